//! `outboxd dlq list|replay --sink kinesis` against a local Kinesis (moto's server mode): events
//! the stream refused (a proxy refuses records holding "refuse-me", as Kinesis refuses a record
//! for good) are dead-lettered to `--kinesis-dlq-stream` (two shards, so one key's copies are in
//! both); once the cause is gone (replay goes straight to moto) they are listed, then replayed
//! byte for byte, each key in its order. A replay killed midway (after its first batch of 1000
//! events was written to the progress file, before the last) loses nothing: the next run resumes
//! from the file and sends what it does not name as done (the killed run's unrecorded sends twice),
//! a run after that sends nothing, and each key's order holds over everything replayed.

mod common;
#[path = "common/kinesis.rs"]
mod kinesis_common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::aws::{Moto, ThrottleProxy};
use common::*;
use kinesis_common::*;

/// Events; a third are refused: 1500 copies, more than the tool's batch of 1000, so a replay
/// saves its progress once before its last batch.
const N: u64 = 4500;
/// Keys: an event's is `k<n % KEYS>`. Few enough that a batch takes many calls (one event of a
/// key a call), so the kill lands in the middle of the last one.
const KEYS: u64 = 20;

/// Whether event `n` is one the proxy refuses.
fn refused(n: u64) -> bool {
    n % 3 == 0
}

fn dlq_args(cmd: &str, endpoint: &str, state: &std::path::Path, extra: &[&str]) -> Vec<String> {
    dlq_args_for("main-dlq", cmd, endpoint, state, extra)
}

/// [`dlq_args`] for the dead-letter stream given as `dlq` (a name or an ARN).
fn dlq_args_for(dlq: &str, cmd: &str, endpoint: &str, state: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut a = args(&["dlq", cmd, "--sink", "kinesis", "--kinesis-dlq-stream", dlq]);
    a.extend(args(&["--aws-endpoint-url", endpoint, "--aws-region", "us-east-1", "--read-timeout", "20s"]));
    if cmd == "replay" {
        a.extend(args(&["--kinesis-stream", "main", "--state-dir", state.to_str().expect("path")]));
    }
    a.extend(args(extra));
    a
}

fn run(a: &[String]) -> (Option<i32>, String) {
    let mut d = Outboxd::spawn_with_env(a, ENV);
    let status = d.wait_exit(Duration::from_secs(120));
    if status.is_none() {
        d.kill9();
    }
    (status.and_then(|s| s.code()), d.log())
}

/// Each record's `n`, in the stream's order, with its key and data.
fn records(moto: &Moto) -> Vec<(u64, String, Vec<u8>)> {
    read_stream(moto, "main")
        .into_iter()
        .map(|r| {
            let n = serde_json::from_slice::<serde_json::Value>(&r.data).expect("JSON")["n"].as_u64().expect("n");
            (n, r.pk, r.data)
        })
        .collect()
}

#[test]
fn refused_events_are_replayed_byte_for_byte_in_key_order_and_a_killed_replay_loses_nothing() {
    let moto = Moto::start();
    create_stream(&moto, "main", 1);
    let dlq_arn = create_stream(&moto, "main-dlq", 2);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    {
        let proxy = ThrottleProxy::start_mode(&moto, 0.0, Some("kinesis-refuse"));
        let dl = ["--on-bad-event", "dlq", "--kinesis-dlq-stream", "main-dlq"];
        let mut d = spawn(&kinesis_args(&pg, &proxy.url, "main", &dl), &[]);
        // One transaction an event, so each copy has a source position of its own.
        pg.psql(&format!(
            "DO $$ BEGIN FOR g IN 1..{N} LOOP
               INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t',
                 'k' || (g % {KEYS}), 'e',
                 CASE WHEN g % 3 = 0 THEN jsonb_build_object('n', g, 'note', 'refuse-me') ELSE jsonb_build_object('n', g) END);
               COMMIT; END LOOP; END $$;"
        ));
        let end = pg.current_lsn();
        assert!(pg.wait_slot_confirms(&end, Duration::from_secs(180)), "slot behind\n{}", d.log());
        d.stop_cleanly();
    }
    let before = records(&moto);
    let stored: BTreeSet<u64> = before.iter().map(|r| r.0).collect();
    assert_eq!(stored, (1..=N).filter(|n| !refused(*n)).collect(), "the refused events are not in the stream");
    let copies = read_stream(&moto, "main-dlq");
    assert_eq!(copies.len() as u64, N / 3, "one copy a refused event");
    assert_eq!(copies.iter().map(|c| c.shard.as_str()).collect::<BTreeSet<_>>().len(), 2, "copies in both shards");

    let state = tempfile::tempdir().expect("tempdir");
    let (code, out) = run(&dlq_args("list", &moto.url, state.path(), &[]));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("{} records in the Kinesis stream", N / 3)), "{out}");
    assert!(out.contains("shardId-"), "positions are SHARD/SEQUENCE: {out}");

    // Killed midway: through a proxy throttling a tenth of the calls (and records of another
    // tenth), as soon as its first batch is in the progress file (written only after a batch).
    let file = state.path().join("kinesis.main-dlq.json");
    {
        let proxy = ThrottleProxy::start(&moto, 0.1);
        let mut d = Outboxd::spawn_with_env(&dlq_args("replay", &proxy.url, state.path(), &[]), ENV);
        let saved = wait_until(Duration::from_secs(120), || file.exists());
        d.kill9();
        assert!(saved, "no progress file\n{}", d.log());
        assert!(
            !d.log().contains("(no destination), already done"),
            "the kill came after the run ended: nothing resumed\n{}",
            d.log()
        );
    }
    let killed = records(&moto).len();
    assert!(killed > before.len(), "the killed replay put nothing");
    let (code, out) = run(&dlq_args("replay", &moto.url, state.path(), &[]));
    assert_eq!(code, Some(0), "{out}");
    // Resumed from the file: what it names as done is not sent again.
    let resumed: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("replayed "))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count\n{out}"));
    assert!(resumed < (N / 3) as usize, "{resumed} replayed: the run did not resume from the file\n{out}");
    let records_after_second = records(&moto).len();
    // The stream given by its ARN this time: the same progress file.
    let (code, again) = run(&dlq_args_for(&dlq_arn, "replay", &moto.url, state.path(), &[]));
    assert_eq!(code, Some(0), "{again}");
    assert!(again.contains("replayed 0,"), "{again}");

    let after = records(&moto);
    assert_eq!(after.len(), records_after_second, "the third run sent nothing");
    let got: BTreeSet<u64> = after.iter().map(|r| r.0).collect();
    let lost: Vec<u64> = (1..=N).filter(|n| !got.contains(n)).collect();
    assert!(lost.is_empty(), "lost {lost:?}\n{out}");
    // Byte for byte: each replayed record's data is the payload the outbox row holds.
    let rows: BTreeMap<u64, String> = pg
        .psql("SELECT payload->>'n', payload::text FROM outbox")
        .lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(n, p)| (n.parse().expect("n"), p.to_owned()))
        .collect();
    for (n, pk, data) in &after[before.len()..] {
        assert!(refused(*n), "event {n} replayed, but it was never dead-lettered");
        assert_eq!(data, rows[n].as_bytes(), "event {n}: not the payload byte for byte");
        assert_eq!(*pk, format!("k{}", n % KEYS), "event {n}: partition key = the record key");
    }
    // Each key's order over everything replayed, both runs: the first copy of each event (a
    // second one is the resumed run sending again what the killed one had sent unrecorded).
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    let mut first = BTreeSet::new();
    for (n, pk, _) in after[before.len()..].iter().filter(|r| first.insert(r.0)) {
        let prev = last.insert(pk, *n);
        assert!(prev.is_none_or(|p| p < *n), "key {pk}: {n} after {prev:?}");
    }
    let dup = after.len() - before.len() - (N / 3) as usize;
    // The killed run's progress file names what it had sent when the file was last written: the
    // rest of what it sent (if it was killed between an answer and the write) comes twice.
    assert!(dup <= killed - before.len(), "{dup} sent twice, more than the killed run sent");
    eprintln!("{} refused events replayed; the killed replay's events sent twice: {dup}", N / 3);
}
