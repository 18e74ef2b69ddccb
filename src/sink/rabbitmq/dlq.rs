//! `outboxd dlq` against `--sink rabbitmq`: reading the dead-letter copies from a **stream queue**
//! bound to the `--dlq-topic` routing key, and republishing them with publisher confirms.
//!
//! Why a stream queue: a classic or quorum queue is read only by consuming it, so listing would
//! take the copies away (or requeue them). A stream queue (`x-queue-type: stream`) is an
//! append-only log read from an offset by any number of consumers, and a consumer's ack only
//! grants credit: nothing is removed. The queue is `--rabbitmq-dlq-queue` (default: the
//! `--dlq-topic` name, which is the queue the default exchange routes it to).
//!
//! Reading: the queue's message count is asked for once (a passive declare) and a consumer starts
//! at `x-stream-offset: first`; reading stops after that many copies, and fails when
//! `--read-timeout` passes without one before, rather than returning a shortened DLQ. Each copy's
//! position is `0/<stream offset>` (the `x-stream-offset` header), which replay progress keeps.
//! Another queue type refuses the consumer (`406`, invalid arg `x-stream-offset`), and a delivery
//! without the header would say the same: reading stops with that error before acking anything.
//!
//! Records: the body is the payload, the `key` header the key, the other headers (`id` and the
//! event's own, plus `outboxd.*`) the headers, as the sink writes them
//! ([`crate::sink::rabbitmq::properties`]). Replay publishes with that same function to
//! `--rabbitmq-exchange` (routing key: the original topic or `--to-topic`), `mandatory`, one at a
//! time so a `basic.return` is known to belong to the message it came with; an event counts as
//! replayed only on a `basic.ack` without a return.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties, Consumer};

use super::config::{RabbitConfig, SHORTSTR_MAX};
use super::properties;
use crate::error::{Definite, Error};
use crate::router::Record;
use crate::sink::dead_letter::entry::Entry;
use crate::sink::dead_letter::{DlqRecord, PREFIX};

/// Copies delivered ahead of the reader (stream queues need a prefetch).
const PREFETCH: u16 = 256;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// AMQP reply code 404: the queue does not exist.
const NOT_FOUND: u16 = 404;
/// AMQP reply code 406: here, `x-stream-offset` on a queue that is no stream queue.
const PRECONDITION_FAILED: u16 = 406;

/// A connection and one channel in confirm mode; errors name the masked URL only.
pub async fn connect(cfg: &RabbitConfig) -> Result<(Connection, Channel), Definite> {
    let uri = cfg.uri()?;
    let fail = |e: String| Definite::Setup(format!("cannot use --rabbitmq-url {}: {e}", cfg.url_masked()));
    let open = async {
        let props = ConnectionProperties::default().with_connection_name("outboxd-dlq".into());
        let conn = Connection::connect_uri(uri, props).await?;
        let chan = conn.create_channel().await?;
        chan.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok::<_, lapin::Error>((conn, chan))
    };
    // lapin's errors carry no URL, so no password.
    match tokio::time::timeout(CONNECT_TIMEOUT, open).await {
        Ok(r) => r.map_err(|e| fail(e.to_string())),
        Err(_) => Err(fail(format!("no answer in {CONNECT_TIMEOUT:?}"))),
    }
}

/// Reads the DLQ stream queue; see the module doc.
pub struct RabbitReader {
    /// Kept open while reading: closing it ends the consumer.
    _conn: Connection,
    consumer: Consumer,
    queue: String,
    expected: u64,
    read: u64,
    timeout: Duration,
}

impl RabbitReader {
    /// `None` when the queue does not exist.
    pub async fn open(cfg: &RabbitConfig, queue: &str, timeout: Duration) -> Result<Option<RabbitReader>, Definite> {
        let (conn, chan) = connect(cfg).await?;
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let declared = match chan.queue_declare(queue, passive, FieldTable::default()).await {
            Ok(d) => d,
            Err(e) if reply_code(&e) == Some(NOT_FOUND) => return Ok(None),
            Err(e) => return Err(Definite::Setup(format!("cannot look at RabbitMQ queue {queue:?}: {e}"))),
        };
        let setup = |e: lapin::Error| {
            match reply_code(&e) {
            Some(PRECONDITION_FAILED) => Definite::Config(not_a_stream(queue)),
            _ => Definite::Setup(format!(
                "cannot read RabbitMQ queue {queue:?} from its first offset: {e}; it must be a stream queue (x-queue-type: stream)"
            )),
        }
        };
        chan.basic_qos(PREFETCH, BasicQosOptions::default()).await.map_err(setup)?;
        let mut args = FieldTable::default();
        args.insert("x-stream-offset".into(), AMQPValue::LongString(LongString::from("first")));
        let consumer =
            chan.basic_consume(queue, "outboxd-dlq", BasicConsumeOptions::default(), args).await.map_err(setup)?;
        Ok(Some(RabbitReader {
            _conn: conn,
            consumer,
            queue: queue.to_owned(),
            expected: u64::from(declared.message_count()),
            read: 0,
            timeout,
        }))
    }

    /// The next copy, `None` after as many as the queue held at open.
    pub async fn next(&mut self) -> Result<Option<DlqRecord>, Error> {
        if self.read >= self.expected {
            return Ok(None);
        }
        let stalled = |why: String| {
            Definite::Setup(format!(
                "reading RabbitMQ queue {:?} stalled after {} of {} copies: {why}; check the broker, or raise --read-timeout",
                self.queue, self.read, self.expected
            ))
        };
        let d = match tokio::time::timeout(self.timeout, self.consumer.next()).await {
            Err(_) => return Err(stalled(format!("nothing for --read-timeout {:?}", self.timeout)).into()),
            Ok(None) => return Err(stalled("the broker ended the consumer".into()).into()),
            Ok(Some(Err(e))) => return Err(stalled(e.to_string()).into()),
            Ok(Some(Ok(d))) => d,
        };
        let table = d.properties.headers().clone().unwrap_or_default();
        let Some(offset) = table.inner().get("x-stream-offset").and_then(as_i64) else {
            return Err(Definite::Config(not_a_stream(&self.queue)).into());
        };
        // A stream consumer's ack only grants credit: nothing is removed.
        let _ = d.acker.ack(lapin::options::BasicAckOptions::default()).await;
        self.read += 1;
        Ok(Some(record(offset, &table, d.data)))
    }
}

/// The error for a DLQ queue that cannot be read by offset (the broker refuses `x-stream-offset`
/// on other queue types; a delivery without the header says the same).
fn not_a_stream(queue: &str) -> String {
    format!(
        "RabbitMQ queue {queue:?} is not a stream queue: outboxd dlq reads dead letters only from a stream queue (x-queue-type: stream) bound to --dlq-topic, or the one --rabbitmq-dlq-queue names; nothing was taken from it"
    )
}

fn as_i64(v: &AMQPValue) -> Option<i64> {
    match v {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        _ => None,
    }
}

/// A header value's bytes: long strings as they are, anything else as text.
fn value_bytes(v: &AMQPValue) -> Vec<u8> {
    match v {
        AMQPValue::LongString(s) => s.as_bytes().to_vec(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes().to_vec(),
        other => format!("{other:?}").into_bytes(),
    }
}

fn record(offset: i64, table: &FieldTable, body: Vec<u8>) -> DlqRecord {
    let mut key = None;
    let mut headers: Vec<(String, Option<Vec<u8>>)> = Vec::new();
    for (name, v) in table.inner() {
        match name.as_str() {
            "key" => key = Some(value_bytes(v)),
            "x-stream-offset" => {}
            n => headers.push((n.to_owned(), Some(value_bytes(v)))),
        }
    }
    headers.sort_by(|a, b| (a.0 != "id", &a.0).cmp(&(b.0 != "id", &b.0)));
    DlqRecord {
        partition: 0,
        offset,
        key,
        payload_len: Some(body.len()),
        payload: Some(body),
        headers,
        timestamp_ms: None,
        time_ms: None,
        label: None,
        undecoded: Vec::new(),
        moved_later: false,
    }
}

fn reply_code(e: &lapin::Error) -> Option<u16> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(a) => Some(a.get_id()),
        _ => None,
    }
}

/// The record replay publishes for `r` to `dest`, in the sink's layout.
fn replayed(r: &DlqRecord, dest: &str) -> Record {
    let bytes = |v: &Option<Vec<u8>>| bytes::Bytes::from(v.clone().unwrap_or_default());
    Record {
        topic: dest.into(),
        key: r.key.clone().map(bytes::Bytes::from),
        payload: r.payload.clone().map(bytes::Bytes::from),
        headers: r
            .headers
            .iter()
            .filter(|(k, _)| !k.starts_with(PREFIX))
            .map(|(k, v)| (k.clone().into(), bytes(v)))
            .collect(),
        partition: None,
        timestamp_ms: None,
        event_id: r.event_id().unwrap_or_default().into(),
        event_type: None,
    }
}

/// Publishes `batch` one message at a time, each waiting for its confirm: per event,
/// `Ok(where it went)` or `Err(why)`.
pub async fn send_batch(chan: &Channel, exchange: &str, batch: &[(Entry, String)]) -> Vec<Result<String, String>> {
    let mut out = Vec::with_capacity(batch.len());
    for (e, dest) in batch {
        out.push(send_one(chan, exchange, &replayed(&e.head, dest)).await);
    }
    out
}

async fn send_one(chan: &Channel, exchange: &str, r: &Record) -> Result<String, String> {
    if r.topic.len() > SHORTSTR_MAX || r.event_id.len() > SHORTSTR_MAX {
        return Err(format!("routing key or event id over AMQP's {SHORTSTR_MAX} bytes"));
    }
    // The sink refused such an event too; its copy kept the name escaped, and an AMQP frame
    // cannot carry it as it is (the length would wrap).
    if let Some((name, _)) = r.headers.iter().find(|(k, _)| k.len() > SHORTSTR_MAX) {
        return Err(format!("header name of {} bytes is over AMQP's {SHORTSTR_MAX}: {:.40}...", name.len(), name));
    }
    // RabbitMQ would close the channel on it (see the sink's is_routing_header).
    if let Some((name, _)) = r.headers.iter().find(|(k, _)| crate::sink::rabbitmq::is_routing_header(k)) {
        return Err(format!(
            "header {name} is RabbitMQ's sender-selected distribution header, which takes only an array"
        ));
    }
    let opts = BasicPublishOptions { mandatory: true, immediate: false };
    let body = r.payload.clone().unwrap_or_default();
    let confirm = async { chan.basic_publish(exchange, &r.topic, opts, &body, properties(r)).await?.await };
    match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
        Err(_) => Err(format!("no confirm in {CONFIRM_TIMEOUT:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(Confirmation::Ack(None))) => Ok(format!("exchange {exchange:?} routing key {:?}", r.topic)),
        Ok(Ok(Confirmation::Ack(Some(_)))) => {
            Err(format!("unroutable: no queue is bound for routing key {:?} at exchange {exchange:?}", r.topic))
        }
        Ok(Ok(Confirmation::Nack(_))) => Err("the broker nacked the message".into()),
        Ok(Ok(Confirmation::NotRequested)) => Err("the channel is not in confirm mode".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_read_back_as_the_sink_wrote_them() {
        let mut t = FieldTable::default();
        let long = |s: &str| AMQPValue::LongString(LongString::from(s));
        t.insert("trace".into(), long("t-1"));
        t.insert("key".into(), long("k-1"));
        t.insert("id".into(), long("e-1"));
        t.insert("outboxd.error".into(), long("unroutable"));
        t.insert("x-stream-offset".into(), AMQPValue::LongLongInt(7));
        let r = record(7, &t, b"{}".to_vec());
        assert_eq!(r.key.as_deref(), Some(&b"k-1"[..]));
        let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["id", "outboxd.error", "trace"]);
        let back = replayed(&r, "orders");
        assert_eq!(back.headers.len(), 2, "outboxd.* stripped");
        assert_eq!(back.event_id, "e-1");
        let p = properties(&back);
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("e-1"));
    }
}
