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
            // Each error names its place in the file or the YAML position.
            prop_assert!(!errors.is_empty());
            for e in &errors {
                prop_assert!((e.contains(':') || e.contains('"')) && e.len() > 10, "an error that names nothing: {e:?}");
            }
        }
    }

    #[test]
    fn arbitrary_annotation_values_parse_or_fail_with_a_message(value in "\\PC{0,80}") {
        match value.parse::<evi::volume::VolumeRequest>() {
            // A refusal names a field, the form, or the value it could not read.
            Err(e) => prop_assert!(
                ["field", "profile", "JSON", "key=value", "value", "source", "type", "mountPath", "size",
                 "env", "container", "name", "attr", "given", "medium", "driver", "accessMode", "storageClass",
                 "fsType", "subPath", "readOnly", "apply", "quantity"]
                    .iter().any(|w| e.0.contains(w)),
                "{value:?}: a message that names nothing: {}", e.0),
            // Whatever is accepted has exactly one source and a valid mount path, if any.
            Ok(req) => if let Some(p) = &req.mount.mount_path {
                prop_assert!(p.starts_with('/') && p != "/" && !p.ends_with('/'), "{value:?}: mountPath {p:?}");
            },
        }
    }
}

#[test]
fn inputs_that_once_crashed_a_fuzz_target_stay_fixed() {
    let cfg = config();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz-regressions");
    let mut seen = 0;
    for target in ["annotation", "config", "review"] {
        let Ok(entries) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in entries {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
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
