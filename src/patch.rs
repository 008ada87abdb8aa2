//! JSON Patch (RFC 6902) operations as typed values, serialised once.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, Volume, VolumeMount};
use serde::Serialize;

/// The webhook only ever adds: whole arrays where they are missing, `/-` appends otherwise,
/// and single annotation keys. It never replaces an existing array.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatchOp {
    pub op: &'static str,
    pub path: String,
    pub value: PatchValue,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PatchValue {
    Volume(Box<Volume>),
    Volumes(Vec<Volume>),
    Mount(VolumeMount),
    Mounts(Vec<VolumeMount>),
    Env(EnvVar),
    Envs(Vec<EnvVar>),
    Text(String),
    Map(BTreeMap<String, String>),
    Metadata {
        annotations: BTreeMap<String, String>,
    },
}

impl PatchOp {
    pub fn add(path: String, value: PatchValue) -> Self {
        PatchOp {
            op: "add",
            path,
            value,
        }
    }
}

/// RFC 6901: `~` becomes `~0`, `/` becomes `~1`.
pub fn escape(token: &str) -> std::borrow::Cow<'_, str> {
    if token.contains(['~', '/']) {
        token.replace('~', "~0").replace('/', "~1").into()
    } else {
        token.into()
    }
}

/// Serialises a patch to the bytes the AdmissionReview carries (before base64).
pub fn to_json(ops: &[PatchOp]) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::with_capacity(256 * ops.len());
    serde_json::to_writer(&mut out, ops)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_follows_rfc_6901() {
        assert_eq!(escape("plain"), "plain");
        assert_eq!(
            escape("injector.ephemeral-volumes.io/injected"),
            "injector.ephemeral-volumes.io~1injected"
        );
        assert_eq!(escape("a~b/c"), "a~0b~1c");
    }

    #[test]
    fn ops_serialise_as_rfc_6902_and_apply_with_json_patch() {
        let ops = vec![PatchOp::add(
            "/metadata/annotations/a~1b".into(),
            PatchValue::Text("x".into()),
        )];
        let bytes = to_json(&ops).unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        let mut doc = serde_json::json!({"metadata": {"annotations": {}}});
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(doc["metadata"]["annotations"]["a/b"], "x");
    }
}
