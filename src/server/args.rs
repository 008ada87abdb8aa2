//! The `serve` flags (each also an environment variable) and the durations made of them.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::{connection::Bounds, errors::ServeError};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (for log collectors).
    Json,
    /// Human-readable lines.
    Text,
}

/// `serve`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Webhook address (HTTPS): POST /mutate (pods) and POST /validate (workloads: Jobs,
    /// CronJobs, Deployments… whose pod template asks for volumes). Every interface by
    /// default, as in a pod, where the API server comes to the pod's own address; outside
    /// one, give 127.0.0.1:8443 (the README's command does).
    #[arg(long, env = "EVI_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Admin address (plain HTTP): /healthz, /readyz, /metrics. Every interface by default
    /// (the kubelet's probes and the scraper come to the pod's address).
    #[arg(long, env = "EVI_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    pub admin_listen: SocketAddr,
    /// Serving certificate (PEM, chain allowed); reloaded when it changes. Without it (and
    /// without --tls-secret), a self-signed certificate for localhost is generated in memory.
    #[arg(
        long,
        env = "EVI_TLS_CERT",
        requires = "tls_key",
        conflicts_with = "tls_secret"
    )]
    pub tls_cert: Option<PathBuf>,
    /// Private key of the serving certificate (PEM).
    #[arg(long, env = "EVI_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Self-managed TLS: the Secret (NAMESPACE/NAME) in which the webhook keeps its own CA and
    /// serving certificate, created when empty, read through the API (a watch) and renewed
    /// before expiry; the CA goes into the caBundle of the webhook configurations named below.
    #[arg(long, env = "EVI_TLS_SECRET", requires = "tls_names")]
    pub tls_secret: Option<String>,
    /// Self-managed TLS: a name (DNS name or IP address) of the serving certificate; the first
    /// is its common name. Repeat the flag, or separate with commas.
    #[arg(long = "tls-name", env = "EVI_TLS_NAMES", value_delimiter = ',')]
    pub tls_names: Vec<String>,
    /// Self-managed TLS: a MutatingWebhookConfiguration whose webhooks get the CA bundle (and
    /// get it back when something else changes it). Repeatable.
    #[arg(
        long,
        env = "EVI_MUTATING_WEBHOOK_CONFIGURATION",
        value_delimiter = ','
    )]
    pub mutating_webhook_configuration: Vec<String>,
    /// Self-managed TLS: a ValidatingWebhookConfiguration, as above. Repeatable.
    #[arg(
        long,
        env = "EVI_VALIDATING_WEBHOOK_CONFIGURATION",
        value_delimiter = ','
    )]
    pub validating_webhook_configuration: Vec<String>,
    /// Self-managed TLS: the CA's lifetime (Go-style duration: 8760h, 90m, 30s).
    #[arg(long, env = "EVI_CA_LIFETIME", default_value = "8760h", value_parser = lifetime)]
    pub ca_lifetime: Duration,
    /// Self-managed TLS: a new CA is made and trusted this long before the CA expires.
    #[arg(long, env = "EVI_CA_RENEW_BEFORE", default_value = "2160h", value_parser = duration)]
    pub ca_renew_before: Duration,
    /// Self-managed TLS: the serving certificate's lifetime.
    #[arg(long, env = "EVI_CERT_LIFETIME", default_value = "2160h", value_parser = lifetime)]
    pub cert_lifetime: Duration,
    /// Self-managed TLS: the serving certificate is renewed this long before it expires.
    #[arg(long, env = "EVI_CERT_RENEW_BEFORE", default_value = "720h", value_parser = duration)]
    pub cert_renew_before: Duration,
    /// Self-managed TLS: how long a CA that no longer signs (the old one after a rotation, or
    /// another mode's found in the caBundle at the start) stays trusted.
    #[arg(long, env = "EVI_CA_OVERLAP", default_value = "1h", value_parser = duration)]
    pub ca_overlap: Duration,
    /// Where the generated CA certificate is written when no certificate is given, once the
    /// port is bound [default: $TMPDIR/ephemeral-volume-injector-PORT-ca.crt].
    #[arg(long, env = "EVI_CA_OUT")]
    pub ca_out: Option<PathBuf>,
    /// Configuration file (YAML; see docs/configuration.md); reloaded when it changes. Built-in defaults without it.
    #[arg(long, env = "EVI_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "EVI_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. info or evi=debug: comma-separated levels
    /// (trace, debug, info, warn, error, off) or `target=level` directives.
    #[arg(long, env = "EVI_LOG_LEVEL", default_value = "info", value_parser = log_filter)]
    pub log_level: String,
    /// Largest request body accepted; an UPDATE review carries two pods.
    #[arg(long, env = "EVI_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Large request bodies held at once, in bytes (each over 256 KiB counted at its
    /// Content-Length, from before it is read until its answer is sent); more wait for room. Bounds memory under a flood of the largest reviews, which would
    /// otherwise get the webhook killed at its memory limit. At least --max-body-bytes.
    #[arg(long, env = "EVI_MAX_INFLIGHT_BODY_BYTES", default_value_t = 32 << 20)]
    pub max_inflight_body_bytes: usize,
    /// Seconds a client has to finish the TLS handshake, the HTTP/2 preface and each
    /// request's headers (from its first byte). The API server sends a request at once.
    #[arg(long, env = "EVI_HEADER_TIMEOUT_SECONDS", default_value = "5", value_parser = seconds)]
    pub header_timeout_seconds: Duration,
    /// Seconds a request body may take to arrive; then 408. The API server sends the whole
    /// review at once and gives up on a webhook after at most 30 s (10 s by default).
    #[arg(long, env = "EVI_BODY_TIMEOUT_SECONDS", default_value = "10", value_parser = seconds)]
    pub body_timeout_seconds: Duration,
    /// Seconds an HTTP/1.1 keep-alive connection may wait for its next request. Longer than
    /// the API server's own idle timeout (Go's 90 s), so that the client, not the webhook,
    /// closes idle connections and never sends a request on one being closed.
    #[arg(long, env = "EVI_IDLE_TIMEOUT_SECONDS", default_value = "120", value_parser = seconds)]
    pub idle_timeout_seconds: Duration,
    /// Seconds an HTTP/2 connection may stay open with no request in flight (pings do not
    /// count). The API server speaks HTTP/2 to a webhook that offers it (as this one does, by
    /// ALPN), all its calls over one connection; it reconnects cheaply.
    #[arg(long, env = "EVI_H2_IDLE_TIMEOUT_SECONDS", default_value = "60", value_parser = seconds)]
    pub h2_idle_timeout_seconds: Duration,
    /// Connections served at once; bounds memory under a flood of idle or slow clients (each
    /// connection in a TLS handshake holds ~25 KiB). When it is reached, a newcomer takes the
    /// place of a connection that is not in a request (in its handshake, before its first
    /// request, or idle) from the address holding the most; clients never make the webhook
    /// report itself not ready.
    #[arg(long, env = "EVI_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Connections one client address may hold on the webhook port; its next one replaces its
    /// own oldest connection that is not in a request, or is closed at once. The API server
    /// needs one or a few (HTTP/2); a pod flooding the port holds at most this many.
    #[arg(long, env = "EVI_MAX_CONNECTIONS_PER_PEER", default_value_t = 64)]
    pub max_connections_per_peer: usize,
    /// Connections served at once on the admin port (probes and scrapes need a few); it
    /// cannot take descriptors or memory from the webhook port beyond this.
    #[arg(long, env = "EVI_ADMIN_MAX_CONNECTIONS", default_value_t = 64)]
    pub admin_max_connections: usize,
    /// Connections one client address may hold on the admin port (the kubelet's probes and a
    /// scraper need one or two each).
    #[arg(long, env = "EVI_ADMIN_MAX_CONNECTIONS_PER_PEER", default_value_t = 8)]
    pub admin_max_connections_per_peer: usize,
    /// Seconds an admin client has for its request headers (probes send them at once).
    #[arg(long, env = "EVI_ADMIN_HEADER_TIMEOUT_SECONDS", default_value = "5", value_parser = seconds)]
    pub admin_header_timeout_seconds: Duration,
    /// Seconds an admin keep-alive connection may wait for its next request (the kubelet's
    /// probes and Prometheus come every 10 s or more and reconnect cheaply).
    #[arg(long, env = "EVI_ADMIN_IDLE_TIMEOUT_SECONDS", default_value = "30", value_parser = seconds)]
    pub admin_idle_timeout_seconds: Duration,
    /// Kubeconfig for the cluster checks (CSIDriver and StorageClass watches). Without it the
    /// in-cluster service account is used; outside a cluster the checks are off.
    #[arg(long, env = "EVI_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Seconds readiness waits for the first complete CSIDriver and StorageClass lists; past
    /// it the webhook is ready with the cluster checks in warn until they arrive.
    #[arg(long, env = "EVI_CLUSTER_SYNC_TIMEOUT_SECONDS", default_value = "30", value_parser = seconds)]
    pub cluster_sync_timeout_seconds: Duration,
    /// After SIGTERM, how long to keep accepting while unready, so endpoints can stop sending
    /// (every --*-seconds flag takes a number of seconds or a duration like 5s or 1m30s).
    #[arg(long, env = "EVI_DRAIN_DELAY_SECONDS", default_value = "0", value_parser = seconds)]
    pub drain_delay_seconds: Duration,
    /// After the drain delay, seconds in-flight requests get to finish before exit.
    #[arg(long, env = "EVI_GRACE_PERIOD_SECONDS", default_value = "20", value_parser = seconds)]
    pub grace_period_seconds: Duration,
    /// Seconds between checks of the certificate and configuration files, besides file events.
    #[arg(long, env = "EVI_RELOAD_POLL_SECONDS", default_value = "10", value_parser = seconds)]
    pub reload_poll_seconds: Duration,
}

/// The flags' durations, checked.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    pub webhook: Bounds,
    pub admin: Bounds,
    pub body: Duration,
    pub drain_delay: Duration,
    pub grace: Duration,
    pub poll: Duration,
    pub cluster_sync: Duration,
}

impl ServeArgs {
    /// Every duration flag, or an error naming the first bad one.
    pub(super) fn timing(&self) -> Result<Timing, ServeError> {
        let admin_idle = self.admin_idle_timeout_seconds;
        if self.max_inflight_body_bytes < self.max_body_bytes {
            return Err(ServeError::Flag(format!(
                "--max-inflight-body-bytes ({}) must be at least --max-body-bytes ({}): a body of the largest size could never be read",
                self.max_inflight_body_bytes, self.max_body_bytes
            )));
        }
        Ok(Timing {
            webhook: Bounds {
                header: self.header_timeout_seconds,
                h1_idle: self.idle_timeout_seconds,
                h2_idle: self.h2_idle_timeout_seconds,
                body: self.body_timeout_seconds,
            },
            admin: Bounds {
                header: self.admin_header_timeout_seconds,
                h1_idle: admin_idle,
                h2_idle: admin_idle,
                body: self.body_timeout_seconds,
            },
            body: self.body_timeout_seconds,
            drain_delay: self.drain_delay_seconds,
            grace: self.grace_period_seconds,
            poll: self.reload_poll_seconds.max(Duration::from_millis(100)),
            cluster_sync: self.cluster_sync_timeout_seconds,
        })
    }
}

/// A Go-style duration (`8760h`, `1h30m`, `45s`), as cert-manager's and the chart's values.
fn duration(s: &str) -> Result<Duration, String> {
    let d: k8s_openapi::jiff::SignedDuration = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a duration like 8760h, 90m or 30s: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?}: a duration must not be negative"))
}

/// A certificate's lifetime: a duration that, from now, ends before the year 10000 (the last
/// date an X.509 certificate can carry).
fn lifetime(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    let end = time::Duration::try_from(d)
        .ok()
        .and_then(|d| time::OffsetDateTime::now_utc().checked_add(d));
    match end {
        Some(end) if end.year() <= 9999 => Ok(d),
        _ => Err(format!(
            "{s:?}: a certificate issued now would expire after the year 9999, the last an X.509 certificate can carry; give a shorter lifetime"
        )),
    }
}

/// A `--*-seconds` flag: a number of seconds (`5`, `0.5`) or, like every other duration flag,
/// a Go-style duration (`5s`, `1m30s`, `250ms`).
fn seconds(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(v) => Duration::try_from_secs_f64(v).map_err(|_| {
            format!("{s:?} must be a non-negative number of seconds or a duration like 5s")
        }),
        Err(_) => duration(s),
    }
}

const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// A log filter that logs something: EnvFilter takes a bare word as a target name, so
/// `verbose` would silence every line, the fatal one included; refused here instead.
pub fn log_filter(s: &str) -> Result<String, String> {
    let explain = "give a level (trace, debug, info, warn, error, off) or target=level directives, comma-separated, e.g. info,evi=debug";
    for directive in s.split(',').map(str::trim) {
        let level = match directive.rsplit_once('=') {
            Some((target, level)) if !target.is_empty() => level,
            _ => directive,
        };
        if !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{directive:?} is not a log level or a target=level directive; {explain}"
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_owned())
        .map_err(|e| format!("{e}; {explain}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_flags_take_a_number_of_seconds_or_a_duration_as_the_other_duration_flags_do() {
        let ok = |s: &str| seconds(s).unwrap();
        assert_eq!(ok("5"), Duration::from_secs(5));
        assert_eq!(ok("0.5"), Duration::from_millis(500));
        assert_eq!(ok("5s"), Duration::from_secs(5));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok(" 2h "), Duration::from_secs(7200));
        assert!(seconds("-1").unwrap_err().contains("non-negative"));
        assert!(seconds("-5s").unwrap_err().contains("must not be negative"));
        assert!(seconds("inf").is_err());
        assert!(
            seconds("soon")
                .unwrap_err()
                .contains("is not a duration like")
        );
        assert_eq!(duration("8760h").unwrap(), Duration::from_secs(8760 * 3600));
    }

    #[test]
    fn log_filters_that_log_something_are_taken_as_written() {
        for ok in [
            "info",
            "debug",
            "evi=debug",
            "warn,evi::server=trace",
            "INFO",
            "off",
        ] {
            assert_eq!(log_filter(ok).as_deref(), Ok(ok), "{ok}");
        }
        for bad in ["verbose", "", "info,", "evi=loud", "=info"] {
            assert!(log_filter(bad).is_err(), "{bad:?}");
        }
    }
}
