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

use rcgen::KeyPair;
use rustls::{
    RootCertStore,
    client::{WebPkiServerVerifier, danger::ServerCertVerifier as _},
    crypto::ring::default_provider,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::server::certs::{self, Ca, from_pem as parse_certs, to_pem};

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

use super::policy::{Policy, SETTLE};

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
    #[error(transparent)]
    Build(#[from] certs::CertsError),
    /// A stored certificate, key or bundle that cannot be used, and why.
    #[error("{what}: {problem}")]
    Unusable {
        /// Which: `CA`, `next CA`, `serving certificate`, `CA bundle`, `DNS name`.
        what: &'static str,
        /// Why.
        #[source]
        problem: Problem,
    },
}

/// Why a stored certificate, key or bundle cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("absent")]
    Absent,
    #[error("not UTF-8: {0}")]
    NotUtf8(#[from] std::string::FromUtf8Error),
    #[error("no CERTIFICATE block")]
    NoCertificate,
    #[error(transparent)]
    NotX509(#[from] certs::CertsError),
    #[error("not a CA certificate")]
    NotCa,
    #[error("not valid now")]
    NotValidNow,
    #[error("no private key")]
    NoKey,
    #[error("the private key cannot be read: {0}")]
    Key(#[from] rcgen::Error),
    #[error("the private key is not the certificate's")]
    KeyMismatch,
    #[error(transparent)]
    Load(#[from] crate::server::tls::TlsError),
    #[error("no usable CA certificate")]
    NoUsableCa,
    #[error(transparent)]
    Verifier(#[from] rustls::client::VerifierBuilderError),
    #[error(transparent)]
    Name(#[from] rustls_pki_types::InvalidDnsNameError),
    #[error(transparent)]
    Rejected(#[from] rustls::Error),
}

fn unusable(what: &'static str, problem: impl Into<Problem>) -> CertError {
    CertError::Unusable {
        what,
        problem: problem.into(),
    }
}

/// A CA pair that parses, is a CA, matches its key and is valid now.
fn read_ca(stored: &Stored, crt: &str, key: &str, now: i64) -> Result<Ca, CertError> {
    let what = if crt == CA_CRT { "CA" } else { "next CA" };
    let pem_bytes = stored
        .data
        .get(crt)
        .ok_or_else(|| unusable(what, Problem::Absent))?;
    let pem = String::from_utf8(pem_bytes.clone()).map_err(|e| unusable(what, e))?;
    let der = parse_certs(pem_bytes)
        .into_iter()
        .next()
        .ok_or_else(|| unusable(what, Problem::NoCertificate))?;
    let info = certs::read(&der).map_err(|e| unusable(what, e))?;
    if !info.is_ca {
        return Err(unusable(what, Problem::NotCa));
    }
    if now < info.not_before || now >= info.not_after {
        return Err(unusable(what, Problem::NotValidNow));
    }
    let key_pem = stored
        .data
        .get(key)
        .and_then(|k| std::str::from_utf8(k).ok())
        .ok_or_else(|| unusable(what, Problem::NoKey))?;
    let key = KeyPair::from_pem(key_pem).map_err(|e| unusable(what, e))?;
    if info.public_key != rcgen::PublicKeyData::subject_public_key_info(&key) {
        return Err(unusable(what, Problem::KeyMismatch));
    }
    Ok(Ca {
        pem,
        der,
        key,
        not_after: info.not_after,
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
        return Err(unusable("CA bundle", Problem::NoUsableCa));
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
        .ok_or_else(|| unusable(what, Problem::Absent))?;
    let key_pem = stored
        .data
        .get(TLS_KEY)
        .ok_or_else(|| unusable(what, Problem::NoKey))?;
    let loaded = crate::server::tls::load_pem(cert_pem, key_pem).map_err(|e| unusable(what, e))?;
    let leaf = loaded
        .key
        .cert
        .first()
        .ok_or_else(|| unusable(what, Problem::NoCertificate))?;
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
    let all_parse = ders.iter().all(|d| certs::read(d).is_ok());
    (all_parse && ders.contains(&ca)).then(|| pem.clone())
}

/// Unix time of `key` in the annotations.
fn time_annotation(stored: &Stored, key: &str) -> Option<i64> {
    stored.annotations.get(key)?.parse().ok()
}

/// The CAs worth keeping from PEM bundles: parse, are CAs, valid now; each once, in order.
fn usable_cas<'a>(
    bundles: impl IntoIterator<Item = &'a [u8]>,
    now: i64,
) -> Vec<CertificateDer<'static>> {
    let mut out: Vec<CertificateDer<'static>> = Vec::new();
    for pem in bundles {
        for der in parse_certs(pem) {
            let ok = certs::read(&der)
                .is_ok_and(|i| i.is_ca && i.not_before <= now && now < i.not_after);
            if ok && !out.contains(&der) {
                out.push(der);
            }
        }
    }
    out
}

/// Where a CA rotation stands, read from the Secret.
enum Rotation {
    /// No next CA: the signing CA signs until it is due for renewal.
    Steady,
    /// The next CA is in the bundle, not yet seen in every webhook configuration.
    NextDistributed(Ca),
    /// Every webhook configuration was seen holding the next CA at `since`.
    NextTrusted { next: Ca, since: i64 },
}

/// Whether the stored bundle is what the Secret's CAs call for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BundleState {
    /// As it must be.
    Exact,
    /// Old CAs whose time to leave has come.
    Retiring { count: usize },
    /// Lacking the signing or next CA, holding something unusable, or an old CA without a
    /// time to leave (or such a time without an old CA).
    Off,
}

/// The Secret, parsed once.
enum Phase {
    /// No usable CA: start over.
    Empty { why: &'static str },
    /// A signing CA.
    Held(Box<Held>),
}

/// A Secret with a usable signing CA.
struct Held {
    ca: Ca,
    rotation: Rotation,
    bundle: BundleState,
    /// The CAs in the stored bundle other than the signing and next ones, in order.
    olds: Vec<CertificateDer<'static>>,
}

impl Held {
    /// The bundle's CAs that sign or will: the signing CA, then the next one.
    fn signing(&self) -> Vec<CertificateDer<'static>> {
        let mut cas = vec![self.ca.der.clone()];
        if let Rotation::NextDistributed(next) | Rotation::NextTrusted { next, .. } = &self.rotation
        {
            cas.push(next.der.clone());
        }
        cas
    }
}

impl Phase {
    fn read(stored: &Stored, now: i64) -> Phase {
        let Ok(ca) = read_ca(stored, CA_CRT, CA_KEY, now) else {
            let why = if stored.data.is_empty() {
                "no CA stored"
            } else {
                "the stored CA is unusable"
            };
            return Phase::Empty { why };
        };
        let rotation = match read_ca(stored, NEXT_CRT, NEXT_KEY, now) {
            Err(_) => Rotation::Steady,
            Ok(next) => match time_annotation(stored, TRUSTED_SINCE) {
                None => Rotation::NextDistributed(next),
                Some(since) => Rotation::NextTrusted { next, since },
            },
        };
        let mut held = Held {
            ca,
            rotation,
            bundle: BundleState::Exact,
            olds: Vec::new(),
        };
        let signing = held.signing();
        held.olds = usable_cas(stored.data.get(BUNDLE).map(Vec::as_slice), now)
            .into_iter()
            .filter(|d| !signing.contains(d))
            .collect();
        let retire_after = time_annotation(stored, RETIRE_AFTER);
        let all = [signing, held.olds.clone()].concat();
        held.bundle = if retire_after.is_some_and(|t| now >= t) && !held.olds.is_empty() {
            BundleState::Retiring {
                count: held.olds.len(),
            }
        } else if !stored
            .data
            .get(BUNDLE)
            .is_some_and(|b| parse_certs(b) == all)
            || held.olds.is_empty() == retire_after.is_some()
        {
            BundleState::Off
        } else {
            BundleState::Exact
        };
        Phase::Held(Box::new(held))
    }
}

/// The next state of the Secret, or `None` when it is as it should be: the Secret's phase,
/// then one short step for it.
///
/// `live` holds each webhook's `caBundle` as the API server has it (PEM; empty when unset).
/// `names` are the serving certificate's DNS names (or IP addresses), the first one checked.
pub fn next_step(
    stored: Option<&Stored>,
    live: &[Vec<u8>],
    names: &[String],
    policy: &Policy,
    now: i64,
    ca_name: &str,
) -> Result<Option<(Step, Stored)>, CertError> {
    let empty = Stored::default();
    let old = stored.unwrap_or(&empty);
    let step = Steps {
        old,
        names,
        policy,
        now,
        ca_name,
    };
    let held = match Phase::read(old, now) {
        Phase::Empty { why } => return step.create(live, why).map(Some),
        Phase::Held(held) => held,
    };
    // Every webhook configuration holds this CA.
    let everywhere =
        |ca: &Ca| !live.is_empty() && live.iter().all(|b| parse_certs(b).contains(&ca.der));
    Ok(match (&held.bundle, &held.rotation) {
        (BundleState::Retiring { count }, _) => Some(step.retire(&held, *count)),
        (BundleState::Off, _) => Some(step.repair_bundle(&held)),
        (BundleState::Exact, Rotation::Steady)
            if held.ca.not_after - now <= policy.ca_renew_before =>
        {
            Some(step.add_next(&held)?)
        }
        (BundleState::Exact, Rotation::NextDistributed(next)) if everywhere(next) => {
            Some(step.trust_next())
        }
        // A configuration lost the next CA after it was seen everywhere (a stale write, a
        // sync): the settle time starts again once it is back.
        (BundleState::Exact, Rotation::NextTrusted { next, .. }) if !everywhere(next) => {
            Some(step.untrust_next())
        }
        (BundleState::Exact, Rotation::NextTrusted { next, since }) if now >= since + SETTLE => {
            Some(step.switch(&held, next)?)
        }
        // Steady and not due, the next CA not yet everywhere or settling: only the serving
        // certificate may need a step.
        (BundleState::Exact, _) => step.renew_serving(&held)?,
    })
}

/// The steps [`plan`] takes, each from the stored Secret to the next.
struct Steps<'a> {
    old: &'a Stored,
    names: &'a [String],
    policy: &'a Policy,
    now: i64,
    ca_name: &'a str,
}

impl Steps<'_> {
    /// Nothing usable: start over, keeping trusted whatever the API server trusts now
    /// (another mode's CA during an upgrade, or this mode's last good bundle).
    fn create(&self, live: &[Vec<u8>], why: &'static str) -> Result<(Step, Stored), CertError> {
        let ca = certs::new_ca(self.ca_name, self.now, self.policy.ca_lifetime)?;
        let (crt, key) = certs::new_serving(&ca, self.names, self.now, self.policy.cert_lifetime)?;
        let mut adopted = usable_cas(live.iter().map(Vec::as_slice), self.now);
        adopted.retain(|d| *d != ca.der);
        let mut next = self.old.clone();
        next.data = BTreeMap::from([
            (CA_CRT.into(), ca.pem.clone().into_bytes()),
            (CA_KEY.into(), ca.key.serialize_pem().into_bytes()),
            (TLS_CRT.into(), crt.into_bytes()),
            (TLS_KEY.into(), key.into_bytes()),
            (
                BUNDLE.into(),
                to_pem(&[vec![ca.der.clone()], adopted.clone()].concat()),
            ),
        ]);
        next.annotations.remove(TRUSTED_SINCE);
        next.annotations.remove(RETIRE_AFTER);
        if !adopted.is_empty() {
            next.annotations.insert(
                RETIRE_AFTER.into(),
                (self.now + self.policy.overlap).to_string(),
            );
        }
        let step = Step::Created {
            adopted: adopted.len(),
            why,
        };
        Ok((step, next))
    }

    /// The overlap has passed: the old CAs leave the bundle.
    fn retire(&self, held: &Held, count: usize) -> (Step, Stored) {
        let mut next = self.old.clone();
        next.data.insert(BUNDLE.into(), to_pem(&held.signing()));
        next.annotations.remove(RETIRE_AFTER);
        (Step::OldCasRemoved { count }, next)
    }

    /// The bundle as the CAs call for; every CA that no longer signs has a time to leave,
    /// and none stays without one.
    fn repair_bundle(&self, held: &Held) -> (Step, Stored) {
        let mut next = self.old.clone();
        next.data.insert(
            BUNDLE.into(),
            to_pem(&[held.signing(), held.olds.clone()].concat()),
        );
        if held.olds.is_empty() {
            next.annotations.remove(RETIRE_AFTER);
        } else if !next.annotations.contains_key(RETIRE_AFTER) {
            next.annotations.insert(
                RETIRE_AFTER.into(),
                (self.now + self.policy.overlap).to_string(),
            );
        }
        (Step::BundleRepaired, next)
    }

    /// The CA is due: a next CA joins the bundle, right after the signing one.
    fn add_next(&self, held: &Held) -> Result<(Step, Stored), CertError> {
        let n = certs::new_ca(self.ca_name, self.now, self.policy.ca_lifetime)?;
        let mut next = self.old.clone();
        let all = [vec![held.ca.der.clone(), n.der.clone()], held.olds.clone()].concat();
        next.data.insert(NEXT_CRT.into(), n.pem.into_bytes());
        next.data
            .insert(NEXT_KEY.into(), n.key.serialize_pem().into_bytes());
        next.data.insert(BUNDLE.into(), to_pem(&all));
        next.annotations.remove(TRUSTED_SINCE);
        Ok((Step::NextCaAdded, next))
    }

    /// Every webhook configuration holds the next CA: the settle time starts.
    fn trust_next(&self) -> (Step, Stored) {
        let mut next = self.old.clone();
        next.annotations
            .insert(TRUSTED_SINCE.into(), self.now.to_string());
        (Step::NextCaTrusted, next)
    }

    fn untrust_next(&self) -> (Step, Stored) {
        let mut next = self.old.clone();
        next.annotations.remove(TRUSTED_SINCE);
        (Step::NextCaUntrusted, next)
    }

    /// Settled: the next CA signs a new serving certificate and becomes the CA; the old one
    /// stays in the bundle for the overlap.
    fn switch(&self, held: &Held, n: &Ca) -> Result<(Step, Stored), CertError> {
        let (crt, key) = certs::new_serving(n, self.names, self.now, self.policy.cert_lifetime)?;
        let mut next = self.old.clone();
        let all = [vec![n.der.clone(), held.ca.der.clone()], held.olds.clone()].concat();
        next.data.insert(CA_CRT.into(), n.pem.clone().into_bytes());
        next.data
            .insert(CA_KEY.into(), n.key.serialize_pem().into_bytes());
        next.data.remove(NEXT_CRT);
        next.data.remove(NEXT_KEY);
        next.data.insert(TLS_CRT.into(), crt.into_bytes());
        next.data.insert(TLS_KEY.into(), key.into_bytes());
        next.data.insert(BUNDLE.into(), to_pem(&all));
        next.annotations.remove(TRUSTED_SINCE);
        next.annotations.insert(
            RETIRE_AFTER.into(),
            (self.now + self.policy.overlap).to_string(),
        );
        Ok((Step::CaSwitched, next))
    }

    /// A new serving certificate from the signing CA when the stored one is unusable or due.
    fn renew_serving(&self, held: &Held) -> Result<Option<(Step, Stored)>, CertError> {
        let now = self.now;
        let why = match serving_state(self.old, &held.ca, self.names, now) {
            Err(why) => why,
            // Renew only if a new one would last longer (the CA bounds it): no write loop
            // near the CA's end while its rotation waits.
            Ok(not_after)
                if not_after - now <= self.policy.cert_renew_before
                    && (now + self.policy.cert_lifetime).min(held.ca.not_after) > not_after =>
            {
                "due for renewal"
            }
            Ok(_) => return Ok(None),
        };
        let (crt, key) = certs::new_serving(&held.ca, self.names, now, self.policy.cert_lifetime)?;
        let mut next = self.old.clone();
        next.data.insert(TLS_CRT.into(), crt.into_bytes());
        next.data.insert(TLS_KEY.into(), key.into_bytes());
        Ok(Some((Step::ServingRenewed { why }, next)))
    }
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
    certs::read(&der).ok().map(|i| i.not_after)
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
    use crate::server::selftls::policy::{PolicyError, go_duration};

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
        next_step(stored, &live, &names(), &POLICY, now, "test CA").unwrap()
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

    /// The phase each step of a rotation leaves the Secret in, as `plan` reads it back.
    fn phase(stored: &Stored, now: i64) -> (&'static str, BundleState) {
        match Phase::read(stored, now) {
            Phase::Empty { why } => (why, BundleState::Off),
            Phase::Held(h) => {
                let rotation = match h.rotation {
                    Rotation::Steady => "steady",
                    Rotation::NextDistributed(_) => "next distributed",
                    Rotation::NextTrusted { .. } => "next trusted",
                };
                (rotation, h.bundle)
            }
        }
    }

    #[test]
    fn each_step_of_a_rotation_leaves_the_phase_the_next_step_starts_from() {
        assert_eq!(phase(&Stored::default(), T0).0, "no CA stored");
        let (_, stored) = step(None, &[], T0).unwrap();
        assert_eq!(phase(&stored, T0), ("steady", BundleState::Exact));
        let due = T0 + POLICY.ca_lifetime - POLICY.ca_renew_before;
        let (_, stored) = step(Some(&stored), &[], due - 1).unwrap(); // serving renewed
        let (s, added) = step(Some(&stored), &[], due).unwrap();
        assert_eq!(s, Step::NextCaAdded);
        assert_eq!(phase(&added, due), ("next distributed", BundleState::Exact));
        let both = bundle(&added).unwrap();
        let (_, trusted) = step(Some(&added), &[&both], due + 1).unwrap();
        assert_eq!(
            phase(&trusted, due + 1),
            ("next trusted", BundleState::Exact)
        );
        let (s, switched) = step(Some(&trusted), &[&both], due + 1 + SETTLE).unwrap();
        assert_eq!(s, Step::CaSwitched);
        assert_eq!(
            phase(&switched, due + 1 + SETTLE),
            ("steady", BundleState::Exact)
        );
        let end = due + 1 + SETTLE + POLICY.overlap;
        assert_eq!(
            phase(&switched, end),
            ("steady", BundleState::Retiring { count: 1 })
        );
        let (_, retired) = step(Some(&switched), &[&both], end).unwrap();
        assert_eq!(phase(&retired, end), ("steady", BundleState::Exact));
        // A bundle edited by hand (the old CA back, without its time to leave): off.
        let mut edited = retired.clone();
        edited.data.insert(BUNDLE.into(), both.clone());
        assert_eq!(phase(&edited, end), ("steady", BundleState::Off));
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
        assert!(
            matches!(
                serving(&mismatched, &names(), T0),
                Err(CertError::Unusable {
                    what: "serving certificate",
                    problem: Problem::Load(crate::server::tls::TlsError::Mismatch)
                })
            ),
            "another pair's key is named as such"
        );

        // A certificate for other names: not served, reissued.
        assert!(matches!(
            serving(&good, &["other.example".into()], T0),
            Err(CertError::Unusable {
                problem: Problem::Rejected(_),
                ..
            })
        ));
        let (s, _) = next_step(
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
        assert_eq!(POLICY.check(), Ok(()));
        let bad = |p: Policy| p.check().unwrap_err();
        assert_eq!(
            bad(Policy {
                cert_renew_before: 300,
                ..POLICY
            }),
            PolicyError::Serving {
                renew_before: 300,
                lifetime: 300
            }
        );
        assert_eq!(
            bad(Policy {
                ca_renew_before: 1000,
                ..POLICY
            }),
            PolicyError::Ca {
                renew_before: 1000,
                lifetime: 1000
            }
        );
        assert_eq!(
            bad(Policy {
                ca_renew_before: 105,
                ..POLICY
            }),
            PolicyError::CaBeforeServing {
                ca_renew_before: 105,
                cert_renew_before: 100
            }
        );
        assert_eq!(
            bad(Policy {
                overlap: -1,
                ..POLICY
            }),
            PolicyError::NegativeOverlap
        );
        // Shown as the flags take them: hours as hours, not seconds.
        let msg = bad(Policy {
            ca_lifetime: 8760 * 3600,
            ca_renew_before: 8760 * 3600,
            cert_lifetime: 2160 * 3600,
            cert_renew_before: 720 * 3600,
            overlap: 3600,
        })
        .to_string();
        assert!(
            msg.contains("(8760h) must be shorter than its lifetime (8760h)"),
            "{msg}"
        );
        assert_eq!(go_duration(5400), "1h30m");
        assert_eq!(go_duration(45), "45s");
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(3601), "1h1s");
    }
}
