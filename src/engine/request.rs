//! What a pod asks for: its annotations (checked against policy), then the volumes of every
//! rule that matches it (trusted: the admin wrote them).

use super::{bounds, targets};
use crate::{
    config::{Config, Mode},
    decision::Denial,
    pod::PodView,
    validate::{self, Invalid},
    volume::{Requested, VolumeRequest},
};

/// Which requests a decision serves: every one (what enforcing everything would do), or only
/// those not audited (what the webhook does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    All,
    Enforced,
}

/// Whether a request is audited: its rule is, the profile it names is, or (an annotation's
/// inline volume) the configuration's default is.
pub(super) fn audited(cfg: &Config, origin: &Origin<'_>, request: &VolumeRequest) -> bool {
    audited_rule(cfg, origin)
        || match &request.source {
            Requested::Profile(p) => cfg.audited_profiles.contains(p),
            Requested::Inline(_) => origin.is_annotation() && cfg.mode == Mode::Audit,
        }
}

fn audited_rule(cfg: &Config, origin: &Origin<'_>) -> bool {
    match origin {
        Origin::Rule(name) => cfg
            .rules
            .iter()
            .any(|r| r.name == *name && r.mode == Mode::Audit),
        Origin::Annotation(_) => false,
    }
}

/// What audits a request, for the warning and the metrics — `rule/<name>`, `profile/<name>`,
/// `mode/audit` (an annotation's inline volume under the default `mode: audit`; not its key,
/// which pods choose: the sources are metric labels) —, or `None` when it is enforced.
pub(super) fn audit_source(cfg: &Config, r: &Request<'_>) -> Option<String> {
    if !audited(cfg, &r.origin, &r.request) {
        return None;
    }
    Some(match (&r.origin, &r.request.source) {
        (Origin::Rule(rule), _) if audited_rule(cfg, &r.origin) => format!("rule/{rule}"),
        (_, Requested::Profile(p)) => format!("profile/{p}"),
        // What is left audited is an annotation's inline volume, under the default.
        _ => MODE_AUDIT.to_owned(),
    })
}

/// The source of what the default `mode: audit` audits: a pod's own inline volumes, and its
/// annotations that cannot be read.
pub(super) const MODE_AUDIT: &str = "mode/audit";

/// Where a request came from, for messages and for policy (borrowed from the pod or the
/// configuration, which outlive the decision).
#[derive(Debug, Clone, Copy)]
pub(super) enum Origin<'a> {
    /// An annotation, by key: held to the policy.
    Annotation(&'a str),
    /// A rule, by name: trusted.
    Rule(&'a str),
}

impl Origin<'_> {
    /// How messages name the request.
    pub(super) fn describe(&self, volume: &str) -> String {
        match self {
            Origin::Annotation(key) => format!("annotation {key}"),
            Origin::Rule(rule) => format!("rule {rule}, volume {volume}"),
        }
    }

    pub(super) fn is_annotation(&self) -> bool {
        matches!(self, Origin::Annotation(_))
    }
}

/// One volume asked for.
pub(super) struct Request<'a> {
    /// The volume's name (after the annotation prefix, or a rule's volume).
    pub name: &'a str,
    pub origin: Origin<'a>,
    pub request: VolumeRequest,
}

/// The volume an annotation key asks for: the name after the configured prefix and `/`.
fn volume_name<'k>(cfg: &Config, key: &'k str) -> Option<&'k str> {
    key.strip_prefix(cfg.prefix.as_str())?.strip_prefix('/')
}

/// Every volume the pod asks for, by name; an annotation wins over a rule for the same name,
/// and the first matching rule over later ones. Every annotation error, beside the requests
/// that could be read (a refused annotation still keeps its name from the rules).
pub(super) fn collect<'a>(
    cfg: &'a Config,
    pod: &'a PodView<'_>,
    namespace: &str,
    scope: Scope,
) -> Result<(Vec<Request<'a>>, Vec<Denial>), Denial> {
    // Counted first: the bound is checked before any annotation is read.
    let asked = pod.annotations().map_or(0, |a| {
        a.keys().filter(|k| volume_name(cfg, k).is_some()).count()
    });
    bounds::annotations(asked, &cfg.prefix)?;
    let mut requests = Vec::with_capacity(asked);
    let mut errors = Vec::new();
    let mut refused = Vec::new();
    for (key, value) in pod.annotations().into_iter().flatten() {
        let Some(name) = volume_name(cfg, key) else {
            continue;
        };
        let read = Read { cfg, pod, scope };
        if !read.annotation(&mut requests, key, name, value, &mut errors) {
            refused.push(name);
        }
    }
    rule_requests(cfg, pod, namespace, scope, &refused, &mut requests)?;
    requests.sort_by(|a, b| a.name.cmp(b.name));
    Ok((requests, errors))
}
/// What reads one annotation into a request.
struct Read<'a, 'p> {
    cfg: &'a Config,
    pod: &'a PodView<'p>,
    scope: Scope,
}

impl<'a> Read<'a, '_> {
    /// The annotation `key` (volume `name`) read into the list's next slot, which stays if the
    /// request is served in this scope; `false` when it is not (refused, or audited), with
    /// its errors.
    fn annotation(
        &self,
        requests: &mut Vec<Request<'a>>,
        key: &'a str,
        name: &'a str,
        value: &str,
        errors: &mut Vec<Denial>,
    ) -> bool {
        let (cfg, pod, scope) = (self.cfg, self.pod, self.scope);
        let origin = Origin::Annotation(key);
        // Parsed where it will live, the list's next slot (taken back unless it is kept):
        // a request returned by value was copied at every layer it passed through.
        let at = requests.len();
        requests.resize_with(at + 1, || Request {
            name,
            origin,
            request: VolumeRequest::placeholder(),
        });
        let Some(slot) = requests.last_mut() else {
            return false; // never: the slot was just added
        };
        let parsed = validate::dns_label("volume name", name)
            .and_then(|()| bounds::value(value).map_err(Invalid))
            .and_then(|()| slot.request.read(value));
        let kept = match parsed {
            Ok(()) => !(scope == Scope::Enforced && audited(cfg, &origin, &slot.request)),
            // Under the default `mode: audit` an unreadable annotation is audited too.
            Err(_) if scope == Scope::Enforced && cfg.mode == Mode::Audit => false,
            Err(e) => {
                errors.push(Denial::invalid(format!("annotation {key}: {}", e.0)));
                // The checks against the pod, on what could be read of it: every mistake of
                // the annotation in one answer (a misspelt container too, not on the next try).
                let mount = &slot.request.mount;
                if let Err(d) = targets::find(
                    pod,
                    mount.containers.as_deref(),
                    mount.init_containers.as_ref(),
                ) {
                    errors.push(Denial::new(
                        d.reason,
                        format!("annotation {key}: {}", d.message),
                    ));
                }
                false
            }
        };
        if !kept {
            requests.truncate(at);
        }
        kept
    }
}

/// The volumes of every rule that matches the pod, but those a request of the same name has
/// (an annotation wins over a rule, the first matching rule over later ones) or that a
/// refused annotation named.
fn rule_requests<'a>(
    cfg: &'a Config,
    pod: &PodView<'_>,
    namespace: &str,
    scope: Scope,
    refused: &[&str],
    requests: &mut Vec<Request<'a>>,
) -> Result<(), Denial> {
    // Labels are decoded only once a rule's namespaces match.
    let mut labels = None;
    for rule in cfg.rules.iter().filter(|r| r.in_namespace(namespace)) {
        if labels.is_none() {
            labels = Some(
                pod.labels()
                    .map_err(|e| Denial::invalid(format!("metadata.labels: {e}")))?,
            );
        }
        if !labels.as_ref().is_some_and(|l| rule.selects(l)) {
            continue;
        }
        for (name, request) in &rule.volumes {
            let origin = Origin::Rule(&rule.name);
            if scope == Scope::Enforced && audited(cfg, &origin, request) {
                continue;
            }
            if !requests.iter().any(|r| r.name == name) && !refused.contains(&name.as_str()) {
                requests.push(Request {
                    name,
                    origin,
                    request: request.clone(),
                });
            }
        }
    }
    Ok(())
}
