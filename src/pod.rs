//! A narrow view of a pod (or pod template): only what the engine decides on.
//!
//! Everything else in the object is skipped by serde without being built; existing volumes are
//! kept as raw JSON and parsed only when one of them has the name of a volume being injected.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Debug, Default, Deserialize)]
pub struct PodView {
    #[serde(default)]
    pub metadata: Option<MetaView>,
    #[serde(default)]
    pub spec: Option<SpecView>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaView {
    pub name: Option<String>,
    pub generate_name: Option<String>,
    pub namespace: Option<String>,
    pub labels: Option<BTreeMap<String, String>>,
    pub annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecView {
    pub containers: Option<Vec<ContainerView>>,
    pub init_containers: Option<Vec<ContainerView>>,
    pub volumes: Option<Vec<Box<RawValue>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    pub name: String,
    pub volume_mounts: Option<Vec<MountView>>,
    pub env: Option<Vec<EnvView>>,
    pub resources: Option<ResourcesView>,
    pub restart_policy: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountView {
    pub name: String,
    pub mount_path: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct EnvView {
    pub name: String,
    pub value: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ResourcesView {
    pub limits: Option<BTreeMap<String, String>>,
    pub requests: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct VolumeName<'a> {
    #[serde(borrow)]
    name: std::borrow::Cow<'a, str>,
}

impl PodView {
    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref()?.labels.as_ref()
    }

    pub fn annotations(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref()?.annotations.as_ref()
    }

    /// `name`, or `generateName` followed by `*` for pods the API server has yet to name.
    pub fn display_name(&self) -> String {
        let Some(m) = &self.metadata else {
            return String::new();
        };
        match (&m.name, &m.generate_name) {
            (Some(n), _) if !n.is_empty() => n.clone(),
            (_, Some(g)) => format!("{g}*"),
            _ => String::new(),
        }
    }

    pub fn containers(&self) -> &[ContainerView] {
        self.spec
            .as_ref()
            .and_then(|s| s.containers.as_deref())
            .unwrap_or_default()
    }

    pub fn init_containers(&self) -> &[ContainerView] {
        self.spec
            .as_ref()
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default()
    }

    /// The existing volume with this name, as raw JSON.
    pub fn volume(&self, name: &str) -> Option<&RawValue> {
        self.spec
            .as_ref()?
            .volumes
            .as_ref()?
            .iter()
            .find(|raw| {
                serde_json::from_str::<VolumeName<'_>>(raw.get()).is_ok_and(|v| v.name == name)
            })
            .map(|b| &**b)
    }
}
