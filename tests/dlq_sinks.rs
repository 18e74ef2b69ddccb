//! `outboxd dlq list` and `outboxd dlq replay` for the sinks other than Kafka, against the real
//! NATS JetStream (127.0.0.1:4222), Redis (127.0.0.1:6379) and RabbitMQ (127.0.0.1:5672, the DLQ a
//! stream queue) services: one dead-letter copy is
//! written by `outboxd run` itself (the sink's own format), the others are made by the pipeline's
//! own [`DeadLetter::into_records`] (a plain copy, a chunked copy, a chunked copy missing a chunk)
//! and written in the sink's format. Each copy is listed once; replay sends each event exactly once
//! (a second run sends nothing) with its original key, payload (a chunked one joined byte for byte)
//! and headers minus `outboxd.*`; the copy missing a chunk is reported and nothing of it is sent;
//! the DLQ itself is left as it was. Every test uses names of its own.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use common::*;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use outboxd::ack::{Position, Source};
use outboxd::dlq::DeadLetter;
use outboxd::lsn::Lsn;
use outboxd::router::Record;

const RUN_TIMEOUT: Duration = Duration::from_secs(90);
const NATS_URL: &str = "nats://127.0.0.1:4222";
const REDIS_URL: &str = "redis://127.0.0.1:6379/0";

/// A dead letter as the pipeline makes it.
fn dead_letter(id: &str, topic: &str, key: &str, payload: Vec<u8>) -> DeadLetter {
    DeadLetter {
        event_id: Some(id.to_owned()),
        code: "schema",
        message: format!("payload of {id} breaks the contract"),
        original_topic: Some(topic.to_owned()),
        key: Some(Bytes::from(key.to_owned())),
        payload: Some(Bytes::from(payload)),
        headers: vec![("trace".into(), Bytes::from(format!("t-{id}")))],
        source: Source { position: Position::Lsn(Lsn(0x16B_3748)), table: Arc::from("public.outbox") },
    }
}

/// Bytes that show a misplaced or missing chunk.
fn big_payload(n: usize) -> Vec<u8> {
    let mut p = b"{\"blob\":\"".to_vec();
    p.extend((0..n).map(|i| b'a' + (i % 26) as u8));
    p.extend(b"\"}");
    p
}

/// The synthesised copies: A plain, B chunked, C chunked with chunk 1 left out.
fn synthesised(prefix: &str, dlq: &str) -> (Vec<Record>, Vec<u8>) {
    let b_payload = big_payload(30_000);
    let mut records =
        dead_letter("ev-a", &format!("{prefix}.orders.a"), "ka", b"{\"a\":1}".to_vec()).into_records(dlq, 1 << 20);
    let b = dead_letter("ev-b", &format!("{prefix}.orders.b"), "kb", b_payload.clone()).into_records(dlq, 4000);
    assert!(b.len() > 5, "B must be chunked");
    records.extend(b);
    let mut c = dead_letter("ev-c", &format!("{prefix}.orders.c"), "kc", big_payload(20_000)).into_records(dlq, 4000);
    c.remove(1);
    records.extend(c);
    (records, b_payload)
}

fn summary(out: &str) -> String {
    out.lines()
        .rfind(|l| l.starts_with("replayed ") && l.contains("already done"))
        .unwrap_or_else(|| panic!("no summary line in:\n{out}"))
        .to_owned()
}

fn json_line(out: &str) -> serde_json::Value {
    out.lines()
        .filter(|l| l.starts_with('{'))
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line in:\n{out}"))
}

fn dlq_cmd(sink: &[&str], dlq: &str, sub: &str, extra: &[&str]) -> (Option<i32>, String) {
    let mut a = vec!["dlq", sub];
    a.extend_from_slice(sink);
    a.extend(["--dlq-topic", dlq, "--read-timeout", "20s"]);
    a.extend_from_slice(extra);
    run_to_exit(&args(&a), RUN_TIMEOUT)
}

/// `list --json` found A, B and the run's copy, and C as incomplete.
fn check_list(out: &str, run_id: &str, run_reason: &str) {
    let j = json_line(out);
    assert_eq!(j["total"], 3, "{out}");
    let mut ids: Vec<String> =
        j["records"].as_array().unwrap().iter().map(|r| r["event_id"].as_str().unwrap().to_owned()).collect();
    ids.sort();
    let mut want = vec!["ev-a".to_owned(), "ev-b".to_owned(), run_id.to_owned()];
    want.sort();
    assert_eq!(ids, want, "{out}");
    assert_eq!(j["by_reason"]["schema"], 2, "{out}");
    assert_eq!(j["by_reason"][run_reason], 1, "{out}");
    let b = j["records"].as_array().unwrap().iter().find(|r| r["event_id"] == "ev-b").unwrap();
    assert_eq!(b["payload_bytes"], 30_011, "{out}");
    assert!(b["chunks"].as_u64().unwrap() > 5, "{out}");
    let inc = j["incomplete"].as_array().unwrap();
    assert_eq!(inc.len(), 1, "{out}");
    assert_eq!(inc[0]["event_id"], "ev-c", "{out}");
}

// ---------------------------------------------------------------------------------------------
// NATS
// ---------------------------------------------------------------------------------------------

/// A record as the NATS sink publishes it: headers, `key`, `Nats-Msg-Id`.
async fn nats_publish(js: &jetstream::Context, r: &Record, n: usize) {
    let mut h = async_nats::HeaderMap::new();
    for (k, v) in &r.headers {
        h.append(k.as_str(), std::str::from_utf8(v).unwrap());
    }
    if let Some(k) = &r.key {
        h.append("key", std::str::from_utf8(k).unwrap());
    }
    h.append("Nats-Msg-Id", format!("{}/dlq/{n}", r.event_id).as_str());
    let payload = Bytes::from(r.payload.clone().unwrap_or_default().to_vec());
    js.publish_with_headers(r.topic.clone(), h, payload).await.unwrap().await.expect("PubAck");
}

struct NatsMsg {
    subject: String,
    headers: HashMap<String, String>,
    payload: Vec<u8>,
}

async fn nats_messages(js: &jetstream::Context, stream: &str) -> Vec<NatsMsg> {
    let mut s = js.get_stream(stream).await.expect("stream");
    let last = s.info().await.unwrap().state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let m = s.get_raw_message(seq).await.expect("message");
        let headers = m.headers.iter().map(|(k, v)| (k.to_string(), v[0].to_string())).collect();
        out.push(NatsMsg { subject: m.subject.to_string(), headers, payload: m.payload.to_vec() });
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_dead_letters_are_listed_and_replayed_once_joined_and_never_in_part() {
    let client = async_nats::connect("127.0.0.1:4222").await.expect("NATS on 127.0.0.1:4222");
    let js = jetstream::new(client);
    let name = unique_name("obxdlq").replace('-', "_");
    let prefix = name.replace('_', "-");
    let dlq = format!("{prefix}.dlq");
    // p.stray is in no stream: the run's event is refused (no_stream) and dead-lettered.
    let subjects = vec![dlq.clone(), format!("{prefix}.orders.>")];
    js.create_stream(jetstream::stream::Config { name: name.clone(), subjects, ..Default::default() })
        .await
        .expect("create stream");

    let pg = PgCluster::start();
    pg.apply_all_sql();
    let replacement = format!("{prefix}.${{routedByValue}}");
    let run =
        ["--sink", "nats", "--nats-url", NATS_URL, "--route-topic-replacement", &replacement, "--dlq-topic", &dlq];
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &run));
    let stray = pg.insert_event("t", "ks", Some("stray"), "{\"n\": 2}", Some("{\"trace\": \"t-s\"}"));
    let stored = wait_until_async(Duration::from_secs(30), || async {
        js.get_stream(&name).await.map(|s| s.cached_info().state.messages >= 1).unwrap_or(false)
    })
    .await;
    assert!(stored, "no dead-letter copy\n{}", d.log());
    d.stop_cleanly();

    let (records, b_payload) = synthesised(&prefix, &dlq);
    for (n, r) in records.iter().enumerate() {
        nats_publish(&js, r, n).await;
    }
    let dlq_count = nats_messages(&js, &name).await.len();

    let sink = ["--sink", "nats", "--nats-url", NATS_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    check_list(&out, &stray, "no_stream");
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("{dlq}: 3 records in JetStream stream {name}")), "{out}");
    assert!(out.contains("1 incomplete chunk sets"), "{out}");

    let state = tempfile::tempdir().unwrap();
    let st = state.path().to_str().unwrap();
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st, "--dry-run"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(nats_messages(&js, &name).await.len(), dlq_count, "a dry run sends nothing");

    // The run's copy: its subject has no stream, so it goes elsewhere.
    let to = format!("{prefix}.orders.stray");
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st, "--event-id", &stray, "--to-topic", &to]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 1,"), "{out}");
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 2, skipped 0 (no destination), already done 1"), "{out}");
    assert!(out.contains("ev-c") && out.contains("missing 1"), "the incomplete set is reported:\n{out}");
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 0, skipped 0 (no destination), already done 3"), "{out}");

    let all = nats_messages(&js, &name).await;
    assert_eq!(all.iter().filter(|m| m.subject == dlq).count(), dlq_count, "the DLQ is left as it was");
    let sent: Vec<&NatsMsg> = all.iter().filter(|m| m.subject.starts_with(&format!("{prefix}.orders."))).collect();
    let subjects: Vec<&str> = sent.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(subjects.len(), 3, "each event exactly once, C never: {subjects:?}");
    for m in &sent {
        assert!(m.headers.keys().all(|k| !k.starts_with("outboxd.")), "{:?}", m.headers);
        assert_eq!(m.headers["Nats-Msg-Id"], m.headers["id"], "the event id dedupes a rerun");
    }
    let by = |s: &str| sent.iter().find(|m| m.subject == s).unwrap_or_else(|| panic!("{s} not sent: {subjects:?}"));
    let s = by(&to);
    assert_eq!(
        (s.headers["id"].as_str(), s.headers["key"].as_str(), s.headers["trace"].as_str()),
        (stray.as_str(), "ks", "t-s")
    );
    assert_eq!(s.payload, b"{\"n\": 2}");
    let a = by(&format!("{prefix}.orders.a"));
    assert_eq!((a.headers["key"].as_str(), a.headers["trace"].as_str()), ("ka", "t-ev-a"));
    assert_eq!(a.payload, b"{\"a\":1}");
    let b = by(&format!("{prefix}.orders.b"));
    assert_eq!(b.headers["key"], "kb");
    assert!(b.payload == b_payload, "the chunked copy is joined byte for byte");
    let _ = js.delete_stream(&name).await;
}

// ---------------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------------

fn redis() -> redis::Connection {
    redis::Client::open(REDIS_URL).and_then(|c| c.get_connection()).expect("Redis on 127.0.0.1:6379")
}

type Entry = (String, Vec<Vec<u8>>);

fn xrange(con: &mut redis::Connection, key: &str) -> Vec<Entry> {
    redis::cmd("XRANGE").arg(key).arg("-").arg("+").query(con).expect("XRANGE")
}

/// Deletes every key under the prefix when the test ends, pass or fail.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(mut con) = redis::Client::open(REDIS_URL).and_then(|c| c.get_connection()) {
            let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{}*", self.0)).query(&mut con).unwrap_or_default();
            for k in keys {
                let _: Result<i64, _> = redis::cmd("DEL").arg(k).query(&mut con);
            }
        }
    }
}

/// A record as the Redis sink XADDs it: key, payload, then the headers.
fn redis_xadd(con: &mut redis::Connection, r: &Record) {
    let mut c = redis::cmd("XADD");
    c.arg(&r.topic).arg("*");
    if let Some(k) = &r.key {
        c.arg("key").arg(k.as_ref());
    }
    if let Some(p) = &r.payload {
        c.arg("payload").arg(p.as_ref());
    }
    for (k, v) in &r.headers {
        c.arg(k).arg(v.as_ref());
    }
    let _: String = c.query(con).expect("XADD");
}

#[test]
fn redis_dead_letters_are_listed_and_replayed_once_joined_and_never_in_part() {
    let prefix = unique_name("outboxd-dlqtool");
    let _clean = Cleanup(prefix.clone());
    let mut con = redis();
    let dlq = format!("{prefix}.dlq");
    let blocked = format!("{prefix}.blocked");
    // The routed stream's key holds a string: XADD answers WRONGTYPE and the event is dead-lettered.
    let _: () = redis::cmd("SET").arg(&blocked).arg("not a stream").query(&mut con).unwrap();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let replacement = format!("{prefix}.${{routedByValue}}");
    let run = [
        "--sink",
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
    let bad = pg.insert_event("blocked", "kx", Some("e.v1"), "{\"n\": 2}", Some("{\"trace\": \"t-x\"}"));
    assert!(wait_until(Duration::from_secs(30), || xrange(&mut con, &dlq).len() == 1), "no copy\n{}", d.log());
    d.stop_cleanly();

    let (records, b_payload) = synthesised(&prefix, &dlq);
    for r in &records {
        redis_xadd(&mut con, r);
    }
    let dlq_before = xrange(&mut con, &dlq);

    let sink = ["--sink", "redis", "--redis-url", REDIS_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    check_list(&out, &bad, "wrong_type");
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("{dlq}: 3 records in the Redis stream")), "{out}");
    assert!(out.contains(&dlq_before[0].0), "positions are entry ids:\n{out}");

    let state = tempfile::tempdir().unwrap();
    let st = state.path().to_str().unwrap();
    // The blocked key still refuses: that event fails, is not recorded, and the run says so.
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st]);
    assert_ne!(code, Some(0), "a failed event fails the run:\n{out}");
    assert!(summary(&out).starts_with("replayed 2, skipped 0 (no destination), already done 0"), "{out}");
    assert!(out.contains("WRONGTYPE") && out.contains("failed 1"), "{out}");
    assert!(out.contains("ev-c") && out.contains("missing 1"), "the incomplete set is reported:\n{out}");
    let _: i64 = redis::cmd("DEL").arg(&blocked).query(&mut con).unwrap();
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 1, skipped 0 (no destination), already done 2"), "{out}");
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 0, skipped 0 (no destination), already done 3"), "{out}");

    assert_eq!(xrange(&mut con, &dlq), dlq_before, "the DLQ is left as it was");
    let one = |key: &str| {
        let e = xrange(&mut redis(), key);
        assert_eq!(e.len(), 1, "{key}: exactly once");
        e.into_iter().next().unwrap().1
    };
    let f = |v: &[&[u8]]| v.iter().map(|x| x.to_vec()).collect::<Vec<_>>();
    assert_eq!(one(&blocked), f(&[b"key", b"kx", b"payload", b"{\"n\": 2}", b"id", bad.as_bytes(), b"trace", b"t-x"]));
    assert_eq!(
        one(&format!("{prefix}.orders.a")),
        f(&[b"key", b"ka", b"payload", b"{\"a\":1}", b"id", b"ev-a", b"trace", b"t-ev-a"])
    );
    let b = one(&format!("{prefix}.orders.b"));
    assert_eq!(
        b,
        f(&[b"key", b"kb", b"payload", &b_payload, b"id", b"ev-b", b"trace", b"t-ev-b"]),
        "joined byte for byte"
    );
    assert!(xrange(&mut con, &format!("{prefix}.orders.c")).is_empty(), "an incomplete set is never sent in part");
}

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
        t.insert(k.as_str().into(), long(v));
    }
    if let Some(k) = &r.key {
        t.insert("key".into(), long(k));
    }
    t.insert("id".into(), long(r.event_id.as_bytes()));
    let p =
        BasicProperties::default().with_delivery_mode(2).with_message_id(r.event_id.as_str().into()).with_headers(t);
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
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st, "--event-id", &stray, "--to-topic", &to]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 1,"), "{out}");
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 2, skipped 0 (no destination), already done 1"), "{out}");
    assert!(out.contains("ev-c") && out.contains("missing 1"), "the incomplete set is reported:\n{out}");
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 0, skipped 0 (no destination), already done 3"), "{out}");

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
    assert_eq!(hook.delivered_ids(), [ok.clone(), after.clone()], "the receiver got the good events only");
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
    assert!(out.contains("--dlq-sink http") && out.contains("kafka, nats, redis or rabbitmq"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------------------------

#[test]
fn sinks_whose_dead_letters_cannot_be_read_are_refused_in_one_line() {
    for sink in ["http", "stdout", "null"] {
        let (code, out) = run_to_exit(&args(&["dlq", "list", "--sink", sink]), RUN_TIMEOUT);
        assert_ne!(code, Some(0), "{out}");
        assert!(out.contains(&format!("--sink {sink}")) && out.contains("kafka, nats, redis or rabbitmq"), "{out}");
    }
}

#[test]
fn an_unreachable_server_is_an_error_without_the_password() {
    let (code, out) = run_to_exit(
        &args(&["dlq", "list", "--sink", "redis", "--redis-url", "redis://app:hunter2@127.0.0.1:1/0"]),
        RUN_TIMEOUT,
    );
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("--redis-url") && !out.contains("hunter2"), "{out}");
    let (code, out) = run_to_exit(
        &args(&["dlq", "replay", "--sink", "nats", "--nats-url", "nats://app:hunter2@127.0.0.1:1"]),
        RUN_TIMEOUT,
    );
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("--nats-url") && !out.contains("hunter2"), "{out}");
}

/// Nothing to read is no error: no stream for the subject, no Redis key. A key that holds no
/// stream is a one-line error naming it.
#[test]
fn empty_dead_letter_places_are_empty_and_a_wrong_key_type_is_one_line() {
    let prefix = unique_name("outboxd-dlqempty");
    let _clean = Cleanup(prefix.clone());
    let dlq = format!("{prefix}.dlq");
    let state = tempfile::tempdir().unwrap();
    let st = state.path().to_str().unwrap();
    let nats = ["--sink", "nats", "--nats-url", NATS_URL];
    let (code, out) = dlq_cmd(&nats, &dlq, "list", &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("{dlq}: no JetStream stream holds this subject")), "{out}");
    let (code, out) = dlq_cmd(&nats, &dlq, "replay", &["--state-dir", st]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 0,"), "{out}");
    let redis_sink = ["--sink", "redis", "--redis-url", REDIS_URL];
    let (code, out) = dlq_cmd(&redis_sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!((json_line(&out)["exists"].clone(), json_line(&out)["total"].clone()), (false.into(), 0.into()));
    let _: () = redis::cmd("SET").arg(&dlq).arg("not a stream").query(&mut redis()).unwrap();
    let (code, out) = dlq_cmd(&redis_sink, &dlq, "list", &[]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains(&dlq) && out.contains("WRONGTYPE"), "{out}");
    let (code, out) = dlq_cmd(&nats, "bad subject", "list", &[]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("--dlq-topic \"bad subject\" is not a NATS subject"), "{out}");
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
