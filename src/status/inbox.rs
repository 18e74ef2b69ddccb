//! The status page of `outboxd inbox`: `/` (HTML) and `/status.json` on `--metrics-addr`, the
//! inbox at a glance: each assigned partition with its offset stored in PostgreSQL, its end in
//! Kafka and its lag, the inbox table's unprocessed rows and the oldest one's age, the writer's
//! state (running, or paused while PostgreSQL, the registry or a dead-letter copy is waited
//! for), and the dead letters.
//!
//! Where the figures come from, as for `run`'s page ([`super`]): the Prometheus exporter's text
//! (rows, duplicates, the backlog gauges, dead letters by reason), [`Health`] (ready, live), the
//! [`board`](super::board) (the newest dead letters, the last WARN or ERROR line), and the
//! [`InboxBoard`] here, which the inbox writes where things change: a partition's stored offset
//! after each batch commits (not per record), its end and lag every second, the writer's
//! state when it pauses or resumes. The machinery (the `Host` check, the token check, the
//! stylesheet, escaping, the dead-letter section) is the run page's, and so are its flags
//! (`--status-page-token-file`, `--status-page-allowed-hosts`: [`Access`]).
//!
//! Invariants: bounded (a group's assigned partitions, the board's ring); nothing secret (the
//! server is `outboxd config`'s masked form; no payload is kept; the token is compared, never
//! shown); read-only.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;

use super::board::{self, board};
use super::page::esc;
use super::sample::Scrape;
use crate::format::Password;
use crate::health::Health;

/// Who may read the page, as for `run`'s: with a token, only requests that carry it
/// (`Authorization: Bearer` or `?token=`); besides localhost and IP addresses, only the `Host`
/// names listed. `/metrics` and the probes are not the page's and answer anyone.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// `--status-page-token-file`.
    pub token: Option<Password>,
    /// `--status-page-allowed-hosts`, checked.
    pub allowed_hosts: Vec<String>,
}

/// What the inbox is and where it points, set once at start.
#[derive(Clone, Debug, Default, Serialize)]
pub struct InboxFacts {
    pub group: String,
    /// `schema.table`.
    pub table: String,
    /// The topics, or the pattern, read.
    pub topics: String,
    /// The consumer's PostgreSQL as `outboxd config` shows it (no password).
    pub server: String,
    pub dead_letter_topic: String,
    pub batch_size: u64,
}

/// One assigned partition.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PartitionState {
    pub topic: String,
    pub partition: i32,
    /// The next offset stored in PostgreSQL (where a restart reads from), as of the last commit.
    pub stored_offset: Option<i64>,
    /// The partition's end a read_committed reader can reach (its last stable offset), as of the
    /// last statistics.
    pub high_watermark: Option<i64>,
    pub lag_records: Option<i64>,
    pub lag_seconds: Option<f64>,
}

/// The writer's state.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WriterState {
    /// `starting`, `running` or `paused`.
    pub state: &'static str,
    /// Why it is paused (the last error), else null.
    pub reason: Option<String>,
    /// Since when it is in this state (RFC 3339, UTC).
    pub since: String,
}

/// The figures the inbox writes for its page ([`inbox_board`]).
pub struct InboxBoard {
    partitions: Mutex<BTreeMap<(String, i32), PartitionState>>,
    writer: Mutex<WriterState>,
}

/// The process's one inbox board.
pub fn inbox_board() -> &'static InboxBoard {
    static BOARD: OnceLock<InboxBoard> = OnceLock::new();
    BOARD.get_or_init(|| InboxBoard {
        partitions: Mutex::default(),
        writer: Mutex::new(WriterState { state: "starting", reason: None, since: board::now_text() }),
    })
}

impl InboxBoard {
    fn parts(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, i32), PartitionState>> {
        self.partitions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A partition assigned here, starting at `stored` (None: not stored yet).
    pub fn assigned(&self, topic: &str, partition: i32, stored: Option<i64>) {
        let state = PartitionState { topic: topic.to_owned(), partition, stored_offset: stored, ..Default::default() };
        self.parts().insert((topic.to_owned(), partition), state);
    }

    /// A partition no longer assigned here: the process that holds it now shows it.
    pub fn revoked(&self, topic: &str, partition: i32) {
        self.parts().remove(&(topic.to_owned(), partition));
    }

    /// A batch committed: the partition's next offset stored in PostgreSQL.
    pub fn stored(&self, topic: &str, partition: i32, next: i64) {
        if let Some(p) = self.parts().get_mut(&(topic.to_owned(), partition)) {
            p.stored_offset = Some(p.stored_offset.map_or(next, |s| s.max(next)));
        }
    }

    /// The lag's turn (every second): the partition's end and lag (only while assigned here).
    pub fn lag(&self, topic: &str, partition: i32, end: i64, records: i64, seconds: Option<f64>) {
        if let Some(p) = self.parts().get_mut(&(topic.to_owned(), partition)) {
            p.high_watermark = Some(end);
            p.lag_records = Some(records);
            p.lag_seconds = seconds.or(p.lag_seconds);
        }
    }

    /// The writer wrote a batch (`None`) or is paused for `reason`; the state's time moves only
    /// when the state changes.
    pub fn writer(&self, paused: Option<&str>) {
        let mut w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let state = if paused.is_some() { "paused" } else { "running" };
        if w.state != state {
            w.since = board::now_text();
        }
        w.state = state;
        w.reason = paused.map(|r| board::cut(r, board::MAX_TEXT));
    }

    pub fn partitions(&self) -> Vec<PartitionState> {
        self.parts().values().cloned().collect()
    }

    pub fn writer_state(&self) -> WriterState {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// `/status.json` of `outboxd inbox`.
#[derive(Debug, Serialize)]
pub struct InboxStatus {
    pub version: &'static str,
    /// Always `inbox`: tells this JSON from `run`'s.
    pub command: &'static str,
    pub ready: bool,
    pub live: bool,
    pub started_at: String,
    pub uptime_seconds: u64,
    pub facts: InboxFacts,
    pub writer: WriterState,
    pub partitions: Vec<PartitionState>,
    /// Rows inserted and duplicates skipped since start.
    pub rows_total: u64,
    pub duplicates_total: u64,
    /// The inbox table's unprocessed rows and the oldest one's age, as of the last backlog query
    /// (every 5 s); null before the first.
    pub unprocessed_rows: Option<u64>,
    pub oldest_unprocessed_seconds: Option<f64>,
    pub dead_letters: super::DeadLetters,
    pub last_error: Option<board::Problem>,
}

/// The inbox's page state, shared by the request handlers.
pub struct InboxPage {
    handle: PrometheusHandle,
    health: Arc<Health>,
    facts: InboxFacts,
    access: Access,
    started: Instant,
    started_at: String,
}

impl InboxPage {
    pub fn new(facts: InboxFacts, access: Access, handle: PrometheusHandle, health: Arc<Health>) -> InboxPage {
        InboxPage { handle, health, facts, access, started: Instant::now(), started_at: board::now_text() }
    }

    pub fn status(&self) -> InboxStatus {
        let scrape = Scrape::parse(&self.handle.render());
        let by_reason: Vec<super::ReasonCount> = scrape
            .by_label("outboxd_inbox_dlq_total", "reason")
            .into_iter()
            .filter(|(_, n)| *n > 0.0)
            .map(|(reason, n)| super::ReasonCount { reason, events: n as u64 })
            .collect();
        let flags = format!("--sink kafka --dlq-topic {}", self.facts.dead_letter_topic);
        InboxStatus {
            version: concat!("outboxd ", env!("CARGO_PKG_VERSION")),
            command: "inbox",
            ready: self.health.ready(),
            live: self.health.live(),
            started_at: self.started_at.clone(),
            uptime_seconds: self.started.elapsed().as_secs(),
            facts: self.facts.clone(),
            writer: inbox_board().writer_state(),
            partitions: inbox_board().partitions(),
            rows_total: scrape.value("outboxd_inbox_rows_total").unwrap_or(0.0) as u64,
            duplicates_total: scrape.value("outboxd_inbox_duplicates_total").unwrap_or(0.0) as u64,
            unprocessed_rows: scrape.value("outboxd_inbox_unprocessed_rows").map(|v| v as u64),
            oldest_unprocessed_seconds: scrape.value("outboxd_inbox_oldest_unprocessed_seconds"),
            dead_letters: super::DeadLetters {
                destination: self.facts.dead_letter_topic.clone(),
                on_bad_event: "dlq".into(),
                total: by_reason.iter().map(|r| r.events).sum(),
                by_reason,
                newest: board().newest_dead_letters(),
                list_command: format!("outboxd dlq list {flags} --limit 100"),
                replay_command: format!("outboxd dlq replay {flags} --dry-run"),
            },
            last_error: board().last_problem(),
        }
    }
}

impl super::Page for InboxPage {
    fn host_allowed(&self, head: &str, complete: bool) -> Result<(), String> {
        super::host_check(head, complete, &self.access.allowed_hosts)
    }

    fn authorized(&self, head: &str, query: &str) -> bool {
        super::authorized(self.access.token.as_ref().map(|t| t.expose()), head, query)
    }

    fn json(&self) -> String {
        serde_json::to_string(&self.status()).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    fn html(&self, token_query: Option<&str>) -> String {
        render(&self.status(), token_query)
    }

    fn script(&self) -> &'static str {
        SCRIPT
    }
}

/// The inbox page's script, served at `/status.js`: redraws the figures from `/status.json`.
const SCRIPT: &str = include_str!("inbox.js");

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "–".to_owned(), f)
}

/// The whole page, every figure filled in on the server (it reads without JavaScript).
/// `token_query` is `token=…` when the page was asked for with one, so the script's requests and
/// the JSON link carry it too.
pub fn render(s: &InboxStatus, token_query: Option<&str>) -> String {
    let f = &s.facts;
    let q = token_query.map(|t| format!("?{}", esc(t))).unwrap_or_default();
    let mut h = String::with_capacity(8 * 1024);
    h.push_str(&format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>outboxd inbox · {group}</title><link rel=\"stylesheet\" href=\"/status.css\"></head>\n\
         <body data-json=\"/status.json{q}\" data-rendered=\"0\">\n<header><h1>outboxd inbox</h1>\
         <span id=\"writer\" class=\"badge {wclass}\">{wstate}</span>\
         <span id=\"ready\" class=\"badge {rclass}\">{ready}</span>\
         <dl class=\"facts\"><dt>group</dt><dd id=\"group\">{group}</dd><dt>table</dt><dd id=\"table\">{table}</dd>\
         <dt>topics</dt><dd id=\"topics\">{topics}</dd><dt>server</dt><dd id=\"server\">{server}</dd>\
         <dt>up</dt><dd id=\"uptime\">{up}</dd><dt>build</dt><dd>{version}</dd></dl></header>\n<main>\n",
        group = esc(&f.group),
        table = esc(&f.table),
        topics = esc(&f.topics),
        server = esc(&f.server),
        wclass = if s.writer.state == "running" { "ok" } else { "bad" },
        wstate = esc(s.writer.state),
        rclass = if s.ready { "ok" } else { "bad" },
        ready = if s.ready { "ready" } else { "not ready" },
        up = esc(&format!("{} s (since {})", s.uptime_seconds, s.started_at)),
        version = esc(s.version),
    ));
    let card = |id: &str, label: &str, value: String| {
        format!(
            "<div class=\"card\"><div class=\"label\">{label}</div><div class=\"value\" id=\"{id}\">{}</div></div>",
            esc(&value)
        )
    };
    let lag: i64 = s.partitions.iter().filter_map(|p| p.lag_records).sum();
    h.push_str("<section class=\"cards\">");
    h.push_str(&card("rows-total", "rows inserted", s.rows_total.to_string()));
    h.push_str(&card("duplicates-total", "duplicates skipped", s.duplicates_total.to_string()));
    h.push_str(&card("unprocessed", "unprocessed rows", opt(s.unprocessed_rows, |v| v.to_string())));
    h.push_str(&card("oldest", "oldest unprocessed", opt(s.oldest_unprocessed_seconds, |v| format!("{v:.1} s"))));
    h.push_str(&card("lag-records", "lag (records)", lag.to_string()));
    h.push_str("</section>\n");
    h.push_str(&format!(
        "<section><h2>Writer</h2><p id=\"writer-state\">{} since {}{}</p></section>\n",
        esc(s.writer.state),
        esc(&s.writer.since),
        s.writer.reason.as_deref().map(|r| format!(": {}", esc(r))).unwrap_or_default()
    ));
    h.push_str(
        "<section><h2>Partitions</h2><table><thead><tr><th>topic</th><th>partition</th><th>stored offset</th>\
         <th>high watermark</th><th>lag (records)</th><th>lag (seconds)</th></tr></thead><tbody id=\"partitions\">",
    );
    for p in &s.partitions {
        h.push_str(&format!(
            "<tr data-partition=\"{}/{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&p.topic),
            p.partition,
            esc(&p.topic),
            p.partition,
            opt(p.stored_offset, |v| v.to_string()),
            opt(p.high_watermark, |v| v.to_string()),
            opt(p.lag_records, |v| v.to_string()),
            opt(p.lag_seconds, |v| format!("{v:.1}")),
        ));
    }
    h.push_str("</tbody></table></section>\n");
    super::page::dead_letter_section(&mut h, &s.dead_letters);
    h.push_str("<section><h2>Last error</h2><p id=\"last-error\">");
    match &s.last_error {
        Some(e) => h.push_str(&format!("{} {} <time>{}</time>", esc(&e.level), esc(&e.message), esc(&e.at))),
        None => h.push_str("none"),
    }
    h.push_str(&format!(
        "</p></section>\n</main><footer>The same data: <a href=\"/status.json{q}\">/status.json</a> · \
         <a href=\"/metrics\">/metrics</a> · updated <span id=\"updated\">now</span></footer>\n\
         <script src=\"/status.js\"></script></body></html>\n"
    ));
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_shown_while_assigned_and_its_stored_offset_only_grows() {
        let b = InboxBoard {
            partitions: Mutex::default(),
            writer: Mutex::new(WriterState { state: "starting", reason: None, since: String::new() }),
        };
        b.assigned("t", 0, Some(5));
        b.stored("t", 0, 9);
        b.stored("t", 0, 7);
        b.lag("t", 0, 20, 11, Some(1.5));
        b.stored("t", 1, 3);
        let p = b.partitions();
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].stored_offset, p[0].high_watermark, p[0].lag_records), (Some(9), Some(20), Some(11)));
        b.revoked("t", 0);
        b.lag("t", 0, 30, 4, None);
        assert!(b.partitions().is_empty());
        b.writer(Some("PostgreSQL: connection refused"));
        assert_eq!(b.writer_state().state, "paused");
        b.writer(None);
        assert_eq!((b.writer_state().state, b.writer_state().reason), ("running", None));
    }

    #[test]
    fn the_page_escapes_what_it_shows() {
        let s = InboxStatus {
            version: "outboxd 0",
            command: "inbox",
            ready: true,
            live: true,
            started_at: String::new(),
            uptime_seconds: 1,
            facts: InboxFacts { group: "<g>".into(), ..Default::default() },
            writer: WriterState { state: "running", reason: None, since: String::new() },
            partitions: vec![PartitionState { topic: "<t>".into(), ..Default::default() }],
            rows_total: 0,
            duplicates_total: 0,
            unprocessed_rows: None,
            oldest_unprocessed_seconds: None,
            dead_letters: super::super::DeadLetters {
                destination: String::new(),
                on_bad_event: String::new(),
                total: 0,
                by_reason: vec![],
                newest: vec![],
                list_command: String::new(),
                replay_command: String::new(),
            },
            last_error: None,
        };
        let h = render(&s, None);
        assert!(!h.contains("<g>") && !h.contains("<t>") && h.contains("&lt;t&gt;"), "{h}");
        // Asked for with a token, the script's requests and the JSON link carry it, escaped.
        let h = render(&s, Some("token=a\"b"));
        assert!(h.contains("data-json=\"/status.json?token=a&quot;b\"") && !h.contains("a\"b"), "{h}");
        assert!(h.contains("href=\"/status.json?token=a&quot;b\""), "{h}");
    }
}
