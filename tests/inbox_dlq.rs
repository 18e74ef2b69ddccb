//! `outboxd inbox`'s bad records against real Kafka and PostgreSQL: a record whose `id` header is
//! empty, one whose id is not UTF-8, and one the inbox table refuses (a CHECK constraint the
//! consumer added) each go to the dead-letter topic with their reason, where `outboxd dlq list`
//! reads them; the good records around them are stored, and the offsets move past all of them.

mod common;

use std::time::Duration;

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "orders.events";

#[test]
fn bad_records_go_to_the_dead_letter_topic_with_their_reason_and_the_inbox_moves_on() {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    pg.psql("ALTER TABLE public.inbox ADD CONSTRAINT no_poison CHECK (event_type IS DISTINCT FROM 'poison')");
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    let producer: BaseProducer = broker.client_config().create().unwrap();
    let send = |id: Option<&[u8]>, ty: &str, n: usize| {
        let headers = OwnedHeaders::new()
            .insert(Header { key: "id", value: id })
            .insert(Header { key: "eventType", value: Some(ty) });
        let payload = format!("{{\"n\":{n}}}");
        producer.send(BaseRecord::to(TOPIC).key("k").payload(&payload).headers(headers)).unwrap();
    };
    for n in 0..12 {
        match n {
            3 => send(Some(b""), "order.paid", n),
            6 => send(Some(b"\xff\xfe"), "order.paid", n),
            9 => send(Some(b"e9"), "poison", n),
            _ => send(Some(format!("e{n}").as_bytes()), "order.paid", n),
        }
    }
    producer.flush(Duration::from_secs(10)).unwrap();
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
        "--dlq-topic",
        "inbox.dlq",
    ]));
    let stored = || pg.psql("SELECT coalesce(max(next_offset), 0) FROM public.inbox_offsets").trim().to_owned();
    assert!(wait_until(Duration::from_secs(60), || stored() == "12"), "offset {}:\n{}", stored(), inbox.log());
    let ns = pg.psql("SELECT string_agg(payload_json->>'n', ',' ORDER BY seq) FROM public.inbox");
    assert_eq!(ns.trim(), "0,1,2,4,5,7,8,10,11", "{}", inbox.log());

    let (code, out) = run_to_exit(
        &args(&["dlq", "list", "--json", "--kafka-brokers", &broker.bootstrap(), "--dlq-topic", "inbox.dlq"]),
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "{out}");
    let line = out.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON in {out}"));
    let j: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(j["total"], 3, "{j}");
    assert_eq!(j["by_reason"], serde_json::json!({"inbox_bad_event_id": 2, "inbox_refused": 1}), "{j}");
    for r in j["records"].as_array().unwrap() {
        assert_eq!(r["original_topic"], TOPIC, "{r}");
        assert!(r["source_table"].as_str().unwrap().starts_with("orders.events/0"), "{r}");
    }
    let refused = j["records"].as_array().unwrap().iter().find(|r| r["reason"] == "inbox_refused").unwrap();
    assert_eq!(refused["source_seq"], 9, "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("no_poison"), "{refused}");
    inbox.stop_cleanly();
}
