//! W3C trace context from the outbox (Debezium's `tracingspancontext` column, in either form) on
//! Kafka records against Apache Kafka: `traceparent`/`tracestate` headers, replacing those of the
//! headers column; a row whose column is not trace context still goes, without them. The other
//! sinks' tests (NATS, Redis, RabbitMQ, HTTP binary and batch) check the same headers through
//! [`with_trace_context`].

mod common;

use std::time::Duration;

use common::*;

#[test]
fn the_trace_context_column_becomes_traceparent_and_tracestate_headers() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    with_trace_context(&pg);
    let broker = Broker::start();
    let mut d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &["--status-interval", "500ms"]));
    let insert = |agg: &str, ctx: Option<&str>, headers: &str| {
        let (col, val) = match ctx {
            Some(c) => (", tracingspancontext", format!(", '{c}'")),
            None => ("", String::new()),
        };
        pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers{col}) \
             VALUES ('t', '{agg}', 'traced.v1', '{{}}', '{headers}'{val}) RETURNING event_id"
        ))
    };
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    // The column's default (Debezium's properties text), a bare traceparent that wins over the
    // headers column's, and a value that is not trace context.
    insert("a-1", None, "{}");
    insert("a-2", Some(other), &format!(r#"{{"traceparent": "{TRACEPARENT}", "k": "v"}}"#));
    insert("a-3", Some("not trace context"), "{}");
    let got = broker.consume_all("traced.v1.events", 1, 3, Duration::from_secs(60));
    assert_eq!(got.len(), 3, "every event goes, valid trace context or not:\n{}", d.log());
    let by_key = |k: &str| got.iter().find(|c| c.key_str().as_deref() == Some(k)).unwrap();
    assert_eq!(by_key("a-1").header_str("traceparent").as_deref(), Some(TRACEPARENT));
    assert_eq!(by_key("a-1").header_str("tracestate").as_deref(), Some(TRACESTATE));
    let a2 = by_key("a-2");
    let parents: Vec<&[u8]> =
        a2.headers.iter().filter(|(k, _)| k == "traceparent").map(|(_, v)| v.as_slice()).collect();
    assert_eq!(parents, [other.as_bytes()], "the column replaces the headers column's traceparent: {:?}", a2.headers);
    assert_eq!(a2.header_str("k").as_deref(), Some("v"));
    assert!(a2.header_str("tracestate").is_none());
    assert!(by_key("a-3").header_str("traceparent").is_none());
    let log = d.log();
    assert_eq!(log.matches("is not W3C trace context").count(), 1, "logged once per table:\n{log}");
    d.stop_cleanly();
}

/// `--otlp-endpoint` against an OTLP/HTTP receiver built on the official opentelemetry-proto
/// messages (`tools/otlp/receive.py`): one span per traced event, a child of the row's context,
/// whose id is the parent in the Kafka record's `traceparent`; a dead-lettered event's span says
/// so. Writer → outboxd → consumer is one trace.
#[test]
fn otlp_spans_sit_between_the_writer_and_the_consumer() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    with_trace_context(&pg);
    let broker = Broker::start();
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("spans.jsonl");
    let receiver = std::process::Command::new("bash")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/registry"))
        .arg("python")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/otlp/receive.py"))
        .args(["--port", &port.to_string(), "--out", out.to_str().unwrap()])
        .spawn()
        .expect("receive.py");
    let _receiver = KillOnDrop(receiver);
    assert!(wait_until(Duration::from_secs(30), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()));
    let endpoint = format!("http://127.0.0.1:{port}");
    // A record over the producer's limit is refused by the sink side and dead-lettered.
    let args = ["--otlp-endpoint", &endpoint, "--kafka-property", "message.max.bytes=4000"];
    let mut d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &args));
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'a-{i}', 'traced.v1', '{{}}') RETURNING event_id"
        )));
    }
    let bad = pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'b', 'traced.v1', '{{\"blob\": \"{}\"}}') RETURNING event_id",
        "x".repeat(6000)
    ));
    let got = broker.consume_all("traced.v1.events", 1, 3, Duration::from_secs(60));
    assert_eq!(got.len(), 3, "{}", d.log());
    let read = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&out).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    };
    assert!(wait_until(Duration::from_secs(30), || read().len() >= 4), "spans: {:?}\n{}", read(), d.log());
    let spans = read();
    let (trace, parent) = (&TRACEPARENT[3..35], &TRACEPARENT[36..52]);
    let span_of = |id: &str| {
        spans
            .iter()
            .find(|s| s["attributes"]["messaging.message.id"] == id)
            .unwrap_or_else(|| panic!("no span for {id}: {spans:?}"))
    };
    for c in &got {
        let id = c.header_str("id").unwrap();
        let s = span_of(&id);
        assert_eq!(s["trace_id"], trace, "{s}");
        assert_eq!(s["parent_span_id"], parent, "a child of the writer's span: {s}");
        let span_id = s["span_id"].as_str().unwrap();
        assert_eq!(
            c.header_str("traceparent"),
            Some(format!("00-{trace}-{span_id}-01")),
            "the consumer's parent is outboxd's span"
        );
        assert_eq!(s["attributes"]["outboxd.outcome"], "acked");
        assert_eq!(s["attributes"]["messaging.destination.name"], "traced.v1.events");
        assert!(s["attributes"]["outboxd.lsn"].as_str().is_some_and(|l| l.contains('/')), "{s}");
        assert_eq!(s["kind"], 4, "PRODUCER");
        assert_eq!(s["service"], "outboxd");
        assert!(s["end"].as_u64() >= s["start"].as_u64(), "{s}");
    }
    assert_eq!(span_of(&bad)["attributes"]["outboxd.outcome"], "dead_lettered");
    assert_eq!(spans.len(), 4, "one span per event: {spans:?}");
    d.stop_cleanly();
}

/// Ends the receiver however the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
