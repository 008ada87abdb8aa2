//! The decision: from a pod's annotations, the matching rules and the configuration to a patch,
//! a denial, and warnings. Pure: no I/O, no clock, no logging.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use serde_json::{Value, value::RawValue};

use crate::{
    annotation::{
        InitTargets, Medium, Source, VolumeKind, VolumeRequest, normalize_path, validate_dns_label,
    },
    cluster::{ClusterState, Finding, Known, Mode as ClusterMode},
    config::{CompiledSource, Config, OnError},
    patch::{Entry, EnvValue, MetadataWith, MountValue, Patch},
    pod::{ContainerView, PodView},
    quantity::Quantity,
};

/// Why a pod was refused; each maps to an HTTP-style status code in the AdmissionReview.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DenyReason {
    /// The annotation or rule entry cannot be understood (400).
    Invalid,
    /// Understood, but the cluster policy forbids it (403).
    Policy,
    /// Legal on its own, but clashes with the pod (422).
    Conflict,
    /// The cluster cannot provide the volume: no such CSIDriver or StorageClass (422).
    Cluster,
}

impl DenyReason {
    pub fn code(self) -> u16 {
        match self {
            DenyReason::Invalid => 400,
            DenyReason::Policy => 403,
            DenyReason::Conflict | DenyReason::Cluster => 422,
        }
    }

    /// The `status.reason` of the AdmissionReview (a Kubernetes StatusReason).
    pub fn status_reason(self) -> &'static str {
        match self {
            DenyReason::Invalid => "BadRequest",
            DenyReason::Policy => "Forbidden",
            DenyReason::Conflict | DenyReason::Cluster => "Invalid",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::Invalid => "invalid",
            DenyReason::Policy => "policy",
            DenyReason::Conflict => "conflict",
            DenyReason::Cluster => "cluster",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Denial {
    pub reason: DenyReason,
    pub message: String,
}

impl Denial {
    pub fn code(&self) -> u16 {
        self.reason.code()
    }
}

/// What the engine decided for one pod.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcome {
    /// The patch to return; empty when there is nothing to do.
    pub patch: Patch,
    /// Volumes this pass adds, with their kind.
    pub injected: Vec<(String, VolumeKind)>,
    /// Set when the pod is refused (`onError: deny`), or admitted unchanged (`onError: warn`).
    pub denial: Option<Denial>,
    /// True when `denial` is only reported, the pod being admitted.
    pub admitted_despite_error: bool,
    pub warnings: Vec<String>,
}

impl Outcome {
    pub fn allowed(&self) -> bool {
        self.denial.is_none() || self.admitted_despite_error
    }
}

/// Where the pod sits in the object being patched.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// Namespace used to match rules (the AdmissionRequest's, not the object's, which is often empty).
    pub namespace: &'a str,
    /// JSON pointer to the pod (`""`) or pod template (`/spec/template`).
    pub base: &'a str,
}

// === impl the engine ===

/// Where a request came from, for messages and for policy: annotations are checked, rules trusted.
#[derive(Debug, Clone, Copy)]
enum Origin<'a> {
    Annotation(&'a str),
    Rule(&'a str),
}

impl Origin<'_> {
    fn describe(&self, volume: &str) -> String {
        match self {
            Origin::Annotation(key) => format!("annotation {key}"),
            Origin::Rule(rule) => format!("rule {rule}, volume {volume}"),
        }
    }
}

/// A profile's source, compiled at load, or a source to build.
enum Resolved<'c> {
    Compiled(&'c CompiledSource),
    Source(Source),
}

/// The volume to add: built for this pod (its source is never a profile), or a profile's as
/// loaded. Either way it is written as k8s-openapi writes a `Volume`: `{"<kind>": source,
/// "name": …}`.
#[derive(Debug)]
enum PlannedVolume<'a> {
    Built {
        name: &'a str,
        source: Source,
    },
    Profile {
        name: &'a str,
        kind: VolumeKind,
        source: &'a RawValue,
    },
}

impl serde::Serialize for PlannedVolume<'_> {
    /// Keys in k8s-openapi's order (alphabetical: the source, then `name`), so the bytes are
    /// the ones a `Volume` would give.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(2))?;
        let name = match self {
            PlannedVolume::Built { name, source } => {
                match source {
                    Source::EmptyDir(e) => m.serialize_entry("emptyDir", e)?,
                    Source::Csi(c) => m.serialize_entry("csi", c)?,
                    Source::Ephemeral(e) => m.serialize_entry("ephemeral", e)?,
                    Source::Profile(_) => {
                        return Err(serde::ser::Error::custom(
                            "a profile is not a volume source",
                        ));
                    }
                }
                name
            }
            PlannedVolume::Profile { name, kind, source } => {
                m.serialize_entry(kind.as_str(), source)?;
                name
            }
        };
        m.serialize_entry("name", name)?;
        m.end()
    }
}

/// Which entries of a container list get the mount.
#[derive(Debug)]
enum Targets {
    All,
    Listed(Vec<usize>),
}

impl Targets {
    fn contains(&self, i: usize) -> bool {
        match self {
            Targets::All => true,
            Targets::Listed(l) => l.contains(&i),
        }
    }
}

/// One volume to add, borrowing from the configuration and the pod where it can.
struct Planned<'a> {
    name: &'a str,
    kind: VolumeKind,
    volume: PlannedVolume<'a>,
    mount_path: Cow<'a, str>,
    read_only: Option<bool>,
    sub_path: Option<Cow<'a, str>>,
    env: Cow<'a, [String]>,
    containers: Targets,
    init_containers: Targets,
    size: Option<Quantity>,
    medium: Medium,
    origin: Origin<'a>,
    /// What the cluster checks found, if anything.
    cluster: Option<Finding>,
}

impl Planned<'_> {
    fn mount(&self) -> MountValue<'_> {
        MountValue {
            mount_path: &self.mount_path,
            name: self.name,
            read_only: self.read_only,
            sub_path: self.sub_path.as_deref(),
        }
    }
}

pub fn mutate(cfg: &Config, pod: &PodView, target: Target<'_>) -> Outcome {
    mutate_in(cfg, None, pod, target)
}

/// [`mutate`], with the cluster checks against what is known of the cluster (`None`: unknown,
/// no checks).
pub fn mutate_in(
    cfg: &Config,
    cluster: Option<Known<'_>>,
    pod: &PodView,
    target: Target<'_>,
) -> Outcome {
    // Off, or nothing known: no checks. Enforcing on incomplete lists would refuse pods for
    // objects not yet seen: warn until they are complete.
    let checks = match (cfg.cluster_checks, cluster) {
        (ClusterMode::Off, _) | (_, None) => None,
        (ClusterMode::Enforce, Some(k)) if !k.complete => Some((k.state, ClusterMode::Warn)),
        (mode, Some(k)) => Some((k.state, mode)),
    };
    match plan(cfg, checks, pod, target) {
        Ok(outcome) => outcome,
        Err(mut denial) => {
            if let Cow::Owned(cut) =
                crate::text::bounded(&denial.message, crate::text::MESSAGE_LIMIT)
            {
                denial.message = cut;
            }
            fail(cfg, pod, target, denial)
        }
    }
}

/// `onError`: refuse, or admit unchanged with a warning and the status annotation.
fn fail(cfg: &Config, pod: &PodView, target: Target<'_>, denial: Denial) -> Outcome {
    match cfg.on_error {
        OnError::Deny => Outcome {
            denial: Some(denial),
            ..Outcome::default()
        },
        OnError::Warn => {
            let mut patch = Patch::default();
            let mut path = String::new();
            if annotate(
                pod,
                target,
                (&cfg.error_key, &cfg.error_token),
                &denial.message,
                &mut patch,
                &mut path,
            )
            .is_err()
            {
                // The status annotation could not be written: refuse rather than admit silently.
                return Outcome {
                    denial: Some(denial),
                    ..Outcome::default()
                };
            }
            Outcome {
                patch,
                warnings: vec![format!("volumes not injected: {}", denial.message)],
                denial: Some(denial),
                admitted_despite_error: true,
                injected: Vec::new(),
            }
        }
    }
}

fn plan(
    cfg: &Config,
    checks: Option<(&ClusterState, ClusterMode)>,
    pod: &PodView,
    target: Target<'_>,
) -> Result<Outcome, Denial> {
    let requests = collect(cfg, pod, target.namespace)?;
    if requests.is_empty() {
        return Ok(Outcome::default());
    }
    if pod.containers().is_empty() {
        return Err(Denial {
            reason: DenyReason::Invalid,
            message: "the pod has no containers to mount volumes in".into(),
        });
    }

    let mut errors: Vec<Denial> = Vec::new();
    let mut planned = Vec::with_capacity(requests.len());
    for (name, origin, req) in requests {
        match resolve(cfg, checks.map(|c| c.0), pod, name, origin, req) {
            Ok(p) => planned.push(p),
            Err(d) => errors.push(d),
        }
    }
    if let Some(max) = cfg.policy.max_volumes_per_pod
        && planned.len() + errors.len() > max
    {
        errors.push(Denial {
            reason: DenyReason::Policy,
            message: format!(
                "{} volumes requested, policy.maxVolumesPerPod allows {max}",
                planned.len() + errors.len()
            ),
        });
    }
    combine(errors)?;
    let mode = checks.map_or(ClusterMode::Off, |c| c.1);
    let unavailable = cluster_findings(mode, &planned)?;

    let mut out = Outcome {
        patch: Patch::with_capacity(512 * planned.len() + 256),
        ..Outcome::default()
    };
    apply(
        (&cfg.injected_key, &cfg.injected_token),
        pod,
        target,
        &planned,
        &mut out,
    )?;
    for p in &planned {
        if let Some(Finding::Suspect(m)) = &p.cluster {
            out.warnings.push(format!("volume {}: {m}", p.name));
        }
    }
    // clusterChecks: warn: injected all the same; the warning and the status annotation say
    // what the cluster lacks.
    if !unavailable.is_empty() {
        out.warnings.extend(unavailable.iter().cloned());
        let mut path = String::new();
        annotate(
            pod,
            target,
            (&cfg.cluster_check_key, &cfg.cluster_check_token),
            &unavailable.join("; "),
            &mut out.patch,
            &mut path,
        )
        .map_err(unwritable)?;
    }
    Ok(out)
}

/// The volumes the cluster cannot provide: a denial under `clusterChecks: enforce`, else
/// their messages (for `warn`).
fn cluster_findings(mode: ClusterMode, planned: &[Planned]) -> Result<Vec<String>, Denial> {
    let unavailable: Vec<String> = planned
        .iter()
        .filter_map(|p| match &p.cluster {
            Some(Finding::Unavailable(m)) => Some(format!("{}: {m}", p.origin.describe(p.name))),
            _ => None,
        })
        .collect();
    if mode == ClusterMode::Enforce && !unavailable.is_empty() {
        return Err(Denial {
            reason: DenyReason::Cluster,
            message: unavailable.join("; "),
        });
    }
    Ok(unavailable)
}

/// The cluster check of one volume source (CSI driver or storage class), if the cluster is known.
fn check_cluster(cluster: Option<&ClusterState>, source: &Source) -> Option<Finding> {
    let cluster = cluster?;
    match source {
        Source::Csi(c) => crate::cluster::check_csi(cluster, &c.driver),
        Source::Ephemeral(e) => crate::cluster::check_storage_class(
            cluster,
            e.volume_claim_template
                .as_ref()
                .and_then(|t| t.spec.storage_class_name.as_deref()),
        ),
        Source::EmptyDir(_) | Source::Profile(_) => None,
    }
}

/// All errors of one kind at once, so a user fixes every annotation in one go.
fn combine(errors: Vec<Denial>) -> Result<(), Denial> {
    let Some(reason) = errors.iter().map(|d| d.reason).min() else {
        return Ok(());
    };
    Err(Denial {
        reason,
        message: errors
            .into_iter()
            .map(|d| d.message)
            .collect::<Vec<_>>()
            .join("; "),
    })
}

/// One request: the volume name, where it came from, and what it asks for (borrowed from a
/// rule, or parsed from an annotation).
type Request<'a> = (&'a str, Origin<'a>, Cow<'a, VolumeRequest>);

fn collect<'a>(
    cfg: &'a Config,
    pod: &'a PodView,
    namespace: &str,
) -> Result<Vec<Request<'a>>, Denial> {
    let mut requests: Vec<Request<'a>> = Vec::new();
    let mut errors = Vec::new();
    if let Some(annotations) = pod.annotations() {
        for (key, value) in annotations {
            let (key, value) = (&**key, &**value);
            let Some(name) = key
                .strip_prefix(cfg.prefix.as_str())
                .and_then(|r| r.strip_prefix('/'))
            else {
                continue;
            };
            let invalid = |m: String| Denial {
                reason: DenyReason::Invalid,
                message: format!(
                    "annotation {key}: {}",
                    crate::text::bounded(&m, crate::text::ECHO_LIMIT)
                ),
            };
            if let Err(e) = validate_dns_label("volume name", name) {
                errors.push(invalid(e.0));
                continue;
            }
            match value.parse::<VolumeRequest>() {
                Ok(req) => requests.push((name, Origin::Annotation(key), Cow::Owned(req))),
                Err(e) => errors.push(invalid(e.0)),
            }
        }
    }
    combine(errors)?;
    // Labels are decoded only once a rule's namespaces match.
    let mut labels = None;
    for rule in &cfg.rules {
        if !rule.in_namespace(namespace) {
            continue;
        }
        if labels.is_none() {
            labels = Some(pod.labels().map_err(|e| Denial {
                reason: DenyReason::Invalid,
                message: format!("metadata.labels: {e}"),
            })?);
        }
        if !labels.as_ref().is_some_and(|l| rule.selects(l)) {
            continue;
        }
        for (name, req) in &rule.volumes {
            // An annotation for the same name wins; the first matching rule wins over later ones.
            if !requests.iter().any(|(n, ..)| n == name) {
                requests.push((name, Origin::Rule(&rule.name), Cow::Borrowed(req)));
            }
        }
    }
    requests.sort_by(|a, b| a.0.cmp(b.0));
    Ok(requests)
}

fn resolve<'a>(
    cfg: &'a Config,
    cluster: Option<&ClusterState>,
    pod: &PodView,
    name: &'a str,
    origin: Origin<'a>,
    req: Cow<'a, VolumeRequest>,
) -> Result<Planned<'a>, Denial> {
    let at = || origin.describe(name);
    let invalid = |m: String| Denial {
        reason: DenyReason::Invalid,
        message: format!("{}: {m}", at()),
    };
    let forbidden = |m: String| Denial {
        reason: DenyReason::Policy,
        message: format!("{}: {m}", at()),
    };
    let checked = matches!(origin, Origin::Annotation(_));
    let policy = &cfg.policy;

    // Profiles: the profile's fields, overridden by what the request may override. An
    // annotation's request is this decision's own and is taken apart; a rule's is copied.
    let VolumeRequest {
        source: requested,
        size: size_override,
        size_from_request,
        mount_path,
        read_only,
        sub_path,
        containers,
        init_containers,
        env,
    } = req.into_owned();
    let (source, base, profile_name) = match requested {
        Source::Profile(p) => {
            let Some(profile) = cfg.profiles.get(&p) else {
                let known: Vec<&str> = cfg.profiles.keys().map(String::as_str).collect();
                return Err(invalid(format!(
                    "profile {p:?} is not defined (defined: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                )));
            };
            // A profile used as is (no size override, no default size to add) needs neither
            // a copy of its source nor checks: its bytes were written when it was loaded.
            let as_is = cfg.profile_sources.get(&p).filter(|c| {
                let sized_here = size_override.is_some() || size_from_request;
                let needs_default =
                    policy.require_size_limit && c.kind == VolumeKind::EmptyDir && c.size.is_none();
                !(sized_here || profile.size_from_request || needs_default)
            });
            let source = match as_is {
                Some(c) => Resolved::Compiled(c),
                None => Resolved::Source(profile.source.clone()),
            };
            (source, Some(profile), Some(p))
        }
        other => {
            if checked && !policy.allow_inline {
                return Err(forbidden(
                    "policy.allowInline is false: name one of the cluster's profiles".into(),
                ));
            }
            (Resolved::Source(other), None, None)
        }
    };
    let from_profile = profile_name.is_some();
    let Some(mount_path) = or_profile(mount_path, base, |b| b.mount_path.as_deref()) else {
        return Err(invalid(match &profile_name {
            Some(p) => format!("mountPath is required: profile {p:?} does not set one"),
            None => "mountPath is required".into(),
        }));
    };
    let read_only = read_only.or_else(|| base.and_then(|b| b.read_only));
    let sub_path = or_profile(sub_path, base, |b| b.sub_path.as_deref());
    let containers = or_profile(containers, base, |b| b.containers.as_deref());
    let init = or_profile(init_containers, base, |b| b.init_containers.as_ref());
    let env = or_profile(env, base, |b| b.env.as_deref());
    let (containers, init_containers) = targets(pod, containers, init.as_deref(), &at)?;
    let cluster = match (&source, base) {
        (Resolved::Source(s), _) => check_cluster(cluster, s),
        (Resolved::Compiled(_), Some(profile)) => check_cluster(cluster, &profile.source),
        (Resolved::Compiled(_), None) => None,
    };
    // size=request: from the pod's own requests, unless a size is given here; a profile's
    // default `size: request` gives way to an explicit size.
    let size_from_request =
        size_from_request || (size_override.is_none() && base.is_some_and(|b| b.size_from_request));
    let size_override = match size_from_request {
        true => Some(requested_size(pod, &containers, &init_containers).map_err(invalid)?),
        false => size_override,
    };

    let (kind, volume, size, medium) = match source {
        Resolved::Compiled(c) => (
            c.kind,
            PlannedVolume::Profile {
                name,
                kind: c.kind,
                source: &c.json,
            },
            c.size,
            c.medium,
        ),
        Resolved::Source(source) => {
            let mut source = source;
            let kind = kind_of(&source).map_err(invalid)?;
            // A profile's size may be overridden, within policy.
            if let Some(size) = &size_override {
                set_size(&mut source, size).map_err(invalid)?;
            }
            let (size, medium) = size_of(&source).map_err(invalid)?;

            if checked && !from_profile {
                if !policy.types.contains(&kind) {
                    return Err(forbidden(format!(
                        "type {kind} is not allowed by policy.types ({})",
                        policy
                            .types
                            .iter()
                            .map(|k| k.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                check_allowlists(policy, &source).map_err(forbidden)?;
            }
            // A size an annotation chose, or one taken from the pod's own requests (whatever
            // asked for it: the pod's word), is held to policy.maxSize.
            if (checked && (!from_profile || size_override.is_some())) || size_from_request {
                // HugePages are sized by the pod's hugepages resources: no disk or memory cap.
                let max = match (kind, medium) {
                    (VolumeKind::EmptyDir, Medium::Memory) => {
                        policy.max_memory.map(|m| (m, "memory"))
                    }
                    (VolumeKind::EmptyDir, Medium::Disk) => {
                        policy.max_empty_dir.map(|m| (m, "emptyDir"))
                    }
                    (VolumeKind::Ephemeral, _) => policy.max_ephemeral.map(|m| (m, "ephemeral")),
                    _ => None,
                };
                if let (Some((max, field)), Some(size)) = (max, size)
                    && size > max
                {
                    return Err(forbidden(format!(
                        "size {size} exceeds policy.maxSize.{field} ({max})"
                    )));
                }
            }
            let mut size = size;
            if policy.require_size_limit
                && medium != Medium::HugePages
                && let Source::EmptyDir(e) = &mut source
                && e.size_limit.is_none()
            {
                e.size_limit = Some(K8sQuantity(policy.default_size_limit_text.clone()));
                size = Some(policy.default_size_limit);
            }
            (kind, PlannedVolume::Built { name, source }, size, medium)
        }
    };

    if medium == Medium::Memory && pod.is_windows() {
        return Err(Denial {
            reason: DenyReason::Conflict,
            message: format!(
                "{}: a Memory emptyDir cannot be mounted in a Windows pod (spec.os.name: windows); \
                 use a disk emptyDir",
                at()
            ),
        });
    }

    Ok(Planned {
        name,
        kind,
        volume,
        mount_path,
        read_only,
        sub_path,
        env: env.unwrap_or(Cow::Borrowed(&[])),
        containers,
        init_containers,
        size,
        medium,
        origin,
        cluster,
    })
}

/// The containers and init containers a volume is mounted in.
fn targets(
    pod: &PodView,
    containers: Option<Cow<'_, [String]>>,
    init: Option<&InitTargets>,
    at: &dyn Fn() -> String,
) -> Result<(Targets, Targets), Denial> {
    let find = |list: &[ContainerView], names: &[String], what: &str| {
        names
            .iter()
            .map(|n| {
                list.iter()
                    .position(|c| *c.name == **n)
                    .ok_or_else(|| Denial {
                        reason: DenyReason::Conflict,
                        message: format!(
                            "{}: {what} {n:?} is not in the pod ({what}s: {})",
                            at(),
                            list.iter().map(|c| &*c.name).collect::<Vec<_>>().join(", ")
                        ),
                    })
            })
            .collect::<Result<Vec<usize>, Denial>>()
    };
    let containers = match containers {
        Some(names) => Targets::Listed(find(pod.containers(), &names, "container")?),
        None => Targets::All,
    };
    let init_containers = match init {
        None | Some(InitTargets::None) => Targets::Listed(Vec::new()),
        Some(InitTargets::All) => Targets::All,
        Some(InitTargets::Named(names)) => {
            Targets::Listed(find(pod.init_containers(), names, "init container")?)
        }
    };
    Ok((containers, init_containers))
}

/// `size=request`: the largest `ephemeral-storage` request of the targeted containers (what
/// Nextflow's `disk` directive sets). None of them having one is an error naming them.
fn requested_size(
    pod: &PodView,
    containers: &Targets,
    init_containers: &Targets,
) -> Result<String, String> {
    let targeted: Vec<&ContainerView> = pod
        .containers()
        .iter()
        .enumerate()
        .filter(|(i, _)| containers.contains(*i))
        .chain(
            pod.init_containers()
                .iter()
                .enumerate()
                .filter(|(i, _)| init_containers.contains(*i)),
        )
        .map(|(_, c)| c)
        .collect();
    let mut largest: Option<Quantity> = None;
    for c in &targeted {
        let request = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.ephemeral_storage.as_ref());
        if let Some(q) = request {
            let q = q
                .parse::<Quantity>()
                .map_err(|e| format!("size=request: container {}: {e}", c.name))?;
            largest = largest.max(Some(q));
        }
    }
    match largest {
        Some(q) if !q.is_zero() => Ok(q.to_string()),
        _ => Err(format!(
            "size=request, but {} (set one, e.g. with Nextflow's disk directive, or give a size)",
            match targeted.as_slice() {
                [one] => format!("container {} has no ephemeral-storage request", one.name),
                many => format!(
                    "none of the containers {} has an ephemeral-storage request",
                    many.iter().map(|c| &*c.name).collect::<Vec<_>>().join(", ")
                ),
            }
        )),
    }
}

/// The request's value for a field, else the profile's (borrowed from the configuration).
fn or_profile<'a, B: ?Sized + ToOwned + 'a>(
    requested: Option<B::Owned>,
    profile: Option<&'a VolumeRequest>,
    f: impl FnOnce(&'a VolumeRequest) -> Option<&'a B>,
) -> Option<Cow<'a, B>> {
    match requested {
        Some(v) => Some(Cow::Owned(v)),
        None => profile.and_then(f).map(Cow::Borrowed),
    }
}

/// The kind of a source to build; a profile is not one.
fn kind_of(source: &Source) -> Result<VolumeKind, String> {
    // The configuration refuses a profile that names a profile; should one get here anyway,
    // refuse the pod rather than guess a volume.
    match source {
        Source::EmptyDir(_) => Ok(VolumeKind::EmptyDir),
        Source::Csi(_) => Ok(VolumeKind::Csi),
        Source::Ephemeral(_) => Ok(VolumeKind::Ephemeral),
        Source::Profile(p) => Err(format!("profile {p:?} names another profile")),
    }
}

fn set_size(source: &mut Source, size: &str) -> Result<(), String> {
    match source {
        Source::EmptyDir(e) => e.size_limit = Some(K8sQuantity(size.to_owned())),
        Source::Ephemeral(e) => {
            let Some(t) = e.volume_claim_template.as_mut() else {
                return Err("ephemeral.volumeClaimTemplate is required".into());
            };
            t.spec
                .resources
                .get_or_insert_with(Default::default)
                .requests
                .get_or_insert_with(Default::default)
                .insert("storage".into(), K8sQuantity(size.to_owned()));
        }
        Source::Csi(_) => return Err("size does not apply to a CSI inline volume".into()),
        Source::Profile(p) => return Err(format!("profile {p:?} names another profile")),
    }
    Ok(())
}

/// A profile's source as the patch will carry it, with its size: computed once per load.
pub(crate) fn compile_source(source: &Source) -> Result<CompiledSource, String> {
    let kind = kind_of(source)?;
    let (size, medium) = size_of(source)?;
    let json = match source {
        Source::EmptyDir(e) => serde_json::to_string(e),
        Source::Csi(c) => serde_json::to_string(c),
        Source::Ephemeral(e) => serde_json::to_string(e),
        Source::Profile(_) => return Err("a profile is not a volume source".into()),
    }
    .map_err(|e| e.to_string())?;
    Ok(CompiledSource {
        kind,
        json: RawValue::from_string(json).map_err(|e| e.to_string())?,
        size,
        medium,
    })
}

/// The requested size (emptyDir sizeLimit or PVC storage request) and the emptyDir's medium.
fn size_of(source: &Source) -> Result<(Option<Quantity>, Medium), String> {
    let parse = |q: &K8sQuantity| crate::annotation::parse_size("size", &q.0).map_err(|e| e.0);
    let medium = Medium::of(source);
    if let Source::EmptyDir(e) = source {
        let size = e.size_limit.as_ref().map(parse).transpose()?;
        return Ok((size, medium));
    }
    if let Source::Ephemeral(e) = source
        && let Some(t) = &e.volume_claim_template
    {
        let size = t
            .spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(parse)
            .transpose()?;
        return Ok((size, medium));
    }
    Ok((None, medium))
}

fn check_allowlists(policy: &crate::config::Policy, source: &Source) -> Result<(), String> {
    if let (Some(allowed), Source::Csi(csi)) = (&policy.csi_drivers, source)
        && !allowed.contains(&csi.driver)
    {
        return Err(format!(
            "CSI driver {:?} is not in policy.csiDrivers ({})",
            csi.driver,
            allowed.join(", ")
        ));
    }
    if let (Some(allowed), Source::Ephemeral(e)) = (&policy.storage_classes, source)
        && let Some(t) = &e.volume_claim_template
    {
        match &t.spec.storage_class_name {
            Some(sc) if allowed.contains(sc) => {}
            Some(sc) => {
                return Err(format!(
                    "storage class {sc:?} is not in policy.storageClasses ({})",
                    allowed.join(", ")
                ));
            }
            None => {
                return Err(format!(
                    "a storage class is required by policy.storageClasses ({}); set storageClass",
                    allowed.join(", ")
                ));
            }
        }
    }
    Ok(())
}

// === impl the patch ===

type Group<'a, 'p> = (
    &'static str,
    &'a [ContainerView<'p>],
    for<'x> fn(&'x Planned<'_>) -> &'x Targets,
);

/// Serialises the items of an iterator as a JSON array, without collecting them.
struct SeqOf<I>(I);

impl<I> serde::Serialize for SeqOf<I>
where
    I: Iterator + Clone,
    I::Item: serde::Serialize,
{
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.clone())
    }
}

/// Checks the plan against the pod (conflicts, what is already there) and writes the patch:
/// volumes, then mounts, then env, then the record. Should a conflict turn up half-way, the
/// caller drops the whole outcome.
fn apply(
    injected_key: (&str, &str),
    pod: &PodView,
    target: Target<'_>,
    planned: &[Planned],
    out: &mut Outcome,
) -> Result<(), Denial> {
    let base = target.base;
    let conflict = |m: String| Denial {
        reason: DenyReason::Conflict,
        message: m,
    };

    // Volumes: identical ones count as done, different ones are conflicts.
    let mut new_volumes: Vec<&Planned> = Vec::with_capacity(planned.len());
    for p in planned {
        match pod.volume_named(p.name) {
            None => new_volumes.push(p),
            Some(raw) => {
                let existing: Value = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
                let desired = serde_json::to_value(&p.volume).unwrap_or(Value::Null);
                if let Err(differs) = same_volume(&desired, &existing) {
                    return Err(conflict(format!(
                        "volume {:?} ({}): the pod already has a volume with this name, {differs}; \
                         rename one of them",
                        p.name,
                        p.origin.describe(p.name)
                    )));
                }
            }
        }
    }
    let mut path = String::with_capacity(64);
    path.push_str(base);
    path.push_str("/spec/volumes");
    let has_volumes = pod.spec.as_ref().is_some_and(|s| s.volumes.is_some());
    push_all(
        &mut out.patch,
        has_volumes,
        &mut path,
        new_volumes.iter().map(|p| &p.volume),
    )?;
    for p in &new_volumes {
        out.injected.push((p.name.to_owned(), p.kind));
        if let Some(size) = p.size.filter(|s| s.is_implausible_size()) {
            out.warnings.push(format!(
                "volume {}: size {size} is less than a kibibyte or a fraction of a byte; \
                 did you mean Mi, Gi or M, G?",
                p.name
            ));
        }
        if p.medium == Medium::Memory && p.size.is_none() {
            out.warnings.push(format!(
                "volume {}: a Memory emptyDir without a size can use all of the pod's memory; set size",
                p.name
            ));
        }
    }

    // Mounts, per container; the same checks for app and init containers. Env ops wait in
    // their own patch so that they follow every mount.
    let groups: [Group<'_, '_>; 2] = [
        ("containers", pod.containers(), |p| &p.containers),
        ("initContainers", pod.init_containers(), |p| {
            &p.init_containers
        }),
    ];
    let mut env_ops: Option<Patch> = None;
    let mut new_mounts: Vec<&Planned> = Vec::with_capacity(planned.len());
    let mut new_env: Vec<EnvValue<'_>> = Vec::new();
    for (field, list, targets_of) in groups {
        for (i, c) in list.iter().enumerate() {
            let mut mine = planned
                .iter()
                .filter(|p| targets_of(p).contains(i))
                .peekable();
            if mine.peek().is_none() {
                continue;
            }
            new_mounts.clear();
            new_env.clear();
            for p in mine {
                // One path, one spelling: `/scratch/`, `/scratch//` and `/./scratch` are `/scratch`.
                let want = normalize_path(&p.mount_path);
                let taken = c
                    .volume_mounts
                    .iter()
                    .flatten()
                    .map(|m| (normalize_path(&m.mount_path), &*m.name))
                    .chain(
                        new_mounts
                            .iter()
                            .map(|m| (normalize_path(&m.mount_path), m.name)),
                    )
                    .find(|(path, _)| *path == want);
                match taken {
                    Some((_, v)) if v == p.name => {}
                    Some((_, other)) => {
                        return Err(conflict(format!(
                            "volume {:?}: container {:?} already mounts volume {other:?} at {}",
                            p.name, c.name, p.mount_path
                        )));
                    }
                    None => {
                        new_mounts.push(p);
                        warn_mount(p, c, out);
                    }
                }
                for var in p.env.iter() {
                    match c.env.iter().flatten().find(|e| *e.name == **var) {
                        Some(e) if e.value.as_deref() == Some(&*p.mount_path) => {}
                        Some(_) => out.warnings.push(format!(
                            "volume {}: container {} already sets {var}; left alone",
                            p.name, c.name
                        )),
                        None if new_env.iter().any(|e| e.name == var) => {
                            out.warnings.push(format!(
                                "volume {}: {var} is set by another volume in container {}; left alone",
                                p.name, c.name
                            ))
                        }
                        None => new_env.push(EnvValue {
                            name: var,
                            value: &p.mount_path,
                        }),
                    }
                }
            }
            let at = |path: &mut String, leaf: &str| {
                path.clear();
                path.push_str(base);
                path.push_str("/spec/");
                path.push_str(field);
                path.push('/');
                push_index(path, i);
                path.push('/');
                path.push_str(leaf);
            };
            at(&mut path, "volumeMounts");
            push_all(
                &mut out.patch,
                c.volume_mounts.is_some(),
                &mut path,
                new_mounts.iter().map(|p| p.mount()),
            )?;
            if !new_env.is_empty() {
                at(&mut path, "env");
                push_all(
                    env_ops.get_or_insert_with(|| Patch::with_capacity(256)),
                    c.env.is_some(),
                    &mut path,
                    new_env.iter(),
                )?;
            }
        }
    }
    if let Some(env_ops) = &env_ops {
        out.patch.append(env_ops);
    }

    // The record: every volume the webhook manages on this pod, done now or before.
    let mut record = String::with_capacity(planned.iter().map(|p| p.name.len() + 1).sum());
    for p in planned {
        if !record.is_empty() {
            record.push(',');
        }
        record.push_str(p.name);
    }
    annotate(
        pod,
        target,
        injected_key,
        &record,
        &mut out.patch,
        &mut path,
    )
    .map_err(unwritable)?;
    Ok(())
}

/// Appends a decimal index (a JSON-pointer array token) without the formatting machinery.
fn push_index(path: &mut String, i: usize) {
    match u8::try_from(i) {
        Ok(d @ 0..=9) => path.push(char::from(b'0' + d)),
        _ => {
            use std::fmt::Write as _;
            let _ = write!(path, "{i}");
        }
    }
}

/// Serialising the patch cannot fail for these types; should it, the pod is refused.
fn unwritable(e: serde_json::Error) -> Denial {
    Denial {
        reason: DenyReason::Invalid,
        message: format!("the patch could not be written: {e}"),
    }
}

fn warn_mount(p: &Planned, c: &ContainerView, out: &mut Outcome) {
    if p.kind != VolumeKind::EmptyDir {
        return;
    }
    let resources = c.resources.as_ref();
    let limits = resources.and_then(|r| r.limits.as_ref());
    let requests = resources.and_then(|r| r.requests.as_ref());
    let quantity =
        |q: Option<&crate::pod::QuantityText<'_>>| q.and_then(|q| q.parse::<Quantity>().ok());
    if p.medium == Medium::Memory {
        if let (Some(size), Some(limit)) =
            (p.size, quantity(limits.and_then(|l| l.memory.as_ref())))
            && size > limit
        {
            out.warnings.push(format!(
                "volume {}: Memory emptyDir size {size} exceeds the memory limit {limit} of container {}",
                p.name, c.name
            ));
        }
    } else if p.medium == Medium::Disk
        && p.size.is_none()
        && quantity(requests.and_then(|r| r.ephemeral_storage.as_ref())).is_none()
    {
        out.warnings.push(format!(
            "volume {}: emptyDir without a size on container {}, which has no ephemeral-storage request; it can fill the node's disk",
            p.name, c.name
        ));
    }
}

/// Adds `items` to the array at `path`: the whole array when it is missing, else one `/-`
/// append each. `path` is a scratch buffer holding the array's path.
fn push_all<I>(patch: &mut Patch, exists: bool, path: &mut String, items: I) -> Result<(), Denial>
where
    I: Iterator + Clone,
    I::Item: serde::Serialize,
{
    if items.clone().next().is_none() {
        return Ok(());
    }
    if exists {
        path.push_str("/-");
        for item in items {
            patch.add(path, &item).map_err(unwritable)?;
        }
    } else {
        patch.add(path, &SeqOf(items)).map_err(unwritable)?;
    }
    Ok(())
}

/// Sets one annotation, creating `metadata` or `annotations` as needed; nothing if already set.
/// `key` is the annotation key and its JSON-pointer token; `path` is a scratch buffer.
fn annotate(
    pod: &PodView,
    target: Target<'_>,
    (key, token): (&str, &str),
    value: &str,
    patch: &mut Patch,
    path: &mut String,
) -> Result<(), serde_json::Error> {
    path.clear();
    path.push_str(target.base);
    path.push_str("/metadata");
    match pod.metadata.as_ref().map(|m| m.annotations.as_ref()) {
        None => patch.add(
            path,
            &MetadataWith {
                annotations: Entry(key, value),
            },
        ),
        Some(None) => {
            path.push_str("/annotations");
            patch.add(path, &Entry(key, value))
        }
        Some(Some(a)) if a.get(key).map(|v| &**v) == Some(value) => Ok(()),
        Some(Some(_)) => {
            path.push_str("/annotations/");
            path.push_str(token);
            patch.add(path, value)
        }
    }
}

/// Is the pod's volume of this name the one we would write? Only an identical source counts:
/// same kind, same fields. Identical allows for what the API server does between two calls of
/// the webhook (reinvocation): it drops zero values (`medium: ""`, `readOnly: false`), adds
/// `volumeClaimTemplate.metadata: {}` and `volumeMode: Filesystem`, and canonicalises
/// quantities (`1024Mi` → `1Gi`). The error says how they differ.
fn same_volume(desired: &Value, existing: &Value) -> Result<(), String> {
    let source_of = |v: &Value| -> Option<(String, Value)> {
        let obj = v.as_object()?;
        let mut sources = obj.iter().filter(|(k, _)| k.as_str() != "name");
        let (kind, source) = sources.next()?;
        sources
            .next()
            .is_none()
            .then(|| (kind.clone(), canonical(source, kind).unwrap_or(Value::Null)))
    };
    let (Some((want_kind, want)), Some((have_kind, have))) =
        (source_of(desired), source_of(existing))
    else {
        return Err("which is not a single volume source".into());
    };
    if want_kind != have_kind {
        return Err(format!("of kind {have_kind}, not {want_kind}"));
    }
    if want != have {
        return Err(format!(
            "with other {have_kind} settings ({have} here, {want} asked)"
        ));
    }
    Ok(())
}

/// A value as the API server would store it: zero values and defaults dropped, quantities in
/// one spelling. `None` when nothing is left.
fn canonical(v: &Value, key: &str) -> Option<Value> {
    match v {
        Value::Object(o) => {
            let kept: serde_json::Map<String, Value> = o
                .iter()
                .filter_map(|(k, v)| canonical(v, k).map(|v| (k.clone(), v)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        Value::Array(a) if a.is_empty() => None,
        Value::Array(a) => Some(Value::Array(
            a.iter()
                .map(|v| canonical(v, "").unwrap_or(Value::Null))
                .collect(),
        )),
        Value::Null | Value::Bool(false) => None,
        Value::String(s) if s.is_empty() => None,
        Value::String(s) if key == "volumeMode" && s == "Filesystem" => None,
        Value::String(s) if matches!(key, "sizeLimit" | "storage") => Some(Value::String(
            s.parse::<Quantity>()
                .map_or_else(|_| s.clone(), |q| q.to_string()),
        )),
        Value::Number(n) if n.as_f64() == Some(0.0) => None,
        other => Some(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planned_volumes_serialise_exactly_as_kubernetes_volumes() {
        use k8s_openapi::api::core::v1::Volume;
        let cfg = Config::parse(
            "profiles:\n  e: {mountPath: /s, ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], storageClassName: gp3, resources: {requests: {storage: 1Gi}}}}}}\n  m: {mountPath: /m, emptyDir: {medium: Memory, sizeLimit: 1Gi}}\n  c: {mountPath: /c, csi: {driver: secrets-store.csi.k8s.io, readOnly: true, volumeAttributes: {secretProviderClass: db}}}\n",
        )
        .unwrap();
        for (name, profile) in &cfg.profiles {
            let mut theirs = Volume {
                name: "vol".into(),
                ..Volume::default()
            };
            match profile.source.clone() {
                Source::EmptyDir(e) => theirs.empty_dir = Some(e),
                Source::Csi(c) => theirs.csi = Some(c),
                Source::Ephemeral(e) => theirs.ephemeral = Some(*e),
                Source::Profile(_) => unreachable!("profiles name sources"),
            }
            let theirs = serde_json::to_string(&theirs).unwrap();
            let compiled = &cfg.profile_sources[name];
            assert_eq!(kind_of(&profile.source), Ok(compiled.kind), "{name}");
            let planned = [
                PlannedVolume::Profile {
                    name: "vol",
                    kind: compiled.kind,
                    source: &compiled.json,
                },
                PlannedVolume::Built {
                    name: "vol",
                    source: profile.source.clone(),
                },
            ];
            for p in planned {
                assert_eq!(serde_json::to_string(&p).unwrap(), theirs, "{name}: {p:?}");
            }
        }
        let profile = PlannedVolume::Built {
            name: "vol",
            source: Source::Profile("p".into()),
        };
        assert!(serde_json::to_string(&profile).is_err());
    }
}
