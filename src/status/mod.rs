//! The status page: `/` (HTML) and `/status.json` on `--metrics-addr`, read-only, the outbox at a
//! glance for an operator with a browser.
//!
//! Where the figures come from:
//! - the Prometheus exporter's own text ([`sample`]): lag, rates, in-flight records, connection
//!   state, dead-letter counts, topics. Nothing is counted twice, and the event path pays nothing;
//! - [`Health`]: role, readiness, liveness;
//! - the [`board`]: facts set at start, the last WARN or ERROR line, the newest dead-lettered
//!   events, the in-flight bytes (none of them written per event);
//! - the routing [`preview`]: read from the outbox table when a page asks, at most every 30 s.
//!
//! Invariants: bounded whatever the deployment (the top [`TOP_TOPICS`] topics, the newest
//! [`board::NEWEST_DEAD_LETTERS`] dead letters, [`sample::HISTORY_POINTS`] chart points), no
//! secret (the facts are `outboxd config`'s masked forms; the token is compared, never shown), and
//! the JSON's field names are an interface: [`FIELDS`] lists them and the manual's table is
//! generated from it.

pub mod board;
pub mod host;
pub mod inbox;
mod page;
pub mod preview;
pub mod sample;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;

use crate::config::{value_name, Config};
use crate::health::Health;

pub use board::{board, Facts};

/// The response headers of the HTML page (its Content-Security-Policy), each ending in CRLF.
pub const PAGE_HEADERS: &str = page::HEADERS;

/// The page's script, served at `/status.js`.
pub fn page_js() -> &'static str {
    page::JS
}

/// The page's stylesheet, served at `/status.css`.
pub fn page_css() -> &'static str {
    page::CSS
}

/// Topics listed by events acked; the rest are counted only.
pub const TOP_TOPICS: usize = 20;

/// What the server needs to serve the page: the configuration (for the facts, the preview and
/// the token) and the command that runs.
pub struct PageSetup {
    pub cfg: Config,
    /// `run` or `poll`.
    pub command: &'static str,
}

/// The status page's state, shared by the sampler and the request handlers.
pub struct StatusPage {
    handle: PrometheusHandle,
    health: Arc<Health>,
    cfg: Config,
    started: Instant,
    started_at: String,
    history: Mutex<sample::History>,
    preview: Mutex<Option<(Instant, preview::Preview)>>,
    previewing: AtomicBool,
}

impl StatusPage {
    /// Set the board's facts and start the sampler on the current runtime.
    pub fn start(setup: PageSetup, handle: PrometheusHandle, health: Arc<Health>) -> Arc<StatusPage> {
        board().set_facts(facts(&setup.cfg, setup.command));
        let poll = setup.command == "poll";
        let page = Arc::new(StatusPage {
            handle,
            health,
            cfg: setup.cfg,
            started: Instant::now(),
            started_at: board::now_text(),
            history: Mutex::default(),
            preview: Mutex::new(None),
            previewing: AtomicBool::new(false),
        });
        let p = page.clone();
        let sampler = tokio::spawn(async move {
            let mut tick = tokio::time::interval(sample::SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let scrape = sample::Scrape::parse(&p.handle.render());
                let t = jiff::Timestamp::now().as_millisecond();
                p.history.lock().unwrap_or_else(PoisonError::into_inner).add(t, Instant::now(), &scrape, poll);
            }
        });
        // Never silent: the sampler only ends if it panics.
        tokio::spawn(async move {
            let ended = sampler.await;
            tracing::error!(how = ?ended.err(), "the status page's sampler ended; its charts no longer move (events are not affected)");
        });
        page
    }

    /// Whether the page answers this request head's `Host` ([`host`]). `complete`: the head
    /// ended (a blank line) within what was read; a cut head may have lost its `Host` line, so it
    /// is never answered.
    pub fn host_allowed(&self, head: &str, complete: bool) -> Result<(), String> {
        host_check(head, complete, &self.cfg.status_page_allowed_hosts)
    }

    /// Whether a request may see the page: always without `--status-page-token-file`, else with
    /// `Authorization: Bearer TOKEN` or `?token=TOKEN`.
    pub fn authorized(&self, head: &str, query: &str) -> bool {
        authorized(self.cfg.status_page_token.as_ref().map(|t| t.expose()), head, query)
    }

    /// The current status (renders the exporter once, and starts a preview refresh when due).
    pub fn status(self: &Arc<Self>) -> Status {
        self.refresh_preview_if_due();
        let scrape = sample::Scrape::parse(&self.handle.render());
        let facts = board().facts();
        let (points, rate) = {
            let h = self.history.lock().unwrap_or_else(PoisonError::into_inner);
            (h.points(), h.rate())
        };
        let role = if self.health.standby() {
            "standby"
        } else if facts.command == "poll" {
            if self.health.ready() {
                "polling"
            } else {
                "connecting"
            }
        } else if self.health.streaming() {
            "active"
        } else {
            "connecting"
        };
        let mut topics = scrape.by_label("outboxd_events_total", "topic");
        topics.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let topic_count = topics.len();
        let top =
            topics.into_iter().take(TOP_TOPICS).map(|(topic, n)| TopicCount { topic, events: n as u64 }).collect();
        let by_reason: Vec<ReasonCount> = scrape
            .by_label("outboxd_dlq_events_total", "reason")
            .into_iter()
            .filter(|(_, n)| *n > 0.0)
            .map(|(reason, n)| ReasonCount { reason, events: n as u64 })
            .collect();
        let connections = scrape
            .by_label("outboxd_connected", "component")
            .into_iter()
            .map(|(component, v)| Connection { component, connected: v > 0.0 })
            .collect();
        let poll = (facts.command == "poll").then(|| {
            let tries = scrape.value("outboxd_poll_publish_tries_total").unwrap_or(0.0);
            let errors = scrape.value("outboxd_poll_publish_errors_total").unwrap_or(0.0);
            Poll {
                unpublished_rows: scrape.value("outboxd_poll_unpublished_rows").map(|v| v as u64),
                oldest_unpublished_age_seconds: scrape.value("outboxd_poll_oldest_unpublished_age_seconds"),
                publish_error_ratio: if tries > 0.0 { errors / tries } else { 0.0 },
            }
        });
        let preview = self.preview.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|(_, p)| p.clone());
        let figures = sample::Figures::of(&scrape, facts.command == "poll");
        Status {
            version: concat!("outboxd ", env!("CARGO_PKG_VERSION")),
            role,
            ready: self.health.ready(),
            live: self.health.live(),
            started_at: self.started_at.clone(),
            uptime_seconds: self.started.elapsed().as_secs(),
            lag: Lag { bytes: figures.lag_bytes.map(|v| v as u64), seconds: figures.lag_seconds },
            events_total: sample::events_total(&scrape) as u64,
            events_per_second: rate,
            in_flight: InFlight {
                records: figures.in_flight.map(|v| v as u64),
                records_max: facts.max_in_flight,
                bytes: figures.in_flight.map(|_| board().in_flight_bytes()),
                bytes_max: facts.max_in_flight_bytes,
                oldest_unacked_age_seconds: figures.oldest_unacked,
            },
            connections,
            last_error: board().last_problem(),
            dead_letters: DeadLetters {
                destination: facts.dead_letter_destination.clone(),
                on_bad_event: facts.on_bad_event.clone(),
                total: by_reason.iter().map(|r| r.events).sum(),
                by_reason,
                newest: board().newest_dead_letters(),
                list_command: facts.dlq_list_command.clone(),
                replay_command: facts.dlq_replay_command.clone(),
            },
            topics: Topics { count: topic_count, top },
            routing_preview: preview,
            poll,
            history: History { interval_seconds: sample::SAMPLE_EVERY.as_secs(), points },
            facts,
        }
    }

    /// The page's HTML, with the current figures filled in (readable without JavaScript).
    pub fn html(self: &Arc<Self>, token_query: Option<&str>) -> String {
        page::render(&self.status(), token_query)
    }

    fn refresh_preview_if_due(self: &Arc<Self>) {
        let due = match &*self.preview.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((at, _)) => at.elapsed() >= preview::PREVIEW_TTL,
            None => true,
        };
        if !due || self.previewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let page = self.clone();
        let read = tokio::spawn(async move {
            // Cleared however the read ends (a panic too), so a later page asks again.
            let _done = Previewed(&page.previewing);
            let p = preview::read(&page.cfg).await;
            *page.preview.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), p));
        });
        tokio::spawn(async move {
            if let Err(e) = read.await {
                tracing::error!(error = %e, "the status page's routing preview read failed; the next page view tries again");
            }
        });
    }
}

/// A page served by the HTTP endpoint (`serve.rs`): `run`'s and `poll`'s [`StatusPage`], or
/// `outboxd inbox`'s [`inbox::InboxPage`].
pub trait Page: Send + Sync {
    /// Whether the page answers this request head's `Host` ([`host`]); `complete`: the head ended.
    fn host_allowed(&self, head: &str, complete: bool) -> Result<(), String>;
    /// Whether the request carries the page's token, when it has one.
    fn authorized(&self, head: &str, query: &str) -> bool;
    /// `/status.json`.
    fn json(&self) -> String;
    /// `/`, the figures filled in; `token_query` is `token=…` when the page was asked for with one.
    fn html(&self, token_query: Option<&str>) -> String;
    /// `/status.js`.
    fn script(&self) -> &'static str;
}

impl Page for Arc<StatusPage> {
    fn host_allowed(&self, head: &str, complete: bool) -> Result<(), String> {
        StatusPage::host_allowed(self, head, complete)
    }

    fn authorized(&self, head: &str, query: &str) -> bool {
        StatusPage::authorized(self, head, query)
    }

    fn json(&self) -> String {
        serde_json::to_string(&self.status()).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    fn html(&self, token_query: Option<&str>) -> String {
        StatusPage::html(self, token_query)
    }

    fn script(&self) -> &'static str {
        page::JS
    }
}

/// Whether a page answers a request head's `Host` ([`host`]), besides the names `listed`. A cut
/// head may have lost its `Host` line, so it is never answered.
pub fn host_check(head: &str, complete: bool, listed: &[String]) -> Result<(), String> {
    if !complete {
        return Err("the request head is over 8 KiB or ended early; the status page answers only a whole head\n".into());
    }
    let h = host::header(head);
    // HTTP/1.1 requires Host; only an HTTP/1.0 request may come without one.
    let http10 = head.lines().next().is_some_and(|l| l.trim_end().ends_with("HTTP/1.0"));
    if h.is_none() && !http10 {
        return Err("the request has no Host header; HTTP/1.1 requires one\n".into());
    }
    if host::allowed(h, listed) {
        Ok(())
    } else {
        Err(host::refusal(h.unwrap_or_default()))
    }
}

/// Clears the "a preview is being read" flag when dropped.
struct Previewed<'a>(&'a AtomicBool);

impl Drop for Previewed<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Whether a request (its head and query string) carries `token`; any request does when there is
/// none.
fn authorized(token: Option<&str>, head: &str, query: &str) -> bool {
    let Some(token) = token else { return true };
    let bearer = head.lines().filter_map(|l| l.split_once(':')).find_map(|(k, v)| {
        let (scheme, credentials) = v.trim().split_once(' ')?;
        (k.trim().eq_ignore_ascii_case("authorization") && scheme.eq_ignore_ascii_case("bearer"))
            .then(|| credentials.trim())
    });
    let given = match bearer {
        Some(b) => Some(std::borrow::Cow::Borrowed(b)),
        // The address carries it percent-encoded, as a browser writes it.
        None => query
            .split('&')
            .find_map(|kv| kv.strip_prefix("token="))
            .map(|v| percent_encoding::percent_decode_str(v).decode_utf8_lossy()),
    };
    given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes()))
}

/// Equal, in a time that says nothing about where they differ or how long the token is (both
/// sides are hashed first).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The board's facts for this configuration.
pub fn facts(cfg: &Config, command: &str) -> Facts {
    let dlq_sink = cfg.dlq_sink.unwrap_or(cfg.sink);
    let dlq_flags = format!("--sink {} --dlq-topic {}", value_name(dlq_sink), cfg.dlq_topic);
    Facts {
        command: command.to_owned(),
        slot: cfg.slot.clone(),
        publication: cfg.publication.clone(),
        server: cfg.postgres.to_string(),
        tables: cfg.tables.iter().map(|t| t.to_string()).collect(),
        sink: value_name(cfg.sink),
        dead_letter_sink: cfg.dlq_sink.filter(|k| *k != cfg.sink).map(value_name),
        on_bad_event: value_name(cfg.on_bad_event),
        dead_letter_destination: cfg.dlq_topic.clone(),
        max_in_flight: cfg.max_in_flight as u64,
        max_in_flight_bytes: cfg.max_in_flight_bytes as u64,
        dlq_list_command: format!("outboxd dlq list {dlq_flags} --limit 100"),
        dlq_replay_command: format!("outboxd dlq replay {dlq_flags} --dry-run"),
    }
}

/// `/status.json`: see [`FIELDS`] for each field's meaning.
#[derive(Debug, Serialize)]
pub struct Status {
    pub version: &'static str,
    pub role: &'static str,
    pub ready: bool,
    pub live: bool,
    pub started_at: String,
    pub uptime_seconds: u64,
    pub facts: Facts,
    pub lag: Lag,
    pub events_total: u64,
    pub events_per_second: f64,
    pub in_flight: InFlight,
    pub connections: Vec<Connection>,
    pub last_error: Option<board::Problem>,
    pub dead_letters: DeadLetters,
    pub topics: Topics,
    pub routing_preview: Option<preview::Preview>,
    pub poll: Option<Poll>,
    pub history: History,
}

#[derive(Debug, Serialize)]
pub struct Lag {
    pub bytes: Option<u64>,
    pub seconds: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct InFlight {
    pub records: Option<u64>,
    pub records_max: u64,
    pub bytes: Option<u64>,
    pub bytes_max: u64,
    pub oldest_unacked_age_seconds: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Connection {
    pub component: String,
    pub connected: bool,
}

#[derive(Debug, Serialize)]
pub struct DeadLetters {
    pub destination: String,
    pub on_bad_event: String,
    pub total: u64,
    pub by_reason: Vec<ReasonCount>,
    pub newest: Vec<board::DeadLettered>,
    pub list_command: String,
    pub replay_command: String,
}

#[derive(Debug, Serialize)]
pub struct ReasonCount {
    pub reason: String,
    pub events: u64,
}

#[derive(Debug, Serialize)]
pub struct Topics {
    pub count: usize,
    pub top: Vec<TopicCount>,
}

#[derive(Debug, Serialize)]
pub struct TopicCount {
    pub topic: String,
    pub events: u64,
}

#[derive(Debug, Serialize)]
pub struct Poll {
    pub unpublished_rows: Option<u64>,
    pub oldest_unpublished_age_seconds: Option<f64>,
    pub publish_error_ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct History {
    pub interval_seconds: u64,
    pub points: Vec<sample::Point>,
}

/// Every field of `/status.json` with its meaning, in the manual's order (`docs/src/status-page.md`
/// is generated from it, and a test holds the JSON to it). Arrays are written `field[]`.
pub const FIELDS: &[(&str, &str)] = &[
    ("version", "The build: `outboxd` and its version."),
    ("role", "`active` (streaming the slot), `standby` (another process holds it), `polling` (`outboxd poll`), or `connecting`."),
    ("ready", "What `/readyz` answers: streaming (or polling) and the sink reachable."),
    ("live", "What `/healthz` answers: the loop turned within `--health-stall-timeout`."),
    ("started_at", "When this process started (RFC 3339, UTC)."),
    ("uptime_seconds", "Seconds since then."),
    ("facts.command", "`run` or `poll`."),
    ("facts.slot", "The replication slot (`--slot`)."),
    ("facts.publication", "The publication (`--publication`)."),
    ("facts.server", "The PostgreSQL server as `outboxd config` shows it (never a password)."),
    ("facts.tables[]", "The outbox tables (`--table`)."),
    ("facts.sink", "The sink kind (`--sink`)."),
    ("facts.dead_letter_sink", "The dead-letter sink when it differs from the sink (`--dlq-sink`), else null."),
    ("facts.on_bad_event", "What a bad event does (`--on-bad-event`): `fail`, `skip` or `dlq`."),
    ("facts.dead_letter_destination", "The dead-letter topic, stream or subject (`--dlq-topic`)."),
    ("facts.max_in_flight", "The in-flight record budget (`--max-in-flight`)."),
    ("facts.max_in_flight_bytes", "The in-flight byte budget (`--max-in-flight-bytes`)."),
    ("facts.dlq_list_command", "The command that lists the dead-letter queue (add this process's connection flags)."),
    ("facts.dlq_replay_command", "The command that replays it (drop `--dry-run` to publish)."),
    ("lag.bytes", "`outboxd_replication_lag_bytes`: WAL between the server's position and the slot's confirmed position (`run`; 0 before the lag monitor's first poll; null for `poll`)."),
    ("lag.seconds", "`outboxd_lag_seconds` (`run`) or the oldest unpublished row's age (`poll`)."),
    ("events_total", "Events acked by the sink since start, over every topic."),
    ("events_per_second", "Acked events per second over the last sample interval."),
    ("in_flight.records", "Records handed to the sink and not yet acked (`run` and `poll`)."),
    ("in_flight.records_max", "Their budget, `--max-in-flight`."),
    ("in_flight.bytes", "Their bytes (`run` and `poll`)."),
    ("in_flight.bytes_max", "Their budget, `--max-in-flight-bytes`."),
    ("in_flight.oldest_unacked_age_seconds", "Age of the oldest unacked transaction's commit (0 when caught up; `run`; null for `poll`)."),
    ("connections[].component", "`postgres` or a sink (`kafka`, `nats`, `redis`, `rabbitmq`, `http`)."),
    ("connections[].connected", "Whether it is connected now."),
    ("last_error", "The latest WARN or ERROR log line, or null."),
    ("last_error.level", "`WARN` or `ERROR`."),
    ("last_error.message", "The line's message and fields (at most 500 bytes)."),
    ("last_error.at", "When it was logged (RFC 3339, UTC)."),
    ("dead_letters.destination", "The dead-letter topic, stream or subject."),
    ("dead_letters.on_bad_event", "`--on-bad-event`: only `dlq` sends events there."),
    ("dead_letters.total", "Events dead-lettered since start."),
    ("dead_letters.by_reason[].reason", "A reason code (`null_route`, `invalid_topic`, `too_large`, ...)."),
    ("dead_letters.by_reason[].events", "Events dead-lettered for it since start."),
    ("dead_letters.newest[].event_id", "The newest dead-lettered events (at most 50, newest first): the event id, if the row had one."),
    ("dead_letters.newest[].topic", "The topic it was routed to, if routing got that far."),
    ("dead_letters.newest[].reason", "Its reason code."),
    ("dead_letters.newest[].message", "Why, in words (at most 500 bytes; never the payload)."),
    ("dead_letters.newest[].at", "When it was dead-lettered (RFC 3339, UTC)."),
    ("dead_letters.list_command", "The command that lists the whole dead-letter queue."),
    ("dead_letters.replay_command", "The command that replays it."),
    ("topics.count", "Topics events were acked to since start (at most 1001: see `outboxd_events_total`)."),
    ("topics.top[].topic", "The 20 topics with the most acked events."),
    ("topics.top[].events", "Events acked to it since start."),
    ("routing_preview", "Null until the first preview has been read (a page view starts it; refreshed at most every 30 s)."),
    ("routing_preview.checked_at", "When the rows were read."),
    ("routing_preview.tables[].table", "An outbox table."),
    ("routing_preview.tables[].routes[].value", "A `--route-by-field` value among its newest 200 rows (null for rows without one)."),
    ("routing_preview.tables[].routes[].topic", "The topic that value routes to (null for a null value)."),
    ("routing_preview.tables[].routes[].rows", "Sampled rows with that value."),
    ("routing_preview.tables[].routes[].problem", "`null_route` or `invalid_topic` when such rows would be bad events, `too_long_to_preview` for a value over 1000 bytes (shown cut, not routed here), else null."),
    ("routing_preview.tables[].error", "Why the table could not be read, else null."),
    ("poll", "`outboxd poll` only (null for `run`): the outbox's own three signals."),
    ("poll.unpublished_rows", "Rows not yet published, as of the last backlog query."),
    ("poll.oldest_unpublished_age_seconds", "The oldest unpublished row's age."),
    ("poll.publish_error_ratio", "Refused tries over all tries since start."),
    ("history.interval_seconds", "Seconds between chart points (5)."),
    ("history.points[].t", "A point's time (Unix milliseconds); at most 180 points, 15 minutes, oldest first."),
    ("history.points[].lag_bytes", "`lag.bytes` then."),
    ("history.points[].lag_seconds", "`lag.seconds` then."),
    ("history.points[].events_per_second", "Acked events per second over the interval before it."),
];

/// The manual's `/status.json` table, generated from [`FIELDS`].
pub fn fields_markdown() -> String {
    let mut out = String::from("| field | meaning |\n|---|---|\n");
    for (f, m) in FIELDS {
        out.push_str(&format!("| `{f}` | {m} |\n"));
    }
    out
}

#[cfg(test)]
mod tests;
