//! JSON Patch (RFC 6902): the operations the webhook writes, and the values it writes in them.

use std::{collections::BTreeMap, sync::Arc};

use serde::Serialize;
use serde_json::value::RawValue;

use crate::volume::VolumeKind;

/// A JSON Patch, kept as the JSON it is: each op's value is serialised as it is added, so the
/// response only has to base64 the bytes.
///
/// The webhook only ever adds: whole arrays where they are missing, `/-` appends otherwise,
/// and single annotation keys. It never replaces an existing array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    /// Always a complete JSON array (`[]` when empty).
    json: Vec<u8>,
    ops: usize,
}

impl Default for Patch {
    fn default() -> Self {
        Patch::with_capacity(2)
    }
}

impl Patch {
    /// An empty patch with room for `bytes` of operations.
    pub fn with_capacity(bytes: usize) -> Self {
        let mut json = Vec::with_capacity(bytes.max(2));
        json.extend_from_slice(b"[]");
        Patch { json, ops: 0 }
    }

    /// Whether there is no operation.
    pub fn is_empty(&self) -> bool {
        self.ops == 0
    }

    /// The number of operations.
    pub fn len(&self) -> usize {
        self.ops
    }

    /// The RFC 6902 array, as the AdmissionReview carries it (before base64).
    pub fn as_bytes(&self) -> &[u8] {
        &self.json
    }

    /// Appends `{"op":"add","path":path,"value":value}`. On error the patch is unchanged.
    pub fn add<T: Serialize + ?Sized>(
        &mut self,
        path: &str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        let len = self.json.len();
        self.open_op();
        let written = serde_json::to_writer(&mut self.json, path).and_then(|()| {
            self.json.extend_from_slice(b",\"value\":");
            serde_json::to_writer(&mut self.json, value)
        });
        if let Err(e) = written {
            self.json.truncate(len - 1);
            self.json.push(b']');
            return Err(e);
        }
        self.json.extend_from_slice(b"}]");
        self.ops += 1;
        Ok(())
    }

    fn open_op(&mut self) {
        self.reopen();
        self.json.extend_from_slice(b"{\"op\":\"add\",\"path\":");
    }

    /// Drops the closing `]` and, after an operation, adds the `,` before the next one.
    fn reopen(&mut self) {
        self.json.pop();
        if self.ops > 0 {
            self.json.push(b',');
        }
    }
}

impl Serialize for Patch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw: &serde_json::value::RawValue =
            serde_json::from_slice(&self.json).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

/// `metadata` holding only annotations, for a pod that has no `metadata` at all.
#[derive(Serialize)]
pub struct MetadataWith<'a> {
    /// The annotations to set.
    pub annotations: &'a BTreeMap<&'a str, &'a str>,
}

/// A `core/v1` Volume with one source, kept as the JSON it is written as; serialises as
/// k8s-openapi's `Volume` does (keys in its order: the source, then `name`).
#[derive(Debug, Clone)]
pub struct Volume {
    /// The volume's name.
    pub name: String,
    /// The source's field: `emptyDir`, `csi` or `ephemeral`.
    pub kind: VolumeKind,
    /// The source object.
    pub source: Arc<RawValue>,
}

impl Serialize for Volume {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry(self.kind.as_str(), &*self.source)?;
        m.serialize_entry("name", &self.name)?;
        m.end()
    }
}

/// A `core/v1` VolumeMount with the fields the webhook sets; serialises as k8s-openapi's
/// `VolumeMount` does (same names, same order, absent fields omitted).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    /// Where it is mounted.
    pub mount_path: String,
    /// The volume's name.
    pub name: String,
    /// `readOnly`, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// `subPath`, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
}

/// A `core/v1` EnvVar with a literal value; serialises as k8s-openapi's `EnvVar` does.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EnvVar {
    /// The variable.
    pub name: String,
    /// Its value (a mount path).
    pub value: String,
}

/// RFC 6901: `~` becomes `~0`, `/` becomes `~1`.
pub fn escape(token: &str) -> std::borrow::Cow<'_, str> {
    if token.contains(['~', '/']) {
        token.replace('~', "~0").replace('/', "~1").into()
    } else {
        token.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_and_env_serialise_as_kubernetes_types() {
        use k8s_openapi::api::core::v1 as k8s;
        for (read_only, sub_path) in [(None, None), (Some(true), Some("a/b")), (Some(false), None)]
        {
            let ours = VolumeMount {
                mount_path: "/scratch".into(),
                name: "scratch".into(),
                read_only,
                sub_path: sub_path.map(str::to_owned),
            };
            let theirs = k8s::VolumeMount {
                mount_path: "/scratch".into(),
                name: "scratch".into(),
                read_only,
                sub_path: sub_path.map(str::to_owned),
                ..Default::default()
            };
            assert_eq!(
                serde_json::to_string(&ours).unwrap(),
                serde_json::to_string(&theirs).unwrap()
            );
        }
        let env = EnvVar {
            name: "TMPDIR".into(),
            value: "/scratch".into(),
        };
        let theirs = k8s::EnvVar {
            name: "TMPDIR".into(),
            value: Some("/scratch".into()),
            value_from: None,
        };
        assert_eq!(
            serde_json::to_string(&env).unwrap(),
            serde_json::to_string(&theirs).unwrap()
        );
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
        let mut patch = Patch::default();
        assert_eq!(patch.as_bytes(), b"[]");
        patch.add("/metadata/annotations/a~1b", "x").unwrap();
        patch
            .add(
                "/spec/env",
                &[EnvVar {
                    name: "TMPDIR".into(),
                    value: "/scratch".into(),
                }],
            )
            .unwrap();
        patch
            .add("/metadata/labels", &BTreeMap::from([("k\"", "v")]))
            .unwrap();
        assert_eq!(patch.len(), 3);
        let parsed: json_patch::Patch = serde_json::from_slice(patch.as_bytes()).unwrap();
        let mut doc = serde_json::json!({"metadata": {"annotations": {}}, "spec": {}});
        json_patch::patch(&mut doc, &parsed).unwrap();
        assert_eq!(doc["metadata"]["annotations"]["a/b"], "x");
        assert_eq!(doc["metadata"]["labels"]["k\""], "v");
        assert_eq!(
            doc["spec"]["env"],
            serde_json::to_value([k8s_openapi::api::core::v1::EnvVar {
                name: "TMPDIR".into(),
                value: Some("/scratch".into()),
                value_from: None,
            }])
            .unwrap()
        );
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            serde_json::from_slice::<serde_json::Value>(patch.as_bytes()).unwrap()
        );
    }

    #[test]
    fn a_failed_add_leaves_the_patch_as_it_was() {
        struct Fails;
        impl Serialize for Fails {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no"))
            }
        }
        let mut patch = Patch::default();
        patch.add("/a", "1").unwrap();
        let before = patch.clone();
        assert!(patch.add("/b", &Fails).is_err());
        assert_eq!(patch, before);
        let mut empty = Patch::default();
        assert!(empty.add("/b", &Fails).is_err());
        assert_eq!(empty, Patch::default());
    }
}
