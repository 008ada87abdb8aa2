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

use super::{metrics::ReloadLabel, state::AppState, tls};
use crate::config::Config;

pub struct Watched {
    pub cert: Option<(PathBuf, PathBuf)>,
    pub config: Option<PathBuf>,
    /// The bytes in force: what was loaded at startup, not what a later read finds (a swap
    /// between the two would otherwise never be noticed).
    pub loaded_cert: Option<Vec<u8>>,
    pub loaded_config: Option<Vec<u8>>,
}

#[derive(Default)]
struct Seen {
    cert: Option<Vec<u8>>,
    config: Option<Vec<u8>>,
    /// A certificate and key that disagreed, waiting for one more look.
    mismatch: Option<Vec<u8>>,
    /// The certificate files could not be read at the last look (reported once).
    cert_unreadable: bool,
}

/// The reload counters, by outcome and reason.
type Reloads = prometheus_client::metrics::family::Family<
    ReloadLabel,
    prometheus_client::metrics::counter::Counter,
>;

fn count(family: &Reloads, outcome: &'static str, reason: &'static str) {
    family.get_or_create(&ReloadLabel { outcome, reason }).inc();
}

/// The kubelet's Secret volume layout: the files are symlinks through `..data`, swapped in one
/// atomic rename, so a certificate and key that disagree there are not half-written.
fn kubelet_layout(cert: &Path) -> bool {
    std::fs::symlink_metadata(parent(cert).join("..data")).is_ok_and(|m| m.file_type().is_symlink())
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
        cert: watched.loaded_cert.clone(),
        config: watched.loaded_config.clone(),
        ..Seen::default()
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

/// The certificate and key files as one byte string, to tell whether either changed.
fn read_pair(cert: &Path, key: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = std::fs::read(cert)?;
    bytes.push(0);
    bytes.extend(std::fs::read(key)?);
    Ok(bytes)
}

fn check(state: &AppState, watched: &Watched, seen: &mut Seen) {
    if let Some((cert, key)) = &watched.cert {
        check_certificate(state, cert, key, seen);
    }
    if let Some(path) = &watched.config {
        check_config(state, path, seen);
    }
}

/// One look at the certificate pair: a new pair that loads replaces the old one; one that does
/// not is counted and logged once, and the old one stays in force.
fn check_certificate(state: &AppState, cert: &Path, key: &Path, seen: &mut Seen) {
    let bytes = match read_pair(cert, key) {
        Ok(bytes) => bytes,
        Err(e) => {
            if !seen.cert_unreadable {
                seen.cert_unreadable = true;
                count(&state.metrics.cert_reloads, "failure", "read");
                tracing::warn!(cert = %cert.display(), key = %key.display(), error = %e, "cannot read the certificate or key; the old one stays in force");
            }
            return;
        }
    };
    seen.cert_unreadable = false;
    if seen.cert.as_ref() == Some(&bytes) {
        return;
    }
    // Loaded from the very bytes compared: PEM never holds the NUL that separates them.
    let split = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let (cert_pem, key_pem) = bytes.split_at(split);
    match tls::load_pem(cert_pem, key_pem.get(1..).unwrap_or_default()) {
        Ok(loaded) => {
            state.certs.swap(loaded.key);
            state.metrics.cert_not_after.set(loaded.not_after);
            count(&state.metrics.cert_reloads, "success", "");
            tracing::info!(cert = %cert.display(), not_after = loaded.not_after, "serving certificate reloaded");
            seen.cert = Some(bytes);
            seen.mismatch = None;
        }
        // Half of a plain rewrite gets one more look (the next event or poll); the same
        // pair still disagreeing then, or at once in the kubelet's atomic layout, is a
        // failure.
        Err(tls::TlsError::Mismatch)
            if !kubelet_layout(cert) && seen.mismatch.as_ref() != Some(&bytes) =>
        {
            tracing::debug!("certificate and key disagree; waiting for the other file");
            seen.mismatch = Some(bytes);
        }
        Err(e) => {
            let reason = match e {
                tls::TlsError::Mismatch => "key-mismatch",
                _ => "invalid",
            };
            count(&state.metrics.cert_reloads, "failure", reason);
            tracing::error!(cert = %cert.display(), reason, error = %e, "new certificate refused; the old one stays in force");
            seen.cert = Some(bytes);
            seen.mismatch = None;
        }
    }
}

/// One look at the configuration file: a new one that parses replaces the old one; one that does
/// not is counted and logged, and the old one stays in force.
fn check_config(state: &AppState, path: &Path, seen: &mut Seen) {
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
            .map_err(|e| ("invalid", e.to_string()))
            .and_then(|t| Config::parse(&t).map_err(|e| ("invalid", e.to_string())))
            .and_then(|cfg| needs_no_missing_client(state, cfg)),
        Err(e) => Err(("read", format!("cannot read: {e}"))),
    };
    match result {
        Ok(cfg) => {
            state.config.store(Arc::new(cfg));
            count(&state.metrics.config_reloads, "success", "");
            state.metrics.config_last_reload_ok.set(1);
            tracing::info!(config = %path.display(), "configuration reloaded");
        }
        Err((reason, e)) => {
            count(&state.metrics.config_reloads, "failure", reason);
            state.metrics.config_last_reload_ok.set(0);
            tracing::error!(config = %path.display(), reason, error = %e, "new configuration refused; the old one stays in force");
        }
    }
    seen.config = bytes.ok();
}

/// A configuration that turns the cluster checks on while the process has no API client for
/// them (it started with them off, and its client could not be built) is refused: they would
/// be silently off.
fn needs_no_missing_client(
    state: &AppState,
    cfg: Config,
) -> Result<Config, (&'static str, String)> {
    match &state.no_client {
        Some(why) if cfg.reads_cluster() => Err((
            "cluster",
            format!(
                "clusterChecks is on, or a policy override selects namespaces by label, but this process has no API client to read the cluster ({why}); restart it with working credentials"
            ),
        )),
        _ => Ok(cfg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::state::test_state;

    fn reloads(family: &Reloads, outcome: &'static str, reason: &'static str) -> u64 {
        family.get_or_create(&ReloadLabel { outcome, reason }).get()
    }

    fn write_pair(dir: &Path, cert_pem: &str, key_pem: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, cert_pem).unwrap();
        std::fs::write(&key, key_pem).unwrap();
        (cert, key)
    }

    #[test]
    fn an_unreadable_certificate_is_counted_once_and_a_good_one_then_loads() {
        let state = test_state("{}");
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let mut seen = Seen::default();
        let m = &state.metrics.cert_reloads;

        check_certificate(&state, &cert, &key, &mut seen);
        check_certificate(&state, &cert, &key, &mut seen);
        assert_eq!(
            reloads(m, "failure", "read"),
            1,
            "reported once, not per look"
        );

        let pair = tls::self_signed(&["evi.example"]).unwrap();
        write_pair(dir.path(), &pair.cert_pem, &pair.key_pem);
        check_certificate(&state, &cert, &key, &mut seen);
        check_certificate(&state, &cert, &key, &mut seen);
        assert_eq!(reloads(m, "success", ""), 1, "unchanged bytes load once");

        std::fs::remove_file(&key).unwrap();
        check_certificate(&state, &cert, &key, &mut seen);
        assert_eq!(
            reloads(m, "failure", "read"),
            2,
            "a new outage is reported again"
        );
    }

    #[test]
    fn a_key_that_disagrees_gets_one_more_look_then_is_refused() {
        let state = test_state("{}");
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (
            tls::self_signed(&["a.example"]).unwrap(),
            tls::self_signed(&["b.example"]).unwrap(),
        );
        let (cert, key) = write_pair(dir.path(), &a.cert_pem, &b.key_pem);
        let mut seen = Seen::default();
        let m = &state.metrics.cert_reloads;

        check_certificate(&state, &cert, &key, &mut seen);
        assert_eq!(
            reloads(m, "failure", "key-mismatch"),
            0,
            "half a rewrite waits"
        );
        check_certificate(&state, &cert, &key, &mut seen);
        assert_eq!(reloads(m, "failure", "key-mismatch"), 1);
        assert_eq!(reloads(m, "success", ""), 0);

        write_pair(dir.path(), &b.cert_pem, &b.key_pem);
        check_certificate(&state, &cert, &key, &mut seen);
        assert_eq!(reloads(m, "success", ""), 1, "the matching pair loads");
    }

    #[test]
    fn a_bad_or_empty_configuration_never_replaces_a_good_one() {
        let state = test_state("{}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        let mut seen = Seen::default();
        let m = &state.metrics.config_reloads;
        let profiles = |s: &AppState| s.config.load().profiles.len();
        let before = profiles(&state);

        std::fs::write(&path, "profiles: {scratch: {emptyDir: {}}}\n").unwrap();
        check_config(&state, &path, &mut seen);
        assert_eq!(reloads(m, "success", ""), 1);
        assert_eq!(profiles(&state), 1, "the new configuration is in force");
        assert_ne!(before, 1);

        std::fs::write(&path, "\n  \n").unwrap();
        check_config(&state, &path, &mut seen);
        assert_eq!(
            reloads(m, "failure", "invalid"),
            0,
            "an empty file is waited for"
        );

        std::fs::write(&path, "profiles: {scratch: {nfs: {}}}\n").unwrap();
        check_config(&state, &path, &mut seen);
        check_config(&state, &path, &mut seen);
        assert_eq!(
            reloads(m, "failure", "invalid"),
            1,
            "refused once per new content"
        );
        assert_eq!(profiles(&state), 1, "the good configuration stays");
        let last_ok = |s: &AppState| s.metrics.config_last_reload_ok.get();
        assert_eq!(last_ok(&state), 0, "the alert sees the refusal");

        std::fs::write(
            &path,
            "profiles: {scratch: {emptyDir: {}}, ram: {emptyDir: {medium: Memory}}}\n",
        )
        .unwrap();
        check_config(&state, &path, &mut seen);
        assert_eq!((profiles(&state), last_ok(&state)), (2, 1), "fixed");

        std::fs::remove_file(&path).unwrap();
        check_config(&state, &path, &mut seen);
        assert_eq!(reloads(m, "failure", "read"), 1);
        assert_eq!((profiles(&state), last_ok(&state)), (2, 0));
    }

    #[test]
    fn checks_without_a_client_are_refused_not_silently_off() {
        let mut state = Arc::into_inner(test_state("clusterChecks: off")).unwrap();
        state.no_client = Some("API client: invalid peer certificate".into());
        let state = Arc::new(state);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        let mut seen = Seen::default();
        std::fs::write(&path, "clusterChecks: enforce\n").unwrap();
        check_config(&state, &path, &mut seen);
        assert_eq!(
            reloads(&state.metrics.config_reloads, "failure", "cluster"),
            1
        );
        assert_eq!(
            state.config.load().cluster_checks,
            crate::cluster::Mode::Off,
            "the old configuration stays"
        );
        std::fs::write(&path, "clusterChecks: off\nprofiles: {s: {emptyDir: {}}}\n").unwrap();
        check_config(&state, &path, &mut seen);
        assert_eq!(reloads(&state.metrics.config_reloads, "success", ""), 1);
    }
}
