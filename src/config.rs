//! The cluster-wide configuration file (`docs/configuration.md`): parsed, validated whole, then compiled into a
//! [`Config`] the engine reads without further checks.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use serde::Deserialize;
use serde_json::Value;

use crate::{
    quantity::Quantity,
    selector::Selector,
    validate::{self, parse_size},
    volume::{Profile, Requested, VolumeKind, VolumeRequest},
};

/// The annotation prefix when `annotationPrefix` is not set.
pub const DEFAULT_PREFIX: &str = "ephemeral-volumes.io";

/// A configuration that failed: every problem found, each naming its place in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// The operating system's error, as text.
        message: String,
    },
    /// Every problem found, each naming its place.
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
}

/// `mode`: whether a rule, a profile or the whole configuration acts, or only says what it
/// would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    /// Inject and refuse (the default).
    #[default]
    Enforce,
    /// Decide exactly as `enforce`, inject nothing and refuse nothing: the decision comes back
    /// as an API warning, is logged and counted (`evi_audit_decisions_total`).
    Audit,
}

/// `onError`: what happens to a pod whose request cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OnError {
    /// Refuse the pod (the default).
    #[default]
    Deny,
    /// Admit it without the volumes, with a warning and the status annotation.
    Warn,
}

// === the file as written ===

/// The file as written, read part by part ([`FileConfig::read`]) so that every error is found.
#[derive(Debug, Default)]
struct FileConfig {
    annotation_prefix: Option<String>,
    on_error: Option<OnError>,
    mode: Option<Mode>,
    cluster_checks: Option<crate::cluster::Mode>,
    profiles: BTreeMap<String, Value>,
    /// With their place in the file: a rule that failed to read keeps the others' numbers.
    rules: Vec<(usize, FileRule)>,
    policy: FilePolicy,
    /// `policyOverrides`, with their place in the file.
    policy_overrides: Vec<(usize, FileOverride)>,
}

/// One of `policyOverrides`: a policy for the namespaces it selects.
#[derive(Debug, Default)]
struct FileOverride {
    name: String,
    namespaces: Option<Vec<String>>,
    namespace_selector: Option<Value>,
    policy: FilePolicy,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileRule {
    /// Empty when missing: refused by name, after the rest of the rule is read (so that its
    /// other errors come in the same answer).
    #[serde(default)]
    name: String,
    namespaces: Option<Vec<String>>,
    pod_selector: Option<Value>,
    #[serde(default)]
    volumes: BTreeMap<String, Value>,
    mode: Option<Mode>,
}

#[derive(Debug, Default, Clone)]
struct FilePolicy {
    allow_inline: Option<bool>,
    types: Option<Vec<VolumeKind>>,
    csi_drivers: Option<Vec<String>>,
    storage_classes: Option<Vec<String>>,
    max_size: Option<FileMaxSize>,
    max_volumes_per_pod: Option<usize>,
    require_size_limit: Option<bool>,
    default_size_limit: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileMaxSize {
    empty_dir: Option<String>,
    memory: Option<String>,
    ephemeral: Option<String>,
}

// === the compiled configuration ===

/// The configuration, compiled: what the engine reads, checked once at load.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `annotationPrefix`: annotations `<prefix>/<volume>` ask for volumes.
    pub prefix: String,
    /// The prefix's searcher, built once: a pod's labels, as written, are searched for it
    /// (a label meant as an annotation gets a hint).
    pub prefix_search: Search,
    /// `injector.<prefix>/injected`: the volumes the webhook added.
    pub injected: StatusKey,
    /// `injector.<prefix>/error`, written when `onError: warn` admits a pod it could not serve.
    pub error: StatusKey,
    /// `injector.<prefix>/cluster-check`, written under `clusterChecks: warn` when the cluster
    /// lacks what a volume needs.
    pub cluster_check: StatusKey,
    /// `onError`.
    pub on_error: OnError,
    /// `mode`: the default of every rule and profile; `audit` audits the whole configuration.
    pub mode: Mode,
    /// The profiles with `mode: audit` (a request naming one is audited, not served).
    pub audited_profiles: BTreeSet<String>,
    /// `clusterChecks`.
    pub cluster_checks: crate::cluster::Mode,
    /// `profiles`, by name.
    pub profiles: BTreeMap<String, Profile>,
    /// `rules`, in the file's order (the first that gives a volume name wins).
    pub rules: Vec<Rule>,
    /// `policy`.
    pub policy: Policy,
    /// `policyOverrides`, in the file's order: the policy of the namespaces each selects.
    pub overrides: Vec<PolicyOverride>,
}

/// A policy for some namespaces (`policyOverrides[i]`): the global `policy` with the fields the
/// override sets replaced.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyOverride {
    /// Its name (in messages).
    pub name: String,
    /// The namespaces it applies to.
    pub selects: Namespaces,
    /// The policy in force there.
    pub policy: Policy,
}

/// How an override selects its namespaces: one way or the other, never both.
#[derive(Debug, Clone, PartialEq)]
pub enum Namespaces {
    /// `namespaces`: by name.
    Named(Vec<String>),
    /// `namespaceSelector`: by the Namespace's labels.
    Labelled(Selector),
}

/// A rule: volumes for the pods it matches, without annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Its name (in messages).
    pub name: String,
    /// The namespaces it applies in; every namespace when `None`.
    pub namespaces: Option<Vec<String>>,
    /// Its pod selector; every pod when `None`.
    pub selector: Option<Selector>,
    /// `mode` (the configuration's when not given).
    pub mode: Mode,
    /// The volumes it gives, by name.
    pub volumes: BTreeMap<String, VolumeRequest>,
}

/// The cluster admin's limits on what annotations may ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Where its limits are written, for messages: `policy`, or
    /// `policyOverrides[<name>].policy`.
    pub origin: String,
    /// `allowInline`: annotations may give a source rather than a profile.
    pub allow_inline: bool,
    /// `types`: the kinds an annotation may ask for inline.
    pub types: Vec<VolumeKind>,
    /// `csiDrivers`: the drivers an annotation may name; any when `None`.
    pub csi_drivers: Option<Vec<String>>,
    /// `storageClasses`: the classes an annotation may name; any when `None`.
    pub storage_classes: Option<Vec<String>>,
    /// `maxSize.emptyDir`: the largest disk emptyDir.
    pub max_empty_dir: Option<Quantity>,
    /// `maxSize.memory`: the largest RAM disk.
    pub max_memory: Option<Quantity>,
    /// `maxSize.ephemeral`: the largest PVC request.
    pub max_ephemeral: Option<Quantity>,
    /// `maxVolumesPerPod`.
    pub max_volumes_per_pod: Option<usize>,
    /// `requireSizeLimit`: an emptyDir without a size gets `defaultSizeLimit`.
    pub require_size_limit: bool,
    /// `defaultSizeLimit`.
    pub default_size_limit: Quantity,
    /// `defaultSizeLimit` as written (the patch carries it so).
    pub default_size_limit_text: String,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            origin: "policy".to_owned(),
            allow_inline: true,
            types: VolumeKind::ALL.to_vec(),
            csi_drivers: None,
            storage_classes: None,
            max_empty_dir: None,
            max_memory: None,
            max_ephemeral: None,
            max_volumes_per_pod: None,
            require_size_limit: false,
            default_size_limit: Quantity::from_bytes(10 << 30),
            default_size_limit_text: "10Gi".to_owned(),
        }
    }
}

/// A status annotation the webhook writes on a pod, `injector.<prefix>/<name>`: its key, and
/// the key as a JSON-pointer token (RFC 6901) for the patch, computed once at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusKey {
    /// `injector.<prefix>/<name>`.
    pub key: String,
    /// The key with `~` and `/` escaped, as a patch path segment.
    pub token: String,
}

impl StatusKey {
    fn new(prefix: &str, name: &str) -> StatusKey {
        let key = format!("injector.{prefix}/{name}");
        StatusKey {
            token: crate::patch::escape(&key).into_owned(),
            key,
        }
    }
}

/// A substring searcher (`memchr::memmem`), built once instead of for every search;
/// compared by what it searches for.
#[derive(Debug, Clone)]
pub struct Search(memchr::memmem::Finder<'static>);

impl Search {
    /// A searcher for `needle`.
    pub fn new(needle: &str) -> Search {
        Search(memchr::memmem::Finder::new(needle.as_bytes()).into_owned())
    }

    /// Whether `haystack` contains the needle.
    pub fn is_in(&self, haystack: &str) -> bool {
        self.0.find(haystack.as_bytes()).is_some()
    }
}

impl PartialEq for Search {
    fn eq(&self, other: &Search) -> bool {
        self.0.needle() == other.0.needle()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::with_prefix(DEFAULT_PREFIX)
    }
}

impl Config {
    /// Whether anything is audited: when nothing is, a decision is made once, as always.
    pub fn audits(&self) -> bool {
        self.mode == Mode::Audit
            || !self.audited_profiles.is_empty()
            || self.rules.iter().any(|r| r.mode == Mode::Audit)
    }

    fn with_prefix(prefix: &str) -> Self {
        Config {
            prefix: prefix.to_owned(),
            prefix_search: Search::new(prefix),
            injected: StatusKey::new(prefix, "injected"),
            error: StatusKey::new(prefix, "error"),
            cluster_check: StatusKey::new(prefix, "cluster-check"),
            on_error: OnError::Deny,
            mode: Mode::Enforce,
            audited_profiles: BTreeSet::new(),
            cluster_checks: crate::cluster::Mode::default(),
            profiles: BTreeMap::new(),
            rules: Vec::new(),
            policy: Policy::default(),
            overrides: Vec::new(),
        }
    }

    /// Reads and compiles a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Config::parse(&text)
    }

    /// Parses and validates a whole file; any problem refuses all of it. Every problem is
    /// listed, type errors included: each part of the file is read on its own.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let mut errors = Vec::new();
        // YAML syntax, and keys given twice (which YAML forbids and serde would let pass,
        // keeping the last), stop the reading: there is no document to read further.
        let syntax =
            |e: yaml_serde::Error| ConfigError::Invalid(vec![format!("not valid YAML: {e}")]);
        let doc: Value = yaml_serde::from_str(text).map_err(syntax)?;
        // An empty file, or one with only comments, is the default configuration.
        let file = if doc.is_null() {
            FileConfig::default()
        } else {
            yaml_serde::from_str::<validate::NoDuplicates>(text).map_err(syntax)?;
            FileConfig::read(doc, &mut errors)
        };
        compile(file, errors)
    }
}

// === reading the file part by part ===

/// One part of the file as `T`, or an error naming where it is.
fn part<T: serde::de::DeserializeOwned>(v: Value, at: &str, errors: &mut Vec<String>) -> Option<T> {
    serde_json::from_value(v)
        .map_err(|e| errors.push(format!("{at}: {e}")))
        .ok()
}

/// The entries of a mapping, or an error naming where it is.
fn entries(v: Value, at: &str, errors: &mut Vec<String>) -> serde_json::Map<String, Value> {
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
    fn read(doc: Value, errors: &mut Vec<String>) -> FileConfig {
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
    fn read(i: usize, v: Value, errors: &mut Vec<String>) -> FileOverride {
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
    fn over(&self, base: &FilePolicy) -> FilePolicy {
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

    fn read(v: Value, at: &str, errors: &mut Vec<String>) -> FilePolicy {
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

fn compile(file: FileConfig, mut errors: Vec<String>) -> Result<Config, ConfigError> {
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

impl Config {
    /// Each policy a pod of these namespaces (`None`: any) can be decided under, with where
    /// (for messages, empty or with a leading space): the override naming a namespace; for a namespace no override names,
    /// every override selecting by label (its labels are not known here) and the top-level
    /// policy.
    fn policies_met(&self, namespaces: Option<&[String]>) -> Vec<(&Policy, String)> {
        let named = |ns: &str| {
            self.overrides
                .iter()
                .find(|o| matches!(&o.selects, Namespaces::Named(n) if n.iter().any(|n| n == ns)))
        };
        let labelled = self
            .overrides
            .iter()
            .filter(|o| matches!(o.selects, Namespaces::Labelled(_)));
        let mut met: Vec<(&Policy, String)> = Vec::new();
        let mut add = |policy, whose| met.push((policy, whose));
        match namespaces {
            None => {
                let whose = if self.overrides.is_empty() {
                    ""
                } else {
                    " where no override applies"
                };
                add(&self.policy, whose.to_owned());
                for o in &self.overrides {
                    add(
                        &o.policy,
                        format!(" in the namespaces of override {:?}", o.name),
                    );
                }
            }
            Some(list) => {
                for ns in list {
                    if let Some(o) = named(ns) {
                        add(&o.policy, format!(" in namespace {ns}"));
                        continue;
                    }
                    for o in labelled.clone() {
                        add(
                            &o.policy,
                            format!(" in namespace {ns} if override {:?} selects it", o.name),
                        );
                    }
                    add(&self.policy, format!(" in namespace {ns}"));
                }
            }
        }
        // Each policy once, where it is first met.
        let mut seen = BTreeSet::new();
        met.retain(|(p, _)| seen.insert(p.origin.clone()));
        met
    }

    /// The webhook must read the cluster: the checks are on, or an override selects
    /// namespaces by label.
    pub fn reads_cluster(&self) -> bool {
        self.cluster_checks != crate::cluster::Mode::Off || self.uses_namespace_labels()
    }

    /// Some override selects namespaces by their labels: the webhook must read Namespaces.
    pub fn uses_namespace_labels(&self) -> bool {
        self.overrides
            .iter()
            .any(|o| matches!(o.selects, Namespaces::Labelled(_)))
    }

    /// What this configuration cannot decide without the namespaces' labels (`serve` without
    /// API access, `mutate` without Namespace objects), said once at start; `None` when it
    /// needs none.
    pub fn needs_namespace_labels(&self) -> Option<&'static str> {
        self.uses_namespace_labels().then_some(
            "policyOverrides select namespaces by label, and the namespaces' labels are not known: \
             a pod whose annotations ask for a volume in a namespace not listed by name is refused \
             (\"try again in a moment\") until they are; rule volumes are decided under the \
             top-level policy meanwhile",
        )
    }

    /// The policy in force in a namespace: the override that lists it by name; else, of the
    /// overrides whose `namespaceSelector` matches its labels, the one with the most
    /// requirements (the first in the file on a tie); else `policy`. `labels`: the namespace's
    /// labels, `None` when they are not known (asked only when an override needs them).
    pub fn policy_for(
        &self,
        namespace: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> Result<&Policy, String> {
        if let Some(o) = self.overrides.iter().find(
            |o| matches!(&o.selects, Namespaces::Named(n) if n.iter().any(|n| n == namespace)),
        ) {
            return Ok(&o.policy);
        }
        if !self.uses_namespace_labels() {
            return Ok(&self.policy);
        }
        let Some(labels) = labels else {
            return Err(format!(
                "the labels of namespace {namespace:?} are not known to the webhook yet (policyOverrides select namespaces by label; it reads them from the API server): try again in a moment"
            ));
        };
        let best = self
            .overrides
            .iter()
            .rev()
            .filter_map(|o| match &o.selects {
                Namespaces::Labelled(s) => Some((o, s)),
                Namespaces::Named(_) => None,
            })
            .filter(|(_, s)| s.matches(labels))
            .max_by_key(|(_, s)| s.requirements());
        Ok(best.map_or(&self.policy, |(o, _)| &o.policy))
    }
}

impl Rule {
    /// Whether the rule applies in this namespace (every namespace when none are listed).
    pub fn in_namespace(&self, namespace: &str) -> bool {
        self.namespaces
            .as_ref()
            .is_none_or(|ns| ns.iter().any(|n| n == namespace))
    }

    /// Whether the rule's pod selector matches these labels (every pod when it has none).
    pub fn selects<K, V>(&self, labels: &BTreeMap<K, V>) -> bool
    where
        K: std::borrow::Borrow<str> + Ord,
        V: std::ops::Deref<Target = str>,
    {
        self.selector.as_ref().is_none_or(|s| s.matches(labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{Medium, Source};

    /// The example of docs/configuration.md, read from the page itself (its first `yaml`
    /// block), so that the documented file is the tested one.
    fn documented_example() -> &'static str {
        let page = include_str!("../docs/configuration.md");
        let start = page
            .find("```yaml\n")
            .expect("a yaml block in docs/configuration.md")
            + 8;
        let len = page[start..].find("```").expect("the yaml block ends");
        &page[start..start + len]
    }

    #[test]
    fn the_documented_example_compiles() {
        let cfg = Config::parse(documented_example()).unwrap();
        assert_eq!(cfg.injected.key, "injector.ephemeral-volumes.io/injected");
        assert_eq!(cfg.profiles.len(), 2);
        assert_eq!(
            cfg.rules[0].volumes["scratch"].source,
            Requested::Profile("ebs-200g".into())
        );
        assert_eq!(cfg.policy.max_memory, Some("8Gi".parse().unwrap()));
        assert_eq!(cfg.policy.max_volumes_per_pod, Some(8));
        let labels = BTreeMap::from([("nextflow.io/app".to_owned(), "nextflow".to_owned())]);
        let rule = &cfg.rules[0];
        assert!(rule.in_namespace("nf") && rule.selects(&labels));
        assert!(!rule.in_namespace("default"));
        assert!(!rule.selects(&BTreeMap::<String, String>::new()));
    }

    #[test]
    fn each_team_gets_the_override_that_selects_its_namespace_most_specifically() {
        let cfg = Config::parse(documented_example()).unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let genomics = labels(&[("team", "genomics")]);
        // By label: its own fields, the global policy's elsewhere (maxSize key by key).
        let p = cfg.policy_for("gx-1", Some(&genomics)).unwrap();
        assert_eq!(p.origin, "policyOverrides[genomics].policy");
        assert_eq!(p.max_empty_dir, Some("500Gi".parse().unwrap()));
        assert_eq!(p.max_memory, Some("8Gi".parse().unwrap()));
        assert_eq!(
            p.storage_classes.as_deref(),
            Some(&["gp3".to_owned(), "io2".to_owned()][..])
        );
        assert_eq!(p.max_volumes_per_pod, Some(8));
        // By name: wins over the labels.
        let p = cfg.policy_for("training", Some(&genomics)).unwrap();
        assert_eq!(
            (p.origin.as_str(), p.max_volumes_per_pod),
            ("policyOverrides[training].policy", Some(2))
        );
        assert_eq!(p.types, vec![VolumeKind::EmptyDir]);
        // Neither: the global policy; labels unknown: refused, naming the namespace.
        assert_eq!(
            cfg.policy_for("nf", Some(&labels(&[]))).unwrap().origin,
            "policy"
        );
        let err = cfg.policy_for("nf", None).unwrap_err();
        assert!(
            err.contains("the labels of namespace \"nf\" are not known"),
            "{err}"
        );
        // Listed by name, the labels are not needed.
        assert!(cfg.policy_for("training", None).is_ok());
        // Without label selectors, they are never asked for.
        let plain = Config::parse(
            "policyOverrides: [{name: a, namespaces: [a], policy: {maxVolumesPerPod: 1}}]",
        )
        .unwrap();
        assert_eq!(plain.policy_for("b", None).unwrap().origin, "policy");
        assert!(!plain.uses_namespace_labels());
        assert!(cfg.uses_namespace_labels());
        // The most requirements win; on a tie, the first.
        let two = Config::parse(
            "policyOverrides:\n\
             - {name: broad, namespaceSelector: {matchLabels: {team: a}}, policy: {maxVolumesPerPod: 1}}\n\
             - {name: narrow, namespaceSelector: {matchLabels: {team: a, tier: gpu}}, policy: {maxVolumesPerPod: 2}}\n\
             - {name: tie, namespaceSelector: {matchExpressions: [{key: team, operator: Exists}]}, policy: {maxVolumesPerPod: 3}}\n",
        )
        .unwrap();
        let at = |l: &[(&str, &str)]| {
            two.policy_for("x", Some(&labels(l)))
                .unwrap()
                .origin
                .clone()
        };
        assert_eq!(
            at(&[("team", "a"), ("tier", "gpu")]),
            "policyOverrides[narrow].policy"
        );
        assert_eq!(at(&[("team", "a")]), "policyOverrides[broad].policy");
        assert_eq!(at(&[("team", "b")]), "policyOverrides[tie].policy");
    }

    #[test]
    fn every_mistake_in_the_overrides_is_reported_with_its_place() {
        let text = "policy: {maxSize: {emptyDir: 100Gi}}\n\
policyOverrides:\n\
  - {name: a, namespaces: [x, y], policy: {maxSize: {emptyDir: 5GB}}}\n\
  - {name: b, namespaces: [y], policy: {requireSizeLimit: true, defaultSizeLimit: 200Gi}}\n\
  - {name: c, policy: {}}\n\
  - {name: d, namespaces: [z], namespaceSelector: {}, policy: {maxVolumes: 3}}\n\
  - {name: a, namespaces: [w]}\n";
        let Err(ConfigError::Invalid(errors)) = Config::parse(text) else {
            panic!("accepted")
        };
        let want = [
            "policyOverrides[a].policy.maxSize.emptyDir",
            "policyOverrides[1] (b).namespaces: namespace \"y\" is already listed by policyOverrides[0] (a)",
            "policyOverrides[b].policy.defaultSizeLimit 200Gi exceeds policyOverrides[b].policy.maxSize.emptyDir 100Gi",
            "policyOverrides[2] (c): give namespaces (a list of names) or namespaceSelector",
            "policyOverrides[3] (d): give namespaces or namespaceSelector, not both",
            "policyOverrides[3] (d).policy: unknown field \"maxVolumes\"",
            "policyOverrides[4] (a): a second override named \"a\"",
            "policyOverrides[4] (a): no policy",
        ];
        for w in want {
            assert!(
                errors.iter().any(|e| e.contains(w)),
                "missing {w:?} in {errors:#?}"
            );
        }
        assert_eq!(errors.len(), want.len(), "{errors:#?}");
    }

    #[test]
    fn profile_sources_are_compiled_once_with_their_size() {
        let cfg = Config::parse(documented_example()).unwrap();
        let ebs = &cfg.profiles["ebs-200g"].compiled;
        assert_eq!(ebs.kind, VolumeKind::Ephemeral);
        assert_eq!(ebs.size, Some("200Gi".parse().unwrap()));
        let Source::Ephemeral(source) = &cfg.profiles["ebs-200g"].source else {
            panic!("ebs-200g is an ephemeral profile");
        };
        assert_eq!(
            serde_json::from_str::<Value>(ebs.json.get()).unwrap(),
            serde_json::to_value(source).unwrap()
        );
        let shm = &cfg.profiles["shm"].compiled;
        assert_eq!(
            (shm.kind, shm.medium),
            (VolumeKind::EmptyDir, Medium::Memory)
        );
        assert_eq!(shm.size, Some("1Gi".parse().unwrap()));
    }

    #[test]
    fn an_empty_file_is_the_default_configuration() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
        assert_eq!(Config::parse("{}\n").unwrap(), Config::default());
        assert_eq!(
            Config::parse("# nothing set yet\n").unwrap(),
            Config::default()
        );
    }

    #[test]
    fn a_custom_prefix_moves_the_status_domain_too() {
        let cfg = Config::parse("annotationPrefix: volumes.example.com").unwrap();
        assert_eq!(cfg.injected.key, "injector.volumes.example.com/injected");
        assert_eq!(cfg.error.key, "injector.volumes.example.com/error");
    }

    #[test]
    fn every_problem_is_listed_with_its_place() {
        let text = r#"
onError: maybe
"#;
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(e.contains("onError") || e.contains("maybe"), "{e}");

        let text = r#"
profiles:
  Bad_Name: {mountPath: /x, emptyDir: {}}
  typo: {mountPath: /x, emptyDir: {sizeLimt: 1Gi}}
  loop: {profile: typo}
rules:
  - name: r1
    podSelector: {matchExpressions: [{key: a, operator: Maybe}]}
    volumes:
      scratch: {profile: missing}
      Bad: {profile: typo}
policy:
  maxSize: {emptyDir: 10GB}
  requireSizeLimit: true
"#;
        let Err(ConfigError::Invalid(errors)) = Config::parse(text) else {
            panic!()
        };
        let all = errors.join("\n");
        for want in [
            "profiles.Bad_Name: profile name",
            "profiles.typo: unknown field emptyDir.sizeLimt",
            "profiles.loop: a profile cannot name another profile",
            "rules[0] (r1).podSelector: matchExpressions[0] (a): operator \"Maybe\"",
            "rules[0] (r1).volumes.scratch: profile \"missing\" is not defined",
            "rules[0] (r1).volumes.Bad: volume name",
            "policy.maxSize.emptyDir: invalid quantity \"10GB\"",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
    }

    #[test]
    fn unknown_keys_are_refused_at_every_level() {
        for (text, want) in [
            ("annotationPrefx: a.io", "annotationPrefx"),
            ("policy: {maxVolumes: 3}", "maxVolumes"),
            ("policy: {maxSize: {disk: 1Gi}}", "disk"),
            ("rules: [{name: a, namespace: [x]}]", "namespace"),
            ("policy: {types: [hostPath]}", "hostPath"),
        ] {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    /// A rule is held to the volume cap of every policy a pod it matches can be decided
    /// under: the override naming its namespace, an override selecting by label (the labels
    /// are not known here), and the top-level policy where no override names it.
    #[test]
    fn rules_are_checked_against_every_policy_override_they_can_meet() {
        let overrides = "policy: {maxVolumesPerPod: 8}\npolicyOverrides:\n  \
             - {name: small, namespaces: [team-a], policy: {maxVolumesPerPod: 1}}\n  \
             - {name: gpu, namespaceSelector: {matchLabels: {tier: gpu}}, policy: {maxVolumesPerPod: 2}}\n";
        let two = "volumes: {a: 'type=emptyDir,mountPath=/a', b: 'type=emptyDir,mountPath=/b'}";
        let three = "volumes: {a: 'type=emptyDir,mountPath=/a', b: 'type=emptyDir,mountPath=/b', c: 'type=emptyDir,mountPath=/c'}";
        let check = |rule: &str| {
            Config::parse(&format!("{overrides}rules:\n  - {{name: r, {rule}}}\n"))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        // Named by an override: its cap.
        let e = check(&format!("namespaces: [team-a], {two}"));
        assert!(
            e.contains("rules[0] (r): 2 volumes, more than policyOverrides[small].policy.maxVolumesPerPod (1): every pod it matches in namespace team-a would be denied"),
            "{e}"
        );
        // Named by none: a label override may select it; the top-level cap holds.
        let e = check(&format!("namespaces: [team-b], {three}"));
        assert!(
            e.contains("more than policyOverrides[gpu].policy.maxVolumesPerPod (2): every pod it matches in namespace team-b if override \"gpu\" selects it would be denied"),
            "{e}"
        );
        assert!(!e.contains("small"), "{e}");
        // Any namespace: every policy.
        let e = check(three);
        assert!(
            e.contains("policyOverrides[small]") && e.contains("policyOverrides[gpu]"),
            "{e}"
        );
        assert!(!e.contains("more than policy.maxVolumesPerPod"), "{e}");
        // Within every cap it can meet: valid.
        assert_eq!(check(&format!("namespaces: [team-b], {two}")), "");
        // Without overrides, as before.
        let e = Config::parse(&format!(
            "policy: {{maxVolumesPerPod: 1}}\nrules:\n  - {{name: r, {two}}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rules[0] (r): 2 volumes, more than policy.maxVolumesPerPod (1): every pod it matches would be denied"),
            "{e}"
        );
    }

    #[test]
    fn a_rule_without_a_name_says_its_other_errors_too_and_rule_names_are_unique() {
        let e = Config::parse(
            "rules:\n  - {name: a, namespaces: [x], volumes: {s: 'type=emptyDir,mountPath=/s'}}\n  \
             - {namespaces: [y], volumes: {t: 'type=emptyDir,sizee=1Gi,mountPath=/t'}}\n  \
             - {name: a, namespaces: [z], volumes: {u: 'type=emptyDir,mountPath=/u'}}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rules[1]: missing field name"), "{e}");
        assert!(
            e.contains("unknown field \"sizee\": did you mean size?"),
            "{e}"
        );
        assert!(
            e.contains("rules[2] (a): the name is rules[0]'s too"),
            "{e}"
        );
    }

    #[test]
    fn default_size_limit_above_the_maximum_is_refused() {
        let e = Config::parse(
            "policy: {requireSizeLimit: true, defaultSizeLimit: 20Gi, maxSize: {emptyDir: 10Gi}}",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("defaultSizeLimit 20Gi exceeds"),
            "{e}"
        );
    }
}
