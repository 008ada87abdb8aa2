//! The AdmissionReview codec: bytes in, bytes out, with the engine in between.
//!
//! Field names and semantics are kube-core's (`kube_core::admission`); the request is decoded
//! as a narrow borrowed view (the pod is decoded only for Pod CREATE), and the response is
//! written by hand because kube-core serialises `patch` as an array of numbers, which the API
//! server refuses (kube-rs issue 1781): the wire format is a standard-base64 string.

use std::borrow::Cow;

use base64::{Engine as _, engine::general_purpose::STANDARD};
use kube_core::admission::Operation;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{
    cluster::Known,
    config::Config,
    decision::Decision,
    engine::{self, PodLocation},
    pod::{PodView, Str},
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
    object: Option<O>,

    dry_run: Option<bool>,
}

#[derive(Deserialize)]
struct Gvk<'a> {
    #[serde(borrow, default)]
    group: &'a str,
    #[serde(borrow)]
    kind: &'a str,
}

#[derive(Serialize)]
struct StatusOut<'a> {
    status: &'static str,
    code: u16,
    reason: &'static str,
    message: &'a str,
}

/// The response and what the decision log and metrics need, borrowing from the request body.
#[derive(Debug, Clone)]
pub struct Handled<'a> {
    /// The AdmissionReview to send back.
    pub body: Vec<u8>,
    /// What was decided ([`Decision::Unchanged`] for anything but a Pod CREATE).
    pub decision: Decision,
    /// The request's uid.
    pub uid: &'a str,
    /// The request's namespace.
    pub namespace: Cow<'a, str>,
    /// The pod's name, or its `generateName` with a `*`; empty when it is not a pod.
    pub pod: Cow<'a, str>,
    /// A server-side dry run.
    pub dry_run: bool,
}

/// Decodes a review, decides, and encodes the response.
pub fn handle<'a>(cfg: &Config, body: &'a [u8]) -> Result<Handled<'a>, ReviewError> {
    handle_in(cfg, None, body)
}

/// [`handle`], with the cluster checks against what is known of the cluster.
pub fn handle_in<'a>(
    cfg: &Config,
    cluster: Option<Known<'_>>,
    body: &'a [u8],
) -> Result<Handled<'a>, ReviewError> {
    // JSON is UTF-8 (RFC 8259): the body is checked once, whole, so the parser need not check
    // every string it reads (or every raw value it keeps) again.
    let text = std::str::from_utf8(body).map_err(ReviewError::NotUtf8)?;
    // One pass: the object is decoded as a narrow pod view while the envelope is read. Should
    // it not fit that view (it is not a pod), read it again keeping the object raw.
    match serde_json::from_str::<ReviewIn<'_, PodView<'_>>>(text) {
        Ok(review) => decide(cfg, cluster, review),
        Err(pod_error) => {
            let review: ReviewIn<'_, &RawValue> =
                serde_json::from_str(text).map_err(ReviewError::Malformed)?;
            let req = review.request.as_ref().ok_or(ReviewError::NoRequest)?;
            if is_pod_create(req) {
                return Err(ReviewError::Malformed(pod_error));
            }
            decide(
                cfg,
                cluster,
                ReviewIn::<PodView<'_>> {
                    api_version: review.api_version,
                    kind: review.kind,
                    request: review.request.map(|r| RequestIn {
                        uid: r.uid,
                        kind: r.kind,
                        operation: r.operation,
                        sub_resource: r.sub_resource,
                        namespace: r.namespace,
                        object: None,
                        dry_run: r.dry_run,
                    }),
                },
            )
        }
    }
}

fn is_pod_create<O>(req: &RequestIn<'_, O>) -> bool {
    req.kind.group.is_empty()
        && req.kind.kind == "Pod"
        && req.operation == Operation::Create
        && req.sub_resource.is_none_or(str::is_empty)
}

fn decide<'a>(
    cfg: &Config,
    cluster: Option<Known<'_>>,
    review: ReviewIn<'a, PodView<'a>>,
) -> Result<Handled<'a>, ReviewError> {
    let mut req = review.request.ok_or(ReviewError::NoRequest)?;
    let namespace = req.namespace.take().map_or(Cow::Borrowed(""), |n| n.0);
    let (pod, decision) = match (is_pod_create(&req), &req.object) {
        (true, Some(pod)) => (
            pod.display_name(),
            engine::decide(
                cfg,
                cluster,
                pod,
                PodLocation {
                    namespace: &namespace,
                    pointer: "",
                },
            ),
        ),
        _ => (
            Cow::Borrowed(""),
            Decision::Unchanged {
                warnings: Vec::new(),
            },
        ),
    };
    Ok(Handled {
        body: encode(review.api_version, review.kind, req.uid, &decision)?,
        decision,
        uid: req.uid,
        namespace,
        pod,
        dry_run: req.dry_run.unwrap_or(false),
    })
}

/// Writes the response envelope by hand so the base64 patch goes straight into the output
/// (serde would scan every byte of it for characters to escape, and there are none).
fn encode(
    api_version: &str,
    kind: &str,
    uid: &str,
    decision: &Decision,
) -> Result<Vec<u8>, ReviewError> {
    let allowed = decision.allowed();
    let patch = decision.patch().map(|p| p.as_bytes());
    let mut out = Vec::with_capacity(256 + patch.map_or(0, |p| p.len() * 4 / 3 + 4));
    out.extend_from_slice(b"{\"apiVersion\":");
    json(&mut out, &api_version)?;
    out.extend_from_slice(b",\"kind\":");
    json(&mut out, &kind)?;
    out.extend_from_slice(b",\"response\":{\"uid\":");
    json(&mut out, &uid)?;
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
        let start = out.len();
        out.resize(start + base64::encoded_len(p.len(), true).unwrap_or(0), 0);
        let written = STANDARD
            .encode_slice(p, &mut out[start..])
            .map_err(|e| ReviewError::Serialize(serde::ser::Error::custom(e)))?;
        out.truncate(start + written);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decision::{Denial, DenyReason},
        volume::VolumeKind,
    };
    use serde_json::{Value, json};

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
            &encode("admission.k8s.io/v1", "AdmissionReview", "u\"1", &outcome).unwrap(),
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
        let out: Value = serde_json::from_slice(&encode("v", "k", "u", &warned).unwrap()).unwrap();
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
        let h = handle(&cfg, &request).unwrap();
        assert!(matches!(h.decision, Decision::Mutated { .. }));
        for (kind, op) in [
            ("Pod", "UPDATE"),
            ("Pod", "DELETE"),
            ("ConfigMap", "CREATE"),
        ] {
            let request = body(kind, op, pod.clone());
            let h = handle(&cfg, &request).unwrap();
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
        let h = handle(&cfg, &request).unwrap();
        assert!(matches!(h.decision, Decision::Unchanged { .. }));
        assert!(matches!(
            handle(&cfg, &body("Pod", "CREATE", odd)),
            Err(ReviewError::Malformed(_))
        ));
    }

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        let cfg = Config::default();
        assert!(matches!(handle(&cfg, b"{"), Err(ReviewError::Malformed(_))));
        assert!(matches!(
            handle(&cfg, b"[]"),
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
        let err = handle(&cfg, &bad).unwrap_err();
        assert!(matches!(err, ReviewError::NotUtf8(_)));
        assert!(
            err.to_string().starts_with("the body is not UTF-8"),
            "{err}"
        );
        assert!(matches!(
            handle(
                &cfg,
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
        let h = handle(&cfg, &request).unwrap();
        assert!(matches!(h.decision, Decision::Mutated { .. }));
        assert_eq!(
            h.decision.injected(),
            [("tmp".to_owned(), VolumeKind::EmptyDir)]
        );
        let request = body("Pod", "CREATE", pod(json!({"app": 1})));
        let h = handle(&cfg, &request).unwrap();
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
            handle(&cfg, &other).unwrap().decision,
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
            let h = handle(&cfg, &request).unwrap();
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
