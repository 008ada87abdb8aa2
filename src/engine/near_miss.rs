//! Keys that look meant for the webhook but that it does not read, said as hints (warnings):
//! the webhook would otherwise pass such a pod through in silence.

use super::bounds;
use crate::{config::Config, pod::PodView, validate};

/// Keys that look meant for the webhook but that it does not read, as hints: an annotation
/// whose prefix is a near miss of the configured one (`ephemeral-volume.io/scratch`), and a
/// label of the prefix (volumes are asked for with annotations).
pub fn near_misses(cfg: &Config, pod: &PodView) -> Vec<String> {
    let mut hints = Hints::new(cfg);
    for (key, value) in pod
        .annotations()
        .into_iter()
        .flatten()
        .map(|(k, v)| (&**k, &**v))
    {
        if hints.annotation(key, value).is_break() {
            break;
        }
    }
    let mut hints = hints.finish();
    let prefix = cfg.prefix.as_str();
    if pod.labels_mention(&cfg.prefix_search)
        && let Ok(labels) = pod.labels()
    {
        for key in labels
            .keys()
            .filter(|k| k.split_once('/').is_some_and(|(p, _)| p == prefix))
            .take(bounds::MAX_WARNINGS)
        {
            hints.push(format!(
                "label {key} is not read: volumes are asked for with annotations; make it an annotation"
            ));
        }
    }
    hints
}

/// The hints of a pod's annotations, as they are read in key order.
struct Hints<'c, 'k> {
    cfg: &'c Config,
    prefix: &'c str,
    /// The webhook's own status domain (`injector.<prefix>`).
    status_prefix: &'c str,
    /// As `validate::closest` allows: one edit for a short prefix, two for a longer one.
    limit: usize,
    /// The last prefix looked at and whether it was a near miss: keys of one prefix (the
    /// usual way a misspelt prefix comes, once per volume) are measured once.
    last: Option<(&'k str, bool)>,
    /// How many prefixes were measured: at most [`bounds::MAX_PREFIXES_MEASURED`] in all.
    /// Hints are a courtesy, and a pod of thousands of keys of the prefix's length, each
    /// another, would otherwise cost a distance each.
    measured: usize,
    hints: Vec<String>,
    /// Hints past what a response carries, counted, not written.
    unwritten: usize,
}

impl<'c, 'k> Hints<'c, 'k> {
    fn new(cfg: &'c Config) -> Self {
        let prefix = cfg.prefix.as_str();
        Hints {
            cfg,
            prefix,
            status_prefix: cfg
                .injected
                .key
                .rsplit_once('/')
                .map_or("", |(status, _)| status),
            limit: if prefix.len() <= 4 { 1 } else { 2 },
            last: None,
            measured: 0,
            hints: Vec::new(),
            unwritten: 0,
        }
    }

    fn hint(&mut self, text: String) {
        if self.hints.len() >= bounds::MAX_WARNINGS {
            self.unwritten += 1;
        } else {
            self.hints.push(text);
        }
    }

    fn did_you_mean(&mut self, key: &str, name: &str) {
        let prefix = self.prefix;
        self.hint(format!(
            "annotation {key} is not read: the annotation prefix is {prefix}; did you mean {prefix}/{name}?"
        ));
    }

    /// One annotation; `Break` once no more prefixes may be measured.
    fn annotation(&mut self, key: &'k str, value: &str) -> std::ops::ControlFlow<()> {
        let prefix = self.prefix;
        let Some((other, name)) = validate::split_once_byte(key, b'/') else {
            // The prefix alone, or the prefix with another separator (`<prefix>.scratch`).
            if let Some(rest) = key.strip_prefix(prefix) {
                match rest.trim_start_matches(['.', '_', '-', ':']) {
                    "" => self.hint(format!(
                        "annotation {key} is not read: it names no volume; write {prefix}/<volume name>"
                    )),
                    name => self.did_you_mean(key, name),
                }
            }
            return std::ops::ControlFlow::Continue(());
        };
        if other == self.status_prefix {
            self.status(key, name, value);
        } else if other.len() < prefix.len()
            && prefix.starts_with(other)
            && prefix.as_bytes().get(other.len()) == Some(&b'.')
        {
            // The prefix without its domain (`ephemeral-volumes/scratch`).
            self.did_you_mean(key, name);
        } else {
            let near = match self.last {
                Some((seen, near)) if seen == other => near,
                _ if self.measured >= bounds::MAX_PREFIXES_MEASURED => {
                    return std::ops::ControlFlow::Break(());
                }
                _ => self.measure(other),
            };
            if near {
                self.did_you_mean(key, name);
            }
        }
        std::ops::ControlFlow::Continue(())
    }

    /// Whether `other` is a near miss of the prefix. A cheap length test first: most keys are
    /// nowhere near. Then the optimal string alignment distance (adjacent transpositions
    /// count once, as in `validate::closest`), which allocates three short rows where
    /// Damerau–Levenshtein builds a map and a matrix.
    fn measure(&mut self, other: &'k str) -> bool {
        self.measured += 1;
        let prefix = self.prefix;
        let near = other != prefix
            && other.len().abs_diff(prefix.len()) <= 2
            && (other.eq_ignore_ascii_case(prefix)
                || strsim::osa_distance(other, prefix) <= self.limit);
        self.last = Some((other, near));
        near
    }

    /// A key of the webhook's status domain given a volume request by hand (a value that
    /// reads as one: key=value pairs, a JSON object or a profile of the configuration).
    fn status(&mut self, key: &str, name: &str, value: &str) {
        let cfg = self.cfg;
        // Read only while warnings are still written: at most MAX_WARNINGS values.
        let asks = self.hints.len() < bounds::MAX_WARNINGS
            && value.len() <= bounds::MAX_VALUE_BYTES
            && ((value.contains('=') || value.trim_start().starts_with('{'))
                && value.parse::<crate::volume::VolumeRequest>().is_ok()
                || cfg.profiles.contains_key(value.trim()));
        let own = [
            cfg.injected.key.as_str(),
            cfg.error.key.as_str(),
            cfg.cluster_check.key.as_str(),
        ];
        if asks && !own.contains(&key) {
            let (status_prefix, prefix) = (self.status_prefix, self.prefix);
            self.hint(format!(
                "annotation {key} is not read: {status_prefix}/ is the webhook's own status; did you mean {prefix}/{name}?"
            ));
        }
    }

    fn finish(mut self) -> Vec<String> {
        if self.unwritten > 0 {
            self.hints.push(format!(
                "… and {} more annotations whose prefix is a near miss of {}",
                self.unwritten, self.prefix
            ));
        }
        self.hints
    }
}
