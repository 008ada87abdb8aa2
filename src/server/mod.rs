//! `serve`: the HTTPS webhook, the plain-HTTP admin port, hot reload and graceful shutdown.

pub mod cluster;
pub mod connection;
pub mod metrics;
pub mod reload;
pub mod tls;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use self::{
    metrics::{CauseLabel, CodeLabel, KindLabel, Metrics, PortLabel, ReasonLabel, ResultLabel},
    tls::CertStore,
};
use crate::{config::Config, decision::Decision, review};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Webhook address (HTTPS); the webhook path is POST /mutate.
    #[arg(long, env = "EVI_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Admin address (plain HTTP): /healthz, /readyz, /metrics.
    #[arg(long, env = "EVI_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    pub admin_listen: SocketAddr,
    /// Serving certificate (PEM, chain allowed); reloaded when it changes. Without it, a
    /// self-signed certificate for localhost is generated in memory.
    #[arg(long, env = "EVI_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of the serving certificate (PEM).
    #[arg(long, env = "EVI_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Where the generated CA certificate is written when no certificate is given.
    #[arg(long, env = "EVI_CA_OUT")]
    pub ca_out: Option<PathBuf>,
    /// Configuration file (YAML; see the README's Configuration); reloaded when it changes. Built-in defaults without it.
    #[arg(long, env = "EVI_CONFIG")]
    pub config: Option<PathBuf>,
    #[arg(long, env = "EVI_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. info or evi=debug.
    #[arg(long, env = "EVI_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Largest request body accepted; an UPDATE review carries two pods.
    #[arg(long, env = "EVI_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Seconds a client has to finish the TLS handshake, the HTTP/2 preface and each
    /// request's headers (from its first byte). The API server sends a request at once.
    #[arg(long, env = "EVI_HEADER_TIMEOUT_SECONDS", default_value_t = 5.0)]
    pub header_timeout_seconds: f64,
    /// Seconds a request body may take to arrive; then 408. The API server sends the whole
    /// review at once and gives up on a webhook after at most 30 s (10 s by default).
    #[arg(long, env = "EVI_BODY_TIMEOUT_SECONDS", default_value_t = 10.0)]
    pub body_timeout_seconds: f64,
    /// Seconds an HTTP/1.1 keep-alive connection may wait for its next request. Longer than
    /// the API server's own idle timeout (Go's 90 s), so that the client, not the webhook,
    /// closes idle connections and never sends a request on one being closed.
    #[arg(long, env = "EVI_IDLE_TIMEOUT_SECONDS", default_value_t = 120.0)]
    pub idle_timeout_seconds: f64,
    /// Seconds an HTTP/2 connection may stay open with no request in flight (pings do not
    /// count). The API server speaks HTTP/1.1 to webhooks; HTTP/2 clients reconnect cheaply.
    #[arg(long, env = "EVI_H2_IDLE_TIMEOUT_SECONDS", default_value_t = 60.0)]
    pub h2_idle_timeout_seconds: f64,
    /// Connections served at once; more wait in the kernel's backlog. Bounds memory under a
    /// flood of idle or slow clients (each connection in a TLS handshake holds ~25 KiB). Too low a
    /// limit lets a flood of idle connections starve the API server until they time out.
    #[arg(long, env = "EVI_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Connections served at once on the admin port (probes and scrapes need a few); it
    /// cannot take descriptors or memory from the webhook port beyond this.
    #[arg(long, env = "EVI_ADMIN_MAX_CONNECTIONS", default_value_t = 64)]
    pub admin_max_connections: usize,
    /// Seconds an admin client has for its request headers (probes send them at once).
    #[arg(long, env = "EVI_ADMIN_HEADER_TIMEOUT_SECONDS", default_value_t = 5.0)]
    pub admin_header_timeout_seconds: f64,
    /// Seconds an admin keep-alive connection may wait for its next request (the kubelet's
    /// probes and Prometheus come every 10 s or more and reconnect cheaply).
    #[arg(long, env = "EVI_ADMIN_IDLE_TIMEOUT_SECONDS", default_value_t = 30.0)]
    pub admin_idle_timeout_seconds: f64,
    /// Kubeconfig for the cluster checks (CSIDriver and StorageClass watches). Without it the
    /// in-cluster service account is used; outside a cluster the checks are off.
    #[arg(long, env = "EVI_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Seconds readiness waits for the first complete CSIDriver and StorageClass lists; past
    /// it the webhook is ready with the cluster checks in warn until they arrive.
    #[arg(long, env = "EVI_CLUSTER_SYNC_TIMEOUT_SECONDS", default_value_t = 30.0)]
    pub cluster_sync_timeout_seconds: f64,
    /// After SIGTERM, seconds to keep accepting while unready, so endpoints can stop sending.
    #[arg(long, env = "EVI_DRAIN_DELAY_SECONDS", default_value_t = 0.0)]
    pub drain_delay_seconds: f64,
    /// After the drain delay, seconds in-flight requests get to finish before exit.
    #[arg(long, env = "EVI_GRACE_PERIOD_SECONDS", default_value_t = 20.0)]
    pub grace_period_seconds: f64,
    /// Seconds between checks of the certificate and configuration files, besides file events.
    #[arg(long, env = "EVI_RELOAD_POLL_SECONDS", default_value_t = 10.0)]
    pub reload_poll_seconds: f64,
}

/// Shared by every request; swapped pieces are behind `ArcSwap`.
pub struct AppState {
    pub config: ArcSwap<Config>,
    pub metrics: Metrics,
    pub certs: Arc<CertStore>,
    pub ready: AtomicBool,
    /// The webhook port is at its connection cap: not ready, so the Service sends elsewhere.
    pub at_capacity: AtomicBool,
    pub max_body_bytes: usize,
    pub body_timeout: Duration,
    /// The cluster as the watches see it; `None` without API access (checks off).
    pub cluster: Option<Arc<cluster::ClusterWatch>>,
    /// The first cluster lists arrived, or the sync timeout passed (readiness waits for it).
    pub cluster_ready: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("configuration {path}: {source}")]
    Config {
        path: String,
        source: crate::config::ConfigError,
    },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot write the CA certificate to {path}: {source}")]
    WriteCa {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("bad flag: {0}")]
    Flag(String),
}

/// The log writer's guard: dropping it flushes the lines still buffered. Kept here so that
/// the second-signal exit, which skips every destructor, can flush the log first.
static LOG_GUARD: std::sync::Mutex<Option<tracing_appender::non_blocking::WorkerGuard>> =
    std::sync::Mutex::new(None);

fn flush_log() {
    let guard = LOG_GUARD.lock().map(|mut g| g.take()).unwrap_or_default();
    drop(guard);
}

pub fn run(args: ServeArgs) -> ExitCode {
    if let Ok(mut g) = LOG_GUARD.lock() {
        *g = Some(init_logging(&args));
    }
    let code = run_logged(args);
    flush_log();
    code
}

fn run_logged(args: ServeArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %ServeError::Runtime(e), "cannot start");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(serve(args, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "cannot serve");
            ExitCode::from(2)
        }
    }
}

/// Logs go to stderr through a background writer: a decision line costs a channel send on
/// the request path instead of a write(2). Lines are never dropped (lossy = false).
fn init_logging(args: &ServeArgs) -> tracing_appender::non_blocking::WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(4096)
        .finish(std::io::BufWriter::new(std::io::stderr()));
    // Colours only for a person at a terminal, never in a file or a log collector.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(writer);
    let _ = match args.log_format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
    guard
}

/// Resolves at the first SIGTERM or SIGINT; a second one exits the process at once.
async fn shutdown_signal() {
    wait_signal().await;
    tokio::spawn(async {
        wait_signal().await;
        tracing::warn!("second signal: exiting now");
        flush_log();
        std::process::exit(1);
    });
}

async fn wait_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn seconds(name: &str, v: f64) -> Result<Duration, ServeError> {
    Duration::try_from_secs_f64(v).map_err(|_| {
        ServeError::Flag(format!(
            "{name} must be a non-negative number of seconds, not {v}"
        ))
    })
}

/// Runs until `shutdown` resolves, then drains and returns.
pub async fn serve(
    args: ServeArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let header_timeout = seconds("--header-timeout-seconds", args.header_timeout_seconds)?;
    let drain_delay = seconds("--drain-delay-seconds", args.drain_delay_seconds)?;
    let grace = seconds("--grace-period-seconds", args.grace_period_seconds)?;
    let poll =
        seconds("--reload-poll-seconds", args.reload_poll_seconds)?.max(Duration::from_millis(100));
    let webhook_bounds = connection::Bounds {
        header: header_timeout,
        h1_idle: seconds("--idle-timeout-seconds", args.idle_timeout_seconds)?,
        h2_idle: seconds("--h2-idle-timeout-seconds", args.h2_idle_timeout_seconds)?,
    };
    let admin_idle = seconds(
        "--admin-idle-timeout-seconds",
        args.admin_idle_timeout_seconds,
    )?;
    let admin_bounds = connection::Bounds {
        header: seconds(
            "--admin-header-timeout-seconds",
            args.admin_header_timeout_seconds,
        )?,
        h1_idle: admin_idle,
        h2_idle: admin_idle,
    };
    let body_timeout = seconds("--body-timeout-seconds", args.body_timeout_seconds)?;

    let config_error = |path: &std::path::Path, source| ServeError::Config {
        path: path.display().to_string(),
        source,
    };
    let (config, loaded_config) = match &args.config {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| {
                config_error(
                    path,
                    crate::config::ConfigError::Read {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    },
                )
            })?;
            let text = String::from_utf8_lossy(&bytes);
            let config = Config::parse(&text).map_err(|e| config_error(path, e))?;
            (config, Some(bytes))
        }
        None => (Config::default(), None),
    };
    let mut loaded_cert = None;
    let loaded = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|source| tls::TlsError::Read {
                    path: p.display().to_string(),
                    source,
                })
            };
            let (cert_pem, key_pem) = (read(cert)?, read(key)?);
            let loaded = tls::load_pem(&cert_pem, &key_pem)?;
            // The bytes just loaded, as the reloader compares them (`read_pair`'s form).
            loaded_cert = Some([cert_pem, vec![0], key_pem].concat());
            loaded
        }
        _ => {
            let generated = tls::self_signed(&["localhost", "127.0.0.1", "::1"])?;
            let path = args
                .ca_out
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join("ephemeral-volume-injector-ca.crt"));
            std::fs::write(&path, &generated.ca_pem).map_err(|source| ServeError::WriteCa {
                path: path.display().to_string(),
                source,
            })?;
            tracing::info!(ca = %path.display(), "no --tls-cert given: serving a self-signed certificate for localhost; its CA certificate is in this file");
            tls::load_pem(generated.cert_pem.as_bytes(), generated.key_pem.as_bytes())?
        }
    };

    let sync_timeout = seconds(
        "--cluster-sync-timeout-seconds",
        args.cluster_sync_timeout_seconds,
    )?;
    // Cluster access is optional: a bad --kubeconfig stops the start (it was asked for), a
    // missing in-cluster credential only turns the checks off.
    let client = match cluster::client(args.kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e @ cluster::ClusterAccessError::Kubeconfig { .. }) => {
            return Err(ServeError::Flag(e.to_string()));
        }
        Err(e) => {
            tracing::warn!(error = %e, "cluster checks off: cannot reach the API server");
            None
        }
    };
    if client.is_none() {
        tracing::info!("cluster checks off: no --kubeconfig and not running in a cluster");
    }
    let watch = client
        .as_ref()
        .map(|_| Arc::new(cluster::ClusterWatch::new()));

    let metrics = Metrics::default();
    metrics.cert_not_after.set(loaded.not_after);
    let certs = Arc::new(CertStore::new(loaded.key));
    let state = Arc::new(AppState {
        config: ArcSwap::from_pointee(config),
        metrics,
        certs: certs.clone(),
        ready: AtomicBool::new(false),
        at_capacity: AtomicBool::new(false),
        max_body_bytes: args.max_body_bytes,
        body_timeout,
        cluster: watch.clone(),
        cluster_ready: AtomicBool::new(watch.is_none()),
    });
    if let (Some(client), Some(w)) = (client, watch) {
        tracing::info!(sync_timeout = ?sync_timeout, "cluster checks: watching CSIDrivers and StorageClasses");
        cluster::watch(client, w.clone(), state.clone());
        let state = state.clone();
        tokio::spawn(async move {
            let complete = tokio::time::timeout(sync_timeout, w.wait_complete())
                .await
                .is_ok();
            state.cluster_ready.store(true, Ordering::SeqCst);
            if !complete {
                state.metrics.cluster_degraded.set(1);
                tracing::warn!(timeout = ?sync_timeout, "the cluster's CSIDriver and StorageClass lists have not arrived: ready, with the cluster checks in warn until they do");
                w.wait_complete().await;
                state.metrics.cluster_degraded.set(0);
                tracing::info!(
                    "cluster lists received: the cluster checks are as configured again"
                );
            }
        });
    }
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(certs)?));

    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })
    };
    let listener = bind(args.listen).await?;
    let admin = bind(args.admin_listen).await?;
    let webhook_addr = listener.local_addr().unwrap_or(args.listen);
    let admin_addr = admin.local_addr().unwrap_or(args.admin_listen);

    let (stop_webhook, webhook_stopping) = tokio::sync::watch::channel(false);
    let (stop_admin, admin_stopping) = tokio::sync::watch::channel(false);
    let admin_port = Arc::new(Port {
        name: "admin",
        app: admin_router(state.clone()),
        tls: None,
        bounds: admin_bounds,
        cap: args.admin_max_connections.max(1),
        permits: Arc::new(tokio::sync::Semaphore::new(
            args.admin_max_connections.max(1),
        )),
        state: state.clone(),
        stopping: admin_stopping.clone(),
    });
    let admin_task = tokio::spawn({
        let port = admin_port.clone();
        let mut stopping = admin_stopping;
        async move {
            accept_loop(&admin, &port, async move {
                let _ = stopping.wait_for(|s| *s).await;
            })
            .await;
        }
    });
    if args.tls_cert.is_some() || args.config.is_some() {
        let watched = reload::Watched {
            cert: args.tls_cert.clone().zip(args.tls_key.clone()),
            config: args.config.clone(),
            loaded_cert,
            loaded_config,
        };
        tokio::spawn(reload::run(state.clone(), watched, poll));
    }

    let webhook_port = Port {
        name: "webhook",
        app: webhook_router(state.clone()),
        tls: Some(acceptor),
        bounds: webhook_bounds,
        cap: args.max_connections.max(1),
        permits: Arc::new(tokio::sync::Semaphore::new(args.max_connections.max(1))),
        state: state.clone(),
        stopping: webhook_stopping,
    };
    state.ready.store(true, Ordering::SeqCst);
    tracing::info!(webhook = %webhook_addr, admin = %admin_addr, "listening");

    let mut shutdown = std::pin::pin!(shutdown);
    accept_loop(&listener, &webhook_port, shutdown.as_mut()).await;

    // Unready at once; keep serving for the drain delay so endpoints stop sending us traffic.
    state.ready.store(false, Ordering::SeqCst);
    tracing::info!(drain_delay = ?drain_delay, "shutting down: not ready");
    if !drain_delay.is_zero() {
        accept_loop(&listener, &webhook_port, tokio::time::sleep(drain_delay)).await;
    }
    drop(listener);
    // Keep-alive ends after the request in flight; HTTP/2 gets GOAWAY.
    let _ = stop_webhook.send(true);
    tokio::select! {
        _ = webhook_port.closed() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(grace) => tracing::warn!(grace = ?grace, "grace period over; exiting with connections open"),
    }
    let _ = stop_admin.send(true);
    let _ = admin_task.await;
    let _ = tokio::time::timeout(Duration::from_secs(1), admin_port.closed()).await;
    Ok(())
}

/// A listening port: what it serves, its bounds and its connection cap.
struct Port {
    name: &'static str,
    app: Router,
    tls: Option<TlsAcceptor>,
    bounds: connection::Bounds,
    cap: usize,
    permits: Arc<tokio::sync::Semaphore>,
    state: Arc<AppState>,
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl Port {
    /// Resolves when every connection of this port has closed.
    async fn closed(&self) {
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
async fn accept_loop(
    listener: &TcpListener,
    port: &Port,
    until: impl std::future::Future<Output = ()>,
) {
    let mut until = std::pin::pin!(until);
    let m = &port.state.metrics;
    loop {
        let permit = match port.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                m.at_capacity.get_or_create(&port.label()).inc();
                if port.tls.is_some() {
                    port.state.at_capacity.store(true, Ordering::SeqCst);
                }
                tracing::warn!(
                    port = port.name,
                    cap = port.cap,
                    "at the connection cap: waiting for a connection to close"
                );
                let permit = tokio::select! {
                    _ = until.as_mut() => return,
                    permit = port.permits.clone().acquire_owned() => match permit {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                port.state.at_capacity.store(false, Ordering::SeqCst);
                permit
            }
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
        let _ = tcp.set_nodelay(true);
        let (app, tls, bounds, name) = (port.app.clone(), port.tls.clone(), port.bounds, port.name);
        let state = port.state.clone();
        let mut stopping = port.stopping.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let m = &state.metrics;
            let open = m
                .connections_open
                .get_or_create(&PortLabel { port: name })
                .clone();
            open.inc();
            let stop = async move {
                let _ = stopping.wait_for(|s| *s).await;
            };
            match tls {
                None => connection::serve(tcp, false, app, bounds, m, name, stop).await,
                Some(acceptor) => {
                    match tokio::time::timeout(bounds.header, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            // ALPN decides the protocol: no sniffing of the first bytes, which
                            // would wait for a silent client.
                            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                            connection::serve(tls, h2, app, bounds, m, name, stop).await;
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => {
                            m.connections_closed
                                .get_or_create(&CauseLabel {
                                    port: name,
                                    cause: connection::Cause::HandshakeTimeout.as_str(),
                                })
                                .inc();
                            tracing::debug!("TLS handshake timed out");
                        }
                    }
                }
            }
            open.dec();
        });
    }
}

// === the webhook ===

pub fn webhook_router(state: Arc<AppState>) -> Router {
    let router = Router::new().route("/mutate", post(mutate));
    with_json_errors(router, state, "webhook", "the webhook is POST /mutate")
}

/// The shared end of both routers: JSON 404 and 405 naming what the port serves, and every
/// response counted by port and status code.
fn with_json_errors(
    router: Router<Arc<AppState>>,
    state: Arc<AppState>,
    port: &'static str,
    serves: &'static str,
) -> Router {
    router
        .method_not_allowed_fallback(move || async move {
            json_error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("method not allowed: {serves}"),
            )
        })
        .fallback(move || async move {
            json_error(StatusCode::NOT_FOUND, &format!("not found: {serves}"))
        })
        .layer(axum::middleware::from_fn_with_state(
            (state.clone(), port),
            count_responses,
        ))
        .with_state(state)
}

/// Every response is counted by port and status code.
async fn count_responses(
    State((state, port)): State<(Arc<AppState>, &'static str)>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(req).await;
    state
        .metrics
        .responses
        .get_or_create(&CodeLabel {
            port,
            code: response.status().as_u16(),
        })
        .inc();
    response
}

/// Every error response is JSON with a reason: `{"error": "..."}`.
fn json_error(code: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The body, within the size and time bounds. A `Content-Length` over the limit is refused
/// before anything is read (so `Expect: 100-continue` gets its 413 at once, not a 100).
async fn read_body(state: &AppState, req: axum::extract::Request) -> Result<Bytes, Response> {
    let limit = state.max_body_bytes;
    let too_large = || {
        json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body over the limit of {limit} bytes (--max-body-bytes)"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        // Refused before it is read. A client that sends its body anyway (no `Expect:
        // 100-continue`) is still writing it: read and drop up to one limit's worth for a
        // moment, so that closing does not reset the connection under the 413 it has not
        // read yet (the "lingering close" of other servers). With `Expect`, nothing is read.
        let expects = req.headers().contains_key(header::EXPECT);
        if !expects {
            let body = req.into_body();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), collect(body, limit)).await;
            });
        }
        return Err(too_large());
    }
    match tokio::time::timeout(state.body_timeout, collect(req.into_body(), limit)).await {
        Ok(Ok(Some(bytes))) => Ok(bytes),
        Ok(Ok(None)) => Err(too_large()),
        Ok(Err(e)) => Err(json_error(
            StatusCode::BAD_REQUEST,
            &format!("cannot read the request body: {e}"),
        )),
        Err(_) => Err(json_error(
            StatusCode::REQUEST_TIMEOUT,
            &format!(
                "the request body did not arrive within {:?} (--body-timeout-seconds)",
                state.body_timeout
            ),
        )),
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

async fn mutate(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    let body = match read_body(&state, req).await {
        Ok(b) => b,
        Err(response) => return response,
    };
    let start = Instant::now();
    let config = state.config.load();
    let m = &state.metrics;
    let snapshot = state.cluster.as_ref().map(|w| (w.snapshot(), w.complete()));
    let known = snapshot
        .as_ref()
        .map(|(s, complete)| crate::cluster::Known {
            state: s,
            complete: *complete,
        });
    let response = match review::handle_in(&config, known, &body) {
        Ok(h) => {
            record(m, &h);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                h.body,
            )
                .into_response()
        }
        Err(e) => {
            m.requests
                .get_or_create(&ResultLabel { result: "invalid" })
                .inc();
            tracing::debug!(error = %e, "bad request");
            json_error(StatusCode::BAD_REQUEST, &e.to_string())
        }
    };
    m.duration.observe(start.elapsed().as_secs_f64());
    response
}

/// The decision in the metrics and the decision log.
fn record(m: &Metrics, h: &review::Handled<'_>) {
    let d = &h.decision;
    m.requests
        .get_or_create(&ResultLabel { result: d.label() })
        .inc();
    for (_, kind) in d.injected() {
        m.volumes
            .get_or_create(&KindLabel {
                kind: kind.as_str(),
            })
            .inc();
    }
    match d {
        Decision::Denied(denial) => {
            m.denials
                .get_or_create(&ReasonLabel {
                    reason: denial.reason.as_str(),
                })
                .inc();
            tracing::info!(uid = %h.uid, namespace = %h.namespace, pod = %h.pod, dry_run = h.dry_run,
                reason = denial.reason.as_str(), denial = %denial.message, "denied");
        }
        Decision::AdmittedDespiteError { denial, .. } => {
            m.denials
                .get_or_create(&ReasonLabel { reason: d.label() })
                .inc();
            tracing::warn!(uid = %h.uid, namespace = %h.namespace, pod = %h.pod, dry_run = h.dry_run,
                reason = denial.reason.as_str(), denial = %denial.message,
                "admitted without volumes (onError: warn)");
        }
        Decision::Mutated { injected, .. } => {
            let volumes: Vec<&str> = injected.iter().map(|(n, _)| n.as_str()).collect();
            tracing::info!(uid = %h.uid, namespace = %h.namespace, pod = %h.pod, dry_run = h.dry_run,
                volumes = %volumes.join(","), "mutated");
        }
        Decision::Unchanged { .. } => {
            tracing::debug!(uid = %h.uid, namespace = %h.namespace, pod = %h.pod, "unchanged");
        }
    }
}

// === the admin port ===

pub fn admin_router(state: Arc<AppState>) -> Router {
    let router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(s): State<Arc<AppState>>| async move {
                if !s.ready.load(Ordering::SeqCst) {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                } else if !s.cluster_ready.load(Ordering::SeqCst) {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "not ready: waiting for the cluster's CSIDriver and StorageClass lists\n",
                    )
                } else if s.at_capacity.load(Ordering::SeqCst) {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "not ready: the webhook port is at its connection cap\n",
                    )
                } else {
                    (StatusCode::OK, "ready\n")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(s): State<Arc<AppState>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    s.metrics.encode(),
                )
            }),
        );
    with_json_errors(
        router,
        state,
        "admin",
        "the admin endpoints are GET /healthz, /readyz, /metrics",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use tower::ServiceExt as _;

    fn state(config: &str) -> Arc<AppState> {
        let pair = tls::self_signed(&["localhost"]).unwrap();
        let loaded = tls::load_pem(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes()).unwrap();
        Arc::new(AppState {
            config: ArcSwap::from_pointee(Config::parse(config).unwrap()),
            metrics: Metrics::default(),
            certs: Arc::new(CertStore::new(loaded.key)),
            ready: AtomicBool::new(true),
            at_capacity: AtomicBool::new(false),
            max_body_bytes: 1 << 20,
            body_timeout: Duration::from_secs(5),
            cluster: None,
            cluster_ready: AtomicBool::new(true),
        })
    }

    async fn post(state: &Arc<AppState>, body: &serde_json::Value) -> serde_json::Value {
        let request = axum::http::Request::post("/mutate")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap();
        let response = webhook_router(state.clone())
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn review(annotations: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "0d5c7a1e-0000-4000-8000-000000000001",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE", "namespace": "nf",
                "object": {"metadata": {"generateName": "nf-", "annotations": annotations},
                           "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
            }
        })
    }

    #[tokio::test]
    async fn each_verdict_is_counted_under_its_own_result_and_reason() {
        let state = state("onError: warn");
        let ok =
            serde_json::json!({"ephemeral-volumes.io/s": "type=emptyDir,mountPath=/s,size=1Gi"});
        let bad = serde_json::json!({"ephemeral-volumes.io/s": "type=emptyDir,mountpath=/s"});
        post(&state, &review(ok.clone())).await;
        post(&state, &review(serde_json::json!({"other": "x"}))).await;
        let warned = post(&state, &review(bad.clone())).await;
        assert_eq!(warned["response"]["allowed"], true);
        // Called again with the error annotation already there (reinvocation): counted the same.
        let mut again = bad.clone();
        again["injector.ephemeral-volumes.io/error"] = serde_json::json!("x");
        post(&state, &review(again)).await;
        let text = state.metrics.encode();
        for line in [
            "evi_admission_requests_total{result=\"mutated\"} 1",
            "evi_admission_requests_total{result=\"unchanged\"} 1",
            "evi_admission_requests_total{result=\"admitted-on-error\"} 2",
            "evi_denials_total{reason=\"admitted-on-error\"} 2",
            "evi_volumes_injected_total{kind=\"emptyDir\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }

        let state = self::state("");
        let denied = post(&state, &review(bad)).await;
        assert_eq!(denied["response"]["status"]["code"], 400);
        let text = state.metrics.encode();
        assert!(
            text.contains("evi_admission_requests_total{result=\"denied\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("evi_denials_total{reason=\"invalid\"} 1"),
            "{text}"
        );
        assert!(!text.contains("admitted-on-error\"} "), "{text}");
    }

    #[tokio::test]
    async fn a_body_without_a_length_is_refused_when_it_passes_the_limit() {
        let state = state("");
        let request = axum::http::Request::post("/mutate")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(vec![b' '; (1 << 20) + 1]))
            .unwrap();
        assert!(request.headers().get(header::CONTENT_LENGTH).is_none());
        let response = webhook_router(state.clone())
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(
            body["error"].as_str().unwrap().contains("--max-body-bytes"),
            "{body}"
        );
        assert!(
            state
                .metrics
                .encode()
                .contains("evi_http_responses_total{port=\"webhook\",code=\"413\"} 1")
        );
    }
}
