//! `outboxd inbox` against real Kafka and PostgreSQL, for findings of the registry/offsets
//! review: Kafka's copy of the offsets (`--commit-kafka-offsets`) is never ahead of PostgreSQL's,
//! even when shutdown comes while a refused row's dead-letter copy waits for Kafka, or while two
//! processes of the group rebalance under load (and equals it at the end); and the
//! cleartext-credentials warning of an `http://` registry URL is logged by `inbox` as by `run`.

mod common;

use std::time::Duration;

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "orders.events";

/// The group's committed offset of partition 0 in Kafka (`None`: none).
fn committed(broker: &Broker, group: &str) -> Option<i64> {
    broker.committed_offsets(group, TOPIC, 1)[0]
}

#[test]
fn kafka_is_never_ahead_of_postgresql_when_shutdown_comes_during_a_dead_letter_copy() {
    shutdown_during_a_dead_letter_copy(&[]);
}

/// With `--batch-size 5` the refused row 9 is in the middle of the consumer's chunk (records 0-11
/// come in one): shutdown while its copy waits must drop the rest of the chunk (10 and 11), not
/// write them with a next offset of 12 past row 9, which is neither in the inbox nor dead-lettered.
#[test]
fn shutdown_during_a_dead_letter_copy_mid_chunk_stores_nothing_past_the_refused_row() {
    shutdown_during_a_dead_letter_copy(&["--batch-size", "5"]);
}

/// Records 0-11 (9 refused by a CHECK constraint, its dead-letter copy waiting for a topic that
/// cannot be created), then SIGTERM: PostgreSQL's next offset stays 9 and Kafka's is not ahead.
fn shutdown_during_a_dead_letter_copy(extra: &[&str]) {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    pg.psql("ALTER TABLE public.inbox ADD CONSTRAINT no_poison CHECK (event_type IS DISTINCT FROM 'poison')");
    // The dead-letter topic does not exist and cannot be created: its copy waits for Kafka.
    let broker = BrokerOptions::new().prop("auto.create.topics.enable=false").start();
    broker.create_topic(TOPIC, 1);
    let producer: BaseProducer = broker.client_config().create().unwrap();
    for n in 0..12 {
        let ty = if n == 9 { "poison" } else { "order.paid" };
        let id = format!("e{n}");
        let headers = OwnedHeaders::new()
            .insert(Header { key: "id", value: Some(id.as_str()) })
            .insert(Header { key: "eventType", value: Some(ty) });
        let payload = format!("{{\"n\":{n}}}");
        producer.send(BaseRecord::to(TOPIC).key("k").payload(&payload).headers(headers)).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let mut a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--topics",
        TOPIC,
        "--group",
        "review",
        "--metrics-addr",
        "off",
        "--dlq-topic",
        "missing.dlq",
        "--commit-kafka-offsets",
        "true",
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    let mut inbox = Outboxd::spawn(&a);
    let stored = || -> i64 {
        pg.psql("SELECT coalesce(max(next_offset), 0) FROM public.inbox_offsets").trim().parse().unwrap_or(0)
    };
    // Rows 0-8 are stored one by one (the batch was refused for row 9); row 9's copy waits.
    assert!(wait_until(Duration::from_secs(60), || stored() == 9), "offset {}:\n{}", stored(), inbox.log());
    std::thread::sleep(Duration::from_secs(3));
    // While it waits, Kafka has at most what PostgreSQL has.
    let during = committed(&broker, "review");
    assert!(during.is_none_or(|k| k <= stored()), "Kafka {during:?} ahead of PostgreSQL {}", stored());
    inbox.sigterm();
    assert!(inbox.wait_exit(Duration::from_secs(120)).is_some(), "no exit:\n{}", inbox.log());
    let (pg_next, kafka_next) = (stored(), committed(&broker, "review"));
    assert_eq!(pg_next, 9, "{}", inbox.log());
    assert!(
        kafka_next.is_none_or(|k| k <= pg_next),
        "Kafka's committed offset {kafka_next:?} is ahead of PostgreSQL's stored {pg_next}:\n{}",
        inbox.log()
    );
}

#[test]
fn inbox_warns_of_registry_credentials_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("registry.pw");
    std::fs::write(&pw, "hunter2\n").unwrap();
    let base = [
        "inbox",
        "--kafka-brokers",
        "127.0.0.1:9",
        "--postgres-url",
        "postgres://u@127.0.0.1:9/db",
        "--topics",
        TOPIC,
        "--metrics-addr",
        "off",
        "--value-format",
        "avro",
        "--schema-registry-user",
        "outboxd",
        "--schema-registry-password-file",
        pw.to_str().unwrap(),
        "--schema-registry-url",
    ];
    let mut a = args(&base);
    a.push("http://registry.example:8081".into());
    let mut inbox = Outboxd::spawn(&a);
    assert!(inbox.wait_for_log("clear text", Duration::from_secs(20)), "no warning:\n{}", inbox.log());
    let log = inbox.log();
    let warning = log.lines().find(|l| l.contains("clear text")).unwrap();
    assert!(warning.contains("--schema-registry-url") && warning.contains("https://"), "{warning}");
    assert!(!log.contains("hunter2"), "{log}");
    inbox.kill9();
    // https: no warning (by the time PostgreSQL is being waited for, it would have been logged).
    let mut a = args(&base);
    a.push("https://registry.example:8081".into());
    let mut inbox = Outboxd::spawn(&a);
    assert!(inbox.wait_for_log("PostgreSQL not reachable", Duration::from_secs(30)), "{}", inbox.log());
    assert!(!inbox.log().contains("clear text"), "{}", inbox.log());
    inbox.kill9();
}

/// Per partition of `TOPIC` (0..n): Kafka's committed offset for `group` (`None`: none).
fn committed_all(broker: &Broker, group: &str, n: i32) -> Vec<Option<i64>> {
    broker.committed_offsets(group, TOPIC, n)
}

/// Per partition (0..n): the next offset stored in PostgreSQL (`None`: none, or no table yet).
fn stored_all(pg: &PgCluster, group: &str, n: i32) -> Vec<Option<i64>> {
    pg.inbox_offsets(group, TOPIC, n)
}

#[test]
fn kafka_offsets_follow_postgresql_through_rebalances_never_ahead() {
    const PARTS: i32 = 4;
    const TOTAL: usize = 4000;
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    // Each batch's transaction takes 250 ms, so an offset sent to Kafka before PostgreSQL's commit
    // would be seen ahead by the checks below (every 200 ms).
    pg.psql(
        "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.25); RETURN NULL; END $$; \
         CREATE TRIGGER slow AFTER INSERT ON public.inbox FOR EACH STATEMENT EXECUTE FUNCTION slow()",
    );
    let broker = Broker::start();
    broker.create_topic(TOPIC, PARTS);
    let bootstrap = broker.bootstrap();
    // A steady producer, 4000 records over about 8 s, keys spread over the partitions.
    let producer: BaseProducer = broker.client_config().create().unwrap();
    let load = std::thread::spawn(move || {
        for n in 0..TOTAL {
            let id = format!("e{n}");
            let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
            let key = format!("k{}", n % 64);
            let payload = format!("{{\"n\":{n}}}");
            while producer.send(BaseRecord::to(TOPIC).key(&key).payload(&payload).headers(headers.clone())).is_err() {
                producer.poll(Duration::from_millis(10));
            }
            if n % 50 == 49 {
                producer.poll(Duration::ZERO);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        producer.flush(Duration::from_secs(30)).unwrap();
    });
    let inbox = || {
        Outboxd::spawn(&args(&[
            "inbox",
            "--kafka-brokers",
            &bootstrap,
            "--postgres-url",
            &pg.url(),
            "--topics",
            TOPIC,
            "--group",
            "lag",
            "--metrics-addr",
            "off",
            "--batch-size",
            "200",
            "--kafka-property",
            "session.timeout.ms=6000",
            "--kafka-property",
            "heartbeat.interval.ms=500",
        ]))
    };
    // Kafka read before PostgreSQL (which only grows): Kafka's must never be the higher.
    let mut checks = 0;
    let mut check = |when: &str| {
        let kafka = committed_all(&broker, "lag", PARTS);
        let stored = stored_all(&pg, "lag", PARTS);
        for (p, (k, s)) in kafka.iter().zip(&stored).enumerate() {
            if let Some(k) = k {
                assert!(s.is_some_and(|s| *k <= s), "{when}: partition {p}: Kafka {k} ahead of PostgreSQL {s:?}");
            }
        }
        checks += 1;
    };
    let mut a = inbox();
    let until = |secs: u64, check: &mut dyn FnMut(&str), when: &str| {
        let end = std::time::Instant::now() + Duration::from_secs(secs);
        while std::time::Instant::now() < end {
            check(when);
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    until(4, &mut check, "A alone");
    let mut b = inbox();
    until(4, &mut check, "B joining");
    // A loaded box may take longer than those 4 s to start B and rebalance: keep checking.
    let end = std::time::Instant::now() + Duration::from_secs(60);
    while !(a.log().contains("revoked") && b.log().contains("assigned")) && std::time::Instant::now() < end {
        check("B joining");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        a.log().contains("revoked") && b.log().contains("assigned"),
        "no rebalance:\nA:\n{}\nB:\n{}",
        a.log(),
        b.log()
    );
    a.stop_cleanly();
    until(3, &mut check, "A left");
    load.join().unwrap();
    let total = TOTAL as i64;
    let sum = |v: &[Option<i64>]| v.iter().map(|o| o.unwrap_or(0)).sum::<i64>();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sum(&stored_all(&pg, "lag", PARTS)) < total && std::time::Instant::now() < deadline {
        check("draining");
        std::thread::sleep(Duration::from_millis(200));
    }
    let stored = stored_all(&pg, "lag", PARTS);
    assert_eq!(sum(&stored), total, "{}", b.log());
    let rows: i64 = pg.psql("SELECT count(DISTINCT event_id) FROM public.inbox").trim().parse().unwrap();
    assert_eq!(rows, total, "{}", b.log());
    // At the end, Kafka has what PostgreSQL has (commits go out within 200 ms).
    assert!(
        wait_until(Duration::from_secs(10), || committed_all(&broker, "lag", PARTS) == stored),
        "Kafka {:?}, PostgreSQL {stored:?}:\n{}",
        committed_all(&broker, "lag", PARTS),
        b.log()
    );
    check("at the end");
    // The checks ran through the rebalance (about 11 s of windows at one check per 200 ms plus
    // the check's own time: 29 on a loaded CI box, so the bound only says they ran at all).
    assert!(checks >= 10, "only {checks} checks");
    b.stop_cleanly();
}
