//! `outboxd shadow compare` against a real Apache Kafka broker: a legacy topic and a shadow topic with a
//! missing event, an extra event, a changed field, an ignored field, a number spelled differently,
//! a repeated copy, a record without an id and an old event outside `--since`; the exact `--json`
//! report and the exit codes (0 all matched, 1 mismatch, 2 bad flags); and `--follow`, whose
//! gauges show the same counts and follow events produced while it runs.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;

const RUN_TIMEOUT: Duration = Duration::from_secs(90);
const LEGACY: &str = "order.paid.v1.events";
const SHADOW: &str = "order.paid.v1.shadow.events";

struct Rec {
    partition: i32,
    id: Option<&'static str>,
    payload: String,
    timestamp_ms: i64,
}

fn rec(partition: i32, id: &'static str, timestamp_ms: i64, payload: serde_json::Value) -> Rec {
    Rec { partition, id: Some(id), payload: payload.to_string(), timestamp_ms }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Sends each record as its own batch, keyed by id, with header `id` and the given CreateTime.
fn produce(broker: &Broker, topic: &str, records: &[Rec]) {
    let producer: FutureProducer =
        broker.client_config().set("enable.idempotence", "true").set("acks", "all").create().expect("producer");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        for r in records {
            let mut headers = OwnedHeaders::new();
            if let Some(id) = r.id {
                headers = headers.insert(Header { key: "id", value: Some(id) });
            }
            let key = r.id.unwrap_or("no-id");
            let rec: FutureRecord<'_, str, str> = FutureRecord::to(topic)
                .partition(r.partition)
                .key(key)
                .timestamp(r.timestamp_ms)
                .headers(headers)
                .payload(r.payload.as_str());
            producer.send(rec, Duration::from_secs(30)).await.map_err(|(e, _)| e).expect("produce test record");
        }
    });
}

fn compare(broker: &Broker, legacy: &str, shadow: &str, extra: &[&str]) -> (Option<i32>, String) {
    let bootstrap = broker.bootstrap();
    let mut a = vec![
        "shadow",
        "compare",
        "--kafka-brokers",
        bootstrap.as_str(),
        "--legacy-topic",
        legacy,
        "--shadow-topic",
        shadow,
    ];
    a.extend_from_slice(extra);
    run_to_exit(&args(&a), RUN_TIMEOUT)
}

fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().filter(|l| l.starts_with('{')).filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn json_line(out: &str) -> serde_json::Value {
    json_lines(out).pop().unwrap_or_else(|| panic!("no JSON line in:\n{out}"))
}

/// The scenario, produced onto a 2-partition legacy topic and a 1-partition shadow topic.
/// Returns the base timestamp.
fn scenario(broker: &Broker) -> i64 {
    broker.create_topic(LEGACY, 2);
    broker.create_topic(SHADOW, 1);
    let t = now_ms() - 10 * 60 * 1000;
    let old = now_ms() - 3 * 3600 * 1000;
    let legacy = vec![
        // Before --since 1h; differs, so only a whole-topic run reports it.
        rec(0, "e-0", old, json!({"orderId": "o-0", "total": 1})),
        // Matches: the sentAt difference is ignored, 100 equals 100.0, key order does not matter.
        rec(0, "e-1", t, json!({"orderId": "o-1", "total": 100, "sentAt": "2026-12-03T08:00:00Z"})),
        // Missing from the shadow topic.
        rec(1, "e-2", t + 10, json!({"orderId": "o-2", "total": 200})),
        // A changed field, and an item field that differs.
        rec(1, "e-3", t + 20, json!({"orderId": "o-3", "total": 300, "items": [{"sku": "a", "qty": 1}]})),
        // Matches except in an ignored field of each array element.
        rec(0, "e-4", t + 30, json!({"orderId": "o-4", "items": [{"sku": "b", "at": 1}, {"sku": "c", "at": 2}]})),
        rec(1, "e-5", t + 40, json!({"orderId": "o-5", "total": 5})),
        // No id header: cannot be compared.
        Rec { partition: 0, id: None, payload: json!({"orderId": "o-x"}).to_string(), timestamp_ms: t + 50 },
    ];
    let shadow = vec![
        rec(0, "e-0", old, json!({"orderId": "o-0", "total": 2})),
        rec(0, "e-5", t + 60, json!({"orderId": "o-5", "total": 5})),
        rec(0, "e-1", t + 40, json!({"total": 100.0, "sentAt": "2026-12-03T08:00:01Z", "orderId": "o-1"})),
        rec(0, "e-3", t + 80, json!({"orderId": "o-3", "total": 301, "items": [{"sku": "a", "qty": 2}]})),
        rec(0, "e-4", t + 130, json!({"orderId": "o-4", "items": [{"sku": "b", "at": 7}, {"sku": "c", "at": 8}]})),
        // An extra event, and an at-least-once repeat of e-5.
        rec(0, "e-9", t + 140, json!({"orderId": "o-9", "total": 9})),
        rec(0, "e-5", t + 60, json!({"orderId": "o-5", "total": 5})),
    ];
    produce(broker, LEGACY, &legacy);
    produce(broker, SHADOW, &shadow);
    t
}

#[test]
fn compare_reports_missing_extra_and_changed_events_exactly() {
    let broker = Broker::start();
    scenario(&broker);
    let ignore = ["--ignore", "/sentAt", "--ignore", "/items/*/at"];

    // The whole of both topics: e-0 counts too.
    let mut a = vec!["--match-by", "header:id", "--json"];
    a.extend_from_slice(&ignore);
    let (code, out) = compare(&broker, LEGACY, SHADOW, &a);
    assert_eq!(code, Some(1), "a mismatch exits 1:\n{out}");
    assert_eq!(
        json_line(&out),
        json!({
            "ok": false,
            "legacy_topic": LEGACY,
            "shadow_topic": SHADOW,
            "matched": 3,
            "only_legacy": ["e-2"],
            "only_shadow": ["e-9"],
            "different": [{"id": "e-0", "paths": ["/total"]}, {"id": "e-3", "paths": ["/items/0/qty", "/total"]}],
            "only_legacy_count": 1,
            "only_shadow_count": 1,
            "different_count": 2,
            "records": {"legacy": 7, "shadow": 7},
            "duplicates": {"legacy": 0, "shadow": 1},
            "unidentified": {"legacy": 1, "shadow": 0},
            "pending": {"legacy": 0, "shadow": 0},
            "lag_ms": {"pairs": 5, "p50": 40, "min": 0, "max": 100},
        }),
        "{out}"
    );

    // --since 1h: e-0 is outside the window.
    let mut a = vec!["--match-by", "header:id", "--json", "--since", "1h"];
    a.extend_from_slice(&ignore);
    let (code, out) = compare(&broker, LEGACY, SHADOW, &a);
    assert_eq!(code, Some(1), "{out}");
    let j = json_line(&out);
    assert_eq!(j["different"], json!([{"id": "e-3", "paths": ["/items/0/qty", "/total"]}]), "{out}");
    assert_eq!((j["matched"].clone(), j["records"].clone()), (json!(3), json!({"legacy": 6, "shadow": 6})), "{out}");
    assert_eq!(j["lag_ms"], json!({"pairs": 4, "p50": 40, "min": 20, "max": 100}), "{out}");

    // Paired by a payload field instead, without --ignore: the ignored differences come back.
    // The record without an id header has an orderId, so it is an event only in legacy now.
    let (code, out) = compare(&broker, LEGACY, SHADOW, &["--match-by", "field:/orderId", "--since", "1h"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("matched 1, different 3, only in legacy 2, only in shadow 1\n"), "{out}");
    assert!(out.contains("only in legacy (2):\n  o-2\n  o-x\n"), "{out}");
    assert!(out.contains("only in shadow (1):\n  o-9\n"), "{out}");
    assert!(
        out.contains("different (3):\n  o-1: /sentAt\n  o-3: /items/0/qty, /total\n  o-4: /items/0/at, /items/1/at\n"),
        "{out}"
    );
    assert!(out.contains("lag (shadow minus legacy timestamp): p50 40ms, min 20ms, max 100ms over 4 pairs"), "{out}");
    assert!(out.trim_end().ends_with("MISMATCH"), "{out}");
}

#[test]
fn clean_topics_exit_0_and_bad_flags_exit_2() {
    let broker = Broker::start();
    broker.create_topic("clean.events", 1);
    broker.create_topic("clean.shadow.events", 1);
    let t = now_ms();
    produce(&broker, "clean.events", &[rec(0, "a", t, json!({"n": 1})), rec(0, "b", t + 1, json!({"n": [2]}))]);
    produce(
        &broker,
        "clean.shadow.events",
        &[rec(0, "b", t + 5, json!({"n": [2.0]})), rec(0, "a", t + 9, json!({"n": 1}))],
    );
    let (code, out) = compare(&broker, "clean.events", "clean.shadow.events", &["--match-by", "key", "--json"]);
    assert_eq!(code, Some(0), "{out}");
    let j = json_line(&out);
    assert_eq!((j["ok"].clone(), j["matched"].clone()), (json!(true), json!(2)), "{out}");
    assert_eq!(
        (j["only_legacy"].clone(), j["only_shadow"].clone(), j["different"].clone()),
        (json!([]), json!([]), json!([]))
    );
    let (code, out) = compare(&broker, "clean.events", "clean.shadow.events", &["--match-by", "key"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("matched 2, different 0, only in legacy 0, only in shadow 0\n") && out.contains("OK:"),
        "{out}"
    );

    for (bad, names) in [
        (&["--match-by", "id"][..], "--match-by"),
        (&["--match-by", "key", "--ignore", "total"], "--ignore"),
        (&["--match-by", "key", "--since", "a while"], "--since"),
        (&["--ignore", "/a"], "--match-by"),
    ] {
        let (code, out) = compare(&broker, "clean.events", "clean.shadow.events", bad);
        assert_eq!(code, Some(2), "{bad:?}:\n{out}");
        assert!(out.contains(names), "{bad:?}:\n{out}");
    }
    // A topic that does not exist is named, not taken for an empty one.
    let (code, out) = compare(&broker, "clean.events", "clean.shadw.events", &["--match-by", "key"]);
    assert_eq!(code, Some(1), "{out}");
    let line = out.lines().find(|l| l.contains("outboxd: error:")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("--shadow-topic \"clean.shadw.events\" does not exist"), "{line}");
}

#[test]
fn follow_exports_the_counts_and_pairs_new_events_as_they_come() {
    let broker = Broker::start();
    let t = scenario(&broker);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let bootstrap = broker.bootstrap();
    let mut d = Outboxd::spawn(&args(&[
        "shadow",
        "compare",
        "--kafka-brokers",
        &bootstrap,
        "--legacy-topic",
        LEGACY,
        "--shadow-topic",
        SHADOW,
        "--match-by",
        "header:id",
        "--ignore",
        "/sentAt",
        "--ignore",
        "/items/*/at",
        "--since",
        "1h",
        "--max-lag",
        "2s",
        "--follow",
        "--json",
        "--report-interval",
        "1s",
        "--metrics-addr",
        &addr,
    ]));
    let gauges = |want: &[(&str, f64)]| {
        wait_until(Duration::from_secs(60), || {
            let Some((_, body)) = http_get(port, "/metrics") else { return false };
            want.iter().all(|(s, v)| metric(&body, s) == Some(*v))
        })
    };
    let settled = [
        ("outboxd_shadow_matched", 3.0),
        ("outboxd_shadow_different", 1.0),
        ("outboxd_shadow_only_legacy", 1.0),
        ("outboxd_shadow_only_shadow", 1.0),
        ("outboxd_shadow_duplicates{side=\"shadow\"}", 1.0),
        ("outboxd_shadow_unidentified{side=\"legacy\"}", 1.0),
        ("outboxd_shadow_pending{side=\"legacy\"}", 0.0),
        ("outboxd_shadow_pending{side=\"shadow\"}", 0.0),
        ("outboxd_shadow_lag_max_seconds", 0.1),
    ];
    assert!(gauges(&settled), "gauges never showed {settled:?}:\n{}", d.log());
    assert_eq!(http_get(port, "/readyz").map(|(code, _)| code), Some(200), "caught up: ready");

    // A new pair while it runs, and a new legacy event whose copy never comes.
    let now = now_ms();
    produce(&broker, LEGACY, &[rec(0, "n-1", now, json!({"v": 1})), rec(1, "n-2", now, json!({"v": 2}))]);
    produce(&broker, SHADOW, &[rec(0, "n-1", now + 5, json!({"v": 1}))]);
    let later = [("outboxd_shadow_matched", 4.0), ("outboxd_shadow_only_legacy", 2.0)];
    assert!(gauges(&later), "gauges never showed {later:?}:\n{}", d.log());
    assert!(t < now);

    d.sigterm();
    let status = d.wait_exit(Duration::from_secs(30));
    assert_eq!(status.and_then(|s| s.code()), Some(1), "mismatches found: exit 1\n{}", d.log());
    let last = json_line(&d.log());
    assert_eq!(last["only_legacy"], json!(["e-2", "n-2"]), "{}", d.log());
    assert_eq!(last["matched"], json!(4), "{}", d.log());
}
