//! Fault injection on the real processes: kill -9 of outboxd mid-stream, and a frozen broker
//! (SIGSTOP) while records are in flight. Nothing may be lost, and the slot may never be
//! confirmed past a record the broker has not acknowledged.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

fn slot_confirmed(pg: &PgCluster) -> String {
    pg.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'")
}

fn lsn(s: &str) -> u64 {
    let (hi, lo) = s.trim().split_once('/').unwrap_or_else(|| panic!("not an LSN: {s:?}"));
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

fn lsn_lt(_pg: &PgCluster, a: &str, b: &str) -> bool {
    lsn(a) < lsn(b)
}

/// Count Kafka records per event id on `topic`.
fn ids_in_kafka(broker: &Broker, topic: &str, min: usize) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for r in broker.consume_all(topic, 1, min, Duration::from_secs(120)) {
        *counts.entry(r.header_str("id").expect("id header")).or_insert(0) += 1;
    }
    counts
}

#[test]
fn kill_9_mid_stream_loses_nothing() {
    const TXNS: usize = 200;
    const PER_TXN: usize = 100; // 20k events
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let args = daemon_args(&pg, &broker, &["--status-interval", "200ms"]);
    let mut d = Outboxd::spawn_streaming(&args);

    // A writer keeps committing while we kill outboxd. For each transaction it records the WAL
    // insert position after the commit (a separate psql -c, so a separate transaction): an upper
    // bound of that commit's end LSN.
    let writer = {
        let sock = pg.socket_dir();
        let port = pg.port();
        std::thread::spawn(move || {
            let mut after = Vec::with_capacity(TXNS);
            for t in 0..TXNS {
                let sql = format!(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                     SELECT 'crash', 'agg-' || (g % 7), 'crash.v1', jsonb_build_object('t', {t}, 'g', g) \
                     FROM generate_series(1, {PER_TXN}) g"
                );
                let out = psql_socket(&sock, port, &[&sql, "SELECT pg_current_wal_insert_lsn()"]).expect("psql runs");
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                after.push(String::from_utf8_lossy(&out.stdout).trim().to_owned());
                std::thread::sleep(Duration::from_millis(10));
            }
            after
        })
    };
    // Let some events through, then kill without warning.
    assert!(
        wait_until(Duration::from_secs(60), || pg.psql("SELECT count(*) FROM outbox").parse::<usize>().unwrap()
            >= TXNS * PER_TXN / 3),
        "writer too slow"
    );
    d.kill9();
    // Once the walsender has noticed, nobody holds the slot, so this is where the restart resumes.
    let released = wait_until(Duration::from_secs(30), || {
        pg.psql("SELECT active FROM pg_replication_slots WHERE slot_name = 'outboxd'") == "f"
    });
    assert!(released, "the slot stayed active after kill -9");
    let resume_at = slot_confirmed(&pg);
    let mut d2 = Outboxd::spawn_streaming(&args);
    let after = writer.join().expect("writer finished");

    let all: Vec<String> = pg.psql("SELECT event_id FROM outbox").lines().map(String::from).collect();
    assert_eq!(all.len(), TXNS * PER_TXN);
    let mut seen: HashMap<String, (usize, usize)> = HashMap::new();
    for r in broker.consume_all("crash.v1.events", 1, all.len(), Duration::from_secs(120)) {
        let t = r.payload_json()["t"].as_u64().expect("payload has t") as usize;
        seen.entry(r.header_str("id").expect("id header")).or_insert((0, t)).0 += 1;
    }
    let missing: Vec<&String> = all.iter().filter(|id| !seen.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} events lost after kill -9 (resumed at {resume_at}), e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert_eq!(seen.len(), all.len(), "records with ids that are not in the outbox");
    // Duplicates are allowed only for transactions the slot had not confirmed: a repeat of a
    // transaction that committed at or before the resume point is outside the documented window.
    let mut dups = 0;
    for (id, (count, t)) in &seen {
        if *count > 1 {
            dups += count - 1;
            assert!(
                lsn_lt(&pg, &resume_at, &after[*t]),
                "event {id} of transaction {t} (committed by {}) repeated although the slot had confirmed {resume_at}",
                after[*t]
            );
        }
    }
    eprintln!("kill -9: {} events, {dups} duplicates, resumed at {resume_at}", all.len());
    d2.stop_cleanly();
}

#[test]
fn slot_is_never_confirmed_past_an_unacked_record() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let args = daemon_args(&pg, &broker, &["--status-interval", "200ms"]);
    let mut d = Outboxd::spawn_streaming(&args);
    // Warm up: the topic exists and one event made it through.
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('w', 'w', 'frozen.v1', '{}')",
    );
    assert_eq!(broker.consume_all("frozen.v1.events", 1, 1, Duration::from_secs(30)).len(), 1, "{}", d.log());

    broker.pause();
    // Commit a transaction while the broker is frozen. psql runs both statements in one implicit
    // transaction, so `before_commit` is the WAL insert position after the rows and before the
    // commit record: confirming that transaction would put the slot strictly past it.
    let before_commit = pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'f', 'f', 'frozen.v1', jsonb_build_object('g', g) FROM generate_series(1, 500) g; \
         SELECT pg_current_wal_insert_lsn()",
    );
    // Other WAL keeps flowing (keepalives) while the records are stuck.
    pg.psql("CREATE TABLE noise (x int); INSERT INTO noise SELECT generate_series(1, 10000)");
    let noise_end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    // One record more, so WAL exists past `noise_end` for the server to send.
    pg.psql("INSERT INTO noise VALUES (0)");
    // Sample until the server has sent us everything up to the end of the noise (so keepalives
    // offered that position), then for 3 s more: 15 status updates, each a chance to confirm
    // past the unacked transaction.
    let sent_all = format!(
        "SELECT r.sent_lsn >= '{noise_end}'::pg_lsn FROM pg_stat_replication r \
         JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = 'outboxd'"
    );
    let started = std::time::Instant::now();
    let mut sent_at: Option<std::time::Instant> = None;
    while sent_at.is_none_or(|t| t.elapsed() < Duration::from_secs(3)) {
        let c = slot_confirmed(&pg);
        assert!(
            !lsn_lt(&pg, &before_commit, &c),
            "slot confirmed {c}, past the commit of unacked records (commit record starts at or after {before_commit})\n{}",
            d.log()
        );
        if sent_at.is_none() && pg.psql(&sent_all) == "t" {
            sent_at = Some(std::time::Instant::now());
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the server never sent up to {noise_end}\n{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Crash while frozen: the restart must still deliver everything.
    d.kill9();
    broker.resume();
    let mut d2 = Outboxd::spawn_streaming(&args);
    let seen = ids_in_kafka(&broker, "frozen.v1.events", 501);
    let all: Vec<String> = pg.psql("SELECT event_id FROM outbox").lines().map(String::from).collect();
    assert!(all.iter().all(|id| seen.contains_key(id)), "events lost: have {} of {}", seen.len(), all.len());
    let end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    assert!(
        wait_until(Duration::from_secs(20), || lsn_lt(&pg, &before_commit, &slot_confirmed(&pg))),
        "slot never advanced after the broker came back (stuck at {}, want > {before_commit}, wal at {end})",
        slot_confirmed(&pg)
    );
    d2.stop_cleanly();
}

#[test]
fn idle_outbox_does_not_pin_wal() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &["--sink", "null", "--status-interval", "200ms"]));
    let start = slot_confirmed(&pg);
    pg.psql("CREATE TABLE busy (x int); INSERT INTO busy SELECT generate_series(1, 50000)");
    let end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    assert!(lsn_lt(&pg, &start, &end));
    let advanced = wait_until(Duration::from_secs(30), || !lsn_lt(&pg, &slot_confirmed(&pg), &end));
    assert!(advanced, "idle slot stuck at {} while WAL reached {end}\n{}", slot_confirmed(&pg), d.log());
    d.stop_cleanly();
}
