//! The key=value form (`type=emptyDir,size=10Gi,mountPath=/scratch`) in CEL: the pairs read
//! into a map per annotation, every problem the webhook would find in them (as it says them
//! all at once), the policy's limits, and the volume and mount they ask for.
//!
//! Read as the webhook reads it: split at `,`, each pair trimmed and split at its first `=`,
//! empty pairs skipped. The fields a profile override, a container list or `size=request`
//! need are refused as the webhook's only, naming the field.

use crate::{
    annotation::FIELD_NAMES,
    config::Policy,
    quantity::Quantity,
    volume::{Medium, Profile, VolumeKind},
};

use super::{
    cel::{ALL, list, quote},
    requests,
};

/// The fields an annotation naming a profile may set (the webhook's only aside).
const PROFILE_FIELDS: [&str; 8] = [
    "profile",
    "mountPath",
    "size",
    "readOnly",
    "subPath",
    "env",
    "containers",
    "initContainers",
];

/// The access modes a claim template may ask for.
const ACCESS_MODES: [&str; 4] = [
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

/// A DNS-1123 subdomain (storage class and CSI driver names).
const SUBDOMAIN: &str =
    "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$";

/// The longest value in key=value form the policies read, and the most pairs (commas + 1):
/// the API server's runtime cost limit (1,000,000 for one evaluation, the variables it reads
/// included) holds for 64 of them. The webhook reads up to 16 KiB; a longer value is refused
/// here, naming the bound.
pub const MAX_VALUE: usize = 1024;
pub const MAX_PAIRS: usize = 32;

/// The pairs of annotation `k` (`variables.pairs[k]`: `[key, value]`, or `[text]` for a pair
/// without `=`) and its fields (`variables.kv[k]`: the first value of each key).
const KV: &str = "variables.kv[k]";
const PAIRS: &str = "variables.pairs[k]";

/// The key=value form under one policy.
pub struct Form<'p> {
    policy: &'p Policy,
}

/// `variables.kv[k]['f']`.
fn get(f: &str) -> String {
    format!("{KV}[{}]", quote(f))
}

/// `'f' in variables.kv[k]`.
fn has(f: &str) -> String {
    format!("({} in {KV})", quote(f))
}

/// The names field `f` lists (`a;b`, spaces and empty names aside), as the webhook reads them.
fn names(f: &str) -> String {
    format!("{}.split(';').map(x, x.trim()).filter(x, x != '')", get(f))
}

/// `variables.kv[k]` holds `f` with a non-empty value.
fn given(f: &str) -> String {
    format!("({} && {} != '')", has(f), get(f))
}

/// `[message]` when `cond`, else `[]` (CEL lists of strings, concatenated with `+`).
fn when(cond: &str, message: &str) -> String {
    format!("({cond} ? [{message}] : [])")
}

/// The CEL of the type annotation `k` asks for (`''` without a type).
fn kind() -> String {
    format!("{KV}[?'type'].orValue('')")
}

/// A path in the webhook's one spelling: `//` and `/./` collapsed, no trailing `/`.
pub fn normalized(path: &str) -> String {
    format!("('/' + {path}.split('/').filter(x, x != '' && x != '.').join('/'))")
}

impl<'p> Form<'p> {
    pub fn new(policy: &'p Policy) -> Self {
        Form { policy }
    }

    /// The variables the form is read into, after `values` (the trimmed value of each asked
    /// annotation): `pairs`, the keys given more than once (`twice`, found by sorting: linear,
    /// where comparing pairs with pairs is not) and `kv` (empty when a key is given twice),
    /// and the names of `env` (`envs`), for the values in key=value form of at most
    /// [`MAX_VALUE`] characters and [`MAX_PAIRS`] pairs only.
    pub fn variables(
        profiles: &[(&str, &Profile)],
        rules: Option<String>,
    ) -> Vec<(&'static str, String)> {
        let mut out = vec![
            (
                "pairs",
                format!(
                    "variables.values.transformMapEntry(k, v, v.contains('=') && !v.startsWith('{{') \
                     && v.size() <= {MAX_VALUE} && v.split(',').size() <= {MAX_PAIRS}, \
                     {{k: v.split(',').map(p, p.trim()).filter(p, p != '').map(p, p.contains('=') \
                     ? [p.substring(0, p.indexOf('=')).trim(), p.substring(p.indexOf('=') + 1).trim()] \
                     : [p])}})"
                ),
            ),
            (
                "twice",
                "variables.pairs.transformMap(k, ps, ps.filter(p, p.size() == 2).map(p, p[0]).sort())\
                 .transformMap(k, keys, keys.transformList(i, f, i > 0 && keys[i - 1] == f \
                 && (i == 1 || keys[i - 2] != f), f))"
                    .to_owned(),
            ),
            (
                "parsed",
                "variables.pairs.transformMap(k, ps, variables.twice[k].size() > 0 ? {} \
                 : ps.filter(p, p.size() == 2).transformMapEntry(i, p, {p[0]: p[1]}))"
                    .to_owned(),
            ),
        ];
        out.extend(requests::variables(profiles, rules));
        out.extend([
            (
                // The pairs, `size=request` (or a profile's) read as the size it stands for.
                "kv",
                "variables.pairs.transformMap(k, ps, variables.twice[k].size() > 0 ? {} \
                 : (k in variables.requested && variables.requested[k] != '' \
                    ? ps.filter(p, p.size() == 2 && p[0] != 'size') + [['size', variables.requested[k]]] \
                    : ps.filter(p, p.size() == 2)).transformMapEntry(i, p, {p[0]: p[1]}))"
                    .to_owned(),
            ),
            (
                "envs",
                "variables.kv.transformMap(k, f, 'env' in f \
                 ? f['env'].split(';').map(e, e.trim()).filter(e, e != '') : [])"
                    .to_owned(),
            ),
        ]);
        out
    }

    /// Every problem of annotation `k`'s pairs: a CEL list of messages (without the
    /// annotation's name), empty when the webhook would serve it as the policies do.
    pub fn problems(&self, profiles: &[(&str, &Profile)]) -> String {
        let pairs = [
            format!(
                "{PAIRS}.filter(p, p.size() == 1).map(p, '\"' + p[0] + '\" is not a key=value pair \
                 (values cannot contain commas; use the JSON form)')"
            ),
            format!(
                "{PAIRS}.filter(p, p.size() == 2 && !(p[0] in {}) && !p[0].startsWith('attr.'))\
                 .map(p, 'unknown field \"' + p[0] + '\"')",
                list(FIELD_NAMES)
            ),
            "variables.twice[k].map(f, f + ' is given twice')".to_owned(),
        ];
        let mut out = self.common();
        out.extend([
            format!(
                "{KV}.filter(f, f in ['emptyDir', 'csi', 'ephemeral']).map(f, f + ' needs the JSON \
                 form; in key=value form write type=' + f + ' with its shorthands')"
            ),
            when(
                &format!("!{KV}.exists(f, f in ['type', 'emptyDir', 'csi', 'ephemeral'])"),
                "'no volume source: give exactly one of profile, type, emptyDir, csi, ephemeral'",
            ),
        ]);
        let t = kind();
        out.push(format!(
            "({t} != '' && !({t} in ['emptyDir', 'csi', 'ephemeral']) ? ['type \"' + {t} + \
             '\" is not one of emptyDir, csi, ephemeral (spelled as in the Pod API)'] \
             : {t} != '' && !({t} in {}) ? ['type ' + {t} + ' is not allowed by {}.types ({})'] : [])",
            list(self.policy.types.iter().map(|k| k.as_str())),
            self.policy.origin,
            self.policy
                .types
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        out.push(shorthands());
        out.push(self.size());
        out.extend(self.source_fields());
        out.extend(mount_fields(true));
        // A key given twice leaves the fields unread (`kv` is empty): its pairs' problems only.
        let inline = if self.policy.allow_inline {
            out.join("\n + ")
        } else {
            format!(
                "['{}.allowInline is false: name one of the cluster\\'s profiles']",
                self.policy.origin
            )
        };
        format!(
            "{}\n + (variables.twice[k].size() > 0 ? [] : {} ? ({}) : ({inline}))",
            pairs.join("\n + "),
            has("profile"),
            self.with_profile(profiles),
        )
    }

    /// What both the inline form and a profile with fields refuse: an empty value, `attr.`
    /// without a key, the fields only the webhook reads.
    fn common(&self) -> Vec<String> {
        vec![
            format!(
                "{KV}.filter(f, (f in {} || f.startsWith('attr.')) && f != 'readOnly' && f != 'attr.' \
                 && {KV}[f] == '').map(f, f + ' is empty')",
                list(FIELD_NAMES)
            ),
            when(
                &has("attr."),
                "'attr. needs a key, e.g. attr.secretProviderClass=vault-db'",
            ),
        ]
    }

    /// The refusal of `size` (a CEL string, `''` for none) past the policy's cap for a volume
    /// of this kind and medium, as the webhook says it.
    pub fn over_cap(&self, kind: VolumeKind, medium: Medium, size: &str) -> String {
        let cap = match (kind, medium) {
            (VolumeKind::Ephemeral, _) => self.policy.max_ephemeral.map(|c| (c, "ephemeral")),
            (VolumeKind::EmptyDir, Medium::Memory) => self.policy.max_memory.map(|c| (c, "memory")),
            (VolumeKind::EmptyDir, Medium::Disk) => {
                self.policy.max_empty_dir.map(|c| (c, "emptyDir"))
            }
            _ => None,
        };
        match cap {
            Some((cap, field)) => format!(
                "({size} != '' && quantity({size}).isGreaterThan(quantity({})) ? ['size ' + {size} + \
                 ' exceeds {}.maxSize.{field} ({cap})'] : [])",
                quote(&cap.to_string()),
                self.policy.origin
            ),
            None => "[]".to_owned(),
        }
    }

    /// The size: a quantity above zero, within the policy's cap for the volume's kind.
    fn size(&self) -> String {
        let t = kind();
        let medium = format!("{KV}[?'medium'].orValue('')");
        let caps = [
            (
                format!("{t} == 'emptyDir' && {medium} == ''"),
                self.policy.max_empty_dir,
                "emptyDir",
            ),
            (
                format!("{t} == 'emptyDir' && {medium} == 'Memory'"),
                self.policy.max_memory,
                "memory",
            ),
            (
                format!("{t} == 'ephemeral'"),
                self.policy.max_ephemeral,
                "ephemeral",
            ),
        ];
        self.size_checks(&format!("{t} in ['emptyDir', 'ephemeral']"), &caps)
    }

    /// The checks of a size given where `applies`: a quantity above zero, within the first of
    /// `caps` whose condition holds.
    fn size_checks(&self, applies: &str, caps: &[(String, Option<Quantity>, &str)]) -> String {
        let s = get("size");
        let mut over = String::new();
        for (cond, cap, field) in caps {
            let Some(cap) = cap else { continue };
            let cap = cap.to_string();
            over.push_str(&format!(
                "{cond} && quantity({s}).isGreaterThan(quantity({})) ? ['size ' + {s} + \
                 ' exceeds {}.maxSize.{field} ({cap})'] : ",
                quote(&cap),
                self.policy.origin
            ));
        }
        format!(
            "({applies} && {} && {s} != 'request' ? (\
             !isQuantity({s}) ? ['size: invalid quantity \"' + {s} + '\"'] \
             : quantity({s}).compareTo(quantity('0')) < 0 ? ['size: invalid quantity \"' + {s} + '\" (negative)'] \
             : quantity({s}).compareTo(quantity('0')) == 0 ? ['size \"' + {s} + '\" is zero, which is no limit at all; give a size above zero'] \
             : {over}[]) : [])",
            given("size")
        )
    }

    /// The problems of `profile=<name>,…`: a profile that is not one, a field a profile does
    /// not let an annotation change, a size the profile's kind does not read or the policy
    /// caps, a mount path neither gives.
    fn with_profile(&self, profiles: &[(&str, &Profile)]) -> String {
        let name = get("profile");
        let defined: Vec<&str> = profiles.iter().map(|(n, _)| *n).collect();
        let mut chain = format!(
            "!({name} in {}) ? ['profile \"' + {name} + '\" is not defined (defined: {})'] ",
            list(defined.iter().copied()),
            defined.join(", ")
        );
        for (n, p) in profiles {
            let kind = p.compiled.kind;
            let size = if kind == VolumeKind::Csi {
                when(
                    &given("size"),
                    "'size does not apply to a CSI inline volume'",
                )
            } else {
                let cap = match (kind, p.compiled.medium) {
                    (VolumeKind::Ephemeral, _) => (self.policy.max_ephemeral, "ephemeral"),
                    (_, Medium::Memory) => (self.policy.max_memory, "memory"),
                    (_, Medium::Disk) => (self.policy.max_empty_dir, "emptyDir"),
                    _ => (None, ""),
                };
                self.size_checks("true", &[("true".to_owned(), cap.0, cap.1)])
            };
            let path = match p.mount.mount_path {
                Some(_) => "[]".to_owned(),
                None => when(
                    &format!("!{}", has("mountPath")),
                    &quote(&format!(
                        "mountPath is required: profile \"{n}\" does not set one"
                    )),
                ),
            };
            chain.push_str(&format!(": {name} == {} ? {size} + {path} ", quote(n)));
        }
        chain.push_str(": []");
        let mut out = vec![
            format!(
                "{KV}.filter(f, (f in {} || f.startsWith('attr.')) && !(f in {})).map(f, f + \
                 ' does not apply to profile=' + {name} + ': a profile fixes the volume source')",
                list(FIELD_NAMES),
                list(PROFILE_FIELDS)
            ),
            format!("({chain})"),
        ];
        out.extend(self.common());
        out.extend(mount_fields(false));
        out.join("\n + ")
    }

    /// The fields of the source a type reads: medium, access mode, storage class, driver; a
    /// size an ephemeral volume cannot do without.
    fn source_fields(&self) -> Vec<String> {
        let t = kind();
        let mut out = vec![
            when(
                &format!(
                    "{t} == 'emptyDir' && {} && !({m} == 'Memory' || {m} == 'HugePages' || {m}.startsWith('HugePages-'))",
                    given("medium"),
                    m = get("medium")
                ),
                &format!(
                    "'medium \"' + {} + '\" is not one of \"\" (node disk), Memory, HugePages'",
                    get("medium")
                ),
            ),
            when(
                &format!(
                    "{t} == 'ephemeral' && {} && !({} in {})",
                    given("accessMode"),
                    get("accessMode"),
                    list(ACCESS_MODES)
                ),
                &format!(
                    "'accessMode \"' + {} + '\" is not one of {}'",
                    get("accessMode"),
                    ACCESS_MODES.join(", ")
                ),
            ),
            when(
                &format!(
                    "{t} == 'ephemeral' && {} && !({sc}.size() <= 253 && {sc}.matches('{SUBDOMAIN}'))",
                    given("storageClass"),
                    sc = get("storageClass")
                ),
                &format!(
                    "'storageClass \"' + {} + '\" is not a DNS-1123 subdomain'",
                    get("storageClass")
                ),
            ),
            when(
                &format!("{t} == 'ephemeral' && !{}", has("size")),
                "'type=ephemeral needs size=<quantity> (e.g. size=100Gi) or size=request'",
            ),
            when(
                &format!("{t} == 'csi' && !{}", has("driver")),
                "'type=csi needs driver=<CSI driver name>'",
            ),
            when(
                &format!(
                    "{t} == 'csi' && {} && !({d}.size() <= 63 && {d}.matches('{SUBDOMAIN}'))",
                    given("driver"),
                    d = get("driver")
                ),
                &format!(
                    "'driver: CSI driver \"' + {} + '\" is not a DNS-1123 subdomain of at most 63 characters'",
                    get("driver")
                ),
            ),
        ];
        out.extend(self.allowlists());
        out
    }

    /// `storageClasses` and `csiDrivers`: the classes and drivers the form may name.
    fn allowlists(&self) -> Vec<String> {
        let t = kind();
        let p = &self.policy.origin;
        let mut out = Vec::new();
        if let Some(classes) = &self.policy.storage_classes {
            let allowed = classes.join(", ");
            out.push(format!(
                "({t} != 'ephemeral' ? [] : {} ? ({} in {} ? [] : ['storage class \"' + {} + \
                 '\" is not in {p}.storageClasses ({allowed})']) : {} ? [] : \
                 ['a storage class is required by {p}.storageClasses ({allowed}); set storageClass'])",
                given("storageClass"),
                get("storageClass"),
                list(classes.iter().map(String::as_str)),
                get("storageClass"),
                has("storageClass"),
            ));
        }
        if let Some(drivers) = &self.policy.csi_drivers {
            out.push(when(
                &format!(
                    "{t} == 'csi' && {} && !({} in {})",
                    given("driver"),
                    get("driver"),
                    list(drivers.iter().map(String::as_str))
                ),
                &format!(
                    "'CSI driver \"' + {} + '\" is not in {p}.csiDrivers ({})'",
                    get("driver"),
                    drivers.join(", ")
                ),
            ));
        }
        out
    }

    /// The size of the emptyDir annotation `k` asks for (`''` for none): its own, else the
    /// policy's default when it requires one (not for HugePages).
    fn empty_dir_size(&self) -> String {
        if self.policy.require_size_limit {
            format!(
                "{KV}[?'size'].orValue({KV}[?'medium'].orValue('').startsWith('HugePages') ? '' : {})",
                quote(&self.policy.default_size_limit_text)
            )
        } else {
            format!("{KV}[?'size'].orValue('')")
        }
    }

    /// The volume annotation `k` asks for (it has no problems), named `n`: the typed object
    /// the webhook would add.
    pub fn volume(&self, n: &str) -> String {
        let v = "Object.spec.volumes";
        let size = self.empty_dir_size();
        let size = format!("({size}) == '' ? optional.none() : optional.of({size})");
        let read_only = format!(
            "{} ? optional.of({} == 'true') : optional.none()",
            has("readOnly"),
            get("readOnly")
        );
        let t = format!("{v}.ephemeral.volumeClaimTemplate");
        format!(
            "({kind} == 'emptyDir' ? {v}{{name: {n}, emptyDir: {v}.emptyDir{{?medium: {KV}[?'medium'], ?sizeLimit: {size}}}}}\
             : {kind} == 'csi' ? {v}{{name: {n}, csi: {v}.csi{{driver: {driver}, ?fsType: {KV}[?'fsType'], \
             ?readOnly: {read_only}, ?volumeAttributes: {attrs}.size() > 0 ? optional.of({attrs}) : optional.none()}}}}\
             : {v}{{name: {n}, ephemeral: {v}.ephemeral{{volumeClaimTemplate: {t}{{spec: {t}.spec{{\
             accessModes: [{KV}[?'accessMode'].orValue('ReadWriteOnce')], ?storageClassName: {KV}[?'storageClass'], \
             resources: {t}.spec.resources{{requests: {{'storage': {size_text}}}}}}}}}}}}})",
            kind = kind(),
            driver = get("driver"),
            attrs = attributes(),
            size_text = get("size"),
        )
    }

    /// Whether the pod's own volume `v` is the one annotation `k` asks for, on the fields the
    /// annotation sets (as a profile's is compared: [`super::cel::same_as`]).
    pub fn same(&self) -> String {
        let t = kind();
        let size = self.empty_dir_size();
        let same_size = |at: &str| {
            format!(
                "(({size}) == '' ? !has({at}) : has({at}) && quantity(string({at})).compareTo(quantity({size})) == 0)"
            )
        };
        let claim = "v.ephemeral.volumeClaimTemplate.spec";
        format!(
            "({t} == 'emptyDir' ? has(v.emptyDir) && (has(v.emptyDir.medium) ? v.emptyDir.medium : '') == {KV}[?'medium'].orValue('') \
               && {empty_dir_size}\
             : {t} == 'csi' ? has(v.csi) && v.csi.driver == {driver} \
               && (has(v.csi.fsType) ? v.csi.fsType : '') == {KV}[?'fsType'].orValue('') \
               && (has(v.csi.volumeAttributes) ? v.csi.volumeAttributes : {{}}) == {attrs}\
             : has(v.ephemeral) && has(v.ephemeral.volumeClaimTemplate) \
               && (has({claim}.storageClassName) ? {claim}.storageClassName : '') == {KV}[?'storageClass'].orValue('') \
               && has({claim}.accessModes) && {claim}.accessModes == [{KV}[?'accessMode'].orValue('ReadWriteOnce')] \
               && has({claim}.resources) && has({claim}.resources.requests) && 'storage' in {claim}.resources.requests \
               && quantity({claim}.resources.requests['storage']).compareTo(quantity({size_text})) == 0)",
            empty_dir_size = same_size("v.emptyDir.sizeLimit"),
            driver = get("driver"),
            attrs = attributes(),
            size_text = get("size"),
        )
    }

    /// The mount path annotation `k` asks for, normalised (`''` without one).
    pub fn path() -> String {
        format!(
            "({} ? {} : '')",
            given("mountPath"),
            normalized(&get("mountPath"))
        )
    }

    /// `f` of annotation `k`, else `default` (a CEL string).
    pub fn field_or(f: &str, default: &str) -> String {
        format!("{KV}[?{}].orValue({default})", quote(f))
    }

    /// The mount path annotation `k` gives, normalised, else `default` (a CEL string).
    pub fn path_or(default: &str) -> String {
        format!(
            "({} ? {} : {default})",
            given("mountPath"),
            normalized(&get("mountPath"))
        )
    }

    /// The variables annotation `k` names, else `default` (a CEL list).
    pub fn env_or(default: &str) -> String {
        format!("({} ? variables.envs[k] : {default})", has("env"))
    }

    /// The size annotation `k` gives, else `default` (`''` without either).
    pub fn size_or(default: Option<&str>) -> String {
        Self::field_or("size", &quote(default.unwrap_or("")))
    }

    /// Annotation `k`'s `readOnly`: `'true'`, `'false'` or `''`.
    pub fn read_only() -> String {
        format!("{KV}[?'readOnly'].orValue('')")
    }

    /// Annotation `k`'s `subPath` (`''` without one).
    pub fn sub_path() -> String {
        format!("{KV}[?'subPath'].orValue('')")
    }

    /// The containers annotation `k` names, else `default` (a CEL list; [`ALL`]: every one).
    pub fn containers_or(default: &str) -> String {
        format!(
            "({} ? {} : {default})",
            has("containers"),
            names("containers")
        )
    }

    /// The init containers annotation `k` names (`true`: [`ALL`], `false`: none), else
    /// `default`.
    pub fn init_containers_or(default: &str) -> String {
        let f = get("initContainers");
        format!(
            "({} ? ({f} == 'true' ? {ALL} : {f} == 'false' ? [] : {}) : {default})",
            has("initContainers"),
            names("initContainers")
        )
    }

    /// Annotation `k`'s variables: the names of its `env` (split once, in `envs`).
    pub fn env() -> String {
        "variables.envs[k]".to_owned()
    }
}

/// `attr.<key>=<value>` pairs as the CSI volume's attributes.
fn attributes() -> String {
    format!(
        "{KV}.transformMapEntry(f, x, f.startsWith('attr.') && f.size() > 5, {{f.substring(5): x}})"
    )
}

/// Each shorthand written that the type does not read, in written order.
fn shorthands() -> String {
    let t = kind();
    let not_for = |k: VolumeKind| match k {
        VolumeKind::EmptyDir => {
            "p[0] in ['storageClass', 'accessMode', 'driver', 'fsType'] || p[0].startsWith('attr.')"
        }
        VolumeKind::Csi => "p[0] in ['size', 'medium', 'storageClass', 'accessMode']",
        VolumeKind::Ephemeral => {
            "p[0] in ['medium', 'driver', 'fsType'] || p[0].startsWith('attr.')"
        }
    };
    format!(
        "{PAIRS}.filter(p, p.size() == 2 && ({t} == 'emptyDir' ? ({}) : {t} == 'csi' ? ({}) : {t} == 'ephemeral' ? ({}) : false))\
         .map(p, p[0] + ' does not apply to type=' + {t})",
        not_for(VolumeKind::EmptyDir),
        not_for(VolumeKind::Csi),
        not_for(VolumeKind::Ephemeral)
    )
}

/// The mount's fields: a mount path (required: the form names no profile that gives one),
/// readOnly, subPath, variables.
fn mount_fields(required: bool) -> Vec<String> {
    let path = get("mountPath");
    let sub = get("subPath");
    let dot_dot = |p: &str| format!("{p}.split('/').exists(x, x == '..')");
    vec![
        if required {
            when(&format!("!{}", has("mountPath")), "'mountPath is required'")
        } else {
            "[]".to_owned()
        },
        format!(
            "({} ? (!{path}.startsWith('/') ? ['mountPath \"' + {path} + '\" must be an absolute path'] \
             : {norm} == '/' ? ['mountPath \"' + {path} + '\" is the container\\'s root; mount the volume below it'] \
             : {dd} ? ['mountPath \"' + {path} + '\" must not contain \\'..\\''] \
             : {path}.contains(':') ? ['mountPath \"' + {path} + '\" must not contain \\':\\' or NUL'] : []) : [])",
            given("mountPath"),
            norm = normalized(&path),
            dd = dot_dot(&path),
        ),
        when(
            &format!(
                "{} && !({} in ['true', 'false'])",
                has("readOnly"),
                get("readOnly")
            ),
            &format!(
                "'readOnly must be true or false, not \"' + {} + '\"'",
                get("readOnly")
            ),
        ),
        format!(
            "({} ? ({sub}.startsWith('/') ? ['subPath \"' + {sub} + '\" must be a relative path'] \
             : {} ? ['subPath \"' + {sub} + '\" must not contain \\'..\\''] : []) : [])",
            given("subPath"),
            dot_dot(&sub)
        ),
        format!(
            "({} ? ({env}.size() == 0 ? ['env is empty'] \
             : {env}.size() > {MAX_PAIRS} ? ['env lists ' + string({env}.size()) + ' names; the admission policies read at most {MAX_PAIRS}'] \
             : {env}.filter(e, !e.matches('^[A-Za-z_.-][A-Za-z0-9_.-]*$'))\
             .map(e, 'env name \"' + e + '\" is not a valid environment variable name')) : [])",
            given("env"),
            env = Form::env()
        ),
    ]
}
