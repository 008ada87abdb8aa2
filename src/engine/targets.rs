//! Which containers get a volume's mount, and `size=request` (a size read from them).

use crate::{
    decision::Denial,
    echo::{self, quoted},
    pod::{ContainerView, PodView},
    quantity::Quantity,
    volume::InitTargets,
};

/// Which entries of one container list get the mount.
#[derive(Debug, Clone)]
pub(super) enum Targets {
    All,
    /// These, by position in the list: sorted, each once.
    Listed(Vec<usize>),
}

impl Targets {
    pub(super) fn contains(&self, i: usize) -> bool {
        match self {
            Targets::All => true,
            Targets::Listed(l) => l.binary_search(&i).is_ok(),
        }
    }

    /// How many entries of a list of `len` get the mount.
    pub(super) fn count(&self, len: usize) -> usize {
        match self {
            Targets::All => len,
            Targets::Listed(l) => l.len(),
        }
    }
}

/// The containers and init containers named by a request, each of which must be in the pod.
pub(super) fn find(
    pod: &PodView,
    containers: Option<&[String]>,
    init: Option<&InitTargets>,
) -> Result<(Targets, Targets), Denial> {
    // Every name missing at once, and what the pod has instead. Each name is one look-up in
    // the pod's index of the list, made once per review however many annotations ask.
    let positions = |init: bool, names: &[String], what: &str| {
        let mut found = Vec::with_capacity(names.len());
        let mut missing = Vec::new();
        for n in names {
            match pod.position(init, n) {
                Some(i) => found.push(i),
                None => missing.push(quoted(n)),
            }
        }
        if missing.is_empty() {
            found.sort_unstable();
            found.dedup();
            return Ok(found);
        }
        let list = if init {
            pod.init_containers()
        } else {
            pod.containers()
        };
        // Only the names a message shows are copied, however long the list.
        let present: Vec<&str> = list
            .iter()
            .take(echo::LIST_LIMIT)
            .map(|c| &*c.name)
            .collect();
        let has = match echo::list(&present) {
            None => format!("the pod has no {what}s"),
            Some(listed) if list.len() > present.len() => {
                format!(
                    "its {what}s: {listed} and {} more",
                    list.len() - present.len()
                )
            }
            Some(listed) => format!("its {what}s: {listed}"),
        };
        let missing = match missing.as_slice() {
            [one] => format!("{what} {one} is"),
            many => format!("{what}s {} are", echo::list(many).unwrap_or_default()),
        };
        Err(Denial::conflict(format!(
            "{missing} not in the pod ({has})"
        )))
    };
    let containers = match containers {
        Some(names) => Targets::Listed(positions(false, names, "container")?),
        None => Targets::All,
    };
    let init_containers = match init {
        None | Some(InitTargets::None) => Targets::Listed(Vec::new()),
        Some(InitTargets::All) => Targets::All,
        Some(InitTargets::Named(names)) => {
            Targets::Listed(positions(true, names, "init container")?)
        }
    };
    Ok((containers, init_containers))
}

/// `size=request`: the largest `ephemeral-storage` request of the targeted containers (what
/// Nextflow's `disk` directive sets), spelt as that container spells it (the first of equal
/// ones, containers before init containers). None of them having one is an error naming them.
pub(super) fn requested_size(
    pod: &PodView,
    containers: &Targets,
    init_containers: &Targets,
) -> Result<String, Denial> {
    let targeted: Vec<&ContainerView> = targeted(pod.containers(), containers)
        .chain(targeted(pod.init_containers(), init_containers))
        .collect();
    let mut largest: Option<(Quantity, &str)> = None;
    for c in &targeted {
        let request = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.ephemeral_storage.as_ref());
        if let Some(text) = request {
            let q = text
                .parse::<Quantity>()
                .map_err(|e| Denial::invalid(format!("size=request: container {}: {e}", c.name)))?;
            if largest.as_ref().is_none_or(|(l, _)| q > *l) {
                largest = Some((q, text));
            }
        }
    }
    match largest {
        Some((q, text)) if !q.is_zero() => Ok(text.to_owned()),
        _ => Err(Denial::invalid(format!(
            "size=request, but {} (set one, e.g. with Nextflow's disk directive, or give a size)",
            match targeted.as_slice() {
                [one] => format!("container {} has no ephemeral-storage request", one.name),
                many => format!(
                    "none of the containers {} has an ephemeral-storage request",
                    echo::list(&many.iter().map(|c| &*c.name).collect::<Vec<_>>())
                        .unwrap_or_default()
                ),
            }
        ))),
    }
}

fn targeted<'l, 'p>(
    list: &'l [ContainerView<'p>],
    targets: &'l Targets,
) -> impl Iterator<Item = &'l ContainerView<'p>> {
    list.iter()
        .enumerate()
        .filter(|(i, _)| targets.contains(*i))
        .map(|(_, c)| c)
}
