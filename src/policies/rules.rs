//! The configuration's `rules` in the admission policies: which rules match a pod (the
//! request's namespace and the pod's labels, as the webhook matches them) and the volume each
//! gives, resolved once here as the webhook resolves it. A rule's volume takes part as an
//! annotation would, under the key its annotation would have (`<prefix>/<volume>`), so that
//! one asked for by an annotation of that name is the annotation's (an annotation wins over a
//! rule; the first matching rule over later ones).

use super::{Unsupported, cel::quote};
use crate::{
    config::{Config, Policy, Rule},
    engine::{RuleVolume, rule_volume},
};

/// One volume of one rule.
pub struct Given<'c> {
    /// The rule.
    pub rule: &'c Rule,
    /// The annotation key a request of this volume would have.
    pub key: String,
    /// The volume as the webhook resolves it.
    pub volume: RuleVolume,
}

/// Every rule's volumes, in the configuration's order, and each rule's match in CEL.
pub struct Rules<'c> {
    given: Vec<Given<'c>>,
    rules: &'c [Rule],
}

/// The rules' keys the policies cannot serve as the webhook does, each named.
pub fn unsupported(cfg: &Config) -> Vec<Unsupported> {
    let mut out = Vec::new();
    for rule in &cfg.rules {
        let at = format!("rules[{}]", rule.name);
        if rule.mode != cfg.mode {
            out.push(Unsupported {
                key: format!("{at}.mode"),
                why: "the policies audit everything (mode: audit at the top, no profile or rule \
                      enforced) or nothing"
                    .to_owned(),
            });
        }
        // Resolved as the webhook resolves it in any pod: a volume it would refuse whatever
        // the pod is said here.
        for (name, request) in &rule.volumes {
            if let Err(d) = rule_volume(cfg, &cfg.policy, &rule.name, name, request) {
                out.push(Unsupported {
                    key: format!("{at}.volumes.{name}"),
                    why: d.message,
                });
            }
        }
    }
    out
}

impl<'c> Rules<'c> {
    /// The rules of `cfg` (those [`unsupported`] lets through) under `policy`, their keys
    /// under `prefix` (with its `/`).
    pub fn new(cfg: &'c Config, policy: &Policy, prefix: &str) -> Self {
        let mut given = Vec::new();
        for rule in &cfg.rules {
            for (name, request) in &rule.volumes {
                if let Ok(volume) = rule_volume(cfg, policy, &rule.name, name, request) {
                    given.push(Given {
                        rule,
                        key: format!("{prefix}{name}"),
                        volume,
                    });
                }
            }
        }
        Rules {
            given,
            rules: &cfg.rules,
        }
    }

    /// Whether no rule gives a volume.
    pub fn is_empty(&self) -> bool {
        self.given.is_empty()
    }

    /// Whether any rule matches a pod whose labels are `labels`.
    pub fn any(&self, labels: &str) -> String {
        let any: Vec<String> = self
            .rules
            .iter()
            .map(|rule| format!("({})", matches(rule, labels)))
            .collect();
        if any.is_empty() {
            "false".to_owned()
        } else {
            any.join(" || ")
        }
    }

    /// A map from each key a rule gives to the name of the first rule that matches the pod
    /// and gives it, else `''`.
    pub fn rule_of(&self, labels: &str) -> String {
        let mut keys: Vec<&str> = Vec::new();
        for g in &self.given {
            if !keys.contains(&g.key.as_str()) {
                keys.push(&g.key);
            }
        }
        let entries: Vec<String> = keys
            .iter()
            .map(|key| {
                let mut chain = String::new();
                for g in self.given.iter().filter(|g| g.key == *key) {
                    let rule = quote(&g.rule.name);
                    chain.push_str(&format!("({}) ? {rule} : ", matches(g.rule, labels)));
                }
                format!("{}: {chain}''", quote(key))
            })
            .collect();
        format!("{{{}}}", entries.join(", "))
    }

    /// `pick` of the volume the rule in `variables.ruleOf[k]` gives at key `k`: a chain of
    /// conditionals, the last without a test (only a key a rule gives is asked).
    pub fn chain(&self, pick: impl Fn(&RuleVolume) -> String) -> String {
        let Some((last, rest)) = self.given.split_last() else {
            return "''".to_owned();
        };
        let mut out = String::new();
        for g in rest {
            out.push_str(&format!(
                "k == {} && variables.ruleOf[k] == {} ? {} : ",
                quote(&g.key),
                quote(&g.rule.name),
                pick(&g.volume)
            ));
        }
        out.push_str(&pick(&last.volume));
        out
    }
}

/// Whether `rule` matches: the request's namespace is one of its namespaces and the pod's
/// labels (`labels`, a CEL map) its selector.
fn matches(rule: &Rule, labels: &str) -> String {
    let mut terms = Vec::new();
    if let Some(namespaces) = &rule.namespaces {
        let names: Vec<String> = namespaces.iter().map(|n| quote(n)).collect();
        terms.push(format!("request.namespace in [{}]", names.join(", ")));
    }
    if let Some(selector) = &rule.selector {
        terms.push(selector.cel(labels));
    }
    if terms.is_empty() {
        "true".to_owned()
    } else {
        terms.join(" && ")
    }
}
