//! `--max-in-flight` holds for `poll` and `backfill` as for `run`, against a real PostgreSQL and
//! Apache Kafka: with the broker stalled (SIGSTOP, or a proxy holding the produce traffic) and a
//! backlog many times the budget, no more than the budget is ever handed to the sink unacked;
//! once the broker answers again every row arrives once, in order per aggregate. A poll batch
//! waiting for room still stops on SIGTERM.

mod common;

use std::time::{Duration, Instant};

use common::netfault::{Dir, FreezeProxy};
use common::poll::*;
use common::*;

const BUDGET: usize = 20;

/// The largest `outboxd_events_in_flight` seen on `port` over `span`, sampled every 100 ms.
fn peak_in_flight(port: u16, span: Duration) -> f64 {
    let end = Instant::now() + span;
    let mut peak = 0.0f64;
    while Instant::now() < end {
        if let Some(v) = http_get(port, "/metrics").and_then(|(_, b)| metric(&b, "outboxd_events_in_flight")) {
            peak = peak.max(v);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    peak
}

/// A poll batch ten times the budget, claimed while the broker is stopped: at most the budget is
/// in flight; the rest of the batch follows as acks make room, each aggregate in order.
#[test]
fn poll_never_has_more_than_max_in_flight_unacked() {
    let pg = PgCluster::start();
    poll_outbox(&pg);
    let broker = Broker::start();
    broker.create_topic("pb.events", 1);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let budget = BUDGET.to_string();
    let mut d = spawn_polling(&poll_args(
        &pg,
        &broker,
        &["--metrics-addr", &addr, "--max-in-flight", &budget, "--poll-batch", "200", "--poll-interval", "100ms"],
    ));
    // One event first, so the producer knows the topic before the broker stops.
    pg.insert_event("t", "warm", Some("pb"), "{\"agg\": \"warm\", \"n\": 0}", None);
    assert!(wait_until(Duration::from_secs(30), || count(&pg, "published_at IS NULL") == 0), "{}", d.log());

    broker.pause();
    insert_series(&pg, "pb", 10, 0, 20);
    let peak = peak_in_flight(port, Duration::from_secs(6));
    let stuck = count(&pg, "published_at IS NULL");
    // The status page shows poll's in-flight records and their bytes too.
    let page: serde_json::Value =
        http_get(port, "/status.json").and_then(|(_, b)| serde_json::from_str(&b).ok()).unwrap_or_default();
    broker.resume();
    let (records, bytes) = (page["in_flight"]["records"].as_f64(), page["in_flight"]["bytes"].as_f64());
    assert!(
        records.is_some_and(|r| r > 0.0 && r <= BUDGET as f64) && bytes.is_some_and(|b| b > 0.0),
        "the status page's in_flight under a stalled poll: {:#}",
        page["in_flight"]
    );
    eprintln!("peak in flight with the broker stopped: {peak}");
    assert!(peak >= BUDGET as f64 / 2.0, "the stalled batch should fill the budget, saw {peak}\n{}", d.log());
    assert!(peak <= BUDGET as f64, "--max-in-flight {BUDGET} exceeded: {peak} records in flight\n{}", d.log());
    assert_eq!(stuck, 200, "nothing may be marked while the broker is down\n{}", d.log());

    assert!(wait_until(Duration::from_secs(60), || count(&pg, "published_at IS NULL") == 0), "{}", d.log());
    let got = broker.consume_all("pb.events", 1, 201, Duration::from_secs(30));
    let (mut order, dups) = first_occurrences(&got);
    order.remove("warm");
    assert_complete_in_order(&order, 10, 20, &d.log());
    assert_eq!(dups, 0, "no crash, so no duplicate\n{}", d.log());
    assert_eq!(peak_in_flight(port, Duration::from_millis(300)), 0.0, "idle: nothing in flight\n{}", d.log());
    d.stop_cleanly();
}

/// The largest "N in flight" of a backfill's progress lines.
fn backfill_peak(log: &str) -> Option<usize> {
    log.lines()
        .filter(|l| l.starts_with("outboxd backfill:"))
        .filter_map(|l| l.split(", ").find_map(|part| part.strip_suffix(" in flight")?.parse().ok()))
        .max()
}

/// A backfill whose pages are five times the budget, with the produce traffic held by a proxy:
/// the progress lines never show more than the budget in flight, and every row is delivered.
#[test]
fn backfill_never_has_more_than_max_in_flight_unacked() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let proxy = FreezeProxy::start(1);
    let broker = Broker::options().advertise(proxy.port).start();
    proxy.set_target(broker.port());
    broker.create_topic("bb.events", 1);
    // 300 rows of about 2 KiB over 10 aggregates, numbered per aggregate in insertion order.
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
         SELECT 'b', 'a' || (g % 10), 'bb', jsonb_build_object('agg', 'a' || (g % 10), 'n', g / 10, \
         'pad', repeat('x', 2000)), now() - interval '1 minute' + g * interval '1 ms' \
         FROM generate_series(0, 299) g",
    );
    // Metadata and the topic check pass; the first produce request stalls part way.
    proxy.hold_after(Dir::Up, 16_000);
    let budget = BUDGET.to_string();
    let mut a = args(&["backfill", "--postgres-url", &pg.url(), "--kafka-brokers"]);
    a.push(format!("127.0.0.1:{}", proxy.port));
    a.extend(args(&["--since", "1h", "--batch-size", "100", "--max-in-flight", &budget]));
    let mut d = Outboxd::spawn(&a);
    assert!(wait_until(Duration::from_secs(60), || proxy.held(Dir::Up)), "no produce traffic:\n{}", d.log());
    // Progress lines come every second while the backfill waits.
    std::thread::sleep(Duration::from_secs(5));
    let stalled = d.log();
    proxy.release(Dir::Up);
    let peak = backfill_peak(&stalled);
    eprintln!("peak in flight with the produce traffic held: {peak:?}");
    assert!(peak.is_some_and(|p| p >= BUDGET / 2), "the stalled backfill should fill the budget:\n{stalled}");
    assert!(peak.is_some_and(|p| p <= BUDGET), "--max-in-flight {BUDGET} exceeded:\n{stalled}");

    let status = d.wait_exit(Duration::from_secs(120));
    let log = d.log();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{log}");
    assert!(log.contains("300 rows read, 300 delivered, 0 bad"), "{log}");
    let peak = backfill_peak(&log).unwrap_or(0);
    assert!(peak <= BUDGET, "--max-in-flight {BUDGET} exceeded after the release ({peak}):\n{log}");
    let got = broker.consume_all("bb.events", 1, 300, Duration::from_secs(30));
    let (order, dups) = first_occurrences(&got);
    assert_complete_in_order(&order, 10, 30, &log);
    assert_eq!(dups, 0, "{log}");
}

/// A poll batch waiting for room when SIGTERM comes: it sends nothing more and exits within
/// `--shutdown-timeout` although the broker is still stopped; the next poller sends every row.
#[test]
fn poll_waiting_for_room_still_stops_on_sigterm() {
    let pg = PgCluster::start();
    poll_outbox(&pg);
    let broker = Broker::start();
    broker.create_topic("ps.events", 1);
    let budget = BUDGET.to_string();
    let flags =
        ["--max-in-flight", &budget, "--poll-batch", "200", "--poll-interval", "100ms", "--shutdown-timeout", "2s"];
    let mut d = spawn_polling(&poll_args(&pg, &broker, &flags));
    pg.insert_event("t", "warm", Some("ps"), "{\"agg\": \"warm\", \"n\": 0}", None);
    assert!(wait_until(Duration::from_secs(30), || count(&pg, "published_at IS NULL") == 0), "{}", d.log());

    broker.pause();
    insert_series(&pg, "ps", 10, 0, 20);
    // The batch is claimed and waits for room (its first 20 records are in flight).
    std::thread::sleep(Duration::from_secs(3));
    let asked = Instant::now();
    d.sigterm();
    let status = d.wait_exit(Duration::from_secs(20));
    let took = asked.elapsed();
    broker.resume();
    assert!(status.is_some(), "SIGTERM ignored while the batch waited for room:\n{}", d.log());
    assert!(took < Duration::from_secs(10), "exit took {took:?} with --shutdown-timeout 2s:\n{}", d.log());

    let mut d = spawn_polling(&poll_args(&pg, &broker, &flags));
    assert!(wait_until(Duration::from_secs(60), || count(&pg, "published_at IS NULL") == 0), "{}", d.log());
    let got = broker.consume_all("ps.events", 1, 201, Duration::from_secs(30));
    let (mut order, _) = first_occurrences(&got);
    order.remove("warm");
    assert_complete_in_order(&order, 10, 20, &d.log());
    d.stop_cleanly();
}
