//! `--sink sqs` against a local SQS (moto's server mode, one per test, from `scripts/aws`):
//! kill -9 cycles under a steady writer lose nothing, keep each key's order on a FIFO queue and,
//! through SQS's deduplication on the event id, store nothing twice; an event SQS cannot take is
//! dead-lettered to its own queue byte for byte; `outboxd check` verifies the queue.
//! Messages are read back with boto3 (`tools/aws/client.py`) in the queue's order.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::aws::{Moto, SqsMessage, ThrottleProxy};
use common::*;

fn sqs_args(pg: &PgCluster, moto: &Moto, queue: &str, extra: &[&str]) -> Vec<String> {
    sqs_args_via(pg, &moto.url, queue, extra)
}

fn sqs_args_via(pg: &PgCluster, endpoint: &str, queue: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["--sink", "sqs", "--sqs-queue-url", queue, "--aws-endpoint-url", endpoint];
    a.extend(["--aws-region", "us-east-1", "--status-interval", "200ms"]);
    a.extend(extra);
    daemon_args_pg_only(pg, &a)
}

/// moto takes any credentials; these keep the SDK from looking for real ones.
const ENV: &[(&str, &str)] = &[("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test-secret")];

fn spawn(a: &[String]) -> Outboxd {
    let d = Outboxd::spawn_with_env(a, ENV);
    assert!(d.wait_for_streaming(Duration::from_secs(60)), "{}", d.log());
    d
}

fn attr(m: &SqsMessage, name: &str) -> Option<String> {
    m.attributes.iter().find(|(k, _)| k == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
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

/// Three kill -9 cycles while a writer commits steadily, on a FIFO queue: every event arrives,
/// none twice (SQS's deduplication on the event id drops what the restarts resend), and each key's
/// events in commit order; the group id is the key and the deduplication id the event id.
#[test]
fn fifo_kill9_cycles_under_a_steady_writer_lose_nothing_duplicate_nothing_and_keep_key_order() {
    let moto = Moto::start();
    let queue = moto.create_queue("orders.fifo", true);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let a = sqs_args(&pg, &moto, &queue, &["--on-bad-event", "fail"]);
    // moto's FIFO queues take about 0.2 s per SendMessageBatch on this machine, growing with the
    // queue: a modest writer keeps the test within its time.
    // The daemon first: it creates the slot, and rows committed before it exists are not in it.
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
    let ids: HashSet<String> = pg.psql("SELECT event_id FROM outbox").lines().map(str::to_owned).collect();
    assert_eq!(ids.len() as u64, written);
    let got: Vec<String> = msgs.iter().map(|m| attr(m, "id").expect("id attribute")).collect();
    let unique: HashSet<&String> = got.iter().collect();
    assert_eq!(unique.len(), got.len(), "duplicates in a FIFO queue within its deduplication window");
    let missing: Vec<&String> = ids.iter().filter(|i| !unique.contains(i)).collect();
    if !missing.is_empty() {
        let list = missing.iter().map(|i| format!("'{i}'")).collect::<Vec<_>>().join(",");
        let rows =
            pg.psql(&format!("SELECT aggregate_id, payload->>'n' FROM outbox WHERE event_id IN ({list}) ORDER BY 2"));
        let late = moto.drain_queue(&queue, 35);
        panic!(
            "{} of {written} events lost: {}; {} more messages after a 35 s wait\n{}",
            missing.len(),
            rows.replace('\n', " "),
            late.len(),
            d.log()
        );
    }
    let mut last: HashMap<String, u64> = HashMap::new();
    for m in &msgs {
        let key = attr(m, "key").expect("key attribute");
        assert_eq!(m.group.as_deref(), Some(key.as_str()), "group id is the key");
        assert_eq!(m.dedup, attr(m, "id"), "deduplication id is the event id");
        let v: serde_json::Value = serde_json::from_slice(&m.body).expect("JSON body");
        let n = v["n"].as_u64().expect("n");
        let prev = last.insert(key.clone(), n);
        assert!(prev.is_none_or(|p| p < n), "key {key}: {n} after {prev:?}");
    }
    eprintln!("{written} events through 3 kill -9 cycles, each stored once, in key order");
    d.stop_cleanly();
}

/// A standard queue under kill -9: nothing lost (duplicates are allowed there, at least once).
#[test]
fn standard_queue_kill9_loses_nothing() {
    let moto = Moto::start();
    let queue = moto.create_queue("orders", false);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let a = sqs_args(&pg, &moto, &queue, &["--on-bad-event", "fail"]);
    let mut d = spawn(&a);
    pg.insert_load("t", 5, 4, 100);
    std::thread::sleep(Duration::from_millis(300));
    d.kill9();
    d = spawn(&a);
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(120)), "slot behind\n{}", d.log());
    let msgs = moto.drain_queue(&queue, 2);
    let got: HashSet<String> = msgs.iter().filter_map(|m| attr(m, "id")).collect();
    let ids: HashSet<String> = pg.psql("SELECT event_id FROM outbox").lines().map(str::to_owned).collect();
    assert_eq!(ids.len(), 400);
    assert!(ids.is_subset(&got), "{} events lost", ids.difference(&got).count());
    eprintln!("{} messages for 400 events ({} resent after the kill)", msgs.len(), msgs.len() - 400);
    d.stop_cleanly();
}

/// An event over the queue's MaximumMessageSize is a bad event: it goes to --sqs-dlq-queue-url,
/// whose copy holds the payload byte for byte (base64 in the body) and the reason; the events
/// around it reach the queue and the slot moves past all of them.
#[test]
fn oversized_event_is_dead_lettered_to_its_queue_byte_for_byte() {
    let moto = Moto::start();
    let queue = moto.client(&["create-queue-max", "small", "2048"]).trim().to_owned();
    let dlq = moto.create_queue("small-dlq", false);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let a = sqs_args(&pg, &moto, &queue, &["--sqs-dlq-queue-url", &dlq]);
    let mut d = spawn(&a);
    let small = pg.insert_event("t", "a", Some("fits"), "{\"n\": 1}", None);
    let blob = "y".repeat(5000);
    let big = pg.insert_event("t", "b", Some("huge"), &format!("{{\"blob\": \"{blob}\"}}"), None);
    let after = pg.insert_event("t", "a", Some("fits"), "{\"n\": 2}", None);
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(60)), "slot behind\n{}", d.log());
    let main = moto.drain_queue(&queue, 1);
    // A standard queue: SQS (and moto) hand messages out in any order.
    let ids: HashSet<String> = main.iter().filter_map(|m| attr(m, "id")).collect();
    assert_eq!(ids, HashSet::from([small, after]), "the queue holds the two small events only");
    let copies = moto.drain_queue(&dlq, 1);
    assert_eq!(copies.len(), 1, "one dead-letter copy (sized for the dead-letter queue), not {}", copies.len());
    let c = &copies[0];
    let headers: Vec<(String, String)> =
        serde_json::from_str(&attr(c, "outboxd.headers").expect("headers attribute")).expect("JSON headers");
    let header = |n: &str| {
        use base64::Engine as _;
        headers.iter().find(|(k, _)| k == n).map(|(_, v)| {
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(v).expect("base64")).expect("UTF-8")
        })
    };
    assert_eq!(header("id").as_deref(), Some(big.as_str()));
    assert_eq!(header("outboxd.error").as_deref(), Some("too_large"));
    let body = String::from_utf8(c.body.clone()).expect("text body");
    let payload = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.decode(body.strip_prefix("b64:").expect("b64: body")).expect("base64")
    };
    let stored = pg.psql(&format!("SELECT payload::text FROM outbox WHERE event_id = '{big}'"));
    assert_eq!(String::from_utf8(payload).expect("UTF-8"), stored, "the copy's payload, byte for byte");
    d.stop_cleanly();
}

/// `outboxd check` passes for a queue that is there (saying FIFO or standard), and fails, naming
/// the flag, for one that is not; `outboxd config` shows the AWS flags and nothing secret.
#[test]
fn check_verifies_the_queue_and_config_shows_no_secret() {
    let moto = Moto::start();
    let queue = moto.create_queue("checked.fifo", true);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let base = |q: &str| {
        let mut a = args(&["check", "--postgres-url"]);
        a.push(pg.url());
        a.extend(args(&["--sink", "sqs", "--on-bad-event", "fail", "--aws-region", "us-east-1"]));
        a.extend(args(&["--aws-endpoint-url", &moto.url, "--sqs-queue-url", q]));
        a
    };
    let run = |a: Vec<String>| {
        let out = std::process::Command::new(outboxd_bin()).args(&a).envs(ENV.iter().copied()).output().expect("check");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let (code, text) = run(base(&queue));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("FIFO queue"), "{text}");
    let missing = queue.replace("checked.fifo", "absent.fifo");
    let (code, text) = run(base(&missing));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("--sqs-queue-url") && text.contains("absent.fifo"), "{text}");
    let mut c = base(&queue);
    c[0] = "config".into();
    let (code, text) = run(c);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("--sqs-queue-url") && text.contains("--aws-endpoint-url"), "{text}");
    assert!(!text.contains("test-secret"), "{text}");
}

/// Throttling on a share of calls, whole calls and single entries of a batch (a proxy answering
/// ThrottlingException or marking entries RequestThrottled while SQS stores the others), on a
/// FIFO queue: nothing lost, nothing twice, and no key reordered, so a throttled event was sent
/// again before any later event of its key was accepted.
#[test]
fn throttled_calls_and_entries_lose_nothing_and_reorder_no_key() {
    let moto = Moto::start();
    let queue = moto.create_queue("throttled.fifo", true);
    let proxy = ThrottleProxy::start(&moto, 0.3);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = spawn(&sqs_args_via(&pg, &proxy.url, &queue, &["--on-bad-event", "fail"]));
    pg.insert_load("t", 6, 6, 30);
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(120)), "slot behind\n{}", d.log());
    let (whole, entries) = proxy.injected();
    assert!(whole > 0 && entries > 0, "nothing injected: {whole} calls, {entries} entries");
    let msgs = moto.drain_queue(&queue, 2);
    let ids: HashSet<String> = pg.psql("SELECT event_id FROM outbox").lines().map(str::to_owned).collect();
    let got: Vec<String> = msgs.iter().filter_map(|m| attr(m, "id")).collect();
    let unique: HashSet<&String> = got.iter().collect();
    assert_eq!(unique.len(), got.len(), "duplicates");
    assert_eq!(got.len(), ids.len(), "{} of {} events lost", ids.len() - got.len(), ids.len());
    let mut last: HashMap<String, u64> = HashMap::new();
    for m in &msgs {
        let key = attr(m, "key").expect("key attribute");
        let v: serde_json::Value = serde_json::from_slice(&m.body).expect("JSON body");
        let n = v["n"].as_u64().expect("n");
        let prev = last.insert(key.clone(), n);
        assert!(prev.is_none_or(|p| p < n), "key {key}: {n} after {prev:?}");
    }
    eprintln!("180 events through {whole} throttled calls and {entries} throttled entries, in key order");
    d.stop_cleanly();
}
