//! Process health and the HTTP endpoint: `/metrics` (Prometheus text), `/healthz`, `/readyz`.
//!
//! [`Health`] is a few atomics written where the facts change (session start/end, Kafka delivery
//! results and metadata checks) and read by the HTTP handler. Ready means: streaming (so PostgreSQL
//! is connected), and the last Kafka delivery or metadata check succeeded.
//!
//! The server is deliberately tiny: one request per connection, GET only, no keep-alive. It serves
//! probes and scrapes, not users.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::error::Definite;

/// Shared readiness facts.
#[derive(Debug)]
pub struct Health {
    streaming: AtomicBool,
    kafka: AtomicBool,
    /// Outbox events and heartbeats seen in the stream: a counter, so the per-event path pays one
    /// relaxed add and no clock read; the monitor turns changes into idle time.
    activity: AtomicU64,
}

impl Health {
    pub fn new() -> Arc<Health> {
        Arc::new(Health {
            streaming: AtomicBool::new(false),
            kafka: AtomicBool::new(true),
            activity: AtomicU64::new(0),
        })
    }

    pub fn set_streaming(&self, v: bool) {
        self.streaming.store(v, Ordering::Relaxed);
    }

    pub fn set_kafka(&self, ok: bool) {
        self.kafka.store(ok, Ordering::Relaxed);
    }

    pub fn kafka_ok(&self) -> bool {
        self.kafka.load(Ordering::Relaxed)
    }

    /// An outbox event or a heartbeat just came through the stream.
    pub fn activity(&self) {
        self.activity.fetch_add(1, Ordering::Relaxed);
    }

    /// How many events and heartbeats have come through so far.
    pub fn activity_count(&self) -> u64 {
        self.activity.load(Ordering::Relaxed)
    }

    pub fn streaming(&self) -> bool {
        self.streaming.load(Ordering::Relaxed)
    }

    pub fn ready(&self) -> bool {
        self.streaming() && self.kafka_ok()
    }
}

/// Install the Prometheus recorder and serve the endpoints on `addr`. Returns the bound address
/// (useful with port 0).
pub async fn serve(addr: SocketAddr, health: Arc<Health>) -> Result<SocketAddr, Definite> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("outboxd_commit_to_ack_seconds".into()),
            &[0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
        )
        .and_then(|b| b.install_recorder())
        .map_err(|e| Definite::Config(format!("--metrics-addr: cannot install the metrics recorder: {e}")))?;
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Definite::Config(format!("--metrics-addr {addr}: cannot listen ({e}); pick a free port, or 'off' to disable"))
    })?;
    let bound = listener.local_addr().unwrap_or(addr);
    tokio::spawn(accept_loop(listener, handle, health));
    Ok(bound)
}

async fn accept_loop(listener: TcpListener, handle: PrometheusHandle, health: Arc<Health>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else { continue };
        let handle = handle.clone();
        let health = health.clone();
        tokio::spawn(async move {
            // Read the whole request head: closing with unread bytes would reset the connection.
            let mut buf = Vec::with_capacity(1024);
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
                let mut chunk = [0u8; 1024];
                match tokio::time::timeout_at(deadline, sock.read(&mut chunk)).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                    Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let n = buf.len();
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let (status, body, ctype) = match path.split('?').next().unwrap_or("/") {
                "/metrics" => ("200 OK", handle.render(), "text/plain; version=0.0.4"),
                "/healthz" => ("200 OK", "ok\n".to_owned(), "text/plain"),
                "/readyz" if health.ready() => ("200 OK", "ready\n".to_owned(), "text/plain"),
                "/readyz" => ("503 Service Unavailable", "not ready\n".to_owned(), "text/plain"),
                _ => ("404 Not Found", "not found\n".to_owned(), "text/plain"),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}
