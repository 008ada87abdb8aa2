//! The annotation grammar: one annotation value → one [`VolumeRequest`].
//!
//! Three forms share one set of field names (`docs/annotations.md`):
//! a bare profile name, comma-separated `key=value` pairs, or a JSON object. Both structured
//! forms go through the same field dispatcher, so a field means the same thing in either.

mod hints;

use std::{collections::BTreeMap, str::FromStr};

pub use self::hints::FIELD_NAMES;
use self::hints::{
    colon_pairs, comma_separated, intended_field, is_field, suggestion, unknown_field, unquoted,
};

use serde::de::IgnoredAny;
use serde_json::{Value, value::RawValue};

use crate::{
    echo::quoted,
    validate::{
        self, Invalid, Problems, bad, from_text_strict, parse_size, split_byte, split_once_byte,
        trim,
    },
    volume::{InitTargets, Mount, Requested, Source, VolumeKind, VolumeRequest, Written},
};

impl FromStr for VolumeRequest {
    type Err = Invalid;

    /// Parses an annotation value in any of the three forms; every problem at once.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        VolumeRequest::parse(value).map_err(|u| u.error)
    }
}

/// An annotation value that could not be read: every problem, and the mount fields that could
/// be read all the same (the checks against the pod run on them, so that a misspelt container
/// is said in the same answer).
pub struct Unreadable {
    /// Every problem of the value.
    pub error: Invalid,
    /// What could be read of the mount.
    pub mount: Box<Mount>,
}

impl VolumeRequest {
    /// Parses an annotation value (as [`FromStr`]), keeping what could be read of its mount
    /// when it cannot be read whole.
    pub fn parse(value: &str) -> Result<VolumeRequest, Unreadable> {
        let mut request = VolumeRequest::placeholder();
        match request.read(value) {
            Ok(()) => Ok(request),
            Err(error) => Err(Unreadable {
                error,
                mount: Box::new(request.mount),
            }),
        }
    }

    /// Reads an annotation value into this request, a field at a time; on an error it holds
    /// what could be read.
    fn read(&mut self, value: &str) -> Result<(), Invalid> {
        let trimmed = trim(value);
        if trimmed.is_empty() {
            return bad(
                "the value is empty; give a profile name, key=value pairs or a JSON object",
            );
        }
        if trimmed.starts_with('{') {
            return self.read_json(trimmed);
        }
        // A value refused as written may be one of two slips that hide every other problem:
        // then the hint is the fix (checked, as every suggestion is).
        self.read_text(trimmed).map_err(|e| {
            let shown = || quoted(&crate::echo::without_attributes(trimmed));
            if let Some(inner) = unquoted(trimmed) {
                Invalid(suggestion(
                    &format!(
                        "the value {} is wrapped in quotes, which are kept as part of it (a \
                         quoted string inside the annotation's own quotes); write it without them",
                        shown()
                    ),
                    inner,
                ))
            } else if let Some(fixed) = comma_separated(trimmed) {
                // The value as written is not quoted: split at its `;`, a CSI attribute's
                // value could not be told from the pair after it.
                Invalid(suggestion(
                    "pairs are separated by commas, not by semicolons or spaces",
                    &fixed,
                ))
            } else {
                e
            }
        })
    }

    /// A profile name or `key=value` pairs, trimmed.
    fn read_text(&mut self, trimmed: &str) -> Result<(), Invalid> {
        if !trimmed.bytes().any(|b| b == b'=') {
            if let Some(fixed) = colon_pairs(trimmed) {
                return bad(suggestion(
                    &format!(
                        "{} looks like key:value pairs (or a Groovy map written as a string); \
                         write key=value pairs separated by commas",
                        quoted(&crate::echo::without_attributes(trimmed))
                    ),
                    &fixed,
                ));
            }
            validate::profile_name(trimmed)?;
            *self = VolumeRequest::profile(trimmed);
            return Ok(());
        }
        let mut raw = WrittenFields::default();
        let mut problems = Problems::default();
        for pair in split_byte(trimmed, b',') {
            let pair = trim(pair);
            if pair.is_empty() {
                continue;
            }
            match split_once_byte(pair, b'=') {
                Some((key, val)) => raw.read_field(trim(key), FieldValue::Text(trim(val)), &mut problems),
                None => problems.push(match colon_pairs(pair) {
                    Some(fixed) => format!(
                        "{} is not a key=value pair: did you mean {}?",
                        quoted(&crate::echo::without_attributes(pair)),
                        crate::echo::without_attributes(&fixed)
                    ),
                    None => format!(
                        "{} is not a key=value pair (values cannot contain commas; use the JSON form)",
                        quoted(&crate::echo::without_attributes(pair))
                    ),
                }),
            }
        }
        raw.build(problems, self)
    }
}

impl VolumeRequest {
    /// The JSON form (also used for profiles and rule entries in the configuration file).
    pub fn from_json(json: &Value) -> Result<Self, Invalid> {
        let mut request = VolumeRequest::placeholder();
        match json {
            Value::Object(_) => request.read_json(&json.to_string())?,
            Value::Null => return bad("is empty: give the volume's fields (a mapping)"),
            other => {
                return bad(format!(
                    "expected the volume's fields (a mapping), not {}",
                    crate::echo::quoted(&other.to_string())
                ));
            }
        }
        Ok(request)
    }

    /// The JSON form (a JSON object's text) read into this request, where it lives (as
    /// [`VolumeRequest::read`]). Read as it is parsed, never as a tree: the text is checked
    /// once ([`validate::check_json`]), its fields are taken as raw text, and each source is
    /// read straight into its Kubernetes type.
    fn read_json(&mut self, text: &str) -> Result<(), Invalid> {
        validate::check_json(text)?;
        let fields: BTreeMap<validate::Key<'_>, &RawValue> =
            serde_json::from_str(text).map_err(|e| {
                Invalid(format!(
                    "expected the volume's fields (a JSON object): {}",
                    validate::without_position(&e.to_string())
                ))
            })?;
        let fields: Vec<(&str, JsonField<'_>)> = fields
            .iter()
            .map(|(key, raw)| (key.as_str(), JsonField::read(key.as_str(), raw)))
            .collect();
        let mut raw = WrittenFields::default();
        let mut problems = Problems::default();
        for (key, val) in &fields {
            raw.read_field(key, FieldValue::Json(val), &mut problems);
        }
        raw.build(problems, self)
    }
}

/// One field of the JSON form: its raw text, and what it was read as.
struct JsonField<'a> {
    raw: &'a RawValue,
    read: Read,
}

/// What a field of the JSON form holds, read as far as its field needs it.
enum Read {
    Text(String),
    Bool(bool),
    List(Vec<String>),
    /// A list of more than [`MAX_LIST_NAMES`] items (how many), not read.
    TooLong(usize),
    /// An object, left as text for its source to read into its type.
    Object,
    /// Anything else (a number, null, a list of anything but strings), or a field that is not
    /// one of the grammar's (refused by name, its value unread).
    Other,
}

impl<'a> JsonField<'a> {
    fn read(key: &str, raw: &'a RawValue) -> Self {
        let text = raw.get();
        let read = if !is_field(key) && intended_field(key).is_none() {
            Read::Other
        } else {
            match text.as_bytes().first() {
                Some(b'"') => serde_json::from_str(text).map_or(Read::Other, Read::Text),
                Some(b't' | b'f') => serde_json::from_str(text).map_or(Read::Other, Read::Bool),
                // Counted first (a list of zero-sized items allocates nothing), so that a list
                // past the bound is never read; one of anything but strings fails at its first
                // other element.
                Some(b'[') => match serde_json::from_str::<Vec<IgnoredAny>>(text) {
                    Ok(items) if items.len() > MAX_LIST_NAMES => Read::TooLong(items.len()),
                    _ => serde_json::from_str(text).map_or(Read::Other, Read::List),
                },
                Some(b'{') => Read::Object,
                _ => Read::Other,
            }
        };
        JsonField { raw, read }
    }

    /// The value as a message shows it: compact JSON, cut to [`crate::echo::VALUE_LIMIT`].
    fn shown(&self) -> String {
        let text = self.raw.get();
        // Re-read (to compact it) only when it is short: a long one is shown cut, as written.
        let compact = (text.len() <= crate::echo::VALUE_LIMIT)
            .then(|| serde_json::from_str::<Value>(text).ok())
            .flatten();
        match compact {
            Some(v) => v.to_string(),
            None => crate::echo::bounded(text, crate::echo::VALUE_LIMIT).into_owned(),
        }
    }
}

// === field dispatch ===

#[derive(Clone, Copy)]
enum FieldValue<'a> {
    Text(&'a str),
    Json(&'a JsonField<'a>),
}

impl<'a> FieldValue<'a> {
    /// The value, trimmed, borrowed from the annotation (or the JSON) it came from.
    fn string(&self, field: &str) -> Result<&'a str, Invalid> {
        match *self {
            FieldValue::Text(s) => non_empty(field, s),
            FieldValue::Json(JsonField {
                read: Read::Text(s),
                ..
            }) => non_empty(field, s),
            FieldValue::Json(other) => {
                bad(format!("{field} must be a string, not {}", other.shown()))
            }
        }
    }

    fn boolean(&self, field: &str) -> Result<bool, Invalid> {
        match *self {
            FieldValue::Text("true") => Ok(true),
            FieldValue::Text("false") => Ok(false),
            FieldValue::Text(s) => bad(format!("{field} must be true or false, not {}", quoted(s))),
            FieldValue::Json(v) => match &v.read {
                Read::Bool(b) => Ok(*b),
                Read::Text(s) if s == "true" || s == "false" => Ok(s == "true"),
                _ => bad(format!("{field} must be true or false, not {}", v.shown())),
            },
        }
    }

    /// `a;b;c` in key=value form, a list (or a `;`-separated string) in JSON.
    fn list(&self, field: &str) -> Result<Vec<String>, Invalid> {
        let items: Vec<String> = match *self {
            FieldValue::Text(s) => split_list(field, s)?,
            FieldValue::Json(v) => match &v.read {
                Read::Text(s) => split_list(field, s)?,
                Read::TooLong(count) => return too_long(field, *count),
                Read::List(items) => {
                    let mut names = Vec::with_capacity(items.len());
                    for item in items {
                        let name = trim(item);
                        if name.is_empty() {
                            return bad(format!(
                                "{field} must list non-empty strings, found {}",
                                quoted(item)
                            ));
                        }
                        names.push(name.to_owned());
                    }
                    names
                }
                _ if v.raw.get().starts_with('[') => {
                    return bad(format!(
                        "{field} must list non-empty strings, not {}",
                        v.shown()
                    ));
                }
                _ => {
                    return bad(format!(
                        "{field} must be a list of names, not {}",
                        v.shown()
                    ));
                }
            },
        };
        if items.is_empty() {
            return bad(format!("{field} is empty"));
        }
        Ok(items)
    }

    /// A JSON object's text.
    fn object(&self, field: &str) -> Result<&'a str, Invalid> {
        match *self {
            FieldValue::Json(JsonField {
                raw,
                read: Read::Object,
            }) => Ok(raw.get()),
            FieldValue::Json(v) => bad(format!("{field} must be a JSON object, not {}", v.shown())),
            FieldValue::Text(_) => bad(format!(
                "{field} needs the JSON form; in key=value form write type={field} with its shorthands"
            )),
        }
    }
}

/// The most names one list (`containers`, `initContainers`, `env`) may have: counted before
/// the list is read, so that a list costs no more per byte than the rest of a pod.
pub const MAX_LIST_NAMES: usize = 1024;

/// `a;b;c`, counted first against [`MAX_LIST_NAMES`].
fn split_list(field: &str, s: &str) -> Result<Vec<String>, Invalid> {
    let names = || split_byte(s, b';').map(trim).filter(|s| !s.is_empty());
    let count = names().count();
    if count > MAX_LIST_NAMES {
        return too_long(field, count);
    }
    Ok(names().map(str::to_owned).collect())
}

fn too_long<T>(field: &str, count: usize) -> Result<T, Invalid> {
    bad(format!(
        "{field} lists {count} names, more than the {MAX_LIST_NAMES} a list may have"
    ))
}

fn non_empty<'a>(field: &str, s: &'a str) -> Result<&'a str, Invalid> {
    let s = trim(s);
    if s.is_empty() {
        bad(format!("{field} is empty"))
    } else {
        Ok(s)
    }
}

/// Every field as written (borrowed from the value), before the combination is checked.
#[derive(Default)]
struct WrittenFields<'a> {
    profile: Option<&'a str>,
    kind: Option<VolumeKind>,
    empty_dir: Option<&'a str>,
    csi: Option<&'a str>,
    ephemeral: Option<&'a str>,
    size: Option<&'a str>,
    /// `size=request`, which fits every source but CSI (kept apart from the quantity shorthand).
    size_request: bool,
    medium: Option<&'a str>,
    storage_class: Option<&'a str>,
    access_mode: Option<&'a str>,
    driver: Option<&'a str>,
    fs_type: Option<&'a str>,
    attrs: BTreeMap<&'a str, &'a str>,
    mount_path: Option<&'a str>,
    read_only: Option<bool>,
    sub_path: Option<&'a str>,
    containers: Option<Vec<String>>,
    init_containers: Option<InitTargets>,
    env: Option<Vec<String>>,
    /// The shorthands written, in order: each source (see [`ShorthandsOf`]) refuses those it does not
    /// accept. Inline room for the two or three an annotation writes.
    shorthands: Vec<&'a str>,
    /// The fields given with a value that was refused: their absence is not reported again.
    failed: Vec<&'a str>,
    /// The fields set, in written order.
    given: Vec<&'a str>,
}

/// The sources whose shorthands are checked, and the shorthands each accepts.
#[derive(Clone, Copy)]
enum ShorthandsOf {
    Profile,
    EmptyDir,
    Csi,
    Ephemeral,
    Json,
}

impl ShorthandsOf {
    fn accepts(self, shorthand: &str) -> bool {
        match self {
            ShorthandsOf::Profile => shorthand == "size",
            ShorthandsOf::EmptyDir => matches!(shorthand, "size" | "medium"),
            ShorthandsOf::Csi => {
                matches!(shorthand, "driver" | "fsType") || shorthand.starts_with("attr.")
            }
            ShorthandsOf::Ephemeral => matches!(shorthand, "size" | "storageClass" | "accessMode"),
            ShorthandsOf::Json => false,
        }
    }
}

const FIELDS: &str = "profile, type, emptyDir, csi, ephemeral, size, medium, storageClass, \
                      accessMode, driver, fsType, attr.<key>, mountPath, readOnly, subPath, \
                      containers, initContainers, env";

fn put<T>(slot: &mut Option<T>, field: &str, value: T) -> Result<(), Invalid> {
    if slot.is_some() {
        return bad(format!("{field} is given twice"));
    }
    *slot = Some(value);
    Ok(())
}

impl<'a> WrittenFields<'a> {
    /// Remembers a shorthand, in written order.
    fn note_shorthand(&mut self, key: &'a str) {
        self.shorthands.push(key);
    }

    fn failed(&self, field: &str) -> bool {
        self.failed.contains(&field)
    }

    /// One field: set, or its problem recorded. A key that is not a field but certainly means
    /// one (`mountpath`, `sizee`) has its value checked as that field too, so that what is
    /// wrong with the value is said in the same answer as the misspelling.
    fn read_field(&mut self, key: &'a str, val: FieldValue<'a>, problems: &mut Problems) {
        if is_field(key) || key.starts_with("attr.") {
            match problems.check(self.set(key, val)) {
                Some(()) => self.given.push(key),
                None => self.failed.push(key),
            }
            return;
        }
        // Not a field: named (with what it means) while problems are still said, else counted.
        let counted_only = problems.is_full();
        problems.push_with(|| unknown_field(key));
        if counted_only {
            return;
        }
        if let Some(field) = intended_field(key) {
            if self.given.contains(&field) || self.failed.contains(&field) {
                return;
            }
            match problems.check(self.set(field, val)) {
                Some(()) => self.given.push(field),
                None => self.failed.push(field),
            }
        }
    }

    fn set(&mut self, key: &'a str, val: FieldValue<'a>) -> Result<(), Invalid> {
        if let Some(attr) = key.strip_prefix("attr.") {
            if attr.is_empty() {
                return bad("attr. needs a key, e.g. attr.secretProviderClass=vault-db");
            }
            let v = val.string(key)?;
            if self.attrs.insert(attr, v).is_some() {
                return bad(format!("{key} is given twice"));
            }
            self.note_shorthand(key);
            return Ok(());
        }
        if key == "size" && val.string(key)? == "request" {
            if self.size_request || self.size.is_some() {
                return bad("size is given twice");
            }
            self.size_request = true;
            return Ok(());
        }
        let shorthand = matches!(
            key,
            "size" | "medium" | "storageClass" | "accessMode" | "driver" | "fsType"
        );
        match key {
            "profile" => {
                let p = val.string(key)?;
                validate::profile_name(p)?;
                put(&mut self.profile, key, p)
            }
            "type" => {
                let t = val.string(key)?.parse()?;
                put(&mut self.kind, key, t)
            }
            "emptyDir" => put(&mut self.empty_dir, key, val.object(key)?),
            "csi" => put(&mut self.csi, key, val.object(key)?),
            "ephemeral" => put(&mut self.ephemeral, key, val.object(key)?),
            "size" if self.size_request => bad("size is given twice"),
            "size" => put(&mut self.size, key, val.string(key)?),
            "medium" => put(&mut self.medium, key, val.string(key)?),
            "storageClass" => put(&mut self.storage_class, key, val.string(key)?),
            "accessMode" => put(&mut self.access_mode, key, val.string(key)?),
            "driver" => put(&mut self.driver, key, val.string(key)?),
            "fsType" => put(&mut self.fs_type, key, val.string(key)?),
            "mountPath" => put(&mut self.mount_path, key, val.string(key)?),
            "readOnly" => put(&mut self.read_only, key, val.boolean(key)?),
            "subPath" => put(&mut self.sub_path, key, val.string(key)?),
            "containers" => put(&mut self.containers, key, val.list(key)?),
            "initContainers" => {
                let t = match val.boolean(key) {
                    Ok(true) => InitTargets::All,
                    Ok(false) => InitTargets::None,
                    Err(_) => InitTargets::Named(val.list(key).map_err(|_| {
                        Invalid(
                            "initContainers must be true, false or a list of init container names"
                                .into(),
                        )
                    })?),
                };
                put(&mut self.init_containers, key, t)
            }
            "env" => put(&mut self.env, key, val.list(key)?),
            _ => bad(unknown_field(key)),
        }?;
        if shorthand {
            self.note_shorthand(key);
        }
        Ok(())
    }

    /// The request, written into `out`, or every problem: those found while reading the
    /// fields, then the source's, then the mount's. (By reference: the ~260-byte `WrittenFields` is not
    /// copied into the call, and its lists are taken out; the request's fields are written
    /// where it lives.)
    fn build(&mut self, mut problems: Problems, out: &mut VolumeRequest) -> Result<(), Invalid> {
        let source = match self.one_source() {
            Ok(true) => self.source(&mut problems),
            // The one source given was refused, and said so.
            Ok(false) => None,
            Err(e) => {
                problems.push(e.0);
                None
            }
        };
        self.mount(&mut problems, &mut out.mount);
        match source {
            Some((source, size)) if problems.is_empty() => {
                out.source = source;
                out.size = size;
                out.size_from_request = self.size_request;
                Ok(())
            }
            _ => problems.finish(()).and_then(|()| bad("no volume source")),
        }
    }

    /// Exactly one of profile, type, emptyDir, csi, ephemeral (none is said only when no
    /// source was given at all, not when the one given was refused).
    fn one_source(&self) -> Result<bool, Invalid> {
        let given = [
            ("profile", self.profile.is_some()),
            ("type", self.kind.is_some()),
            ("emptyDir", self.empty_dir.is_some()),
            ("csi", self.csi.is_some()),
            ("ephemeral", self.ephemeral.is_some()),
        ];
        let refused = given.iter().any(|(n, _)| self.failed(n));
        match given.iter().filter(|(_, g)| *g).count() {
            0 if refused => Ok(false),
            0 => {
                bad("no volume source: give exactly one of profile, type, emptyDir, csi, ephemeral")
            }
            1 => Ok(true),
            _ => {
                let many: Vec<&str> = given.iter().filter_map(|(n, g)| g.then_some(*n)).collect();
                bad(format!(
                    "{} are given together; give exactly one volume source",
                    many.join(" and ")
                ))
            }
        }
    }

    /// The source (a profile with its size override, or a validated inline source), each
    /// shorthand written that does not apply to it refused.
    fn source(&self, problems: &mut Problems) -> Option<(Requested, Option<String>)> {
        if let Some(profile) = self.profile {
            self.only(ShorthandsOf::Profile, problems, || {
                format!("profile={profile}: a profile fixes the volume source")
            });
            if let Some(s) = self.size {
                problems.check(parse_size("size", s));
            }
            let size = self.size.map(str::to_owned);
            return Some((Requested::Profile(profile.to_owned()), size));
        }
        let (source, written) = if let Some(kind) = self.kind {
            (self.shorthand_source(kind, problems)?, Written::Shorthand)
        } else {
            self.only(ShorthandsOf::Json, problems, || {
                "a volume given as a JSON object; put it inside the object".to_owned()
            });
            let source = if let Some(v) = self.empty_dir {
                problems.check(from_text_strict("emptyDir", v).map(Source::EmptyDir))
            } else if let Some(v) = self.csi {
                problems.check(from_text_strict("csi", v).map(Source::Csi))
            } else if let Some(v) = self.ephemeral {
                problems
                    .check(from_text_strict("ephemeral", v).map(|e| Source::Ephemeral(Box::new(e))))
            } else {
                None
            };
            (source?, Written::Object)
        };
        if self.size_request && source.kind() == VolumeKind::Csi {
            problems.push("size=request does not apply to a CSI inline volume");
        }
        problems.check(source.validate(self.size_request, written));
        Some((Requested::Inline(source), None))
    }

    /// The mount fields, each checked, written into `out`; the mount path in its one spelling.
    fn mount(&mut self, problems: &mut Problems, out: &mut Mount) {
        if let Some(p) = self.mount_path {
            problems.check(validate::mount_path(p));
        }
        if let Some(p) = self.sub_path {
            problems.check(validate::sub_path(p));
        }
        for c in self.containers.iter().flatten() {
            problems.check(validate::dns_label("container name", c));
        }
        if let Some(InitTargets::Named(names)) = &self.init_containers {
            for c in names {
                problems.check(validate::dns_label("init container name", c));
            }
        }
        for e in self.env.iter().flatten() {
            problems.check(validate::env_name(e));
        }
        out.mount_path = self.mount_path.map(|p| validate::normalize_path(p).into());
        out.read_only = self.read_only;
        out.sub_path = self.sub_path.map(str::to_owned);
        out.containers = self.containers.take();
        out.init_containers = self.init_containers.take();
        out.env = self.env.take();
    }

    /// The source a `type=` shorthand describes, from the shorthand fields given with it.
    fn shorthand_source(&self, kind: VolumeKind, problems: &mut Problems) -> Option<Source> {
        Some(match kind {
            VolumeKind::EmptyDir => {
                self.only(ShorthandsOf::EmptyDir, problems, || {
                    "type=emptyDir".to_owned()
                });
                Source::empty_dir(self.medium, self.size)
            }
            VolumeKind::Csi => {
                self.only(ShorthandsOf::Csi, problems, || "type=csi".to_owned());
                let Some(driver) = self.driver else {
                    if !self.failed("driver") {
                        problems.push("type=csi needs driver=<CSI driver name>");
                    }
                    return None;
                };
                // readOnly on the annotation means both the mount and the volume.
                Source::csi(driver, self.fs_type, self.read_only, &self.attrs)
            }
            VolumeKind::Ephemeral => {
                self.only(ShorthandsOf::Ephemeral, problems, || {
                    "type=ephemeral".to_owned()
                });
                if self.size.is_none() && !self.size_request {
                    if !self.failed("size") {
                        problems.push(
                            "type=ephemeral needs size=<quantity> (e.g. size=100Gi) or size=request",
                        );
                    }
                    return None;
                }
                let access = self.access_mode.unwrap_or("ReadWriteOnce");
                Source::ephemeral(self.storage_class, access, self.size)
            }
        })
    }

    /// Refuses each shorthand written that does not fit `fit` (`context` says what the volume
    /// is, for the message).
    fn only(&self, fit: ShorthandsOf, problems: &mut Problems, context: impl Fn() -> String) {
        for s in self.shorthands.iter().filter(|s| !fit.accepts(s)) {
            problems.push(format!("{s} does not apply to {}", context()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

    fn ok(v: &str) -> VolumeRequest {
        v.parse().unwrap_or_else(|e| panic!("{v}: {e}"))
    }

    #[test]
    fn the_first_misplaced_shorthand_written_is_named() {
        let err = |v: &str| v.parse::<VolumeRequest>().unwrap_err().0;
        assert!(
            err("type=emptyDir,driver=d,storageClass=x,mountPath=/x")
                .starts_with("driver does not apply")
        );
        assert!(
            err("storageClass=x,driver=d,type=emptyDir,mountPath=/x")
                .starts_with("storageClass does not apply")
        );
        assert!(
            err("type=csi,driver=d,attr.a=1,size=1Gi,mountPath=/x")
                .starts_with("size does not apply")
        );
        assert!(
            err("profile=p,attr.k=v,size=1Gi").starts_with("attr.k does not apply to profile=p")
        );
    }

    #[test]
    fn bare_profile_name_is_a_profile_request() {
        let r = ok("ebs-200g");
        assert_eq!(r.source, Requested::Profile("ebs-200g".into()));
        assert_eq!(r.mount.mount_path, None);
    }

    #[test]
    fn key_value_profile_with_overrides() {
        let r = ok("profile=ebs-200g,mountPath=/scratch,size=300Gi");
        assert_eq!(r.source, Requested::Profile("ebs-200g".into()));
        assert_eq!(r.mount.mount_path.as_deref(), Some("/scratch"));
        assert_eq!(r.size.as_deref(), Some("300Gi"));
    }

    #[test]
    fn key_value_emptydir_memory() {
        let r = ok("type=emptyDir, medium=Memory, mountPath=/dev/shm, size=2Gi");
        let Requested::Inline(Source::EmptyDir(e)) = r.source else {
            panic!()
        };
        assert_eq!(e.medium.as_deref(), Some("Memory"));
        assert_eq!(e.size_limit, Some(K8sQuantity("2Gi".into())));
        assert_eq!(r.mount.mount_path.as_deref(), Some("/dev/shm"));
    }

    #[test]
    fn key_value_ephemeral_defaults_to_read_write_once() {
        let r = ok("type=ephemeral,storageClass=gp3,size=100Gi,mountPath=/scratch");
        let Requested::Inline(Source::Claim(c)) = r.source else {
            panic!()
        };
        assert_eq!(c.access_mode, "ReadWriteOnce");
        assert_eq!(c.storage_class.as_deref(), Some("gp3"));
        assert_eq!(c.size.as_deref(), Some("100Gi"));
        let spec = c.template().volume_claim_template.unwrap().spec;
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"],
            K8sQuantity("100Gi".into())
        );
    }

    #[test]
    fn key_value_csi_with_attributes_sets_read_only_on_volume_and_mount() {
        let r = ok(
            "type=csi,driver=secrets-store.csi.k8s.io,attr.secretProviderClass=vault-db,mountPath=/mnt/secrets,readOnly=true",
        );
        let Requested::Inline(Source::Csi(c)) = &r.source else {
            panic!()
        };
        assert_eq!(c.driver, "secrets-store.csi.k8s.io");
        assert_eq!(c.read_only, Some(true));
        assert_eq!(
            c.volume_attributes.as_ref().unwrap()["secretProviderClass"],
            "vault-db"
        );
        assert_eq!(r.mount.read_only, Some(true));
    }

    #[test]
    fn targets_env_and_init_containers() {
        let r = ok(
            "type=emptyDir,mountPath=/tmp/x,containers=main;sidecar,initContainers=true,env=TMPDIR;NXF_SCRATCH",
        );
        assert_eq!(
            r.mount.containers,
            Some(vec!["main".into(), "sidecar".into()])
        );
        assert_eq!(r.mount.init_containers, Some(InitTargets::All));
        assert_eq!(
            r.mount.env,
            Some(vec!["TMPDIR".into(), "NXF_SCRATCH".into()])
        );
        let r = ok("type=emptyDir,mountPath=/x,initContainers=setup;fetch");
        assert_eq!(
            r.mount.init_containers,
            Some(InitTargets::Named(vec!["setup".into(), "fetch".into()]))
        );
    }

    #[test]
    fn json_form_takes_kubernetes_sources_verbatim() {
        let r = ok(
            r#"{"mountPath":"/scratch","ephemeral":{"volumeClaimTemplate":{"spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"gp3","resources":{"requests":{"storage":"100Gi"}}}}}}"#,
        );
        assert!(matches!(r.source, Requested::Inline(Source::Ephemeral(_))));
        let r = ok(
            r#"{"type":"emptyDir","size":"1Gi","mountPath":"/x","containers":["a","b"],"initContainers":["i"],"readOnly":false}"#,
        );
        assert_eq!(r.mount.containers, Some(vec!["a".into(), "b".into()]));
        assert_eq!(
            r.mount.init_containers,
            Some(InitTargets::Named(vec!["i".into()]))
        );
        assert_eq!(r.mount.read_only, Some(false));
    }

    #[test]
    fn json_form_reads_escaped_keys_and_names_every_unknown_field_up_to_the_bound() {
        // A key with an escape is still the field it spells.
        let r = ok(r#"{"\u0074ype":"emptyDir","mountPath":"/x","containers":["a"]}"#);
        assert_eq!(r.mount.containers, Some(vec!["a".into()]));
        // Unknown fields inside a source, at any depth, by their path.
        let err = |v: &str| v.parse::<VolumeRequest>().unwrap_err().0;
        assert_eq!(
            err(
                r#"{"mountPath":"/x","ephemeral":{"volumeClaimTemplate":{"spec":{"resources":{"requests":{"storage":"1Gi"}},"accessModes":["ReadWriteOnce"],"colour":1}}}}"#
            ),
            "unknown field ephemeral.volumeClaimTemplate.spec.colour"
        );
        // Null or not: what the type does not know is not read into it.
        assert_eq!(
            err(r#"{"mountPath":"/x","emptyDir":{"sizeLimt":null}}"#),
            "unknown field emptyDir.sizeLimt"
        );
        let many: Vec<String> = (0..30).map(|i| format!(r#""k{i}":0"#)).collect();
        let message = err(&format!(
            r#"{{"mountPath":"/x","emptyDir":{{{}}}}}"#,
            many.join(",")
        ));
        assert_eq!(message.matches("unknown field emptyDir.k").count(), 20);
        assert!(message.ends_with("and 10 more unknown fields"), "{message}");
        // A value of the wrong kind is shown compact, and cut when long.
        assert_eq!(
            err(r#"{"type":"emptyDir","mountPath":"/x","containers":[ 1 ]}"#),
            "containers must list non-empty strings, not [1]"
        );
        let long = format!(
            r#"{{"type":"emptyDir","mountPath":["{}"]}}"#,
            "x".repeat(500)
        );
        assert!(
            err(&long).contains("… (504 bytes in all)"),
            "{}",
            err(&long)
        );
    }

    #[test]
    fn a_list_of_names_is_counted_against_its_bound_before_it_is_read() {
        let names = |n: usize| vec!["m"; n];
        let err = |v: &str| v.parse::<VolumeRequest>().unwrap_err().0;
        let at_bound = format!(
            "type=emptyDir,mountPath=/x,containers={}",
            names(MAX_LIST_NAMES).join(";")
        );
        assert_eq!(
            ok(&at_bound).mount.containers.map(|c| c.len()),
            Some(MAX_LIST_NAMES)
        );
        let past = format!(
            "type=emptyDir,mountPath=/x,env={}",
            names(MAX_LIST_NAMES + 1).join(";")
        );
        assert_eq!(
            err(&past),
            "env lists 1025 names, more than the 1024 a list may have"
        );
        let json = serde_json::json!({"type": "emptyDir", "mountPath": "/x",
                                      "containers": names(2000)});
        assert_eq!(
            err(&json.to_string()),
            "containers lists 2000 names, more than the 1024 a list may have"
        );
    }

    #[test]
    fn one_annotation_says_every_problem_at_once_checking_a_misspelled_keys_value_as_its_field() {
        let err = |v: &str| v.parse::<VolumeRequest>().unwrap_err().0;
        assert_eq!(
            err("type=emptyDir,sizee=10Gi,mountpath=scratch,medium=memory"),
            "unknown field \"sizee\": did you mean size?; unknown field \"mountpath\": did you \
             mean mountPath?; medium \"memory\" is not one of \"\" (node disk), Memory, HugePages: \
             did you mean Memory?; mountPath \"scratch\" must be an absolute path"
        );
        assert!(
            err("type=emptyDir,mountPath=/s,medium=hugepages-2Mi").ends_with(
                "is not one of \"\" (node disk), Memory, HugePages: did you mean HugePages-2Mi?"
            )
        );
        assert!(err("type=emptyDir,mountPath=/s,medium=disk").ends_with("Memory, HugePages"));
        // Kubernetes' own names, snake case and other spellings lead to the field.
        for (key, field) in [
            ("sizeLimit", "size"),
            ("sizelimit", "size"),
            ("storageClassName", "storageClass"),
            ("mount_path", "mountPath"),
            ("read-only", "readOnly"),
            ("container", "containers"),
        ] {
            assert_eq!(
                err(&format!("type=emptyDir,mountPath=/x,{key}=1Gi"))
                    .split(';')
                    .next()
                    .unwrap(),
                format!("unknown field \"{key}\": did you mean {field}?")
            );
        }
        // The misspelled field's value is read as that field: a good one is no second problem.
        assert_eq!(
            err("type=emptyDir,mountpath=/x"),
            "unknown field \"mountpath\": did you mean mountPath?"
        );
    }

    #[test]
    fn the_fields_named_in_messages_are_the_fields_read() {
        for field in FIELDS.split(", ").filter(|f| !f.starts_with("attr.")) {
            assert!(is_field(field), "{field}");
        }
        assert!(is_field("attr.x") && !is_field("attr.") && !is_field("sizee"));
    }

    #[test]
    fn a_value_of_many_bad_pairs_says_the_first_twenty_problems_and_counts_the_rest() {
        let pairs: Vec<String> = (0..50).map(|i| format!("k{i:02}=1")).collect();
        let message = format!("type=emptyDir,mountPath=/x,{}", pairs.join(","))
            .parse::<VolumeRequest>()
            .unwrap_err()
            .0;
        assert_eq!(message.matches("unknown field").count(), 20, "{message}");
        assert!(
            message.contains("\"k19\"") && !message.contains("\"k20\""),
            "{message}"
        );
        assert!(message.ends_with("; and 30 more problems"), "{message}");
    }

    #[test]
    fn every_hint_is_checked_by_the_parser_and_says_what_else_is_wrong() {
        let err = |v: &str| v.parse::<VolumeRequest>().unwrap_err().0;
        assert_eq!(
            err("type=emptyDir; mountPath=/scratch; size=1Gi"),
            "pairs are separated by commas, not by semicolons or spaces: did you mean \
             \"type=emptyDir,mountPath=/scratch,size=1Gi\"?"
        );
        assert_eq!(
            err("type=emptyDir mountPath=/scratch sizee=1Gi"),
            "pairs are separated by commas, not by semicolons or spaces; read as \
             \"type=emptyDir,mountPath=/scratch,sizee=1Gi\", it still has: unknown field \
             \"sizee\": did you mean size?"
        );
        // A list's own `;` and spaces around `=` are not separators.
        assert!(
            "type=emptyDir,mountPath=/x,env=A;B"
                .parse::<VolumeRequest>()
                .is_ok()
        );
        assert!(
            "type = emptyDir , mountPath = /x"
                .parse::<VolumeRequest>()
                .is_ok()
        );
        assert_eq!(
            err("\"type=emptyDir,mountPath=/s\""),
            "the value \"\\\"type=emptyDir,mountPath=/s\\\"\" is wrapped in quotes, which are \
             kept as part of it (a quoted string \
             inside the annotation's own quotes); write it without them: did you mean \
             \"type=emptyDir,mountPath=/s\"?"
        );
        assert_eq!(
            err("[type:emptyDir, mountpath:/scratch, size:1Gi]"),
            "\"[type:emptyDir, mountpath:/scratch, size:1Gi]\" looks like key:value pairs (or a \
             Groovy map written as a string); write key=value pairs separated by commas: did you \
             mean \"type=emptyDir,mountPath=/scratch,size=1Gi\"?"
        );
        assert_eq!(
            err("[type:emptyDir, size:10GB, mountPath:/scratch]"),
            "\"[type:emptyDir, size:10GB, mountPath:/scratch]\" looks like key:value pairs (or a \
             Groovy map written as a string); write key=value pairs separated by commas; read as \
             \"type=emptyDir,size=10GB,mountPath=/scratch\", it still has: size: invalid \
             quantity \"10GB\": unknown suffix (use Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E or \
             m); did you mean 10G (powers of 1000) or 10Gi (powers of 1024)?"
        );
        for (size, hint) in [
            ("1gi", "did you mean 1Gi?"),
            ("10 Gi", "did you mean 10Gi?"),
            ("1GiB", "did you mean 1Gi?"),
            (
                "1.5TB",
                "did you mean 1.5T (powers of 1000) or 1.5Ti (powers of 1024)?",
            ),
        ] {
            let message = err(&format!("type=emptyDir,mountPath=/x,size={size}"));
            assert!(message.ends_with(hint), "{size}: {message}");
        }
    }

    #[test]
    fn every_error_names_what_is_wrong() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("   ", "empty"),
            ("Bad_Profile", "profile name \"Bad_Profile\""),
            (
                "type=emptyDir,mountPath=/x,sizee=1Gi",
                "unknown field \"sizee\"",
            ),
            (
                "type=emptydir,mountPath=/x",
                "type \"emptydir\" is not one of",
            ),
            ("mountPath=/x", "no volume source"),
            (
                "profile=a,type=emptyDir",
                "profile and type are given together",
            ),
            (
                "type=emptyDir,mountPath=/x,mountPath=/y",
                "mountPath is given twice",
            ),
            (
                "type=emptyDir,mountPath=relative/path",
                "must be an absolute path",
            ),
            ("type=emptyDir,mountPath=/a/../etc", "must not contain '..'"),
            (
                "type=emptyDir,mountPath=/x,subPath=/abs",
                "subPath \"/abs\" must be a relative path",
            ),
            (
                "type=emptyDir,mountPath=/x,size=10GB",
                "invalid quantity \"10GB\"",
            ),
            ("type=emptyDir,mountPath=/x,size=-1Gi", "negative"),
            (
                "type=emptyDir,mountPath=/x,medium=memory",
                "medium \"memory\" is not one of",
            ),
            (
                "type=emptyDir,mountPath=/x,storageClass=gp3",
                "storageClass does not apply to type=emptyDir",
            ),
            (
                "type=emptyDir,mountPath=/x,attr.a=b",
                "attr.a does not apply to type=emptyDir",
            ),
            ("type=csi,mountPath=/x", "type=csi needs driver"),
            (
                "type=csi,driver=d,size=1Gi,mountPath=/x",
                "size does not apply to type=csi",
            ),
            (
                "type=csi,driver=Not_A_Driver,mountPath=/x",
                "CSI driver \"Not_A_Driver\"",
            ),
            (
                "type=csi,driver=d,attr.=x,mountPath=/x",
                "attr. needs a key",
            ),
            (
                "type=csi,driver=d,attr.a=1,attr.a=2,mountPath=/x",
                "attr.a is given twice",
            ),
            ("type=ephemeral,mountPath=/x", "type=ephemeral needs size"),
            (
                "type=ephemeral,size=1Gi,accessMode=RWO,mountPath=/x",
                "accessMode \"RWO\" is not one of",
            ),
            (
                "type=ephemeral,size=1Gi,medium=Memory,mountPath=/x",
                "medium does not apply to type=ephemeral",
            ),
            (
                "profile=p,storageClass=gp3",
                "storageClass does not apply to profile=p",
            ),
            ("profile=p,size=lots", "invalid quantity \"lots\""),
            (
                "type=emptyDir,mountPath=/x,readOnly=yes",
                "readOnly must be true or false",
            ),
            (
                "type=emptyDir,mountPath=/x,containers=Main",
                "container name \"Main\"",
            ),
            (
                "type=emptyDir,mountPath=/x,containers=;",
                "containers is empty",
            ),
            (
                "type=emptyDir,mountPath=/x,initContainers=",
                "initContainers",
            ),
            ("type=emptyDir,mountPath=/x,env=1BAD", "env name \"1BAD\""),
            (
                "type=emptyDir,mountPath=/x,emptyDir=1",
                "emptyDir needs the JSON form",
            ),
            (
                "type=emptyDir,mountPath",
                "\"mountPath\" is not a key=value pair",
            ),
            ("type=emptyDir,mountPath=", "mountPath is empty"),
            ("{not json", "invalid JSON"),
            (
                "{\"mountPath\":\"/x\",\"emptyDir\":{\"sizeLimt\":\"1Gi\"}}",
                "unknown field emptyDir.sizeLimt",
            ),
            (
                "{\"mountPath\":\"/x\",\"emptyDir\":{\"sizeLimit\":true}}",
                "emptyDir: invalid type",
            ),
            (
                "{\"mountPath\":\"/x\",\"emptyDir\":{},\"size\":\"1Gi\"}",
                "size does not apply to a volume given as a JSON object",
            ),
            (
                "{\"mountPath\":\"/x\",\"emptyDir\":[]}",
                "emptyDir must be a JSON object",
            ),
            (
                "{\"mountPath\":\"/x\",\"ephemeral\":{}}",
                "volumeClaimTemplate is required",
            ),
            (
                "{\"mountPath\":\"/x\",\"ephemeral\":{\"volumeClaimTemplate\":{\"spec\":{}}}}",
                "accessModes is required",
            ),
            (
                "{\"mountPath\":\"/x\",\"ephemeral\":{\"volumeClaimTemplate\":{\"spec\":{\"accessModes\":[\"ReadWriteOnce\"]}}}}",
                "requests.storage is required",
            ),
            (
                "{\"mountPath\":\"/x\",\"ephemeral\":{\"volumeClaimTemplate\":{\"spec\":{\"accessModes\":[\"ReadWriteOnce\"],\"volumeMode\":\"Block\",\"resources\":{\"requests\":{\"storage\":\"1Gi\"}}}}}}",
                "volumeMode Block",
            ),
            (
                "{\"mountPath\":\"/x\",\"csi\":{\"driver\":\"d\",\"volumeAtributes\":{}}}",
                "unknown field csi.volumeAtributes",
            ),
            (
                "{\"mountPath\":true,\"type\":\"emptyDir\"}",
                "mountPath must be a string",
            ),
            (
                "{\"type\":\"emptyDir\",\"mountPath\":\"/x\",\"containers\":[1]}",
                "containers must list non-empty strings",
            ),
            ("[1,2]", "profile name \"[1,2]\""),
            (
                "{\"type\":\"emptyDir\",\"mountPath\":\"/x\",\"colour\":\"red\"}",
                "unknown field \"colour\"",
            ),
        ];
        for (input, want) in cases {
            let err = input
                .parse::<VolumeRequest>()
                .expect_err(&format!("{input:?} should be refused"));
            assert!(
                err.0.contains(want),
                "{input:?}: got {:?}, want {want:?}",
                err.0
            );
        }
    }
}
