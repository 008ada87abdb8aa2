//! Hot reload of the certificate and the configuration.
//!
//! The parent directories are watched (not the files): the kubelet updates a Secret or
//! ConfigMap volume by swapping the `..data` symlink, which changes no watched file's inode.
//! Every event, and a periodic poll as a safety net, re-reads the files and acts only when
//! their bytes changed. A file that does not load is refused and the old one stays in force.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::{AppState, metrics::OutcomeLabel, tls};
use crate::config::Config;

pub struct Watched {
    pub cert: Option<(PathBuf, PathBuf)>,
    pub config: Option<PathBuf>,
}

#[derive(Default)]
struct Seen {
    cert: Option<Vec<u8>>,
    config: Option<Vec<u8>>,
}

pub async fn run(state: Arc<AppState>, watched: Watched, poll: Duration) {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let watcher = notify::recommended_watcher(move |_event: notify::Result<notify::Event>| {
        // A full channel already means "look again"; dropping the extra wake-up is fine.
        let _ = tx.try_send(());
    });
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some((c, k)) = &watched.cert {
        dirs.push(parent(c));
        dirs.push(parent(k));
    }
    if let Some(c) = &watched.config {
        dirs.push(parent(c));
    }
    dirs.sort();
    dirs.dedup();
    let _watcher = match watcher {
        Ok(mut w) => {
            for d in &dirs {
                if let Err(e) = w.watch(d, RecursiveMode::NonRecursive) {
                    tracing::warn!(dir = %d.display(), error = %e, "cannot watch; relying on polling");
                }
            }
            Some(w)
        }
        Err(e) => {
            tracing::warn!(error = %e, "file watching unavailable; relying on polling");
            None
        }
    };

    let mut seen = Seen {
        cert: watched
            .cert
            .as_ref()
            .and_then(|(c, k)| read_pair(c, k).ok()),
        config: watched.config.as_ref().and_then(|c| std::fs::read(c).ok()),
    };
    let mut tick = tokio::time::interval(poll);
    tick.tick().await;
    loop {
        tokio::select! {
            got = rx.recv() => {
                if got.is_none() { return; }
                // Let a burst of events (a symlink swap is several) settle.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while rx.try_recv().is_ok() {}
            }
            _ = tick.tick() => {}
        }
        check(&state, &watched, &mut seen);
    }
}

fn parent(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn read_pair(cert: &Path, key: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = std::fs::read(cert)?;
    bytes.push(0);
    bytes.extend(std::fs::read(key)?);
    Ok(bytes)
}

fn check(state: &AppState, watched: &Watched, seen: &mut Seen) {
    if let Some((cert, key)) = &watched.cert
        && let Ok(bytes) = read_pair(cert, key)
        && seen.cert.as_ref() != Some(&bytes)
    {
        match tls::load_files(cert, key) {
            Ok(loaded) => {
                state.certs.swap(loaded.key);
                state.metrics.cert_not_after.set(loaded.not_after);
                state
                    .metrics
                    .cert_reloads
                    .get_or_create(&OutcomeLabel { outcome: "success" })
                    .inc();
                tracing::info!(cert = %cert.display(), not_after = loaded.not_after, "serving certificate reloaded");
                seen.cert = Some(bytes);
            }
            // A half-written pair is retried on the next event or poll; it is not remembered.
            Err(tls::TlsError::Mismatch) => {
                tracing::debug!("certificate and key disagree; waiting for the other file");
            }
            Err(e) => {
                state
                    .metrics
                    .cert_reloads
                    .get_or_create(&OutcomeLabel { outcome: "failure" })
                    .inc();
                tracing::error!(cert = %cert.display(), error = %e, "new certificate refused; the old one stays in force");
                seen.cert = Some(bytes);
            }
        }
    }
    if let Some(path) = &watched.config {
        let bytes = std::fs::read(path);
        // A plain rewrite truncates before it writes; an empty file seen in between would
        // silently mean "defaults". Wait for content (write `{}` to mean defaults).
        if bytes
            .as_ref()
            .is_ok_and(|b| b.iter().all(u8::is_ascii_whitespace))
        {
            tracing::debug!(config = %path.display(), "configuration file is empty; waiting for content");
            return;
        }
        let changed = match &bytes {
            Ok(b) => seen.config.as_ref() != Some(b),
            Err(_) => seen.config.is_some(),
        };
        if !changed {
            return;
        }
        let result = match &bytes {
            Ok(b) => String::from_utf8(b.clone())
                .map_err(|e| e.to_string())
                .and_then(|t| Config::parse(&t).map_err(|e| e.to_string())),
            Err(e) => Err(format!("cannot read: {e}")),
        };
        match result {
            Ok(cfg) => {
                state.config.store(Arc::new(cfg));
                state
                    .metrics
                    .config_reloads
                    .get_or_create(&OutcomeLabel { outcome: "success" })
                    .inc();
                tracing::info!(config = %path.display(), "configuration reloaded");
            }
            Err(e) => {
                state
                    .metrics
                    .config_reloads
                    .get_or_create(&OutcomeLabel { outcome: "failure" })
                    .inc();
                tracing::error!(config = %path.display(), error = %e, "new configuration refused; the old one stays in force");
            }
        }
        seen.config = bytes.ok();
    }
}
