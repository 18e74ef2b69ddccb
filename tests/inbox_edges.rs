//! `outboxd inbox` at its edges, against real Kafka and PostgreSQL:
//! * a stored offset outside the partition's log (beyond its end: the topic was created again;
//!   below its start: the retention deleted records the inbox never stored) stops the inbox with
//!   a line naming the partition, the offset, the log's range and the SQL that moves the offset,
//!   instead of librdkafka jumping to the end and records being skipped; that SQL then works;
//! * `--start-from latest` stores where each new partition starts before it is assigned, so a
//!   kill -9 before the first record arrives loses nothing produced after the assignment;
//! * a setup fault (the inbox's role loses INSERT on the table) stops the inbox with nothing
//!   dead-lettered and no offset moved; once the grant is back, every record arrives.

mod common;

use std::time::Duration;

use common::*;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const TOPIC: &str = "orders.events";

/// Send events `e{from}..e{to}` (key `k{i % 3}`, partition by key) and wait for the acks.
fn produce(broker: &Broker, from: usize, to: usize) {
    let producer: BaseProducer = broker.client_config().create().unwrap();
    for i in from..to {
        let id = format!("e{i}");
        let key = format!("k{}", i % 3);
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
        let payload = format!("{{\"i\":{i}}}");
        producer.send(BaseRecord::to(TOPIC).key(&key).payload(&payload).headers(headers)).unwrap();
    }
    producer.flush(Duration::from_secs(20)).unwrap();
}

fn inbox_args(url: &str, broker: &Broker, extra: &[&str]) -> Vec<String> {
    let mut a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        url,
        "--topics",
        TOPIC,
        "--metrics-addr",
        "off",
        "--dlq-topic",
        "inbox.dlq",
        "--kafka-property",
        "session.timeout.ms=6000",
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn num(pg: &PgCluster, sql: &str) -> i64 {
    pg.psql(sql).trim().parse().unwrap_or(-1)
}

fn rows(pg: &PgCluster) -> i64 {
    num(pg, "SELECT count(*) FROM public.inbox")
}

fn stored(pg: &PgCluster) -> i64 {
    num(pg, "SELECT coalesce(sum(next_offset), 0) FROM public.inbox_offsets")
}

/// Waits for the inbox to exit, asserts it failed, and returns its log.
fn fails(inbox: &mut Outboxd, what: &str) -> String {
    let status = inbox.wait_exit(Duration::from_secs(45));
    assert!(
        status.is_some_and(|s| !s.success()),
        "{what}: the inbox did not stop with an error ({status:?}):\n{}",
        inbox.log()
    );
    inbox.log()
}

#[test]
fn a_stored_offset_outside_the_log_stops_the_inbox_with_the_fix_instead_of_skipping_records() {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    produce(&broker, 0, 5);
    let mut inbox = Outboxd::spawn(&inbox_args(&pg.url(), &broker, &[]));
    assert!(wait_until(Duration::from_secs(40), || stored(&pg) == 5), "offset {}:\n{}", stored(&pg), inbox.log());
    inbox.stop_cleanly();

    // Beyond the end (as after the topic was deleted and created again): librdkafka's default
    // would start at the end, and the records below the stored offset would be dropped.
    pg.psql("UPDATE public.inbox_offsets SET next_offset = 1000");
    produce(&broker, 5, 8);
    let mut inbox = Outboxd::spawn(&inbox_args(&pg.url(), &broker, &[]));
    let log = fails(&mut inbox, "stored offset 1000, log 0..8");
    let line = log
        .lines()
        .find(|l| l.contains("UPDATE public.inbox_offsets"))
        .unwrap_or_else(|| panic!("no fix named:\n{log}"));
    for want in ["orders.events/0", "is 1000", "beyond the partition's end, 8", "inbox.md"] {
        assert!(line.contains(want), "{want:?} missing from: {line}");
    }
    assert_eq!(rows(&pg), 5, "rows were written:\n{log}");
    assert_eq!(stored(&pg), 1000, "the stored offset moved:\n{log}");

    // The SQL the line names moves the offset to the log's start; then every record arrives once.
    let start = line.find("UPDATE ").unwrap();
    let end = line[start..].find(" and start again").unwrap();
    let sql = &line[start..start + end];
    assert!(sql.contains("next_offset = 0 WHERE group_id = 'outboxd-inbox'"), "{sql}");
    pg.psql(sql);
    let mut inbox = Outboxd::spawn(&inbox_args(&pg.url(), &broker, &[]));
    assert!(wait_until(Duration::from_secs(40), || stored(&pg) == 8), "offset {}:\n{}", stored(&pg), inbox.log());
    assert_eq!(rows(&pg), 8);
    inbox.stop_cleanly();

    // Below the start (the retention deleted records 0..6 while the stored offset was 2).
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Offset(6)).unwrap();
    let cfg = broker.client_config();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let admin: AdminClient<DefaultClientContext> = cfg.create().unwrap();
            let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
            admin.delete_records(&tpl, &opts).await.expect("delete records")
        })
    })
    .join()
    .unwrap();
    pg.psql("UPDATE public.inbox_offsets SET next_offset = 2");
    let mut inbox = Outboxd::spawn(&inbox_args(&pg.url(), &broker, &[]));
    let log = fails(&mut inbox, "stored offset 2, log 6..8");
    for want in ["orders.events/0", "is 2", "below the first record Kafka still holds, 6", "SET next_offset = 6"] {
        assert!(log.contains(want), "{want:?} missing:\n{log}");
    }
    assert_eq!(stored(&pg), 2, "the stored offset moved:\n{log}");
}

#[test]
fn start_from_latest_stores_the_start_so_a_kill_before_the_first_record_loses_nothing() {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    let broker = Broker::options().prop("group.min.session.timeout.ms=1000").start();
    broker.create_topic(TOPIC, 2);
    produce(&broker, 0, 4);
    let latest = ["--start-from", "latest", "--kafka-property", "session.timeout.ms=2000"];
    let mut inbox = Outboxd::spawn(&inbox_args(&pg.url(), &broker, &latest));
    assert!(
        wait_until(Duration::from_secs(40), || inbox.log().contains("assigned;")),
        "no assignment:\n{}",
        inbox.log()
    );
    inbox.kill9();
    assert_eq!(stored(&pg), 4, "the start was not stored before the assignment:\n{}", inbox.log());
    // Produced after the assignment, while the inbox is down: all of it must arrive.
    produce(&broker, 4, 10);
    let mut inbox = Outboxd::spawn(&inbox_args(&pg.url(), &broker, &latest));
    assert!(wait_until(Duration::from_secs(40), || rows(&pg) == 6), "{} of 6 rows:\n{}", rows(&pg), inbox.log());
    let ids = pg.psql("SELECT string_agg(event_id, ',' ORDER BY (payload_json->>'i')::int) FROM public.inbox");
    assert_eq!(ids.trim(), "e4,e5,e6,e7,e8,e9");
    assert!(wait_until(Duration::from_secs(20), || stored(&pg) == 10), "offsets {}", stored(&pg));
    inbox.stop_cleanly();
}

#[test]
fn a_role_without_insert_stops_the_inbox_without_dead_letters_or_moved_offsets() {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    pg.psql("CREATE ROLE inboxer LOGIN PASSWORD 'inbox-pw'");
    pg.psql("GRANT USAGE ON SCHEMA public TO inboxer");
    pg.psql("GRANT SELECT, INSERT ON public.inbox TO inboxer");
    pg.psql("GRANT SELECT, INSERT, UPDATE ON public.inbox_offsets TO inboxer");
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    broker.create_topic("inbox.dlq", 1);
    let url = pg.url_for("inboxer", "inbox-pw");
    let mut inbox = Outboxd::spawn(&inbox_args(&url, &broker, &[]));
    produce(&broker, 0, 5);
    assert!(wait_until(Duration::from_secs(40), || stored(&pg) == 5), "offset {}:\n{}", stored(&pg), inbox.log());

    pg.psql("REVOKE INSERT ON public.inbox FROM inboxer");
    produce(&broker, 5, 10);
    let dead = || broker.end_offsets("inbox.dlq");
    // Before the fix every record went to the dead-letter topic and the inbox ran on.
    wait_until(Duration::from_secs(45), || !inbox.is_running() || dead() > 0);
    assert_eq!(dead(), 0, "records were dead-lettered:\n{}", inbox.log());
    let log = fails(&mut inbox, "INSERT revoked");
    let line = log.lines().find(|l| l.contains("42501")).unwrap_or_else(|| panic!("no 42501 line:\n{log}"));
    for want in ["permission denied", "no offset moved", "grants"] {
        assert!(line.contains(want), "{want:?} missing from: {line}");
    }
    assert_eq!(stored(&pg), 5, "the offset moved:\n{log}");
    assert_eq!(rows(&pg), 5);

    pg.psql("GRANT INSERT ON public.inbox TO inboxer");
    let mut inbox = Outboxd::spawn(&inbox_args(&url, &broker, &[]));
    assert!(wait_until(Duration::from_secs(40), || rows(&pg) == 10), "{} of 10 rows:\n{}", rows(&pg), inbox.log());
    assert!(wait_until(Duration::from_secs(20), || stored(&pg) == 10), "offset {}", stored(&pg));
    assert_eq!(dead(), 0);
    inbox.stop_cleanly();
}
