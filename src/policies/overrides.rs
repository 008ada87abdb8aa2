//! `policyOverrides` in the admission policies: the policy of the request's namespace chosen as
//! the webhook chooses it — the override that names the namespace, else of those whose
//! `namespaceSelector` matches the Namespace's labels (`namespaceObject`) the one with the most
//! requirements (the first in the file on a tie), else `policy` — in a variable, `policy`,
//! that every expression reading a limit branches on. The objects are the same four whatever
//! the overrides: each is compiled once per policy and the copies merged, expression by
//! expression, where they differ.

use serde_json::{Value, json};

use super::cel::quote;
use crate::config::{Config, Namespaces, Policy};

/// Each policy the objects are compiled under, by the value the `policy` variable has where
/// it is in force: the overrides by name, then `policy` (`''`).
pub fn variants(cfg: &Config) -> Vec<(&str, &Policy)> {
    let mut out: Vec<(&str, &Policy)> = cfg
        .overrides
        .iter()
        .map(|o| (o.name.as_str(), &o.policy))
        .collect();
    out.push(("", &cfg.policy));
    out
}

/// The name of the override in force in the request's namespace, `''` for `policy`.
fn chooser(cfg: &Config) -> String {
    let labels = "(namespaceObject != null && has(namespaceObject.metadata.labels) \
                  ? namespaceObject.metadata.labels : {})";
    let mut out = String::new();
    for o in &cfg.overrides {
        if let Namespaces::Named(names) = &o.selects {
            let names: Vec<String> = names.iter().map(|n| quote(n)).collect();
            out.push_str(&format!(
                "request.namespace in [{}] ? {} : ",
                names.join(", "),
                quote(&o.name)
            ));
        }
    }
    // The most requirements first; the first in the file on a tie (a stable sort).
    let mut by_label: Vec<_> = cfg
        .overrides
        .iter()
        .filter_map(|o| match &o.selects {
            Namespaces::Labelled(s) => Some((o, s)),
            Namespaces::Named(_) => None,
        })
        .collect();
    by_label.sort_by_key(|(_, s)| std::cmp::Reverse(s.requirements()));
    for (o, s) in by_label {
        out.push_str(&format!("({}) ? {} : ", s.cel(labels), quote(&o.name)));
    }
    out.push_str("''");
    out
}

/// The objects of each policy made one: where an expression differs between them, it branches
/// on `variables.policy` (added first to every object with variables).
pub fn merge(cfg: &Config, mut variants: Vec<(&str, Vec<Value>)>) -> Vec<Value> {
    if variants.len() < 2 {
        return variants.pop().map(|(_, d)| d).unwrap_or_default();
    }
    let count = variants[0].1.len();
    (0..count)
        .map(|i| {
            let copies: Vec<(&str, &Value)> =
                variants.iter().map(|(name, d)| (*name, &d[i])).collect();
            let mut merged = merge_value(&copies, "");
            if let Some(Value::Array(vars)) = merged.pointer_mut("/spec/variables") {
                vars.insert(0, json!({"name": "policy", "expression": chooser(cfg)}));
            }
            merged
        })
        .collect()
}

/// One value of the copies (the last is `policy`'s): the same where they agree, an
/// expression that branches where they do not.
fn merge_value(copies: &[(&str, &Value)], key: &str) -> Value {
    let Some(((_, last), overrides)) = copies.split_last() else {
        return Value::Null;
    };
    if overrides.iter().all(|(_, v)| v == last) {
        return (*last).clone();
    }
    match last {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, _)| {
                    let at: Vec<(&str, &Value)> = copies.iter().map(|(n, v)| (*n, &v[k])).collect();
                    (k.clone(), merge_value(&at, k))
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            (0..items.len())
                .map(|i| {
                    let at: Vec<(&str, &Value)> = copies.iter().map(|(n, v)| (*n, &v[i])).collect();
                    merge_value(&at, key)
                })
                .collect(),
        ),
        Value::String(default) if key.ends_with("xpression") => {
            let mut out = String::new();
            for (name, v) in overrides {
                out.push_str(&format!(
                    "variables.policy == {} ? ({}) : ",
                    quote(name),
                    v.as_str().unwrap_or_default()
                ));
            }
            out.push_str(&format!("({default})"));
            Value::String(out)
        }
        _ => (*last).clone(),
    }
}
