//! What the webhook decided for one pod: one of four outcomes, and why a pod is refused. The
//! status code, the Kubernetes status reason and the metric label of each are defined here once.

use crate::{echo, patch::Patch, volume::VolumeKind};

/// Why a pod was refused (or, under `onError: warn`, admitted unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DenyReason {
    /// The annotation or rule entry cannot be understood (400).
    Invalid,
    /// Understood, but the cluster policy forbids it (403).
    Policy,
    /// Legal on its own, but clashes with the pod (422).
    Conflict,
    /// The cluster cannot provide the volume: no such CSIDriver or StorageClass (422).
    Cluster,
}

impl DenyReason {
    /// Every reason (the metrics start each at 0).
    pub const ALL: [DenyReason; 4] = [
        DenyReason::Invalid,
        DenyReason::Policy,
        DenyReason::Conflict,
        DenyReason::Cluster,
    ];

    /// The `status.code` of the AdmissionReview (an HTTP status code).
    pub fn code(self) -> u16 {
        match self {
            DenyReason::Invalid => 400,
            DenyReason::Policy => 403,
            DenyReason::Conflict | DenyReason::Cluster => 422,
        }
    }

    /// The `status.reason` of the AdmissionReview (a Kubernetes StatusReason).
    pub fn status_reason(self) -> &'static str {
        match self {
            DenyReason::Invalid => "BadRequest",
            DenyReason::Policy => "Forbidden",
            DenyReason::Conflict | DenyReason::Cluster => "Invalid",
        }
    }

    /// The reason's name in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::Invalid => "invalid",
            DenyReason::Policy => "policy",
            DenyReason::Conflict => "conflict",
            DenyReason::Cluster => "cluster",
        }
    }
}

/// A refusal: its reason and a message naming the annotation (or rule) and the field.
#[derive(Debug, Clone, PartialEq)]
pub struct Denial {
    /// Which kind of refusal: it sets the status code, the status reason and the metric label.
    pub reason: DenyReason,
    /// The message for the user: the annotation or rule, the field, and what is wrong.
    pub message: String,
}

impl Denial {
    /// A denial for this reason.
    pub fn new(reason: DenyReason, message: impl Into<String>) -> Denial {
        Denial {
            reason,
            message: message.into(),
        }
    }

    /// The annotation or rule entry cannot be understood.
    pub fn invalid(message: impl Into<String>) -> Denial {
        Denial::new(DenyReason::Invalid, message)
    }

    /// The cluster policy forbids it.
    pub fn policy(message: impl Into<String>) -> Denial {
        Denial::new(DenyReason::Policy, message)
    }

    /// It clashes with the pod.
    pub fn conflict(message: impl Into<String>) -> Denial {
        Denial::new(DenyReason::Conflict, message)
    }

    /// The same refusal, said of `place` (an annotation, a rule entry, a volume): the message
    /// becomes `place: message`.
    pub fn at(self, place: impl std::fmt::Display) -> Denial {
        Denial {
            reason: self.reason,
            message: format!("{place}: {}", self.message),
        }
    }

    /// The status code of the reason.
    pub fn code(&self) -> u16 {
        self.reason.code()
    }
}

/// What the engine decided for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing to do: the pod asked for nothing, is not a pod, or has everything already.
    Unchanged {
        /// Warnings for the user (e.g. a variable the pod already sets otherwise).
        warnings: Vec<String>,
    },
    /// A patch adds volumes, mounts, variables and the record annotation.
    Mutated {
        /// The JSON Patch, never empty.
        patch: Patch,
        /// The volumes this pass adds, with their kind.
        injected: Vec<(String, VolumeKind)>,
        /// Warnings for the user.
        warnings: Vec<String>,
    },
    /// The pod is refused (`onError: deny`).
    Denied(Denial),
    /// `onError: warn`: the pod could not be served and is admitted without its volumes, with
    /// the status annotation (already there when the API server calls again: an empty patch).
    AdmittedDespiteError {
        /// What could not be done.
        denial: Denial,
        /// The status annotation, or nothing when it is already set.
        patch: Patch,
        /// The warning that says so.
        warnings: Vec<String>,
    },
}

impl Decision {
    /// More warnings for an admitted pod (a refusal carries its message only).
    pub fn add_warnings(&mut self, more: Vec<String>) {
        match self {
            Decision::Unchanged { warnings }
            | Decision::Mutated { warnings, .. }
            | Decision::AdmittedDespiteError { warnings, .. } => warnings.extend(more),
            Decision::Denied(_) => {}
        }
    }

    /// Every warning with its [unsafe](echo::is_unsafe) characters escaped.
    pub fn printable_warnings(&mut self) {
        let (Decision::Unchanged { warnings }
        | Decision::Mutated { warnings, .. }
        | Decision::AdmittedDespiteError { warnings, .. }) = self
        else {
            return;
        };
        for w in warnings.iter_mut() {
            if let std::borrow::Cow::Owned(escaped) = echo::printable(w) {
                *w = escaped;
            }
        }
    }

    /// At most `max` warnings, the last of them saying how many more there were, each cut to
    /// [`echo::WARNING_LIMIT`] bytes (the API server shortens longer ones itself).
    pub fn bound_warnings(&mut self, max: usize) {
        let (Decision::Unchanged { warnings }
        | Decision::Mutated { warnings, .. }
        | Decision::AdmittedDespiteError { warnings, .. }) = self
        else {
            return;
        };
        if warnings.len() > max {
            let more = warnings.len() - (max - 1);
            warnings.truncate(max - 1);
            warnings.push(format!("… and {more} more warnings"));
        }
        for w in warnings.iter_mut() {
            if let std::borrow::Cow::Owned(cut) = echo::bounded(w, echo::WARNING_LIMIT) {
                *w = cut;
            }
        }
    }

    /// Whether the pod is admitted.
    pub fn allowed(&self) -> bool {
        !matches!(self, Decision::Denied(_))
    }

    /// The patch to return, if there is one.
    pub fn patch(&self) -> Option<&Patch> {
        match self {
            Decision::Mutated { patch, .. } | Decision::AdmittedDespiteError { patch, .. }
                if !patch.is_empty() =>
            {
                Some(patch)
            }
            _ => None,
        }
    }

    /// The warnings for the user.
    pub fn warnings(&self) -> &[String] {
        match self {
            Decision::Unchanged { warnings }
            | Decision::Mutated { warnings, .. }
            | Decision::AdmittedDespiteError { warnings, .. } => warnings,
            Decision::Denied(_) => &[],
        }
    }

    /// What went wrong, whether the pod was refused or admitted all the same.
    pub fn denial(&self) -> Option<&Denial> {
        match self {
            Decision::Denied(d) | Decision::AdmittedDespiteError { denial: d, .. } => Some(d),
            _ => None,
        }
    }

    /// The volumes added by this pass.
    pub fn injected(&self) -> &[(String, VolumeKind)] {
        match self {
            Decision::Mutated { injected, .. } => injected,
            _ => &[],
        }
    }

    /// The outcome's name in logs and metric labels.
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Unchanged { .. } => "unchanged",
            Decision::Mutated { .. } => "mutated",
            Decision::Denied(_) => "denied",
            Decision::AdmittedDespiteError { .. } => "admitted-on-error",
        }
    }
}
