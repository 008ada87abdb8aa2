//! The cluster admin's limits (`policy` in the configuration), one check each. Each returns
//! the message; the caller says which annotation or rule it is about.

use crate::{
    config::Policy,
    quantity::Quantity,
    volume::{Medium, Source, VolumeKind},
};

/// `allowInline: false`: annotations may only name profiles.
pub(super) fn inline_allowed(policy: &Policy) -> Result<(), String> {
    if policy.allow_inline {
        Ok(())
    } else {
        Err("policy.allowInline is false: name one of the cluster's profiles".into())
    }
}

/// `types`: the kinds an annotation may ask for inline.
pub(super) fn kind_allowed(policy: &Policy, kind: VolumeKind) -> Result<(), String> {
    if policy.types.contains(&kind) {
        return Ok(());
    }
    let allowed: Vec<&str> = policy.types.iter().map(|k| k.as_str()).collect();
    Err(format!(
        "type {kind} is not allowed by policy.types ({})",
        allowed.join(", ")
    ))
}

/// `csiDrivers` and `storageClasses`: the drivers and classes an annotation may name inline.
pub(super) fn allowlists(policy: &Policy, source: &Source) -> Result<(), String> {
    if let (Some(allowed), Some(driver)) = (&policy.csi_drivers, source.csi_driver())
        && !allowed.iter().any(|d| d == driver)
    {
        return Err(format!(
            "CSI driver {driver:?} is not in policy.csiDrivers ({})",
            allowed.join(", ")
        ));
    }
    if let (Some(allowed), Source::Ephemeral(e)) = (&policy.storage_classes, source)
        && e.volume_claim_template.is_some()
    {
        match source.storage_class() {
            Some(sc) if allowed.iter().any(|a| a == sc) => {}
            Some(sc) => {
                return Err(format!(
                    "storage class {sc:?} is not in policy.storageClasses ({})",
                    allowed.join(", ")
                ));
            }
            None => {
                return Err(format!(
                    "a storage class is required by policy.storageClasses ({}); set storageClass",
                    allowed.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// `maxSize`: the cap for the volume's kind and medium. HugePages are sized by the pod's
/// hugepages resources: no disk or memory cap applies.
pub(super) fn max_size(
    policy: &Policy,
    kind: VolumeKind,
    medium: Medium,
    size: Option<Quantity>,
) -> Result<(), String> {
    let max = match (kind, medium) {
        (VolumeKind::EmptyDir, Medium::Memory) => policy.max_memory.map(|m| (m, "memory")),
        (VolumeKind::EmptyDir, Medium::Disk) => policy.max_empty_dir.map(|m| (m, "emptyDir")),
        (VolumeKind::Ephemeral, _) => policy.max_ephemeral.map(|m| (m, "ephemeral")),
        _ => None,
    };
    match (max, size) {
        (Some((max, field)), Some(size)) if size > max => Err(format!(
            "size {size} exceeds policy.maxSize.{field} ({max})"
        )),
        _ => Ok(()),
    }
}

/// `requireSizeLimit`: the size an emptyDir without one is given (not HugePages), if any.
pub(super) fn default_size<'p>(policy: &'p Policy, source: &Source) -> Option<(&'p str, Quantity)> {
    let unsized_disk_or_ram = matches!(source, Source::EmptyDir(e) if e.size_limit.is_none())
        && source.medium() != Medium::HugePages;
    (policy.require_size_limit && unsized_disk_or_ram).then_some((
        policy.default_size_limit_text.as_str(),
        policy.default_size_limit,
    ))
}

/// `maxVolumesPerPod`.
pub(super) fn volume_count(policy: &Policy, count: usize) -> Result<(), String> {
    match policy.max_volumes_per_pod {
        Some(max) if count > max => Err(format!(
            "{count} volumes requested, policy.maxVolumesPerPod allows {max}"
        )),
        _ => Ok(()),
    }
}
