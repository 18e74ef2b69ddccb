//! `outboxd dlq list|replay --sink sqs` against a local SQS (moto's server mode, one per test):
//! the copies `--sink sqs` dead-lettered to `--sqs-dlq-queue-url` are listed without being taken
//! from the queue, and replayed byte for byte (body and attributes as the relay would have sent
//! them) once the cause is fixed; a copy leaves the dead-letter queue only after its event was
//! accepted, so a replay killed while the queue refuses it (or midway through a throttled run)
//! loses nothing.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::aws::{Moto, SqsMessage, ThrottleProxy};
use common::*;

/// moto takes any credentials; these keep the SDK from looking for real ones.
const ENV: &[(&str, &str)] = &[("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test-secret")];

fn attr(m: &SqsMessage, name: &str) -> Option<Vec<u8>> {
    m.attributes.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// The relay with `--sink sqs`, dead letters to `dlq`, streaming while `insert` writes events,
/// then until they are confirmed; stopped. What `insert` returns.
fn relay<T>(pg: &PgCluster, moto: &Moto, queue: &str, dlq: &str, insert: impl FnOnce() -> T) -> T {
    let flags = ["--sink", "sqs", "--on-bad-event", "dlq", "--sqs-queue-url", queue, "--sqs-dlq-queue-url", dlq];
    let mut a = daemon_args_pg_only(pg, &flags);
    a.extend(args(&["--aws-endpoint-url", &moto.url, "--aws-region", "us-east-1", "--status-interval", "200ms"]));
    let mut d = Outboxd::spawn_with_env(&a, ENV);
    assert!(d.wait_for_streaming(Duration::from_secs(60)), "{}", d.log());
    let out = insert();
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(60)), "slot behind\n{}", d.log());
    d.stop_cleanly();
    out
}

/// `outboxd dlq CMD --sink sqs ...` against `endpoint`: its exit code and output.
fn dlq(cmd: &str, endpoint: &str, dlq: &str, extra: &[&str]) -> (Option<i32>, String) {
    let mut a = args(&["dlq", cmd, "--sink", "sqs", "--sqs-dlq-queue-url", dlq, "--aws-endpoint-url", endpoint]);
    a.extend(args(&["--aws-region", "us-east-1", "--sqs-visibility-timeout", "3s", "--read-timeout", "20s"]));
    a.extend(args(extra));
    let mut d = Outboxd::spawn_with_env(&a, ENV);
    let status = d.wait_exit(Duration::from_secs(120));
    if status.is_none() {
        d.kill9();
    }
    (status.and_then(|s| s.code()), d.log())
}

/// `dlq list --json`'s object.
fn list_json(moto: &Moto, dlq_url: &str) -> serde_json::Value {
    let (code, out) = dlq("list", &moto.url, dlq_url, &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    out.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["sink"] == "sqs")
        .unwrap_or_else(|| panic!("no JSON from dlq list:\n{out}"))
}

/// An event over the queue's MaximumMessageSize is dead-lettered; `dlq list` shows it (twice:
/// listing takes nothing from the queue); `dlq replay` fails while the queue still cannot take
/// it and keeps the copy; once the queue takes larger messages, replay sends the event as the
/// relay would have: the same body byte for byte, the same attributes (the key, the event id,
/// the row's headers, no `outboxd.*`), and deletes the copy; a second replay sends nothing.
#[test]
fn an_oversized_event_is_listed_and_replayed_byte_for_byte_once_the_queue_takes_it() {
    let moto = Moto::start();
    let queue = moto.client(&["create-queue-max", "small", "1024"]).trim().to_owned();
    let dlq_url = moto.create_queue("small-dlq", false);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    // jsonb prints these keys in this order with ": " and ", ", so the row's text is the payload.
    let small_payload = "{\"n\": 1}";
    let big_payload = format!("{{\"n\": 2, \"pad\": \"{}\"}}", "x\u{e9}y".repeat(700));
    let (small, big) = relay(&pg, &moto, &queue, &dlq_url, || {
        let small = pg.insert_event("t", "k-small", Some("e"), small_payload, Some("{\"trace\": \"t0\"}"));
        (small, pg.insert_event("t", "k-big", Some("e"), &big_payload, Some("{\"trace\": \"t1\"}")))
    });

    let sent = moto.drain_queue(&queue, 1);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].body, small_payload.as_bytes(), "the routed body is the row's payload text");
    assert_eq!(attr(&sent[0], "id"), Some(small.clone().into_bytes()));

    for _ in 0..2 {
        let l = list_json(&moto, &dlq_url);
        assert_eq!(l["total"], 1, "{l}");
        let r = &l["records"][0];
        assert_eq!((r["event_id"].as_str(), r["reason"].as_str()), (Some(big.as_str()), Some("too_large")), "{l}");
        assert_eq!(r["key"].as_str(), Some("k-big"), "{l}");
    }

    // The queue still takes 1 KiB: replay fails, and the copy stays.
    let (code, out) = dlq("replay", &moto.url, &dlq_url, &["--sqs-queue-url", &queue]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("too_large") && out.contains("failed 1"), "{out}");
    assert_eq!(list_json(&moto, &dlq_url)["total"], 1, "a failed replay keeps the copy");

    moto.client(&["set-queue-max", &queue, "262144"]);
    let (code, out) = dlq("replay", &moto.url, &dlq_url, &["--sqs-queue-url", &queue]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("replayed 1,"), "{out}");
    let back = moto.drain_queue(&queue, 1);
    assert_eq!(back.len(), 1, "{back:?}");
    assert!(back[0].body == big_payload.as_bytes(), "the body differs from the payload");
    let names: BTreeMap<String, Vec<u8>> = back[0].attributes.iter().cloned().collect();
    let want: BTreeMap<String, Vec<u8>> = [("id", big.as_str()), ("key", "k-big"), ("trace", "t1")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
    assert_eq!(names, want, "the attributes the relay would have sent, none of outboxd.*");
    assert_eq!(list_json(&moto, &dlq_url)["total"], 0, "the replayed copy is deleted");
    let (code, out) = dlq("replay", &moto.url, &dlq_url, &["--sqs-queue-url", &queue]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("replayed 0,"), "{out}");
    assert!(moto.drain_queue(&queue, 1).is_empty());
}

/// 25 dead letters. A replay through a proxy that throttles every SendMessageBatch is killed
/// (-9) once it has received copies and tried to send them: every copy is still in the queue
/// (none was deleted before its event was accepted). A replay through a proxy that throttles a
/// share of the calls is killed after its first sent batch. After the visibility timeout, a
/// replay runs to its end: every event reached the queue (a second copy of some is allowed: at
/// least once) and the dead-letter queue is empty.
#[test]
fn an_interrupted_replay_loses_no_copy() {
    const N: usize = 25;
    let moto = Moto::start();
    let queue = moto.client(&["create-queue-max", "main", "1024"]).trim().to_owned();
    let dlq_url = moto.create_queue("main-dlq", false);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let pad = "z".repeat(1500);
    let ids: HashSet<String> = relay(&pg, &moto, &queue, &dlq_url, || {
        (0..N)
            .map(|i| {
                let payload = format!("{{\"n\": {i}, \"p\": \"{pad}\"}}");
                pg.insert_event("t", &format!("k{}", i % 5), Some("e"), &payload, None)
            })
            .collect()
    });
    assert!(moto.drain_queue(&queue, 1).is_empty());
    assert_eq!(list_json(&moto, &dlq_url)["total"], N, "every event dead-lettered");
    moto.client(&["set-queue-max", &queue, "262144"]);

    let replay_args = |endpoint: &str| {
        let mut a =
            args(&["dlq", "replay", "--sink", "sqs", "--sqs-dlq-queue-url", &dlq_url, "--sqs-queue-url", &queue]);
        a.extend(args(&[
            "--aws-endpoint-url",
            endpoint,
            "--aws-region",
            "us-east-1",
            "--sqs-visibility-timeout",
            "3s",
        ]));
        a
    };
    {
        let proxy = ThrottleProxy::start(&moto, 1.0);
        let mut d = Outboxd::spawn_with_env(&replay_args(&proxy.url), ENV);
        assert!(wait_until(Duration::from_secs(60), || proxy.injected().0 >= 2), "{}", d.log());
        d.kill9();
        assert!(!d.log().contains("sent "), "nothing was accepted: {}", d.log());
    }
    // Copies received by the killed replay come back after the 3 s visibility timeout.
    let all_back = wait_until(Duration::from_secs(20), || list_json(&moto, &dlq_url)["total"] == N);
    assert!(all_back, "a killed replay took no copy it did not send: {}", list_json(&moto, &dlq_url)["total"]);
    {
        let proxy = ThrottleProxy::start(&moto, 0.3);
        let mut d = Outboxd::spawn_with_env(&replay_args(&proxy.url), ENV);
        let sent = wait_until(Duration::from_secs(60), || d.log().contains("sent "));
        d.kill9();
        assert!(sent, "{}", d.log());
    }
    // Past the 3 s visibility timeout of what the killed replay received, with room for a slow moto.
    std::thread::sleep(Duration::from_secs(8));
    let (code, out) = {
        let mut d = Outboxd::spawn_with_env(&replay_args(&moto.url), ENV);
        let status = d.wait_exit(Duration::from_secs(120));
        (status.and_then(|s| s.code()), d.log())
    };
    assert_eq!(code, Some(0), "{out}");
    let got = moto.drain_queue(&queue, 1);
    let seen: HashSet<String> =
        got.iter().filter_map(|m| attr(m, "id")).map(|v| String::from_utf8(v).expect("id")).collect();
    let lost: Vec<&String> = ids.difference(&seen).collect();
    assert!(lost.is_empty(), "{} of {N} events lost by the interrupted replays: {lost:?}\n{out}", lost.len());
    assert!(got.len() >= N, "{}", got.len());
    assert_eq!(list_json(&moto, &dlq_url)["total"], 0, "{out}");
}
