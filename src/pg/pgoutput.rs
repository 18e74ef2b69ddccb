//! Decoder for PostgreSQL's `pgoutput` logical replication messages (protocol versions 1–4).
//!
//! Owns the wire format described in the PostgreSQL docs page "Logical Replication Message
//! Formats": one call to [`Decoder::decode`] turns the payload of one `XLogData` into one
//! [`LogicalMessage`].
//!
//! Invariants:
//! - Pure: no I/O, no clocks, no logging. The only state is whether we are inside a streamed
//!   transaction block (between Stream Start and Stream Stop), because in there Relation, Type,
//!   Insert, Update, Delete, Truncate and Message carry an extra `Int32` xid after the tag.
//!   State changes only when a message decodes successfully.
//! - Never panics, whatever the input: every read is bounds-checked and returns
//!   [`DecodeError`]; declared lengths and counts are checked against the remaining input
//!   before anything is allocated from them.
//! - Zero-copy: a tuple is a view of the input buffer (one offset and length per column, no
//!   reference per column); message contents are [`Bytes`] slices of it. Names (C strings) are
//!   copied into `String` after a UTF-8 check.
//! - A message must be consumed exactly: leftover bytes are an error, not ignored.

use bytes::Bytes;

use crate::lsn::Lsn;

/// Why a pgoutput message could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("pgoutput message truncated while reading {what}")]
    Truncated { what: &'static str },
    #[error("unknown pgoutput message tag 0x{tag:02x} ({ch:?})", tag = .0, ch = char::from(*.0))]
    UnknownTag(u8),
    #[error("pgoutput message has {0} trailing byte(s)")]
    TrailingBytes(usize),
    #[error("pgoutput {what} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str },
    #[error("invalid pgoutput {what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

type Result<T> = std::result::Result<T, DecodeError>;

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalMessage {
    Begin(Begin),
    Commit(Commit),
    Origin(Origin),
    Relation(Relation),
    Type(TypeMessage),
    Insert(Insert),
    /// Boxed: it carries two rows, and every message is the size of the largest variant.
    Update(Box<Update>),
    Delete(Delete),
    Truncate(Truncate),
    Message(Message),
    StreamStart(StreamStart),
    StreamStop,
    StreamCommit(StreamCommit),
    StreamAbort(StreamAbort),
    BeginPrepare(BeginPrepare),
    Prepare(PrepareInfo),
    CommitPrepared(CommitPrepared),
    RollbackPrepared(RollbackPrepared),
    StreamPrepare(PrepareInfo),
}

/// Timestamps are microseconds since the PostgreSQL epoch, 2000-01-01 00:00 UTC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begin {
    pub final_lsn: Lsn,
    pub commit_time: i64,
    pub xid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub commit_lsn: Lsn,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub xid: Option<u32>,
    pub id: u32,
    pub namespace: String,
    pub name: String,
    /// `d` default, `n` nothing, `f` full, `i` index (as sent; not validated).
    pub replica_identity: u8,
    pub columns: Vec<Column>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// 1 = part of the key.
    pub flags: u8,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeMessage {
    pub xid: Option<u32>,
    pub id: u32,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    pub xid: Option<u32>,
    pub relation_id: u32,
    pub tuple: TupleData,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub xid: Option<u32>,
    pub relation_id: u32,
    pub old: Option<(OldKind, TupleData)>,
    pub new: TupleData,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    pub xid: Option<u32>,
    pub relation_id: u32,
    pub old: (OldKind, TupleData),
}

/// Which old-row image an Update/Delete carries: `K` (replica identity key columns only) or
/// `O` (the full old row, replica identity FULL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldKind {
    Key,
    Full,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    pub xid: Option<u32>,
    /// Bit 1 = CASCADE, bit 2 = RESTART IDENTITY.
    pub options: u8,
    pub relation_ids: Vec<u32>,
}

/// Logical decoding message (`pg_logical_emit_message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub xid: Option<u32>,
    /// 1 = transactional.
    pub flags: u8,
    pub lsn: Lsn,
    pub prefix: String,
    pub content: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStart {
    pub xid: u32,
    pub first_segment: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCommit {
    pub xid: u32,
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamAbort {
    pub xid: u32,
    pub subxid: u32,
    /// Present when `proto_version >= 4` (streaming = parallel).
    pub abort_lsn: Option<Lsn>,
    pub abort_time: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginPrepare {
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_time: i64,
    pub xid: u32,
    pub gid: String,
}

/// Body of Prepare (`P`) and Stream Prepare (`p`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareInfo {
    pub flags: u8,
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_time: i64,
    pub xid: u32,
    pub gid: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPrepared {
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: i64,
    pub xid: u32,
    pub gid: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackPrepared {
    pub flags: u8,
    pub prepare_end_lsn: Lsn,
    pub rollback_end_lsn: Lsn,
    pub prepare_time: i64,
    pub rollback_time: i64,
    pub xid: u32,
    pub gid: String,
}

/// Column values of one row, in relation column order: the router's own row type, decoded
/// straight into as a view of the message (one cell per column, no `Bytes` per column).
pub use crate::router::Row as TupleData;

/// One column value (`n` NULL, `u` unchanged TOAST, `t` text, `b` binary), as a row built from
/// values holds it (the decoder itself writes cells of a [`WireRow`]).
pub use crate::router::Value as TupleValue;
use crate::router::WireRow;

/// Stateful pgoutput decoder: tracks whether we are inside a Stream Start/Stop block.
#[derive(Debug, Clone)]
pub struct Decoder {
    proto_version: u32,
    in_stream: bool,
}

impl Decoder {
    pub fn new(proto_version: u32) -> Self {
        Decoder { proto_version, in_stream: false }
    }

    pub fn proto_version(&self) -> u32 {
        self.proto_version
    }

    /// True between a decoded Stream Start and the next Stream Stop.
    pub fn in_stream(&self) -> bool {
        self.in_stream
    }

    /// Decode one pgoutput message (the payload of one XLogData). Errors on unknown tag,
    /// truncated input, or trailing bytes.
    pub fn decode(&mut self, buf: Bytes) -> Result<LogicalMessage> {
        let mut r = Reader { buf, pos: 0 };
        let msg = self.parse(&mut r)?;
        if r.remaining() != 0 {
            return Err(DecodeError::TrailingBytes(r.remaining()));
        }
        match msg {
            LogicalMessage::StreamStart(_) => self.in_stream = true,
            LogicalMessage::StreamStop => self.in_stream = false,
            _ => {}
        }
        Ok(msg)
    }

    fn parse(&self, r: &mut Reader) -> Result<LogicalMessage> {
        use LogicalMessage as M;
        let stream_xid = |r: &mut Reader| match self.in_stream {
            true => r.u32("stream xid").map(Some),
            false => Ok(None),
        };
        Ok(match r.u8("message tag")? {
            b'B' => M::Begin(Begin {
                final_lsn: r.lsn("Begin.final_lsn")?,
                commit_time: r.i64("Begin.commit_time")?,
                xid: r.u32("Begin.xid")?,
            }),
            b'C' => M::Commit(Commit {
                flags: r.u8("Commit.flags")?,
                commit_lsn: r.lsn("Commit.commit_lsn")?,
                end_lsn: r.lsn("Commit.end_lsn")?,
                commit_time: r.i64("Commit.commit_time")?,
            }),
            b'O' => M::Origin(Origin { commit_lsn: r.lsn("Origin.commit_lsn")?, name: r.cstr("Origin.name")? }),
            b'R' => M::Relation(Relation {
                xid: stream_xid(r)?,
                id: r.u32("Relation.id")?,
                namespace: r.cstr("Relation.namespace")?,
                name: r.cstr("Relation.name")?,
                replica_identity: r.u8("Relation.replica_identity")?,
                columns: {
                    let n = r.count16("Relation column count")?;
                    let mut cols = Vec::with_capacity(n);
                    for _ in 0..n {
                        cols.push(Column {
                            flags: r.u8("Column.flags")?,
                            name: r.cstr("Column.name")?,
                            type_oid: r.u32("Column.type_oid")?,
                            type_modifier: r.i32("Column.type_modifier")?,
                        });
                    }
                    cols
                },
            }),
            b'Y' => M::Type(TypeMessage {
                xid: stream_xid(r)?,
                id: r.u32("Type.id")?,
                namespace: r.cstr("Type.namespace")?,
                name: r.cstr("Type.name")?,
            }),
            b'I' => {
                let xid = stream_xid(r)?;
                let relation_id = r.u32("Insert.relation_id")?;
                r.expect(b'N', "Insert new-tuple marker")?;
                M::Insert(Insert { xid, relation_id, tuple: r.tuple()? })
            }
            b'U' => {
                let xid = stream_xid(r)?;
                let relation_id = r.u32("Update.relation_id")?;
                let old = match r.u8("Update tuple marker")? {
                    b'N' => None,
                    b'K' => Some((OldKind::Key, r.tuple()?)),
                    b'O' => Some((OldKind::Full, r.tuple()?)),
                    b => return Err(bad_marker("Update tuple marker", b)),
                };
                if old.is_some() {
                    r.expect(b'N', "Update new-tuple marker")?;
                }
                M::Update(Box::new(Update { xid, relation_id, old, new: r.tuple()? }))
            }
            b'D' => {
                let xid = stream_xid(r)?;
                let relation_id = r.u32("Delete.relation_id")?;
                let kind = match r.u8("Delete tuple marker")? {
                    b'K' => OldKind::Key,
                    b'O' => OldKind::Full,
                    b => return Err(bad_marker("Delete tuple marker", b)),
                };
                M::Delete(Delete { xid, relation_id, old: (kind, r.tuple()?) })
            }
            b'T' => {
                let xid = stream_xid(r)?;
                let n = r.count32("Truncate relation count")?;
                let options = r.u8("Truncate.options")?;
                if n.checked_mul(4).is_none_or(|need| need > r.remaining()) {
                    return Err(DecodeError::Truncated { what: "Truncate.relation_ids" });
                }
                let relation_ids = (0..n).map(|_| r.u32("Truncate.relation_ids")).collect::<Result<_>>()?;
                M::Truncate(Truncate { xid, options, relation_ids })
            }
            b'M' => M::Message(Message {
                xid: stream_xid(r)?,
                flags: r.u8("Message.flags")?,
                lsn: r.lsn("Message.lsn")?,
                prefix: r.cstr("Message.prefix")?,
                content: r.len_prefixed("Message.content")?,
            }),
            b'S' => M::StreamStart(StreamStart {
                xid: r.u32("StreamStart.xid")?,
                first_segment: r.u8("StreamStart.first_segment")? != 0,
            }),
            b'E' => M::StreamStop,
            b'c' => M::StreamCommit(StreamCommit {
                xid: r.u32("StreamCommit.xid")?,
                flags: r.u8("StreamCommit.flags")?,
                commit_lsn: r.lsn("StreamCommit.commit_lsn")?,
                end_lsn: r.lsn("StreamCommit.end_lsn")?,
                commit_time: r.i64("StreamCommit.commit_time")?,
            }),
            b'A' => {
                let xid = r.u32("StreamAbort.xid")?;
                let subxid = r.u32("StreamAbort.subxid")?;
                let (abort_lsn, abort_time) = match self.proto_version >= 4 {
                    true => (Some(r.lsn("StreamAbort.abort_lsn")?), Some(r.i64("StreamAbort.abort_time")?)),
                    false => (None, None),
                };
                M::StreamAbort(StreamAbort { xid, subxid, abort_lsn, abort_time })
            }
            b'b' => M::BeginPrepare(BeginPrepare {
                prepare_lsn: r.lsn("BeginPrepare.prepare_lsn")?,
                end_lsn: r.lsn("BeginPrepare.end_lsn")?,
                prepare_time: r.i64("BeginPrepare.prepare_time")?,
                xid: r.u32("BeginPrepare.xid")?,
                gid: r.cstr("BeginPrepare.gid")?,
            }),
            b'P' => M::Prepare(r.prepare_info()?),
            b'p' => M::StreamPrepare(r.prepare_info()?),
            b'K' => M::CommitPrepared(CommitPrepared {
                flags: r.u8("CommitPrepared.flags")?,
                commit_lsn: r.lsn("CommitPrepared.commit_lsn")?,
                end_lsn: r.lsn("CommitPrepared.end_lsn")?,
                commit_time: r.i64("CommitPrepared.commit_time")?,
                xid: r.u32("CommitPrepared.xid")?,
                gid: r.cstr("CommitPrepared.gid")?,
            }),
            b'r' => M::RollbackPrepared(RollbackPrepared {
                flags: r.u8("RollbackPrepared.flags")?,
                prepare_end_lsn: r.lsn("RollbackPrepared.prepare_end_lsn")?,
                rollback_end_lsn: r.lsn("RollbackPrepared.rollback_end_lsn")?,
                prepare_time: r.i64("RollbackPrepared.prepare_time")?,
                rollback_time: r.i64("RollbackPrepared.rollback_time")?,
                xid: r.u32("RollbackPrepared.xid")?,
                gid: r.cstr("RollbackPrepared.gid")?,
            }),
            tag => return Err(DecodeError::UnknownTag(tag)),
        })
    }
}

fn bad_marker(what: &'static str, b: u8) -> DecodeError {
    DecodeError::Invalid { what, detail: format!("unexpected byte 0x{b:02x}") }
}

/// Bounds-checked big-endian cursor over the message; every read returns `Result`. Reads index
/// the buffer at `pos` (`pos <= buf.len()` always); only a value handed out as [`Bytes`] (a
/// tuple value, a message's content) takes a reference on the buffer.
struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn rest(&self) -> &[u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    fn need(&self, n: usize, what: &'static str) -> Result<()> {
        match self.remaining() >= n {
            true => Ok(()),
            false => Err(DecodeError::Truncated { what }),
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let a = *self.rest().first_chunk::<N>().ok_or(DecodeError::Truncated { what })?;
        self.pos += N;
        Ok(a)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn i16(&mut self, what: &'static str) -> Result<i16> {
        self.array(what).map(i16::from_be_bytes)
    }

    fn i32(&mut self, what: &'static str) -> Result<i32> {
        self.array(what).map(i32::from_be_bytes)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        self.array(what).map(u32::from_be_bytes)
    }

    fn i64(&mut self, what: &'static str) -> Result<i64> {
        self.array(what).map(i64::from_be_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        self.array(what).map(u64::from_be_bytes)
    }

    fn lsn(&mut self, what: &'static str) -> Result<Lsn> {
        self.u64(what).map(Lsn)
    }

    /// The next `n` bytes as a slice of the message (a reference, not a copy).
    fn bytes(&mut self, n: usize, what: &'static str) -> Result<Bytes> {
        self.need(n, what)?;
        let b = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(b)
    }

    /// NUL-terminated string, UTF-8 checked.
    fn cstr(&mut self, what: &'static str) -> Result<String> {
        let rest = self.rest();
        let nul = rest.iter().position(|&b| b == 0).ok_or(DecodeError::Truncated { what })?;
        let s = std::str::from_utf8(&rest[..nul]).map_err(|_| DecodeError::InvalidUtf8 { what })?.to_owned();
        self.pos += nul + 1;
        Ok(s)
    }

    fn expect(&mut self, want: u8, what: &'static str) -> Result<()> {
        match self.u8(what)? {
            b if b == want => Ok(()),
            b => Err(bad_marker(what, b)),
        }
    }

    /// Int16 element count; negative is invalid, more than the remaining bytes is truncated
    /// (every element takes at least one byte), so allocating `n` is bounded by the input.
    fn count16(&mut self, what: &'static str) -> Result<usize> {
        let n = self.i16(what)?;
        let n = usize::try_from(n).map_err(|_| negative(what, n.into()))?;
        self.need(n, what)?;
        Ok(n)
    }

    fn count32(&mut self, what: &'static str) -> Result<usize> {
        let n = self.i32(what)?;
        usize::try_from(n).map_err(|_| negative(what, n.into()))
    }

    /// Int32 length followed by that many bytes, returned as a slice of the input.
    fn len_prefixed(&mut self, what: &'static str) -> Result<Bytes> {
        let n = self.count32(what)?;
        self.bytes(n, what)
    }

    /// TupleData as a view of the message: one cell per column, offsets into the buffer. One
    /// tight loop over the bytes (this runs for every column of every row): the same checks and
    /// errors as the general reads, without a call and an error value built per field.
    fn tuple(&mut self) -> Result<TupleData> {
        let n = self.count16("TupleData column count")?;
        if u32::try_from(self.buf.len()).is_err() {
            // Beyond what a cell's 32-bit offsets address: read the tuple as values.
            return self.tuple_values(n);
        }
        let mut row = WireRow::new(self.buf.clone(), n);
        let data: &[u8] = &self.buf;
        // The unread bytes; a value's offset is `data.len() - rest.len()`, which fits in 32 bits
        // (checked above).
        let mut rest = data.get(self.pos..).unwrap_or_default();
        for _ in 0..n {
            let Some((&kind, tail)) = rest.split_first() else {
                return Err(DecodeError::Truncated { what: "TupleData value kind" });
            };
            let binary = match kind {
                b'n' => {
                    row.null();
                    rest = tail;
                    continue;
                }
                b'u' => {
                    row.unchanged_toast();
                    rest = tail;
                    continue;
                }
                b't' => false,
                b'b' => true,
                b => return Err(bad_marker("TupleData value kind", b)),
            };
            let what = if binary { "TupleData binary value" } else { "TupleData text value" };
            let Some((len, tail)) = tail.split_first_chunk::<4>() else {
                return Err(DecodeError::Truncated { what });
            };
            let len = i32::from_be_bytes(*len);
            let Some((value, after)) = usize::try_from(len).ok().and_then(|l| tail.split_at_checked(l)) else {
                return Err(if len < 0 { negative(what, len.into()) } else { DecodeError::Truncated { what } });
            };
            row.push_within((data.len() - tail.len()) as u32, value.len() as u32, binary);
            rest = after;
        }
        self.pos = data.len() - rest.len();
        Ok(row.finish())
    }

    /// TupleData as a vector of values (shared slices of the message), for a buffer the cells'
    /// 32-bit offsets cannot address; the tests compare [`Reader::tuple`] against it.
    fn tuple_values(&mut self, n: usize) -> Result<TupleData> {
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            values.push(match self.u8("TupleData value kind")? {
                b'n' => TupleValue::Null,
                b'u' => TupleValue::UnchangedToast,
                b't' => TupleValue::Text(self.len_prefixed("TupleData text value")?),
                b'b' => TupleValue::Binary(self.len_prefixed("TupleData binary value")?),
                b => return Err(bad_marker("TupleData value kind", b)),
            });
        }
        Ok(TupleData::from(values))
    }

    fn prepare_info(&mut self) -> Result<PrepareInfo> {
        Ok(PrepareInfo {
            flags: self.u8("Prepare.flags")?,
            prepare_lsn: self.lsn("Prepare.prepare_lsn")?,
            end_lsn: self.lsn("Prepare.end_lsn")?,
            prepare_time: self.i64("Prepare.prepare_time")?,
            xid: self.u32("Prepare.xid")?,
            gid: self.cstr("Prepare.gid")?,
        })
    }
}

fn negative(what: &'static str, n: i64) -> DecodeError {
    DecodeError::Invalid { what, detail: format!("negative count/length {n}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::Field;

    /// Test-only big-endian byte builder.
    struct W(Vec<u8>);

    #[rustfmt::skip]
    impl W {
        fn tag(t: u8) -> W { W(vec![t]) }
        fn raw(mut self, b: &[u8]) -> W { self.0.extend_from_slice(b); self }
        fn u8(self, v: u8) -> W { self.raw(&[v]) }
        fn i16(self, v: i16) -> W { self.raw(&v.to_be_bytes()) }
        fn i32(self, v: i32) -> W { self.raw(&v.to_be_bytes()) }
        fn u32(self, v: u32) -> W { self.raw(&v.to_be_bytes()) }
        fn i64(self, v: i64) -> W { self.raw(&v.to_be_bytes()) }
        fn u64(self, v: u64) -> W { self.raw(&v.to_be_bytes()) }
        fn cstr(self, s: &str) -> W { self.raw(s.as_bytes()).u8(0) }
        fn bytes(self) -> Bytes { Bytes::from(self.0) }
        /// TupleData: text "42", null, unchanged toast, binary [1, 2].
        fn tuple(self) -> W {
            self.i16(4).u8(b't').i32(2).raw(b"42").u8(b'n').u8(b'u').u8(b'b').i32(2).raw(&[1, 2])
        }
    }

    fn tuple() -> TupleData {
        TupleData::from(vec![
            TupleValue::Text(Bytes::from_static(b"42")),
            TupleValue::Null,
            TupleValue::UnchangedToast,
            TupleValue::Binary(Bytes::from_static(&[1, 2])),
        ])
    }

    fn dec(proto_version: u32, in_stream: bool) -> Decoder {
        Decoder { proto_version, in_stream }
    }

    /// (proto_version, in_stream, wire bytes, expected message) for every message type.
    #[rustfmt::skip]
    fn samples() -> Vec<(u32, bool, Bytes, LogicalMessage)> {
        use LogicalMessage as M;
        let x = Some(77);
        let s = |v: &str| v.to_owned();
        let prep = || PrepareInfo {
            flags: 0, prepare_lsn: Lsn(1), end_lsn: Lsn(2), prepare_time: 3, xid: 4, gid: s("g1"),
        };
        vec![
            (1, false, W::tag(b'B').u64(0x10).i64(5).u32(9).bytes(),
             M::Begin(Begin { final_lsn: Lsn(0x10), commit_time: 5, xid: 9 })),
            (1, false, W::tag(b'C').u8(0).u64(1).u64(2).i64(3).bytes(),
             M::Commit(Commit { flags: 0, commit_lsn: Lsn(1), end_lsn: Lsn(2), commit_time: 3 })),
            (1, false, W::tag(b'O').u64(4).cstr("origin").bytes(),
             M::Origin(Origin { commit_lsn: Lsn(4), name: s("origin") })),
            (2, true, W::tag(b'R').u32(77).u32(16384).cstr("public").cstr("outbox").u8(b'd').i16(2)
                .u8(1).cstr("id").u32(20).i32(-1).u8(0).cstr("payload").u32(3802).i32(-1).bytes(),
             M::Relation(Relation { xid: x, id: 16384, namespace: s("public"), name: s("outbox"),
                replica_identity: b'd', columns: vec![
                    Column { flags: 1, name: s("id"), type_oid: 20, type_modifier: -1 },
                    Column { flags: 0, name: s("payload"), type_oid: 3802, type_modifier: -1 },
                ] })),
            (1, false, W::tag(b'Y').u32(600).cstr("ext").cstr("mytype").bytes(),
             M::Type(TypeMessage { xid: None, id: 600, namespace: s("ext"), name: s("mytype") })),
            (1, false, W::tag(b'I').u32(16384).u8(b'N').tuple().bytes(),
             M::Insert(Insert { xid: None, relation_id: 16384, tuple: tuple() })),
            (1, false, W::tag(b'U').u32(5).u8(b'N').tuple().bytes(),
             M::Update(Box::new(Update { xid: None, relation_id: 5, old: None, new: tuple() }))),
            (2, true, W::tag(b'U').u32(77).u32(5).u8(b'K').i16(1).u8(b'n').u8(b'N').tuple().bytes(),
             M::Update(Box::new(Update { xid: x, relation_id: 5,
                old: Some((OldKind::Key, TupleData::from(vec![TupleValue::Null]))), new: tuple() }))),
            (1, false, W::tag(b'U').u32(5).u8(b'O').tuple().u8(b'N').i16(0).bytes(),
             M::Update(Box::new(Update { xid: None, relation_id: 5, old: Some((OldKind::Full, tuple())),
                new: TupleData::from(vec![]) }))),
            (1, false, W::tag(b'D').u32(5).u8(b'K').tuple().bytes(),
             M::Delete(Delete { xid: None, relation_id: 5, old: (OldKind::Key, tuple()) })),
            (2, true, W::tag(b'D').u32(77).u32(5).u8(b'O').tuple().bytes(),
             M::Delete(Delete { xid: x, relation_id: 5, old: (OldKind::Full, tuple()) })),
            (1, false, W::tag(b'T').i32(2).u8(3).u32(10).u32(11).bytes(),
             M::Truncate(Truncate { xid: None, options: 3, relation_ids: vec![10, 11] })),
            (2, true, W::tag(b'T').u32(77).i32(0).u8(0).bytes(),
             M::Truncate(Truncate { xid: x, options: 0, relation_ids: vec![] })),
            (1, false, W::tag(b'M').u8(1).u64(8).cstr("outbox").i32(3).raw(b"abc").bytes(),
             M::Message(Message { xid: None, flags: 1, lsn: Lsn(8), prefix: s("outbox"),
                content: Bytes::from_static(b"abc") })),
            (2, true, W::tag(b'M').u32(77).u8(1).u64(8).cstr("").i32(0).bytes(),
             M::Message(Message { xid: x, flags: 1, lsn: Lsn(8), prefix: s(""), content: Bytes::new() })),
            (2, false, W::tag(b'S').u32(77).u8(1).bytes(),
             M::StreamStart(StreamStart { xid: 77, first_segment: true })),
            (2, true, W::tag(b'E').bytes(), M::StreamStop),
            (2, false, W::tag(b'c').u32(77).u8(0).u64(1).u64(2).i64(3).bytes(),
             M::StreamCommit(StreamCommit { xid: 77, flags: 0, commit_lsn: Lsn(1), end_lsn: Lsn(2),
                commit_time: 3 })),
            (2, false, W::tag(b'A').u32(77).u32(78).bytes(),
             M::StreamAbort(StreamAbort { xid: 77, subxid: 78, abort_lsn: None, abort_time: None })),
            (4, false, W::tag(b'A').u32(77).u32(78).u64(99).i64(-5).bytes(),
             M::StreamAbort(StreamAbort { xid: 77, subxid: 78, abort_lsn: Some(Lsn(99)),
                abort_time: Some(-5) })),
            (3, false, W::tag(b'b').u64(1).u64(2).i64(3).u32(4).cstr("g1").bytes(),
             M::BeginPrepare(BeginPrepare { prepare_lsn: Lsn(1), end_lsn: Lsn(2), prepare_time: 3,
                xid: 4, gid: s("g1") })),
            (3, false, W::tag(b'P').u8(0).u64(1).u64(2).i64(3).u32(4).cstr("g1").bytes(),
             M::Prepare(prep())),
            (3, false, W::tag(b'p').u8(0).u64(1).u64(2).i64(3).u32(4).cstr("g1").bytes(),
             M::StreamPrepare(prep())),
            (3, false, W::tag(b'K').u8(0).u64(1).u64(2).i64(3).u32(4).cstr("g1").bytes(),
             M::CommitPrepared(CommitPrepared { flags: 0, commit_lsn: Lsn(1), end_lsn: Lsn(2),
                commit_time: 3, xid: 4, gid: s("g1") })),
            (3, false, W::tag(b'r').u8(0).u64(1).u64(2).i64(3).i64(4).u32(5).cstr("g1").bytes(),
             M::RollbackPrepared(RollbackPrepared { flags: 0, prepare_end_lsn: Lsn(1),
                rollback_end_lsn: Lsn(2), prepare_time: 3, rollback_time: 4, xid: 5, gid: s("g1") })),
        ]
    }

    #[test]
    fn decodes_every_message_type() {
        for (proto, in_stream, buf, want) in samples() {
            let got = dec(proto, in_stream).decode(buf);
            assert_eq!(got.as_ref().ok(), Some(&want), "{got:?}");
        }
    }

    #[test]
    fn every_truncated_prefix_is_an_error() {
        for (proto, in_stream, buf, _) in samples() {
            for len in 0..buf.len() {
                let err = dec(proto, in_stream).decode(buf.slice(..len)).unwrap_err();
                assert!(matches!(err, DecodeError::Truncated { .. }), "prefix {len} of {buf:?}: {err}");
            }
        }
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        for (proto, in_stream, buf, _) in samples() {
            let mut v = buf.to_vec();
            v.extend_from_slice(&[0, 0]);
            let err = dec(proto, in_stream).decode(v.into()).unwrap_err();
            assert!(matches!(err, DecodeError::TrailingBytes(2)), "{err}");
        }
    }

    #[test]
    fn unknown_tag_is_an_error() {
        for tag in [b'Z', b'x', 0, 0xff] {
            let err = Decoder::new(4).decode(W::tag(tag).bytes()).unwrap_err();
            assert!(matches!(err, DecodeError::UnknownTag(t) if t == tag), "{err}");
            assert!(err.to_string().contains("unknown"));
        }
    }

    #[test]
    fn stream_state_controls_xid() {
        let insert = |xid: Option<u32>| {
            let w = W::tag(b'I');
            let w = match xid {
                Some(x) => w.u32(x),
                None => w,
            };
            w.u32(1).u8(b'N').i16(0).bytes()
        };
        let mut d = Decoder::new(2);
        let ins = |m| match m {
            LogicalMessage::Insert(i) => i.xid,
            other => panic!("{other:?}"),
        };
        assert_eq!(ins(d.decode(insert(None)).unwrap()), None);
        // A failed Stream Start must not change state.
        assert!(d.decode(W::tag(b'S').u32(9).bytes()).is_err());
        assert!(!d.in_stream());
        d.decode(W::tag(b'S').u32(9).u8(1).bytes()).unwrap();
        assert!(d.in_stream());
        assert_eq!(ins(d.decode(insert(Some(9))).unwrap()), Some(9));
        // Without the xid the in-stream insert is misparsed and rejected.
        assert!(d.decode(insert(None)).is_err());
        assert_eq!(d.decode(W::tag(b'E').bytes()).unwrap(), LogicalMessage::StreamStop);
        assert!(!d.in_stream());
        assert_eq!(ins(d.decode(insert(None)).unwrap()), None);
    }

    #[test]
    fn tuple_values_are_zero_copy() {
        let buf = W::tag(b'I').u32(1).u8(b'N').tuple().bytes();
        let range = buf.as_ptr_range();
        let LogicalMessage::Insert(ins) = Decoder::new(1).decode(buf.clone()).unwrap() else { panic!("not an insert") };
        for v in ins.tuple.fields() {
            if let Field::Text(b) | Field::Binary(b) = v {
                assert!(range.contains(&b.as_ptr()), "value was copied");
            }
        }
        for i in [0, 3] {
            assert!(range.contains(&ins.tuple.share(i).unwrap().as_ptr()), "shared value was copied");
        }
    }

    #[test]
    fn invalid_utf8_name_is_an_error() {
        let buf = W::tag(b'O').u64(1).raw(&[0xff, 0xfe, 0]).bytes();
        let err = Decoder::new(1).decode(buf).unwrap_err();
        assert!(matches!(err, DecodeError::InvalidUtf8 { what: "Origin.name" }), "{err}");
    }

    #[test]
    fn bad_counts_lengths_and_markers_are_errors() {
        let bad = [
            W::tag(b'I').u32(1).u8(b'N').i16(-1).bytes(),
            W::tag(b'I').u32(1).u8(b'N').i16(i16::MAX).u8(b'n').bytes(),
            W::tag(b'I').u32(1).u8(b'N').i16(1).u8(b't').i32(-1).bytes(),
            W::tag(b'I').u32(1).u8(b'N').i16(1).u8(b't').i32(i32::MAX).u8(0).bytes(),
            W::tag(b'I').u32(1).u8(b'N').i16(1).u8(b'x').bytes(),
            W::tag(b'I').u32(1).u8(b'K').i16(0).bytes(),
            W::tag(b'U').u32(1).u8(b'K').i16(0).u8(b'K').i16(0).bytes(),
            W::tag(b'D').u32(1).u8(b'N').i16(0).bytes(),
            W::tag(b'T').i32(-1).u8(0).bytes(),
            W::tag(b'T').i32(i32::MAX).u8(0).u32(1).bytes(),
            W::tag(b'R').u32(1).cstr("a").cstr("b").u8(b'd').i16(-5).bytes(),
            W::tag(b'R').u32(1).cstr("a").cstr("b").u8(b'd').i16(30000).bytes(),
            W::tag(b'M').u8(0).u64(0).cstr("p").i32(-7).bytes(),
            W::tag(b'M').u8(0).u64(0).cstr("p").i32(1 << 30).bytes(),
        ];
        for buf in bad {
            let err = Decoder::new(1).decode(buf.clone());
            assert!(err.is_err(), "{buf:?} decoded as {err:?}");
        }
    }

    /// The tuple view ([`Reader::tuple`]) reads every input as the value reader does: the same
    /// values, the same error, the same bytes consumed, on valid, truncated and mutated tuples.
    #[test]
    fn tuple_view_agrees_with_the_value_reader() {
        let mut s: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut ok = 0;
        for _ in 0..20_000 {
            let cols = (rnd() % 20) as i16;
            let mut w = W(Vec::new()).i16(cols);
            for _ in 0..cols {
                w = match rnd() % 5 {
                    0 => w.u8(b'n'),
                    1 => w.u8(b'u'),
                    k => {
                        let len = (rnd() % 12) as usize;
                        let body: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
                        w.u8([b't', b'b', b't'][k as usize - 2]).i32(len as i32).raw(&body)
                    }
                };
            }
            let mut v = w.0;
            for _ in 0..(rnd() % 3) {
                if v.is_empty() {
                    break;
                }
                let at = (rnd() as usize) % v.len();
                match rnd() % 4 {
                    0 => v[at] = rnd() as u8,
                    1 => v[at] = [0x00, 0x7f, 0x80, 0xff, b'n', b'u', b't', b'b'][(rnd() % 8) as usize],
                    2 => v.truncate(at),
                    _ => v.insert(at, rnd() as u8),
                }
            }
            let buf = Bytes::from(v);
            let mut view = Reader { buf: buf.clone(), pos: 0 };
            let mut values = Reader { buf, pos: 0 };
            let a = view.tuple();
            let b = values.count16("TupleData column count").and_then(|n| values.tuple_values(n));
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
            assert_eq!(a.as_ref().ok(), b.as_ref().ok());
            if a.is_ok() {
                assert_eq!(view.pos, values.pos);
                ok += 1;
            }
        }
        assert!(ok > 1000, "only {ok} inputs decoded");
    }

    /// Cheap deterministic fuzzing: random and mutated inputs must never panic.
    #[test]
    fn fuzz_never_panics() {
        let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let seeds: Vec<_> = samples().into_iter().map(|(_, _, b, _)| b.to_vec()).collect();
        let tags = b"BCORYIUDTMSEcAbPKrpNKOntub";
        let mut ok = 0;
        for i in 0..20_000 {
            let mut v = if i % 2 == 0 {
                let len = (rnd() % 64) as usize;
                let mut v: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
                if let Some(first) = v.first_mut() {
                    *first = tags[(rnd() as usize) % tags.len()];
                }
                v
            } else {
                seeds[(rnd() as usize) % seeds.len()].clone()
            };
            for _ in 0..(rnd() % 4) {
                if v.is_empty() {
                    break;
                }
                let at = (rnd() as usize) % v.len();
                match rnd() % 4 {
                    0 => v[at] = rnd() as u8,
                    1 => v[at] = [0x00, 0x7f, 0x80, 0xff][(rnd() % 4) as usize],
                    2 => v.truncate(at),
                    _ => v.insert(at, rnd() as u8),
                }
            }
            let mut d = dec(1 + (rnd() % 4) as u32, rnd() % 2 == 0);
            ok += d.decode(v.into()).is_ok() as u32;
        }
        assert!(ok > 0, "fuzz inputs never decoded; generator is too hostile to be useful");
    }
}
