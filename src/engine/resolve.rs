//! One request → one volume to add: the profile's defaults under the request's overrides, the
//! size (given, taken from the pod, or the policy's default), the policy limits, the containers
//! it goes to, and what the cluster checks say of it.

use std::{borrow::Cow, collections::BTreeMap};

use crate::volume::Json;

use super::{
    policy,
    request::{Origin, Request},
    targets::{self, Targets},
};
use crate::{
    cluster::{self, ClusterState, Finding},
    config::{Config, Policy},
    decision::Denial,
    pod::PodView,
    quantity::Quantity,
    volume::{Medium, Mount, Profile, Requested, Source, VolumeKind, VolumeRequest},
};

/// A volume to add to the pod, with everything the plan needs.
#[derive(Clone)]
pub(super) struct Resolved<'a> {
    pub name: &'a str,
    pub origin: Origin<'a>,
    pub kind: VolumeKind,
    /// The source object as the patch carries it.
    pub source: Json,
    pub size: Option<Quantity>,
    pub medium: Medium,
    /// The mount's fields: the request's own, or its profile's (borrowed).
    pub mount_path: Cow<'a, str>,
    pub read_only: Option<bool>,
    pub sub_path: Option<Cow<'a, str>>,
    pub env: Cow<'a, [String]>,
    pub containers: Targets,
    pub init_containers: Targets,
    /// What the cluster checks found, if anything.
    pub cluster: Option<Finding>,
}

impl Resolved<'_> {
    /// At most what this volume adds to the patch in a pod of `containers` and
    /// `init_containers` containers (operations, bytes), each operation costing `per_op`
    /// beyond its value ([`super::bounds::patch`] adds them up).
    pub(super) fn patch_cost(
        &self,
        containers: usize,
        init_containers: usize,
        per_op: usize,
    ) -> (usize, usize) {
        let pairs = self.containers.count(containers) + self.init_containers.count(init_containers);
        let mount = per_op
            + self.mount_path.len()
            + self.name.len()
            + self.sub_path.as_deref().map_or(0, str::len);
        let env: usize = self
            .env
            .iter()
            .map(|var| per_op + var.len() + self.mount_path.len())
            .sum();
        let ops = 1usize.saturating_add(pairs.saturating_mul(1 + self.env.len()));
        let bytes = (per_op + self.source.get().len() + 2 * self.name.len())
            .saturating_add(pairs.saturating_mul(mount.saturating_add(env)));
        (ops, bytes)
    }
}

/// Every request resolved, and every error beside; `failed` is told the position of each
/// request that failed.
/// What the requests of an audited pod resolved to, kept for its second decision: a request
/// both scopes ask for (the same name from the same annotation or rule) is resolved once. A
/// resolution depends on the request, the policy, the cluster and the pod, which both scopes
/// share.
#[derive(Default)]
pub(super) struct Resolutions<'a>(
    pub(super) BTreeMap<(&'a str, Origin<'a>), Result<Resolved<'a>, Denial>>,
);

/// Each request resolved (taken from `kept` when it already was), in order.
pub(super) fn all<'a, 'r>(
    cfg: &'a Config,
    policy: &'r Policy,
    cluster: Option<&'r ClusterState>,
    pod: &'r PodView,
    requests: Vec<Request<'a>>,
    mut kept: Option<&'r mut Resolutions<'a>>,
) -> impl Iterator<Item = Result<Resolved<'a>, Denial>> + 'r
where
    'a: 'r,
{
    requests
        .into_iter()
        .map(move |request| match kept.as_deref_mut() {
            None => resolve(cfg, policy, cluster, pod, request),
            Some(Resolutions(kept)) => kept
                .entry((request.name, request.origin))
                .or_insert_with(|| resolve(cfg, policy, cluster, pod, request))
                .clone(),
        })
}

pub(super) fn resolve<'a>(
    cfg: &'a Config,
    policy: &Policy,
    cluster: Option<&ClusterState>,
    pod: &PodView,
    Request {
        name,
        origin,
        request,
    }: Request<'a>,
) -> Result<Resolved<'a>, Denial> {
    // Where the request came from, written out only for a message.
    let at = || origin.describe(name);
    let here = |d: Denial| d.at(at());
    let checked = origin.is_annotation();
    let VolumeRequest {
        source,
        size,
        size_from_request,
        mount,
    } = request;

    let base = base(cfg, policy, source, checked).map_err(here)?;
    // Each mount field the request leaves out is the profile's, borrowed.
    let defaults = match &base {
        Base::Profile(_, p) => Some(&p.mount),
        Base::Inline(_) => None,
    };
    let or = |own: Option<String>, default: fn(&'a Mount) -> Option<&'a String>| {
        let default = defaults
            .and_then(default)
            .map(|s| Cow::Borrowed(s.as_str()));
        own.map(Cow::Owned).or(default)
    };
    // Looked up now, said after the mount path (a missing one is said first).
    let targets = targets_of(pod, &mount, defaults);
    let Some(mount_path) = or(mount.mount_path, |d| d.mount_path.as_ref()) else {
        return Err(here(no_mount_path(&base)));
    };
    let sub_path = or(mount.sub_path, |d| d.sub_path.as_ref());
    let read_only = mount.read_only.or(defaults.and_then(|d| d.read_only));
    let env = env_of(mount.env, defaults);
    let (containers, init_containers) = targets.map_err(here)?;

    let targets = (&containers, &init_containers);
    let sized = size_of(pod, &base, (size, size_from_request), targets).map_err(here)?;
    let (size, from_request) = sized;
    let built = build(
        policy,
        cluster,
        base,
        size.as_deref(),
        (checked, from_request),
    );
    let built = built.map_err(here)?;

    if built.medium == Medium::Memory && pod.is_windows() {
        return Err(here(Denial::conflict(
            "a Memory emptyDir cannot be mounted in a Windows pod (spec.os.name: windows); use a disk emptyDir",
        )));
    }

    Ok(Resolved {
        name,
        origin,
        kind: built.kind,
        source: built.json,
        size: built.size,
        medium: built.medium,
        mount_path,
        read_only,
        sub_path,
        env,
        containers,
        init_containers,
        cluster: built.finding,
    })
}

/// The containers and init containers the mount goes to: the request's own lists, else its
/// profile's.
fn targets_of(
    pod: &PodView,
    mount: &Mount,
    defaults: Option<&Mount>,
) -> Result<(Targets, Targets), Denial> {
    let containers =
        (mount.containers.as_deref()).or_else(|| defaults.and_then(|d| d.containers.as_deref()));
    let init_containers = (mount.init_containers.as_ref())
        .or_else(|| defaults.and_then(|d| d.init_containers.as_ref()));
    targets::find(pod, containers, init_containers)
}

/// The size asked for, and whether it is the pod's own (`size=request`: from the containers'
/// requests, unless a size is given here; a profile's default `size: request` gives way to an
/// explicit size).
fn size_of(
    pod: &PodView,
    base: &Base<'_>,
    (size, size_from_request): (Option<String>, bool),
    (containers, init_containers): (&Targets, &Targets),
) -> Result<(Option<String>, bool), Denial> {
    let from_request = size_from_request
        || (size.is_none() && matches!(base, Base::Profile(_, p) if p.size_from_request));
    if !from_request {
        return Ok((size, false));
    }
    let size = targets::requested_size(pod, containers, init_containers)?;
    Ok((Some(size), true))
}

/// A request with no mount path of its own nor from its profile.
fn no_mount_path(base: &Base<'_>) -> Denial {
    Denial::invalid(match base {
        Base::Profile(p, _) => format!("mountPath is required: profile {p:?} does not set one"),
        Base::Inline(_) => "mountPath is required".into(),
    })
}

/// The variables set to the mount path: the request's own, else its profile's (borrowed).
fn env_of<'a>(own: Option<Vec<String>>, defaults: Option<&'a Mount>) -> Cow<'a, [String]> {
    match (own, defaults.and_then(|d| d.env.as_deref())) {
        (Some(own), _) => Cow::Owned(own),
        (None, Some(default)) => Cow::Borrowed(default),
        (None, None) => Cow::Borrowed(&[]),
    }
}

/// The profile a request names (it must exist), or its own source (if policy allows one).
fn base<'c>(
    cfg: &'c Config,
    policy: &Policy,
    source: Requested,
    checked: bool,
) -> Result<Base<'c>, Denial> {
    match source {
        Requested::Profile(p) => {
            let profile = profile(cfg, &p)?;
            Ok(Base::Profile(p, profile))
        }
        Requested::Inline(source) => {
            if checked {
                policy::inline_allowed(policy)?;
            }
            Ok(Base::Inline(source))
        }
    }
}

/// The volume's source with its size: a profile's as loaded when nothing changes it, else
/// built for this pod under the checks that apply (an annotation's own source is held to
/// every allowlist; a size an annotation chose, or one taken from the pod, to `maxSize`).
/// `checked`: the request is an annotation's (held to the policy); `from_request`: its size
/// is the pod's own.
fn build(
    policy: &Policy,
    cluster: Option<&ClusterState>,
    base: Base<'_>,
    size: Option<&str>,
    (checked, from_request): (bool, bool),
) -> Result<BuiltSource, Denial> {
    match base {
        // Used as is: its bytes were written when the configuration was loaded.
        Base::Profile(_, p)
            if size.is_none() && policy::default_size(policy, &p.source).is_none() =>
        {
            Ok(BuiltSource {
                kind: p.compiled.kind,
                json: p.compiled.json.clone(),
                size: p.compiled.size,
                medium: p.compiled.medium,
                finding: cluster.and_then(|c| check(c, &p.source)),
            })
        }
        // A profile's size may be overridden, within policy; its source is trusted.
        Base::Profile(_, p) => sized(
            policy,
            cluster,
            p.source.clone(),
            size,
            Checks {
                allowlists: false,
                max_size: (checked && size.is_some()) || from_request,
            },
        ),
        Base::Inline(source) => sized(
            policy,
            cluster,
            source,
            size,
            Checks {
                allowlists: checked,
                max_size: checked || from_request,
            },
        ),
    }
}

/// A profile of the configuration, or an error listing those there are.
fn profile<'c>(cfg: &'c Config, name: &str) -> Result<&'c Profile, Denial> {
    cfg.profiles.get(name).ok_or_else(|| {
        let known: Vec<&str> = cfg.profiles.keys().map(String::as_str).collect();
        Denial::invalid(format!(
            "profile {name:?} is not defined (defined: {})",
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        ))
    })
}

/// What a volume is built from: a profile (by name) or the request's own source.
enum Base<'c> {
    Profile(String, &'c Profile),
    Inline(Source),
}

/// The source with its size, as the patch will carry it.
struct BuiltSource {
    kind: VolumeKind,
    json: Json,
    size: Option<Quantity>,
    medium: Medium,
    finding: Option<Finding>,
}

/// Which policy checks a source built for this pod goes through.
struct Checks {
    /// `types`, `csiDrivers`, `storageClasses`: for a source an annotation gave inline.
    allowlists: bool,
    /// `maxSize`: for a size an annotation chose, or one taken from the pod's own requests
    /// (whatever asked for it: the pod's word).
    max_size: bool,
}

/// A source built for this pod: the size set, the policy checked, the default size added.
fn sized(
    policy: &Policy,
    cluster: Option<&ClusterState>,
    source: Source,
    size: Option<&str>,
    checks: Checks,
) -> Result<BuiltSource, Denial> {
    let invalid = |e: crate::validate::Invalid| Denial::invalid(e.0);
    let kind = source.kind();
    let mut source = match size {
        Some(size) => source.with_size(size).map_err(invalid)?,
        None => source,
    };
    let medium = source.medium();
    let mut size = source.size().map_err(invalid)?;
    if checks.allowlists {
        policy::kind_allowed(policy, kind)?;
        policy::allowlists(policy, &source)?;
    }
    if checks.max_size {
        policy::max_size(policy, kind, medium, size)?;
    }
    if let Some((text, quantity)) = policy::default_size(policy, &source) {
        source = source.with_size(text).map_err(invalid)?;
        size = Some(quantity);
    }
    let json = source
        .to_json()
        .map_err(|e| Denial::invalid(format!("the volume could not be written: {e}")))?;
    Ok(BuiltSource {
        kind,
        json,
        size,
        medium,
        finding: cluster.and_then(|c| check(c, &source)),
    })
}

/// The cluster check of one source: its CSI driver or its storage class.
fn check(cluster: &ClusterState, source: &Source) -> Option<Finding> {
    match source.kind() {
        VolumeKind::Csi => cluster::check_csi(cluster, source.csi_driver()?),
        VolumeKind::Ephemeral => cluster::check_storage_class(cluster, source.storage_class()),
        VolumeKind::EmptyDir => None,
    }
}
