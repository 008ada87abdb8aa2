//! What a pod asks for: its annotations (checked against policy), then the volumes of every
//! rule that matches it (trusted: the admin wrote them).

use super::{bounds, targets};
use crate::{
    annotation::Unreadable,
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
/// inline volume, or a name that is no profile: an error of the annotation) the
/// configuration's default is.
pub(super) fn audited(cfg: &Config, origin: &Origin<'_>, request: &VolumeRequest) -> bool {
    audited_rule(cfg, origin)
        || match &request.source {
            Requested::Profile(p) if cfg.profiles.contains_key(p) => {
                cfg.audited_profiles.contains(p)
            }
            _ => origin.is_annotation() && cfg.mode == Mode::Audit,
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
        (_, Requested::Profile(p)) if cfg.profiles.contains_key(p) => format!("profile/{p}"),
        // What is left audited is an annotation's inline volume or a name that is no profile
        // (not the name: pods choose it, and the sources are metric labels), under the default.
        _ => MODE_AUDIT.to_owned(),
    })
}

/// The source of what the default `mode: audit` audits: a pod's own inline volumes, and its
/// annotations that cannot be read.
pub(super) const MODE_AUDIT: &str = "mode/audit";

/// Where a request came from, for messages and for policy (borrowed from the pod or the
/// configuration, which outlive the decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
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
#[derive(Clone)]
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

/// A pod's annotations of the prefix, each read once: the requests that could be read, every
/// error, and the names of those refused (a refused annotation still keeps its name from the
/// rules).
pub(super) struct Annotations<'a> {
    requests: Vec<Request<'a>>,
    errors: Vec<Denial>,
    refused: Vec<&'a str>,
}

/// Reads the pod's annotations of the prefix (their number bounded first).
pub(super) fn annotations<'a>(
    cfg: &'a Config,
    pod: &'a PodView<'_>,
) -> Result<Annotations<'a>, Denial> {
    // Counted first: the bound is checked before any annotation is read.
    let asked = pod.annotations().map_or(0, |a| {
        a.keys().filter(|k| volume_name(cfg, k).is_some()).count()
    });
    bounds::annotations(asked, &cfg.prefix)?;
    let mut read = Annotations {
        requests: Vec::with_capacity(asked),
        errors: Vec::new(),
        refused: Vec::new(),
    };
    for (key, value) in pod.annotations().into_iter().flatten() {
        let Some(name) = volume_name(cfg, key) else {
            continue;
        };
        match read_annotation(pod, key, name, value, &mut read.errors) {
            Some(request) => read.requests.push(request),
            None => read.refused.push(name),
        }
    }
    Ok(read)
}

impl<'a> Annotations<'a> {
    /// Every volume the pod asks for in this scope, by name — an annotation wins over a rule
    /// for the same name, and the first matching rule over later ones —, and every annotation
    /// error the scope reports. Enforced, an audited annotation is left out (its name still
    /// taken from the rules), and under the default `mode: audit` so is every error (an
    /// annotation that cannot be read is audited too).
    pub(super) fn in_scope(
        &self,
        cfg: &'a Config,
        pod: &PodView<'_>,
        namespace: &str,
        scope: Scope,
    ) -> Result<(Vec<Request<'a>>, Vec<Denial>), Denial> {
        let mut refused = self.refused.clone();
        let mut requests = Vec::with_capacity(self.requests.len());
        for r in &self.requests {
            if scope == Scope::Enforced && audited(cfg, &r.origin, &r.request) {
                refused.push(r.name);
            } else {
                requests.push(r.clone());
            }
        }
        let errors = match scope {
            Scope::Enforced if cfg.mode == Mode::Audit => Vec::new(),
            _ => self.errors.clone(),
        };
        rule_requests(cfg, pod, namespace, scope, &refused, &mut requests)?;
        requests.sort_by(|a, b| a.name.cmp(b.name));
        Ok((requests, errors))
    }

    /// [`Annotations::in_scope`] for every request, the annotations' own moved, not copied.
    pub(super) fn all(
        self,
        cfg: &'a Config,
        pod: &PodView<'_>,
        namespace: &str,
    ) -> Result<(Vec<Request<'a>>, Vec<Denial>), Denial> {
        let Annotations {
            mut requests,
            errors,
            refused,
        } = self;
        rule_requests(cfg, pod, namespace, Scope::All, &refused, &mut requests)?;
        requests.sort_by(|a, b| a.name.cmp(b.name));
        Ok((requests, errors))
    }
}
/// The annotation `key` (volume `name`) read; with its errors when it could not be, what
/// could be read of its mount checked against the pod all the same.
fn read_annotation<'a>(
    pod: &PodView<'_>,
    key: &'a str,
    name: &'a str,
    value: &str,
    errors: &mut Vec<Denial>,
) -> Option<Request<'a>> {
    let parsed = validate::dns_label("volume name", name)
        .and_then(|()| bounds::value(value).map_err(Invalid))
        .map_err(|error| Unreadable {
            error,
            mount: Box::default(),
        })
        .and_then(|()| VolumeRequest::parse(value));
    match parsed {
        Ok(request) => Some(Request {
            name,
            origin: Origin::Annotation(key),
            request,
        }),
        Err(Unreadable { error, mount }) => {
            errors.push(Denial::invalid(format!("annotation {key}: {}", error.0)));
            // The checks against the pod, on what could be read of it: every mistake of
            // the annotation in one answer (a misspelt container too, not on the next try).
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
            None
        }
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
