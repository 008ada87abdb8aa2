//! What the cluster checks know of the cluster: its CSIDriver and StorageClass objects, each
//! reduced to the fields the checks read. Built from objects (`mutate --cluster FILE`) or kept
//! up to date by watches (`serve`, in `src/server/watch.rs`); the checks themselves are
//! pure and run on the request path without any API call.

use std::collections::BTreeMap;

use serde_json::Value;

/// `clusterChecks` in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    /// A volume the cluster cannot provide is refused (422).
    #[default]
    Enforce,
    /// Admitted with the volume, a warning and the status annotation.
    Warn,
    /// No checks.
    Off,
}

/// One CSIDriver: whether it serves inline (ephemeral) volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiDriverInfo {
    /// `spec.volumeLifecycleModes` includes `Ephemeral`: the driver serves inline volumes.
    pub ephemeral: bool,
}

/// One StorageClass: its provisioner, and whether it is marked as the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageClassInfo {
    /// The provisioner (for messages).
    pub provisioner: String,
    /// Annotated `storageclass.kubernetes.io/is-default-class: "true"`.
    pub default: bool,
}

/// The cluster's CSIDrivers and StorageClasses, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterState {
    /// CSIDrivers by name.
    pub csi_drivers: BTreeMap<String, CsiDriverInfo>,
    /// StorageClasses by name.
    pub storage_classes: BTreeMap<String, StorageClassInfo>,
    /// Namespaces' labels by name (for `policyOverrides` that select by label).
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
}

/// Cluster objects (`mutate --cluster`) that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Not YAML or JSON.
    #[error("cannot parse the cluster objects as YAML or JSON: {0}")]
    Parse(String),
    /// One object that is not a valid CSIDriver or StorageClass.
    #[error("{at}: {message}")]
    Object {
        /// Which object.
        at: String,
        /// What is wrong with it.
        message: String,
    },
}

const DEFAULT_CLASS: [&str; 2] = [
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
];

impl CsiDriverInfo {
    /// `spec.volumeLifecycleModes`; absent means `[Persistent]`.
    pub fn from_modes<'a>(modes: Option<impl IntoIterator<Item = &'a str>>) -> Self {
        CsiDriverInfo {
            ephemeral: modes.is_some_and(|m| m.into_iter().any(|m| m == "Ephemeral")),
        }
    }
}

impl StorageClassInfo {
    /// The default-class annotation (either spelling) set to `"true"`.
    pub fn from_parts<'a>(
        provisioner: &str,
        annotations: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        StorageClassInfo {
            provisioner: provisioner.to_owned(),
            default: annotations
                .into_iter()
                .any(|(k, v)| DEFAULT_CLASS.contains(&k) && v == "true"),
        }
    }
}

impl ClusterState {
    /// What `kubectl get csidrivers,storageclasses,namespaces -o yaml` prints: a List, a multi-document
    /// stream, or single objects; other kinds are skipped.
    pub fn parse(text: &str) -> Result<ClusterState, ClusterError> {
        use serde::Deserialize as _;
        crate::yaml_nesting::check(text).map_err(|e| ClusterError::Parse(e.to_string()))?;
        let mut state = ClusterState::default();
        for (i, doc) in yaml_serde::Deserializer::from_str(text).enumerate() {
            let value = Value::deserialize(doc)
                .map_err(|e| ClusterError::Parse(format!("document {}: {e}", i + 1)))?;
            state.add_value(&value, &format!("document {}", i + 1))?;
        }
        Ok(state)
    }

    fn add_value(&mut self, v: &Value, at: &str) -> Result<(), ClusterError> {
        let bad = |message: &str| ClusterError::Object {
            at: at.to_owned(),
            message: message.to_owned(),
        };
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
        let name = || {
            v.pointer("/metadata/name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(&format!("a {kind} without metadata.name")))
        };
        match kind {
            "List" | "CSIDriverList" | "StorageClassList" | "NamespaceList" => {
                for (i, item) in v
                    .get("items")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    self.add_value(item, &format!("{at}, item {i}"))?;
                }
            }
            "CSIDriver" => {
                let modes = v
                    .pointer("/spec/volumeLifecycleModes")
                    .and_then(Value::as_array)
                    .map(|m| m.iter().filter_map(Value::as_str));
                self.csi_drivers
                    .insert(name()?.to_owned(), CsiDriverInfo::from_modes(modes));
            }
            "StorageClass" => {
                let provisioner = v
                    .get("provisioner")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a StorageClass without provisioner"))?;
                let annotations = v
                    .pointer("/metadata/annotations")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)));
                self.storage_classes.insert(
                    name()?.to_owned(),
                    StorageClassInfo::from_parts(provisioner, annotations),
                );
            }
            "Namespace" => {
                let labels = v
                    .pointer("/metadata/labels")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect();
                self.namespaces.insert(name()?.to_owned(), labels);
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether a StorageClass is marked as the default.
    pub fn has_default_class(&self) -> bool {
        self.storage_classes.values().any(|c| c.default)
    }
}

/// What the checks know of the cluster: a state, and whether it is complete (both lists
/// received). Until it is, `enforce` acts as `warn`: an incomplete list must not refuse pods.
#[derive(Debug, Clone, Copy)]
pub struct KnownCluster<'a> {
    /// The objects seen.
    pub state: &'a ClusterState,
    /// The first full lists have arrived.
    pub complete: bool,
}

/// What the checks found about one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The kubelet (inline CSI) or the PVC (ephemeral) would never get this volume.
    Unavailable(String),
    /// Legal, but likely to fail: a warning.
    Suspect(String),
}

/// An inline CSI volume of `driver`: the kubelet mounts it only if a CSIDriver object exists
/// and lists `Ephemeral`; otherwise the pod sits in ContainerCreating.
pub fn check_csi(state: &ClusterState, driver: &str) -> Option<Finding> {
    match state.csi_drivers.get(driver) {
        None => Some(Finding::Unavailable(format!(
            "CSIDriver {driver:?} does not exist in the cluster: the kubelet could not mount the \
             inline volume (the pod would stay in ContainerCreating)"
        ))),
        Some(d) if !d.ephemeral => Some(Finding::Unavailable(format!(
            "CSIDriver {driver:?} does not list Ephemeral in volumeLifecycleModes (it serves \
             persistent volumes only): the kubelet would refuse the inline volume"
        ))),
        Some(_) => None,
    }
}

/// A generic ephemeral volume of `class` (or the default class): its PVC is provisioned only
/// if the class exists; otherwise it stays Pending and the pod never starts.
pub fn check_storage_class(state: &ClusterState, class: Option<&str>) -> Option<Finding> {
    match class {
        Some(class) => match state.storage_classes.get(class) {
            None => Some(Finding::Unavailable(format!(
                "StorageClass {class:?} does not exist: the PVC would stay Pending and the pod \
                 would never start"
            ))),
            Some(c) => provisioner_finding(state, class, c),
        },
        None if !state.has_default_class() => Some(Finding::Unavailable(
            "no storageClass is named and the cluster has no default StorageClass: the PVC \
             would stay Pending and the pod would never start"
                .to_owned(),
        )),
        None => None,
    }
}

/// A CSI provisioner (a name with a dot, not one of the in-tree `kubernetes.io/…` ones)
/// without its CSIDriver object is probably not installed.
fn provisioner_finding(state: &ClusterState, class: &str, c: &StorageClassInfo) -> Option<Finding> {
    // CSI driver names are DNS subdomains; in-tree provisioners are `kubernetes.io/<name>`.
    let csi_like = c.provisioner.contains('.') && !c.provisioner.contains('/');
    (csi_like && !state.csi_drivers.contains_key(&c.provisioner)).then(|| {
        Finding::Suspect(format!(
            "StorageClass {class:?} uses provisioner {:?}, which has no CSIDriver object: is the \
             driver installed?",
            c.provisioner
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJECTS: &str = r#"
apiVersion: v1
kind: List
items:
  - apiVersion: storage.k8s.io/v1
    kind: CSIDriver
    metadata: {name: secrets-store.csi.k8s.io}
    spec: {volumeLifecycleModes: [Ephemeral]}
  - apiVersion: storage.k8s.io/v1
    kind: CSIDriver
    metadata: {name: ebs.csi.aws.com}
    spec: {attachRequired: true}
  - apiVersion: storage.k8s.io/v1
    kind: StorageClass
    metadata: {name: gp3, annotations: {storageclass.kubernetes.io/is-default-class: "true"}}
    provisioner: ebs.csi.aws.com
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: fast}
provisioner: fast.example.com
"#;

    #[test]
    fn kubectl_output_is_read_as_lists_and_streams() {
        let s = ClusterState::parse(OBJECTS).unwrap();
        assert!(s.csi_drivers["secrets-store.csi.k8s.io"].ephemeral);
        assert!(
            !s.csi_drivers["ebs.csi.aws.com"].ephemeral,
            "absent modes: Persistent only"
        );
        assert!(s.storage_classes["gp3"].default);
        assert!(!s.storage_classes["fast"].default);
        assert!(s.has_default_class());
        let e = ClusterState::parse("kind: StorageClass\nmetadata: {name: x}\n").unwrap_err();
        assert!(e.to_string().contains("without provisioner"), "{e}");
    }

    #[test]
    fn each_check_names_the_cluster_object() {
        let s = ClusterState::parse(OBJECTS).unwrap();
        assert_eq!(check_csi(&s, "secrets-store.csi.k8s.io"), None);
        assert!(
            matches!(check_csi(&s, "ebs.csi.aws.com"), Some(Finding::Unavailable(m)) if m.contains("does not list Ephemeral"))
        );
        assert!(
            matches!(check_csi(&s, "nope.csi.io"), Some(Finding::Unavailable(m)) if m.contains("\"nope.csi.io\" does not exist"))
        );
        assert_eq!(check_storage_class(&s, Some("gp3")), None);
        assert_eq!(
            check_storage_class(&s, None),
            None,
            "the default class serves it"
        );
        assert!(
            matches!(check_storage_class(&s, Some("io2")), Some(Finding::Unavailable(m)) if m.contains("\"io2\" does not exist"))
        );
        assert!(
            matches!(check_storage_class(&s, Some("fast")), Some(Finding::Suspect(m)) if m.contains("fast.example.com"))
        );
        let mut no_default = s.clone();
        no_default.storage_classes.get_mut("gp3").unwrap().default = false;
        assert!(
            matches!(check_storage_class(&no_default, None), Some(Finding::Unavailable(m)) if m.contains("no default StorageClass"))
        );
    }
}
