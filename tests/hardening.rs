//! Hardening against a stalled broker, a slow sink and a restarting server (issue "never wedge,
//! never crash-loop, never grow without bound"), against a private PostgreSQL and a real Apache Kafka.
//!
//! * A record stalled at a SIGSTOPped broker while 200,000 other transactions stream past: memory
//!   stays flat (the ack tracker folds empty transactions), the slot never passes the record, and
//!   everything arrives after the resume. Run on the default server (15) and on PostgreSQL 14,
//!   whose pgoutput sends a BEGIN/COMMIT pair even for transactions that touch no published table.
//! * `--max-in-flight-bytes` stops reading WAL at the byte budget.
//! * A topic that cannot be created yet (broker stopped) does not silence the loop: status
//!   updates keep going and SIGTERM is honoured.
//! * A `:partition` placement past the topic's partition count is a bad event, not a crash loop.
//! * PostgreSQL restarts replay only what was in flight, not everything since the slot was last
//!   persisted.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::*;

fn insert(pg: &PgCluster, event_type: &str, from: usize, to: usize) {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'a', 'k' || g, '{event_type}', json_build_object('n', g) FROM generate_series({from}, {to}) g"
    ));
}

fn confirmed_at_least(pg: &PgCluster, lsn: &str) -> bool {
    pg.slot_confirmed_at_least(lsn)
}

fn current_lsn(pg: &PgCluster) -> String {
    pg.current_lsn()
}

/// outboxd has received WAL up to `lsn` (the write position of its status updates).
fn received_at_least(pg: &PgCluster, lsn: &str) -> bool {
    pg.psql(&format!("SELECT coalesce(bool_or(write_lsn >= '{lsn}'::pg_lsn), false)::text FROM pg_stat_replication"))
        == "true"
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn keys(records: &[Consumed]) -> Vec<String> {
    records.iter().filter_map(|r| r.key_str()).collect()
}

#[test]
fn empty_transactions_behind_a_stalled_record_keep_memory_flat() {
    stalled_record_with_empty_transactions(PgCluster::start());
}

/// PostgreSQL 14 does not skip empty transactions: every transaction of the flood reaches outboxd
/// as BEGIN/COMMIT even without the logical message. Fails (not skips) when 14 is not installed.
#[test]
fn empty_transactions_behind_a_stalled_record_keep_memory_flat_on_postgres_14() {
    stalled_record_with_empty_transactions(PgCluster::start_version(14));
}

/// A record stalled at a paused broker, then 200,000 transactions that carry nothing for us:
/// RSS stays within 4 MiB, the slot stays behind the record, and nothing is lost after the resume.
fn stalled_record_with_empty_transactions(pg: PgCluster) {
    let version = pg.server_major();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("CREATE TABLE other (id bigserial PRIMARY KEY, v int)");
    let broker = Broker::start();
    broker.create_topic("stall.v1.events", 1);
    // Heartbeats on (the default), so pgoutput sends logical messages: every transaction below
    // reaches outboxd as BEGIN, MESSAGE, COMMIT on every PostgreSQL version.
    let mut d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &["--status-interval", "500ms"]));
    insert(&pg, "stall.v1", 1, 1);
    let first = current_lsn(&pg);
    assert!(wait_until(Duration::from_secs(30), || confirmed_at_least(&pg, &first)), "{}", d.log());

    broker.pause();
    insert(&pg, "stall.v1", 2, 2);
    let stalled_end = current_lsn(&pg);
    assert!(wait_until(Duration::from_secs(20), || received_at_least(&pg, &stalled_end)), "{}", d.log());
    std::thread::sleep(Duration::from_secs(1));
    let pid = d.pid().expect("pid");
    let before = rss_kib(pid);

    // 200,000 transactions that carry nothing for us: a transactional logical message each, and
    // a row of an unpublished table.
    pg.psql(
        "DO $$ BEGIN FOR i IN 1..200000 LOOP \
           PERFORM pg_logical_emit_message(true, 'app.note', 'x'); \
           INSERT INTO other (v) VALUES (i); COMMIT; END LOOP; END $$",
    );
    let flood_end = current_lsn(&pg);
    assert!(
        wait_until(Duration::from_secs(120), || received_at_least(&pg, &flood_end)),
        "outboxd did not read the flood:\n{}",
        d.log()
    );
    std::thread::sleep(Duration::from_secs(1));
    let after = rss_kib(pid);
    let growth = after.saturating_sub(before);
    eprintln!("PostgreSQL {version}: RSS before the flood {before} KiB, after {after} KiB, growth {growth} KiB");
    assert!(!confirmed_at_least(&pg, &stalled_end), "the slot passed the stalled record:\n{}", d.log());
    assert!(growth < 4096, "RSS grew by {growth} KiB over 200,000 empty transactions (limit 4 MiB)");

    broker.resume();
    let end = current_lsn(&pg);
    assert!(
        wait_until(Duration::from_secs(60), || confirmed_at_least(&pg, &end)),
        "slot did not catch up after the resume:\n{}",
        d.log()
    );
    let got = broker.consume_all("stall.v1.events", 1, 2, Duration::from_secs(30));
    let ids: HashSet<String> = keys(&got).into_iter().collect();
    assert_eq!(ids, HashSet::from(["k1".to_string(), "k2".to_string()]), "nothing lost");
    d.stop_cleanly();
}

#[test]
fn byte_budget_stops_reading_wal() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    broker.create_topic("bytes.v1.events", 1);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--metrics-addr", &addr, "--max-in-flight-bytes", "64KiB", "--status-interval", "200ms"],
    ));
    insert(&pg, "bytes.v1", 1, 1);
    let first = current_lsn(&pg);
    assert!(wait_until(Duration::from_secs(30), || confirmed_at_least(&pg, &first)), "{}", d.log());

    broker.pause();
    // 100 events of about 4 KiB each, one transaction each: 400 KiB, six times the budget.
    for i in 2..=101 {
        pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('a', 'k{i}', 'bytes.v1', json_build_object('pad', repeat('x', 4000)))"
        ));
    }
    let in_flight = || http_get(port, "/metrics").and_then(|(_, b)| metric(&b, "outboxd_events_in_flight"));
    // The gauge follows the reader, which fills the budget within seconds (longer on a loaded box).
    wait_until(Duration::from_secs(30), || in_flight().is_some_and(|n| n >= 10.0));
    // Time to overrun the budget, were it not kept: the reader has all 100 rows to take.
    std::thread::sleep(Duration::from_secs(3));
    let held = in_flight().expect("metrics");
    eprintln!("in flight at the byte budget: {held}");
    assert!(held >= 10.0, "the budget should admit about 16 records of 4 KiB, saw {held}");
    assert!(held <= 20.0, "64 KiB budget exceeded: {held} records of 4 KiB in flight");

    broker.resume();
    let end = current_lsn(&pg);
    assert!(wait_until(Duration::from_secs(60), || confirmed_at_least(&pg, &end)), "{}", d.log());
    let got = broker.consume_all("bytes.v1.events", 1, 101, Duration::from_secs(30));
    let ids: HashSet<String> = keys(&got).into_iter().collect();
    assert_eq!(ids.len(), 101, "every event arrived after the resume");
    d.stop_cleanly();
}

#[test]
fn waiting_for_a_topic_keeps_status_updates_and_shutdown() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--status-interval", "300ms", "--shutdown-timeout", "2s", "--heartbeat-interval", "0"],
    ));
    // The broker stops answering before the topic exists: its creation cannot finish.
    broker.pause();
    insert(&pg, "wait.v1", 1, 1);
    let end = current_lsn(&pg);
    // The row is read and held for its topic (reading stops there, before the COMMIT).
    std::thread::sleep(Duration::from_secs(3));
    let reply_time = || pg.psql("SELECT coalesce(max(reply_time)::text, '') FROM pg_stat_replication");
    let t0 = reply_time();
    std::thread::sleep(Duration::from_secs(2));
    let t1 = reply_time();
    assert_ne!(t0, t1, "no status update for 2 s while waiting for the topic:\n{}", d.log());
    assert!(!confirmed_at_least(&pg, &end), "confirmed an event that was never sent");

    let asked = Instant::now();
    d.sigterm();
    let status = d.wait_exit(Duration::from_secs(15));
    assert!(status.is_some(), "SIGTERM ignored while waiting for a topic:\n{}", d.log());
    eprintln!("exited {:?} after SIGTERM", asked.elapsed());
    broker.resume();
}

#[test]
fn a_partition_past_the_topic_is_a_bad_event_not_a_crash_loop() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN part int");
    let broker = Broker::start();
    broker.create_topic("part.v1.events", 1);
    broker.create_topic("outboxd.dlq", 1);
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--table-fields-additional-placement", "part:partition", "--table-field-additional-missing", "ignore"],
    ));
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, part) VALUES \
         ('a', 'ok-before', 'part.v1', '{}', 0)",
    );
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, part) VALUES \
         ('a', 'bad', 'part.v1', '{}', 5)",
    );
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, part) VALUES \
         ('a', 'ok-after', 'part.v1', '{}', 0)",
    );
    let end = current_lsn(&pg);
    assert!(
        wait_until(Duration::from_secs(30), || confirmed_at_least(&pg, &end)),
        "slot stuck behind the bad partition:\n{}",
        d.log()
    );
    assert!(d.is_running(), "the process ended on one bad row:\n{}", d.log());
    let good = broker.consume_all("part.v1.events", 1, 2, Duration::from_secs(20));
    let mut k = keys(&good);
    k.sort();
    assert_eq!(k, vec!["ok-after".to_string(), "ok-before".to_string()]);
    let dead = broker.consume_all("outboxd.dlq", 1, 1, Duration::from_secs(20));
    assert_eq!(dead.len(), 1, "the bad row is dead-lettered once");
    assert_eq!(dead[0].key_str().as_deref(), Some("bad"));
    assert_eq!(dead[0].header_str("outboxd.error").as_deref(), Some("unknown_partition"));
    d.stop_cleanly();
}

#[test]
fn a_postgres_restart_replays_only_what_was_in_flight() {
    let mut pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    broker.create_topic("restart.v1.events", 1);
    let max_in_flight = 200;
    let mif = max_in_flight.to_string();
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--max-in-flight", &mif, "--status-interval", "200ms", "--reconnect-max-backoff", "1s"],
    ));
    let batches = [(1, 3000), (3001, 6000), (6001, 8000)];
    for (i, (from, to)) in batches.iter().enumerate() {
        // One transaction per 100 events.
        for start in (*from..=*to).step_by(100) {
            insert(&pg, "restart.v1", start, (start + 99).min(*to));
        }
        let end = current_lsn(&pg);
        assert!(
            wait_until(Duration::from_secs(90), || confirmed_at_least(&pg, &end)),
            "batch {i} not confirmed:\n{}",
            d.log()
        );
        if i + 1 < batches.len() {
            // A clean server restart: PostgreSQL 15 does not persist a confirmed_flush_lsn that
            // moved without restart_lsn, so the slot comes back behind what outboxd confirmed.
            pg.restart();
        }
    }
    let total = 8000;
    let got = broker.consume_all("restart.v1.events", 1, total, Duration::from_secs(60));
    let mut count: HashMap<String, usize> = HashMap::new();
    for k in keys(&got) {
        *count.entry(k).or_default() += 1;
    }
    assert_eq!(count.len(), total, "lost events: {} distinct of {total}", count.len());
    let duplicates = got.len() - count.len();
    eprintln!("{} records, {} distinct, {duplicates} duplicates over 2 restarts", got.len(), count.len());
    assert!(
        duplicates <= 2 * max_in_flight,
        "{duplicates} duplicates over 2 restarts; at most what was in flight ({max_in_flight} each) is allowed"
    );
    d.stop_cleanly();
}

#[test]
fn adding_a_column_while_streaming_loses_nothing() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    broker.create_topic("alter.v1.events", 1);
    let mut d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &[]));
    insert(&pg, "alter.v1", 1, 50);
    pg.psql("ALTER TABLE outbox ADD COLUMN tenant text NOT NULL DEFAULT 'acme'");
    insert(&pg, "alter.v1", 51, 100);
    // The new column placed as a header from now on needs a restart; the stream itself goes on.
    let end = current_lsn(&pg);
    assert!(wait_until(Duration::from_secs(30), || confirmed_at_least(&pg, &end)), "{}", d.log());
    assert!(d.is_running(), "{}", d.log());
    let got = broker.consume_all("alter.v1.events", 1, 100, Duration::from_secs(30));
    let ids: HashSet<String> = keys(&got).into_iter().collect();
    assert_eq!(ids.len(), 100, "events across the ALTER TABLE");
    d.stop_cleanly();
}

#[test]
fn dropping_the_routed_column_is_a_clear_definite_error() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    broker.create_topic("drop.v1.events", 1);
    let mut d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &[]));
    insert(&pg, "drop.v1", 1, 5);
    let before = current_lsn(&pg);
    assert!(wait_until(Duration::from_secs(30), || confirmed_at_least(&pg, &before)), "{}", d.log());
    pg.psql("ALTER TABLE outbox DROP COLUMN event_type");
    pg.psql("INSERT INTO outbox (aggregate_type, aggregate_id, payload) VALUES ('a', 'after-drop', '{}')");
    let after = current_lsn(&pg);
    let status = d.wait_exit(Duration::from_secs(30));
    let log = d.log();
    assert!(status.is_some_and(|s| !s.success()), "expected a failing exit:\n{log}");
    let line = log.lines().find(|l| l.contains("outboxd: error:")).unwrap_or_default().to_string();
    assert!(line.contains("event_type"), "the error names the missing column: {line}\n{log}");
    assert_eq!(log.matches("outboxd: error:").count(), 1, "one error line, no retry loop:\n{log}");
    assert!(!confirmed_at_least(&pg, &after), "the row that could not be routed was confirmed");
}
