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
        // Which fields differ, never their values: a CSI volume's attributes can carry
        // credentials, and the message goes to the user, the API server's audit log and ours.
        let mut fields = Vec::new();
        differing(&want, &have, have_kind.as_str(), &mut fields);
        return Err(format!(
            "with other {have_kind} settings ({} differ)",
            crate::echo::list(&fields).unwrap_or_else(|| have_kind.clone())
        ));
    }
    Ok(())
}

/// The paths (`emptyDir.sizeLimit`) at which two values differ, into `out`: a field one has
/// and the other lacks, or the same field with other contents (an array as a whole).
fn differing(want: &Value, have: &Value, path: &str, out: &mut Vec<String>) {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            let keys: std::collections::BTreeSet<&String> = w.keys().chain(h.keys()).collect();
            for key in keys {
                let at = format!("{path}.{key}");
                match (w.get(key), h.get(key)) {
                    (Some(a), Some(b)) if a == b => {}
                    (Some(a), Some(b)) => differing(a, b, &at, out),
                    _ => out.push(at),
                }
            }
        }
        (a, b) if a != b => out.push(path.to_owned()),
        _ => {}
    }
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
    fn a_csi_volumes_attributes_are_named_by_key_never_quoted() {
        let ours = json!({"name": "s", "csi": {"driver": "d", "volumeAttributes": {
            "secretProviderClass": "vault", "token": "s3cr3t-ours", "same": "x"}}});
        let theirs = json!({"name": "s", "csi": {"driver": "d", "volumeAttributes": {
            "secretProviderClass": "vault", "token": "s3cr3t-theirs", "extra": "hunter2", "same": "x"}}});
        let differs = same_volume(&ours, &theirs).unwrap_err();
        assert_eq!(
            differs,
            "with other csi settings (csi.volumeAttributes.extra, csi.volumeAttributes.token differ)"
        );
        for secret in ["s3cr3t", "hunter2", "vault"] {
            assert!(!differs.contains(secret), "{differs}");
        }
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
        assert_eq!(
            other,
            Err("with other emptyDir settings (emptyDir.sizeLimit differ)".into())
        );
        assert_eq!(
            same_volume(&ours, &json!({"name": "s"})),
            Err("which is not a single volume source".into())
        );
    }
}
