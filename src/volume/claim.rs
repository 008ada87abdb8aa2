//! The `type=ephemeral` shorthand's volume: three fields where k8s-openapi has a template.

use std::{borrow::Cow, collections::BTreeMap};

use k8s_openapi::{
    api::core::v1::{
        EphemeralVolumeSource, PersistentVolumeClaimSpec, PersistentVolumeClaimTemplate,
        VolumeResourceRequirements,
    },
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};

/// A generic ephemeral volume as the `type=ephemeral` shorthand describes it: a PVC template
/// with one access mode, a storage class (the cluster's default when `None`) and a `storage`
/// request (`None` until `size=request` sets it). Its three fields, not k8s-openapi's template
/// (seven allocations to build and drop for every such volume of every pod); written to the
/// patch as that template serialises ([`Claim::template`]), through a borrowed copy of the
/// template's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// `storageClassName`.
    pub storage_class: Option<String>,
    /// The one entry of `accessModes` (a known mode is not copied).
    pub access_mode: Cow<'static, str>,
    /// `resources.requests.storage`.
    pub size: Option<String>,
}

/// The JSON of a [`Claim`]: k8s-openapi's `EphemeralVolumeSource` with only the fields a claim
/// sets, in its order, borrowed from the claim (serde writes it; nothing is built first). A
/// test holds it to [`Claim::template`]'s JSON.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ClaimJson<'c> {
    volume_claim_template: ClaimTemplateJson<'c>,
}

#[derive(serde::Serialize)]
struct ClaimTemplateJson<'c> {
    spec: ClaimSpecJson<'c>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ClaimSpecJson<'c> {
    access_modes: [&'c str; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    resources: Option<ClaimResourcesJson<'c>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    storage_class_name: Option<&'c str>,
}

#[derive(serde::Serialize)]
struct ClaimResourcesJson<'c> {
    requests: ClaimStorageJson<'c>,
}

#[derive(serde::Serialize)]
struct ClaimStorageJson<'c> {
    storage: &'c str,
}

impl Claim {
    pub(super) fn json(&self) -> impl serde::Serialize + '_ {
        ClaimJson {
            volume_claim_template: ClaimTemplateJson {
                spec: ClaimSpecJson {
                    access_modes: [&self.access_mode],
                    resources: self.size.as_deref().map(|storage| ClaimResourcesJson {
                        requests: ClaimStorageJson { storage },
                    }),
                    storage_class_name: self.storage_class.as_deref(),
                },
            },
        }
    }

    /// The same volume as k8s-openapi's object.
    pub fn template(&self) -> EphemeralVolumeSource {
        EphemeralVolumeSource {
            volume_claim_template: Some(PersistentVolumeClaimTemplate {
                metadata: None,
                spec: PersistentVolumeClaimSpec {
                    access_modes: Some(vec![self.access_mode.clone().into_owned()]),
                    storage_class_name: self.storage_class.clone(),
                    resources: self.size.as_ref().map(|size| VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_owned(),
                            K8sQuantity(size.clone()),
                        )])),
                        limits: None,
                    }),
                    ..Default::default()
                },
            }),
        }
    }
}
