//! One connection, from accept to close, on either port: it lives only as long as it makes
//! progress. The bounds:
//!
//! - **headers**: the first request (TLS handshake, HTTP/2 preface, request headers) and every
//!   later request once its first byte arrived must be in within `header`;
//! - **idle**: a keep-alive connection with no request in flight is closed after `h1_idle`
//!   (HTTP/1.1) or `h2_idle` (HTTP/2, whose pings do not count as activity);
//! - **body**: each request body must be read within `body` (enforced by the handlers, which
//!   answer 408).
//!
//! hyper's own header-read timeout also runs while a keep-alive connection waits, so it would
//! make the idle bound the header bound; this module tracks the phases itself instead.
//!
//! When its port wants a slot, a connection that is not in a request (before its first one,
//! or idle between requests) can be closed to make room ([`Activity::evict`]; the port
//! chooses which, fairly between peers: see `listener`). At shutdown, an HTTP/1.1 connection
//! that has not had its first request yet gets it answered (with `Connection: close`) within
//! the header bound: the client sends it on a connection we accepted, and would otherwise
//! read an EOF.

use std::{
    convert::Infallible,
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use axum::{Router, body::Body, extract::Request, response::Response};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Instant,
};
use tower::ServiceExt as _;

use super::metrics::{Cause, CauseLabel, Metrics};

/// How long each phase of a connection may last.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub header: Duration,
    pub h1_idle: Duration,
    pub h2_idle: Duration,
    /// A request's body (the handlers enforce it; the port waits no longer for a request to
    /// end than the header and body bounds together).
    pub body: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a request's headers, or an HTTP/2 preface.
    Headers,
    /// At least one request in flight: its body is bounded by the handler.
    InRequest,
    /// Keep-alive, nothing in flight.
    Idle,
}

/// What a connection is doing, and since when.
#[derive(Debug)]
pub struct Activity {
    state: Mutex<(Phase, Instant, usize)>,
    h2: std::sync::atomic::AtomicBool,
    /// A request has started on it (set once).
    served: std::sync::atomic::AtomicBool,
    /// Notified at each request's start.
    started: tokio::sync::Notify,
    /// Notified to close the connection to make room at the cap.
    evicted: tokio::sync::Notify,
    /// It was asked to close (and is not chosen again).
    evicting: std::sync::atomic::AtomicBool,
    /// Its port's news: told when the connection becomes idle (it may then make room).
    changed: Option<Arc<tokio::sync::Notify>>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            state: Mutex::new((Phase::Headers, Instant::now(), 0)),
            h2: std::sync::atomic::AtomicBool::new(false),
            served: std::sync::atomic::AtomicBool::new(false),
            started: tokio::sync::Notify::new(),
            evicted: tokio::sync::Notify::new(),
            evicting: std::sync::atomic::AtomicBool::new(false),
            changed: None,
        }
    }
}

impl Activity {
    #[cfg(test)]
    fn new(h2: bool) -> Self {
        let a = Activity::default();
        a.h2.store(h2, std::sync::atomic::Ordering::Relaxed);
        a
    }

    /// A connection's activity, its port told through `changed` whenever it becomes idle.
    pub fn watched(changed: Arc<tokio::sync::Notify>) -> Self {
        Activity {
            changed: Some(changed),
            ..Activity::default()
        }
    }

    fn is_h2(&self) -> bool {
        self.h2.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Since when the connection has been closable without losing a request — before its
    /// first request (TLS handshake, preface, first headers: since it was accepted) or idle
    /// between requests — unless it has been asked to close already.
    pub fn closable_since(&self) -> Option<Instant> {
        if self.is_evicting() {
            return None;
        }
        let served = self.has_served();
        self.with(|&mut (phase, since, _)| match phase {
            Phase::Idle => Some(since),
            Phase::Headers if !served => Some(since),
            Phase::Headers | Phase::InRequest => None,
        })
    }

    /// Whether it was asked to close.
    pub fn is_evicting(&self) -> bool {
        self.evicting.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn has_served(&self) -> bool {
        self.served.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Asks the connection to close (it is not in a request: nothing is lost).
    pub fn evict(&self) {
        self.evicting
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.evicted.notify_one();
    }

    /// Resolves once the connection has been asked to close.
    pub async fn evicted(&self) {
        self.evicted.notified().await;
    }

    /// Resolves at the first request's start (at once if one has started).
    async fn first_request(&self) {
        loop {
            let started = self.started.notified();
            if self.served.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            started.await;
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut (Phase, Instant, usize)) -> T) -> T {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// HTTP/1.1: the first bytes of the next request end the idle wait. (HTTP/2 frames such
    /// as pings do not: only a new stream does.)
    fn bytes_read(&self) {
        if self.is_h2() {
            return;
        }
        self.with(|s| {
            if s.0 == Phase::Idle {
                *s = (Phase::Headers, Instant::now(), s.2);
            }
        });
    }

    pub(super) fn request_started(&self) {
        self.with(|s| *s = (Phase::InRequest, Instant::now(), s.2 + 1));
        self.served.store(true, std::sync::atomic::Ordering::SeqCst);
        self.started.notify_waiters();
    }

    pub(super) fn request_finished(&self) {
        self.with(|s| {
            let active = s.2.saturating_sub(1);
            let phase = if active == 0 {
                Phase::Idle
            } else {
                Phase::InRequest
            };
            *s = (phase, Instant::now(), active);
        });
        if let Some(changed) = &self.changed {
            changed.notify_waiters();
        }
    }

    /// When the current phase runs out, and why; `None` while a request is in flight.
    fn deadline(&self, b: &Bounds) -> Option<(Instant, Cause)> {
        self.with(|&mut (phase, since, _)| match phase {
            Phase::Headers => Some((since + b.header, Cause::HeaderTimeout)),
            Phase::Idle if self.is_h2() => Some((since + b.h2_idle, Cause::Idle)),
            Phase::Idle => Some((since + b.h1_idle, Cause::Idle)),
            Phase::InRequest => None,
        })
    }
}

/// Resolves when the connection has outlived its current phase.
async fn watchdog(activity: Arc<Activity>, bounds: Bounds) -> Cause {
    loop {
        match activity.deadline(&bounds) {
            Some((deadline, cause)) if Instant::now() >= deadline => return cause,
            Some((deadline, _)) => tokio::time::sleep_until(deadline).await,
            // A request's body and handling are bounded by the handler; look again soon.
            None => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// The transport, noting every read for [`Activity`].
struct Tracked<IO> {
    io: IO,
    activity: Arc<Activity>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Serves one connection until the client closes it, a bound runs out, it is evicted at the
/// cap, or `shutdown` resolves (then: the first request is awaited if none came yet, the
/// request in flight finishes, keep-alive ends, HTTP/2 sends GOAWAY). `activity` is the
/// connection's, made when it was accepted (its port finds idle connections through it).
#[allow(clippy::too_many_arguments)]
pub async fn serve<IO>(
    io: IO,
    h2: bool,
    activity: Arc<Activity>,
    app: Router,
    bounds: Bounds,
    metrics: &Metrics,
    port: &'static str,
    shutdown: impl Future<Output = ()>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    activity.h2.store(h2, std::sync::atomic::Ordering::Relaxed);
    let tracked = Tracked {
        io,
        activity: activity.clone(),
    };
    // The room its requests' bodies share (an HTTP/2 connection's streams).
    let bodies = super::bodies::ConnectionBodies::new();
    let service = hyper::service::service_fn({
        let activity = activity.clone();
        move |req: Request<hyper::body::Incoming>| {
            let mut req = req.map(Body::new);
            req.extensions_mut().insert(bodies.clone());
            serve_request(app.clone(), activity.clone(), req)
        }
    });
    let builder = http_builder(h2, bounds);
    let conn = builder.serve_connection(TokioIo::new(tracked), service);
    let mut conn = std::pin::pin!(conn);
    let mut shutdown = std::pin::pin!(shutdown);
    let cut = |cause: Cause| {
        let label = CauseLabel {
            port,
            cause: cause.as_str(),
        };
        metrics.connections_closed.get_or_create(&label).inc();
    };
    tokio::select! {
        ended = conn.as_mut() => {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "connection ended with an error");
                if is_parse_error(&*e) {
                    cut(Cause::Malformed);
                }
            }
            return;
        }
        cause = watchdog(activity.clone(), bounds) => {
            cut(cause);
            if cause == Cause::Idle {
                // Nothing in flight: close politely (HTTP/2 GOAWAY), but not for long.
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(bounds.header, conn.as_mut()).await;
            }
            return;
        }
        () = activity.evicted() => {
            cut(Cause::Evicted);
            if !activity.has_served() {
                // No request yet: nothing to finish, and the slot is wanted now.
                return;
            }
            // Idle when chosen; a request that started since is finished first.
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(bounds.header, conn.as_mut()).await;
            return;
        }
        () = shutdown.as_mut() => {}
    }
    // HTTP/1.1 has no way to say "go elsewhere" before a request: a connection accepted
    // before the signal whose first request has not come yet gets it answered, within the
    // header bound (the watchdog's), with `Connection: close`.
    if !h2 {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = watchdog(activity.clone(), bounds) => return,
            () = activity.first_request() => {}
        }
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// One request on the connection, its activity tracked (the watchdog's and the cap's view).
async fn serve_request(
    app: Router,
    activity: Arc<Activity>,
    req: Request<Body>,
) -> Result<Response, Infallible> {
    activity.request_started();
    let response = app.oneshot(req).await;
    activity.request_finished();
    response
}

/// hyper's connection settings for one protocol (chosen by ALPN, never sniffed).
fn http_builder(h2: bool, bounds: Bounds) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's own header-read timer (30 s by default once a timer is set) would also run
    // while a keep-alive connection waits, cutting it before `h1_idle`: the phases here
    // bound the headers instead.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        // Pings find dead peers; they do not keep an idle connection open (h2_idle does that).
        // At least two per idle bound, so a peer that stopped answering is found within it.
        .keep_alive_interval(Some(
            (bounds.h2_idle.min(Duration::from_secs(60)) / 2).max(Duration::from_secs(1)),
        ));
    if h2 {
        builder.http2_only()
    } else {
        builder.http1_only()
    }
}

/// Whether hyper gave up on what the client sent (it has already answered a bare 400).
fn is_parse_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(err) = source {
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && h.is_parse()
        {
            return true;
        }
        source = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Bounds = Bounds {
        body: Duration::from_secs(10),
        header: Duration::from_secs(5),
        h1_idle: Duration::from_secs(120),
        h2_idle: Duration::from_secs(60),
    };

    #[tokio::test(start_paused = true)]
    async fn each_phase_has_its_own_bound() {
        let a = Activity::new(false);
        let start = Instant::now();
        assert_eq!(
            a.deadline(&B),
            Some((start + B.header, Cause::HeaderTimeout))
        );
        a.request_started();
        assert_eq!(
            a.deadline(&B),
            None,
            "a request in flight is bounded by its handler"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        a.request_finished();
        let idle = Instant::now();
        assert_eq!(a.deadline(&B), Some((idle + B.h1_idle, Cause::Idle)));
        // HTTP/1.1: the next request's first bytes switch to the header bound.
        tokio::time::advance(Duration::from_secs(30)).await;
        a.bytes_read();
        assert_eq!(
            a.deadline(&B),
            Some((Instant::now() + B.header, Cause::HeaderTimeout))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_connection_outside_a_request_is_offered_for_eviction_and_only_once() {
        let a = Activity::new(false);
        let accepted = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            a.closable_since(),
            Some(accepted),
            "waiting for its first request, since it was accepted"
        );
        a.request_started();
        assert_eq!(a.closable_since(), None, "a request in flight");
        a.request_finished();
        let idle = Instant::now();
        assert_eq!(a.closable_since(), Some(idle));
        // HTTP/1.1: the next request's first bytes make it a request again.
        a.bytes_read();
        assert_eq!(a.closable_since(), None, "the next request's headers");
        a.request_started();
        a.request_finished();
        a.evict();
        assert_eq!(a.closable_since(), None, "already asked to close");
        assert!(a.is_evicting());
        tokio::time::timeout(Duration::from_millis(1), a.evicted())
            .await
            .expect("the eviction is kept for the connection to see");
        // The request the shutdown waits for: resolved at once once one has started.
        tokio::time::timeout(Duration::from_millis(1), a.first_request())
            .await
            .unwrap();
        let fresh = Activity::new(false);
        assert!(
            tokio::time::timeout(Duration::from_millis(1), fresh.first_request())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn http2_frames_between_requests_do_not_keep_a_connection_open() {
        let a = Activity::new(true);
        a.request_started();
        a.request_started();
        a.request_finished();
        assert_eq!(a.deadline(&B), None, "one stream still open");
        a.request_finished();
        let idle = Instant::now();
        tokio::time::advance(Duration::from_secs(10)).await;
        a.bytes_read(); // a PING ack
        assert_eq!(a.deadline(&B), Some((idle + B.h2_idle, Cause::Idle)));
    }
}
