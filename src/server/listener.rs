//! The listening ports: connections accepted up to each port's cap, each served on its own
//! task (TLS first on the webhook port).

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use axum::Router;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::{
    AppState, connection,
    metrics::{CauseLabel, PortLabel},
};

/// A listening port: what it serves, its bounds and its connection cap.
pub(super) struct Port {
    pub name: &'static str,
    pub app: Router,
    pub tls: Option<TlsAcceptor>,
    pub bounds: connection::Bounds,
    pub cap: usize,
    pub permits: Arc<tokio::sync::Semaphore>,
    pub state: Arc<AppState>,
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

impl Port {
    /// Resolves when every connection of this port has closed.
    pub(super) async fn closed(&self) {
        let all = u32::try_from(self.cap).unwrap_or(u32::MAX);
        let _ = self.permits.acquire_many(all).await;
    }

    fn label(&self) -> PortLabel {
        PortLabel { port: self.name }
    }
}

/// Accepts connections until `until` resolves, each served on its own task while it holds
/// one of the port's permits. At the cap it waits for a free slot (the kernel's backlog holds
/// the newcomers) and, on the webhook port, reports not ready meanwhile.
pub(super) async fn accept_loop(
    listener: &TcpListener,
    port: &Port,
    until: impl std::future::Future<Output = ()>,
) {
    let mut until = std::pin::pin!(until);
    let m = &port.state.metrics;
    loop {
        let permit = match port.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                m.at_capacity.get_or_create(&port.label()).inc();
                if port.tls.is_some() {
                    port.state.at_capacity.store(true, Ordering::SeqCst);
                }
                tracing::warn!(
                    port = port.name,
                    cap = port.cap,
                    "at the connection cap: waiting for a connection to close"
                );
                let permit = tokio::select! {
                    _ = until.as_mut() => return,
                    permit = port.permits.clone().acquire_owned() => match permit {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                port.state.at_capacity.store(false, Ordering::SeqCst);
                permit
            }
        };
        let (tcp, _peer) = tokio::select! {
            _ = until.as_mut() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(port = port.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (app, tls, bounds, name) = (port.app.clone(), port.tls.clone(), port.bounds, port.name);
        let state = port.state.clone();
        let mut stopping = port.stopping.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let m = &state.metrics;
            let open = m
                .connections_open
                .get_or_create(&PortLabel { port: name })
                .clone();
            open.inc();
            let stop = async move {
                let _ = stopping.wait_for(|s| *s).await;
            };
            match tls {
                None => connection::serve(tcp, false, app, bounds, m, name, stop).await,
                Some(acceptor) => {
                    match tokio::time::timeout(bounds.header, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            // ALPN decides the protocol: no sniffing of the first bytes, which
                            // would wait for a silent client.
                            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                            connection::serve(tls, h2, app, bounds, m, name, stop).await;
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => {
                            m.connections_closed
                                .get_or_create(&CauseLabel {
                                    port: name,
                                    cause: connection::Cause::HandshakeTimeout.as_str(),
                                })
                                .inc();
                            tracing::debug!("TLS handshake timed out");
                        }
                    }
                }
            }
            open.dec();
        });
    }
}
