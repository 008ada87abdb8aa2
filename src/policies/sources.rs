//! A profile's source as CEL: the typed object the mutating policy adds and the check that a
//! volume of the pod's own is it, each with the size an annotation may set
//! (`profile=<name>,size=…`) in place of the profile's.

use serde_json::{Value, json};

use super::{
    cel::{self, quote, typed},
    inline::Form,
};
use crate::volume::VolumeKind;

/// The volume named `n` (a CEL expression) with `source`; with `fields`, its size the
/// annotation's, else the source's.
pub fn volume(mut source: Value, kind: VolumeKind, fields: bool, n: &str) -> String {
    let field = kind_field(kind);
    let placeholder = "\u{0}size\u{0}";
    let size = match size_pointer(kind) {
        Some(at) if fields => {
            let size = source
                .pointer(at)
                .and_then(Value::as_str)
                .map(str::to_owned);
            set_pointer(&mut source, at, placeholder);
            Some(size)
        }
        _ => None,
    };
    let mut text = typed(&format!("Object.spec.volumes.{field}"), &source);
    if let Some(size) = size {
        // The annotation's size, else the profile's; an emptyDir with neither has no sizeLimit.
        let at = size_field(kind);
        let quoted = quote(placeholder);
        text = match size {
            Some(size) => text.replace(&quoted, &Form::size_or(Some(&size))),
            // A claim's storage is required: a profile without one has its size from the
            // containers' requests, which the annotation's pairs then hold.
            None if kind == VolumeKind::Ephemeral => {
                text.replace(&quoted, "variables.kv[k][?'size'].orValue('')")
            }
            None => text.replace(
                &format!("{at}: {quoted}"),
                &format!("?{at}: variables.kv[k][?'size']"),
            ),
        };
    }
    format!("Object.spec.volumes{{name: {n}, {field}: {text}}}")
}

/// `source` without its size (a rule's stand-in for the containers' request).
pub fn without_size(mut source: Value, kind: VolumeKind) -> Value {
    if let Some(at) = size_pointer(kind) {
        if let Some(v) = source.pointer_mut(at) {
            v.take();
        }
        remove_empty(&mut source);
    }
    source
}

/// The volume named `n` with `source`, its size `size` (a CEL string: the containers' request).
pub fn volume_sized(mut source: Value, kind: VolumeKind, size: &str, n: &str) -> String {
    let field = kind_field(kind);
    let placeholder = "\u{0}size\u{0}";
    if let Some(at) = size_pointer(kind) {
        set_pointer(&mut source, at, placeholder);
    }
    let text =
        typed(&format!("Object.spec.volumes.{field}"), &source).replace(&quote(placeholder), size);
    format!("Object.spec.volumes{{name: {n}, {field}: {text}}}")
}

/// Whether the pod's own volume `v` is the one `source` describes, on the fields it sets; with
/// `fields`, the size the annotation may set compared as a quantity.
pub fn same(source: &Value, kind: VolumeKind, fields: bool) -> String {
    let mut source = source.clone();
    let field = kind_field(kind);
    let mut checks = vec![format!("has(v.{field})")];
    if let (true, Some(at)) = (fields, size_pointer(kind)) {
        let size = source.pointer_mut(at).map(Value::take);
        let wanted = Form::size_or(size.as_ref().and_then(Value::as_str));
        checks.push(same_size(kind, &wanted));
        remove_empty(&mut source);
    }
    cel::same_as(&format!("v.{field}"), &source, &mut checks);
    format!("({})", checks.join(" && "))
}

/// Where a source of this kind keeps its size, as a JSON pointer into it (a CSI volume has none).
fn size_pointer(kind: VolumeKind) -> Option<&'static str> {
    match kind {
        VolumeKind::EmptyDir => Some("/sizeLimit"),
        VolumeKind::Ephemeral => Some("/volumeClaimTemplate/spec/resources/requests/storage"),
        VolumeKind::Csi => None,
    }
}

/// The size's field as a CEL path below the source.
fn size_field(kind: VolumeKind) -> &'static str {
    match kind {
        VolumeKind::Ephemeral => "volumeClaimTemplate.spec.resources.requests['storage']",
        _ => "sizeLimit",
    }
}

/// Whether the pod's own volume `v` of this kind has the size `wanted` (a CEL string, `''`
/// for none), as a quantity: `1024Mi` is `1Gi`.
fn same_size(kind: VolumeKind, wanted: &str) -> String {
    match kind {
        VolumeKind::Ephemeral => {
            let spec = "v.ephemeral.volumeClaimTemplate.spec";
            format!(
                "(has(v.ephemeral.volumeClaimTemplate) && has({spec}.resources) && has({spec}.resources.requests) \
                 && 'storage' in {spec}.resources.requests \
                 && quantity(string({spec}.resources.requests['storage'])).compareTo(quantity({wanted})) == 0)"
            )
        }
        _ => format!(
            "(({wanted}) == '' ? !has(v.emptyDir.sizeLimit) : has(v.emptyDir.sizeLimit) \
             && quantity(string(v.emptyDir.sizeLimit)).compareTo(quantity({wanted})) == 0)"
        ),
    }
}

/// Sets the string at `pointer` (its parent objects made when missing).
fn set_pointer(value: &mut Value, pointer: &str, text: &str) {
    let mut at = value;
    for part in pointer.split('/').skip(1) {
        if !at.is_object() {
            *at = json!({});
        }
        at = &mut at[part];
    }
    *at = Value::String(text.to_owned());
}

/// Drops the nulls a taken value left, and the objects left empty by it.
fn remove_empty(value: &mut Value) {
    if let Value::Object(fields) = value {
        for v in fields.values_mut() {
            remove_empty(v);
        }
        fields.retain(|_, v| !v.is_null() && v.as_object().is_none_or(|o| !o.is_empty()));
    }
}

/// The volume's field for a source of this kind.
pub fn kind_field(kind: VolumeKind) -> &'static str {
    match kind {
        VolumeKind::EmptyDir => "emptyDir",
        VolumeKind::Csi => "csi",
        VolumeKind::Ephemeral => "ephemeral",
    }
}
