//! `--sink sns` and `outboxd dlq --sink sns` at their edges, against a local SNS (moto's server
//! mode, one per test, from `scripts/aws`) delivering to a subscribed FIFO queue: PublishBatch
//! entries that fail one by one (a proxy in front of moto answers part of a call's entries
//! Throttled, and refuses the entries it is told to with SNS's per-entry codes) lose nothing,
//! reorder no key, and send the refused events to `--on-bad-event`; and `dlq replay --event-id`
//! on a FIFO dead-letter queue, where copies of its key held before it keep SQS from handing it
//! out, exits non-zero naming what it did not reach instead of reporting success.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::aws::{Moto, SqsMessage, ThrottleProxy};
use common::*;

/// moto takes any credentials; these keep the SDK from looking for real ones.
const ENV: &[(&str, &str)] = &[("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test-secret")];

fn sns_args(pg: &PgCluster, endpoint: &str, topic: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["--sink", "sns", "--sns-topic-arn", topic, "--aws-endpoint-url", endpoint];
    a.extend(["--aws-region", "us-east-1", "--status-interval", "200ms"]);
    a.extend(extra);
    daemon_args_pg_only(pg, &a)
}

fn attr(m: &SqsMessage, name: &str) -> Option<String> {
    m.attributes.iter().find(|(k, _)| k == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

/// A FIFO topic with a FIFO queue subscribed (raw delivery): (topic ARN, queue URL).
fn fifo_topic(moto: &Moto, name: &str) -> (String, String) {
    let topic = moto.client(&["create-topic", &format!("{name}.fifo"), "fifo"]).trim().to_owned();
    let queue = moto.create_queue(&format!("{name}-sub.fifo"), true);
    moto.client(&["subscribe-queue", &topic, &queue]);
    (topic, queue)
}

/// `outboxd dlq CMD --sink sns --sns-dlq-queue-url DLQ ...`: its exit code and output.
fn dlq(cmd: &str, moto: &Moto, dlq: &str, extra: &[&str]) -> (Option<i32>, String) {
    let mut a = args(&["dlq", cmd, "--sink", "sns", "--sns-dlq-queue-url", dlq, "--aws-endpoint-url", &moto.url]);
    a.extend(args(&["--aws-region", "us-east-1", "--sqs-visibility-timeout", "5s", "--read-timeout", "20s"]));
    a.extend(args(extra));
    let mut d = Outboxd::spawn_with_env(&a, ENV);
    let status = d.wait_exit(Duration::from_secs(120));
    if status.is_none() {
        d.kill9();
    }
    (status.and_then(|s| s.code()), d.log())
}

/// A share of PublishBatch calls comes back with part of its entries Failed (Throttled), and
/// two events are refused per entry by SNS's codes (ParameterValueInvalid, InvalidParameter):
/// entries were failed and sent again, every other event reached the queue exactly once, each
/// key in commit order; the two refused ones are dead-lettered (not a stop of the relay), and
/// `dlq list --sink sns` shows them.
#[test]
fn per_entry_failures_lose_nothing_keep_key_order_and_refused_entries_are_dead_lettered() {
    let moto = Moto::start();
    let (topic, queue) = fifo_topic(&moto, "entries");
    let dlq_url = moto.create_queue("entries-dlq", false);
    let proxy = ThrottleProxy::start_mode(&moto, 0.5, Some("sns-entries"));
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let flags = ["--on-bad-event", "dlq", "--sns-dlq-queue-url", dlq_url.as_str()];
    let mut d = Outboxd::spawn_with_env(&sns_args(&pg, &proxy.url, &topic, &flags), ENV);
    assert!(d.wait_for_streaming(Duration::from_secs(60)), "{}", d.log());
    pg.insert_load("t", 6, 6, 20);
    let pvi = pg.insert_event("t", "k0", Some("e"), "{\"n\": 100000, \"m\": \"refuse-pvi\"}", None);
    let ip = pg.insert_event("t", "k1", Some("e"), "{\"n\": 100001, \"m\": \"refuse-ip\"}", None);
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(120)), "slot behind\n{}", d.log());
    assert!(d.is_running(), "a refused entry stopped the relay\n{}", d.log());
    let (_, entries) = proxy.injected();
    assert!(entries > 0, "no entry failed");

    let refused: HashSet<String> = [pvi.clone(), ip.clone()].into();
    let want: HashSet<String> =
        pg.psql("SELECT event_id FROM outbox").lines().map(str::to_owned).filter(|i| !refused.contains(i)).collect();
    let msgs = moto.drain_queue(&queue, 2);
    let got: Vec<String> = msgs.iter().map(|m| attr(m, "id").expect("id attribute")).collect();
    let unique: HashSet<String> = got.iter().cloned().collect();
    assert_eq!(unique.len(), got.len(), "an event stored twice");
    assert_eq!(unique, want, "lost: {:?}; extra: {:?}", want.difference(&unique), unique.difference(&want));
    let mut last: HashMap<String, u64> = HashMap::new();
    for m in &msgs {
        let key = attr(m, "key").expect("key attribute");
        let v: serde_json::Value = serde_json::from_slice(&m.body).expect("JSON body");
        let n = v["n"].as_u64().expect("n");
        let prev = last.insert(key.clone(), n);
        assert!(prev.is_none_or(|p| p < n), "key {key}: {n} after {prev:?}");
    }
    d.stop_cleanly();
    eprintln!("{} events through {entries} per-entry throttles, in key order", msgs.len());

    let (code, out) = dlq("list", &moto, &dlq_url, &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let v = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["total"].is_number())
        .unwrap_or_else(|| panic!("{out}"));
    let listed: HashSet<String> = v["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| r["event_id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(listed, refused, "{v}");
}

/// On a FIFO dead-letter queue, `dlq replay --event-id E` with twelve copies of E's key before
/// it: the copies it reads and filters out are held, so SQS hands out no more of the group and E
/// is never read. Replay says how many it did not reach and exits non-zero; nothing is lost.
#[test]
fn replay_of_an_event_behind_held_copies_of_its_key_exits_non_zero_naming_them() {
    let moto = Moto::start();
    let (topic, _queue) = fifo_topic(&moto, "behind");
    let dlq_url = moto.create_queue("behind-dlq.fifo", true);
    let schemas = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        schemas.path().join("e.json"),
        r#"{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}"#,
    )
    .expect("schema");
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let dir = schemas.path().to_str().expect("path");
    let flags = ["--on-bad-event", "dlq", "--sns-dlq-queue-url", dlq_url.as_str(), "--schema-dir", dir];
    let mut d = Outboxd::spawn_with_env(&sns_args(&pg, &moto.url, &topic, &flags), ENV);
    assert!(d.wait_for_streaming(Duration::from_secs(60)), "{}", d.log());
    let ids: Vec<String> =
        (1..=13).map(|n| pg.insert_event("t", "k", Some("e"), &format!("{{\"n\": -{n}}}"), None)).collect();
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(60)), "slot behind\n{}", d.log());
    d.stop_cleanly();

    let last = ids.last().expect("ids");
    let (code, out) = dlq("replay", &moto, &dlq_url, &["--event-id", last, "--sns-topic-arn", &topic]);
    assert_ne!(code, Some(0), "replay reported success without reaching {last}:\n{out}");
    assert!(out.contains("were not reached") && out.contains(&dlq_url), "{out}");
    let left = moto.drain_queue(&dlq_url, 2);
    assert_eq!(left.len(), ids.len(), "copies lost");
}
