//! `size=request` in the admission policies: which annotations (and rules' volumes) ask for a
//! size from the containers' ephemeral-storage requests — the key=value form, `profile=<name>,
//! size=request`, a profile whose size is `request` by name or with fields but no size — the
//! containers each targets (as the webhook targets them), their positive requests, and the
//! largest (the first of equal ones) as the container spells it: what Nextflow's `disk`
//! directive sets, read as the size.

use super::cel::{ALL, list, quote};
use crate::volume::{InitTargets, Profile, VolumeKind};

/// The variables, after `parsed` (each annotation's pairs) and before `kv` (which reads
/// `requested` as the size): `forms`, `reqSpec` (of each annotation or rule that asks: its
/// containers, then its init containers, [`ALL`] for every one), `reqNames`, `requests`,
/// `reqMax` and `requested`. `rules`: the pairs a rule's volume would have, by key (a CEL
/// chain), when the configuration has rules.
pub fn variables(
    profiles: &[(&str, &Profile)],
    rules: Option<String>,
) -> [(&'static str, String); 6] {
    let spec = spec(profiles);
    let targeted = |list: &str, at: usize| {
        format!("object.spec.{list}.filter(c, s[{at}] == {ALL} || c.name in s[{at}])")
    };
    let containers = targeted("containers", 0);
    let inits = format!(
        "(has(object.spec.initContainers) ? {} : [])",
        targeted("initContainers", 1)
    );
    let request = "has(c.resources) && has(c.resources.requests) && 'ephemeral-storage' in c.resources.requests";
    [
            (
                // Each annotation's pairs (none for a profile's name), and each rule's volume
                // that takes its size from the requests as the pairs that would say so.
                "forms",
                match rules {
                    None => "variables.values.transformMap(k, v, k in variables.parsed ? variables.parsed[k] : {})"
                        .to_owned(),
                    Some(rule_form) => format!(
                        "(variables.asked + variables.ruled).transformMapEntry(i, k, {{k: k in variables.parsed \
                         ? variables.parsed[k] : k in variables.annotations ? {{}} : ({rule_form})}})"
                    ),
                },
            ),
            (
                "reqSpec",
                format!("variables.forms.transformMapEntry(k, f, {spec}.size() > 0, {{k: {spec}[0]}})"),
            ),
            (
                "reqNames",
                format!(
                    "variables.reqSpec.transformMap(k, s, {containers}.map(c, c.name) + {inits}.map(c, c.name))"
                ),
            ),
            (
                "requests",
                format!(
                    "variables.reqSpec.transformMap(k, s, \
                     ({containers}.filter(c, {request}).map(c, string(c.resources.requests['ephemeral-storage'])) \
                     + {inits}.filter(c, {request}).map(c, string(c.resources.requests['ephemeral-storage'])))\
                     .filter(q, isQuantity(q) && quantity(q).isGreaterThan(quantity('0'))))"
                ),
            ),
            (
                // Each list's largest, once (the API server's CEL has no cel.bind).
                "reqMax",
                "variables.requests.transformMap(k, rs, rs.size() == 0 ? 0.0 \
                 : rs.map(q, quantity(q).asApproximateFloat()).max())"
                    .to_owned(),
            ),
            (
                "requested",
                "variables.requests.transformMap(k, rs, rs.size() == 0 ? '' \
                 : rs.filter(q, quantity(q).asApproximateFloat() == variables.reqMax[k])[0])"
                    .to_owned(),
            ),
        ]
}

/// Of annotation `k` (its pairs `f`, empty unless in key=value form; its value
/// `variables.values[k]`): a CEL list of its spec — its containers, then its init
/// containers — empty when it does not ask for a size from the requests. Asked by the inline
/// form (not on a CSI volume), by `profile=<name>,size=request` (not on a CSI profile), and by
/// a profile whose size is `request` (by name, or with fields but no size).
fn spec(profiles: &[(&str, &Profile)]) -> String {
    // `size=request`: which containers each asking annotation targets (`spec`: its
    // containers, then its init containers, [`ALL`] for every one), their names, their
    // positive ephemeral-storage requests, the largest (the first of equal ones) as the
    // container spells it. Asked by the inline form, by `profile=<name>,size=request`,
    // and by a profile whose size is `request` (by name, or with fields but no size).
    let by_request: Vec<&str> = profiles
        .iter()
        .filter(|(_, p)| p.size_from_request && p.compiled.kind != VolumeKind::Csi)
        .map(|(n, _)| *n)
        .collect();
    let lists = |of: &str, given: &str| {
        let mut chain = String::new();
        for (n, p) in profiles {
            let containers = match &p.mount.containers {
                Some(names) => list(names.iter().map(String::as_str)),
                None => ALL.to_owned(),
            };
            let inits = match &p.mount.init_containers {
                None | Some(InitTargets::None) => "[]".to_owned(),
                Some(InitTargets::All) => ALL.to_owned(),
                Some(InitTargets::Named(names)) => list(names.iter().map(String::as_str)),
            };
            chain.push_str(&format!(
                "{of} == {} ? [{containers}, {inits}] : ",
                quote(n)
            ));
        }
        format!("({chain}{given})")
    };
    let field_list = |f: &str, default: &str| {
        format!(
            "('{f}' in f ? f['{f}'].split(';').map(x, x.trim()).filter(x, x != '') : {default})"
        )
    };
    let inits_of = |default: &str| {
        format!(
            "('initContainers' in f ? (f['initContainers'] == 'true' ? {ALL} : f['initContainers'] == 'false' ? [] \
                 : f['initContainers'].split(';').map(x, x.trim()).filter(x, x != '')) : {default})"
        )
    };
    let csi: Vec<&str> = profiles
        .iter()
        .filter(|(_, p)| p.compiled.kind == VolumeKind::Csi)
        .map(|(n, _)| *n)
        .collect();
    // Of annotation `k` (its pairs `f`, empty unless in key=value form; its value `v`): a
    // list of its spec, empty when it does not ask for a size from the requests.
    let v = "variables.values[k]";
    let fallback = format!("[{ALL}, []]");
    let of_profile = lists("f['profile']", &fallback);
    format!(
        "(f.size() > 0 ? (!('profile' in f) \
             ? (f[?'size'] == optional.of('request') && f[?'type'].orValue('') != 'csi' \
                ? [[{field_containers}, {inits_inline}]] : []) \
             : (!(f['profile'] in {csi}) && (f[?'size'] == optional.of('request') \
                || (f['profile'] in {by_request} && !('size' in f))) \
                ? [[{profile_containers}, {profile_inits}]] : [])) \
             : (k in variables.values && {v} in {by_request} ? [{by_name}] : []))",
        field_containers = field_list("containers", ALL),
        inits_inline = inits_of("[]"),
        csi = list(csi.iter().copied()),
        by_request = list(by_request.iter().copied()),
        profile_containers = field_list("containers", &format!("{of_profile}[0]")),
        profile_inits = inits_of(&format!("{of_profile}[1]")),
        by_name = lists(v, &fallback),
    )
}
