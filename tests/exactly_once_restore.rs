//! `--delivery exactly-once` after a point-in-time restore: the position stored in Kafka names
//! LSNs of a history the server no longer has, and the new timeline reuses them.
//!
//! The scene: outboxd delivers some events, a base backup is taken (`pg_basebackup -X stream`),
//! 300 more events are delivered (the position in Kafka moves past them), then the cluster is
//! restored from the backup (`recovery_target = 'immediate'`: it ends recovery at the backup's
//! end and continues on timeline 2). The 300 events are gone from the database; 50 new ones are
//! written on timeline 2, at LSNs below the stored position. Every one of them must reach Kafka
//! once, and the log must say why the position was cut back to the branch point. (Before the
//! position carried its timeline, all 50 were skipped as delivered, and nothing was logged.)

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const TOPIC: &str = "restore.v1.events";
const T: Duration = Duration::from_secs(120);

/// `bindir/prog` as the `postgres` OS user when the tests run as root (as the harness runs
/// servers).
fn as_postgres(bindir: &Path, prog: &str) -> Command {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bindir.join(prog));
        c
    } else {
        Command::new(bindir.join(prog))
    }
}

/// A base backup of `pg` into `dir`, with the WAL it needs (`-X stream`), as an operator takes one.
fn base_backup(pg: &PgCluster, dir: &Path) {
    let out = as_postgres(pg.bindir(), "pg_basebackup")
        .arg("-D")
        .arg(dir)
        .args(["-X", "stream", "-c", "fast", "-U", "postgres", "-p", &pg.port().to_string(), "-h"])
        .arg(pg.socket_dir())
        .output()
        .expect("spawn pg_basebackup");
    assert!(out.status.success(), "pg_basebackup failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Stop `pg`, put `backup` in place of its data directory, and start it with a recovery that ends
/// as soon as the backup is consistent: it then continues on a new timeline.
fn restore(pg: &mut PgCluster, backup: &Path) {
    pg.stop("fast");
    let data = pg.data_dir().to_path_buf();
    std::fs::rename(&data, data.with_extension("lost")).expect("move the data directory away");
    std::fs::rename(backup, &data).expect("put the backup in place");
    std::fs::write(data.join("recovery.signal"), "").expect("write recovery.signal");
    let conf = "\n# --- restore ---\nrecovery_target = 'immediate'\nrecovery_target_action = 'promote'\n\
                restore_command = 'false'\n";
    let mut f = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).expect("postgresql.conf");
    std::io::Write::write_all(&mut f, conf.as_bytes()).expect("append to postgresql.conf");
    pg.start_again();
    let promoted = wait_until(T, || pg.psql("SELECT pg_is_in_recovery()") == "f");
    assert!(promoted, "the restored cluster did not leave recovery:\n{}", pg.server_log());
}

/// How often each event number (payload `n`) is in the topic, read with `read_committed`.
fn counts(broker: &Broker, at_least: usize) -> HashMap<i64, usize> {
    let mut seen = HashMap::new();
    for c in broker.consume_all(TOPIC, 1, at_least, T) {
        *seen.entry(c.payload_json()["n"].as_i64().expect("payload n")).or_default() += 1;
    }
    seen
}

/// The events before and after the restore: 20, then (after the backup or snapshot) 300 more,
/// all read back from Kafka; returns where the WAL ended (near the stored position).
fn deliver(
    pg: &mut PgCluster,
    broker: &Broker,
    mut d: Outboxd,
    events: &Numbered,
    backup: impl FnOnce(&mut PgCluster),
) -> String {
    assert!(events.insert(0, 20), "insert 0..20");
    assert!(pg.wait_slot_confirms(&pg.current_lsn(), T), "{}", d.log());
    backup(pg);
    for first in (20..320).step_by(30) {
        assert!(events.insert(first, 30), "insert {first}..");
    }
    let before = counts(broker, 320);
    assert_eq!(before.len(), 320, "before the restore:\n{}", d.log());
    d.stop_cleanly();
    pg.current_lsn()
}

/// 50 new events after the restore, with outboxd started on the restored cluster: each reaches
/// Kafka once, and the log has `why`.
fn new_events_arrive(pg: &PgCluster, broker: &Broker, args: &[String], events: &Numbered, why: &str) {
    let d = Outboxd::spawn_streaming(args);
    assert!(events.insert(1000, 50), "insert 1000..1050");
    eprintln!("[restore] the new events end at {}", pg.current_lsn());
    all_new_once(broker, &d, why);
}

/// Events 1000..1050 are each in Kafka once, and `d`'s log has `why`.
fn all_new_once(broker: &Broker, d: &Outboxd, why: &str) {
    let after = counts(broker, 370);
    let log = d.log();
    let missing: Vec<i64> = (1000..1050).filter(|n| !after.contains_key(n)).collect();
    assert!(missing.is_empty(), "{} of 50 new events never reached Kafka: {missing:?}\n{log}", missing.len());
    let twice: Vec<(&i64, &usize)> = after.iter().filter(|(n, c)| **n >= 1000 && **c > 1).collect();
    assert!(twice.is_empty(), "new events read more than once: {twice:?}");
    let again = after.values().filter(|c| **c > 1).count();
    eprintln!("[restore] {} events in Kafka, {again} of the earlier ones sent again", after.len());
    assert!(log.contains(why), "the log does not say why the position was not skipped by ({why:?}):\n{log}");
}

/// Stop `pg`, put the copy `snapshot` in place of its data directory, start it (same timeline).
fn put_back(pg: &mut PgCluster, snapshot: &Path) {
    let data = pg.data_dir().to_path_buf();
    pg.stop("fast");
    std::fs::rename(&data, data.with_extension("lost")).expect("move the data directory away");
    std::fs::rename(snapshot, &data).expect("put the snapshot in place");
    let _ = std::fs::remove_file(data.join("postmaster.pid"));
    pg.start_again();
}

/// Events 0..320 delivered, a cold copy of the data directory taken after the first 20; returns
/// where the copy is and the WAL position near the stored one.
fn snapshot_scene(pg: &mut PgCluster, broker: &Broker, args: &[String], events: &Numbered) -> (PathBuf, String) {
    let snapshot = pg.data_dir().with_extension("snapshot");
    let snap = |pg: &mut PgCluster| {
        pg.stop("fast");
        let st = Command::new("cp").arg("-a").arg(pg.data_dir()).arg(&snapshot).status().expect("cp");
        assert!(st.success(), "copying the data directory failed");
        pg.start_again();
    };
    let stored_at = deliver(pg, broker, Outboxd::spawn_streaming(args), events, snap);
    (snapshot, stored_at)
}

fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.trim().split_once('/').expect("an LSN");
    (u64::from_str_radix(hi, 16).expect("hex") << 32) | u64::from_str_radix(lo, 16).expect("hex")
}

#[test]
fn after_a_restore_to_before_delivered_events_every_new_event_reaches_kafka() {
    let mut pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let args = daemon_args(&pg, &broker, &["--delivery", "exactly-once", "--status-interval", "1s"]);
    let events = Numbered::new(&pg, "restore", 7);
    let backup = pg.data_dir().with_extension("backup");
    let stored_at = deliver(&mut pg, &broker, Outboxd::spawn_streaming(&args), &events, |pg| base_backup(pg, &backup));

    restore(&mut pg, &backup);
    let history = std::fs::read_to_string(pg.data_dir().join("pg_wal/00000002.history")).unwrap_or_default();
    let kept = pg.psql("SELECT count(*) FROM outbox");
    eprintln!(
        "[restore] position stored near {stored_at} on timeline 1; restored: {kept} rows, WAL at {}, timeline 2's history {history:?}",
        pg.current_lsn()
    );
    assert!(history.starts_with('1'), "the restore did not start timeline 2:\n{}", pg.server_log());
    assert_eq!(kept, "20", "the restore keeps only the events before the backup");
    // The slot was not in the backup: outboxd makes a new one; the new events follow on the new
    // timeline, below the stored position.
    new_events_arrive(
        &pg,
        &broker,
        &args,
        &events,
        "the committed position lies past the point where this server's history left its timeline",
    );
}

/// A restore that keeps the timeline: a copy of the data directory (with its slot) taken while
/// the server was stopped, put back later. Nothing in the server's history shows it; the stored
/// position lies beyond the server's WAL end, which no position of this history can.
#[test]
fn after_a_snapshot_restore_on_the_same_timeline_every_new_event_reaches_kafka() {
    let mut pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let args = daemon_args(&pg, &broker, &["--delivery", "exactly-once", "--status-interval", "1s"]);
    let events = Numbered::new(&pg, "restore", 7);
    let (snapshot, stored_at) = snapshot_scene(&mut pg, &broker, &args, &events);
    put_back(&mut pg, &snapshot);
    eprintln!("[snapshot] position stored near {stored_at}; restored: WAL at {}", pg.current_lsn());
    assert_eq!(pg.psql("SELECT count(*) FROM outbox"), "20", "the snapshot holds only the events before it");
    new_events_arrive(&pg, &broker, &args, &events, "the committed position lies beyond the server's WAL end");
}

/// The same restore, but the server wrote past the stored position before outboxd started: the
/// reused LSNs cannot be told apart any more, so the guarantees chapter says to remove the
/// position with a tombstone (Kafka's console producer, as written there). outboxd then skips
/// nothing: the 50 events written after the restore, below the stored position, all arrive.
#[test]
fn a_tombstone_removes_the_position_after_a_restore_outboxd_cannot_recognise() {
    let mut pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let args = daemon_args(&pg, &broker, &["--delivery", "exactly-once", "--status-interval", "1s"]);
    let events = Numbered::new(&pg, "restore", 7);
    let (snapshot, stored_at) = snapshot_scene(&mut pg, &broker, &args, &events);
    put_back(&mut pg, &snapshot);
    assert!(events.insert(1000, 50), "insert 1000..1050");
    assert!(lsn(&pg.current_lsn()) < lsn(&stored_at), "the new events are not below the stored position");
    // The application writes on while outboxd is down, past the stored position.
    while lsn(&pg.current_lsn()) <= lsn(&stored_at) {
        pg.psql("SELECT pg_switch_wal(); CREATE TABLE IF NOT EXISTS filler (x int); INSERT INTO filler VALUES (1)");
    }
    let system_id = pg.psql("SELECT system_identifier FROM pg_control_system()");
    let mut producer = Command::new(common::kafka::kafka_script())
        .args(["tool", "ConsoleProducer", "--bootstrap-server", &broker.bootstrap(), "--topic", "outboxd.positions"])
        .args([
            "--reader-property",
            "parse.key=true",
            "--reader-property",
            "key.separator=|",
            "--reader-property",
            "null.marker=NULL",
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the console producer");
    let mut stdin = producer.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, format!("{system_id}/outboxd|NULL\n").as_bytes())
        .expect("write the tombstone");
    drop(stdin);
    assert!(producer.wait().expect("console producer").success(), "the console producer failed");

    let d = Outboxd::spawn_streaming(&args);
    all_new_once(&broker, &d, "committed position read position=None");
}

/// The other side of the rule: a failover to a standby that had every WAL record outboxd read
/// (PostgreSQL 17, a synchronized failover slot, `synchronized_standby_slots`) keeps the position
/// whole. The standby's copy of the slot is left behind on purpose (slot sync turned off, then
/// more events delivered), so after the promotion the slot starts before the position, on a new
/// timeline: what the position covers is skipped as after a restart, and nothing is sent twice.
#[test]
fn after_a_failover_to_a_caught_up_standby_nothing_is_sent_twice() {
    let mut primary = PgCluster::start_version(17);
    primary.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let standby = PgCluster::start_standby_of(
        &mut primary,
        &StandbyOptions { physical_slot: "standby1", sync_slots: true, synchronized_standby_slots: true },
    );
    let broker = Broker::start();
    let url = format!(
        "postgres://{USER}:{PASSWORD}@127.0.0.1:{},127.0.0.1:{}/{DB}?sslmode=disable&target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let mut a = args(&["run", "--postgres-url", &url, "--kafka-brokers", &broker.bootstrap(), "--slot-failover"]);
    a.extend(args(&["--delivery", "exactly-once", "--status-interval", "500ms", "--reconnect-max-backoff", "1s"]));
    a.extend(args(&["--metrics-addr", "127.0.0.1:0"]));
    let d = Outboxd::spawn_streaming(&a);
    let events = Numbered::new(&primary, "restore", 7);
    let mut n = 0;
    let synced = wait_until(T, || {
        assert!(events.insert(n, 10), "insert {n}..");
        n += 10;
        standby.psql(
            "SELECT coalesce(bool_and(synced AND NOT temporary AND NOT conflicting), false) \
             FROM pg_replication_slots WHERE slot_name = 'outboxd'",
        ) == "t"
    });
    assert!(synced, "the standby never synchronized the slot:\n{}", standby.server_log());
    // The standby's copy stays where it is now; the position in Kafka moves on.
    standby.psql("ALTER SYSTEM SET sync_replication_slots = off");
    standby.psql("SELECT pg_reload_conf()");
    std::thread::sleep(Duration::from_secs(2));
    let copy = standby.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'");
    assert!(events.insert(n, 200), "insert {n}..");
    n += 200;
    assert_eq!(counts(&broker, n).len(), n, "before the failover:\n{}", d.log());
    assert!(primary.wait_slot_reaches_wal_end(T), "{}", d.log());
    // A clean switchover: a fast stop sends the standby every WAL record first.
    primary.stop("fast");
    standby.promote();
    let on_standby = Numbered::new(&standby, "restore", 7);
    assert!(on_standby.insert(100_000, 50), "insert on the new primary");
    let total = n + 50;
    let got = counts(&broker, total);
    let log = d.log();
    let twice: Vec<(&i64, &usize)> = got.iter().filter(|(_, c)| **c > 1).collect();
    let missing = (0..n as i64).chain(100_000..100_050).filter(|k| !got.contains_key(k)).count();
    eprintln!(
        "[failover] the standby's slot copy at {copy}; {n} events before, 50 after; read {} distinct, {} twice, {missing} missing",
        got.len(),
        twice.len()
    );
    let skipped = log.lines().filter(|l| l.contains("already delivered were not sent again")).last().unwrap_or("");
    eprintln!("[failover] {skipped}");
    assert_eq!(missing, 0, "events missing:\n{log}");
    assert!(twice.is_empty(), "events sent twice after a failover to a caught-up standby: {twice:?}\n{log}");
    assert!(!log.contains("lies past the point"), "the position was cut back:\n{log}");
    assert!(
        skipped.contains("skipped=") && !skipped.contains("skipped=0"),
        "nothing was skipped by the position:\n{log}"
    );
}

/// outboxd stays up (at-least-once here; exactly-once resumes from the same frontier) while the
/// server is put back to a copy of its data directory taken earlier, on the same timeline. The
/// process's own frontier is then past the server's WAL end: resuming from it, as it does when
/// the server merely has not persisted the slot yet, would skip the new events at the reused LSNs
/// below it. It resumes from the slot instead, and says why.
#[test]
fn a_process_that_stays_up_through_a_snapshot_restore_sends_every_new_event() {
    let mut pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let args = daemon_args(&pg, &broker, &["--status-interval", "1s"]);
    let events = Numbered::new(&pg, "restore", 7);
    let snapshot = pg.data_dir().with_extension("snapshot");
    let d = Outboxd::spawn_streaming(&args);
    assert!(events.insert(0, 20), "insert 0..20");
    assert!(pg.wait_slot_confirms(&pg.current_lsn(), T), "{}", d.log());
    pg.stop("fast");
    let st = Command::new("cp").arg("-a").arg(pg.data_dir()).arg(&snapshot).status().expect("cp");
    assert!(st.success(), "copying the data directory failed");
    pg.start_again();
    for first in (20..320).step_by(30) {
        assert!(events.insert(first, 30), "insert {first}..");
    }
    assert_eq!(counts(&broker, 320).len(), 320, "before the restore:\n{}", d.log());
    let frontier = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&frontier, T), "{}", d.log());
    put_back(&mut pg, &snapshot);
    eprintln!("[in-process snapshot] outboxd confirmed {frontier}; restored: WAL at {}", pg.current_lsn());
    assert!(lsn(&pg.current_lsn()) < lsn(&frontier), "the restored WAL must end before the frontier");
    assert!(events.insert(1000, 50), "insert 1000..1050");
    all_new_once(&broker, &d, "the server's WAL ends before what it confirmed");
}
