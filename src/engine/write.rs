//! The plan → a JSON Patch. Knows nothing of policy: it writes what the plan says, in a fixed
//! order (volumes, then mounts, then variables, then annotations), adding whole arrays where
//! the pod has none and appending (`/-`) where it has one.

use super::plan::{Additions, ContainerChanges, Metadata, Plan, annotation_map};
use crate::{
    decision::Denial,
    patch::{MetadataWith, Patch, PatchValue},
};

/// Writes the plan for the pod at `pointer` in the patched object.
pub(super) fn patch_of(pointer: &str, plan: &Plan) -> Result<Patch, Denial> {
    // Room for the usual patch (a Nextflow task's is ~720 bytes), grown for more.
    let mut patch = Patch::with_capacity(384 * plan.volumes.items.len() + 128);
    let mut path = Pointer::new(pointer);
    add_all(&mut patch, path.at("/spec/volumes"), &plan.volumes)?;
    for c in &plan.containers {
        add_all(&mut patch, path.container(c, "volumeMounts"), &c.mounts)?;
    }
    for c in &plan.containers {
        add_all(&mut patch, path.container(c, "env"), &c.env)?;
    }
    if !plan.annotations.is_empty() {
        let all = annotation_map(&plan.annotations);
        match plan.metadata {
            Metadata::Missing => add(
                &mut patch,
                path.at("/metadata"),
                &MetadataWith { annotations: &all },
            )?,
            Metadata::NoAnnotations => add(&mut patch, path.at("/metadata/annotations"), &all)?,
            Metadata::Annotations => {
                for a in &plan.annotations {
                    let at = path.at("/metadata/annotations/");
                    at.push_str(a.token);
                    add(&mut patch, at, &a.value)?;
                }
            }
        }
    }
    Ok(patch)
}

/// The JSON pointers of one patch, written in one buffer: the pod's pointer, then the rest.
struct Pointer {
    buf: String,
    base: usize,
}

impl Pointer {
    fn new(pod: &str) -> Pointer {
        let mut buf = String::with_capacity(pod.len() + 64);
        buf.push_str(pod);
        Pointer {
            base: buf.len(),
            buf,
        }
    }

    /// The pod's pointer followed by `rest`.
    fn at(&mut self, rest: &str) -> &mut String {
        self.buf.truncate(self.base);
        self.buf.push_str(rest);
        &mut self.buf
    }

    /// `/spec/<list>/<index>/<leaf>` of one container.
    fn container(&mut self, c: &ContainerChanges, leaf: &str) -> &mut String {
        let buf = self.at("/spec/");
        buf.push_str(c.list.field());
        buf.push('/');
        buf.push_str(itoa::Buffer::new().format(c.index));
        buf.push('/');
        buf.push_str(leaf);
        buf
    }
}

/// The items of an array at `path`: the whole array when it is missing, else one append
/// (`path` + `/-`) each.
fn add_all<T: PatchValue>(
    patch: &mut Patch,
    path: &mut String,
    additions: &Additions<T>,
) -> Result<(), Denial> {
    match (additions.items.as_slice(), additions.exists) {
        ([], _) => Ok(()),
        (items, true) => {
            path.push_str("/-");
            items.iter().try_for_each(|item| add(patch, path, item))
        }
        (items, false) => add(patch, path, items),
    }
}

/// Serialising the patch cannot fail for these types; should it, the pod is refused.
fn add<T: PatchValue + ?Sized>(patch: &mut Patch, path: &str, value: &T) -> Result<(), Denial> {
    patch
        .add(path, value)
        .map_err(|e| Denial::invalid(format!("the patch could not be written: {e}")))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::{
        engine::plan::{Annotation, ContainerList},
        patch::{EnvVar, Volume, VolumeMount},
        volume::VolumeKind,
    };

    fn plan(exists: bool, metadata: Metadata, source: &crate::volume::Json) -> Plan<'_> {
        let additions = |items| Additions { exists, items };
        Plan {
            volumes: additions(vec![Volume {
                name: "s",
                kind: VolumeKind::EmptyDir,
                source,
            }]),
            containers: vec![ContainerChanges {
                list: ContainerList::InitContainers,
                index: 1,
                mounts: Additions {
                    exists,
                    items: vec![VolumeMount {
                        mount_path: "/s",
                        name: "s",
                        read_only: None,
                        sub_path: None,
                    }],
                },
                env: Additions {
                    exists,
                    items: vec![EnvVar {
                        name: "TMPDIR",
                        value: "/s",
                    }],
                },
            }],
            metadata,
            annotations: [("a/x", "a~1x"), ("a/y", "a~1y")]
                .map(|(key, token)| Annotation {
                    key,
                    token,
                    value: "v".into(),
                })
                .into_iter()
                .collect(),
            injected: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn source() -> crate::volume::Json {
        crate::volume::Json::written(serde_json::to_vec(&json!({"sizeLimit": "1Gi"})).unwrap())
            .unwrap()
    }

    fn ops(plan: &Plan<'_>) -> Vec<(String, Value)> {
        let patch: Value =
            serde_json::from_slice(patch_of("/spec/template", plan).unwrap().as_bytes()).unwrap();
        patch
            .as_array()
            .unwrap()
            .iter()
            .map(|op| (op["path"].as_str().unwrap().to_owned(), op["value"].clone()))
            .collect()
    }

    #[test]
    fn missing_arrays_are_written_whole_in_order() {
        let got = ops(&plan(false, Metadata::Missing, &source()));
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
        let got = ops(&plan(true, Metadata::Annotations, &source()));
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
        let no_annotations = ops(&plan(true, Metadata::NoAnnotations, &source()));
        assert_eq!(
            no_annotations.last().unwrap(),
            &(
                "/spec/template/metadata/annotations".to_owned(),
                json!({"a/x": "v", "a/y": "v"})
            )
        );
    }
}
