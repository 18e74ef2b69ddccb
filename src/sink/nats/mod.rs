//! The NATS JetStream sink (`--sink nats`): one connection, async publishes, acks in send order.
//!
//! `send` checks what NATS can never take (an invalid subject, a header that cannot be a NATS
//! header, a message over the server's `max_payload`) and rejects it for the bad-event policy;
//! everything else goes as a [`Job`] through a bounded channel to the publisher task. A full
//! channel holds the record here, in order, and reports [`Sink::blocked`] ([`Handoff`]).
//!
//! The publisher task publishes each job on the one connection and keeps up to [`WINDOW`] publish
//! acks outstanding, but **at most one per key and subject**: the next event of a key is handed
//! to the client only after the previous one's ack (or refusal). A connection can lose what was
//! written to it before a reconnect while later messages, written after, are stored; were two
//! events of one key on the wire at once, the lost first one's republish would land after the
//! second (reproduced in `tests/nats.rs` by cutting the link mid-stream). Keyless events are not held
//! back (no order is promised between them). Acks resolve front to back:
//! * a PublishAck → `ack()`: the stream stored the message under its own storage and replication
//!   settings;
//! * a definite refusal of this one message → `reject()`: no stream binds the subject (the
//!   server's "no responders" answer, confirmed by asking JetStream which stream holds the
//!   subject) or JetStream error 10054 (message over the stream's `max_msg_size`);
//! * anything else (timeouts, disconnects, a stream without a leader, storage full) → back off and
//!   publish the whole window again, in order, from the failed message on. `Nats-Msg-Id` (the
//!   event id) makes the server's duplicate window drop the copies it already stored, so a retry
//!   does not duplicate, and since a key has one message in the window, it cannot reorder one.
//!   Nothing is acked on a retry path, so the slot stays where it was.
//!
//! Health: `/readyz` and `outboxd_connected{component="nats"}` follow the client's connection
//! state, checked every second.

pub mod config;
pub(crate) mod dlq;

use std::collections::{HashMap, VecDeque};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::header::HeaderName;
use async_nats::jetstream::context::{Publish, PublishError, PublishErrorKind};
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{connection::State, HeaderMap};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::delivery::Delivery;
use super::handoff::{held_in_handoff, Handoff};
use super::link::Link;
use super::{Sink, SinkError};

use crate::error::Definite;
use crate::health::Health;
use crate::router::Record;
use crate::sink::escape::{copy_id, plain_text, Limits};
use config::NatsConfig;

/// Publish acks outstanding at once, and the channel's capacity.
const WINDOW: usize = 4096;
/// Room left under `max_payload` for the header block when the pipeline sizes dead-letter chunks.
const HEADER_SLACK: usize = 4096;
const MAX_BACKOFF: Duration = Duration::from_secs(5);
const PING_INTERVAL: Duration = Duration::from_secs(5);

/// One record on its way to JetStream.
struct Job {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
    /// The record's parts, for a rejection.
    key: Option<Bytes>,
    record_headers: Vec<crate::router::Header>,
    delivery: Delivery,
}

type AckFuture = Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>;

pub struct NatsSink {
    /// To the publisher task (one lane); owns the publisher and the connection watcher.
    handoff: Handoff<Job>,
    max_payload: usize,
}

impl NatsSink {
    /// Connect, create `--nats-create-stream` if missing, and start the publisher task.
    pub async fn connect(cfg: &NatsConfig, health: Arc<Health>) -> Result<NatsSink, Definite> {
        let url = cfg.url_masked();
        // Pings every few seconds (the default is a minute) so a silent, half-open link is noticed,
        // reconnected and shown on /readyz about as fast as the Kafka sink's metadata check does.
        let mut opts =
            async_nats::ConnectOptions::new().name("outboxd").retry_on_initial_connect().ping_interval(PING_INTERVAL);
        if let Some(creds) = &cfg.creds {
            opts = opts.credentials_file(creds).await.map_err(|e| {
                Definite::Config(format!("--nats-creds {}: {e}; give a NATS .creds file", creds.display()))
            })?;
        }
        // retry_on_initial_connect: a server down at start is waited for (in the background), like
        // a broker outage later; the first publish waits for the connection.
        let client = opts
            .connect(cfg.url.as_str())
            .await
            .map_err(|e| Definite::Config(format!("--nats-url {url}: {e}; check the URL")))?;
        let js = jetstream::new(client.clone());
        if let Some(spec) = &cfg.create_stream {
            let config = jetstream::stream::Config {
                name: spec.name.clone(),
                subjects: spec.subjects.clone(),
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            };
            js.get_or_create_stream(config).await.map_err(|e| {
                Definite::Setup(format!(
                    "--nats-create-stream {spec}: {e}; check the name, that JetStream is enabled at {url}, and that no other stream claims these subjects"
                ))
            })?;
            tracing::info!(stream = %spec.name, "JetStream stream ready");
        }
        let max_payload = match client.server_info().max_payload {
            0 => 1024 * 1024,
            n => n,
        };
        let (tx, rx) = mpsc::channel(WINDOW);
        let publisher = tokio::spawn(publish_loop(js, rx));
        let watcher = tokio::spawn(watch_connection(client, health));
        let handoff = Handoff::new(vec![tx], vec![publisher, watcher], "the NATS publisher task ended");
        Ok(NatsSink { handoff, max_payload })
    }
}

/// The sink's entry in the list of sinks ([`crate::sink::registry`]).
impl crate::sink::registered::Registered for NatsSink {
    const READABLE_DEAD_LETTERS: bool = true;

    async fn build(cfg: &crate::config::Config, health: Arc<Health>) -> Result<Self, Definite> {
        NatsSink::connect(&cfg.nats, health).await
    }

    fn probe(cfg: &crate::config::Config) -> crate::sink::registered::Probe {
        let (shown, url) = (cfg.nats.url_masked(), cfg.nats.url.clone());
        crate::sink::registered::Probe::Tcp { name: "nats", shown, url, default_port: 4222 }
    }
}

impl Sink for NatsSink {
    fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        let job = match job(record, delivery, self.max_payload) {
            Ok(j) => j,
            Err(e) => return Err(*e),
        };
        self.handoff.push(0, job)
    }

    held_in_handoff!();

    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.max_payload.saturating_sub(HEADER_SLACK).max(1))
    }

    fn copy_limits(&self) -> Limits {
        COPY_LIMITS
    }
}

/// What a dead-letter copy carries as it is ([`crate::sink::escape`]): header names NATS takes,
/// except `key` (the record key's header) and `Nats-*` (JetStream reads those: a stray
/// `Nats-Expected-Stream` would make it refuse the copy); values, key and `Nats-Msg-Id` as
/// [`plain_text`], since the client trims a value's surrounding whitespace when reading.
const COPY_LIMITS: Limits = Limits {
    header: |name, value| {
        HeaderName::from_str(name).is_ok()
            && name != "key"
            && !name.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("nats-"))
            && plain_text(value)
    },
    key: plain_text,
    id: |id| plain_text(id.as_bytes()),
    // The header block counts in max_payload, which the copy's size is checked against.
    header_bytes: usize::MAX,
};

/// Build the NATS message for `record`, or the rejection that it can never be one.
fn job(record: Record, delivery: Delivery, max_payload: usize) -> Result<Job, Box<SinkError>> {
    let reject = |code: &'static str, reason: String, record: Record, delivery: Delivery| {
        Box::new(SinkError::Rejected { code, reason, record: Box::new(record), delivery })
    };
    if !valid_subject(&record.topic) {
        let reason = format!(
            "topic {:?} is not a valid NATS subject (non-empty dot-separated tokens, no whitespace, no '*' or '>')",
            record.topic
        );
        return Err(reject("invalid_subject", reason, record, delivery));
    }
    let mut headers = HeaderMap::new();
    let mut header_bytes = "NATS/1.0\r\n\r\n".len();
    let mut add = |name: &str, value: &[u8]| -> Result<(), String> {
        let parsed =
            HeaderName::from_str(name).map_err(|_| format!("header name {name:?} is not a valid NATS header name"))?;
        let value = std::str::from_utf8(value)
            .ok()
            .filter(|v| !v.contains(['\r', '\n']))
            .ok_or_else(|| format!("header {name} is not UTF-8 without CR/LF, which NATS headers need"))?;
        header_bytes += name.len() + value.len() + 4;
        headers.append(parsed, value);
        Ok(())
    };
    let mut added = record.headers.iter().try_for_each(|(k, v)| add(k, v));
    if let (Ok(()), Some(key)) = (&added, &record.key) {
        added = add("key", key);
    }
    // Dead-letter chunks share the event id; each gets its own (its chunk index in it).
    let msg_id = match delivery.copy_part() {
        Some(part) => copy_id(&record.event_id, part, &COPY_LIMITS),
        None => record.event_id.to_string(),
    };
    if added.is_ok() {
        added = add("Nats-Msg-Id", msg_id.as_bytes());
    }
    if let Err(reason) = added {
        return Err(reject("invalid_header", reason, record, delivery));
    }
    let payload = record.payload.clone().unwrap_or_default();
    let size = header_bytes + payload.len() + record.topic.len();
    if size > max_payload {
        let reason = format!("message of {size} bytes exceeds the NATS server's max_payload {max_payload}");
        return Err(reject("too_large", reason, record, delivery));
    }
    Ok(Job {
        subject: record.topic.into(),
        headers,
        payload,
        key: record.key,
        record_headers: record.headers,
        delivery,
    })
}

/// A subject we may publish to: tokens non-empty, printable ASCII or UTF-8 without whitespace, no
/// wildcards (a wildcard is not a destination).
pub(crate) fn valid_subject(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|t| {
            !t.is_empty() && t != "*" && t != ">" && !t.contains(|c: char| c.is_whitespace() || c.is_control())
        })
}

/// Why JetStream refused one message for good, if it did.
async fn rejection(js: &jetstream::Context, subject: &str, e: &PublishError) -> Option<&'static str> {
    match e.kind() {
        PublishErrorKind::StreamNotFound => {
            // "No responders" also happens while a stream has no leader; only JetStream saying no
            // stream holds the subject makes it this message's fault.
            use async_nats::jetstream::context::GetStreamByNameErrorKind as K;
            match js.stream_by_subject(subject).await {
                Err(e) if e.kind() == K::NotFound => Some("no_stream"),
                _ => None,
            }
        }
        PublishErrorKind::Other => {
            let code = std::error::Error::source(e)?.downcast_ref::<jetstream::Error>()?.error_code();
            (code == ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM).then_some("too_large")
        }
        _ => None,
    }
}

async fn publish(js: &jetstream::Context, job: &Job) -> AckFuture {
    let msg = Publish::build().payload(job.payload.clone()).headers(job.headers.clone());
    match js.send_publish(job.subject.clone(), msg).await {
        Ok(ack) => Box::pin(ack.into_future()),
        Err(e) => Box::pin(std::future::ready(Err(e))),
    }
}

/// Events of one key on one subject are published one at a time (see the module doc).
type Lane = (String, Bytes);

fn lane(job: &Job) -> Option<Lane> {
    job.key.as_ref().map(|k| (job.subject.clone(), k.clone()))
}

/// Publish jobs in order, at most one per [`Lane`] awaiting its ack, and resolve their deliveries
/// in order (see the module doc).
async fn publish_loop(js: jetstream::Context, mut rx: mpsc::Receiver<Job>) {
    let mut window: VecDeque<(Job, AckFuture)> = VecDeque::new();
    // A lane is here while one of its jobs is in the window; the value holds its next jobs, in order.
    let mut lanes: HashMap<Lane, VecDeque<Job>> = HashMap::new();
    let mut held = 0usize;
    let mut attempt: u32 = 0;
    let mut open = true;
    loop {
        if !open && window.is_empty() {
            return;
        }
        tokio::select! {
            biased;
            res = async { (&mut window.front_mut().expect("guarded").1).await }, if !window.is_empty() => {
                let (job, _) = window.pop_front().expect("guarded");
                let done = match res {
                    Ok(ack) => {
                        attempt = 0;
                        // A copy's Nats-Msg-Id is its own (see escape::copy_id): a duplicate
                        // means this copy was stored before (a retry), or that another message
                        // took its id, and JetStream kept that one instead. Worth a look.
                        if ack.duplicate && job.delivery.is_dead_letter() {
                            tracing::warn!(subject = %job.subject, stream = %ack.stream, sequence = ack.sequence, event_id = job.delivery.event_id(), "JetStream took a dead-letter copy as a duplicate of a message it stored before (a retry, or another message with its Nats-Msg-Id); the copy is not stored again");
                        }
                        let l = lane(&job);
                        job.delivery.ack();
                        Some(l)
                    }
                    Err(e) => match rejection(&js, &job.subject, &e).await {
                        Some(code) => {
                            let l = lane(&job);
                            let Job { key, payload, record_headers, delivery, subject, .. } = job;
                            delivery.reject(code, format!("JetStream refused subject {subject}: {e}"), key, Some(payload), record_headers);
                            Some(l)
                        }
                        None => {
                            tracing::warn!(subject = %job.subject, error = %e, pending = window.len() + 1, "JetStream publish not acknowledged; publishing again from this event on");
                            tokio::time::sleep(crate::retry::backoff(attempt, MAX_BACKOFF)).await;
                            attempt = attempt.saturating_add(1);
                            window.push_front((job, Box::pin(std::future::pending())));
                            for entry in window.iter_mut() {
                                entry.1 = publish(&js, &entry.0).await;
                            }
                            None
                        }
                    },
                };
                // The lane's next job, if one waits, may go now that this one is resolved.
                if let Some(Some(l)) = done {
                    match lanes.get_mut(&l).and_then(VecDeque::pop_front) {
                        Some(next) => {
                            held -= 1;
                            let fut = publish(&js, &next).await;
                            window.push_back((next, fut));
                        }
                        None => {
                            lanes.remove(&l);
                        }
                    }
                }
            }
            job = rx.recv(), if open && window.len() + held < WINDOW => match job {
                Some(job) => match lane(&job) {
                    Some(l) => match lanes.get_mut(&l) {
                        Some(waiting) => {
                            waiting.push_back(job);
                            held += 1;
                        }
                        None => {
                            lanes.insert(l, VecDeque::new());
                            let fut = publish(&js, &job).await;
                            window.push_back((job, fut));
                        }
                    },
                    None => {
                        let fut = publish(&js, &job).await;
                        window.push_back((job, fut));
                    }
                },
                None => open = false,
            },
        }
    }
}

/// Mirror the client's connection state into the sink's [`Link`], checked every second.
async fn watch_connection(client: async_nats::Client, health: Arc<Health>) {
    let link = Link::new("nats", "NATS", health.clone());
    // The start-up connect (in the background) is neither a loss nor a reconnect: not ready, and
    // not reported, until the client has tried once.
    let mut starting = true;
    loop {
        let state = client.connection_state();
        starting &= state == State::Pending;
        if starting {
            health.set_sink_up(false);
        } else {
            link.set(state == State::Connected, "connection lost");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::valid_subject;

    #[test]
    fn subjects() {
        for ok in ["orders", "outbox.order.created", "a-b_c.1"] {
            assert!(valid_subject(ok), "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "a b", "a.*", "a.>", "a\tb"] {
            assert!(!valid_subject(bad), "{bad:?}");
        }
    }
    #[test]
    fn escaped_parts_are_writable_and_what_nats_changes_is_not() {
        use super::COPY_LIMITS as L;
        assert!((L.header)("outboxd.escaped-header.12", b"note=line1%0Aline2"));
        assert!((L.header)("outboxd.escaped-key", b"k%0A1") && (L.header)("trace", b"t 1"));
        for (name, value) in
            [("note", &b"a\nb"[..]), ("x", b" pad"), ("key", b"k"), ("nats-msg-id", b"x"), ("a:b", b"x")]
        {
            assert!(!(L.header)(name, value), "{name:?}: {value:?}");
        }
        assert!(!(L.key)(b"k\r") && !(L.id)("e\n1/dlq/0"));
    }
}
