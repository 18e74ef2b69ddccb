//! The race's latency part (`bench/run debezium`): outboxd and Debezium under the same steady
//! insert load, measured the same way, REPS repetitions per rate in alternating order.
//!
//! Both stamp their records from the same column, `ts_utc timestamp DEFAULT clock_timestamp() AT
//! TIME ZONE 'utc'` (Debezium's EventRouter takes only a `timestamp` column, in ms; outboxd reads it
//! as UTC), added for this part and dropped after it. bench_insert inserts one row per transaction,
//! so that time is the commit time to within the insert's own duration (its p99 is in the table).
//! bench_latency consumes every record and measures consume time − record timestamp: commit → the
//! record is on the broker and fetched, for both readers in the same way. Each run has its own slot
//! (created by the reader at its start), its own topics (event types prefixed per run, both readers
//! routing to `${routedByValue}.events`) and a warm-up at the same rate that creates the topics and
//! keeps start-up (the JVM's JIT included) out of the measured window. Debezium runs with Connect's
//! and Debezium's defaults, as in the drain part (`poll.interval.ms` 500: a user who wants less
//! latency from Debezium lowers it; we do not).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::bench::Bench;
use crate::debezium;
use crate::latency::{bench_insert, reap, spawn};
use crate::measure::{self, kv};
use crate::procs;
use crate::stats::Spread;

const EVENT_TYPES: [&str; 5] =
    ["order.created.v1", "order.paid.v1", "order.shipped.v1", "order.delivered.v1", "order.cancelled.v1"];

const COLUMN: &str = "ts_utc";

#[derive(Clone, Copy, PartialEq)]
enum Who {
    Outboxd,
    Debezium,
}

impl Who {
    fn name(self) -> &'static str {
        match self {
            Who::Outboxd => "outboxd --sink kafka",
            Who::Debezium => "Debezium on Connect",
        }
    }
    fn tag(self) -> &'static str {
        match self {
            Who::Outboxd => "o",
            Who::Debezium => "d",
        }
    }
}

/// What one run measured.
struct Run {
    count: f64,
    p50: f64,
    p99: f64,
    max: f64,
    le20: f64,
    insert_p99: f64,
    cpu_pct: Option<f64>,
}

/// The section: one row per rate and reader, medians over REPS with (min–max).
pub fn race_latency(b: &mut Bench) -> Result<String> {
    let k = b.knobs.clone();
    b.pg.reset()?;
    b.pg.exec(&format!(
        "ALTER TABLE outbox ADD COLUMN IF NOT EXISTS {COLUMN} timestamp DEFAULT (clock_timestamp() AT TIME ZONE 'utc')"
    ))?;
    let mut rows = String::new();
    for &rate in &k.rates {
        let mut runs: Vec<(Who, Run)> = Vec::new();
        for rep in 0..k.reps {
            let order = if rep % 2 == 0 { [Who::Outboxd, Who::Debezium] } else { [Who::Debezium, Who::Outboxd] };
            for who in order {
                println!("   latency race: {rate} events/s, {}, repetition {}", who.name(), rep + 1);
                let run = one(b, rate, who, rep)?;
                println!(
                    "   {} records, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {:.1}% <= 20 ms",
                    run.count, run.p50, run.p99, run.max, run.le20
                );
                runs.push((who, run));
                b.pg.reset()?;
            }
        }
        for who in [Who::Outboxd, Who::Debezium] {
            let of = |f: fn(&Run) -> f64| {
                let v: Vec<f64> = runs.iter().filter(|(w, _)| *w == who).map(|(_, r)| f(r)).collect();
                Spread::of(&v).map_or_else(|| "?".to_owned(), |s| s.cell())
            };
            let cpu: Vec<f64> = runs.iter().filter(|(w, _)| *w == who).filter_map(|(_, r)| r.cpu_pct).collect();
            let cpu = Spread::of(&cpu).map_or_else(|| "?".to_owned(), |s| s.cell());
            let counts: Vec<f64> = runs.iter().filter(|(w, _)| *w == who).map(|(_, r)| r.count).collect();
            let counts = Spread::of(&counts).map_or_else(
                || "?".to_owned(),
                |s| {
                    if s.count > 1 {
                        format!("{:.0} ({:.0}–{:.0})", s.median, s.min, s.max)
                    } else {
                        format!("{:.0}", s.median)
                    }
                },
            );
            rows.push_str(&format!(
                "| {rate}/s | {} | {counts} of {} | {} | {} | {} | {} | {} | {cpu} |\n",
                who.name(),
                rate * k.lat_secs,
                of(|r| r.p50),
                of(|r| r.p99),
                of(|r| r.max),
                of(|r| r.le20),
                of(|r| r.insert_p99),
            ));
        }
    }
    b.pg.exec(&format!("ALTER TABLE outbox DROP COLUMN IF EXISTS {COLUMN}"))?;
    Ok(format!(
        "Latency under a steady load, the same way for both ({} s per run after a {} s warm-up, median of \
         {} with min–max; one row per transaction): consume time − record timestamp, the timestamp taken \
         by both from a `timestamp` column set by `clock_timestamp()` at insert (commit → the record is on \
         the broker and fetched by a consumer; ms). Debezium with its defaults (`poll.interval.ms` 500, \
         Connect's producer: acks=all, linger.ms 5); outboxd with its defaults.\n\n\
         | rate | reader | records consumed | p50 ms | p99 ms | max ms | % ≤ 20 ms | insert p99 ms | reader CPU, % of a core |\n\
         |---|---|---|---|---|---|---|---|---|\n{rows}\n",
        k.lat_secs, k.warm_secs, k.reps
    ))
}

/// One run of `who` at `rate`: start it on a fresh slot, warm up, measure LAT_SECS, stop it.
fn one(b: &Bench, rate: u64, who: Who, rep: usize) -> Result<Run> {
    let k = &b.knobs;
    let slot = format!("race_{rate}_{}{rep}", who.tag());
    let prefix = format!("race{rate}{}{rep}.", who.tag());
    let dir = b.work.join(&slot);
    std::fs::create_dir_all(&dir)?;
    let brokers = format!("127.0.0.1:{}", b.kafka_port());
    // The reader and how to stop it.
    let (pid, mut child, work) = match who {
        Who::Outboxd => {
            let mut cmd = Command::new(&b.tools.outboxd);
            cmd.args(["run", "--postgres-url", &b.pg.outboxd_url(), "--slot", &slot, "--sink", "kafka"]);
            cmd.args(["--kafka-brokers", &brokers, "--table-field-event-timestamp", COLUMN]);
            let c = spawn(cmd, &dir.join("outboxd.log"), None)?;
            (c.id(), Some(c), None)
        }
        Who::Debezium => {
            let conn = debezium::connector(b, &slot, "${routedByValue}.events", Some(COLUMN));
            let mut launcher = debezium::launch(b, &dir, &conn)?;
            let status = launcher.wait()?;
            let work = dir.join("worker");
            if !status.success() {
                debezium::stop(b, &work, &slot);
                bail!(
                    "scripts/debezium start failed: {}\n{}",
                    std::fs::read_to_string(dir.join("launcher.log")).unwrap_or_default(),
                    procs::tail(&work.join("connect.log"), 30)
                );
            }
            let pid = std::fs::read_to_string(work.join("pid"))?.trim().parse()?;
            (pid, None, Some(work))
        }
    };
    let stop = |child: &mut Option<std::process::Child>| match (&work, child.take()) {
        (Some(w), _) => debezium::stop(b, w, &slot),
        (None, Some(mut c)) => {
            procs::terminate(c.id());
            let _ = c.wait();
            procs::untrack(c.id());
        }
        (None, None) => {}
    };
    let t0 = Instant::now();
    while !b.pg.slot_active(&slot)? {
        if t0.elapsed() > Duration::from_secs(60) {
            stop(&mut child);
            bail!("{} did not start streaming from {slot} within 60 s (logs in {})", who.name(), dir.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let measured = (|| -> Result<Run> {
        // Warm-up: creates the topics (auto-created on the first record) and warms both readers.
        procs::output(&mut bench_insert(b, rate, k.warm_secs.max(3), &prefix))?;
        std::thread::sleep(Duration::from_secs(2));
        let expect = rate * k.lat_secs;
        let topics: Vec<String> = EVENT_TYPES.iter().map(|t| format!("{prefix}{t}.events")).collect();
        let (out, err) = (dir.join("latency.out"), dir.join("latency.err"));
        let mut cmd = Command::new(b.tools.examples.join("bench_latency"));
        cmd.args(["--brokers", &brokers, "--topics", &topics.join(",")]);
        cmd.args(["--expect", &expect.to_string(), "--timeout-secs", &(k.lat_secs + 120).to_string()]);
        cmd.args(["--fetch-wait-ms", &k.fetch_wait_ms.to_string()]);
        let consumer = spawn(cmd, &out, Some(&err))?;
        procs::wait_for_text(&out, "ready", 60)?;
        let cpu0 = measure::proc_cpu(pid);
        let ins = procs::output(&mut bench_insert(b, rate, k.lat_secs, &prefix))?;
        let ins_secs: Option<f64> = kv("secs", &ins).and_then(|s| s.parse().ok());
        if !reap(consumer)?.success() {
            bail!("bench_latency failed:\n{}", procs::tail(&err, 20));
        }
        let cpu1 = measure::proc_cpu(pid);
        let res = std::fs::read_to_string(&out)?;
        let line = res.lines().find(|l| l.starts_with("count=")).unwrap_or("");
        let num = |key: &str, line: &str| kv(key, line).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
        let cpu_pct = match (cpu0, cpu1, ins_secs) {
            (Some(a), Some(z), Some(s)) if s > 0.0 => Some((z - a) / s * 100.0),
            _ => None,
        };
        Ok(Run {
            count: num("count", line),
            p50: num("p50_ms", line),
            p99: num("p99_ms", line),
            max: num("max_ms", line),
            le20: num("le20_pct", line),
            insert_p99: num("commit_p99_ms", &ins),
            cpu_pct,
        })
    })();
    stop(&mut child);
    measured
}
