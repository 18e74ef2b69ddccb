//! Database failover: a PostgreSQL 17 primary with a streaming physical standby on this machine,
//! outboxd given both hosts, the primary killed with kill -9 under load, the standby promoted.
//!
//! * With failover slots (`--slot-failover`, `sync_replication_slots = on` on the standby,
//!   `synchronized_standby_slots` on the primary), outboxd finds the new primary by itself and
//!   resumes from the synchronized slot: every event that survived the failover reaches Kafka
//!   (lost = 0), none that did not survive was sent, and the duplicates are counted and printed.
//!   The standby is listed first, so the same test shows that a server in recovery is skipped.
//! * Without slot sync (the standby lacks `sync_replication_slots`, the primary
//!   `synchronized_standby_slots`, which outboxd warns about), the promoted standby has no slot:
//!   outboxd stops with the definite error that explains the recovery, and creates nothing.
//! * `--slot-failover` against PostgreSQL 15 is a clear start-up error.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const TOPIC: &str = "failover.v1.events";

/// `postgres://` URL naming `first` then `second`, with `target_session_attrs=read-write`.
fn two_host_url(first: &PgCluster, second: &PgCluster) -> String {
    format!(
        "postgres://{USER}:{PASSWORD}@127.0.0.1:{},127.0.0.1:{}/{DB}?sslmode=disable&target_session_attrs=read-write",
        first.port(),
        second.port()
    )
}

fn run_args(url: &str, broker: &Broker, extra: &[&str]) -> Vec<String> {
    let mut a = args(&["run", "--postgres-url", url, "--kafka-brokers", &broker.bootstrap()]);
    a.extend(args(&[
        "--metrics-addr",
        "127.0.0.1:0",
        "--status-interval",
        "200ms",
        "--reconnect-max-backoff",
        "1s",
        "--wal-receiver-timeout",
        "5s",
    ]));
    a.extend(args(extra));
    a
}

/// The numbered events of these tests, written to `pg`.
fn events(pg: &PgCluster) -> Numbered {
    Numbered::new(pg, "failover", 17)
}

/// A writer committing 5-event transactions to `pg` until told to stop or the server goes away;
/// returns how many events it believes committed.
fn spawn_writer(pg: &PgCluster, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    let events = events(pg);
    std::thread::spawn(move || {
        let mut next = 0;
        while !stop.load(Ordering::Relaxed) {
            if !events.insert(next, 5) {
                break;
            }
            next += 5;
            std::thread::sleep(Duration::from_millis(10));
        }
        next
    })
}

fn streaming_lines(log: &str) -> usize {
    log.lines().filter(|l| streaming_started(l)).count()
}

#[test]
fn failover_to_a_promoted_standby_loses_nothing() {
    let mut primary = PgCluster::start_version(17);
    primary.apply_sql_file(sql_dir().join("01_outbox.sql"));
    // A slot that exists without FAILOVER: --slot-failover must turn it on (ALTER_REPLICATION_SLOT).
    primary.psql("SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput')");
    let standby = PgCluster::start_standby_of(
        &mut primary,
        &StandbyOptions { physical_slot: "standby1", sync_slots: true, synchronized_standby_slots: true },
    );
    let broker = Broker::start();
    // The standby first: it is in recovery, so outboxd must pass it over for the primary.
    let url = two_host_url(&standby, &primary);
    let mut d = Outboxd::spawn_streaming(&run_args(&url, &broker, &["--slot-failover"]));
    assert_eq!(
        primary
            .psql("SELECT failover AND active_pid IS NOT NULL FROM pg_replication_slots WHERE slot_name = 'outboxd'"),
        "t",
        "outboxd must stream from the primary's slot with FAILOVER on:\n{}",
        d.log()
    );
    assert!(!d.log().contains("synchronized_standby_slots is empty"), "{}", d.log());

    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&primary, stop.clone());
    // The sync worker's copy stays temporary (and is dropped at promotion) until the primary's
    // slot has moved past what the standby reserved for it; only a persistent copy survives.
    let synced = wait_until(Duration::from_secs(120), || {
        standby.psql(
            "SELECT coalesce(bool_and(synced AND NOT temporary AND NOT conflicting), false) \
             FROM pg_replication_slots WHERE slot_name = 'outboxd'",
        ) == "t"
    });
    assert!(synced, "the standby never synchronized the slot:\n{}", standby.server_log());
    std::thread::sleep(Duration::from_secs(3));
    assert!(!writer.is_finished(), "the writer stopped before the failover");

    eprintln!(
        "before the kill: primary slot {}, standby copy {}",
        primary.psql("SELECT confirmed_flush_lsn, restart_lsn, failover FROM pg_replication_slots WHERE slot_name = 'outboxd'"),
        standby.psql("SELECT confirmed_flush_lsn, restart_lsn, synced, temporary FROM pg_replication_slots WHERE slot_name = 'outboxd'")
    );
    primary.kill9();
    let written_before = writer.join().expect("writer");
    stop.store(true, Ordering::Relaxed);
    let promote_started = Instant::now();
    standby.promote();
    // More events on the new primary.
    for k in 0..20 {
        assert!(events(&standby).insert(1_000_000 + k * 5, 5), "insert on the new primary");
    }
    let resumed = wait_until(Duration::from_secs(90), || streaming_lines(&d.log()) >= 2);
    let resume_secs = promote_started.elapsed().as_secs_f64();
    assert!(resumed, "outboxd did not resume on the promoted standby:\n{}", d.log());
    assert!(d.is_running(), "{}", d.log());

    let survived: HashSet<String> = standby.psql("SELECT event_id FROM outbox").lines().map(str::to_owned).collect();
    let got = broker.consume_all(TOPIC, 1, survived.len(), Duration::from_secs(120));
    let count = count_by_id(&got);
    let lost: Vec<&String> = survived.iter().filter(|id| !count.contains_key(*id)).collect();
    let phantom: Vec<&String> = count.keys().filter(|id| !survived.contains(*id)).collect();
    let duplicates: usize = count.values().map(|c| c - 1).sum();
    eprintln!(
        "failover figures: events written before the kill {written_before}, survived on the promoted standby {}, \
         lost {}, sent but not on the new primary {}, duplicates {duplicates}, records read {}, \
         promote-to-streaming {resume_secs:.1}s",
        survived.len(),
        lost.len(),
        phantom.len(),
        got.len()
    );
    assert!(lost.is_empty(), "{} events lost, e.g. {:?}\n{}", lost.len(), &lost[..lost.len().min(5)], d.log());
    // synchronized_standby_slots holds the walsender back until the standby has the WAL: nothing
    // reached Kafka that the failover then undid.
    assert!(phantom.is_empty(), "{} events sent that the new primary does not have: {:?}", phantom.len(), phantom);
    assert_eq!(
        standby.psql("SELECT active_pid IS NOT NULL FROM pg_replication_slots WHERE slot_name = 'outboxd'"),
        "t",
        "outboxd streams from the synchronized slot on the new primary"
    );
    d.stop_cleanly();
}

#[test]
fn a_slot_missing_after_failover_is_a_definite_error() {
    let mut primary = PgCluster::start_version(17);
    primary.apply_sql_file(sql_dir().join("01_outbox.sql"));
    // No slot sync: the promoted standby will not have the logical slot.
    let standby = PgCluster::start_standby_of(
        &mut primary,
        &StandbyOptions { physical_slot: "standby1", sync_slots: false, synchronized_standby_slots: false },
    );
    let broker = Broker::start();
    let url = two_host_url(&primary, &standby);
    // --slot-failover without synchronized_standby_slots on the primary: a warning, not an error.
    let mut d = Outboxd::spawn_streaming(&run_args(&url, &broker, &["--slot-failover"]));
    assert!(d.log().contains("synchronized_standby_slots is empty"), "{}", d.log());
    assert!(events(&primary).insert(0, 5));
    assert!(primary.wait_slot_reaches_wal_end(Duration::from_secs(30)), "{}", d.log());

    primary.kill9();
    standby.promote();
    let status = d.wait_exit(Duration::from_secs(90));
    let log = d.log();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "outboxd must stop with a set-up failure:\n{log}");
    assert!(
        log.contains("replication slot \\\"outboxd\\\" is gone")
            || log.contains("replication slot \"outboxd\" is gone"),
        "{log}"
    );
    assert!(log.contains("outboxd backfill") && log.contains("--slot-recreate-after-loss"), "{log}");
    assert_eq!(standby.psql("SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'"), "0");
}

#[test]
fn slot_failover_before_postgresql_17_is_a_startup_error() {
    let pg = PgCluster::start();
    assert!(pg.server_major() < 17, "this test needs the default (older) server");
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let (code, log) =
        run_to_exit(&daemon_args_pg_only(&pg, &["--sink", "null", "--slot-failover"]), Duration::from_secs(60));
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("--slot-failover needs PostgreSQL 17 or later"), "{log}");
    assert_eq!(pg.psql("SELECT count(*) FROM pg_replication_slots"), "0", "no slot may be created");
}
