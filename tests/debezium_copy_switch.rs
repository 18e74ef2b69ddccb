//! Switching from Debezium when the cut falls inside rows that share one LSN
//! (docs/src/debezium.md, Switching from Debezium).
//!
//! A COPY logs a heap page's rows as one WAL record (a heap multi-insert), so dozens of changes
//! share one LSN, and Debezium 3.6.1's offset names only that LSN (`lsn_proc`), not how many of
//! its changes it sent. outboxd reads the `id` headers of Debezium's records back from the topic
//! to decide. Each test writes 20,000 numbered events in one transaction, stops the connector
//! through Connect's REST API (`scripts/debezium handover`) once a random number of them is on
//! the topic, and lets outboxd take over with the offsets: by event id, 0 lost and 0 duplicates.
//! `pg_walinspect` says where the cut fell: the WAL record at `lsn_proc`, how many rows it holds,
//! and how many of those Debezium had sent.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use common::debezium::{pg_source, Debezium};
use common::netfault::{Dir, FreezeProxy};
use common::*;
use serde_json::{json, Value};

const TOPIC: &str = "cp.copy.v1.events";
const SLOT: &str = "debezium";
const AGGREGATES: usize = 8;
const ROWS: usize = 20_000;
const COLUMNS: &str = "event_id, aggregate_type, aggregate_id, event_type, payload";

fn connector(pg: &PgCluster, via: Option<u16>, topic_replacement: &str) -> Value {
    let mut config = pg_source(pg);
    if let Some(port) = via {
        config.insert("database.port".into(), json!(port.to_string()));
    }
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
        "transforms.outbox.route.topic.replacement": topic_replacement,
        "transforms.outbox.table.field.event.id": "event_id",
        "transforms.outbox.table.field.event.key": "aggregate_id",
        "transforms.outbox.table.field.event.payload": "payload"
    });
    config.extend(own.as_object().cloned().unwrap_or_default());
    json!({ "name": "outbox-copy", "config": config })
}

fn event_id(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

/// How the 20,000 rows are written, in one transaction.
enum Write {
    /// `COPY outbox FROM 'file'` (CSV).
    Copy,
    /// `INSERT INTO outbox SELECT … FROM generate_series(…)`.
    InsertSelect,
}

impl Write {
    fn run(&self, pg: &PgCluster, dir: &std::path::Path) {
        match self {
            Write::Copy => {
                let file = dir.join("rows.csv");
                let mut csv = String::new();
                for i in 0..ROWS {
                    csv.push_str(&format!(
                        "{},copy,agg-{},copy.v1,\"{{\"\"n\"\": {i}}}\"\n",
                        event_id(i),
                        i % AGGREGATES
                    ));
                }
                std::fs::write(&file, csv).unwrap();
                pg.psql(&format!("COPY public.outbox ({COLUMNS}) FROM '{}' WITH (FORMAT csv)", file.display()));
            }
            Write::InsertSelect => {
                pg.psql(&format!(
                    "INSERT INTO public.outbox ({COLUMNS}) SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, \
                     'copy', 'agg-' || (i % {AGGREGATES}), 'copy.v1', jsonb_build_object('n', i) FROM generate_series(0, {}) i",
                    ROWS - 1
                ));
            }
        }
    }
}

fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').unwrap_or_else(|| panic!("not an LSN: {text:?}"));
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

fn lsn_text(l: u64) -> String {
    format!("{:X}/{:X}", l >> 32, l & 0xFFFF_FFFF)
}

/// The heap records of the outbox's rows between two LSNs, in order: (start LSN, rows in it).
fn heap_records(pg: &PgCluster, from: u64, to: u64) -> Vec<(u64, usize)> {
    let rows = pg.psql(&format!(
        "SELECT start_lsn, record_type, description FROM pg_get_wal_records_info('{}', '{}') \
         WHERE (resource_manager = 'Heap2' AND record_type LIKE 'MULTI_INSERT%') \
            OR (resource_manager = 'Heap' AND record_type LIKE 'INSERT%') ORDER BY start_lsn",
        lsn_text(from),
        lsn_text(to)
    ));
    rows.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '|');
            let (at, kind, desc) = (f.next()?, f.next()?, f.next()?);
            let n = if kind.starts_with("MULTI_INSERT") {
                // Its first number: "45 tuples flags 0x02" (PostgreSQL 15), "ntuples: 45, …" (16+).
                let digits = desc.trim_start_matches(|c: char| !c.is_ascii_digit());
                digits.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?
            } else {
                1
            };
            Some((lsn(at), n))
        })
        .collect()
}

/// What the topic holds, by event id.
struct Tally {
    lost: Vec<usize>,
    duplicated: BTreeMap<usize, usize>,
    order_violations: Vec<String>,
    by_debezium: usize,
}

fn tally(records: &[Consumed]) -> Tally {
    let mut copies: HashMap<usize, usize> = HashMap::new();
    let mut per_key: BTreeMap<(i32, String), Vec<(i64, usize)>> = BTreeMap::new();
    let mut by_debezium = 0;
    for r in records {
        let id = r.header_str("id").unwrap_or_else(|| panic!("a record without an id header: {r:?}"));
        let n = usize::from_str_radix(id.rsplit('-').next().unwrap(), 16).unwrap();
        assert_eq!(r.payload_json()["n"].as_u64(), Some(n as u64), "event {id}: payload");
        *copies.entry(n).or_default() += 1;
        by_debezium += r.headers.iter().any(|(k, _)| k.starts_with("__debezium.context.")) as usize;
        per_key.entry((r.partition, r.key_str().expect("a key"))).or_default().push((r.offset, n));
    }
    let mut order_violations = Vec::new();
    for ((p, key), mut v) in per_key {
        v.sort();
        for w in v.windows(2) {
            if w[1].1 < w[0].1 {
                order_violations
                    .push(format!("{key} (partition {p}): {} at offset {} after {}", w[1].1, w[1].0, w[0].1));
            }
        }
    }
    Tally {
        lost: (0..ROWS).filter(|n| !copies.contains_key(n)).collect(),
        duplicated: copies.into_iter().filter(|(_, c)| *c > 1).collect(),
        order_violations,
        by_debezium,
    }
}

fn random_below(n: u64) -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    (nanos ^ (nanos >> 7).wrapping_mul(0x9E37_79B9)) % n
}

/// Writes the rows with Debezium streaming, stops it once `cut` of them are on the topic, and
/// lets outboxd take over from its offsets; returns what outboxd logged about the shared LSN.
fn cut_and_take_over(write: Write, what: &str) {
    let started = Instant::now();
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("CREATE EXTENSION IF NOT EXISTS pg_walinspect");
    let broker = Broker::start();
    broker.create_topic(TOPIC, 3);
    let dir = tempfile::tempdir().unwrap();
    // Debezium reads PostgreSQL through a proxy that stops forwarding after a random number of
    // the transaction's bytes: it sends what it got and stalls there, inside the transaction,
    // until it is stopped.
    let proxy = FreezeProxy::start(pg.port());
    let dbz = Debezium::start(&connector(&pg, Some(proxy.port), "cp.${routedByValue}.events"), &broker.bootstrap());
    let file = dir.path().join("connector.json");
    std::fs::write(&file, connector(&pg, None, "cp.${routedByValue}.events").to_string()).unwrap();

    // Debezium streams once an event of another topic went through.
    pg.psql(&format!("INSERT INTO public.outbox ({COLUMNS}) VALUES (gen_random_uuid(), 'w', 'w', 'warmup', '{{}}')"));
    assert!(
        wait_until(Duration::from_secs(120), || broker.end_offsets("cp.warmup.events") >= 1),
        "Debezium does not stream:\n{}",
        dbz.log()
    );
    let before = lsn(&pg.psql("SELECT pg_current_wal_insert_lsn()"));
    // pgoutput sends about 200 bytes per row here (4 MB in all); Debezium goes on for a while
    // after the release below.
    let cut = 100_000 + random_below(2_000_000);
    proxy.hold_after(Dir::Down, cut);
    write.run(&pg, dir.path());
    let after = lsn(&pg.psql("SELECT pg_current_wal_insert_lsn()"));
    assert!(wait_until(Duration::from_secs(120), || proxy.held(Dir::Down)), "the proxy never held:\n{}", dbz.log());
    // Debezium sends what it got: wait until the topic stops growing.
    let mut last = -1;
    assert!(
        wait_until(Duration::from_secs(60), || {
            let now = broker.end_offsets(TOPIC);
            std::thread::sleep(Duration::from_millis(1500));
            std::mem::replace(&mut last, now) == now && now > 0
        }),
        "Debezium did not send the part it got:\n{}",
        dbz.log().lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
    // Stop the connector, and let its reader go on meanwhile: held in the middle of a message,
    // it could not stop in time, and Connect would skip the final offset commit.
    let offsets = std::thread::scope(|s| {
        let stopping = s.spawn(|| dbz.handover());
        std::thread::sleep(Duration::from_millis(50));
        proxy.release(Dir::Down);
        stopping.join().expect("handover")
    });
    let on_topic_at_handover = broker.end_offsets(TOPIC);
    dbz.kill9();
    // The walsender Debezium used sees its connection close and ends, freeing the slot.
    proxy.cut();
    let offset = &offsets["offsets"][0]["offset"];
    let lsn_proc = offset["lsn_proc"].as_u64().expect("lsn_proc");
    let kind = offset["messageType"].as_str().unwrap_or("").to_owned();
    assert!(offset.get("lsn_events_processed").is_none(), "Debezium 3.6.1 stores no count: {offset}");
    // Where the cut fell: the record at lsn_proc, its rows, and how many of them Debezium sent.
    let records = heap_records(&pg, before, after);
    let first_row: usize = records.iter().take_while(|(at, _)| *at < lsn_proc).map(|(_, n)| n).sum();
    let at_proc = records.iter().find(|(at, _)| *at == lsn_proc).map_or(0, |(_, n)| *n);
    let sent_of_it = (on_topic_at_handover as usize).saturating_sub(first_row);
    let shared = records.iter().filter(|(_, n)| *n > 1).count();
    eprintln!(
        "{what}: cut after {cut} bytes; Debezium stopped with {on_topic_at_handover} on the topic, offset {kind} at {} \
         ({at_proc} row(s) share that LSN, {sent_of_it} of them sent); {} heap records, {shared} with several rows",
        lsn_text(lsn_proc),
        records.len()
    );
    eprintln!("{what}: offset {offset}");
    let offsets_file = dir.path().join("offsets.json");
    std::fs::write(&offsets_file, offsets.to_string()).unwrap();

    if at_proc > 1 && kind != "COMMIT" {
        // Routed elsewhere, Debezium's records of that LSN are not found: refused before anything
        // is sent or confirmed.
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(&elsewhere, self::connector(&pg, None, "elsewhere.${routedByValue}").to_string()).unwrap();
        let (code, out) = run_to_exit(
            &args(&[
                "run",
                "--debezium-config",
                &elsewhere.display().to_string(),
                "--debezium-offsets",
                &offsets_file.display().to_string(),
                "--kafka-brokers",
                &broker.bootstrap(),
                "--metrics-addr",
                "127.0.0.1:0",
            ]),
            Duration::from_secs(90),
        );
        assert_ne!(code, Some(0), "{out}");
        assert!(out.contains("none of the") && out.contains("retention"), "{out}");
    }

    let mut d = Outboxd::spawn_streaming(&args(&[
        "run",
        "--debezium-config",
        &file.display().to_string(),
        "--debezium-offsets",
        &offsets_file.display().to_string(),
        "--kafka-brokers",
        &broker.bootstrap(),
        "--metrics-addr",
        "127.0.0.1:0",
    ]));
    let confirmed =
        || lsn(&pg.psql(&format!("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{SLOT}'")));
    assert!(wait_until(Duration::from_secs(120), || confirmed() >= after), "outboxd did not catch up:\n{}", d.log());
    let got = broker.consume_all(TOPIC, 3, ROWS, Duration::from_secs(120));
    let t = tally(&got);
    let decided = d.log().lines().find(|l| l.contains("share the offset's LSN")).map(str::to_owned);
    d.stop_cleanly();
    eprintln!(
        "{what}: {} records, {} by Debezium; lost {}, duplicated {}, order violations {}; outboxd: {decided:?}; {:.0?}",
        got.len(),
        t.by_debezium,
        t.lost.len(),
        t.duplicated.len(),
        t.order_violations.len(),
        started.elapsed()
    );
    assert!(t.lost.is_empty(), "lost {}: {:?}", t.lost.len(), &t.lost[..t.lost.len().min(50)]);
    assert!(t.duplicated.is_empty(), "duplicated {}: {:?}", t.duplicated.len(), t.duplicated);
    assert!(t.order_violations.is_empty(), "{:?}", t.order_violations);
    assert!(kind != "COMMIT" && t.by_debezium > 0 && t.by_debezium < ROWS, "the cut fell inside the transaction");
    if at_proc > 1 {
        let decided = decided.expect("outboxd logs how it decided the changes at the shared LSN");
        assert!(decided.contains(&format!("changes={at_proc}")), "{decided}");
    }
}

#[test]
fn a_copy_cut_in_the_middle_is_taken_over_without_loss_or_duplicates() {
    cut_and_take_over(Write::Copy, "COPY");
}

#[test]
fn an_insert_select_cut_in_the_middle_is_taken_over_without_loss_or_duplicates() {
    cut_and_take_over(Write::InsertSelect, "INSERT ... SELECT");
}
