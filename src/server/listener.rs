//! The listening ports: connections accepted up to each port's cap, each served on its own
//! task (TLS first on the webhook port).

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use axum::Router;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::OwnedSemaphorePermit,
};
use tokio_rustls::TlsAcceptor;

use super::{
    connection,
    metrics::{CauseLabel, PortLabel},
    state::AppState,
};

/// A listening port: what it serves, its bounds and its connection cap.
pub(super) struct Port {
    pub name: &'static str,
    pub app: Router,
    pub tls: Option<TlsAcceptor>,
    pub bounds: connection::Bounds,
    pub cap: usize,
    pub permits: Arc<tokio::sync::Semaphore>,
    pub state: Arc<AppState>,
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// The connections being served, for the cap to find an idle one to close.
    pub connections: Arc<Connections>,
}

/// The connections of a port, by a number of their own.
#[derive(Default)]
pub(super) struct Connections {
    next: std::sync::atomic::AtomicU64,
    open: std::sync::Mutex<std::collections::HashMap<u64, Arc<connection::Activity>>>,
}

impl Connections {
    fn add(self: &Arc<Self>, activity: Arc<connection::Activity>) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, activity);
        Registered {
            id,
            connections: self.clone(),
        }
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Arc<connection::Activity>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the connection that has been idle longest, if one is idle; whether one was.
    pub(super) fn evict_oldest_idle(&self) -> bool {
        let open = self.lock();
        let oldest = open
            .values()
            .filter_map(|a| a.idle_since().map(|since| (since, a)))
            .min_by_key(|(since, _)| *since);
        match oldest {
            Some((_, a)) => {
                a.evict();
                true
            }
            None => false,
        }
    }
}

/// A connection's place in [`Connections`], given back when it closes.
struct Registered {
    id: u64,
    connections: Arc<Connections>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
    }
}

impl Port {
    /// A port of this name serving `app`, with at most `cap` connections (at least one).
    pub(super) fn new(
        name: &'static str,
        app: Router,
        tls: Option<TlsAcceptor>,
        bounds: connection::Bounds,
        cap: usize,
        state: Arc<AppState>,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let cap = cap.max(1);
        Port {
            name,
            app,
            tls,
            bounds,
            cap,
            permits: Arc::new(tokio::sync::Semaphore::new(cap)),
            state,
            stopping,
            connections: Arc::default(),
        }
    }

    /// Resolves when every connection of this port has closed.
    pub(super) async fn closed(&self) {
        let all = u32::try_from(self.cap).unwrap_or(u32::MAX);
        let _ = self.permits.acquire_many(all).await;
    }

    fn label(&self) -> PortLabel {
        PortLabel { port: self.name }
    }
}

/// Accepts connections until `until` resolves, each served on its own task while it holds
/// one of the port's permits. At the cap it waits for a free slot (the kernel's backlog holds
/// the newcomers) and, on the webhook port, reports not ready meanwhile.
pub(super) async fn accept_loop(
    listener: &TcpListener,
    port: &Port,
    until: impl std::future::Future<Output = ()>,
) {
    let mut until = std::pin::pin!(until);
    loop {
        let Some(permit) = permit(port, until.as_mut()).await else {
            return;
        };
        let (tcp, _peer) = tokio::select! {
            _ = until.as_mut() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(port = port.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        spawn_connection(tcp, permit, port);
    }
}

/// Serves an accepted connection on a task of its own, holding `permit`, until the port stops.
fn spawn_connection(tcp: TcpStream, permit: OwnedSemaphorePermit, port: &Port) {
    let _ = tcp.set_nodelay(true);
    let mut stopping = port.stopping.clone();
    let stop = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    tokio::spawn(serve(tcp, permit, PortHandle::of(port), stop));
}

/// At shutdown, after the accept loop: the connections the kernel has already accepted (the
/// backlog), each served as if accepted before the signal (its first request answered), and
/// then the listener closed. Without this they would be reset when it closes.
pub(super) async fn accept_backlog(listener: TcpListener, port: &Port) {
    let listener = match listener.into_std() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(port = port.name, error = %e, "cannot take the backlog");
            return;
        }
    };
    let mut taken = 0usize;
    // A plain non-blocking accept: it sees every connection the kernel holds, where the
    // runtime's readiness may not have seen the newest yet.
    while let Ok((tcp, _peer)) = listener.accept() {
        let tcp = match tcp
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(tcp))
        {
            Ok(tcp) => tcp,
            Err(e) => {
                tracing::warn!(port = port.name, error = %e, "cannot serve a connection of the backlog");
                continue;
            }
        };
        let Ok(permit) = port.permits.clone().acquire_owned().await else {
            return;
        };
        spawn_connection(tcp, permit, port);
        taken += 1;
    }
    if taken > 0 {
        tracing::info!(
            port = port.name,
            connections = taken,
            "shutting down: took the backlog"
        );
    }
}

/// How long the accept loop waits for the slot of an idle connection it closed at the cap
/// (it closes within milliseconds) before it reports the port at its cap.
const EVICTION_WAIT: Duration = Duration::from_millis(500);

/// A free slot on the port; at the cap, the slot of the idle connection that waited longest,
/// closed for it; else waiting, not ready meanwhile. `None` once `until` resolves.
async fn permit(
    port: &Port,
    mut until: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(p) = port.permits.clone().try_acquire_owned() {
        return Some(p);
    }
    while port.connections.evict_oldest_idle() {
        tokio::select! {
            _ = until.as_mut() => return None,
            freed = tokio::time::timeout(EVICTION_WAIT, port.permits.clone().acquire_owned()) => {
                if let Ok(Ok(p)) = freed {
                    return Some(p);
                }
            }
        }
    }
    port.state
        .metrics
        .at_capacity
        .get_or_create(&port.label())
        .inc();
    if port.tls.is_some() {
        port.state.at_capacity.store(true, Ordering::SeqCst);
    }
    tracing::warn!(
        port = port.name,
        cap = port.cap,
        "at the connection cap: waiting for a connection to close"
    );
    let permit = tokio::select! {
        _ = until => return None,
        permit = port.permits.clone().acquire_owned() => permit.ok()?,
    };
    port.state.at_capacity.store(false, Ordering::SeqCst);
    Some(permit)
}

/// What a connection's task takes from its port.
struct PortHandle {
    name: &'static str,
    app: Router,
    tls: Option<TlsAcceptor>,
    bounds: connection::Bounds,
    state: Arc<AppState>,
    connections: Arc<Connections>,
}

impl PortHandle {
    fn of(port: &Port) -> Self {
        PortHandle {
            name: port.name,
            app: port.app.clone(),
            tls: port.tls.clone(),
            bounds: port.bounds,
            state: port.state.clone(),
            connections: port.connections.clone(),
        }
    }
}

/// One accepted connection: the TLS handshake (bounded by the header timeout) on the webhook
/// port, then HTTP until it closes or `stop` resolves. The permit is held to the end.
async fn serve(
    tcp: TcpStream,
    permit: OwnedSemaphorePermit,
    port: PortHandle,
    stop: impl std::future::Future<Output = ()>,
) {
    let _permit = permit;
    let PortHandle {
        name,
        app,
        tls,
        bounds,
        state,
        connections,
    } = port;
    let activity = Arc::new(connection::Activity::default());
    let _registered = connections.add(activity.clone());
    let m = &state.metrics;
    let open = m
        .connections_open
        .get_or_create(&PortLabel { port: name })
        .clone();
    open.inc();
    match tls {
        None => connection::serve(tcp, false, activity, app, bounds, m, name, stop).await,
        Some(acceptor) => match tokio::time::timeout(bounds.header, acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => {
                // ALPN decides the protocol: no sniffing of the first bytes, which would wait
                // for a silent client.
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                connection::serve(tls, h2, activity, app, bounds, m, name, stop).await;
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
            Err(_) => {
                m.connections_closed
                    .get_or_create(&CauseLabel {
                        port: name,
                        cause: super::metrics::Cause::HandshakeTimeout.as_str(),
                    })
                    .inc();
                tracing::debug!("TLS handshake timed out");
            }
        },
    }
    open.dec();
}
