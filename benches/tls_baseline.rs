//! The physical limit for the load benchmark: the smallest hyper + rustls server that reads the
//! request body and answers a constant AdmissionReview response of the webhook's own size, with
//! the webhook's TLS configuration (same provider, versions, ALPN, certificate kind).
//!
//!   tls-baseline LISTEN_ADDR CA_OUT_PATH
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark tool, not a request path

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use tokio_rustls::TlsAcceptor;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:9443".into());
    let ca_out = args
        .next()
        .unwrap_or_else(|| "/tmp/tls-baseline-ca.crt".into());

    // The response the webhook gives for the benchmark's review, computed once.
    let review = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/review.json"
    ))
    .unwrap();
    let response = Bytes::from(
        evi::review::handle(
            &evi::config::Config::default(),
            None,
            evi::review::Endpoint::Mutate,
            &review,
        )
        .unwrap()
        .body,
    );

    let generated = evi::server::tls::self_signed(&["localhost", "127.0.0.1"]).unwrap();
    std::fs::write(&ca_out, &generated.ca_pem).unwrap();
    let loaded =
        evi::server::tls::load_pem(generated.cert_pem.as_bytes(), generated.key_pem.as_bytes())
            .unwrap();
    let store = Arc::new(evi::server::tls::CertStore::new(loaded.key));
    let acceptor = TlsAcceptor::from(Arc::new(evi::server::tls::server_config(store).unwrap()));
    let listener = tokio::net::TcpListener::bind(&listen).await.unwrap();
    eprintln!(
        "tls-baseline listening on {} ({} byte response)",
        listener.local_addr().unwrap(),
        response.len()
    );
    // SIGTERM ends the process through `exit`, so that a build instrumented for profile-guided
    // optimisation writes its profile (release/pgo.py --baseline).
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = term.recv() => std::process::exit(0),
        };
        let Ok((tcp, _)) = accepted else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let response = response.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let response = response.clone();
                async move {
                    let _body = req.into_body().collect().await;
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(response))
                            .unwrap(),
                    )
                }
            });
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5));
            let builder = if h2 {
                builder.http2_only()
            } else {
                builder.http1_only()
            };
            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
        });
    }
}
