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
fn heartbeats_move_an_idle_slot_and_never_reach_kafka() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("CREATE TABLE beats (n int)");
    let broker = Broker::start();
    let port = free_port();
    let mut d = start(
        &pg,
        &broker,
        port,
        &["--heartbeat-interval", "1s", "--heartbeat-action-query", "INSERT INTO beats VALUES (1)"],
    );
    let first = pg.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'");
    let mut moves = 0;
    let mut last = first.clone();
    for _ in 0..12 {
        std::thread::sleep(Duration::from_millis(500));
        let now = pg.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'");
        if now != last {
            moves += 1;
            last = now;
        }
    }
    assert!(
        moves >= 2,
        "confirmed_flush_lsn moved {moves} times in 6 s of heartbeats (from {first} to {last})\n{}",
        d.log()
    );
    assert!(pg.psql("SELECT count(*) FROM beats").parse::<i32>().unwrap() >= 2, "action query did not run");
    let topics = broker.topics();
    assert!(topics.is_empty(), "heartbeats must not create or reach topics: {topics:?}");
    d.stop_cleanly();
}
