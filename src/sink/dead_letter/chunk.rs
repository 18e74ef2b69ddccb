//! Chunked dead-letter copies: a payload larger than the broker takes is split into records under
//! the limit, and read back into the original bytes.
//!
//! Every chunk is a whole dead-letter record (same key, so same partition and order; the same
//! `outboxd.*` headers) carrying one slice of the payload, plus:
//! `outboxd.chunk.id` (shared by the chunks of one copy), `outboxd.chunk.index` (0-based),
//! `outboxd.chunk.count`, `outboxd.chunk.size` (length of the whole payload) and
//! `outboxd.chunk.sha256` (hex digest of the whole payload).
//!
//! The id is derived from the source (table, LSN, event id), the chunk length and the payload's
//! digest. A copy written again after a crash (its transaction was never confirmed) therefore has
//! the same id, and its chunks merge with those of the earlier partial copy instead of leaving an
//! orphan set behind.
//!
//! [`Assembler`] collects chunks in any order, keeps the first of a duplicated index, and hands a
//! set back once every index is there; [`join`] checks the whole payload's length and digest. A
//! set that never completes comes back from [`Assembler::finish`] for reporting: nothing here ever
//! yields part of a payload.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use openssl::sha::Sha256;

use crate::sink::delivery::Position;

pub const H_ID: &str = "outboxd.chunk.id";
pub const H_INDEX: &str = "outboxd.chunk.index";
pub const H_COUNT: &str = "outboxd.chunk.count";
pub const H_SIZE: &str = "outboxd.chunk.size";
pub const H_SHA256: &str = "outboxd.chunk.sha256";

/// Room kept in each chunk record for the chunk headers (about 270 bytes at their longest) and
/// for the wire format's per-record and per-batch overhead that [`super::record_size`] only
/// estimates.
pub const HEADER_ALLOWANCE: usize = 1024;
/// The smallest slice a chunk carries, however large the other parts of the record are: a record
/// whose key and headers alone leave less room is refused by the broker, which stops the pipeline
/// rather than confirming an event whose copy was not kept.
pub const MIN_LEN: usize = 1024;
/// More chunks than this in a header is not something outboxd wrote (a 1 MB limit would make
/// that a 1 TB payload); refusing it keeps a corrupt header from sizing an allocation.
const MAX_COUNT: u32 = 1 << 20;

/// Hex SHA-256 of `data`.
pub fn digest_hex(data: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(data);
    crate::hex::lower(&h.finish())
}

/// The id shared by the chunks of one copy: the same event, chunked the same way, gets the same id.
/// (An LSN position hashes as its `X/Y` text, as it did before poll positions existed.)
pub fn chunk_id(table: &str, position: Position, event_id: &str, chunk_len: usize, digest: &str) -> String {
    let mut h = Sha256::new();
    for part in [table, &position.to_string(), event_id, &chunk_len.to_string(), digest] {
        h.update(part.as_bytes());
        h.update(&[0]);
    }
    crate::hex::lower(&h.finish()[..16])
}

/// `payload` in slices of at most `chunk_len` bytes (no copies).
pub fn split(payload: &Bytes, chunk_len: usize) -> Vec<Bytes> {
    let chunk_len = chunk_len.max(1);
    (0..payload.len()).step_by(chunk_len).map(|s| payload.slice(s..(s + chunk_len).min(payload.len()))).collect()
}

/// What the chunk headers of one record say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    pub id: String,
    pub index: u32,
    pub count: u32,
    /// Length of the whole payload.
    pub size: u64,
    pub sha256: String,
}

impl ChunkInfo {
    /// The headers to add to chunk `index` of `count`.
    pub fn headers(&self) -> [crate::router::Header; 5] {
        [
            (H_ID.into(), Bytes::from(self.id.clone())),
            (H_INDEX.into(), Bytes::from(self.index.to_string())),
            (H_COUNT.into(), Bytes::from(self.count.to_string())),
            (H_SIZE.into(), Bytes::from(self.size.to_string())),
            (H_SHA256.into(), Bytes::from(self.sha256.clone())),
        ]
    }

    /// Reads the chunk headers through `get` (header name → value). `Ok(None)`: not a chunk.
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Option<ChunkInfo>, String> {
        let Some(id) = get(H_ID) else { return Ok(None) };
        let num = |name: &str| -> Result<u64, String> {
            let v = get(name).ok_or_else(|| format!("{H_ID} is set but {name} is missing"))?;
            v.trim().parse::<u64>().map_err(|_| format!("{name} {v:?} is not a number"))
        };
        let index = num(H_INDEX)?;
        let count = num(H_COUNT)?;
        let size = num(H_SIZE)?;
        if count == 0 || count > u64::from(MAX_COUNT) || index >= count {
            return Err(format!("chunk {index} of {count} is impossible"));
        }
        let sha256 = get(H_SHA256).ok_or_else(|| format!("{H_ID} is set but {H_SHA256} is missing"))?;
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("{H_SHA256} {sha256:?} is not a hex SHA-256"));
        }
        Ok(Some(ChunkInfo { id, index: index as u32, count: count as u32, size, sha256: sha256.to_ascii_lowercase() }))
    }

    /// Chunks of one copy agree on everything but the index.
    fn set_key(&self) -> (String, u32, u64, String) {
        (self.id.clone(), self.count, self.size, self.sha256.clone())
    }
}

/// Something the assembler holds: a chunk record as the caller reads it.
pub trait Piece {
    /// Payload bytes held, for the memory bound.
    fn data_len(&self) -> usize;
    /// Drop the payload (a duplicate is kept for its position only).
    fn strip(&mut self);
}

struct Pending<T> {
    info: ChunkInfo,
    parts: BTreeMap<u32, T>,
    /// Duplicated indexes, payloads stripped.
    extra: Vec<T>,
    bytes: usize,
    seq: u64,
}

/// A complete set: `parts` in index order (0..count), `extra` the duplicates seen meanwhile.
pub struct Assembled<T> {
    pub info: ChunkInfo,
    pub parts: Vec<T>,
    pub extra: Vec<T>,
}

/// A set still missing chunks when reading ended.
pub struct Incomplete<T> {
    pub info: ChunkInfo,
    pub parts: Vec<T>,
    pub extra: Vec<T>,
    pub have: Vec<u32>,
}

impl<T> Incomplete<T> {
    /// `have 0,1 of 4 chunks (missing 2,3)`.
    pub fn describe(&self) -> String {
        let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let missing: Vec<u32> = (0..self.info.count).filter(|i| !self.have.contains(i)).collect();
        format!("have {} of {} chunks (missing {})", list(&self.have), self.info.count, list(&missing))
    }
}

/// Collects chunks into complete sets.
pub struct Assembler<T> {
    sets: HashMap<(String, u32, u64, String), Pending<T>>,
    held: usize,
    seq: u64,
}

impl<T: Piece> Default for Assembler<T> {
    fn default() -> Self {
        Assembler { sets: HashMap::new(), held: 0, seq: 0 }
    }
}

impl<T: Piece> Assembler<T> {
    /// Payload bytes held in sets not yet complete.
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// Adds one chunk; returns its set once complete.
    pub fn add(&mut self, info: ChunkInfo, mut item: T) -> Option<Assembled<T>> {
        let key = info.set_key();
        let seq = self.seq;
        self.seq += 1;
        let set = self.sets.entry(key.clone()).or_insert_with(|| Pending {
            info: info.clone(),
            parts: BTreeMap::new(),
            extra: Vec::new(),
            bytes: 0,
            seq,
        });
        if set.parts.contains_key(&info.index) {
            item.strip();
            set.extra.push(item);
            return None;
        }
        let len = item.data_len();
        set.bytes += len;
        self.held += len;
        set.parts.insert(info.index, item);
        if set.parts.len() < info.count as usize {
            return None;
        }
        let set = self.sets.remove(&key)?;
        self.held -= set.bytes;
        Some(Assembled {
            info: ChunkInfo { index: 0, ..set.info },
            parts: set.parts.into_values().collect(),
            extra: set.extra,
        })
    }

    /// The sets never completed, in the order their first chunk arrived.
    pub fn finish(self) -> Vec<Incomplete<T>> {
        let mut left: Vec<Pending<T>> = self.sets.into_values().collect();
        left.sort_by_key(|p| p.seq);
        left.into_iter()
            .map(|p| Incomplete {
                info: p.info,
                have: p.parts.keys().copied().collect(),
                parts: p.parts.into_values().collect(),
                extra: p.extra,
            })
            .collect()
    }
}

/// The whole payload from a complete set's slices, checked against its length and digest.
pub fn join<'a>(info: &ChunkInfo, slices: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<u8>, String> {
    // Sized by what is really there, never by the header alone (a corrupt one could ask for GiBs).
    let slices: Vec<&[u8]> = slices.into_iter().collect();
    let mut out = Vec::with_capacity(slices.iter().map(|s| s.len()).sum());
    for s in slices {
        out.extend_from_slice(s);
    }
    if out.len() as u64 != info.size {
        return Err(format!("chunks add up to {} bytes, {H_SIZE} says {}", out.len(), info.size));
    }
    let digest = digest_hex(&out);
    if digest != info.sha256 {
        return Err(format!("the joined payload's SHA-256 is {digest}, {H_SHA256} says {}", info.sha256));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsn::Lsn;

    #[derive(Debug)]
    struct P {
        at: i64,
        data: Option<Vec<u8>>,
    }

    impl Piece for P {
        fn data_len(&self) -> usize {
            self.data.as_ref().map_or(0, Vec::len)
        }
        fn strip(&mut self) {
            self.data = None;
        }
    }

    fn chunks(payload: &[u8], len: usize) -> Vec<(ChunkInfo, P)> {
        let whole = Bytes::copy_from_slice(payload);
        let digest = digest_hex(payload);
        let id = chunk_id("public.outbox", Position::Lsn(Lsn(7)), "e-1", len, &digest);
        let slices = split(&whole, len);
        let count = slices.len() as u32;
        slices
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let info = ChunkInfo {
                    id: id.clone(),
                    index: i as u32,
                    count,
                    size: payload.len() as u64,
                    sha256: digest.clone(),
                };
                (info, P { at: i as i64, data: Some(s.to_vec()) })
            })
            .collect()
    }

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn joined(set: &Assembled<P>) -> Result<Vec<u8>, String> {
        join(&set.info, set.parts.iter().map(|p| p.data.as_deref().unwrap()))
    }

    #[test]
    fn split_covers_the_payload_in_order() {
        let p = Bytes::from(payload(10));
        let s = split(&p, 4);
        assert_eq!(s.iter().map(Bytes::len).collect::<Vec<_>>(), vec![4, 4, 2]);
        assert_eq!(s.concat(), p.to_vec());
        assert_eq!(split(&p, 10).len(), 1);
        assert!(split(&Bytes::new(), 4).is_empty());
    }

    #[test]
    fn headers_round_trip() {
        let (info, _) = chunks(&payload(10), 4).remove(1);
        let h = info.headers();
        let get = |k: &str| h.iter().find(|(n, _)| n == k).map(|(_, v)| String::from_utf8(v.to_vec()).unwrap());
        assert_eq!(ChunkInfo::parse(get).unwrap(), Some(info));
        assert_eq!(ChunkInfo::parse(|_| None).unwrap(), None, "no id: not a chunk");
        let bad =
            |k: &str, v: &str| ChunkInfo::parse(|n| if n == k { Some(v.to_owned()) } else { get(n) }).unwrap_err();
        assert!(bad(H_INDEX, "3").contains("impossible"));
        assert!(bad(H_COUNT, "x").contains("not a number"));
        assert!(bad(H_SHA256, "abc").contains("SHA-256"));
    }

    #[test]
    fn out_of_order_and_duplicated_chunks_reassemble_byte_exact() {
        let data = payload(10_000);
        let mut cs = chunks(&data, 3000);
        assert_eq!(cs.len(), 4);
        let mut asm = Assembler::default();
        // A crashed first attempt wrote 0 and 1, the retry all four, read in a shuffled order.
        let dup0 = P { at: 100, data: cs[0].1.data.clone() };
        let dup1 = P { at: 101, data: cs[1].1.data.clone() };
        let (i3, p3) = cs.remove(3);
        let (i1, p1) = cs.remove(1);
        let (i0, p0) = cs.remove(0);
        let (i2, p2) = cs.remove(0);
        assert!(asm.add(i2, p2).is_none());
        assert!(asm.add(i0.clone(), p0).is_none());
        assert!(asm.add(i0, dup0).is_none());
        assert!(asm.add(i1.clone(), dup1).is_none());
        assert_eq!(asm.held_bytes(), 9000, "three distinct chunks held, duplicates not counted");
        assert!(asm.add(i1, p1).is_none(), "a duplicate index does not complete the set");
        let set = asm.add(i3, p3).expect("complete");
        assert_eq!(joined(&set).unwrap(), data);
        assert_eq!(set.parts.iter().map(|p| p.at).collect::<Vec<_>>(), vec![0, 101, 2, 3], "first seen kept");
        assert_eq!(set.extra.iter().map(|p| p.at).collect::<Vec<_>>(), vec![100, 1]);
        assert!(set.extra.iter().all(|p| p.data.is_none()), "duplicates are stripped");
        assert_eq!(asm.held_bytes(), 0);
        assert!(asm.finish().is_empty());
    }

    #[test]
    fn a_missing_chunk_is_reported_never_joined() {
        let data = payload(10_000);
        let mut asm = Assembler::default();
        for (i, (info, p)) in chunks(&data, 3000).into_iter().enumerate() {
            if i != 2 {
                assert!(asm.add(info, p).is_none());
            }
        }
        let left = asm.finish();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].describe(), "have 0,1,3 of 4 chunks (missing 2)");
        assert_eq!(left[0].parts.len(), 3);
    }

    #[test]
    fn corrupt_chunks_fail_the_digest_check() {
        let data = payload(5000);
        let mut asm = Assembler::default();
        let mut done = None;
        for (info, mut p) in chunks(&data, 2000) {
            if info.index == 1 {
                p.data.as_mut().unwrap()[5] ^= 1;
            }
            done = asm.add(info, p);
        }
        let err = joined(&done.unwrap()).unwrap_err();
        assert!(err.contains("SHA-256"), "{err}");
    }

    #[test]
    fn sets_of_different_copies_do_not_mix() {
        let a = chunks(&payload(5000), 2000);
        let b = chunks(&payload(5000), 3000); // the same event chunked differently
        assert_ne!(a[0].0.id, b[0].0.id);
        let mut asm = Assembler::default();
        let mut done = Vec::new();
        for (info, p) in a.into_iter().chain(b) {
            done.extend(asm.add(info, p));
        }
        assert_eq!(done.len(), 2);
        for set in &done {
            assert_eq!(joined(set).unwrap(), payload(5000));
        }
    }
}
