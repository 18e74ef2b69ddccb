//! The two example workers (examples/inbox_worker.rs and examples/inbox/worker.py) against a real
//! inbox: `outboxd inbox` fills it from Apache Kafka under a steady producer while two workers of
//! each language claim rows and are killed with SIGKILL (and started again) every 0.7 s.
//!
//! The workers' effect is a row in `inbox_demo_effects` keyed by the inbox row's `seq`, which the
//! test creates beforehand with one more column, `n`, an identity: the order in which the effects
//! were inserted. A key's next row can be claimed only after the transaction that processed the
//! previous one committed, so within a key, effects in `n` order must be in `seq` order. At the
//! end every inbox row is processed and has exactly one effect: a row processed twice would
//! break the primary key (and end that worker, which the test would see), one never processed
//! stays unprocessed, and a key processed out of order breaks the `n`/`seq` order.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "workers.events";
const KEYS: usize = 25;
const TOTAL: usize = 4_000;
const KILLS: usize = 20;

/// The Rust example, built by cargo on demand (`cargo test --test` builds no example).
fn rust_worker() -> PathBuf {
    let ok = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--example", "inbox_worker"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build --example inbox_worker");
    assert!(ok.success(), "cargo build --example inbox_worker failed");
    // This test runs from target/<profile>/deps/; the example is in target/<profile>/examples/.
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples").join("inbox_worker")
}

/// A Python 3 that imports psycopg (scripts/lib.sh installs Debian's python3-psycopg).
fn python() -> &'static str {
    static FOUND: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    FOUND.get_or_init(|| {
        ["python3", "/usr/bin/python3"]
            .into_iter()
            .find(|p| Command::new(p).args(["-c", "import psycopg"]).status().is_ok_and(|s| s.success()))
            .expect("no python3 with psycopg: run scripts/lib.sh's ensure_tools")
    })
}

struct Worker {
    rust: bool,
    child: Child,
    log: PathBuf,
}

fn spawn(rust: bool, url: &str, rust_bin: &PathBuf, dir: &std::path::Path, i: usize) -> Worker {
    let log = dir.join(format!("worker-{i}.log"));
    let out = std::fs::File::create(&log).unwrap();
    let mut cmd = if rust {
        Command::new(rust_bin)
    } else {
        let mut c = Command::new(python());
        c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/inbox/worker.py"));
        c
    };
    let child =
        cmd.arg(url).stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out).spawn().expect("spawn worker");
    Worker { rust, child, log }
}

fn produce(bootstrap: &str) {
    let mut cfg = rdkafka::ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5");
    let producer: BaseProducer = cfg.create().expect("producer");
    let t0 = Instant::now();
    for i in 0..TOTAL {
        let (id, key) = (format!("e{i}"), format!("k{}", i % KEYS));
        let payload = serde_json::json!({ "i": i }).to_string();
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
        let mut rec = BaseRecord::to(TOPIC).key(&key).payload(&payload).headers(headers);
        while let Err((_, r)) = producer.send(rec) {
            producer.poll(Duration::from_millis(10));
            rec = r;
        }
        producer.poll(Duration::ZERO);
        // About 200 events a second (20 s): the kills land while rows arrive.
        if let Some(wait) =
            (t0 + Duration::from_secs_f64((i + 1) as f64 / 200.0)).checked_duration_since(Instant::now())
        {
            std::thread::sleep(wait);
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

#[test]
fn four_example_workers_killed_at_random_process_every_row_once_and_each_key_in_order() {
    let pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, 4);
    let rust_bin = rust_worker();
    let mut inbox = Outboxd::spawn(&args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--topics",
        TOPIC,
        "--metrics-addr",
        "off",
    ]));
    assert!(
        wait_until(Duration::from_secs(30), || {
            pg.psql("SELECT to_regprocedure('public.inbox_claim(integer)') IS NOT NULL").trim() == "t"
        }),
        "no inbox schema:\n{}",
        inbox.log()
    );
    pg.psql(
        "CREATE TABLE inbox_demo_effects (seq bigint PRIMARY KEY, event_id text, \
                                          n bigint GENERATED ALWAYS AS IDENTITY UNIQUE)",
    );
    let dir = tempfile::Builder::new().prefix("inbox-workers-").tempdir().expect("tempdir");
    let url = pg.url();
    let mut workers: Vec<Worker> = (0..4).map(|i| spawn(i % 2 == 0, &url, &rust_bin, dir.path(), i)).collect();
    let bootstrap = broker.admin_bootstrap();
    let producer = std::thread::spawn(move || produce(&bootstrap));
    // Kill a worker every 0.7 s, in turn, and start one of the same language in its place.
    let (mut kills, mut next_log) = (0, 4);
    while kills < KILLS {
        std::thread::sleep(Duration::from_millis(700));
        let w = &mut workers[kills % 4];
        if let Some(st) = w.child.try_wait().unwrap() {
            panic!("a worker ended by itself ({st}):\n{}", std::fs::read_to_string(&w.log).unwrap_or_default());
        }
        w.child.kill().unwrap();
        w.child.wait().unwrap();
        let rust = w.rust;
        *w = spawn(rust, &url, &rust_bin, dir.path(), next_log);
        next_log += 1;
        kills += 1;
    }
    let producing = !producer.is_finished();
    producer.join().expect("producer");
    assert!(producing, "the producer finished before the last kill: the kills did not all land under load");
    let done =
        || pg.psql("SELECT count(*) FILTER (WHERE processed_at IS NOT NULL) FROM public.inbox").trim().to_owned();
    assert!(
        wait_until(Duration::from_secs(60), || done() == TOTAL.to_string()),
        "{} of {TOTAL} rows processed; inbox:\n{}",
        done(),
        inbox.log()
    );
    for w in &mut workers {
        if let Some(st) = w.child.try_wait().unwrap() {
            panic!("a worker ended by itself ({st}):\n{}", std::fs::read_to_string(&w.log).unwrap_or_default());
        }
        let _ = w.child.kill();
        let _ = w.child.wait();
    }
    assert_eq!(pg.psql("SELECT count(*) FROM public.inbox").trim(), TOTAL.to_string());
    // Every row has exactly one effect (the primary key forbids two), and no effect is extra.
    let missing =
        pg.psql("SELECT count(*) FROM public.inbox i LEFT JOIN inbox_demo_effects e USING (seq) WHERE e.seq IS NULL");
    assert_eq!(missing.trim(), "0", "rows processed without their effect");
    assert_eq!(pg.psql("SELECT count(*) FROM inbox_demo_effects").trim(), TOTAL.to_string());
    // Within each key, the effects' insertion order is the rows' order.
    let out_of_order = pg.psql(
        "SELECT count(*) FROM (SELECT e.seq, lag(e.seq) OVER (PARTITION BY i.aggregate_key ORDER BY e.n) AS prev \
                                 FROM inbox_demo_effects e JOIN public.inbox i USING (seq)) x \
          WHERE prev > seq",
    );
    assert_eq!(out_of_order.trim(), "0", "a key's rows were processed out of order");
    // Both languages did work, through the kills.
    let logs: Vec<(bool, String)> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
        .map(|s| (s.contains("key=Some("), s))
        .collect();
    assert!(logs.iter().any(|(rust, s)| *rust && !s.is_empty()), "the Rust workers processed nothing");
    assert!(
        logs.iter().any(|(rust, s)| !*rust && s.lines().any(|l| l.contains(" e"))),
        "the Python workers processed nothing"
    );
    eprintln!("{kills} worker kills");
    inbox.stop_cleanly();
}
