//! Switching a running Debezium outbox connector over to outboxd under a steady writer, on
//! Debezium's own slot and topics (docs/src/debezium.md, Switching from Debezium).
//!
//! Every event is numbered (`{"n": i}`, key `agg-(i % 8)`), so the checker reads the topic
//! whole and reports lost events (committed, never on the topic), duplicates (on it twice) and,
//! per key, order (each key's numbers rising in offset order). Records Debezium wrote carry its
//! `__debezium.context.*` headers, so each record says who wrote it.
//!
//! 1. Handover (`scripts/debezium handover`: the connector stopped through Connect's REST API,
//!    its committed offsets read back) and `outboxd run --debezium-offsets`: 0 lost, 0 duplicates.
//! 2. Debezium killed (kill -9 of the Connect worker), outboxd started on its slot without
//!    offsets: 0 lost; duplicates only of transactions the slot had not confirmed, and counted.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::debezium::{pg_source, Debezium};
use common::*;
use serde_json::{json, Value};

const KIND: &str = "switch";
const TOPIC: &str = "sw.switch.v1.events";
const SLOT: &str = "debezium";
const AGGREGATES: usize = 8;

fn connector(pg: &PgCluster) -> Value {
    let mut config = pg_source(pg);
    let own = json!({
        "topic.prefix": "app-pg",
        "plugin.name": "pgoutput",
        "slot.name": SLOT,
        "publication.name": "dbz_publication",
        "publication.autocreate.mode": "filtered",
        "table.include.list": "public.outbox",
        "snapshot.mode": "initial",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.route.by.field": "event_type",
        "transforms.outbox.route.topic.replacement": "sw.${routedByValue}.events",
        "transforms.outbox.table.field.event.id": "event_id",
        "transforms.outbox.table.field.event.key": "aggregate_id",
        "transforms.outbox.table.field.event.payload": "payload"
    });
    config.extend(own.as_object().cloned().unwrap_or_default());
    json!({ "name": "outbox-switch", "config": config })
}

/// One committed writer transaction: events `first..first + n`, and the WAL insert position
/// read after its commit (an upper bound of the commit record's end).
#[derive(Clone, Copy, Debug)]
struct Batch {
    first: usize,
    n: usize,
    after: u64,
}

/// Commits numbered events in transactions of 1, 3 or 5 rows, about 100 events a second.
struct Writer {
    stop: Arc<AtomicBool>,
    batches: Arc<Mutex<Vec<Batch>>>,
    handle: JoinHandle<()>,
}

impl Writer {
    fn start(pg: &PgCluster) -> Writer {
        let ev = Numbered::new(pg, KIND, AGGREGATES);
        let stop = Arc::new(AtomicBool::new(false));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let handle = {
            let (stop, batches) = (stop.clone(), batches.clone());
            std::thread::spawn(move || {
                let (mut next, mut i) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    let n = [1, 3, 5][i % 3];
                    let out = psql_socket(
                        &ev.sock,
                        ev.port,
                        &[&ev.insert_sql(next, n), "SELECT pg_current_wal_insert_lsn()"],
                    )
                    .expect("psql runs");
                    assert!(out.status.success(), "writer: {}", String::from_utf8_lossy(&out.stderr));
                    let after = lsn(String::from_utf8_lossy(&out.stdout).trim());
                    batches.lock().unwrap().push(Batch { first: next, n, after });
                    next += n;
                    i += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        Writer { stop, batches, handle }
    }

    fn written(&self) -> usize {
        self.batches.lock().unwrap().iter().map(|b| b.n).sum()
    }

    /// Waits until `more` events were committed after this call.
    fn wait_for_more(&self, more: usize) {
        let target = self.written() + more;
        assert!(wait_until(Duration::from_secs(120), || self.written() >= target), "the writer stalled");
    }

    fn finish(self) -> Vec<Batch> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("writer thread");
        let b = self.batches.lock().unwrap().clone();
        b
    }
}

fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').unwrap_or_else(|| panic!("not an LSN: {text:?}"));
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// Debezium's slot: (confirmed_flush_lsn, active).
fn slot(pg: &PgCluster) -> (u64, bool) {
    let row =
        pg.psql(&format!("SELECT confirmed_flush_lsn, active FROM pg_replication_slots WHERE slot_name = '{SLOT}'"));
    let (c, a) = row.split_once('|').unwrap_or_else(|| panic!("slot {SLOT}: {row:?}"));
    (lsn(c), a == "t")
}

/// What the topic holds, checked against what was committed.
struct Tally {
    lost: Vec<usize>,
    /// Event number → copies, for events on the topic more than once.
    duplicated: BTreeMap<usize, usize>,
    order_violations: Vec<String>,
    by_debezium: usize,
    by_outboxd: usize,
}

fn tally(records: &[Consumed], total: usize) -> Tally {
    let mut copies: HashMap<usize, usize> = HashMap::new();
    let (mut by_debezium, mut by_outboxd) = (0, 0);
    // Per (partition, key): numbers in offset order.
    let mut per_key: BTreeMap<(i32, String), Vec<(i64, usize)>> = BTreeMap::new();
    for r in records {
        let n = r.payload_json()["n"].as_u64().unwrap_or_else(|| panic!("a record without n: {r:?}")) as usize;
        *copies.entry(n).or_default() += 1;
        if r.headers.iter().any(|(k, _)| k.starts_with("__debezium.context.")) {
            by_debezium += 1;
        } else {
            by_outboxd += 1;
        }
        let key = r.key_str().expect("every event has a key");
        assert_eq!(key, format!("agg-{}", n % AGGREGATES), "event {n}: key");
        per_key.entry((r.partition, key)).or_default().push((r.offset, n));
    }
    let mut order_violations = Vec::new();
    for ((p, key), mut v) in per_key {
        v.sort();
        // A duplicate may repeat an earlier number once the switch resends; a number lower than
        // one already seen, that was not seen before, is a reordering.
        let mut seen = std::collections::HashSet::new();
        let mut high = None;
        for (offset, n) in v {
            if seen.insert(n) {
                if high.is_some_and(|h| n < h) {
                    order_violations.push(format!("{key} (partition {p}): {n} at offset {offset} after {high:?}"));
                }
                high = high.max(Some(n));
            }
        }
    }
    Tally {
        lost: (0..total).filter(|n| !copies.contains_key(n)).collect(),
        duplicated: copies.into_iter().filter(|(_, c)| *c > 1).collect(),
        order_violations,
        by_debezium,
        by_outboxd,
    }
}

fn outboxd(broker: &Broker, connector: &std::path::Path, extra: &[&str]) -> Outboxd {
    let mut a = args(&[
        "run",
        "--debezium-config",
        &connector.display().to_string(),
        "--kafka-brokers",
        &broker.bootstrap(),
        "--metrics-addr",
        "127.0.0.1:0",
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    Outboxd::spawn_streaming(&a)
}

/// Reads the whole topic once every committed event is there (or the timeout passed).
fn read_topic(broker: &Broker, total: usize) -> Vec<Consumed> {
    broker.consume_all(TOPIC, 3, total, Duration::from_secs(120))
}

#[test]
fn handover_with_debeziums_offsets_loses_nothing_and_sends_nothing_twice() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    broker.create_topic(TOPIC, 3);
    let connector = connector(&pg);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("connector.json");
    std::fs::write(&file, connector.to_string()).unwrap();

    let dbz = Debezium::start(&connector, &broker.bootstrap());
    let writer = Writer::start(&pg);
    writer.wait_for_more(400);
    let offsets = dbz.handover();
    let (slot_at_handover, _) = slot(&pg);
    let lsn_commit = offsets["offsets"][0]["offset"]["lsn_commit"].as_u64().expect("lsn_commit");
    let offsets_file = dir.path().join("offsets.json");
    std::fs::write(&offsets_file, offsets.to_string()).unwrap();
    dbz.kill9();
    writer.wait_for_more(100);

    // Mistakes an operator could make say what to do.
    let (code, out) = run_to_exit(
        &args(&[
            "run",
            "--debezium-config",
            &file.display().to_string(),
            "--debezium-offsets",
            &offsets_file.display().to_string(),
            "--slot",
            "not_debeziums",
            "--kafka-brokers",
            &broker.bootstrap(),
        ]),
        Duration::from_secs(60),
    );
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("does not exist") && out.contains("Debezium used"), "{out}");

    let (code, out) = run_to_exit(
        &args(&[
            "check",
            "--debezium-config",
            &file.display().to_string(),
            "--debezium-offsets",
            &offsets_file.display().to_string(),
            "--kafka-brokers",
            &broker.bootstrap(),
        ]),
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("debezium offsets") && out.contains("skipped as delivered by Debezium"), "{out}");

    let mut d = outboxd(&broker, &file, &["--debezium-offsets", &offsets_file.display().to_string()]);
    writer.wait_for_more(400);
    let batches = writer.finish();
    let total: usize = batches.iter().map(|b| b.n).sum();
    let records = read_topic(&broker, total);
    let t = tally(&records, total);
    let skipped = d
        .log()
        .lines()
        .find(|l| l.contains("--debezium-offsets: resumed from the committed position"))
        .map(str::to_owned);
    eprintln!(
        "handover: {total} events; {} records by Debezium, {} by outboxd; lost {}, duplicated {}; slot at handover {:X} \
         vs lsn_commit {lsn_commit:X} (messageType {}); {skipped:?}",
        t.by_debezium,
        t.by_outboxd,
        t.lost.len(),
        t.duplicated.len(),
        slot_at_handover,
        offsets["offsets"][0]["offset"]["messageType"],
    );
    d.stop_cleanly();
    assert!(t.lost.is_empty(), "lost: {:?}", t.lost);
    assert!(t.duplicated.is_empty(), "duplicated: {:?}", t.duplicated);
    assert!(t.order_violations.is_empty(), "{:?}", t.order_violations);
    assert!(t.by_debezium >= 100 && t.by_outboxd >= 100, "both wrote a part");
    // When the slot lagged the offsets (the usual case: Debezium confirms after committing
    // offsets), the resent transactions were recognised and skipped.
    let skipped = skipped.expect("outboxd logs how many events it skipped");
    if slot_at_handover < lsn_commit {
        assert!(!skipped.contains("skipped=0"), "{skipped}");
    }
}

#[test]
fn after_debezium_is_killed_outboxd_on_its_slot_loses_nothing() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    broker.create_topic(TOPIC, 3);
    let connector = connector(&pg);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("connector.json");
    std::fs::write(&file, connector.to_string()).unwrap();

    let dbz = Debezium::start(&connector, &broker.bootstrap());
    let writer = Writer::start(&pg);
    writer.wait_for_more(400);
    dbz.kill9();
    assert!(wait_until(Duration::from_secs(30), || !slot(&pg).1), "the slot stays active after the kill");
    let (confirmed, _) = slot(&pg);
    // The outbox is not empty and snapshot.mode is initial: on Debezium's existing slot that is a
    // resumption, not a first start.
    let mut d = outboxd(&broker, &file, &[]);
    writer.wait_for_more(400);
    let batches = writer.finish();
    let total: usize = batches.iter().map(|b| b.n).sum();
    let records = read_topic(&broker, total);
    let t = tally(&records, total);
    d.stop_cleanly();
    // Events of transactions the slot had confirmed may not come again.
    let mut wrongly_resent = Vec::new();
    for b in batches.iter().filter(|b| b.after <= confirmed) {
        wrongly_resent.extend((b.first..b.first + b.n).filter(|n| t.duplicated.contains_key(n)));
    }
    eprintln!(
        "kill -9 of Debezium: {total} events; {} records by Debezium, {} by outboxd; lost {}, duplicated {} \
         (all after the slot's confirmed position {confirmed:X})",
        t.by_debezium,
        t.by_outboxd,
        t.lost.len(),
        t.duplicated.len()
    );
    assert!(t.lost.is_empty(), "lost: {:?}", t.lost);
    assert!(wrongly_resent.is_empty(), "sent again though confirmed: {wrongly_resent:?}");
    assert!(t.order_violations.is_empty(), "{:?}", t.order_violations);
    assert!(t.by_debezium >= 100 && t.by_outboxd >= 100, "both wrote a part");
}
