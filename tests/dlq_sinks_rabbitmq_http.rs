//! `outboxd dlq list` and `outboxd dlq replay` for RabbitMQ (127.0.0.1:5672; the DLQ a stream
//! queue) and for `--sink http --dlq-sink redis`, against the real services, with the same copies
//! and checks as `tests/dlq_sinks.rs` (`common::dlq_copies`): listed once, replayed exactly once,
//! chunked copies joined byte for byte and never sent in part, `outboxd.*` headers stripped, the
//! DLQ left as it was. Every test uses names of its own.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::dlq_copies::*;
use common::*;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use outboxd::router::Record;

// ---------------------------------------------------------------------------------------------
// RabbitMQ
// ---------------------------------------------------------------------------------------------

const RABBIT_URL: &str = "amqp://127.0.0.1:5672/%2f";

fn long(b: &[u8]) -> AMQPValue {
    AMQPValue::LongString(LongString::from(b.to_vec()))
}

/// A record as the RabbitMQ sink publishes it: headers, then `key` and `id`; persistent.
async fn rabbit_publish(chan: &Channel, r: &Record) {
    let mut t = FieldTable::default();
    for (k, v) in &r.headers {
        t.insert((&**k).into(), long(v));
    }
    if let Some(k) = &r.key {
        t.insert("key".into(), long(k));
    }
    t.insert("id".into(), long(r.event_id.as_bytes()));
    let p = BasicProperties::default().with_delivery_mode(2).with_message_id(r.event_id[..].into()).with_headers(t);
    let body = r.payload.clone().unwrap_or_default();
    let opts = BasicPublishOptions { mandatory: true, immediate: false };
    let c = chan.basic_publish("", &r.topic, opts, &body, p).await.unwrap().await.unwrap();
    assert!(matches!(c, Confirmation::Ack(None)), "{c:?}");
}

async fn rabbit_count(chan: &Channel, queue: &str) -> u32 {
    let opts = QueueDeclareOptions { passive: true, ..Default::default() };
    chan.queue_declare(queue, opts, FieldTable::default()).await.expect("queue").message_count()
}

/// The one message of a classic queue: its headers (as text) and body.
async fn rabbit_only(chan: &Channel, queue: &str) -> (HashMap<String, String>, Vec<u8>) {
    assert_eq!(rabbit_count(chan, queue).await, 1, "{queue}: exactly once");
    let m = chan.basic_get(queue, BasicGetOptions { no_ack: true }).await.unwrap().expect("a message");
    let headers = m
        .properties
        .headers()
        .clone()
        .unwrap_or_default()
        .inner()
        .iter()
        .map(|(k, v)| match v {
            AMQPValue::LongString(s) => (k.to_string(), String::from_utf8_lossy(s.as_bytes()).into_owned()),
            other => (k.to_string(), format!("{other:?}")),
        })
        .collect();
    (headers, m.delivery.data.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_dead_letters_in_a_stream_queue_are_listed_and_replayed_once_joined_and_never_in_part() {
    let conn = Connection::connect(RABBIT_URL, ConnectionProperties::default()).await.expect("RabbitMQ on 5672");
    let chan = conn.create_channel().await.unwrap();
    chan.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let prefix = unique_name("obxdlq");
    let dlq = format!("{prefix}.dlq");
    let mut stream_args = FieldTable::default();
    stream_args.insert("x-queue-type".into(), AMQPValue::LongString(LongString::from("stream")));
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    chan.queue_declare(&dlq, durable, stream_args).await.expect("stream queue");
    let dests: Vec<String> = ["a", "b", "c", "stray"].iter().map(|s| format!("{prefix}.orders.{s}")).collect();
    for q in &dests {
        chan.queue_declare(q, durable, FieldTable::default()).await.expect("queue");
    }

    let pg = PgCluster::start();
    pg.apply_all_sql();
    let replacement = format!("{prefix}.${{routedByValue}}");
    // p.stray has no queue: the broker returns the event (unroutable) and it is dead-lettered.
    let run = [
        "--sink",
        "rabbitmq",
        "--rabbitmq-url",
        RABBIT_URL,
        "--route-topic-replacement",
        &replacement,
        "--dlq-topic",
        &dlq,
    ];
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &run));
    let stray = pg.insert_event("t", "ks", Some("stray"), "{\"n\": 2}", Some("{\"trace\": \"t-s\"}"));
    let stored = wait_until_async(Duration::from_secs(30), || async { rabbit_count(&chan, &dlq).await >= 1 }).await;
    assert!(stored, "no dead-letter copy\n{}", d.log());
    d.stop_cleanly();

    let (records, b_payload) = synthesised(&prefix, &dlq);
    for r in &records {
        rabbit_publish(&chan, r).await;
    }
    let in_dlq = 1 + records.len() as u32;
    let all_in =
        wait_until_async(Duration::from_secs(10), || async { rabbit_count(&chan, &dlq).await == in_dlq }).await;
    assert!(all_in, "{} of {in_dlq} in the stream", rabbit_count(&chan, &dlq).await);

    let sink = ["--sink", "rabbitmq", "--rabbitmq-url", RABBIT_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    check_list(&out, &stray, "unroutable");
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("{dlq}: 3 records in RabbitMQ stream queue {dlq}")), "{out}");

    let state = tempfile::tempdir().unwrap();
    let st = state.path().to_str().unwrap();
    let to = format!("{prefix}.orders.stray");
    replay_in_three_runs(&sink, &dlq, st, &stray, &to);

    assert_eq!(rabbit_count(&chan, &dlq).await, in_dlq, "the DLQ is left as it was");
    assert_eq!(rabbit_count(&chan, &dests[2]).await, 0, "an incomplete set is never sent in part");
    let (h, body) = rabbit_only(&chan, &to).await;
    assert_eq!((h["id"].as_str(), h["key"].as_str(), h["trace"].as_str()), (stray.as_str(), "ks", "t-s"));
    assert_eq!(body, b"{\"n\": 2}");
    assert!(h.keys().all(|k| !k.starts_with("outboxd.")), "{h:?}");
    let (h, body) = rabbit_only(&chan, &dests[0]).await;
    assert_eq!(h.len(), 3, "id, key, trace: {h:?}");
    assert_eq!((h["id"].as_str(), h["key"].as_str(), h["trace"].as_str()), ("ev-a", "ka", "t-ev-a"));
    assert_eq!(body, b"{\"a\":1}");
    let (h, body) = rabbit_only(&chan, &dests[1]).await;
    assert_eq!(h.len(), 3, "id, key, trace: {h:?}");
    assert!(body == b_payload, "the chunked copy is joined byte for byte");
    for q in dests.iter().chain([&dlq]) {
        let _ = chan.queue_delete(q, QueueDeleteOptions::default()).await;
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP with --dlq-sink
// ---------------------------------------------------------------------------------------------

/// `--sink http --dlq-sink redis`: the receiver refuses one event (422), its dead-letter copy goes
/// to the Redis DLQ stream, not to the receiver, and `outboxd dlq` lists and replays it from there;
/// the events the receiver took are not in Redis.
#[test]
fn http_dead_letters_go_to_the_dlq_sink_and_are_listed_and_replayed_from_there() {
    let prefix = unique_name("outboxd-dlqhttp");
    let _clean = Cleanup(prefix.clone());
    let mut con = redis();
    let dlq = format!("{prefix}.dlq");
    let hook = webhook::Webhook::start(None);
    hook.respond_with(|r| if r.path.contains("refused") { 422 } else { 200 });
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let url = hook.url("/in/${topic}");
    let replacement = format!("{prefix}.${{routedByValue}}");
    let run = [
        "--sink",
        "http",
        "--http-url",
        &url,
        "--dlq-sink",
        "redis",
        "--redis-url",
        REDIS_URL,
        "--route-by-field",
        "aggregate_type",
        "--route-topic-replacement",
        &replacement,
        "--dlq-topic",
        &dlq,
    ];
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &run));
    let ok = pg.insert_event("fine", "k1", Some("e.v1"), "{\"n\": 1}", None);
    let bad = pg.insert_event("refused", "k2", Some("e.v1"), "{\"n\": 2}", Some("{\"trace\": \"t-2\"}"));
    let after = pg.insert_event("fine", "k3", Some("e.v1"), "{\"n\": 3}", None);
    assert!(wait_until(Duration::from_secs(30), || xrange(&mut con, &dlq).len() == 1), "no copy in Redis\n{}", d.log());
    assert!(hook.wait_delivered(2, Duration::from_secs(30)), "{}", d.log());
    assert!(
        pg.wait_slot_reaches_wal_end(Duration::from_secs(30)),
        "the copy's XADD must let the slot move\n{}",
        d.log()
    );
    d.stop_cleanly();
    // Different keys travel in different lanes: no order between them.
    let mut got = hook.delivered_ids();
    got.sort();
    let mut want = vec![ok.clone(), after.clone()];
    want.sort();
    assert_eq!(got, want, "the receiver got the good events only");
    let paths: Vec<String> = hook.requests().iter().map(|r| r.path.clone()).collect();
    assert!(
        paths.iter().all(|p| p.ends_with(".fine") || p.ends_with(".refused")),
        "no dead letter went to the receiver: {paths:?}"
    );

    let sink = ["--sink", "redis", "--redis-url", REDIS_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let j = json_line(&out);
    assert_eq!((j["total"].as_u64(), j["records"][0]["event_id"].as_str()), (Some(1), Some(bad.as_str())), "{out}");
    assert_eq!(j["records"][0]["reason"], "http_refused", "{out}");
    let state = tempfile::tempdir().unwrap();
    let to = format!("{prefix}.fixed");
    let replay = ["--state-dir", state.path().to_str().unwrap(), "--to-topic", &to];
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &replay);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 1,"), "{out}");
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &replay);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 0,"), "{out}");
    let e = xrange(&mut con, &to);
    assert_eq!(e.len(), 1, "exactly once");
    let f: HashMap<String, Vec<u8>> =
        e[0].1.chunks(2).map(|p| (String::from_utf8_lossy(&p[0]).into_owned(), p[1].clone())).collect();
    assert_eq!(
        (f["id"].as_slice(), f["key"].as_slice(), f["payload"].as_slice()),
        (bad.as_bytes(), &b"k2"[..], &b"{\"n\": 2}"[..])
    );
    assert_eq!(f["trace"], b"t-2");
    assert!(f.keys().all(|k| !k.starts_with("outboxd.")), "{f:?}");
}

#[test]
fn a_dlq_sink_that_cannot_be_read_back_is_refused() {
    let (code, out) = run_to_exit(
        &args(&["run", "--postgres-url", "postgres://u@127.0.0.1:1/db", "--sink", "kafka", "--dlq-sink", "http"]),
        RUN_TIMEOUT,
    );
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("--dlq-sink http") && out.contains("kafka, nats, redis, rabbitmq, sqs, sns or kinesis"),
        "{out}"
    );
}

/// A DLQ queue that is no stream queue is refused in one line, and nothing is taken from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_rabbitmq_dlq_queue_is_refused_and_keeps_its_copies() {
    let conn = Connection::connect(RABBIT_URL, ConnectionProperties::default()).await.expect("RabbitMQ on 5672");
    let chan = conn.create_channel().await.unwrap();
    chan.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let q = format!("{}.dlq", unique_name("obxdlq-classic"));
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    chan.queue_declare(&q, durable, FieldTable::default()).await.expect("queue");
    let (records, _) = synthesised("x", &q);
    for r in &records[..2] {
        rabbit_publish(&chan, r).await;
    }
    let sink = ["--sink", "rabbitmq", "--rabbitmq-url", RABBIT_URL];
    let (code, out) = dlq_cmd(&sink, &q, "list", &[]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("is not a stream queue") && out.contains("nothing was taken"), "{out}");
    let kept = wait_until_async(Duration::from_secs(10), || async { rabbit_count(&chan, &q).await == 2 }).await;
    assert!(kept, "{} of 2 copies left", rabbit_count(&chan, &q).await);
    let (code, out) = dlq_cmd(&sink, "no-such-queue-here", "list", &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("does not exist"), "{out}");
    let _ = chan.queue_delete(&q, QueueDeleteOptions::default()).await;
}
