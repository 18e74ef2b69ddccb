//! The HTTP webhook sink (`--sink http`): POST each event (or a batch of them) to `--http-url`,
//! with the routed topic as a path segment where the URL says `${topic}`. What goes on the wire is
//! [`wire`]'s business; this file owns ordering, acks and retries.
//!
//! # Flow
//! `send` checks what HTTP can never carry (see [`wire`]) and rejects it for the bad-event
//! policy; everything else goes to one of `--http-concurrency` lanes, chosen by a hash of the key
//! (keyless events share lane 0). Each lane is a task with a bounded channel; a full channel holds
//! the record here, in send order, and reports [`Sink::blocked`] ([`Handoff`]).
//!
//! # Why per-key order holds
//! A key always maps to the same lane, and a lane has exactly one request in flight: it sends the
//! next request only after the previous one was acked (2xx) or refused for good. A retry sends the
//! same request again before anything behind it, so an event is never overtaken by a later one
//! of its key, not even across retries. Lanes are independent, so one slow key's lane does not
//! hold up the others (the slot still waits for it: the ack tracker confirms only contiguous
//! prefixes of WAL).
//!
//! # Acks and retries
//! * a 2xx response → `ack()` for every event of the request;
//! * a status in `--http-bad-event-status` (400, 413, 415, 422 by default: answers about the
//!   event) → a definite refusal: `reject()` for `--on-bad-event`. For a batch
//!   the lane does not know which event was refused, so it sends the batch's events again one per
//!   batch (still the batch format), in order, and each one-event answer decides that event (the
//!   events the receiver already took from the refused batch are sent again: receivers that
//!   refuse a batch should take none of it, or deduplicate by `id`);
//! * every other 4xx (401/403 a rotated credential, 404/405 a receiver being deployed, 409 an
//!   idempotency conflict our own retry caused, 408, 429), 5xx, other statuses, timeouts and
//!   connection errors → back off exponentially (capped
//!   at [`MAX_BACKOFF`], or longer when `Retry-After` asks for up to [`MAX_RETRY_AFTER`]) and send
//!   the same request again. Nothing is acked on that path, so the frontier (and the slot) stalls.
//!
//! Redirects are not followed (a 3xx is retried with a warning): a POST silently turned into a GET
//! elsewhere would not be delivery.
//!
//! At-least-once window: a request the receiver processed whose response was lost (a timeout, a
//! dropped connection, a kill) is sent again; receivers deduplicate by `Idempotency-Key` / `ce-id`.
//!
//! # Health
//! `/readyz` and `outboxd_connected{component="http"}` say whether the receiver judges events:
//! up after an ack or a refusal, down after a retried answer (401, 404, 503 ...), a timeout or a
//! connection error. The warning logged for each retry names the status.
//!
//! Response bodies are read up to [`MAX_BODY_READ`] bytes (a refusal quotes [`REASON_BODY`]).

pub mod config;
mod wire;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use reqwest::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Client, StatusCode, Url};
use tokio::sync::mpsc;

use super::delivery::Delivery;
use super::handoff::{held_in_handoff, Handoff};
use super::link::Link;
use super::{Sink, SinkError};
use crate::error::Definite;
use crate::health::Health;
use crate::router::Record;
use crate::sink::escape::Limits;
use config::HttpConfig;
use wire::Event;

/// Records queued per lane beyond the request in flight.
const LANE_QUEUE: usize = 1024;
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The longest `Retry-After` honoured; a longer one waits this long.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// Topics whose URL is kept parsed.
const URL_CACHE: usize = 4096;
/// Response body text quoted in a refusal's reason.
const REASON_BODY: usize = 200;
/// Most bytes of a response body read (the rest is dropped with the connection): a receiver's
/// large or endless body costs each lane this much at most.
const MAX_BODY_READ: usize = 64 * 1024;

/// One event on its way to a lane.
struct Job {
    url: Url,
    event: Event,
    delivery: Delivery,
}

/// What the lanes share.
struct Shared {
    client: Client,
    cfg: HttpConfig,
    /// The receiver's reachability as `/readyz`, the metrics and the log show it.
    link: Link,
}

pub struct HttpSink {
    /// One lane per `--http-concurrency`; owns the lane tasks.
    handoff: Handoff<Job>,
    urls: HashMap<String, Url>,
    cfg: HttpConfig,
}

impl HttpSink {
    pub fn new(cfg: &HttpConfig, health: Arc<Health>) -> Result<HttpSink, Definite> {
        let client = Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(cfg.concurrency)
            .tcp_keepalive(Duration::from_secs(30))
            .user_agent(concat!("outboxd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Definite::Setup(format!("--sink http: cannot set up the HTTP client: {e}")))?;
        let link = Link::new("http", "The webhook receiver", health);
        link.set(true, "");
        let shared = Arc::new(Shared { client, cfg: cfg.clone(), link });
        let mut lanes = Vec::with_capacity(cfg.concurrency);
        let mut tasks = Vec::with_capacity(cfg.concurrency);
        for _ in 0..cfg.concurrency {
            let (tx, rx) = mpsc::channel(LANE_QUEUE);
            lanes.push(tx);
            tasks.push(tokio::spawn(lane(shared.clone(), rx)));
        }
        let webhook = cfg.url_for("topic").map(|u| origin(&u)).unwrap_or_default();
        tracing::info!(%webhook, lanes = cfg.concurrency, batch = cfg.batch, "webhook sink ready");
        let handoff = Handoff::new(lanes, tasks, "an HTTP sink lane ended");
        Ok(HttpSink { handoff, urls: HashMap::new(), cfg: cfg.clone() })
    }

    fn url(&mut self, topic: &str) -> Result<Url, String> {
        if let Some(u) = self.urls.get(topic) {
            return Ok(u.clone());
        }
        let u = self.cfg.url_for(topic)?;
        if self.urls.len() >= URL_CACHE {
            self.urls.clear();
        }
        self.urls.insert(topic.to_owned(), u.clone());
        Ok(u)
    }
}

/// The lane of a key: FNV-1a, stable across runs and platforms.
fn lane_of(key: Option<&[u8]>, lanes: usize) -> usize {
    let Some(key) = key else { return 0 };
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    (h % lanes as u64) as usize
}

/// The sink's entry in the list of sinks ([`crate::sink::registry`]). A webhook receiver's dead
/// letters cannot be read back (`--dlq-sink` sends them elsewhere).
impl crate::sink::registered::Registered for HttpSink {
    async fn build(cfg: &crate::config::Config, health: Arc<Health>) -> Result<Self, Definite> {
        HttpSink::new(&cfg.http, health)
    }

    fn probe(cfg: &crate::config::Config) -> crate::sink::registered::Probe {
        let default_port = if cfg.http.url.starts_with("https://") { 443 } else { 80 };
        let (shown, url) = (cfg.http.url_masked(), cfg.http.url.clone());
        crate::sink::registered::Probe::Tcp { name: "http", shown, url, default_port }
    }
}

impl Sink for HttpSink {
    fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        let url = match self.url(&record.topic) {
            Ok(u) => u,
            Err(reason) => {
                let record = Box::new(record);
                return Err(SinkError::Rejected { code: "invalid_url", reason, record, delivery });
            }
        };
        let lane = lane_of(record.key.as_deref(), self.handoff.lanes());
        let ce_id = Event::ce_id(&record, delivery.copy_part());
        if let Err(reason) = wire::check(&record, &ce_id, self.cfg.batch > 1) {
            return Err(SinkError::Rejected { code: "invalid_header", reason, record: Box::new(record), delivery });
        }
        let event = Event::from_record(record, ce_id);
        let job = Job { url, event, delivery };
        self.handoff.push(lane, job)
    }

    held_in_handoff!();

    fn copy_limits(&self) -> Limits {
        wire::COPY_LIMITS
    }
}

/// One lane: requests strictly one at a time, in arrival order (see the module doc).
async fn lane(shared: Arc<Shared>, mut rx: mpsc::Receiver<Job>) {
    let batch = shared.cfg.batch;
    let mut queue: VecDeque<Job> = VecDeque::new();
    loop {
        if queue.is_empty() {
            match rx.recv().await {
                Some(j) => queue.push_back(j),
                None => return,
            }
        }
        while queue.len() < batch {
            match rx.try_recv() {
                Ok(j) => queue.push_back(j),
                Err(_) => break,
            }
        }
        // A batch goes to one URL: the longest run of the queue's front with the same URL.
        let n = queue.iter().take(batch).take_while(|j| j.url == queue[0].url).count();
        let jobs: Vec<Job> = queue.drain(..n).collect();
        if batch == 1 {
            for job in jobs {
                deliver_single(&shared, job).await;
            }
        } else {
            deliver_batch(&shared, jobs).await;
        }
    }
}

/// What one request came to.
enum Answer {
    Acked,
    /// A status in --http-bad-event-status: the events of this request are bad.
    Refused(String),
    /// Anything else; `Some` when the server said how long to wait.
    Retry(String, Option<Duration>),
}

async fn deliver_single(shared: &Shared, job: Job) {
    let mut attempt = 0u32;
    loop {
        let built = wire::single(&job.event, &shared.cfg.source);
        let (headers, body) = match built {
            Ok(x) => x,
            // check() passed in `send`; this cannot happen, but if it did the event is bad.
            Err(reason) => return reject(job, "invalid_header", reason),
        };
        match post(shared, &job.url, headers, body).await {
            Answer::Acked => return job.delivery.ack(),
            Answer::Refused(reason) => return reject(job, "http_refused", reason),
            Answer::Retry(why, after) => {
                wait_retry(&job.url, &job.event.ce_id, &why, 1, attempt, after).await;
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

async fn deliver_batch(shared: &Shared, jobs: Vec<Job>) {
    let Some((parts, reason)) = send_batch(shared, jobs).await else { return };
    if let [_] = parts.as_slice() {
        return parts.into_iter().for_each(|job| reject(job, "http_refused", reason.clone()));
    }
    tracing::warn!(webhook = %origin(&parts[0].url), first_id = %parts[0].event.ce_id, events = parts.len(), %reason, "batch refused; sending its events one per batch to find the refused ones");
    for job in parts {
        if let Some((one, reason)) = send_batch(shared, vec![job]).await {
            one.into_iter().for_each(|job| reject(job, "http_refused", reason.clone()));
        }
    }
}

/// POST `jobs` as one JSON batch until it is acked (all acked, `None`) or refused for good (the
/// events back with the reason). An event that cannot be a batch element is rejected on the way.
/// A batch of one is still a batch: a receiver set up for batches always gets one shape.
async fn send_batch(shared: &Shared, jobs: Vec<Job>) -> Option<(Vec<Job>, String)> {
    let room = jobs.iter().map(|j| j.event.payload.as_ref().map_or(0, |p| p.len()) + 256).sum();
    let mut body = Vec::with_capacity(room);
    body.push(b'[');
    let mut parts = Vec::with_capacity(jobs.len());
    for job in jobs {
        let mark = body.len();
        if !parts.is_empty() {
            body.push(b',');
        }
        match wire::batch_element(&job.event, &shared.cfg.source, &mut body) {
            Ok(()) => parts.push(job),
            Err(reason) => {
                body.truncate(mark);
                reject(job, "invalid_header", format!("cannot put it in a JSON batch: {reason}"));
            }
        }
    }
    if parts.is_empty() {
        return None;
    }
    body.push(b']');
    let body = Bytes::from(body);
    let url = parts[0].url.clone();
    let mut attempt = 0u32;
    loop {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(wire::BATCH_CONTENT_TYPE));
        match post(shared, &url, headers, body.clone()).await {
            Answer::Acked => {
                for job in parts {
                    job.delivery.ack();
                }
                return None;
            }
            Answer::Refused(reason) => return Some((parts, reason)),
            Answer::Retry(why, after) => {
                wait_retry(&url, &parts[0].event.ce_id, &why, parts.len(), attempt, after).await;
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

fn reject(job: Job, code: &'static str, reason: String) {
    let Event { key, payload, headers, .. } = job.event;
    job.delivery.reject(code, reason, key, payload, headers);
}

async fn wait_retry(url: &Url, first_id: &str, why: &str, events: usize, attempt: u32, after: Option<Duration>) {
    let delay = crate::retry::backoff(attempt, MAX_BACKOFF).max(after.unwrap_or_default().min(MAX_RETRY_AFTER));
    tracing::warn!(webhook = %origin(url), first_id, events, reason = %why, ?delay, "webhook delivery not acknowledged; sending the same request again");
    tokio::time::sleep(delay).await;
}

/// Where a request went, for logs: the origin only, since a webhook's path or query may hold its
/// secret (`/services/T0/B0/XXXX`, `?token=`).
fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

/// POST once: signed, with basic auth when the URL had credentials.
async fn post(shared: &Shared, url: &Url, mut headers: reqwest::header::HeaderMap, body: Bytes) -> Answer {
    let cfg = &shared.cfg;
    if let Some(secret) = &cfg.signing_secret {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        if cfg.signature_v1 {
            if let Ok(v) = HeaderValue::from_str(&wire::signature(&secret.key, now, &body)) {
                headers.insert(wire::SIGNATURE_HEADER, v);
            }
        } else {
            let target = match url.query() {
                Some(q) => format!("{}?{q}", url.path()),
                None => url.path().to_owned(),
            };
            let (sig, names) = wire::signature_v2(&secret.key, now, &target, &headers, &body);
            // Both are ASCII (hex digits, header names); a failure here would leave the request
            // unsigned, which the receiver refuses.
            if let (Ok(s), Ok(n)) = (HeaderValue::from_str(&sig), HeaderValue::from_str(&names)) {
                headers.insert(wire::SIGNATURE_HEADER, s);
                headers.insert(wire::SIGNED_HEADERS_HEADER, n);
            }
        }
    }
    let mut req = shared.client.post(url.clone()).headers(headers).body(body);
    if let Some((user, pass)) = &cfg.basic_auth {
        req = req.basic_auth(user, pass.as_ref());
    }
    let answer = match req.send().await {
        Ok(resp) => classify(cfg, resp).await,
        Err(e) => {
            let e = e.without_url();
            let what = if e.is_timeout() { "timed out" } else { "failed" };
            let reason = format!("request {what}: {}", error_chain(&e));
            shared.link.set(false, &reason);
            return Answer::Retry(reason, None);
        }
    };
    // The receiver answered; it counts as up only when it judges events (acks or refuses them). A
    // 401, 404, 503 ... keeps /readyz not ready until an answer of the other kind.
    match &answer {
        Answer::Retry(reason, _) => shared.link.set(false, reason),
        _ => shared.link.set(true, ""),
    };
    answer
}

/// An error and its sources on one line (reqwest's own text alone is often just "error sending
/// request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The body's first `cap` bytes; the rest is never read.
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < cap {
        match resp.chunk().await {
            Ok(Some(c)) => out.extend_from_slice(&c[..c.len().min(cap - out.len())]),
            _ => break,
        }
    }
    out
}

/// What a response means.
async fn classify(cfg: &HttpConfig, resp: reqwest::Response) -> Answer {
    let status = resp.status();
    if status.is_success() {
        // Read (and drop) a small body so the connection goes back to the pool.
        let _ = read_capped(resp, MAX_BODY_READ).await;
        return Answer::Acked;
    }
    let after = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let location = resp.headers().get(reqwest::header::LOCATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let text = read_capped(resp, REASON_BODY).await;
    let snippet: String =
        String::from_utf8_lossy(&text).chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let what = match snippet.trim() {
        "" => format!("HTTP {status}"),
        text => format!("HTTP {status}: {text}"),
    };
    if status.is_client_error() && cfg.is_bad_event_status(status.as_u16()) {
        return Answer::Refused(format!("the webhook refused it with {what}"));
    }
    if status.is_client_error() && status != StatusCode::REQUEST_TIMEOUT && status != StatusCode::TOO_MANY_REQUESTS {
        return Answer::Retry(
            format!("{what} (about the receiver, not the event: --http-bad-event-status does not list it)"),
            after,
        );
    }
    if status.is_redirection() {
        // A redirect to a webhook's secret path (a Slack or Teams URL) is masked like --http-url.
        let to = crate::secret::mask_webhook_url(&location.unwrap_or_default());
        return Answer::Retry(
            format!("{what} (a redirect to {to:?}; fix --http-url, redirects are not followed)"),
            None,
        );
    }
    Answer::Retry(what, after)
}

#[cfg(test)]
mod tests {
    use super::lane_of;

    #[test]
    fn a_key_always_has_one_lane_and_keys_spread() {
        assert_eq!(lane_of(None, 8), 0);
        assert_eq!(lane_of(Some(b"agg-1"), 8), lane_of(Some(b"agg-1"), 8));
        let used: std::collections::HashSet<usize> =
            (0..200).map(|i| lane_of(Some(format!("k{i}").as_bytes()), 8)).collect();
        assert_eq!(used.len(), 8, "200 keys use every lane");
        assert!((0..100).all(|i| lane_of(Some(format!("k{i}").as_bytes()), 1) == 0));
    }
}
