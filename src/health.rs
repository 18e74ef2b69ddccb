//! Process health and the HTTP endpoint: `/metrics` (Prometheus text), `/healthz`, `/readyz`, and
//! the status page (`/`, `/status.json`: [`crate::status`]) for `run` and `poll`. The page's paths
//! answer only the `Host` names [`crate::status::host`] allows (DNS rebinding); the probes and
//! `/metrics` answer any.
//!
//! [`Health`] is a few atomics written where the facts change (session start/end, the sink's
//! connection state, each status update of the replication loop) and read by the HTTP handler.
//!
//! - Live (`/healthz`) means the replication loop (or the supervisor between sessions) turned
//!   within `--health-stall-timeout`. The session loop turns at least once per
//!   `--status-interval` even when saturated or idle (its status timer is an arm of the loop), and
//!   the supervisor ticks through every backoff and through the bounded waits for Kafka of
//!   exactly-once ([`Health::ticking`]), so only a loop blocked inside one step, a wedge, goes
//!   quiet. That is the one failure a restart fixes, so it is the only one `/healthz` reports:
//!   a broker outage or a reconnecting PostgreSQL link is readiness, not liveness.
//! - Ready (`/readyz`) means streaming (so PostgreSQL is connected) and the sink reaches its
//!   destination (Kafka: the last delivery or metadata check succeeded; the others: their
//!   connection is up). A standby instance (another process holds the slot) is not
//!   ready, and its 503 body says "standby" so a probe or a person can tell it from a failure.
//!
//! The server is hand-written on purpose: one request per connection, GET only, no keep-alive. It
//! serves probes and scrapes, not users. hyper would parse HTTP better, but the robustness this
//! endpoint needs is the same code with or without it: our own accept loop that backs off on
//! errors (EMFILE would otherwise spin a core), one deadline per connection covering reading the
//! request and writing the answer (a silent client is dropped, never waited on), a task per
//! connection (a slow client never holds up a probe), and a cap on open connections so probes
//! cannot use up the file descriptors PostgreSQL and Kafka need. At the cap, the connection that
//! has waited longest without sending its request is ended to make room: sockets opened and left
//! idle (64 of them, re-opened every few seconds) would otherwise keep every probe out and make a
//! kubelet restart a healthy process. That is a few lines here, and
//! saves four crates in the build.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::error::Definite;
use crate::status::{PageSetup, StatusPage};

/// One connection's whole life: reading the request head, rendering, writing the answer.
const CONN_DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once. A connection past the cap ends the one that has waited longest
/// without sending its request, so idle sockets can never keep a probe out; when none is idle,
/// the new one is closed.
const MAX_CONNECTIONS: usize = 64;
/// A connection must send its request head within this (a probe sends it at once).
const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// Longest pause after a failed accept (e.g. EMFILE), reached by doubling from 10 ms.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Shared readiness and liveness facts.
#[derive(Debug)]
pub struct Health {
    streaming: AtomicBool,
    /// Another process holds the slot; this one waits to take it over.
    standby: AtomicBool,
    /// The sink reaches its destination (every sink reports it, whatever its kind).
    sink_up: AtomicBool,
    /// Outbox events and heartbeats seen in the stream: a counter, so the per-event path pays one
    /// relaxed add and no clock read; the monitor turns changes into idle time.
    activity: AtomicU64,
    /// Loop ticks are stored as milliseconds since this instant (a monotonic clock).
    epoch: Instant,
    last_tick_ms: AtomicU64,
    /// No tick for this long means wedged; zero turns the check off.
    stall_timeout: Duration,
}

impl Health {
    /// Health whose `/healthz` fails after `stall_timeout` without a [`loop_tick`](Self::loop_tick)
    /// (zero: never). The clock starts now, so start-up has one timeout to reach the loop.
    pub fn new(stall_timeout: Duration) -> Arc<Health> {
        Arc::new(Health {
            streaming: AtomicBool::new(false),
            standby: AtomicBool::new(false),
            sink_up: AtomicBool::new(true),
            activity: AtomicU64::new(0),
            epoch: Instant::now(),
            last_tick_ms: AtomicU64::new(0),
            stall_timeout,
        })
    }

    /// The replication loop (or the supervisor between sessions) made progress. One clock read
    /// and a relaxed store: cheap next to decoding one WAL message.
    pub fn loop_tick(&self) {
        self.tick_at(Instant::now());
    }

    fn tick_at(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        self.last_tick_ms.store(ms, Ordering::Relaxed);
    }

    /// Await `step`, ticking every second meanwhile. For a step that waits on a destination with a
    /// bound of its own (the exactly-once producer's start, which waits for Kafka up to a
    /// timeout; aborting its transaction): a broker outage is readiness, not a wedge. The ticks
    /// come from the runtime's thread, so a blocked runtime still goes quiet.
    pub async fn ticking<F: std::future::Future>(&self, step: F) -> F::Output {
        self.ticking_for(Duration::MAX, step).await
    }

    /// [`Health::ticking`] for at most `limit`: a step that takes longer still runs, but the loop
    /// goes quiet, so a wait that never ends (a hung call) shows as a stall.
    pub async fn ticking_for<F: std::future::Future>(&self, limit: Duration, step: F) -> F::Output {
        tokio::pin!(step);
        let mut every = tokio::time::interval(Duration::from_secs(1));
        let started = Instant::now();
        loop {
            tokio::select! {
                biased;
                out = &mut step => return out,
                _ = every.tick(), if started.elapsed() < limit => self.loop_tick(),
            }
        }
    }

    /// Not wedged: the loop ticked within the stall timeout.
    pub fn live(&self) -> bool {
        self.stalled_for(Instant::now()).is_none()
    }

    /// How long the loop has been quiet at `now`, if that is longer than the stall timeout.
    fn stalled_for(&self, now: Instant) -> Option<Duration> {
        if self.stall_timeout.is_zero() {
            return None;
        }
        let last = self.epoch + Duration::from_millis(self.last_tick_ms.load(Ordering::Relaxed));
        let quiet = now.saturating_duration_since(last);
        (quiet > self.stall_timeout).then_some(quiet)
    }

    pub fn set_streaming(&self, v: bool) {
        self.streaming.store(v, Ordering::Relaxed);
    }

    pub fn set_standby(&self, v: bool) {
        self.standby.store(v, Ordering::Relaxed);
    }

    pub fn standby(&self) -> bool {
        self.standby.load(Ordering::Relaxed)
    }

    pub fn set_sink_up(&self, up: bool) {
        self.sink_up.store(up, Ordering::Relaxed);
    }

    pub fn sink_up(&self) -> bool {
        self.sink_up.load(Ordering::Relaxed)
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
        self.streaming() && self.sink_up()
    }
}

/// What the process shares with every session: readiness, metric handles, the shutdown signal.
#[derive(Clone)]
pub struct Handles {
    pub health: Arc<Health>,
    pub metrics: crate::metrics::Metrics,
    pub shutdown: tokio_util::sync::CancellationToken,
}

/// Install the Prometheus recorder and serve the endpoints on `addr`. Returns the bound address
/// (useful with port 0).
///
/// With `page`, `/` and `/status.json` serve the status page ([`crate::status`]) too.
pub async fn serve(addr: SocketAddr, health: Arc<Health>, page: Option<PageSetup>) -> Result<SocketAddr, Definite> {
    let handle = crate::metrics::install_recorder(crate::metrics::UPKEEP_INTERVAL)?;
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Definite::Config(format!("--metrics-addr {addr}: cannot listen ({e}); pick a free port, or 'off' to disable"))
    })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let page = page.map(|p| StatusPage::start(p, handle.clone(), health.clone()));
    tokio::spawn(accept_loop(listener, handle, health, page));
    Ok(bound)
}

/// Connections that have not sent their request head yet, oldest first: (id, its task).
type Waiting = Arc<Mutex<VecDeque<(u64, tokio::task::AbortHandle)>>>;

/// Removes a connection from [`Waiting`] when its head arrived or its task ended (or was aborted).
struct Forget {
    waiting: Waiting,
    id: u64,
}

impl Forget {
    fn now(&self) {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).retain(|(id, _)| *id != self.id);
    }
}

impl Drop for Forget {
    fn drop(&mut self) {
        self.now();
    }
}

async fn accept_loop(
    listener: TcpListener,
    handle: PrometheusHandle,
    health: Arc<Health>,
    page: Option<Arc<StatusPage>>,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let waiting: Waiting = Arc::default();
    let mut next_id = 0u64;
    let mut backoff = Duration::ZERO;
    loop {
        let sock = match listener.accept().await {
            Ok((sock, _)) => sock,
            Err(e) => {
                // Out of file descriptors, or the like: retrying at once would spin. Pause and
                // let connections close.
                if backoff.is_zero() {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed; pausing and retrying");
                } else {
                    tracing::debug!(error = %e, "metrics endpoint: accept failed again");
                }
                backoff = (backoff * 2).clamp(Duration::from_millis(10), MAX_ACCEPT_BACKOFF);
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        backoff = Duration::ZERO;
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // Over the cap: end the longest-idle connection and take its place; with none
                // idle, close this one rather than queue behind clients that may never finish.
                let oldest = waiting.lock().unwrap_or_else(PoisonError::into_inner).pop_front();
                let Some((_, task)) = oldest else { continue };
                task.abort();
                match tokio::time::timeout(Duration::from_millis(100), permits.clone().acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => continue,
                }
            }
        };
        let (handle, health, page) = (handle.clone(), health.clone(), page.clone());
        let id = next_id;
        next_id = next_id.wrapping_add(1);
        let forget = Forget { waiting: waiting.clone(), id };
        let task = tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(CONN_DEADLINE, answer(sock, &handle, &health, page.as_ref(), &forget)).await;
        });
        // The task cannot have ended yet on this single-threaded runtime; if it has elsewhere,
        // the entry is stale and ending it later is a no-op.
        if !task.is_finished() {
            waiting.lock().unwrap_or_else(PoisonError::into_inner).push_back((id, task.abort_handle()));
        }
    }
}

/// Read one request head (within [`HEAD_DEADLINE`]) and write one response.
async fn answer(
    mut sock: TcpStream,
    handle: &PrometheusHandle,
    health: &Health,
    page: Option<&Arc<StatusPage>>,
    forget: &Forget,
) {
    // Read the whole request head: closing with unread bytes would reset the connection.
    let mut buf = Vec::with_capacity(1024);
    let head = async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
            let mut chunk = [0u8; 1024];
            match sock.read(&mut chunk).await {
                // The client finished sending: answer what it asked, if anything.
                Ok(0) => break,
                Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        true
    };
    if !matches!(tokio::time::timeout(HEAD_DEADLINE, head).await, Ok(true)) {
        return;
    }
    // A head cut at 8 KiB (or by the client) may have lost its Host line: the page refuses it.
    let complete = buf.windows(4).any(|w| w == b"\r\n\r\n");
    // Answering now: no longer one to end for room.
    forget.now();
    let req = String::from_utf8_lossy(&buf);
    // A connection that sent nothing (a TCP probe, a port scan) gets nothing: no page rendered,
    // no preview read.
    let Some(target) = req.split_whitespace().nth(1) else { return };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut extra = "";
    let (status, body, ctype) = match path {
        "/metrics" => ("200 OK", handle.render(), "text/plain; version=0.0.4"),
        "/healthz" => match health.stalled_for(Instant::now()) {
            None => ("200 OK", "ok\n".to_owned(), "text/plain"),
            Some(quiet) => (
                "503 Service Unavailable",
                format!("stalled: the replication loop made no progress for {}s\n", quiet.as_secs()),
                "text/plain",
            ),
        },
        "/readyz" if health.ready() => ("200 OK", "ready\n".to_owned(), "text/plain"),
        "/readyz" if health.standby() => (
            "503 Service Unavailable",
            "standby: another process holds the replication slot; this one takes over when it is released\n".to_owned(),
            "text/plain",
        ),
        "/readyz" => ("503 Service Unavailable", "not ready\n".to_owned(), "text/plain"),
        "/" | "/status.json" | "/status.js" | "/status.css" | "/favicon.ico" if page.is_some() => {
            let Some(page) = page else { return };
            let (answer, headers) = page_answer(page, path, query, &req, complete);
            extra = headers;
            answer
        }
        _ => ("404 Not Found", "not found\n".to_owned(), "text/plain"),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n{extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = sock.write_all(resp.as_bytes()).await;
    let _ = sock.shutdown().await;
}

/// The status page's paths: (status, body, content type) and the extra headers.
fn page_answer(
    page: &Arc<StatusPage>,
    path: &str,
    query: &str,
    req: &str,
    complete: bool,
) -> ((&'static str, String, &'static str), &'static str) {
    if let Err(refusal) = page.host_allowed(req, complete) {
        let status = if complete { "403 Forbidden" } else { "431 Request Header Fields Too Large" };
        return ((status, refusal, "text/plain"), "");
    }
    match path {
        // Browsers ask for it; an empty answer keeps their consoles clean.
        "/favicon.ico" => (("204 No Content", String::new(), "image/x-icon"), ""),
        "/status.js" => (("200 OK", crate::status::page_js().to_owned(), "text/javascript; charset=utf-8"), ""),
        "/status.css" => (("200 OK", crate::status::page_css().to_owned(), "text/css; charset=utf-8"), ""),
        _ if !page.authorized(req, query) => (
            (
                "401 Unauthorized",
                "the status page needs its token (--status-page-token-file): send Authorization: Bearer TOKEN or add ?token=TOKEN\n".to_owned(),
                "text/plain",
            ),
            "WWW-Authenticate: Bearer\r\n",
        ),
        "/status.json" => {
            let json = serde_json::to_string(&page.status()).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
            (("200 OK", json, "application/json"), "")
        }
        _ => {
            let token = query.split('&').find(|kv| kv.starts_with("token="));
            (("200 OK", page.html(token), "text/html; charset=utf-8"), crate::status::PAGE_HEADERS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_until_the_loop_is_quiet_longer_than_the_timeout() {
        let h = Health::new(Duration::from_secs(120));
        let t0 = h.epoch;
        // Start-up gets one timeout from creation.
        assert_eq!(h.stalled_for(t0 + Duration::from_secs(120)), None);
        assert_eq!(h.stalled_for(t0 + Duration::from_secs(121)), Some(Duration::from_secs(121)));
        h.tick_at(t0 + Duration::from_secs(100));
        assert_eq!(h.stalled_for(t0 + Duration::from_secs(220)), None);
        assert_eq!(h.stalled_for(t0 + Duration::from_millis(220_500)), Some(Duration::from_millis(120_500)));
        // A tick heals it.
        h.tick_at(t0 + Duration::from_secs(300));
        assert_eq!(h.stalled_for(t0 + Duration::from_secs(301)), None);
    }

    #[test]
    fn zero_timeout_never_stalls() {
        let h = Health::new(Duration::ZERO);
        assert_eq!(h.stalled_for(h.epoch + Duration::from_secs(86_400 * 365)), None);
        assert!(h.live());
    }

    #[test]
    fn real_clock_stalls_after_a_short_timeout() {
        let h = Health::new(Duration::from_millis(50));
        h.loop_tick();
        assert!(h.live());
        std::thread::sleep(Duration::from_millis(120));
        assert!(!h.live());
        h.loop_tick();
        assert!(h.live());
    }
}
