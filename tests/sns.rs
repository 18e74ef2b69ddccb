//! `--sink sns` against a local SNS (moto's server mode, one per test, from `scripts/aws`) that
//! delivers to a subscribed SQS queue (a FIFO topic to a FIFO queue, raw message delivery so the
//! attributes survive), read back with boto3 in the queue's order: kill -9 cycles under a steady
//! writer lose nothing, store nothing twice (SNS's FIFO deduplication on the event id drops what
//! the restarts resend) and keep each key's order; throttled PublishBatch calls lose nothing and
//! reorder no key; an event SNS cannot take is dead-lettered to its SQS queue, where
//! `outboxd dlq --sink sqs` reads it; `outboxd check` verifies the topic.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
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

fn spawn(a: &[String]) -> Outboxd {
    let d = Outboxd::spawn_with_env(a, ENV);
    assert!(d.wait_for_streaming(Duration::from_secs(60)), "{}", d.log());
    d
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

/// Every event of the outbox arrived once, and each key's in commit order (`n` rising); the
/// group id is the key and the deduplication id the event id.
fn assert_all_once_in_key_order(pg: &PgCluster, msgs: &[SqsMessage], log: &str) {
    let ids: HashSet<String> = pg.psql("SELECT event_id FROM outbox").lines().map(str::to_owned).collect();
    let got: Vec<String> = msgs.iter().map(|m| attr(m, "id").expect("id attribute")).collect();
    let unique: HashSet<&String> = got.iter().collect();
    assert_eq!(unique.len(), got.len(), "duplicates in a FIFO topic's queue within its deduplication window");
    let missing: Vec<&String> = ids.iter().filter(|i| !unique.contains(i)).collect();
    assert!(missing.is_empty(), "{} of {} events lost: {missing:?}\n{log}", missing.len(), ids.len());
    let mut last: HashMap<String, u64> = HashMap::new();
    for m in msgs {
        let key = attr(m, "key").expect("key attribute");
        assert_eq!(m.group.as_deref(), Some(key.as_str()), "group id is the key");
        assert_eq!(m.dedup, attr(m, "id"), "deduplication id is the event id");
        let v: serde_json::Value = serde_json::from_slice(&m.body).expect("JSON body");
        let n = v["n"].as_u64().expect("n");
        let prev = last.insert(key.clone(), n);
        assert!(prev.is_none_or(|p| p < n), "key {key}: {n} after {prev:?}");
    }
}

/// A writer committing one transaction of `keys` rows (one per key, payload `{"n": N}` with N
/// counting up) every 150 ms until stopped; its count of rows written.
struct Writer {
    stop: Arc<AtomicBool>,
    rows: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(url: String, keys: u64) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let rows = Arc::new(AtomicU64::new(0));
        let (s, r) = (stop.clone(), rows.clone());
        let handle = std::thread::spawn(move || {
            let mut t = 0u64;
            while !s.load(Ordering::Relaxed) {
                let sql = format!(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                     SELECT 't', 'k' || g, 'load', jsonb_build_object('n', {t} * {keys} + g) \
                     FROM generate_series(1, {keys}) g"
                );
                let ok = std::process::Command::new(pg_bindir().join("psql"))
                    .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &url, "-c", &sql])
                    .output()
                    .is_ok_and(|o| o.status.success());
                assert!(ok, "the writer's INSERT failed");
                t += 1;
                r.store(t * keys, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(150));
            }
        });
        Writer { stop, rows, handle: Some(handle) }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().expect("once").join().expect("writer thread");
        self.rows.load(Ordering::Relaxed)
    }
}

/// Three kill -9 cycles while a writer commits steadily, on a FIFO topic: every event reaches
/// the subscribed FIFO queue, none twice (each restart resends what was not confirmed, and SNS
/// drops it by the event id), each key's in commit order.
#[test]
fn fifo_topic_kill9_cycles_under_a_steady_writer_lose_nothing_duplicate_nothing_and_keep_key_order() {
    let moto = Moto::start();
    let (topic, queue) = fifo_topic(&moto, "orders");
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let a = sns_args(&pg, &moto.url, &topic, &["--on-bad-event", "fail"]);
    let mut d = spawn(&a);
    let writer = Writer::start(pg.url(), 6);
    for cycle in 0..3 {
        std::thread::sleep(Duration::from_millis(2000));
        d.kill9();
        eprintln!("cycle {cycle}: killed with {} rows written", writer.rows.load(Ordering::Relaxed));
        d = spawn(&a);
    }
    std::thread::sleep(Duration::from_secs(1));
    let written = writer.finish();
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(120)), "slot behind\n{}", d.log());
    let msgs = moto.drain_queue(&queue, 2);
    assert_all_once_in_key_order(&pg, &msgs, &d.log());
    eprintln!("{written} events through 3 kill -9 cycles, each delivered once, in key order");
    d.stop_cleanly();
}

/// The events a restart resends are dropped by FIFO deduplication on the event id: a relay whose
/// confirmations never reach PostgreSQL (`--status-interval` longer than the test) publishes
/// every event, is killed, and the next one publishes them all again from the slot's start; the
/// queue still holds each event once.
#[test]
fn a_restart_resending_everything_is_deduplicated_by_the_event_id() {
    let moto = Moto::start();
    let (topic, queue) = fifo_topic(&moto, "resent");
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut slow = sns_args(&pg, &moto.url, &topic, &["--on-bad-event", "fail"]);
    let at = slow.iter().position(|s| s == "200ms").expect("status interval");
    slow[at] = "600s".into();
    slow.extend(args(&["--health-stall-timeout", "0"]));
    let mut d = spawn(&slow);
    pg.insert_load("t", 4, 5, 3);
    let total: usize = pg.psql("SELECT count(*) FROM outbox").trim().parse().expect("count");
    let end = pg.current_lsn();
    // moto deduplicates in the FIFO queue, against the messages it still holds (AWS does so at
    // the topic, for 5 minutes): so nothing is received before the second relay has run.
    let count = || moto.client(&["queue-count", &queue]).trim().parse::<usize>().expect("count");
    assert!(wait_until(Duration::from_secs(30), || count() == total), "the first relay published {}", count());
    d.kill9();
    // Nothing confirmed: the next relay reads (and publishes) every event again.
    assert!(!pg.slot_confirmed_at_least(&end), "the slot moved; nothing would be resent");
    let mut d = spawn(&sns_args(&pg, &moto.url, &topic, &["--on-bad-event", "fail"]));
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(60)), "slot behind\n{}", d.log());
    let got = moto.drain_queue(&queue, 2);
    let ids: Vec<String> = got.iter().map(|m| attr(m, "id").expect("id attribute")).collect();
    let unique: HashSet<String> = ids.iter().cloned().collect();
    assert_eq!(unique.len(), ids.len(), "{} events stored twice", ids.len() - unique.len());
    let want: HashSet<String> = pg.psql("SELECT event_id FROM outbox").lines().map(str::to_owned).collect();
    assert_eq!(unique, want, "lost: {:?}; extra: {:?}", want.difference(&unique), unique.difference(&want));
    assert_eq!(ids.len(), total);
    d.stop_cleanly();
}

/// A share of PublishBatch calls answered Throttled (a proxy in front of moto), on a FIFO topic:
/// nothing lost, nothing twice, no key reordered.
#[test]
fn throttled_calls_lose_nothing_and_reorder_no_key() {
    let moto = Moto::start();
    let (topic, queue) = fifo_topic(&moto, "throttled");
    let proxy = ThrottleProxy::start(&moto, 0.3);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = spawn(&sns_args(&pg, &proxy.url, &topic, &["--on-bad-event", "fail"]));
    pg.insert_load("t", 6, 6, 20);
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(120)), "slot behind\n{}", d.log());
    let (whole, _) = proxy.injected();
    assert!(whole > 0, "nothing injected");
    let msgs = moto.drain_queue(&queue, 2);
    assert_all_once_in_key_order(&pg, &msgs, &d.log());
    eprintln!("{} events through {whole} throttled calls, in key order", msgs.len());
    d.stop_cleanly();
}

/// An event over SNS's 256 KiB is dead-lettered to `--sns-dlq-queue-url`; the events around it
/// are published; `outboxd dlq list --sink sqs` on that queue shows it with its reason.
/// `outboxd check` verifies the topic (and says FIFO), and refuses a topic that is not there.
#[test]
fn an_oversized_event_is_dead_lettered_to_its_queue_and_check_verifies_the_topic() {
    let moto = Moto::start();
    let (topic, queue) = fifo_topic(&moto, "big");
    let dlq = moto.create_queue("big-dlq", false);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let flags = ["--on-bad-event", "dlq", "--sns-dlq-queue-url", dlq.as_str()];
    let mut d = spawn(&sns_args(&pg, &moto.url, &topic, &flags));
    let before = pg.insert_event("t", "k", Some("e"), "{\"n\": 1}", None);
    let big = pg
        .psql(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('t', 'k', 'e', jsonb_build_object('n', 2, 'p', repeat('y', 300000))) RETURNING event_id",
        )
        .lines()
        .next()
        .expect("event id")
        .to_owned();
    let after = pg.insert_event("t", "k", Some("e"), "{\"n\": 3}", None);
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(60)), "slot behind\n{}", d.log());
    d.stop_cleanly();
    let got: Vec<String> = moto.drain_queue(&queue, 1).iter().filter_map(|m| attr(m, "id")).collect();
    assert_eq!(got, vec![before, after], "the events around it, in order");

    // The queue read as `--sink sqs` sees it, and as `--sink sns` names it.
    for (sink, flag) in [("sqs", "--sqs-dlq-queue-url"), ("sns", "--sns-dlq-queue-url")] {
        let mut list = args(&["dlq", "list", "--sink", sink, flag, &dlq, "--json"]);
        list.extend(args(&["--aws-endpoint-url", &moto.url, "--aws-region", "us-east-1"]));
        let mut l = Outboxd::spawn_with_env(&list, ENV);
        assert!(l.wait_exit(Duration::from_secs(60)).is_some_and(|s| s.success()), "{sink}: {}", l.log());
        let out = l.log();
        let v = out
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["total"].is_number())
            .unwrap_or_else(|| panic!("{sink}: {out}"));
        assert_eq!(v["total"], 1, "{sink}: {v}");
        assert_eq!(
            (v["records"][0]["event_id"].as_str(), v["records"][0]["reason"].as_str()),
            (Some(big.as_str()), Some("too_large")),
            "{sink}"
        );
    }

    let check = |arn: &str| {
        let mut c = args(&["check", "--postgres-url"]);
        c.push(pg.url());
        c.extend(args(&["--sink", "sns", "--sns-topic-arn", arn, "--on-bad-event", "fail"]));
        c.extend(args(&["--aws-endpoint-url", &moto.url, "--aws-region", "us-east-1"]));
        let mut p = Outboxd::spawn_with_env(&c, ENV);
        let s = p.wait_exit(Duration::from_secs(60));
        (s.and_then(|s| s.code()), p.log())
    };
    let (code, out) = check(&topic);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("FIFO topic"), "{out}");
    let (code, out) = check("arn:aws:sns:us-east-1:123456789012:absent.fifo");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("--sns-topic-arn"), "{out}");
}

/// `outboxd dlq replay --sink sns` reads the dead letters in `--sns-dlq-queue-url` and publishes
/// them to the topic: an event refused by its contract (`--schema-dir`) is dead-lettered; replayed,
/// it reaches the subscribed FIFO queue as the relay would have published it (the body byte for
/// byte, the `id` and `key` attributes, none of `outboxd.*`, group id = key, deduplication id =
/// event id), and its copy is deleted.
#[test]
fn dlq_replay_publishes_a_dead_letter_to_the_topic_byte_for_byte() {
    let moto = Moto::start();
    let (topic, queue) = fifo_topic(&moto, "replayed");
    let dlq = moto.create_queue("replayed-dlq", false);
    let schemas = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        schemas.path().join("e.json"),
        r#"{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}"#,
    )
    .expect("schema");
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let dir = schemas.path().to_str().expect("path");
    let flags = ["--on-bad-event", "dlq", "--sns-dlq-queue-url", dlq.as_str(), "--schema-dir", dir];
    let mut d = spawn(&sns_args(&pg, &moto.url, &topic, &flags));
    let bad_payload = "{\"n\": -1, \"s\": \"caf\u{e9}\"}";
    let ok = pg.insert_event("t", "k", Some("e"), "{\"n\": 1}", None);
    let bad = pg.insert_event("t", "k", Some("e"), bad_payload, None);
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(60)), "slot behind\n{}", d.log());
    d.stop_cleanly();
    let got: Vec<String> = moto.drain_queue(&queue, 1).iter().filter_map(|m| attr(m, "id")).collect();
    assert_eq!(got, vec![ok], "only the event its contract takes");

    let mut replay = args(&["dlq", "replay", "--sink", "sns", "--sns-dlq-queue-url", &dlq, "--sns-topic-arn", &topic]);
    replay.extend(args(&["--aws-endpoint-url", &moto.url, "--aws-region", "us-east-1"]));
    let mut r = Outboxd::spawn_with_env(&replay, ENV);
    assert!(r.wait_exit(Duration::from_secs(60)).is_some_and(|s| s.success()), "{}", r.log());
    assert!(r.log().contains("replayed 1,"), "{}", r.log());
    let back = moto.drain_queue(&queue, 1);
    assert_eq!(back.len(), 1, "{back:?}");
    let m = &back[0];
    assert!(m.body == bad_payload.as_bytes(), "the body differs: {:?}", String::from_utf8_lossy(&m.body));
    let mut names: Vec<(String, String)> =
        m.attributes.iter().map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned())).collect();
    names.sort();
    assert_eq!(names, vec![("id".to_owned(), bad.clone()), ("key".to_owned(), "k".to_owned())]);
    assert_eq!((m.group.as_deref(), m.dedup.as_deref()), (Some("k"), Some(bad.as_str())));
    assert!(moto.drain_queue(&dlq, 1).is_empty(), "the replayed copy is deleted");
}
