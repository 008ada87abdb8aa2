//! The domain: what a volume is, what a pod may ask for, and what a profile holds, with the
//! methods the configuration and the engine share (kind, size, with a size, validation,
//! compilation). Nothing here parses an annotation ([`crate::annotation`]) or decides for a pod
//! ([`crate::engine`]).

use std::{borrow::Cow, collections::BTreeMap, fmt, str::FromStr, sync::Arc};

use k8s_openapi::{
    api::core::v1::{CSIVolumeSource, EmptyDirVolumeSource, EphemeralVolumeSource},
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};

mod claim;

pub use claim::Claim;

use crate::{
    echo::quoted,
    quantity::Quantity,
    validate::{self, Invalid, Problems, bad},
};

/// The three volume kinds, spelled as the Pod API spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
pub enum VolumeKind {
    /// `emptyDir`: a scratch directory on the node's disk, or a RAM disk.
    #[serde(rename = "emptyDir")]
    EmptyDir,
    /// `csi`: a CSI inline volume (e.g. the Secrets Store driver).
    #[serde(rename = "csi")]
    Csi,
    /// `ephemeral`: a generic ephemeral volume, a PVC made from a template for the pod's life.
    #[serde(rename = "ephemeral")]
    Ephemeral,
}

impl VolumeKind {
    /// Every kind, in the order the messages list them.
    pub const ALL: [VolumeKind; 3] = [VolumeKind::EmptyDir, VolumeKind::Csi, VolumeKind::Ephemeral];

    /// The kind's name in the Pod API (the volume's field name).
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
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        VolumeKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                Invalid(format!(
                    "type {} is not one of emptyDir, csi, ephemeral (spelled as in the Pod API)",
                    quoted(s)
                ))
            })
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

/// A Kubernetes volume source: what goes under the volume's `emptyDir`, `csi` or `ephemeral`.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// An emptyDir (disk or RAM).
    EmptyDir(EmptyDirVolumeSource),
    /// A CSI inline volume.
    Csi(CSIVolumeSource),
    /// A generic ephemeral volume given as its Kubernetes object (boxed: the PVC template is
    /// large).
    Ephemeral(Box<EphemeralVolumeSource>),
    /// A generic ephemeral volume as the `type=ephemeral` shorthand describes it.
    Claim(Claim),
}

impl Source {
    /// An emptyDir: on the node's disk, or in `medium` (`Memory`), of at most `size`.
    pub fn empty_dir(medium: Option<&str>, size: Option<&str>) -> Source {
        Source::EmptyDir(EmptyDirVolumeSource {
            medium: medium.map(str::to_owned),
            size_limit: size.map(|s| K8sQuantity(s.to_owned())),
        })
    }

    /// A CSI inline volume of `driver`, with its `volumeAttributes` (none when empty).
    /// `read_only` is the source's own flag (the Secrets Store driver refuses a writable one).
    pub fn csi(
        driver: &str,
        fs_type: Option<&str>,
        read_only: Option<bool>,
        attributes: &BTreeMap<&str, &str>,
    ) -> Source {
        Source::Csi(CSIVolumeSource {
            driver: driver.to_owned(),
            fs_type: fs_type.map(str::to_owned),
            read_only,
            volume_attributes: (!attributes.is_empty()).then(|| {
                attributes
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            node_publish_secret_ref: None,
        })
    }

    /// A generic ephemeral volume: a PVC of `storage_class` (the cluster's default when
    /// `None`) with one access mode, requesting `size` (set later for `size=request`).
    pub fn ephemeral(storage_class: Option<&str>, access_mode: &str, size: Option<&str>) -> Source {
        Source::Claim(Claim {
            storage_class: storage_class.map(str::to_owned),
            access_mode: ACCESS_MODES
                .into_iter()
                .find(|m| *m == access_mode)
                .map_or_else(|| Cow::Owned(access_mode.to_owned()), Cow::Borrowed),
            size: size.map(str::to_owned),
        })
    }

    /// The source's kind.
    pub fn kind(&self) -> VolumeKind {
        match self {
            Source::EmptyDir(_) => VolumeKind::EmptyDir,
            Source::Csi(_) => VolumeKind::Csi,
            Source::Ephemeral(_) | Source::Claim(_) => VolumeKind::Ephemeral,
        }
    }

    /// Where an emptyDir lives; [`Medium::None`] for the other kinds.
    pub fn medium(&self) -> Medium {
        match self {
            Source::EmptyDir(e) => match e.medium.as_deref() {
                Some("Memory") => Medium::Memory,
                Some(m) if m.starts_with("HugePages") => Medium::HugePages,
                _ => Medium::Disk,
            },
            _ => Medium::None,
        }
    }

    /// The size asked for: an emptyDir's `sizeLimit` or the PVC template's `storage` request.
    pub fn size(&self) -> Result<Option<Quantity>, Invalid> {
        let parse = |field: &str, q: &K8sQuantity| validate::parse_size(field, &q.0);
        match self {
            Source::EmptyDir(e) => e
                .size_limit
                .as_ref()
                .map(|q| parse("emptyDir.sizeLimit", q))
                .transpose(),
            Source::Ephemeral(e) => e
                .volume_claim_template
                .as_ref()
                .and_then(|t| t.spec.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .map(|q| parse(STORAGE, q))
                .transpose(),
            Source::Claim(c) => c
                .size
                .as_deref()
                .map(|q| validate::parse_size(STORAGE, q))
                .transpose(),
            Source::Csi(_) => Ok(None),
        }
    }

    /// The same source with another size (`sizeLimit`, or the PVC's `storage` request).
    pub fn with_size(mut self, size: &str) -> Result<Source, Invalid> {
        match &mut self {
            Source::EmptyDir(e) => e.size_limit = Some(K8sQuantity(size.to_owned())),
            Source::Ephemeral(e) => {
                let Some(t) = e.volume_claim_template.as_mut() else {
                    return bad("ephemeral.volumeClaimTemplate is required");
                };
                t.spec
                    .resources
                    .get_or_insert_with(Default::default)
                    .requests
                    .get_or_insert_with(Default::default)
                    .insert("storage".into(), K8sQuantity(size.to_owned()));
            }
            Source::Claim(c) => c.size = Some(size.to_owned()),
            Source::Csi(_) => return bad("size does not apply to a CSI inline volume"),
        }
        Ok(self)
    }

    /// The CSI driver, for a CSI inline volume.
    pub fn csi_driver(&self) -> Option<&str> {
        match self {
            Source::Csi(c) => Some(&c.driver),
            _ => None,
        }
    }

    /// The PVC template's storage class, for an ephemeral volume that names one.
    pub fn storage_class(&self) -> Option<&str> {
        match self {
            Source::Ephemeral(e) => e
                .volume_claim_template
                .as_ref()
                .and_then(|t| t.spec.storage_class_name.as_deref()),
            Source::Claim(c) => c.storage_class.as_deref(),
            _ => None,
        }
    }

    /// The source object as JSON, as k8s-openapi serialises it (shared: the plan and the
    /// patch hold the same bytes).
    pub fn to_json(&self) -> Result<Json, serde_json::Error> {
        match self {
            Source::EmptyDir(e) => serde_json::to_vec(e),
            Source::Csi(c) => serde_json::to_vec(c),
            Source::Ephemeral(e) => serde_json::to_vec(e),
            Source::Claim(c) => serde_json::to_vec(&c.json()),
        }
        .and_then(Json::written)
    }

    /// The source as a patch carries it, with its size: computed once per load for profiles.
    pub fn compile(&self) -> Result<CompiledSource, Invalid> {
        Ok(CompiledSource {
            kind: self.kind(),
            json: self.to_json().map_err(|e| Invalid(e.to_string()))?.shared(),
            size: self.size()?,
            medium: self.medium(),
        })
    }

    /// Checks what Kubernetes itself would reject later, so the user hears it from us, every
    /// problem at once, each under the name it was `written` with. `sized_later`: the size comes
    /// from the pod (`size=request`), so a PVC may have none yet.
    pub fn validate(&self, sized_later: bool, written: Written) -> Result<(), Invalid> {
        let mut problems = Problems::default();
        match self {
            Source::EmptyDir(e) => validate_empty_dir(e, written, &mut problems),
            Source::Csi(c) => validate_csi(c, written, &mut problems),
            Source::Ephemeral(e) => validate_ephemeral(e, sized_later, written, &mut problems),
            Source::Claim(c) => {
                access_modes([&*c.access_mode], written, &mut problems);
                storage_class(c.storage_class.as_deref(), written, &mut problems);
                storage(c.size.as_deref(), sized_later, written, &mut problems);
            }
        }
        problems.finish(())
    }
}

/// JSON text this crate wrote (a volume source's object, by serde_json), kept to be copied
/// into patches as it is: never text from a request, so it is not parsed again. A profile's is written once, when the configuration is
/// loaded, and shared by the patch of every pod that uses it (`Json::shared`); one written
/// for a pod is its writer's buffer, used once (copying it into an `Arc` would cost an
/// allocation and a copy per volume).
#[derive(Debug, Clone)]
pub struct Json(Text);

#[derive(Debug, Clone)]
enum Text {
    Shared(Arc<str>),
    Own(String),
}

impl Json {
    /// The bytes a writer produced (UTF-8, as every writer here writes from `str`s).
    pub(crate) fn written(bytes: Vec<u8>) -> Result<Json, serde_json::Error> {
        let text = String::from_utf8(bytes).map_err(serde::ser::Error::custom)?;
        Ok(Json(Text::Own(text)))
    }

    /// The same text, shared by its clones (for text kept and copied into many patches).
    pub(crate) fn shared(self) -> Json {
        match self.0 {
            Text::Own(text) => Json(Text::Shared(Arc::from(text))),
            shared @ Text::Shared(_) => Json(shared),
        }
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        match &self.0 {
            Text::Shared(text) => text,
            Text::Own(text) => text,
        }
    }
}

impl PartialEq for Json {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Json {}

/// How a source was written: its messages name the fields as the user wrote them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// `type=…` with the shorthands (`size`, `medium`, `storageClass`, `accessMode`, `driver`).
    Shorthand,
    /// A Kubernetes volume source object (`emptyDir`, `csi`, `ephemeral`), as in a profile.
    Object,
}

impl Written {
    fn name(self, shorthand: &'static str, object: &'static str) -> &'static str {
        match self {
            Written::Shorthand => shorthand,
            Written::Object => object,
        }
    }
}

const PVC_SPEC: &str = "ephemeral.volumeClaimTemplate.spec";

/// An emptyDir: a medium the kubelet knows, a size that parses.
fn validate_empty_dir(e: &EmptyDirVolumeSource, written: Written, problems: &mut Problems) {
    if let Some(m) = &e.medium
        && !(m.is_empty() || m == "Memory" || m == "HugePages" || m.starts_with("HugePages-"))
    {
        // Spelt in another case (`memory`, `hugepages-2Mi`): the medium meant is certain.
        let meant = ["Memory", "HugePages"]
            .into_iter()
            .find(|k| m.eq_ignore_ascii_case(k))
            .map(str::to_owned)
            .or_else(|| {
                let size = m
                    .get(..10)
                    .filter(|p| p.eq_ignore_ascii_case("HugePages-"))
                    .and(m.get(10..))?;
                Some(format!("HugePages-{size}"))
            });
        problems.push(format!(
            "{} {} is not one of \"\" (node disk), Memory, HugePages{}",
            written.name("medium", "emptyDir.medium"),
            quoted(m),
            meant
                .map(|k| format!(": did you mean {k}?"))
                .unwrap_or_default()
        ));
    }
    if let Some(q) = &e.size_limit {
        problems.check(validate::parse_size(
            written.name("size", "emptyDir.sizeLimit"),
            &q.0,
        ));
    }
}

/// A CSI inline volume: a driver name the API server accepts, a Secret name if one is given.
fn validate_csi(c: &CSIVolumeSource, written: Written, problems: &mut Problems) {
    let field = written.name("driver", "csi.driver");
    if c.driver.trim().is_empty() {
        problems.push(format!("{field} is empty"));
    } else if c.driver.len() > 63 {
        problems.push(format!(
            "{field}: CSI driver {} is longer than 63 characters",
            quoted(&c.driver)
        ));
    } else {
        problems.check(validate::dns_subdomain("CSI driver", &c.driver));
    }
    if let Some(r) = &c.node_publish_secret_ref {
        problems.check(validate::dns_subdomain(
            "csi.nodePublishSecretRef.name",
            &r.name,
        ));
    }
}

/// A generic ephemeral volume: a claim template the API server accepts and a pod can mount at a
/// path (access modes, Filesystem mode, a storage class name, a size unless it comes later).
fn validate_ephemeral(
    e: &EphemeralVolumeSource,
    sized_later: bool,
    written: Written,
    problems: &mut Problems,
) {
    let Some(t) = &e.volume_claim_template else {
        problems.push("ephemeral.volumeClaimTemplate is required");
        return;
    };
    let spec = &t.spec;
    let modes = spec.access_modes.as_deref().unwrap_or_default();
    if modes.is_empty() {
        problems.push(format!("{PVC_SPEC}.accessModes is required"));
    }
    access_modes(modes.iter().map(String::as_str), written, problems);
    if let Some(meta) = &t.metadata {
        problems.check(validate::template_metadata(meta));
    }
    match spec.volume_mode.as_deref() {
        None | Some("Filesystem") => {}
        Some("Block") => problems.push(format!(
            "{PVC_SPEC}.volumeMode Block cannot be mounted at a mountPath; use Filesystem"
        )),
        Some(other) => problems.push(format!(
            "{PVC_SPEC}.volumeMode {} is not Filesystem (the only mode a mountPath can use)",
            quoted(other)
        )),
    }
    storage_class(spec.storage_class_name.as_deref(), written, problems);
    let requested = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"));
    storage(
        requested.map(|q| q.0.as_str()),
        sized_later,
        written,
        problems,
    );
}

/// A PVC template's access modes (either form): each one Kubernetes knows.
fn access_modes<'m>(
    modes: impl IntoIterator<Item = &'m str>,
    written: Written,
    problems: &mut Problems,
) {
    let field = written.name(
        "accessMode",
        "ephemeral.volumeClaimTemplate.spec.accessModes",
    );
    for m in modes.into_iter().filter(|m| !ACCESS_MODES.contains(m)) {
        problems.push(format!(
            "{field} {} is not one of {}",
            quoted(m),
            ACCESS_MODES.join(", ")
        ));
    }
}

/// A PVC template's storage class (either form): a name the API server accepts.
fn storage_class(class: Option<&str>, written: Written, problems: &mut Problems) {
    if let Some(sc) = class {
        problems.check(validate::dns_subdomain(
            written.name(
                "storageClass",
                "ephemeral.volumeClaimTemplate.spec.storageClassName",
            ),
            sc,
        ));
    }
}

/// A PVC template's `storage` request (either form): a size that parses, required unless it
/// comes later from the pod.
fn storage(size: Option<&str>, sized_later: bool, written: Written, problems: &mut Problems) {
    match size {
        Some(q) => {
            problems.check(validate::parse_size(written.name("size", STORAGE), q));
        }
        None if sized_later => {}
        None => problems.push(format!("{STORAGE} is required")),
    }
}

const STORAGE: &str = "ephemeral.volumeClaimTemplate.spec.resources.requests.storage";

/// A source serialised once, when the configuration is loaded: a pod that uses a profile as is
/// gets these bytes in its patch.
#[derive(Debug, Clone)]
pub struct CompiledSource {
    /// The source's kind.
    pub kind: VolumeKind,
    /// The source object: the value of the volume's `emptyDir`, `csi` or `ephemeral` field.
    pub json: Json,
    /// The size the source asks for, if any.
    pub size: Option<Quantity>,
    /// Where an emptyDir lives.
    pub medium: Medium,
}

impl PartialEq for CompiledSource {
    fn eq(&self, other: &Self) -> bool {
        (self.kind, self.json.get(), self.size, self.medium)
            == (other.kind, other.json.get(), other.size, other.medium)
    }
}

/// Which init containers get the mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitTargets {
    /// None of them (the default).
    None,
    /// Every init container, native sidecars included.
    All,
    /// These, by name.
    Named(Vec<String>),
}

/// What a request says about the mount, apart from the source. A profile's are defaults that a
/// request may override field by field.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Mount {
    /// Where the volume is mounted (normalised: one spelling per path).
    pub mount_path: Option<String>,
    /// The mount's `readOnly`.
    pub read_only: Option<bool>,
    /// The mount's `subPath`.
    pub sub_path: Option<String>,
    /// The containers that get the mount; `None`: every entry of `spec.containers`.
    pub containers: Option<Vec<String>>,
    /// The init containers that get the mount; `None`: none.
    pub init_containers: Option<InitTargets>,
    /// Variables set to the mount path in the targeted containers.
    pub env: Option<Vec<String>>,
}

/// Where a requested volume comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Requested {
    /// A profile of the configuration, by name.
    Profile(String),
    /// A source given in the request itself.
    Inline(Source),
}

/// One requested volume, as written; a profile is resolved later against the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeRequest {
    /// The profile or inline source.
    pub source: Requested,
    /// A size for a profile request (an inline size is folded into the source).
    pub size: Option<String>,
    /// `size=request`: the size is the targeted containers' largest `ephemeral-storage`
    /// request, decided per pod; the source carries none.
    pub size_from_request: bool,
    /// Where and in which containers it is mounted.
    pub mount: Mount,
}

impl VolumeRequest {
    /// An empty request for the annotation parser to read a value into, a field at a time.
    pub(crate) fn placeholder() -> Self {
        VolumeRequest {
            source: Requested::Profile(String::new()),
            size: None,
            size_from_request: false,
            mount: Mount::default(),
        }
    }

    /// A request for a profile by name, with nothing overridden.
    pub fn profile(name: &str) -> Self {
        VolumeRequest {
            source: Requested::Profile(name.to_owned()),
            size: None,
            size_from_request: false,
            mount: Mount::default(),
        }
    }
}

/// A profile of the configuration: a source compiled once, and the defaults a request may
/// override.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// The source, for requests that change it (a size).
    pub source: Source,
    /// The source as loaded, for requests that use it as is.
    pub compiled: CompiledSource,
    /// `size: request` as the profile's default.
    pub size_from_request: bool,
    /// The mount defaults.
    pub mount: Mount,
}

impl Profile {
    /// A profile from its definition in the configuration, which must give a source.
    pub fn compile(request: VolumeRequest) -> Result<Profile, Invalid> {
        let Requested::Inline(source) = request.source else {
            return bad("a profile cannot name another profile");
        };
        Ok(Profile {
            compiled: source.compile()?,
            source,
            size_from_request: request.size_from_request,
            mount: request.mount,
        })
    }
}

const ACCESS_MODES: [&str; 4] = [
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The shorthand's three fields behave as the k8s-openapi template they stand for, valid or
    /// not: the same kind, size, class, problems (in order), JSON, and JSON once resized.
    #[test]
    fn a_claim_is_its_template() {
        for class in [None, Some("gp3"), Some("Not_A_Name")] {
            for mode in ["ReadWriteOnce", "ReadWriteMany", "Sometimes"] {
                for size in [None, Some("100Gi"), Some("lots")] {
                    let claim = Source::ephemeral(class, mode, size);
                    let Source::Claim(c) = &claim else {
                        panic!("{claim:?}")
                    };
                    let template = Source::Ephemeral(Box::new(c.template()));
                    let what = format!("{claim:?}");
                    assert_eq!(claim.kind(), template.kind(), "{what}");
                    assert_eq!(claim.medium(), template.medium(), "{what}");
                    assert_eq!(claim.size(), template.size(), "{what}");
                    assert_eq!(claim.storage_class(), template.storage_class(), "{what}");
                    for later in [false, true] {
                        for written in [Written::Shorthand, Written::Object] {
                            assert_eq!(
                                claim.validate(later, written),
                                template.validate(later, written),
                                "{what}"
                            );
                        }
                    }
                    assert_eq!(
                        claim.to_json().unwrap().get(),
                        template.to_json().unwrap().get(),
                        "{what}"
                    );
                    let resized = |s: &Source| s.clone().with_size("5Gi").unwrap().to_json();
                    assert_eq!(
                        resized(&claim).unwrap().get(),
                        resized(&template).unwrap().get(),
                        "{what}"
                    );
                }
            }
        }
        // A known mode is not copied.
        let Source::Claim(c) = Source::ephemeral(None, "ReadWriteOncePod", None) else {
            panic!()
        };
        assert!(matches!(c.access_mode, Cow::Borrowed("ReadWriteOncePod")));
    }

    #[test]
    fn volume_kind_round_trips_through_its_name() {
        for k in VolumeKind::ALL {
            assert_eq!(k.as_str().parse::<VolumeKind>(), Ok(k));
            assert_eq!(k.to_string(), k.as_str());
        }
    }
}
