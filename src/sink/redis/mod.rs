//! The Redis Streams sink: one `XADD` per record, to the stream named by the routed topic.
//!
//! Entry fields, in order: `key` (absent for a null key), `payload` (absent for a null payload, a
//! tombstone), then one field per header, byte for byte; the router's first header is `id`, the
//! event id (added here if a record lacks it). The entry id is Redis's (`*`). With
//! `--redis-maxlen N` every XADD trims its stream to about N entries (`MAXLEN ~ N`).
//!
//! # Flow and invariants
//! `send` never waits: it `try_send`s the record into a bounded channel read by one background
//! writer task. A full channel holds the record, in order, and the sink reports [`Sink::blocked`]
//! ([`Handoff`]: the wait for room is cancel-safe).
//!
//! The writer drains what is queued into one pipeline (at most [`BATCH`] XADDs, one pipeline in
//! flight) and resolves each [`Delivery`] from its own reply: an entry id is an ack (the server
//! applied the XADD; see docs/src/redis.md for what that means on disk); a per-event refusal that
//! retrying cannot fix (`WRONGTYPE`: the key holds something other than a stream; `NOPERM`: an ACL
//! denies this key) is a rejection for `--on-bad-event`. Anything else, a lost connection, a reply
//! timeout or a transient server error (OOM, LOADING, READONLY, ...), is retried with backoff: the
//! batch, from its first unresolved record on, is sent again in order, and no handle is resolved
//! until its XADD answers. So the frontier stalls during an outage and nothing is dropped.
//!
//! At-least-once window: an XADD the server applied whose reply was lost (the connection dropped
//! mid-pipeline) is sent again, so the stream can hold an entry twice; the copies keep the events'
//! order, since a retry resends the whole unanswered suffix in order. Only a transient error
//! answered for one XADD while later ones in the same pipeline succeeded can put a later event of
//! a key ahead of its retried predecessor; consumers that dedupe by `id` keep the first copy.

pub mod config;
pub(crate) mod dlq;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};
use tokio::sync::mpsc;

use super::delivery::Delivery;
use super::handoff::{held_in_handoff, Handoff};
use super::link::Link;
use super::{Sink, SinkError};

use crate::error::Definite;
use crate::health::Health;
use crate::router::Record;
use config::RedisConfig;

/// XADDs per pipeline.
pub const BATCH: usize = 512;
/// Records queued for the writer beyond the one pipeline in flight.
const CHANNEL: usize = 4 * BATCH;
/// Redis's default `proto-max-bulk-len`: a bigger value is refused for good.
const MAX_BULK: usize = 512 * 1024 * 1024;
/// A pipeline with no reply this long counts as a lost connection.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

struct Item {
    record: Record,
    delivery: Delivery,
}

pub struct RedisSink {
    /// To the writer task (one lane), which it aborts on drop: unresolved handles then fail, and
    /// the slot keeps their events for next time.
    handoff: Handoff<Item>,
}

impl RedisSink {
    /// Start the writer; it connects in the background (an unreachable server stalls, it is not
    /// fatal: Kafka's sink behaves the same way).
    pub fn new(cfg: &RedisConfig, health: Arc<Health>) -> Result<RedisSink, Definite> {
        cfg.check()?;
        let client = Client::open(cfg.url.as_str())
            .map_err(|e| Definite::Config(format!("--redis-url {}: {:?}", cfg.url_masked(), e.kind())))?;
        let (tx, rx) = mpsc::channel(CHANNEL);
        let writer = Writer { client, maxlen: cfg.maxlen, conn: None, link: Link::new("redis", "Redis", health) };
        let writer = tokio::spawn(writer.run(rx));
        Ok(RedisSink { handoff: Handoff::new(vec![tx], vec![writer], "the Redis writer task ended") })
    }
}

/// The sink's entry in the list of sinks ([`crate::sink::registry`]).
impl crate::sink::registered::Registered for RedisSink {
    const READABLE_DEAD_LETTERS: bool = true;

    async fn build(cfg: &crate::config::Config, health: Arc<Health>) -> Result<Self, Definite> {
        RedisSink::new(&cfg.redis, health)
    }

    fn probe(cfg: &crate::config::Config) -> crate::sink::registered::Probe {
        let (shown, url) = (cfg.redis.url_masked(), cfg.redis.url.clone());
        crate::sink::registered::Probe::Tcp { name: "redis", shown, url, default_port: 6379 }
    }
}

impl Sink for RedisSink {
    fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        self.handoff.push(0, Item { record, delivery })
    }

    held_in_handoff!();

    fn max_message_bytes(&self) -> Option<usize> {
        Some(MAX_BULK)
    }
}

/// What one XADD reply means for its record.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Added,
    /// Refused for good: (bad-event code, reason).
    Refused(&'static str, String),
    /// Worth another try (server busy, out of memory, failing over, or an answer we do not know).
    Retry(String),
}

fn classify(v: &Value) -> Reply {
    match v {
        Value::BulkString(_) | Value::SimpleString(_) | Value::VerbatimString { .. } => Reply::Added,
        Value::ServerError(e) => {
            let text = format!("{} {}", e.code(), e.details().unwrap_or_default());
            match e.code() {
                "WRONGTYPE" => Reply::Refused("wrong_type", text),
                "NOPERM" => Reply::Refused("not_permitted", text),
                _ => Reply::Retry(text),
            }
        }
        other => Reply::Retry(format!("unexpected XADD reply {other:?}")),
    }
}

struct Writer {
    client: Client,
    maxlen: Option<u64>,
    conn: Option<MultiplexedConnection>,
    /// Redis's reachability as `/readyz`, the metrics and the log show it.
    link: Link,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<Item>) {
        // Sent or being retried, in order; never more than one pipeline's worth.
        let mut batch: VecDeque<Item> = VecDeque::with_capacity(BATCH);
        let mut failures = 0u32;
        loop {
            if batch.is_empty() {
                match rx.recv().await {
                    Some(i) => batch.push_back(i),
                    None => return,
                }
            }
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(i) => batch.push_back(i),
                    Err(_) => break,
                }
            }
            match self.write(&mut batch).await {
                Ok(()) => failures = 0,
                Err(reason) => {
                    self.set_up(false, &reason);
                    self.conn = None;
                    tokio::time::sleep(crate::retry::backoff(failures, MAX_BACKOFF)).await;
                    failures = failures.saturating_add(1);
                }
            }
        }
    }

    fn set_up(&self, up: bool, reason: &str) {
        self.link.set(up, reason);
    }

    /// Send `batch` as one pipeline; resolve and remove what got a final answer. An error leaves
    /// the unanswered suffix in `batch`, in order, for the retry.
    async fn write(&mut self, batch: &mut VecDeque<Item>) -> Result<(), String> {
        let conn = match &mut self.conn {
            Some(c) => c,
            None => {
                let cfg = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(REPLY_TIMEOUT));
                let c = self
                    .client
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await
                    .map_err(|e| format!("connecting: {}", describe(&e)))?;
                self.conn.insert(c)
            }
        };
        let mut pipe = redis::pipe();
        for item in batch.iter() {
            pipe.add_command(xadd(&item.record, self.maxlen));
        }
        let replies = conn.send_packed_commands(&pipe, 0, batch.len()).await.map_err(|e| describe(&e))?;
        if replies.len() != batch.len() {
            return Err(format!("{} replies for {} XADDs", replies.len(), batch.len()));
        }
        self.set_up(true, "");
        for reply in replies {
            match classify(&reply) {
                Reply::Added => {
                    if let Some(i) = batch.pop_front() {
                        i.delivery.ack();
                    }
                }
                Reply::Refused(code, reason) => {
                    if let Some(Item { record, delivery }) = batch.pop_front() {
                        let reason = format!("Redis refused XADD to stream {:?}: {reason}", record.topic);
                        delivery.reject(code, reason, record.key, record.payload, record.headers);
                    }
                }
                // This and everything after it go again, in order.
                Reply::Retry(reason) => return Err(reason),
            }
        }
        Ok(())
    }
}

/// The error's kind and server detail, never the URL (it may hold the password).
pub(crate) fn describe(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(d)) => format!("{code} {d}"),
        _ if e.is_timeout() => "no reply in time".into(),
        _ => format!("{:?}", e.kind()),
    }
}

/// `XADD <topic> [MAXLEN ~ N] * [key K] [payload P] <header> <value>...`
pub(crate) fn xadd(r: &Record, maxlen: Option<u64>) -> redis::Cmd {
    let mut c = redis::cmd("XADD");
    c.arg(r.topic[..].as_bytes());
    if let Some(n) = maxlen {
        c.arg("MAXLEN").arg("~").arg(n);
    }
    c.arg("*");
    if let Some(k) = &r.key {
        c.arg("key").arg(k.as_ref());
    }
    if let Some(p) = &r.payload {
        c.arg("payload").arg(p.as_ref());
    }
    if !r.headers.iter().any(|(k, _)| k == "id") {
        c.arg("id").arg(r.event_id[..].as_bytes());
    }
    for (k, v) in &r.headers {
        c.arg(k.as_bytes()).arg(Bytes::as_ref(v));
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        key: Option<&'static [u8]>,
        payload: Option<&'static [u8]>,
        headers: Vec<(&str, &'static [u8])>,
    ) -> Record {
        Record {
            topic: "outbox.event.order".into(),
            key: key.map(Bytes::from_static),
            payload: payload.map(Bytes::from_static),
            headers: headers.into_iter().map(|(k, v)| (k.to_owned().into(), Bytes::from_static(v))).collect(),
            partition: None,
            timestamp_ms: None,
            event_id: "e-1".into(),
            event_type: None,
        }
    }

    fn args(c: &redis::Cmd) -> Vec<Vec<u8>> {
        c.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => b"<not a simple argument>".to_vec(),
            })
            .collect()
    }

    #[test]
    fn xadd_fields_follow_the_record() {
        let r = record(Some(b"42"), Some(b"{\"a\":1}"), vec![("id", b"e-1"), ("trace", b"\x00\xff")]);
        let a = args(&xadd(&r, Some(1000)));
        let want: Vec<&[u8]> = vec![
            b"XADD",
            b"outbox.event.order",
            b"MAXLEN",
            b"~",
            b"1000",
            b"*",
            b"key",
            b"42",
            b"payload",
            b"{\"a\":1}",
            b"id",
            b"e-1",
            b"trace",
            b"\x00\xff",
        ];
        assert_eq!(a, want.iter().map(|s| s.to_vec()).collect::<Vec<_>>());
        // A tombstone without a key and without an id header: no key, no payload, id from the record.
        let a = args(&xadd(&record(None, None, vec![]), None));
        let want: Vec<&[u8]> = vec![b"XADD", b"outbox.event.order", b"*", b"id", b"e-1"];
        assert_eq!(a, want.iter().map(|s| s.to_vec()).collect::<Vec<_>>());
    }

    #[test]
    fn only_lasting_refusals_are_bad_events() {
        let reply = |resp: &str| classify(&redis::parse_redis_value(resp.as_bytes()).unwrap());
        assert_eq!(reply("$3\r\n1-0\r\n"), Reply::Added);
        let wrong = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
        assert!(matches!(reply(wrong), Reply::Refused("wrong_type", r) if r.contains("WRONGTYPE")));
        assert!(matches!(reply("-NOPERM no permissions to access the key\r\n"), Reply::Refused("not_permitted", _)));
        // Out of memory, loading, a read-only replica after failover: wait, never skip.
        for e in ["-OOM command not allowed\r\n", "-LOADING loading\r\n", "-READONLY replica\r\n", "-ERR x\r\n"] {
            assert!(matches!(reply(e), Reply::Retry(_)), "{e}");
        }
        assert!(matches!(classify(&Value::Nil), Reply::Retry(_)));
    }
}
