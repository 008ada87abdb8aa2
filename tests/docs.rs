#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! The documentation stands alone and keeps up with the code: every relative link in the
//! README, `docs/`, the chart's README and the contributor pages leads to a file of the
//! repository, and so does every repository path they name in code spans; every `serve` flag
//! and every metric is in `docs/operations.md`.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        root().join("README.md"),
        root().join("CONTRIBUTING.md"),
        root().join("benches/README.md"),
        root().join("fuzz/README.md"),
        root().join("tests/e2e/README.md"),
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
            assert!(
                resolved
                    .canonicalize()
                    .unwrap()
                    .starts_with(root().canonicalize().unwrap()),
                "{}: link {target:?} leaves the repository",
                page.display()
            );
            checked += 1;
        }
    }
    assert!(
        checked > 10,
        "only {checked} links found: is the parser broken?"
    );
}

/// Every repository path a page names in a code span (`src/engine/plan.rs`,
/// `tests/golden/<case>/` excepted for its placeholder) is a file or folder of the repository:
/// a renamed file cannot leave the docs pointing at nothing, and no page sends a reader to a
/// file that is not part of the project.
#[test]
fn repository_paths_named_in_the_docs_exist() {
    const TOP: [&str; 11] = [
        "src/", "tests/", "docs/", "charts/", "benches/", "fuzz/", "certs/", ".ci/", "Makefile",
        "release/", ".github/",
    ];
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (i, span) in text.split('`').enumerate() {
            // Odd pieces are inside code spans; a path is one word.
            let word = span.split_whitespace().next().unwrap_or_default();
            if i % 2 == 0 || word != span.trim() || !TOP.iter().any(|t| word.starts_with(t)) {
                continue;
            }
            if word.contains(['<', '*', '{', '…', '$']) {
                continue;
            }
            let path = word.trim_end_matches([':', ',', '.', ')']);
            assert!(
                root().join(path).exists(),
                "{}: names `{word}`, which is not in the repository",
                page.display()
            );
            checked += 1;
        }
    }
    assert!(
        checked > 20,
        "only {checked} paths found: is the parser broken?"
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
