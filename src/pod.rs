//! A narrow view of a pod (or pod template): only what the engine decides on.
//!
//! Everything else in the object is skipped by serde without being built; strings borrow from
//! the request body unless they contain escapes; existing volumes are kept as raw JSON and
//! parsed only when one of them has the name of a volume being injected.

use std::{borrow::Borrow, borrow::Cow, collections::BTreeMap, fmt, ops::Deref};

use serde::{Deserialize, Deserializer, de};
use serde_json::value::RawValue;

/// A string borrowed from the input when it has no escapes, owned otherwise.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Str<'a>(pub Cow<'a, str>);

impl Deref for Str<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Str<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Str<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Str<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// A resource quantity as written: a string, or a plain number as YAML and kubectl allow
/// (`memory: 1073741824`; the API server's Quantity reads both).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantityText<'a>(pub Str<'a>);

impl Deref for QuantityText<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for QuantityText<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = QuantityText<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity (a string such as \"1Gi\", or a number)")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(QuantityText(Str(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(QuantityText(Str(Cow::Owned(v.to_owned()))))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(QuantityText(Str(Cow::Owned(v.to_string()))))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(QuantityText(Str(Cow::Owned(v.to_string()))))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(QuantityText(Str(Cow::Owned(v.to_string()))))
            }
        }
        d.deserialize_any(V)
    }
}

/// An object's name as the decision log writes it: its `name`, or, for an object the API
/// server has yet to name (a Job's pods), its `generateName` followed by `*`. The `*` is added
/// when it is displayed: no string is built for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectName<'a> {
    /// `name`, or `generateName` when `generated`.
    pub name: Cow<'a, str>,
    /// Only a `generateName` is known.
    pub generated: bool,
}

impl<'a> ObjectName<'a> {
    /// From an object's `name` and `generateName` (a `name` that is empty counts as none).
    pub fn of(name: Option<&Str<'a>>, generate_name: Option<&Str<'a>>) -> ObjectName<'a> {
        match (name, generate_name) {
            (Some(n), _) if !n.is_empty() => ObjectName {
                name: n.0.clone(),
                generated: false,
            },
            (_, Some(g)) => ObjectName {
                name: g.0.clone(),
                generated: true,
            },
            _ => ObjectName::default(),
        }
    }
}

impl fmt::Display for ObjectName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if self.generated {
            f.write_str("*")?;
        }
        Ok(())
    }
}

/// Labels or annotations.
pub type StrMap<'a> = BTreeMap<Str<'a>, Str<'a>>;

/// The part of a pod the engine reads, borrowed from the request body.
#[derive(Debug, Default, Deserialize)]
pub struct PodView<'a> {
    /// `metadata`.
    #[serde(borrow)]
    pub metadata: Option<MetaView<'a>>,
    /// `spec`.
    #[serde(borrow)]
    pub spec: Option<SpecView<'a>>,
    /// The containers' and the init containers' positions sorted by name (then position),
    /// each made once per review, the first time a request names containers of that list:
    /// every name of every annotation is then a binary search, not a pass over the pod.
    #[serde(skip)]
    by_name: [std::sync::OnceLock<Vec<usize>>; 2],
}

/// A pod's `metadata`, as far as the engine reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaView<'a> {
    /// `name`.
    #[serde(borrow)]
    pub name: Option<Str<'a>>,
    /// `generateName` (Job pods have no name yet).
    #[serde(borrow)]
    pub generate_name: Option<Str<'a>>,
    /// Kept raw: labels matter only when a rule's namespaces match (see [`PodView::labels`]).
    #[serde(borrow)]
    pub labels: Option<&'a RawValue>,
    /// `annotations`.
    #[serde(borrow)]
    pub annotations: Option<StrMap<'a>>,
    /// `ownerReferences`: read only to name a pod's controller in the decision log.
    #[serde(borrow)]
    pub owner_references: Option<Vec<OwnerView<'a>>>,
}

/// An owner reference, as far as the decision log names it.
#[derive(Debug, Default, Deserialize)]
pub struct OwnerView<'a> {
    /// `kind`.
    #[serde(borrow)]
    pub kind: Str<'a>,
    /// `name`.
    #[serde(borrow)]
    pub name: Str<'a>,
    /// `controller`: the one owner that manages the pod (a Job, a ReplicaSet, …).
    pub controller: Option<bool>,
}

/// A pod's `spec`, as far as the engine reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecView<'a> {
    /// `containers`.
    #[serde(borrow)]
    pub containers: Option<Vec<ContainerView<'a>>>,
    /// `initContainers` (native sidecars included).
    #[serde(borrow)]
    pub init_containers: Option<Vec<ContainerView<'a>>>,
    /// `volumes`, kept raw: only their names are read, and a same-named one compared.
    #[serde(borrow)]
    pub volumes: Option<Vec<&'a RawValue>>,
    /// `os`.
    #[serde(borrow)]
    pub os: Option<OsView<'a>>,
}

/// `spec.os`: a Windows pod cannot have a RAM disk.
#[derive(Debug, Default, Deserialize)]
pub struct OsView<'a> {
    /// `name`.
    #[serde(borrow)]
    pub name: Option<Str<'a>>,
}

/// A container, as far as the engine reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView<'a> {
    /// `name`.
    #[serde(borrow)]
    pub name: Str<'a>,
    /// `volumeMounts`.
    #[serde(borrow)]
    pub volume_mounts: Option<Vec<MountView<'a>>>,
    /// `env`.
    #[serde(borrow)]
    pub env: Option<Vec<EnvView<'a>>>,
    /// `resources`, boxed: a container without them (the most a pod of many containers can
    /// have per byte of its review) costs a pointer, not the view's 96 bytes.
    #[serde(borrow)]
    pub resources: Option<Box<ResourcesView<'a>>>,
}

/// A volume mount: its volume and path.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountView<'a> {
    /// `name`.
    #[serde(borrow)]
    pub name: Str<'a>,
    /// `mountPath`.
    #[serde(borrow)]
    pub mount_path: Str<'a>,
}

/// An environment variable.
#[derive(Debug, Default, Deserialize)]
pub struct EnvView<'a> {
    /// `name`.
    #[serde(borrow)]
    pub name: Str<'a>,
    /// `value` (absent for `valueFrom`).
    #[serde(borrow)]
    pub value: Option<Str<'a>>,
}

/// A container's resources.
#[derive(Debug, Default, Deserialize)]
pub struct ResourcesView<'a> {
    /// `limits`.
    #[serde(borrow)]
    pub limits: Option<ResourceList<'a>>,
    /// `requests`.
    #[serde(borrow)]
    pub requests: Option<ResourceList<'a>>,
}

/// The two resources the engine compares sizes with; the others are skipped.
#[derive(Debug, Default, Deserialize)]
pub struct ResourceList<'a> {
    /// `memory`.
    #[serde(borrow)]
    pub memory: Option<QuantityText<'a>>,
    /// `ephemeral-storage`.
    #[serde(borrow, rename = "ephemeral-storage")]
    pub ephemeral_storage: Option<QuantityText<'a>>,
}

#[derive(Deserialize)]
struct VolumeName<'a> {
    #[serde(borrow)]
    name: Str<'a>,
}

impl<'a> PodView<'a> {
    /// Whether the pod's labels, as written, contain what `search` looks for anywhere (a scan
    /// before decoding).
    pub fn labels_mention(&self, search: &crate::config::Substring) -> bool {
        self.metadata
            .as_ref()
            .and_then(|m| m.labels)
            .is_some_and(|raw| search.is_in(raw.get()))
    }

    /// The pod's labels, decoded on demand (an absent map is empty).
    pub fn labels(&self) -> Result<StrMap<'a>, serde_json::Error> {
        match self.metadata.as_ref().and_then(|m| m.labels) {
            Some(raw) => serde_json::from_str(raw.get()),
            None => Ok(StrMap::new()),
        }
    }

    /// The pod's annotations, if it has any.
    pub fn annotations(&self) -> Option<&StrMap<'a>> {
        self.metadata.as_ref()?.annotations.as_ref()
    }

    /// `name`, or `generateName` followed by `*` for pods the API server has yet to name.
    pub fn display_name(&self) -> ObjectName<'a> {
        match &self.metadata {
            Some(m) => ObjectName::of(m.name.as_ref(), m.generate_name.as_ref()),
            None => ObjectName::default(),
        }
    }

    /// The controlling owner (`ownerReferences` entry with `controller: true`), if any.
    pub fn controller(&self) -> Option<&OwnerView<'a>> {
        self.metadata
            .as_ref()?
            .owner_references
            .as_deref()?
            .iter()
            .find(|o| o.controller == Some(true))
    }

    /// `spec.os.name: windows`.
    pub fn is_windows(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(|s| s.os.as_ref())
            .and_then(|o| o.name.as_deref())
            == Some("windows")
    }

    /// `spec.containers` (empty when missing).
    pub fn containers(&self) -> &[ContainerView<'a>] {
        self.spec
            .as_ref()
            .and_then(|s| s.containers.as_deref())
            .unwrap_or_default()
    }

    /// `spec.initContainers` (empty when missing).
    pub fn init_containers(&self) -> &[ContainerView<'a>] {
        self.spec
            .as_ref()
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default()
    }

    /// The position of the first container named `name` in the containers (`init`: the init
    /// containers), if there is one.
    pub fn position(&self, init: bool, name: &str) -> Option<usize> {
        let list = if init {
            self.init_containers()
        } else {
            self.containers()
        };
        let sorted = self.by_name[usize::from(init)].get_or_init(|| {
            let mut sorted: Vec<usize> = (0..list.len()).collect();
            // Stable: of equal names, the first position first.
            sorted.sort_by(|&a, &b| list[a].name.cmp(&list[b].name));
            sorted
        });
        let first = sorted.partition_point(|&i| *list[i].name < *name);
        sorted
            .get(first)
            .copied()
            .filter(|&i| *list[i].name == *name)
    }

    /// The pod's volumes by name (the first of a name), read once for a decision.
    pub fn volumes_by_name(&self) -> std::collections::HashMap<Cow<'a, str>, &'a RawValue> {
        let mut by_name = std::collections::HashMap::new();
        for raw in self.raw_volumes() {
            if let Some(name) = volume_name(raw) {
                by_name.entry(name.0).or_insert(raw);
            }
        }
        by_name
    }

    fn raw_volumes(&self) -> impl Iterator<Item = &'a RawValue> + '_ {
        self.spec
            .as_ref()
            .and_then(|s| s.volumes.as_deref())
            .unwrap_or_default()
            .iter()
            .copied()
    }
}

fn volume_name<'a>(raw: &'a RawValue) -> Option<Str<'a>> {
    name_first(raw.get())
        .map(|n| Str(Cow::Borrowed(n)))
        .or_else(|| {
            serde_json::from_str::<VolumeName<'a>>(raw.get())
                .ok()
                .map(|v| v.name)
        })
}

/// The API server writes `name` first in every volume (Go's field order); read it without
/// parsing the rest, which for the service-account volume is most of the bytes. Anything
/// else (escapes, other orders, whitespace) falls back to a real parse.
fn name_first(raw: &str) -> Option<&str> {
    let rest = raw.strip_prefix("{\"name\":\"")?;
    // The name ends at its closing quote; an escape means a real parse.
    match rest.find(['"', '\\']) {
        Some(end) if rest.as_bytes().get(end) == Some(&b'"') => rest.get(..end),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_named_by_its_name_else_its_generate_name_and_a_star() {
        let named = |metadata: &str| {
            let pod: PodView<'_> = serde_json::from_str(metadata).unwrap();
            pod.display_name().to_string()
        };
        assert_eq!(
            named(r#"{"metadata":{"name":"a","generateName":"a-"}}"#),
            "a"
        );
        assert_eq!(
            named(r#"{"metadata":{"name":"","generateName":"nf-1-"}}"#),
            "nf-1-*"
        );
        assert_eq!(named(r#"{"metadata":{"generateName":"nf-1-"}}"#), "nf-1-*");
        assert_eq!(named(r#"{"metadata":{}}"#), "");
        assert_eq!(named("{}"), "");
    }

    #[test]
    fn volume_names_are_read_fast_or_parsed() {
        let body = r#"{"spec":{"volumes":[
            {"name":"fast","emptyDir":{}},
            { "emptyDir": {}, "name": "slow" },
            {"name":"esc\u0061ped","emptyDir":{}},
            {"name":"then","csi":{"driver":"d","volumeAttributes":{"k":"a\"b\\c"}}},
            {"emptyDir":{}}
        ]}}"#;
        let pod: PodView<'_> = serde_json::from_str(body).unwrap();
        let volumes = pod.volumes_by_name();
        for name in ["fast", "slow", "escaped", "then"] {
            assert!(volumes.contains_key(name), "{name}");
        }
        assert_eq!(volumes.len(), 4, "{volumes:?}");
        assert!(volumes["slow"].get().contains("\"slow\""));
        assert!(!volumes.contains_key("missing"));
        assert!(PodView::default().volumes_by_name().is_empty());
        // The shortcut reads a plain name and leaves an escaped one to the parser.
        assert_eq!(name_first(r#"{"name":"ab","x":"\\"}"#), Some("ab"));
        assert_eq!(name_first(r#"{"name":"a\"b","x":1}"#), None);
        assert_eq!(name_first(r#"{"name":"","x":1}"#), Some(""));
        assert_eq!(name_first(r#"{"name":"unterminated"#), None);
        assert_eq!(name_first(r#"{"x":1,"name":"ab"}"#), None);
    }

    #[test]
    fn strings_borrow_unless_escaped() {
        let body = r#"{"metadata":{"name":"plain","annotations":{"k":"{\"a\":1}"}}}"#;
        let pod: PodView<'_> = serde_json::from_str(body).unwrap();
        let meta = pod.metadata.as_ref().unwrap();
        assert!(matches!(
            meta.name.as_ref().unwrap().0,
            Cow::Borrowed("plain")
        ));
        assert_eq!(&*pod.annotations().unwrap()["k"], r#"{"a":1}"#);
    }

    #[test]
    fn the_controller_is_the_owner_marked_controller() {
        let pod: PodView<'_> = serde_json::from_str(
            r#"{"metadata":{"ownerReferences":[
                {"apiVersion":"v1","kind":"ConfigMap","name":"other","uid":"1"},
                {"apiVersion":"batch/v1","kind":"Job","name":"nf-1","uid":"2","controller":true}]}}"#,
        )
        .unwrap();
        let owner = pod.controller().unwrap();
        assert_eq!((&*owner.kind, &*owner.name), ("Job", "nf-1"));
        let bare: PodView<'_> = serde_json::from_str(
            r#"{"metadata":{"ownerReferences":[{"kind":"ConfigMap","name":"other"}]}}"#,
        )
        .unwrap();
        assert!(bare.controller().is_none());
        assert!(PodView::default().controller().is_none());
    }

    #[test]
    fn labels_are_decoded_on_demand_and_errors_are_reported() {
        let pod: PodView<'_> =
            serde_json::from_str(r#"{"metadata":{"labels":{"a":"1","b\u0032":"2"}}}"#).unwrap();
        let labels = pod.labels().unwrap();
        assert_eq!(labels.len(), 2);
        assert_eq!(&*labels["b2"], "2");
        assert!(PodView::default().labels().unwrap().is_empty());
        // A bad labels map does not fail the decode of a pod no rule looks at, only its use.
        let odd: PodView<'_> = serde_json::from_str(r#"{"metadata":{"labels":{"a":1}}}"#).unwrap();
        assert!(odd.labels().is_err());
    }
}
