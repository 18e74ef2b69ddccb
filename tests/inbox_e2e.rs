//! The pattern end to end, two services: a producer's PostgreSQL with the outbox, `outboxd run
//! --delivery exactly-once` into Apache Kafka (three brokers), `outboxd inbox` into a consumer's PostgreSQL (a
//! second cluster), with kill -9 of both daemons, alternately, while the producer commits. Each
//! outbox row must appear once in the other database's inbox, under its own event id, and each
//! aggregate's rows in the order they were committed.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

const TOPIC: &str = "order.paid.events";
const KEYS: usize = 10;
const TXNS: usize = 300;

#[test]
fn outbox_to_inbox_with_kill_9_on_both_sides_puts_each_row_once_in_the_other_database() {
    let producer_db = PgCluster::start();
    producer_db.apply_all_sql();
    let consumer_db = PgCluster::start();
    // Three brokers (replication factor 3, min.insync.replicas 2: the cluster's defaults), as the
    // transaction log and the topic would have in production.
    let broker = Broker::options().brokers(3).prop("group.min.session.timeout.ms=1000").start();
    broker.create_topic(TOPIC, 3);
    let relay_args = daemon_args(&producer_db, &broker, &["--delivery", "exactly-once", "--max-in-flight", "200"]);
    let inbox_args = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &consumer_db.url(),
        "--topics",
        TOPIC,
        "--group",
        "billing",
        "--metrics-addr",
        "off",
        "--kafka-property",
        "session.timeout.ms=2000",
        "--kafka-property",
        "heartbeat.interval.ms=500",
    ]);
    let mut relay = Outboxd::spawn_streaming(&relay_args);
    let mut inbox = Outboxd::spawn(&inbox_args);

    // The producer: one transaction per step, one event per key, numbered by the step.
    let done = Arc::new(AtomicBool::new(false));
    let url = producer_db.url();
    let flag = done.clone();
    let writer = std::thread::spawn(move || {
        let mut client = postgres_client(&url);
        for t in 0..TXNS {
            let sql = format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 SELECT 'order', 'k' || g, 'order.paid', jsonb_build_object('n', {t}) \
                   FROM generate_series(0, {}) g ORDER BY g",
                KEYS - 1
            );
            client(&sql);
            std::thread::sleep(Duration::from_millis(60));
        }
        flag.store(true, Ordering::Relaxed);
    });

    let mut kills = 0;
    let mut pause = 700u64;
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(pause));
        pause = 500 + (pause * 7919 + 17) % 1500;
        if kills % 2 == 0 {
            relay.kill9();
            relay = Outboxd::spawn(&relay_args);
        } else {
            inbox.kill9();
            inbox = Outboxd::spawn(&inbox_args);
        }
        kills += 1;
    }
    writer.join().expect("the producer thread");
    eprintln!("{kills} kills, alternately outboxd run and outboxd inbox");
    assert!(kills >= 8, "only {kills} kills");

    let total = KEYS * TXNS;
    let count = || -> usize {
        if consumer_db.psql("SELECT to_regclass('public.inbox') IS NULL").trim() == "t" {
            return 0;
        }
        consumer_db.psql("SELECT count(*) FROM public.inbox").trim().parse().unwrap_or(0)
    };
    let logs = || format!("run:\n{}\ninbox:\n{}", relay.log(), inbox.log());
    assert!(wait_until(Duration::from_secs(90), || count() >= total), "{} of {total} rows\n{}", count(), logs());
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(count(), total, "more rows than outbox events\n{}", logs());
    let sent = producer_db.psql("SELECT event_id::text FROM outbox ORDER BY 1");
    let got = consumer_db.psql("SELECT event_id FROM public.inbox ORDER BY 1");
    assert!(sent == got, "the inbox's event ids are not the outbox's");
    let disorder = consumer_db.psql(
        "SELECT aggregate_key, n, rn FROM (SELECT aggregate_key, (payload_json->>'n')::int AS n, \
           row_number() OVER (PARTITION BY aggregate_key ORDER BY seq) - 1 AS rn FROM public.inbox) x \
          WHERE n <> rn LIMIT 5",
    );
    assert!(disorder.trim().is_empty(), "aggregates out of order: {disorder}");
    inbox.stop_cleanly();
    relay.stop_cleanly();
}

/// A blocking statement runner on its own connection (the producer thread has no runtime).
fn postgres_client(url: &str) -> impl FnMut(&str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (client, conn) = rt.block_on(tokio_postgres::connect(url, tokio_postgres::NoTls)).expect("connect");
    rt.spawn(conn);
    move |sql: &str| {
        rt.block_on(client.batch_execute(sql)).expect("insert into the outbox");
    }
}
