#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! The fuzz targets' oracles on stable Rust, so CI catches a regression without nightly:
//! mutated fixtures through the configuration parser and the review handler, plus every input
//! that ever crashed a fuzz target or its oracle (tests/data/fuzz-regressions/<target>/*).

use std::path::Path;

use evi::config::Config;
use proptest::prelude::*;

#[path = "common/oracle.rs"]
mod oracle;

fn fixture(p: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(p),
    )
    .unwrap()
}

fn config() -> Config {
    Config::parse(std::str::from_utf8(&fixture("config.yaml")).unwrap()).unwrap()
}

fn mutate(seed: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut data = seed.to_vec();
    for &(pos, byte, kind) in edits {
        if data.is_empty() {
            break;
        }
        let i = pos % data.len();
        match kind % 3 {
            0 => data[i] = byte,
            1 => data.insert(i, byte),
            _ => {
                data.remove(i);
            }
        }
    }
    data
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_reviews_get_a_valid_response_or_an_error(edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..6)) {
        oracle::check_review(&config(), &mutate(&fixture("review.json"), &edits));
    }

    #[test]
    fn mutated_configurations_parse_or_list_errors(edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..6)) {
        let data = mutate(&fixture("config.yaml"), &edits);
        if let Ok(text) = std::str::from_utf8(&data)
            && let Err(evi::config::ConfigError::Invalid(errors)) = Config::parse(text)
        {
            // Each error names its place in the file (a path from a top-level key), the
            // unknown key as written, or says the text is not YAML (or not a mapping).
            prop_assert!(!errors.is_empty());
            for e in &errors {
                let top = e.split(['.', '[', ':', ' ']).next().unwrap_or_default();
                // The key is a JSON string at the front; it may hold a `;` itself.
                let unknown = e.strip_prefix("unknown field ").and_then(|r| {
                    serde_json::Deserializer::from_str(r).into_iter::<String>().next()?.ok()
                });
                prop_assert!(
                    (TOP_LEVEL.contains(&top) && e[top.len()..].starts_with(['.', '[', ':', ' ']))
                        || unknown.is_some_and(|k| text.contains(&k))
                        || e.starts_with("not valid YAML: ")
                        || e.starts_with("the configuration: "),
                    "an error that names no place: {e:?}");
            }
        }
    }

    #[test]
    fn arbitrary_annotation_values_parse_or_fail_with_a_message(value in "\\PC{0,80}") {
        match value.parse::<evi::volume::VolumeRequest>() {
            Err(e) => prop_assert!(names_its_input(&value, &e.0), "{value:?}: a message that names nothing it was given: {}", e.0),
            // Whatever is accepted has exactly one source and a valid mount path, if any.
            Ok(req) => if let Some(p) = &req.mount.mount_path {
                prop_assert!(p.starts_with('/') && p != "/" && !p.ends_with('/'), "{value:?}: mountPath {p:?}");
            },
        }
    }

    /// One bad value among good fields, in any order: the refusal names that field and quotes
    /// the value as written — what a user needs to find the typo in a Nextflow config.
    #[test]
    fn a_bad_value_is_quoted_and_its_field_named(
        bad in prop::sample::select(BAD_VALUES.to_vec()),
        extra in prop::sample::subsequence(vec!["size=1Gi", "readOnly=true", "env=TMPDIR", "containers=main"], 0..=4),
        shuffle in any::<u64>(),
    ) {
        let (field, named, value) = bad;
        let mut pairs: Vec<String> = vec!["type=emptyDir".into(), "mountPath=/scratch".into()];
        pairs.extend(extra.iter().filter(|p| !p.starts_with(field)).map(|p| (*p).to_owned()));
        pairs.retain(|p| !p.starts_with(&format!("{field}=")));
        pairs.push(format!("{field}={value}"));
        let n = pairs.len();
        pairs.rotate_left((shuffle % n as u64) as usize);
        let text = pairs.join(",");
        let e = text.parse::<evi::volume::VolumeRequest>().expect_err(&text);
        prop_assert!(e.0.contains(&format!("{value:?}")), "{text:?}: the value is not quoted: {}", e.0);
        prop_assert!(e.0.contains(named), "{text:?}: the field {named} is not named: {}", e.0);
    }
}

/// The configuration file's top-level keys.
const TOP_LEVEL: [&str; 6] = [
    "annotationPrefix",
    "onError",
    "clusterChecks",
    "profiles",
    "rules",
    "policy",
];

/// A field, the words its refusal names it by, and a bad value for it.
const BAD_VALUES: [(&str, &str, &str); 10] = [
    ("size", "size", "10Gii"),
    ("size", "size", "-1Gi"),
    ("medium", "medium", "Disk"),
    ("mountPath", "mountPath", "scratch"),
    ("env", "env name", "1x"),
    ("subPath", "subPath", "/abs"),
    ("subPath", "subPath", "../x"),
    ("containers", "container name", "Bad_Name"),
    ("readOnly", "readOnly", "maybe"),
    ("type", "type", "foo"),
];

/// Whether a refusal names what it is about in the input: a piece of the input quoted (a
/// value, a key: `unknown field "sizee"`, `invalid quantity "10Gii"`), or a field the input
/// gives (`mountPath is given twice`), or, for an empty value or broken JSON, says so. A
/// message that only says "invalid" — or names a field the user never wrote without quoting
/// what they did write — fails it. Something missing (no source, no driver) must name the
/// fields that would supply it.
fn names_its_input(value: &str, message: &str) -> bool {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return message.contains("empty");
    }
    if trimmed.starts_with('{') && message.starts_with("invalid JSON: ") {
        return message.contains("line ") && message.contains("column ");
    }
    let mut pieces = vec![value.to_owned(), trimmed.to_owned()];
    for part in value.split(',') {
        pieces.push(part.to_owned());
        pieces.push(part.trim().to_owned());
        if let Some((k, v)) = part.split_once('=') {
            pieces.extend([k, k.trim(), v, v.trim()].map(str::to_owned));
            pieces.extend(v.split(';').map(str::to_owned));
        }
    }
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(trimmed) {
        for (k, v) in map {
            pieces.push(k);
            if let serde_json::Value::String(s) = v {
                pieces.push(s);
            }
        }
    }
    // Quoted whole, or (a long one) cut where it is quoted.
    let quoted = pieces
        .iter()
        .any(|p| message.contains(&evi::echo::quoted(p)));
    // A field named in the message's own words must be one the input gives.
    let named_field = pieces.iter().any(|p| {
        let p = p.trim();
        !p.is_empty()
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
            && (message.starts_with(&format!("{p} "))
                || message.starts_with(&format!("{p}:"))
                || message.starts_with(&format!("{p}=")))
    });
    // Something missing: the message names the fields that would supply it.
    let names_the_missing = (message.contains("give") || message.contains("needs"))
        && GRAMMAR.iter().any(|f| message.contains(f));
    quoted || named_field || names_the_missing
}

const GRAMMAR: [&str; 18] = [
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
    "attr.",
    "mountPath",
    "readOnly",
    "subPath",
    "containers",
    "initContainers",
    "env",
];

#[test]
fn inputs_that_once_crashed_a_fuzz_target_stay_fixed() {
    let cfg = config();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz-regressions");
    let mut seen = 0;
    for target in ["annotation", "config", "review"] {
        // Each target's folder exists (a .gitkeep for none yet): a renamed or lost folder must
        // fail here, not replay nothing.
        let dir = root.join(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (a regression folder per fuzz target)",
                dir.display()
            )
        });
        for entry in entries {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n == ".gitkeep") {
                continue;
            }
            let data = std::fs::read(&path).unwrap();
            seen += 1;
            match target {
                "annotation" => {
                    let _ = String::from_utf8_lossy(&data).parse::<evi::volume::VolumeRequest>();
                }
                "config" => {
                    let _ = Config::parse(&String::from_utf8_lossy(&data));
                }
                _ => oracle::check_review(&cfg, &data),
            }
        }
    }
    assert!(
        seen > 0,
        "no regression input found under {}",
        root.display()
    );
}
