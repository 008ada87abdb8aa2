//! Serving certificates: loaded from PEM files or generated in memory, served through a
//! resolver whose key is swapped atomically on reload. A handshake takes the key current at
//! that moment; connections already up keep theirs.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::{
    ServerConfig,
    crypto::ring::{default_provider, sign::any_supported_type},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use super::certs;

/// A certificate or key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file that cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The operating system's error (no such file, permission denied).
        source: std::io::Error,
    },
    /// PEM that holds no usable certificate or key.
    #[error("{what}: {message}")]
    Pem {
        /// Which of the two.
        what: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The key is not the certificate's.
    #[error("the private key does not match the certificate")]
    Mismatch,
    /// The self-signed certificate.
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(#[from] certs::CertsError),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A certificate chain and key, checked to belong together.
pub struct Loaded {
    /// The certificate chain and signing key, for rustls.
    pub key: Arc<CertifiedKey>,
    /// Unix time after which the leaf certificate is no longer valid.
    pub not_after: i64,
}

/// A certificate chain and its key from PEM, checked to belong together.
pub fn load_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Loaded, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificate",
            message: e.to_string(),
        })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::Pem {
            what: "certificate",
            message: "no CERTIFICATE block found".into(),
        });
    };
    let not_after = certs::read(leaf)
        .map_err(|e| TlsError::Pem {
            what: "certificate",
            message: e.to_string(),
        })?
        .not_after;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        what: "private key",
        message: e.to_string(),
    })?;
    let signing = any_supported_type(&key)?;
    let certified = CertifiedKey::new(chain, signing);
    // During a plain (non-atomic) rewrite the two files can disagree for a moment.
    certified.keys_match().map_err(|_| TlsError::Mismatch)?;
    Ok(Loaded {
        key: Arc::new(certified),
        not_after,
    })
}

/// A development CA and a serving certificate for localhost, made in memory.
pub struct SelfSigned {
    /// The CA certificate (give it to clients).
    pub ca_pem: String,
    /// The serving certificate, signed by the CA.
    pub cert_pem: String,
    /// The serving key.
    pub key_pem: String,
}

/// A CA and a serving certificate for these names, generated in memory, valid for a year.
/// The CA's name carries the process's id and the time: a client given another server's CA
/// then names the CA it expected instead of failing on two CAs that look alike.
pub fn self_signed(names: &[&str]) -> Result<SelfSigned, TlsError> {
    const YEAR: i64 = 365 * 24 * 3600;
    let now = certs::unix_now();
    let name = format!(
        "ephemeral-volume-injector development CA (pid {}, {now})",
        std::process::id()
    );
    let ca = certs::new_ca(&name, now, YEAR)?;
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let (cert_pem, key_pem) = certs::new_serving(&ca, &names, now, YEAR)?;
    Ok(SelfSigned {
        ca_pem: ca.pem,
        cert_pem,
        key_pem,
    })
}

/// Hands every handshake the current key.
#[derive(Debug)]
pub struct CertStore {
    current: ArcSwap<CertifiedKey>,
}

impl CertStore {
    /// A store serving this certificate.
    pub fn new(key: Arc<CertifiedKey>) -> Self {
        CertStore {
            current: ArcSwap::new(key),
        }
    }

    /// Serves another certificate from the next handshake on.
    pub fn swap(&self, key: Arc<CertifiedKey>) {
        self.current.store(key);
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// TLS 1.2 and 1.3 with the ring provider (the only one linked), ALPN h2 and http/1.1.
pub fn server_config(store: Arc<CertStore>) -> Result<ServerConfig, TlsError> {
    let mut cfg = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(store);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}
