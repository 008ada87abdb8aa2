//! `serve`: the HTTPS webhook, the plain-HTTP admin port, hot reload and graceful shutdown.
//! This file is the composition (`serve` starts the parts in order); the parts, from the
//! bottom up:
//!
//! - `certs`, `tasks`, `client` (the API client), `cluster_view` (the snapshot the request path
//!   reads), `log_writer` and `json_log` (the log lines and their writer);
//! - [`tls`] (the certificate store), `metrics` (every metric, defined once); `errors` (why
//!   `serve` could not start), `bodies` (request bodies within their size, time and memory
//!   bounds);
//! - `state` (what every request shares), `connection` (one connection's timeouts);
//! - `http` (JSON errors and response counts, shared by both ports), `listener` (the ports,
//!   their connection caps, TLS), `args` (the flags), `watch` (the cluster watches), `reload`
//!   (certificate and configuration reloads);
//! - `webhook` (`POST /mutate`, `POST /validate`), `admin` (`/healthz`, `/readyz`,
//!   `/metrics`), `logging`, `selftls` (the self-managed certificate keeper); `shutdown`
//!   (signals and the drain).

mod admin;
mod args;
mod bodies;
mod certs;
mod client;
mod cluster_view;
mod connection;
mod errors;
mod http;
pub mod json_log;
mod listener;
mod log_writer;
mod logging;
mod metrics;
mod reload;
mod selftls;
mod shutdown;
mod state;
mod tasks;
pub mod tls;
mod watch;

pub use client::{
    ClusterAccessError, ClusterSource, client as api_client, client_for, cluster_source,
    with_cluster,
};
mod webhook;

use std::{
    net::SocketAddr,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub use self::args::{LogFormat, ServeArgs};
pub use self::errors::ServeError;
use self::{
    bodies::{Bodies, BodyBudget},
    listener::{Port, accept_loop},
    logging::{LOG_GUARD, flush_log, init_logging},
    metrics::Metrics,
    shutdown::shutdown_signal,
    state::{AppState, reviews_at_once},
    tls::CertStore,
};
use crate::config::Config;

/// Runs `serve` until SIGTERM or SIGINT; exits 2 if it cannot start.
pub fn run(args: ServeArgs) -> ExitCode {
    if let Ok(mut g) = LOG_GUARD.lock() {
        *g = init_logging(&args);
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

/// Runs until `shutdown` resolves, then drains and returns.
pub async fn serve(
    args: ServeArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let timing = args.timing()?;

    let (config, loaded_config) = initial_config(&args)?;
    let self_tls = selftls::Settings::from_args(&args)?;
    let first = first_certificate(&args, self_tls.is_some())?;
    let clients = clients(&args, &config, self_tls.is_some()).await?;
    let watch = (clients.cluster.as_ref()).map(|_| Arc::new(cluster_view::ClusterWatch::new()));

    let certs = Arc::new(CertStore::new(first.loaded.key));
    let (cluster, no_client, tls_ready) = (watch.clone(), clients.no_client, self_tls.is_none());
    let state = app_state(
        &args,
        &timing,
        config,
        certs.clone(),
        cluster,
        no_client,
        tls_ready,
    );
    state.metrics.cert_not_after.set(first.loaded.not_after);
    let background = tasks::Background::new();
    if let (Some(settings), Some(client)) = (self_tls, clients.tls) {
        selftls::start(client, settings, state.clone(), &background);
    }
    if let (Some(client), Some(w)) = (clients.cluster, watch) {
        start_watches(client, w, &state, &background, timing.cluster_sync);
    }
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(certs)?));

    let listener = bind(args.listen).await?;
    let admin = bind(args.admin_listen).await?;
    let webhook_addr = listener.local_addr().unwrap_or(args.listen);
    let admin_addr = admin.local_addr().unwrap_or(args.admin_listen);
    if let Some(ca_pem) = first.generated_ca {
        write_generated_ca(&args, &ca_pem, webhook_addr)?;
    }

    let (stop_webhook, webhook_stopping) = tokio::sync::watch::channel(false);
    let admin = start_admin(&args, &state, &timing, admin, admin_addr)?;
    start_reloader(
        &args,
        &state,
        first.loaded_cert,
        loaded_config,
        timing.poll,
        &background,
    );

    let webhook_port = Port::new(
        "webhook",
        webhook::router(state.clone()),
        Some(acceptor),
        timing.webhook,
        args.max_connections,
        args.max_connections_per_peer,
        state.clone(),
        webhook_stopping,
    );
    state.ready.store(true, Ordering::SeqCst);
    tracing::info!(webhook = %webhook_addr, admin = %admin_addr, "listening");

    let mut shutdown = std::pin::pin!(shutdown);
    accept_loop(&listener, &webhook_port, shutdown.as_mut()).await;

    background.signal();
    shutdown::drain(&state, listener, &webhook_port, stop_webhook, &timing).await;
    stop_the_rest(background, admin).await;
    Ok(())
}

/// After the drain: the background tasks, then the admin port.
async fn stop_the_rest(background: tasks::Background, admin: Admin) {
    if background.stop(BACKGROUND_STOP).await {
        tracing::info!("background tasks stopped");
    } else {
        tracing::warn!(running = background.running(), within = ?BACKGROUND_STOP, "background tasks still running; exiting all the same");
    }
    shutdown::close_admin(admin.stop, admin.task, admin.port).await;
    admin.runtime.stop();
}

/// The serving certificate `serve` starts with: the self-managed keeper's placeholder (it puts
/// the first certificate in; readiness waits for it), or the files', or one generated.
fn first_certificate(args: &ServeArgs, self_managed: bool) -> Result<Initial, ServeError> {
    if self_managed {
        return Ok(Initial {
            loaded: selftls::placeholder()?,
            loaded_cert: None,
            generated_ca: None,
        });
    }
    initial_certificate(args)
}

/// The state every request shares, not ready yet (`tls_ready`: a serving certificate is in
/// hand already).
fn app_state(
    args: &ServeArgs,
    timing: &args::Timing,
    config: Config,
    certs: Arc<CertStore>,
    cluster: Option<Arc<cluster_view::ClusterWatch>>,
    no_client: Option<String>,
    tls_ready: bool,
) -> Arc<AppState> {
    Arc::new(AppState {
        config: ArcSwap::from_pointee(config),
        metrics: Metrics::default(),
        certs,
        ready: AtomicBool::new(false),
        bodies: Bodies {
            max_bytes: args.max_body_bytes,
            timeout: timing.body,
            budget: BodyBudget::new(args.max_inflight_body_bytes),
        },
        reviews: tokio::sync::Semaphore::new(reviews_at_once()),
        large_review: tokio::sync::Semaphore::new(1),
        cluster_ready: AtomicBool::new(cluster.is_none()),
        cluster,
        no_client,
        tls_ready: AtomicBool::new(tls_ready),
    })
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// The cluster checks' watches, and the timeout readiness waits for their first lists.
fn start_watches(
    client: kube::Client,
    w: Arc<cluster_view::ClusterWatch>,
    state: &Arc<AppState>,
    background: &tasks::Background,
    sync: Duration,
) {
    tracing::info!(sync_timeout = ?sync, "cluster checks: watching CSIDrivers and StorageClasses");
    watch::watch(client, w.clone(), state.clone(), background, sync);
    let synced = watch::await_sync(w, state.clone(), sync);
    background.spawn(tasks::Until::Exit, "cluster checks: sync timeout", synced);
}

/// The API clients `serve` uses.
struct Clients {
    /// For the cluster checks and the Namespace watch, when the configuration reads the cluster.
    cluster: Option<kube::Client>,
    /// Why there is none although one was asked for.
    no_client: Option<String>,
    /// For the self-managed certificate's Secret (`--tls-secret`), which needs one whatever
    /// the checks: without it there is no certificate.
    tls: Option<kube::Client>,
}

async fn clients(args: &ServeArgs, config: &Config, self_tls: bool) -> Result<Clients, ServeError> {
    let (cluster, no_client) = match cluster_client(args, config.reads_cluster()).await? {
        ClientOutcome::Client(c) => (Some(c), None),
        ClientOutcome::NotAskedFor => (None, None),
        ClientOutcome::Failed(why) => (None, Some(why)),
    };
    if let (None, Some(note)) = (&cluster, config.needs_namespace_labels()) {
        tracing::warn!("without API access: {note}");
    }
    let needs = |why: String| ServeError::Flag(format!("--tls-secret needs the API server: {why}"));
    let tls = match (self_tls, &cluster) {
        (false, _) => None,
        (true, Some(c)) => Some(c.clone()),
        (true, None) => match client::client(args.kubeconfig.as_deref()).await {
            Ok(Some(c)) => Some(c),
            Ok(None) => {
                return Err(needs(
                    "give --kubeconfig, or run in a pod with a service account".into(),
                ));
            }
            Err(e) => return Err(needs(e.to_string())),
        },
    };
    Ok(Clients {
        cluster,
        no_client,
        tls,
    })
}

/// The CA certificate of the self-signed serving certificate, written once the port is ours:
/// a second server that fails to bind writes nothing, and the default name carries the port,
/// so two servers never share a file.
fn write_generated_ca(
    args: &ServeArgs,
    ca_pem: &str,
    webhook_addr: SocketAddr,
) -> Result<(), ServeError> {
    let path = args.ca_out.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "ephemeral-volume-injector-{}-ca.crt",
            webhook_addr.port()
        ))
    });
    write_no_follow(&path, ca_pem.as_bytes()).map_err(|source| ServeError::WriteCa {
        path: path.display().to_string(),
        source,
    })?;
    tracing::info!(ca = %path.display(), "no --tls-cert given: serving a self-signed certificate for localhost; its CA certificate is in this file");
    Ok(())
}

/// Writes `bytes` to `path` without following a symbolic link there (the default path is in
/// the shared temporary directory, where another user could have put one to a file of
/// ours): a new file beside it, then renamed over it. A link at `path` is refused.
fn write_no_follow(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let is_link = |p: &std::path::Path| {
        std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
    };
    if is_link(path) {
        return Err(std::io::Error::other(
            "it is a symbolic link, which the webhook does not follow (remove it, or name another file)",
        ));
    }
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(name);
    // create_new: never an existing file, nor through a link.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes));
    // A rename replaces the directory entry, a link included, and never follows it.
    let renamed = written.and_then(|()| std::fs::rename(&tmp, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed
}

/// The admin port, serving on its runtime.
struct Admin {
    runtime: AdminRuntime,
    task: tokio::task::JoinHandle<()>,
    port: Arc<Port>,
    stop: tokio::sync::watch::Sender<bool>,
}

/// Starts the admin port on a runtime and thread of its own: reviews that keep every worker
/// of the main runtime busy cannot delay `/healthz` or `/readyz` (a kubelet that sees the
/// probes time out would restart a replica that is only busy).
fn start_admin(
    args: &ServeArgs,
    state: &Arc<AppState>,
    timing: &args::Timing,
    listener: TcpListener,
    addr: SocketAddr,
) -> Result<Admin, ServeError> {
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let port = Arc::new(Port::new(
        "admin",
        admin::router(state.clone()),
        None,
        timing.admin,
        args.admin_max_connections,
        args.admin_max_connections_per_peer,
        state.clone(),
        stopping.clone(),
    ));
    let runtime = AdminRuntime::start().map_err(ServeError::Runtime)?;
    // Its socket moves to that runtime's reactor too.
    let listener = listener
        .into_std()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let task = runtime.spawn({
        let port = port.clone();
        let mut stopping = stopping;
        async move {
            let listener = match TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "the admin port cannot listen");
                    return;
                }
            };
            accept_loop(&listener, &port, async move {
                let _ = stopping.wait_for(|s| *s).await;
            })
            .await;
        }
    });
    Ok(Admin {
        runtime,
        task,
        port,
        stop,
    })
}

/// A current-thread runtime on a thread of its own, for the admin port.
struct AdminRuntime {
    handle: tokio::runtime::Handle,
    /// Dropped (or sent) to end the thread.
    stop: tokio::sync::oneshot::Sender<()>,
}

impl AdminRuntime {
    fn start() -> std::io::Result<AdminRuntime> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("evi-admin".into())
            .spawn(move || {
                // Its tasks run while this waits; the runtime is dropped when it returns.
                runtime.block_on(async move {
                    let _ = stopped.await;
                });
            })?;
        Ok(AdminRuntime { handle, stop })
    }

    fn spawn(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        self.handle.spawn(task)
    }

    fn stop(self) {
        let _ = self.stop.send(());
    }
}

/// How long the shutdown waits for the background tasks after cancelling them (they stop at
/// their next await point: at once, unless one is stuck).
const BACKGROUND_STOP: Duration = Duration::from_secs(5);

/// Watches the certificate and configuration files given on the command line, if any.
fn start_reloader(
    args: &ServeArgs,
    state: &Arc<AppState>,
    loaded_cert: Option<Vec<u8>>,
    loaded_config: Option<Vec<u8>>,
    poll: Duration,
    background: &tasks::Background,
) {
    if args.tls_cert.is_none() && args.config.is_none() {
        return;
    }
    let watched = reload::Watched {
        cert: args.tls_cert.clone().zip(args.tls_key.clone()),
        config: args.config.clone(),
        loaded_cert,
        loaded_config,
    };
    background.spawn(
        tasks::Until::Exit,
        "reloader",
        reload::run(state.clone(), watched, poll),
    );
}

/// The client for the cluster checks. Cluster access is optional: a bad `--kubeconfig` stops
/// the start (it was asked for), a missing in-cluster credential only turns the checks off.
/// The API client of the cluster checks, if there is one.
enum ClientOutcome {
    Client(kube::Client),
    /// No `--kubeconfig` and not in a cluster: run locally, checks off.
    NotAskedFor,
    /// Asked for but not built, with the checks off: why.
    Failed(String),
}

async fn cluster_client(
    args: &ServeArgs,
    reads_cluster: bool,
) -> Result<ClientOutcome, ServeError> {
    match client::client(args.kubeconfig.as_deref()).await {
        Ok(Some(c)) => Ok(ClientOutcome::Client(c)),
        Ok(None) => {
            tracing::info!("cluster checks off: no --kubeconfig and not running in a cluster");
            Ok(ClientOutcome::NotAskedFor)
        }
        // A --kubeconfig that cannot be read is a bad flag, whatever the checks.
        Err(e @ client::ClusterAccessError::Kubeconfig { .. }) => {
            Err(ServeError::Flag(e.to_string()))
        }
        Err(e) if !reads_cluster => {
            tracing::info!(error = %e, "cluster checks off (clusterChecks: off, no policyOverrides by namespace label); no API client needed");
            Ok(ClientOutcome::Failed(e.to_string()))
        }
        // The checks were asked for (a kubeconfig, or a pod's service account) and cannot have
        // a client: refuse to start rather than run with them silently off. A client that
        // cannot be built from these files will not be built by retrying either.
        Err(e) => Err(ServeError::ClusterClient(e)),
    }
}

/// The configuration to start with (the built-in default without `--config`), and its bytes
/// for the reloader.
fn initial_config(args: &ServeArgs) -> Result<(Config, Option<Vec<u8>>), ServeError> {
    let config_error = |path: &std::path::Path, source| ServeError::Config {
        path: path.display().to_string(),
        source,
    };
    match &args.config {
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
            Ok((config, Some(bytes)))
        }
        None => Ok((Config::default(), None)),
    }
}

/// The certificate served from the start.
struct Initial {
    loaded: tls::Loaded,
    /// The files' bytes as the reloader compares them, when files were given.
    loaded_cert: Option<Vec<u8>>,
    /// The self-signed certificate's CA, written out once the port is bound.
    generated_ca: Option<String>,
}

/// The serving certificate: the files given, or a self-signed one for localhost.
fn initial_certificate(args: &ServeArgs) -> Result<Initial, ServeError> {
    match (&args.tls_cert, &args.tls_key) {
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
            Ok(Initial {
                loaded,
                loaded_cert: Some([cert_pem, vec![0], key_pem].concat()),
                generated_ca: None,
            })
        }
        _ => {
            let generated = tls::self_signed(&["localhost", "127.0.0.1", "::1"])?;
            let loaded =
                tls::load_pem(generated.cert_pem.as_bytes(), generated.key_pem.as_bytes())?;
            Ok(Initial {
                loaded,
                loaded_cert: None,
                generated_ca: Some(generated.ca_pem),
            })
        }
    }
}
