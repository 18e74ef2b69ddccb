//! The latency scenario: a steady insert load while outboxd runs, and what it costs in time.
//!
//! Per rate and sink: outboxd starts (and creates its slot), a warm-up at the same rate on the
//! same topics keeps producer start-up out of the numbers, then `bench_insert` runs LAT_SECS
//! while (Kafka) `bench_latency` consumes and measures consume time − record timestamp. outboxd's
//! own `outboxd_commit_to_ack_seconds` is the delta between scrapes just before and after the
//! measured window. Then the broker alone is calibrated at the same rates under the same insert
//! load (no slot reads it).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bench::Bench;
use crate::broker::Listeners;
use crate::measure::{self, kv, kv_cell};
use crate::procs;
use crate::prom;
use crate::report::at_most;

const EVENT_TYPES: [&str; 5] =
    ["order.created.v1", "order.paid.v1", "order.shipped.v1", "order.delivered.v1", "order.cancelled.v1"];

const INTRO: &str = "bench_insert inserts one row per transaction at the given rate while outboxd runs (default --status-interval). End-to-end = consumer's wall clock when it gets the record − record timestamp (the row's created_at, i.e. the inserting transaction's start; ms resolution): insert → commit → WAL → outboxd → Kafka broker ack → consumer fetch; an upper bound on commit → ack. commit→ack = outboxd's own histogram `outboxd_commit_to_ack_seconds` (per transaction, PostgreSQL commit timestamp → last record acked), the delta between scrapes before and after the measured window; p50/p99 are interpolated inside its buckets (…, 5, 7.5, 10, 12.5, 15, 17.5, 20, 25, 30, 40, 50, 75, 100 ms; builds before issue 14 jump from 20 to 50 ms), \"≤ 20 ms\" is exact (a bucket bound). The --sink null rows measure commit → outboxd has decoded and routed the event (null acks at once): the WAL-delivery part of commit→ack, without Kafka. The warm-up (same rate, same topics, not measured) keeps producer start-up out of the numbers.";

const CALIBRATION: &str = "Broker alone (calibration, {CAL} s per rate, outboxd stopped): a librdkafka producer with outboxd's settings (idempotence, acks=all, linger.ms=5) sends ~300 B records round-robin over 5 topics (like the 5 event types) to the same Apache Kafka broker at the same rate while a consumer (same settings as above) reads them, and bench_insert puts the same insert load on PostgreSQL (no slot reads it). send→ack is what the broker alone adds to commit→ack; send→consumed is the floor under the end-to-end column.";

/// A spawned helper with stdout to a file, registered for cleanup.
/// stderr goes to `err`, or with stdout to `out` when `None`.
pub fn spawn(mut cmd: Command, out: &Path, err: Option<&Path>) -> Result<Child> {
    let out = std::fs::File::create(out)?;
    let err = match err {
        Some(p) => std::fs::File::create(p)?,
        None => out.try_clone()?,
    };
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    procs::track(child.id());
    Ok(child)
}

pub fn reap(mut child: Child) -> Result<std::process::ExitStatus> {
    let status = child.wait()?;
    procs::untrack(child.id());
    Ok(status)
}

pub fn bench_insert(b: &Bench, rate: u64, secs: u64, prefix: &str) -> Command {
    let mut cmd = Command::new(b.tools.examples.join("bench_insert"));
    cmd.args(["--pg", &b.pg.socket_conninfo(), "--rate", &rate.to_string(), "--secs", &secs.to_string()]);
    cmd.args(["--type-prefix", prefix]);
    cmd
}

pub fn latency(b: &mut Bench) -> Result<()> {
    b.new_broker(Listeners::Plaintext)?;
    b.pg.reset()?;
    let k = b.knobs.clone();
    let mut md = format!(
        "### Latency under a steady load ({} s per rate and sink, after a {} s warm-up)\n\n{INTRO}\n\n\
         | rate | sink | inserter: achieved, conns, max behind schedule, insert p99 | records consumed | end-to-end p50 | p99 | max | commit→ack p50 | commit→ack p99 | commit→ack ≤ 20 ms | outboxd CPU | outboxd peak RSS |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
        k.lat_secs, k.warm_secs
    );
    let sinks: &[&str] = if k.lat_null { &["kafka", "null"] } else { &["kafka"] };
    for &rate in &k.rates {
        for &sink in sinks {
            md.push_str(&one_rate(b, rate, sink)?);
        }
    }
    md.push_str(&format!(
        "\n{}\n\n| rate | records | send→ack p50 | send→ack p99 | send→ack max | send→consumed p50 | p99 | max |\n|---|---|---|---|---|---|---|---|\n",
        CALIBRATION.replace("{CAL}", &k.cal_secs.to_string())
    ));
    for &rate in &k.rates {
        md.push_str(&calibrate(b, rate)?);
    }
    md.push('\n');
    b.report.section(&md);
    b.pg.reset()
}

/// outboxd's flags for a latency row: `kafka`, `null`, or `eos_<interval>` (Kafka with
/// `--delivery exactly-once --transaction-interval <interval>`).
fn sink_args(sink: &str) -> Vec<String> {
    match sink.strip_prefix("eos_") {
        Some(interval) => ["--sink", "kafka", "--delivery", "exactly-once", "--transaction-interval", interval]
            .map(str::to_owned)
            .to_vec(),
        None => vec!["--sink".to_owned(), sink.to_owned()],
    }
}

/// One rate and sink: the table row (and the 5k/s target for Kafka).
pub fn one_rate(b: &mut Bench, rate: u64, sink: &str) -> Result<String> {
    let k = b.knobs.clone();
    let name = format!("lat_{rate}_{sink}");
    let prefix = format!("r{rate}{sink}.");
    let (log, out, err) = (
        b.work.join(format!("{name}.log")),
        b.work.join(format!("{name}.out")),
        b.work.join(format!("{name}.out.err")),
    );
    let mport = procs::free_port()?;
    println!("   {rate} events/s, --sink {sink}: {} s warm-up, then {} s measured", k.warm_secs, k.lat_secs);
    let mut cmd = Command::new(&b.tools.outboxd);
    cmd.args(["run", "--postgres-url", &b.pg.outboxd_url(), "--slot", &name]).args(sink_args(sink));
    cmd.args(["--kafka-brokers", &format!("127.0.0.1:{}", b.kafka_port()), "--metrics-addr"]);
    cmd.arg(format!("127.0.0.1:{mport}"));
    let mut outboxd = spawn(cmd, &log, None)?;
    let pid = outboxd.id();
    let t0 = Instant::now();
    while !b.pg.slot_active(&name)? {
        if outboxd.try_wait()?.is_some() || t0.elapsed() > Duration::from_secs(30) {
            bail!("outboxd did not start streaming:\n{}", procs::tail(&log, 20));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if k.warm_secs > 0 {
        procs::output(&mut bench_insert(b, rate, k.warm_secs, &prefix))?;
        std::thread::sleep(Duration::from_secs(2));
    }
    let expect = rate * k.lat_secs;
    let consumer = if sink != "null" {
        let topics: Vec<String> = EVENT_TYPES.iter().map(|t| format!("{prefix}{t}.events")).collect();
        let mut cmd = Command::new(b.tools.examples.join("bench_latency"));
        cmd.args(["--brokers", &format!("127.0.0.1:{}", b.kafka_port()), "--topics", &topics.join(",")]);
        cmd.args(["--expect", &expect.to_string(), "--timeout-secs", &(k.lat_secs + 120).to_string()]);
        cmd.args(["--fetch-wait-ms", &k.fetch_wait_ms.to_string()]);
        let c = spawn(cmd, &out, Some(&err))?;
        procs::wait_for_text(&out, "ready", 60)?;
        Some(c)
    } else {
        std::fs::write(&out, "")?;
        None
    };
    let before = prom::scrape(mport);
    let cpu0 = measure::proc_cpu(pid);
    let ins = procs::output(&mut bench_insert(b, rate, k.lat_secs, &prefix))?.trim().to_owned();
    println!("   inserter: {ins}");
    match consumer {
        Some(c) => {
            if !reap(c)?.success() {
                bail!("bench_latency failed:\n{}", procs::tail(&err, 20));
            }
        }
        None => std::thread::sleep(Duration::from_secs(1)),
    }
    let (cpu1, hwm) = (measure::proc_cpu(pid), measure::hwm_kib(pid));
    let after = prom::scrape(mport);
    procs::terminate(pid);
    let _ = outboxd.wait();
    procs::untrack(pid);

    let res = std::fs::read_to_string(&out)?.lines().find(|l| l.starts_with("count=")).map(str::to_owned);
    if let Some(r) = &res {
        println!("   consumer: {r}");
    }
    let (m50, m99) = (prom::commit_to_ack_ms(&before, &after, 0.50), prom::commit_to_ack_ms(&before, &after, 0.99));
    let buckets = prom::bucket_deltas(&before, &after);
    let m20 = buckets.as_deref().and_then(|b| prom::share_le(b, 0.02));
    let n = prom::count(&before, &after);
    let m20_text = m20.map_or_else(|| "?".to_owned(), |v| format!("{v:.1}"));
    let (m50s, m99s, m20s) = match (m50, m99) {
        (Some(a), Some(z)) => (format!("{a:.1} ms"), format!("{z:.1} ms"), format!("{m20_text}% of {n} txns")),
        _ => ("n/a (metric not exported)".to_owned(), "n/a (metric not exported)".to_owned(), "n/a".to_owned()),
    };
    println!("   commit_to_ack: p50 {m50s}, p99 {m99s}, <= 20 ms: {m20s}");
    let e2e = match &res {
        Some(r) => format!(
            "{} of {expect} | {} ms | {} ms | {} ms",
            kv_cell("count", r),
            kv_cell("p50_ms", r),
            kv_cell("p99_ms", r),
            kv_cell("max_ms", r)
        ),
        None => "– | – | – | –".to_owned(),
    };
    let ins_secs: Option<f64> = kv("secs", &ins).and_then(|s| s.parse().ok());
    let cpu_pct = match (cpu0, cpu1, ins_secs) {
        (Some(a), Some(z), Some(s)) if s > 0.0 => format!("{:.0}", (z - a) / s * 100.0),
        _ => "?".to_owned(),
    };
    let row = format!(
        "| {rate}/s | {sink} | {}/s, {} conns, {} ms, {} ms | {e2e} | {m50s} | {m99s} | {m20s} | {cpu_pct}% of a core | {} MiB |\n",
        kv_cell("rate", &ins),
        kv_cell("connections", &ins),
        kv_cell("behind_max_ms", &ins),
        kv_cell("commit_p99_ms", &ins),
        hwm.map_or_else(|| "?".to_owned(), |h| format!("{:.1}", h as f64 / 1024.0)),
    );
    if let Some(interval) = sink.strip_prefix("eos_").filter(|_| rate == 5000) {
        let v = m99.or_else(|| res.as_deref().and_then(|r| kv("p99_ms", r)).and_then(|p| p.parse().ok()));
        b.report.target(
            format!("exactly-once p99 commit→ack ≤ 50 ms at 5k/s (--transaction-interval {interval})"),
            v.map_or("n/a".to_owned(), |v| format!("{v:.1} ms ({m20_text}% of txns ≤ 20 ms)")),
            at_most(v, 50.0),
        );
    }
    if rate == 5000 && sink == "kafka" {
        let name = "p99 commit→ack ≤ 20 ms at 5k/s";
        match m99 {
            Some(v) => b.report.target(
                name,
                format!("{v:.1} ms (outboxd_commit_to_ack_seconds; {m20_text}% of txns ≤ 20 ms)"),
                at_most(Some(v), 20.0),
            ),
            None => {
                let p99 = res.as_deref().and_then(|r| kv("p99_ms", r)).unwrap_or("?").to_owned();
                match p99.parse::<f64>() {
                    Ok(p) if p <= 20.0 => b.report.target(
                        name,
                        format!("metric not exported; end-to-end p99 {p99} ms is an upper bound"),
                        Some(true),
                    ),
                    _ => b.report.target(name, format!("n/a (metric not exported); end-to-end p99 {p99} ms"), None),
                }
            }
        }
    }
    Ok(row)
}

/// The broker alone at `rate` for CAL_SECS, under the same insert load: one table row.
fn calibrate(b: &Bench, rate: u64) -> Result<String> {
    let k = &b.knobs;
    let load_out = b.work.join(format!("calib_load_{rate}.out"));
    let load = spawn(bench_insert(b, rate, k.cal_secs + 3, &format!("calib{rate}.")), &load_out, None)?;
    let topics: Vec<String> = (1..=5).map(|i| format!("calib{rate}.t{i}")).collect();
    let mut cmd = Command::new(b.tools.examples.join("bench_latency"));
    cmd.args(["--brokers", &format!("127.0.0.1:{}", b.kafka_port()), "--topics", &topics.join(",")]);
    cmd.args(["--calibrate-rate", &rate.to_string(), "--secs", &k.cal_secs.to_string()]);
    cmd.args(["--fetch-wait-ms", &k.fetch_wait_ms.to_string()]);
    let cal = procs::output(cmd.stderr(std::fs::File::create(b.work.join(format!("calib_{rate}.err")))?));
    let _ = reap(load);
    let cal = cal?.lines().find(|l| l.starts_with("count=")).unwrap_or("").to_owned();
    println!("   broker alone at {rate}/s: {cal}");
    let c = |key| kv_cell(key, &cal);
    Ok(format!(
        "| {rate}/s | {} | {} ms | {} ms | {} ms | {} ms | {} ms | {} ms |\n",
        c("count"),
        c("ack_p50_ms"),
        c("ack_p99_ms"),
        c("ack_max_ms"),
        c("p50_ms"),
        c("p99_ms"),
        c("max_ms")
    ))
}
