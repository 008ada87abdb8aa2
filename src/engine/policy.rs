//! The cluster admin's limits (`policy` in the configuration), one check each. Each returns
//! a policy refusal; the caller says which annotation or rule it is about ([`Denial::at`]).

use crate::{
    config::Policy,
    decision::Denial,
    quantity::Quantity,
    volume::{Medium, Source, VolumeKind},
};

/// `allowInline: false`: annotations may only name profiles.
pub(super) fn inline_allowed(policy: &Policy) -> Result<(), Denial> {
    if policy.allow_inline {
        Ok(())
    } else {
        Err(Denial::policy(format!(
            "{}.allowInline is false: name one of the cluster's profiles",
            policy.origin
        )))
    }
}

/// `types`: the kinds an annotation may ask for inline.
pub(super) fn kind_allowed(policy: &Policy, kind: VolumeKind) -> Result<(), Denial> {
    if policy.types.contains(&kind) {
        return Ok(());
    }
    let allowed: Vec<&str> = policy.types.iter().map(|k| k.as_str()).collect();
    Err(Denial::policy(format!(
        "type {kind} is not allowed by {}.types ({})",
        policy.origin,
        allowed.join(", ")
    )))
}

/// `csiDrivers` and `storageClasses`: the drivers and classes an annotation may name inline.
pub(super) fn allowlists(policy: &Policy, source: &Source) -> Result<(), Denial> {
    if let (Some(allowed), Some(driver)) = (&policy.csi_drivers, source.csi_driver())
        && !allowed.iter().any(|d| d == driver)
    {
        return Err(Denial::policy(format!(
            "CSI driver {driver:?} is not in {}.csiDrivers ({})",
            policy.origin,
            allowed.join(", ")
        )));
    }
    let claim = match source {
        Source::Ephemeral(e) => e.volume_claim_template.is_some(),
        Source::Claim(_) => true,
        Source::EmptyDir(_) | Source::Csi(_) => false,
    };
    if let (Some(allowed), true) = (&policy.storage_classes, claim) {
        match source.storage_class() {
            Some(sc) if allowed.iter().any(|a| a == sc) => {}
            Some(sc) => {
                return Err(Denial::policy(format!(
                    "storage class {sc:?} is not in {}.storageClasses ({})",
                    policy.origin,
                    allowed.join(", ")
                )));
            }
            None => {
                return Err(Denial::policy(format!(
                    "a storage class is required by {}.storageClasses ({}); set storageClass",
                    policy.origin,
                    allowed.join(", ")
                )));
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
) -> Result<(), Denial> {
    let max = match (kind, medium) {
        (VolumeKind::EmptyDir, Medium::Memory) => policy.max_memory.map(|m| (m, "memory")),
        (VolumeKind::EmptyDir, Medium::Disk) => policy.max_empty_dir.map(|m| (m, "emptyDir")),
        (VolumeKind::Ephemeral, _) => policy.max_ephemeral.map(|m| (m, "ephemeral")),
        _ => None,
    };
    match (max, size) {
        (Some((max, field)), Some(size)) if size > max => Err(Denial::policy(format!(
            "size {size} exceeds {}.maxSize.{field} ({max})",
            policy.origin
        ))),
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
pub(super) fn volume_count(policy: &Policy, count: usize) -> Result<(), Denial> {
    match policy.max_volumes_per_pod {
        Some(max) if count > max => Err(Denial::policy(format!(
            "{count} volumes requested, {}.maxVolumesPerPod allows {max}",
            policy.origin
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::Requested;

    fn source(annotation: &str) -> Source {
        match annotation.parse::<crate::volume::VolumeRequest>() {
            Ok(r) => match r.source {
                Requested::Inline(s) => s,
                Requested::Profile(p) => panic!("{p} is a profile"),
            },
            Err(e) => panic!("{annotation}: {e}"),
        }
    }

    fn policy(yaml: &str) -> Policy {
        crate::config::Config::parse(&format!("policy: {yaml}"))
            .unwrap_or_else(|e| panic!("{yaml}: {e}"))
            .policy
    }

    #[test]
    fn allowlists_name_what_is_allowed() {
        let p = policy("{csiDrivers: [a.example.com], storageClasses: [gp3, io2]}");
        let csi = |d: &str| source(&format!("type=csi,driver={d},mountPath=/s"));
        assert_eq!(allowlists(&p, &csi("a.example.com")), Ok(()));
        assert_eq!(
            allowlists(&p, &csi("b.example.com")),
            Err(Denial::policy(
                r#"CSI driver "b.example.com" is not in policy.csiDrivers (a.example.com)"#
            ))
        );
        let pvc = |sc: &str| source(&format!("type=ephemeral,size=1Gi,mountPath=/s{sc}"));
        assert_eq!(allowlists(&p, &pvc(",storageClass=io2")), Ok(()));
        assert!(
            allowlists(&p, &pvc(",storageClass=st1"))
                .unwrap_err()
                .message
                .contains("\"st1\" is not in policy.storageClasses (gp3, io2)")
        );
        assert!(
            allowlists(&p, &pvc(""))
                .unwrap_err()
                .message
                .contains("a storage class is required")
        );
        // Without lists, everything goes.
        assert_eq!(
            allowlists(&Policy::default(), &csi("b.example.com")),
            Ok(())
        );
    }

    #[test]
    fn each_medium_has_its_own_cap_and_huge_pages_none() {
        let p = policy("{maxSize: {emptyDir: 10Gi, memory: 1Gi, ephemeral: 100Gi}}");
        let q = |s: &str| Some(s.parse::<Quantity>().unwrap());
        let cases = [
            (
                VolumeKind::EmptyDir,
                Medium::Disk,
                "11Gi",
                Some("policy.maxSize.emptyDir (10Gi)"),
            ),
            (VolumeKind::EmptyDir, Medium::Disk, "10Gi", None),
            (
                VolumeKind::EmptyDir,
                Medium::Memory,
                "2Gi",
                Some("policy.maxSize.memory (1Gi)"),
            ),
            (VolumeKind::EmptyDir, Medium::HugePages, "2Ti", None),
            (
                VolumeKind::Ephemeral,
                Medium::None,
                "1Ti",
                Some("policy.maxSize.ephemeral (100Gi)"),
            ),
            (VolumeKind::Csi, Medium::None, "1Ti", None),
        ];
        for (kind, medium, size, refused) in cases {
            let got = max_size(&p, kind, medium, q(size));
            match refused {
                Some(m) => assert!(
                    got.as_ref().is_err_and(|e| e.message.contains(m)),
                    "{kind} {medium:?} {size}: {got:?}"
                ),
                None => assert_eq!(got, Ok(()), "{kind} {medium:?} {size}"),
            }
        }
        assert_eq!(
            max_size(&p, VolumeKind::EmptyDir, Medium::Disk, None),
            Ok(())
        );
    }

    #[test]
    fn the_default_size_goes_to_unsized_disk_and_ram_only() {
        let p = policy("{requireSizeLimit: true, defaultSizeLimit: 5Gi}");
        let five = Some(("5Gi", "5Gi".parse().unwrap()));
        assert_eq!(
            default_size(&p, &source("type=emptyDir,mountPath=/s")),
            five
        );
        assert_eq!(
            default_size(&p, &source("type=emptyDir,medium=Memory,mountPath=/s")),
            five
        );
        assert_eq!(
            default_size(&p, &source("type=emptyDir,size=1Gi,mountPath=/s")),
            None
        );
        assert_eq!(
            default_size(&p, &source("type=emptyDir,medium=HugePages,mountPath=/s")),
            None
        );
        assert_eq!(
            default_size(&p, &source("type=ephemeral,size=1Gi,mountPath=/s")),
            None
        );
        assert_eq!(
            default_size(&Policy::default(), &source("type=emptyDir,mountPath=/s")),
            None
        );
    }

    #[test]
    fn inline_sources_types_and_counts() {
        let p = policy("{allowInline: false, types: [emptyDir], maxVolumesPerPod: 2}");
        assert!(
            inline_allowed(&p)
                .unwrap_err()
                .message
                .contains("allowInline is false")
        );
        assert_eq!(inline_allowed(&Policy::default()), Ok(()));
        assert_eq!(kind_allowed(&p, VolumeKind::EmptyDir), Ok(()));
        assert_eq!(
            kind_allowed(&p, VolumeKind::Csi),
            Err(Denial::policy(
                "type csi is not allowed by policy.types (emptyDir)"
            ))
        );
        assert_eq!(volume_count(&p, 2), Ok(()));
        assert_eq!(
            volume_count(&p, 3),
            Err(Denial::policy(
                "3 volumes requested, policy.maxVolumesPerPod allows 2"
            ))
        );
    }
}
