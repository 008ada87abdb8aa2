//! The harness of tests/server.rs: certificates (a CA, leaves, the kubelet's Secret layout),
//! the `serve` process with its logs and metrics, and a TLS client for HTTP/1.1 and h2.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::common;

// === certificates ===

pub struct Ca {
    pub issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

pub fn new_ca() -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test CA");
    let cert = params.self_signed(&key).unwrap();
    Ca {
        issuer: Issuer::new(params, key),
        pem: cert.pem(),
    }
}

/// A serving certificate for localhost; `cn` tells two leaves apart.
pub fn leaf(ca: &Ca, cn: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Writes a Secret volume the way the kubelet does: a timestamped directory, a `..data`
/// symlink swapped atomically, and file symlinks through it.
pub fn kubelet_write(dir: &Path, generation: u32, cert: &str, key: &str) {
    use std::os::unix::fs::symlink;
    let ts = format!("..2026_11_30_12_00_00.{generation:09}");
    let data = dir.join(&ts);
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("tls.crt"), cert).unwrap();
    std::fs::write(data.join("tls.key"), key).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&ts, &tmp).unwrap();
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        if std::fs::symlink_metadata(dir.join(f)).is_err() {
            symlink(format!("..data/{f}"), dir.join(f)).unwrap();
        }
    }
    if let Some(old) = old {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
}

// === the server process ===

pub struct Server {
    pub child: Child,
    pub webhook: SocketAddr,
    pub admin: SocketAddr,
    pub logs: Arc<Mutex<Vec<Value>>>,
    pub ca_pem: String,
    pub _dir: tempfile::TempDir,
}

/// A line of the text log as the JSON log's fields the harness reads: the line itself (`raw`),
/// and for the `listening` line its message and addresses.
fn text_line(line: &str) -> Value {
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(str::to_owned)
    };
    match (
        line.contains(" listening"),
        field("webhook="),
        field("admin="),
    ) {
        (true, Some(webhook), Some(admin)) => {
            json!({"raw": line, "message": "listening", "webhook": webhook, "admin": admin})
        }
        _ => json!({"raw": line}),
    }
}

impl Server {
    pub fn start(extra: &[&str], ca_pem: Option<String>, dir: tempfile::TempDir) -> Server {
        let ca_out = dir.path().join("generated-ca.crt");
        let mut child = Command::new(env!("CARGO_BIN_EXE_ephemeral-volume-injector"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(if extra.contains(&"--log-format") {
                &[][..]
            } else {
                &["--log-format", "json"][..]
            })
            .args(if extra.contains(&"--log-level") {
                &[][..]
            } else {
                &["--log-level", "info"][..]
            })
            .arg("--ca-out")
            .arg(&ca_out)
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let logs = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| text_line(&line));
                    if v["message"] == "listening" {
                        let _ = tx.send(v.clone());
                    }
                    // Decision lines arrive by the thousand under load; keep the rest.
                    let mut logs = logs.lock().unwrap_or_else(|p| p.into_inner());
                    if v["message"] != "mutated" || logs.len() < 1000 {
                        logs.push(v);
                    }
                }
            });
        }
        let listening = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the server did not start listening");
        let ca_pem = ca_pem.unwrap_or_else(|| std::fs::read_to_string(&ca_out).unwrap());
        Server {
            child,
            webhook: listening["webhook"].as_str().unwrap().parse().unwrap(),
            admin: listening["admin"].as_str().unwrap().parse().unwrap(),
            logs,
            ca_pem,
            _dir: dir,
        }
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    /// Waits (off the runtime) for the process to exit, failing the test after `within`.
    pub async fn exit_status(mut self, within: Duration) -> std::process::ExitStatus {
        tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            loop {
                if let Some(status) = self.child.try_wait().unwrap() {
                    return status;
                }
                assert!(
                    t.elapsed() < within,
                    "the server did not exit within {within:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await
        .unwrap()
    }

    pub async fn admin_get(&self, path: &str) -> (StatusCode, String) {
        let tcp = TcpStream::connect(self.admin).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::get(path)
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Waits for a log line that `matches` (lines are written in batches, a few ms after the
    /// event), failing with `what` and the lines so far after `within`.
    pub async fn wait_log(
        &self,
        matches: impl Fn(&Value) -> bool,
        within: Duration,
        what: &str,
    ) -> Value {
        let t = Instant::now();
        loop {
            if let Some(line) = self.logs.lock().unwrap().iter().find(|l| matches(l)) {
                return line.clone();
            }
            let logs = self.logs.lock().unwrap().clone();
            assert!(t.elapsed() < within, "{what}: {logs:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until a metric reaches `at_least`, failing with `what` after `within`.
    pub async fn wait_metric(
        &self,
        name_and_labels: &str,
        at_least: f64,
        within: Duration,
        what: &str,
    ) {
        let t = Instant::now();
        while self.metric(name_and_labels).await < at_least {
            assert!(t.elapsed() < within, "{what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn metric(&self, name_and_labels: &str) -> f64 {
        let (_, text) = self.admin_get("/metrics").await;
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name_and_labels)
                    .and_then(|r| r.trim().parse().ok())
            })
            .unwrap_or(0.0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// === a TLS client ===

#[derive(Clone, Copy, PartialEq)]
pub enum Proto {
    H1,
    H2,
}

pub fn connector(ca_pem: &str, proto: Proto) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    // A resumed session reports the certificate of the session it resumes; the rotation test
    // needs to see what a new handshake gets.
    cfg.resumption = rustls::client::Resumption::disabled();
    cfg.alpn_protocols = vec![match proto {
        Proto::H1 => b"http/1.1".to_vec(),
        Proto::H2 => b"h2".to_vec(),
    }];
    TlsConnector::from(Arc::new(cfg))
}

pub enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

pub struct Conn {
    pub sender: Sender,
    /// The leaf certificate the server presented.
    pub peer: Vec<u8>,
}

/// A TCP connection from `127.0.0.<src>` (a client at another address: the webhook shares
/// its connections fairly between addresses).
pub async fn tcp_from(src: u8, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from(([127, 0, 0, src], 0)))?;
    socket.connect(to).await
}

pub async fn connect(addr: SocketAddr, tls: &TlsConnector, proto: Proto) -> Result<Conn, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let stream = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let peer = stream.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let io = TokioIo::new(stream);
    let sender = match proto {
        Proto::H1 => {
            assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
            let (s, c) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(c);
            Sender::H1(s)
        }
        Proto::H2 => {
            assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
            let (s, c) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(c);
            Sender::H2(s)
        }
    };
    Ok(Conn { sender, peer })
}

impl Conn {
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Vec<u8>), String> {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let resp = match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
            Sender::H2(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body.to_vec()))
    }
}

/// Posts a review over a fresh connection; returns the parsed response.
pub async fn review(server: &Server, proto: Proto, request: &Value) -> Value {
    let tls = connector(&server.ca_pem, proto);
    let mut conn = connect(server.webhook, &tls, proto).await.unwrap();
    let (status, body) = conn
        .send("POST", "/mutate", serde_json::to_vec(request).unwrap())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

pub fn nextflow_review(uid: &str) -> (Value, Value) {
    let pod = common::read_input("nextflow-pod-mode");
    let req = common::review_for(&pod, "nf", uid);
    (pod, req)
}

pub fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
}

pub fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

pub fn volume_names(pod: &Value) -> Vec<String> {
    pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect()
}
