//! The RabbitMQ sink (`--sink rabbitmq`): persistent messages with publisher confirms, published
//! in send order on one channel.
//!
//! Each record becomes one `basic.publish` to `--rabbitmq-exchange` (default: the default
//! exchange `""`) with the routed topic as routing key, `mandatory` set, and properties:
//! `delivery_mode` 2 (persistent), `message_id` = the event id, `timestamp` = the record's
//! timestamp in seconds, and the AMQP headers `key` (the record key, absent for a null key), `id`
//! (the event id) and one per record header, values as byte-exact long strings. No content type:
//! the record does not say whether its payload column held JSON, text or bytes.
//!
//! `send` refuses what AMQP can never carry (a routing key, event id or header name over 255
//! bytes, a `CC` or `BCC` header, which RabbitMQ only takes as an array, a body over the server's
//! message size limit) as a bad event; a dead-letter copy has
//! those escaped ([`COPY_LIMITS`]) and a message-id that fits. Everything else goes as a
//! [`Job`] through a bounded channel to the publisher task ([`publisher`]). A full
//! channel holds the record here, in order, and reports [`Sink::blocked`] ([`Handoff`]).
//!
//! The publisher owns the connection and every unconfirmed message; its module doc says what an
//! ack, a rejection and a retry are.

pub mod config;
pub(crate) mod dlq;
mod publisher;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use tokio::sync::mpsc;

use super::delivery::Delivery;
use super::handoff::{held_in_handoff, Handoff};
use super::{Sink, SinkError};
use crate::error::Definite;
use crate::health::Health;
use crate::router::Record;
use crate::sink::escape::{copy_id, Limits};
use config::{RabbitConfig, SHORTSTR_MAX};
use publisher::{Job, MAX_MESSAGE_SIZE, WINDOW};

/// AMQP's persistent delivery mode: the broker writes the message to disk in a durable queue.
const PERSISTENT: u8 = 2;
/// Room left under the message size limit when the pipeline sizes dead-letter chunks: the
/// limit counts the body only, but a dead-letter copy also gains headers.
const HEADER_SLACK: usize = 4096;

pub struct RabbitSink {
    /// To the publisher task (one lane), which it aborts on drop: unconfirmed handles then fail,
    /// and the slot keeps their events for the next start.
    handoff: Handoff<Job>,
    /// The broker's message size limit as the publisher knows it.
    limit: Arc<AtomicUsize>,
}

impl RabbitSink {
    /// Check the settings, make the first connection (a broker down at start is waited for in
    /// the background; a refused login or a missing exchange is a set-up error) and start the
    /// publisher task.
    pub async fn connect(cfg: &RabbitConfig, health: Arc<Health>) -> Result<RabbitSink, Definite> {
        cfg.check()?;
        let limit = Arc::new(AtomicUsize::new(MAX_MESSAGE_SIZE));
        let publisher = publisher::Publisher::start(cfg, health, limit.clone()).await?;
        let (tx, rx) = mpsc::channel(WINDOW);
        let publisher = tokio::spawn(publisher.run(rx));
        let handoff = Handoff::new(vec![tx], vec![publisher], "the RabbitMQ publisher task ended");
        Ok(RabbitSink { handoff, limit })
    }
}

/// The sink's entry in the list of sinks ([`crate::sink::registry`]).
impl crate::sink::registered::Registered for RabbitSink {
    const READABLE_DEAD_LETTERS: bool = true;

    async fn build(cfg: &crate::config::Config, health: Arc<Health>) -> Result<Self, Definite> {
        RabbitSink::connect(&cfg.rabbitmq, health).await
    }

    fn probe(cfg: &crate::config::Config) -> crate::sink::registered::Probe {
        let default_port = if cfg.rabbitmq.url.starts_with("amqps://") { 5671 } else { 5672 };
        let (shown, url) = (cfg.rabbitmq.url_masked(), cfg.rabbitmq.url.clone());
        crate::sink::registered::Probe::Tcp { name: "rabbitmq", shown, url, default_port }
    }
}

impl Sink for RabbitSink {
    fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        let job = job(record, delivery).map_err(|e| *e)?;
        self.handoff.push(0, job)
    }

    held_in_handoff!();

    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.limit.load(Ordering::Relaxed).saturating_sub(HEADER_SLACK).max(1))
    }

    fn copy_limits(&self) -> Limits {
        COPY_LIMITS
    }
}

/// What a dead-letter copy carries as it is ([`crate::sink::escape`]): header names up to
/// [`SHORTSTR_MAX`] bytes except `key` (the record key's header would overwrite it) and
/// `x-stream-offset` (a stream queue sets it on delivery); any value and key (long strings); a
/// message-id up to [`SHORTSTR_MAX`] bytes. `CC` and `BCC` are escaped ([`is_routing_header`]).
const COPY_LIMITS: Limits = Limits {
    header: |name, _| {
        name.len() <= SHORTSTR_MAX && !matches!(name, "key" | "x-stream-offset") && !is_routing_header(name)
    },
    key: |_| true,
    id: |id| id.len() <= SHORTSTR_MAX,
    // The headers travel in one content-header frame, which must fit RabbitMQ's frame_max
    // (128 KiB by default).
    header_bytes: 64 * 1024,
};

/// RabbitMQ's sender-selected distribution headers (`CC`, `BCC`, matched as written): the broker
/// reads them as an array of extra routing keys and closes the channel on any other value type
/// (`unacceptable_type_in_header`). outboxd sends every header as a string, so such a record
/// could never be confirmed: it is refused as a bad event instead of being retried for good.
pub(crate) fn is_routing_header(name: &str) -> bool {
    matches!(name, "CC" | "BCC")
}

/// Build the AMQP message for `record`, or the rejection that it can never be one.
fn job(record: Record, delivery: Delivery) -> Result<Job, Box<SinkError>> {
    let refuse = |code: &'static str, reason: String, record: Record, delivery: Delivery| {
        Box::new(SinkError::Rejected { code, reason, record: Box::new(record), delivery })
    };
    if record.topic.len() > SHORTSTR_MAX {
        let reason = format!(
            "topic {:?} is {} bytes; an AMQP routing key is at most {SHORTSTR_MAX}",
            record.topic,
            record.topic.len()
        );
        return Err(refuse("invalid_routing_key", reason, record, delivery));
    }
    // A dead-letter copy's message-id is its copy id, made to fit; its `id` header has no limit.
    let message_id = delivery.copy_part().map(|part| copy_id(&record.event_id, part, &COPY_LIMITS));
    if message_id.is_none() && record.event_id.len() > SHORTSTR_MAX {
        let reason =
            format!("event id is {} bytes; an AMQP message-id is at most {SHORTSTR_MAX}", record.event_id.len());
        return Err(refuse("invalid_id", reason, record, delivery));
    }
    if let Some((name, _)) = record.headers.iter().find(|(k, _)| k.len() > SHORTSTR_MAX) {
        let reason = format!("header name {name:?} is over {SHORTSTR_MAX} bytes, the AMQP limit");
        return Err(refuse("invalid_header", reason, record, delivery));
    }
    if let Some((name, _)) = record.headers.iter().find(|(k, _)| is_routing_header(k)) {
        let reason = format!(
            "header {name} is RabbitMQ's sender-selected distribution header, which must be an array of routing keys, and outboxd sends header values as strings; rename it in the headers column"
        );
        return Err(refuse("invalid_header", reason, record, delivery));
    }
    let size = record.payload.as_ref().map_or(0, Bytes::len);
    if size > MAX_MESSAGE_SIZE {
        let reason = format!("message body of {size} bytes exceeds RabbitMQ's max_message_size {MAX_MESSAGE_SIZE}");
        return Err(refuse("too_large", reason, record, delivery));
    }
    let mut properties = properties(&record);
    if let Some(id) = message_id {
        properties = properties.with_message_id(ShortString::from(id));
    }
    let Record { topic, key, payload, headers, .. } = record;
    Ok(Job { routing_key: topic.into(), properties, key, payload, headers, delivery })
}

/// Persistent delivery, the event id as message id, the timestamp, and the headers.
pub(crate) fn properties(r: &Record) -> BasicProperties {
    let long = |b: &[u8]| AMQPValue::LongString(LongString::from(b.to_vec()));
    let mut table = FieldTable::default();
    // Record headers first, then `key` and `id`: a headers-column entry of the same name is
    // overridden (the router's own `id` header has the same value anyway).
    for (name, value) in &r.headers {
        table.insert(ShortString::from(&**name), long(value));
    }
    if let Some(k) = &r.key {
        table.insert("key".into(), long(k));
    }
    table.insert("id".into(), long(r.event_id.as_bytes()));
    let mut p = BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_message_id(ShortString::from(&r.event_id[..]))
        .with_headers(table);
    if let Some(ms) = r.timestamp_ms.and_then(|ms| u64::try_from(ms).ok()) {
        p = p.with_timestamp(ms / 1000);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: Option<&'static [u8]>, headers: Vec<(&str, &'static [u8])>) -> Record {
        Record {
            topic: "outbox.event.order".into(),
            key: key.map(Bytes::from_static),
            payload: Some(Bytes::from_static(b"{\"a\":1}")),
            headers: headers.into_iter().map(|(k, v)| (k.to_owned().into(), Bytes::from_static(v))).collect(),
            partition: None,
            timestamp_ms: Some(1_700_000_000_123),
            event_id: "e-1".into(),
            event_type: None,
        }
    }

    fn header<'a>(p: &'a BasicProperties, name: &str) -> Option<&'a [u8]> {
        match p.headers().as_ref()?.inner().get(name)? {
            AMQPValue::LongString(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    #[test]
    fn properties_follow_the_record() {
        let p = properties(&record(Some(b"42"), vec![("id", b"e-1"), ("trace", b"\x00\xff")]));
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(p.message_id().as_ref().map(ShortString::as_str), Some("e-1"));
        assert_eq!(*p.timestamp(), Some(1_700_000_000));
        assert_eq!(header(&p, "key"), Some(&b"42"[..]));
        assert_eq!(header(&p, "id"), Some(&b"e-1"[..]));
        assert_eq!(header(&p, "trace"), Some(&b"\x00\xff"[..]));
        assert_eq!(p.headers().as_ref().map(|h| h.inner().len()), Some(3));
        // The record key wins over a headers-column entry named `key`; with a null key that
        // entry is all there is.
        let p = properties(&record(None, vec![("key", b"col")]));
        assert_eq!(header(&p, "key"), Some(&b"col"[..]));
        let p = properties(&record(Some(b"real"), vec![("key", b"col")]));
        assert_eq!(header(&p, "key"), Some(&b"real"[..]));
    }
    #[test]
    fn escaped_parts_are_writable_and_what_amqp_cannot_carry_is_not() {
        let l = COPY_LIMITS;
        assert!((l.header)("outboxd.escaped-header.3", b"x") && (l.header)("note", b"a\nb\x00"));
        assert!(
            !(l.header)(&"n".repeat(256), b"v") && !(l.header)("key", b"k") && !(l.header)("x-stream-offset", b"1")
        );
        assert!((l.key)(b"\xff\n") && (l.id)(&"i".repeat(255)) && !(l.id)(&"i".repeat(256)));
        // Sender-selected distribution, matched as RabbitMQ matches it.
        assert!(
            !(l.header)("CC", b"x") && !(l.header)("BCC", b"x") && (l.header)("cc", b"x") && (l.header)("Bcc", b"x")
        );
    }
}
