//! The configuration compiled from the file as read: profiles, rules and policies checked
//! against each other, every problem with its place.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{
    Config, ConfigError, DEFAULT_PREFIX, Mode, Namespaces, Policy, PolicyOverride, Rule,
    file::{FileConfig, FileOverride, FilePolicy, FileRule},
};
use crate::{
    quantity::Quantity,
    selector::Selector,
    validate::{self, parse_size},
    volume::{Profile, Requested, VolumeKind, VolumeRequest},
};

pub(super) fn compile(file: FileConfig, mut errors: Vec<String>) -> Result<Config, ConfigError> {
    let prefix = file
        .annotation_prefix
        .unwrap_or_else(|| DEFAULT_PREFIX.to_owned());
    if prefix
        .split('.')
        .any(|l| validate::dns_label("", l).is_err())
        || prefix.len() > 253 - 9
    {
        errors.push(format!(
            "annotationPrefix: {prefix:?} is not a DNS subdomain (it is the annotation key prefix)"
        ));
    }
    let mut cfg = Config::with_prefix(&prefix);
    cfg.on_error = file.on_error.unwrap_or_default();
    cfg.mode = file.mode.unwrap_or_default();
    cfg.cluster_checks = file.cluster_checks.unwrap_or_default();
    for (name, value) in &file.profiles {
        // `mode` is the profile's own, not a field of the volume it describes.
        let mut value = value.clone();
        let mode = match value.as_object_mut().and_then(|m| m.remove("mode")) {
            Some(m) => serde_json::from_value::<Mode>(m)
                .map_err(|e| errors.push(format!("profiles.{name}.mode: {e}")))
                .ok(),
            None => None,
        };
        if mode.unwrap_or(cfg.mode) == Mode::Audit {
            cfg.audited_profiles.insert(name.clone());
        }
        if let Some(profile) = compile_profile(name, &value, &mut errors) {
            cfg.profiles.insert(name.clone(), profile);
        }
    }
    cfg.policy = compile_policy(file.policy.clone(), "policy", &mut errors);
    cfg.overrides = compile_overrides(&file.policy, file.policy_overrides, &mut errors);
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    for (i, rule) in file.rules {
        if rule.name.is_empty() {
            errors.push(format!(
                "rules[{i}]: missing field name (rules are named in warnings, metrics and audit results)"
            ));
        } else if let Some(first) = names.get(&rule.name) {
            errors.push(format!(
                "rules[{i}] ({}): the name is rules[{first}]'s too; each rule needs its own (warnings, metrics and audit results name rules by it)",
                rule.name
            ));
        } else {
            names.insert(rule.name.clone(), i);
        }
        // A profile that failed to compile is reported where it is defined, not again here.
        let defined = |p: &str| cfg.profiles.contains_key(p) || file.profiles.contains_key(p);
        let written = rule.volumes.len();
        let rule = compile_rule(i, rule, &defined, cfg.mode, &mut errors);
        check_rule(
            &cfg,
            &format!("rules[{i}] ({})", rule.name),
            &rule.namespaces,
            (&rule.volumes, written),
            &mut errors,
        );
        cfg.rules.push(rule);
    }
    if errors.is_empty() {
        Ok(cfg)
    } else {
        Err(ConfigError::Invalid(errors))
    }
}

/// One profile, or its errors under `profiles.<name>`.
fn compile_profile(name: &str, value: &Value, errors: &mut Vec<String>) -> Option<Profile> {
    let compiled = validate::profile_name(name)
        .and_then(|()| VolumeRequest::from_json(value))
        .and_then(Profile::compile);
    compiled
        .map_err(|e| errors.push(format!("profiles.{name}: {e}")))
        .ok()
}

/// One rule: its selector, volumes and namespaces read, each error under `rules[i] (name)`.
fn compile_rule(
    i: usize,
    rule: FileRule,
    defined: &dyn Fn(&str) -> bool,
    default_mode: Mode,
    errors: &mut Vec<String>,
) -> Rule {
    let at = format!("rules[{i}] ({})", rule.name);
    let selector = rule
        .pod_selector
        .as_ref()
        .map(Selector::from_json)
        .transpose()
        .map_err(|e| errors.push(format!("{at}.podSelector: {e}")))
        .ok()
        .flatten();
    let mut volumes = BTreeMap::new();
    for (vol, value) in rule.volumes {
        let vat = format!("{at}.volumes.{vol}");
        let parsed = validate::dns_label("volume name", &vol).and_then(|()| match &value {
            Value::String(s) => s.parse::<VolumeRequest>(),
            other => VolumeRequest::from_json(other),
        });
        match parsed {
            Ok(req) => {
                if let Requested::Profile(p) = &req.source
                    && !defined(p)
                {
                    errors.push(format!(
                        "{vat}: profile {p:?} is not defined under profiles"
                    ));
                }
                volumes.insert(vol, req);
            }
            Err(e) => errors.push(format!("{vat}: {e}")),
        }
    }
    for ns in rule.namespaces.iter().flatten() {
        if let Err(e) = validate::dns_label("namespace", ns) {
            errors.push(format!("{at}.namespaces: {e}"));
        }
    }
    Rule {
        mode: rule.mode.unwrap_or(default_mode),
        name: rule.name,
        namespaces: rule.namespaces,
        selector,
        volumes,
    }
}

/// A rule that can never do what it says is refused: the chart sends every pod it matches to
/// the webhook, so a rule that cannot inject would deny each of them.
fn check_rule(
    cfg: &Config,
    at: &str,
    namespaces: &Option<Vec<String>>,
    (volumes, written): (&BTreeMap<String, VolumeRequest>, usize),
    errors: &mut Vec<String>,
) {
    if namespaces.as_ref().is_some_and(Vec::is_empty) {
        errors.push(format!(
            "{at}.namespaces is empty, so the rule matches no pod; leave it out to match every namespace"
        ));
    }
    // Volumes that were written but refused are reported where they were read.
    if written == 0 {
        errors.push(format!(
            "{at}.volumes is empty: the rule would inject nothing"
        ));
    }
    for (policy, whose) in cfg.policies_met(namespaces.as_deref()) {
        if let Some(max) = policy.max_volumes_per_pod
            && volumes.len() > max
        {
            errors.push(format!(
                "{at}: {} volumes, more than {}.maxVolumesPerPod ({max}): every pod it matches{whose} would be denied",
                volumes.len(),
                policy.origin
            ));
        }
    }
    for (vol, req) in volumes {
        let vat = format!("{at}.volumes.{vol}");
        let profile = match &req.source {
            Requested::Profile(p) => match cfg.profiles.get(p) {
                Some(profile) => Some((p, profile)),
                // Reported where the volume was read.
                None => continue,
            },
            _ => None,
        };
        if req.mount.mount_path.is_none()
            && profile.is_none_or(|(_, p)| p.mount.mount_path.is_none())
        {
            errors.push(match profile {
                Some((p, _)) => format!(
                    "{vat}: no mountPath: profile {p:?} does not set one; every pod the rule matches would be denied"
                ),
                None => format!(
                    "{vat}: no mountPath; every pod the rule matches would be denied"
                ),
            });
        }
        if let Some((p, profile)) = profile
            && (req.size.is_some() || req.size_from_request)
            && profile.source.kind() == VolumeKind::Csi
        {
            errors.push(format!(
                "{vat}: size does not apply to profile {p:?}, a CSI inline volume"
            ));
        }
    }
}

/// Each override's policy (the global one with its fields replaced), checked as the global
/// one is; a namespace named by two overrides, or two overrides of one name, are refused.
fn compile_overrides(
    global: &FilePolicy,
    overrides: Vec<(usize, FileOverride)>,
    errors: &mut Vec<String>,
) -> Vec<PolicyOverride> {
    let mut out: Vec<PolicyOverride> = Vec::new();
    let mut named: BTreeMap<String, String> = BTreeMap::new();
    for (i, o) in overrides {
        let at = format!("policyOverrides[{i}] ({})", o.name);
        if out.iter().any(|p| p.name == o.name) {
            errors.push(format!("{at}: a second override named {:?}", o.name));
        }
        for ns in o.namespaces.iter().flatten() {
            if let Err(e) = validate::dns_label("namespace", ns) {
                errors.push(format!("{at}.namespaces: {e}"));
            }
            if let Some(first) = named.insert(ns.clone(), at.clone()) {
                errors.push(format!(
                    "{at}.namespaces: namespace {ns:?} is already listed by {first}; one override per namespace"
                ));
            }
        }
        let policy = compile_policy(
            o.policy.over(global),
            &format!("policyOverrides[{}].policy", o.name),
            errors,
        );
        // Neither or both were reported when it was read.
        let selects = match (o.namespaces, &o.namespace_selector) {
            (Some(names), None) => Namespaces::Named(names),
            (None, Some(v)) => match Selector::from_json(v) {
                Ok(s) => Namespaces::Labelled(s),
                Err(e) => {
                    errors.push(format!("{at}.namespaceSelector: {e}"));
                    continue;
                }
            },
            _ => continue,
        };
        out.push(PolicyOverride {
            name: o.name,
            selects,
            policy,
        });
    }
    out
}

/// A policy, compiled; `origin` is where its fields are written (`policy`, or an override's),
/// in its errors and later in refusals.
fn compile_policy(p: FilePolicy, origin: &str, errors: &mut Vec<String>) -> Policy {
    let mut policy = Policy {
        origin: origin.to_owned(),
        ..Policy::default()
    };
    let mut size = |field: &str, v: Option<String>| -> Option<Quantity> {
        let v = v?;
        parse_size(field, &v)
            .map_err(|e| errors.push(format!("{origin}.{e}")))
            .ok()
    };
    if let Some(m) = p.max_size {
        policy.max_empty_dir = size("maxSize.emptyDir", m.empty_dir);
        policy.max_memory = size("maxSize.memory", m.memory);
        policy.max_ephemeral = size("maxSize.ephemeral", m.ephemeral);
    }
    if let Some(d) = p.default_size_limit.clone()
        && let Some(q) = size("defaultSizeLimit", Some(d.clone()))
    {
        policy.default_size_limit = q;
        policy.default_size_limit_text = d;
    }
    policy.allow_inline = p.allow_inline.unwrap_or(true);
    if let Some(t) = p.types {
        policy.types = t;
    }
    policy.csi_drivers = p.csi_drivers;
    policy.storage_classes = p.storage_classes;
    policy.max_volumes_per_pod = p.max_volumes_per_pod;
    policy.require_size_limit = p.require_size_limit.unwrap_or(false);
    // The default is given to every emptyDir without a size, RAM disks included: a default
    // above either cap would make the webhook write a size it refuses from a user.
    for (max, field) in [
        (policy.max_empty_dir, "emptyDir"),
        (policy.max_memory, "memory"),
    ] {
        if policy.require_size_limit
            && let Some(max) = max
            && policy.default_size_limit > max
        {
            errors.push(format!(
                "{origin}.defaultSizeLimit {} exceeds {origin}.maxSize.{field} {max}",
                policy.default_size_limit_text
            ));
        }
    }
    policy
}
