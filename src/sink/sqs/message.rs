//! One record as an SQS message, built without I/O: the body, the message attributes, and on a
//! FIFO queue the group and deduplication ids; or the reason SQS could never take it, for the
//! bad-event policy.
//!
//! * The body is the payload as routed. SQS takes only XML-safe Unicode text, at least one
//!   character: a payload that is not (binary, control characters, empty or null) is a bad event.
//! * Each header is an attribute of its name (SQS's name rules: `[A-Za-z0-9_.-]`, 256 bytes, not
//!   `AWS.`/`Amazon.`, no `..`, no `.` at either end), a `String` when its value is SQS text, else
//!   `Binary`; the key, when there is one, is the attribute `key`. SQS takes 10 attributes: an
//!   event with more (headers and key together) is a bad event (`too_many_attributes`), never
//!   written with some left out. Attributes are a map by name: a header whose name another header
//!   has already (say `id` in the headers column), or that is named `key`, is a bad event
//!   (`invalid_header`), since one of the two would be lost.
//! * FIFO: `MessageGroupId` is the key, so one key's events keep their order; keyless events share
//!   the group [`NO_KEY_GROUP`]. `MessageDeduplicationId` is the event id, so SQS drops what a
//!   restart sends again within its 5-minute window. A key or id SQS cannot take as an id (over
//!   128 bytes, or not printable ASCII) is replaced by `sha256.<32 hex digits>` of it: the same
//!   key always maps to the same group.
//! * A dead-letter copy ([`Delivery::is_dead_letter`]) goes to `--sqs-dlq-queue-url` in a form
//!   that carries any bytes, since a copy's headers are more than 10 and its payload any bytes:
//!   its body is `b64:` and the payload in base64 (`null` for none), its headers are one
//!   attribute, [`H_COPY_HEADERS`] (a JSON array of `[name, base64 value]`), its key the
//!   attribute [`H_COPY_KEY`] (base64); its deduplication id is [`copy_id`].
//!
//! The size SQS counts is the body plus each attribute's name, type and value; over the queue's
//! `MaximumMessageSize` the event is a bad event (`too_large`).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::router::Record;
use crate::sink::delivery::Delivery;
use crate::sink::escape::{copy_id, Limits};
use crate::sink::SinkError;

/// SQS's limit on message attributes.
pub const MAX_ATTRIBUTES: usize = 10;
/// The group of keyless events on a FIFO queue.
pub const NO_KEY_GROUP: &str = "outboxd.no-key";
/// A dead-letter copy's headers, as one attribute.
pub const H_COPY_HEADERS: &str = "outboxd.headers";
/// A dead-letter copy's key, base64.
pub const H_COPY_KEY: &str = "outboxd.key";

/// An attribute's value: `String` when SQS takes it as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Text(String),
    Binary(Bytes),
}

/// One message on its way to SQS, with what a rejection needs.
pub struct Job {
    /// To `--sqs-dlq-queue-url` (a dead-letter copy) rather than the queue.
    pub dlq: bool,
    pub group: Option<String>,
    pub dedup: Option<String>,
    pub body: String,
    pub attributes: Vec<(String, Value)>,
    /// What SQS counts against `MaximumMessageSize` and a batch's total.
    pub size: usize,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    pub headers: Vec<crate::router::Header>,
    pub delivery: Delivery,
}

crate::aws_job!(Job);

/// What the queues are: FIFO or not, and the largest message each takes.
#[derive(Clone, Copy, Debug)]
pub struct Queues {
    pub fifo: bool,
    pub dlq_fifo: bool,
    pub max_bytes: usize,
    pub dlq_max_bytes: usize,
}

/// Characters SQS takes in a body or a `String` attribute.
pub fn sqs_text(s: &str) -> bool {
    s.chars().all(|c| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..))
}

/// A name SQS takes for a message attribute.
pub fn attribute_name(n: &str) -> bool {
    let lower = n.to_ascii_lowercase();
    !n.is_empty()
        && n.len() <= 256
        && n.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        && !n.starts_with('.')
        && !n.ends_with('.')
        && !n.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
}

/// Text SQS takes as a group or deduplication id.
fn id_text(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| (33..=126).contains(&b))
}

/// `s` as an SQS id: itself when SQS takes it, else `sha256.<32 hex digits>` of it.
fn as_id(s: &[u8]) -> String {
    match std::str::from_utf8(s) {
        Ok(t) if id_text(t) => t.to_owned(),
        _ => format!("sha256.{}", crate::hex::lower(&Sha256::digest(s)[..16])),
    }
}

fn value(v: &[u8]) -> Value {
    match std::str::from_utf8(v) {
        Ok(s) if !s.is_empty() && sqs_text(s) => Value::Text(s.to_owned()),
        _ => Value::Binary(Bytes::copy_from_slice(v)),
    }
}

fn value_len(v: &Value) -> usize {
    match v {
        Value::Text(s) => s.len() + "String".len(),
        Value::Binary(b) => b.len() + "Binary".len(),
    }
}

/// What a dead-letter copy carries as it is: anything (its headers and payload travel encoded),
/// with at most [`COPY_HEADER_BYTES`] of key and headers (the rest moves into the body).
pub const COPY_LIMITS: Limits =
    Limits { header: |_, _| true, key: |_| true, id: id_text, header_bytes: COPY_HEADER_BYTES };
/// Key and header bytes a copy keeps in its attributes; base64 and JSON make them at most ~6 KiB.
pub const COPY_HEADER_BYTES: usize = 4096;

/// Build the SQS message for `record`, or the rejection that SQS can never take it.
pub fn job(record: Record, delivery: Delivery, q: &Queues) -> Result<Job, Box<SinkError>> {
    let dlq = delivery.is_dead_letter();
    let built = if dlq { copy_parts(&record, &delivery, q) } else { event_parts(&record, q) };
    let (body, attributes, dedup, fifo, max) = match built {
        Ok(parts) => parts,
        Err((code, reason)) => {
            return Err(Box::new(SinkError::Rejected { code, reason, record: Box::new(record), delivery }));
        }
    };
    let size = body.len() + attributes.iter().map(|(n, v)| n.len() + value_len(v)).sum::<usize>();
    if size > max {
        let reason = format!("message of {size} bytes exceeds the queue's MaximumMessageSize {max}");
        return Err(Box::new(SinkError::Rejected { code: "too_large", reason, record: Box::new(record), delivery }));
    }
    let group = fifo.then(|| group_of(record.key.as_deref(), dlq));
    let Record { key, payload, headers, .. } = record;
    Ok(Job { dlq, group, dedup: fifo.then_some(dedup), body, attributes, size, key, payload, headers, delivery })
}

/// The FIFO group of an event (`dlq`: of a dead-letter copy) with this key.
pub(super) fn group_of(key: Option<&[u8]>, dlq: bool) -> String {
    match (key, dlq) {
        (Some(k), _) => as_id(k),
        (None, false) => NO_KEY_GROUP.to_owned(),
        (None, true) => "outboxd.dlq".to_owned(),
    }
}

/// An event as a message, apart from a delivery: what `outboxd dlq replay` sends
/// ([`super::dlq`]), built by the rules `--sink sqs` sends it by.
pub struct Message {
    pub group: Option<String>,
    pub dedup: Option<String>,
    pub body: String,
    pub attributes: Vec<(String, Value)>,
    pub size: usize,
}

/// `record` as a message to a queue that is FIFO or not and takes `max` bytes; or the code and
/// reason it cannot be one (a bad event, as [`job`] would reject it).
pub fn event_message(record: &Record, fifo: bool, max: usize) -> Result<Message, Refusal> {
    let q = Queues { fifo, dlq_fifo: false, max_bytes: max, dlq_max_bytes: max };
    let (body, attributes, dedup, fifo, max) = event_parts(record, &q)?;
    let size = body.len() + attributes.iter().map(|(n, v)| n.len() + value_len(v)).sum::<usize>();
    if size > max {
        return Err(("too_large", format!("message of {size} bytes exceeds the queue's MaximumMessageSize {max}")));
    }
    let group = fifo.then(|| group_of(record.key.as_deref(), false));
    Ok(Message { group, dedup: fifo.then_some(dedup), body, attributes, size })
}

type Parts = (String, Vec<(String, Value)>, String, bool, usize);
/// Why SQS can never take an event: its bad-event code and the reason.
pub type Refusal = (&'static str, String);

fn event_parts(record: &Record, q: &Queues) -> Result<Parts, Refusal> {
    let body = match &record.payload {
        None => return Err(("no_payload", "the event has no payload (null), and an SQS message needs a body".into())),
        Some(p) => match std::str::from_utf8(p) {
            Ok(s) if !s.is_empty() && sqs_text(s) => s.to_owned(),
            Ok("") => return Err(("no_payload", "the payload is empty, and an SQS message needs a body".into())),
            _ => {
                return Err((
                    "invalid_body",
                    "the payload is not text SQS takes (UTF-8 without control characters other than tab, CR, LF)"
                        .into(),
                ))
            }
        },
    };
    let count = record.headers.len() + usize::from(record.key.is_some());
    if count > MAX_ATTRIBUTES {
        return Err((
            "too_many_attributes",
            format!("the event has {count} headers and key, and SQS takes {MAX_ATTRIBUTES} message attributes"),
        ));
    }
    let mut attributes: Vec<(String, Value)> = Vec::with_capacity(count);
    for (name, v) in &record.headers {
        // Attributes are a map by name: a second header of a name would replace the first.
        if attributes.iter().any(|(n, _)| n == name) {
            return Err((
                "invalid_header",
                format!("header {name} appears twice, and an SQS message has one attribute of a name"),
            ));
        }
        if !attribute_name(name) || name == "key" {
            return Err(("invalid_header", format!("header name {name:?} is not an SQS message attribute name ([A-Za-z0-9_.-], not AWS.* or Amazon.*, no '..', not key)")));
        }
        if v.is_empty() {
            return Err(("invalid_header", format!("header {name} is empty, and SQS takes no empty attribute value")));
        }
        attributes.push((name.to_string(), value(v)));
    }
    if let Some(k) = record.key.as_ref().filter(|k| !k.is_empty()) {
        attributes.push(("key".to_owned(), value(k)));
    }
    Ok((body, attributes, as_id(record.event_id.as_bytes()), q.fifo, q.max_bytes))
}

fn copy_parts(record: &Record, delivery: &Delivery, q: &Queues) -> Result<Parts, Refusal> {
    let body = match &record.payload {
        Some(p) => format!("b64:{}", STANDARD.encode(p)),
        None => "null".to_owned(),
    };
    let headers: Vec<(&str, String)> = record.headers.iter().map(|(n, v)| (&**n, STANDARD.encode(v))).collect();
    let mut attributes =
        vec![(H_COPY_HEADERS.to_owned(), Value::Text(serde_json::to_string(&headers).unwrap_or_else(|_| "[]".into())))];
    if let Some(k) = &record.key {
        attributes.push((H_COPY_KEY.to_owned(), Value::Text(STANDARD.encode(k))));
    }
    let dedup = copy_id(&record.event_id, delivery.copy_part().unwrap_or("0"), &COPY_LIMITS);
    let dedup = if id_text(&dedup) { dedup } else { as_id(dedup.as_bytes()) };
    Ok((body, attributes, dedup, q.dlq_fifo, q.dlq_max_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_text_and_ids() {
        for ok in ["trace-id", "a.b_c", "X1"] {
            assert!(attribute_name(ok), "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "AWS.x", "amazon.y", "a b", "ü"] {
            assert!(!attribute_name(bad), "{bad:?}");
        }
        assert!(sqs_text("{\"a\":1}\n\té") && !sqs_text("a\u{1}b") && !sqs_text("\u{FFFF}"));
        assert_eq!(as_id(b"order-1"), "order-1");
        let long = as_id(&[b'k'; 200]);
        assert!(long.starts_with("sha256.") && long.len() == 39 && as_id(&[b'k'; 200]) == long);
        assert!(as_id(b"a b").starts_with("sha256."));
    }

    #[test]
    fn values_are_text_when_sqs_takes_them() {
        assert_eq!(value(b"abc"), Value::Text("abc".into()));
        assert_eq!(value(&[0xff, 0]), Value::Binary(Bytes::from_static(&[0xff, 0])));
        assert_eq!(value(b"a\x01"), Value::Binary(Bytes::from_static(b"a\x01")));
    }
}
