//! Certificates, built and read in one place: a CA, a serving certificate it signs, and what
//! the webhook needs to know of a certificate it is given. Used by the development
//! certificate of `serve` without `--tls-cert` ([`super::tls::self_signed`]), the self-managed
//! mode's CA and serving certificates ([`super::selftls`]) and every certificate loaded.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, pem::PemObject};

/// A serving certificate is backdated this much, for clocks a little behind ours.
const BACKDATE: i64 = 300;

/// Why a certificate cannot be built or read.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    /// rcgen refused the parameters or the key.
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A validity bound out of what a certificate can carry.
    #[error("the time {0} (Unix seconds) cannot be a certificate's validity bound")]
    Time(i64),
    /// DER that is not an X.509 certificate.
    #[error("not an X.509 certificate: {0}")]
    Parse(#[from] x509_parser::nom::Err<x509_parser::error::X509Error>),
}

/// What the webhook reads of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// Unix time from which it is valid.
    pub not_before: i64,
    /// Unix time after which it is not.
    pub not_after: i64,
    /// Whether its basic constraints make it a CA.
    pub is_ca: bool,
    /// Its SubjectPublicKeyInfo (DER), to match a private key against.
    pub public_key: Vec<u8>,
}

/// Reads a DER certificate.
pub fn read(der: &[u8]) -> Result<Info, CertsError> {
    let (_, c) = x509_parser::parse_x509_certificate(der)?;
    let is_ca = c
        .basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|b| b.value.ca);
    Ok(Info {
        not_before: c.validity().not_before.timestamp(),
        not_after: c.validity().not_after.timestamp(),
        is_ca,
        public_key: c.public_key().raw.to_vec(),
    })
}

/// The CERTIFICATE blocks of PEM, in order; other blocks and broken ones skipped.
pub fn from_pem(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}

/// Certificates as PEM CERTIFICATE blocks (the `pem` crate's encoding, LF line ends).
pub fn to_pem(ders: &[CertificateDer<'_>]) -> Vec<u8> {
    let blocks: Vec<pem::Pem> = ders
        .iter()
        .map(|d| pem::Pem::new("CERTIFICATE", d.as_ref()))
        .collect();
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::encode_many_config(&blocks, config).into_bytes()
}

fn at(unix: i64) -> Result<time::OffsetDateTime, CertsError> {
    time::OffsetDateTime::from_unix_timestamp(unix).map_err(|_| CertsError::Time(unix))
}

/// A CA: its certificate (PEM and DER), key and expiry.
pub struct Ca {
    /// The certificate, PEM.
    pub pem: String,
    /// The certificate, DER.
    pub der: CertificateDer<'static>,
    /// Its key.
    pub key: KeyPair,
    /// Unix time after which it is not valid.
    pub not_after: i64,
}

/// A new CA named `name`, valid from `now` (backdated) for `lifetime` seconds, that signs
/// only end-entity certificates (path length 0).
pub fn new_ca(name: &str, now: i64, lifetime: i64) -> Result<Ca, CertsError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = at(now - BACKDATE)?;
    params.not_after = at(now + lifetime)?;
    let cert = params.self_signed(&key)?;
    Ok(Ca {
        pem: cert.pem(),
        der: cert.der().clone(),
        key,
        not_after: now + lifetime,
    })
}

/// A serving certificate for `names` (DNS names or IP addresses; the first is its common
/// name) signed by `ca`, valid from `now` for `lifetime` seconds but never past the CA.
/// Returns the certificate and its key, as PEM.
pub fn new_serving(
    ca: &Ca,
    names: &[String],
    now: i64,
    lifetime: i64,
) -> Result<(String, String), CertsError> {
    let issuer = Issuer::from_ca_cert_der(&ca.der, &ca.key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        names
            .first()
            .map(String::as_str)
            .unwrap_or("ephemeral-volume-injector"),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    params.not_before = at(now - BACKDATE)?;
    params.not_after = at((now + lifetime).min(ca.not_after))?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Unix time now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serving_certificate_reads_back_as_built_and_never_outlives_its_ca() {
        let now = 1_800_000_000;
        let ca = new_ca("test CA", now, 1000).unwrap();
        let info = read(&ca.der).unwrap();
        assert!(info.is_ca);
        assert_eq!(
            (info.not_before, info.not_after),
            (now - BACKDATE, now + 1000)
        );
        assert_eq!(
            info.public_key,
            rcgen::PublicKeyData::subject_public_key_info(&ca.key)
        );
        let (crt, _) = new_serving(&ca, &["evi.evi.svc".into()], now, 5000).unwrap();
        let leaf = from_pem(crt.as_bytes()).remove(0);
        let info = read(&leaf).unwrap();
        assert!(!info.is_ca);
        assert_eq!(info.not_after, now + 1000, "bounded by the CA");
        assert!(read(b"not DER").is_err());
    }

    #[test]
    fn pem_written_reads_back_to_the_same_certificates_in_order() {
        let now = 1_800_000_000;
        let (a, b) = (new_ca("a", now, 10).unwrap(), new_ca("b", now, 10).unwrap());
        let pem = to_pem(&[a.der.clone(), b.der.clone()]);
        assert_eq!(from_pem(&pem), vec![a.der.clone(), b.der.clone()]);
        // One block as rcgen writes it, byte for byte.
        assert_eq!(
            String::from_utf8(to_pem(std::slice::from_ref(&a.der))).unwrap(),
            a.pem
        );
    }
}
