//! What the webhook's own Secret should hold next: the decision of the self-managed TLS mode,
//! made from the stored Secret, the `caBundle`s the API server has, and the time. No I/O: every
//! replica runs it on what it reads and writes the result with the API's optimistic
//! concurrency, so that whichever write lands first is the one all of them follow.
//!
//! The Secret's keys:
//! - `ca.crt`, `ca.key`: the CA that signs the serving certificate;
//! - `tls.crt`, `tls.key`: the serving certificate, for the configured DNS names;
//! - `ca-bundle.crt`: the CAs the webhook configurations' `caBundle` must hold — the signing
//!   CA, the next one while a rotation is under way, and retired ones until `retire-after`;
//! - `next-ca.crt`, `next-ca.key`: the CA that will sign next, while a rotation is under way.
//!
//! A CA rotation goes: the next CA is added to the bundle (`next-ca-added`); once every
//! webhook configuration holds it, the time is recorded (`next-ca-trusted`); after
//! [`SETTLE`] more, the next CA signs a new serving certificate and becomes the CA
//! (`ca-switched`); the old one stays in the bundle for the overlap, then goes (`old-cas-removed`).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::{
    RootCertStore,
    client::{WebPkiServerVerifier, danger::ServerCertVerifier as _},
    crypto::ring::default_provider,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};

pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const BUNDLE: &str = "ca-bundle.crt";
pub const NEXT_CRT: &str = "next-ca.crt";
pub const NEXT_KEY: &str = "next-ca.key";
/// Unix time at which every webhook configuration was first seen holding the next CA.
pub const TRUSTED_SINCE: &str = "ephemeral-volumes.io/next-ca-trusted-since";
/// Unix time after which the bundle's CAs other than the signing (and next) one are dropped.
pub const RETIRE_AFTER: &str = "ephemeral-volumes.io/retire-after";

/// Between every webhook configuration holding the next CA and serving a certificate from it:
/// the API server's webhook clients follow a changed configuration within about a second.
pub const SETTLE: i64 = 10;
/// A serving certificate is backdated this much, for clocks a little behind ours.
const BACKDATE: i64 = 300;

/// Lifetimes and renewal thresholds, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub ca_lifetime: i64,
    pub ca_renew_before: i64,
    pub cert_lifetime: i64,
    pub cert_renew_before: i64,
    /// How long a CA that no longer signs stays in the bundle.
    pub overlap: i64,
}

impl Policy {
    /// Checks that the thresholds leave room for each step; returns the first problem.
    pub fn check(&self) -> Result<(), String> {
        let d = |s: i64| format!("{s}s");
        if self.cert_renew_before <= 0 || self.cert_renew_before >= self.cert_lifetime {
            return Err(format!(
                "the serving certificate's renewal threshold ({}) must be positive and shorter than its lifetime ({})",
                d(self.cert_renew_before),
                d(self.cert_lifetime)
            ));
        }
        if self.ca_renew_before >= self.ca_lifetime {
            return Err(format!(
                "the CA's renewal threshold ({}) must be shorter than its lifetime ({})",
                d(self.ca_renew_before),
                d(self.ca_lifetime)
            ));
        }
        // The CA rotation must start while a serving certificate from the old CA still has
        // its whole renewal window ahead: one renewal, then the switch.
        if self.ca_renew_before <= self.cert_renew_before + SETTLE {
            return Err(format!(
                "the CA's renewal threshold ({}) must be longer than the serving certificate's ({}) plus {SETTLE}s",
                d(self.ca_renew_before),
                d(self.cert_renew_before)
            ));
        }
        if self.overlap < 0 {
            return Err("the CA overlap must not be negative".into());
        }
        Ok(())
    }
}

/// The Secret as the plan reads and writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    pub data: BTreeMap<String, Vec<u8>>,
    pub annotations: BTreeMap<String, String>,
}

/// One change to the Secret, for the log and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No usable CA was stored: a new CA and serving certificate. `adopted` CAs found in the
    /// webhook configurations stay trusted for the overlap (another mode's, during an upgrade).
    Created { adopted: usize, why: &'static str },
    /// The CA is due for renewal: the next CA joins the bundle.
    NextCaAdded,
    /// Every webhook configuration holds the next CA.
    NextCaTrusted,
    /// One no longer does: the settle time starts again when it does.
    NextCaUntrusted,
    /// The next CA signs the serving certificate from now on.
    CaSwitched,
    /// The overlap has passed: CAs that no longer sign leave the bundle.
    OldCasRemoved { count: usize },
    /// A new serving certificate from the same CA.
    ServingRenewed { why: &'static str },
    /// The bundle lacked the signing or next CA, or held something unusable.
    BundleRepaired,
}

impl Step {
    /// A short name (metric label, log field).
    pub fn name(&self) -> &'static str {
        match self {
            Step::Created { .. } => "created",
            Step::NextCaAdded => "next-ca-added",
            Step::NextCaTrusted => "next-ca-trusted",
            Step::NextCaUntrusted => "next-ca-untrusted",
            Step::CaSwitched => "ca-switched",
            Step::OldCasRemoved { .. } => "old-cas-removed",
            Step::ServingRenewed { .. } => "serving-renewed",
            Step::BundleRepaired => "bundle-repaired",
        }
    }
}

/// Why a certificate cannot be made or used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{what}: {message}")]
    Unusable { what: &'static str, message: String },
}

fn unusable(what: &'static str, message: impl std::fmt::Display) -> CertError {
    CertError::Unusable {
        what,
        message: message.to_string(),
    }
}

/// A CA from the Secret: its certificate, key, and expiry.
struct Ca {
    pem: String,
    der: CertificateDer<'static>,
    key: KeyPair,
    not_after: i64,
}

fn parse_certs(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}

/// (notBefore, notAfter, is a CA) of a DER certificate.
fn validity(der: &[u8]) -> Option<(i64, i64, bool)> {
    let (_, c) = x509_parser::parse_x509_certificate(der).ok()?;
    let is_ca = c
        .basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|b| b.value.ca);
    Some((
        c.validity().not_before.timestamp(),
        c.validity().not_after.timestamp(),
        is_ca,
    ))
}

/// A CA pair that parses, is a CA, matches its key and is valid now.
fn read_ca(stored: &Stored, crt: &str, key: &str, now: i64) -> Result<Ca, CertError> {
    let what = if crt == CA_CRT { "CA" } else { "next CA" };
    let pem_bytes = stored
        .data
        .get(crt)
        .ok_or_else(|| unusable(what, "absent"))?;
    let pem = String::from_utf8(pem_bytes.clone()).map_err(|e| unusable(what, e))?;
    let der = parse_certs(pem_bytes)
        .into_iter()
        .next()
        .ok_or_else(|| unusable(what, "no CERTIFICATE block"))?;
    let (not_before, not_after, is_ca) =
        validity(&der).ok_or_else(|| unusable(what, "not an X.509 certificate"))?;
    if !is_ca {
        return Err(unusable(what, "not a CA certificate"));
    }
    if now < not_before || now >= not_after {
        return Err(unusable(what, "not valid now"));
    }
    let key_pem = stored
        .data
        .get(key)
        .and_then(|k| std::str::from_utf8(k).ok())
        .ok_or_else(|| unusable(what, "no private key"))?;
    let key = KeyPair::from_pem(key_pem).map_err(|e| unusable(what, e))?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&der).map_err(|e| unusable(what, e))?;
    if parsed.public_key().raw != rcgen::PublicKeyData::subject_public_key_info(&key).as_slice() {
        return Err(unusable(what, "the private key is not the certificate's"));
    }
    Ok(Ca {
        pem,
        der,
        key,
        not_after,
    })
}

/// What a replica serves: the stored serving certificate, if it parses, matches its key, is
/// valid now for the first name, and chains to a CA of the stored bundle.
pub struct Serving {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub not_after: i64,
}

/// Checks a serving certificate against `bundle` for `name` at `now` as a TLS client does.
fn verify(leaf: &CertificateDer<'_>, bundle: &[u8], name: &str, now: i64) -> Result<(), CertError> {
    let mut roots = RootCertStore::empty();
    for der in parse_certs(bundle) {
        // A CA the verifier cannot use is skipped; none usable fails below.
        let _ = roots.add(der);
    }
    if roots.is_empty() {
        return Err(unusable("CA bundle", "no usable CA certificate"));
    }
    let verifier =
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::new(default_provider()))
            .build()
            .map_err(|e| unusable("CA bundle", e))?;
    let server_name =
        ServerName::try_from(name.to_string()).map_err(|e| unusable("DNS name", e))?;
    let time = UnixTime::since_unix_epoch(Duration::from_secs(u64::try_from(now).unwrap_or(0)));
    verifier
        .verify_server_cert(leaf, &[], &server_name, &[], time)
        .map(|_| ())
        .map_err(|e| unusable("serving certificate", e))
}

/// The serving certificate to use from `stored`, checked (see [`Serving`]).
pub fn serving(stored: &Stored, names: &[String], now: i64) -> Result<Serving, CertError> {
    let bundle = stored.data.get(BUNDLE).map(Vec::as_slice).unwrap_or(&[]);
    serving_against(stored, bundle, names, now)
}

/// The stored serving certificate, checked against `bundle`.
fn serving_against(
    stored: &Stored,
    bundle: &[u8],
    names: &[String],
    now: i64,
) -> Result<Serving, CertError> {
    let what = "serving certificate";
    let cert_pem = stored
        .data
        .get(TLS_CRT)
        .ok_or_else(|| unusable(what, "absent"))?;
    let key_pem = stored
        .data
        .get(TLS_KEY)
        .ok_or_else(|| unusable(what, "no private key"))?;
    let loaded = crate::server::tls::load_pem(cert_pem, key_pem).map_err(|e| unusable(what, e))?;
    let leaf = loaded
        .key
        .cert
        .first()
        .ok_or_else(|| unusable(what, "empty"))?;
    for name in names {
        verify(leaf, bundle, name, now)?;
    }
    Ok(Serving {
        cert_pem: cert_pem.clone(),
        key_pem: key_pem.clone(),
        not_after: loaded.not_after,
    })
}

/// The stored bundle, if every certificate in it parses and it holds the signing CA: what the
/// webhook configurations' `caBundle` must be.
pub fn bundle(stored: &Stored) -> Option<Vec<u8>> {
    let pem = stored.data.get(BUNDLE)?;
    let ders = parse_certs(pem);
    let ca = parse_certs(stored.data.get(CA_CRT)?).into_iter().next()?;
    let all_parse = ders.iter().all(|d| validity(d).is_some());
    (all_parse && ders.contains(&ca)).then(|| pem.clone())
}

/// Unix time of `key` in the annotations.
fn time_annotation(stored: &Stored, key: &str) -> Option<i64> {
    stored.annotations.get(key)?.parse().ok()
}

fn at(unix: i64) -> Result<time::OffsetDateTime, CertError> {
    time::OffsetDateTime::from_unix_timestamp(unix).map_err(|e| unusable("time", e))
}

/// A new CA valid from `now` for `lifetime` seconds.
fn new_ca(now: i64, lifetime: i64, name: &str) -> Result<Ca, CertError> {
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

/// A serving certificate for `names` signed by `ca`, valid for `lifetime` but never past the CA.
fn new_serving(
    ca: &Ca,
    names: &[String],
    now: i64,
    lifetime: i64,
) -> Result<(String, String), CertError> {
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

fn pem_of(ders: &[CertificateDer<'_>]) -> Vec<u8> {
    use base64::Engine as _;
    let mut out = String::new();
    for der in ders {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(chunk));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out.into_bytes()
}

/// The CAs worth keeping from PEM bundles: parse, are CAs, valid now; each once, in order.
fn usable_cas<'a>(
    bundles: impl IntoIterator<Item = &'a [u8]>,
    now: i64,
) -> Vec<CertificateDer<'static>> {
    let mut out: Vec<CertificateDer<'static>> = Vec::new();
    for pem in bundles {
        for der in parse_certs(pem) {
            let ok = validity(&der).is_some_and(|(nb, na, ca)| ca && nb <= now && now < na);
            if ok && !out.contains(&der) {
                out.push(der);
            }
        }
    }
    out
}

/// The next state of the Secret, or `None` when it is as it should be.
///
/// `live` holds each webhook's `caBundle` as the API server has it (PEM; empty when unset).
/// `names` are the serving certificate's DNS names (or IP addresses), the first one checked.
pub fn plan(
    stored: Option<&Stored>,
    live: &[Vec<u8>],
    names: &[String],
    policy: &Policy,
    now: i64,
    ca_name: &str,
) -> Result<Option<(Step, Stored)>, CertError> {
    let empty = Stored::default();
    let old = stored.unwrap_or(&empty);
    let mut next = old.clone();

    let Ok(ca) = read_ca(old, CA_CRT, CA_KEY, now) else {
        // Nothing usable: start over, keeping trusted whatever the API server trusts now
        // (another mode's CA during an upgrade, or this mode's last good bundle).
        let why = if old.data.is_empty() {
            "no CA stored"
        } else {
            "the stored CA is unusable"
        };
        let ca = new_ca(now, policy.ca_lifetime, ca_name)?;
        let (crt, key) = new_serving(&ca, names, now, policy.cert_lifetime)?;
        let mut adopted = usable_cas(live.iter().map(Vec::as_slice), now);
        adopted.retain(|d| *d != ca.der);
        let mut all = vec![ca.der.clone()];
        all.extend(adopted.iter().cloned());
        next.data = BTreeMap::from([
            (CA_CRT.into(), ca.pem.clone().into_bytes()),
            (CA_KEY.into(), ca.key.serialize_pem().into_bytes()),
            (TLS_CRT.into(), crt.into_bytes()),
            (TLS_KEY.into(), key.into_bytes()),
            (BUNDLE.into(), pem_of(&all)),
        ]);
        next.annotations.remove(TRUSTED_SINCE);
        next.annotations.remove(RETIRE_AFTER);
        if !adopted.is_empty() {
            next.annotations
                .insert(RETIRE_AFTER.into(), (now + policy.overlap).to_string());
        }
        let step = Step::Created {
            adopted: adopted.len(),
            why,
        };
        return Ok(Some((step, next)));
    };
    let next_ca = read_ca(old, NEXT_CRT, NEXT_KEY, now).ok();

    // The bundle as it must be: the signing CA, the next one, and unretired old ones.
    let stored_bundle = usable_cas(old.data.get(BUNDLE).map(Vec::as_slice), now);
    let retire_after = time_annotation(old, RETIRE_AFTER);
    let retiring = retire_after.is_some_and(|t| now >= t);
    let mut want = vec![ca.der.clone()];
    if let Some(n) = &next_ca {
        want.push(n.der.clone());
    }
    let olds: Vec<_> = stored_bundle
        .iter()
        .filter(|d| !want.contains(d))
        .cloned()
        .collect();
    if retiring && !olds.is_empty() {
        next.data.insert(BUNDLE.into(), pem_of(&want));
        next.annotations.remove(RETIRE_AFTER);
        return Ok(Some((Step::OldCasRemoved { count: olds.len() }, next)));
    }
    want.extend(olds.iter().cloned());
    let bundle_ok = old.data.get(BUNDLE).is_some_and(|b| parse_certs(b) == want);
    // Every CA that no longer signs has a time to leave; none stays without one.
    if !bundle_ok || olds.is_empty() == retire_after.is_some() {
        next.data.insert(BUNDLE.into(), pem_of(&want));
        if olds.is_empty() {
            next.annotations.remove(RETIRE_AFTER);
        } else if retire_after.is_none() {
            next.annotations
                .insert(RETIRE_AFTER.into(), (now + policy.overlap).to_string());
        }
        return Ok(Some((Step::BundleRepaired, next)));
    }

    if let Some(n) = next_ca {
        let everywhere = !live.is_empty() && live.iter().all(|b| parse_certs(b).contains(&n.der));
        match time_annotation(old, TRUSTED_SINCE) {
            None if everywhere => {
                next.annotations
                    .insert(TRUSTED_SINCE.into(), now.to_string());
                return Ok(Some((Step::NextCaTrusted, next)));
            }
            Some(since) if everywhere && now >= since + SETTLE => {
                let (crt, key) = new_serving(&n, names, now, policy.cert_lifetime)?;
                let mut all = vec![n.der.clone(), ca.der.clone()];
                all.extend(olds);
                next.data.insert(CA_CRT.into(), n.pem.into_bytes());
                next.data
                    .insert(CA_KEY.into(), n.key.serialize_pem().into_bytes());
                next.data.remove(NEXT_CRT);
                next.data.remove(NEXT_KEY);
                next.data.insert(TLS_CRT.into(), crt.into_bytes());
                next.data.insert(TLS_KEY.into(), key.into_bytes());
                next.data.insert(BUNDLE.into(), pem_of(&all));
                next.annotations.remove(TRUSTED_SINCE);
                next.annotations
                    .insert(RETIRE_AFTER.into(), (now + policy.overlap).to_string());
                return Ok(Some((Step::CaSwitched, next)));
            }
            // A configuration lost the next CA after it was seen everywhere (a stale write, a
            // sync): the settle time starts again once it is back.
            Some(_) if !everywhere => {
                next.annotations.remove(TRUSTED_SINCE);
                return Ok(Some((Step::NextCaUntrusted, next)));
            }
            // Not yet everywhere (the configurations are being patched), or settling.
            _ => {}
        }
    } else if ca.not_after - now <= policy.ca_renew_before {
        let n = new_ca(now, policy.ca_lifetime, ca_name)?;
        let mut all = want.clone();
        all.insert(1, n.der.clone());
        next.data.insert(NEXT_CRT.into(), n.pem.into_bytes());
        next.data
            .insert(NEXT_KEY.into(), n.key.serialize_pem().into_bytes());
        next.data.insert(BUNDLE.into(), pem_of(&all));
        next.annotations.remove(TRUSTED_SINCE);
        return Ok(Some((Step::NextCaAdded, next)));
    }

    // The serving certificate, from the signing CA.
    let why = match serving_state(old, &ca, names, now) {
        Err(why) => Some(why),
        Ok(not_after) if not_after - now <= policy.cert_renew_before => {
            // Renew only if a new one would last longer (the CA bounds it): no write loop
            // near the CA's end while its rotation waits.
            let would_end = (now + policy.cert_lifetime).min(ca.not_after);
            (would_end > not_after).then_some("due for renewal")
        }
        Ok(_) => None,
    };
    if let Some(why) = why {
        let (crt, key) = new_serving(&ca, names, now, policy.cert_lifetime)?;
        next.data.insert(TLS_CRT.into(), crt.into_bytes());
        next.data.insert(TLS_KEY.into(), key.into_bytes());
        return Ok(Some((Step::ServingRenewed { why }, next)));
    }
    Ok(None)
}

/// The serving certificate's expiry if it is the signing CA's, for every name, and valid now.
fn serving_state(
    stored: &Stored,
    ca: &Ca,
    names: &[String],
    now: i64,
) -> Result<i64, &'static str> {
    serving_against(stored, ca.pem.as_bytes(), names, now)
        .map(|s| s.not_after)
        .map_err(|_| "absent, unusable, not from the CA or not for these names")
}

/// The expiry of the first certificate under `key`, if it parses.
fn not_after(stored: &Stored, key: &str) -> Option<i64> {
    let der = parse_certs(stored.data.get(key)?).into_iter().next()?;
    validity(&der).map(|(_, not_after, _)| not_after)
}

/// The signing CA's expiry, if it parses.
pub fn ca_not_after(stored: &Stored) -> Option<i64> {
    not_after(stored, CA_CRT)
}

/// The next time [`plan`] has something to do on its own (a renewal, the settle time, the
/// end of the overlap), if any is ahead of `now`; changes to the webhook configurations wake
/// the loop besides.
pub fn deadline(stored: &Stored, policy: &Policy, now: i64) -> Option<i64> {
    let mut times = vec![
        not_after(stored, TLS_CRT).map(|t| t - policy.cert_renew_before),
        time_annotation(stored, RETIRE_AFTER),
        time_annotation(stored, TRUSTED_SINCE).map(|t| t + SETTLE),
    ];
    if !stored.data.contains_key(NEXT_CRT) {
        times.push(not_after(stored, CA_CRT).map(|t| t - policy.ca_renew_before));
    }
    times.into_iter().flatten().filter(|t| *t > now).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000;
    const POLICY: Policy = Policy {
        ca_lifetime: 1000,
        ca_renew_before: 400,
        cert_lifetime: 300,
        cert_renew_before: 100,
        overlap: 50,
    };

    fn names() -> Vec<String> {
        vec!["evi.evi.svc".into(), "127.0.0.1".into(), "evi".into()]
    }

    fn step(stored: Option<&Stored>, live: &[&Vec<u8>], now: i64) -> Option<(Step, Stored)> {
        let live: Vec<Vec<u8>> = live.iter().map(|b| (*b).clone()).collect();
        plan(stored, &live, &names(), &POLICY, now, "test CA").unwrap()
    }

    /// The step only (a Stored holds keys: never printed).
    fn name(planned: &Option<(Step, Stored)>) -> Option<&'static str> {
        planned.as_ref().map(|(s, _)| s.name())
    }

    fn leaf(stored: &Stored) -> CertificateDer<'static> {
        parse_certs(&stored.data[TLS_CRT]).remove(0)
    }

    /// The leaf verifies against the bundle for every name at `now`: a client with that
    /// caBundle accepts it.
    fn accepts(bundle: &[u8], leaf: &CertificateDer<'_>, now: i64) -> bool {
        names().iter().all(|n| verify(leaf, bundle, n, now).is_ok())
    }

    #[test]
    fn an_empty_secret_gets_a_ca_and_a_certificate_that_its_bundle_verifies_and_then_stays() {
        let (s, stored) = step(None, &[], T0).unwrap();
        assert_eq!(
            s,
            Step::Created {
                adopted: 0,
                why: "no CA stored"
            }
        );
        let serving = serving(&stored, &names(), T0).unwrap();
        assert!(serving.not_after <= T0 + POLICY.cert_lifetime);
        let b = bundle(&stored).unwrap();
        assert_eq!(parse_certs(&b), parse_certs(&stored.data[CA_CRT]));
        assert!(accepts(&b, &leaf(&stored), T0));
        assert_eq!(
            name(&step(Some(&stored), &[&b], T0 + 1)),
            None,
            "nothing to do"
        );
        // An empty Secret rendered by the chart is the same as none.
        let (s, _) = step(Some(&Stored::default()), &[], T0).unwrap();
        assert!(matches!(s, Step::Created { .. }));
    }

    #[test]
    fn another_modes_ca_found_in_the_ca_bundle_stays_trusted_for_the_overlap() {
        let (_, other) = step(None, &[], T0).unwrap();
        let other_bundle = other.data[CA_CRT].clone();
        let (s, stored) = step(None, &[&other_bundle, &Vec::new()], T0).unwrap();
        assert_eq!(
            s,
            Step::Created {
                adopted: 1,
                why: "no CA stored"
            }
        );
        let b = bundle(&stored).unwrap();
        // Both the old pods' certificate and the new one are accepted meanwhile.
        assert!(accepts(&b, &leaf(&other), T0) && accepts(&b, &leaf(&stored), T0));
        assert_eq!(
            name(&step(Some(&stored), &[&b], T0 + POLICY.overlap - 1)),
            None
        );
        let (s, after) = step(Some(&stored), &[&b], T0 + POLICY.overlap).unwrap();
        assert_eq!(s, Step::OldCasRemoved { count: 1 });
        let b = bundle(&after).unwrap();
        assert!(!accepts(&b, &leaf(&other), T0 + POLICY.overlap));
        assert!(accepts(&b, &leaf(&after), T0 + POLICY.overlap));
        assert!(!after.annotations.contains_key(RETIRE_AFTER));
    }

    /// A whole CA rotation, the caBundle following each step as the loop sets it: at every
    /// moment the certificate of a replica that has read the Secret, and that of one that has
    /// not yet, are both accepted by the caBundle before and after the step.
    #[test]
    fn a_ca_rotation_never_serves_a_certificate_the_api_servers_bundle_rejects() {
        let (_, mut stored) = step(None, &[], T0).unwrap();
        let mut live = bundle(&stored).unwrap();
        let first_ca = stored.data[CA_CRT].clone();
        let mut steps = Vec::new();
        let mut now = T0;
        while now < T0 + 2 * POLICY.ca_lifetime {
            now += 5;
            let Some((s, next)) = step(Some(&stored), &[&live], now) else {
                continue;
            };
            let before = live.clone();
            let after = bundle(&next).unwrap();
            for l in [leaf(&stored), leaf(&next)] {
                for b in [&before, &after] {
                    assert!(
                        accepts(b, &l, now),
                        "{s:?} at +{}: a certificate the bundle rejects",
                        now - T0
                    );
                }
            }
            steps.push(s);
            stored = next;
            live = after;
        }
        let names: Vec<_> = steps.iter().map(Step::name).collect();
        // Serving certificates are renewed on their own schedule, during a rotation too.
        let rotation: Vec<_> = names.iter().filter(|n| **n != "serving-renewed").collect();
        assert_eq!(
            rotation[..4],
            [
                &"next-ca-added",
                &"next-ca-trusted",
                &"ca-switched",
                &"old-cas-removed"
            ],
            "{names:?}"
        );
        assert!(names.contains(&"serving-renewed"), "{names:?}");
        assert_ne!(stored.data[CA_CRT], first_ca, "the CA was replaced");
    }

    #[test]
    fn the_switch_waits_until_every_webhook_configuration_holds_the_next_ca_and_then_settles() {
        let (_, stored) = step(None, &[], T0).unwrap();
        let old = bundle(&stored).unwrap();
        let due = T0 + POLICY.ca_lifetime - POLICY.ca_renew_before;
        // A fresh serving certificate first, so that only the rotation is due below.
        let (s, stored) = step(Some(&stored), &[&old], due - 1).unwrap();
        assert_eq!(s.name(), "serving-renewed");
        let (s, added) = step(Some(&stored), &[&old], due).unwrap();
        assert_eq!(s, Step::NextCaAdded);
        let both = bundle(&added).unwrap();
        assert_eq!(parse_certs(&both).len(), 2);
        // One configuration still has the old bundle: wait.
        assert_eq!(name(&step(Some(&added), &[&both, &old], due + 30)), None);
        let (s, trusted) = step(Some(&added), &[&both, &both], due + 31).unwrap();
        assert_eq!(s, Step::NextCaTrusted);
        assert_eq!(
            name(&step(
                Some(&trusted),
                &[&both, &both],
                due + 31 + SETTLE - 1
            )),
            None
        );
        // Something put the old bundle back meanwhile: no switch, and the settle time starts
        // again once it is set again.
        let (s, untrusted) = step(Some(&trusted), &[&old, &both], due + 31 + SETTLE).unwrap();
        assert_eq!(s, Step::NextCaUntrusted);
        assert_eq!(
            name(&step(Some(&untrusted), &[&both, &both], due + 32 + SETTLE)),
            Some("next-ca-trusted")
        );
        let (s, switched) = step(Some(&trusted), &[&both, &both], due + 31 + SETTLE).unwrap();
        assert_eq!(s, Step::CaSwitched);
        assert_eq!(switched.data[CA_CRT], added.data[NEXT_CRT]);
        assert!(!switched.data.contains_key(NEXT_CRT));
        assert_eq!(
            deadline(&switched, &POLICY, due + 31 + SETTLE),
            Some(due + 31 + SETTLE + POLICY.overlap)
        );
    }

    #[test]
    fn the_serving_certificate_is_renewed_from_the_same_ca_before_it_expires() {
        let (_, stored) = step(None, &[], T0).unwrap();
        let b = bundle(&stored).unwrap();
        let due = serving(&stored, &names(), T0).unwrap().not_after - POLICY.cert_renew_before;
        assert_eq!(deadline(&stored, &POLICY, T0), Some(due));
        assert_eq!(name(&step(Some(&stored), &[&b], due - 1)), None);
        let (s, renewed) = step(Some(&stored), &[&b], due).unwrap();
        assert_eq!(
            s,
            Step::ServingRenewed {
                why: "due for renewal"
            }
        );
        assert_eq!(renewed.data[CA_CRT], stored.data[CA_CRT]);
        assert_ne!(renewed.data[TLS_CRT], stored.data[TLS_CRT]);
        assert!(accepts(&b, &leaf(&renewed), due));
    }

    #[test]
    fn a_serving_certificate_bounded_by_its_ca_is_renewed_once_not_in_a_loop() {
        // The CA rotation cannot proceed (no webhook configuration takes the next CA): the
        // serving certificate is renewed up to the CA's end once, then left alone.
        let (_, mut stored) = step(None, &[], T0).unwrap();
        let b = bundle(&stored).unwrap();
        let mut renewals = 0;
        for now in (T0..T0 + POLICY.ca_lifetime).step_by(5) {
            if let Some((s, next)) = step(Some(&stored), &[&b], now) {
                renewals += usize::from(s.name() == "serving-renewed");
                stored = next;
            }
        }
        let ca_end = ca_not_after(&stored).unwrap();
        assert_eq!(
            serving(&stored, &names(), ca_end - 1).unwrap().not_after,
            ca_end
        );
        assert!(renewals <= 4, "{renewals} renewals");
    }

    #[test]
    fn what_does_not_parse_is_never_served_and_is_replaced() {
        let (_, good) = step(None, &[], T0).unwrap();
        let b = bundle(&good).unwrap();

        let mut bad_leaf = good.clone();
        bad_leaf.data.insert(
            TLS_CRT.into(),
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec(),
        );
        assert!(serving(&bad_leaf, &names(), T0).is_err());
        let (s, fixed) = step(Some(&bad_leaf), &[&b], T0).unwrap();
        assert!(matches!(s, Step::ServingRenewed { .. }), "{s:?}");
        assert!(serving(&fixed, &names(), T0).is_ok());

        // Another pair's key: refused.
        let (_, other) = step(None, &[], T0).unwrap();
        let mut mismatched = good.clone();
        mismatched
            .data
            .insert(TLS_KEY.into(), other.data[TLS_KEY].clone());
        assert!(serving(&mismatched, &names(), T0).is_err());

        // A certificate for other names: not served, reissued.
        assert!(serving(&good, &["other.example".into()], T0).is_err());
        let (s, _) = plan(
            Some(&good),
            std::slice::from_ref(&b),
            &["other.example".into()],
            &POLICY,
            T0,
            "t",
        )
        .unwrap()
        .unwrap();
        assert!(matches!(s, Step::ServingRenewed { .. }));

        // A CA that does not parse: a new one, the live bundle's CA kept for the overlap.
        let mut bad_ca = good.clone();
        bad_ca.data.insert(CA_CRT.into(), b"garbage".to_vec());
        assert_eq!(
            bundle(&bad_ca),
            None,
            "a bundle without its CA is never written out"
        );
        let (s, new) = step(Some(&bad_ca), &[&b], T0).unwrap();
        assert_eq!(
            s,
            Step::Created {
                adopted: 1,
                why: "the stored CA is unusable"
            }
        );
        assert!(accepts(&bundle(&new).unwrap(), &leaf(&good), T0));

        // An expired CA is not used either.
        let (s, _) = step(Some(&good), &[], T0 + POLICY.ca_lifetime).unwrap();
        assert!(matches!(s, Step::Created { .. }), "{s:?}");
    }

    #[test]
    fn a_bundle_missing_its_ca_is_repaired_and_a_foreign_ca_in_it_leaves_after_the_overlap() {
        let (_, good) = step(None, &[], T0).unwrap();
        let (_, other) = step(None, &[], T0).unwrap();
        let mut wrong = good.clone();
        wrong.data.insert(BUNDLE.into(), other.data[CA_CRT].clone());
        let (s, fixed) = step(Some(&wrong), &[], T0).unwrap();
        assert_eq!(s, Step::BundleRepaired);
        let cas = parse_certs(&fixed.data[BUNDLE]);
        assert_eq!(
            cas,
            [
                parse_certs(&good.data[CA_CRT]),
                parse_certs(&other.data[CA_CRT])
            ]
            .concat()
        );
        assert_eq!(
            fixed.annotations[RETIRE_AFTER],
            (T0 + POLICY.overlap).to_string()
        );
        let (s, done) = step(Some(&fixed), &[], T0 + POLICY.overlap).unwrap();
        assert_eq!(s, Step::OldCasRemoved { count: 1 });
        assert_eq!(done.data[BUNDLE], good.data[BUNDLE]);
    }

    #[test]
    fn thresholds_that_leave_no_room_are_refused() {
        assert!(POLICY.check().is_ok());
        let bad = |p: Policy| p.check().unwrap_err();
        assert!(
            bad(Policy {
                cert_renew_before: 300,
                ..POLICY
            })
            .contains("serving certificate")
        );
        assert!(
            bad(Policy {
                ca_renew_before: 1000,
                ..POLICY
            })
            .contains("CA's renewal threshold")
        );
        assert!(
            bad(Policy {
                ca_renew_before: 105,
                ..POLICY
            })
            .contains("plus 10s")
        );
    }
}
