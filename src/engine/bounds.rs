//! The built-in bounds of one decision, each checked before the step whose work it caps, so
//! that what a review costs grows with its bytes and never with a product of two of its
//! parts (annotations × containers, names × names). A pod past one is refused (403) with a
//! message naming the bound; a pod that asks for nothing is never held to them.

use crate::decision::Denial;

/// The most volumes one pod may ask for, its annotations and the rules that match it
/// together, whatever `maxVolumesPerPod` says (which may only lower it). Counted before any
/// annotation is read.
pub const MAX_VOLUMES: usize = 64;

/// The longest value of one volume annotation read (the API server allows 256 KiB for all of a
/// pod's annotations together; a CSI volume's attributes are the longest a real one carries).
pub const MAX_VALUE_BYTES: usize = 16 * 1024;

/// The most operations one patch may have: the API server refuses a JSON patch of more
/// (413, "the number of operations in the JSON patch exceeds 10000").
pub const MAX_PATCH_OPERATIONS: usize = 10_000;

/// The most bytes one patch may have. The pod it patches must still fit in one etcd write
/// (1.5 MiB by default), so a patch past this is one the API server could not store.
pub const MAX_PATCH_BYTES: usize = 1024 * 1024;

/// The most warnings one response carries (the last says how many more there were): the API
/// server keeps 4 KiB of them.
pub const MAX_WARNINGS: usize = 16;

/// The most distinct annotation prefixes compared with the configured one for near-miss hints
/// (`ephemeral-volume.io/…`): a hint is a courtesy, and each comparison is an edit distance.
pub const MAX_PREFIXES_MEASURED: usize = 256;

/// More volume annotations than [`MAX_VOLUMES`]: refused before any is read.
pub(super) fn annotations(count: usize, prefix: &str) -> Result<(), Denial> {
    if count > MAX_VOLUMES {
        return Err(Denial::policy(format!(
            "{count} annotations {prefix}/*: a pod may ask for at most {MAX_VOLUMES} volumes"
        )));
    }
    Ok(())
}

/// An annotation value longer than [`MAX_VALUE_BYTES`]: refused before it is read.
pub(super) fn value(value: &str) -> Result<(), String> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "the value is {} bytes, more than the {MAX_VALUE_BYTES} a volume annotation may have",
            value.len()
        ));
    }
    Ok(())
}

/// The requests and rule volumes together, against [`MAX_VOLUMES`].
pub(super) fn volumes(count: usize) -> Result<(), Denial> {
    if count > MAX_VOLUMES {
        return Err(Denial::policy(format!(
            "{count} volumes requested (annotations and rules together): a pod may get at most {MAX_VOLUMES}"
        )));
    }
    Ok(())
}

/// What one patch operation costs beyond its value, at most: `{"op":"add","path":"<pointer>/
/// spec/initContainers/<index>/volumeMounts/-","value":…}`, with room to spare.
pub(super) fn per_operation(pointer: &str) -> usize {
    96 + pointer.len()
}

/// An upper bound of the patch a plan writes (operations, bytes), from each volume's own
/// (`Resolved::patch_cost`): checked before the plan sets each volume against each container
/// it goes to.
pub(super) fn patch(
    volumes: impl IntoIterator<Item = (usize, usize)>,
    per_op: usize,
) -> Result<(), Denial> {
    // The record and status annotations, and the arrays written whole.
    let (mut ops, mut bytes) = (8usize, 8 * per_op);
    for (o, b) in volumes {
        ops = ops.saturating_add(o);
        bytes = bytes.saturating_add(b);
    }
    if ops > MAX_PATCH_OPERATIONS {
        return Err(Denial::policy(format!(
            "the patch would have up to {ops} operations (volumes × the containers they go to), more than the {MAX_PATCH_OPERATIONS} the API server accepts; name the containers each volume goes to (containers=)"
        )));
    }
    if bytes > MAX_PATCH_BYTES {
        return Err(Denial::policy(format!(
            "the patch would be up to {bytes} bytes (volumes × the containers they go to), more than the {MAX_PATCH_BYTES} a patch may have"
        )));
    }
    Ok(())
}
