#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! The documentation stands alone and keeps up with the code: every relative link in the
//! README, `docs/` and the chart's README leads to a file of the repository; every `serve` flag
//! and every metric is in `docs/operations.md`.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        root().join("README.md"),
        root().join("charts/ephemeral-volume-injector/README.md"),
    ];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        pages.push(entry.unwrap().path());
    }
    pages
}

#[test]
fn relative_links_lead_to_files_of_the_repository() {
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for link in text.split("](").skip(1) {
            let target = link.split(')').next().unwrap();
            let path = target.split('#').next().unwrap();
            if path.is_empty() || path.contains("://") {
                continue;
            }
            let resolved = page.parent().unwrap().join(path);
            assert!(
                resolved.exists(),
                "{}: link {target:?} leads nowhere",
                page.display()
            );
            checked += 1;
        }
        for outside in ["SPEC", "../shared", "NEXTFLOW.md", "STYLE.md"] {
            assert!(
                !text.contains(outside),
                "{}: refers to {outside}, which is not part of the project",
                page.display()
            );
        }
    }
    assert!(
        checked > 10,
        "only {checked} links found: is the parser broken?"
    );
}

#[test]
fn every_serve_flag_and_metric_is_documented() {
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_ephemeral-volume-injector"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let flags: Vec<&str> = help
        .split_whitespace()
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()))
        .filter(|w| *w != "--help")
        .collect();
    assert!(flags.len() > 15, "{help}");
    for flag in flags {
        assert!(
            doc.contains(&format!("`{flag}`")),
            "{flag} is not in docs/operations.md"
        );
    }
    // The names registered in src/server/metrics.rs: the string after each `register(`.
    let metrics = std::fs::read_to_string(root().join("src/server/metrics.rs")).unwrap();
    let registered: Vec<String> = metrics
        .split("register(")
        .skip(1)
        .filter_map(|r| r.split('"').nth(1))
        .map(|n| format!("evi_{n}"))
        .collect();
    assert!(registered.len() > 10, "{registered:?}");
    for name in registered {
        assert!(doc.contains(&name), "{name} is not in docs/operations.md");
    }
}
