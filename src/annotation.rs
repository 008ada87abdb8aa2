//! The annotation grammar: one annotation value → one [`VolumeRequest`].
//!
//! Three forms share one set of field names (the README's "Asking for a volume"):
//! a bare profile name, comma-separated `key=value` pairs, or a JSON object. Both structured
//! forms go through the same field dispatcher, so a field means the same thing in either.

use std::{collections::BTreeMap, fmt, str::FromStr};

use k8s_openapi::{
    api::core::v1::{
        CSIVolumeSource, EmptyDirVolumeSource, EphemeralVolumeSource, PersistentVolumeClaimSpec,
        PersistentVolumeClaimTemplate, VolumeResourceRequirements,
    },
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::quantity::Quantity;

/// Why an annotation value (or a profile, or a rule entry) was refused. The message names the
/// field; the caller adds where the value came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

fn bad<T>(msg: impl Into<String>) -> Result<T, GrammarError> {
    Err(GrammarError(msg.into()))
}

/// The three volume kinds, spelled as the Pod API spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
pub enum VolumeKind {
    #[serde(rename = "emptyDir")]
    EmptyDir,
    #[serde(rename = "csi")]
    Csi,
    #[serde(rename = "ephemeral")]
    Ephemeral,
}

impl VolumeKind {
    pub const ALL: [VolumeKind; 3] = [VolumeKind::EmptyDir, VolumeKind::Csi, VolumeKind::Ephemeral];

    pub fn as_str(self) -> &'static str {
        match self {
            VolumeKind::EmptyDir => "emptyDir",
            VolumeKind::Csi => "csi",
            VolumeKind::Ephemeral => "ephemeral",
        }
    }
}

impl fmt::Display for VolumeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for VolumeKind {
    type Err = GrammarError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        VolumeKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                GrammarError(format!(
                    "type {s:?} is not one of emptyDir, csi, ephemeral (spelled as in the Pod API)"
                ))
            })
    }
}

/// Where a volume comes from: a named profile or an inline Kubernetes volume source.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Profile(String),
    EmptyDir(EmptyDirVolumeSource),
    Csi(CSIVolumeSource),
    Ephemeral(Box<EphemeralVolumeSource>),
}

impl Source {
    pub fn kind(&self) -> Option<VolumeKind> {
        match self {
            Source::Profile(_) => None,
            Source::EmptyDir(_) => Some(VolumeKind::EmptyDir),
            Source::Csi(_) => Some(VolumeKind::Csi),
            Source::Ephemeral(_) => Some(VolumeKind::Ephemeral),
        }
    }
}

/// Where an emptyDir lives: what its size is checked against, and which warnings apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// The node's disk (no medium): capped by `maxSize.emptyDir`, defaulted by `defaultSizeLimit`.
    Disk,
    /// RAM (`Memory`): capped by `maxSize.memory`, counted against the memory limit.
    Memory,
    /// Pre-allocated huge pages (`HugePages`, `HugePages-<size>`): not disk, not ordinary memory;
    /// sized by the pod's hugepages resources, so no disk cap, default or warning applies.
    HugePages,
    /// Not an emptyDir.
    None,
}

impl Medium {
    pub fn of(source: &Source) -> Medium {
        match source {
            Source::EmptyDir(e) => match e.medium.as_deref() {
                Some("Memory") => Medium::Memory,
                Some(m) if m.starts_with("HugePages") => Medium::HugePages,
                _ => Medium::Disk,
            },
            _ => Medium::None,
        }
    }
}

/// Which init containers get the mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitTargets {
    None,
    All,
    Named(Vec<String>),
}

/// One requested volume, as written; profiles are resolved later against the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeRequest {
    pub source: Source,
    /// Only set for profile requests: inline sizes are folded into the source.
    pub size: Option<String>,
    /// `size=request`: the size is the targeted containers' `ephemeral-storage` request (the
    /// largest), decided per pod; the source carries none.
    pub size_from_request: bool,
    pub mount_path: Option<String>,
    pub read_only: Option<bool>,
    pub sub_path: Option<String>,
    pub containers: Option<Vec<String>>,
    pub init_containers: Option<InitTargets>,
    pub env: Option<Vec<String>>,
}

impl FromStr for VolumeRequest {
    type Err = GrammarError;

    /// Parses an annotation value in any of the three forms.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let trimmed = trim(value);
        if trimmed.is_empty() {
            return bad(
                "the value is empty; give a profile name, key=value pairs or a JSON object",
            );
        }
        if trimmed.starts_with('{') {
            return VolumeRequest::from_json(&parse_json_strict(trimmed)?);
        }
        if !trimmed.bytes().any(|b| b == b'=') {
            validate_profile_name(trimmed)?;
            return Ok(VolumeRequest::profile(trimmed));
        }
        let mut raw = Raw::default();
        for pair in split_ascii(trimmed, b',') {
            let pair = trim(pair);
            if pair.is_empty() {
                continue;
            }
            let Some((key, val)) = pair
                .bytes()
                .position(|b| b == b'=')
                .map(|i| (&pair[..i], &pair[i + 1..]))
            else {
                return bad(format!(
                    "{pair:?} is not a key=value pair (values cannot contain commas; use the JSON form)"
                ));
            };
            raw.set(trim(key), Val::Text(trim(val)))?;
        }
        raw.build()
    }
}

impl VolumeRequest {
    pub fn profile(name: &str) -> Self {
        VolumeRequest {
            source: Source::Profile(name.to_owned()),
            size: None,
            size_from_request: false,
            mount_path: None,
            read_only: None,
            sub_path: None,
            containers: None,
            init_containers: None,
            env: None,
        }
    }

    /// The JSON form (also used for profiles and rule entries in the configuration file).
    pub fn from_json(json: &Value) -> Result<Self, GrammarError> {
        let Value::Object(map) = json else {
            return bad("expected a JSON object");
        };
        let mut raw = Raw::default();
        for (key, val) in map {
            raw.set(key, Val::Json(val))?;
        }
        raw.build()
    }
}

/// Parses JSON refusing a repeated key anywhere (serde_json keeps the last one silently, which
/// would make the JSON form laxer than key=value, where a repeated field is an error).
pub fn parse_json_strict(text: &str) -> Result<Value, GrammarError> {
    let checked: Result<NoDuplicates, _> = serde_json::from_str(text);
    if let Err(e) = checked {
        if e.is_data() {
            // Our own error: a repeated key, whose message names the field.
            let message = e.to_string();
            let message = message.split(" at line ").next().unwrap_or(&message);
            return bad(message.to_owned());
        }
        return bad(format!("invalid JSON: {e}"));
    }
    serde_json::from_str(text).map_err(|e| GrammarError(format!("invalid JSON: {e}")))
}

/// Walks a JSON document and fails on the first object with a repeated key, naming its path.
pub struct NoDuplicates;

impl<'de> serde::Deserialize<'de> for NoDuplicates {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DupVisitor {
            path: String::new(),
        })
    }
}

struct DupVisitor {
    path: String,
}

impl<'de> serde::de::DeserializeSeed<'de> for DupVisitor {
    type Value = NoDuplicates;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for DupVisitor {
    type Value = NoDuplicates;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = std::collections::BTreeSet::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let path = if self.path.is_empty() {
                key.to_string()
            } else {
                format!("{}.{key}", self.path)
            };
            if !seen.insert(key.into_owned()) {
                return Err(serde::de::Error::custom(format!(
                    "field {path} is given twice"
                )));
            }
            map.next_value_seed(DupVisitor { path })?;
        }
        Ok(NoDuplicates)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(DupVisitor {
                path: format!("{}[{i}]", self.path),
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(NoDuplicates)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
}

// === field dispatch ===

enum Val<'a> {
    Text(&'a str),
    Json(&'a Value),
}

impl<'a> Val<'a> {
    /// The value, trimmed, borrowed from the annotation (or the JSON) it came from.
    fn string(&self, field: &str) -> Result<&'a str, GrammarError> {
        match *self {
            Val::Text(s) => non_empty(field, s),
            Val::Json(Value::String(s)) => non_empty(field, s),
            Val::Json(other) => bad(format!("{field} must be a string, not {other}")),
        }
    }

    fn boolean(&self, field: &str) -> Result<bool, GrammarError> {
        match self {
            Val::Text("true") | Val::Json(Value::Bool(true)) => Ok(true),
            Val::Text("false") | Val::Json(Value::Bool(false)) => Ok(false),
            Val::Json(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
            Val::Text(s) => bad(format!("{field} must be true or false, not {s:?}")),
            Val::Json(v) => bad(format!("{field} must be true or false, not {v}")),
        }
    }

    /// `a;b;c` in key=value form, a list (or a `;`-separated string) in JSON.
    fn list(&self, field: &str) -> Result<Vec<String>, GrammarError> {
        let items: Vec<String> = match *self {
            Val::Text(s) => split_list(s),
            Val::Json(Value::String(s)) => split_list(s),
            Val::Json(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
                    other => bad(format!(
                        "{field} must list non-empty strings, found {other}"
                    )),
                })
                .collect::<Result<_, _>>()?,
            Val::Json(v) => return bad(format!("{field} must be a list of names, not {v}")),
        };
        if items.is_empty() {
            return bad(format!("{field} is empty"));
        }
        Ok(items)
    }

    fn object(&self, field: &str) -> Result<&'a Value, GrammarError> {
        match *self {
            Val::Json(v @ Value::Object(_)) => Ok(v),
            Val::Json(v) => bad(format!("{field} must be a JSON object, not {v}")),
            Val::Text(_) => bad(format!(
                "{field} needs the JSON form; in key=value form write type={field} with its shorthands"
            )),
        }
    }
}

fn split_list(s: &str) -> Vec<String> {
    split_ascii(s, b';')
        .map(trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `str::split` on an ASCII separator, without the char searcher's setup per piece (annotation
/// values are short). An ASCII byte never occurs inside a multi-byte character.
fn split_ascii(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let r = rest?;
        match r.bytes().position(|b| b == sep) {
            Some(i) => {
                rest = r.get(i + 1..);
                r.get(..i)
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

/// `str::trim`, with a byte-level fast path for the usual all-ASCII edges.
fn trim(s: &str) -> &str {
    let ws = |b: &u8| b.is_ascii() && char::from(*b).is_whitespace();
    let bytes = s.as_bytes();
    let start = bytes.iter().position(|b| !ws(b)).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !ws(b)).map_or(start, |i| i + 1);
    match s.get(start..end) {
        Some(t)
            if t.bytes().next().is_none_or(|b| b.is_ascii())
                && t.bytes().next_back().is_none_or(|b| b.is_ascii()) =>
        {
            t
        }
        _ => s.trim(),
    }
}

fn non_empty<'a>(field: &str, s: &'a str) -> Result<&'a str, GrammarError> {
    let s = trim(s);
    if s.is_empty() {
        bad(format!("{field} is empty"))
    } else {
        Ok(s)
    }
}

/// Every field as written (borrowed from the value), before the combination is checked.
#[derive(Default)]
struct Raw<'a> {
    profile: Option<&'a str>,
    kind: Option<VolumeKind>,
    empty_dir: Option<&'a Value>,
    csi: Option<&'a Value>,
    ephemeral: Option<&'a Value>,
    size: Option<&'a str>,
    /// `size=request`, which fits every source but CSI (kept apart from the quantity shorthand).
    size_request: bool,
    medium: Option<&'a str>,
    storage_class: Option<&'a str>,
    access_mode: Option<&'a str>,
    driver: Option<&'a str>,
    fs_type: Option<&'a str>,
    attrs: BTreeMap<&'a str, &'a str>,
    mount_path: Option<&'a str>,
    read_only: Option<bool>,
    sub_path: Option<&'a str>,
    containers: Option<Vec<String>>,
    init_containers: Option<InitTargets>,
    env: Option<Vec<String>>,
    /// Per source (see [`Fit`]), the first shorthand written that does not apply to it.
    misfits: [Option<&'a str>; 5],
}

/// The sources whose shorthands are checked, and the shorthands each accepts.
#[derive(Clone, Copy)]
enum Fit {
    Profile,
    EmptyDir,
    Csi,
    Ephemeral,
    Json,
}

impl Fit {
    const ALL: [Fit; 5] = [
        Fit::Profile,
        Fit::EmptyDir,
        Fit::Csi,
        Fit::Ephemeral,
        Fit::Json,
    ];

    fn accepts(self, shorthand: &str) -> bool {
        match self {
            Fit::Profile => shorthand == "size",
            Fit::EmptyDir => matches!(shorthand, "size" | "medium"),
            Fit::Csi => matches!(shorthand, "driver" | "fsType") || shorthand.starts_with("attr."),
            Fit::Ephemeral => matches!(shorthand, "size" | "storageClass" | "accessMode"),
            Fit::Json => false,
        }
    }
}

const FIELDS: &str = "profile, type, emptyDir, csi, ephemeral, size, medium, storageClass, \
                      accessMode, driver, fsType, attr.<key>, mountPath, readOnly, subPath, \
                      containers, initContainers, env";

fn put<T>(slot: &mut Option<T>, field: &str, value: T) -> Result<(), GrammarError> {
    if slot.is_some() {
        return bad(format!("{field} is given twice"));
    }
    *slot = Some(value);
    Ok(())
}

impl<'a> Raw<'a> {
    /// Remembers, in written order, the first shorthand each source would refuse.
    fn note_shorthand(&mut self, key: &'a str) {
        for fit in Fit::ALL {
            let slot = &mut self.misfits[fit as usize];
            if slot.is_none() && !fit.accepts(key) {
                *slot = Some(key);
            }
        }
    }

    fn set(&mut self, key: &'a str, val: Val<'a>) -> Result<(), GrammarError> {
        if let Some(attr) = key.strip_prefix("attr.") {
            if attr.is_empty() {
                return bad("attr. needs a key, e.g. attr.secretProviderClass=vault-db");
            }
            let v = val.string(key)?;
            if self.attrs.insert(attr, v).is_some() {
                return bad(format!("{key} is given twice"));
            }
            self.note_shorthand(key);
            return Ok(());
        }
        if key == "size" && val.string(key)? == "request" {
            if self.size_request || self.size.is_some() {
                return bad("size is given twice");
            }
            self.size_request = true;
            return Ok(());
        }
        let shorthand = matches!(
            key,
            "size" | "medium" | "storageClass" | "accessMode" | "driver" | "fsType"
        );
        match key {
            "profile" => {
                let p = val.string(key)?;
                validate_profile_name(p)?;
                put(&mut self.profile, key, p)
            }
            "type" => {
                let t = val.string(key)?.parse()?;
                put(&mut self.kind, key, t)
            }
            "emptyDir" => put(&mut self.empty_dir, key, val.object(key)?),
            "csi" => put(&mut self.csi, key, val.object(key)?),
            "ephemeral" => put(&mut self.ephemeral, key, val.object(key)?),
            "size" if self.size_request => bad("size is given twice"),
            "size" => put(&mut self.size, key, val.string(key)?),
            "medium" => put(&mut self.medium, key, val.string(key)?),
            "storageClass" => put(&mut self.storage_class, key, val.string(key)?),
            "accessMode" => put(&mut self.access_mode, key, val.string(key)?),
            "driver" => put(&mut self.driver, key, val.string(key)?),
            "fsType" => put(&mut self.fs_type, key, val.string(key)?),
            "mountPath" => put(&mut self.mount_path, key, val.string(key)?),
            "readOnly" => put(&mut self.read_only, key, val.boolean(key)?),
            "subPath" => put(&mut self.sub_path, key, val.string(key)?),
            "containers" => put(&mut self.containers, key, val.list(key)?),
            "initContainers" => {
                let t = match val.boolean(key) {
                    Ok(true) => InitTargets::All,
                    Ok(false) => InitTargets::None,
                    Err(_) => InitTargets::Named(val.list(key).map_err(|_| {
                        GrammarError(
                            "initContainers must be true, false or a list of init container names"
                                .into(),
                        )
                    })?),
                };
                put(&mut self.init_containers, key, t)
            }
            "env" => put(&mut self.env, key, val.list(key)?),
            _ => bad(format!("unknown field {key:?}; the fields are {FIELDS}")),
        }?;
        if shorthand {
            self.note_shorthand(key);
        }
        Ok(())
    }

    fn build(self) -> Result<VolumeRequest, GrammarError> {
        let given = [
            ("profile", self.profile.is_some()),
            ("type", self.kind.is_some()),
            ("emptyDir", self.empty_dir.is_some()),
            ("csi", self.csi.is_some()),
            ("ephemeral", self.ephemeral.is_some()),
        ];
        match given.iter().filter(|(_, g)| *g).count() {
            0 => {
                return bad(
                    "no volume source: give exactly one of profile, type, emptyDir, csi, ephemeral",
                );
            }
            1 => {}
            _ => {
                let many: Vec<&str> = given.iter().filter_map(|(n, g)| g.then_some(*n)).collect();
                return bad(format!(
                    "{} are given together; give exactly one volume source",
                    many.join(" and ")
                ));
            }
        }
        let only = |fit: Fit, context: &dyn Fn() -> String| -> Result<(), GrammarError> {
            match self.misfits[fit as usize] {
                Some(s) => bad(format!("{s} does not apply to {}", context())),
                None => Ok(()),
            }
        };

        let mut size_override = None;
        let source = if let Some(profile) = self.profile {
            only(Fit::Profile, &|| {
                format!("profile={profile}: a profile fixes the volume source")
            })?;
            if let Some(s) = self.size {
                parse_size("size", s)?;
                size_override = Some(s.to_owned());
            }
            Source::Profile(profile.to_owned())
        } else if let Some(kind) = self.kind {
            self.shorthand_source(kind, &only)?
        } else {
            only(Fit::Json, &|| {
                "a volume given as a JSON object; put it inside the object".to_owned()
            })?;
            if let Some(v) = self.empty_dir {
                Source::EmptyDir(from_json_strict("emptyDir", v)?)
            } else if let Some(v) = self.csi {
                Source::Csi(from_json_strict("csi", v)?)
            } else if let Some(v) = self.ephemeral {
                Source::Ephemeral(Box::new(from_json_strict("ephemeral", v)?))
            } else {
                return bad("no volume source");
            }
        };
        if self.size_request && matches!(source, Source::Csi(_)) {
            return bad("size=request does not apply to a CSI inline volume");
        }
        validate_source(&source, self.size_request)?;

        if let Some(p) = self.mount_path {
            validate_mount_path(p)?;
        }
        if let Some(p) = self.sub_path {
            validate_sub_path(p)?;
        }
        for c in self.containers.iter().flatten() {
            validate_dns_label("container name", c)?;
        }
        if let Some(InitTargets::Named(names)) = &self.init_containers {
            for c in names {
                validate_dns_label("init container name", c)?;
            }
        }
        for e in self.env.iter().flatten() {
            validate_env_name(e)?;
        }
        Ok(VolumeRequest {
            source,
            size: size_override,
            size_from_request: self.size_request,
            mount_path: self.mount_path.map(normalize_path),
            read_only: self.read_only,
            sub_path: self.sub_path.map(str::to_owned),
            containers: self.containers,
            init_containers: self.init_containers,
            env: self.env,
        })
    }

    fn shorthand_source(
        &self,
        kind: VolumeKind,
        only: &OnlyCheck<'_>,
    ) -> Result<Source, GrammarError> {
        Ok(match kind {
            VolumeKind::EmptyDir => {
                only(Fit::EmptyDir, &|| "type=emptyDir".to_owned())?;
                Source::EmptyDir(EmptyDirVolumeSource {
                    medium: self.medium.map(str::to_owned),
                    size_limit: self.size.map(|s| K8sQuantity(s.to_owned())),
                })
            }
            VolumeKind::Csi => {
                only(Fit::Csi, &|| "type=csi".to_owned())?;
                let Some(driver) = self.driver.map(str::to_owned) else {
                    return bad("type=csi needs driver=<CSI driver name>");
                };
                Source::Csi(CSIVolumeSource {
                    driver,
                    fs_type: self.fs_type.map(str::to_owned),
                    // The Secrets Store driver refuses a writable inline volume; readOnly on the
                    // annotation means both the mount and the volume.
                    read_only: self.read_only,
                    volume_attributes: (!self.attrs.is_empty()).then(|| {
                        self.attrs
                            .iter()
                            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                            .collect()
                    }),
                    node_publish_secret_ref: None,
                })
            }
            VolumeKind::Ephemeral => {
                only(Fit::Ephemeral, &|| "type=ephemeral".to_owned())?;
                let size = match (self.size, self.size_request) {
                    (Some(size), _) => Some(size.to_owned()),
                    (None, true) => None,
                    (None, false) => {
                        return bad(
                            "type=ephemeral needs size=<quantity> (e.g. size=100Gi) or size=request",
                        );
                    }
                };
                let access = self.access_mode.unwrap_or("ReadWriteOnce").to_owned();
                Source::Ephemeral(Box::new(EphemeralVolumeSource {
                    volume_claim_template: Some(PersistentVolumeClaimTemplate {
                        metadata: None,
                        spec: PersistentVolumeClaimSpec {
                            access_modes: Some(vec![access]),
                            storage_class_name: self.storage_class.map(str::to_owned),
                            resources: size.map(|size| VolumeResourceRequirements {
                                requests: Some(BTreeMap::from([(
                                    "storage".to_owned(),
                                    K8sQuantity(size),
                                )])),
                                limits: None,
                            }),
                            ..Default::default()
                        },
                    }),
                }))
            }
        })
    }
}

type OnlyCheck<'a> = dyn Fn(Fit, &dyn Fn() -> String) -> Result<(), GrammarError> + 'a;

// === validation shared by annotations, profiles and rules ===

/// Deserializes a Kubernetes type and refuses any field the type does not know: k8s-openapi
/// ignores unknown fields, which would turn `sizeLimt` into a silently unlimited volume.
pub fn from_json_strict<T>(field: &str, json: &Value) -> Result<T, GrammarError>
where
    T: DeserializeOwned + serde::Serialize,
{
    let typed: T =
        serde_json::from_value(json.clone()).map_err(|e| GrammarError(format!("{field}: {e}")))?;
    let back = serde_json::to_value(&typed).map_err(|e| GrammarError(format!("{field}: {e}")))?;
    let mut unknown = Vec::new();
    unknown_fields(json, &back, field, &mut unknown);
    match unknown.first() {
        Some(path) => bad(format!("unknown field {path}")),
        None => Ok(typed),
    }
}

fn unknown_fields(input: &Value, known: &Value, path: &str, out: &mut Vec<String>) {
    match (input, known) {
        (Value::Object(i), Value::Object(k)) => {
            for (key, v) in i {
                let here = format!("{path}.{key}");
                match k.get(key) {
                    Some(kv) => unknown_fields(v, kv, &here, out),
                    None if v.is_null() => {}
                    None => out.push(here),
                }
            }
        }
        (Value::Array(i), Value::Array(k)) => {
            for (n, (iv, kv)) in i.iter().zip(k).enumerate() {
                unknown_fields(iv, kv, &format!("{path}[{n}]"), out);
            }
        }
        _ => {}
    }
}

/// A size to give a volume: a valid quantity above zero (a zero `sizeLimit` is no limit at
/// all to the kubelet, and the API server refuses a zero PVC request).
pub fn parse_size(field: &str, s: &str) -> Result<Quantity, GrammarError> {
    let q = s
        .parse::<Quantity>()
        .map_err(|e| GrammarError(format!("{field}: {e}")))?;
    if q.is_zero() {
        return bad(format!(
            "{field} {s:?} is zero, which is no limit at all; give a size above zero"
        ));
    }
    Ok(q)
}

const ACCESS_MODES: [&str; 4] = [
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

/// Checks what Kubernetes itself would reject later, so the user hears it from us with the key.
/// `sized_later`: the size comes from the pod (`size=request`), so a PVC may have none yet.
pub fn validate_source(source: &Source, sized_later: bool) -> Result<(), GrammarError> {
    match source {
        Source::Profile(p) => validate_profile_name(p),
        Source::EmptyDir(e) => {
            if let Some(m) = &e.medium
                && !(m.is_empty()
                    || m == "Memory"
                    || m == "HugePages"
                    || m.starts_with("HugePages-"))
            {
                return bad(format!(
                    "medium {m:?} is not one of \"\" (node disk), Memory, HugePages"
                ));
            }
            if let Some(q) = &e.size_limit {
                parse_size("size", &q.0)?;
            }
            Ok(())
        }
        Source::Csi(c) => {
            if c.driver.trim().is_empty() {
                return bad("csi.driver is empty");
            }
            if c.driver.len() > 63 {
                return bad(format!(
                    "CSI driver {:?} is longer than 63 characters",
                    c.driver
                ));
            }
            validate_dns_subdomain("CSI driver", &c.driver)?;
            if let Some(r) = &c.node_publish_secret_ref {
                validate_dns_subdomain("csi.nodePublishSecretRef.name", &r.name)?;
            }
            Ok(())
        }
        Source::Ephemeral(e) => {
            let Some(t) = &e.volume_claim_template else {
                return bad("ephemeral.volumeClaimTemplate is required");
            };
            let spec = &t.spec;
            let modes = spec.access_modes.as_deref().unwrap_or_default();
            if modes.is_empty() {
                return bad("ephemeral.volumeClaimTemplate.spec.accessModes is required");
            }
            if let Some(m) = modes.iter().find(|m| !ACCESS_MODES.contains(&m.as_str())) {
                return bad(format!(
                    "accessMode {m:?} is not one of {}",
                    ACCESS_MODES.join(", ")
                ));
            }
            if let Some(meta) = &t.metadata {
                validate_template_metadata(meta)?;
            }
            match spec.volume_mode.as_deref() {
                None | Some("Filesystem") => {}
                Some("Block") => {
                    return bad(
                        "volumeMode Block cannot be mounted at a mountPath; use Filesystem",
                    );
                }
                Some(other) => {
                    return bad(format!(
                        "volumeMode {other:?} is not Filesystem (the only mode a mountPath can use)"
                    ));
                }
            }
            if let Some(sc) = &spec.storage_class_name {
                validate_dns_subdomain("storageClass", sc)?;
            }
            let storage = spec
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"));
            match storage {
                Some(q) => parse_size("size", &q.0).map(|_| ()),
                None if sized_later => Ok(()),
                None => {
                    bad("ephemeral.volumeClaimTemplate.spec.resources.requests.storage is required")
                }
            }
        }
    }
}

pub fn validate_mount_path(p: &str) -> Result<(), GrammarError> {
    if !p.starts_with('/') {
        return bad(format!("mountPath {p:?} must be an absolute path"));
    }
    if normalize_path(p) == "/" {
        return bad(format!(
            "mountPath {p:?} is the container's root; mount the volume below it"
        ));
    }
    if has_dot_dot(p) {
        return bad(format!("mountPath {p:?} must not contain '..'"));
    }
    if p.bytes().any(|b| b == 0 || b == b':') {
        return bad(format!("mountPath {p:?} must not contain ':' or NUL"));
    }
    Ok(())
}

/// One spelling per path: `//` and `/./` collapsed, no trailing `/` (`/scratch//a/./` is
/// `/scratch/a`). Mount paths are written and compared in this form.
pub fn normalize_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for part in p.split('/').filter(|part| !part.is_empty() && *part != ".") {
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// Whether a `..` path element occurs (a plain byte scan first: most paths have no `..`).
fn has_dot_dot(p: &str) -> bool {
    p.as_bytes().windows(2).any(|w| w == b"..") && split_ascii(p, b'/').any(|part| part == "..")
}

fn validate_sub_path(p: &str) -> Result<(), GrammarError> {
    if p.starts_with('/') {
        return bad(format!("subPath {p:?} must be a relative path"));
    }
    if has_dot_dot(p) {
        return bad(format!("subPath {p:?} must not contain '..'"));
    }
    Ok(())
}

/// DNS-1123 label: what Kubernetes requires of volume and container names.
pub fn validate_dns_label(what: &str, s: &str) -> Result<(), GrammarError> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        bad(format!(
            "{what} {s:?} is not a DNS-1123 label (lowercase letters, digits and '-', at most 63, starting and ending alphanumeric)"
        ))
    }
}

fn validate_dns_subdomain(what: &str, s: &str) -> Result<(), GrammarError> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && split_ascii(s, b'.').all(|part| validate_dns_label(what, part).is_ok());
    if ok {
        Ok(())
    } else {
        bad(format!("{what} {s:?} is not a valid DNS-1123 subdomain"))
    }
}

/// A PVC template may carry labels and annotations only (the API server refuses the rest of
/// ObjectMeta there), each a valid Kubernetes key and label value.
fn validate_template_metadata(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<(), GrammarError> {
    let at = "ephemeral.volumeClaimTemplate.metadata";
    let mut rest = serde_json::to_value(meta).map_err(|e| GrammarError(format!("{at}: {e}")))?;
    if let Value::Object(fields) = &mut rest {
        fields.remove("labels");
        fields.remove("annotations");
        if let Some(field) = fields.keys().next() {
            return bad(format!(
                "{at}.{field} cannot be set for an ephemeral volume (only labels and annotations)"
            ));
        }
    }
    for (k, v) in meta.labels.iter().flatten() {
        validate_qualified_name(&format!("{at}.labels"), k)?;
        let ok = v.is_empty()
            || (v.len() <= 63
                && v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric())
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')));
        if !ok {
            return bad(format!("{at}.labels.{k}: {v:?} is not a valid label value"));
        }
    }
    for k in meta.annotations.iter().flatten().map(|(k, _)| k) {
        validate_qualified_name(&format!("{at}.annotations"), k)?;
    }
    Ok(())
}

/// A label or annotation key: an optional DNS subdomain prefix and `/`, then a name of at most
/// 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn validate_qualified_name(at: &str, key: &str) -> Result<(), GrammarError> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !name_ok || prefix.is_some_and(|p| validate_dns_subdomain("prefix", p).is_err()) {
        return bad(format!("{at}: {key:?} is not a valid key"));
    }
    Ok(())
}

pub fn validate_profile_name(s: &str) -> Result<(), GrammarError> {
    validate_dns_subdomain("profile name", s)
}

fn validate_env_name(s: &str) -> Result<(), GrammarError> {
    let mut bytes = s.bytes();
    let ok = matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_' || b == b'-' || b == b'.')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        bad(format!(
            "env name {s:?} is not a valid environment variable name"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(v: &str) -> VolumeRequest {
        v.parse().unwrap_or_else(|e| panic!("{v}: {e}"))
    }

    #[test]
    fn ascii_split_and_trim_match_the_standard_library() {
        for s in [
            "",
            ",",
            "a",
            "a,b",
            ",a,,b,",
            " a , b ",
            "é,ü",
            "\u{a0}x\u{a0}",
            "\u{b} y \t",
            "\u{3000}z",
            "x\u{2003}",
            " \u{a0} ",
        ] {
            assert_eq!(
                split_ascii(s, b',').collect::<Vec<_>>(),
                s.split(',').collect::<Vec<_>>(),
                "{s:?}"
            );
            assert_eq!(trim(s), s.trim(), "{s:?}");
        }
    }

    #[test]
    fn the_first_misplaced_shorthand_written_is_named() {
        let err = |v: &str| v.parse::<VolumeRequest>().unwrap_err().0;
        assert!(
            err("type=emptyDir,driver=d,storageClass=x,mountPath=/x")
                .starts_with("driver does not apply")
        );
        assert!(
            err("storageClass=x,driver=d,type=emptyDir,mountPath=/x")
                .starts_with("storageClass does not apply")
        );
        assert!(
            err("type=csi,driver=d,attr.a=1,size=1Gi,mountPath=/x")
                .starts_with("size does not apply")
        );
        assert!(
            err("profile=p,attr.k=v,size=1Gi").starts_with("attr.k does not apply to profile=p")
        );
    }

    #[test]
    fn dot_dot_is_refused_only_as_a_whole_path_element() {
        assert!(validate_mount_path("/data/a..b/..c").is_ok());
        assert!(validate_mount_path("/data/..").is_err());
        assert!(validate_mount_path("/../x").is_err());
        assert!(validate_sub_path("x/../y").is_err());
        assert!(validate_sub_path("..").is_err());
        assert!(validate_sub_path("a..").is_ok());
    }

    #[test]
    fn bare_profile_name_is_a_profile_request() {
        let r = ok("ebs-200g");
        assert_eq!(r.source, Source::Profile("ebs-200g".into()));
        assert_eq!(r.mount_path, None);
    }

    #[test]
    fn key_value_profile_with_overrides() {
        let r = ok("profile=ebs-200g,mountPath=/scratch,size=300Gi");
        assert_eq!(r.source, Source::Profile("ebs-200g".into()));
        assert_eq!(r.mount_path.as_deref(), Some("/scratch"));
        assert_eq!(r.size.as_deref(), Some("300Gi"));
    }

    #[test]
    fn key_value_emptydir_memory() {
        let r = ok("type=emptyDir, medium=Memory, mountPath=/dev/shm, size=2Gi");
        let Source::EmptyDir(e) = r.source else {
            panic!()
        };
        assert_eq!(e.medium.as_deref(), Some("Memory"));
        assert_eq!(e.size_limit, Some(K8sQuantity("2Gi".into())));
        assert_eq!(r.mount_path.as_deref(), Some("/dev/shm"));
    }

    #[test]
    fn key_value_ephemeral_defaults_to_read_write_once() {
        let r = ok("type=ephemeral,storageClass=gp3,size=100Gi,mountPath=/scratch");
        let Source::Ephemeral(e) = r.source else {
            panic!()
        };
        let spec = e.volume_claim_template.unwrap().spec;
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        assert_eq!(spec.storage_class_name.as_deref(), Some("gp3"));
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"],
            K8sQuantity("100Gi".into())
        );
    }

    #[test]
    fn key_value_csi_with_attributes_sets_read_only_on_volume_and_mount() {
        let r = ok(
            "type=csi,driver=secrets-store.csi.k8s.io,attr.secretProviderClass=vault-db,mountPath=/mnt/secrets,readOnly=true",
        );
        let Source::Csi(c) = &r.source else { panic!() };
        assert_eq!(c.driver, "secrets-store.csi.k8s.io");
        assert_eq!(c.read_only, Some(true));
        assert_eq!(
            c.volume_attributes.as_ref().unwrap()["secretProviderClass"],
            "vault-db"
        );
        assert_eq!(r.read_only, Some(true));
    }

    #[test]
    fn targets_env_and_init_containers() {
        let r = ok(
            "type=emptyDir,mountPath=/tmp/x,containers=main;sidecar,initContainers=true,env=TMPDIR;NXF_SCRATCH",
        );
        assert_eq!(r.containers, Some(vec!["main".into(), "sidecar".into()]));
        assert_eq!(r.init_containers, Some(InitTargets::All));
        assert_eq!(r.env, Some(vec!["TMPDIR".into(), "NXF_SCRATCH".into()]));
        let r = ok("type=emptyDir,mountPath=/x,initContainers=setup;fetch");
        assert_eq!(
            r.init_containers,
            Some(InitTargets::Named(vec!["setup".into(), "fetch".into()]))
        );
    }

    #[test]
    fn json_form_takes_kubernetes_sources_verbatim() {
        let r = ok(
            r#"{"mountPath":"/scratch","ephemeral":{"volumeClaimTemplate":{"spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"gp3","resources":{"requests":{"storage":"100Gi"}}}}}}"#,
        );
        assert!(matches!(r.source, Source::Ephemeral(_)));
        let r = ok(
            r#"{"type":"emptyDir","size":"1Gi","mountPath":"/x","containers":["a","b"],"initContainers":["i"],"readOnly":false}"#,
        );
        assert_eq!(r.containers, Some(vec!["a".into(), "b".into()]));
        assert_eq!(
            r.init_containers,
            Some(InitTargets::Named(vec!["i".into()]))
        );
        assert_eq!(r.read_only, Some(false));
    }

    #[test]
    fn every_error_names_what_is_wrong() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("   ", "empty"),
            ("Bad_Profile", "profile name \"Bad_Profile\""),
            (
                "type=emptyDir,mountPath=/x,sizee=1Gi",
                "unknown field \"sizee\"",
            ),
            (
                "type=emptydir,mountPath=/x",
                "type \"emptydir\" is not one of",
            ),
            ("mountPath=/x", "no volume source"),
            (
                "profile=a,type=emptyDir",
                "profile and type are given together",
            ),
            (
                "type=emptyDir,mountPath=/x,mountPath=/y",
                "mountPath is given twice",
            ),
            (
                "type=emptyDir,mountPath=relative/path",
                "must be an absolute path",
            ),
            ("type=emptyDir,mountPath=/a/../etc", "must not contain '..'"),
            (
                "type=emptyDir,mountPath=/x,subPath=/abs",
                "subPath \"/abs\" must be a relative path",
            ),
            (
                "type=emptyDir,mountPath=/x,size=10GB",
                "invalid quantity \"10GB\"",
            ),
            ("type=emptyDir,mountPath=/x,size=-1Gi", "negative"),
            (
                "type=emptyDir,mountPath=/x,medium=memory",
                "medium \"memory\" is not one of",
            ),
            (
                "type=emptyDir,mountPath=/x,storageClass=gp3",
                "storageClass does not apply to type=emptyDir",
            ),
            (
                "type=emptyDir,mountPath=/x,attr.a=b",
                "attr.a does not apply to type=emptyDir",
            ),
            ("type=csi,mountPath=/x", "type=csi needs driver"),
            (
                "type=csi,driver=d,size=1Gi,mountPath=/x",
                "size does not apply to type=csi",
            ),
            (
                "type=csi,driver=Not_A_Driver,mountPath=/x",
                "CSI driver \"Not_A_Driver\"",
            ),
            (
                "type=csi,driver=d,attr.=x,mountPath=/x",
                "attr. needs a key",
            ),
            (
                "type=csi,driver=d,attr.a=1,attr.a=2,mountPath=/x",
                "attr.a is given twice",
            ),
            ("type=ephemeral,mountPath=/x", "type=ephemeral needs size"),
            (
                "type=ephemeral,size=1Gi,accessMode=RWO,mountPath=/x",
                "accessMode \"RWO\" is not one of",
            ),
            (
                "type=ephemeral,size=1Gi,medium=Memory,mountPath=/x",
                "medium does not apply to type=ephemeral",
            ),
            (
                "profile=p,storageClass=gp3",
                "storageClass does not apply to profile=p",
            ),
            ("profile=p,size=lots", "invalid quantity \"lots\""),
            (
                "type=emptyDir,mountPath=/x,readOnly=yes",
                "readOnly must be true or false",
            ),
            (
                "type=emptyDir,mountPath=/x,containers=Main",
                "container name \"Main\"",
            ),
            (
                "type=emptyDir,mountPath=/x,containers=;",
                "containers is empty",
            ),
            (
                "type=emptyDir,mountPath=/x,initContainers=",
                "initContainers",
            ),
            ("type=emptyDir,mountPath=/x,env=1BAD", "env name \"1BAD\""),
            (
                "type=emptyDir,mountPath=/x,emptyDir=1",
                "emptyDir needs the JSON form",
            ),
            (
                "type=emptyDir,mountPath",
                "\"mountPath\" is not a key=value pair",
            ),
            ("type=emptyDir,mountPath=", "mountPath is empty"),
            ("{not json", "invalid JSON"),
            (
                "{\"mountPath\":\"/x\",\"emptyDir\":{\"sizeLimt\":\"1Gi\"}}",
                "unknown field emptyDir.sizeLimt",
            ),
            (
                "{\"mountPath\":\"/x\",\"emptyDir\":{\"sizeLimit\":true}}",
                "emptyDir: invalid type",
            ),
            (
                "{\"mountPath\":\"/x\",\"emptyDir\":{},\"size\":\"1Gi\"}",
                "size does not apply to a volume given as a JSON object",
            ),
            (
                "{\"mountPath\":\"/x\",\"emptyDir\":[]}",
                "emptyDir must be a JSON object",
            ),
            (
                "{\"mountPath\":\"/x\",\"ephemeral\":{}}",
                "volumeClaimTemplate is required",
            ),
            (
                "{\"mountPath\":\"/x\",\"ephemeral\":{\"volumeClaimTemplate\":{\"spec\":{}}}}",
                "accessModes is required",
            ),
            (
                "{\"mountPath\":\"/x\",\"ephemeral\":{\"volumeClaimTemplate\":{\"spec\":{\"accessModes\":[\"ReadWriteOnce\"]}}}}",
                "requests.storage is required",
            ),
            (
                "{\"mountPath\":\"/x\",\"ephemeral\":{\"volumeClaimTemplate\":{\"spec\":{\"accessModes\":[\"ReadWriteOnce\"],\"volumeMode\":\"Block\",\"resources\":{\"requests\":{\"storage\":\"1Gi\"}}}}}}",
                "volumeMode Block",
            ),
            (
                "{\"mountPath\":\"/x\",\"csi\":{\"driver\":\"d\",\"volumeAtributes\":{}}}",
                "unknown field csi.volumeAtributes",
            ),
            (
                "{\"mountPath\":true,\"type\":\"emptyDir\"}",
                "mountPath must be a string",
            ),
            (
                "{\"type\":\"emptyDir\",\"mountPath\":\"/x\",\"containers\":[1]}",
                "containers must list non-empty strings",
            ),
            ("[1,2]", "profile name \"[1,2]\""),
            (
                "{\"type\":\"emptyDir\",\"mountPath\":\"/x\",\"colour\":\"red\"}",
                "unknown field \"colour\"",
            ),
        ];
        for (input, want) in cases {
            let err = input
                .parse::<VolumeRequest>()
                .expect_err(&format!("{input:?} should be refused"));
            assert!(
                err.0.contains(want),
                "{input:?}: got {:?}, want {want:?}",
                err.0
            );
        }
    }

    #[test]
    fn volume_kind_round_trips_through_its_name() {
        for k in VolumeKind::ALL {
            assert_eq!(k.as_str().parse::<VolumeKind>(), Ok(k));
            assert_eq!(k.to_string(), k.as_str());
        }
    }
}
