//! The decision: from a pod's annotations, the matching rules and the configuration to one
//! [`Decision`]. Pure: no I/O, no clock, no logging.
//!
//! Planning, then writing:
//! - `request` collects what the pod asks for (its annotations, then the matching rules);
//! - `resolve` turns each request into a volume to add: profile defaults, size, the
//!   `policy` limits, the containers it `targets`, the cluster checks;
//! - `plan` sets the volumes against the pod (`existing` compares with what it has) and
//!   decides every change and warning;
//! - `write` turns the plan into a JSON Patch, knowing nothing of policy.

mod blame;
pub mod bounds;
mod existing;
mod near_miss;
mod plan;
mod policy;
mod request;
mod resolve;
mod targets;
mod write;

use std::borrow::Cow;

use crate::{
    cluster::{Finding, KnownCluster, Mode as ClusterMode},
    config::{Config, OnError, Policy},
    decision::{Decision, Denial, DenyReason},
    echo,
    pod::PodView,
    volume::{InitTargets, Medium, Requested, VolumeKind, VolumeRequest},
};

use self::{
    blame::{Blame, Sources},
    plan::Plan,
    request::{Request, Scope},
    resolve::{Resolutions, Resolved},
};

/// Where the pod is: the namespace its rules are matched in, and where it sits in the object
/// the patch applies to.
#[derive(Debug, Clone, Copy)]
pub struct PodLocation<'a> {
    /// The AdmissionRequest's namespace (the object's own is often empty).
    pub namespace: &'a str,
    /// JSON pointer to the pod in the patched object: `""` for a Pod, `/spec/template` for a
    /// workload's pod template.
    pub pointer: &'a str,
}

/// A rule's volume as the webhook resolves it, for what does not depend on the pod (the
/// admission policies write it): its source with the policy's default size, and its mount.
/// The request's containers and a size from the containers' requests are not read.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleVolume {
    /// Its kind.
    pub kind: VolumeKind,
    /// The source object (`emptyDir`, `csi` or `ephemeral`'s value).
    pub source: serde_json::Value,
    /// The mount's fields: the request's own, else its profile's.
    pub mount_path: String,
    /// `readOnly`, when set.
    pub read_only: Option<bool>,
    /// `subPath`, when set.
    pub sub_path: Option<String>,
    /// The variables set to the mount path.
    pub env: Vec<String>,
    /// The containers it goes to, by name: every one when `None`.
    pub containers: Option<Vec<String>>,
    /// The init containers it goes to.
    pub init_containers: InitTargets,
    /// Its size is the targeted containers' largest ephemeral-storage request (`source` holds
    /// a stand-in).
    pub size_from_request: bool,
    /// Where an emptyDir lives (its cap).
    pub medium: Medium,
}

/// [`RuleVolume`] of volume `name` of rule `rule` under `policy` (the namespace's), or the
/// webhook's refusal of it in any pod.
pub fn rule_volume(
    cfg: &Config,
    policy: &Policy,
    rule: &str,
    name: &str,
    request: &VolumeRequest,
) -> Result<RuleVolume, Denial> {
    // The containers it names, the request's own or its profile's (whether a pod has them is
    // decided pod by pod).
    let profile = match &request.source {
        Requested::Profile(p) => cfg.profiles.get(p),
        Requested::Inline(_) => None,
    };
    // A profile's `size: request` gives way to a size of the rule's own.
    let size_from_request = request.size_from_request
        || (request.size.is_none() && profile.is_some_and(|p| p.size_from_request));
    let profile = profile.map(|p| &p.mount);
    let containers =
        (request.mount.containers.clone()).or_else(|| profile.and_then(|m| m.containers.clone()));
    let init_containers = (request.mount.init_containers.clone())
        .or_else(|| profile.and_then(|m| m.init_containers.clone()))
        .unwrap_or(InitTargets::None);
    // Each with a request, for a size from the requests (a stand-in, `size_from_request`).
    let named = |names: &[String]| -> Vec<serde_json::Value> {
        names
            .iter()
            .map(|n| serde_json::json!({"name": n, "resources": {"requests": {"ephemeral-storage": "1"}}}))
            .collect()
    };
    let init = match &init_containers {
        InitTargets::Named(names) => named(names),
        _ => Vec::new(),
    };
    let spec = serde_json::json!({"spec": {
        "containers": named(containers.as_deref().unwrap_or(&["c".to_owned()])),
        "initContainers": init}});
    let text = spec.to_string();
    let pod: PodView = serde_json::from_str(&text).map_err(|e| Denial::invalid(e.to_string()))?;
    let request = Request {
        name,
        origin: request::Origin::Rule(rule),
        request: request.clone(),
    };
    let v = resolve::resolve(cfg, policy, None, &pod, request)?;
    Ok(RuleVolume {
        kind: v.kind,
        source: serde_json::from_str(v.source.get()).map_err(|e| Denial::invalid(e.to_string()))?,
        mount_path: v.mount_path.into_owned(),
        read_only: v.read_only,
        sub_path: v.sub_path.map(Cow::into_owned),
        env: v.env.into_owned(),
        containers,
        init_containers,
        size_from_request,
        medium: v.medium,
    })
}

/// Decides for one pod. `cluster`: what is known of the cluster, for the cluster checks
/// (`None`: nothing, no checks).
pub fn decide(
    cfg: &Config,
    cluster: Option<KnownCluster<'_>>,
    pod: &PodView,
    at: PodLocation<'_>,
) -> Decision {
    decide_audited(cfg, cluster, pod, at).0
}

/// What an audited rule, profile or default would have done to a pod: the decision had they
/// been enforced, told apart from the one made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audit {
    /// What was audited: `rule/<name>`, `profile/<name>`, `mode/audit` (inline annotation
    /// volumes under the top-level `mode: audit`). Bounded by the configuration: a metric label.
    pub sources: Vec<String>,
    /// The label of the decision enforcing them would have made (`mutated`, `denied`, …).
    pub result: &'static str,
    /// What it would have done, in words (also the API warning).
    pub message: String,
}

/// [`decide`], and the audit when something audited would have changed the decision: the pod
/// is decided twice then, once with every request (as if all were enforced) and once without
/// the audited ones; the second is the decision, the first is reported, credited to the
/// audited sources that made it (the volumes it would inject, or the requests it would be
/// refused for).
pub fn decide_audited(
    cfg: &Config,
    cluster: Option<KnownCluster<'_>>,
    pod: &PodView,
    at: PodLocation<'_>,
) -> (Decision, Option<Audit>) {
    // The annotations are read once; what the two scopes ask for is made of them.
    let read = request::annotations(cfg, pod);
    if !cfg.audits() {
        let requests = read.and_then(|r| r.all(cfg, pod, at.namespace));
        let decision =
            decide_for_scope(cfg, cluster, pod, at, requests, None, &mut Blame::default());
        return (decision, None);
    }
    let (all, enforced) = match &read {
        Ok(r) => (
            r.in_scope(cfg, pod, at.namespace, Scope::All),
            r.in_scope(cfg, pod, at.namespace, Scope::Enforced),
        ),
        Err(d) => (Err(d.clone()), Err(d.clone())),
    };
    // What both scopes ask for is resolved once, for the first; the second plans it again.
    let mut kept = Resolutions::default();
    let mut blame = Blame::default();
    let full = decide_for_scope(cfg, cluster, pod, at, all, Some(&mut kept), &mut blame);
    let mut enforced = decide_for_scope(
        cfg,
        cluster,
        pod,
        at,
        enforced,
        Some(&mut kept),
        &mut Blame::default(),
    );
    if full == enforced {
        return (enforced, None);
    }
    let sources = if blame.0.is_empty() {
        vec![request::MODE_AUDIT.to_owned()]
    } else {
        blame.0
    };
    let would = match &full {
        Decision::Denied(d) => format!("would refuse the pod ({}): {}", d.code(), d.message),
        Decision::AdmittedDespiteError { denial, .. } => {
            format!(
                "would admit the pod without its volumes: {}",
                denial.message
            )
        }
        Decision::Mutated { injected, .. } => {
            let more: Vec<&str> = injected
                .iter()
                .filter(|v| !enforced.injected().contains(v))
                .map(|(n, _)| n.as_str())
                .collect();
            match more.as_slice() {
                [] => "would change the pod otherwise".to_owned(),
                names => format!("would inject {}", names.join(", ")),
            }
        }
        Decision::Unchanged { .. } => "would leave the pod unchanged".to_owned(),
    };
    let message = format!("audit ({}): {would}", sources.join(", "));
    enforced.add_warnings(vec![message.clone()]);
    let audit = Audit {
        sources,
        result: full.label(),
        message,
    };
    (enforced, Some(audit))
}

fn decide_for_scope<'a>(
    cfg: &'a Config,
    cluster: Option<KnownCluster<'_>>,
    pod: &PodView,
    at: PodLocation<'_>,
    requests: Result<(Vec<Request<'a>>, Vec<Denial>), Denial>,
    kept: Option<&mut Resolutions<'a>>,
    blame: &mut Blame,
) -> Decision {
    match requests.and_then(|r| decide_requests(cfg, cluster, pod, at, r, kept, blame)) {
        Ok(mut decision) => {
            decision.add_warnings(near_miss::near_misses(cfg, pod));
            decision.printable_warnings();
            decision.bound_warnings(bounds::MAX_WARNINGS);
            decision
        }
        Err(mut denial) => {
            // Escaped before it is cut: what is cut is what is sent, the status annotation
            // and the log included.
            if let Cow::Owned(escaped) = echo::printable(&denial.message) {
                denial.message = escaped;
            }
            if let Cow::Owned(cut) = echo::reasons(&denial.message, echo::MESSAGE_LIMIT) {
                denial.message = cut;
            }
            apply_on_error(cfg, pod, at, denial)
        }
    }
}

fn decide_requests<'a>(
    cfg: &'a Config,
    cluster: Option<KnownCluster<'_>>,
    pod: &PodView,
    at: PodLocation<'_>,
    (requests, mut errors): (Vec<Request<'a>>, Vec<Denial>),
    kept: Option<&mut Resolutions<'a>>,
    blame: &mut Blame,
) -> Result<Decision, Denial> {
    // Off, or nothing known: no checks. Enforcing on incomplete lists would refuse pods for
    // objects not yet seen: warn until they are complete.
    let checks = match (cfg.cluster_checks, cluster) {
        (ClusterMode::Off, _) | (_, None) => None,
        (ClusterMode::Enforce, Some(k)) if !k.complete => Some((k.state, ClusterMode::Warn)),
        (mode, Some(k)) => Some((k.state, mode)),
    };
    let namespaces = cluster.map(|k| &k.state.namespaces);
    // Which audited source each request has, credited with what this decision does.
    let credited = cfg.audits();
    let sources = Sources::of(cfg, credited, &requests);
    // An annotation that cannot be read is audited under the default `mode: audit` (the
    // enforced decision drops it).
    if !errors.is_empty() && credited && cfg.mode == crate::config::Mode::Audit {
        blame.add(Some(&request::MODE_AUDIT.to_owned()));
    }
    if requests.is_empty() {
        combine(errors)?;
        return Ok(Decision::Unchanged {
            warnings: Vec::new(),
        });
    }
    if pod.containers().is_empty() {
        return Err(Denial::invalid(
            "the pod has no containers to mount volumes in",
        ));
    }
    // Refusals of the pod as a whole, not of one request: credited to every audited one.
    let whole = |blame: &mut Blame, d: Denial| {
        sources.all(blame);
        d
    };
    // The policy of the pod's namespace (policyOverrides), its labels read from the cluster
    // when an override selects by label.
    let policy = match cfg.policy_for(at.namespace, namespaces.and_then(|n| n.get(at.namespace))) {
        Ok(policy) => policy,
        // Rule volumes are the admin's, trusted: they do not wait for the namespace's labels
        // (their limits are the top-level policy's meanwhile). A pod's own annotations do.
        Err(_) if requests.iter().all(|r| !r.origin.is_annotation()) => &cfg.policy,
        Err(m) => return Err(whole(blame, Denial::new(DenyReason::Cluster, m))),
    };
    // Counted before anything is resolved or planned: a pod past either bound costs no more
    // than reading its annotations.
    bounds::volumes(requests.len()).map_err(|d| whole(blame, d))?;
    if let Err(over) = policy::volume_count(policy, requests.len()) {
        // With the annotations' own errors, so that all are fixed in one try.
        return Err(whole(blame, combined(errors, over)));
    }
    // Every problem at once: the requests that could be read are resolved, and those that
    // resolved are set against the pod, whatever the others' errors.
    let cluster = checks.map(|c| c.0);
    let mut volumes = Vec::with_capacity(requests.len());
    for (i, resolved) in resolve::all(cfg, policy, cluster, pod, requests, kept).enumerate() {
        match resolved {
            Ok(v) => volumes.push(v),
            Err(d) => {
                errors.push(d);
                sources.at(i, blame);
            }
        }
    }
    let per_op = bounds::per_operation(at.pointer);
    let (containers, init_containers) = (pod.containers().len(), pod.init_containers().len());
    let costs = volumes
        .iter()
        .map(|v| v.patch_cost(containers, init_containers, per_op));
    bounds::patch(costs, per_op).map_err(|d| whole(blame, d))?;
    let mode = checks.map_or(ClusterMode::Off, |c| c.1);
    let plan = planned(cfg, pod, &volumes, mode, errors, &sources, blame)?;
    written(at.pointer, plan, &sources, blame)
}

/// The decision the plan makes: its patch written (held to the patch bound) and what it
/// injects credited to what audits each volume.
fn written(
    pointer: &str,
    plan: Plan<'_>,
    sources: &Sources<'_>,
    blame: &mut Blame,
) -> Result<Decision, Denial> {
    let patch = write::patch_of(pointer, &plan).inspect_err(|_| sources.all(blame))?;
    if patch.len() > bounds::MAX_PATCH_BYTES {
        // Never past the estimate checked before the plan; held here all the same.
        sources.all(blame);
        return Err(Denial::policy(format!(
            "the patch is {} bytes, more than the {} a patch may have",
            patch.len(),
            bounds::MAX_PATCH_BYTES
        )));
    }
    for (name, _) in &plan.injected {
        sources.named(name, blame);
    }
    Ok(if patch.is_empty() {
        Decision::Unchanged {
            warnings: plan.warnings,
        }
    } else {
        Decision::Mutated {
            patch,
            injected: plan.injected,
            warnings: plan.warnings,
        }
    })
}

/// The plan of the resolved volumes against the pod, with what the cluster checks found; a
/// denial with every error so far (`errors`) when there is any.
fn planned<'p>(
    cfg: &'p Config,
    pod: &'p PodView,
    volumes: &'p [Resolved<'p>],
    mode: ClusterMode,
    mut errors: Vec<Denial>,
    sources: &Sources<'_>,
    blame: &mut Blame,
) -> Result<Plan<'p>, Denial> {
    let before = errors.len();
    let mut plan = plan::place_volumes(pod, volumes, &cfg.injected, &mut errors);
    if errors.len() > before {
        // Conflicts with the pod or between volumes: each of the volumes may be the cause.
        for v in volumes {
            sources.named(v.name, blame);
        }
    }
    combine(errors)?;
    let unavailable = unavailable(mode, volumes).inspect_err(|_| {
        for v in volumes
            .iter()
            .filter(|v| matches!(v.cluster, Some(Finding::Unavailable(_))))
        {
            sources.named(v.name, blame);
        }
    })?;
    for v in volumes {
        if let Some(Finding::Suspect(m)) = &v.cluster {
            plan.warnings.push(format!("volume {}: {m}", v.name));
        }
    }
    // clusterChecks: warn: injected all the same; the warning and the status annotation say
    // what the cluster lacks.
    if !unavailable.is_empty() {
        let value = unavailable.join("; ");
        plan.warnings.extend(unavailable);
        plan.annotate(pod, &cfg.cluster_check, value);
    }
    Ok(plan)
}

/// The volumes the cluster cannot provide: a denial under `clusterChecks: enforce`, else
/// their messages (for `warn`).
fn unavailable(mode: ClusterMode, volumes: &[Resolved]) -> Result<Vec<String>, Denial> {
    let unavailable: Vec<String> = volumes
        .iter()
        .filter_map(|v| match &v.cluster {
            Some(Finding::Unavailable(m)) => Some(format!("{}: {m}", v.origin.describe(v.name))),
            _ => None,
        })
        .collect();
    if mode == ClusterMode::Enforce && !unavailable.is_empty() {
        return Err(Denial::new(DenyReason::Cluster, unavailable.join("; ")));
    }
    Ok(unavailable)
}

/// `onError`: refuse, or admit without the volumes, with a warning and the status annotation.
fn apply_on_error(cfg: &Config, pod: &PodView, at: PodLocation<'_>, denial: Denial) -> Decision {
    match cfg.on_error {
        OnError::Deny => Decision::Denied(denial),
        OnError::Warn => {
            let mut plan = Plan::new(pod);
            plan.annotate(pod, &cfg.error, denial.message.clone());
            match write::patch_of(at.pointer, &plan) {
                Ok(patch) => Decision::AdmittedDespiteError {
                    patch,
                    warnings: vec![format!("volumes not injected: {}", denial.message)],
                    denial,
                },
                // The status annotation could not be written: refuse rather than admit silently.
                Err(_) => Decision::Denied(denial),
            }
        }
    }
}

/// All errors of the worst kind at once, so a user fixes every annotation in one go.
fn combine(mut errors: Vec<Denial>) -> Result<(), Denial> {
    match errors.pop() {
        None => Ok(()),
        Some(last) => Err(combined(errors, last)),
    }
}

/// `errors` and `last` as one denial, of the worst reason among them.
fn combined(mut errors: Vec<Denial>, last: Denial) -> Denial {
    let mut reason = last.reason;
    errors.push(last);
    for d in &errors {
        reason = reason.min(d.reason);
    }
    let messages: Vec<String> = errors.into_iter().map(|d| d.message).collect();
    Denial::new(reason, messages.join("; "))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::cluster::ClusterState;

    /// Decides for a pod given as JSON and returns the decision and the pod as patched.
    fn run(cfg: &Config, cluster: Option<&ClusterState>, pod: &Value) -> (Decision, Value) {
        let text = pod.to_string();
        let view: PodView = serde_json::from_str(&text).unwrap();
        let known = cluster.map(|state| KnownCluster {
            state,
            complete: true,
        });
        let at = PodLocation {
            namespace: "nf",
            pointer: "",
        };
        let decision = decide(cfg, known, &view, at);
        let mut patched = pod.clone();
        if let Some(p) = decision.patch() {
            let ops: json_patch::Patch = serde_json::from_slice(p.as_bytes()).unwrap();
            json_patch::patch(&mut patched, &ops).unwrap();
        }
        (decision, patched)
    }

    #[test]
    fn an_audited_pods_second_decision_takes_what_the_first_resolved() {
        // An audited profile and an enforced inline volume: the enforced scope asks for the
        // inline one only, which the first decision (every request) resolved already.
        let cfg = Config::parse(
            "profiles:\n  big:\n    mode: audit\n    mountPath: /big\n    emptyDir: {sizeLimit: 1Gi}\n",
        )
        .unwrap();
        let text = json!({"metadata": {"annotations": {
            "ephemeral-volumes.io/big": "big",
            "ephemeral-volumes.io/s": "type=emptyDir,mountPath=/s,size=1Gi"}},
            "spec": {"containers": [{"name": "c"}]}})
        .to_string();
        let pod: PodView = serde_json::from_str(&text).unwrap();
        let at = PodLocation {
            namespace: "nf",
            pointer: "",
        };
        let read = request::annotations(&cfg, &pod).unwrap();
        let scope = |s| read.in_scope(&cfg, &pod, "nf", s);
        let mut kept = Resolutions::default();
        let full = decide_for_scope(
            &cfg,
            None,
            &pod,
            at,
            scope(Scope::All),
            Some(&mut kept),
            &mut Blame::default(),
        );
        assert_eq!(full.injected().len(), 2, "{full:?}");
        // What the first resolved stands for the second: a resolution changed in between is
        // what the second decision injects.
        for v in kept.0.values_mut().flatten() {
            v.mount_path = Cow::Borrowed("/kept");
        }
        let enforced = decide_for_scope(
            &cfg,
            None,
            &pod,
            at,
            scope(Scope::Enforced),
            Some(&mut kept),
            &mut Blame::default(),
        );
        let Decision::Mutated {
            patch, injected, ..
        } = &enforced
        else {
            panic!("{enforced:?}")
        };
        assert_eq!(
            injected.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["s"]
        );
        let patch = String::from_utf8_lossy(patch.as_bytes());
        assert!(patch.contains("\"/kept\""), "{patch}");
        // And the decision as a whole is the one without kept resolutions.
        let (decision, audit) = decide_audited(&cfg, None, &pod, at);
        assert!(
            matches!(&decision, Decision::Mutated { patch, .. } if String::from_utf8_lossy(patch.as_bytes()).contains("\"/s\"")),
            "{decision:?}"
        );
        assert!(audit.is_some_and(|a| a.sources == ["profile/big"]));
    }

    #[test]
    fn a_pod_without_metadata_gets_every_annotation() {
        // A workload's pod template may have no metadata; a rule can still match it. Under
        // clusterChecks: warn it gets two annotations, which must not overwrite each other.
        let cfg = Config::parse(
            "clusterChecks: warn\nrules:\n  - name: scratch\n    volumes:\n      s: type=ephemeral,storageClass=fast,size=1Gi,mountPath=/s\n",
        )
        .unwrap();
        let pod = json!({"spec": {"containers": [{"name": "c"}]}});
        let (decision, patched) = run(&cfg, Some(&ClusterState::default()), &pod);
        assert!(matches!(decision, Decision::Mutated { .. }), "{decision:?}");
        let annotations = &patched["metadata"]["annotations"];
        assert_eq!(annotations[&cfg.injected.key], "s");
        assert!(
            annotations[&cfg.cluster_check.key]
                .as_str()
                .is_some_and(|m| m.contains("StorageClass \"fast\"")),
            "{patched}"
        );
    }

    #[test]
    fn on_error_warn_admits_once_with_the_status_annotation_and_then_stays_quiet() {
        let cfg = Config::parse("onError: warn").unwrap();
        let pod = json!({"metadata": {"annotations": {"ephemeral-volumes.io/s": "type=nope"}},
                         "spec": {"containers": [{"name": "c"}]}});
        let (first, patched) = run(&cfg, None, &pod);
        let Decision::AdmittedDespiteError { denial, .. } = &first else {
            panic!("{first:?}")
        };
        assert_eq!(denial.reason, DenyReason::Invalid);
        assert_eq!(
            patched["metadata"]["annotations"][&cfg.error.key],
            denial.message.as_str()
        );
        // Reinvoked: still admitted despite the error, with nothing more to write.
        let (again, _) = run(&cfg, None, &patched);
        assert!(
            matches!(&again, Decision::AdmittedDespiteError { patch, .. } if patch.is_empty()),
            "{again:?}"
        );
        assert!(again.patch().is_none() && again.allowed());
    }

    /// Control characters and line or direction marks a pod put in its annotations' keys
    /// and values reach no refusal, warning or status annotation as they are.
    #[test]
    fn control_characters_of_a_pod_are_escaped_in_every_answer() {
        let unsafe_text = "a\nb\u{2028}c\u{1b}[31md\u{202e}e";
        let raw = |s: &str| s.chars().any(crate::echo::is_unsafe);
        let key = format!("ephemeral-volumes.io/{unsafe_text}");
        let value = format!("type=emptyDir,mountPath=/s,size={unsafe_text}");
        for on_error in ["deny", "warn"] {
            let cfg = Config::parse(&format!("onError: {on_error}")).unwrap();
            let pod = json!({"metadata": {"annotations": {&key: &value,
                                 format!("ephemeral-volume.io/{unsafe_text}"): "type=emptyDir,mountPath=/t"}},
                             "spec": {"containers": [{"name": "c"}]}});
            let (decision, patched) = run(&cfg, None, &pod);
            let message = match &decision {
                Decision::Denied(d) | Decision::AdmittedDespiteError { denial: d, .. } => {
                    d.message.clone()
                }
                other => panic!("{other:?}"),
            };
            assert!(!raw(&message), "{message:?}");
            assert!(message.contains("a\\nb\\u{2028}c\\u{1b}"), "{message}");
            for w in decision.warnings() {
                assert!(!raw(w), "{w:?}");
            }
            if on_error == "warn" {
                let note = patched["metadata"]["annotations"][&cfg.error.key]
                    .as_str()
                    .unwrap();
                assert!(!raw(note), "{note:?}");
            }
        }
        // A pod that is admitted: its warnings (a near miss of the prefix) are escaped too.
        let pod = json!({"metadata": {"annotations": {
                             format!("ephemeral-volume.io/{unsafe_text}"): "type=emptyDir,mountPath=/t"}},
                         "spec": {"containers": [{"name": "c"}]}});
        let (decision, _) = run(&Config::default(), None, &pod);
        assert!(!decision.warnings().is_empty(), "{decision:?}");
        for w in decision.warnings() {
            assert!(!raw(w), "{w:?}");
            assert!(w.contains("\\u{2028}"), "{w}");
        }
    }

    /// One annotation, every mistake in one answer: its fields, its values (a misspelt key
    /// whose field is certain checked as that field) and, on what could be read, the pod.
    #[test]
    fn every_mistake_of_one_annotation_is_in_the_first_refusal() {
        let cfg = Config::default();
        let value = "type=emptyDir,sizee=10Gi,mountpath=scratch,medium=memory,containers=mian";
        let pod = json!({"metadata": {"annotations": {"ephemeral-volumes.io/scratch": value}},
                         "spec": {"containers": [{"name": "main"}], "initContainers": [{"name": "setup"}]}});
        let (decision, _) = run(&cfg, None, &pod);
        let Decision::Denied(d) = &decision else {
            panic!("{decision:?}")
        };
        // The worst code decides the status: the annotation cannot be read (400).
        assert_eq!(d.reason, DenyReason::Invalid);
        for want in [
            "unknown field \"sizee\": did you mean size?",
            "unknown field \"mountpath\": did you mean mountPath?",
            "medium \"memory\" is not one of",
            "mountPath \"scratch\" must be an absolute path",
            "annotation ephemeral-volumes.io/scratch: container \"mian\" is not in the pod (its containers: main)",
        ] {
            assert!(d.message.contains(want), "{want:?} not in {}", d.message);
        }
        // Init containers too; and names that are in the pod add nothing.
        let value = "type=emptyDir,sizee=1Gi,mountPath=/s,containers=main,initContainers=stup";
        let pod = json!({"metadata": {"annotations": {"ephemeral-volumes.io/s": value}},
                         "spec": {"containers": [{"name": "main"}], "initContainers": [{"name": "setup"}]}});
        let (decision, _) = run(&cfg, None, &pod);
        let message = match &decision {
            Decision::Denied(d) => d.message.clone(),
            other => panic!("{other:?}"),
        };
        assert!(
            message.contains("init container \"stup\" is not in the pod"),
            "{message}"
        );
        assert!(!message.contains("container \"main\""), "{message}");
    }

    #[test]
    fn everything_there_already_is_unchanged_with_the_warnings_kept() {
        let cfg = Config::default();
        let pod = json!({"metadata": {"annotations": {"ephemeral-volumes.io/s": "type=emptyDir,size=1Gi,mountPath=/s,env=TMPDIR"}},
                         "spec": {"containers": [{"name": "c", "env": [{"name": "TMPDIR", "value": "/tmp"}]}]}});
        let (first, patched) = run(&cfg, None, &pod);
        assert_eq!(
            first.injected(),
            [("s".to_owned(), crate::volume::VolumeKind::EmptyDir)]
        );
        assert_eq!(
            first.warnings(),
            ["volume s: container c already sets TMPDIR; left alone"]
        );
        let (again, _) = run(&cfg, None, &patched);
        assert_eq!(
            again,
            Decision::Unchanged {
                warnings: first.warnings().to_vec()
            }
        );
    }
}
