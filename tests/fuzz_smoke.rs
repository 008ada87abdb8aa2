#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! The fuzz targets' oracles on stable Rust, so CI catches a regression without nightly:
//! mutated fixtures through the configuration parser and the review handler, plus every input
//! that ever crashed a fuzz target (tests/data/fuzz-regressions/<target>/*).

use std::path::Path;

use base64::{Engine as _, engine::general_purpose::STANDARD};
use evi::{config::Config, review};
use proptest::prelude::*;
use serde_json::Value;

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

/// The review target's oracle.
fn review_oracle(cfg: &Config, data: &[u8]) {
    let Ok(handled) = review::handle(cfg, data) else {
        return;
    };
    let response: Value = serde_json::from_slice(&handled.body).expect("response is JSON");
    let r = &response["response"];
    assert!(r["allowed"].is_boolean());
    assert_eq!(r.get("patch").is_some(), r.get("patchType").is_some());
    if let Some(patch) = r.get("patch").and_then(Value::as_str) {
        let patch: json_patch::Patch =
            serde_json::from_slice(&STANDARD.decode(patch).unwrap()).unwrap();
        // serde skips ignored fields without checking their escapes; a body only that lenient
        // parse accepts cannot be replayed here (the API server never sends one).
        let Ok(request) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        let mut object = request["request"]["object"].clone();
        json_patch::patch(&mut object, &patch).expect("the patch applies to the object");
    }
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
        review_oracle(&config(), &mutate(&fixture("review.json"), &edits));
    }

    #[test]
    fn mutated_configurations_parse_or_list_errors(edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..6)) {
        let data = mutate(&fixture("config.yaml"), &edits);
        if let Ok(text) = std::str::from_utf8(&data)
            && let Err(evi::config::ConfigError::Invalid(errors)) = Config::parse(text)
        {
            prop_assert!(!errors.is_empty());
        }
    }

    #[test]
    fn arbitrary_annotation_values_parse_or_fail_with_a_message(value in "\\PC{0,80}") {
        if let Err(e) = value.parse::<evi::annotation::VolumeRequest>() {
            prop_assert!(!e.0.is_empty());
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
                    let _ =
                        String::from_utf8_lossy(&data).parse::<evi::annotation::VolumeRequest>();
                }
                "config" => {
                    let _ = Config::parse(&String::from_utf8_lossy(&data));
                }
                _ => review_oracle(&cfg, &data),
            }
        }
    }
    eprintln!("{seen} regression inputs replayed");
}
