//! Request bodies, bounded: the size limit, the time they have to arrive, and the memory they
//! hold at once — each connection's own small allowance, and a shared budget for larger ones.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Bytes,
    http::{StatusCode, header},
};

use super::metrics::Metrics;

/// Room for the request bodies held at once (`--max-inflight-body-bytes`), counted in KiB: a
/// request takes its share before its body is read and gives it back once its answer is
/// built, so that a flood of the largest reviews waits instead of growing the heap past the
/// memory limit (where the kernel would kill the replica, and the API server refuse the pods
/// it was sending there until the kubelet marks it unready).
pub(crate) struct BodyBudget {
    pub(super) room: tokio::sync::Semaphore,
    pub(super) total_kib: u32,
}

impl BodyBudget {
    pub fn new(bytes: usize) -> Self {
        let total_kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        BodyBudget {
            room: tokio::sync::Semaphore::new(total_kib as usize),
            total_kib,
        }
    }

    /// Waits for room for `bytes` (never more than the whole budget). `None` only if the
    /// budget was closed, which it never is: the request then goes on without a share.
    async fn reserve(
        &self,
        bytes: usize,
        metrics: &Metrics,
    ) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .clamp(1, self.total_kib.max(1));
        match self.room.try_acquire_many(kib) {
            Ok(permit) => Some(permit),
            Err(_) => {
                metrics.body_budget_waits.inc();
                self.room.acquire_many(kib).await.ok()
            }
        }
    }
}

/// The body's length as the client declared it: its `Content-Length` (hyper's body knows it
/// exactly then; an in-memory body always does), `None` for one of unknown length.
pub(super) fn declared_length(req: &axum::extract::Request) -> Option<u64> {
    hyper::body::Body::size_hint(req.body())
        .exact()
        .or_else(|| {
            req.headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
        })
}

/// The most bytes of bodies one connection holds on its own allowance, without a share of
/// the budget: an HTTP/1.1 connection has one request at a time, an HTTP/2 connection's
/// streams share it (a stream waits for its own connection's room, never another's). A pod's
/// review is a few KiB, so the API server's reviews never wait for the budget, and what
/// connections hold is bounded by `--max-connections` times this.
pub const CONNECTION_BODY_BYTES: u64 = 64 << 10;

/// A connection's own room for bodies ([`CONNECTION_BODY_BYTES`]), in KiB; put in each
/// request's extensions by the connection it came on.
#[derive(Clone)]
pub struct ConnectionBodies(pub Arc<tokio::sync::Semaphore>);

impl ConnectionBodies {
    /// A new connection's room.
    pub fn new() -> Self {
        ConnectionBodies(Arc::new(tokio::sync::Semaphore::new(
            usize::try_from(CONNECTION_BODY_BYTES / 1024).unwrap_or(64),
        )))
    }
}

impl Default for ConnectionBodies {
    fn default() -> Self {
        Self::new()
    }
}

/// What a request's body is held against while it is served.
pub(super) enum Room<'a> {
    /// A share of `--max-inflight-body-bytes`.
    Budget {
        _share: Option<tokio::sync::SemaphorePermit<'a>>,
    },
    /// Its connection's own allowance.
    Connection {
        _share: Option<tokio::sync::OwnedSemaphorePermit>,
    },
    /// Nothing: the body is refused unread (over `--max-body-bytes`), or the request did not
    /// come on a connection (a test calling the router).
    Nothing,
}

/// A request body refused, or not read in time.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Over `--max-body-bytes` (declared, or as read).
    #[error("request body over the limit of {limit} bytes (--max-body-bytes)")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// Of unknown length, and over what a connection's allowance reads.
    #[error(
        "request body of unknown length over {limit} bytes: send its Content-Length (up to --max-body-bytes, {max})"
    )]
    UnknownLengthTooLarge {
        /// What was read of it at most.
        limit: usize,
        /// `--max-body-bytes`.
        max: usize,
    },
    /// The connection failed while it was read.
    #[error("cannot read the request body: {0}")]
    Read(axum::Error),
    /// It did not arrive in time.
    #[error("the request body did not arrive within {0:?} (--body-timeout-seconds)")]
    Timeout(Duration),
    /// No room to hold it came in time.
    #[error("no room for the request body within {timeout:?} (--body-timeout-seconds): {why}")]
    NoRoom {
        /// `--body-timeout-seconds`.
        timeout: Duration,
        /// What holds the room.
        why: &'static str,
    },
}

impl BodyError {
    /// The status code it is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge { .. } | BodyError::UnknownLengthTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            BodyError::Read(_) => StatusCode::BAD_REQUEST,
            BodyError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            BodyError::NoRoom { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// The bounds on request bodies (`--max-body-bytes`, `--body-timeout-seconds`,
/// `--max-inflight-body-bytes`).
pub(crate) struct Bodies {
    /// The largest body read.
    pub max_bytes: usize,
    /// How long a body has to arrive, and to find room.
    pub timeout: Duration,
    /// Room for the larger bodies held at once.
    pub budget: BodyBudget,
}

impl Bodies {
    /// Room for a request's body, held until its answer is built. A body within its
    /// connection's own allowance (a pod's review is a few KiB) never waits for the budget, so
    /// that clients that declare large bodies and trickle them cannot make the API server's
    /// reviews wait; a larger one takes a share of the budget. One of unknown length (the API
    /// server always sends a length) takes its connection's whole allowance and is read up to
    /// it. A body over the size limit gets its 413 unread. So what bodies hold at once is
    /// bounded by the flags: the budget, plus `--max-connections` times
    /// [`CONNECTION_BODY_BYTES`]. `declared` is the request's [`declared_length`],
    /// `connection` the allowance of the connection it came on (`None`: not on a connection, a
    /// test calling the router).
    pub(super) async fn room(
        &self,
        declared: Option<u64>,
        connection: Option<ConnectionBodies>,
        metrics: &Metrics,
    ) -> Result<Room<'_>, BodyError> {
        let no_room = |why| BodyError::NoRoom {
            timeout: self.timeout,
            why,
        };
        // The bytes to hold on its connection's allowance, if it is one of those.
        let own = match declared {
            None => Some(CONNECTION_BODY_BYTES),
            Some(n) if n <= CONNECTION_BODY_BYTES => Some(n),
            Some(_) => None,
        };
        if declared.is_some_and(|n| n > self.max_bytes as u64) {
            return Ok(Room::Nothing);
        }
        let Some(n) = own else {
            let wanted = declared
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(self.max_bytes);
            return match tokio::time::timeout(self.timeout, self.budget.reserve(wanted, metrics))
                .await
            {
                Ok(share) => Ok(Room::Budget { _share: share }),
                Err(_) => Err(no_room(
                    "the bodies being served fill --max-inflight-body-bytes",
                )),
            };
        };
        let Some(ConnectionBodies(room)) = connection else {
            return Ok(Room::Nothing);
        };
        let kib = u32::try_from(n.div_ceil(1024)).unwrap_or(1).max(1);
        match tokio::time::timeout(self.timeout, room.acquire_many_owned(kib)).await {
            Ok(permit) => Ok(Room::Connection {
                _share: permit.ok(),
            }),
            Err(_) => Err(no_room(
                "this connection's other requests hold its bodies' allowance",
            )),
        }
    }

    /// The body, within the size and time bounds. A `Content-Length` over the limit is refused
    /// before anything is read (so `Expect: 100-continue` gets its 413 at once, not a 100).
    pub(super) async fn read(
        &self,
        req: axum::extract::Request,
        declared: Option<u64>,
    ) -> Result<Bytes, BodyError> {
        // A body of unknown length is read on its connection's allowance only.
        let limit = match declared {
            Some(_) => self.max_bytes,
            None => self.max_bytes.min(CONNECTION_BODY_BYTES as usize),
        };
        let too_large = || match declared {
            Some(_) => BodyError::TooLarge { limit },
            None => BodyError::UnknownLengthTooLarge {
                limit,
                max: self.max_bytes,
            },
        };
        if declared.is_some_and(|n| n > limit as u64) {
            // Refused before it is read. A client that sends its body anyway (no `Expect:
            // 100-continue`) is still writing it: read and drop up to one limit's worth for a
            // moment, so that closing does not reset the connection under the 413 it has not
            // read yet (the "lingering close" of other servers). With `Expect`, nothing is read.
            let expects = req.headers().contains_key(header::EXPECT);
            if !expects {
                let body = req.into_body();
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), collect(body, limit)).await;
                });
            }
            return Err(too_large());
        }
        match tokio::time::timeout(self.timeout, collect(req.into_body(), limit)).await {
            Ok(Ok(Some(bytes))) => Ok(bytes),
            Ok(Ok(None)) => Err(too_large()),
            Ok(Err(e)) => Err(BodyError::Read(e)),
            Err(_) => Err(BodyError::Timeout(self.timeout)),
        }
    }
}

/// The body's bytes, copied out of each frame as it arrives (`None` past `limit`). A frame
/// borrows hyper's read buffer: keeping a body of many small frames as frames would hold a
/// whole buffer per byte of a trickling client.
async fn collect(mut body: axum::body::Body, limit: usize) -> Result<Option<Bytes>, axum::Error> {
    use http_body_util::BodyExt as _;
    let mut out = Vec::with_capacity(
        usize::try_from(hyper::body::Body::size_hint(&body).lower())
            .unwrap_or(0)
            .min(limit),
    );
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if out.len() + data.len() > limit {
                return Ok(None);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(Some(Bytes::from(out)))
}
