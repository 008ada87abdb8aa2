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

/// The part of a pod the engine reads, borrowed from the request body. Decoded in place: filled
/// where it lives, not built and moved up through serde's layers.
#[derive(Debug, Default)]
pub struct PodView<'a> {
    /// `metadata`.
    pub metadata: Option<MetaView<'a>>,
    /// `spec`.
    pub spec: Option<SpecView<'a>>,
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

/// A pod's `spec`, as far as the engine reads it. Decoded in place, as the pod view.
#[derive(Debug, Default)]
pub struct SpecView<'a> {
    /// `containers`.
    pub containers: Option<Vec<ContainerView<'a>>>,
    /// `initContainers` (native sidecars included).
    pub init_containers: Option<Vec<ContainerView<'a>>>,
    /// `volumes`, kept raw: only their names are read, and a same-named one compared.
    pub volumes: Option<Vec<&'a RawValue>>,
    /// `os`.
    pub os: Option<OsView<'a>>,
}

/// `spec.os`: a Windows pod cannot have a RAM disk.
#[derive(Debug, Default, Deserialize)]
pub struct OsView<'a> {
    /// `name`.
    #[serde(borrow)]
    pub name: Option<Str<'a>>,
}

/// A container, as far as the engine reads it. Decoded in place, as the pod view.
#[derive(Debug, Default)]
pub struct ContainerView<'a> {
    /// `name`.
    pub name: Str<'a>,
    /// `volumeMounts`.
    pub volume_mounts: Option<Vec<MountView<'a>>>,
    /// `env`.
    pub env: Option<Vec<EnvView<'a>>>,
    /// `resources`, boxed: a container without them (the most a pod of many containers can
    /// have per byte of its review) costs a pointer, not the view's 96 bytes.
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

// === decoding in place ===
//
// serde's derived code builds a struct in locals, moves it into the struct, and returns it
// through a `Result` at every layer, so the pod view (272 bytes), its spec and each container
// (344 bytes) are copied again at each level they are decoded through: copies of 256–512 bytes
// were ~8 % of a Pod-mode review's time on an AMD EPYC. These three are filled where they
// live instead, with the derived code's behaviour: unknown keys skipped, `null` for an absent
// optional field, a repeated field or a missing `name` refused with serde's own errors. (One
// difference: derived structs also read a JSON array as their fields in order; these refuse it.)

/// A view decoded into the place it lives in.
trait FillIn<'de>: Default {
    /// The struct's name, for serde's error messages.
    const NAME: &'static str;
    /// Its fields.
    const FIELDS: &'static [&'static str];
    /// Reads the value of `FIELDS[field]` into its place.
    fn field<A: de::MapAccess<'de>>(&mut self, field: usize, map: &mut A) -> Result<(), A::Error>;
    /// The required field that was not given, if any (`seen`: a bit per field of `FIELDS`).
    fn missing(_seen: u32) -> Option<&'static str> {
        None
    }
}

/// Fills a [`FillIn`] view from a JSON object.
struct Fill<'p, T>(&'p mut T);

impl<'de, T: FillIn<'de>> de::Visitor<'de> for Fill<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "struct {}", T::NAME)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = 0u32;
        while let Some(key) = map.next_key::<Str<'de>>()? {
            let Some(field) = T::FIELDS.iter().position(|f| *f == &*key) else {
                map.next_value::<de::IgnoredAny>()?;
                continue;
            };
            if seen & (1 << field) != 0 {
                return Err(de::Error::duplicate_field(T::FIELDS[field]));
            }
            seen |= 1 << field;
            self.0.field(field, &mut map)?;
        }
        match T::missing(seen) {
            Some(field) => Err(de::Error::missing_field(field)),
            None => Ok(()),
        }
    }
}

impl<'de, T: FillIn<'de>> de::DeserializeSeed<'de> for Fill<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct(T::NAME, T::FIELDS, self)
    }
}

/// Fills an optional view: `null` leaves it `None`.
struct FillOption<'p, T>(&'p mut Option<T>);

impl<'de, T: FillIn<'de>> de::Visitor<'de> for FillOption<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("option")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        *self.0 = None;
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        de::DeserializeSeed::deserialize(Fill(self.0.insert(T::default())), d)
    }
}

impl<'de, T: FillIn<'de>> de::DeserializeSeed<'de> for FillOption<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

/// Fills an optional list of views, each element in its slot: `null` leaves it `None`.
struct FillList<'p, T>(&'p mut Option<Vec<T>>);

impl<'de, T: FillIn<'de>> de::Visitor<'de> for FillList<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        *self.0 = None;
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let list = self.0.insert(Vec::new());
        while seq.next_element_seed(Push(list))?.is_some() {}
        Ok(())
    }
}

/// Fills the next element of a list in a slot added for it (only once the list has one).
struct Push<'p, T>(&'p mut Vec<T>);

impl<'de, T: FillIn<'de>> de::DeserializeSeed<'de> for Push<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // Added in place (a pushed default is built, then copied in: 344 bytes a container).
        let len = self.0.len();
        self.0.resize_with(len + 1, T::default);
        match self.0.last_mut() {
            Some(slot) => de::DeserializeSeed::deserialize(Fill(slot), d),
            None => Ok(()),
        }
    }
}

impl<'de, T: FillIn<'de>> de::DeserializeSeed<'de> for FillList<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for PodView<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut pod = PodView::default();
        pod.fill(d)?;
        Ok(pod)
    }
}

impl<'a> PodView<'a> {
    /// Decodes a pod into this (empty) view where it is, e.g. in its box.
    pub(crate) fn fill<'de: 'a, D: Deserializer<'de>>(&mut self, d: D) -> Result<(), D::Error> {
        de::DeserializeSeed::deserialize(Fill(self), d)
    }
}

impl<'de: 'a, 'a> FillIn<'de> for PodView<'a> {
    const NAME: &'static str = "PodView";
    const FIELDS: &'static [&'static str] = &["metadata", "spec"];

    fn field<A: de::MapAccess<'de>>(&mut self, field: usize, map: &mut A) -> Result<(), A::Error> {
        match field {
            0 => self.metadata = map.next_value()?,
            _ => map.next_value_seed(FillOption(&mut self.spec))?,
        }
        Ok(())
    }
}

impl<'de: 'a, 'a> FillIn<'de> for SpecView<'a> {
    const NAME: &'static str = "SpecView";
    const FIELDS: &'static [&'static str] = &["containers", "initContainers", "volumes", "os"];

    fn field<A: de::MapAccess<'de>>(&mut self, field: usize, map: &mut A) -> Result<(), A::Error> {
        match field {
            0 => map.next_value_seed(FillList(&mut self.containers))?,
            1 => map.next_value_seed(FillList(&mut self.init_containers))?,
            2 => self.volumes = map.next_value()?,
            _ => self.os = map.next_value()?,
        }
        Ok(())
    }
}

impl<'de: 'a, 'a> FillIn<'de> for ContainerView<'a> {
    const NAME: &'static str = "ContainerView";
    const FIELDS: &'static [&'static str] = &["name", "volumeMounts", "env", "resources"];

    fn field<A: de::MapAccess<'de>>(&mut self, field: usize, map: &mut A) -> Result<(), A::Error> {
        match field {
            0 => self.name = map.next_value()?,
            1 => self.volume_mounts = map.next_value()?,
            2 => self.env = map.next_value()?,
            _ => self.resources = map.next_value()?,
        }
        Ok(())
    }

    fn missing(seen: u32) -> Option<&'static str> {
        (seen & 1 == 0).then_some("name")
    }
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
    // A byte loop: names are a few bytes, where `str::find`'s searcher costs more to set up
    // than to run (it was 1.2 % of a Pod-mode decision's time).
    match rest.bytes().position(|b| b == b'"' || b == b'\\') {
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

    /// The views filled in place decode as serde's derived code did: the same values, and the
    /// same errors (repeated fields, a missing `name`, wrong types) at the same place.
    #[test]
    fn filled_in_place_as_derived() {
        #[derive(Debug, Deserialize)]
        struct RefPod<'a> {
            #[serde(borrow)]
            metadata: Option<MetaView<'a>>,
            #[serde(borrow)]
            spec: Option<RefSpec<'a>>,
        }
        #[derive(Debug, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct RefSpec<'a> {
            #[serde(borrow)]
            containers: Option<Vec<RefContainer<'a>>>,
            #[serde(borrow)]
            init_containers: Option<Vec<RefContainer<'a>>>,
            #[serde(borrow)]
            volumes: Option<Vec<&'a RawValue>>,
            #[serde(borrow)]
            os: Option<OsView<'a>>,
        }
        #[derive(Debug, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct RefContainer<'a> {
            #[serde(borrow)]
            name: Str<'a>,
            #[serde(borrow)]
            volume_mounts: Option<Vec<MountView<'a>>>,
            #[serde(borrow)]
            env: Option<Vec<EnvView<'a>>>,
            #[serde(borrow)]
            resources: Option<ResourcesView<'a>>,
        }
        /// The view as text, whichever code decoded it.
        fn shown(pod: &PodView<'_>) -> String {
            let spec = pod.spec.as_ref().map(|s| {
                let list = |l: &Option<Vec<ContainerView<'_>>>| {
                    l.as_ref().map(|l| {
                        l.iter()
                            .map(|c| {
                                format!("{:?}", (&c.name, &c.volume_mounts, &c.env, &c.resources))
                            })
                            .collect::<Vec<_>>()
                    })
                };
                let (containers, init) = (list(&s.containers), list(&s.init_containers));
                format!("{:?}", (containers, init, &s.volumes, &s.os))
            });
            format!("{:?} {spec:?}", pod.metadata)
        }
        fn filled(json: &str) -> Result<String, String> {
            let pod: PodView<'_> = serde_json::from_str(json).map_err(|e| e.to_string())?;
            Ok(shown(&pod))
        }
        fn derived(json: &str) -> Result<String, String> {
            // The reference structs' names, as the views' in serde's messages.
            let named = |e: serde_json::Error| {
                e.to_string()
                    .replace("RefPod", "PodView")
                    .replace("RefSpec", "SpecView")
                    .replace("RefContainer", "ContainerView")
            };
            let pod: RefPod<'_> = serde_json::from_str(json).map_err(named)?;
            fn list<'a>(l: Option<Vec<RefContainer<'a>>>) -> Option<Vec<ContainerView<'a>>> {
                l.map(|l| {
                    l.into_iter()
                        .map(|c| ContainerView {
                            name: c.name,
                            volume_mounts: c.volume_mounts,
                            env: c.env,
                            resources: c.resources.map(Box::new),
                        })
                        .collect()
                })
            }
            Ok(shown(&PodView {
                metadata: pod.metadata,
                spec: pod.spec.map(|s| SpecView {
                    containers: list(s.containers),
                    init_containers: list(s.init_containers),
                    volumes: s.volumes,
                    os: s.os,
                }),
            }))
        }
        let cases = [
            r#"{"metadata":{"name":"p","annotations":{"a":"1"}},"spec":{"restartPolicy":"Never","containers":[{"name":"c","image":"i","args":["a",{"x":[1]}],"volumeMounts":[{"name":"v","mountPath":"/v","readOnly":true}],"env":[{"name":"E","value":"1"},{"name":"F","valueFrom":{}}],"resources":{"requests":{"memory":"1Gi","cpu":"1"},"limits":{"ephemeral-storage":2}}},{"name":"d"}],"initContainers":[{"name":"i"}],"volumes":[{"name":"v","emptyDir":{}}],"os":{"name":"linux"}},"status":{}}"#,
            r#"{}"#,
            r#"{"metadata":null,"spec":null}"#,
            r#"{"spec":{}}"#,
            r#"{"spec":{"containers":null,"initContainers":[]}}"#,
            r#"{"sp\u0065c":{"containers":[{"n\u0061me":"a\u0062"}]}}"#,
            r#"{"spec":{},"spec":{}}"#,
            r#"{"spec":null,"spec":null}"#,
            r#"{"spec":{"containers":[],"containers":[]}}"#,
            r#"{"spec":{"containers":[{"name":"a","name":"b"}]}}"#,
            r#"{"spec":{"containers":[{"name":"a","env":null,"env":[]}]}}"#,
            r#"{"spec":{"containers":[{"env":[]}]}}"#,
            r#"{"spec":{"initContainers":[{"name":"a"},{}]}}"#,
            r#"{"spec":"x"}"#,
            r#"{"spec":1}"#,
            r#"{"spec":{"containers":"x"}}"#,
            r#"{"spec":{"containers":{}}}"#,
            r#"{"spec":{"containers":[1]}}"#,
            r#"{"spec":{"containers":[null]}}"#,
            r#"{"spec":{"containers":[{"name":null}]}}"#,
            r#"{"spec":{"containers":[{"name":"a","volumeMounts":[{"name":"v"}]}]}}"#,
            r#"{"spec":{"containers":[{"name":"a"}],}}"#,
            r#"{"spec":{"containers":[{"name":"a"},]}}"#,
            r#"{"spec":{"containers":[{"name":"a"}]"#,
            r#"{"spec":{"os":{"name":"windows"},"volumes":[1,"x"]}}"#,
            r#"null"#,
        ];
        for json in cases {
            assert_eq!(filled(json), derived(json), "{json}");
        }
        // Derived structs also read a JSON array as their fields in order; no API server
        // writes one, and these views refuse it.
        assert!(filled(r#"{"spec":[null,null,null,null]}"#).is_err());
        assert!(derived(r#"{"spec":[null,null,null,null]}"#).is_ok());
        assert!(filled("[]").is_err() && derived("[]").is_err());
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
