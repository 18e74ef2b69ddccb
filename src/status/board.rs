//! The status board: the few facts the status page shows that `/metrics` does not carry, written
//! where they change and read only when a page or `/status.json` is rendered.
//!
//! Invariants:
//! - Nothing here is written per event. The dead-letter ring is written per dead-lettered event (a
//!   bad event, already logged), the last problem per WARN or ERROR log line, the in-flight bytes
//!   per status update of the replication loop (`--status-interval`), the facts once per start.
//! - Everything is bounded: [`NEWEST_DEAD_LETTERS`] entries, messages cut at [`MAX_TEXT`] bytes.
//! - Nothing secret enters: the facts are the masked forms `outboxd config` shows, the messages are
//!   the log lines' own text (which never carry secrets), and no payload is kept.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use serde::Serialize;

/// Dead-lettered events the page lists, newest first; the DLQ itself holds all of them.
pub const NEWEST_DEAD_LETTERS: usize = 50;
/// Longest message or reason kept, in bytes (cut at a character boundary).
pub const MAX_TEXT: usize = 500;

/// What this process is and where it points: set once at start, before the page is served.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Facts {
    /// `run` (the replication slot) or `poll` (the polled table).
    pub command: String,
    pub slot: String,
    pub publication: String,
    /// The PostgreSQL server as `outboxd config` shows it (no password).
    pub server: String,
    pub tables: Vec<String>,
    /// The sink kind (`kafka`, `nats`, ...), and the dead-letter sink when it differs.
    pub sink: String,
    pub dead_letter_sink: Option<String>,
    pub on_bad_event: String,
    /// The dead-letter destination (a topic, stream, subject or queue name).
    pub dead_letter_destination: String,
    pub max_in_flight: u64,
    pub max_in_flight_bytes: u64,
    /// `outboxd dlq list` and `outboxd dlq replay` command lines for this deployment's DLQ.
    pub dlq_list_command: String,
    pub dlq_replay_command: String,
}

/// One dead-lettered event, as the page lists it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DeadLettered {
    pub event_id: Option<String>,
    /// The topic the event was routed to, when routing got that far.
    pub topic: Option<String>,
    pub reason: String,
    pub message: String,
    /// RFC 3339, UTC.
    pub at: String,
}

/// The latest WARN or ERROR log line.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Problem {
    pub level: String,
    pub message: String,
    pub at: String,
}

/// The process-wide board (see the module doc).
#[derive(Debug, Default)]
pub struct Board {
    facts: Mutex<Facts>,
    dead_letters: Mutex<VecDeque<DeadLettered>>,
    last_problem: Mutex<Option<Problem>>,
    /// Written by the replication loop (`run`) only.
    in_flight_bytes: AtomicU64,
}

static BOARD: OnceLock<Board> = OnceLock::new();

/// The board every part of the process writes to.
pub fn board() -> &'static Board {
    BOARD.get_or_init(Board::default)
}

/// Now, as RFC 3339 in UTC with milliseconds.
pub fn now_text() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_millisecond(now.as_millisecond()).unwrap_or(now).to_string()
}

/// `s` cut to at most `max` bytes at a character boundary, with `…` when cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl Board {
    pub fn set_facts(&self, facts: Facts) {
        *self.facts.lock().unwrap_or_else(PoisonError::into_inner) = facts;
    }

    pub fn facts(&self) -> Facts {
        self.facts.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// A bad event went to the dead-letter destination.
    pub fn dead_lettered(&self, event_id: Option<&str>, topic: Option<&str>, reason: &str, message: &str) {
        let entry = DeadLettered {
            event_id: event_id.map(|s| cut(s, MAX_TEXT)),
            topic: topic.map(|s| cut(s, MAX_TEXT)),
            reason: reason.to_owned(),
            message: cut(message, MAX_TEXT),
            at: now_text(),
        };
        let mut ring = self.dead_letters.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.len() == NEWEST_DEAD_LETTERS {
            ring.pop_back();
        }
        ring.push_front(entry);
    }

    /// The newest dead-lettered events, newest first.
    pub fn newest_dead_letters(&self) -> Vec<DeadLettered> {
        self.dead_letters.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
    }

    /// A WARN or ERROR line. Any URL in it is masked as `outboxd config` masks URLs, in case a
    /// line ever carries one with credentials (log lines must not, but the page has no token by
    /// default).
    pub fn problem(&self, level: &str, message: &str) {
        let masked: Vec<String> = message
            .split(' ')
            .map(|w| if w.contains("://") { crate::secret::mask_url(w) } else { w.to_owned() })
            .collect();
        let p = Problem { level: level.to_owned(), message: cut(&masked.join(" "), MAX_TEXT), at: now_text() };
        *self.last_problem.lock().unwrap_or_else(PoisonError::into_inner) = Some(p);
    }

    pub fn last_problem(&self) -> Option<Problem> {
        self.last_problem.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The replication loop's bytes handed to the sink and not yet resolved (per status update).
    pub fn set_in_flight_bytes(&self, bytes: usize) {
        self.in_flight_bytes.store(bytes as u64, Ordering::Relaxed);
    }

    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes.load(Ordering::Relaxed)
    }
}

/// A tracing layer that keeps the latest WARN or ERROR line on the [`board`]: the page's "last
/// error". Lines below WARN cost one level comparison.
pub struct ProblemLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ProblemLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: tracing_subscriber::layer::Context<'_, S>) {
        let level = *event.metadata().level();
        if level > tracing::Level::WARN {
            return;
        }
        let mut text = Text::default();
        event.record(&mut text);
        board().problem(level.as_str(), &text.line());
    }
}

/// The event's fields in order. An event can carry two `message` fields (the format string, which
/// the macros record first, and an explicit `message = …`): the first one leads, as the text log
/// shows it, and the others follow as `message=…`.
#[derive(Default)]
struct Text {
    fields: Vec<(&'static str, String)>,
    bytes: usize,
}

impl Text {
    fn push(&mut self, name: &'static str, value: String) {
        if self.bytes <= MAX_TEXT {
            self.bytes += name.len() + value.len() + 2;
            self.fields.push((name, value));
        }
    }

    fn line(mut self) -> String {
        let lead = self.fields.iter().position(|(k, _)| *k == "message").map(|i| self.fields.remove(i).1);
        let mut out = lead.unwrap_or_default();
        for (k, v) in self.fields {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(k);
            out.push('=');
            out.push_str(&v);
        }
        out
    }
}

impl tracing::field::Visit for Text {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        // The format string arrives as `Arguments`, whose Debug is its text already.
        if field.name() == "message" {
            self.push(field.name(), text);
        } else if let Some(v) = for_people(&text) {
            self.push(field.name(), v);
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.push(field.name(), value.to_owned());
    }
}

/// A field recorded with `?` (Rust's `Debug`) as a person reads it: `Some(x)` as `x`, a quoted
/// string as its text, `None` as no field at all. Anything else is kept.
fn for_people(debug: &str) -> Option<String> {
    let mut v = debug;
    if v == "None" {
        return None;
    }
    // `Some(a), Some(b)` is not one `Some`: only a wrapper whose parentheses pair up is taken off.
    while let Some(inner) = v.strip_prefix("Some(").and_then(|r| r.strip_suffix(')')).filter(|i| balanced(i)) {
        v = inner;
    }
    Some(unquote(v).unwrap_or_else(|| v.to_owned()))
}

/// Whether every `)` in `s` closes an earlier `(` (quotes aside: good enough for `Debug` text).
fn balanced(s: &str) -> bool {
    let mut depth = 0i32;
    for c in s.chars() {
        depth += match c {
            '(' => 1,
            ')' => -1,
            _ => 0,
        };
        if depth < 0 {
            return false;
        }
    }
    depth == 0
}

/// The text of a string literal as `Debug` writes it (`"say \"hi\""`), or `None` when `v` is not
/// exactly one. Escapes of control characters (`\n`, `\u{1b}`) stay escaped: a log line is one
/// line.
fn unquote(v: &str) -> Option<String> {
    let body = v.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return None,
            '\\' => match chars.next()? {
                c @ ('"' | '\\' | '\'') => out.push(c),
                c => {
                    out.push('\\');
                    out.push(c);
                }
            },
            c => out.push(c),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_fields_read_as_people_write_them() {
        for (debug, want) in [
            (r#"Some("e-1")"#, Some("e-1")),
            (r#""plain""#, Some("plain")),
            (r#"Some("say \"hi\"\n\u{1b} \\")"#, Some(r#"say "hi"\n\u{1b} \"#)),
            ("None", None),
            ("Some(42)", Some("42")),
            ("Some(Some(\"x\"))", Some("x")),
            ("Duration { secs: 1 }", Some("Duration { secs: 1 }")),
            (r#""a" "b""#, Some(r#""a" "b""#)),
            ("Some(1), Some(2)", Some("Some(1), Some(2)")),
        ] {
            assert_eq!(for_people(debug).as_deref(), want, "{debug}");
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_entries_first_and_is_bounded() {
        let b = Board::default();
        for i in 0..(NEWEST_DEAD_LETTERS + 7) {
            b.dead_lettered(Some(&format!("e{i}")), Some("t"), "null_route", &"x".repeat(2 * MAX_TEXT));
        }
        let all = b.newest_dead_letters();
        assert_eq!(all.len(), NEWEST_DEAD_LETTERS);
        assert_eq!(all[0].event_id.as_deref(), Some(&*format!("e{}", NEWEST_DEAD_LETTERS + 6)));
        assert_eq!(all.last().unwrap().event_id.as_deref(), Some("e7"));
        assert!(all[0].message.len() <= MAX_TEXT + '…'.len_utf8());
    }

    #[test]
    fn cut_respects_character_boundaries() {
        assert_eq!(cut("héllo", 2), "h…");
        assert_eq!(cut("abc", 3), "abc");
    }

    #[test]
    fn urls_in_a_problem_are_masked() {
        let b = Board::default();
        b.problem("WARN", "export failed endpoint=https://user:s3cret@collector:4318/v1/traces?api_key=k3y retrying");
        let p = b.last_problem().unwrap();
        assert!(!p.message.contains("s3cret") && !p.message.contains("k3y"), "{}", p.message);
        assert!(p.message.contains("user:****@collector:4318"), "{}", p.message);
    }

    #[test]
    fn the_layer_keeps_warnings_and_errors_with_their_fields() {
        use tracing_subscriber::layer::SubscriberExt;
        let sub = tracing_subscriber::registry().with(ProblemLayer);
        tracing::subscriber::with_default(sub, || {
            tracing::info!("not a problem");
            tracing::warn!(error = "broker down", delay = 2, "replication session ended");
        });
        let p = board().last_problem().unwrap();
        assert_eq!(p.level, "WARN");
        assert_eq!(p.message, "replication session ended error=broker down delay=2");
        // Two message fields (as the relay's dead-letter line has): the format string leads.
        let sub = tracing_subscriber::registry().with(ProblemLayer);
        tracing::subscriber::with_default(sub, || {
            let why = "the route-by column is NULL";
            tracing::warn!(event_id = "e1", message = %why, "sending bad event to the dead-letter topic");
        });
        let p = board().last_problem().unwrap();
        assert_eq!(
            p.message,
            "sending bad event to the dead-letter topic event_id=e1 message=the route-by column is NULL"
        );
        // Fields given with `?`, as Options: for people, not Rust's Debug.
        let sub = tracing_subscriber::registry().with(ProblemLayer);
        tracing::subscriber::with_default(sub, || {
            let (id, topic): (Option<String>, Option<&str>) = (Some("e-7".into()), None);
            tracing::warn!(event_id = ?id, topic = ?topic, reason = "schema", "sending bad event");
        });
        assert_eq!(board().last_problem().unwrap().message, "sending bad event event_id=e-7 reason=schema");
    }
}
