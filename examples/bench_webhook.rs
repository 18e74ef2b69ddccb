//! Benchmark helper for `bench/run`: the fastest honest webhook receiver, for the `http` drain
//! row. It answers `200` to every request after reading its whole body, and counts requests and
//! bytes (printed on SIGTERM/SIGINT, to stderr), so the row measures outboxd's side of a webhook
//! and not a slow receiver. It does not verify signatures (tests/common/webhook.rs does).
//!
//! Usage: `bench_webhook --port PORT` (0: any; the bound port is printed as the first stdout line).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    bytes: AtomicU64,
}

async fn handle(State(c): State<Arc<Counts>>, body: Bytes) -> StatusCode {
    c.requests.fetch_add(1, Ordering::Relaxed);
    c.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    StatusCode::OK
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::io::Result<()> {
    let mut port = 0u16;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--port", Some(p)) => port = p.parse().map_err(|_| std::io::Error::other("--port: not a port"))?,
            _ => return Err(std::io::Error::other("usage: bench_webhook --port PORT")),
        }
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("{}", listener.local_addr()?.port());
    let counts = Arc::new(Counts::default());
    let app = axum::Router::new().fallback(handle).with_state(counts.clone());
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    axum::serve(listener, app).with_graceful_shutdown(stop).await?;
    eprintln!("requests {} bytes {}", counts.requests.load(Ordering::Relaxed), counts.bytes.load(Ordering::Relaxed));
    Ok(())
}
