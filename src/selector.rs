//! Kubernetes label selectors (`metav1.LabelSelector`), compiled once when the configuration
//! loads and matched with Kubernetes' semantics. The chart's matchConditions compile the same
//! selectors to CEL; the end-to-end tests check that the API server agrees with this matcher.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use crate::validate::{Invalid, from_json_strict};

/// A compiled `metav1.LabelSelector`.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    match_labels: BTreeMap<String, String>,
    expressions: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// How many requirements it states (labels and expressions): the more, the more specific.
    pub fn requirements(&self) -> usize {
        self.match_labels.len() + self.expressions.len()
    }

    /// Compiles a `podSelector` (strict JSON: unknown fields are refused).
    pub fn from_json(v: &Value) -> Result<Selector, Invalid> {
        let sel: LabelSelector = from_json_strict("podSelector", v)?;
        let mut expressions = Vec::new();
        for (i, e) in sel
            .match_expressions
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let values = e.values.unwrap_or_default();
            let at = format!("matchExpressions[{i}] ({})", e.key);
            let req = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(Invalid(format!(
                        "{at}: operator {} needs values",
                        e.operator
                    )));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(Invalid(format!(
                        "{at}: operator {} takes no values",
                        e.operator
                    )));
                }
                "In" => Requirement::In(e.key, values),
                "NotIn" => Requirement::NotIn(e.key, values),
                "Exists" => Requirement::Exists(e.key),
                "DoesNotExist" => Requirement::DoesNotExist(e.key),
                other => {
                    return Err(Invalid(format!(
                        "{at}: operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                    )));
                }
            };
            expressions.push(req);
        }
        Ok(Selector {
            match_labels: sel.match_labels.unwrap_or_default(),
            expressions,
        })
    }

    /// Whether these labels match (Kubernetes semantics: every requirement must hold).
    pub fn matches<K, V>(&self, labels: &BTreeMap<K, V>) -> bool
    where
        K: std::borrow::Borrow<str> + Ord,
        V: std::ops::Deref<Target = str>,
    {
        let get = |k: &str| labels.get(k).map(|v| &**v);
        self.match_labels
            .iter()
            .all(|(k, v)| get(k) == Some(v.as_str()))
            && self.expressions.iter().all(|r| match r {
                Requirement::In(k, vs) => get(k).is_some_and(|v| vs.iter().any(|x| x == v)),
                Requirement::NotIn(k, vs) => get(k).is_none_or(|v| !vs.iter().any(|x| x == v)),
                Requirement::Exists(k) => get(k).is_some(),
                Requirement::DoesNotExist(k) => get(k).is_none(),
            })
    }
}

impl Selector {
    /// The same test in CEL, of `labels` (a CEL expression of a map of strings, present even
    /// when the object has no labels): what the admission policies match a rule with.
    pub fn cel(&self, labels: &str) -> String {
        // A JSON string is a CEL string literal (the same escapes).
        let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let list = |vs: &[String]| {
            let vs: Vec<String> = vs.iter().map(|v| q(v)).collect();
            format!("[{}]", vs.join(", "))
        };
        let mut terms: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| {
                format!(
                    "({k} in {labels} && {labels}[{k}] == {v})",
                    k = q(k),
                    v = q(v)
                )
            })
            .collect();
        terms.extend(self.expressions.iter().map(|r| match r {
            Requirement::In(k, vs) => format!(
                "({k} in {labels} && {labels}[{k}] in {vs})",
                k = q(k),
                vs = list(vs)
            ),
            Requirement::NotIn(k, vs) => format!(
                "(!({k} in {labels}) || !({labels}[{k}] in {vs}))",
                k = q(k),
                vs = list(vs)
            ),
            Requirement::Exists(k) => format!("({} in {labels})", q(k)),
            Requirement::DoesNotExist(k) => format!("!({} in {labels})", q(k)),
        }));
        if terms.is_empty() {
            "true".to_owned()
        } else {
            terms.join(" && ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Kubernetes' semantics, one row per operator and edge: `NotIn` and `DoesNotExist` hold
    /// when the label is absent; `{}` selects everything; every requirement must hold.
    #[test]
    fn selectors_match_as_kubernetes_does() {
        type Case<'a> = (Value, &'a [(&'a str, &'a str)], bool);
        let cases: &[Case] = &[
            (json!({}), &[], true),
            (json!({}), &[("a", "1")], true),
            (json!({"matchLabels": {"a": "1"}}), &[("a", "1")], true),
            (json!({"matchLabels": {"a": "1"}}), &[("a", "2")], false),
            (json!({"matchLabels": {"a": "1"}}), &[], false),
            (
                json!({"matchLabels": {"a": "1", "b": "2"}}),
                &[("a", "1")],
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}),
                &[("a", "2")],
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}),
                &[],
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}),
                &[],
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}),
                &[("a", "1")],
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}),
                &[("a", "3")],
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]}),
                &[("a", "")],
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]}),
                &[],
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}),
                &[],
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}),
                &[("a", "x")],
                false,
            ),
            (
                json!({"matchLabels": {"b": "2"}, "matchExpressions": [{"key": "a", "operator": "Exists"}]}),
                &[("a", "1")],
                false,
            ),
        ];
        for (selector, pod, want) in cases {
            let compiled = Selector::from_json(selector).unwrap();
            assert_eq!(
                compiled.matches(&labels(pod)),
                *want,
                "{selector} on {pod:?}"
            );
        }
    }

    #[test]
    fn bad_selectors_are_refused_by_place() {
        for (selector, message) in [
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
                "matchExpressions[0] (a): operator In needs values",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["1"]}]}),
                "operator Exists takes no values",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["1"]}]}),
                "operator \"Equals\" is not one of",
            ),
            (json!({"matchLabel": {"a": "1"}}), "matchLabel"),
        ] {
            let err = Selector::from_json(&selector).unwrap_err();
            assert!(err.0.contains(message), "{selector}: {}", err.0);
        }
    }
}
