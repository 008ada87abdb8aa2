//! JSON Patch (RFC 6902) operations as typed values, serialised once.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIVolumeSource, EmptyDirVolumeSource, EnvVar, EphemeralVolumeSource, Volume, VolumeMount,
};
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
    Volume(InjectedVolume),
    Volumes(Vec<InjectedVolume>),
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

/// A `core/v1` Volume with one of the three sources this webhook injects. It serialises exactly
/// as k8s-openapi's `Volume` does, without carrying that type's 3 KB of other sources around.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InjectedVolume {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDirVolumeSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub csi: Option<CSIVolumeSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<Box<EphemeralVolumeSource>>,
}

impl From<InjectedVolume> for Volume {
    fn from(v: InjectedVolume) -> Volume {
        Volume {
            name: v.name,
            empty_dir: v.empty_dir,
            csi: v.csi,
            ephemeral: v.ephemeral.map(|e| *e),
            ..Volume::default()
        }
    }
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
    fn injected_volumes_serialise_as_kubernetes_volumes() {
        let v = InjectedVolume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                    "1Gi".into(),
                )),
            }),
            csi: None,
            ephemeral: None,
        };
        let ours = serde_json::to_value(&v).unwrap();
        let theirs = serde_json::to_value(Volume::from(v)).unwrap();
        assert_eq!(ours, theirs);
        let back: Volume = serde_json::from_value(ours).unwrap();
        assert_eq!(back.name, "scratch");
    }

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
