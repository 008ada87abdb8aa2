//! The hints a refused value gets: the slips that hide every other problem (a value wrapped in
//! quotes, pairs separated by `;` or spaces, key:value pairs of a Groovy map) and the field a
//! misspelt key means. Every suggested value is run through the parser before it is offered.

use super::{FIELDS, VolumeRequest};
use crate::{echo::quoted, validate};

/// `why`, and the value it suggests instead — offered as a fix only when it is accepted; when it
/// is not, what else is wrong with it.
pub(super) fn suggestion(why: &str, fixed: &str) -> String {
    let shown = quoted(&crate::echo::without_attributes(fixed));
    match fixed.parse::<VolumeRequest>() {
        Ok(_) => format!("{why}: did you mean {shown}?"),
        Err(e) => format!("{why}; read as {shown}, it still has: {e}"),
    }
}

/// The value inside the quotes a whole value is wrapped in (`"type=emptyDir,…"`, `'…'`).
pub(super) fn unquoted(value: &str) -> Option<&str> {
    ['"', '\'']
        .iter()
        .find_map(|q| value.strip_prefix(*q)?.strip_suffix(*q))
        .map(str::trim)
        .filter(|inner| !inner.is_empty())
}

/// The most words after a `;` or a space, followed by `=` but not a field as written, whose
/// meaning [`comma_separated`] looks up: a volume has fewer fields than this.
pub(super) const MAX_WORDS_LOOKED_UP: usize = 32;

/// The value with commas between its pairs, when it separates them with semicolons or spaces
/// (`type=emptyDir; mountPath=/scratch`, `type=emptyDir mountPath=/scratch`): a `;` or a run of
/// spaces before a word that is a field (or one that certainly means a field) followed by `=`.
/// A `;` before anything else is a list's (`containers=a;b`). `None` when there is none.
pub(super) fn comma_separated(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let is_separator = |b: &u8| matches!(b, b';' | b' ' | b'\t');
    // The separators to write as commas, as byte ranges; the value is copied only if any.
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let mut looked_up = 0;
    let mut i = 0;
    while let Some(offset) = bytes[i..].iter().position(is_separator) {
        let start = i + offset;
        let end = start
            + bytes[start..]
                .iter()
                .take_while(|b| is_separator(b))
                .count();
        i = end;
        // The word after the separator, up to `=` (spaces around `=` allowed).
        let rest = &value[end..];
        let word_end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-'))
            .unwrap_or(rest.len());
        let (word, after) = rest.split_at(word_end);
        let equals_follows = after.trim_start().starts_with('=') && !word.is_empty();
        // A field as written is cheap to tell; what a word that is not one means is looked
        // up for at most a few words.
        let pair_follows = equals_follows
            && (is_field(word) || {
                looked_up += 1;
                looked_up <= MAX_WORDS_LOOKED_UP && intended_field(word).is_some()
            });
        // Spaces around `=` (`type = emptyDir`) and after a comma are not separators.
        let before = value[..start].trim_end();
        let semicolon = bytes[start..end].contains(&b';');
        if pair_follows && !before.ends_with('=') && (semicolon || !before.ends_with(',')) {
            cuts.push((start, end));
        }
        if i >= bytes.len() {
            break;
        }
    }
    if cuts.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(value.len());
    let mut from = 0;
    for (start, end) in cuts {
        out.push_str(&value[from..start]);
        out.push(',');
        from = end;
    }
    out.push_str(&value[from..]);
    Some(out)
}

/// What is said of a key that is not a field: what it most likely means, or every field.
pub(super) fn unknown_field(key: &str) -> String {
    let near = intended_field(key).or_else(|| {
        // No field is longer than this: a longer key is compared with none.
        (key.len() <= 32).then(|| {
            validate::closest(key, FIELDS.split(", ").filter(|f| !f.starts_with("attr.")))
        })?
    });
    match near {
        Some(field) => format!("unknown field {}: did you mean {field}?", quoted(key)),
        None => format!("unknown field {}; the fields are {FIELDS}", quoted(key)),
    }
}

/// The field a key that is not one certainly means: the same but for case, `_` and `-`
/// (`mountpath`, `mount_path`), a Kubernetes or common name for it (`sizeLimit`,
/// `storageClassName`), or one edit away from it (`sizee`).
pub(super) fn intended_field(key: &str) -> Option<&'static str> {
    // No field or alias is longer than this: a longer key means none.
    if key.len() > 32 {
        return None;
    }
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| *c != '_' && *c != '-')
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let key_norm = norm(key);
    let fields = FIELDS.split(", ").filter(|f| !f.starts_with("attr."));
    if let Some(f) = fields.clone().find(|f| f.eq_ignore_ascii_case(&key_norm)) {
        return Some(f);
    }
    let alias = match key_norm.as_str() {
        "sizelimit" | "limit" | "storage" | "capacity" | "disk" | "disksize" | "request" => "size",
        "storageclassname" | "class" | "sc" => "storageClass",
        "accessmodes" => "accessMode",
        "path" | "mount" | "mountpoint" | "dir" | "directory" => "mountPath",
        "container" => "containers",
        "initcontainer" => "initContainers",
        "kind" | "volumetype" => "type",
        "ro" => "readOnly",
        "envvar" | "envvars" | "variable" | "variables" => "env",
        _ => "",
    };
    if !alias.is_empty() {
        return fields.clone().find(|f| *f == alias);
    }
    fields
        .filter(|f| f.len().abs_diff(key.len()) <= 1)
        .filter(|f| strsim::osa_distance(&key_norm, &f.to_ascii_lowercase()) == 1)
        .min_by_key(|f| f.len().abs_diff(key.len()))
}

/// `[type:emptyDir, size:1Gi]` or `type:emptyDir,size:1Gi` (what a Groovy map, or a YAML habit,
/// makes of a volume) as the `key=value` form it means; `None` unless every part is
/// `field:value` with a field of the grammar.
pub(super) fn colon_pairs(value: &str) -> Option<String> {
    // Most values reaching here are profile names, with no `:` at all.
    if !value.as_bytes().contains(&b':') {
        return None;
    }
    let inner = value
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .unwrap_or(value);
    let mut fixed = Vec::new();
    for part in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, val) = part.split_once(':')?;
        let mut key = key.trim();
        if !is_field(key) {
            key = intended_field(key)?;
        }
        fixed.push(format!("{key}={}", val.trim()));
    }
    (!fixed.is_empty()).then(|| fixed.join(","))
}

/// The fields of the grammar, `attr.<key>` aside: what the parser reads and the admission
/// policies (src/policies) read the same way.
pub const FIELD_NAMES: [&str; 17] = [
    "profile",
    "type",
    "emptyDir",
    "csi",
    "ephemeral",
    "size",
    "medium",
    "storageClass",
    "accessMode",
    "driver",
    "fsType",
    "mountPath",
    "readOnly",
    "subPath",
    "containers",
    "initContainers",
    "env",
];

pub(super) fn is_field(key: &str) -> bool {
    key.strip_prefix("attr.").is_some_and(|k| !k.is_empty()) || FIELD_NAMES.contains(&key)
}
