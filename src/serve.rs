//! The HTTP endpoint on `--metrics-addr`: `/metrics` (Prometheus text), the probes `/healthz` and
//! `/readyz` (answered by [`crate::health`]), and the status page (`/`, `/status.json`:
//! [`crate::status`]) for `run` and `poll`, and `outboxd inbox`'s own ([`crate::status::inbox`]);
//! `shadow --follow` serves it without the page. The page's paths answer only the `Host` names
//! [`crate::status::host`] allows (DNS rebinding) and, with a token, only requests that carry it;
//! the probes and `/metrics` answer any. This module composes those parts and owns only the
//! connection handling; none of them imports it.
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
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::error::Definite;
use crate::health::{Health, Probe};
use crate::status::inbox::{Access, InboxFacts, InboxPage};
use crate::status::{self, Page, PageSetup, StatusPage};

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

/// Install the Prometheus recorder and serve the endpoints on `addr`. Returns the bound address
/// (useful with port 0).
///
/// With `page`, `/` and `/status.json` serve the status page ([`crate::status`]) too.
pub async fn serve(addr: SocketAddr, health: Arc<Health>, page: Option<PageSetup>) -> Result<SocketAddr, Definite> {
    serve_page(addr, health, |handle, health| {
        page.map(|p| Arc::new(StatusPage::start(p, handle.clone(), health.clone())) as Arc<dyn Page>)
    })
    .await
}

/// [`serve`] for `outboxd inbox`: its own status page ([`crate::status::inbox`]), behind the same
/// token and `Host` checks as `run`'s.
pub async fn serve_inbox(
    addr: SocketAddr,
    health: Arc<Health>,
    facts: InboxFacts,
    access: Access,
) -> Result<SocketAddr, Definite> {
    serve_page(addr, health, |handle, health| {
        Some(Arc::new(InboxPage::new(facts, access, handle.clone(), health.clone())) as Arc<dyn Page>)
    })
    .await
}

async fn serve_page(
    addr: SocketAddr,
    health: Arc<Health>,
    page: impl FnOnce(&PrometheusHandle, &Arc<Health>) -> Option<Arc<dyn Page>>,
) -> Result<SocketAddr, Definite> {
    let handle = crate::metrics::install_recorder(crate::metrics::UPKEEP_INTERVAL)?;
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Definite::Config(format!("--metrics-addr {addr}: cannot listen ({e}); pick a free port, or 'off' to disable"))
    })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let page = page(&handle, &health);
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
    page: Option<Arc<dyn Page>>,
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
    page: Option<&Arc<dyn Page>>,
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
        "/healthz" => probe(health.healthz()),
        "/readyz" => probe(health.readyz()),
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
    page: &Arc<dyn Page>,
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
        "/status.js" => (("200 OK", page.script().to_owned(), "text/javascript; charset=utf-8"), ""),
        "/status.css" => (("200 OK", status::page_css().to_owned(), "text/css; charset=utf-8"), ""),
        _ if !page.authorized(req, query) => (
            (
                "401 Unauthorized",
                "the status page needs its token (--status-page-token-file): send Authorization: Bearer TOKEN or add ?token=TOKEN\n".to_owned(),
                "text/plain",
            ),
            "WWW-Authenticate: Bearer\r\n",
        ),
        "/status.json" => (("200 OK", page.json(), "application/json"), ""),
        _ => {
            let token = query.split('&').find(|kv| kv.starts_with("token="));
            (("200 OK", page.html(token), "text/html; charset=utf-8"), status::PAGE_HEADERS)
        }
    }
}

/// A probe's answer as (status, body, content type).
fn probe(p: Probe) -> (&'static str, String, &'static str) {
    (if p.ok { "200 OK" } else { "503 Service Unavailable" }, p.body, "text/plain")
}
