//! The listening ports: connections accepted and served each on its own task (TLS first on
//! the webhook port), shared fairly between the addresses they come from.
//!
//! The fairness model (docs/operations.md, "Connections"): a port holds at most `cap`
//! connections and one peer address at most `per_peer` of them. A connection that is not in
//! a request — still in its TLS handshake or before its first request, or idle between
//! requests — can be closed to make room. When a newcomer finds the port full, the room is
//! taken from the address holding the most connections (its oldest such connection), as long
//! as that address holds more than the newcomer's; a newcomer whose own address already holds
//! the most gives up one of its own, or is closed at once. Nothing a client does makes the
//! replica report itself not ready: the API server's few connections and the kubelet's
//! probes, from addresses holding one or two, always find room within milliseconds.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use axum::Router;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Notify, OwnedSemaphorePermit},
    time::Instant,
};
use tokio_rustls::TlsAcceptor;

use super::{
    connection::{self, Activity},
    metrics::{Cause, CauseLabel, PortLabel},
    state::AppState,
};

/// A listening port: what it serves, its bounds and its connection caps.
pub(super) struct Port {
    pub name: &'static str,
    pub app: Router,
    pub tls: Option<TlsAcceptor>,
    pub bounds: connection::Bounds,
    pub cap: usize,
    /// The most connections one peer address may hold.
    pub per_peer: usize,
    /// The cap and its [`headroom`]: a newcomer is served at once beside the connection
    /// closing for it.
    pub permits: Arc<tokio::sync::Semaphore>,
    slots: usize,
    pub state: Arc<AppState>,
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// The connections being served, for the caps to find one to close.
    pub connections: Arc<Connections>,
}

/// The connections of a port, by a number of their own.
#[derive(Default)]
pub(super) struct Connections {
    next: std::sync::atomic::AtomicU64,
    open: std::sync::Mutex<HashMap<u64, Held>>,
    /// Notified when a connection closes or may be closed to make room.
    changed: Arc<Notify>,
}

/// One open connection: where it comes from and what it is doing.
struct Held {
    peer: IpAddr,
    activity: Arc<Activity>,
}

/// What a newcomer at the port does next.
#[derive(Debug)]
enum Plan {
    /// A slot is free and the peer is within its share.
    Take,
    /// Close this connection (not in a request) to make room.
    Evict(Arc<Activity>),
    /// Room is coming (a connection is closing, or the fuller peers' requests are bounded).
    Wait,
    /// The newcomer's peer holds its share and has nothing to give up: close the newcomer.
    Refuse,
}

impl Connections {
    fn add(
        self: &Arc<Self>,
        peer: IpAddr,
        permit: OwnedSemaphorePermit,
    ) -> (Registered, Arc<Activity>) {
        let activity = Arc::new(Activity::watched(self.changed.clone()));
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            id,
            Held {
                peer,
                activity: activity.clone(),
            },
        );
        let registered = Registered {
            id,
            permit: Some(permit),
            connections: self.clone(),
        };
        (registered, activity)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a newcomer from `peer` does at a port of `cap` connections: one pass over the
    /// open connections (at most the cap and its headroom).
    fn plan(&self, peer: IpAddr, per_peer: usize, cap: usize) -> Plan {
        let open = self.lock();
        // Connections already asked to close do not count: their slots are on the way back.
        let mut held: HashMap<IpAddr, usize> = HashMap::new();
        let mut live = 0usize;
        for h in open.values().filter(|h| !h.activity.is_evicting()) {
            *held.entry(h.peer).or_default() += 1;
            live += 1;
        }
        let full = live >= cap;
        let own = held.get(&peer).copied().unwrap_or(0);
        let closable = || {
            open.values()
                .filter_map(|h| h.activity.closable_since().map(|since| (h, since)))
        };
        if own >= per_peer {
            // At its own share: only one of its own can make room.
            return closable()
                .filter(|(h, _)| h.peer == peer)
                .min_by_key(|(_, since)| *since)
                .map_or(Plan::Refuse, |(h, _)| Plan::Evict(h.activity.clone()));
        }
        if !full {
            return Plan::Take;
        }
        // Full: from the peer holding the most (more than the newcomer's, or its own), the
        // connection that has waited longest.
        let count = |p: &IpAddr| held.get(p).copied().unwrap_or(0);
        let victim = closable()
            .filter(|(h, _)| h.peer == peer || count(&h.peer) > own)
            .max_by_key(|(h, since)| (count(&h.peer), std::cmp::Reverse(*since)));
        if let Some((h, _)) = victim {
            return Plan::Evict(h.activity.clone());
        }
        // Nothing can close now: the fuller peers' connections are all in requests (each
        // bounded by the body bound and the handler), so room comes; unless none is fuller.
        if held.values().any(|&n| n > own) {
            Plan::Wait
        } else {
            Plan::Refuse
        }
    }
}

/// A connection's place in [`Connections`] and its slot, given back when it closes.
struct Registered {
    id: u64,
    permit: Option<OwnedSemaphorePermit>,
    connections: Arc<Connections>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
        // The slot first, then the news: a newcomer that wakes finds it free.
        drop(self.permit.take());
        self.connections.changed.notify_waiters();
    }
}

impl Port {
    /// A port of this name serving `app`, with at most `cap` connections, `per_peer` from one
    /// address (each at least one).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        name: &'static str,
        app: Router,
        tls: Option<TlsAcceptor>,
        bounds: connection::Bounds,
        cap: usize,
        per_peer: usize,
        state: Arc<AppState>,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let cap = cap.max(1);
        let slots = cap + headroom(cap);
        Port {
            name,
            app,
            tls,
            bounds,
            cap,
            per_peer: per_peer.clamp(1, cap),
            permits: Arc::new(tokio::sync::Semaphore::new(slots)),
            slots,
            state,
            stopping,
            connections: Arc::default(),
        }
    }

    /// Resolves when every connection of this port has closed.
    pub(super) async fn closed(&self) {
        let all = u32::try_from(self.slots).unwrap_or(u32::MAX);
        let _ = self.permits.acquire_many(all).await;
    }

    fn label(&self) -> PortLabel {
        PortLabel { port: self.name }
    }

    fn count_closed(&self, cause: Cause) {
        self.state
            .metrics
            .connections_closed
            .get_or_create(&CauseLabel {
                port: self.name,
                cause: cause.as_str(),
            })
            .inc();
    }
}

/// Accepts connections until `until` resolves, each served on its own task while it holds
/// one of the port's slots ([`admit`] finds it one, or closes it).
pub(super) async fn accept_loop(
    listener: &TcpListener,
    port: &Port,
    until: impl std::future::Future<Output = ()>,
) {
    let mut until = std::pin::pin!(until);
    loop {
        let (tcp, peer) = tokio::select! {
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
        let peer = peer.ip().to_canonical();
        match admit(port, peer, until.as_mut()).await {
            Admitted::Slot(permit) => spawn_connection(tcp, peer, permit, port),
            Admitted::Refused => {
                port.count_closed(Cause::Refused);
                tracing::debug!(port = port.name, %peer, "connection refused: its address holds its share");
            }
            Admitted::Stopping => return,
        }
    }
}

/// Serves an accepted connection on a task of its own, holding `permit`, until the port stops.
/// It is counted for its peer at once, before the next newcomer is admitted.
fn spawn_connection(tcp: TcpStream, peer: IpAddr, permit: OwnedSemaphorePermit, port: &Port) {
    let _ = tcp.set_nodelay(true);
    let mut stopping = port.stopping.clone();
    let stop = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    let held = port.connections.add(peer, permit);
    tokio::spawn(serve(tcp, held, PortHandle::of(port), stop));
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
    while let Ok((tcp, peer)) = listener.accept() {
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
        spawn_connection(tcp, peer.ip().to_canonical(), permit, port);
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

/// Connections that may be closing beyond the cap: a newcomer that made room is served at
/// once, beside the connection closing for it (which gives its slot back within
/// milliseconds, or the header bound at most), so a burst does not wait in line for each.
fn headroom(cap: usize) -> usize {
    cap / 8 + 1
}

/// How often a waiting newcomer looks again, besides being told of a change.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// What [`admit`] decided for a newcomer.
enum Admitted {
    Slot(OwnedSemaphorePermit),
    Refused,
    Stopping,
}

/// A slot for a newcomer from `peer`, made by closing a connection that is not in a request
/// if need be ([`Connections::plan`]); or the newcomer is refused: when its address holds its
/// share with nothing to give up, or when no room came within the header and body bounds (by
/// then every request in its way has been answered or cut: the accept loop waits no longer).
async fn admit(
    port: &Port,
    peer: IpAddr,
    mut until: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Admitted {
    let started = Instant::now();
    let mut counted = false;
    loop {
        // Listen for changes before looking, so none is missed between the two.
        let changed = port.connections.changed.notified();
        let mut changed = std::pin::pin!(changed);
        changed.as_mut().enable();
        match port.connections.plan(peer, port.per_peer, port.cap) {
            Plan::Take => {
                if let Ok(permit) = port.permits.clone().try_acquire_owned() {
                    return Admitted::Slot(permit);
                }
                // Every slot of the headroom is closing: wait for one.
            }
            Plan::Evict(victim) => {
                victim.evict();
                continue;
            }
            Plan::Refuse => return Admitted::Refused,
            Plan::Wait => {
                if !counted {
                    counted = true;
                    port.state
                        .metrics
                        .at_capacity
                        .get_or_create(&port.label())
                        .inc();
                    tracing::warn!(
                        port = port.name,
                        cap = port.cap,
                        "at the connection cap with every connection in a request: the newcomer waits"
                    );
                }
            }
        }
        // Every request in the way has its headers and body in within these, or is cut.
        if started.elapsed() >= port.bounds.header + port.bounds.body {
            return Admitted::Refused;
        }
        tokio::select! {
            _ = until.as_mut() => return Admitted::Stopping,
            () = changed => {}
            () = tokio::time::sleep(LOOK_AGAIN) => {}
        }
    }
}

/// What a connection's task takes from its port.
struct PortHandle {
    name: &'static str,
    app: Router,
    tls: Option<TlsAcceptor>,
    bounds: connection::Bounds,
    state: Arc<AppState>,
}

impl PortHandle {
    fn of(port: &Port) -> Self {
        PortHandle {
            name: port.name,
            app: port.app.clone(),
            tls: port.tls.clone(),
            bounds: port.bounds,
            state: port.state.clone(),
        }
    }
}

/// One accepted connection: the TLS handshake (bounded by the header timeout, and closed at
/// once if its slot is wanted) on the webhook port, then HTTP until it closes or `stop`
/// resolves. The slot is held to the end.
async fn serve(
    tcp: TcpStream,
    (_registered, activity): (Registered, Arc<Activity>),
    port: PortHandle,
    stop: impl std::future::Future<Output = ()>,
) {
    let PortHandle {
        name,
        app,
        tls,
        bounds,
        state,
    } = port;
    let m = &state.metrics;
    let open = m
        .connections_open
        .get_or_create(&PortLabel { port: name })
        .clone();
    open.inc();
    let cut = |cause: Cause| {
        m.connections_closed
            .get_or_create(&CauseLabel {
                port: name,
                cause: cause.as_str(),
            })
            .inc();
    };
    match tls {
        None => connection::serve(tcp, false, activity, app, bounds, m, name, stop).await,
        Some(acceptor) => {
            let handshake = tokio::time::timeout(bounds.header, acceptor.accept(tcp));
            tokio::select! {
                done = handshake => match done {
                    Ok(Ok(tls)) => {
                        // ALPN decides the protocol: no sniffing of the first bytes, which
                        // would wait for a silent client.
                        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                        connection::serve(tls, h2, activity, app, bounds, m, name, stop).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => {
                        cut(Cause::HandshakeTimeout);
                        tracing::debug!("TLS handshake timed out");
                    }
                },
                () = activity.evicted() => cut(Cause::Evicted),
            }
        }
    }
    open.dec();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, n])
    }

    /// Open connections in given states, and the plan a newcomer gets.
    struct Fixture {
        connections: Arc<Connections>,
        slots: Arc<tokio::sync::Semaphore>,
        held: Vec<(Registered, Arc<Activity>)>,
    }

    impl Fixture {
        fn new() -> Self {
            Fixture {
                connections: Arc::default(),
                slots: Arc::new(tokio::sync::Semaphore::new(1024)),
                held: Vec::new(),
            }
        }

        /// A connection from 127.0.0.`n`: `pre` (before its first request), `idle` (after
        /// one) or `busy` (in one). Each opened a second after the one before.
        async fn open(&mut self, n: u8, state: &str) -> Arc<Activity> {
            tokio::time::advance(Duration::from_secs(1)).await;
            let permit = self.slots.clone().try_acquire_owned().unwrap();
            let (registered, activity) = self.connections.add(ip(n), permit);
            match state {
                "pre" => {}
                "idle" => {
                    activity.request_started();
                    activity.request_finished();
                }
                "busy" => activity.request_started(),
                _ => unreachable!("{state}"),
            }
            self.held.push((registered, activity.clone()));
            activity
        }

        fn plan(&self, n: u8, per_peer: usize, cap: usize) -> Plan {
            self.connections.plan(ip(n), per_peer, cap)
        }
    }

    fn evicts(plan: Plan, expected: &Arc<Activity>) {
        match plan {
            Plan::Evict(a) => assert!(Arc::ptr_eq(&a, expected), "another connection chosen"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn room_comes_from_the_address_holding_the_most_its_oldest_first() {
        let mut f = Fixture::new();
        let a_old = f.open(1, "idle").await;
        let _a = f.open(1, "pre").await;
        let _a = f.open(1, "idle").await;
        let _b = f.open(2, "idle").await;
        // Room left: taken.
        assert!(matches!(f.plan(3, 64, 5), Plan::Take));
        // Full: a newcomer from elsewhere, from the lighter address, and from the heaviest
        // itself each take the heaviest address's oldest place.
        for newcomer in [3, 2, 1] {
            evicts(f.plan(newcomer, 64, 4), &a_old);
        }
        // Asked to close, it no longer counts: the next newcomer is served beside it.
        a_old.evict();
        assert!(matches!(f.plan(3, 64, 4), Plan::Take));
    }

    #[tokio::test(start_paused = true)]
    async fn a_newcomer_never_takes_from_an_address_holding_no_more_than_its_own() {
        let mut f = Fixture::new();
        for _ in 0..3 {
            f.open(1, "busy").await;
        }
        let b = f.open(2, "idle").await;
        // From the heaviest address, with nothing of its own to give up: closed at once.
        assert!(matches!(f.plan(1, 64, 4), Plan::Refuse));
        // From the lighter address: its own idle place; from one holding none, the same
        // (the only place not in a request, of an address holding more than it).
        evicts(f.plan(2, 64, 4), &b);
        evicts(f.plan(3, 64, 4), &b);
        // Once that one is closing, nothing is left but 127.0.0.1's requests, bounded by
        // the body bound and the handler: a lighter newcomer waits for them.
        b.evict();
        assert!(matches!(f.plan(3, 64, 3), Plan::Wait));
        let mut f = Fixture::new();
        for _ in 0..4 {
            f.open(1, "busy").await;
        }
        assert!(matches!(f.plan(2, 64, 4), Plan::Wait));
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_at_its_share_gives_up_its_own_oldest_or_is_refused() {
        let mut f = Fixture::new();
        let pre = f.open(1, "pre").await;
        let _idle = f.open(1, "idle").await;
        let _other = f.open(2, "idle").await;
        // Far from the port's cap, but at its own share of two.
        evicts(f.plan(1, 2, 100), &pre);
        assert!(matches!(f.plan(2, 2, 100), Plan::Take));
        let mut f = Fixture::new();
        f.open(1, "busy").await;
        f.open(1, "busy").await;
        f.open(2, "idle").await;
        assert!(matches!(f.plan(1, 2, 100), Plan::Refuse));
    }

    #[test]
    fn the_headroom_is_an_eighth_of_the_cap_and_never_none() {
        assert_eq!(headroom(512), 65);
        assert_eq!(headroom(1), 1);
    }
}
