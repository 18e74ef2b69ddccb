//! `--sink kinesis` against a local Kinesis (moto's server mode, one per test, from `scripts/aws`):
//! kill -9 cycles under a steady writer lose nothing and keep each key's order (what a restart
//! resends is read again: Kinesis has no deduplication); an event over Kinesis's record limit is
//! dead-lettered to its own stream byte for byte; `outboxd check` verifies the stream.
//! Records are read back with boto3 (`tools/aws/kinesis.py`), each shard in sequence order.

mod common;
#[path = "common/kinesis.rs"]
mod kinesis_common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::aws::Moto;
use common::*;
use kinesis_common::*;

/// Three kill -9 cycles while a writer commits steadily, to a stream of 2 shards: every event is
/// in the stream, each key's events in commit order (a resent event is read again, but no event
/// of a key arrives before an earlier one), and the partition key is the record key.
#[test]
fn kill9_cycles_under_a_steady_writer_lose_nothing_and_keep_key_order() {
    let moto = Moto::start();
    create_stream(&moto, "orders", 2);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let a = kinesis_args(&pg, &moto.url, "orders", &["--on-bad-event", "fail"]);
    // The daemon first: it creates the slot, and rows committed before it exists are not in it.
    let mut d = spawn(&a, &[]);
    let writer = Writer::start(pg.url(), 8, Duration::from_millis(100));
    for cycle in 0..3 {
        std::thread::sleep(Duration::from_millis(2000));
        d.kill9();
        eprintln!("cycle {cycle}: killed with {} rows written", writer.rows.load(Ordering::Relaxed));
        d = spawn(&a, &[]);
    }
    std::thread::sleep(Duration::from_secs(1));
    let written = writer.finish();
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(120)), "slot behind\n{}", d.log());
    let records = read_stream(&moto, "orders");
    let v = judge(&records);
    let want: BTreeSet<u64> = (1..=written).collect();
    let missing: Vec<&u64> = want.difference(&v.seen).collect();
    assert!(missing.is_empty(), "{} of {written} events lost: {missing:?}\n{}", missing.len(), d.log());
    assert!(v.reordered.is_empty(), "key order broken: {:?}", &v.reordered[..v.reordered.len().min(10)]);
    let mut shard_of: HashMap<&str, &str> = HashMap::new();
    for r in &records {
        assert!(r.pk.starts_with('k'), "partition key {} is not the record key", r.pk);
        let s = shard_of.entry(&r.pk).or_insert(&r.shard);
        assert_eq!(*s, r.shard, "key {} in two shards", r.pk);
    }
    let shards: BTreeSet<&str> = shard_of.values().copied().collect();
    assert_eq!(shards.len(), 2, "8 keys over both shards");
    eprintln!("{written} events through 3 kill -9 cycles, in key order; {} resent after the kills", v.resent);
    d.stop_cleanly();
}

fn b64(s: &serde_json::Value) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s.as_str().expect("base64 text")).expect("base64")
}

/// An event over Kinesis's 1 MiB record limit is a bad event: it goes to --kinesis-dlq-stream as
/// chunked copies (JSON envelopes with the key, headers and payload in base64) whose joined
/// payload is the event's byte for byte; the events around it reach the stream, in order, and the
/// slot moves past all of them.
#[test]
fn oversized_event_is_dead_lettered_to_its_stream_byte_for_byte() {
    let moto = Moto::start();
    create_stream(&moto, "small", 1);
    create_stream(&moto, "small-dlq", 1);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let a = kinesis_args(&pg, &moto.url, "small", &["--kinesis-dlq-stream", "small-dlq"]);
    let mut d = spawn(&a, &[]);
    pg.insert_event("t", "a", Some("fits"), "{\"n\": 1}", None);
    // Built in SQL: a 1.1 MiB literal would not fit one argument of psql's command line.
    let big = pg
        .psql(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES \
             ('t', 'a', 'huge', jsonb_build_object('n', 2, 'blob', repeat('y', 1100 * 1024))) RETURNING event_id",
        )
        .lines()
        .next()
        .expect("event id")
        .to_owned();
    pg.insert_event("t", "a", Some("fits"), "{\"n\": 3}", None);
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(60)), "slot behind\n{}", d.log());
    let main = read_stream(&moto, "small");
    let ns: Vec<u64> = main
        .iter()
        .map(|r| serde_json::from_slice::<serde_json::Value>(&r.data).expect("JSON")["n"].as_u64().expect("n"))
        .collect();
    assert_eq!(ns, vec![1, 3], "the stream holds the two small events, in order");
    assert!(main.iter().all(|r| r.pk == "a"), "partition key = the record key");
    let copies = read_stream(&moto, "small-dlq");
    assert!(copies.len() >= 2, "a 1.1 MiB payload is chunked into copies under 1 MiB: {}", copies.len());
    let mut parts: Vec<(u64, Vec<u8>)> = Vec::new();
    for c in &copies {
        assert!(c.data.len() <= 1024 * 1024, "a copy of {} bytes", c.data.len());
        let env: serde_json::Value = serde_json::from_slice(&c.data).expect("JSON envelope");
        let headers: HashMap<String, String> = env["headers"]
            .as_array()
            .expect("headers")
            .iter()
            .map(|h| (h[0].as_str().expect("name").to_owned(), String::from_utf8(b64(&h[1])).expect("UTF-8")))
            .collect();
        assert_eq!(headers.get("id"), Some(&big), "{headers:?}");
        assert_eq!(headers.get("outboxd.error").map(String::as_str), Some("too_large"));
        assert_eq!(b64(&env["key"]), b"a");
        let index = headers["outboxd.chunk.index"].parse().expect("chunk index");
        parts.push((index, b64(&env["payload"])));
    }
    parts.sort();
    let joined: Vec<u8> = parts.into_iter().flat_map(|(_, p)| p).collect();
    let stored = pg.psql(&format!("SELECT payload::text FROM outbox WHERE event_id = '{big}'"));
    assert_eq!(joined.len(), stored.len());
    assert!(joined == stored.as_bytes(), "the copies' payload, byte for byte");
    d.stop_cleanly();
}

/// `outboxd check` passes for an ACTIVE stream whose empty PutRecords is not refused (nothing is
/// written), and
/// fails, naming the flag, for one that is not there; `outboxd config` shows the Kinesis and AWS
/// flags and nothing secret.
#[test]
fn check_verifies_the_stream_and_config_shows_no_secret() {
    let moto = Moto::start();
    create_stream(&moto, "checked", 1);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let base = |s: &str| {
        let mut a = args(&["check", "--postgres-url"]);
        a.push(pg.url());
        a.extend(args(&["--sink", "kinesis", "--on-bad-event", "fail", "--aws-region", "us-east-1"]));
        a.extend(args(&["--aws-endpoint-url", &moto.url, "--kinesis-stream", s]));
        a
    };
    let run = |a: Vec<String>| {
        let out = std::process::Command::new(outboxd_bin()).args(&a).envs(ENV.iter().copied()).output().expect("check");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let (code, text) = run(base("checked"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("checked: ACTIVE") && text.contains("PutRecords not refused"), "{text}");
    assert!(read_stream(&moto, "checked").is_empty(), "check wrote a record");
    let (code, text) = run(base("absent"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("--kinesis-stream absent") && text.contains("ResourceNotFound"), "{text}");
    let mut c = base("checked");
    c[0] = "config".into();
    let (code, text) = run(c);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("--kinesis-stream") && text.contains("--aws-endpoint-url"), "{text}");
    assert!(!text.contains("test-secret"), "{text}");
}
