//! The dead-letter queue: how a bad event becomes a record on `--dlq-topic`, and the
//! `outboxd dlq` tools ([`tool`]).
//!
//! A dead-letter record keeps the event's original key, payload and headers and adds:
//! `outboxd.error` (reason code), `outboxd.error.message`, `outboxd.original.topic` (when known),
//! `outboxd.source.lsn` and `outboxd.source.table`. When the event is too large to send at all, the
//! copy carries no payload and an `outboxd.payload.size` header instead; the row itself stays in
//! the outbox table. The copy's broker ack stands in for the event's ack.

pub mod tool;

use bytes::Bytes;

use crate::ack::Source;
use crate::router::Record;

/// Header names of dead-letter records. Replay strips every header with the `outboxd.` prefix.
pub const H_ERROR: &str = "outboxd.error";
pub const H_MESSAGE: &str = "outboxd.error.message";
pub const H_TOPIC: &str = "outboxd.original.topic";
pub const H_LSN: &str = "outboxd.source.lsn";
pub const H_TABLE: &str = "outboxd.source.table";
pub const H_SIZE: &str = "outboxd.payload.size";
pub const PREFIX: &str = "outboxd.";

/// A bad event, with everything known about it.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    pub event_id: Option<String>,
    /// Stable reason code: `null_id`, `null_route`, `invalid_topic`, `invalid_json`, `bad_value`,
    /// `too_large`, `rejected`, `policy_violation`.
    pub code: &'static str,
    pub message: String,
    pub original_topic: Option<String>,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    pub headers: Vec<(String, Bytes)>,
    pub source: Source,
}

/// Bytes a record occupies on the wire, near enough for the `message.max.bytes` check.
pub fn record_size(key: Option<&Bytes>, payload: Option<&Bytes>, headers: &[(String, Bytes)]) -> usize {
    let h: usize = headers.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
    key.map_or(0, |k| k.len()) + payload.map_or(0, |p| p.len()) + h + 64
}

impl DeadLetter {
    /// A routed record that could not be delivered as it is.
    pub fn from_record(record: Record, code: &'static str, message: String, source: Source) -> DeadLetter {
        DeadLetter {
            event_id: Some(record.event_id),
            code,
            message,
            original_topic: Some(record.topic),
            key: record.key,
            payload: record.payload,
            headers: record.headers,
            source,
        }
    }

    /// The record to send to `dlq_topic`. The payload is dropped (and its size recorded) when the
    /// copy would not fit in `max_bytes`.
    pub fn into_record(self, dlq_topic: &str, max_bytes: usize) -> Record {
        let mut headers = self.headers;
        if headers.iter().all(|(k, _)| k != "id") {
            if let Some(id) = &self.event_id {
                headers.insert(0, ("id".into(), Bytes::copy_from_slice(id.as_bytes())));
            }
        }
        headers.push((H_ERROR.into(), Bytes::from_static(self.code.as_bytes())));
        // Long messages are cut: the header must not be what makes the copy too large.
        let mut message = self.message;
        if message.len() > 1024 {
            let mut cut = 1024;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        headers.push((H_MESSAGE.into(), Bytes::from(message)));
        if let Some(t) = &self.original_topic {
            headers.push((H_TOPIC.into(), Bytes::copy_from_slice(t.as_bytes())));
        }
        headers.push((H_LSN.into(), Bytes::from(self.source.lsn.to_string())));
        headers.push((H_TABLE.into(), Bytes::copy_from_slice(self.source.table.as_bytes())));
        let mut payload = self.payload;
        if record_size(self.key.as_ref(), payload.as_ref(), &headers) > max_bytes {
            if let Some(p) = payload.take() {
                headers.push((H_SIZE.into(), Bytes::from(p.len().to_string())));
            }
        }
        Record {
            topic: dlq_topic.to_owned(),
            key: self.key,
            payload,
            headers,
            partition: None,
            timestamp_ms: None,
            event_id: self.event_id.unwrap_or_else(|| "(unknown)".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::lsn::Lsn;

    fn dl(payload: &[u8]) -> DeadLetter {
        DeadLetter {
            event_id: Some("e-1".into()),
            code: "null_route",
            message: "the route-by column is NULL".into(),
            original_topic: None,
            key: Some(Bytes::from_static(b"k")),
            payload: Some(Bytes::copy_from_slice(payload)),
            headers: vec![("trace".into(), Bytes::from_static(b"t-1"))],
            source: Source { lsn: Lsn(0x1_0000_00AB), table: Arc::from("public.outbox") },
        }
    }

    fn header<'a>(r: &'a Record, k: &str) -> Option<&'a [u8]> {
        r.headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_ref())
    }

    #[test]
    fn copy_keeps_the_event_and_explains_the_failure() {
        let r = dl(b"{}").into_record("outboxd.dlq", 1_000_000);
        assert_eq!(r.topic, "outboxd.dlq");
        assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r.payload.as_deref(), Some(&b"{}"[..]));
        assert_eq!(header(&r, "id"), Some(&b"e-1"[..]));
        assert_eq!(header(&r, "trace"), Some(&b"t-1"[..]));
        assert_eq!(header(&r, H_ERROR), Some(&b"null_route"[..]));
        assert_eq!(header(&r, H_LSN), Some(&b"1/AB"[..]));
        assert_eq!(header(&r, H_TABLE), Some(&b"public.outbox"[..]));
        assert_eq!(header(&r, H_TOPIC), None);
        assert_eq!(header(&r, H_SIZE), None);
    }

    #[test]
    fn oversize_copy_drops_the_payload_and_records_its_size() {
        let big = vec![b'x'; 5000];
        let r = dl(&big).into_record("outboxd.dlq", 1000);
        assert_eq!(r.payload, None);
        assert_eq!(header(&r, H_SIZE), Some(&b"5000"[..]));
        assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
    }
}
