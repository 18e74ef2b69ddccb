//! `outboxd inbox`'s chores (the backlog gauges, `--retain`) on a role with a single connection
//! slot (`CONNECTION LIMIT 1`), where each process needs two. The writer must keep working: after
//! a PostgreSQL restart the chores, which reconnect every 5 s while the inbox is idle, must give
//! the slot up once the writer needs it (before, they kept it and the writer got 53300 for good);
//! and the chores' own failures must become a warning after a minute (before: a debug line, so
//! `--retain` and the gauges stopped silently).

mod common;

use std::time::{Duration, Instant};

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "chores.events";

fn produce(broker: &Broker, from: usize, to: usize) {
    let producer: BaseProducer = broker.client_config().create().expect("producer");
    for i in from..to {
        let (id, key) = (format!("e{i}"), format!("k{}", i % 3));
        let payload = serde_json::json!({ "i": i }).to_string();
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
        let mut rec = BaseRecord::to(TOPIC).key(&key).payload(&payload).headers(headers);
        while let Err((_, r)) = producer.send(rec) {
            producer.poll(Duration::from_millis(10));
            rec = r;
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

fn rows(pg: &PgCluster) -> usize {
    pg.psql("SELECT count(DISTINCT event_id) FROM public.inbox").trim().parse().unwrap_or(0)
}

#[test]
fn with_one_connection_slot_the_writer_gets_it_back_after_a_restart_and_the_chores_warn() {
    let mut pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    pg.psql("CREATE ROLE inbox_one LOGIN PASSWORD 'one-pw' CONNECTION LIMIT 1");
    pg.psql("GRANT USAGE ON SCHEMA public TO inbox_one");
    pg.psql("GRANT SELECT, INSERT, DELETE ON public.inbox TO inbox_one");
    pg.psql("GRANT SELECT, INSERT, UPDATE ON public.inbox_offsets TO inbox_one");
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    let port = free_port();
    let mut inbox = Outboxd::spawn(&args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url_for("inbox_one", "one-pw"),
        "--topics",
        TOPIC,
        // The gauges are wanted: the chores run (every 5 s).
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--reconnect-max-backoff",
        "2s",
    ]));
    produce(&broker, 0, 10);
    assert!(wait_until(Duration::from_secs(60), || rows(&pg) == 10), "{} of 10 rows:\n{}", rows(&pg), inbox.log());

    // A restart while the inbox is idle: the writer does not notice it; the chores reconnect at
    // their next turn and may take the only slot.
    pg.restart();
    std::thread::sleep(Duration::from_secs(12));
    produce(&broker, 10, 20);
    assert!(
        wait_until(Duration::from_secs(60), || rows(&pg) == 20),
        "{} of 20 rows a minute after the restart: the writer never got the connection slot back:\n{}",
        rows(&pg),
        inbox.log()
    );
    let slot = Instant::now();

    // The writer holds the slot now, so the chores are refused (53300): a warning after a minute
    // of it, naming what stops and the fix.
    let warned = "the inbox chores have failed for";
    assert!(
        wait_until(Duration::from_secs(100), || inbox.log().contains(warned)),
        "no warning {:?} after the chores were refused:\n{}",
        slot.elapsed(),
        inbox.log()
    );
    let log = inbox.log();
    let line = log.lines().find(|l| l.contains(warned)).unwrap();
    for want in ["WARN", "53300", "--retain", "outboxd_inbox_unprocessed_rows", "CONNECTION LIMIT"] {
        assert!(line.contains(want), "{want:?} missing from: {line}");
    }
    assert_eq!(rows(&pg), 20);
    inbox.stop_cleanly();
}

#[test]
fn without_metrics_or_retain_the_chores_make_no_connection() {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    let mut inbox = Outboxd::spawn(&args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--topics",
        TOPIC,
        "--metrics-addr",
        "off",
    ]));
    produce(&broker, 0, 5);
    assert!(wait_until(Duration::from_secs(60), || rows(&pg) == 5), "{} of 5 rows:\n{}", rows(&pg), inbox.log());
    // The backlog was read every 5 s on a second connection: well past its first turn now.
    std::thread::sleep(Duration::from_secs(8));
    let conns = pg.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    );
    assert_eq!(conns.trim(), "1", "only the writer's connection:\n{}", inbox.log());
    inbox.stop_cleanly();
}
