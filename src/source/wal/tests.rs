//! The replication loop against a scripted WAL source and an in-memory sink.
//!
//! The source plays pgoutput messages the way a walsender would (transactions in commit order,
//! keepalives carrying the position sent so far, a Relation message before a relation's first row
//! in each session, and on a restart at LSN `s` only the transactions that end after `s`). The
//! sink holds every delivery handle; an acker task resolves them in a random order, sometimes by
//! rejecting a record (which sends it to the dead-letter path). Every standby status update is
//! checked against the ground truth: it must stay below the end of every transaction that still
//! has a record without an ack, and at or below what the server has sent.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use clap::Parser;
use proptest::prelude::*;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::config::{Cli, Command};
use crate::error::Transient;
use crate::relay::Delivery;
use crate::sink::SinkError;
use crate::tools::dlq::H_PAYLOAD_DROPPED;

const OUTBOX: u32 = 1;
const OTHER: u32 = 2;

/// One transaction of the script.
#[derive(Clone, Debug)]
struct Txn {
    /// Outbox rows; `true` for a row of the wide schema (an added column).
    rows: Vec<bool>,
    other_rows: usize,
    message: bool,
    /// A transactional `--messages-prefix` message (an event) after the rows.
    event_message: bool,
    /// A non-transactional message with the event prefix after the commit (a bad event, sent to
    /// the dead-letter topic in a transaction of its own).
    stray: bool,
    /// A keepalive arrives between two rows (inside the open transaction).
    keepalive_inside: bool,
    begin: Lsn,
    end: Lsn,
    /// LSN of each outbox row, for the ground truth.
    row_lsns: Vec<Lsn>,
}

impl Txn {
    /// LSN of the event message, after the rows, other rows and the app message.
    fn event_lsn(&self) -> Lsn {
        Lsn(self.row_lsns.last().copied().unwrap_or(self.begin).0 + self.other_rows as u64 + 2)
    }

    /// LSN of the stray message: after the commit and its heartbeat, before the next BEGIN.
    fn stray_lsn(&self) -> Lsn {
        Lsn(self.end.0 + 4)
    }
}

/// What happened to each outbox row, by its LSN, shared by the sink, the acker and the checks.
#[derive(Default)]
struct Truth {
    /// Row LSN → (end LSN of its transaction, acked by the sink).
    rows: BTreeMap<Lsn, (Lsn, bool)>,
    /// Highest WAL position the source has sent.
    sent: Lsn,
    statuses: Vec<Lsn>,
    violations: Vec<String>,
}

impl Truth {
    fn check(&mut self, confirmed: Lsn) {
        if confirmed > self.sent {
            self.violations.push(format!("confirmed {confirmed} beyond what was sent ({})", self.sent));
        }
        for (lsn, (end, acked)) in &self.rows {
            if !acked && confirmed >= *end {
                self.violations.push(format!("confirmed {confirmed} passes unacked row at {lsn} (txn end {end})"));
            }
        }
        if let Some(prev) = self.statuses.last() {
            if confirmed < *prev {
                self.violations.push(format!("confirmed went back from {prev} to {confirmed}"));
            }
        }
        self.statuses.push(confirmed);
    }
}

struct Scripted {
    msgs: VecDeque<(Lsn, WalMessage)>,
    /// Fail with a transient error after this many messages.
    fail_after: Option<usize>,
    truth: Arc<Mutex<Truth>>,
    last: Lsn,
}

impl Scripted {
    /// The next scripted message or disconnect; `None` when the script is spent.
    fn pop(&mut self) -> Option<Result<WalMessage, Error>> {
        if let Some(n) = self.fail_after.as_mut() {
            if *n == 0 {
                return Some(Err(
                    Transient::PgServer { code: "57P01".into(), message: "scripted disconnect".into() }.into()
                ));
            }
            *n -= 1;
        }
        let (pos, m) = self.msgs.pop_front()?;
        let mut t = self.truth.lock().unwrap();
        t.sent = t.sent.max(pos);
        self.last = self.last.max(pos);
        Some(Ok(m))
    }
}

impl WalSource for Scripted {
    async fn next(&mut self) -> Result<WalMessage, Error> {
        match self.pop() {
            Some(m) => m,
            None => std::future::pending().await,
        }
    }
    /// Every scripted message is at hand: the session's burst path reads them as it reads a
    /// walsender's buffered frames (a scripted disconnect is left for `next` to report).
    fn try_next(&mut self) -> Option<Result<WalMessage, Error>> {
        match self.fail_after {
            Some(0) => None,
            _ if self.msgs.is_empty() => None,
            _ => self.pop(),
        }
    }
    async fn send_status(&mut self, confirmed: Lsn) -> Result<(), Error> {
        self.truth.lock().unwrap().check(confirmed);
        Ok(())
    }
    fn liveness_period(&self) -> Option<Duration> {
        None
    }
    async fn check_liveness(&mut self, _: Lsn) -> Result<(), Error> {
        Ok(())
    }
    fn pause_liveness(&mut self) {}
    async fn close(self) {}
    fn last_received(&self) -> Lsn {
        self.last
    }
}

fn cstr(b: &mut BytesMut, s: &str) {
    b.put_slice(s.as_bytes());
    b.put_u8(0);
}

fn relation(id: u32, name: &str, cols: &[(&str, u32)]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'R');
    b.put_u32(id);
    cstr(&mut b, "public");
    cstr(&mut b, name);
    b.put_u8(b'd');
    b.put_u16(cols.len() as u16);
    for (n, oid) in cols {
        b.put_u8(0);
        cstr(&mut b, n);
        b.put_u32(*oid);
        b.put_i32(-1);
    }
    b.freeze()
}

fn insert(id: u32, vals: &[&str]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'I');
    b.put_u32(id);
    b.put_u8(b'N');
    b.put_u16(vals.len() as u16);
    for v in vals {
        b.put_u8(b't');
        b.put_u32(v.len() as u32);
        b.put_slice(v.as_bytes());
    }
    b.freeze()
}

fn begin(final_lsn: Lsn) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'B');
    b.put_u64(final_lsn.0);
    b.put_i64(0);
    b.put_u32(7);
    b.freeze()
}

fn commit(commit_lsn: Lsn, end: Lsn) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'C');
    b.put_u8(0);
    b.put_u64(commit_lsn.0);
    b.put_u64(end.0);
    b.put_i64(0);
    b.freeze()
}

fn message(transactional: bool, lsn: Lsn, prefix: &str) -> Bytes {
    message_with(transactional, lsn, prefix, "hi")
}

fn message_with(transactional: bool, lsn: Lsn, prefix: &str, content: &str) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'M');
    b.put_u8(u8::from(transactional));
    b.put_u64(lsn.0);
    cstr(&mut b, prefix);
    b.put_u32(content.len() as u32);
    b.put_slice(content.as_bytes());
    b.freeze()
}

fn event_content(at: Lsn) -> String {
    format!(r#"{{"event_id": "m-{}", "aggregate_id": "agg", "event_type": "order", "payload": {{"n": 1}}}}"#, at.0)
}

const NARROW: &[(&str, u32)] =
    &[("event_id", 25), ("aggregate_id", 25), ("event_type", 25), ("payload", 3802), ("created_at", 1184)];
const WIDE: &[(&str, u32)] = &[
    ("event_id", 25),
    ("aggregate_id", 25),
    ("event_type", 25),
    ("payload", 3802),
    ("created_at", 1184),
    ("tenant", 25),
];

/// Lay the transactions out in WAL: each message 16 bytes after the last.
fn layout(txns: &mut [Txn]) {
    let mut pos = 1000u64;
    for t in txns.iter_mut() {
        t.begin = Lsn(pos);
        let n = 4
            + t.rows.len() * 2
            + t.other_rows
            + usize::from(t.message)
            + usize::from(t.event_message)
            + usize::from(t.keepalive_inside);
        t.row_lsns.clear();
        let mut p = pos + 16;
        for _ in &t.rows {
            p += 16; // the Relation message before each row (schemas may change mid-stream)
            t.row_lsns.push(Lsn(p));
            p += 16;
        }
        pos += 16 * n as u64 + 16;
        t.end = Lsn(pos);
        pos += 16;
    }
}

/// The messages a walsender sends for a session that starts at `start`.
fn session_messages(txns: &[Txn], start: Lsn, keepalive_reply: bool) -> VecDeque<(Lsn, WalMessage)> {
    let mut out = VecDeque::new();
    let data = |at: Lsn, b: Bytes| (at, WalMessage::Data { wal_start: at, wal_end: at, data: b });
    for t in txns {
        // A restart resends the transactions that end after `start`, and the non-transactional
        // messages that start at or after it.
        if t.end <= start {
            if t.stray && t.stray_lsn() >= start {
                let at = t.stray_lsn();
                out.push_back(data(at, message_with(false, at, "outbox", &event_content(at))));
            }
            continue;
        }
        out.push_back(data(t.begin, begin(t.end)));
        for (i, wide) in t.rows.iter().enumerate() {
            let at = t.row_lsns[i];
            let cols = if *wide { WIDE } else { NARROW };
            out.push_back(data(Lsn(at.0 - 16), relation(OUTBOX, "outbox", cols)));
            let id = format!("e-{}", at.0);
            let mut vals = vec![id.as_str(), "agg", "order", "{\"n\":1}", "2024-01-02 03:04:05+00"];
            if *wide {
                vals.push("acme");
            }
            out.push_back(data(at, insert(OUTBOX, &vals)));
            if i == 0 && t.keepalive_inside {
                // The server's position is past this transaction's start, not past its end.
                out.push_back((at, WalMessage::Keepalive { wal_end: at, reply_requested: keepalive_reply }));
            }
        }
        let mut p = t.row_lsns.last().copied().unwrap_or(t.begin);
        for _ in 0..t.other_rows {
            p = Lsn(p.0 + 1);
            out.push_back(data(p, relation(OTHER, "other", &[("x", 25)])));
            out.push_back(data(p, insert(OTHER, &["1"])));
        }
        if t.message {
            p = Lsn(p.0 + 1);
            out.push_back(data(p, message(true, p, "app.note")));
        }
        if t.event_message {
            let at = t.event_lsn();
            out.push_back(data(at, message_with(true, at, "outbox", &event_content(at))));
        }
        // The commit's XLogData reaches up to the transaction's end.
        let at = Lsn(t.end.0 - 8);
        out.push_back((t.end, WalMessage::Data { wal_start: at, wal_end: t.end, data: commit(at, t.end) }));
        out.push_back((t.end, WalMessage::Keepalive { wal_end: t.end, reply_requested: keepalive_reply }));
        // An idle heartbeat after the commit, as outboxd's own monitor emits.
        out.push_back(data(t.end, message(false, t.end, HEARTBEAT_PREFIX)));
        if t.stray {
            let at = t.stray_lsn();
            out.push_back(data(at, message_with(false, at, "outbox", &event_content(at))));
        }
    }
    out
}

/// Holds every delivery; the acker resolves them.
struct MemSink {
    held: Arc<Mutex<Vec<Delivery>>>,
    /// Records not yet handed over: the sink reports itself blocked while this is non-empty.
    waiting: VecDeque<Delivery>,
    block_every: usize,
    sent: usize,
}

impl Sink for MemSink {
    fn send(&mut self, _record: Record, delivery: Delivery) -> Result<(), SinkError> {
        self.sent += 1;
        if !self.waiting.is_empty() || (self.block_every > 0 && self.sent % self.block_every == 0) {
            self.waiting.push_back(delivery);
        } else {
            self.held.lock().unwrap().push(delivery);
        }
        Ok(())
    }
    fn blocked(&self) -> bool {
        !self.waiting.is_empty()
    }
    async fn unblock(&mut self) -> Result<(), SinkError> {
        tokio::time::sleep(Duration::from_millis(3)).await;
        let mut held = self.held.lock().unwrap();
        held.extend(self.waiting.drain(..));
        Ok(())
    }
}

fn test_config(extra: &[&str]) -> Config {
    let mut args = vec!["outboxd", "run", "--postgres-url", "postgres://u@127.0.0.1/db", "--status-interval", "20ms"];
    args.extend_from_slice(extra);
    let Command::Run(a) = Cli::try_parse_from(args).unwrap().command else { unreachable!() };
    Config::from_args(&a).unwrap()
}

struct Plan {
    txns: Vec<Txn>,
    seed: u64,
    max_in_flight: usize,
    reject_one_in: u64,
    block_every: usize,
    /// Per session: fail after this many messages (the last session never fails).
    disconnects: Vec<usize>,
    keepalive_reply: bool,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Run the plan to completion; returns the truth for the caller's assertions.
async fn run_plan(mut plan: Plan) -> Truth {
    layout(&mut plan.txns);
    let truth = Arc::new(Mutex::new(Truth::default()));
    {
        let mut t = truth.lock().unwrap();
        for txn in &plan.txns {
            for l in &txn.row_lsns {
                t.rows.insert(*l, (txn.end, false));
            }
            if txn.event_message {
                t.rows.insert(txn.event_lsn(), (txn.end, false));
            }
            // Confirming the stray's own LSN is allowed (the server resends a message that starts
            // at the confirmed position); passing it is not, until its dead-letter copy is acked.
            if txn.stray {
                t.rows.insert(txn.stray_lsn(), (Lsn(txn.stray_lsn().0 + 1), false));
            }
        }
    }
    let last_end = plan.txns.last().map_or(Lsn(0), |t| t.end);
    let max = plan.max_in_flight.to_string();
    let cfg = test_config(&[
        "--max-in-flight",
        &max,
        "--on-bad-event",
        "dlq",
        "--shutdown-timeout",
        "5s",
        "--messages-prefix",
        "outbox",
    ]);
    let held: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let mut sink = MemSink { held: held.clone(), waiting: VecDeque::new(), block_every: plan.block_every, sent: 0 };
    let shutdown = CancellationToken::new();

    // The acker: resolve a random held delivery every millisecond; a few are rejected.
    let acker = {
        let (held, truth, shutdown) = (held.clone(), truth.clone(), shutdown.clone());
        let (mut rng, reject) = (plan.seed | 1, plan.reject_one_in);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let d = {
                    let mut h = held.lock().unwrap();
                    if h.is_empty() {
                        if shutdown.is_cancelled() {
                            return;
                        }
                        continue;
                    }
                    let i = (xorshift(&mut rng) % h.len() as u64) as usize;
                    h.swap_remove(i)
                };
                let Position::Lsn(lsn) = d.source().position else { panic!("a run record has an LSN") };
                if !d.is_dead_letter() && reject > 0 && xorshift(&mut rng) % reject == 0 {
                    d.reject("rejected", "scripted refusal", None, Some(Bytes::from_static(b"{}")), Vec::new());
                } else {
                    if let Some(row) = truth.lock().unwrap().rows.get_mut(&lsn) {
                        row.1 = true;
                    }
                    d.ack();
                }
            }
        })
    };
    // Stop once every row is acked and a status update reached the last commit.
    let watcher = {
        let (truth, shutdown) = (truth.clone(), shutdown.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let t = truth.lock().unwrap();
                if t.rows.values().all(|r| r.1) && t.statuses.last().is_some_and(|s| *s >= last_end) {
                    shutdown.cancel();
                    return;
                }
            }
        })
    };

    // A bound in virtual time: a run that never completes is a failure, not a hang.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(600);
    let mut confirmed = Lsn(0);
    let mut session = 0;
    loop {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the run did not complete: {:?}",
            truth.lock().unwrap().violations.first()
        );
        let start = confirmed;
        let msgs = session_messages(&plan.txns, start, plan.keepalive_reply);
        let stream =
            Scripted { msgs, fail_after: plan.disconnects.get(session).copied(), truth: truth.clone(), last: start };
        let ctx = Context { cfg: &cfg, metrics: Metrics::new(), health: Health::new(Duration::ZERO) };
        let run = Session::new(ctx, &mut sink, stream, start).run(shutdown.clone(), &mut confirmed);
        let r = match tokio::time::timeout_at(give_up, run).await {
            Ok(r) => r,
            Err(_) => panic!("the run did not complete: {:?}", truth.lock().unwrap().violations.first()),
        };
        session += 1;
        match r {
            Ok(()) => break,
            Err(e) if e.is_transient() => {
                // The old session's unsent records are gone with it (their handles fail on drop).
                sink.waiting.clear();
                continue;
            }
            Err(e) => panic!("session failed: {e}"),
        }
    }
    shutdown.cancel();
    let _ = watcher.await;
    let _ = acker.await;
    Arc::try_unwrap(truth).ok().expect("no other owner").into_inner().unwrap()
}

fn txn_strategy() -> impl Strategy<Value = Txn> {
    (
        prop::collection::vec(any::<bool>(), 0..4),
        0usize..3,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(rows, other_rows, message, keepalive_inside, event_message, stray)| Txn {
            keepalive_inside: keepalive_inside && !rows.is_empty(),
            rows,
            other_rows,
            message,
            event_message,
            stray,
            begin: Lsn(0),
            end: Lsn(0),
            row_lsns: Vec::new(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every status update stays below every transaction with an unacked row, and once all is
    /// acked the frontier reaches the last commit, across random acks, rejections, backpressure,
    /// a blocked sink, schema changes, keepalives and disconnects.
    #[test]
    fn status_updates_never_pass_an_unacked_row(
        txns in prop::collection::vec(txn_strategy(), 1..25),
        seed in any::<u64>(),
        max_in_flight in 1usize..6,
        reject_one_in in prop_oneof![Just(0u64), 2u64..8],
        block_every in prop_oneof![Just(0usize), 2usize..5],
        disconnects in prop::collection::vec(0usize..40, 0..3),
        keepalive_reply in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        let plan = Plan { txns, seed, max_in_flight, reject_one_in, block_every, disconnects, keepalive_reply };
        let truth = rt.block_on(run_plan(plan));
        prop_assert!(truth.violations.is_empty(), "{:?}", &truth.violations[..truth.violations.len().min(5)]);
        prop_assert!(truth.rows.values().all(|r| r.1), "every row acked in the end");
        prop_assert!(!truth.statuses.is_empty());
    }
}

fn txn(rows: Vec<bool>, keepalive_inside: bool) -> Txn {
    Txn {
        rows,
        other_rows: 0,
        message: false,
        event_message: false,
        stray: false,
        keepalive_inside,
        begin: Lsn(0),
        end: Lsn(0),
        row_lsns: Vec::new(),
    }
}

/// A keepalive inside an open transaction whose row is acked must not move the frontier past the
/// transaction's start, let alone its end, while a later row is still unacked.
#[tokio::test(start_paused = true)]
async fn keepalive_mid_transaction_does_not_advance() {
    let plan = Plan {
        txns: vec![txn(vec![false, true, false], true), txn(vec![false], false)],
        seed: 42,
        max_in_flight: 1,
        reject_one_in: 0,
        block_every: 0,
        disconnects: vec![],
        keepalive_reply: true,
    };
    let truth = run_plan(plan).await;
    assert!(truth.violations.is_empty(), "{:?}", truth.violations);
    // Replies to keepalives mid-transaction were sent, and none of them confirmed anything yet.
    assert!(truth.statuses.len() >= 3);
}

/// Rejections in delivery reports go to the dead-letter path; the transaction is confirmed only
/// when the dead-letter copy is acked.
#[tokio::test(start_paused = true)]
async fn rejected_rows_are_confirmed_only_after_their_dead_letter_copy() {
    let plan = Plan {
        txns: (0..10).map(|_| txn(vec![false, false], false)).collect(),
        seed: 7,
        max_in_flight: 4,
        reject_one_in: 2,
        block_every: 3,
        disconnects: vec![5, 17],
        keepalive_reply: false,
    };
    let truth = run_plan(plan).await;
    assert!(truth.violations.is_empty(), "{:?}", truth.violations);
}

/// Shutdown with a record that is never acked: the drain gives up after --shutdown-timeout and the
/// last status update stays before that record's transaction.
#[tokio::test(start_paused = true)]
async fn drain_timeout_confirms_nothing_unacked() {
    let cfg = test_config(&["--shutdown-timeout", "2s"]);
    let truth = Arc::new(Mutex::new(Truth::default()));
    let mut txns = vec![txn(vec![false], false), txn(vec![false], false)];
    layout(&mut txns);
    for t in &txns {
        truth.lock().unwrap().rows.insert(t.row_lsns[0], (t.end, false));
    }
    let held: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let mut sink = MemSink { held: held.clone(), waiting: VecDeque::new(), block_every: 0, sent: 0 };
    let stream =
        Scripted { msgs: session_messages(&txns, Lsn(0), false), fail_after: None, truth: truth.clone(), last: Lsn(0) };
    let shutdown = CancellationToken::new();
    let (h, tr, sd) = (held.clone(), truth.clone(), shutdown.clone());
    tokio::spawn(async move {
        // Ack only the first transaction's row, then ask for shutdown.
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let first = {
                let mut h = h.lock().unwrap();
                let i = h.iter().position(|d| d.source().position == Position::Lsn(Lsn(1032)));
                i.map(|i| h.swap_remove(i))
            };
            if let Some(d) = first {
                let Position::Lsn(lsn) = d.source().position else { panic!("a run record has an LSN") };
                tr.lock().unwrap().rows.get_mut(&lsn).unwrap().1 = true;
                d.ack();
                tokio::time::sleep(Duration::from_millis(50)).await;
                sd.cancel();
                return;
            }
        }
    });
    let ctx = Context { cfg: &cfg, metrics: Metrics::new(), health: Health::new(Duration::ZERO) };
    let mut confirmed = Lsn(0);
    let started = tokio::time::Instant::now();
    Session::new(ctx, &mut sink, stream, Lsn(0)).run(shutdown, &mut confirmed).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(2), "waited for the drain timeout");
    let t = truth.lock().unwrap();
    assert!(t.violations.is_empty(), "{:?}", t.violations);
    assert_eq!(confirmed, txns[0].end, "the first transaction is confirmed, the second is not");
    assert_eq!(*t.statuses.last().unwrap(), txns[0].end);
    drop(held);
}

/// Takes every record and acks it at once; reports a `message.max.bytes`.
struct CaptureSink {
    max: usize,
    got: Vec<Record>,
}

impl Sink for CaptureSink {
    fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        self.got.push(record);
        delivery.ack();
        Ok(())
    }
    fn blocked(&self) -> bool {
        false
    }
    async fn unblock(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.max)
    }
}

/// Dead-letter copies carry nothing the stream may not: a record over the sink's limit is
/// dead-lettered (as chunks) as it was masked, a row the router refuses is dead-lettered with
/// its payload masked, and one whose payload cannot be masked without it.
#[tokio::test(start_paused = true)]
async fn dead_letter_copies_are_masked() {
    let cfg = test_config(&["--mask", "/card=redact", "--on-bad-event", "dlq"]);
    let card = "4111111111111111";
    let big = format!(r#"{{"card": "{card}", "note": "{}"}}"#, "x".repeat(600));
    let small = format!(r#"{{"card": "{card}", "note": "n"}}"#);
    let rows: [(&str, &str, &str); 3] = [
        ("e-big", "order.v1", &big),
        ("e-bad", "bad topic!", &small),
        ("e-text", "bad topic!", r#""card 4111111111111111""#),
    ];
    let mut msgs = VecDeque::new();
    let data = |at: u64, b: Bytes| (Lsn(at), WalMessage::Data { wal_start: Lsn(at), wal_end: Lsn(at), data: b });
    msgs.push_back(data(1000, begin(Lsn(1200))));
    msgs.push_back(data(1016, relation(OUTBOX, "outbox", NARROW)));
    for (i, (id, ty, payload)) in rows.iter().enumerate() {
        msgs.push_back(data(1032 + 16 * i as u64, insert(OUTBOX, &[id, "agg", ty, payload, "2026-12-02 10:49:10+00"])));
    }
    msgs.push_back(data(1200, commit(Lsn(1200), Lsn(1216))));
    let truth = Arc::new(Mutex::new(Truth::default()));
    let stream = Scripted { msgs, fail_after: None, truth, last: Lsn(0) };
    let mut sink = CaptureSink { max: 400, got: Vec::new() };
    let shutdown = CancellationToken::new();
    let sd = shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        sd.cancel();
    });
    let ctx = Context { cfg: &cfg, metrics: Metrics::new(), health: Health::new(Duration::ZERO) };
    let mut confirmed = Lsn(0);
    Session::new(ctx, &mut sink, stream, Lsn(0)).run(shutdown, &mut confirmed).await.unwrap();
    assert_eq!(confirmed, Lsn(1216), "every copy acked");
    let of = |id: &str| -> Vec<&Record> { sink.got.iter().filter(|r| r.event_id == id).collect() };
    let header = |r: &Record, k: &str| r.headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    // Too large even masked: chunks of the masked payload.
    let chunks = of("e-big");
    assert!(!chunks.is_empty() && chunks.iter().all(|r| r.topic == "outboxd.dlq"), "{chunks:?}");
    assert_eq!(header(chunks[0], crate::tools::dlq::H_ERROR).as_deref(), Some(&b"too_large"[..]));
    let joined: Vec<u8> = chunks.iter().flat_map(|r| r.payload.as_deref().unwrap().to_vec()).collect();
    assert_eq!(std::str::from_utf8(&joined).unwrap(), format!(r#"{{"card":"***","note":"{}"}}"#, "x".repeat(600)));
    // Refused by the router: masked as the stream would have been.
    let bad = of("e-bad");
    assert_eq!(bad.len(), 1);
    assert_eq!(header(bad[0], crate::tools::dlq::H_ERROR).as_deref(), Some(&b"invalid_topic"[..]));
    assert_eq!(bad[0].payload.as_deref(), Some(&br#"{"card":"***","note":"n"}"#[..]));
    // Not maskable: no payload, and why.
    let text = of("e-text");
    assert_eq!(text.len(), 1);
    assert_eq!(text[0].payload, None);
    assert!(header(text[0], H_PAYLOAD_DROPPED).is_some(), "{:?}", text[0].headers);
    for r in &sink.got {
        assert!(!r.payload.as_deref().unwrap_or_default().windows(card.len()).any(|w| w == card.as_bytes()), "{r:?}");
    }
}

/// `--mask-event-type` on a table without the event type column stops at the Relation message,
/// naming both flags, instead of masking by a type it cannot read.
#[tokio::test(start_paused = true)]
async fn mask_event_type_needs_the_type_column() {
    let cfg =
        test_config(&["--mask", "/card=redact", "--mask-event-type", "order.*", "--table-field-event-type", "kind"]);
    let data = |at: u64, b: Bytes| (Lsn(at), WalMessage::Data { wal_start: Lsn(at), wal_end: Lsn(at), data: b });
    let msgs = VecDeque::from([data(1000, begin(Lsn(1100))), data(1016, relation(OUTBOX, "outbox", NARROW))]);
    let stream = Scripted { msgs, fail_after: None, truth: Arc::default(), last: Lsn(0) };
    let mut sink = CaptureSink { max: 1 << 20, got: Vec::new() };
    let ctx = Context { cfg: &cfg, metrics: Metrics::new(), health: Health::new(Duration::ZERO) };
    let mut confirmed = Lsn(0);
    let e =
        Session::new(ctx, &mut sink, stream, Lsn(0)).run(CancellationToken::new(), &mut confirmed).await.unwrap_err();
    let e = e.to_string();
    assert!(e.contains("\"kind\"") && e.contains("--mask-event-type") && e.contains("--table-field-event-type"), "{e}");
}
