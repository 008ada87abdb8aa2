//! CEL text for the admission policies: string literals, and a volume source's JSON as the
//! typed object the API server's CEL knows it as (`Object.spec.volumes.emptyDir{…}`), so that
//! the API server type-checks what a policy adds against the pod's schema when the policy is
//! created, not when a pod arrives.

use std::fmt::Write as _;

use serde_json::Value;

/// Every container of a list, as a target list: `;` is in no name (the lists are split at it).
pub const ALL: &str = "[';']";

/// The fields of a volume source, at any depth, whose value is a map of strings in the pod's
/// schema (every other object is a typed object, named by its path).
const MAPS: [&str; 6] = [
    "volumeAttributes",
    "labels",
    "annotations",
    "requests",
    "limits",
    "matchLabels",
];

/// A CEL string literal of `s`: single-quoted, with `\`, `'` and every control character
/// escaped.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A CEL list literal of strings.
pub fn list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.into_iter().map(quote).collect();
    format!("[{}]", items.join(", "))
}

/// `value` as a CEL literal of the type at `path` in the pod's schema (`Object.spec.volumes`
/// and below): an object is `path{field: …}`, a map of strings `{'k': 'v'}`, a list `[…]` of
/// its items at the same path.
pub fn typed(path: &str, value: &Value) -> String {
    match value {
        Value::Object(fields) => {
            let fields: Vec<String> = fields
                .iter()
                .map(|(k, v)| {
                    let inner = if MAPS.contains(&k.as_str()) {
                        map(v)
                    } else {
                        typed(&format!("{path}.{k}"), v)
                    };
                    format!("{k}: {inner}")
                })
                .collect();
            format!("{path}{{{}}}", fields.join(", "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(|v| typed(path, v)).collect();
            format!("[{}]", items.join(", "))
        }
        Value::String(s) => quote(s),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => "null".to_owned(),
    }
}

/// The checks that the object at `at` (a CEL expression) has every field of `value` with its
/// value (lists of scalars and maps of strings compared whole; a list of objects is not
/// compared): how a volume of the pod's own is told from the one a profile would add.
pub fn same_as(at: &str, value: &Value, checks: &mut Vec<String>) {
    let Value::Object(fields) = value else {
        return;
    };
    for (k, v) in fields {
        let here = format!("{at}.{k}");
        match v {
            Value::Object(_) if MAPS.contains(&k.as_str()) => {
                checks.push(format!("has({here}) && {here} == {}", map(v)));
            }
            Value::Object(_) => {
                checks.push(format!("has({here})"));
                same_as(&here, v, checks);
            }
            Value::Array(items) if items.iter().any(Value::is_object) => {}
            other => checks.push(format!("has({here}) && {here} == {}", typed("", other))),
        }
    }
}

/// A map of strings as a CEL map literal.
fn map(value: &Value) -> String {
    match value {
        Value::Object(fields) => {
            let entries: Vec<String> = fields
                .iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) => quote(s),
                        other => quote(&other.to_string()),
                    };
                    format!("{}: {v}", quote(k))
                })
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
        other => typed("", other),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_string_literal_escapes_what_would_end_or_break_it() {
        assert_eq!(quote("/scratch"), "'/scratch'");
        assert_eq!(quote(r"a'b\c"), r"'a\'b\\c'");
        assert_eq!(quote("a\nb\u{1}"), r"'a\nb\u0001'");
        assert_eq!(list(["a", "b'"]), r"['a', 'b\'']");
    }

    #[test]
    fn a_source_is_a_typed_object_and_its_string_maps_are_maps() {
        let source = json!({"volumeClaimTemplate": {
            "metadata": {"labels": {"app": "x"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
                     "resources": {"requests": {"storage": "200Gi"}}}}});
        let p = "Object.spec.volumes.ephemeral";
        assert_eq!(
            typed(p, &source),
            format!(
                "{p}{{volumeClaimTemplate: {p}.volumeClaimTemplate{{metadata: {p}.volumeClaimTemplate.metadata{{labels: {{'app': 'x'}}}}, \
                 spec: {p}.volumeClaimTemplate.spec{{accessModes: ['ReadWriteOnce'], \
                 resources: {p}.volumeClaimTemplate.spec.resources{{requests: {{'storage': '200Gi'}}}}, storageClassName: 'gp3'}}}}}}"
            )
        );
        let csi = json!({"driver": "d", "readOnly": true, "volumeAttributes": {"a'": "1"}});
        assert_eq!(
            typed("Object.spec.volumes.csi", &csi),
            r"Object.spec.volumes.csi{driver: 'd', readOnly: true, volumeAttributes: {'a\'': '1'}}"
        );
    }
}
