//! The AdmissionReview codec: bytes in, bytes out, with the engine in between.
//!
//! Two endpoints share it: `/mutate` decides on a Pod CREATE and patches it; `/validate`
//! decides on a pod controller's template (Job, CronJob, Deployment, …) the same way and only
//! admits or refuses, so that a workload whose pods would be refused fails at its own creation.
//!
//! Field names and semantics are kube-core's (`kube_core::admission`); the request is decoded
//! as a narrow borrowed view (the pod is decoded only for Pod CREATE), and the response is
//! written by hand because kube-core serialises `patch` as an array of numbers, which the API
//! server refuses (kube-rs issue 1781): the wire format is a standard-base64 string.

use std::borrow::Cow;

use kube_core::admission::Operation;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{
    cluster::KnownCluster,
    config::Config,
    decision::Decision,
    engine::{self, PodLocation},
    pod::{ObjectName, PodView, Str},
    workload::{self, TemplateAt},
};

/// A body the webhook cannot answer with an AdmissionReview (the server sends 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// Not an AdmissionReview (or a Pod CREATE whose object is not a pod).
    #[error("the body is not an AdmissionReview: {0}")]
    Malformed(serde_json::Error),
    /// Not UTF-8.
    #[error("the body is not UTF-8 (JSON must be): {0}")]
    NotUtf8(std::str::Utf8Error),
    /// No `request`.
    #[error("the AdmissionReview has no request")]
    NoRequest,
    /// The response could not be written.
    #[error("failed to serialize the response: {0}")]
    Serialize(serde_json::Error),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(bound(deserialize = "O: Deserialize<'de>, 'de: 'a"))]
struct ReviewIn<'a, O> {
    #[serde(borrow)]
    api_version: &'a str,
    #[serde(borrow)]
    kind: &'a str,
    request: Option<RequestIn<'a, O>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(bound(deserialize = "O: Deserialize<'de>, 'de: 'a"))]
struct RequestIn<'a, O> {
    #[serde(borrow)]
    uid: &'a str,
    #[serde(borrow)]
    kind: Gvk<'a>,
    operation: Operation,
    #[serde(borrow)]
    sub_resource: Option<&'a str>,
    #[serde(borrow)]
    namespace: Option<Str<'a>>,
    /// Boxed: the request is small, whatever the object's view.
    #[serde(default)]
    object: Option<Box<O>>,
    /// An UPDATE's object as it was, kept raw (a workload's template is compared with it).
    #[serde(borrow, default)]
    old_object: Option<&'a RawValue>,
    dry_run: Option<bool>,
}

#[derive(Deserialize)]
struct Gvk<'a> {
    #[serde(borrow, default)]
    group: &'a str,
    #[serde(borrow)]
    kind: &'a str,
}

/// A workload as the validating webhook reads it: its name and its pod template, wherever the
/// kind keeps it (`spec.template`, or a CronJob's `spec.jobTemplate.spec.template`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WorkloadIn<'a> {
    #[serde(borrow)]
    metadata: Option<NameView<'a>>,
    #[serde(borrow)]
    spec: Option<WorkloadSpec<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NameView<'a> {
    #[serde(borrow)]
    name: Option<Str<'a>>,
    #[serde(borrow)]
    generate_name: Option<Str<'a>>,
}

/// The templates are kept raw: read into a pod view only when the review decides on them, and
/// an UPDATE's compared with the old object's as text.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WorkloadSpec<'a> {
    #[serde(borrow)]
    template: Option<&'a RawValue>,
    #[serde(borrow)]
    job_template: Option<JobTemplate<'a>>,
}

#[derive(Deserialize)]
struct JobTemplate<'a> {
    #[serde(borrow)]
    spec: Option<JobTemplateSpec<'a>>,
}

#[derive(Deserialize)]
struct JobTemplateSpec<'a> {
    #[serde(borrow)]
    template: Option<&'a RawValue>,
}

impl<'a> WorkloadIn<'a> {
    fn name(&self) -> ObjectName<'a> {
        match &self.metadata {
            Some(m) => ObjectName::of(m.name.as_ref(), m.generate_name.as_ref()),
            None => ObjectName::default(),
        }
    }

    /// The pod template where this kind keeps it, as written.
    fn template(&self, at: TemplateAt) -> Option<&'a RawValue> {
        let spec = self.spec.as_ref()?;
        match at {
            TemplateAt::Spec => spec.template,
            TemplateAt::JobSpec => spec.job_template.as_ref()?.spec.as_ref()?.template,
        }
    }
}

#[derive(Serialize)]
struct StatusOut<'a> {
    status: &'static str,
    code: u16,
    reason: &'static str,
    message: &'a str,
}

/// Which webhook a review came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /mutate`: a Pod CREATE is decided and patched.
    Mutate,
    /// `POST /validate`: a pod controller's CREATE or UPDATE is decided on its pod template
    /// exactly as on the pod it would make, and refused when that pod would be; never patched.
    Validate,
}

/// The object a decision was made on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subject<'a> {
    /// Its kind (`Pod`, `Job`, …); empty when nothing was decided.
    pub kind: &'a str,
    /// Its name, or its `generateName` with a `*`.
    pub name: ObjectName<'a>,
    /// For a pod, its controller (`ownerReferences` with `controller: true`): kind and name.
    pub owner: Option<(Cow<'a, str>, Cow<'a, str>)>,
}

/// The response and what the decision log and metrics need, borrowing from the request body.
#[derive(Debug, Clone)]
pub struct Handled<'a> {
    /// The AdmissionReview to send back.
    pub body: Vec<u8>,
    /// What was decided ([`Decision::Unchanged`] when there was nothing to decide). At
    /// [`Endpoint::Validate`] a [`Decision::Mutated`] says what the pod will get; the response
    /// carries no patch.
    pub decision: Decision,
    /// The request's uid.
    pub uid: &'a str,
    /// The request's namespace.
    pub namespace: Cow<'a, str>,
    /// What was decided on.
    pub subject: Subject<'a>,
    /// A server-side dry run.
    pub dry_run: bool,
    /// What audited rules or profiles would have done, when it differs from the decision.
    pub audit: Option<engine::Audit>,
}

/// Decodes a review, decides (with the cluster checks against what is known of the cluster,
/// `None`: no checks), and encodes the response. The one entry point of the server, the CLI's
/// tests, the property tests, the fuzz oracle and the benchmarks.
pub fn handle<'a>(
    cfg: &Config,
    cluster: Option<KnownCluster<'_>>,
    endpoint: Endpoint,
    body: &'a [u8],
) -> Result<Handled<'a>, ReviewError> {
    // JSON is UTF-8 (RFC 8259): the body is checked once, whole, so the parser need not check
    // every string it reads (or every raw value it keeps) again; on an invalid body std's
    // check runs again for its error, which says where.
    let text = simdutf8::basic::from_utf8(body)
        .or_else(|_| std::str::from_utf8(body))
        .map_err(ReviewError::NotUtf8)?;
    match endpoint {
        Endpoint::Mutate => mutate(cfg, cluster, text),
        Endpoint::Validate => validate(cfg, cluster, text),
    }
}

/// Decodes the review with its object in the view `O`; should the object not fit that view,
/// reads it again keeping the object raw, and gives the decoding error only when the request
/// is one this endpoint decides on (`decides`).
fn decode<'a, O: Deserialize<'a>>(
    text: &'a str,
    decides: impl Fn(&RequestIn<'a, &'a RawValue>) -> bool,
) -> Result<ReviewIn<'a, O>, ReviewError> {
    match serde_json::from_str::<ReviewIn<'a, O>>(text) {
        Ok(review) => Ok(review),
        Err(view_error) => {
            let review: ReviewIn<'a, &'a RawValue> =
                serde_json::from_str(text).map_err(ReviewError::Malformed)?;
            let req = review.request.ok_or(ReviewError::NoRequest)?;
            if decides(&req) {
                return Err(ReviewError::Malformed(view_error));
            }
            Ok(ReviewIn {
                api_version: review.api_version,
                kind: review.kind,
                request: Some(RequestIn {
                    uid: req.uid,
                    kind: req.kind,
                    operation: req.operation,
                    sub_resource: req.sub_resource,
                    namespace: req.namespace,
                    object: None,
                    old_object: req.old_object,
                    dry_run: req.dry_run,
                }),
            })
        }
    }
}

fn mutate<'a>(
    cfg: &Config,
    cluster: Option<KnownCluster<'_>>,
    text: &'a str,
) -> Result<Handled<'a>, ReviewError> {
    // One pass: the object is decoded as a narrow pod view while the envelope is read.
    let review = decode::<PodView<'a>>(text, is_pod_create)?;
    let mut req = review.request.ok_or(ReviewError::NoRequest)?;
    let namespace = req.namespace.take().map_or(Cow::Borrowed(""), |n| n.0);
    let (subject, (decision, audit)) = match (is_pod_create(&req), &req.object) {
        (true, Some(pod)) => (
            Subject {
                kind: "Pod",
                name: pod.display_name(),
                owner: pod
                    .controller()
                    .map(|o| (o.kind.0.clone(), o.name.0.clone())),
            },
            engine::decide_audited(
                cfg,
                cluster,
                pod,
                PodLocation {
                    namespace: &namespace,
                    pointer: "",
                },
            ),
        ),
        _ => (Subject::default(), (unchanged(), None)),
    };
    Ok(Handled {
        body: encode(review.api_version, review.kind, req.uid, &decision, true)?,
        decision,
        uid: req.uid,
        namespace,
        subject,
        dry_run: req.dry_run.unwrap_or(false),
        audit,
    })
}

fn validate<'a>(
    cfg: &Config,
    cluster: Option<KnownCluster<'_>>,
    text: &'a str,
) -> Result<Handled<'a>, ReviewError> {
    let review = decode::<WorkloadIn<'a>>(text, |req| workload_change(req).is_some())?;
    let mut req = review.request.ok_or(ReviewError::NoRequest)?;
    let namespace = req.namespace.take().map_or(Cow::Borrowed(""), |n| n.0);
    let mut subject = Subject::default();
    let mut decision = unchanged();
    let mut audit = None;
    if let (Some(at), Some(object)) = (workload_change(&req), &req.object)
        && let Some(raw) = object.template(at)
        && (req.operation == Operation::Create
            || template_changed(raw, req.old_object, at.pointer()))
    {
        let template: PodView<'a> =
            serde_json::from_str(raw.get()).map_err(ReviewError::Malformed)?;
        subject = Subject {
            kind: req.kind.kind,
            name: object.name(),
            owner: None,
        };
        (decision, audit) = engine::decide_audited(
            cfg,
            cluster,
            &template,
            PodLocation {
                namespace: &namespace,
                pointer: at.pointer(),
            },
        );
    }
    Ok(Handled {
        body: encode(review.api_version, review.kind, req.uid, &decision, false)?,
        decision,
        uid: req.uid,
        namespace,
        subject,
        dry_run: req.dry_run.unwrap_or(false),
        audit,
    })
}

fn unchanged() -> Decision {
    Decision::Unchanged {
        warnings: Vec::new(),
    }
}

fn is_pod_create<O>(req: &RequestIn<'_, O>) -> bool {
    req.kind.group.is_empty()
        && req.kind.kind == "Pod"
        && req.operation == Operation::Create
        && req.sub_resource.is_none_or(str::is_empty)
}

/// A pod controller's CREATE or UPDATE (not of a subresource: `scale` and `status` cannot
/// change the template): where its pod template is. A custom resource (a dotted API group of
/// its own, not Kubernetes' `*.k8s.io`: Argo Rollouts, Knative, OpenKruise, which the chart's
/// `webhook.workloads.customResources` sends) keeps it at `spec.template`, as a Deployment
/// does; one with no pod template there is admitted unchanged.
fn workload_change<O>(req: &RequestIn<'_, O>) -> Option<TemplateAt> {
    let group = req.kind.group;
    let custom = group.contains('.') && !group.ends_with(".k8s.io");
    matches!(req.operation, Operation::Create | Operation::Update)
        .then_some(())
        .filter(|()| req.sub_resource.is_none_or(str::is_empty))
        .and_then(|()| match workload::find(group, req.kind.kind) {
            Some(w) => Some(w.template),
            None => custom.then_some(TemplateAt::Spec),
        })
}

/// Whether an UPDATE changes the pod template. One that does not (a label on the workload,
/// a finalizer removed at deletion, a workload stored before the webhook was installed) is not
/// decided on: refusing it would block the workload's owners for what its pods already get.
///
/// The new template and the old object's are compared as text, whitespace outside strings
/// aside: the API server writes both with one deterministic encoder (struct fields in order,
/// map keys sorted), so equal templates are equal text. Nothing is decoded into a tree.
fn template_changed(new: &RawValue, old_object: Option<&RawValue>, pointer: &str) -> bool {
    match template_at(old_object, pointer) {
        Some(old) => !same_json_text(new.get(), old),
        None => true,
    }
}

/// The raw value at `pointer` (`/spec/template`) in `raw`, found one object at a time.
fn template_at<'a>(raw: Option<&'a RawValue>, pointer: &str) -> Option<&'a str> {
    let mut at = raw?;
    for token in pointer.split('/').skip(1) {
        // Not an object here: no template at this place.
        let fields: std::collections::HashMap<Cow<'a, str>, &'a RawValue> =
            serde_json::from_str(at.get()).ok()?;
        at = fields.get(token).copied()?;
    }
    Some(at.get())
}

/// Whether two JSON texts are the same but for whitespace outside strings.
fn same_json_text(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    significant(a).eq(significant(b))
}

/// The bytes of a JSON text that carry meaning: whitespace outside strings left out.
fn significant(text: &str) -> impl Iterator<Item = u8> + '_ {
    let mut in_string = false;
    let mut escaped = false;
    text.bytes().filter(move |&b| {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            true
        } else if b == b'"' {
            in_string = true;
            true
        } else {
            !b.is_ascii_whitespace()
        }
    })
}

/// Writes the response envelope by hand so the base64 patch goes straight into the output
/// (serde would scan every byte of it for characters to escape, and there are none).
fn encode(
    api_version: &str,
    kind: &str,
    uid: &str,
    decision: &Decision,
    with_patch: bool,
) -> Result<Vec<u8>, ReviewError> {
    let allowed = decision.allowed();
    let patch = decision
        .patch()
        .filter(|_| with_patch)
        .map(|p| p.as_bytes());
    let mut out = Vec::with_capacity(256 + patch.map_or(0, |p| p.len() * 4 / 3 + 4));
    out.extend_from_slice(b"{\"apiVersion\":");
    str_json(&mut out, api_version)?;
    out.extend_from_slice(b",\"kind\":");
    str_json(&mut out, kind)?;
    out.extend_from_slice(b",\"response\":{\"uid\":");
    str_json(&mut out, uid)?;
    out.extend_from_slice(if allowed {
        b",\"allowed\":true"
    } else {
        b",\"allowed\":false"
    });
    if let Decision::Denied(d) = decision {
        out.extend_from_slice(b",\"status\":");
        json(
            &mut out,
            &StatusOut {
                status: "Failure",
                code: d.code(),
                reason: d.reason.status_reason(),
                message: &d.message,
            },
        )?;
    }
    if let Some(p) = patch {
        out.extend_from_slice(b",\"patchType\":\"JSONPatch\",\"patch\":\"");
        // Standard base64 with padding; SIMD where the CPU has it (the patch is most of the
        // response's bytes).
        base64_simd::STANDARD.encode_append(p, &mut out);
        out.push(b'"');
    }
    if !decision.warnings().is_empty() {
        out.extend_from_slice(b",\"warnings\":");
        json(&mut out, decision.warnings())?;
    }
    out.extend_from_slice(b"}}");
    Ok(out)
}

fn json<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), ReviewError> {
    serde_json::to_writer(out, value).map_err(ReviewError::Serialize)
}

/// A string, as [`json`] writes it, without serde's byte-by-byte escaping loop.
fn str_json(out: &mut Vec<u8>, value: &str) -> Result<(), ReviewError> {
    crate::patch::write_str(out, value).map_err(ReviewError::Serialize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decision::{Denial, DenyReason},
        volume::VolumeKind,
    };
    use base64::{Engine as _, engine::general_purpose::STANDARD};
    use serde_json::{Value, json};

    #[test]
    fn the_patch_is_standard_base64_whatever_its_length() {
        // Every remainder of the length by 3 (padding "", "==", "="), read back by another
        // implementation than the one that wrote it.
        for extra in 0..9 {
            let mut patch = crate::patch::Patch::default();
            patch.add(&format!("/a{}", "~".repeat(extra)), "v").unwrap();
            let decision = Decision::Mutated {
                patch: patch.clone(),
                injected: Vec::new(),
                warnings: Vec::new(),
            };
            let out: Value =
                serde_json::from_slice(&encode("v", "k", "u", &decision, true).unwrap()).unwrap();
            let text = out["response"]["patch"].as_str().unwrap();
            assert_eq!(STANDARD.decode(text).unwrap(), patch.as_bytes(), "{text}");
        }
    }

    fn body(kind: &str, op: &str, object: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": kind},
                        "operation": op, "namespace": "nf", "object": object}
        }))
        .unwrap()
    }

    #[test]
    fn the_envelope_is_valid_json_with_escaped_strings() {
        let outcome =
            Decision::Denied(Denial::new(DenyReason::Policy, "a \"quoted\" \\ message\n"));
        let out: Value = serde_json::from_slice(
            &encode(
                "admission.k8s.io/v1",
                "AdmissionReview",
                "u\"1",
                &outcome,
                true,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(out["response"]["uid"], "u\"1");
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["code"], 403);
        assert_eq!(
            out["response"]["status"]["message"],
            "a \"quoted\" \\ message\n"
        );
        assert!(out["response"].get("warnings").is_none());
        let warned = Decision::Unchanged {
            warnings: vec!["w\"1".into()],
        };
        let out: Value =
            serde_json::from_slice(&encode("v", "k", "u", &warned, true).unwrap()).unwrap();
        assert_eq!(out["response"]["allowed"], true);
        assert_eq!(out["response"]["warnings"][0], "w\"1");
        assert!(out["response"].get("patch").is_none());
    }

    #[test]
    fn only_pod_create_is_mutated() {
        let pod = json!({"metadata": {"annotations": {"ephemeral-volumes.io/x": "type=emptyDir,mountPath=/x"}},
                         "spec": {"containers": [{"name": "c"}]}});
        let cfg = Config::default();
        let request = body("Pod", "CREATE", pod.clone());
        let h = handle(&cfg, None, Endpoint::Mutate, &request).unwrap();
        assert!(matches!(h.decision, Decision::Mutated { .. }));
        for (kind, op) in [
            ("Pod", "UPDATE"),
            ("Pod", "DELETE"),
            ("ConfigMap", "CREATE"),
        ] {
            let request = body(kind, op, pod.clone());
            let h = handle(&cfg, None, Endpoint::Mutate, &request).unwrap();
            assert!(
                matches!(h.decision, Decision::Unchanged { .. }),
                "{kind} {op}"
            );
            let out: Value = serde_json::from_slice(&h.body).unwrap();
            assert_eq!(out["response"]["allowed"], true);
            assert!(out["response"].get("patch").is_none());
        }
        // A non-pod object that does not fit the pod view is still passed through.
        let odd = json!({"spec": {"containers": "not a list"}});
        let request = body("Widget", "CREATE", odd.clone());
        let h = handle(&cfg, None, Endpoint::Mutate, &request).unwrap();
        assert!(matches!(h.decision, Decision::Unchanged { .. }));
        assert!(matches!(
            handle(&cfg, None, Endpoint::Mutate, &body("Pod", "CREATE", odd)),
            Err(ReviewError::Malformed(_))
        ));
    }

    #[test]
    fn a_pod_create_without_an_object_is_admitted_unchanged_and_a_bad_one_refused() {
        let cfg = Config::default();
        let mut absent: Value =
            serde_json::from_slice(&body("Pod", "CREATE", json!(null))).unwrap();
        absent["request"].as_object_mut().unwrap().remove("object");
        for request in [
            body("Pod", "CREATE", json!(null)),
            serde_json::to_vec(&absent).unwrap(),
        ] {
            let h = handle(&cfg, None, Endpoint::Mutate, &request).unwrap();
            assert!(matches!(h.decision, Decision::Unchanged { .. }));
            assert_eq!(h.subject, Subject::default());
        }
        for object in [json!("a pod"), json!([]), json!(1)] {
            let request = body("Pod", "CREATE", object);
            let err = handle(&cfg, None, Endpoint::Mutate, &request);
            assert!(
                matches!(&err, Err(ReviewError::Malformed(e)) if e.to_string().contains("PodView")),
                "{err:?}"
            );
        }
    }

    fn workload(kind: &str, op: &str, annotation: &str, old: Option<&str>) -> Vec<u8> {
        let group = match kind {
            "Job" | "CronJob" => "batch",
            "ReplicationController" => "",
            "Rollout" => "argoproj.io",
            "CloneSet" => "apps.kruise.io",
            _ => "apps",
        };
        let template = |value: &str| {
            json!({"metadata": {"annotations": {"ephemeral-volumes.io/s": value}},
                   "spec": {"containers": [{"name": "c"}]}})
        };
        let object = |value: &str| {
            let spec = if kind == "CronJob" {
                json!({"jobTemplate": {"spec": {"template": template(value)}}})
            } else {
                json!({"template": template(value)})
            };
            json!({"metadata": {"name": "w"}, "spec": spec})
        };
        let mut review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-2", "kind": {"group": group, "version": "v1", "kind": kind},
                        "operation": op, "namespace": "nf", "object": object(annotation)}
        });
        if let Some(old) = old {
            review["request"]["oldObject"] = object(old);
        }
        serde_json::to_vec(&review).unwrap()
    }

    fn validate(body: &[u8]) -> (Decision, Value) {
        let h = handle(&Config::default(), None, Endpoint::Validate, body).unwrap();
        (h.decision, serde_json::from_slice(&h.body).unwrap())
    }

    #[test]
    fn a_workload_is_refused_as_its_pod_would_be_and_never_patched() {
        const BAD: &str = "type=emptyDir,mountPath=/s,size=10Gii";
        const GOOD: &str = "type=emptyDir,mountPath=/s,size=1Gi";
        for kind in [
            "Job",
            "CronJob",
            "Deployment",
            "StatefulSet",
            "DaemonSet",
            "ReplicaSet",
            "ReplicationController",
        ] {
            let (decision, out) = validate(&workload(kind, "CREATE", BAD, None));
            let Decision::Denied(d) = decision else {
                panic!("{kind}: {decision:?}")
            };
            assert_eq!(out["response"]["allowed"], false, "{kind}");
            assert_eq!(out["response"]["status"]["code"], 400, "{kind}");
            assert!(
                d.message.contains("annotation ephemeral-volumes.io/s"),
                "{kind}: {}",
                d.message
            );
            let (decision, out) = validate(&workload(kind, "CREATE", GOOD, None));
            assert!(matches!(decision, Decision::Mutated { .. }), "{kind}");
            assert_eq!(out["response"]["allowed"], true, "{kind}");
            assert!(out["response"].get("patch").is_none(), "{kind}: {out}");
        }
        // The same message as the pod's, word for word.
        let pod = json!({"metadata": {"annotations": {"ephemeral-volumes.io/s": BAD}},
                         "spec": {"containers": [{"name": "c"}]}});
        let cfg = Config::default();
        let pod_body = body("Pod", "CREATE", pod);
        let as_pod = handle(&cfg, None, Endpoint::Mutate, &pod_body).unwrap();
        let (as_job, _) = validate(&workload("Job", "CREATE", BAD, None));
        assert_eq!(as_pod.decision, as_job);
    }

    /// A custom workload the chart is told to send (`webhook.workloads.customResources`) is
    /// decided as a Deployment is, from its `spec.template`.
    #[test]
    fn a_custom_workload_with_a_pod_template_at_spec_template_is_decided_as_a_deployment() {
        const BAD: &str = "type=emptyDir,mountPath=/s,size=10Gii";
        const GOOD: &str = "type=emptyDir,mountPath=/s,size=1Gi";
        for kind in ["Rollout", "CloneSet"] {
            let (bad, out) = validate(&workload(kind, "CREATE", BAD, None));
            let (as_deployment, _) = validate(&workload("Deployment", "CREATE", BAD, None));
            assert_eq!(bad, as_deployment, "{kind}");
            assert_eq!(out["response"]["status"]["code"], 400, "{kind}");
            let (good, out) = validate(&workload(kind, "CREATE", GOOD, None));
            assert!(matches!(good, Decision::Mutated { .. }), "{kind}: {good:?}");
            assert!(out["response"].get("patch").is_none(), "{kind}: {out}");
            // An UPDATE that leaves the template as it was: not decided on.
            let (same, _) = validate(&workload(kind, "UPDATE", BAD, Some(BAD)));
            assert_eq!(same, unchanged(), "{kind}");
        }
        // A kind with no pod template at spec.template: admitted unchanged.
        let mut other: Value =
            serde_json::from_slice(&workload("Rollout", "CREATE", BAD, None)).unwrap();
        other["request"]["object"] = json!({"metadata": {"name": "w"}, "spec": {"replicas": 1}});
        let (d, out) = validate(&serde_json::to_vec(&other).unwrap());
        assert_eq!(d, unchanged());
        assert_eq!(out["response"]["allowed"], true);
    }

    #[test]
    fn an_update_is_decided_only_when_it_changes_the_template() {
        const BAD: &str = "type=emptyDir,mountPath=/s,size=10Gii";
        const GOOD: &str = "type=emptyDir,mountPath=/s,size=1Gi";
        // Introducing a bad annotation: refused. Removing it: admitted.
        let (d, _) = validate(&workload("Deployment", "UPDATE", BAD, Some(GOOD)));
        assert!(matches!(d, Decision::Denied(_)), "{d:?}");
        let (d, out) = validate(&workload("Deployment", "UPDATE", GOOD, Some(BAD)));
        assert!(matches!(d, Decision::Mutated { .. }), "{d:?}");
        assert_eq!(out["response"]["allowed"], true);
        // A template left as it was (a label, a finalizer, a workload stored before the
        // webhook): not decided on, so its owners are never blocked by it.
        let (d, out) = validate(&workload("Deployment", "UPDATE", BAD, Some(BAD)));
        assert_eq!(d, unchanged());
        assert_eq!(out["response"]["allowed"], true);
        let (d, _) = validate(&workload("CronJob", "UPDATE", BAD, Some(BAD)));
        assert_eq!(d, unchanged());
    }

    #[test]
    fn templates_are_compared_in_the_raw_text_whitespace_aside() {
        let pointer = "/spec/template";
        // The new object's template (as the review keeps it) against the old object.
        let changed = |new: &str, old: &str| {
            let new: &RawValue = serde_json::from_str(new).unwrap();
            let old: Option<&RawValue> = serde_json::from_str(old).unwrap();
            template_changed(template_raw(new, pointer), old, pointer)
        };
        fn template_raw<'a>(object: &'a RawValue, pointer: &str) -> &'a RawValue {
            let text = template_at(Some(object), pointer).unwrap();
            serde_json::from_str(text).unwrap()
        }
        let a = r#"{"metadata":{"labels":{"x":"1"}},"spec":{"template":{"spec":{"containers":[{"name":"c","image":"i"}]}}}}"#;
        // Another label on the workload, the template pretty-printed: the same template.
        let b = r#"{"metadata":{"labels":{"x":"2"}}, "spec": {"template": {"spec": {"containers": [ {"name": "c", "image": "i"} ] } } } }"#;
        assert!(!changed(a, b));
        // A space inside a string is a change.
        let c = r#"{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"i "}]}}}}"#;
        assert!(changed(a, c));
        // A template added is a change (an old object without one, or none at all).
        assert!(changed(a, r#"{"spec":{}}"#));
        assert!(changed(a, "null"));
        // Escapes are read as text: an escaped quote does not end the string.
        assert!(same_json_text(r#"{"a":"x\" y"}"#, r#"{ "a" : "x\" y" }"#));
        assert!(!same_json_text(r#"{"a":"x\" y"}"#, r#"{"a":"x\"y"}"#));
    }

    #[test]
    fn the_workload_webhook_passes_what_is_not_a_pod_controller_change() {
        const BAD: &str = "type=emptyDir,mountPath=/s,size=10Gii";
        for (kind, op) in [
            ("Job", "DELETE"),
            ("ConfigMap", "CREATE"),
            ("Pod", "CREATE"),
        ] {
            let (d, out) = validate(&workload(kind, op, BAD, None));
            assert_eq!(d, unchanged(), "{kind} {op}");
            assert_eq!(out["response"]["allowed"], true);
        }
        // The scale subresource cannot change the template.
        let mut scale: Value =
            serde_json::from_slice(&workload("Deployment", "UPDATE", BAD, Some("x"))).unwrap();
        scale["request"]["subResource"] = json!("scale");
        let (d, _) = validate(&serde_json::to_vec(&scale).unwrap());
        assert_eq!(d, unchanged());
        // A ReplicationController without a template has no pod to decide on.
        let rc = body(
            "ReplicationController",
            "CREATE",
            json!({"spec": {"replicas": 0}}),
        );
        let mut rc: Value = serde_json::from_slice(&rc).unwrap();
        rc["request"]["kind"]["group"] = json!("");
        let (d, _) = validate(&serde_json::to_vec(&rc).unwrap());
        assert_eq!(d, unchanged());
        // A workload whose template is not a pod is a bad request, as a bad pod is.
        let mut odd: Value = serde_json::from_slice(&workload("Job", "CREATE", BAD, None)).unwrap();
        odd["request"]["object"]["spec"]["template"]["spec"]["containers"] = json!("x");
        assert!(matches!(
            handle(
                &Config::default(),
                None,
                Endpoint::Validate,
                &serde_json::to_vec(&odd).unwrap()
            ),
            Err(ReviewError::Malformed(_))
        ));
    }

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        let cfg = Config::default();
        assert!(matches!(
            handle(&cfg, None, Endpoint::Mutate, b"{"),
            Err(ReviewError::Malformed(_))
        ));
        assert!(matches!(
            handle(&cfg, None, Endpoint::Mutate, b"[]"),
            Err(ReviewError::Malformed(_))
        ));
        // Invalid UTF-8, even inside a field the webhook would not read, is refused by name.
        let mut bad = body(
            "Pod",
            "CREATE",
            json!({"metadata": {"labels": {"x": "ab"}}}),
        );
        let at = bad.windows(2).position(|w| w == b"ab").unwrap();
        bad[at] = 0xff;
        let err = handle(&cfg, None, Endpoint::Mutate, &bad).unwrap_err();
        assert!(matches!(err, ReviewError::NotUtf8(_)));
        assert!(
            err.to_string().starts_with("the body is not UTF-8"),
            "{err}"
        );
        // Where: the SIMD check only says whether; the error comes from std's.
        assert!(err.to_string().contains(&format!("index {at}")), "{err}");
        assert!(matches!(
            handle(
                &cfg,
                None,
                Endpoint::Mutate,
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#
            ),
            Err(ReviewError::NoRequest)
        ));
    }

    #[test]
    fn labels_are_read_only_for_rules_in_the_namespace_and_bad_ones_are_named() {
        let cfg = Config::parse(
            "rules:\n- name: r\n  namespaces: [nf]\n  podSelector: {matchLabels: {app: x}}\n  volumes:\n    tmp: {emptyDir: {}, mountPath: /tmp}\n",
        )
        .unwrap();
        let pod = |labels: Value| json!({"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c"}]}});
        let request = body("Pod", "CREATE", pod(json!({"app": "x"})));
        let h = handle(&cfg, None, Endpoint::Mutate, &request).unwrap();
        assert!(matches!(h.decision, Decision::Mutated { .. }));
        assert_eq!(
            h.decision.injected(),
            [("tmp".to_owned(), VolumeKind::EmptyDir)]
        );
        let request = body("Pod", "CREATE", pod(json!({"app": 1})));
        let h = handle(&cfg, None, Endpoint::Mutate, &request).unwrap();
        let Decision::Denied(d) = &h.decision else {
            panic!("{:?}", h.decision)
        };
        assert_eq!(d.reason, DenyReason::Invalid);
        assert!(d.message.starts_with("metadata.labels: "));
        // Outside the rule's namespaces the labels are never decoded.
        let mut other = body("Pod", "CREATE", pod(json!({"app": 1})));
        other = String::from_utf8(other)
            .unwrap()
            .replace("\"nf\"", "\"ns2\"")
            .into_bytes();
        assert!(matches!(
            handle(&cfg, None, Endpoint::Mutate, &other)
                .unwrap()
                .decision,
            Decision::Unchanged { .. }
        ));
    }

    #[test]
    fn a_profile_is_used_as_loaded_unless_the_pod_or_the_policy_changes_it() {
        let volumes = |policy: &str, annotation: &str| -> Value {
            let cfg = Config::parse(&format!(
                "profiles:\n  tmp: {{mountPath: /tmp, emptyDir: {{medium: Memory}}}}\n{policy}"
            ))
            .unwrap();
            let pod = json!({"metadata": {"annotations": {"ephemeral-volumes.io/t": annotation}},
                             "spec": {"containers": [{"name": "c"}]}});
            let request = body("Pod", "CREATE", pod);
            let h = handle(&cfg, None, Endpoint::Mutate, &request).unwrap();
            let out: Value = serde_json::from_slice(&h.body).unwrap();
            let patch = STANDARD
                .decode(out["response"]["patch"].as_str().unwrap())
                .unwrap();
            let patch: Value = serde_json::from_slice(&patch).unwrap();
            patch[0]["value"][0].clone()
        };
        let as_loaded = json!({"name": "t", "emptyDir": {"medium": "Memory"}});
        assert_eq!(volumes("", "tmp"), as_loaded);
        assert_eq!(
            volumes("", "profile=tmp,size=1Gi"),
            json!({"name": "t", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}})
        );
        assert_eq!(
            volumes(
                "policy: {requireSizeLimit: true, defaultSizeLimit: 2Gi}",
                "tmp"
            ),
            json!({"name": "t", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}})
        );
    }
}
