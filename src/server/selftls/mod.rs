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
mod policy;

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
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};

use self::{plan::Stored, policy::Policy};
use super::{
    args::ServeArgs, certs::unix_now, errors::ServeError, metrics::OperationLabel, state::AppState,
    tls,
};

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
    /// The webhook configurations whose caBundle this replica keeps, of both kinds.
    fn configurations(&self) -> impl Iterator<Item = (Kind, &str)> {
        let mutating = self.mutating.iter().map(|n| (Kind::Mutating, n.as_str()));
        mutating.chain(
            self.validating
                .iter()
                .map(|n| (Kind::Validating, n.as_str())),
        )
    }

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
    for (kind, name) in ctx.settings.configurations() {
        background.spawn(
            Until::Signal,
            "self-managed TLS: webhook configuration watch",
            wake_on_change(ctx.clone(), kind.api(&ctx.client), by_name(name)),
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
                swap_in_stored(&ctx, &stored_of(&s), unix_now());
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
async fn wake_on_change(ctx: Arc<Ctx>, api: Api<DynamicObject>, config: watcher::Config) {
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

/// The two kinds of webhook configuration, read and patched by one code path through the
/// erased resource (both keep `webhooks[].name` and `webhooks[].clientConfig.caBundle`).
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

    fn api(self, client: &Client) -> Api<DynamicObject> {
        let resource = match self {
            Kind::Mutating => ApiResource::erase::<MutatingWebhookConfiguration>(&()),
            Kind::Validating => ApiResource::erase::<ValidatingWebhookConfiguration>(&()),
        };
        Api::all_with(client.clone(), &resource)
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

/// Each webhook's name and caBundle, in order. A caBundle that is not base64 is kept as its
/// text: it then differs from the stored bundle and is set again.
fn webhooks_of(configuration: &DynamicObject) -> Vec<(String, Vec<u8>)> {
    use base64::Engine as _;
    let hooks = configuration
        .data
        .get("webhooks")
        .and_then(|w| w.as_array());
    hooks
        .into_iter()
        .flatten()
        .map(|hook| {
            let name = hook
                .get("name")
                .and_then(|n| n.as_str())
                .unwrap_or_default();
            let bundle = hook
                .pointer("/clientConfig/caBundle")
                .and_then(|b| b.as_str())
                .unwrap_or_default();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(bundle)
                .unwrap_or_else(|_| bundle.as_bytes().to_vec());
            (name.to_owned(), bytes)
        })
        .collect()
}

/// The webhooks of one configuration; a missing configuration is counted and has none.
async fn read_one(ctx: &Ctx, kind: Kind, name: &str) -> Result<Vec<LiveWebhook>, Reported> {
    match kind.api(&ctx.client).get_opt(name).await {
        Ok(Some(c)) => Ok(webhooks_of(&c)
            .into_iter()
            .enumerate()
            .map(|(index, (hook, ca_bundle))| LiveWebhook {
                kind,
                configuration: name.to_string(),
                index,
                name: hook,
                ca_bundle,
            })
            .collect()),
        Ok(None) => {
            ctx.error(
                "read-webhook-configuration",
                &format!("{} {name} does not exist", kind.name()),
            );
            Ok(Vec::new())
        }
        Err(e) => Err(ctx.error("read-webhook-configuration", &e)),
    }
}

async fn read_live(ctx: &Ctx) -> Result<Vec<LiveWebhook>, Reported> {
    let mut out = Vec::new();
    for (kind, name) in ctx.settings.configurations() {
        out.extend(read_one(ctx, kind, name).await?);
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
    let planned = plan::next_step(
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
    swap_in_stored(ctx, &current, now);
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
            tracing::info!(step = step.name(), %secret, settle_seconds = policy::SETTLE,
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

/// Swaps the stored certificate into the running server's store (server::serve runs the
/// server), if it is usable and not the one served already.
fn swap_in_stored(ctx: &Ctx, stored: &Stored, now: i64) {
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
    use json_patch::{AddOperation, PatchOperation, TestOperation, jsonptr::PointerBuf};
    let encoded = base64::engine::general_purpose::STANDARD.encode(bundle);
    let mut failed = None;
    for w in live.iter().filter(|w| w.ca_bundle != bundle) {
        let index = w.index.to_string();
        let patch = json_patch::Patch(vec![
            PatchOperation::Test(TestOperation {
                path: PointerBuf::from_tokens(["webhooks", &index, "name"]),
                value: w.name.clone().into(),
            }),
            PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["webhooks", &index, "clientConfig", "caBundle"]),
                value: encoded.clone().into(),
            }),
        ]);
        let result = w
            .kind
            .api(&ctx.client)
            .patch(
                &w.configuration,
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await;
        match result {
            Ok(_) => {
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

/// The I/O shell against a mocked API server (the controller-rs pattern): each test runs one
/// look ([`reconcile`]) while a verifier answers the requests it expects, in order, and
/// checks each one — method, path and, for writes, what is written.
#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{Method, Request, Response};
    use kube::client::Body;
    use serde_json::{Value, json};

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    const SECRET: &str = "/api/v1/namespaces/evi/secrets/certs";
    const MWC: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/evi";
    const VWC: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/evi";

    fn settings(validating: bool) -> Settings {
        Settings {
            namespace: "evi".into(),
            name: "certs".into(),
            names: vec!["evi.evi.svc".into()],
            mutating: vec!["evi".into()],
            validating: if validating {
                vec!["evi".into()]
            } else {
                Vec::new()
            },
            policy: Policy {
                ca_lifetime: 8760 * 3600,
                ca_renew_before: 720 * 3600,
                cert_lifetime: 2160 * 3600,
                cert_renew_before: 240 * 3600,
                overlap: 3600,
            },
        }
    }

    /// A replica's loop state on a mocked client, not yet ready (no certificate served).
    fn ctx(settings: Settings) -> (Arc<Ctx>, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let state = crate::server::state::test_state("{}");
        state.tls_ready.store(false, Ordering::SeqCst);
        let ctx = Arc::new(Ctx {
            client: Client::new(service, "default"),
            settings,
            state,
            served: Mutex::new(None),
            last_problem: Mutex::new(None),
            wake: tokio::sync::Notify::new(),
        });
        (ctx, handle)
    }

    /// Waits for the next request, checks its method and path, answers `status` with `body`;
    /// returns what was sent (JSON, Null when empty) and its content type.
    async fn answer(
        handle: &mut Handle,
        method: Method,
        path: &str,
        status: u16,
        body: &Value,
    ) -> (Value, String) {
        let (request, send) = handle.next_request().await.expect("a request");
        assert_eq!(
            (request.method(), request.uri().path()),
            (&method, path),
            "unexpected request"
        );
        let content_type = request
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap_or_default().to_owned())
            .unwrap_or_default();
        let sent = request.into_body().collect_bytes().await.unwrap();
        let sent = if sent.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&sent).unwrap()
        };
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap();
        send.send_response(response);
        (sent, content_type)
    }

    fn status(code: u16, reason: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
               "message": format!("{reason} (from the test)")})
    }

    /// A webhook configuration with these webhooks and caBundles (base64; absent when empty).
    fn configuration(kind: &str, hooks: &[(&str, &[u8])]) -> Value {
        use base64::Engine as _;
        let webhooks: Vec<Value> = hooks
            .iter()
            .map(|(name, ca)| {
                let mut config = json!({"service": {"name": "evi", "namespace": "evi"}});
                if !ca.is_empty() {
                    config["caBundle"] = base64::engine::general_purpose::STANDARD.encode(ca).into();
                }
                json!({"name": name, "clientConfig": config, "sideEffects": "None", "admissionReviewVersions": ["v1"]})
            })
            .collect();
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
               "metadata": {"name": "evi", "resourceVersion": "1"}, "webhooks": webhooks})
    }

    /// The Secret as another replica would have stored it.
    fn secret(stored: &Stored) -> Value {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("certs".into()),
                namespace: Some("evi".into()),
                resource_version: Some("7".into()),
                annotations: Some(stored.annotations.clone()),
                ..Default::default()
            },
            data: Some(
                stored
                    .data
                    .iter()
                    .map(|(k, v)| (k.clone(), ByteString(v.clone())))
                    .collect(),
            ),
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        serde_json::to_value(secret).unwrap()
    }

    fn a_stored_secret(settings: &Settings) -> Stored {
        let (_, stored) = plan::next_step(
            None,
            &[],
            &settings.names,
            &settings.policy,
            unix_now(),
            "test CA",
        )
        .unwrap()
        .unwrap();
        stored
    }

    fn errors(ctx: &Ctx, operation: &'static str) -> u64 {
        ctx.state
            .metrics
            .tls_errors
            .get_or_create(&OperationLabel { operation })
            .get()
    }

    fn steps(ctx: &Ctx, step: &'static str) -> u64 {
        ctx.state
            .metrics
            .tls_steps
            .get_or_create(&super::super::metrics::StepLabel { step })
            .get()
    }

    fn served(ctx: &Ctx) -> Option<Vec<u8>> {
        ctx.served
            .lock()
            .unwrap()
            .as_ref()
            .map(|(pem, _)| pem.clone())
    }

    /// Both kinds through one code path: the patch tests the webhook's name at its index and
    /// sets its caBundle, as a JSON patch.
    fn assert_bundle_patch(
        sent: &Value,
        content_type: &str,
        index: usize,
        name: &str,
        bundle: &[u8],
    ) {
        use base64::Engine as _;
        assert_eq!(content_type, "application/json-patch+json");
        let encoded = base64::engine::general_purpose::STANDARD.encode(bundle);
        assert_eq!(
            sent,
            &json!([
                {"op": "test", "path": format!("/webhooks/{index}/name"), "value": name},
                {"op": "add", "path": format!("/webhooks/{index}/clientConfig/caBundle"), "value": encoded},
            ])
        );
    }

    #[tokio::test]
    async fn a_write_that_loses_the_race_is_read_again_and_the_winners_certificate_served_and_distributed()
     {
        let (ctx, mut api) = ctx(settings(true));
        let mwc = configuration("MutatingWebhookConfiguration", &[("volumes.x", b"")]);
        let vwc = configuration(
            "ValidatingWebhookConfiguration",
            &[("workloads.x", b""), ("cronjobs.x", b"")],
        );

        // No Secret yet: this replica makes one, another replica's create lands first.
        let look = tokio::spawn({
            let ctx = ctx.clone();
            async move { reconcile(&ctx).await.map_err(|Reported| ()) }
        });
        answer(&mut api, Method::GET, SECRET, 404, &status(404, "NotFound")).await;
        answer(&mut api, Method::GET, MWC, 200, &mwc).await;
        answer(&mut api, Method::GET, VWC, 200, &vwc).await;
        let (created, _) = answer(
            &mut api,
            Method::POST,
            "/api/v1/namespaces/evi/secrets",
            409,
            &status(409, "AlreadyExists"),
        )
        .await;
        assert_eq!(created["metadata"]["name"], "certs");
        assert!(created["data"]["tls.crt"].is_string(), "{created}");
        assert_eq!(
            look.await.unwrap(),
            Ok(Duration::from_millis(200)),
            "read again soon"
        );
        assert!(
            !ctx.state.tls_ready.load(Ordering::SeqCst),
            "nothing served: the write lost"
        );
        assert_eq!((served(&ctx), steps(&ctx, "created")), (None, 0));
        assert_eq!(ctx.state.metrics.ca_bundle_patches.get(), 0);

        // The next look reads the winner's Secret: nothing to write, its certificate served,
        // its bundle set on all three webhooks of both kinds.
        let winner = a_stored_secret(&ctx.settings);
        let look = tokio::spawn({
            let ctx = ctx.clone();
            async move { reconcile(&ctx).await.map_err(|Reported| ()) }
        });
        answer(&mut api, Method::GET, SECRET, 200, &secret(&winner)).await;
        answer(&mut api, Method::GET, MWC, 200, &mwc).await;
        answer(&mut api, Method::GET, VWC, 200, &vwc).await;
        let bundle = &winner.data[plan::BUNDLE];
        let (sent, ct) = answer(&mut api, Method::PATCH, MWC, 200, &mwc).await;
        assert_bundle_patch(&sent, &ct, 0, "volumes.x", bundle);
        let (sent, ct) = answer(&mut api, Method::PATCH, VWC, 200, &vwc).await;
        assert_bundle_patch(&sent, &ct, 0, "workloads.x", bundle);
        let (sent, ct) = answer(&mut api, Method::PATCH, VWC, 200, &vwc).await;
        assert_bundle_patch(&sent, &ct, 1, "cronjobs.x", bundle);
        assert!(look.await.unwrap().is_ok());
        assert_eq!(served(&ctx).as_ref(), Some(&winner.data[plan::TLS_CRT]));
        assert!(
            ctx.state.tls_ready.load(Ordering::SeqCst),
            "ready once a certificate is served"
        );
        assert_eq!(ctx.state.metrics.ca_bundle_patches.get(), 3);
        assert_eq!(
            steps(&ctx, "created"),
            0,
            "the winner's step, not this replica's"
        );

        // Readiness follows the served certificate: past its end with none newer, not ready.
        let not_after = ctx.served.lock().unwrap().as_ref().unwrap().1;
        check_expiry(&ctx, not_after - 1);
        assert!(ctx.state.tls_ready.load(Ordering::SeqCst));
        check_expiry(&ctx, not_after);
        assert!(!ctx.state.tls_ready.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_configuration_changed_in_between_fails_the_test_op_and_is_read_again_not_clobbered()
    {
        let (ctx, mut api) = ctx(settings(false));
        let stored = a_stored_secret(&ctx.settings);
        let bundle = &stored.data[plan::BUNDLE];
        let before = configuration("MutatingWebhookConfiguration", &[("volumes.x", b"")]);

        let look = tokio::spawn({
            let ctx = ctx.clone();
            async move { reconcile(&ctx).await.map_err(|Reported| ()) }
        });
        answer(&mut api, Method::GET, SECRET, 200, &secret(&stored)).await;
        answer(&mut api, Method::GET, MWC, 200, &before).await;
        // Meanwhile someone put another webhook first: the test op at index 0 fails.
        let (sent, ct) = answer(&mut api, Method::PATCH, MWC, 422, &status(422, "Invalid")).await;
        assert_bundle_patch(&sent, &ct, 0, "volumes.x", bundle);
        assert_eq!(
            look.await.unwrap(),
            Err(()),
            "the loop backs off and looks again"
        );
        assert_eq!(errors(&ctx, "patch-webhook-configuration"), 1);
        assert!(
            ctx.state.tls_ready.load(Ordering::SeqCst),
            "the certificate is served all the same"
        );

        // Read again: the webhook is now at index 1 (the one put first already holds the
        // bundle), and only it is patched, there.
        let after = configuration(
            "MutatingWebhookConfiguration",
            &[("first.y", bundle), ("volumes.x", b"")],
        );
        let look = tokio::spawn({
            let ctx = ctx.clone();
            async move { reconcile(&ctx).await.map_err(|Reported| ()) }
        });
        answer(&mut api, Method::GET, SECRET, 200, &secret(&stored)).await;
        answer(&mut api, Method::GET, MWC, 200, &after).await;
        let (sent, ct) = answer(&mut api, Method::PATCH, MWC, 200, &after).await;
        assert_bundle_patch(&sent, &ct, 1, "volumes.x", bundle);
        assert!(look.await.unwrap().is_ok());
        assert_eq!(ctx.state.metrics.ca_bundle_patches.get(), 1);
    }

    #[tokio::test]
    async fn a_missing_configuration_is_counted_and_the_secret_is_made_and_served_all_the_same() {
        let (ctx, mut api) = ctx(settings(false));
        let look = tokio::spawn({
            let ctx = ctx.clone();
            async move { reconcile(&ctx).await.map_err(|Reported| ()) }
        });
        answer(&mut api, Method::GET, SECRET, 404, &status(404, "NotFound")).await;
        answer(&mut api, Method::GET, MWC, 404, &status(404, "NotFound")).await;
        let (request, send) = api.next_request().await.expect("a request");
        assert_eq!(
            (request.method(), request.uri().path()),
            (&Method::POST, "/api/v1/namespaces/evi/secrets")
        );
        let sent = request.into_body().collect_bytes().await.unwrap();
        let created: Value = serde_json::from_slice(&sent).unwrap();
        let mut echoed = created.clone();
        echoed["metadata"]["resourceVersion"] = "1".into();
        let echoed = Body::from(serde_json::to_vec(&echoed).unwrap());
        send.send_response(Response::builder().status(201).body(echoed).unwrap());
        let wait = look.await.unwrap();
        assert!(wait.is_ok(), "{wait:?}");
        assert_eq!(errors(&ctx, "read-webhook-configuration"), 1);
        assert_eq!(steps(&ctx, "created"), 1);
        // What it wrote is what it serves.
        use base64::Engine as _;
        let crt = created["data"]["tls.crt"].as_str().unwrap();
        let crt = base64::engine::general_purpose::STANDARD
            .decode(crt)
            .unwrap();
        assert_eq!(served(&ctx), Some(crt));
        assert!(ctx.state.tls_ready.load(Ordering::SeqCst));
        assert_eq!(
            ctx.state.metrics.ca_bundle_patches.get(),
            0,
            "nothing to patch"
        );
    }
}
