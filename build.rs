//! Records the commit the binary is built from, for `--version`: `EVI_COMMIT` when the build
//! sets it (the Dockerfile's build argument, a release workflow), else `git rev-parse`, else
//! `unknown` (a source tarball).
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=EVI_COMMIT");
    let commit = match std::env::var("EVI_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => {
            // Rebuilt when HEAD moves (a commit or a checkout), not on every edit.
            if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
                println!("cargo:rerun-if-changed={dir}/HEAD");
                if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    println!("cargo:rerun-if-changed={dir}/{head}");
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"])
                .filter(|sha| !sha.is_empty())
                .unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=EVI_COMMIT={commit}");
}
