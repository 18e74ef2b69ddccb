//! From DLQ records to dead-lettered events: a record is an event, except chunk records
//! ([`super::chunk`]), which become one event once every chunk of their set has been read.
//!
//! [`Collector`] is what `list` and `replay` feed every record to. It says nothing about a chunk
//! set until the set is complete; a set whose chunks do not join into the payload their headers
//! describe (length, digest) is unreadable, and a set still missing chunks at the end comes back
//! from [`Collector::finish`]. Neither is ever replayed in part.

use std::collections::HashSet;

use super::chunk::{self, Assembled, Assembler, ChunkInfo};
use super::record::DlqRecord;

/// One dead-lettered event.
pub struct Entry {
    /// The record whose key, headers and timestamp the event keeps (chunk 0 of a chunked copy).
    /// For a chunked copy, its payload is the whole joined payload, or `None` when not kept.
    pub head: DlqRecord,
    /// Length of the whole payload.
    pub payload_len: Option<usize>,
    /// Records the event was read from: 1, or the chunk count.
    pub chunks: u32,
    /// Every DLQ record it came from, duplicates included (all are marked replayed together).
    pub positions: Vec<(i32, i64)>,
}

impl Entry {
    /// For the replays' tests: the copy of event `id` with key `key` and a payload of `payload`
    /// bytes, read from partition 0, offset 0.
    #[cfg(test)]
    pub(crate) fn for_test(key: &str, id: &str, payload: usize) -> Entry {
        Entry::single(DlqRecord {
            partition: 0,
            offset: 0,
            key: Some(key.as_bytes().to_vec()),
            payload: Some(vec![b'x'; payload]),
            payload_len: Some(payload),
            headers: vec![("id".into(), Some(id.as_bytes().to_vec()))],
            timestamp_ms: None,
            time_ms: None,
            label: None,
            undecoded: Vec::new(),
            moved_later: false,
        })
    }

    fn single(r: DlqRecord) -> Entry {
        Entry { payload_len: r.payload_len, chunks: 1, positions: vec![(r.partition, r.offset)], head: r }
    }

    /// Joins a complete set, checking length and digest.
    fn joined(set: Assembled<DlqRecord>) -> Fed {
        let Assembled { info, parts, extra } = set;
        let positions: Vec<(i32, i64)> = parts.iter().chain(&extra).map(|r| (r.partition, r.offset)).collect();
        let payload = match chunk::join(&info, parts.iter().map(|r| r.payload.as_deref().unwrap_or_default())) {
            Ok(p) => p,
            Err(why) => return Fed::Unreadable(first(parts), format!("chunk set does not join: {why}")),
        };
        let mut head = first(parts);
        head.payload = Some(payload);
        let mut payload_len = Some(info.size as usize);
        if head.moved_later {
            head.restore();
            if let Some(name) = head.escape_left() {
                let why = format!("{name} does not decode to the original header or key");
                return Fed::Unreadable(head, why);
            }
            payload_len = head.payload.as_ref().map(Vec::len);
        }
        Fed::Entry(Entry { payload_len, chunks: info.count, positions, head })
    }
}

fn first(parts: Vec<DlqRecord>) -> DlqRecord {
    // A complete set has chunk 0.
    parts.into_iter().next().expect("a complete chunk set has chunk 0")
}

/// What one record added up to.
pub enum Fed {
    /// A whole event.
    Entry(Entry),
    /// A chunk of a set not complete yet.
    Pending,
    /// A record or set that cannot be an event: the record (chunk 0 for a set) and why.
    Unreadable(DlqRecord, String),
}

/// A chunk set still incomplete at the end.
pub struct Leftover {
    /// Its first chunk read.
    pub head: DlqRecord,
    pub chunk_id: String,
    /// `have 0,1 of 4 chunks (missing 2,3)`.
    pub state: String,
    /// A complete copy with the same chunk id was read, or replayed before: this one is a
    /// partial duplicate from a retried write.
    pub duplicate: bool,
}

/// Turns records into events; see the module doc.
#[derive(Default)]
pub struct Collector {
    asm: Assembler<DlqRecord>,
    /// Chunk ids of sets completed (or, via [`Collector::seen_done`], replayed before).
    complete: HashSet<String>,
}

impl Collector {
    pub fn feed(&mut self, r: DlqRecord) -> Fed {
        if let Some(name) = r.escape_left() {
            let why = format!("{name} does not decode to the original header or key");
            return Fed::Unreadable(r, why);
        }
        let info = match ChunkInfo::parse(|k| r.header(k)) {
            Ok(None) => return Fed::Entry(Entry::single(r)),
            Ok(Some(info)) => info,
            Err(why) => return Fed::Unreadable(r, format!("chunk headers unusable: {why}")),
        };
        let Some(set) = self.asm.add(info, r) else { return Fed::Pending };
        self.complete.insert(set.info.id.clone());
        Entry::joined(set)
    }

    /// A chunk record skipped because an earlier replay republished it: returns whether its
    /// set is new to this run.
    pub fn seen_done(&mut self, r: &DlqRecord) -> bool {
        match r.header(chunk::H_ID) {
            Some(id) => self.complete.insert(id),
            None => true,
        }
    }

    /// Payload bytes held in incomplete sets.
    pub fn held_bytes(&self) -> usize {
        self.asm.held_bytes()
    }

    pub fn finish(self) -> Vec<Leftover> {
        let complete = self.complete;
        self.asm
            .finish()
            .into_iter()
            .map(|set| {
                let state = set.describe();
                let duplicate = complete.contains(&set.info.id);
                let mut all: Vec<DlqRecord> = set.parts.into_iter().chain(set.extra).collect();
                all.sort_by_key(|r| (r.partition, r.offset));
                Leftover { head: all.remove(0), chunk_id: set.info.id, state, duplicate }
            })
            .collect()
    }
}

impl Leftover {
    pub fn line(&self) -> String {
        format!(
            "{} id={} reason={} chunk set {}: {}{}",
            self.head.position(),
            self.head.id_shown(),
            self.head.reason(),
            self.chunk_id,
            self.state,
            if self.duplicate { " (a partial duplicate: a complete copy exists)" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::lsn::Lsn;
    use crate::router::Record;
    use crate::sink::dead_letter::{record_size, DeadLetter};
    use crate::sink::delivery::{Position, Source};
    use crate::sink::escape::{plain_text, Limits};

    /// Line-based headers with a short id, like NATS.
    const STRICT: Limits = Limits {
        header: |n, v| n.len() <= 32 && plain_text(v),
        key: plain_text,
        id: |s| plain_text(s.as_bytes()),
        header_bytes: usize::MAX,
    };

    fn read_back(r: Record, offset: i64) -> DlqRecord {
        let mut d = DlqRecord {
            partition: 0,
            offset,
            key: r.key.map(|k| k.to_vec()),
            payload_len: r.payload.as_ref().map(Bytes::len),
            payload: r.payload.map(|p| p.to_vec()),
            headers: r.headers.into_iter().map(|(k, v)| (k.into_owned(), Some(v.to_vec()))).collect(),
            timestamp_ms: None,
            time_ms: None,
            label: None,
            undecoded: Vec::new(),
            moved_later: false,
        };
        // As the tools' reader does (tools::dlq::sinks::Source::next).
        if d.header(chunk::H_ID).is_some() && d.header(crate::sink::moved::H_MOVED).is_some() {
            d.moved_later = true;
        } else {
            d.restore();
        }
        d
    }

    #[test]
    fn an_escaped_chunked_copy_reads_back_as_the_original_event() {
        let long = "n".repeat(40);
        let payload: Vec<u8> = std::iter::repeat_n(b'a', 20_000).collect();
        let dl = DeadLetter {
            event_id: Some("e\n1".into()),
            code: "invalid_header",
            message: "header note holds a line break".into(),
            original_topic: Some("bad\ntopic".into()),
            key: Some(Bytes::from_static(b"k\r1")),
            payload: Some(Bytes::from(payload.clone())),
            headers: vec![
                ("note".into(), Bytes::from_static(b"line1\nline2")),
                (long.clone().into(), Bytes::from_static(b"v")),
                ("trace".into(), Bytes::from_static(b"t-1")),
            ],
            source: Source { position: Position::Lsn(Lsn(0x10)), table: Arc::from("public.outbox") },
        };
        let records = dl.into_copy("dlq", 4000, &STRICT);
        assert!(records.len() > 4, "chunked");
        for r in &records {
            assert!(r.key.is_none(), "the key moved to a header");
            assert!(r.headers.iter().all(|(n, v)| (STRICT.header)(n, v)), "every header writable: {:?}", r.headers);
            assert!(record_size(r.key.as_ref(), r.payload.as_ref(), &r.headers) <= 4000, "sized after escaping");
        }
        let mut c = Collector::default();
        let mut got = None;
        for (i, r) in records.into_iter().enumerate() {
            if let Fed::Entry(e) = c.feed(read_back(r, i as i64)) {
                got = Some(e);
            }
        }
        let e = got.expect("a complete event");
        assert_eq!(e.head.payload.as_deref(), Some(&payload[..]), "joined byte for byte");
        assert_eq!(e.head.key.as_deref(), Some(&b"k\r1"[..]));
        assert_eq!(e.head.event_id().as_deref(), Some("e\n1"));
        assert_eq!(e.head.original_topic().as_deref(), Some("bad\ntopic"));
        let h = |n: &str| e.head.headers.iter().find(|(k, _)| k == n).and_then(|(_, v)| v.clone());
        assert_eq!(h("note").as_deref(), Some(&b"line1\nline2"[..]));
        assert_eq!(h(&long).as_deref(), Some(&b"v"[..]));
        assert_eq!(h("trace").as_deref(), Some(&b"t-1"[..]));
        assert!(e.head.escape_left().is_none());
    }

    #[test]
    fn a_row_header_named_like_an_escaped_one_reads_back_as_itself() {
        for limits in [STRICT, Limits::ANY] {
            let dl = DeadLetter {
                event_id: Some("e-1".into()),
                code: "invalid_header",
                message: "m".into(),
                original_topic: Some("t".into()),
                key: Some(Bytes::from_static(b"k\n1")),
                payload: Some(Bytes::from_static(b"{}")),
                headers: vec![
                    ("outboxd.escaped-header.7".into(), Bytes::from_static(b"x")),
                    ("outboxd.escaped-key".into(), Bytes::from_static(b"not=the key")),
                    ("note".into(), Bytes::from_static(b"a\nb")),
                ],
                source: Source { position: Position::Lsn(Lsn(0x10)), table: Arc::from("public.outbox") },
            };
            let mut records = dl.into_copy("dlq", 1 << 20, &limits);
            let e = match Collector::default().feed(read_back(records.remove(0), 0)) {
                Fed::Entry(e) => e,
                Fed::Unreadable(_, why) => panic!("a lookalike made the copy unreadable: {why}"),
                Fed::Pending => panic!("not chunked"),
            };
            let h = |n: &str| e.head.headers.iter().find(|(k, _)| k == n).and_then(|(_, v)| v.clone());
            assert_eq!(h("outboxd.escaped-header.7").as_deref(), Some(&b"x"[..]));
            assert_eq!(h("outboxd.escaped-key").as_deref(), Some(&b"not=the key"[..]));
            assert_eq!(h("note").as_deref(), Some(&b"a\nb"[..]));
            assert_eq!(e.head.key.as_deref(), Some(&b"k\n1"[..]), "the real key, not the lookalike");
            assert!(e.head.undecoded.is_empty());
        }
    }

    #[test]
    fn headers_that_do_not_fit_once_escaped_move_into_the_body_and_read_back() {
        let big = [&[b'-'; 30_000][..], b"\n"].concat();
        for (payload, max) in [(vec![b'a'; 20_000], 16_000), (b"{}".to_vec(), 200_000)] {
            let dl = DeadLetter {
                event_id: Some("e-1".into()),
                code: "invalid_header",
                message: "header note holds a line break".into(),
                original_topic: Some("t".into()),
                key: Some(Bytes::from(big.clone())),
                payload: Some(Bytes::from(payload.clone())),
                headers: vec![("note".into(), Bytes::from(big.clone())), ("trace".into(), Bytes::from_static(b"t-1"))],
                source: Source { position: Position::Lsn(Lsn(0x10)), table: Arc::from("public.outbox") },
            };
            let limits = Limits { header_bytes: 8192, ..STRICT };
            let records = dl.into_copy("dlq", max, &limits);
            for r in &records {
                assert!(r.headers.iter().all(|(n, v)| (STRICT.header)(n, v)), "every header writable");
                let size = record_size(r.key.as_ref(), r.payload.as_ref(), &r.headers);
                assert!(size <= max, "{size} over {max}");
                let h = record_size(r.key.as_ref(), None, &r.headers);
                assert!(h <= 8192 + chunk::HEADER_ALLOWANCE, "headers {h}");
            }
            let mut c = Collector::default();
            let mut got = None;
            for (i, r) in records.into_iter().enumerate() {
                match c.feed(read_back(r, i as i64)) {
                    Fed::Entry(e) => got = Some(e),
                    Fed::Pending => {}
                    Fed::Unreadable(_, why) => panic!("{why}"),
                }
            }
            let e = got.expect("a complete event");
            assert_eq!(e.head.payload.as_deref(), Some(&payload[..]), "the payload alone, byte for byte");
            assert_eq!(e.payload_len, Some(payload.len()));
            assert_eq!(e.head.key.as_deref(), Some(&big[..]));
            let h = |n: &str| e.head.headers.iter().find(|(k, _)| k == n).and_then(|(_, v)| v.clone());
            assert_eq!(h("note").as_deref(), Some(&big[..]));
            assert_eq!(h("trace").as_deref(), Some(&b"t-1"[..]));
            assert_eq!(e.head.event_id().as_deref(), Some("e-1"));
            assert!(h(crate::sink::moved::H_MOVED).is_none());
        }
    }

    #[test]
    fn an_escape_that_does_not_decode_is_unreadable() {
        let r = Record {
            topic: "dlq".into(),
            key: None,
            payload: Some(Bytes::from_static(b"{}")),
            headers: vec![
                ("id".into(), Bytes::from_static(b"e-1")),
                ("outboxd.escaped-header.0".into(), Bytes::from_static(b"no-equals-sign")),
            ],
            partition: None,
            timestamp_ms: None,
            event_id: "e-1".into(),
            event_type: None,
        };
        match Collector::default().feed(read_back(r, 0)) {
            Fed::Unreadable(_, why) => assert!(why.contains("outboxd.escaped-header.0"), "{why}"),
            _ => panic!("an undecodable escape must not be replayed"),
        }
    }
}
