//! The configuration file as written, read part by part so that every error is found, each
//! naming its place.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::{Mode, OnError};
use crate::{validate, volume::VolumeKind};

/// The file as written, read part by part ([`FileConfig::read`]) so that every error is found.
#[derive(Debug, Default)]
pub(super) struct FileConfig {
    pub(super) annotation_prefix: Option<String>,
    pub(super) on_error: Option<OnError>,
    pub(super) mode: Option<Mode>,
    pub(super) cluster_checks: Option<crate::cluster::Mode>,
    pub(super) profiles: BTreeMap<String, Value>,
    /// With their place in the file: a rule that failed to read keeps the others' numbers.
    pub(super) rules: Vec<(usize, FileRule)>,
    pub(super) policy: FilePolicy,
    /// `policyOverrides`, with their place in the file.
    pub(super) policy_overrides: Vec<(usize, FileOverride)>,
}

/// One of `policyOverrides`: a policy for the namespaces it selects.
#[derive(Debug, Default)]
pub(super) struct FileOverride {
    pub(super) name: String,
    pub(super) namespaces: Option<Vec<String>>,
    pub(super) namespace_selector: Option<Value>,
    pub(super) policy: FilePolicy,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct FileRule {
    /// Empty when missing: refused by name, after the rest of the rule is read (so that its
    /// other errors come in the same answer).
    #[serde(default)]
    pub(super) name: String,
    pub(super) namespaces: Option<Vec<String>>,
    pub(super) pod_selector: Option<Value>,
    #[serde(default)]
    pub(super) volumes: BTreeMap<String, Value>,
    pub(super) mode: Option<Mode>,
}

#[derive(Debug, Default, Clone)]
pub(super) struct FilePolicy {
    pub(super) allow_inline: Option<bool>,
    pub(super) types: Option<Vec<VolumeKind>>,
    pub(super) csi_drivers: Option<Vec<String>>,
    pub(super) storage_classes: Option<Vec<String>>,
    pub(super) max_size: Option<FileMaxSize>,
    pub(super) max_volumes_per_pod: Option<usize>,
    pub(super) require_size_limit: Option<bool>,
    pub(super) default_size_limit: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct FileMaxSize {
    pub(super) empty_dir: Option<String>,
    pub(super) memory: Option<String>,
    pub(super) ephemeral: Option<String>,
}

/// One part of the file as `T`, or an error naming where it is.
pub(super) fn part<T: serde::de::DeserializeOwned>(
    v: Value,
    at: &str,
    errors: &mut Vec<String>,
) -> Option<T> {
    serde_json::from_value(v)
        .map_err(|e| errors.push(format!("{at}: {e}")))
        .ok()
}

/// The entries of a mapping, or an error naming where it is.
pub(super) fn entries(
    v: Value,
    at: &str,
    errors: &mut Vec<String>,
) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        Value::Null => serde_json::Map::new(),
        other => {
            errors.push(format!("{at}: expected a mapping, not {other}"));
            serde_json::Map::new()
        }
    }
}

impl FileConfig {
    pub(super) fn read(doc: Value, errors: &mut Vec<String>) -> FileConfig {
        let mut file = FileConfig::default();
        for (key, v) in entries(doc, "the configuration", errors) {
            match key.as_str() {
                "annotationPrefix" => file.annotation_prefix = part(v, &key, errors),
                "onError" => file.on_error = part(v, &key, errors),
                "mode" => file.mode = part(v, &key, errors),
                "clusterChecks" => file.cluster_checks = part(v, &key, errors),
                "profiles" => file.profiles = part(v, &key, errors).unwrap_or_default(),
                "rules" => match v {
                    Value::Array(rules) => {
                        file.rules = rules
                            .into_iter()
                            .enumerate()
                            .filter_map(|(i, r)| Some((i, part(r, &format!("rules[{i}]"), errors)?)))
                            .collect();
                    }
                    Value::Null => {}
                    other => errors.push(format!("rules: expected a list, not {other}")),
                },
                "policy" => file.policy = FilePolicy::read(v, "policy", errors),
                "policyOverrides" => match v {
                    Value::Array(items) => {
                        file.policy_overrides = items
                            .into_iter()
                            .enumerate()
                            .map(|(i, o)| (i, FileOverride::read(i, o, errors)))
                            .collect();
                    }
                    Value::Null => {}
                    other => errors.push(format!("policyOverrides: expected a list, not {other}")),
                },
                other => errors.push(format!(
                    "unknown field {other:?}; the fields are annotationPrefix, onError, mode, clusterChecks, profiles, rules, policy, policyOverrides"
                )),
            }
        }
        file
    }
}

impl FileOverride {
    pub(super) fn read(i: usize, v: Value, errors: &mut Vec<String>) -> FileOverride {
        let mut o = FileOverride::default();
        let mut policy = None;
        for (key, v) in entries(v, &format!("policyOverrides[{i}]"), errors) {
            let at = format!("policyOverrides[{i}].{key}");
            match key.as_str() {
                "name" => o.name = part(v, &at, errors).unwrap_or_default(),
                "namespaces" => o.namespaces = part(v, &at, errors),
                "namespaceSelector" => o.namespace_selector = Some(v),
                "policy" => policy = Some(v),
                other => errors.push(format!(
                    "policyOverrides[{i}]: unknown field {other:?}; the fields are name, namespaces, namespaceSelector, policy"
                )),
            }
        }
        let at = format!("policyOverrides[{i}] ({})", o.name);
        if let Err(e) = validate::dns_label("override name", &o.name) {
            errors.push(format!("policyOverrides[{i}].name: {e}"));
        }
        match (&o.namespaces, &o.namespace_selector) {
            (None, None) => errors.push(format!(
                "{at}: give namespaces (a list of names) or namespaceSelector (a label selector on the Namespace)"
            )),
            (Some(_), Some(_)) => errors.push(format!(
                "{at}: give namespaces or namespaceSelector, not both (two overrides can select the same namespaces in both ways)"
            )),
            _ => {}
        }
        match policy {
            Some(v) => o.policy = FilePolicy::read(v, &format!("{at}.policy"), errors),
            None => errors.push(format!(
                "{at}: no policy (the limits it sets for those namespaces)"
            )),
        }
        o
    }
}

impl FilePolicy {
    /// This policy's fields where set, `base`'s elsewhere (`maxSize` field by field).
    pub(super) fn over(&self, base: &FilePolicy) -> FilePolicy {
        let max_size = match (&self.max_size, &base.max_size) {
            (Some(o), Some(b)) => Some(FileMaxSize {
                empty_dir: o.empty_dir.clone().or_else(|| b.empty_dir.clone()),
                memory: o.memory.clone().or_else(|| b.memory.clone()),
                ephemeral: o.ephemeral.clone().or_else(|| b.ephemeral.clone()),
            }),
            (o, b) => o.clone().or_else(|| b.clone()),
        };
        FilePolicy {
            allow_inline: self.allow_inline.or(base.allow_inline),
            types: self.types.clone().or_else(|| base.types.clone()),
            csi_drivers: self
                .csi_drivers
                .clone()
                .or_else(|| base.csi_drivers.clone()),
            storage_classes: self
                .storage_classes
                .clone()
                .or_else(|| base.storage_classes.clone()),
            max_size,
            max_volumes_per_pod: self.max_volumes_per_pod.or(base.max_volumes_per_pod),
            require_size_limit: self.require_size_limit.or(base.require_size_limit),
            default_size_limit: self
                .default_size_limit
                .clone()
                .or_else(|| base.default_size_limit.clone()),
        }
    }

    pub(super) fn read(v: Value, at: &str, errors: &mut Vec<String>) -> FilePolicy {
        let mut p = FilePolicy::default();
        let root = at;
        for (key, v) in entries(v, root, errors) {
            let at = format!("{root}.{key}");
            match key.as_str() {
                "allowInline" => p.allow_inline = part(v, &at, errors),
                "types" => p.types = part(v, &at, errors),
                "csiDrivers" => p.csi_drivers = part(v, &at, errors),
                "storageClasses" => p.storage_classes = part(v, &at, errors),
                "maxSize" => p.max_size = part(v, &at, errors),
                "maxVolumesPerPod" => p.max_volumes_per_pod = part(v, &at, errors),
                "requireSizeLimit" => p.require_size_limit = part(v, &at, errors),
                "defaultSizeLimit" => p.default_size_limit = part(v, &at, errors),
                other => errors.push(format!(
                    "{root}: unknown field {other:?}; the fields are allowInline, types, csiDrivers, \
                     storageClasses, maxSize, maxVolumesPerPod, requireSizeLimit, defaultSizeLimit"
                )),
            }
        }
        p
    }
}
