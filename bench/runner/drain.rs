//! Drain-like scenarios: one backlog, read by several readers, several times.
//!
//! The protocol of one backlog (`run_backlog`): if any Kafka reader takes part, a warm-up run of
//! each Kafka reader over `WARM_ROWS` rows creates the topics and lets the broker's JIT compile its
//! paths (and ProducerPerformance's topic is created, when it takes part), before the backlog and
//! outside every measured run;
//! then every slot of every repetition is created, and only then the backlog is inserted, so all
//! readers read the same WAL. Each repetition runs every reader once, in an order rotated by one
//! per repetition so that no reader always goes first. The scenarios `drain`, `bigtx` and
//! `backlog` are backlogs plus their tables and targets.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Result};

use crate::bench::Bench;
use crate::broker::{self, Listeners};
use crate::measure;
use crate::procs;
use crate::readers::{self, local, Kind, Reader};
use crate::report::{at_least, at_most, times_cell};
use crate::tables::{self, RawRow, DRAIN_HEADER};

/// One backlog and who reads it.
pub struct Backlog<'a> {
    pub key: &'a str,
    pub rows: u64,
    pub per_txn: u64,
    pub reps: usize,
    pub readers: &'a [Reader],
}

/// The readers' order in repetition `rep` (from 1): the list rotated left by `rep - 1`.
pub fn rotated(readers: &[Reader], rep: usize) -> Vec<Reader> {
    let n = readers.len();
    (0..n).map(|i| readers[(i + rep - 1) % n]).collect()
}

/// The slot of one reader in one repetition.
fn slot(key: &str, r: Reader, rep: usize) -> String {
    format!("{key}_{}_{rep}", r.name())
}

/// Creates the Kafka readers' topics and warms the broker up: every Kafka reader drains
/// `WARM_ROWS` single-row transactions once (not measured), and ProducerPerformance's topic gets
/// a short run of its own.
fn warm_kafka(b: &Bench, readers: &[Reader]) -> Result<()> {
    if readers.iter().any(|r| r.kind == Kind::Perf) {
        let argv = readers::producer_perf_cmd(b, readers::PERF_TOPIC, 1000, 300)?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        let out = procs::output(cmd.stderr(std::fs::File::create(b.work.join("warm_perf.log"))?))?;
        if readers::parse_perf_summary(&out).map(|(sent, _)| sent) != Some(1000) {
            bail!("ProducerPerformance warm-up: unexpected output '{}'", out.trim());
        }
    }
    b.pg.reset()?;
    // Every Kafka reader, not one per listener: exactly-once has its own broker paths (the
    // transaction coordinator, markers, the position topic) to create and compile.
    let warm: Vec<Reader> =
        readers.iter().copied().filter(|r| matches!(r.kind, Kind::Kafka | Kind::KafkaEos | Kind::KafkaAvro)).collect();
    let slots: Vec<String> = warm.iter().map(|r| format!("warm_{}", r.name())).collect();
    b.pg.create_slots(&slots)?;
    let rows = b.knobs.warm_rows.max(5);
    b.pg.insert_rows(rows, 1, "")?;
    let end = b.pg.insert_lsn()?;
    for (r, s) in warm.iter().zip(&slots) {
        readers::run(b, *r, s, &end, rows)?;
    }
    Ok(())
}

/// Runs one backlog: warm-up, slots, insert, then `reps` rotated rounds; the runs go to `b.raw`.
pub fn run_backlog(b: &mut Bench, bl: &Backlog) -> Result<()> {
    if bl.readers.iter().any(|r| matches!(r.kind, Kind::Kafka | Kind::KafkaEos | Kind::KafkaAvro | Kind::Perf)) {
        warm_kafka(b, bl.readers)?;
    }
    b.pg.reset()?;
    let mut slots = Vec::new();
    for rep in 1..=bl.reps {
        slots.extend(bl.readers.iter().filter(|r| r.reads_slot()).map(|&r| slot(bl.key, r, rep)));
    }
    b.pg.create_slots(&slots)?;
    println!("   inserting {} rows, {} per transaction...", bl.rows, bl.per_txn);
    let t0 = Instant::now();
    b.pg.insert_rows(bl.rows, bl.per_txn, "")?;
    let end = b.pg.insert_lsn()?;
    b.pg.exec("CHECKPOINT")?;
    let payload = b.pg.payload_bytes()?;
    println!("   inserted in {:.0} s; backlog ends at {end}; payload ~{payload} B", t0.elapsed().as_secs_f64());
    b.report.payload_bytes = Some(payload);
    for rep in 1..=bl.reps {
        for r in rotated(bl.readers, rep) {
            let far = readers::far_pids(b, r);
            let before = measure::tree_cpu(&far);
            let sample = readers::run(b, r, &slot(bl.key, r, rep), &end, bl.rows)?;
            let far_cpu = measure::tree_cpu(&far) - before;
            println!(
                "   rep {rep} {:<40} {:6.2} s  cpu {:>5} s  rss {:>6} MiB  walsender cpu {} s  far side cpu {far_cpu:.2} s",
                r.label(b.http_batch()),
                sample.secs,
                sample.cpu.map_or("-".into(), |c| format!("{c:.2}")),
                sample.hwm_kib.map_or("-".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
                sample.walsender.map_or("-".into(), |c| format!("{c:.2}")),
            );
            b.raw.push(RawRow { key: bl.key.to_owned(), rep, reader: r, sample, far_cpu });
        }
    }
    b.pg.reset()
}

pub fn drain(b: &mut Bench) -> Result<()> {
    b.new_broker(Listeners::Plaintext)?;
    let k = b.knobs.clone();
    let mut rds = vec![local(Kind::Recv), local(Kind::Null), local(Kind::Kafka)];
    if k.drain_broker {
        rds.extend([local(Kind::Broker), local(Kind::Perf)]);
    }
    if k.drain_rabbitmq && procs::listening(5672) {
        let name = format!("outboxd-bench-{}", std::process::id());
        b.far.rabbit = Some(name.clone());
        if readers::rabbit(b, "setup").is_ok() {
            let ex = b.tools.examples.join("bench_rabbitmq").to_string_lossy().into_owned();
            procs::on_cleanup(vec![ex, "--url".into(), k.rabbit_url.clone(), "teardown".into(), name]);
            rds.push(local(Kind::Rabbitmq));
        } else {
            b.far.rabbit = None;
        }
    }
    if k.http_drain {
        b.far.webhook = Some(broker::webhook(&b.tools.examples, &b.work)?);
        rds.push(local(Kind::Http));
    }
    let ran = run_backlog(b, &Backlog { key: "drain", rows: k.n, per_txn: 1, reps: k.reps, readers: &rds });
    if let Some(w) = b.far.webhook.take() {
        w.stop();
    }
    ran?;
    let (md, sums) = tables::drain_rows(&b.raw, "drain", k.n, &format!("{} × 1-row txns", k.n), &rds, k.http_batch);
    b.report.section(&format!(
        "### Drain: {} single-row transactions (median of {})\n\n{DRAIN_HEADER}\n{md}\n",
        k.n, k.reps
    ));
    let get = |kind| tables::find(&sums, kind);
    let (nr, ncr) = (get(Kind::Null).and_then(|s| s.ratio), get(Kind::Null).and_then(|s| s.cpu_ratio));
    let t = &mut b.report;
    t.target("null drain ≥ 0.90× pg_recvlogical", times_cell(nr), at_least(nr, 0.90));
    t.target("CPU/event ≤ 2× pg_recvlogical's (null sink)", times_cell(ncr), at_most(ncr, 2.0));
    kafka_targets(b, &sums, "single-row txns");
    if b.far.rabbit.is_some() {
        let rr = get(Kind::Rabbitmq).and_then(|s| s.ratio);
        b.report.target("RabbitMQ drain ≥ 0.5× pg_recvlogical", times_cell(rr), at_least(rr, 0.5));
    }
    Ok(())
}

/// Issue 14's Kafka targets for one transaction shape: drain ≥ 0.90× pg_recvlogical and CPU per
/// event ≤ 2× pg_recvlogical's (librdkafka's threads included).
fn kafka_targets(b: &mut Bench, sums: &[tables::Summary], shape: &str) {
    let k = tables::find(sums, Kind::Kafka);
    let (kr, kcr) = (k.and_then(|s| s.ratio), k.and_then(|s| s.cpu_ratio));
    let t = &mut b.report;
    t.target(format!("Kafka drain ≥ 0.90× pg_recvlogical ({shape})"), times_cell(kr), at_least(kr, 0.90));
    t.target(
        format!("CPU/event ≤ 2× pg_recvlogical's (Kafka sink, incl. librdkafka threads; {shape})"),
        times_cell(kcr),
        at_most(kcr, 2.0),
    );
}

/// Peak-RSS targets: ≤ 64 MiB for the null and Kafka sinks.
fn rss_targets(b: &mut Bench, sums: &[tables::Summary], what: &str) {
    for (kind, sink) in [(Kind::Null, "null"), (Kind::Kafka, "kafka")] {
        let h = tables::find(sums, kind).map(|s| s.peak_mib);
        let measured = h.map_or_else(|| "n/a".to_owned(), |h| format!("{h:.1} MiB"));
        b.report.target(format!("peak RSS ≤ 64 MiB, {what} (--sink {sink})"), measured, at_most(h, 64.0));
    }
}

/// How many runs a table's cells summarise: "1 run", or "median of N" (REPS_HUGE=5 gave "5 run").
fn runs_note(reps: usize) -> String {
    if reps == 1 {
        "1 run".to_owned()
    } else {
        format!("median of {reps}")
    }
}

pub fn bigtx(b: &mut Bench) -> Result<()> {
    let k = b.knobs.clone();
    let rds = [local(Kind::Recv), local(Kind::Null), local(Kind::Kafka)];
    b.new_broker(Listeners::Plaintext)?;
    run_backlog(b, &Backlog { key: "bigtx", rows: k.n_big, per_txn: k.big_txn_rows, reps: k.reps, readers: &rds })?;
    b.new_broker(Listeners::Plaintext)?;
    run_backlog(b, &Backlog { key: "huge", rows: k.n_huge, per_txn: k.n_huge, reps: k.reps_huge, readers: &rds })?;
    let title = format!("{} rows, {}-row txns", k.n_big, k.big_txn_rows);
    let (big, big_sums) = tables::drain_rows(&b.raw, "bigtx", k.n_big, &title, &rds, k.http_batch);
    let title = format!("1 txn of {} rows", k.n_huge);
    let (huge, sums) = tables::drain_rows(&b.raw, "huge", k.n_huge, &title, &rds, k.http_batch);
    b.report.section(&format!(
        "### Big transactions: {} rows in {}-row transactions ({}), and one {}-row transaction ({})\n\n\
         {DRAIN_HEADER}\n{big}{huge}\n",
        k.n_big,
        k.big_txn_rows,
        runs_note(k.reps),
        k.n_huge,
        runs_note(k.reps_huge)
    ));
    kafka_targets(b, &big_sums, &format!("{}-row txns", k.big_txn_rows));
    kafka_targets(b, &sums, &format!("one {}-row txn", k.n_huge));
    rss_targets(b, &sums, &format!("one {}-row txn", k.n_huge));
    Ok(())
}

/// Exactly-once beside at-least-once: the three backlog shapes drained by pg_recvlogical, outboxd
/// --sink kafka and outboxd --sink kafka --delivery exactly-once (EOS_INTERVAL), REPS rotated
/// repetitions each; then the latency rows at 5k/s for at-least-once and each of EOS_INTERVALS.
pub fn eos(b: &mut Bench) -> Result<()> {
    let k = b.knobs.clone();
    let rds = [local(Kind::Recv), local(Kind::Kafka), local(Kind::KafkaEos)];
    let shapes = [
        ("eos_drain", k.n, 1, k.reps, format!("{} × 1-row txns", k.n)),
        ("eos_bigtx", k.n_big, k.big_txn_rows, k.reps, format!("{} rows, {}-row txns", k.n_big, k.big_txn_rows)),
        ("eos_huge", k.n_huge, k.n_huge, k.reps_huge, format!("1 txn of {} rows", k.n_huge)),
    ];
    let mut md = String::new();
    for (key, rows, per_txn, reps, title) in &shapes {
        b.new_broker(Listeners::Plaintext)?;
        run_backlog(b, &Backlog { key, rows: *rows, per_txn: *per_txn, reps: *reps, readers: &rds })?;
        let (rows_md, sums) = tables::drain_rows(&b.raw, key, *rows, title, &rds, k.http_batch);
        md.push_str(&rows_md);
        let ratio = |kind| tables::find(&sums, kind).and_then(|s| s.ratio);
        let eos_vs_alo = match (ratio(Kind::KafkaEos), ratio(Kind::Kafka)) {
            (Some(e), Some(a)) if a > 0.0 => Some(e / a),
            _ => None,
        };
        b.report.target(
            format!("exactly-once drain ≥ 0.8× at-least-once ({title}, --transaction-interval {})", k.eos_interval),
            times_cell(eos_vs_alo),
            at_least(eos_vs_alo, 0.8),
        );
    }
    b.report.section(&format!(
        "### Exactly-once beside at-least-once: drains (median of {}; the one-transaction shape {} run; \
         --transaction-interval {})\n\n{DRAIN_HEADER}\n{md}\n",
        k.reps, k.reps_huge, k.eos_interval
    ));
    b.new_broker(Listeners::Plaintext)?;
    b.pg.reset()?;
    let mut lat = format!(
        "### Exactly-once beside at-least-once: latency at 5k/s ({} s each, after a {} s warm-up)\n\n\
         commit→ack is `outboxd_commit_to_ack_seconds`: in exactly-once mode a record is acked when its Kafka \
         transaction commits, so it includes the wait for the commit. End-to-end is what a read_committed \
         consumer (librdkafka's default) sees.\n\n\
         | rate | sink | inserter: achieved, conns, max behind schedule, insert p99 | records consumed | end-to-end p50 | p99 | max | commit→ack p50 | commit→ack p99 | commit→ack ≤ 20 ms | outboxd CPU | outboxd peak RSS |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
        k.lat_secs, k.warm_secs
    );
    lat.push_str(&crate::latency::one_rate(b, 5000, "kafka")?);
    for interval in &k.eos_intervals {
        lat.push_str(&crate::latency::one_rate(b, 5000, &format!("eos_{interval}"))?);
    }
    b.report.section(&format!(
        "{lat}
"
    ));
    b.pg.reset()
}

/// Avro through a schema registry beside plain JSON: the single-row and the 1000-row backlogs
/// drained by pg_recvlogical, outboxd --sink kafka and outboxd --sink kafka --value-converter avro
/// (the payload encoded with the latest schema of `<topic>-value` in a private Apicurio Registry,
/// `scripts/registry`), REPS rotated repetitions each.
pub fn avro(b: &mut Bench) -> Result<()> {
    let k = b.knobs.clone();
    let reg = crate::registry::Registry::start(&b.work.join("registry"))?;
    for ty in crate::debezium::EVENT_TYPES {
        reg.register(&format!("{ty}.events-value"), crate::registry::BENCH_SCHEMA)?;
    }
    b.far.registry = Some(reg);
    let rds = [local(Kind::Recv), local(Kind::Kafka), local(Kind::KafkaAvro)];
    let shapes = [
        ("avro_drain", k.n, 1, format!("{} × 1-row txns", k.n)),
        ("avro_bigtx", k.n_big, k.big_txn_rows, format!("{} rows, {}-row txns", k.n_big, k.big_txn_rows)),
    ];
    let mut md = String::new();
    for (key, rows, per_txn, title) in &shapes {
        b.new_broker(Listeners::Plaintext)?;
        run_backlog(b, &Backlog { key, rows: *rows, per_txn: *per_txn, reps: k.reps, readers: &rds })?;
        let (rows_md, sums) = tables::drain_rows(&b.raw, key, *rows, title, &rds, k.http_batch);
        md.push_str(&rows_md);
        let ratio = |kind| tables::find(&sums, kind).and_then(|s| s.ratio);
        let avro_vs_json = match (ratio(Kind::KafkaAvro), ratio(Kind::Kafka)) {
            (Some(a), Some(j)) if j > 0.0 => Some(a / j),
            _ => None,
        };
        b.report.target(
            format!("Avro drain beside JSON ({title}; for reference, no target)"),
            times_cell(avro_vs_json),
            None,
        );
    }
    b.report.section(&format!(
        "### Avro through a schema registry beside JSON: drains (median of {})\n\n\
         The Avro row encodes each payload (~300 B of JSON) as an Avro datum of the subject's latest schema \
         (fetched once per topic from a private Apicurio Registry 3.3.3), behind the Confluent wire-format \
         header; the JSON row writes the payload's text as it is.\n\n{DRAIN_HEADER}\n{md}\n",
        k.reps
    ));
    if let Some(r) = b.far.registry.take() {
        r.stop();
    }
    b.pg.reset()
}

pub fn backlog(b: &mut Bench) -> Result<()> {
    let k = b.knobs.clone();
    let rds = [local(Kind::Recv), local(Kind::Null), local(Kind::Kafka)];
    b.new_broker(Listeners::Plaintext)?;
    run_backlog(
        b,
        &Backlog { key: "backlog", rows: k.n_backlog, per_txn: k.backlog_txn_rows, reps: 1, readers: &rds },
    )?;
    let title = format!("{} events, {}-row txns", k.n_backlog, k.backlog_txn_rows);
    let (md, sums) = tables::drain_rows(&b.raw, "backlog", k.n_backlog, &title, &rds, k.http_batch);
    b.report.section(&format!(
        "### Backlog memory: {} events in {}-row transactions (1 run)\n\n{} rows per transaction only to make the \
         insert faster; outboxd's memory depends on events in flight, not on the transaction size below \
         --max-in-flight.\n\n{DRAIN_HEADER}\n{md}\n",
        k.n_backlog, k.backlog_txn_rows, k.backlog_txn_rows
    ));
    rss_targets(b, &sums, &format!("{}-event backlog", k.n_backlog));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readers::{over, Transport};

    #[test]
    fn every_reader_leads_once_in_as_many_repetitions() {
        let rds = [local(Kind::Recv), local(Kind::Null), local(Kind::Kafka)];
        assert_eq!(rotated(&rds, 1), rds.to_vec());
        assert_eq!(rotated(&rds, 2), vec![rds[1], rds[2], rds[0]]);
        assert_eq!(rotated(&rds, 3), vec![rds[2], rds[0], rds[1]]);
        assert_eq!(rotated(&rds, 4), rds.to_vec());
    }

    #[test]
    fn headings_say_one_run_or_a_median() {
        assert_eq!(runs_note(1), "1 run");
        assert_eq!(runs_note(5), "median of 5");
    }

    #[test]
    fn slots_name_backlog_reader_and_repetition() {
        assert_eq!(slot("drain", local(Kind::Kafka), 3), "drain_kafka_3");
        assert_eq!(slot("tls", over(Kind::Recv, Transport::Tls), 1), "tls_recv_tls_1");
    }
}
