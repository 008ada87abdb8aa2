//! Comparing with what the pod already has: a volume of the same name counts as ours only
//! when it is identical, allowing for what the API server changes between two calls.

use serde_json::Value;

use crate::quantity::Quantity;

/// Is the pod's volume of this name the one we would write? Only an identical source counts:
/// same kind, same fields. Identical allows for what the API server does between two calls of
/// the webhook (reinvocation): it drops zero values (`medium: ""`, `readOnly: false`), adds
/// `volumeClaimTemplate.metadata: {}` and `volumeMode: Filesystem`, and canonicalises
/// quantities (`1024Mi` → `1Gi`). The error says how they differ.
pub(super) fn same_volume(desired: &Value, existing: &Value) -> Result<(), String> {
    let source_of = |v: &Value| -> Option<(String, Value)> {
        let obj = v.as_object()?;
        let mut sources = obj.iter().filter(|(k, _)| k.as_str() != "name");
        let (kind, source) = sources.next()?;
        sources
            .next()
            .is_none()
            .then(|| (kind.clone(), canonical(source, kind).unwrap_or(Value::Null)))
    };
    let (Some((want_kind, want)), Some((have_kind, have))) =
        (source_of(desired), source_of(existing))
    else {
        return Err("which is not a single volume source".into());
    };
    if want_kind != have_kind {
        return Err(format!("of kind {have_kind}, not {want_kind}"));
    }
    if want != have {
        return Err(format!(
            "with other {have_kind} settings ({have} here, {want} asked)"
        ));
    }
    Ok(())
}

/// A value as the API server would store it: zero values and defaults dropped, quantities in
/// one spelling. `None` when nothing is left.
fn canonical(v: &Value, key: &str) -> Option<Value> {
    match v {
        Value::Object(o) => {
            let kept: serde_json::Map<String, Value> = o
                .iter()
                .filter_map(|(k, v)| canonical(v, k).map(|v| (k.clone(), v)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        Value::Array(a) if a.is_empty() => None,
        Value::Array(a) => Some(Value::Array(
            a.iter()
                .map(|v| canonical(v, "").unwrap_or(Value::Null))
                .collect(),
        )),
        Value::Null | Value::Bool(false) => None,
        Value::String(s) if s.is_empty() => None,
        Value::String(s) if key == "volumeMode" && s == "Filesystem" => None,
        Value::String(s) if matches!(key, "sizeLimit" | "storage") => Some(Value::String(
            s.parse::<Quantity>()
                .map_or_else(|_| s.clone(), |q| q.to_string()),
        )),
        Value::Number(n) if n.as_f64() == Some(0.0) => None,
        other => Some(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_api_servers_defaulting_does_not_make_a_volume_different() {
        let ours = json!({"name": "s", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1024Gi"}}}}}});
        let stored = json!({"name": "s", "ephemeral": {"volumeClaimTemplate": {"metadata": {},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                     "resources": {"requests": {"storage": "1Ti"}}}}}});
        assert_eq!(same_volume(&ours, &stored), Ok(()));
        let ram = json!({"name": "s", "emptyDir": {"medium": "", "sizeLimit": "1Gi"}});
        assert_eq!(
            same_volume(
                &ram,
                &json!({"name": "s", "emptyDir": {"sizeLimit": "1024Mi"}})
            ),
            Ok(())
        );
    }

    #[test]
    fn another_kind_or_other_settings_are_named() {
        let ours = json!({"name": "s", "emptyDir": {"sizeLimit": "1Gi"}});
        assert_eq!(
            same_volume(
                &ours,
                &json!({"name": "s", "persistentVolumeClaim": {"claimName": "c"}})
            ),
            Err("of kind persistentVolumeClaim, not emptyDir".into())
        );
        let other = same_volume(
            &ours,
            &json!({"name": "s", "emptyDir": {"sizeLimit": "2Gi"}}),
        );
        assert!(
            other
                .as_ref()
                .is_err_and(|e| e.starts_with("with other emptyDir settings")),
            "{other:?}"
        );
        assert_eq!(
            same_volume(&ours, &json!({"name": "s"})),
            Err("which is not a single volume source".into())
        );
    }
}
