//! `outboxd inbox` beside a schema registry and the group's offsets in Kafka, against real
//! services: two private PostgreSQL clusters (the producer's outbox, the consumer's inbox), Apache
//! Kafka, and Apicurio Registry (its Confluent-compatible API, `scripts/registry`).
//!
//! * Registry formats: `outboxd run --value-converter avro`, `protobuf` and `json-schema` encode
//!   outbox rows; `outboxd inbox --value-format …` decodes them: each inbox row's `payload_json`
//!   equals its outbox row's payload and its `payload` the Kafka value's bytes. Records that do
//!   not decode (not the wire format, an unknown schema id after `--schema-missing-timeout`, a
//!   corrupt body, a recursive value 5000 levels deep) are dead-lettered with their reasons, and
//!   the inbox moves on. While the registry is unreachable, the inbox
//!   waits (readiness 503) and dead-letters nothing; then everything arrives.
//! * Kafka's copy of the offsets: after a drain the group's committed offsets in Kafka are the
//!   log's end (lag 0 for lag tools); an offset set ahead by hand with kafka-consumer-groups is
//!   ignored: the records after PostgreSQL's offset arrive, each once. With
//!   `--commit-kafka-offsets false` the group has no offsets in Kafka.

mod common;

use std::time::Duration;

use common::netfault::FreezeProxy;
use common::registry::Registry;
use common::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const AVRO: &str = r#"{"type":"record","name":"OrderPlaced","namespace":"shop.v1","fields":[
  {"name":"order_id","type":"string"},
  {"name":"amount_cents","type":"long"},
  {"name":"items","type":{"type":"array","items":"string"}},
  {"name":"note","type":["null","string"],"default":null}]}"#;

const PROTO: &str = r#"syntax = "proto3";
package shop.v1;
message OrderPlaced { string order_id = 1; int64 amount_cents = 2; repeated string items = 3; }
"#;

const JSON_SCHEMA: &str = r#"{"$schema":"http://json-schema.org/draft-07/schema#","title":"OrderPlaced",
  "type":"object","properties":{"order_id":{"type":"string"},"amount_cents":{"type":"integer"}},
  "required":["order_id"]}"#;

/// Per format: run's converter (= inbox's --value-format), the event type (its topic is
/// `<type>.events`), the registry's schema type and text, and three payloads that fit.
const FORMATS: [(&str, &str, &str, &str, [&str; 3]); 3] = [
    (
        "avro",
        "avro.order",
        "AVRO",
        AVRO,
        [
            r#"{"order_id": "o-1", "amount_cents": 1234, "items": ["a", "b"], "note": "gift"}"#,
            r#"{"order_id": "o-2", "amount_cents": -5, "items": [], "note": null}"#,
            r#"{"order_id": "o-3", "amount_cents": 9007199254740993, "items": ["ü"], "note": "x"}"#,
        ],
    ),
    (
        "protobuf",
        "proto.order",
        "PROTOBUF",
        PROTO,
        [
            r#"{"order_id": "p-1", "amount_cents": 1234, "items": ["a", "b"]}"#,
            r#"{"order_id": "p-2", "amount_cents": 0, "items": []}"#,
            r#"{"order_id": "p-3", "amount_cents": -9007199254740993, "items": ["ü"]}"#,
        ],
    ),
    (
        "json-schema",
        "json.order",
        "JSON",
        JSON_SCHEMA,
        [
            r#"{"order_id": "j-1", "amount_cents": 1}"#,
            r#"{"order_id": "j-2", "nested": {"a": [1, 2.5, null]}}"#,
            r#"{"order_id": "j-3", "amount_cents": 3, "text": "ü"}"#,
        ],
    ),
];

fn inbox_args(db: &PgCluster, broker: &Broker, format: &str, topic: &str, url: &str, extra: &[&str]) -> Vec<String> {
    let table = format!("inbox_{}", format.replace('-', "_"));
    let group = format!("g_{table}");
    let mut a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &db.url(),
        "--topics",
        topic,
        "--inbox-table",
        &table,
        "--group",
        &group,
        "--value-format",
        format,
        "--schema-registry-url",
        url,
        "--dlq-topic",
        "inbox.dlq",
        "--reconnect-max-backoff",
        "1s",
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn exists(db: &PgCluster, table: &str) -> bool {
    db.psql(&format!("SELECT to_regclass('{table}') IS NOT NULL")) == "t"
}

/// Rows of `table`, or 0 while it is not there.
fn rows(db: &PgCluster, table: &str) -> usize {
    if !exists(db, table) {
        return 0;
    }
    db.psql(&format!("SELECT count(*) FROM {table}")).trim().parse().unwrap_or(0)
}

/// The sum of `table`'s stored next offsets (0 while none is stored).
fn stored(db: &PgCluster, table: &str) -> i64 {
    if !exists(db, &format!("{table}_offsets")) {
        return 0;
    }
    db.psql(&format!("SELECT coalesce(sum(next_offset), 0) FROM {table}_offsets")).trim().parse().unwrap_or(0)
}

fn producer(broker: &Broker) -> BaseProducer {
    broker.client_config().create().expect("producer")
}

fn send(p: &BaseProducer, topic: &str, partition: Option<i32>, id: &str, value: &[u8]) {
    let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id) });
    let mut rec = BaseRecord::<str, [u8]>::to(topic).key(id).payload(value).headers(headers);
    if let Some(p) = partition {
        rec = rec.partition(p);
    }
    p.send(rec).map_err(|(e, _)| e).expect("send");
}

#[test]
fn run_encodes_and_inbox_decodes_avro_protobuf_and_json_schema_bad_records_dead_lettered() {
    let outbox_db = PgCluster::start();
    outbox_db.apply_all_sql();
    let inbox_db = PgCluster::start();
    let broker = Broker::start();
    let reg = Registry::start();
    broker.create_topic("inbox.dlq", 1);
    let mut ids = Vec::new();
    for (format, event_type, kind, schema, payloads) in FORMATS {
        let topic = format!("{event_type}.events");
        broker.create_topic(&topic, 1);
        ids.push(reg.register(&format!("{topic}-value"), kind, schema));
        // One `outboxd run` per format (the converter is the process's), on the same slot.
        let mut run = Outboxd::spawn_streaming(&daemon_args(
            &outbox_db,
            &broker,
            &["--status-interval", "500ms", "--value-converter", format, "--schema-registry-url", &reg.url],
        ));
        for p in payloads {
            outbox_db.psql(&format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('shop', 'o', '{event_type}', '{p}')"
            ));
        }
        assert!(wait_until(Duration::from_secs(60), || broker.end_offsets(&topic) == 3), "{}", run.log());
        run.stop_cleanly();
    }
    // Three records no registry reader can take, after the good ones of the Avro topic: not the
    // wire format, a schema id the registry does not know, a body cut short.
    let unknown_id = ids.iter().max().unwrap() + 1000;
    let mut unknown = vec![0u8];
    unknown.extend_from_slice(&unknown_id.to_be_bytes());
    unknown.extend_from_slice(&[0x06, b'o', b'-', b'9', 0x02, 0x00, 0x00]);
    let mut cut = vec![0u8];
    cut.extend_from_slice(&ids[0].to_be_bytes());
    cut.extend_from_slice(&[0x06, b'o', b'-']);
    // A linked list 5000 levels deep (one byte a level) of a recursive schema: a bad record, not a
    // stack overflow of the process.
    let list = reg.register(
        "nodes-value",
        "AVRO",
        r#"{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"]}]}"#,
    );
    let mut deep = vec![0u8];
    deep.extend_from_slice(&list.to_be_bytes());
    deep.extend(std::iter::repeat_n(2u8, 5000));
    deep.push(0);
    let p = producer(&broker);
    send(&p, "avro.order.events", None, "bad-magic", br#"{"order_id": "o-9"}"#);
    send(&p, "avro.order.events", None, "bad-id", &unknown);
    send(&p, "avro.order.events", None, "bad-body", &cut);
    send(&p, "avro.order.events", None, "bad-deep", &deep);
    p.flush(Duration::from_secs(10)).expect("flush");

    // The Avro inbox starts with the registry unreachable: it waits, 503, dead-letters nothing.
    let proxy = FreezeProxy::start(reg.port);
    proxy.set_target(free_port());
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let mut avro = Outboxd::spawn(&inbox_args(
        &inbox_db,
        &broker,
        "avro",
        "avro.order.events",
        &reg.url_via(proxy.port),
        &["--metrics-addr", &addr, "--schema-missing-timeout", "5s"],
    ));
    assert!(wait_until(Duration::from_secs(40), || avro.log().contains("waiting for the registry")), "{}", avro.log());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(http_get(metrics, "/readyz").map(|(s, _)| s), Some(503), "{}", avro.log());
    assert_eq!(http_get(metrics, "/healthz").map(|(s, _)| s), Some(200), "a registry outage is not a wedge");
    assert_eq!(rows(&inbox_db, "inbox_avro"), 0, "{}", avro.log());
    assert_eq!(broker.end_offsets("inbox.dlq"), 0, "dead-lettered during the registry outage:\n{}", avro.log());
    proxy.set_target(reg.port);

    let mut others: Vec<Outboxd> = FORMATS[1..]
        .iter()
        .map(|(format, event_type, ..)| {
            Outboxd::spawn(&inbox_args(
                &inbox_db,
                &broker,
                format,
                &format!("{event_type}.events"),
                &reg.url,
                &["--metrics-addr", "off"],
            ))
        })
        .collect();
    for ((format, event_type, .., payloads), want) in FORMATS.iter().zip([7, 3, 3]) {
        let table = format!("inbox_{}", format.replace('-', "_"));
        let logs =
            || format!("avro:\n{}\n{}", avro.log(), others.iter().map(|o| o.log()).collect::<Vec<_>>().join("\n"));
        assert!(wait_until(Duration::from_secs(60), || stored(&inbox_db, &table) == want), "{table}\n{}", logs());
        assert_eq!(rows(&inbox_db, &table), 3, "{table}\n{}", logs());
        // payload_json equals the outbox row's payload (jsonb equality), under the same event id.
        let sent = outbox_db.psql(&format!(
            "SELECT event_id::text || ' ' || payload::text FROM outbox WHERE event_type = '{event_type}' ORDER BY 1"
        ));
        let got = inbox_db
            .psql(&format!("SELECT event_id || ' ' || coalesce(payload_json::text, 'NULL') FROM {table} ORDER BY 1"));
        assert_eq!(got, sent, "{format}: decoded payloads differ from the outbox's {payloads:?}");
        // payload keeps the Kafka value's bytes.
        let topic = format!("{event_type}.events");
        let kafka: Vec<String> = broker
            .consume_all(&topic, 1, 3, Duration::from_secs(30))
            .iter()
            .take(3)
            .map(|c| format!("{} {}", c.offset, hex(c.payload.as_deref().unwrap_or_default())))
            .collect();
        let bytes =
            inbox_db.psql(&format!("SELECT kafka_offset || ' ' || encode(payload, 'hex') FROM {table} ORDER BY 1"));
        assert_eq!(bytes.lines().map(str::to_owned).collect::<Vec<_>>(), kafka, "{format}: payload bytes");
    }

    let dead = broker.consume_all("inbox.dlq", 1, 4, Duration::from_secs(30));
    let mut reasons: Vec<(String, String)> = dead
        .iter()
        .map(|c| (c.header_str("id").unwrap_or_default(), c.header_str("outboxd.error").unwrap_or_default()))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            ("bad-body".to_owned(), "inbox_undecodable".to_owned()),
            ("bad-deep".into(), "inbox_undecodable".into()),
            ("bad-id".into(), "inbox_schema_missing".into()),
            ("bad-magic".into(), "inbox_not_wire_format".into())
        ],
        "{}",
        avro.log()
    );
    let message = |id: &str| {
        dead.iter()
            .find(|c| c.header_str("id").as_deref() == Some(id))
            .and_then(|c| c.header_str("outboxd.error.message"))
            .unwrap_or_default()
    };
    assert!(message("bad-id").contains(&format!("schema id {unknown_id}")), "{}", message("bad-id"));
    // The unknown id held the inbox for --schema-missing-timeout first (it may be registered late).
    let waited = format!("schema id {unknown_id} is not in the registry");
    assert!(
        avro.log().lines().any(|l| l.contains(&waited) && l.contains("--schema-missing-timeout")),
        "{}",
        avro.log()
    );
    assert!(message("bad-magic").contains("avro.order.events/0/3"), "{}", message("bad-magic"));
    assert!(message("bad-deep").contains("deeper than 128"), "{}", message("bad-deep"));
    assert!(avro.is_running(), "{}", avro.log());
    avro.stop_cleanly();
    for o in &mut others {
        o.stop_cleanly();
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The group's committed offsets in Kafka for `topic`'s `partitions` (`None`: no offset).
fn committed(broker: &Broker, group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
    broker.committed_offsets(group, topic, partitions)
}

fn high(broker: &Broker, topic: &str, partitions: i32) -> Vec<Option<i64>> {
    let c: BaseConsumer = broker.client_config().create().expect("consumer");
    (0..partitions).map(|p| Some(c.fetch_watermarks(topic, p, Duration::from_secs(5)).expect("watermarks").1)).collect()
}

#[test]
fn kafka_gets_the_stored_offsets_for_lag_tools_and_an_offset_ahead_there_is_ignored() {
    const TOPIC: &str = "lag.events";
    let db = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2);
    let p = producer(&broker);
    let batch = |from: usize, to: usize| {
        for i in from..to {
            send(&p, TOPIC, Some((i % 2) as i32), &format!("e{i}"), format!(r#"{{"i": {i}}}"#).as_bytes());
        }
        p.flush(Duration::from_secs(10)).expect("flush");
    };
    batch(0, 40);
    let inbox = |group: &str, extra: &[&str]| {
        let mut a = args(&[
            "inbox",
            "--kafka-brokers",
            &broker.bootstrap(),
            "--postgres-url",
            &db.url(),
            "--topics",
            TOPIC,
            "--group",
            group,
            "--inbox-table",
            &format!("inbox_{group}"),
            "--metrics-addr",
            "off",
        ]);
        a.extend(extra.iter().map(|s| s.to_string()));
        Outboxd::spawn(&a)
    };
    let mut on = inbox("lagged", &[]);
    let mut off = inbox("silent", &["--commit-kafka-offsets", "false"]);
    let logs = |a: &Outboxd, b: &Outboxd| format!("{}\n{}", a.log(), b.log());
    assert!(
        wait_until(Duration::from_secs(60), || stored(&db, "inbox_lagged") == 40 && stored(&db, "inbox_silent") == 40),
        "{}",
        logs(&on, &off)
    );
    // Lag 0 for a lag tool: the group's offsets in Kafka are the log's end, once committed.
    let end = high(&broker, TOPIC, 2);
    assert!(
        wait_until(Duration::from_secs(10), || committed(&broker, "lagged", TOPIC, 2) == end),
        "Kafka has {:?} for the group, the log ends at {end:?}\n{}",
        committed(&broker, "lagged", TOPIC, 2),
        on.log()
    );
    let (ok, described) = broker.tool(
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        &["--bootstrap-server", &broker.admin_bootstrap(), "--describe", "--group", "lagged"],
    );
    assert!(ok, "{described}");
    let lags: Vec<&str> =
        described.lines().filter(|l| l.contains(TOPIC)).filter_map(|l| l.split_whitespace().nth(5)).collect();
    assert_eq!(lags, ["0", "0"], "kafka-consumer-groups --describe:\n{described}");
    assert_eq!(committed(&broker, "silent", TOPIC, 2), [None, None], "--commit-kafka-offsets false commits nothing");
    off.stop_cleanly();
    on.stop_cleanly();

    // With the inbox stopped, 20 more records, and the group's Kafka offsets set by hand to the
    // new end: 10 per partition ahead of what PostgreSQL stored.
    batch(40, 60);
    let (ok, out) = broker.tool(
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        &[
            "--bootstrap-server",
            &broker.admin_bootstrap(),
            "--group",
            "lagged",
            "--topic",
            TOPIC,
            "--reset-offsets",
            "--to-latest",
            "--execute",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(committed(&broker, "lagged", TOPIC, 2), [Some(30), Some(30)], "{out}");
    assert_eq!(stored(&db, "inbox_lagged"), 40);

    let mut again = inbox("lagged", &[]);
    assert!(wait_until(Duration::from_secs(60), || stored(&db, "inbox_lagged") == 60), "{}", again.log());
    let ids = db.psql("SELECT count(*), count(DISTINCT event_id), min((payload_json->>'i')::int), max((payload_json->>'i')::int) FROM inbox_lagged");
    assert_eq!(ids.trim(), "60|60|0|59", "each record once, none skipped at Kafka's offset\n{}", again.log());
    again.stop_cleanly();
}
