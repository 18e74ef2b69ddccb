//! The compact compatibility suite: the same few end-to-end properties on every supported
//! PostgreSQL major version other than the default server (15, which runs the full suite), and
//! the refusal of 12.
//!
//! One test per version, each on its own cluster and broker, in this order: heartbeats and the
//! idle-WAL advance (before anything else writes, so every transaction id taken is a heartbeat),
//! end to end, a 100k-row transaction, and kill -9 under load with zero loss. The server builds
//! come from `scripts/lib.sh`'s `ensure_pg_version`; a missing one fails the test.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;

const SLOT: &str = "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'";

fn lsn(s: &str) -> u64 {
    let (hi, lo) = s.trim().split_once('/').unwrap_or_else(|| panic!("not an LSN: {s:?}"));
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// Records per event id on `topic` (one partition, the default).
fn ids_on(broker: &Broker, topic: &str, min: usize) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for r in broker.consume_all(topic, 1, min, Duration::from_secs(120)) {
        *counts.entry(r.header_str("id").expect("id header")).or_insert(0) += 1;
    }
    counts
}

fn outbox_ids(pg: &PgCluster, aggregate_type: &str) -> Vec<String> {
    pg.psql(&format!("SELECT event_id FROM outbox WHERE aggregate_type = '{aggregate_type}'"))
        .lines()
        .map(String::from)
        .collect()
}

/// Every outbox row of `aggregate_type` (event type `<it>.v1`) is on its topic; returns the duplicates.
fn assert_none_lost(pg: &PgCluster, broker: &Broker, aggregate_type: &str, what: &str) -> usize {
    let all = outbox_ids(pg, aggregate_type);
    let seen = ids_on(broker, &format!("{aggregate_type}.v1.events"), all.len());
    let missing: Vec<&String> = all.iter().filter(|id| !seen.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "{what}: {} of {} events lost, e.g. {:?}",
        missing.len(),
        all.len(),
        &missing[..missing.len().min(3)]
    );
    assert_eq!(seen.len(), all.len(), "{what}: records whose ids are not in the outbox");
    seen.values().map(|c| c - 1).sum()
}

fn compat(major: u32) {
    let started = Instant::now();
    let pg = PgCluster::start_version(major);
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let run = daemon_args(&pg, &broker, &["--status-interval", "200ms", "--heartbeat-interval", "1s"]);
    let mut d = Outboxd::spawn_streaming(&run);

    // Heartbeats: written while idle (each takes one transaction id, nothing else writes here),
    // invisible to another logical decoding consumer, and the idle slot moves past the last one
    // on every version (the server's keepalives carry the WAL end past it).
    pg.psql("SELECT 1 FROM pg_create_logical_replication_slot('probe', 'test_decoding')");
    let next_xid = || pg.psql("SELECT txid_snapshot_xmax(txid_current_snapshot())").parse::<i64>().unwrap();
    let first = next_xid();
    assert!(wait_until(Duration::from_secs(15), || next_xid() >= first + 2), "PG{major}: no heartbeats\n{}", d.log());
    let last = pg.current_lsn();
    assert!(
        pg.wait_slot_confirms(&last, Duration::from_secs(15)),
        "PG{major}: the idle slot ({}) never passed the heartbeat at {last}\n{}",
        pg.psql(SLOT),
        d.log()
    );
    let seen =
        pg.psql("SELECT count(*) FROM pg_logical_slot_peek_changes('probe', NULL, NULL, 'skip-empty-xacts', '0')");
    assert_eq!(seen, "0", "PG{major}: another logical decoding consumer saw the heartbeats");
    pg.psql("SELECT 1 FROM pg_drop_replication_slot('probe')");

    // Idle-WAL advance: WAL from another table only; the slot follows it to the end.
    let before = pg.psql(SLOT);
    pg.psql("CREATE TABLE busy (x int); INSERT INTO busy SELECT generate_series(1, 20000)");
    let end = pg.current_lsn();
    assert!(lsn(&before) < lsn(&end));
    assert!(
        pg.wait_slot_confirms(&end, Duration::from_secs(30)),
        "PG{major}: idle slot stuck at {} while WAL reached {end}\n{}",
        pg.psql(SLOT),
        d.log()
    );

    // End to end: topic, key, id and payload of a few events.
    let ids: Vec<String> = (0..3)
        .map(|i| pg.insert_event("compat", &format!("agg-{i}"), Some("compat.v1"), &format!("{{\"n\": {i}}}"), None))
        .collect();
    let got = broker.consume_all("compat.v1.events", 1, 3, Duration::from_secs(60));
    assert_eq!(got.len(), 3, "PG{major}: end to end");
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.header_str("id").as_deref(), Some(ids[i].as_str()), "PG{major}: order or id");
        assert_eq!(r.key_str().as_deref(), Some(format!("agg-{i}").as_str()));
        assert_eq!(r.payload_json()["n"], i);
    }

    // One 100k-row transaction.
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'big', 'agg-' || (g % 11), 'big.v1', jsonb_build_object('g', g) FROM generate_series(1, 100000) g",
    );
    let dups = assert_none_lost(&pg, &broker, "big", &format!("PG{major}: 100k-row transaction"));
    assert_eq!(dups, 0, "PG{major}: duplicates without any fault");
    assert!(pg.wait_slot_reaches_wal_end(Duration::from_secs(60)), "PG{major}: slot behind after 100k\n{}", d.log());

    // kill -9 under load: a writer commits 60 transactions of 100 while outboxd dies and restarts.
    let writer = {
        let url = pg.url();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let (client, conn) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("writer connects");
                tokio::spawn(conn);
                let mut after = Vec::new();
                for t in 0..60 {
                    client
                        .batch_execute(&format!(
                            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                             SELECT 'load', 'agg-' || (g % 7), 'load.v1', jsonb_build_object('t', {t}, 'g', g) \
                             FROM generate_series(1, 100) g"
                        ))
                        .await
                        .expect("writer inserts");
                    // A separate statement after the commit: an upper bound of its end LSN.
                    let row = client.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).await.unwrap();
                    after.push(row.get::<_, String>(0));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                after
            })
        })
    };
    let loaded = || pg.psql("SELECT count(*) FROM outbox WHERE aggregate_type = 'load'").parse::<usize>().unwrap();
    assert!(wait_until(Duration::from_secs(60), || loaded() >= 2000), "PG{major}: writer too slow");
    d.kill9();
    let released = wait_until(Duration::from_secs(30), || {
        pg.psql("SELECT active FROM pg_replication_slots WHERE slot_name = 'outboxd'") == "f"
    });
    assert!(released, "PG{major}: the slot stayed active after kill -9");
    let resume_at = pg.psql(SLOT);
    let mut seen_confirmed: HashMap<String, usize> = HashMap::new();
    let mut d2 = Outboxd::spawn_streaming(&run);
    let after = writer.join().expect("writer finished");
    assert_eq!(loaded(), 6000);
    let dups = assert_none_lost(&pg, &broker, "load", &format!("PG{major}: kill -9 under load"));
    // Repeats only of transactions the slot had not confirmed: the at-least-once window.
    for r in broker.consume_all("load.v1.events", 1, 6000 + dups, Duration::from_secs(60)) {
        let t = r.payload_json()["t"].as_u64().expect("payload has t") as usize;
        if lsn(&after[t]) <= lsn(&resume_at) {
            *seen_confirmed.entry(r.header_str("id").expect("id header")).or_insert(0) += 1;
        }
    }
    let beyond: Vec<_> = seen_confirmed.iter().filter(|(_, c)| **c > 1).collect();
    assert!(beyond.is_empty(), "PG{major}: events repeated although the slot had confirmed {resume_at}: {beyond:?}");
    d2.stop_cleanly();
    eprintln!("PG{major}: compat block passed in {:.1}s (kill -9: {dups} duplicates)", started.elapsed().as_secs_f64());
}

#[test]
fn compat_postgres_13() {
    compat(13);
}

#[test]
fn compat_postgres_14() {
    compat(14);
}

#[test]
fn compat_postgres_16() {
    compat(16);
}

#[test]
fn compat_postgres_17() {
    compat(17);
}

#[test]
fn compat_postgres_18() {
    compat(18);
}

#[test]
fn postgres_12_is_refused_with_a_clear_error() {
    let pg = PgCluster::start_version(12);
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let (code, log) = run_to_exit(&daemon_args_pg_only(&pg, &["--sink", "null"]), Duration::from_secs(30));
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("unsupported version: PostgreSQL 12.") && log.contains("13 or newer"), "{log}");
    assert!(!streaming_started(&log), "{log}");
    // Nothing was created on the refused server.
    assert_eq!(pg.psql("SELECT count(*) FROM pg_replication_slots"), "0");
}
