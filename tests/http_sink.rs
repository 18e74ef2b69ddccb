//! `--sink http` against a real HTTP receiver in the test process ([`common::webhook`]), which
//! verifies every request's signature: events arrive byte-exact with their CloudEvents headers and
//! in per-key order; kill -9 under load loses nothing; a 503 outage confirms nothing until the
//! receiver answers 2xx again; a 400 sends one event to the dead-letter path (its own URL, through
//! `${topic}`) while later events flow; batch mode delivers CloudEvents JSON batches; an
//! unreachable receiver shows on `/readyz` and `outboxd_connected{component="http"}`.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::webhook::{Received, Webhook};
use common::*;

const SECRET: &[u8] = b"whsec-test-0123456789abcdef";

/// The secret in a file, for `--http-signing-secret-file`.
fn secret_file() -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), [SECRET, b"\n"].concat()).unwrap();
    f
}

/// Topics `hook.<aggregate_type>`, posted to `/in/<topic>`; DLQ `hook.dlq`.
fn http_args(pg: &PgCluster, hook: &Webhook, secret: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let url = hook.url("/in/${topic}");
    let secret = secret.display().to_string();
    let mut a: Vec<&str> = vec![
        "--sink",
        "http",
        "--http-url",
        &url,
        "--http-signing-secret-file",
        &secret,
        "--route-by-field",
        "aggregate_type",
        "--route-topic-replacement",
        "hook.${routedByValue}",
        "--dlq-topic",
        "hook.dlq",
        "--status-interval",
        "200ms",
    ];
    a.extend_from_slice(extra);
    daemon_args_pg_only(pg, &a)
}

fn slot_reaches_wal_end(pg: &PgCluster) -> bool {
    pg.wait_slot_reaches_wal_end(Duration::from_secs(60))
}

/// Every request so far carried a valid v2 signature (path, headers and body), and the headers
/// it covers include the ones a receiver relies on.
fn assert_all_signed(hook: &Webhook) {
    for r in hook.requests() {
        let sig = r.header_str("outboxd-signature").unwrap_or_default();
        assert_eq!(
            r.signature_ok,
            Some(true),
            "bad signature on {} {sig:?}: {:?}",
            r.path,
            r.headers.iter().map(|(n, v)| format!("{n}={}", String::from_utf8_lossy(v))).collect::<Vec<_>>()
        );
        assert!(sig.contains(",v2="), "not a v2 signature: {sig}");
        let names = r.header_str("outboxd-signed-headers").unwrap_or_default();
        let batch = r.header_str("content-type").as_deref() == Some("application/cloudevents-batch+json");
        let needed: &[&str] = if batch { &["content-type"] } else { &["ce-id", "idempotency-key", "ce-source"] };
        for h in needed {
            assert!(names.split(',').any(|n| n == *h), "{h} not signed: {names}");
        }
    }
}

/// Per key, the first copies of its events carry increasing `n`.
fn assert_first_copies_in_key_order(events: &[(String, String, u64)]) {
    let mut seen = HashSet::new();
    let mut last: HashMap<&str, u64> = HashMap::new();
    for (id, key, n) in events {
        if !seen.insert(id.clone()) {
            continue;
        }
        let prev = last.insert(key, *n);
        assert!(prev.is_none_or(|p| p < *n), "key {key}: event {n} after {prev:?}");
    }
}

/// (ce-id, key, payload n) of each delivered single-event request, in arrival order.
fn singles(hook: &Webhook) -> Vec<(String, String, u64)> {
    hook.delivered()
        .iter()
        .filter(|r| !r.is_batch() && r.path.starts_with("/in/hook.load"))
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            (r.header_str("ce-id").unwrap(), r.header_str("key").unwrap(), v["n"].as_u64().unwrap())
        })
        .collect()
}

#[test]
fn events_arrive_byte_exact_with_cloudevents_headers_and_the_slot_moves() {
    let hook = Webhook::start(Some(SECRET));
    let secret = secret_file();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    with_trace_context(&pg);
    let mut d = Outboxd::spawn_streaming(&http_args(&pg, &hook, secret.path(), &["--slot", "outboxd"]));
    let mut sent = Vec::new();
    for i in 0..20u64 {
        let agg = if i % 2 == 0 { "a-1" } else { "b-2" };
        let payload = format!("{{\"n\": {i}, \"s\": \"ü x\"}}");
        let id =
            pg.insert_event("order", agg, Some("order.paid.v1"), &payload, Some(&format!("{{\"trace\": \"t-{i}\"}}")));
        let row = pg.psql(&format!(
            "SELECT payload::text || '|' || floor(extract(epoch from created_at) * 1000)::bigint FROM outbox WHERE event_id = '{id}'"
        ));
        let (text, ms) = row.rsplit_once('|').unwrap();
        sent.push((id, agg, text.to_owned(), ms.parse::<i64>().unwrap(), i));
    }
    assert!(hook.wait_delivered(sent.len(), Duration::from_secs(30)), "{}", d.log());
    assert!(slot_reaches_wal_end(&pg), "every event answered 2xx: the slot must move\n{}", d.log());
    let got: HashMap<String, Received> =
        hook.delivered().into_iter().map(|r| (r.header_str("ce-id").unwrap(), r)).collect();
    assert_eq!(got.len(), sent.len(), "one request per event");
    for (id, agg, payload, ms, i) in &sent {
        let r = &got[id];
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/in/hook.order", "the topic is the URL's path segment");
        assert_eq!(r.body, payload.as_bytes(), "payload byte-exact");
        assert_eq!(r.header("content-type"), Some(&b"application/json"[..]));
        assert_eq!(r.header("ce-specversion"), Some(&b"1.0"[..]));
        assert_eq!(r.header("ce-id"), Some(id.as_bytes()));
        assert_eq!(r.header("id"), Some(id.as_bytes()));
        assert_eq!(r.header("idempotency-key"), Some(id.as_bytes()));
        assert_eq!(r.header("key"), Some(agg.as_bytes()));
        assert_eq!(r.header("ce-subject"), Some(agg.as_bytes()));
        assert_eq!(r.header("ce-type"), Some(&b"order.paid.v1"[..]));
        assert_eq!(r.header("ce-source"), Some(&b"outboxd/outboxd"[..]));
        assert_eq!(r.header_str("trace"), Some(format!("t-{i}")), "a headers-column key as a header");
        assert_eq!(r.header_str("traceparent").as_deref(), Some(TRACEPARENT), "W3C trace context");
        assert_eq!(r.header_str("tracestate").as_deref(), Some(TRACESTATE));
        let time = r.header_str("ce-time").unwrap();
        let t: jiff::Timestamp = time.parse().unwrap_or_else(|e| panic!("ce-time {time:?} is not RFC 3339: {e}"));
        assert!(time.ends_with('Z'), "{time}");
        assert_eq!(t.as_millisecond(), *ms, "ce-time is created_at");
    }
    // Per key, arrival order is commit order.
    for key in ["a-1", "b-2"] {
        let arrived: Vec<String> = hook
            .delivered()
            .iter()
            .filter(|r| r.header("key") == Some(key.as_bytes()))
            .map(|r| r.header_str("ce-id").unwrap())
            .collect();
        let want: Vec<String> = sent.iter().filter(|s| s.1 == key).map(|s| s.0.clone()).collect();
        assert_eq!(arrived, want, "key {key} in commit order");
    }
    assert_all_signed(&hook);
    d.stop_cleanly();
}

#[test]
fn kill9_under_load_then_restart_loses_nothing() {
    let hook = Webhook::start(Some(SECRET));
    let secret = secret_file();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let a = http_args(&pg, &hook, secret.path(), &["--http-concurrency", "4"]);
    let mut d = Outboxd::spawn_streaming(&a);
    const TXNS: u64 = 10;
    const ROWS: u64 = 300;
    pg.insert_load("load", 7, TXNS, ROWS);
    // Mid-way through the fourth transaction: the first transactions confirmed, the rest in flight or unread.
    assert!(hook.wait_delivered((3 * ROWS + ROWS / 2) as usize, Duration::from_secs(60)), "{}", d.log());
    d.kill9();
    let at_kill = hook.delivered_ids().len();
    let mut d2 = Outboxd::spawn_streaming(&a);
    assert!(slot_reaches_wal_end(&pg), "{}", d2.log());
    let want: HashSet<String> = pg.psql("SELECT event_id FROM outbox").lines().map(str::to_owned).collect();
    assert_eq!(want.len() as u64, TXNS * ROWS);
    let ids = hook.delivered_ids();
    let got: HashSet<String> = ids.iter().cloned().collect();
    let missing: Vec<&String> = want.difference(&got).take(5).collect();
    assert!(missing.is_empty(), "{} events lost, e.g. {missing:?}\n{}", want.difference(&got).count(), d2.log());
    assert_eq!(got.len(), want.len(), "nothing delivered that was not inserted");
    assert_first_copies_in_key_order(&singles(&hook));
    assert_all_signed(&hook);
    eprintln!(
        "killed with {at_kill} of {} delivered; {} duplicates after the restart (the at-least-once window)",
        TXNS * ROWS,
        ids.len() - got.len()
    );
    d2.stop_cleanly();
}

#[test]
fn a_503_outage_confirms_nothing_and_everything_arrives_after_it() {
    let hook = Webhook::start(Some(SECRET));
    let secret = secret_file();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = Outboxd::spawn_streaming(&http_args(&pg, &hook, secret.path(), &[]));
    let first = pg.insert_event("order", "a", Some("e.v1"), "{\"n\": 0}", None);
    assert!(hook.wait_delivered(1, Duration::from_secs(30)), "{}", d.log());
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    let before = pg.confirmed_lsn();
    hook.respond_with(|_| 503);
    let mut ids = Vec::new();
    for i in 1..=10 {
        let agg = if i % 2 == 0 { "a" } else { "b" };
        ids.push(pg.insert_event("order", agg, Some("e.v1"), &format!("{{\"n\": {i}}}"), None));
    }
    // Several refused attempts per lane.
    assert!(
        wait_until(Duration::from_secs(20), || hook.requests().iter().filter(|r| r.status == 503).count() >= 6),
        "the sink must keep retrying\n{}",
        d.log()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(pg.confirmed_lsn(), before, "nothing may be confirmed while the webhook answers 503\n{}", d.log());
    assert_eq!(hook.delivered_ids(), vec![first.clone()], "nothing else was delivered");
    assert!(d.log().contains("HTTP 503"), "the retries are logged with the status\n{}", d.log());
    hook.respond_with(|_| 200);
    assert!(hook.wait_delivered(11, Duration::from_secs(60)), "{}", d.log());
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    let delivered: HashSet<String> = hook.delivered_ids().into_iter().collect();
    for id in &ids {
        assert!(delivered.contains(id), "{id} lost");
    }
    // Per key, the delivered order is commit order.
    for key in ["a", "b"] {
        let arrived: Vec<String> = hook
            .delivered()
            .iter()
            .filter(|r| r.header("key") == Some(key.as_bytes()) && r.header_str("ce-id").unwrap() != first)
            .map(|r| r.header_str("ce-id").unwrap())
            .collect();
        let want: Vec<String> = ids
            .iter()
            .enumerate()
            .filter(|(i, _)| ((i + 1) % 2 == 0) == (key == "a"))
            .map(|(_, id)| id.clone())
            .collect();
        assert_eq!(arrived, want, "key {key}");
    }
    assert_all_signed(&hook);
    d.stop_cleanly();
}

#[test]
fn a_400_dead_letters_the_event_and_later_events_flow() {
    let hook = Webhook::start(Some(SECRET));
    hook.respond_with(|r| if r.path == "/in/hook.blocked" { 400 } else { 200 });
    let secret = secret_file();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = Outboxd::spawn_streaming(&http_args(&pg, &hook, secret.path(), &["--on-bad-event", "dlq"]));
    let before = pg.insert_event("fine", "k", Some("e.v1"), "{\"n\": 1}", None);
    let bad = pg.insert_event("blocked", "k", Some("e.v1"), "{\"n\": 2}", None);
    // A header HTTP cannot carry as it is: a bad event before any request, and its dead-letter
    // copy carries it escaped.
    let framing = pg.insert_event("fine", "k", Some("e.v1"), "{\"n\": 4}", Some("{\"Content-Length\": \"99\"}"));
    let after = pg.insert_event("fine", "k", Some("e.v1"), "{\"n\": 3}", None);
    assert!(wait_until(Duration::from_secs(30), || hook.delivered().len() >= 4), "{}", d.log());
    assert!(slot_reaches_wal_end(&pg), "the DLQ copy's ack must let the slot move on\n{}", d.log());
    let fine: Vec<String> =
        hook.delivered().iter().filter(|r| r.path == "/in/hook.fine").map(|r| r.header_str("ce-id").unwrap()).collect();
    assert_eq!(fine, vec![before, after]);
    let dlq: Vec<Received> = hook.delivered().into_iter().filter(|r| r.path == "/in/hook.dlq").collect();
    assert_eq!(dlq.len(), 2, "{}", d.log());
    let by_id = |id: &str| dlq.iter().find(|r| r.header_str("id").as_deref() == Some(id)).expect("a dead-letter copy");
    let r = by_id(&framing);
    assert_eq!(r.header_str("outboxd.error").as_deref(), Some("invalid_header"));
    assert_eq!(r.header_str("outboxd.escaped-header.0").as_deref(), Some("Content%2DLength=99"));
    assert_eq!(r.header("content-length"), Some(&b"8"[..]), "the body's own length, not the row's header");
    let r = by_id(&bad);
    assert_eq!(r.header_str("outboxd.error").as_deref(), Some("http_refused"));
    assert!(r.header_str("outboxd.error.message").unwrap().contains("HTTP 400"), "{:?}", r.headers);
    assert_eq!(r.body, b"{\"n\": 2}");
    let refused = hook.requests().iter().filter(|r| r.path == "/in/hook.blocked").count();
    assert_eq!(refused, 1, "a 400 is final: no retries");
    assert_all_signed(&hook);
    d.stop_cleanly();
}

#[test]
fn batch_mode_posts_cloudevents_batches_and_splits_a_refused_one() {
    let hook = Webhook::start(Some(SECRET));
    // A batch holding the poisoned event is refused; alone, only that event is.
    hook.respond_with(|r| {
        if r.path != "/in/hook.dlq" && String::from_utf8_lossy(&r.body).contains("\"poison\"") {
            400
        } else {
            200
        }
    });
    let secret = secret_file();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    with_trace_context(&pg);
    let a = http_args(&pg, &hook, secret.path(), &["--http-batch", "50", "--http-concurrency", "2"]);
    let mut d = Outboxd::spawn_streaming(&a);
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
         SELECT 'load', 'k' || (g % 3), 'load.v1', jsonb_build_object('n', g), jsonb_build_object('h', 'v' || g) \
         FROM generate_series(1, 400) g",
    );
    let poison = pg.insert_event("load", "k1", Some("load.v1"), "{\"poison\": true}", None);
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'load', 'k' || (g % 3), 'load.v1', jsonb_build_object('n', 400 + g) FROM generate_series(1, 30) g",
    );
    assert!(hook.wait_delivered(430, Duration::from_secs(60)), "{}", d.log());
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    let want: HashSet<String> =
        pg.psql("SELECT event_id FROM outbox WHERE payload ? 'n'").lines().map(str::to_owned).collect();
    let batches: Vec<Received> = hook.delivered().into_iter().filter(|r| r.path == "/in/hook.load").collect();
    assert!(batches.iter().all(Received::is_batch), "every request to the topic is a batch");
    assert!(batches.iter().any(|r| r.event_ids().len() > 1), "batches carry several events");
    assert!(batches.iter().all(|r| r.event_ids().len() <= 50), "at most --http-batch events per request");
    let mut events = Vec::new();
    for r in &batches {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        for e in v.as_array().unwrap() {
            assert_eq!(e["specversion"], "1.0");
            assert_eq!(e["type"], "load.v1");
            assert_eq!(e["datacontenttype"], "application/json");
            assert_eq!(e["subject"], e["partitionkey"]);
            // CloudEvents' distributed-tracing extension, from the trace context column.
            assert_eq!(e["traceparent"], TRACEPARENT);
            assert_eq!(e["tracestate"], TRACESTATE);
            let n = e["data"]["n"].as_u64().unwrap();
            if n <= 400 {
                let h: serde_json::Value = serde_json::from_str(e["outboxdheaders"].as_str().unwrap()).unwrap();
                assert_eq!(h["h"], format!("v{n}"));
                assert_eq!(h["id"], e["id"]);
            }
            events.push((e["id"].as_str().unwrap().to_owned(), e["subject"].as_str().unwrap().to_owned(), n));
        }
    }
    let got: HashSet<String> = events.iter().map(|e| e.0.clone()).collect();
    assert_eq!(got, want, "every event once a batch was acked");
    assert!(!got.contains(&poison));
    assert_first_copies_in_key_order(&events);
    let dlq: Vec<Received> = hook.delivered().into_iter().filter(|r| r.path == "/in/hook.dlq").collect();
    assert_eq!(dlq.iter().flat_map(Received::event_ids).count(), 1, "only the refused event is dead-lettered");
    assert!(dlq[0].body.windows(8).any(|w| w == b"\"poison\""), "{}", String::from_utf8_lossy(&dlq[0].body));
    assert_all_signed(&hook);
    d.stop_cleanly();
}

/// Answers about the receiver (401, 403, 404, 405, 409: a rotated credential, a deploy, an
/// idempotency conflict) are retried with backoff, confirm nothing and show on /readyz and the
/// gauge, and the event arrives once the receiver takes it; an answer about the event (422) makes
/// it a bad event at once; `--http-bad-event-status` moves a status between the classes.
#[test]
fn answers_about_the_receiver_are_retried_and_answers_about_the_event_are_bad_events() {
    let hook = Webhook::start(Some(SECRET));
    let secret = secret_file();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut d = Outboxd::spawn_streaming(&http_args(
        &pg,
        &hook,
        secret.path(),
        &["--on-bad-event", "dlq", "--metrics-addr", &metrics],
    ));
    let ready = || http_get(metrics_port, "/readyz").map(|r| r.0);
    let gauge =
        || http_get(metrics_port, "/metrics").and_then(|(_, b)| metric(&b, "outboxd_connected{component=\"http\"}"));
    let tries = |id: &str, status: u16| {
        hook.requests().iter().filter(|r| r.status == status && r.event_ids().iter().any(|i| i == id)).count()
    };
    let mut ids = Vec::new();
    for status in [401u16, 403, 404, 405, 409] {
        hook.respond_with(move |r| if r.path == "/in/hook.dlq" { 200 } else { status });
        let id = pg.insert_event("recv", "k", Some("e.v1"), &format!("{{\"status\": {status}}}"), None);
        let commit_end = pg.psql("SELECT pg_current_wal_insert_lsn()");
        assert!(wait_until(Duration::from_secs(20), || tries(&id, status) >= 2), "{status} not retried\n{}", d.log());
        assert!(wait_until(Duration::from_secs(5), || ready() == Some(503)), "{status}: /readyz stayed ready");
        assert_eq!(gauge(), Some(0.0), "{status}: the gauge stayed up");
        let past = pg.psql(&format!(
            "SELECT confirmed_flush_lsn >= '{commit_end}' FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        ));
        assert_eq!(past, "f", "{status}: confirmed while the receiver refused\n{}", d.log());
        hook.respond_with(|_| 200);
        assert!(wait_until(Duration::from_secs(60), || hook.delivered_ids().contains(&id)), "{status}\n{}", d.log());
        assert!(wait_until(Duration::from_secs(10), || ready() == Some(200)), "{status}: /readyz never recovered");
        ids.push(id);
    }
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    let fine: Vec<String> =
        hook.delivered().iter().filter(|r| r.path == "/in/hook.recv").flat_map(|r| r.event_ids()).collect();
    assert_eq!(fine, ids, "each event once, in order");
    assert!(hook.requests().iter().all(|r| r.path != "/in/hook.dlq"), "a receiver's answer dead-lettered an event");
    // 422 is about the event: one request, then its dead-letter copy, and the slot moves on.
    hook.respond_with(|r| if r.path == "/in/hook.recv" { 422 } else { 200 });
    let bad = pg.insert_event("recv", "k", Some("e.v1"), "{\"status\": 422}", None);
    assert!(
        wait_until(Duration::from_secs(30), || hook
            .delivered()
            .iter()
            .any(|r| r.path == "/in/hook.dlq" && r.header_str("id").as_deref() == Some(bad.as_str()))),
        "{}",
        d.log()
    );
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    assert_eq!(tries(&bad, 422), 1, "a 422 is final");
    d.stop_cleanly();

    // The flag moves 404 to the bad-event class.
    hook.respond_with(|r| if r.path == "/in/hook.recv" { 404 } else { 200 });
    let mut d = Outboxd::spawn_streaming(&http_args(
        &pg,
        &hook,
        secret.path(),
        &["--on-bad-event", "dlq", "--http-bad-event-status", "404,422"],
    ));
    let gone = pg.insert_event("recv", "k", Some("e.v1"), "{\"status\": 404}", None);
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    assert_eq!(tries(&gone, 404), 1, "with the flag a 404 is final");
    assert!(hook
        .delivered()
        .iter()
        .any(|r| r.path == "/in/hook.dlq" && r.header_str("id").as_deref() == Some(gone.as_str())));
    d.stop_cleanly();
}

/// A receiver that answers 2xx with a body that never ends: outboxd reads a bounded prefix and
/// acks (it used to read until --http-timeout and send the event again, for ever).
#[test]
fn an_endless_response_body_is_read_only_in_part() {
    let hook = Webhook::start(Some(SECRET));
    hook.answer_endless_bodies(true);
    let secret = secret_file();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = Outboxd::spawn_streaming(&http_args(&pg, &hook, secret.path(), &["--http-timeout", "3s"]));
    let id = pg.insert_event("order", "a", Some("e.v1"), "{\"n\": 1}", None);
    assert!(pg.wait_slot_reaches_wal_end(Duration::from_secs(30)), "never acked\n{}", d.log());
    assert_eq!(hook.requests().len(), 1, "sent again\n{}", d.log());
    assert_eq!(hook.delivered_ids(), vec![id]);
    hook.answer_endless_bodies(false);
    d.stop_cleanly();
}

/// The v2 signature covers what a receiver relies on (issue 23 item 2: v1 signed the body only):
/// a captured request replayed with another type, idempotency key, subject, record header or
/// topic path no longer verifies. `--http-signature-version v1` keeps the old scheme.
#[test]
fn the_signature_covers_path_and_headers_and_v1_stays_available() {
    let hook = Webhook::start(Some(SECRET));
    let secret = secret_file();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = Outboxd::spawn_streaming(&http_args(&pg, &hook, secret.path(), &[]));
    pg.insert_event("order", "a", Some("order.paid.v1"), "{\"n\": 1}", Some("{\"trace\": \"t-1\"}"));
    assert!(hook.wait_delivered(1, Duration::from_secs(30)), "{}", d.log());
    d.stop_cleanly();
    let captured = hook.delivered()[0].clone();
    assert!(common::webhook::verify(SECRET, &captured));
    let with = |name: &str, value: &str| {
        let mut r = captured.clone();
        for (n, v) in &mut r.headers {
            if n == name {
                *v = value.as_bytes().to_vec();
            }
        }
        r
    };
    for (name, value) in [
        ("ce-type", "order.refunded.v1"),
        ("idempotency-key", "another-key"),
        ("ce-id", "another-id"),
        ("ce-subject", "b"),
        ("trace", "t-2"),
    ] {
        assert!(captured.header(name).is_some(), "{name} missing from the request");
        assert!(!common::webhook::verify(SECRET, &with(name, value)), "a changed {name} still verifies");
    }
    let mut moved = captured.clone();
    moved.path = "/in/hook.other".into();
    assert!(!common::webhook::verify(SECRET, &moved), "another topic path still verifies");

    let mut d = Outboxd::spawn_streaming(&http_args(&pg, &hook, secret.path(), &["--http-signature-version", "v1"]));
    pg.insert_event("order", "a", Some("order.paid.v1"), "{\"n\": 2}", None);
    assert!(hook.wait_delivered(2, Duration::from_secs(30)), "{}", d.log());
    d.stop_cleanly();
    let last = hook.delivered().last().cloned().unwrap();
    let sig = last.header_str("outboxd-signature").unwrap_or_default();
    assert!(sig.contains(",v1=") && last.header("outboxd-signed-headers").is_none(), "{sig}");
    assert_eq!(last.signature_ok, Some(true));
}

/// A receiver that is not there: the requests fail to connect, `/readyz` and
/// `outboxd_connected{component="http"}` say so, nothing is confirmed; once it listens, the
/// event arrives and both recover.
#[test]
fn an_unreachable_receiver_shows_on_readyz_and_the_gauge() {
    let secret = secret_file();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let hook_port = free_port();
    let metrics_port = free_port();
    let url = format!("http://127.0.0.1:{hook_port}/in/${{topic}}");
    let metrics = format!("127.0.0.1:{metrics_port}");
    let secret_path = secret.path().display().to_string();
    let a = daemon_args_pg_only(
        &pg,
        &[
            "--sink",
            "http",
            "--http-url",
            &url,
            "--http-signing-secret-file",
            &secret_path,
            "--http-timeout",
            "2s",
            "--metrics-addr",
            &metrics,
            "--status-interval",
            "200ms",
        ],
    );
    let mut d = Outboxd::spawn_streaming(&a);
    let before = pg.confirmed_lsn();
    let id = pg.insert_event("order", "a", Some("e.v1"), "{\"n\": 1}", None);
    let gauge =
        || http_get(metrics_port, "/metrics").and_then(|(_, b)| metric(&b, "outboxd_connected{component=\"http\"}"));
    assert!(
        wait_until(Duration::from_secs(20), || gauge() == Some(0.0)),
        "gauge never showed the failure\n{}",
        d.log()
    );
    assert_eq!(
        http_get(metrics_port, "/readyz").map(|r| r.0),
        Some(503),
        "not ready while the receiver is unreachable"
    );
    assert_eq!(pg.confirmed_lsn(), before, "nothing confirmed\n{}", d.log());
    let hook = Webhook::start_on(hook_port, Some(SECRET));
    assert!(hook.wait_delivered(1, Duration::from_secs(60)), "{}", d.log());
    assert_eq!(hook.delivered_ids(), vec![id]);
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    assert!(wait_until(Duration::from_secs(5), || gauge() == Some(1.0)), "gauge back to 1");
    assert!(wait_until(Duration::from_secs(5), || http_get(metrics_port, "/readyz").map(|r| r.0) == Some(200)));
    assert_all_signed(&hook);
    d.stop_cleanly();
}

/// `outboxd poll --sink http` polls the table (main's sink `match` once ran the replication loop
/// for `http` and `rabbitmq` whatever the command): the rows reach the receiver, are marked
/// published, and no replication slot is made.
#[test]
fn poll_mode_relays_to_the_webhook() {
    let hook = Webhook::start(Some(SECRET));
    let secret = secret_file();
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.apply_sql_file(sql_dir().join("05_poll.sql"));
    let mut a = http_args(&pg, &hook, secret.path(), &["--poll-interval", "100ms"]);
    assert_eq!(a[0], "run");
    a[0] = "poll".into();
    let d = Outboxd::spawn(&a);
    assert!(d.wait_for_log("polling", Duration::from_secs(60)), "outboxd poll did not start:\n{}", d.log());
    let mut ids: Vec<String> =
        (0..3).map(|i| pg.insert_event("t", &format!("k{i}"), Some("polled"), "{}", None)).collect();
    assert!(hook.wait_delivered(3, Duration::from_secs(30)), "{}", d.log());
    let mut got = hook.delivered_ids();
    got.sort();
    got.dedup();
    ids.sort();
    assert_eq!(got, ids, "{}", d.log());
    let published = || pg.psql("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL") == "3";
    assert!(wait_until(Duration::from_secs(30), published), "{}", d.log());
    assert_eq!(pg.psql("SELECT count(*) FROM pg_replication_slots"), "0", "poll mode made a slot");
}
