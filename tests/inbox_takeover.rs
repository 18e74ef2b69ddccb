//! `outboxd inbox --commit-kafka-offsets` after a takeover: when a rebalance hands this process
//! partitions, Kafka's copy of their offsets follows the offsets stored in PostgreSQL at once,
//! not only when a new batch is written there. Two inbox processes in one group, one killed with
//! SIGKILL, and no new traffic: the group's committed offsets in Kafka reach PostgreSQL's within
//! 15 s of the survivor's assignment (under a second when the box is quiet; the margin is for a
//! loaded CI box). That the copy is never ahead of PostgreSQL is by construction (it is only ever
//! set from offsets PostgreSQL committed) and is not checked here: with no traffic PostgreSQL's
//! offsets are the partitions' ends, which nothing could exceed.
//!
//! The first process runs with `--commit-kafka-offsets false`: it stands for an owner whose last
//! copy to Kafka was lost (a kill -9 inside its 200 ms between commits), deterministically, so
//! Kafka starts with no offsets at all and only the survivor's commits can set them.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "orders.takeover";
const GROUP: &str = "takeover";
const PARTS: i32 = 4;
const TOTAL: i64 = 400;

/// Per partition (0..PARTS): the next offset stored in PostgreSQL (`None`: none, or no table yet).
fn stored(pg: &PgCluster) -> Vec<Option<i64>> {
    pg.inbox_offsets(GROUP, TOPIC, PARTS)
}

fn assignments(d: &Outboxd) -> usize {
    d.log().matches("assigned; starting at the offsets stored in PostgreSQL").count()
}

#[test]
fn kafka_offsets_follow_postgresql_after_a_takeover_without_new_traffic() {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    let broker = Broker::start();
    broker.create_topic(TOPIC, PARTS);
    let bootstrap = broker.bootstrap();
    let inbox = |commit: &str| {
        Outboxd::spawn(&args(&[
            "inbox",
            "--kafka-brokers",
            &bootstrap,
            "--postgres-url",
            &pg.url(),
            "--topics",
            TOPIC,
            "--group",
            GROUP,
            "--metrics-addr",
            "off",
            "--commit-kafka-offsets",
            commit,
            "--kafka-property",
            "session.timeout.ms=6000",
            "--kafka-property",
            "heartbeat.interval.ms=500",
        ]))
    };
    // A alone, its copies to Kafka off, stores every record.
    let mut a = inbox("false");
    assert!(a.wait_for_log("assigned;", Duration::from_secs(60)), "{}", a.log());
    let producer: BaseProducer = broker.client_config().create().unwrap();
    for n in 0..TOTAL {
        let id = format!("e{n}");
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
        let (key, payload) = (format!("k{}", n % 32), format!("{{\"n\":{n}}}"));
        while producer.send(BaseRecord::to(TOPIC).key(&key).payload(&payload).headers(headers.clone())).is_err() {
            producer.poll(Duration::from_millis(10));
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let sum = |v: &[Option<i64>]| v.iter().map(|o| o.unwrap_or(0)).sum::<i64>();
    assert!(wait_until(Duration::from_secs(30), || sum(&stored(&pg)) == TOTAL), "{:?}\n{}", stored(&pg), a.log());
    let at_rest = stored(&pg);
    assert!(at_rest.iter().all(Option::is_some), "every partition has records: {at_rest:?}");
    assert_eq!(broker.committed_offsets(GROUP, TOPIC, PARTS), vec![None; PARTS as usize], "A committed nothing");

    // B joins (copies on), then A dies with SIGKILL: B takes A's partitions after the session
    // timeout. No record is produced from here on.
    let b = inbox("true");
    assert!(wait_until(Duration::from_secs(60), || assignments(&b) >= 1), "{}", b.log());
    assert!(wait_until(Duration::from_secs(30), || a.log().contains("revoked")), "no rebalance:\n{}", a.log());
    let before = assignments(&b);
    a.kill9();
    assert!(
        wait_until(Duration::from_secs(60), || assignments(&b) > before),
        "B never took A's partitions:\n{}",
        b.log()
    );
    let took = Instant::now();
    let deadline = took + Duration::from_secs(15);
    // Read until they match; the last read comes after the deadline, so a slow turn of this loop
    // never fails a commit that did arrive in time.
    let kafka = loop {
        let past = Instant::now() >= deadline;
        let kafka = broker.committed_offsets(GROUP, TOPIC, PARTS);
        if kafka == at_rest || past {
            break kafka;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(stored(&pg), at_rest, "no traffic: PostgreSQL's offsets stay");
    assert_eq!(
        kafka,
        at_rest,
        "15 s after B took every partition with no new traffic, Kafka's committed offsets (left) are not \
         PostgreSQL's (right):\n{}",
        b.log()
    );
    eprintln!("Kafka's offsets reached PostgreSQL's {:?} after the takeover", took.elapsed());
    let rows: i64 = pg.psql("SELECT count(DISTINCT event_id) FROM public.inbox").trim().parse().unwrap();
    assert_eq!(rows, TOTAL);
    let mut b = b;
    b.stop_cleanly();
}
