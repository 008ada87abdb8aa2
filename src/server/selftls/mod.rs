//! Self-managed TLS (`serve --tls-secret NAMESPACE/NAME`): the webhook keeps its CA and serving
//! certificate in its own Secret and the CA in its webhook configurations' `caBundle`, with
//! nothing rendered by the chart that changes between renders (GitOps tools apply the chart
//! as it is, again and again).
//!
//! Every replica runs the same loop: read the Secret and the webhook configurations, decide
//! ([`plan`]), write the Secret with its `resourceVersion` (a replica that loses the race reads
//! again and follows the winner), serve the stored certificate, and set each webhook's
//! `caBundle` to the stored bundle where it differs — after a rotation step, and whenever
//! something else (a sync, a `kubectl apply`) has changed it. Watches on the Secret and on the
//! configurations wake the loop; so do the next deadline and a minute's resync.
//!
//! Failures (RBAC, an API server away) are counted and logged; the certificate in use stays in
//! use. `/readyz` fails only while there is no valid certificate at all.

pub mod plan;

use std::{
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use futures_util::StreamExt as _;
use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
        core::v1::Secret,
    },
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};

use self::plan::{Policy, Stored};
use super::{AppState, ServeArgs, ServeError, metrics::OperationLabel, tls};

/// At most this long between two looks, whatever the deadlines.
const RESYNC: Duration = Duration::from_secs(60);

/// What `--tls-secret` and the flags around it ask for.
#[derive(Debug, Clone)]
pub struct Settings {
    pub namespace: String,
    pub name: String,
    pub names: Vec<String>,
    pub mutating: Vec<String>,
    pub validating: Vec<String>,
    pub policy: Policy,
}

impl Settings {
    /// The self-managed mode's settings, if `--tls-secret` is given, checked.
    pub fn from_args(args: &ServeArgs) -> Result<Option<Settings>, ServeError> {
        let Some(secret) = &args.tls_secret else {
            return Ok(None);
        };
        let bad = |m: String| ServeError::Flag(m);
        let (namespace, name) = secret
            .split_once('/')
            .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
            .ok_or_else(|| {
                bad(format!(
                    "--tls-secret must be NAMESPACE/NAME, not {secret:?}"
                ))
            })?;
        let names: Vec<String> = args
            .tls_names
            .iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Err(bad(
                "--tls-secret needs at least one --tls-name (the Service's DNS name)".into(),
            ));
        }
        for n in &names {
            if rustls_pki_types::ServerName::try_from(n.as_str()).is_err() {
                return Err(bad(format!(
                    "--tls-name {n:?} is neither a DNS name nor an IP address"
                )));
            }
        }
        let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        let policy = Policy {
            ca_lifetime: secs(args.ca_lifetime),
            ca_renew_before: secs(args.ca_renew_before),
            cert_lifetime: secs(args.cert_lifetime),
            cert_renew_before: secs(args.cert_renew_before),
            overlap: secs(args.ca_overlap),
        };
        policy.check().map_err(|m| {
            bad(format!(
                "--ca-lifetime, --ca-renew-before, --cert-lifetime, --cert-renew-before: {m}"
            ))
        })?;
        if args.mutating_webhook_configuration.is_empty()
            && args.validating_webhook_configuration.is_empty()
        {
            return Err(bad(
                "--tls-secret needs --mutating-webhook-configuration (and, with the workload \
                 webhook, --validating-webhook-configuration): the configurations whose caBundle \
                 it keeps; without them the API server would never trust the CA it makes"
                    .into(),
            ));
        }
        Ok(Some(Settings {
            namespace: namespace.into(),
            name: name.into(),
            names,
            mutating: args.mutating_webhook_configuration.clone(),
            validating: args.validating_webhook_configuration.clone(),
            policy,
        }))
    }
}

/// A certificate no client trusts, served until the Secret's is in (the webhook is not ready
/// meanwhile, so no Service sends it anything).
pub fn placeholder() -> Result<tls::Loaded, tls::TlsError> {
    let pair = tls::self_signed(&["localhost"])?;
    tls::load_pem(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes())
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// A failure already counted and logged (by [`Ctx::error`]): the caller only backs off.
struct Reported;

struct Ctx {
    client: Client,
    settings: Settings,
    state: Arc<AppState>,
    /// The certificate served now (PEM) and its expiry.
    served: Mutex<Option<(Vec<u8>, i64)>>,
    /// The last problem logged with the stored certificate, so that it is logged once.
    last_problem: Mutex<Option<String>>,
    wake: tokio::sync::Notify,
}

impl Ctx {
    fn error(&self, operation: &'static str, error: &dyn std::fmt::Display) -> Reported {
        self.state
            .metrics
            .tls_errors
            .get_or_create(&OperationLabel { operation })
            .inc();
        tracing::warn!(operation, error = %error, secret = %format!("{}/{}", self.settings.namespace, self.settings.name),
            "self-managed TLS: failed; the certificate in use stays in use, retrying");
        Reported
    }
}

/// Starts the watches and the loop; they stop at the shutdown signal (a terminating replica
/// writes nothing more: the replicas replacing it own the Secret and the caBundles).
pub fn start(
    client: Client,
    settings: Settings,
    state: Arc<AppState>,
    background: &super::tasks::Background,
) {
    use super::tasks::Until;
    tracing::info!(secret = %format!("{}/{}", settings.namespace, settings.name), names = ?settings.names,
        mutating = ?settings.mutating, validating = ?settings.validating, "self-managed TLS: keeping the certificate in this Secret");
    let ctx = Arc::new(Ctx {
        client,
        settings,
        state,
        served: Mutex::new(None),
        last_problem: Mutex::new(None),
        wake: tokio::sync::Notify::new(),
    });
    let by_name = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.settings.namespace);
    background.spawn(
        Until::Signal,
        "self-managed TLS: Secret watch",
        watch_secret(ctx.clone(), secrets, by_name(&ctx.settings.name)),
    );
    for name in &ctx.settings.mutating {
        let api: Api<MutatingWebhookConfiguration> = Api::all(ctx.client.clone());
        background.spawn(
            Until::Signal,
            "self-managed TLS: webhook configuration watch",
            wake_on_change(ctx.clone(), api, by_name(name)),
        );
    }
    for name in &ctx.settings.validating {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(ctx.client.clone());
        background.spawn(
            Until::Signal,
            "self-managed TLS: webhook configuration watch",
            wake_on_change(ctx.clone(), api, by_name(name)),
        );
    }
    background.spawn(Until::Signal, "self-managed TLS", run(ctx));
}

/// The Secret's watch: a stored certificate is served as soon as it arrives.
async fn watch_secret(ctx: Arc<Ctx>, api: Api<Secret>, config: watcher::Config) {
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => {
                serve(&ctx, &stored_of(&s), unix_now());
                ctx.wake.notify_one();
            }
            Ok(watcher::Event::Delete(_) | watcher::Event::InitDone) => ctx.wake.notify_one(),
            Ok(watcher::Event::Init) => {}
            Err(e) => {
                ctx.error("watch", &e);
            }
        }
    }
}

/// A webhook configuration's watch: any change wakes the loop (it checks the caBundle).
async fn wake_on_change<K>(ctx: Arc<Ctx>, api: Api<K>, config: watcher::Config)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                ctx.wake.notify_one()
            }
            Ok(_) => {}
            Err(e) => {
                ctx.error("watch", &e);
            }
        }
    }
}

async fn run(ctx: Arc<Ctx>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let wait = match reconcile(&ctx).await {
            Ok(wait) => {
                backoff = Duration::from_secs(1);
                wait
            }
            Err(Reported) => {
                let wait = backoff;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                wait
            }
        };
        check_expiry(&ctx, unix_now());
        tokio::select! {
            () = ctx.wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

fn stored_of(secret: &Secret) -> Stored {
    let data = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    let annotations = secret
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| [plan::TRUSTED_SINCE, plan::RETIRE_AFTER].contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Stored { data, annotations }
}

/// The two kinds of webhook configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutating,
    Validating,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Mutating => "MutatingWebhookConfiguration",
            Kind::Validating => "ValidatingWebhookConfiguration",
        }
    }
}

/// One webhook of a configuration, as read: its name and caBundle.
struct LiveWebhook {
    kind: Kind,
    configuration: String,
    index: usize,
    name: String,
    ca_bundle: Vec<u8>,
}

/// The two kinds of webhook configuration, as this module reads and patches them.
trait Configuration:
    kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + serde::Serialize
    + Send
    + Sync
    + 'static
{
    const KIND: Kind;
    /// Each webhook's name and caBundle, in order.
    fn hooks(self) -> Vec<(String, Option<ByteString>)>;
}

impl Configuration for MutatingWebhookConfiguration {
    const KIND: Kind = Kind::Mutating;
    fn hooks(self) -> Vec<(String, Option<ByteString>)> {
        let hooks = self.webhooks.unwrap_or_default().into_iter();
        hooks.map(|w| (w.name, w.client_config.ca_bundle)).collect()
    }
}

impl Configuration for ValidatingWebhookConfiguration {
    const KIND: Kind = Kind::Validating;
    fn hooks(self) -> Vec<(String, Option<ByteString>)> {
        let hooks = self.webhooks.unwrap_or_default().into_iter();
        hooks.map(|w| (w.name, w.client_config.ca_bundle)).collect()
    }
}

/// The webhooks of one configuration; a missing configuration is counted and has none.
async fn read_one<K: Configuration>(ctx: &Ctx, name: &str) -> Result<Vec<LiveWebhook>, Reported> {
    match Api::<K>::all(ctx.client.clone()).get_opt(name).await {
        Ok(Some(c)) => Ok(c
            .hooks()
            .into_iter()
            .enumerate()
            .map(|(index, (hook, ca))| LiveWebhook {
                kind: K::KIND,
                configuration: name.to_string(),
                index,
                name: hook,
                ca_bundle: ca.map(|b| b.0).unwrap_or_default(),
            })
            .collect()),
        Ok(None) => {
            ctx.error(
                "read-webhook-configuration",
                &format!("{} {name} does not exist", K::KIND.name()),
            );
            Ok(Vec::new())
        }
        Err(e) => Err(ctx.error("read-webhook-configuration", &e)),
    }
}

async fn read_live(ctx: &Ctx) -> Result<Vec<LiveWebhook>, Reported> {
    let mut out = Vec::new();
    for name in &ctx.settings.mutating {
        out.extend(read_one::<MutatingWebhookConfiguration>(ctx, name).await?);
    }
    for name in &ctx.settings.validating {
        out.extend(read_one::<ValidatingWebhookConfiguration>(ctx, name).await?);
    }
    Ok(out)
}

fn ca_name(settings: &Settings) -> String {
    format!(
        "ephemeral-volume-injector CA ({}/{})",
        settings.namespace, settings.name
    )
}

/// One look: decide, write, serve, set the caBundles. Returns how long until the next look.
async fn reconcile(ctx: &Ctx) -> Result<Duration, Reported> {
    let now = unix_now();
    let s = &ctx.settings;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &s.namespace);
    let object = secrets
        .get_opt(&s.name)
        .await
        .map_err(|e| ctx.error("read-secret", &e))?;
    let stored = object.as_ref().map(stored_of);
    let live = read_live(ctx).await?;
    let bundles: Vec<Vec<u8>> = live.iter().map(|w| w.ca_bundle.clone()).collect();
    let planned = plan::plan(
        stored.as_ref(),
        &bundles,
        &s.names,
        &s.policy,
        now,
        &ca_name(s),
    )
    .map_err(|e| ctx.error("generate", &e))?;
    let current = match planned {
        None => stored.unwrap_or_default(),
        Some((step, next)) => match write(ctx, &secrets, object, &next).await {
            Ok(()) => {
                log_step(ctx, &step);
                next
            }
            // Another replica wrote first: read again and follow it.
            Err(WriteError::Conflict) => {
                tracing::debug!(
                    step = step.name(),
                    "self-managed TLS: another replica changed the Secret first"
                );
                return Ok(Duration::from_millis(200));
            }
            Err(WriteError::Other(e)) => return Err(ctx.error("write-secret", &e)),
        },
    };
    serve(ctx, &current, now);
    if let Some(bundle) = plan::bundle(&current) {
        set_bundles(ctx, &live, &bundle).await?;
    }
    let until = plan::deadline(&current, &s.policy, now)
        .map(|t| Duration::from_secs(u64::try_from(t - now).unwrap_or(0).max(1)))
        .unwrap_or(RESYNC);
    Ok(until.min(RESYNC))
}

fn log_step(ctx: &Ctx, step: &plan::Step) {
    ctx.state
        .metrics
        .tls_steps
        .get_or_create(&super::metrics::StepLabel { step: step.name() })
        .inc();
    let secret = format!("{}/{}", ctx.settings.namespace, ctx.settings.name);
    match step {
        plan::Step::Created { adopted, why } => {
            tracing::info!(step = step.name(), %secret, why, adopted,
            "self-managed TLS: new CA and serving certificate stored; CAs found in the webhook configurations stay trusted for the overlap")
        }
        plan::Step::NextCaAdded => tracing::info!(step = step.name(), %secret,
            "self-managed TLS: the CA is due for renewal; the next CA is added to the CA bundle first"),
        plan::Step::NextCaTrusted => {
            tracing::info!(step = step.name(), %secret, settle_seconds = plan::SETTLE,
            "self-managed TLS: every webhook configuration holds the next CA; switching after the settle time")
        }
        plan::Step::NextCaUntrusted => tracing::warn!(step = step.name(), %secret,
            "self-managed TLS: a webhook configuration no longer holds the next CA; the switch waits until it does again"),
        plan::Step::CaSwitched => {
            tracing::info!(step = step.name(), %secret, overlap_seconds = ctx.settings.policy.overlap,
            "self-managed TLS: the serving certificate now comes from the next CA; the old CA stays trusted for the overlap")
        }
        plan::Step::OldCasRemoved { count } => tracing::info!(step = step.name(), %secret, count,
            "self-managed TLS: the overlap has passed; CAs that no longer sign leave the CA bundle"),
        plan::Step::ServingRenewed { why } => tracing::info!(step = step.name(), %secret, why,
            "self-managed TLS: new serving certificate from the same CA"),
        plan::Step::BundleRepaired => tracing::warn!(step = step.name(), %secret,
            "self-managed TLS: the stored CA bundle lacked a CA or held an unusable one; repaired"),
    }
}

enum WriteError {
    Conflict,
    Other(kube::Error),
}

/// Writes `next` over the Secret read (`object`), or creates it: a write based on an older
/// read is refused by the API server (409), so one replica's decision wins.
async fn write(
    ctx: &Ctx,
    api: &Api<Secret>,
    object: Option<Secret>,
    next: &Stored,
) -> Result<(), WriteError> {
    let mut secret = object.unwrap_or_else(|| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(ctx.settings.name.clone()),
            namespace: Some(ctx.settings.namespace.clone()),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        ..Default::default()
    });
    let exists = secret.metadata.resource_version.is_some();
    secret.data = Some(
        next.data
            .iter()
            .map(|(k, v)| (k.clone(), ByteString(v.clone())))
            .collect(),
    );
    secret.string_data = None;
    let annotations = secret
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.remove(plan::TRUSTED_SINCE);
    annotations.remove(plan::RETIRE_AFTER);
    annotations.extend(next.annotations.clone());
    let result = if exists {
        api.replace(&ctx.settings.name, &PostParams::default(), &secret)
            .await
    } else {
        api.create(&PostParams::default(), &secret).await
    };
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(WriteError::Conflict),
        Err(e) => Err(WriteError::Other(e)),
    }
}

/// Serves the stored certificate if it is usable and not the one served already.
fn serve(ctx: &Ctx, stored: &Stored, now: i64) {
    let metrics = &ctx.state.metrics;
    match plan::serving(stored, &ctx.settings.names, now) {
        Ok(s) => {
            let mut served = ctx.served.lock().unwrap_or_else(|p| p.into_inner());
            if served.as_ref().is_some_and(|(pem, _)| *pem == s.cert_pem) {
                return;
            }
            match tls::load_pem(&s.cert_pem, &s.key_pem) {
                Ok(loaded) => {
                    ctx.state.certs.swap(loaded.key);
                    metrics.cert_not_after.set(loaded.not_after);
                    if let Some(ca) = plan::ca_not_after(stored) {
                        metrics.ca_not_after.set(ca);
                    }
                    *served = Some((s.cert_pem, loaded.not_after));
                    ctx.state.tls_ready.store(true, Ordering::SeqCst);
                    *ctx.last_problem.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    tracing::info!(
                        not_after = loaded.not_after,
                        "self-managed TLS: serving the certificate from the Secret"
                    );
                }
                Err(e) => problem(ctx, e.to_string()),
            }
        }
        // Nothing stored yet: the loop is about to make it.
        Err(_) if stored.data.is_empty() => {}
        Err(e) => problem(ctx, e.to_string()),
    }
}

/// A stored certificate that cannot be served: counted, logged once, never served.
fn problem(ctx: &Ctx, message: String) {
    let mut last = ctx.last_problem.lock().unwrap_or_else(|p| p.into_inner());
    if last.as_deref() != Some(message.as_str()) {
        ctx.error("unusable-secret", &message);
        *last = Some(message);
    }
}

/// Not ready once the certificate served has expired (and none replaced it).
fn check_expiry(ctx: &Ctx, now: i64) {
    let served = ctx.served.lock().unwrap_or_else(|p| p.into_inner());
    let valid = served
        .as_ref()
        .is_some_and(|(_, not_after)| now < *not_after);
    if !valid && ctx.state.tls_ready.swap(false, Ordering::SeqCst) {
        tracing::error!(
            "self-managed TLS: the certificate served has expired and none replaced it: not ready"
        );
    }
}

/// Sets every webhook's caBundle that differs from `bundle`. The JSON patch tests the webhook's
/// name at its index, so that a configuration changed in between is read again, not clobbered.
async fn set_bundles(ctx: &Ctx, live: &[LiveWebhook], bundle: &[u8]) -> Result<(), Reported> {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(bundle);
    let mut failed = None;
    for w in live.iter().filter(|w| w.ca_bundle != bundle) {
        let patch: json_patch::Patch = match serde_json::from_value(serde_json::json!([
            {"op": "test", "path": format!("/webhooks/{}/name", w.index), "value": w.name},
            {"op": "add", "path": format!("/webhooks/{}/clientConfig/caBundle", w.index), "value": encoded},
        ])) {
            Ok(p) => p,
            Err(e) => return Err(ctx.error("patch-webhook-configuration", &e)),
        };
        let result = match w.kind {
            Kind::Mutating => {
                patch_one::<MutatingWebhookConfiguration>(ctx, &w.configuration, patch).await
            }
            Kind::Validating => {
                patch_one::<ValidatingWebhookConfiguration>(ctx, &w.configuration, patch).await
            }
        };
        match result {
            Ok(()) => {
                ctx.state.metrics.ca_bundle_patches.inc();
                let was = if w.ca_bundle.is_empty() {
                    "empty"
                } else {
                    "different"
                };
                tracing::info!(kind = w.kind.name(), configuration = %w.configuration, webhook = %w.name, was,
                    "self-managed TLS: caBundle set to the stored CA bundle");
            }
            Err(e) => failed = Some(ctx.error("patch-webhook-configuration", &e)),
        }
    }
    failed.map_or(Ok(()), Err)
}

async fn patch_one<K: Configuration>(
    ctx: &Ctx,
    name: &str,
    patch: json_patch::Patch,
) -> Result<(), kube::Error> {
    Api::<K>::all(ctx.client.clone())
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map(|_| ())
}
