#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! The `serve` binary over real sockets and real TLS: HTTP/1.1 and h2, denials and
//! pass-through, bad requests, slow clients, certificate rotation in the kubelet's Secret
//! layout under load, configuration reload, SIGTERM with requests in flight, metrics.

mod common;
#[path = "common/server.rs"]
mod harness;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::body::Bytes;
use http_body_util::Full;
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use tokio::net::TcpStream;

use harness::*;

// === the tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nextflow_pod_is_patched_over_http1_and_h2() {
    let server = Server::start(&[], None, dir());
    for proto in [Proto::H1, Proto::H2] {
        let (pod, request) = nextflow_review("7f3e1c2a-0001-4000-8000-000000000001");
        let response = review(&server, proto, &request).await;
        assert_eq!(response["response"]["allowed"], true);
        let mutated = common::apply_response(&request, &response, &pod);
        assert_eq!(
            volume_names(&mutated),
            ["vol-1", "kube-api-access-x7k2p", "scratch", "shm"]
        );
        assert_eq!(
            mutated["metadata"]["annotations"]["injector.ephemeral-volumes.io/injected"],
            "scratch,shm"
        );
        let mounts = &mutated["spec"]["containers"][0]["volumeMounts"];
        assert_eq!(
            mounts[2],
            json!({"name": "scratch", "mountPath": "/scratch"})
        );
        serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(mutated).unwrap();
    }
    // One decision line per mutation, naming the pod and the volumes (written by a background
    // thread: wait for it).
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5)
        && server
            .logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l["message"] == "mutated")
            .count()
            < 2
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let logs = server.logs.lock().unwrap().clone();
    let decisions: Vec<&Value> = logs.iter().filter(|l| l["message"] == "mutated").collect();
    assert_eq!(decisions.len(), 2, "{logs:?}");
    assert_eq!(decisions[0]["volumes"], "scratch,shm");
    assert_eq!(decisions[0]["namespace"], "nf");
    // Over the real port: probes answer, and the serving certificate's expiry is exported.
    assert_eq!(
        server.admin_get("/readyz").await,
        (StatusCode::OK, "ready\n".to_owned())
    );
    assert!(
        server
            .metric("evi_certificate_not_after_timestamp_seconds")
            .await
            > 1.7e9
    );
    assert_eq!(
        server.metric("evi_admission_duration_seconds_count").await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_pass_through_and_dry_run() {
    let config = data("config.yaml");
    let server = Server::start(&["--config", config.to_str().unwrap()], None, dir());

    let pod = common::read_input("policy-denied");
    let request = common::review_for(&pod, "nf", "deny-1");
    let r = review(&server, Proto::H1, &request).await;
    assert_eq!(r["response"]["allowed"], false);
    assert_eq!(r["response"]["status"]["code"], 403);
    assert!(
        r["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("policy.storageClasses")
    );
    assert!(r["response"].get("patch").is_none());

    // The decision log names the pod, the reason and the message.
    let t = Instant::now();
    loop {
        let logs = server.logs.lock().unwrap().clone();
        if let Some(line) = logs.iter().find(|l| l["message"] == "denied") {
            assert_eq!(line["uid"], "deny-1");
            assert_eq!(line["pod"], "policy-denied");
            assert_eq!(line["reason"], "policy");
            assert!(
                line["denial"]
                    .as_str()
                    .unwrap()
                    .contains("policy.storageClasses")
            );
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no denied line in {logs:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Not a pod CREATE: allowed, untouched.
    let mut update = common::review_for(&common::read_input("nextflow-pod-mode"), "nf", "upd-1");
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["oldObject"] = update["request"]["object"].clone();
    let r = review(&server, Proto::H2, &update).await;
    assert_eq!(r["response"], json!({"uid": "upd-1", "allowed": true}));

    // dryRun behaves exactly like a real request.
    let (pod, mut request) = nextflow_review("dry-1");
    request["request"]["dryRun"] = json!(true);
    let r = review(&server, Proto::H1, &request).await;
    let mutated = common::apply_response(&request, &r, &pod);
    assert_eq!(volume_names(&mutated).len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_clients_are_cut_off() {
    let server = Server::start(&["--header-timeout-seconds", "1"], None, dir());
    // A TCP connection that never starts TLS.
    let mut idle = TcpStream::connect(server.webhook).await.unwrap();
    // A TLS connection that never sends a request.
    let tls = connector(&server.ca_pem, Proto::H1);
    let tcp = TcpStream::connect(server.webhook).await.unwrap();
    let mut silent = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let start = Instant::now();
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut buf))
        .await
        .unwrap();
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "idle TCP connection still open"
    );
    let n = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf))
        .await
        .unwrap();
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "silent TLS connection still open"
    );
    assert!(start.elapsed() < Duration::from_secs(8));
    // Meanwhile a normal client is served.
    let (_, request) = nextflow_review("after-idle");
    let r = review(&server, Proto::H1, &request).await;
    assert_eq!(r["response"]["allowed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotation_in_kubelet_layout_fails_no_request() {
    let ca = new_ca();
    let d = dir();
    let secret = d.path().join("tls");
    std::fs::create_dir_all(&secret).unwrap();
    let (c1, k1) = leaf(&ca, "generation-1");
    kubelet_write(&secret, 1, &c1, &k1);
    let cert = secret.join("tls.crt");
    let key = secret.join("tls.key");
    let server = Server::start(
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--reload-poll-seconds",
            "30",
        ],
        Some(ca.pem.clone()),
        d,
    );
    let first = CertificateDer::from_pem_slice(c1.as_bytes())
        .unwrap()
        .to_vec();

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut clients = Vec::new();
    for (i, proto) in [Proto::H1, Proto::H1, Proto::H2].into_iter().enumerate() {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        let tls = connector(&server.ca_pem, proto);
        let addr = server.webhook;
        clients.push(tokio::spawn(async move {
            let (_, request) = nextflow_review(&format!("rot-{i}"));
            let body = serde_json::to_vec(&request).unwrap();
            // Client 0 keeps one connection; the others reconnect for every request.
            let mut kept = if i == 0 {
                Some(connect(addr, &tls, proto).await.unwrap())
            } else {
                None
            };
            while !stop.load(Ordering::SeqCst) {
                let result = match kept.as_mut() {
                    Some(c) => c.send("POST", "/mutate", body.clone()).await,
                    None => match connect(addr, &tls, proto).await {
                        Ok(mut c) => c.send("POST", "/mutate", body.clone()).await,
                        Err(e) => Err(e),
                    },
                };
                match result {
                    Ok((StatusCode::OK, _)) => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok((s, b)) => failed
                        .lock()
                        .unwrap()
                        .push(format!("{s} {}", String::from_utf8_lossy(&b))),
                    Err(e) => failed.lock().unwrap().push(e),
                }
                if failed.lock().unwrap().len() > 100 {
                    return;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let tls = connector(&server.ca_pem, Proto::H1);
    for generation in 2..=3u32 {
        let (c, k) = leaf(&ca, &format!("generation-{generation}"));
        let expected = CertificateDer::from_pem_slice(c.as_bytes())
            .unwrap()
            .to_vec();
        let rotated_at = Instant::now();
        kubelet_write(&server._dir.path().join("tls"), generation, &c, &k);
        loop {
            let conn = connect(server.webhook, &tls, Proto::H1).await.unwrap();
            if conn.peer == expected {
                break;
            }
            assert_ne!(conn.peer.len(), 0);
            assert!(
                rotated_at.elapsed() < Duration::from_secs(3),
                "new certificate not served after 3 s; server logs: {:?}",
                server
                    .logs
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|l| l["message"] != "mutated")
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_ne!(expected, first);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    let failed = failed.lock().unwrap().clone();
    assert!(
        failed.is_empty(),
        "{} failed requests: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(
        ok.load(Ordering::SeqCst) > 20,
        "too few requests to mean anything"
    );
    assert_eq!(
        server
            .metric("evi_certificate_reloads_total{outcome=\"success\",reason=\"\"}")
            .await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_reload_takes_good_files_and_refuses_bad_ones() {
    let d = dir();
    let cfg = d.path().join("config.yaml");
    let profile = |path: &str| {
        format!("profiles:\n  tmp: {{mountPath: {path}, emptyDir: {{sizeLimit: 1Gi}}}}\n")
    };
    std::fs::write(&cfg, profile("/first")).unwrap();
    let server = Server::start(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--reload-poll-seconds",
            "30",
        ],
        None,
        d,
    );
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "nf", "annotations": {"ephemeral-volumes.io/tmp": "tmp"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    });
    async fn mount_path_of(server: &Server, pod: &Value) -> String {
        let request = common::review_for(pod, "nf", "cfg");
        let r = review(server, Proto::H1, &request).await;
        let m = common::apply_response(&request, &r, pod);
        m["spec"]["containers"][0]["volumeMounts"][0]["mountPath"]
            .as_str()
            .unwrap()
            .to_owned()
    }
    assert_eq!(mount_path_of(&server, &pod).await, "/first");

    std::fs::write(&cfg, profile("/second")).unwrap();
    let t = Instant::now();
    while mount_path_of(&server, &pod).await != "/second" {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "good configuration not picked up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The truncated moment of a plain rewrite is not "defaults".
    std::fs::write(&cfg, "").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        mount_path_of(&server, &pod).await,
        "/second",
        "an empty file was applied"
    );

    std::fs::write(
        &cfg,
        "profiles:\n  tmp: {mountPath: /third, emptyDir: {sizeLimt: 1Gi}}\n",
    )
    .unwrap();
    server
        .wait_metric(
            "evi_config_reloads_total{outcome=\"failure\",reason=\"invalid\"}",
            1.0,
            Duration::from_secs(3),
            "bad configuration not noticed",
        )
        .await;
    assert_eq!(
        mount_path_of(&server, &pod).await,
        "/second",
        "a bad file replaced a good one"
    );
    assert_eq!(
        server
            .metric("evi_config_reloads_total{outcome=\"success\",reason=\"\"}")
            .await,
        1.0
    );
    server
        .wait_log(
            |l| l["error"].as_str().is_some_and(|e| e.contains("sizeLimt")),
            Duration::from_secs(5),
            "the refusal names the problem",
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let server = Server::start(
        &[
            "--drain-delay-seconds",
            "1.5",
            "--grace-period-seconds",
            "10",
        ],
        None,
        dir(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut clients = Vec::new();
    for i in 0..4 {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        let proto = if i % 2 == 0 { Proto::H1 } else { Proto::H2 };
        let tls = connector(&server.ca_pem, proto);
        let addr = server.webhook;
        clients.push(tokio::spawn(async move {
            let (_, request) = nextflow_review(&format!("term-{i}"));
            let body = serde_json::to_vec(&request).unwrap();
            let mut conn = connect(addr, &tls, proto).await.unwrap();
            while !stop.load(Ordering::SeqCst) {
                match conn.send("POST", "/mutate", body.clone()).await {
                    Ok((StatusCode::OK, _)) => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok((s, _)) => failed.lock().unwrap().push(s.to_string()),
                    Err(e) => failed.lock().unwrap().push(e),
                }
                if failed.lock().unwrap().len() > 100 {
                    return;
                }
            }
        }));
    }
    // A request in flight across the whole drain: headers and half the body before SIGTERM,
    // the rest only after the drain delay, when the listener has stopped accepting.
    let (_, request) = nextflow_review("in-flight");
    let body = serde_json::to_vec(&request).unwrap();
    let tls = connector(&server.ca_pem, Proto::H1);
    let tcp = TcpStream::connect(server.webhook).await.unwrap();
    let mut slow = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(&body[..body.len() / 2]).await.unwrap();
    slow.flush().await.unwrap();

    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = ok.load(Ordering::SeqCst);
    server.signal("TERM");
    // Unready at once, while requests keep flowing during the drain delay.
    let t = Instant::now();
    loop {
        let (status, _) = server.admin_get("/readyz").await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "still ready after SIGTERM"
        );
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    // Past the drain delay: no new connection is taken, the one in flight is still served.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let refused = tokio::time::timeout(Duration::from_secs(2), async {
        let tcp = TcpStream::connect(server.webhook).await.ok()?;
        let mut s = connector(&server.ca_pem, Proto::H1)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .ok()?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut b = [0u8; 16];
        s.read(&mut b).await.ok().filter(|n| *n > 0)
    })
    .await;
    assert!(
        matches!(refused, Ok(None) | Err(_)),
        "a new connection was served after the drain delay"
    );
    slow.write_all(&body[body.len() / 2..]).await.unwrap();
    slow.flush().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut answer))
        .await
        .expect("the in-flight request got its answer")
        .ok();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("\"allowed\":true"),
        "the request in flight during the drain was not served: {answer:.200}"
    );
    let status = server.exit_status(Duration::from_secs(15)).await;
    let failed = failed.lock().unwrap().clone();
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(
        ok.load(Ordering::SeqCst) > before,
        "no requests were served during the drain"
    );
    assert!(status.success(), "exit status {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_newcomer_takes_a_place_without_a_request_waits_for_requests_or_is_closed() {
    let server = Server::start(
        &[
            "--max-connections",
            "2",
            "--header-timeout-seconds",
            "30",
            "--body-timeout-seconds",
            "2",
        ],
        None,
        dir(),
    );
    let tls = connector(&server.ca_pem, Proto::H1);
    let (_, request) = nextflow_review("limit");
    let body = serde_json::to_vec(&request).unwrap();
    // Two handshaken connections that have sent nothing: a third is served at once, in the
    // place of the oldest, which is closed.
    let mut first = connect(server.webhook, &tls, Proto::H1).await.unwrap();
    let _second = connect(server.webhook, &tls, Proto::H1).await.unwrap();
    let mut third = tokio::time::timeout(
        Duration::from_secs(3),
        connect(server.webhook, &tls, Proto::H1),
    )
    .await
    .expect("the newcomer waited")
    .unwrap();
    assert_eq!(
        third.send("POST", "/mutate", body.clone()).await.unwrap().0,
        StatusCode::OK
    );
    assert!(
        first.send("POST", "/mutate", body.clone()).await.is_err(),
        "the oldest connection without a request was not closed"
    );
    drop((first, _second, third));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Both places taken by requests from 127.0.0.2 whose bodies never come.
    let _held = [
        hold(&server, "h1-no-body").await.unwrap(),
        hold(&server, "h1-no-body").await.unwrap(),
    ];
    // (Once the webhook has read their headers: before, they are connections without a
    // request.) Another from that address is closed at once: it holds its share.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let tcp = tcp_from(HOLDER, server.webhook).await.unwrap();
    let refused = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await;
    assert!(refused.is_err(), "a third connection from the holder");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // One from elsewhere waits for the requests' bound (2 s), then is served.
    let mut waited = tokio::time::timeout(
        Duration::from_secs(10),
        connect(server.webhook, &tls, Proto::H1),
    )
    .await
    .expect("the newcomer from elsewhere was never served")
    .unwrap();
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(
        waited.send("POST", "/mutate", body).await.unwrap().0,
        StatusCode::OK
    );
    assert_eq!(server.admin_get("/readyz").await.0, StatusCode::OK);
    for (cause, at_least) in [("evicted", 1.0), ("refused", 1.0)] {
        let n = server
            .metric(&format!(
                "evi_connections_closed_total{{port=\"webhook\",cause=\"{cause}\"}}"
            ))
            .await;
        assert!(n >= at_least, "{cause}: {n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let server = Server::start(&["--drain-delay-seconds", "30"], None, dir());
    server.signal("TERM");
    let t = Instant::now();
    while server.admin_get("/readyz").await.0 != StatusCode::SERVICE_UNAVAILABLE {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "still ready after SIGTERM"
        );
    }
    // Draining for 30 s; a second signal does not wait for it.
    server.signal("INT");
    let logs = server.logs.clone();
    let status = server.exit_status(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(1));
    // Its last words are flushed before the exit.
    let t = Instant::now();
    while !logs
        .lock()
        .unwrap()
        .iter()
        .any(|l| l["message"] == "second signal: exiting now")
    {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the exit lost its log line"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Both signals at once (a user's Ctrl-C twice, or a TERM then a KILL-less INT): the second is
/// not lost while the first is being handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_signals_at_once_exit_at_once() {
    let server = Server::start(&["--drain-delay-seconds", "30"], None, dir());
    let t = Instant::now();
    while server.admin_get("/readyz").await.0 != StatusCode::OK {
        assert!(t.elapsed() < Duration::from_secs(10), "never ready");
    }
    server.signal("TERM");
    server.signal("INT");
    assert_eq!(
        server.exit_status(Duration::from_secs(10)).await.code(),
        Some(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_warn_admits_unchanged_with_a_warning_and_the_status_annotation() {
    let config = data("config-warn.yaml");
    let server = Server::start(&["--config", config.to_str().unwrap()], None, dir());
    let pod = common::read_input("invalid-annotation");
    let request = common::review_for(&pod, "nf", "warn-1");
    let r = review(&server, Proto::H1, &request).await;
    assert_eq!(r["response"]["allowed"], true);
    let warning = r["response"]["warnings"][0].as_str().unwrap();
    assert!(warning.starts_with("volumes not injected: "), "{warning}");
    let mutated = common::apply_response(&request, &r, &pod);
    assert!(mutated["spec"].get("volumes").is_none(), "no volume at all");
    let status = mutated["metadata"]["annotations"]["injector.ephemeral-volumes.io/error"]
        .as_str()
        .unwrap();
    assert!(status.contains("unknown field \"mountpath\""), "{status}");
    assert_eq!(
        server
            .metric("evi_denials_total{reason=\"admitted-on-error\"}")
            .await,
        1.0
    );
}

// === connections that make no progress ===

/// The address the holders come from (127.0.0.2); the normal client comes from 127.0.0.1, as
/// the API server comes from an address of its own.
const HOLDER: u8 = 2;

/// Opens a TLS connection (ALPN `proto`) and leaves it in one of the attack shapes.
async fn hold(
    server: &Server,
    shape: &'static str,
) -> Option<tokio_rustls::client::TlsStream<TcpStream>> {
    use tokio::io::AsyncWriteExt;
    let proto = if shape.starts_with("h2") {
        Proto::H2
    } else {
        Proto::H1
    };
    let tcp = tcp_from(HOLDER, server.webhook).await.ok()?;
    let mut tls = connector(&server.ca_pem, proto)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .ok()?;
    let head = "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n\r\n";
    match shape {
        // HTTP/2 chosen by ALPN, then no preface at all.
        "h2-no-preface" => {}
        // HTTP/1.1 headers, and a body that never comes, or comes a byte at a time.
        "h1-no-body" => tls.write_all(head.as_bytes()).await.ok()?,
        "h1-trickle" => {
            tls.write_all(head.as_bytes()).await.ok()?;
            tls.write_all(b"{").await.ok()?;
        }
        _ => unreachable!("{shape}"),
    }
    tls.flush().await.ok()?;
    Some(tls)
}

/// A request body that never sends a byte.
struct Never;

impl hyper::body::Body for Never {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

/// A request body that sends one byte every 300 ms, for ever.
struct Trickle(tokio::time::Interval);

impl hyper::body::Body for Trickle {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_tick(cx)
            .map(|_| Some(Ok(hyper::body::Frame::data(Bytes::from_static(b" ")))))
    }
}

/// An HTTP/2 connection to the webhook, ready for a request with a body of type `B`.
async fn h2_sender<B>(server: &Server) -> Option<hyper::client::conn::http2::SendRequest<B>>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tcp_from(HOLDER, server.webhook).await.ok()?;
    let tls = connector(&server.ca_pem, Proto::H2)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .ok()?;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .ok()?;
    tokio::spawn(conn);
    send.ready().await.ok()?;
    Some(send)
}

/// A POST to /mutate with this body.
fn mutate_request<B>(body: B) -> Option<Request<B>> {
    Request::post("/mutate")
        .header("content-type", "application/json")
        .body(body)
        .ok()
}

/// An HTTP/2 request whose body trickles a byte every 300 ms.
async fn hold_h2_trickle(server: &Server) -> Option<Box<dyn std::any::Any + Send>> {
    let mut send = h2_sender(server).await?;
    let req = mutate_request(Trickle(tokio::time::interval(Duration::from_millis(300))))?;
    Some(Box::new(tokio::spawn(send.send_request(req))))
}

/// An HTTP/2 connection holding its slot: a request whose body never comes, or (`idle`) one
/// answered request and then nothing but the answers to the server's pings (sent every
/// second here: half the lowered idle bound).
async fn hold_h2(server: &Server, idle: bool) -> Option<Box<dyn std::any::Any + Send>> {
    if idle {
        let mut send = h2_sender(server).await?;
        let (_, request) = nextflow_review("h2-idle");
        let body = Full::new(Bytes::from(serde_json::to_vec(&request).unwrap()));
        send.send_request(mutate_request(body)?).await.ok()?;
        return Some(Box::new(send));
    }
    let mut send = h2_sender(server).await?;
    let req = mutate_request(Never)?;
    Some(Box::new(tokio::spawn(send.send_request(req))))
}

/// Whether a normal client is served within the API server's webhook timeout.
async fn served_within(server: &Server, within: Duration) -> bool {
    let (_, request) = nextflow_review("normal");
    tokio::time::timeout(within, async {
        let tls = connector(&server.ca_pem, Proto::H1);
        let mut conn = connect(server.webhook, &tls, Proto::H1).await.ok()?;
        let (status, _) = conn
            .send("POST", "/mutate", serde_json::to_vec(&request).unwrap())
            .await
            .ok()?;
        (status == StatusCode::OK).then_some(())
    })
    .await
    .is_ok_and(|r| r.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_make_no_progress_are_cut_and_the_webhook_recovers() {
    let cap = 256;
    let server = Server::start(
        &[
            "--max-connections",
            "256",
            "--max-connections-per-peer",
            "256",
            "--header-timeout-seconds",
            "1",
            "--body-timeout-seconds",
            "2",
            "--h2-idle-timeout-seconds",
            "2",
            "--idle-timeout-seconds",
            "2",
        ],
        None,
        dir(),
    );
    for shape in [
        "h2-no-preface",
        "h1-no-body",
        "h1-trickle",
        "h2-no-body",
        "h2-trickle",
        "h2-idle",
    ] {
        // Fill every slot with this shape.
        let mut held: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
        for _ in 0..cap {
            let h: Option<Box<dyn std::any::Any + Send>> = match shape {
                "h2-no-body" => hold_h2(&server, false).await,
                "h2-idle" => hold_h2(&server, true).await,
                "h2-trickle" => hold_h2_trickle(&server).await,
                _ => hold(&server, shape)
                    .await
                    .map(|t| Box::new(t) as Box<dyn std::any::Any + Send>),
            };
            if let Some(h) = h {
                held.push(h);
            }
        }
        // (Once the webhook has read what the holders sent: before, a holder whose headers
        // are not read yet is a connection without a request, and makes room.)
        tokio::time::sleep(Duration::from_millis(300)).await;
        // During the attack, from another address: a normal client is answered within the
        // API server's timeout (10 s by default), in the place of a holder that is not in a
        // request, or once the bounds cut those that are; the replica stays ready.
        assert_eq!(
            server.admin_get("/readyz").await.0,
            StatusCode::OK,
            "{shape}: holders made the replica unready"
        );
        assert!(
            served_within(&server, Duration::from_secs(10)).await,
            "{shape}: not served within 10 s"
        );
        // After the bounds, fully available again, and the cuts are counted by cause.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            served_within(&server, Duration::from_secs(2)).await,
            "{shape}: not available after the bounds"
        );
        assert_eq!(
            server.admin_get("/readyz").await.0,
            StatusCode::OK,
            "{shape}"
        );
        drop(held);
    }
    let metric = |cause: &'static str| {
        let server = &server;
        async move {
            server
                .metric(&format!(
                    "evi_connections_closed_total{{port=\"webhook\",cause=\"{cause}\"}}"
                ))
                .await
        }
    };
    // All but the one each normal client took the place of (closed: evicted).
    assert!(
        metric("header-timeout").await >= 255.0,
        "no preface: cut at the header bound"
    );
    assert!(
        metric("idle").await >= 255.0,
        "idle HTTP/2: cut at the idle bound"
    );
    assert!(
        metric("evicted").await >= 2.0,
        "room made for the normal client"
    );
    assert!(
        server
            .metric("evi_http_responses_total{port=\"webhook\",code=\"408\"}")
            .await
            >= 4.0 * 256.0,
        "bodies never sent or trickled (HTTP/1.1 and HTTP/2): 408"
    );
    // Holders in requests: the normal client waited for them (counted), never refused.
    assert!(
        server
            .metric("evi_connections_at_capacity_total{port=\"webhook\"}")
            .await
            >= 1.0
    );
    assert_eq!(metric("refused").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_limit_body_is_refused_before_it_is_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(&["--max-body-bytes", "1000"], None, dir());
    let tcp = TcpStream::connect(server.webhook).await.unwrap();
    let mut tls = connector(&server.ca_pem, Proto::H1)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\nexpect: 100-continue\r\ncontent-length: 5000000\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(2), tls.read(&mut buf))
        .await
        .expect("an answer at once, without the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert!(
        answer.contains("application/json") && answer.contains("\"error\""),
        "{answer}"
    );
    // Every non-2xx is JSON and counted by code.
    let tls_h1 = connector(&server.ca_pem, Proto::H1);
    let mut conn = connect(server.webhook, &tls_h1, Proto::H1).await.unwrap();
    let (status, body) = conn.send("GET", "/mutate", Vec::new()).await.unwrap();
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(serde_json::from_slice::<Value>(&body).unwrap()["error"].is_string());
    for code in ["413", "405"] {
        assert_eq!(
            server
                .metric(&format!(
                    "evi_http_responses_total{{port=\"webhook\",code=\"{code}\"}}"
                ))
                .await,
            1.0,
            "{code}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_has_its_own_cap_and_timeouts() {
    use tokio::io::AsyncWriteExt;
    let server = Server::start(
        &[
            "--admin-max-connections",
            "8",
            "--admin-header-timeout-seconds",
            "1",
            "--admin-idle-timeout-seconds",
            "1",
        ],
        None,
        dir(),
    );
    // Holders: silent, and byte-by-byte.
    let mut held = Vec::new();
    for i in 0..8 {
        let mut tcp = TcpStream::connect(server.admin).await.unwrap();
        if i % 2 == 1 {
            tcp.write_all(b"GET /heal").await.unwrap();
        }
        held.push(tcp);
    }
    // The webhook port is untouched by the admin port's cap.
    assert!(served_within(&server, Duration::from_secs(2)).await);
    // After the bounds, the admin port answers again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, _) = tokio::time::timeout(Duration::from_secs(3), server.admin_get("/healthz"))
        .await
        .expect("the admin port answers after its bounds");
    assert_eq!(status, StatusCode::OK);
    assert!(
        server
            .metric("evi_connections_closed_total{port=\"admin\",cause=\"header-timeout\"}")
            .await
            >= 8.0
    );
    // Unknown admin paths are JSON too.
    let (status, body) = server.admin_get("/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("\"error\""), "{body}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatched_key_swapped_in_the_kubelet_layout_is_a_counted_failure() {
    let ca = new_ca();
    let dir = dir();
    let (cert, key) = leaf(&ca, "localhost");
    kubelet_write(dir.path(), 1, &cert, &key);
    let server = Server::start(
        &[
            "--tls-cert",
            dir.path().join("tls.crt").to_str().unwrap(),
            "--tls-key",
            dir.path().join("tls.key").to_str().unwrap(),
            "--reload-poll-seconds",
            "0.2",
        ],
        Some(ca.pem.clone()),
        tempfile::tempdir().unwrap(),
    );
    // One atomic swap to a valid certificate with another certificate's key.
    let (cert2, _) = leaf(&ca, "localhost");
    let (_, key3) = leaf(&ca, "localhost");
    kubelet_write(dir.path(), 2, &cert2, &key3);
    server
        .wait_metric(
            "evi_certificate_reloads_total{outcome=\"failure\",reason=\"key-mismatch\"}",
            1.0,
            Duration::from_secs(5),
            "the mismatched key was not counted",
        )
        .await;
    server
        .wait_log(
            |l| l["level"] == "ERROR" && l["reason"] == "key-mismatch",
            Duration::from_secs(5),
            "the log says why",
        )
        .await;
    // The old certificate is still served.
    let (_, request) = nextflow_review("after-mismatch");
    assert_eq!(
        review(&server, Proto::H1, &request).await["response"]["allowed"],
        true
    );
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_lives_for_the_idle_bound_not_hypers_30_s() {
    // The API server reuses its connections (Go closes idle ones after 90 s): the webhook must
    // not close them first. hyper's own header timer would, after 30 s.
    let server = Server::start(&["--idle-timeout-seconds", "60"], None, dir());
    let tls = connector(&server.ca_pem, Proto::H1);
    let mut conn = connect(server.webhook, &tls, Proto::H1).await.unwrap();
    let (_, request) = nextflow_review("idle-1");
    let body = serde_json::to_vec(&request).unwrap();
    assert_eq!(
        conn.send("POST", "/mutate", body.clone()).await.unwrap().0,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_secs(32)).await;
    let again = conn.send("POST", "/mutate", body).await;
    assert_eq!(
        again.map(|r| r.0),
        Ok(StatusCode::OK),
        "the keep-alive connection was closed while idle"
    );
    assert_eq!(
        server
            .metric("evi_connections_closed_total{port=\"webhook\",cause=\"idle\"}")
            .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_at_the_cap_make_room_and_the_replica_stays_ready() {
    // Eight slots: six idle keep-alive connections (one request each, then nothing) and two
    // slow ones (handshaken, no request): the slots any pod that reaches the port can take.
    let server = Server::start(
        &["--max-connections", "8", "--header-timeout-seconds", "20"],
        None,
        dir(),
    );
    let (_, request) = nextflow_review("idle-holder");
    let body = serde_json::to_vec(&request).unwrap();
    let tls = connector(&server.ca_pem, Proto::H1);
    let mut held = Vec::new();
    for _ in 0..6 {
        let mut idle = connect(server.webhook, &tls, Proto::H1).await.unwrap();
        let (status, _) = idle.send("POST", "/mutate", body.clone()).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        held.push(idle);
    }
    let mut slow = Vec::new();
    for _ in 0..2 {
        slow.push(connect(server.webhook, &tls, Proto::H1).await.unwrap());
    }
    assert_eq!(server.admin_get("/readyz").await.0, StatusCode::OK);
    // Past the cap, over and over: each newcomer is served at once, in an idle one's place,
    // and the replica never reports itself at its cap.
    for i in 0..10 {
        let (_, request) = nextflow_review(&format!("newcomer-{i}"));
        let t = Instant::now();
        let mut fresh = tokio::time::timeout(
            Duration::from_secs(3),
            connect(server.webhook, &tls, Proto::H1),
        )
        .await
        .expect("a newcomer waited at the cap")
        .unwrap();
        let (status, _) = fresh
            .send("POST", "/mutate", serde_json::to_vec(&request).unwrap())
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert_eq!(server.admin_get("/readyz").await.0, StatusCode::OK);
        held.push(fresh);
    }
    assert!(
        server
            .metric("evi_connections_closed_total{port=\"webhook\",cause=\"evicted\"}")
            .await
            >= 10.0
    );
    // An idle connection was always there to make room: never at the cap.
    assert_eq!(
        server
            .metric("evi_connections_at_capacity_total{port=\"webhook\"}")
            .await,
        0.0
    );
    drop(held);
    drop(slow);
}

/// What a connection accepted and handshaken before SIGTERM got for its first request.
async fn first_request_after_signal(server: &Server, count: usize) -> Vec<Result<String, String>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_, request) = nextflow_review("after-signal");
    let body = serde_json::to_vec(&request).unwrap();
    let tls = connector(&server.ca_pem, Proto::H1);
    let mut streams = Vec::new();
    for _ in 0..count {
        let tcp = TcpStream::connect(server.webhook).await.unwrap();
        streams.push(
            tls.connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .unwrap(),
        );
    }
    server.signal("TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut answers = Vec::new();
    for mut s in streams {
        let head = format!(
            "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let sent = async {
            s.write_all(head.as_bytes()).await?;
            s.write_all(&body).await?;
            s.flush().await?;
            let mut answer = Vec::new();
            s.read_to_end(&mut answer).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
        };
        answers.push(
            match tokio::time::timeout(Duration::from_secs(5), sent).await {
                Ok(Ok(a)) if a.is_empty() => Err("EOF".to_owned()),
                Ok(Ok(a)) => Ok(a),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("no answer within 5 s".to_owned()),
            },
        );
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_without_a_drain_delay_answers_every_accepted_connections_first_request() {
    let server = Server::start(&["--drain-delay-seconds", "0"], None, dir());
    let answers = first_request_after_signal(&server, 6).await;
    for a in &answers {
        let a = a.as_ref().expect("an accepted connection's request failed");
        assert!(a.starts_with("HTTP/1.1 200"), "{a:.200}");
        assert!(
            a.to_ascii_lowercase().contains("connection: close"),
            "{a:.300}"
        );
    }
    assert!(server.exit_status(Duration::from_secs(15)).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_stops_under_load_fail_no_request_on_a_handshaken_connection() {
    for stop in 0..20 {
        let server = Server::start(&["--drain-delay-seconds", "0"], None, dir());
        let done = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut clients = Vec::new();
        for i in 0..3 {
            let (done, failed) = (done.clone(), failed.clone());
            let tls = connector(&server.ca_pem, Proto::H1);
            let addr = server.webhook;
            clients.push(tokio::spawn(async move {
                let (_, request) = nextflow_review(&format!("stop-{stop}-{i}"));
                let body = serde_json::to_vec(&request).unwrap();
                while !done.load(Ordering::SeqCst) {
                    // A new connection each time: one refused or reset before its handshake
                    // completed was never the server's; one handshaken must be answered.
                    let Ok(mut conn) = connect(addr, &tls, Proto::H1).await else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    match conn.send("POST", "/mutate", body.clone()).await {
                        Ok((StatusCode::OK, _)) => {}
                        Ok((s, _)) => failed.lock().unwrap().push(s.to_string()),
                        Err(e) => failed.lock().unwrap().push(e),
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        server.signal("TERM");
        let status = server.exit_status(Duration::from_secs(15)).await;
        done.store(true, Ordering::SeqCst);
        for c in clients {
            c.await.unwrap();
        }
        assert!(status.success(), "stop {stop}: exit status {status}");
        let failed = failed.lock().unwrap().clone();
        assert!(
            failed.is_empty(),
            "stop {stop}: {} failed: {:?}",
            failed.len(),
            &failed[..failed.len().min(3)]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_can_neither_forge_nor_flood_a_line_of_the_text_log() {
    let server = Server::start(&["--log-format", "text"], None, dir());
    let (mut pod, _) = nextflow_review("forge");
    let forged = "2026-12-04T00:00:00.000000Z  INFO forged: admitted";
    // Nextflow's Job mode: no name, only generateName, which the decision line shows.
    pod["metadata"].as_object_mut().unwrap().remove("name");
    pod["metadata"]["generateName"] =
        json!(format!("nf-\n{forged}\u{1b}[31m{}", "x".repeat(100_000)));
    let request = common::review_for(&pod, "nf", "forge-uid");
    review(&server, Proto::H1, &request).await;
    server
        .wait_log(
            |l| l["raw"].as_str().is_some_and(|r| r.contains("forge-uid")),
            Duration::from_secs(5),
            "the decision line",
        )
        .await;
    let lines: Vec<String> = server
        .logs
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| l["raw"].as_str().map(str::to_owned))
        .collect();
    assert!(
        !lines.iter().any(|l| l.starts_with(forged)),
        "a forged line: {lines:?}"
    );
    let decision = lines.iter().find(|l| l.contains("forge-uid")).unwrap();
    assert!(decision.contains("nf-\\n2026-12-04"), "{decision:.300}");
    assert!(!decision.contains('\u{1b}'), "{decision:.300}");
    assert!(decision.len() < 2048, "{} bytes", decision.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_ordinary_reviews_are_answered_under_a_flood_of_the_largest_reviews() {
    let server = Server::start(&[], None, dir());
    // The largest review of the costliest shape the API server can send: a pod of ~200,000
    // minimal containers asking for a volume (refused by the patch bound, after the decode).
    let containers: Vec<Value> = (0..200_000)
        .map(|i| json!({"name": format!("c{i}")}))
        .collect();
    let (mut big, _) = nextflow_review("big");
    big["spec"]["containers"] = Value::Array(containers);
    let body = serde_json::to_vec(&common::review_for(&big, "nf", "big")).unwrap();
    assert!(body.len() > 3 << 20, "{}", body.len());
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for _ in 0..4 {
        let (stop, answered, body) = (stop.clone(), answered.clone(), body.clone());
        let tls = connector(&server.ca_pem, Proto::H1);
        let addr = server.webhook;
        senders.push(tokio::spawn(async move {
            let mut conn = connect(addr, &tls, Proto::H1).await.unwrap();
            while !stop.load(Ordering::SeqCst) {
                let (status, _) = conn.send("POST", "/mutate", body.clone()).await.unwrap();
                assert_eq!(status, StatusCode::OK);
                answered.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    // Probes as the kubelet sends them (a 1 s timeout each), and an ordinary review on a
    // connection of its own, while the big ones keep coming.
    let t = Instant::now();
    let mut probes = 0;
    while t.elapsed() < Duration::from_secs(6) {
        for path in ["/healthz", "/readyz"] {
            let (status, _) = tokio::time::timeout(Duration::from_secs(1), server.admin_get(path))
                .await
                .unwrap_or_else(|_| panic!("{path} took over the kubelet's 1 s timeout"));
            assert_eq!(status, StatusCode::OK, "{path}");
            probes += 1;
        }
        assert!(
            served_within(&server, Duration::from_secs(10)).await,
            "an ordinary review waited past the API server's timeout"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for s in senders {
        s.await.unwrap();
    }
    assert!(
        answered.load(Ordering::SeqCst) >= 4,
        "the large reviews were not being served"
    );
    assert!(probes > 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connections_streams_share_its_body_allowance_and_wait_only_for_it() {
    use http_body_util::Either;
    let server = Server::start(&["--body-timeout-seconds", "3"], None, dir());
    let mut send = h2_sender::<Either<Never, Full<Bytes>>>(&server)
        .await
        .unwrap();
    // A stream whose body, of unknown length, never comes: it holds its connection's whole
    // allowance for bodies (64 KiB) until the body bound cuts it.
    let held = tokio::spawn(send.send_request(mutate_request(Either::Left(Never)).unwrap()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // An ordinary review on the same connection waits for that allowance...
    let (_, request) = nextflow_review("same-connection");
    let body = serde_json::to_vec(&request).unwrap();
    let mut same = mutate_request(Either::Right(Full::new(Bytes::from(body.clone())))).unwrap();
    same.headers_mut()
        .insert(hyper::header::CONTENT_LENGTH, body.len().into());
    let same = tokio::spawn(send.send_request(same));
    // ... while one on another connection is answered: a client makes only its own
    // connection's streams wait.
    assert!(served_within(&server, Duration::from_secs(2)).await);
    assert!(
        !same.is_finished(),
        "the same connection's stream was answered while its allowance was held"
    );
    // Once the held stream is cut at the body bound (408), the waiting one is answered.
    let held = held.await.unwrap().unwrap();
    assert_eq!(held.status(), StatusCode::REQUEST_TIMEOUT);
    let same = same.await.unwrap().unwrap();
    assert_eq!(same.status(), StatusCode::OK);
}
