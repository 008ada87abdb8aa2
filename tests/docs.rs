#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! The documentation stands alone and keeps up with the code: every relative link in the
//! README, `docs/`, the chart's README and the contributor pages leads to a file of the
//! repository, and so does every repository path they name in code spans; every `serve` flag
//! and every metric is in `docs/operations.md`; the bounds, limits and HTTP versions the pages
//! state are the program's.

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

/// 1024 → "1,024", as the docs write numbers.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// 16384 → "16 KiB", as the docs write sizes.
fn size(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// The table "Bounds of one review" states the program's own constants, row by row.
#[test]
fn the_bounds_the_docs_state_are_the_programs() {
    use evi::{annotation, echo, engine::bounds, validate};
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let table = doc
        .split("## Bounds of one review")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .unwrap();
    let value_of = |row: &str| -> String {
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("| {row}")))
            .unwrap_or_else(|| panic!("no row {row:?} in the bounds table"));
        line.split('|').nth(2).unwrap().trim().to_string()
    };
    let rows: [(&str, Vec<String>); 11] = [
        (
            "volumes one pod asks for",
            vec![bounds::MAX_VOLUMES.to_string()],
        ),
        (
            "one volume annotation's value",
            vec![size(bounds::MAX_VALUE_BYTES)],
        ),
        (
            "a JSON value's nesting",
            vec![format!("{} levels", validate::MAX_JSON_DEPTH)],
        ),
        (
            "names in one list",
            vec![thousands(annotation::MAX_LIST_NAMES)],
        ),
        (
            "unknown fields of one volume source named",
            vec![validate::UNKNOWN_LIMIT.to_string()],
        ),
        (
            "the patch's operations",
            vec![thousands(bounds::MAX_PATCH_OPERATIONS)],
        ),
        ("the patch's bytes", vec![size(bounds::MAX_PATCH_BYTES)]),
        (
            "near-miss hints",
            vec![bounds::MAX_PREFIXES_MEASURED.to_string()],
        ),
        (
            "warnings in one response",
            vec![bounds::MAX_WARNINGS.to_string(), size(echo::WARNING_LIMIT)],
        ),
        (
            "names a message lists",
            vec![echo::LIST_LIMIT.to_string(), size(echo::VALUE_LIMIT)],
        ),
        ("a denial message", vec![size(echo::MESSAGE_LIMIT)]),
    ];
    for (row, wanted) in rows {
        let stated = value_of(row);
        for w in wanted {
            assert!(
                stated.contains(&w),
                "{row}: the docs say {stated:?}, the program {w}"
            );
        }
    }
    // The same numbers where other pages state them in prose.
    let pages: Vec<(PathBuf, String)> = pages()
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    let claims: [(&str, &str, usize); 4] = [
        ("cut at ", " bytes", echo::VALUE_LIMIT),
        ("says at most ", " problems", validate::MAX_PROBLEMS),
        ("ask for at most ", " volumes", bounds::MAX_VOLUMES),
        ("names at most ", " names", annotation::MAX_LIST_NAMES),
    ];
    let mut found = 0;
    for (page, text) in &pages {
        let text = text.replace('\n', " ");
        for (before, after, value) in claims {
            for rest in text.split(before).skip(1) {
                let Some((number, _)) = rest.split_once(after) else {
                    continue;
                };
                let Ok(n) = number.replace(',', "").parse::<usize>() else {
                    continue;
                };
                found += 1;
                assert_eq!(n, value, "{}: \"{before}{number}{after}\"", page.display());
            }
        }
    }
    assert!(
        found >= 4,
        "only {found} claims found: is the search broken?"
    );
}

/// Which HTTP version the API server speaks to webhooks is said one way: HTTP/2, all calls
/// over one connection (what the scale benchmark saw) — in the docs and in `serve --help`.
#[test]
fn the_docs_and_help_say_one_thing_of_the_api_servers_http_version() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_ephemeral-volume-injector"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let mut texts = vec![(
        "serve --help".to_string(),
        String::from_utf8(help.stdout).unwrap(),
    )];
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        texts.push((page.display().to_string(), text));
    }
    let mut says_h2 = Vec::new();
    for (name, text) in &texts {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        // Sentences, table cells and flags' help each on their own.
        let parts = text.split(". ").flat_map(|s| s.split("; "));
        for sentence in parts
            .flat_map(|s| s.split(" | "))
            .flat_map(|s| s.split(" --"))
        {
            if !sentence.contains("API server") {
                continue;
            }
            let speaks = sentence
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| ["speaks", "uses", "sends"].contains(&w));
            if speaks && sentence.contains("HTTP/1.1") && !sentence.contains("HTTP/2") {
                panic!("{name} says the API server speaks HTTP/1.1 to webhooks: {sentence:?}");
            }
            if speaks && sentence.contains("HTTP/2") && sentence.contains("one") {
                says_h2.push(name.clone());
            }
        }
    }
    for needed in ["serve --help", "docs/operations.md"] {
        assert!(
            says_h2.iter().any(|n| n.ends_with(needed)),
            "{needed} does not say the API server speaks HTTP/2 to webhooks ({says_h2:?})"
        );
    }
}
