//! Operating outboxd: metrics and probes, heartbeats, and riding out a PostgreSQL restart and a
//! stalled broker with nothing lost and the process still up.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;

use outboxd::metrics::NAMES as METRICS;

fn start(pg: &PgCluster, broker: &Broker, port: u16, extra: &[&str]) -> Outboxd {
    let addr = format!("127.0.0.1:{port}");
    let mut a = vec!["--metrics-addr", addr.as_str(), "--status-interval", "200ms", "--lag-poll-interval", "200ms"];
    a.extend_from_slice(extra);
    Outboxd::spawn_streaming(&daemon_args(pg, broker, &a))
}

fn scrape(port: u16) -> String {
    let (status, body) = http_get(port, "/metrics").expect("metrics endpoint answers");
    assert_eq!(status, 200);
    body
}

fn insert_events(pg: &PgCluster, n: usize, tag: &str) {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'ops', 'agg-' || (g % 5), 'ops.v1', jsonb_build_object('tag', '{tag}', 'g', g) FROM generate_series(1, {n}) g"
    ));
}

fn all_ids(pg: &PgCluster) -> Vec<String> {
    pg.psql("SELECT event_id FROM outbox").lines().map(String::from).collect()
}

fn assert_all_arrived(pg: &PgCluster, broker: &Broker, d: &Outboxd) {
    let ids = all_ids(pg);
    let got = broker.consume_all("ops.v1.events", 1, ids.len(), Duration::from_secs(90));
    let seen: HashSet<String> = got.iter().filter_map(|r| r.header_str("id")).collect();
    let missing = ids.iter().filter(|id| !seen.contains(*id)).count();
    assert_eq!(missing, 0, "{missing} of {} events never arrived\n{}", ids.len(), d.log());
}

#[test]
fn metrics_probes_and_lag_agree_with_the_server() {
    let pg = PgCluster::start_with(&["max_slot_wal_keep_size = 1GB"]);
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let port = free_port();
    let mut d = start(&pg, &broker, port, &[]);
    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
    assert!(wait_until(Duration::from_secs(10), || http_get(port, "/readyz").map(|r| r.0) == Some(200)), "never ready");
    insert_events(&pg, 50, "m");
    assert_all_arrived(&pg, &broker, &d);
    // Idle now: the polled lag must settle on what the server reports.
    let agreed = wait_until(Duration::from_secs(15), || {
        let body = scrape(port);
        let ours = metric(&body, "outboxd_replication_lag_bytes").unwrap_or(-1.0);
        let theirs: f64 = pg
            .psql("SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'")
            .parse()
            .unwrap();
        ours == theirs
    });
    let body = scrape(port);
    assert!(agreed, "lag gauge never matched pg_replication_slots:\n{body}");
    for name in METRICS {
        assert!(body.lines().any(|l| l.starts_with(name)), "metric {name} missing:\n{body}");
    }
    assert_eq!(metric(&body, "outboxd_events_total{topic=\"ops.v1.events\"}"), Some(50.0));
    assert_eq!(metric(&body, "outboxd_events_in_flight"), Some(0.0));
    assert_eq!(metric(&body, "outboxd_connected{component=\"postgres\"}"), Some(1.0));
    assert_eq!(metric(&body, "outboxd_connected{component=\"kafka\"}"), Some(1.0));
    assert!(metric(&body, "outboxd_slot_safe_wal_size_bytes").unwrap_or(0.0) > 0.0, "{body}");
    assert!(metric(&body, "outboxd_commit_to_ack_seconds_count").unwrap_or(0.0) >= 1.0, "{body}");
    let confirmed: f64 = pg
        .psql("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = 'outboxd'")
        .parse()
        .unwrap();
    assert!(metric(&body, "outboxd_confirmed_flush_lsn").unwrap() <= confirmed);
    d.stop_cleanly();
}

#[test]
fn postgres_fast_restart_mid_stream_loses_nothing() {
    let mut pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let port = free_port();
    let mut d = start(&pg, &broker, port, &["--reconnect-max-backoff", "2s"]);
    insert_events(&pg, 2000, "before");
    pg.restart();
    insert_events(&pg, 2000, "after");
    assert_all_arrived(&pg, &broker, &d);
    assert!(d.is_running(), "outboxd exited on a PostgreSQL restart:\n{}", d.log());
    let body = scrape(port);
    assert!(metric(&body, "outboxd_reconnects_total{component=\"postgres\"}").unwrap_or(0.0) >= 1.0, "{body}");
    d.stop_cleanly();
}

#[test]
fn stalled_broker_flips_readiness_and_recovers_with_everything() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let port = free_port();
    let mut d = start(&pg, &broker, port, &[]);
    insert_events(&pg, 100, "warm");
    assert_eq!(broker.consume_all("ops.v1.events", 1, 100, Duration::from_secs(30)).len(), 100);
    assert!(wait_until(Duration::from_secs(10), || http_get(port, "/readyz").map(|r| r.0) == Some(200)));

    broker.pause();
    insert_events(&pg, 1000, "stalled");
    let flipped = wait_until(Duration::from_secs(20), || http_get(port, "/readyz").map(|r| r.0) == Some(503));
    let during = scrape(port);
    std::thread::sleep(Duration::from_secs(5));
    assert!(d.is_running(), "outboxd exited during the broker stall:\n{}", d.log());
    broker.resume();
    assert!(flipped, "/readyz never reported 503 while the broker was stopped\n{during}");
    assert_eq!(metric(&during, "outboxd_connected{component=\"kafka\"}"), Some(0.0), "{during}");
    assert!(
        wait_until(Duration::from_secs(30), || http_get(port, "/readyz").map(|r| r.0) == Some(200)),
        "never ready again"
    );
    assert_all_arrived(&pg, &broker, &d);
    d.stop_cleanly();
}

#[test]
fn heartbeats_move_an_idle_slot_and_never_reach_the_sink() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(
        &pg,
        &["--sink", "stdout", "--status-interval", "200ms", "--heartbeat-interval", "1s"],
    ));
    // A second slot decodes everything written from here on: outboxd's heartbeats must not show.
    pg.psql("SELECT 1 FROM pg_create_logical_replication_slot('probe', 'test_decoding')");
    // Nothing else writes to this cluster: each heartbeat takes one transaction id (the next
    // one to be given out is read without taking one).
    let next_xid = || pg.psql("SELECT txid_snapshot_xmax(txid_current_snapshot())").parse::<i64>().unwrap();
    let first = next_xid();
    // Three heartbeats' time: the probe saw none of them.
    std::thread::sleep(Duration::from_millis(3500));
    let seen =
        pg.psql("SELECT count(*) FROM pg_logical_slot_peek_changes('probe', NULL, NULL, 'skip-empty-xacts', '0')");
    assert_eq!(seen, "0", "another logical decoding consumer saw the heartbeats");
    assert!(wait_until(Duration::from_secs(15), || next_xid() >= first + 3), "no heartbeats\n{}", d.log());
    // The idle slot moves past a heartbeat's own WAL.
    let last = pg.current_lsn();
    let moved = wait_until(Duration::from_secs(10), || {
        pg.psql(&format!(
            "SELECT confirmed_flush_lsn >= '{last}'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        )) == "t"
    });
    assert!(moved, "confirmed_flush_lsn never passed the heartbeat at {last}\n{}", d.log());
    pg.psql("SELECT 1 FROM pg_drop_replication_slot('probe')");
    d.stop_cleanly();
    let log = d.log();
    assert!(!log.lines().any(|l| l.starts_with("{\"topic\"")), "a heartbeat became a record:\n{log}");
}

#[test]
fn heartbeat_action_query_runs_every_interval() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("CREATE TABLE beats (at timestamptz)");
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(
        &pg,
        &[
            "--sink",
            "null",
            "--heartbeat-interval",
            "1s",
            "--heartbeat-action-query",
            "INSERT INTO beats VALUES (now())",
        ],
    ));
    let runs = || pg.psql("SELECT count(*) FROM beats").parse::<i32>().unwrap();
    assert!(wait_until(Duration::from_secs(15), || runs() >= 3), "action query ran {} times\n{}", runs(), d.log());
    d.stop_cleanly();
}

fn healthz(port: u16) -> Option<u16> {
    http_get(port, "/healthz").map(|r| r.0)
}

fn postmaster_pid(pg: &PgCluster) -> u32 {
    let pidfile = std::fs::read_to_string(pg.data_dir().join("postmaster.pid")).expect("postmaster.pid");
    pidfile.lines().next().and_then(|l| l.trim().parse().ok()).expect("pid on the first line")
}

/// A SIGSTOPped process, continued on drop so a failed assertion never leaves it frozen.
struct Frozen(u32);

impl Frozen {
    fn new(pid: u32) -> Frozen {
        assert!(send_signal(pid, "STOP"), "kill -STOP {pid}");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        send_signal(self.0, "CONT");
    }
}

/// CPU time (user + system, in clock ticks) the process has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn healthz_fails_while_the_loop_is_stuck_and_passes_while_it_turns() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let url = format!("{}&connect_timeout=60", pg.url());
    let a = args(&[
        "run",
        "--postgres-url",
        &url,
        "--sink",
        "null",
        "--metrics-addr",
        &addr,
        "--status-interval",
        "200ms",
        "--health-stall-timeout",
        "2s",
    ]);
    // Stuck before the loop: the server takes the connection and never answers.
    let frozen = Frozen::new(postmaster_pid(&pg));
    let mut d = Outboxd::spawn(&a);
    assert!(wait_until(Duration::from_secs(15), || healthz(port) == Some(503)), "/healthz never failed:\n{}", d.log());
    let body = http_get(port, "/healthz").expect("answers").1;
    assert!(body.contains("stalled"), "{body}");
    drop(frozen);
    assert!(d.wait_for_streaming(Duration::from_secs(60)), "{}", d.log());
    assert!(wait_until(Duration::from_secs(5), || healthz(port) == Some(200)), "/healthz never recovered");

    // Busy, then idle, for twice the stall timeout: the loop turns and every probe passes.
    let writer = {
        let sock = pg.socket_dir();
        let port = pg.port();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while std::time::Instant::now() < deadline {
                let ok = std::process::Command::new("psql")
                    .args(["-X", "-q", "-U", "postgres", "-d", "app", "-p", &port.to_string(), "-h"])
                    .arg(&sock)
                    .args(["-c", "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'h', 'h', 'h.v1', '{}' FROM generate_series(1, 200)"])
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "insert failed");
            }
        })
    };
    for _ in 0..40 {
        assert_eq!(healthz(port), Some(200), "{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    writer.join().expect("writer");
    let events: usize = pg.psql("SELECT count(*) FROM outbox").parse().unwrap();
    assert!(events >= 200, "the writer wrote {events} events");
    d.stop_cleanly();
}

#[test]
fn silent_clients_and_fd_exhaustion_do_not_take_the_endpoint_down() {
    use std::io::{Read as _, Write as _};
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &["--sink", "null", "--metrics-addr", &addr]));
    let pid = d.pid().expect("pid");

    // Slow-loris: clients that connect and send nothing, or half a request.
    let mut silent: Vec<std::net::TcpStream> =
        (0..20).map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect")).collect();
    silent[0].write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
    let t = std::time::Instant::now();
    for _ in 0..10 {
        assert_eq!(healthz(port), Some(200));
    }
    assert!(t.elapsed() < Duration::from_secs(3), "10 probes took {:?} next to silent clients", t.elapsed());
    // The server drops them after its deadline instead of holding a task and a descriptor.
    for s in &mut silent[..2] {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 64];
        let r = s.read(&mut buf);
        assert!(
            matches!(r, Ok(0)) || r.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "{r:?}"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(15), "silent clients were held {:?}", t.elapsed());
    drop(silent);

    // Out of file descriptors: accept fails with EMFILE while connections wait in the backlog.
    // A loop that retries at once burns a core; ours pauses.
    std::thread::sleep(Duration::from_millis(500));
    let open = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    let limit = |n: &str| {
        let ok = std::process::Command::new("prlimit")
            .args([format!("--pid={pid}"), format!("--nofile={n}:")])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "prlimit --nofile={n}");
    };
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft = limits.lines().find(|l| l.starts_with("Max open files")).and_then(|l| l.split_whitespace().nth(3));
    let soft = soft.expect("soft limit").to_owned();
    limit(&open.to_string());
    let waiting: Vec<std::net::TcpStream> =
        (0..5).map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect")).collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    limit(&soft);
    eprintln!("{used} CPU ticks in 2 s of failing accepts");
    assert!(used < 40, "{used} CPU ticks in 2 s while accept failed: the accept loop spins\n{}", d.log());
    assert!(d.log().contains("accept failed"), "{}", d.log());
    drop(waiting);
    assert!(wait_until(Duration::from_secs(5), || healthz(port) == Some(200)), "endpoint did not recover");
    d.stop_cleanly();
}

#[test]
fn second_signal_ends_a_stuck_drain_at_once() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let port = free_port();
    let mut d = start(&pg, &broker, port, &["--shutdown-timeout", "60s"]);
    insert_events(&pg, 10, "warm");
    assert_eq!(broker.consume_all("ops.v1.events", 1, 10, Duration::from_secs(30)).len(), 10);

    broker.pause();
    insert_events(&pg, 100, "stuck");
    let stuck = wait_until(Duration::from_secs(20), || {
        metric(&scrape(port), "outboxd_events_in_flight").is_some_and(|n| n > 0.0)
    });
    assert!(stuck, "no events in flight\n{}", d.log());
    d.sigterm();
    assert!(d.wait_for_log("shutdown requested", Duration::from_secs(10)), "{}", d.log());
    // The drain really is stuck: acks never come while the broker is stopped.
    std::thread::sleep(Duration::from_secs(2));
    assert!(d.is_running(), "exited before the second signal:\n{}", d.log());
    let t = std::time::Instant::now();
    d.sigterm();
    let status = d.wait_exit(Duration::from_secs(10));
    broker.resume();
    let status = status.unwrap_or_else(|| panic!("still draining 10 s after the second SIGTERM:\n{}", d.log()));
    assert!(t.elapsed() < Duration::from_secs(5), "exit took {:?}", t.elapsed());
    assert_eq!(status.code(), Some(143), "{}", d.log());
    assert!(d.log().contains("second signal during shutdown"), "{}", d.log());
}

/// No background task dies silently (issue 23 items 13 and 14): the harness makes one panic
/// (`OUTBOXD_FAULT_END_TASK`, honoured by debug builds only) and outboxd exits 1 naming it,
/// instead of streaming on without lag metrics and heartbeats, or with deliveries that never
/// resolve while /healthz stays green.
#[test]
fn a_dead_background_task_ends_the_process_naming_it() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    for (task, name) in [("monitor", "the monitor task"), ("kafka-reports", "the Kafka delivery-report task")] {
        let mut d = Outboxd::spawn_with_env(&daemon_args(&pg, &broker, &[]), &[("OUTBOXD_FAULT_END_TASK", task)]);
        let status = d.wait_exit(Duration::from_secs(60));
        let log = d.log();
        assert_eq!(status.and_then(|s| s.code()), Some(1), "{task} died and outboxd went on:\n{log}");
        assert!(log.contains(name) && log.contains("panicked: fault injected"), "{task}:\n{log}");
    }
}

/// Idle sockets cannot hold the endpoint shut (issue 23 item 5): 80 connections that send nothing,
/// re-opened every second, once kept every probe out (64 were served at once and the rest closed
/// on accept); now a new connection ends the longest-idle one, so every probe is answered.
#[test]
fn idle_sockets_reopened_in_a_loop_never_keep_a_probe_out() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &["--sink", "null", "--metrics-addr", &addr]));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut held: Vec<std::net::TcpStream> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                held.clear();
                held.extend((0..80).filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok()));
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let mut answered = 0;
    for _ in 0..20 {
        if healthz(port) == Some(200) {
            answered += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    attacker.join().unwrap();
    assert_eq!(answered, 20, "probes answered next to idle sockets\n{}", d.log());
    d.stop_cleanly();
}
