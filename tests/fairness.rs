#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! No client decides whether the webhook is up: the attacks a tenant who can only run pods
//! can make on the ports, alone and together, from several source addresses on loopback
//! (`127.0.0.2` …, as pods would come from several IPs), against one `serve` with the chart's
//! connection flags, while a client that behaves like the API server (one HTTP/2 connection)
//! is answered within 1 s (a new connection now and then within its 10 s) and the kubelet's probes
//! (`/readyz`, `/healthz`, each on a new connection as the kubelet makes them) answer 200
//! within 1 s (the probes' own timeout) throughout.

mod common;
#[path = "common/server.rs"]
mod harness;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::{io::AsyncReadExt, io::AsyncWriteExt, net::TcpStream, task::JoinSet};

use harness::*;

/// The connection flags the chart gives the webhook, read from its values.
fn chart_flags() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/ephemeral-volume-injector/values.yaml"
    );
    let values: Value = yaml_serde::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let server = &values["server"];
    [
        ("--max-connections", "maxConnections"),
        ("--max-connections-per-peer", "maxConnectionsPerPeer"),
        ("--admin-max-connections", "adminMaxConnections"),
        (
            "--admin-max-connections-per-peer",
            "adminMaxConnectionsPerPeer",
        ),
        ("--header-timeout-seconds", "headerTimeoutSeconds"),
        ("--body-timeout-seconds", "bodyTimeoutSeconds"),
        ("--idle-timeout-seconds", "idleTimeoutSeconds"),
        ("--h2-idle-timeout-seconds", "h2IdleTimeoutSeconds"),
        (
            "--admin-header-timeout-seconds",
            "adminHeaderTimeoutSeconds",
        ),
        ("--admin-idle-timeout-seconds", "adminIdleTimeoutSeconds"),
        ("--max-body-bytes", "maxBodyBytes"),
        ("--max-inflight-body-bytes", "maxInflightBodyBytes"),
    ]
    .into_iter()
    .map(|(flag, key)| {
        let value = &server[key];
        assert!(!value.is_null(), "the chart has no server.{key}");
        format!("{flag}={value}")
    })
    .collect()
}

/// The attackers' addresses: 127.0.0.2 to 127.0.0.10.
const ATTACKERS: std::ops::RangeInclusive<u8> = 2..=10;

fn attacker(i: usize) -> u8 {
    let n = ATTACKERS.len();
    ATTACKERS.start() + u8::try_from(i % n).unwrap()
}

/// An HTTP/1.1 GET on a new plain connection (the kubelet's probes), within `within`.
async fn probe(addr: SocketAddr, path: &str, within: Duration) -> Result<(), String> {
    let get = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = Request::get(path)
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        if status == StatusCode::OK {
            Ok(())
        } else {
            Err(format!(
                "{status}: {}",
                String::from_utf8_lossy(&body.to_bytes())
            ))
        }
    };
    tokio::time::timeout(within, get)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {within:?}")))
}

/// A review answered 200 and allowed.
async fn reviewed(conn: &mut Conn, uid: &str) -> Result<(), String> {
    let (_, request) = nextflow_review(uid);
    let (status, body) = conn
        .send("POST", "/mutate", serde_json::to_vec(&request).unwrap())
        .await?;
    let answer: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    if status == StatusCode::OK && answer["response"]["allowed"] == true {
        Ok(())
    } else {
        Err(format!("{status}: {answer}"))
    }
}

/// What the API server and the kubelet saw while the attacks ran.
#[derive(Default)]
struct Seen {
    failures: Vec<String>,
    reviews: usize,
    probes: usize,
}

/// The well-behaved clients, every 200 ms until `stop`: a review on the API server's one
/// HTTP/2 connection (from 127.0.0.1), `/readyz` and `/healthz` on new connections, each
/// within 1 s; and every fourth round a review on a new HTTP/2 connection (an API server
/// that reconnects, or a second one), within the API server's default timeout of 10 s.
async fn well_behaved(
    server: Arc<(SocketAddr, SocketAddr, String)>,
    phase: Arc<Mutex<&'static str>>,
    seen: Arc<Mutex<Seen>>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let (webhook, admin, ca) = &*server;
    let within = Duration::from_secs(1);
    let tls = connector(ca, Proto::H2);
    let mut api = tokio::time::timeout(within, connect(*webhook, &tls, Proto::H2))
        .await
        .expect("the API server's connection")
        .expect("the API server's connection");
    let fail = |what: String| {
        let phase = *phase.lock().unwrap();
        seen.lock()
            .unwrap()
            .failures
            .push(format!("{phase}: {what}"));
    };
    for round in 0usize.. {
        if *stop.borrow() {
            return;
        }
        let started = Instant::now();
        match tokio::time::timeout(within, reviewed(&mut api, &format!("api-{round}"))).await {
            Ok(Ok(())) => seen.lock().unwrap().reviews += 1,
            Ok(Err(e)) => {
                fail(format!("the API server's connection: {e}"));
                // Reconnect, as the API server would, and go on.
                if let Ok(Ok(c)) =
                    tokio::time::timeout(within, connect(*webhook, &tls, Proto::H2)).await
                {
                    api = c;
                }
            }
            Err(_) => fail("the API server's connection: no answer within 1 s".into()),
        }
        for path in ["/readyz", "/healthz"] {
            match probe(*admin, path, within).await {
                Ok(()) => seen.lock().unwrap().probes += 1,
                Err(e) => fail(format!("{path}: {e}")),
            }
        }
        if round % 4 == 0 {
            let fresh = async {
                let mut c = connect(*webhook, &tls, Proto::H2).await?;
                reviewed(&mut c, &format!("fresh-{round}")).await
            };
            // Within the API server's own default webhook timeout: a new connection waits
            // in the accept queue behind the attackers' newcomers, each looked at in turn
            // (in a debug build, on two cores shared with this test's attackers).
            match tokio::time::timeout(Duration::from_secs(10), fresh).await {
                Ok(Ok(())) => seen.lock().unwrap().reviews += 1,
                Ok(Err(e)) => fail(format!("a new connection: {e}")),
                Err(_) => fail("a new connection: no answer within 10 s".into()),
            }
        }
        tokio::time::sleep(Duration::from_millis(200).saturating_sub(started.elapsed())).await;
    }
}

/// `count` TLS connections from the attackers' addresses that each send one ordinary review
/// and then sit idle, held until dropped: the burst that unreadied a replica for two minutes.
/// Each sends its review's headers and half its body as soon as it is handshaken, the rest
/// when the burst is in (all but the few that could not get in hold a request at the moment
/// the port fills: the moment the cap used to be checked, and never again), then idles.
/// Sixteen handshakes at a time: the burst takes a second or two (the hold, not the rate, is
/// the attack; this test's own client side of the handshakes shares the two cores).
async fn idle_reviewers(
    server: &Server,
    count: usize,
    sources: &[u8],
) -> Vec<tokio_rustls::client::TlsStream<TcpStream>> {
    let (_, request) = nextflow_review("idle");
    let body = serde_json::to_vec(&request).unwrap();
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let (half, rest) = body.split_at(body.len() / 2);
    let head = Arc::new([head.as_bytes(), half].concat());
    let rest = Arc::new(rest.to_vec());
    let pace = Arc::new(tokio::sync::Semaphore::new(16));
    let (release, released) = tokio::sync::watch::channel(false);
    let (in_tx, mut in_rx) = tokio::sync::mpsc::unbounded_channel::<bool>();
    let mut set = JoinSet::new();
    for i in 0..count {
        let src = sources[i % sources.len()];
        let (webhook, tls) = (server.webhook, connector(&server.ca_pem, Proto::H1));
        let (pace, head, rest, in_tx) = (pace.clone(), head.clone(), rest.clone(), in_tx.clone());
        let mut released = released.clone();
        set.spawn(async move {
            let got_in = async {
                let _pace = pace.acquire_owned().await.ok()?;
                let tcp = tcp_from(src, webhook).await.ok()?;
                let mut stream = tls
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await
                    .ok()?;
                stream.write_all(&head).await.ok()?;
                stream.flush().await.ok()?;
                Some(stream)
            };
            let stream = tokio::time::timeout(Duration::from_secs(20), got_in)
                .await
                .ok()
                .flatten();
            let _ = in_tx.send(stream.is_some());
            let mut stream = stream?;
            released.wait_for(|r| *r).await.ok()?;
            stream.write_all(&rest).await.ok()?;
            stream.flush().await.ok()?;
            let mut buf = vec![0u8; 16 << 10];
            let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .ok()?
                .ok()?;
            buf[..n].starts_with(b"HTTP/1.1 200").then_some(stream)
        });
    }
    drop(in_tx);
    // The burst is in when every connection got in or gave up, or after 20 s (a newcomer
    // held at the cap for ever neither gets in nor gives up).
    let mut settled = 0;
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        while in_rx.recv().await.is_some() {
            settled += 1;
            if settled == count {
                break;
            }
        }
    })
    .await;
    release.send(true).unwrap();
    set.join_all().await.into_iter().flatten().collect()
}

/// Connections to the admin port that each `GET /metrics` once and then sit idle.
async fn idle_scrapers(
    server: &Server,
    count: usize,
    sources: &[u8],
) -> Vec<Box<dyn std::any::Any + Send>> {
    let mut set = JoinSet::new();
    for i in 0..count {
        let src = sources[i % sources.len()];
        let admin = server.admin;
        set.spawn(async move {
            let tcp = tcp_from(src, admin).await.ok()?;
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .ok()?;
            tokio::spawn(conn);
            let req = Request::get("/metrics")
                .header("host", "localhost")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let resp = send.send_request(req).await.ok()?;
            resp.into_body().collect().await.ok()?;
            Some(Box::new(send) as Box<dyn std::any::Any + Send>)
        });
    }
    set.join_all().await.into_iter().flatten().collect()
}

/// `count` TCP connections to the webhook port that each send a 5-byte TLS record header
/// (a ClientHello of 16 KiB announced, never sent), reopened a second after each is cut,
/// until `stop`.
fn half_open(
    webhook: SocketAddr,
    count: usize,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> JoinSet<usize> {
    let mut set = JoinSet::new();
    for i in 0..count {
        let src = attacker(i);
        let mut stop = stop.clone();
        set.spawn(async move {
            let mut opened = 0usize;
            while !*stop.borrow() {
                if let Ok(mut tcp) = tcp_from(src, webhook).await {
                    opened += 1;
                    if tcp.write_all(&[0x16, 0x03, 0x01, 0x40, 0x00]).await.is_ok() {
                        let mut buf = [0u8; 64];
                        tokio::select! {
                            _ = tcp.read(&mut buf) => {}
                            _ = stop.changed() => return opened,
                        }
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => return opened,
                }
            }
            opened
        });
    }
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_attack_from_pods_unreadies_the_webhook_or_keeps_the_api_server_waiting() {
    let flags = chart_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = Server::start(&flags, None, dir());
    let shared = Arc::new((server.webhook, server.admin, server.ca_pem.clone()));
    let phase = Arc::new(Mutex::new("before"));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let monitor = tokio::spawn(well_behaved(
        shared,
        phase.clone(),
        seen.clone(),
        stop.clone(),
    ));
    let hold = Duration::from_secs(6);
    let sources: Vec<u8> = ATTACKERS.collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 1. A burst of idle connections past the cap, from several addresses and from one.
    *phase.lock().unwrap() = "513 idle reviewers from 9 addresses";
    let idle = idle_reviewers(&server, 513, &sources).await;
    assert!(idle.len() >= 400, "only {} of the burst got in", idle.len());
    tokio::time::sleep(hold).await;
    drop(idle);
    *phase.lock().unwrap() = "513 idle reviewers from one address";
    let idle = idle_reviewers(&server, 513, &[2]).await;
    // Each newcomer took its own address's oldest place that was not in a request (or was
    // closed at once when all of them were): the address holds no more than its share (the
    // monitor's few besides; those asked to close are gone within milliseconds).
    assert!(idle.len() >= 64, "only {} answered", idle.len());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let open = server
        .metric("evi_connections_open{port=\"webhook\"}")
        .await;
    assert!(
        open <= 64.0 + 2.0,
        "one address held {open} connections, past its share"
    );
    tokio::time::sleep(hold).await;
    drop(idle);

    // 2. The admin port: one past its cap, each having scraped once.
    *phase.lock().unwrap() = "65 idle scrapers on the admin port";
    let scrapers = idle_scrapers(&server, 65, &sources).await;
    tokio::time::sleep(hold).await;
    drop(scrapers);

    // 3. Half-open connections, reopened when cut.
    *phase.lock().unwrap() = "600 half-open connections";
    let (stop_half, half_stop) = tokio::sync::watch::channel(false);
    let half = half_open(server.webhook, 600, &half_stop);
    tokio::time::sleep(hold).await;
    stop_half.send(true).unwrap();
    let opened: usize = half.join_all().await.into_iter().sum();
    assert!(opened >= 600, "the half-open attack opened only {opened}");

    // 4. All of them at once.
    *phase.lock().unwrap() = "all at once";
    let (stop_half, half_stop) = tokio::sync::watch::channel(false);
    let half = half_open(server.webhook, 600, &half_stop);
    let idle = idle_reviewers(&server, 513, &sources).await;
    let scrapers = idle_scrapers(&server, 65, &sources).await;
    tokio::time::sleep(hold).await;
    stop_half.send(true).unwrap();
    half.join_all().await;
    drop((idle, scrapers));

    stop_tx.send(true).unwrap();
    monitor.await.unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.failures.is_empty(),
        "{} failures of {} reviews and {} probes: {:#?}",
        seen.failures.len(),
        seen.reviews,
        seen.probes,
        &seen.failures[..seen.failures.len().min(20)]
    );
    assert!(seen.reviews >= 50 && seen.probes >= 100, "too few rounds");
    // Room was made by closing connections that were not in a request.
    for (port, cause) in [("webhook", "evicted"), ("admin", "evicted")] {
        let n = server
            .metric(&format!(
                "evi_connections_closed_total{{port=\"{port}\",cause=\"{cause}\"}}"
            ))
            .await;
        assert!(n >= 1.0, "{port} {cause}: {n}");
    }
}
