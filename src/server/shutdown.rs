//! Shutdown: the signals, then the drain (unready, a delay for endpoints to notice, GOAWAY and
//! keep-alive off, in-flight requests finished within the grace period).

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::net::TcpListener;

use super::{
    args::Timing,
    listener::{Port, accept_backlog, accept_loop},
    logging::flush_log,
    state::AppState,
};

/// Resolves at the first SIGTERM or SIGINT; a second one exits the process at once.
pub(super) async fn shutdown_signal() {
    // One set of listeners for both signals: a listener made only after the first signal
    // would miss a second one sent before it was first polled (tokio delivers to a listener
    // only what arrives once it exists, and its handler keeps the default action away).
    let mut signals = Signals::new();
    signals.recv().await;
    tokio::spawn(async move {
        signals.recv().await;
        tracing::warn!("second signal: exiting now");
        flush_log();
        std::process::exit(1);
    });
}

/// SIGTERM and SIGINT, each a listener that keeps a signal sent while nobody waits for it.
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind: SignalKind, name: &str| {
                signal(kind)
                    .inspect_err(|e| {
                        tracing::warn!(error = %e, signal = name, "cannot listen for the signal");
                    })
                    .ok()
            };
            Signals {
                term: listen(SignalKind::terminate(), "SIGTERM"),
                int: listen(SignalKind::interrupt(), "SIGINT"),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// The next SIGTERM or SIGINT (Ctrl-C elsewhere); never, for a signal that could not be
    /// listened to.
    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = next(&mut self.term) => {}
                () = next(&mut self.int) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// After the shutdown signal: not ready at once, connections still accepted for the drain
/// delay, then no new ones; keep-alive ends after the request in flight and HTTP/2 gets
/// GOAWAY; the in-flight requests have the grace period to finish.
pub(super) async fn drain(
    state: &AppState,
    listener: TcpListener,
    webhook: &Port,
    stop_webhook: tokio::sync::watch::Sender<bool>,
    timing: &Timing,
) {
    state.ready.store(false, Ordering::SeqCst);
    tracing::info!(drain_delay = ?timing.drain_delay, "shutting down: not ready");
    if !timing.drain_delay.is_zero() {
        accept_loop(&listener, webhook, tokio::time::sleep(timing.drain_delay)).await;
    }
    accept_backlog(listener, webhook).await;
    let _ = stop_webhook.send(true);
    tokio::select! {
        _ = webhook.closed() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(timing.grace) => tracing::warn!(grace = ?timing.grace, "grace period over; exiting with connections open"),
    }
}

/// The admin port closes last, so probes and scrapes see the whole drain.
pub(super) async fn close_admin(
    stop_admin: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    admin: Arc<Port>,
) {
    let _ = stop_admin.send(true);
    let _ = task.await;
    let _ = tokio::time::timeout(Duration::from_secs(1), admin.closed()).await;
}
