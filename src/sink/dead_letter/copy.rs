//! How a bad event becomes records on `--dlq-topic`: the dead-letter copy the relay sends under
//! `--on-bad-event dlq` ([`DeadLetter::into_copy`]).
//!
//! A dead-letter record keeps the event's original key, payload and headers and adds the
//! `outboxd.*` headers [`super`] names: the reason code, its message, the original topic (when
//! known), where it was read (`outboxd.source.lsn` in `run`, `outboxd.source.seq` in `poll`) and
//! the table. A copy larger than the sink's limit is split into several records under it
//! ([`super::chunk`]), so the payload is always kept: the event counts as delivered only when
//! every chunk is acked, and `outboxd dlq replay` ([`crate::tools::dlq`]) joins them again. (Copies written
//! by older versions may carry no payload and an `outboxd.payload.size` header instead; the tools
//! report those as not replayable.) What the copy's sink cannot carry as it is (a header, the key,
//! the id) is escaped into headers it takes ([`crate::sink::escape`]), and headers too large for it
//! move into the body ([`crate::sink::moved`]), so a copy is never refused for the bytes that made
//! its event bad.

use bytes::Bytes;

use super::chunk::{self, ChunkInfo};
use super::{record_size, H_ERROR, H_LSN, H_MESSAGE, H_PAYLOAD_DROPPED, H_SEQ, H_SIZE, H_TABLE, H_TOPIC};
use crate::error::Definite;
use crate::router::{BadEvent, Record, Text};
use crate::sink::delivery::{Position, Refusal, Source};
use crate::sink::escape::{self, Limits};
use crate::sink::moved;

/// A bad event, with everything known about it.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    pub event_id: Option<String>,
    /// Stable reason code: `null_id`, `null_route`, `invalid_topic`, `invalid_json`, `bad_value`,
    /// `schema`, `too_large`, `rejected`, `policy_violation`.
    pub code: &'static str,
    pub message: String,
    pub original_topic: Option<String>,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    pub headers: Vec<crate::router::Header>,
    pub source: Source,
}

impl DeadLetter {
    /// A routed record that could not be delivered as it is.
    pub fn from_record(record: Record, code: &'static str, message: String, source: Source) -> DeadLetter {
        DeadLetter {
            event_id: Some(record.event_id.into()),
            code,
            message,
            original_topic: Some(record.topic.into()),
            key: record.key,
            payload: record.payload,
            headers: record.headers,
            source,
        }
    }

    /// A row the router refused. A payload the masking rules could not be applied to is left out,
    /// and the copy says why ([`H_PAYLOAD_DROPPED`]). `into_records` adds the `id` header.
    pub fn from_bad_event(bad: BadEvent, source: Source) -> DeadLetter {
        let mut headers = bad.headers;
        if let Some(why) = bad.payload_dropped {
            headers.push((H_PAYLOAD_DROPPED.into(), Bytes::from(why)));
        }
        DeadLetter {
            event_id: bad.event_id,
            code: bad.code,
            message: bad.message,
            original_topic: bad.topic,
            key: bad.key,
            payload: bad.payload,
            headers,
            source,
        }
    }

    /// A record the destination refused in its delivery report (the sink's `reject()`).
    pub fn from_refusal(
        event_id: impl Into<String>,
        topic: impl Into<String>,
        refusal: Refusal,
        source: Source,
    ) -> DeadLetter {
        DeadLetter {
            event_id: Some(event_id.into()),
            code: refusal.code,
            message: refusal.reason,
            original_topic: Some(topic.into()),
            key: refusal.key,
            payload: refusal.payload,
            headers: refusal.headers,
            source,
        }
    }

    /// The error that stops the relay under `--on-bad-event fail`; `reason` says what happened.
    pub fn into_failure(self, reason: String) -> Definite {
        Definite::Delivery {
            event_id: self.event_id.unwrap_or_default(),
            topic: self.original_topic.unwrap_or_default(),
            reason,
        }
    }

    /// [`DeadLetter::into_copy`] for a sink that carries any bytes (Kafka, Redis).
    pub fn into_records(self, dlq_topic: &str, max_bytes: usize) -> Vec<Record> {
        self.into_copy(dlq_topic, max_bytes, &Limits::ANY)
    }

    /// The records to send to `dlq_topic`: one, or when the copy would not fit in `max_bytes`,
    /// chunks of the payload under it (see [`super::chunk`]). Keyless chunks all go to partition 0, since
    /// the partitioner would scatter them. What the sink cannot carry (`limits`) is escaped first
    /// ([`crate::sink::escape`]), so the sizes count the escaped form; headers that would still not
    /// fit move into the body ([`crate::sink::moved`]).
    pub fn into_copy(mut self, dlq_topic: &str, max_bytes: usize, limits: &Limits) -> Vec<Record> {
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
        match self.source.position {
            Position::Lsn(lsn) => headers.push((H_LSN.into(), Bytes::from(lsn.to_string()))),
            Position::Seq(n) => headers.push((H_SEQ.into(), Bytes::from(n.to_string()))),
            Position::Unknown => {}
        }
        headers.push((H_TABLE.into(), Bytes::copy_from_slice(self.source.table.as_bytes())));
        self.key = escape::make_writable(&mut headers, self.key, limits);
        // What does not fit next to a chunk moves into the body (see crate::sink::moved).
        let room = max_bytes.saturating_sub(chunk::HEADER_ALLOWANCE + chunk::MIN_LEN + 64);
        let kept = [H_ERROR, H_MESSAGE, H_LSN, H_SEQ, H_TABLE, H_SIZE, H_PAYLOAD_DROPPED];
        moved::fit(&mut headers, &mut self.key, &mut self.payload, room.min(limits.header_bytes), &kept);
        let event_id = Text::from(self.event_id.unwrap_or_else(|| "(unknown)".into()));
        let record = |payload: Option<Bytes>, headers: Vec<crate::router::Header>, partition: Option<i32>| Record {
            topic: Text::from(dlq_topic),
            key: self.key.clone(),
            payload,
            headers,
            partition,
            timestamp_ms: None,
            event_id: event_id.clone(),
            event_type: None,
        };
        let payload = match self.payload {
            Some(p) if !p.is_empty() && record_size(self.key.as_ref(), Some(&p), &headers) > max_bytes => p,
            payload => return vec![record(payload, headers, None)],
        };
        let room = max_bytes.saturating_sub(record_size(self.key.as_ref(), None, &headers) + chunk::HEADER_ALLOWANCE);
        let len = room.max(chunk::MIN_LEN);
        let sha256 = chunk::digest_hex(&payload);
        let id = chunk::chunk_id(&self.source.table, self.source.position, &event_id, len, &sha256);
        let slices = chunk::split(&payload, len);
        let count = slices.len() as u32;
        let partition = if self.key.is_none() { Some(0) } else { None };
        slices
            .into_iter()
            .enumerate()
            .map(|(i, slice)| {
                let info = ChunkInfo {
                    id: id.clone(),
                    index: i as u32,
                    count,
                    size: payload.len() as u64,
                    sha256: sha256.clone(),
                };
                let mut h = headers.clone();
                h.extend(info.headers());
                record(Some(slice), h, partition)
            })
            .collect()
    }
}

/// Which part of its copy a dead-letter record is, for the sink's message id
/// ([`crate::sink::escape::copy_id`]): `<chunk id>/<chunk index>` for a chunk, and for a whole
/// copy the same kind of id a chunk set gets ([`chunk::chunk_id`]: table, position, event id and
/// the payload's digest). The position keeps two bad rows with one event id (empty, or shared)
/// and the same payload apart, so a deduplicating broker does not drop the second copy; the same
/// copy written again after a crash gets the same part.
pub fn copy_part(record: &Record, source: &Source) -> String {
    let header = |k: &str| record.headers.iter().find(|(n, _)| n == k).map(|(_, v)| String::from_utf8_lossy(v));
    match (header(chunk::H_ID), header(chunk::H_INDEX)) {
        (Some(id), Some(index)) => format!("{id}/{index}"),
        _ => {
            let digest = chunk::digest_hex(record.payload.as_deref().unwrap_or_default());
            chunk::chunk_id(&source.table, source.position, &record.event_id, 0, &digest)
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
            source: Source { position: Position::Lsn(Lsn(0x1_0000_00AB)), table: Arc::from("public.outbox") },
        }
    }

    fn header<'a>(r: &'a Record, k: &str) -> Option<&'a [u8]> {
        r.headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_ref())
    }

    #[test]
    fn copy_keeps_the_event_and_explains_the_failure() {
        let mut rs = dl(b"{}").into_records("outboxd.dlq", 1_000_000);
        assert_eq!(rs.len(), 1);
        let r = rs.remove(0);
        assert_eq!(r.topic, "outboxd.dlq");
        assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r.payload.as_deref(), Some(&b"{}"[..]));
        assert_eq!(header(&r, "id"), Some(&b"e-1"[..]));
        assert_eq!(header(&r, "trace"), Some(&b"t-1"[..]));
        assert_eq!(header(&r, H_ERROR), Some(&b"null_route"[..]));
        assert_eq!(header(&r, H_LSN), Some(&b"1/AB"[..]));
        assert_eq!(header(&r, H_SEQ), None);
        assert_eq!(header(&r, H_TABLE), Some(&b"public.outbox"[..]));
        assert_eq!(header(&r, H_TOPIC), None);
        assert_eq!(header(&r, H_SIZE), None);
        assert_eq!(header(&r, chunk::H_ID), None, "a copy that fits is not chunked");
        assert_eq!(r.partition, None);
    }

    #[test]
    fn oversize_copy_is_chunked_under_the_limit_and_keeps_every_byte() {
        let big: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
        let max = 4000;
        let rs = dl(&big).into_records("outboxd.dlq", max);
        assert!(rs.len() > 10, "{} chunks", rs.len());
        let info = |r: &Record| {
            ChunkInfo::parse(|k| header(r, k).map(|v| String::from_utf8_lossy(v).into_owned())).unwrap().unwrap()
        };
        let first = info(&rs[0]);
        for (i, r) in rs.iter().enumerate() {
            assert!(record_size(r.key.as_ref(), r.payload.as_ref(), &r.headers) <= max, "chunk {i} too large");
            assert_eq!(r.key.as_deref(), Some(&b"k"[..]), "same key: same partition");
            assert_eq!(header(r, H_ERROR), Some(&b"null_route"[..]));
            assert_eq!(header(r, "trace"), Some(&b"t-1"[..]));
            assert_eq!(header(r, H_SIZE), None);
            let c = info(r);
            assert_eq!((c.index, c.count, c.size), (i as u32, rs.len() as u32, big.len() as u64));
            assert_eq!((&c.id, &c.sha256), (&first.id, &first.sha256));
        }
        let joined = chunk::join(&first, rs.iter().map(|r| r.payload.as_deref().unwrap())).unwrap();
        assert_eq!(joined, big);
        // The same event chunked again (a retry after a crash) gets the same id.
        assert_eq!(info(&dl(&big).into_records("outboxd.dlq", max)[0]).id, first.id);
    }

    #[test]
    fn a_polled_copy_says_its_seq_and_no_lsn() {
        let mut d = dl(b"{}");
        d.source.position = Position::Seq(42);
        let r = d.into_records("outboxd.dlq", 1_000_000).remove(0);
        assert_eq!(header(&r, H_SEQ), Some(&b"42"[..]));
        assert_eq!(header(&r, H_LSN), None);
        assert_eq!(header(&r, H_TABLE), Some(&b"public.outbox"[..]));
    }

    #[test]
    fn chunks_of_identical_bytes_are_told_apart() {
        let rs = dl(&[b'a'; 20_000]).into_records("outboxd.dlq", 3000);
        assert!(rs.len() > 3);
        assert_eq!(rs[1].payload, rs[2].payload, "the same bytes");
        let src = dl(b"").source;
        let parts: std::collections::HashSet<String> = rs.iter().map(|r| copy_part(r, &src)).collect();
        assert_eq!(parts.len(), rs.len(), "a part each");
        let id = String::from_utf8_lossy(header(&rs[1], chunk::H_ID).unwrap()).into_owned();
        assert_eq!(copy_part(&rs[1], &src), format!("{id}/1"));
    }

    #[test]
    fn whole_copies_of_rows_with_one_id_and_payload_are_told_apart_by_position() {
        let copy = |lsn: u64| {
            let mut d = dl(b"{}");
            d.event_id = Some(String::new());
            d.source.position = Position::Lsn(Lsn(lsn));
            let src = d.source.clone();
            copy_part(&d.into_records("outboxd.dlq", 1_000_000).remove(0), &src)
        };
        assert_ne!(copy(0x10), copy(0x20), "two rows, two parts");
        assert_eq!(copy(0x10), copy(0x10), "the same row written again, the same part");
    }

    #[test]
    fn keyless_chunks_share_partition_zero() {
        let mut d = dl(&[b'x'; 10_000]);
        d.key = None;
        let rs = d.into_records("outboxd.dlq", 3000);
        assert!(rs.len() > 1);
        assert!(rs.iter().all(|r| r.partition == Some(0) && r.key.is_none()));
    }
}
