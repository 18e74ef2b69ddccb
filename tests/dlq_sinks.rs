//! `outboxd dlq list` and `outboxd dlq replay` for NATS JetStream (127.0.0.1:4222) and Redis
//! (127.0.0.1:6379), the real services: one dead-letter copy is written by `outboxd run` itself
//! (the sink's own format), the others are made by the pipeline's own `DeadLetter::into_records`
//! (a plain copy, a chunked copy, a chunked copy missing a chunk; `common::dlq_copies`) and written
//! in the sink's format. Each copy is listed once; replay sends each event exactly once (a second
//! run sends nothing) with its original key, payload (a chunked one joined byte for byte) and
//! headers minus `outboxd.*`; the copy missing a chunk is reported and nothing of it is sent; the
//! DLQ itself is left as it was. Also: the sinks the tool refuses, empty DLQs, and errors without
//! passwords. Every test uses names of its own.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use common::dlq_copies::*;
use common::*;
use outboxd::router::Record;

// ---------------------------------------------------------------------------------------------
// NATS
// ---------------------------------------------------------------------------------------------

/// A record as the NATS sink publishes it: headers, `key`, `Nats-Msg-Id`.
async fn nats_publish(js: &jetstream::Context, r: &Record, n: usize) {
    let mut h = async_nats::HeaderMap::new();
    for (k, v) in &r.headers {
        h.append(&**k, std::str::from_utf8(v).unwrap());
    }
    if let Some(k) = &r.key {
        h.append("key", std::str::from_utf8(k).unwrap());
    }
    h.append("Nats-Msg-Id", format!("{}/dlq/{n}", r.event_id).as_str());
    let payload = Bytes::from(r.payload.clone().unwrap_or_default().to_vec());
    js.publish_with_headers(r.topic.to_string(), h, payload).await.unwrap().await.expect("PubAck");
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
    replay_in_three_runs(&sink, &dlq, st, &stray, &to);

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

/// A record as the Redis sink XADDs it: key, payload, then the headers.
fn redis_xadd(con: &mut redis::Connection, r: &Record) {
    let mut c = redis::cmd("XADD");
    c.arg(&r.topic[..]).arg("*");
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
// Refusals
// ---------------------------------------------------------------------------------------------

#[test]
fn sinks_whose_dead_letters_cannot_be_read_are_refused_in_one_line() {
    for sink in ["http", "stdout", "null"] {
        let (code, out) = run_to_exit(&args(&["dlq", "list", "--sink", sink]), RUN_TIMEOUT);
        assert_ne!(code, Some(0), "{out}");
        assert!(
            out.contains(&format!("--sink {sink}"))
                && out.contains("kafka, nats, redis, rabbitmq, sqs, sns or kinesis"),
            "{out}"
        );
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
