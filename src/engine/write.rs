//! The plan → a JSON Patch. Knows nothing of policy: it writes what the plan says, in a fixed
//! order (volumes, then mounts, then variables, then annotations), adding whole arrays where
//! the pod has none and appending (`/-`) where it has one.

use serde::Serialize;

use super::plan::{Additions, Metadata, Plan, annotation_map};
use crate::{
    decision::{Denial, DenyReason},
    patch::{MetadataWith, Patch},
};

/// Writes the plan for the pod at `pointer` in the patched object.
pub(super) fn write(pointer: &str, plan: &Plan) -> Result<Patch, Denial> {
    let mut patch = Patch::with_capacity(512 * plan.volumes.items.len() + 256);
    add_all(
        &mut patch,
        &format!("{pointer}/spec/volumes"),
        &plan.volumes,
    )?;
    let container = |c: &super::plan::ContainerChanges, leaf: &str| {
        format!("{pointer}/spec/{}/{}/{leaf}", c.list.field(), c.index)
    };
    for c in &plan.containers {
        add_all(&mut patch, &container(c, "volumeMounts"), &c.mounts)?;
    }
    for c in &plan.containers {
        add_all(&mut patch, &container(c, "env"), &c.env)?;
    }
    if !plan.annotations.is_empty() {
        let metadata = format!("{pointer}/metadata");
        let all = annotation_map(&plan.annotations);
        match plan.metadata {
            Metadata::Missing => add(&mut patch, &metadata, &MetadataWith { annotations: &all }),
            Metadata::NoAnnotations => add(&mut patch, &format!("{metadata}/annotations"), &all),
            Metadata::Annotations => plan.annotations.iter().try_for_each(|a| {
                add(
                    &mut patch,
                    &format!("{metadata}/annotations/{}", a.token),
                    &a.value,
                )
            }),
        }?;
    }
    Ok(patch)
}

/// The items of an array: the whole array when it is missing, else one append each.
fn add_all<T: Serialize>(
    patch: &mut Patch,
    path: &str,
    additions: &Additions<T>,
) -> Result<(), Denial> {
    match (additions.items.as_slice(), additions.exists) {
        ([], _) => Ok(()),
        (items, true) => {
            let append = format!("{path}/-");
            items.iter().try_for_each(|item| add(patch, &append, item))
        }
        (items, false) => add(patch, path, items),
    }
}

/// Serialising the patch cannot fail for these types; should it, the pod is refused.
fn add<T: Serialize + ?Sized>(patch: &mut Patch, path: &str, value: &T) -> Result<(), Denial> {
    patch.add(path, value).map_err(|e| {
        Denial::new(
            DenyReason::Invalid,
            format!("the patch could not be written: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::{
        engine::plan::{Additions, Annotation, ContainerChanges, ContainerList},
        patch::{EnvVar, Volume, VolumeMount},
        volume::VolumeKind,
    };

    fn plan(exists: bool, metadata: Metadata) -> Plan {
        let source = serde_json::value::to_raw_value(&json!({"sizeLimit": "1Gi"})).unwrap();
        let additions = |items| Additions { exists, items };
        Plan {
            volumes: additions(vec![Volume {
                name: "s".into(),
                kind: VolumeKind::EmptyDir,
                source,
            }]),
            containers: vec![ContainerChanges {
                list: ContainerList::InitContainers,
                index: 1,
                mounts: Additions {
                    exists,
                    items: vec![VolumeMount {
                        mount_path: "/s".into(),
                        name: "s".into(),
                        read_only: None,
                        sub_path: None,
                    }],
                },
                env: Additions {
                    exists,
                    items: vec![EnvVar {
                        name: "TMPDIR".into(),
                        value: "/s".into(),
                    }],
                },
            }],
            metadata,
            annotations: ["a/x", "a/y"]
                .map(|key| Annotation {
                    key: key.into(),
                    token: key.replace('/', "~1"),
                    value: "v".into(),
                })
                .into(),
            injected: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn ops(plan: &Plan) -> Vec<(String, Value)> {
        let patch: Value =
            serde_json::from_slice(write("/spec/template", plan).unwrap().as_bytes()).unwrap();
        patch
            .as_array()
            .unwrap()
            .iter()
            .map(|op| (op["path"].as_str().unwrap().to_owned(), op["value"].clone()))
            .collect()
    }

    #[test]
    fn missing_arrays_are_written_whole_in_order() {
        let got = ops(&plan(false, Metadata::Missing));
        let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/spec/template/spec/volumes",
                "/spec/template/spec/initContainers/1/volumeMounts",
                "/spec/template/spec/initContainers/1/env",
                "/spec/template/metadata",
            ]
        );
        assert_eq!(
            got[0].1,
            json!([{"emptyDir": {"sizeLimit": "1Gi"}, "name": "s"}])
        );
        assert_eq!(got[3].1, json!({"annotations": {"a/x": "v", "a/y": "v"}}));
    }

    #[test]
    fn existing_arrays_are_appended_to_and_annotations_set_one_by_one() {
        let got = ops(&plan(true, Metadata::Annotations));
        let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/spec/template/spec/volumes/-",
                "/spec/template/spec/initContainers/1/volumeMounts/-",
                "/spec/template/spec/initContainers/1/env/-",
                "/spec/template/metadata/annotations/a~1x",
                "/spec/template/metadata/annotations/a~1y",
            ]
        );
        assert_eq!(got[2].1, json!({"name": "TMPDIR", "value": "/s"}));
        let no_annotations = ops(&plan(true, Metadata::NoAnnotations));
        assert_eq!(
            no_annotations.last().unwrap(),
            &(
                "/spec/template/metadata/annotations".to_owned(),
                json!({"a/x": "v", "a/y": "v"})
            )
        );
    }
}
