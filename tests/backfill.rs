//! `outboxd backfill` against real PostgreSQL and Apache Kafka: exactly the rows of a created_at range or
//! an event_id range are re-published through `run`'s router, with `outboxd.backfill=true`; a row
//! the router refuses makes the exit code 1; no slot is touched; 100,000 rows stream in bounded
//! memory (peak RSS measured and printed).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

fn backfill_args(pg: &PgCluster, broker: Option<&Broker>, extra: &[&str]) -> Vec<String> {
    let mut a = args(&["backfill", "--postgres-url"]);
    a.push(pg.url());
    if let Some(b) = broker {
        a.extend(args(&["--kafka-brokers", &b.bootstrap()]));
    }
    a.extend(args(extra));
    a
}

/// `n` rows of `event_type`, created `age` ago (a PostgreSQL interval).
fn insert_aged(pg: &PgCluster, event_type: &str, n: usize, age: &str) {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_at) \
         SELECT 'b', 'agg-' || (g % 7), '{event_type}', jsonb_build_object('g', g, 'age', '{age}'), jsonb_build_object('trace', 't-' || g), \
         now() - interval '{age}' FROM generate_series(1, {n}) g"
    ));
}

fn ids(pg: &PgCluster, sql_where: &str) -> BTreeSet<String> {
    pg.psql(&format!("SELECT event_id FROM outbox WHERE {sql_where}")).lines().map(String::from).collect()
}

#[test]
fn backfill_by_time_range_republishes_exactly_those_rows() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    insert_aged(&pg, "bf.v1", 30, "3 hours");
    insert_aged(&pg, "bf.v1", 1500, "1 hour");
    insert_aged(&pg, "bf.v1", 20, "10 minutes");
    let until =
        pg.psql("SELECT to_char((now() - interval '30 minutes') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')");
    let want = ids(&pg, "created_at >= now() - interval '2 hours' AND created_at < now() - interval '30 minutes'");
    assert_eq!(want.len(), 1500);

    let (code, log) = run_to_exit(
        &backfill_args(&pg, Some(&broker), &["--since", "2h", "--until", &until, "--batch-size", "100"]),
        T,
    );
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("outboxd backfill: done in") && log.contains("1500 rows read, 1500 delivered, 0 bad"),
        "{log}"
    );

    let got = broker.consume_all("bf.v1.events", 1, 1500, T);
    let got_ids: BTreeSet<String> = got.iter().filter_map(|c| c.header_str("id")).collect();
    if got.len() != 1500 {
        let missing: Vec<_> = want.difference(&got_ids).collect();
        let offsets: Vec<_> = got.iter().map(|c| (c.partition, c.offset)).collect();
        eprintln!("missing {missing:?}\nend offset {}\noffsets {offsets:?}\n{log}", broker.end_offsets("bf.v1.events"));
    }
    assert_eq!(got.len(), 1500, "each row once");
    assert_eq!(got_ids, want);
    for c in &got {
        assert_eq!(c.header_str("outboxd.backfill").as_deref(), Some("true"));
        // Routed as `run` routes: key, expanded headers, payload.
        let g = c.payload_json()["g"].as_i64().expect("g");
        assert_eq!(c.key_str(), Some(format!("agg-{}", g % 7)));
        assert_eq!(c.header_str("trace"), Some(format!("t-{g}")));
    }
    // Per-aggregate order is insertion order: one hour-old batch shares its created_at, and its
    // rows were written in `g` order (the table has `seq`), so `g` grows within each key.
    let mut last: std::collections::HashMap<String, i64> = Default::default();
    for c in &got {
        let (k, g) = (c.key_str().unwrap_or_default(), c.payload_json()["g"].as_i64().unwrap_or_default());
        if let Some(prev) = last.insert(k.clone(), g) {
            assert!(prev < g, "out of order on {k}: g {prev} then {g}");
        }
    }
    assert_eq!(pg.psql("SELECT count(*) FROM pg_replication_slots"), "0", "backfill touches no slot");
}

#[test]
fn backfill_by_event_id_range_and_bad_rows_fail_the_exit_code() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    insert_aged(&pg, "ids.v1", 200, "1 minute");
    let all: Vec<String> = ids(&pg, "true").into_iter().collect();
    let (from, to) = (&all[50], &all[149]);
    let (code, log) = run_to_exit(
        &backfill_args(&pg, Some(&broker), &["--from-event-id", from, "--to-event-id", to, "--batch-size", "7"]),
        T,
    );
    assert_eq!(code, Some(0), "{log}");
    let got = broker.consume_all("ids.v1.events", 1, 100, T);
    let got_ids: BTreeSet<String> = got.iter().filter_map(|c| c.header_str("id")).collect();
    assert_eq!(got.len(), 100);
    assert_eq!(got_ids, all[50..150].iter().cloned().collect::<BTreeSet<_>>());
    assert!(got.iter().all(|c| c.header_str("outboxd.backfill").as_deref() == Some("true")));

    // A row whose topic would be illegal: the others still go, the exit code says it.
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('b', 'k', 'bad type!', '{}'), \
         ('b', 'k', 'late.v1', '{}')",
    );
    let (code, log) = run_to_exit(&backfill_args(&pg, Some(&broker), &["--since", "30s"]), T);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("2 rows read, 1 delivered, 1 bad"), "{log}");
    assert_eq!(broker.consume_all("late.v1.events", 1, 1, T).len(), 1);

    // Bad flags: exit 2, one line naming the flag.
    let (code, log) = run_to_exit(&backfill_args(&pg, Some(&broker), &["--since", "yesterday"]), T);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("--since \"yesterday\""), "{log}");
}

/// A create-then-pay pair per aggregate, written in one transaction (so one created_at and random
/// event ids): backfill sends each pair in that order, with the `seq` column and without it
/// (issue 23 item 10: ties went by event_id, so about half the pairs came out paid-first).
#[test]
fn backfill_keeps_a_transactions_order_per_aggregate_with_and_without_seq() {
    for with_seq in [false, true] {
        let pg = PgCluster::start();
        pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
        if with_seq {
            pg.apply_sql_file(sql_dir().join("05_poll.sql"));
        }
        let broker = Broker::start();
        let mut sql = String::from("BEGIN;");
        for a in 0..60 {
            for step in ["created", "paid"] {
                sql.push_str(&format!(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                     VALUES ('order', 'o-{a}', 'pair.v1', '{{\"step\": \"{step}\"}}');"
                ));
            }
        }
        sql.push_str("COMMIT;");
        pg.psql(&sql);
        let (code, log) = run_to_exit(&backfill_args(&pg, Some(&broker), &["--since", "1h", "--batch-size", "7"]), T);
        assert_eq!(code, Some(0), "{log}");
        let got = broker.consume_all("pair.v1.events", 1, 120, T);
        assert_eq!(got.len(), 120, "seq {with_seq}\n{log}");
        let mut steps: std::collections::HashMap<String, Vec<String>> = Default::default();
        for c in &got {
            let step = c.payload_json()["step"].as_str().unwrap_or_default().to_owned();
            steps.entry(c.key_str().unwrap_or_default()).or_default().push(step);
        }
        assert_eq!(steps.len(), 60);
        for (k, s) in &steps {
            assert_eq!(s, &["created", "paid"], "{k} with seq {with_seq}");
        }
    }
}

/// VmHWM (peak resident set) of a running process, in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// 100,000 rows of 2 KiB payload (about 200 MiB of data) stream through in bounded memory.
#[test]
fn backfill_of_100k_rows_streams_in_bounded_memory() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
         SELECT 'big', 'agg-' || (g % 100), 'big.v1', jsonb_build_object('g', g, 'pad', repeat('x', 2048)), \
         now() - interval '1 hour' + g * interval '1 ms' FROM generate_series(1, 100000) g",
    );
    let mut d = Outboxd::spawn(&backfill_args(&pg, None, &["--since", "2h", "--sink", "null"]));
    let pid = d.pid().expect("pid");
    let mut peak = 0;
    while d.is_running() {
        peak = peak.max(peak_rss_kib(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = d.wait_exit(T);
    let log = d.log();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{log}");
    assert!(log.contains("100000 rows read, 100000 delivered"), "{log}");
    eprintln!("backfill of 100000 rows x 2 KiB (--sink null): peak RSS {peak} KiB");
    assert!(peak > 0, "no RSS sample taken");
    // The data is ~200 MiB; a run that held it would exceed this many times over.
    assert!(peak < 64 * 1024, "peak RSS {peak} KiB: backfill does not stream");
}
