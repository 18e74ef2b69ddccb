//! `outboxd poll` against a real PostgreSQL and Apache Kafka: end to end with the NOTIFY wake-up,
//! per-aggregate order with three pollers killed -9 at random, attempts/backoff/dead-lettering of
//! a refused record, and a broker outage that must cost no attempts.

mod common;

use std::time::{Duration, Instant};

use common::poll::*;
use common::*;

#[test]
fn poll_relays_backlog_and_new_rows_in_order_and_wakes_on_notify() {
    let pg = PgCluster::start();
    poll_outbox(&pg);
    let broker = Broker::start();
    insert_series(&pg, "p1", 10, 0, 50);
    // A minute-long fallback: anything that arrives within seconds was woken by NOTIFY.
    let mut d = spawn_polling(&poll_args(&pg, &broker, &["--poll-interval", "60s", "--poll-batch", "64"]));
    let got = broker.consume_all("p1.events", 1, 500, Duration::from_secs(60));
    let (order, dups) = first_occurrences(&got);
    assert_complete_in_order(&order, 10, 50, &d.log());
    assert_eq!(dups, 0, "no crash, so no duplicate\n{}", d.log());
    assert!(
        wait_until(Duration::from_secs(10), || count(&pg, "published_at IS NULL") == 0),
        "acked rows must be marked published\n{}",
        d.log()
    );
    assert_eq!(count(&pg, "attempts <> 0 OR error IS NOT NULL"), 0, "first-try rows keep attempts = 0");
    // Idle now (the claim found nothing and waits up to 60 s): a new row must be relayed at once.
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let id = pg.insert_event("t", "late", Some("p1"), "{\"agg\": \"late\", \"n\": 0}", None);
    let woke = wait_until(Duration::from_secs(20), || {
        count(&pg, &format!("event_id = '{id}' AND published_at IS NOT NULL")) == 1
    });
    assert!(woke && started.elapsed() < Duration::from_secs(20), "the NOTIFY did not wake the poller\n{}", d.log());
    let got = broker.consume_all("p1.events", 1, 501, Duration::from_secs(30));
    assert!(got.iter().any(|r| r.header_str("id").as_deref() == Some(id.as_str())), "{}", d.log());
    d.stop_cleanly();
}

/// Three pollers on one backlog, one of them killed -9 and restarted every ~0.15 s while rows keep
/// coming: every event arrives, each aggregate's events first arrive in insertion order, and the
/// duplicates stay within one batch per kill.
#[test]
fn three_pollers_under_kill_9_keep_aggregate_order_and_lose_nothing() {
    let pg = PgCluster::start();
    poll_outbox(&pg);
    let broker = Broker::start();
    broker.create_topic("p3.events", 1);
    const AGGS: usize = 40;
    const PER: usize = 200;
    const BATCH: usize = 50;
    insert_series(&pg, "p3", AGGS, 0, PER / 2);
    let batch = BATCH.to_string();
    let args = poll_args(&pg, &broker, &["--poll-batch", &batch, "--poll-interval", "100ms"]);
    let mut pollers: Vec<Outboxd> = (0..3).map(|_| spawn_polling(&args)).collect();
    let mut kills = 0usize;
    let inserter = {
        let url = pg.url();
        let psql = pg.bindir().join("psql");
        std::thread::spawn(move || {
            // A second series while the kills go on, a few rows at a time.
            let mut values = Vec::new();
            for i in PER / 2..PER {
                for a in 0..AGGS {
                    values.push(format!("('t', 'a{a}', 'p3', '{{\"agg\": \"a{a}\", \"n\": {i}}}')"));
                }
            }
            for chunk in values.chunks(40) {
                let sql = format!(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES {}",
                    chunk.join(", ")
                );
                let st = std::process::Command::new(&psql).arg(&url).arg("-qAtc").arg(&sql).status();
                assert!(st.is_ok_and(|s| s.success()), "insert failed");
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut round = 0usize;
    while Instant::now() < deadline && (!inserter.is_finished() || count(&pg, "published_at IS NULL") > 0) {
        std::thread::sleep(Duration::from_millis(150));
        if kills < 30 {
            let victim = round % 3;
            pollers[victim].kill9();
            kills += 1;
            pollers[victim] = Outboxd::spawn(&args);
        }
        round += 1;
    }
    inserter.join().unwrap();
    let logs = || pollers.iter().map(|p| p.log()).collect::<Vec<_>>().join("\n-----\n");
    assert!(
        wait_until(Duration::from_secs(60), || count(&pg, "published_at IS NULL") == 0),
        "rows left unpublished: {}\n{}",
        count(&pg, "published_at IS NULL"),
        logs()
    );
    let total = AGGS * PER;
    let got = broker.consume_all("p3.events", 1, total, Duration::from_secs(60));
    let (order, dups) = first_occurrences(&got);
    assert_complete_in_order(&order, AGGS, PER as u64, &logs());
    assert!(dups <= kills * BATCH, "{dups} duplicates after {kills} kills of batch {BATCH}\n{}", logs());
    eprintln!("{kills} kills, {dups} duplicates of {total} events");
    for p in &mut pollers {
        p.kill9();
    }
}

/// A record the sink refuses (larger than message.max.bytes) is a failed try: attempts count up
/// with a backoff, the aggregate's later events wait behind it, another aggregate flows, and after
/// --poll-max-attempts the copy goes to the dead-letter topic and the row is marked.
#[test]
fn refused_record_backs_off_then_dead_letters_while_its_aggregate_waits() {
    let pg = PgCluster::start();
    poll_outbox(&pg);
    let broker = Broker::start();
    let big = format!("{{\"agg\": \"x\", \"n\": 0, \"pad\": \"{}\"}}", "z".repeat(5000));
    let head = pg.insert_event("t", "x", Some("pd"), &big, None);
    let x1 = pg.insert_event("t", "x", Some("pd"), "{\"agg\": \"x\", \"n\": 1}", None);
    let y0 = pg.insert_event("t", "y", Some("pd"), "{\"agg\": \"y\", \"n\": 0}", None);
    let args = poll_args(
        &pg,
        &broker,
        &[
            "--kafka-property",
            "message.max.bytes=2000",
            "--poll-max-attempts",
            "3",
            "--poll-retry-backoff",
            "1s",
            "--poll-interval",
            "100ms",
        ],
    );
    let mut d = spawn_polling(&args);
    // y flows; x's head fails and holds x1 back.
    assert!(
        wait_until(Duration::from_secs(30), || count(&pg, &format!("event_id = '{y0}' AND published_at IS NOT NULL"))
            == 1),
        "{}",
        d.log()
    );
    assert!(wait_until(Duration::from_secs(30), || count(&pg, &format!("event_id = '{head}' AND attempts = 1")) == 1));
    let row = pg.psql(&format!(
        "SELECT published_at IS NULL, next_attempt_at > now(), error FROM outbox WHERE event_id = '{head}'"
    ));
    assert!(row.starts_with("t|t|") && row.contains("too_large"), "after one failed try: {row}");
    assert_eq!(count(&pg, &format!("event_id = '{x1}' AND published_at IS NULL")), 1, "x1 must wait for x's head");
    // Three tries with 1 s and 2 s between them, then the dead-letter copy.
    assert!(
        wait_until(Duration::from_secs(40), || count(
            &pg,
            &format!("event_id = '{head}' AND published_at IS NOT NULL")
        ) == 1),
        "{}",
        d.log()
    );
    let row = pg.psql(&format!("SELECT attempts, error FROM outbox WHERE event_id = '{head}'"));
    assert!(row.starts_with("3|dead-lettered to outboxd.dlq"), "{row}");
    let dlq = broker.consume_all("outboxd.dlq", 1, 1, Duration::from_secs(30));
    assert!(!dlq.is_empty() && dlq.iter().all(|r| r.header_str("id").as_deref() == Some(head.as_str())), "{dlq:?}");
    assert_eq!(dlq[0].header_str("outboxd.error").as_deref(), Some("too_large"));
    // Poll reads no WAL: the copy names the row by its seq, not by an LSN.
    let seq = pg.psql(&format!("SELECT seq FROM outbox WHERE event_id = '{head}'"));
    assert_eq!(dlq[0].header_str("outboxd.source.seq"), Some(seq), "{dlq:?}");
    assert_eq!(dlq[0].header_str("outboxd.source.lsn"), None, "{dlq:?}");
    // Only then x1, which was published on its first try.
    assert!(wait_until(Duration::from_secs(30), || count(
        &pg,
        &format!("event_id = '{x1}' AND published_at IS NOT NULL AND attempts = 0")
    ) == 1));
    let got = broker.consume_all("pd.events", 1, 2, Duration::from_secs(30));
    let ids: Vec<String> = got.iter().filter_map(|r| r.header_str("id")).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&x1) && ids.contains(&y0) && !ids.contains(&head), "{ids:?}");
    let body = d.log();
    assert!(body.contains("tried again after a backoff"), "{body}");
    d.stop_cleanly();
}

/// A broker that stops answering is not a refusal: the poller waits, nothing is marked, no try is
/// counted; after the broker comes back every event is delivered and marked with attempts = 0.
#[test]
fn broker_outage_stalls_without_burning_attempts() {
    let pg = PgCluster::start();
    poll_outbox(&pg);
    let broker = Broker::start();
    broker.create_topic("po.events", 1);
    let mut d = spawn_polling(&poll_args(&pg, &broker, &["--poll-interval", "100ms", "--poll-max-attempts", "1"]));
    insert_series(&pg, "po", 2, 0, 1);
    assert!(wait_until(Duration::from_secs(30), || count(&pg, "published_at IS NULL") == 0), "{}", d.log());
    broker.pause();
    insert_series(&pg, "po", 5, 1, 20);
    std::thread::sleep(Duration::from_secs(6));
    let stuck = count(&pg, "published_at IS NULL");
    let tried = count(&pg, "attempts > 0 OR error IS NOT NULL");
    broker.resume();
    assert_eq!(stuck, 100, "nothing may be marked while the broker is down\n{}", d.log());
    assert_eq!(tried, 0, "an outage must burn no attempts (--poll-max-attempts 1 would dead-letter)\n{}", d.log());
    assert!(wait_until(Duration::from_secs(60), || count(&pg, "published_at IS NULL") == 0), "{}", d.log());
    assert_eq!(count(&pg, "attempts > 0 OR error IS NOT NULL"), 0);
    let got = broker.consume_all("po.events", 1, 102, Duration::from_secs(30));
    let (order, _) = first_occurrences(&got);
    assert_eq!(order.values().map(Vec::len).sum::<usize>(), 102, "{}", d.log());
    assert!(broker.consume_all("outboxd.dlq", 1, 0, Duration::from_secs(2)).is_empty());
    d.stop_cleanly();
}

/// --retention deletes published rows older than it and keeps younger and unpublished ones;
/// --poll-delete deletes rows once acked instead of marking them.
#[test]
fn retention_and_poll_delete() {
    let pg = PgCluster::start();
    poll_outbox(&pg);
    let broker = Broker::start();
    insert_series(&pg, "pr", 3, 0, 10);
    pg.psql("UPDATE outbox SET published_at = now() - interval '2 hours' WHERE payload->>'n' < '5'");
    pg.psql("UPDATE outbox SET published_at = now() - interval '10 minutes' WHERE payload->>'n' = '5'");
    let mut d = spawn_polling(&poll_args(&pg, &broker, &["--retention", "1h", "--poll-interval", "100ms"]));
    let got = broker.consume_all("pr.events", 1, 12, Duration::from_secs(30));
    assert_eq!(got.len(), 12, "only the 12 unpublished rows are sent\n{}", d.log());
    assert!(wait_until(Duration::from_secs(20), || count(&pg, "true") == 15), "{}", d.log());
    assert_eq!(count(&pg, "published_at < now() - interval '1 hour'"), 0);
    assert_eq!(count(&pg, "published_at IS NULL"), 0);
    d.stop_cleanly();
    let mut d = spawn_polling(&poll_args(&pg, &broker, &["--poll-delete", "--poll-interval", "100ms"]));
    insert_series(&pg, "pr", 3, 10, 5);
    let got = broker.consume_all("pr.events", 1, 27, Duration::from_secs(30));
    assert_eq!(got.len(), 27, "{}", d.log());
    assert!(wait_until(Duration::from_secs(20), || count(&pg, "true") == 15), "acked rows are deleted\n{}", d.log());
    assert_eq!(count(&pg, "published_at IS NULL"), 0);
    d.stop_cleanly();
}
