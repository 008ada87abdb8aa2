//! Which audited sources made a decision what it is: under `mode: audit` the pod is also
//! decided with its audited requests, and what that would-be decision does is credited to the
//! sources that caused it — the volumes it would inject, the requests it would be refused
//! for — never to an audited rule beside them that would only have injected.

use super::request::{self, Request};
use crate::config::Config;

/// The audited sources found to have made a decision, each once, in the order found.
#[derive(Default)]
pub(super) struct Blame(pub(super) Vec<String>);

impl Blame {
    pub(super) fn add(&mut self, source: Option<&String>) {
        if let Some(s) = source
            && !self.0.contains(s)
        {
            self.0.push(s.clone());
        }
    }
}

/// What audits each of a decision's requests, by position and by volume name; empty when
/// nothing is credited (the enforced decision, or a configuration that audits nothing).
pub(super) struct Sources<'a> {
    names: Vec<&'a str>,
    audits: Vec<Option<String>>,
}

impl<'a> Sources<'a> {
    pub(super) fn of(cfg: &Config, credited: bool, requests: &[Request<'a>]) -> Self {
        if !credited {
            return Sources {
                names: Vec::new(),
                audits: Vec::new(),
            };
        }
        Sources {
            names: requests.iter().map(|r| r.name).collect(),
            audits: requests
                .iter()
                .map(|r| request::audit_source(cfg, r))
                .collect(),
        }
    }

    /// The request at `i` made it.
    pub(super) fn at(&self, i: usize, blame: &mut Blame) {
        blame.add(self.audits.get(i).and_then(Option::as_ref));
    }

    /// The volume of this name made it.
    pub(super) fn named(&self, name: &str, blame: &mut Blame) {
        if let Some(i) = self.names.iter().position(|n| *n == name) {
            self.at(i, blame);
        }
    }

    /// The pod as a whole made it (a bound, a count, the namespace): every audited request.
    pub(super) fn all(&self, blame: &mut Blame) {
        for s in &self.audits {
            blame.add(s.as_ref());
        }
    }
}
