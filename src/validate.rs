//! Validation shared by annotations, profiles and rules: what Kubernetes would refuse later
//! (names, paths, quantities, label keys), checked here so that the user hears it from us, with
//! the annotation or configuration key that carries it.

use std::{borrow::Cow, fmt};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{echo::quoted, quantity::Quantity};

/// Why a value was refused. The message names the field; the caller adds where the value came
/// from (the annotation key, or the place in the configuration file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// `Err(Invalid(msg))`.
pub fn bad<T>(msg: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid(msg.into()))
}

/// Every problem found in one value, in the order found, so that its author fixes all of them
/// in one try. Finished into one [`Invalid`] whose reasons are joined by `"; "`. At most
/// [`MAX_PROBLEMS`] are kept, the rest counted: a value of thousands of bad pairs costs no more
/// per byte than a good one.
#[derive(Debug, Default)]
pub struct Problems {
    reasons: Vec<String>,
    more: usize,
}

/// The most problems of one value that are said; the rest are counted.
pub const MAX_PROBLEMS: usize = 20;

impl Problems {
    /// Keeps the problem of `r`, if any; its value otherwise.
    pub fn check<T>(&mut self, r: Result<T, Invalid>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.push(e.0);
                None
            }
        }
    }

    /// Keeps one more problem.
    pub fn push(&mut self, reason: impl Into<String>) {
        if self.is_full() {
            self.more += 1;
        } else {
            self.reasons.push(reason.into());
        }
    }

    /// Keeps one more problem, its reason written only if it is to be said.
    pub fn push_with(&mut self, reason: impl FnOnce() -> String) {
        if self.is_full() {
            self.more += 1;
        } else {
            self.reasons.push(reason());
        }
    }

    /// Whether [`MAX_PROBLEMS`] are kept already (more are only counted).
    pub fn is_full(&self) -> bool {
        self.reasons.len() >= MAX_PROBLEMS
    }

    /// Whether no problem was found.
    pub fn is_empty(&self) -> bool {
        self.reasons.is_empty()
    }

    /// `value` when no problem was found, else every problem.
    pub fn finish<T>(mut self, value: T) -> Result<T, Invalid> {
        if self.reasons.is_empty() {
            return Ok(value);
        }
        if self.more > 0 {
            self.reasons
                .push(format!("and {} more problems", self.more));
        }
        Err(Invalid(self.reasons.join("; ")))
    }
}

/// The candidate `word` most likely misspells: the same but for case, or at most two edits away
/// (one for short words). `None` when nothing is that close.
pub fn closest<'c>(word: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    let lower = word.to_ascii_lowercase();
    let limit = if word.len() <= 4 { 1 } else { 2 };
    candidates
        .into_iter()
        .map(|c| {
            let d = if c.to_ascii_lowercase() == lower {
                0
            } else {
                strsim::damerau_levenshtein(word, c)
            };
            (d, c)
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Checks a JSON document without building it: well-formed, nested at most [`MAX_JSON_DEPTH`]
/// deep, and no object with a repeated key anywhere (serde_json keeps the last one silently,
/// which would make the JSON form laxer than key=value, where a repeated field is an error).
pub fn check_json(text: &str) -> Result<(), Invalid> {
    let checked: Result<NoDuplicates, _> = serde_json::from_str(text);
    match checked {
        Ok(NoDuplicates) => Ok(()),
        // Our own error (a repeated key, too deep): its message names where.
        Err(e) if e.is_data() => bad(without_position(&e.to_string()).to_owned()),
        Err(e) => bad(format!("invalid JSON: {e}")),
    }
}

/// Parses JSON as [`check_json`] checks it.
pub fn parse_json_strict(text: &str) -> Result<Value, Invalid> {
    check_json(text)?;
    serde_json::from_str(text).map_err(|e| Invalid(format!("invalid JSON: {e}")))
}

/// A serde_json message without the ` at line 1 column 7` it ends in.
pub(crate) fn without_position(message: &str) -> &str {
    message.split(" at line ").next().unwrap_or(message)
}

/// Walks a JSON document and fails on the first object with a repeated key, naming its path.
/// Keys are borrowed from the text; the path and the keys of the objects being read are two
/// stacks shared by the whole walk, and the path is written out only for the error: the walk's
/// work and memory are linear in the document, whatever its depth or the length of its keys.
pub struct NoDuplicates;

impl<'de> serde::Deserialize<'de> for NoDuplicates {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut walk = Walk::default();
        d.deserialize_any(DupVisitor { walk: &mut walk })
    }
}

/// One step of the path to a value: a key of an object, or a position in an array.
enum Step<K = String> {
    Key(K),
    Index(usize),
}

/// The path of `steps` as the error names it (`a.b[2].c`).
fn path_text<K: AsRef<str>>(steps: &[Step<K>]) -> String {
    let mut out = String::new();
    for step in steps {
        match step {
            Step::Key(k) if out.is_empty() => out.push_str(k.as_ref()),
            Step::Key(k) => {
                out.push('.');
                out.push_str(k.as_ref());
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The deepest a JSON value nests (objects and arrays): a Kubernetes volume source nests 8
/// deep at most (`ephemeral.volumeClaimTemplate.spec.selector.matchExpressions[0].values[0]`).
pub const MAX_JSON_DEPTH: usize = 16;

/// A key as the text has it: borrowed unless it has escapes.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
pub struct Key<'de>(Cow<'de, str>);

impl Key<'_> {
    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// The state of one [`NoDuplicates`] walk.
#[derive(Default)]
struct Walk<'de> {
    /// The steps to the value being read.
    path: Vec<Step<Cow<'de, str>>>,
    /// The keys read so far of every object being read, innermost last.
    keys: Vec<Key<'de>>,
}

impl Walk<'_> {
    /// An object or array here would nest past [`MAX_JSON_DEPTH`].
    fn too_deep<E: serde::de::Error>(&self) -> Result<(), E> {
        if self.path.len() >= MAX_JSON_DEPTH {
            return Err(E::custom(format!(
                "the JSON nests deeper than {MAX_JSON_DEPTH} levels (at {})",
                crate::echo::bounded(&path_text(&self.path), crate::echo::VALUE_LIMIT)
            )));
        }
        Ok(())
    }
}

struct DupVisitor<'w, 'de> {
    walk: &'w mut Walk<'de>,
}

impl<'de> serde::de::DeserializeSeed<'de> for DupVisitor<'_, 'de> {
    type Value = NoDuplicates;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for DupVisitor<'_, 'de> {
    type Value = NoDuplicates;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        self.walk.too_deep()?;
        let first = self.walk.keys.len();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            self.walk.path.push(Step::Key(key.0.clone()));
            self.walk.keys.push(key);
            map.next_value_seed(DupVisitor {
                walk: &mut *self.walk,
            })?;
            self.walk.path.pop();
        }
        // This object's keys, sorted in place: a repeated one is next to its twin.
        let keys = &mut self.walk.keys[first..];
        keys.sort_unstable();
        if let Some(twin) = keys.windows(2).find(|w| w[0] == w[1]) {
            let key = twin[0].0.clone();
            self.walk.path.push(Step::Key(key));
            return Err(serde::de::Error::custom(format!(
                "field {} is given twice",
                crate::echo::bounded(&path_text(&self.walk.path), crate::echo::VALUE_LIMIT)
            )));
        }
        self.walk.keys.truncate(first);
        Ok(NoDuplicates)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        self.walk.too_deep()?;
        let mut i = 0;
        loop {
            self.walk.path.push(Step::Index(i));
            let more = seq
                .next_element_seed(DupVisitor {
                    walk: &mut *self.walk,
                })?
                .is_some();
            self.walk.path.pop();
            if !more {
                return Ok(NoDuplicates);
            }
            i += 1;
        }
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(NoDuplicates)
    }
}

/// The most unknown fields one source names; the rest are counted.
pub const UNKNOWN_LIMIT: usize = crate::echo::LIST_LIMIT;

/// Deserializes a Kubernetes type and refuses any field the type does not know: k8s-openapi
/// ignores unknown fields, which would turn `sizeLimt` into a silently unlimited volume.
pub fn from_json_strict<T: DeserializeOwned>(field: &str, json: &Value) -> Result<T, Invalid> {
    strict(field, json)
}

/// [`from_json_strict`] on JSON text (checked by [`check_json`]): read as it is parsed, no tree.
pub fn from_text_strict<T: DeserializeOwned>(field: &str, text: &str) -> Result<T, Invalid> {
    strict(field, &mut serde_json::Deserializer::from_str(text))
}

/// Reads `T` from `d`, and names the fields `T` skipped (what k8s-openapi's types ignore is
/// what they do not know): each one's path from `field`, at most [`UNKNOWN_LIMIT`] of them.
fn strict<'de, T, D>(field: &str, d: D) -> Result<T, Invalid>
where
    T: serde::Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    let mut unknown = Vec::new();
    let mut more = 0usize;
    let typed: Result<T, _> = serde_ignored::deserialize(d, |path| {
        if unknown.len() < UNKNOWN_LIMIT {
            unknown.push(format!("unknown field {}", ignored_path(field, &path)));
        } else {
            more += 1;
        }
    });
    let typed =
        typed.map_err(|e| Invalid(format!("{field}: {}", without_position(&e.to_string()))))?;
    if unknown.is_empty() {
        return Ok(typed);
    }
    if more > 0 {
        unknown.push(format!("and {more} more unknown fields"));
    }
    bad(unknown.join("; "))
}

/// A path serde_ignored reports, from `field`, as the other errors name paths (`a.b[2].c`).
fn ignored_path(field: &str, path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => field.to_owned(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(field, parent)),
        Path::Map { parent, key } => format!(
            "{}.{}",
            ignored_path(field, parent),
            crate::echo::bounded(key, crate::echo::VALUE_LIMIT)
        ),
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_path(field, parent),
    }
}

/// A size to give a volume: a valid quantity above zero (a zero `sizeLimit` is no limit at
/// all to the kubelet, and the API server refuses a zero PVC request).
pub fn parse_size(field: &str, s: &str) -> Result<Quantity, Invalid> {
    let q = s.parse::<Quantity>().map_err(|e| {
        let near = crate::quantity::near_misses(s);
        match near.as_slice() {
            [] => Invalid(format!("{field}: {e}")),
            [one] => Invalid(format!("{field}: {e}; did you mean {one}?")),
            [decimal, binary, ..] => Invalid(format!(
                "{field}: {e}; did you mean {decimal} (powers of 1000) or {binary} (powers of 1024)?"
            )),
        }
    })?;
    if q.is_zero() {
        return bad(format!(
            "{field} {} is zero, which is no limit at all; give a size above zero",
            quoted(s)
        ));
    }
    Ok(q)
}

/// An absolute path below `/`, without `..`, `:` or NUL.
pub fn mount_path(p: &str) -> Result<(), Invalid> {
    if !p.starts_with('/') {
        return bad(format!("mountPath {} must be an absolute path", quoted(p)));
    }
    if path_parts(p).next().is_none() {
        return bad(format!(
            "mountPath {} is the container's root; mount the volume below it",
            quoted(p)
        ));
    }
    if has_dot_dot(p) {
        return bad(format!("mountPath {} must not contain '..'", quoted(p)));
    }
    if p.bytes().any(|b| b == 0 || b == b':') {
        return bad(format!(
            "mountPath {} must not contain ':' or NUL",
            quoted(p)
        ));
    }
    Ok(())
}

/// One spelling per path: `//` and `/./` collapsed, no trailing `/` (`/scratch//a/./` is
/// `/scratch/a`). Mount paths are written and compared in this form; a path already in it (as
/// nearly all are) is returned as it is.
pub fn normalize_path(p: &str) -> Cow<'_, str> {
    let normal = match p.strip_prefix('/') {
        Some("") => true,
        Some(rest) => split_byte(rest, b'/').all(|part| !part.is_empty() && part != "."),
        None => false,
    };
    if normal {
        return Cow::Borrowed(p);
    }
    let mut out = String::with_capacity(p.len());
    for part in path_parts(p) {
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    Cow::Owned(out)
}

/// Whether two paths are one in [`normalize_path`]'s spelling (compared part by part, without
/// writing either out: the engine compares every mount of a pod with each volume it adds).
pub fn same_path(a: &str, b: &str) -> bool {
    a == b || path_parts(a).eq(path_parts(b))
}

fn path_parts(p: &str) -> impl Iterator<Item = &str> {
    split_byte(p, b'/').filter(|part| !part.is_empty() && *part != ".")
}

/// Whether a `..` path element occurs (a plain byte scan first: most paths have no `..`).
fn has_dot_dot(p: &str) -> bool {
    p.as_bytes().windows(2).any(|w| w == b"..") && split_byte(p, b'/').any(|part| part == "..")
}

/// `s.trim()`, without its search for Unicode whitespace when both ends are visible ASCII
/// (every annotation written in practice): `str::trim` decodes each end's character and looks
/// it up, ~50 instructions a call, and an annotation's parse trims each key and value twice.
pub fn trim(s: &str) -> &str {
    match s.as_bytes() {
        [first, .., last] if first.is_ascii_graphic() && last.is_ascii_graphic() => s,
        [only] if only.is_ascii_graphic() => s,
        _ => s.trim(),
    }
}

/// `s.split(sep)` for an ASCII separator, found by a plain byte loop: the values split here
/// (annotations, paths, names) are short, where `str::split`'s `memchr` search costs more to
/// set up than it saves (~300 instructions a call, measured with `benches/instructions.py`).
pub fn split_byte(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    debug_assert!(sep.is_ascii());
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let r = rest?;
        Some(match split_once_byte(r, sep) {
            Some((part, tail)) => {
                rest = Some(tail);
                part
            }
            None => {
                rest = None;
                r
            }
        })
    })
}

/// `s.split_once(sep)` for an ASCII separator (see [`split_byte`]).
pub fn split_once_byte(s: &str, sep: u8) -> Option<(&str, &str)> {
    debug_assert!(sep.is_ascii());
    // An ASCII byte is never inside a multi-byte character: both sides are whole characters.
    let i = s.bytes().position(|b| b == sep)?;
    Some((s.get(..i)?, s.get(i + 1..)?))
}

/// A relative path without `..`.
pub fn sub_path(p: &str) -> Result<(), Invalid> {
    if p.starts_with('/') {
        return bad(format!("subPath {} must be a relative path", quoted(p)));
    }
    if has_dot_dot(p) {
        return bad(format!("subPath {} must not contain '..'", quoted(p)));
    }
    Ok(())
}

/// DNS-1123 label: what Kubernetes requires of volume and container names.
pub fn dns_label(what: &str, s: &str) -> Result<(), Invalid> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        bad(format!(
            "{what} {} is not a DNS-1123 label (lowercase letters, digits and '-', at most 63, starting and ending alphanumeric)",
            quoted(s)
        ))
    }
}

/// A DNS-1123 subdomain (CSI driver, storage class and profile names).
pub fn dns_subdomain(what: &str, s: &str) -> Result<(), Invalid> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && split_byte(s, b'.').all(|part| dns_label(what, part).is_ok());
    if ok {
        Ok(())
    } else {
        bad(format!(
            "{what} {} is not a valid DNS-1123 subdomain",
            quoted(s)
        ))
    }
}

/// A PVC template may carry labels and annotations only (the API server refuses the rest of
/// ObjectMeta there), each a valid Kubernetes key and label value.
pub fn template_metadata(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<(), Invalid> {
    let at = "ephemeral.volumeClaimTemplate.metadata";
    let mut rest = serde_json::to_value(meta).map_err(|e| Invalid(format!("{at}: {e}")))?;
    if let Value::Object(fields) = &mut rest {
        fields.remove("labels");
        fields.remove("annotations");
        if let Some(field) = fields.keys().next() {
            return bad(format!(
                "{at}.{field} cannot be set for an ephemeral volume (only labels and annotations)"
            ));
        }
    }
    for (k, v) in meta.labels.iter().flatten() {
        qualified_name(&format!("{at}.labels"), k)?;
        let ok = v.is_empty()
            || (v.len() <= 63
                && v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric())
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')));
        if !ok {
            return bad(format!("{at}.labels.{k}: {v:?} is not a valid label value"));
        }
    }
    for k in meta.annotations.iter().flatten().map(|(k, _)| k) {
        qualified_name(&format!("{at}.annotations"), k)?;
    }
    Ok(())
}

/// A label or annotation key: an optional DNS subdomain prefix and `/`, then a name of at most
/// 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn qualified_name(at: &str, key: &str) -> Result<(), Invalid> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !name_ok || prefix.is_some_and(|p| dns_subdomain("prefix", p).is_err()) {
        return bad(format!("{at}: {key:?} is not a valid key"));
    }
    Ok(())
}

/// A profile name: a DNS-1123 subdomain.
pub fn profile_name(s: &str) -> Result<(), Invalid> {
    dns_subdomain("profile name", s)
}

/// An environment variable name Kubernetes accepts.
pub fn env_name(s: &str) -> Result<(), Invalid> {
    let mut bytes = s.bytes();
    let ok = matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_' || b == b'-' || b == b'.')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        bad(format!(
            "env name {} is not a valid environment variable name",
            quoted(s)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_read_to_sixteen_levels_and_refused_deeper_naming_where() {
        let nested = |depth: usize| format!("{}0{}", "[".repeat(depth), "]".repeat(depth));
        assert!(parse_json_strict(&nested(MAX_JSON_DEPTH)).is_ok());
        let deep = parse_json_strict(&format!(r#"{{"emptyDir": {{"x": {}}}}}"#, nested(40)));
        assert_eq!(
            deep,
            Err(Invalid(
                "the JSON nests deeper than 16 levels (at emptyDir.x[0][0][0][0][0][0][0][0][0][0][0][0][0][0])"
                    .into()
            ))
        );
    }

    #[test]
    fn a_repeated_key_is_named_by_its_path_however_long_the_document() {
        let long = "k".repeat(100_000);
        let text = format!(r#"{{"a": [{{"{long}": [0, 0]}}, {{"b": 1, "b": 2}}]}}"#);
        assert_eq!(
            parse_json_strict(&text),
            Err(Invalid("field a[1].b is given twice".into()))
        );
    }

    #[test]
    fn trim_is_strs_trim() {
        // Every character at either end, alone or around text: ASCII (control, space,
        // visible) and the Unicode whitespace `str::trim` removes (NEL, NBSP, the ideographic
        // space, …) next to other non-ASCII characters.
        let mut ends: Vec<char> = (0u8..=0x7f).map(char::from).collect();
        ends.extend([
            '\u{85}', '\u{a0}', '\u{1680}', '\u{2000}', '\u{200a}', '\u{2028}',
        ]);
        ends.extend(['\u{202f}', '\u{3000}', '\u{200b}', '\u{feff}', 'é', '日']);
        for a in &ends {
            for b in &ends {
                for mid in ["", "x", "a b", " \u{3000}"] {
                    let s = format!("{a}{mid}{b}");
                    assert_eq!(trim(&s), s.trim(), "{s:?}");
                }
            }
            let s = a.to_string();
            assert_eq!(trim(&s), s.trim(), "{s:?}");
        }
        assert_eq!(trim(""), "");
    }

    #[test]
    fn byte_splits_are_strs_splits() {
        let cases = [
            "",
            ",",
            ",,",
            "a",
            "a,b",
            ",a,",
            "type=emptyDir,size=1Gi",
            "é,ü=ß,,€",
            "a=b=c",
            "/scratch//a/./",
            "=",
            "ÿ,",
            "日本,語=",
        ];
        for s in cases {
            for sep in [b',', b'=', b'/'] {
                let c = char::from(sep);
                assert_eq!(
                    split_byte(s, sep).collect::<Vec<_>>(),
                    s.split(c).collect::<Vec<_>>(),
                    "{s:?} split at {c:?}"
                );
                assert_eq!(split_once_byte(s, sep), s.split_once(c), "{s:?} at {c:?}");
            }
        }
    }

    #[test]
    fn dot_dot_is_refused_only_as_a_whole_path_element() {
        assert!(mount_path("/data/a..b/..c").is_ok());
        assert!(mount_path("/data/..").is_err());
        assert!(mount_path("/../x").is_err());
        assert!(sub_path("x/../y").is_err());
        assert!(sub_path("..").is_err());
        assert!(sub_path("a..").is_ok());
    }

    #[test]
    fn a_path_already_in_its_one_spelling_is_returned_as_it_is() {
        for (path, spelling) in [
            ("/", "/"),
            ("/scratch", "/scratch"),
            ("/scratch/a", "/scratch/a"),
            ("/a/.b/..", "/a/.b/.."),
            ("/scratch/", "/scratch"),
            ("/scratch//a/./", "/scratch/a"),
            ("//", "/"),
            ("/.", "/"),
            ("/./a", "/a"),
            ("scratch", "/scratch"),
            ("", "/"),
        ] {
            let got = normalize_path(path);
            assert_eq!(got, spelling, "{path:?}");
            assert_eq!(
                matches!(got, Cow::Borrowed(_)),
                path == spelling,
                "{path:?}"
            );
        }
    }

    #[test]
    fn paths_are_the_same_exactly_when_their_one_spelling_is() {
        let paths = [
            "/scratch",
            "/scratch/",
            "//scratch",
            "/./scratch/.",
            "/scratch/a",
            "/scratch//a/./",
            "/scratcha",
            "/",
            "//",
            "/.",
            "/scratch/a/b",
        ];
        for a in paths {
            for b in paths {
                assert_eq!(
                    same_path(a, b),
                    normalize_path(a) == normalize_path(b),
                    "{a:?} and {b:?}"
                );
            }
        }
        assert!(mount_path("/./").is_err(), "the root in another spelling");
        assert!(mount_path("/scratch").is_ok());
    }
}
