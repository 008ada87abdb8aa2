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
    Generate(#[from] rcgen::Error),
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
    let not_after = x509_parser::parse_x509_certificate(leaf)
        .map(|(_, c)| c.validity().not_after.timestamp())
        .map_err(|e| TlsError::Pem {
            what: "certificate",
            message: e.to_string(),
        })?;
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

/// A CA and a serving certificate for these names, generated in memory.
pub fn self_signed(names: &[&str]) -> Result<SelfSigned, TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(
        DnType::CommonName,
        "ephemeral-volume-injector development CA",
    );
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let leaf_key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    leaf.distinguished_name.push(
        DnType::CommonName,
        names.first().copied().unwrap_or("localhost"),
    );
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = leaf.signed_by(&leaf_key, &issuer)?;
    Ok(SelfSigned {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: leaf_key.serialize_pem(),
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
