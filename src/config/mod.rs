//! The cluster-wide configuration file (`docs/configuration.md`): read part by part (`file`),
//! validated whole and compiled (`compile`) into a [`Config`] the engine reads without further
//! checks.

mod compile;
mod file;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use serde::Deserialize;
use serde_json::Value;

use crate::{
    quantity::Quantity,
    selector::Selector,
    validate,
    volume::{Profile, VolumeKind, VolumeRequest},
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

// === the compiled configuration ===

/// The configuration, compiled: what the engine reads, checked once at load.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `annotationPrefix`: annotations `<prefix>/<volume>` ask for volumes.
    pub prefix: String,
    /// The prefix's searcher, built once: a pod's labels, as written, are searched for it
    /// (a label meant as an annotation gets a hint).
    pub prefix_search: Substring,
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
pub struct Substring(memchr::memmem::Finder<'static>);

impl Substring {
    /// A searcher for `needle`.
    pub fn new(needle: &str) -> Substring {
        Substring(memchr::memmem::Finder::new(needle.as_bytes()).into_owned())
    }

    /// Whether `haystack` contains the needle.
    pub fn is_in(&self, haystack: &str) -> bool {
        self.0.find(haystack.as_bytes()).is_some()
    }
}

impl PartialEq for Substring {
    fn eq(&self, other: &Substring) -> bool {
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
            prefix_search: Substring::new(prefix),
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
        // YAML syntax, nesting too deep to read, and keys given twice (which YAML forbids and
        // serde would let pass, keeping the last), stop the reading: there is no document to
        // read further.
        let syntax =
            |e: &dyn std::fmt::Display| ConfigError::Invalid(vec![format!("not valid YAML: {e}")]);
        crate::yaml_nesting::check(text).map_err(|e| syntax(&e))?;
        let doc: Value = yaml_serde::from_str(text).map_err(|e| syntax(&e))?;
        // An empty file, or one with only comments, is the default configuration.
        let file = if doc.is_null() {
            file::FileConfig::default()
        } else {
            yaml_serde::from_str::<validate::NoDuplicates>(text).map_err(|e| syntax(&e))?;
            file::FileConfig::read(doc, &mut errors)
        };
        compile::compile(file, errors)
    }
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
    use crate::volume::{Medium, Requested, Source};

    /// The example of docs/configuration.md, read from the page itself (its first `yaml`
    /// block), so that the documented file is the tested one.
    fn documented_example() -> &'static str {
        let page = include_str!("../../docs/configuration.md");
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
