//! `serve`: the HTTPS webhook, the plain-HTTP admin port, hot reload and graceful shutdown.

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
    extract::{DefaultBodyLimit, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use self::{
    metrics::{KindLabel, Metrics, ReasonLabel, ResultLabel},
    tls::CertStore,
};
use crate::{
    config::Config,
    review::{self, Verdict},
};

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
    /// Configuration file (YAML, SPEC §2); reloaded when it changes. Built-in defaults without it.
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
    /// Seconds a client has to send the request headers (and to finish the TLS handshake).
    #[arg(long, env = "EVI_HEADER_TIMEOUT_SECONDS", default_value_t = 5.0)]
    pub header_timeout_seconds: f64,
    /// Connections served at once; more wait in the kernel's backlog. Bounds memory under a
    /// flood of idle or slow clients (each connection in a TLS handshake holds ~25 KiB). Too low a
    /// limit lets a flood of idle connections starve the API server until they time out.
    #[arg(long, env = "EVI_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
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

pub fn run(args: ServeArgs) -> ExitCode {
    // Held until the process exits, so buffered log lines are flushed at shutdown.
    let _log_guard = init_logging(&args);
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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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

    let config = match &args.config {
        Some(path) => Config::load(path).map_err(|source| ServeError::Config {
            path: path.display().to_string(),
            source,
        })?,
        None => Config::default(),
    };
    let loaded = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => tls::load_files(cert, key)?,
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

    let metrics = Metrics::default();
    metrics.cert_not_after.set(loaded.not_after);
    let certs = Arc::new(CertStore::new(loaded.key));
    let state = Arc::new(AppState {
        config: ArcSwap::from_pointee(config),
        metrics,
        certs: certs.clone(),
        ready: AtomicBool::new(false),
    });
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(certs)?));

    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: args.listen,
            source,
        })?;
    let admin = TcpListener::bind(args.admin_listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: args.admin_listen,
            source,
        })?;
    let webhook_addr = listener.local_addr().unwrap_or(args.listen);
    let admin_addr = admin.local_addr().unwrap_or(args.admin_listen);

    let (admin_stop_tx, admin_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let admin_task = tokio::spawn({
        let app = admin_router(state.clone());
        async move {
            let _ = axum::serve(admin, app)
                .with_graceful_shutdown(async {
                    let _ = admin_stop_rx.await;
                })
                .await;
        }
    });
    if args.tls_cert.is_some() || args.config.is_some() {
        let watched = reload::Watched {
            cert: args.tls_cert.clone().zip(args.tls_key.clone()),
            config: args.config.clone(),
        };
        tokio::spawn(reload::run(state.clone(), watched, poll));
    }

    let app = webhook_router(state.clone(), args.max_body_bytes);
    let graceful = GracefulShutdown::new();
    let limits = Limits {
        header_timeout,
        connections: Arc::new(tokio::sync::Semaphore::new(args.max_connections.max(1))),
    };
    state.ready.store(true, Ordering::SeqCst);
    tracing::info!(webhook = %webhook_addr, admin = %admin_addr, "listening");

    let mut shutdown = std::pin::pin!(shutdown);
    accept_loop(
        &listener,
        &acceptor,
        &app,
        &graceful,
        &limits,
        shutdown.as_mut(),
    )
    .await;

    // Unready at once; keep serving for the drain delay so endpoints stop sending us traffic.
    state.ready.store(false, Ordering::SeqCst);
    tracing::info!(drain_delay = ?drain_delay, "shutting down: not ready");
    if !drain_delay.is_zero() {
        let delay = tokio::time::sleep(drain_delay);
        accept_loop(&listener, &acceptor, &app, &graceful, &limits, delay).await;
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(grace) => tracing::warn!(grace = ?grace, "grace period over; exiting with connections open"),
    }
    let _ = admin_stop_tx.send(());
    let _ = admin_task.await;
    Ok(())
}

struct Limits {
    header_timeout: Duration,
    connections: Arc<tokio::sync::Semaphore>,
}

async fn accept_loop(
    listener: &TcpListener,
    acceptor: &TlsAcceptor,
    app: &Router,
    graceful: &GracefulShutdown,
    limits: &Limits,
    until: impl std::future::Future<Output = ()>,
) {
    let header_timeout = limits.header_timeout;
    let mut until = std::pin::pin!(until);
    loop {
        // At the connection limit, stop accepting until one closes.
        let permit = tokio::select! {
            _ = until.as_mut() => return,
            permit = limits.connections.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (tcp, _peer) = tokio::select! {
            _ = until.as_mut() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(header_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!("TLS handshake timed out");
                    return;
                }
            };
            // ALPN decides the protocol: no sniffing of the first bytes, which would wait
            // for a silent client without any timeout.
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // hyper's header-read timeout also runs while a keep-alive connection is idle,
            // so it bounds idle and slow clients alike.
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(256)
                .keep_alive_interval(Some(Duration::from_secs(30)));
            let builder = if h2 {
                builder.http2_only()
            } else {
                builder.http1_only()
            };
            let conn = builder
                .serve_connection(TokioIo::new(tls), service)
                .into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
}

// === the webhook ===

pub fn webhook_router(state: Arc<AppState>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .fallback(|| async {
            json_error(
                StatusCode::NOT_FOUND,
                "not found: the webhook path is POST /mutate",
            )
        })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

fn json_error(code: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn mutate(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let config = state.config.load();
    let m = &state.metrics;
    let response = match review::handle(&config, &body) {
        Ok(h) => {
            let result = match &h.verdict {
                Verdict::Unchanged => "unchanged",
                Verdict::Mutated => "mutated",
                Verdict::Denied(_) => "denied",
                Verdict::AdmittedDespiteError(_) => "admitted-on-error",
            };
            m.requests.get_or_create(&ResultLabel { result }).inc();
            for (_, kind) in &h.injected {
                m.volumes
                    .get_or_create(&KindLabel {
                        kind: kind.as_str(),
                    })
                    .inc();
            }
            match &h.verdict {
                Verdict::Denied(reason) => {
                    m.denials
                        .get_or_create(&ReasonLabel {
                            reason: reason.as_str(),
                        })
                        .inc();
                    tracing::info!(uid = %h.uid, namespace = %h.namespace, pod = %h.pod, dry_run = h.dry_run,
                        reason = reason.as_str(), denial = h.message.as_deref().unwrap_or_default(), "denied");
                }
                Verdict::AdmittedDespiteError(reason) => {
                    m.denials
                        .get_or_create(&ReasonLabel {
                            reason: "admitted-on-error",
                        })
                        .inc();
                    tracing::warn!(uid = %h.uid, namespace = %h.namespace, pod = %h.pod, dry_run = h.dry_run,
                        reason = reason.as_str(), denial = h.message.as_deref().unwrap_or_default(),
                        "admitted without volumes (onError: warn)");
                }
                Verdict::Mutated => {
                    let volumes = h
                        .injected
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>();
                    tracing::info!(uid = %h.uid, namespace = %h.namespace, pod = %h.pod, dry_run = h.dry_run,
                        volumes = %volumes.join(","), "mutated");
                }
                Verdict::Unchanged => {
                    tracing::debug!(uid = %h.uid, namespace = %h.namespace, pod = %h.pod, "unchanged");
                }
            }
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

// === the admin port ===

pub fn admin_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(s): State<Arc<AppState>>| async move {
                if s.ready.load(Ordering::SeqCst) {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
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
        )
        .with_state(state)
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
        })
    }

    async fn post(state: &Arc<AppState>, body: &serde_json::Value) -> serde_json::Value {
        let request = axum::http::Request::post("/mutate")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap();
        let response = webhook_router(state.clone(), 1 << 20)
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
}
