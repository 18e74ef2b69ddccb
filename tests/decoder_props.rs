//! Property tests for the two pure wire parsers of the replication path:
//! [`Decoder::decode`] (pgoutput messages) and [`parse_copy_data`] (XLogData / keepalive framing).
//!
//! * Hostile input: arbitrary bytes, tag-led random bytes and mutated valid messages never make
//!   either parser panic, for protocol versions 1–4, inside and outside a streamed block; a failed
//!   decode never changes the decoder's state.
//! * Round trips: [`Enc`], a test-only encoder written from the PostgreSQL docs page "Logical
//!   Replication Message Formats", turns random valid messages of every type into wire bytes; the
//!   decoder must give back the very same struct. Every strict prefix of such an encoding is a
//!   `Truncated` error and every extension a `TrailingBytes` error.
//!
//! Case counts: each property has a default sized so the whole file runs in well under a minute in
//! a debug build; `PROPTEST_CASES=N` sets every property to N cases instead (long runs:
//! `PROPTEST_CASES=1000000 cargo test --release --test decoder_props`). Failures are not persisted
//! to a file; a failing input found here or by `fuzz/` becomes a case in [`regressions`].

use bytes::Bytes;
use outboxd::lsn::Lsn;
use outboxd::pg::pgoutput::{
    Begin, BeginPrepare, Column, Commit, CommitPrepared, DecodeError, Decoder, Delete, Insert, LogicalMessage, Message,
    OldKind, Origin, PrepareInfo, Relation, RollbackPrepared, StreamAbort, StreamCommit, StreamStart, Truncate,
    TupleData, TupleValue, TypeMessage, Update,
};
use outboxd::pg::replication::{parse_copy_data, WalMessage};
use outboxd::router::Field;
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{Config, TestRunner};

// ---------------------------------------------------------------------------------------------
// set-up
// ---------------------------------------------------------------------------------------------

/// `PROPTEST_CASES` if set, else this property's default.
fn config(default_cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default_cases);
    Config { cases, failure_persistence: None, ..Config::default() }
}

/// A decoder for `proto_version`, inside a streamed block if `in_stream`. The block is entered the
/// way the server enters it: by decoding a valid Stream Start.
fn decoder(proto_version: u32, in_stream: bool) -> Decoder {
    let mut d = Decoder::new(proto_version);
    if in_stream {
        let start = d.decode(Bytes::from_static(b"S\x00\x00\x00\x2a\x01")).expect("valid Stream Start");
        assert_eq!(start, LogicalMessage::StreamStart(StreamStart { xid: 42, first_segment: true }));
    }
    assert_eq!(d.in_stream(), in_stream);
    d
}

/// Decode with a decoder in the given state; a failure must leave the state alone, a success must
/// change it only for Stream Start / Stream Stop.
fn decode_checked(proto_version: u32, in_stream: bool, buf: Bytes) -> Result<LogicalMessage, DecodeError> {
    let mut d = decoder(proto_version, in_stream);
    let got = d.decode(buf);
    let want_state = match &got {
        Ok(LogicalMessage::StreamStart(_)) => true,
        Ok(LogicalMessage::StreamStop) => false,
        _ => in_stream,
    };
    assert_eq!(d.in_stream(), want_state, "state after {got:?}");
    if let Err(e) = &got {
        // Errors end up in operator-facing messages: formatting must not panic either.
        let _ = e.to_string();
    }
    got
}

// ---------------------------------------------------------------------------------------------
// the test-only encoder
// ---------------------------------------------------------------------------------------------

/// Big-endian pgoutput writer for one message. `in_stream` decides whether the xid that
/// Relation, Type, Insert, Update, Delete, Truncate and Message carry inside a streamed block is
/// written; `proto_version >= 4` adds abort LSN and time to Stream Abort.
struct Enc {
    buf: Vec<u8>,
    proto_version: u32,
    in_stream: bool,
}

impl Enc {
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn i16(&mut self, v: i16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn lsn(&mut self, v: Lsn) {
        self.buf.extend_from_slice(&v.0.to_be_bytes());
    }
    fn cstr(&mut self, s: &str) {
        assert!(!s.contains('\0'), "a C string cannot hold NUL: {s:?}");
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }
    fn count16(&mut self, n: usize) {
        self.i16(i16::try_from(n).expect("Int16 count"));
    }
    fn len_prefixed(&mut self, b: &[u8]) {
        self.i32(i32::try_from(b.len()).expect("Int32 length"));
        self.buf.extend_from_slice(b);
    }
    /// The streamed-transaction xid: present exactly inside a streamed block.
    fn stream_xid(&mut self, xid: Option<u32>) {
        assert_eq!(xid.is_some(), self.in_stream, "xid presence must match stream state");
        if let Some(x) = xid {
            self.u32(x);
        }
    }
    fn tuple(&mut self, t: &TupleData) {
        self.count16(t.len());
        for v in t.fields() {
            match v {
                Field::Null => self.u8(b'n'),
                Field::UnchangedToast => self.u8(b'u'),
                Field::Text(b) => {
                    self.u8(b't');
                    self.len_prefixed(b);
                }
                Field::Binary(b) => {
                    self.u8(b'b');
                    self.len_prefixed(b);
                }
            }
        }
    }
    fn old_kind(&mut self, k: OldKind) {
        self.u8(match k {
            OldKind::Key => b'K',
            OldKind::Full => b'O',
        });
    }
    fn prepare_info(&mut self, tag: u8, p: &PrepareInfo) {
        self.u8(tag);
        self.u8(p.flags);
        self.lsn(p.prepare_lsn);
        self.lsn(p.end_lsn);
        self.i64(p.prepare_time);
        self.u32(p.xid);
        self.cstr(&p.gid);
    }

    fn message(&mut self, m: &LogicalMessage) {
        use LogicalMessage as M;
        match m {
            M::Begin(b) => {
                self.u8(b'B');
                self.lsn(b.final_lsn);
                self.i64(b.commit_time);
                self.u32(b.xid);
            }
            M::Commit(c) => {
                self.u8(b'C');
                self.u8(c.flags);
                self.lsn(c.commit_lsn);
                self.lsn(c.end_lsn);
                self.i64(c.commit_time);
            }
            M::Origin(o) => {
                self.u8(b'O');
                self.lsn(o.commit_lsn);
                self.cstr(&o.name);
            }
            M::Relation(r) => {
                self.u8(b'R');
                self.stream_xid(r.xid);
                self.u32(r.id);
                self.cstr(&r.namespace);
                self.cstr(&r.name);
                self.u8(r.replica_identity);
                self.count16(r.columns.len());
                for c in &r.columns {
                    self.u8(c.flags);
                    self.cstr(&c.name);
                    self.u32(c.type_oid);
                    self.i32(c.type_modifier);
                }
            }
            M::Type(t) => {
                self.u8(b'Y');
                self.stream_xid(t.xid);
                self.u32(t.id);
                self.cstr(&t.namespace);
                self.cstr(&t.name);
            }
            M::Insert(i) => {
                self.u8(b'I');
                self.stream_xid(i.xid);
                self.u32(i.relation_id);
                self.u8(b'N');
                self.tuple(&i.tuple);
            }
            M::Update(u) => {
                self.u8(b'U');
                self.stream_xid(u.xid);
                self.u32(u.relation_id);
                if let Some((kind, old)) = &u.old {
                    self.old_kind(*kind);
                    self.tuple(old);
                }
                self.u8(b'N');
                self.tuple(&u.new);
            }
            M::Delete(d) => {
                self.u8(b'D');
                self.stream_xid(d.xid);
                self.u32(d.relation_id);
                self.old_kind(d.old.0);
                self.tuple(&d.old.1);
            }
            M::Truncate(t) => {
                self.u8(b'T');
                self.stream_xid(t.xid);
                self.i32(i32::try_from(t.relation_ids.len()).expect("Int32 count"));
                self.u8(t.options);
                for id in &t.relation_ids {
                    self.u32(*id);
                }
            }
            M::Message(m) => {
                self.u8(b'M');
                self.stream_xid(m.xid);
                self.u8(m.flags);
                self.lsn(m.lsn);
                self.cstr(&m.prefix);
                self.len_prefixed(&m.content);
            }
            M::StreamStart(s) => {
                self.u8(b'S');
                self.u32(s.xid);
                self.u8(u8::from(s.first_segment));
            }
            M::StreamStop => self.u8(b'E'),
            M::StreamCommit(c) => {
                self.u8(b'c');
                self.u32(c.xid);
                self.u8(c.flags);
                self.lsn(c.commit_lsn);
                self.lsn(c.end_lsn);
                self.i64(c.commit_time);
            }
            M::StreamAbort(a) => {
                self.u8(b'A');
                self.u32(a.xid);
                self.u32(a.subxid);
                let v4 = self.proto_version >= 4;
                assert_eq!(a.abort_lsn.is_some(), v4, "abort LSN exactly in protocol 4+");
                assert_eq!(a.abort_time.is_some(), v4, "abort time exactly in protocol 4+");
                if let (Some(lsn), Some(t)) = (a.abort_lsn, a.abort_time) {
                    self.lsn(lsn);
                    self.i64(t);
                }
            }
            M::BeginPrepare(b) => {
                self.u8(b'b');
                self.lsn(b.prepare_lsn);
                self.lsn(b.end_lsn);
                self.i64(b.prepare_time);
                self.u32(b.xid);
                self.cstr(&b.gid);
            }
            M::Prepare(p) => self.prepare_info(b'P', p),
            M::StreamPrepare(p) => self.prepare_info(b'p', p),
            M::CommitPrepared(c) => {
                self.u8(b'K');
                self.u8(c.flags);
                self.lsn(c.commit_lsn);
                self.lsn(c.end_lsn);
                self.i64(c.commit_time);
                self.u32(c.xid);
                self.cstr(&c.gid);
            }
            M::RollbackPrepared(r) => {
                self.u8(b'r');
                self.u8(r.flags);
                self.lsn(r.prepare_end_lsn);
                self.lsn(r.rollback_end_lsn);
                self.i64(r.prepare_time);
                self.i64(r.rollback_time);
                self.u32(r.xid);
                self.cstr(&r.gid);
            }
        }
    }
}

fn encode(proto_version: u32, in_stream: bool, m: &LogicalMessage) -> Vec<u8> {
    let mut e = Enc { buf: Vec::new(), proto_version, in_stream };
    e.message(m);
    e.buf
}

// ---------------------------------------------------------------------------------------------
// strategies for valid messages
// ---------------------------------------------------------------------------------------------

/// Names as PostgreSQL may send them: any UTF-8 without NUL, from every Unicode plane.
fn name() -> impl Strategy<Value = String> + Clone {
    prop::collection::vec(any::<char>(), 0..12).prop_map(|cs| cs.into_iter().filter(|&c| c != '\0').collect())
}

fn bytes(max: usize) -> impl Strategy<Value = Bytes> + Clone {
    prop::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn lsn() -> impl Strategy<Value = Lsn> + Clone {
    any::<u64>().prop_map(Lsn)
}

fn tuple_value() -> impl Strategy<Value = TupleValue> + Clone {
    prop_oneof![
        Just(TupleValue::Null),
        Just(TupleValue::UnchangedToast),
        bytes(40).prop_map(TupleValue::Text),
        bytes(40).prop_map(TupleValue::Binary),
    ]
}

fn tuple(max_cols: usize) -> impl Strategy<Value = TupleData> + Clone {
    prop::collection::vec(tuple_value(), 0..max_cols).prop_map(TupleData::from)
}

fn old_kind() -> impl Strategy<Value = OldKind> + Clone {
    prop_oneof![Just(OldKind::Key), Just(OldKind::Full)]
}

fn column() -> impl Strategy<Value = Column> + Clone {
    (any::<u8>(), name(), any::<u32>(), any::<i32>()).prop_map(|(flags, name, type_oid, type_modifier)| Column {
        flags,
        name,
        type_oid,
        type_modifier,
    })
}

/// The streamed-transaction xid field: `Some` exactly inside a streamed block.
fn stream_xid(in_stream: bool) -> BoxedStrategy<Option<u32>> {
    match in_stream {
        true => any::<u32>().prop_map(Some).boxed(),
        false => Just(None).boxed(),
    }
}

fn prepare_info() -> impl Strategy<Value = PrepareInfo> + Clone {
    (any::<u8>(), lsn(), lsn(), any::<i64>(), any::<u32>(), name()).prop_map(
        |(flags, prepare_lsn, end_lsn, prepare_time, xid, gid)| PrepareInfo {
            flags,
            prepare_lsn,
            end_lsn,
            prepare_time,
            xid,
            gid,
        },
    )
}

/// Any valid message for a decoder of `proto_version` in the given stream state. `max_cols`
/// bounds Relation columns and TupleData values.
fn message(proto_version: u32, in_stream: bool, max_cols: usize) -> BoxedStrategy<LogicalMessage> {
    use LogicalMessage as M;
    let xid = || stream_xid(in_stream);
    let abort_extra: BoxedStrategy<(Option<Lsn>, Option<i64>)> = match proto_version >= 4 {
        true => (lsn(), any::<i64>()).prop_map(|(l, t)| (Some(l), Some(t))).boxed(),
        false => Just((None, None)).boxed(),
    };
    Union::new(vec![
        (lsn(), any::<i64>(), any::<u32>())
            .prop_map(|(final_lsn, commit_time, xid)| M::Begin(Begin { final_lsn, commit_time, xid }))
            .boxed(),
        (any::<u8>(), lsn(), lsn(), any::<i64>())
            .prop_map(|(flags, commit_lsn, end_lsn, commit_time)| {
                M::Commit(Commit { flags, commit_lsn, end_lsn, commit_time })
            })
            .boxed(),
        (lsn(), name()).prop_map(|(commit_lsn, name)| M::Origin(Origin { commit_lsn, name })).boxed(),
        (
            xid(),
            any::<u32>(),
            name(),
            name(),
            prop_oneof![Just(b'd'), Just(b'n'), Just(b'f'), Just(b'i'), any::<u8>()],
            prop::collection::vec(column(), 0..max_cols),
        )
            .prop_map(|(xid, id, namespace, name, replica_identity, columns)| {
                M::Relation(Relation { xid, id, namespace, name, replica_identity, columns })
            })
            .boxed(),
        (xid(), any::<u32>(), name(), name())
            .prop_map(|(xid, id, namespace, name)| M::Type(TypeMessage { xid, id, namespace, name }))
            .boxed(),
        (xid(), any::<u32>(), tuple(max_cols))
            .prop_map(|(xid, relation_id, tuple)| M::Insert(Insert { xid, relation_id, tuple }))
            .boxed(),
        (xid(), any::<u32>(), prop::option::of((old_kind(), tuple(max_cols))), tuple(max_cols))
            .prop_map(|(xid, relation_id, old, new)| M::Update(Box::new(Update { xid, relation_id, old, new })))
            .boxed(),
        (xid(), any::<u32>(), old_kind(), tuple(max_cols))
            .prop_map(|(xid, relation_id, kind, t)| M::Delete(Delete { xid, relation_id, old: (kind, t) }))
            .boxed(),
        (xid(), any::<u8>(), prop::collection::vec(any::<u32>(), 0..max_cols))
            .prop_map(|(xid, options, relation_ids)| M::Truncate(Truncate { xid, options, relation_ids }))
            .boxed(),
        (xid(), any::<u8>(), lsn(), name(), bytes(64))
            .prop_map(|(xid, flags, lsn, prefix, content)| M::Message(Message { xid, flags, lsn, prefix, content }))
            .boxed(),
        (any::<u32>(), any::<bool>())
            .prop_map(|(xid, first_segment)| M::StreamStart(StreamStart { xid, first_segment }))
            .boxed(),
        Just(M::StreamStop).boxed(),
        (any::<u32>(), any::<u8>(), lsn(), lsn(), any::<i64>())
            .prop_map(|(xid, flags, commit_lsn, end_lsn, commit_time)| {
                M::StreamCommit(StreamCommit { xid, flags, commit_lsn, end_lsn, commit_time })
            })
            .boxed(),
        (any::<u32>(), any::<u32>(), abort_extra)
            .prop_map(|(xid, subxid, (abort_lsn, abort_time))| {
                M::StreamAbort(StreamAbort { xid, subxid, abort_lsn, abort_time })
            })
            .boxed(),
        (lsn(), lsn(), any::<i64>(), any::<u32>(), name())
            .prop_map(|(prepare_lsn, end_lsn, prepare_time, xid, gid)| {
                M::BeginPrepare(BeginPrepare { prepare_lsn, end_lsn, prepare_time, xid, gid })
            })
            .boxed(),
        prepare_info().prop_map(M::Prepare).boxed(),
        prepare_info().prop_map(M::StreamPrepare).boxed(),
        (any::<u8>(), lsn(), lsn(), any::<i64>(), any::<u32>(), name())
            .prop_map(|(flags, commit_lsn, end_lsn, commit_time, xid, gid)| {
                M::CommitPrepared(CommitPrepared { flags, commit_lsn, end_lsn, commit_time, xid, gid })
            })
            .boxed(),
        (any::<u8>(), lsn(), lsn(), any::<i64>(), any::<i64>(), any::<u32>(), name())
            .prop_map(|(flags, prepare_end_lsn, rollback_end_lsn, prepare_time, rollback_time, xid, gid)| {
                M::RollbackPrepared(RollbackPrepared {
                    flags,
                    prepare_end_lsn,
                    rollback_end_lsn,
                    prepare_time,
                    rollback_time,
                    xid,
                    gid,
                })
            })
            .boxed(),
    ])
    .boxed()
}

/// (protocol version, stream state, a valid message for that decoder).
fn any_valid(max_cols: usize) -> impl Strategy<Value = (u32, bool, LogicalMessage)> {
    (1u32..=4, any::<bool>())
        .prop_flat_map(move |(proto, in_stream)| (Just(proto), Just(in_stream), message(proto, in_stream, max_cols)))
}

/// Every tag the decoder knows, plus the tuple markers, to lead random bytes somewhere useful.
const TAGS: &[u8] = b"BCORYIUDTMSEcAbPpKrNKOntu";

// ---------------------------------------------------------------------------------------------
// round trips
// ---------------------------------------------------------------------------------------------

/// encode → decode gives back the original message, with the right state change.
fn check_round_trip(proto: u32, in_stream: bool, msg: &LogicalMessage) -> Result<(), TestCaseError> {
    let wire = Bytes::from(encode(proto, in_stream, msg));
    let got = decode_checked(proto, in_stream, wire.clone());
    prop_assert_eq!(
        got.as_ref().ok(),
        Some(msg),
        "proto {} in_stream {} wire {:02x?}: {:?}",
        proto,
        in_stream,
        &wire[..],
        got
    );
    Ok(())
}

#[test]
fn round_trip_every_message_type() {
    TestRunner::new(config(2048))
        .run(&any_valid(8), |(proto, in_stream, msg)| check_round_trip(proto, in_stream, &msg))
        .unwrap();
}

/// Few cases, but rows and relations as wide as PostgreSQL allows (1664 target-list entries).
#[test]
fn round_trip_wide_rows() {
    let mut cfg = config(24);
    cfg.cases = cfg.cases.min(256);
    TestRunner::new(cfg)
        .run(&any_valid(1700), |(proto, in_stream, msg)| check_round_trip(proto, in_stream, &msg))
        .unwrap();
}

#[test]
fn every_strict_prefix_is_truncated() {
    TestRunner::new(config(256))
        .run(&any_valid(6), |(proto, in_stream, msg)| {
            let wire = Bytes::from(encode(proto, in_stream, &msg));
            for len in 0..wire.len() {
                let got = decode_checked(proto, in_stream, wire.slice(..len));
                prop_assert!(
                    matches!(got, Err(DecodeError::Truncated { .. })),
                    "prefix {} of {:02x?} ({:?}) gave {:?}",
                    len,
                    &wire[..],
                    msg,
                    got
                );
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn any_extension_is_trailing_bytes() {
    let strategy = (any_valid(8), prop::collection::vec(any::<u8>(), 1..8));
    TestRunner::new(config(1024))
        .run(&strategy, |((proto, in_stream, msg), extra)| {
            let mut wire = encode(proto, in_stream, &msg);
            wire.extend_from_slice(&extra);
            let got = decode_checked(proto, in_stream, Bytes::from(wire));
            prop_assert!(
                matches!(got, Err(DecodeError::TrailingBytes(n)) if n == extra.len()),
                "{:?} + {:02x?} gave {:?}",
                msg,
                extra,
                got
            );
            Ok(())
        })
        .unwrap();
}

/// A stream of valid messages through one decoder, with the state following Stream Start/Stop:
/// each step carries a message for either state and sends the one matching the decoder's state
/// when it arrives.
#[test]
fn round_trip_sequences_track_stream_state() {
    let strategy = (1u32..=4).prop_flat_map(|proto| {
        let step = (0u8..8, any::<u32>(), message(proto, false, 4), message(proto, true, 4));
        (Just(proto), prop::collection::vec(step, 1..24))
    });
    TestRunner::new(config(256))
        .run(&strategy, |(proto, steps)| {
            let mut d = Decoder::new(proto);
            for (pick, xid, outside, inside) in steps {
                let in_stream = d.in_stream();
                // One step in four moves the state explicitly; the rest are random messages,
                // which may also be Stream Start/Stop.
                let msg = match (pick, in_stream) {
                    (0, _) => LogicalMessage::StreamStart(StreamStart { xid, first_segment: xid & 1 == 1 }),
                    (1, _) => LogicalMessage::StreamStop,
                    (_, false) => outside,
                    (_, true) => inside,
                };
                let wire = Bytes::from(encode(proto, in_stream, &msg));
                let got = d.decode(wire);
                prop_assert_eq!(got.as_ref().ok(), Some(&msg));
                let want_state = match msg {
                    LogicalMessage::StreamStart(_) => true,
                    LogicalMessage::StreamStop => false,
                    _ => in_stream,
                };
                prop_assert_eq!(d.in_stream(), want_state);
            }
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// hostile input
// ---------------------------------------------------------------------------------------------

#[test]
fn arbitrary_bytes_never_panic() {
    let strategy = (1u32..=4, any::<bool>(), prop::collection::vec(any::<u8>(), 0..256));
    TestRunner::new(config(4096))
        .run(&strategy, |(proto, in_stream, buf)| {
            let _ = decode_checked(proto, in_stream, Bytes::from(buf));
            Ok(())
        })
        .unwrap();
}

/// Random bytes mostly die on the tag; these start with a real one so the body parsers run.
#[test]
fn tag_led_bytes_never_panic() {
    let strategy = (
        1u32..=4,
        any::<bool>(),
        prop::sample::select(TAGS),
        prop::collection::vec(
            prop_oneof![any::<u8>(), Just(0u8), Just(0xff), Just(0x7f), Just(0x80), prop::sample::select(TAGS)],
            0..128,
        ),
    );
    TestRunner::new(config(4096))
        .run(&strategy, |(proto, in_stream, tag, body)| {
            let mut buf = vec![tag];
            buf.extend_from_slice(&body);
            let _ = decode_checked(proto, in_stream, Bytes::from(buf));
            Ok(())
        })
        .unwrap();
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop_oneof![any::<u8>(), Just(0u8), Just(0x7f), Just(0x80), Just(0xff)];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(at, b)| Mutation::Set(at, b)),
        (any::<usize>(), byte).prop_map(|(at, b)| Mutation::Insert(at, b)),
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(buf: &mut Vec<u8>, m: &Mutation) {
    match *m {
        Mutation::Set(at, b) if !buf.is_empty() => {
            let at = at % buf.len();
            buf[at] = b;
        }
        Mutation::Insert(at, b) => buf.insert(at % (buf.len() + 1), b),
        Mutation::Remove(at) if !buf.is_empty() => {
            buf.remove(at % buf.len());
        }
        Mutation::Truncate(at) => buf.truncate(at % (buf.len() + 1)),
        _ => {}
    }
}

/// Valid messages with a few bytes changed: the hostile input closest to real traffic. Decoded in
/// every protocol version and both stream states, not only the one they were encoded for.
#[test]
fn mutated_valid_messages_never_panic() {
    let strategy = (any_valid(6), prop::collection::vec(mutation(), 1..5), 1u32..=4, any::<bool>());
    TestRunner::new(config(2048))
        .run(&strategy, |((proto, in_stream, msg), muts, proto2, in_stream2)| {
            let mut wire = encode(proto, in_stream, &msg);
            for m in &muts {
                apply(&mut wire, m);
            }
            let wire = Bytes::from(wire);
            let _ = decode_checked(proto, in_stream, wire.clone());
            let _ = decode_checked(proto2, in_stream2, wire);
            Ok(())
        })
        .unwrap();
}

/// Protocol versions the decoder was never meant for (0, 5, u32::MAX) must not panic either.
#[test]
fn odd_protocol_versions_never_panic() {
    let strategy = (
        prop_oneof![Just(0u32), Just(5), Just(u32::MAX), any::<u32>()],
        any::<bool>(),
        prop::sample::select(TAGS),
        prop::collection::vec(any::<u8>(), 0..96),
    );
    TestRunner::new(config(1024))
        .run(&strategy, |(proto, in_stream, tag, body)| {
            let mut buf = vec![tag];
            buf.extend_from_slice(&body);
            let _ = decode_checked(proto, in_stream, Bytes::from(buf));
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// CopyData framing
// ---------------------------------------------------------------------------------------------

/// What `parse_copy_data` must say about `frame`, from the protocol docs: `w` + 24 header bytes +
/// payload, or `k` + exactly 17 bytes; nothing else.
fn check_copy_data(frame: &[u8]) -> Result<(), TestCaseError> {
    let be64 = |b: &[u8]| u64::from_be_bytes(b[..8].try_into().unwrap());
    let got = parse_copy_data(Bytes::copy_from_slice(frame));
    match (frame.first(), got) {
        (Some(b'w'), Ok(WalMessage::Data { wal_start, wal_end, data })) => {
            prop_assert!(frame.len() >= 25);
            prop_assert_eq!(wal_start, Lsn(be64(&frame[1..])));
            prop_assert_eq!(wal_end, Lsn(be64(&frame[9..])));
            prop_assert_eq!(&data[..], &frame[25..]);
        }
        (Some(b'k'), Ok(WalMessage::Keepalive { wal_end, reply_requested })) => {
            prop_assert_eq!(frame.len(), 18);
            prop_assert_eq!(wal_end, Lsn(be64(&frame[1..])));
            prop_assert_eq!(reply_requested, frame[17] == 1);
        }
        (Some(b'w'), Err(e)) => prop_assert!(frame.len() < 25, "{}", e),
        (Some(b'k'), Err(e)) => prop_assert!(frame.len() != 18, "{}", e),
        (_, Err(e)) => prop_assert!(!e.is_empty()),
        (tag, Ok(m)) => prop_assert!(false, "tag {:?} parsed as {:?}", tag, m),
    }
    Ok(())
}

#[test]
fn copy_data_arbitrary_bytes() {
    let strategy = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        (prop::sample::select(&b"wk"[..]), prop::collection::vec(any::<u8>(), 0..48)).prop_map(|(t, mut rest)| {
            rest.insert(0, t);
            rest
        }),
    ];
    TestRunner::new(config(4096)).run(&strategy, |frame| check_copy_data(&frame)).unwrap();
}

#[test]
fn copy_data_round_trip_and_prefixes() {
    let strategy = (
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
        any::<i64>(),
        any::<u8>(),
        prop::collection::vec(any::<u8>(), 0..64),
    );
    TestRunner::new(config(1024))
        .run(&strategy, |(xlog, a, b, time, reply, payload)| {
            let mut frame = vec![if xlog { b'w' } else { b'k' }];
            frame.extend_from_slice(&a.to_be_bytes());
            if xlog {
                frame.extend_from_slice(&b.to_be_bytes());
                frame.extend_from_slice(&time.to_be_bytes());
                frame.extend_from_slice(&payload);
            } else {
                frame.extend_from_slice(&time.to_be_bytes());
                frame.push(reply);
            }
            // The frame itself and every prefix and extension of it.
            for len in 0..=frame.len() {
                check_copy_data(&frame[..len])?;
            }
            let mut longer = frame.clone();
            longer.push(reply);
            check_copy_data(&longer)?;
            // And the XLogData payload on into the decoder, as the pipeline does.
            if let Ok(WalMessage::Data { data, .. }) = parse_copy_data(Bytes::from(frame)) {
                let _ = decode_checked(1, false, data);
            }
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// regressions
// ---------------------------------------------------------------------------------------------

/// Fixed cases for the parsers. Every crash found by `fuzz/` (its input's first byte is the
/// target's mode byte: bits 0–1 = protocol version − 1, bit 2 = inside a streamed block, which
/// `decode_mode` below reads the same way) or by the properties above belongs here, with its
/// expected outcome, before the fix. The fuzzing runs recorded in fuzz/README.md found none; these
/// are the limit cases the decoder's length and count checks exist for.
mod regressions {
    use super::*;

    fn decode_mode(mode: u8, body: &[u8]) -> Result<LogicalMessage, DecodeError> {
        decode_checked(1 + u32::from(mode & 0b11), mode & 0b100 != 0, Bytes::copy_from_slice(body))
    }

    #[test]
    fn limit_cases() {
        let cases: &[(u8, &[u8])] = &[
            // Truncate claiming i32::MAX and u32::MAX/4+1 relations: the count × 4 must not
            // overflow or allocate.
            (0, b"T\x7f\xff\xff\xff\x00\x00\x00\x00\x01"),
            (0, b"T\x40\x00\x00\x00\x00"),
            (0, b"T\x80\x00\x00\x00\x00"),
            // In a stream the xid comes first; the count is then the next four bytes.
            (4, b"T\x00\x00\x00\x01\x7f\xff\xff\xff\x00"),
            // Relation with 32767 columns and no bytes for them.
            (0, b"R\x00\x00\x00\x01a\x00b\x00d\x7f\xff"),
            // TupleData count 32767 with one value present.
            (0, b"I\x00\x00\x00\x01N\x7f\xffn"),
            // Text / Message lengths at the limits.
            (0, b"I\x00\x00\x00\x01N\x00\x01t\x7f\xff\xff\xff"),
            (0, b"I\x00\x00\x00\x01N\x00\x01t\x80\x00\x00\x00"),
            (0, b"M\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff"),
            // A C string that never ends, and one that is not UTF-8.
            (0, b"O\x00\x00\x00\x00\x00\x00\x00\x00abc"),
            (0, b"O\x00\x00\x00\x00\x00\x00\x00\x00\xed\xa0\x80\x00"),
            // Stream Abort: protocol 4 needs 16 more bytes than protocol 1–3.
            (3, b"A\x00\x00\x00\x01\x00\x00\x00\x02"),
            (0, b"A\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00"),
            // Only a tag.
            (0, b""),
            (7, b"U"),
        ];
        for (mode, body) in cases {
            let got = decode_mode(*mode, body);
            assert!(got.is_err(), "mode {mode} {body:02x?} decoded as {got:?}");
        }
        // Limit cases that are valid.
        assert_eq!(
            decode_mode(0, b"T\x00\x00\x00\x00\x00").unwrap(),
            LogicalMessage::Truncate(Truncate { xid: None, options: 0, relation_ids: vec![] })
        );
        assert_eq!(
            decode_mode(
                3,
                b"A\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x09\xff\xff\xff\xff\xff\xff\xff\xff"
            )
            .unwrap(),
            LogicalMessage::StreamAbort(StreamAbort {
                xid: 1,
                subxid: 2,
                abort_lsn: Some(Lsn(9)),
                abort_time: Some(-1)
            })
        );
    }

    #[test]
    fn copy_data_limit_cases() {
        for frame in [
            &b""[..],
            b"w",
            b"k",
            &[b'w'; 24],
            &[b'k'; 17],
            &[b'k'; 19],
            b"x\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
        ] {
            assert!(parse_copy_data(Bytes::copy_from_slice(frame)).is_err(), "{frame:02x?}");
        }
        assert!(matches!(
            parse_copy_data(Bytes::copy_from_slice(&[b'w'; 25])),
            Ok(WalMessage::Data { data, .. }) if data.is_empty()
        ));
    }
}
