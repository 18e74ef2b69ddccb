//! The chaos suite: a writer commits 50k events over 200 aggregates in transactions of mixed sizes
//! while faults hit every component — kill -9 of outboxd, SIGSTOP/SIGCONT of the broker, a fast
//! PostgreSQL restart, and `pg_terminate_backend` of the walsender — chosen from a fixed, printed
//! seed (`CHAOS_SEED` to replay one). Then it drains and checks:
//! * every event arrived at least once (lost must be 0);
//! * per aggregate, the first-seen sequence is the commit sequence;
//! * every duplicate belongs to a transaction that a fault could legitimately replay: one that
//!   committed before some fault, past the slot position that fault resumed from.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

const EVENTS: usize = 50_000;
const AGGREGATES: usize = 200;
const SIZES: [usize; 5] = [1, 5, 20, 100, 400];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn lsn(s: &str) -> u64 {
    let (hi, lo) = s.trim().split_once('/').unwrap_or_else(|| panic!("not an LSN: {s:?}"));
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// One committed writer transaction: when its first attempt started (it cannot have committed
/// earlier; a retried attempt may hide the real commit time), and the WAL insert position after it.
struct Txn {
    started: f64,
    after: u64,
}

fn wall_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Seconds since the Unix epoch of a log line's RFC 3339 UTC timestamp (`2026-12-02T11:42:32.19Z`).
fn log_time(line: &str) -> Option<f64> {
    let ts = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let (y, m, day) = (if d[1] <= 2 { d[0] - 1 } else { d[0] }, d[1], d[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let t: Vec<f64> = time.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    Some(days as f64 * 86_400.0 + t[0] * 3600.0 + t[1] * 60.0 + t[2])
}

/// Every replication session any daemon started: (when, the slot LSN it resumed from).
fn session_starts(logs: &[String]) -> Vec<(f64, u64)> {
    logs.iter()
        .flat_map(|l| l.lines())
        .filter(|l| l.contains("outboxd::app: streaming"))
        .filter_map(|l| {
            let start = l.split_whitespace().find_map(|w| w.strip_prefix("start="))?;
            Some((log_time(l)?, lsn(start)))
        })
        .collect()
}

fn psql_retry(sock: &std::path::Path, port: u16, sqls: &[&str]) -> String {
    loop {
        let mut cmd = std::process::Command::new("psql");
        cmd.args(["-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", "app", "-p", &port.to_string(), "-h"])
            .arg(sock);
        for s in sqls {
            cmd.args(["-c", s]);
        }
        match cmd.output() {
            Ok(o) if o.status.success() => return String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            // The server is restarting: the statement is idempotent, so just try again.
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

#[test]
fn chaos_loses_nothing_keeps_order_and_repeats_only_inside_fault_windows() {
    let seed: u64 = std::env::var("CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_0bad_cafe);
    eprintln!("chaos seed: {seed} (replay with CHAOS_SEED={seed})");
    let mut pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let args = daemon_args(
        &pg,
        &broker,
        &["--status-interval", "200ms", "--reconnect-max-backoff", "1s", "--topic-partitions", "3"],
    );
    let mut d = Outboxd::spawn_streaming(&args);

    // The writer: explicit ids and ON CONFLICT make a retried statement harmless.
    let txns: Arc<Mutex<Vec<Txn>>> = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let (sock, port, txns) = (pg.socket_dir(), pg.port(), txns.clone());
        let mut rng = Rng(seed | 1);
        std::thread::spawn(move || {
            let mut seq = vec![0u64; AGGREGATES];
            let mut written = 0;
            let mut t = 0usize;
            while written < EVENTS {
                let n = SIZES[rng.below(SIZES.len())].min(EVENTS - written);
                let rows: Vec<String> = (0..n)
                    .map(|i| {
                        let agg = rng.below(AGGREGATES);
                        seq[agg] += 1;
                        let id = format!("00000000-0000-4000-8000-{:012x}", written + i);
                        format!(
                            "('{id}', 'chaos', 'agg-{agg}', 'chaos.v1', '{{\"agg\": {agg}, \"seq\": {}, \"t\": {t}}}')",
                            seq[agg]
                        )
                    })
                    .collect();
                let sql = format!(
                    "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) VALUES {} ON CONFLICT (event_id) DO NOTHING",
                    rows.join(",")
                );
                let started = wall_now();
                psql_retry(&sock, port, &[&sql]);
                let after = psql_retry(&sock, port, &["SELECT pg_current_wal_insert_lsn()"]);
                txns.lock().unwrap().push(Txn { started, after: lsn(&after) });
                written += n;
                t += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let mut rng = Rng(seed.rotate_left(17) | 1);
    let mut logs: Vec<String> = Vec::new();
    let mut faults: HashMap<&str, usize> = HashMap::new();
    let mut stops: Vec<Instant> = Vec::new();
    while !writer.is_finished() {
        std::thread::sleep(Duration::from_millis(800 + rng.below(1500) as u64));
        let kind = ["kill9", "broker_stop", "pg_restart", "walsender_kill"][rng.below(4)];
        *faults.entry(kind).or_default() += 1;
        match kind {
            "kill9" => {
                d.kill9();
                logs.push(d.log());
                d = Outboxd::spawn_streaming(&args);
            }
            "broker_stop" => {
                stops.push(Instant::now());
                broker.pause();
                std::thread::sleep(Duration::from_millis(500 + rng.below(2000) as u64));
                broker.resume();
            }
            "pg_restart" => pg.restart(),
            _ => {
                pg.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_replication");
            }
        }
        assert!(d.is_running(), "outboxd exited after a {kind} fault:\n{}", d.log());
    }
    writer.join().expect("writer finished");

    // Drain and read everything back.
    let rows: Vec<(String, usize, u64)> = pg
        .psql("SELECT event_id, (payload->>'agg')::int, (payload->>'t')::int8 FROM outbox")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (f[0].to_owned(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    assert_eq!(rows.len(), EVENTS);
    let got = broker.consume_all("chaos.v1.events", 3, EVENTS, Duration::from_secs(180));
    let mut count: HashMap<String, usize> = HashMap::new();
    let mut last_seq: HashMap<u64, u64> = HashMap::new();
    for r in &got {
        let id = r.header_str("id").expect("id header");
        let n = count.entry(id.clone()).or_default();
        *n += 1;
        if *n == 1 {
            let v = r.payload_json();
            let (agg, seq) = (v["agg"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
            let prev = last_seq.insert(agg, seq).unwrap_or(0);
            assert!(seq > prev, "aggregate {agg}: event seq {seq} first seen after seq {prev} (id {id})");
        }
    }
    let lost: Vec<&String> = rows.iter().map(|(id, _, _)| id).filter(|id| !count.contains_key(*id)).collect();
    let duplicates: usize = count.values().map(|c| c - 1).sum();
    let total_faults: usize = faults.values().sum();
    eprintln!(
        "chaos figures: seed {seed}, faults {total_faults} {faults:?}, events {}, lost {}, duplicates {duplicates}, records read {}",
        rows.len(),
        lost.len(),
        got.len()
    );
    assert!(lost.is_empty(), "{} events lost, e.g. {:?}\n{}", lost.len(), &lost[..lost.len().min(5)], d.log());

    // Every duplicate must be explained by a session that resumed from a slot position before
    // the transaction's commit, after the transaction started: the unacked window of some fault.
    // (PostgreSQL 15 keeps a logical slot's confirmed_flush_lsn in memory only, so after a server
    // restart the slot resumes from its last persisted position, further back than outboxd had
    // confirmed; the daemon logs where each session really started.)
    logs.push(d.log());
    let sessions = session_starts(&logs);
    let txns = txns.lock().unwrap();
    let by_id: HashMap<&str, u64> = rows.iter().map(|(id, _, t)| (id.as_str(), *t)).collect();
    let mut windows_used = std::collections::HashSet::new();
    for (id, c) in &count {
        if *c < 2 {
            continue;
        }
        let t = &txns[by_id[id.as_str()] as usize];
        let replayed_by: Vec<usize> =
            (1..sessions.len()).filter(|&k| sessions[k].0 >= t.started && sessions[k].1 < t.after).collect();
        assert!(
            replayed_by.len() + 1 >= *c,
            "event {id} (txn {}) arrived {c} times, but only {} session(s) resumed from before its commit after it started: {:?}",
            by_id[id.as_str()],
            replayed_by.len(),
            sessions
        );
        windows_used.extend(replayed_by);
    }
    eprintln!(
        "chaos: {} sessions, {} of them replayed events (their unacked windows)",
        sessions.len(),
        windows_used.len()
    );
    d.stop_cleanly();
}
