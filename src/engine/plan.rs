//! The plan: the volumes set against the pod. Every change (volumes, mounts and variables per
//! container, annotations) and every warning is decided here, before anything is written.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, hash_map::Entry},
};

use serde_json::value::RawValue;

use super::{existing, resolve::Resolved, targets::Targets};
use crate::{
    config::StatusKey,
    decision::Denial,
    patch::{self, PatchValue},
    pod::{ContainerView, PodView, QuantityText},
    quantity::Quantity,
    validate::normalize_path,
    volume::{Medium, VolumeKind},
};

/// What to add to one array of the pod: `exists` says whether the array is there (append to
/// it) or not (write it whole).
#[derive(Debug)]
pub(super) struct Additions<T> {
    pub exists: bool,
    /// Inline room for the two a Nextflow task's pod gets (volumes, mounts, variables).
    pub items: Vec<T>,
}

/// The two container lists of a pod spec.
#[derive(Debug, Clone, Copy)]
pub(super) enum ContainerList {
    Containers,
    InitContainers,
}

impl ContainerList {
    /// The list's field in the pod spec.
    pub(super) fn field(self) -> &'static str {
        match self {
            ContainerList::Containers => "containers",
            ContainerList::InitContainers => "initContainers",
        }
    }
}

/// The mounts and variables one container gets.
#[derive(Debug)]
pub(super) struct ContainerChanges<'a> {
    pub list: ContainerList,
    pub index: usize,
    pub mounts: Additions<patch::VolumeMount<'a>>,
    pub env: Additions<patch::EnvVar<'a>>,
}

/// How much of `metadata.annotations` the pod has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Metadata {
    /// No `metadata` at all (a workload's pod template may have none).
    Missing,
    /// `metadata` without `annotations`.
    NoAnnotations,
    /// `metadata.annotations` is there.
    Annotations,
}

/// One annotation to set: its key, the key as a JSON-pointer token, and the value.
#[derive(Debug)]
pub(super) struct Annotation<'a> {
    pub key: &'a str,
    pub token: &'a str,
    pub value: String,
}

/// Everything to add to the pod, and what to tell the user. Borrows the resolved volumes and
/// the configuration's status keys: the patch is written from it once.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    pub volumes: Additions<patch::Volume<'a>>,
    /// Containers first, then init containers, each in the pod's order.
    /// Inline room for one: a Nextflow task's pod has one container.
    pub containers: Vec<ContainerChanges<'a>>,
    pub metadata: Metadata,
    pub annotations: Vec<Annotation<'a>>,
    /// The volumes added, with their kind.
    pub injected: Vec<(String, VolumeKind)>,
    pub warnings: Vec<String>,
}

impl<'a> Plan<'a> {
    /// A plan that adds nothing (yet).
    pub(super) fn new(pod: &PodView) -> Plan<'a> {
        Plan {
            volumes: Additions {
                exists: pod.spec.as_ref().is_some_and(|s| s.volumes.is_some()),
                items: Vec::new(),
            },
            containers: Vec::new(),
            metadata: match pod.metadata.as_ref().map(|m| m.annotations.is_some()) {
                None => Metadata::Missing,
                Some(false) => Metadata::NoAnnotations,
                Some(true) => Metadata::Annotations,
            },
            annotations: Vec::new(),
            injected: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// Sets a status annotation, unless the pod already has it with this value.
    pub(super) fn annotate(&mut self, pod: &PodView, status: &'a StatusKey, value: String) {
        let current = pod
            .annotations()
            .and_then(|a| a.get(status.key.as_str()))
            .map(|v| &**v);
        if current != Some(value.as_str()) {
            self.annotations.push(Annotation {
                key: &status.key,
                token: &status.token,
                value,
            });
        }
    }
}

/// The plan for these volumes on this pod: new volumes (identical ones already there count as
/// done, different ones are conflicts), mounts and variables per container (a path taken by
/// another volume is a conflict, a variable already set is left alone), the record annotation
/// (every volume the webhook manages on this pod) and the warnings; every conflict into
/// `errors`.
pub(super) fn place_volumes<'a>(
    pod: &PodView,
    volumes: &'a [Resolved<'_>],
    record: &'a StatusKey,
    errors: &mut Vec<Denial>,
) -> Plan<'a> {
    let mut plan = Plan::new(pod);
    plan.volumes.items.reserve_exact(volumes.len());
    plan.injected.reserve_exact(volumes.len());
    // The pod's volumes by name, read once: each volume added is looked up in it.
    let existing: HashMap<Cow<'_, str>, &RawValue> = pod.volumes_by_name();
    for v in volumes {
        if let Err(d) = add_volume(&mut plan, &existing, v) {
            errors.push(d);
        }
    }
    // Which volume came from where, for a conflict's message.
    let by_name: HashMap<&str, &Resolved<'_>> = volumes.iter().map(|v| (v.name, v)).collect();
    let lists = [
        (ContainerList::Containers, pod.containers()),
        (ContainerList::InitContainers, pod.init_containers()),
    ];
    for (list, containers) in lists {
        let targets = |v: &'a Resolved<'_>| match list {
            ContainerList::Containers => &v.containers,
            ContainerList::InitContainers => &v.init_containers,
        };
        // Which volumes each container gets, without asking every volume about every
        // container: those for all of them, and the (container, volume) pairs of the lists.
        let everywhere: Vec<usize> = (0..volumes.len())
            .filter(|&k| matches!(targets(&volumes[k]), Targets::All))
            .collect();
        let mut listed: Vec<(usize, usize)> = Vec::new();
        for (k, v) in volumes.iter().enumerate() {
            if let Targets::Listed(l) = targets(v) {
                listed.extend(l.iter().map(|&i| (i, k)));
            }
        }
        listed.sort_unstable();
        let mut rest = listed.as_slice();
        for (index, c) in containers.iter().enumerate() {
            let here = rest.partition_point(|&(i, _)| i == index);
            let (own, after) = rest.split_at(here);
            rest = after;
            if everywhere.is_empty() && own.is_empty() {
                continue;
            }
            // In the volumes' order, as they were asked for.
            let mut ks: Vec<usize> = everywhere
                .iter()
                .copied()
                .chain(own.iter().map(|&(_, k)| k))
                .collect();
            ks.sort_unstable();
            let targeting = ks.into_iter().map(|k| &volumes[k]);
            let mut changes = ContainerChanges {
                list,
                index,
                mounts: Additions {
                    exists: c.volume_mounts.is_some(),
                    items: Vec::new(),
                },
                env: Additions {
                    exists: c.env.is_some(),
                    items: Vec::new(),
                },
            };
            // The container's mounts (by path, in one spelling) and variables, read once:
            // every volume it gets is set against them and the ones added before it.
            let mut taken = Taken::of(c);
            for v in targeting {
                match mount(&mut changes, &mut taken, &mut plan.warnings, c, v, &by_name) {
                    Ok(()) => set_env(&mut changes, &mut taken, &mut plan.warnings, c, v),
                    Err(d) => errors.push(d),
                }
            }
            if !(changes.mounts.items.is_empty() && changes.env.items.is_empty()) {
                plan.containers.push(changes);
            }
        }
    }
    let mut names = String::with_capacity(volumes.iter().map(|v| v.name.len() + 1).sum());
    for (i, v) in volumes.iter().enumerate() {
        if i > 0 {
            names.push(',');
        }
        names.push_str(v.name);
    }
    plan.annotate(pod, record, names);
    plan
}

/// A new volume, or one the pod already has identically (nothing to add).
fn add_volume<'a>(
    plan: &mut Plan<'a>,
    existing: &HashMap<Cow<'_, str>, &RawValue>,
    v: &'a Resolved<'_>,
) -> Result<(), Denial> {
    let volume = patch::Volume {
        name: v.name,
        kind: v.kind,
        source: &v.source,
    };
    if let Some(raw) = existing.get(v.name) {
        let existing: serde_json::Value =
            serde_json::from_str(raw.get()).unwrap_or(serde_json::Value::Null);
        let mut json = Vec::new();
        let desired = match volume.write_json(&mut json) {
            Ok(()) => serde_json::from_slice(&json).unwrap_or(serde_json::Value::Null),
            Err(_) => serde_json::Value::Null,
        };
        return existing::same_volume(&desired, &existing).map_err(|differs| {
            Denial::conflict(format!(
                "volume {:?} ({}): the pod already has a volume with this name, {differs}; \
                 rename one of them",
                v.name,
                v.origin.describe(v.name)
            ))
        });
    }
    if let Some(size) = v.size.filter(|s| s.is_implausible_size()) {
        plan.warnings.push(format!(
            "volume {}: size {size} is less than a kibibyte or a fraction of a byte; \
             did you mean Mi, Gi or M, G?",
            v.name
        ));
    }
    if v.medium == Medium::Memory && v.size.is_none() {
        plan.warnings.push(format!(
            "volume {}: a Memory emptyDir without a size can use all of the pod's memory; set size",
            v.name
        ));
    }
    plan.injected.push((v.name.to_owned(), v.kind));
    plan.volumes.items.push(volume);
    Ok(())
}

/// One container's mounts by path (in [`normalize_path`]'s spelling) and its variables by
/// name, the pod's own and those added so far: what each new mount and variable is checked
/// against, in one look-up each.
struct Taken<'c> {
    paths: HashMap<Cow<'c, str>, &'c str>,
    variables: HashMap<&'c str, Variable<'c>>,
}

/// Who sets a variable in a container.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variable<'c> {
    /// The pod, to this value (`None`: from `valueFrom`).
    Pod(Option<&'c str>),
    /// A volume added before, to its mount path.
    Added,
}

impl<'c> Taken<'c> {
    fn of(c: &'c ContainerView<'_>) -> Taken<'c> {
        let mut paths = HashMap::new();
        for m in c.volume_mounts.iter().flatten() {
            // The first mount at a path is the one a conflict names.
            paths
                .entry(normalize_path(&m.mount_path))
                .or_insert(&*m.name);
        }
        let mut variables = HashMap::new();
        for e in c.env.iter().flatten() {
            variables
                .entry(&*e.name)
                .or_insert(Variable::Pod(e.value.as_deref()));
        }
        Taken { paths, variables }
    }
}

/// The mount in one container, unless it is there already; another volume at the same path
/// is a conflict. Paths are compared in one spelling (`/scratch/` is `/scratch`).
fn mount<'a: 't, 't>(
    changes: &mut ContainerChanges<'a>,
    taken: &mut Taken<'t>,
    warnings: &mut Vec<String>,
    c: &'t ContainerView<'_>,
    v: &'a Resolved<'_>,
    volumes: &HashMap<&str, &Resolved<'_>>,
) -> Result<(), Denial> {
    match taken.paths.entry(normalize_path(&v.mount_path)) {
        Entry::Occupied(at) if *at.get() == v.name => Ok(()),
        Entry::Occupied(at) => {
            let other = *at.get();
            // Where the other volume came from: this request's own annotation or rule, or
            // the pod itself.
            let from = match volumes.get(other) {
                Some(o) => format!("volume {other:?} ({})", o.origin.describe(other)),
                None => format!("the pod's volume {other:?}"),
            };
            Err(Denial::conflict(format!(
                "volume {:?} ({}): container {:?} already mounts {from} at {}",
                v.name,
                v.origin.describe(v.name),
                c.name,
                v.mount_path
            )))
        }
        Entry::Vacant(free) => {
            free.insert(v.name);
            changes.mounts.items.push(patch::VolumeMount {
                mount_path: &v.mount_path,
                name: v.name,
                read_only: v.read_only,
                sub_path: v.sub_path.as_deref(),
            });
            warn_mount(warnings, c, v);
            Ok(())
        }
    }
}

/// The variables set to the mount path; one the container (or another volume) sets already
/// is left alone, with a warning unless it has this value.
fn set_env<'a: 't, 't>(
    changes: &mut ContainerChanges<'a>,
    taken: &mut Taken<'t>,
    warnings: &mut Vec<String>,
    c: &ContainerView,
    v: &'a Resolved<'_>,
) {
    for var in v.env.iter() {
        match taken.variables.entry(var.as_str()) {
            Entry::Occupied(set) => match *set.get() {
                Variable::Pod(value) if value == Some(&*v.mount_path) => {}
                Variable::Pod(_) => warnings.push(format!(
                    "volume {}: container {} already sets {var}; left alone",
                    v.name, c.name
                )),
                Variable::Added => warnings.push(format!(
                    "volume {}: {var} is set by another volume in container {}; left alone",
                    v.name, c.name
                )),
            },
            Entry::Vacant(free) => {
                free.insert(Variable::Added);
                changes.env.items.push(patch::EnvVar {
                    name: var,
                    value: &v.mount_path,
                });
            }
        }
    }
}

/// An emptyDir that can outgrow what the container is given.
fn warn_mount(warnings: &mut Vec<String>, c: &ContainerView, v: &Resolved<'_>) {
    if v.kind != VolumeKind::EmptyDir {
        return;
    }
    let resources = c.resources.as_ref();
    let limits = resources.and_then(|r| r.limits.as_ref());
    let requests = resources.and_then(|r| r.requests.as_ref());
    let quantity = |q: Option<&QuantityText<'_>>| q.and_then(|q| q.parse::<Quantity>().ok());
    if v.medium == Medium::Memory {
        if let (Some(size), Some(limit)) =
            (v.size, quantity(limits.and_then(|l| l.memory.as_ref())))
            && size > limit
        {
            warnings.push(format!(
                "volume {}: Memory emptyDir size {size} exceeds the memory limit {limit} of container {}",
                v.name, c.name
            ));
        }
    } else if v.medium == Medium::Disk
        && v.size.is_none()
        && quantity(requests.and_then(|r| r.ephemeral_storage.as_ref())).is_none()
    {
        warnings.push(format!(
            "volume {}: emptyDir without a size on container {}, which has no ephemeral-storage request; it can fill the node's disk",
            v.name, c.name
        ));
    }
}

/// The annotations as one object, for a pod that has no `metadata.annotations`.
pub(super) fn annotation_map<'a>(annotations: &'a [Annotation<'_>]) -> BTreeMap<&'a str, &'a str> {
    annotations
        .iter()
        .map(|a| (a.key, a.value.as_str()))
        .collect()
}
