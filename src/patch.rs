//! JSON Patch (RFC 6902): the operations the webhook writes, and the values it writes in them.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::volume::{Json, VolumeKind};

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
    pub fn add<T: PatchValue + ?Sized>(
        &mut self,
        path: &str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        let len = self.json.len();
        self.open_op();
        let written = write_str(&mut self.json, path).and_then(|()| {
            self.json.extend_from_slice(b",\"value\":");
            value.write_json(&mut self.json)
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

/// A value of a patch operation, written as the JSON serde_json writes for it (compact, the
/// same escapes): the patch's few types write themselves, their strings checked whole for
/// escapes (`write_str`), which they almost never need.
pub trait PatchValue {
    /// Appends the value's JSON to `out`. Fails only if serde_json fails on a string that
    /// needs escapes (it cannot for a `Vec`).
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error>;
}

/// A JSON string: quoted as it is when no byte needs an escape (the usual case; the check is
/// one pass the compiler vectorises, no branch per byte), else written by serde_json.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) -> Result<(), serde_json::Error> {
    let escapes = s.bytes().fold(false, |any, b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if escapes {
        return serde_json::to_writer(out, s);
    }
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
    Ok(())
}

/// Writes an object's fields in the order given, with the commas between them (the patch's
/// mounts and variables).
pub(crate) struct ObjectWriter<'o> {
    out: &'o mut Vec<u8>,
    empty: bool,
}

impl<'o> ObjectWriter<'o> {
    /// Opens the object.
    pub(crate) fn open(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        ObjectWriter { out, empty: true }
    }

    /// Writes the next field's key (a plain ASCII name) and returns where its value goes.
    pub(crate) fn key(&mut self, key: &str) -> &mut Vec<u8> {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    /// A boolean field, when it is set.
    pub(crate) fn bool(&mut self, key: &str, value: Option<bool>) {
        if let Some(v) = value {
            self.key(key)
                .extend_from_slice(if v { b"true" } else { b"false" });
        }
    }

    /// A string field, when it is set.
    pub(crate) fn str(&mut self, key: &str, value: Option<&str>) -> Result<(), serde_json::Error> {
        match value {
            Some(v) => write_str(self.key(key), v),
            None => Ok(()),
        }
    }

    /// Closes the object.
    pub(crate) fn close(self) {
        self.out.push(b'}');
    }
}

impl PatchValue for str {
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        write_str(out, self)
    }
}

impl PatchValue for String {
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        write_str(out, self)
    }
}

/// An array.
impl<T: PatchValue> PatchValue for [T] {
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.push(b'[');
        for (i, item) in self.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            item.write_json(out)?;
        }
        out.push(b']');
        Ok(())
    }
}

/// An object of strings, its keys in order (annotations).
impl PatchValue for BTreeMap<&str, &str> {
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.push(b'{');
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_str(out, k)?;
            out.push(b':');
            write_str(out, v)?;
        }
        out.push(b'}');
        Ok(())
    }
}

/// `metadata` holding only annotations, for a pod that has no `metadata` at all.
pub struct MetadataWith<'a> {
    /// The annotations to set.
    pub annotations: &'a BTreeMap<&'a str, &'a str>,
}

impl PatchValue for MetadataWith<'_> {
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.extend_from_slice(b"{\"annotations\":");
        self.annotations.write_json(out)?;
        out.push(b'}');
        Ok(())
    }
}

/// A `core/v1` Volume with one source, kept as the JSON it is written as; written as
/// k8s-openapi's `Volume` serialises (keys in its order: the source, then `name`). Borrowed,
/// as the other values here, from what the plan was made of: a patch is written once.
#[derive(Debug, Clone, Copy)]
pub struct Volume<'a> {
    /// The volume's name.
    pub name: &'a str,
    /// The source's field: `emptyDir`, `csi` or `ephemeral`.
    pub kind: VolumeKind,
    /// The source object.
    pub source: &'a Json,
}

impl PatchValue for Volume<'_> {
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.extend_from_slice(b"{\"");
        out.extend_from_slice(self.kind.as_str().as_bytes());
        out.extend_from_slice(b"\":");
        out.extend_from_slice(self.source.get().as_bytes());
        out.extend_from_slice(b",\"name\":");
        write_str(out, self.name)?;
        out.push(b'}');
        Ok(())
    }
}

/// A `core/v1` VolumeMount with the fields the webhook sets; written as k8s-openapi's
/// `VolumeMount` serialises (same names, same order, absent fields omitted).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VolumeMount<'a> {
    /// Where it is mounted.
    pub mount_path: &'a str,
    /// The volume's name.
    pub name: &'a str,
    /// `readOnly`, when given.
    pub read_only: Option<bool>,
    /// `subPath`, when given.
    pub sub_path: Option<&'a str>,
}

impl PatchValue for VolumeMount<'_> {
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        let mut o = ObjectWriter::open(out);
        o.str("mountPath", Some(self.mount_path))?;
        o.str("name", Some(self.name))?;
        o.bool("readOnly", self.read_only);
        o.str("subPath", self.sub_path)?;
        o.close();
        Ok(())
    }
}

/// A `core/v1` EnvVar with a literal value; written as k8s-openapi's `EnvVar` serialises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EnvVar<'a> {
    /// The variable.
    pub name: &'a str,
    /// Its value (a mount path).
    pub value: &'a str,
}

impl PatchValue for EnvVar<'_> {
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        let mut o = ObjectWriter::open(out);
        o.str("name", Some(self.name))?;
        o.str("value", Some(self.value))?;
        o.close();
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON a value writes.
    fn json<T: PatchValue + ?Sized>(value: &T) -> String {
        let mut out = Vec::new();
        value.write_json(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        // Every ASCII byte (the control characters, quote and backslash escaped), and text
        // beyond ASCII (left as it is), alone and inside a longer string.
        let mut cases: Vec<String> = (0u8..=0x7f).map(|b| char::from(b).to_string()).collect();
        cases.extend(["", "é", "日本", "\u{2028}", "😀", "\u{7f}"].map(str::to_owned));
        for c in cases.clone() {
            cases.push(format!("/scratch/{c}/x-{c}{c}"));
        }
        // Each byte that needs an escape (and its neighbours) at every place of a string longer
        // than a vector of the check.
        for b in [0x00u8, 0x1f, 0x20, b'"', b'#', b'\\', b']', 0x7f] {
            for at in 0..27 {
                let mut s = "abcdefghijklmnopqrstuvwxyz".to_owned();
                s.insert(at, char::from(b));
                cases.push(s);
            }
        }
        for s in &cases {
            assert_eq!(json(s.as_str()), serde_json::to_string(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn values_are_written_as_kubernetes_types_serialise() {
        use k8s_openapi::api::core::v1 as k8s;
        for (read_only, sub_path) in [
            (None, None),
            (Some(true), Some("a/b")),
            (Some(false), None),
            (None, Some("quote\"and\\tab\t")),
        ] {
            let ours = VolumeMount {
                mount_path: "/scratch",
                name: "scratch",
                read_only,
                sub_path,
            };
            let theirs = k8s::VolumeMount {
                mount_path: "/scratch".into(),
                name: "scratch".into(),
                read_only,
                sub_path: sub_path.map(str::to_owned),
                ..Default::default()
            };
            assert_eq!(json(&ours), serde_json::to_string(&theirs).unwrap());
        }
        let env = EnvVar {
            name: "TMPDIR",
            value: "/scratch",
        };
        let theirs = k8s::EnvVar {
            name: "TMPDIR".into(),
            value: Some("/scratch".into()),
            value_from: None,
        };
        assert_eq!(json(&env), serde_json::to_string(&theirs).unwrap());
        assert_eq!(
            json(&[env, env][..]),
            serde_json::to_string(&[&theirs, &theirs]).unwrap()
        );
        let source = k8s::EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            ..Default::default()
        };
        let written = Json::written(serde_json::to_vec(&source).unwrap()).unwrap();
        let volume = Volume {
            name: "shm",
            kind: VolumeKind::EmptyDir,
            source: &written,
        };
        let theirs = k8s::Volume {
            name: "shm".into(),
            empty_dir: Some(source),
            ..Default::default()
        };
        assert_eq!(json(&volume), serde_json::to_string(&theirs).unwrap());
        let annotations = BTreeMap::from([("b/x", "1"), ("a/y", "say \"hi\"")]);
        let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        };
        assert_eq!(
            json(&annotations),
            serde_json::to_string(&annotations).unwrap()
        );
        assert_eq!(
            json(&MetadataWith {
                annotations: &annotations
            }),
            serde_json::to_string(&meta).unwrap()
        );
        assert_eq!(json(&BTreeMap::<&str, &str>::new()), "{}");
        assert_eq!(json(&[] as &[EnvVar]), "[]");
    }

    #[test]
    fn shared_json_is_one_text_for_every_clone() {
        let own = Json::written(b"{\"medium\":\"Memory\"}".to_vec()).unwrap();
        assert_ne!(own.clone().get().as_ptr(), own.get().as_ptr());
        let shared = own.clone().shared();
        assert_eq!(shared, own);
        assert_eq!(shared.get(), r#"{"medium":"Memory"}"#);
        assert_eq!(shared.clone().get().as_ptr(), shared.get().as_ptr());
        assert_eq!(
            shared.clone().shared().get().as_ptr(),
            shared.get().as_ptr()
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
                    name: "TMPDIR",
                    value: "/scratch",
                }][..],
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
        impl PatchValue for Fails {
            fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
                out.extend_from_slice(b"{\"half");
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
