//! Why `serve` could not start.

use std::net::SocketAddr;

use super::{client, tls};

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration file.
    #[error("configuration {path}: {source}")]
    Config {
        /// The file.
        path: String,
        /// What is wrong with it.
        source: crate::config::ConfigError,
    },
    /// The serving certificate.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// An address to listen on.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The operating system's error (address in use, permission denied).
        source: std::io::Error,
    },
    /// The CA file of the self-signed certificate.
    #[error("cannot write the CA certificate to {path}: {source}")]
    WriteCa {
        /// The file.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The async runtime.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    /// A flag.
    #[error("bad flag: {0}")]
    Flag(String),
    /// The cluster checks are on, and no API client can be built for them.
    #[error(
        "the cluster checks are on (clusterChecks: enforce or warn) but no API client can be built for them: {0}; fix the kubeconfig or the service account (docs/operations.md lists the client certificate forms that work), or set clusterChecks: off"
    )]
    ClusterClient(client::ClusterAccessError),
}
