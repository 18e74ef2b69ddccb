//! The Kinesis side of the `--sink kinesis` tests (included by them with `#[path]`): streams on a
//! [`Moto`] made and read back with boto3 (`tools/aws/kinesis.py`), the order and loss checks
//! the tests share, and the writer that commits steadily while outboxd is killed.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::aws::Moto;
use crate::common::*;

/// moto takes any credentials; these keep the SDK from looking for real ones.
pub const ENV: &[(&str, &str)] = &[("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test-secret")];

/// One record as read back from a shard.
#[derive(Debug, Clone)]
pub struct KRecord {
    pub shard: String,
    pub pk: String,
    pub data: Vec<u8>,
}

fn tool(moto: &Moto, a: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("scripts/aws"))
        .arg("python")
        .arg(root.join("tools/aws/kinesis.py"))
        .arg(&moto.url)
        .args(a)
        .output()
        .expect("run tools/aws/kinesis.py");
    assert!(out.status.success(), "kinesis.py {a:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Create a stream of `shards` shards (ACTIVE when this returns); its ARN.
pub fn create_stream(moto: &Moto, name: &str, shards: u32) -> String {
    tool(moto, &["create-stream", name, &shards.to_string()]).trim().to_owned()
}

/// Every record of the stream, shard by shard, each shard in sequence order.
pub fn read_stream(moto: &Moto, name: &str) -> Vec<KRecord> {
    use base64::Engine as _;
    tool(moto, &["read-stream", name])
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("kinesis.py line");
            KRecord {
                shard: v["shard"].as_str().unwrap_or_default().to_owned(),
                pk: v["pk"].as_str().unwrap_or_default().to_owned(),
                data: base64::engine::general_purpose::STANDARD
                    .decode(v["data"].as_str().unwrap_or_default())
                    .expect("base64"),
            }
        })
        .collect()
}

/// `run` args for `--sink kinesis` to `stream` through `endpoint`.
pub fn kinesis_args(pg: &PgCluster, endpoint: &str, stream: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["--sink", "kinesis", "--kinesis-stream", stream, "--aws-endpoint-url", endpoint];
    a.extend(["--aws-region", "us-east-1", "--status-interval", "200ms"]);
    a.extend(extra);
    daemon_args_pg_only(pg, &a)
}

pub fn spawn(a: &[String], env: &[(&str, &str)]) -> Outboxd {
    let mut all = ENV.to_vec();
    all.extend_from_slice(env);
    let d = Outboxd::spawn_with_env(a, &all);
    assert!(d.wait_for_streaming(Duration::from_secs(60)), "{}", d.log());
    d
}

/// What the records of a stream show, keyed by partition key with the payload's `n`.
pub struct Verdict {
    /// Distinct `n`s read.
    pub seen: BTreeSet<u64>,
    /// Records read again (a restart resends what was not confirmed).
    pub resent: usize,
    /// Order violations: a new `n` of a key after a greater one (key, n, the greater before it).
    pub reordered: Vec<(String, u64, u64)>,
}

/// Read each shard in order: a key's events are in one shard, so a new `n` of a key must be
/// greater than every `n` of that key before it; an `n` seen before is a resend (allowed: Kinesis
/// has no deduplication), never counted as new.
pub fn judge(records: &[KRecord]) -> Verdict {
    let mut max: HashMap<&str, u64> = HashMap::new();
    let mut v = Verdict { seen: BTreeSet::new(), resent: 0, reordered: Vec::new() };
    for r in records {
        let p: serde_json::Value = serde_json::from_slice(&r.data).expect("JSON data");
        let n = p["n"].as_u64().expect("n");
        if !v.seen.insert(n) {
            v.resent += 1;
            continue;
        }
        let m = max.entry(&r.pk).or_insert(0);
        if n < *m {
            v.reordered.push((r.pk.clone(), n, *m));
        }
        *m = (*m).max(n);
    }
    v
}

/// A writer committing one transaction of `keys` rows (key `k1`..`kKEYS`, payload `{"n": N}`
/// with N counting up) every `pause` until stopped; its count of rows written.
pub struct Writer {
    stop: Arc<AtomicBool>,
    pub rows: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    pub fn start(url: String, keys: u64, pause: Duration) -> Writer {
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
                let ok = Command::new(pg_bindir().join("psql"))
                    .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &url, "-c", &sql])
                    .output()
                    .is_ok_and(|o| o.status.success());
                assert!(ok, "the writer's INSERT failed");
                t += 1;
                r.store(t * keys, Ordering::Relaxed);
                std::thread::sleep(pause);
            }
        });
        Writer { stop, rows, handle: Some(handle) }
    }

    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().expect("once").join().expect("writer thread");
        self.rows.load(Ordering::Relaxed)
    }
}
