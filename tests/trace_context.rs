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
