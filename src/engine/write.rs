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
    add_all(&mut patch, &format!("{pointer}/spec/volumes"), &plan.volumes)?;
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
