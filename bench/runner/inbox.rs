//! The inbox scenario (`bench/run inbox`): `outboxd inbox` against the consumer loop a team would
//! write by hand (`bench_inbox hand`: rdkafka and tokio-postgres, the same batch size, one
//! `INSERT … ON CONFLICT (event_id) DO NOTHING` per batch, the offsets committed to Kafka after
//! the database commit) on the same backlog of INBOX_N records in one topic of 4 partitions.
//!
//! Both write tables of the same shape (sql/08_inbox.sql's, indexes included) in the bench cluster,
//! which runs with `track_commit_timestamp = on` here, so every figure is read from PostgreSQL the
//! same way for both: the drain's rate is rows / (last commit − first batch's start), and the
//! latency at INBOX_RATE is each row's commit timestamp − the record's Kafka append time (the
//! topics use `LogAppendTime`: the broker's clock, the same host's). Then the hand loop is killed
//! with SIGKILL a few times while it drains, and the records it read again (skipped by its unique
//! event id) are counted: what `outboxd inbox`, storing offsets in the same transaction, never reads.
//! With INBOX_JDBC=1 (the default), Debezium's JDBC sink connector on Kafka Connect drains the
//! same backlog as a third reader in each repetition (inbox/jdbc.rs).

mod breakdown;
mod jdbc;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bench::Bench;
use crate::broker::Listeners;
use crate::latency::{reap, spawn};
use crate::measure;
use crate::procs;
use crate::report::{at_least, at_most};
use crate::stats::{commas, Spread};

const BACKLOG_TOPIC: &str = "inbox.bench";

const INTRO: &str = "The consumers read the same backlog (one topic, 4 partitions, records like outboxd's: ~300 B JSON, 1,000 keys, `id` and `eventType` headers) into tables of the same shape (sql/08_inbox.sql's columns and indexes), `--batch-size` / `--batch` the same, each repetition into a fresh table and a fresh group, the order rotating. outboxd inbox stores each partition's next offset in the same statement as the rows; the hand loop (`examples/bench_inbox.rs hand`: rdkafka BaseConsumer + tokio-postgres, one multi-row `INSERT … ON CONFLICT (event_id) DO NOTHING` per batch, then a synchronous Kafka offset commit) is the usual at-least-once loop. rows/s = rows / (last commit − the first batch's start), both read from PostgreSQL (`track_commit_timestamp`); wall = process start → all rows committed (includes connecting and joining the group). Peak RSS = VmHWM.";

/// One consumer's drain.
pub(crate) struct Drained {
    rate: f64,
    wall: f64,
    rows: i64,
    rss_mib: Option<f64>,
}

pub fn inbox(b: &mut Bench) -> Result<()> {
    b.new_broker(Listeners::Plaintext)?;
    b.pg.exec("ALTER SYSTEM SET track_commit_timestamp = on")?;
    b.pg.restart()?;
    let k = b.knobs.clone();
    // The hand loop's tables are copies of this one (sql/08_inbox.sql, under another schema).
    let schema = std::fs::read_to_string("sql/08_inbox.sql")?.replace("public.inbox", "ib_tmpl.inbox");
    b.pg.exec(&format!("DROP SCHEMA IF EXISTS ib_tmpl CASCADE; CREATE SCHEMA ib_tmpl; {schema}"))?;
    println!("   producing {} records into {BACKLOG_TOPIC}", k.inbox_n);
    println!("   {}", produce(b, BACKLOG_TOPIC, k.inbox_n, 0, "d", 0)?);

    let plugins = if k.inbox_jdbc { Some(jdbc::fetch()?) } else { None };
    let (mut ours, mut hands, mut dbz) = (Vec::new(), Vec::new(), Vec::new());
    let readers = if plugins.is_some() { 3 } else { 2 };
    for rep in 0..k.reps {
        // The order rotates: 0 outboxd, 1 the hand loop, 2 the JDBC sink.
        for who in (0..readers).map(|i| (i + rep) % readers) {
            let d = match (who, &plugins) {
                (0, _) => drain_outboxd(b, rep)?,
                (1, _) => drain_hand(b, rep)?,
                (_, Some(p)) => jdbc::drain(b, rep, p)?,
                _ => bail!("the JDBC sink runs only when fetched (INBOX_JDBC=1)"),
            };
            let who_name = ["outboxd inbox", "hand loop", jdbc::NAME][who];
            println!(
                "   rep {rep} {who_name}: {} rows/s, {:.1} s wall, {} rows, {:?} MiB",
                commas(d.rate),
                d.wall,
                d.rows,
                d.rss_mib
            );
            if d.rows != k.inbox_n as i64 {
                bail!("{who_name} stored {} rows of {}", d.rows, k.inbox_n);
            }
            match who {
                0 => ours.push(d),
                1 => hands.push(d),
                _ => dbz.push(d),
            }
        }
    }
    let mut md = format!(
        "### Inbox: Kafka → the consumer's PostgreSQL ({} records, {} repetitions, batch {})\n\n{INTRO}\n\n\
         | consumer | rows/s | wall s | rows stored | peak RSS MiB |\n|---|---|---|---|---|\n",
        commas(k.inbox_n as f64),
        k.reps,
        k.inbox_batch
    );
    let cell = |v: Vec<f64>, f: fn(f64) -> String| {
        Spread::of(&v).map_or("?".to_owned(), |s| {
            if s.count < 2 {
                f(s.median)
            } else {
                format!("{} ({}–{})", f(s.median), f(s.min), f(s.max))
            }
        })
    };
    let jdbc_row = format!("{} (Kafka Connect 4.4.0)", jdbc::NAME);
    for (name, runs) in [("outboxd inbox", &ours), ("hand-written loop", &hands), (jdbc_row.as_str(), &dbz)] {
        if runs.is_empty() {
            continue;
        }
        md.push_str(&format!(
            "| {name} | {} | {} | {} | {} |\n",
            cell(runs.iter().map(|d| d.rate).collect(), commas),
            cell(runs.iter().map(|d| d.wall).collect(), |v| format!("{v:.1}")),
            runs.iter().map(|d| d.rows.to_string()).collect::<Vec<_>>().join(", "),
            cell(runs.iter().filter_map(|d| d.rss_mib).collect(), |v| format!("{v:.1}")),
        ));
    }
    let ratio = match (Spread::of(&rates(&ours)), Spread::of(&rates(&hands))) {
        (Some(o), Some(h)) if h.median > 0.0 => Some(o.median / h.median),
        _ => None,
    };
    b.report.target(
        "outboxd inbox rows/s ≥ the hand-written loop's",
        ratio.map_or("n/a".to_owned(), |r| format!("{r:.2}× (medians)")),
        at_least(ratio, 1.0),
    );
    if !dbz.is_empty() {
        let vs = match (Spread::of(&rates(&ours)), Spread::of(&rates(&dbz))) {
            (Some(o), Some(j)) if j.median > 0.0 => format!("{:.2}×", o.median / j.median),
            _ => "n/a".to_owned(),
        };
        md.push_str(&format!("\n{} outboxd inbox / JDBC sink rows/s: {vs} (medians).\n", jdbc::INTRO));
    }
    let (hand_again, ours_again) = (kills(b, false)?, kills(b, true)?);
    md.push_str(&format!(
        "\nEach consumer killed with SIGKILL {} times while draining, each kill once its table passed the next even \
         share of the backlog (then run to the end, all {} rows in): the hand loop read {hand_again} records again and \
         skipped them by its unique event id (each one a second delivery a worker without that index would process \
         twice); outboxd inbox read {ours_again} again (its offsets commit with the rows).\n",
        k.inbox_kills, k.inbox_n
    ));
    b.report.target(
        "outboxd inbox: no record read again after kill -9 (the hand loop's duplicates)",
        format!("{ours_again} (hand loop: {hand_again})"),
        Some(ours_again == 0),
    );
    latency(b, &mut md)?;
    md.push('\n');
    b.report.section(&md);
    Ok(())
}

fn rates(v: &[Drained]) -> Vec<f64> {
    v.iter().map(|d| d.rate).collect()
}

/// `count` records with ids `prefix`-i, after `warm` with ids w-i on the same schedule.
fn produce(b: &Bench, topic: &str, count: u64, rate: u64, prefix: &str, warm: u64) -> Result<String> {
    let mut cmd = Command::new(b.tools.examples.join("bench_inbox"));
    cmd.args(["produce", "--brokers", &format!("127.0.0.1:{}", b.kafka_port()), "--topic", topic]);
    cmd.args(["--count", &count.to_string(), "--rate", &rate.to_string(), "--id-prefix", prefix]);
    cmd.args(["--warm", &warm.to_string()]);
    Ok(procs::output(&mut cmd)?.trim().to_owned())
}

fn outboxd_cmd(b: &Bench, topic: &str, table: &str, group: &str, latest: bool) -> Command {
    let mut cmd = Command::new(&b.tools.outboxd);
    cmd.args(["inbox", "--kafka-brokers", &format!("127.0.0.1:{}", b.kafka_port()), "--topics", topic]);
    cmd.args(["--postgres-url", &b.pg.outboxd_url(), "--inbox-table", table, "--group", group]);
    cmd.args(["--batch-size", &b.knobs.inbox_batch.to_string(), "--metrics-addr", "off"]);
    if latest {
        cmd.args(["--start-from", "latest"]);
    }
    cmd
}

fn hand_cmd(b: &Bench, topic: &str, table: &str, group: &str, expect: Option<u64>) -> Command {
    let mut cmd = Command::new(b.tools.examples.join("bench_inbox"));
    cmd.args(["hand", "--brokers", &format!("127.0.0.1:{}", b.kafka_port()), "--topic", topic]);
    cmd.args(["--pg", &b.pg.socket_conninfo(), "--table", table, "--group", group]);
    cmd.args(["--batch", &b.knobs.inbox_batch.to_string()]);
    if let Some(n) = expect {
        cmd.args(["--expect", &n.to_string()]);
    }
    cmd
}

/// A fresh schema holding a copy of the template inbox table (for the hand loop).
fn hand_table(b: &Bench, schema: &str) -> Result<String> {
    b.pg.exec(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; \
         CREATE TABLE {schema}.inbox (LIKE ib_tmpl.inbox INCLUDING ALL)"
    ))?;
    Ok(format!("{schema}.inbox"))
}

/// Waits until `done` (polled every 20 ms) or the child exits, tracking its peak RSS.
fn watch(child: &mut Child, log: &Path, mut done: impl FnMut() -> Result<bool>) -> Result<Option<u64>> {
    let (t0, mut hwm) = (Instant::now(), None);
    loop {
        hwm = measure::hwm_kib(child.id()).or(hwm);
        if done()? {
            return Ok(hwm);
        }
        if let Some(st) = child.try_wait()? {
            if done()? {
                return Ok(hwm);
            }
            bail!("the consumer exited ({st}) before it was done:\n{}", procs::tail(log, 20));
        }
        if t0.elapsed() > Duration::from_secs(900) {
            bail!("the consumer was not done after 15 min:\n{}", procs::tail(log, 20));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A number from `sql`; 0 while it fails (the table is not there yet).
fn number(b: &Bench, sql: &str) -> i64 {
    b.pg.value(sql).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Rows, and rows / (last commit − first batch's start) of a table.
fn table_rate(b: &Bench, table: &str) -> Result<(i64, f64)> {
    let r = b.pg.row(&format!(
        "SELECT count(*), extract(epoch FROM max(pg_xact_commit_timestamp(xmin)) - min(received_at)) FROM {table}"
    ))?;
    let rows: i64 = r.first().context("no count")?.parse()?;
    let secs: f64 = r.get(1).context("no window")?.parse().unwrap_or(f64::NAN);
    Ok((rows, rows as f64 / secs))
}

fn drain_outboxd(b: &Bench, rep: usize) -> Result<Drained> {
    let schema = format!("ib_o{rep}");
    b.pg.exec(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))?;
    let table = format!("{schema}.inbox");
    let log = b.work.join(format!("inbox_o{rep}.log"));
    let t0 = Instant::now();
    let mut child = spawn(outboxd_cmd(b, BACKLOG_TOPIC, &table, &schema, false), &log, None)?;
    let n = b.knobs.inbox_n as i64;
    // Until outboxd has created the table, the query fails: nothing stored yet.
    let sum = format!("SELECT coalesce(sum(next_offset), 0) FROM {schema}.inbox_offsets");
    let hwm = watch(&mut child, &log, || Ok(number(b, &sum) >= n))?;
    let wall = t0.elapsed().as_secs_f64();
    procs::terminate(child.id());
    reap(child)?;
    let (rows, rate) = table_rate(b, &table)?;
    Ok(Drained { rate, wall, rows, rss_mib: hwm.map(|h| h as f64 / 1024.0) })
}

fn drain_hand(b: &Bench, rep: usize) -> Result<Drained> {
    let schema = format!("ib_h{rep}");
    let table = hand_table(b, &schema)?;
    let log = b.work.join(format!("inbox_h{rep}.log"));
    let t0 = Instant::now();
    let mut child = spawn(hand_cmd(b, BACKLOG_TOPIC, &table, &schema, Some(b.knobs.inbox_n)), &log, None)?;
    let mut exited = false;
    let hwm = watch(&mut child, &log, || {
        exited = exited || procs::tail(&log, 1).contains("done records=");
        Ok(exited)
    })?;
    let wall = t0.elapsed().as_secs_f64();
    reap(child)?;
    let (rows, rate) = table_rate(b, &table)?;
    Ok(Drained { rate, wall, rows, rss_mib: hwm.map(|h| h as f64 / 1024.0) })
}

/// A consumer killed with SIGKILL INBOX_KILLS times while draining the backlog, each kill when
/// its table has passed the next of INBOX_KILLS evenly spaced fractions of it (polled every 2 ms,
/// so the kill lands mid-drain whatever the speed), then run until every row is in; the records
/// it read again and found stored already (its per-batch lines, `records=R inserted=I`: R − I
/// summed; outboxd inbox's are its debug lines, `RUST_LOG` as INBOX_BREAKDOWN sets it).
fn kills(b: &Bench, outboxd: bool) -> Result<u64> {
    let k = &b.knobs;
    let (schema, who) = if outboxd { ("ib_kill_o", "outboxd inbox") } else { ("ib_kill_h", "hand loop") };
    let table = if outboxd {
        b.pg.exec(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))?;
        format!("{schema}.inbox")
    } else {
        hand_table(b, schema)?
    };
    let n = k.inbox_n as i64;
    let count = format!("SELECT count(*) FROM {table}");
    let mut logs = Vec::new();
    for i in 0..=k.inbox_kills {
        let log = b.work.join(format!("inbox_kill_{schema}{i}.log"));
        let cmd = if outboxd {
            let mut cmd = outboxd_cmd(b, BACKLOG_TOPIC, &table, schema, false);
            cmd.env("RUST_LOG", BREAKDOWN_LOG);
            cmd
        } else {
            hand_cmd(b, BACKLOG_TOPIC, &table, schema, None)
        };
        let mut child = spawn(cmd, &log, None)?;
        if i < k.inbox_kills {
            let mark = n * (i as i64 + 1) / (k.inbox_kills as i64 + 1);
            let t0 = Instant::now();
            while number(b, &count) < mark && t0.elapsed() < Duration::from_secs(120) {
                if child.try_wait()?.is_some() {
                    bail!("{who} exited before its kill:\n{}", procs::tail(&log, 20));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = Command::new("kill").args(["-9", &child.id().to_string()]).status();
            reap(child)?;
        } else {
            watch(&mut child, &log, || Ok(number(b, &count) >= n))?;
            procs::terminate(child.id());
            reap(child)?;
        }
        logs.push(log);
    }
    let (mut again, mut read) = (0, 0);
    for log in &logs {
        for line in std::fs::read_to_string(log)?.lines().filter(|l| l.contains("inserted=")) {
            let r: u64 = measure::kv("records", line).and_then(|v| v.parse().ok()).unwrap_or(0);
            let i: u64 = measure::kv("inserted", line).and_then(|v| v.parse().ok()).unwrap_or(0);
            again += r.saturating_sub(i);
            read += r;
        }
    }
    // Without its per-batch lines a consumer would show 0 read again whatever it did. (A killed
    // process's last lines can go with it: its stderr is not flushed after each line.)
    if read < k.inbox_n / 2 {
        bail!("{who}'s per-batch lines account for {read} records of {}", k.inbox_n);
    }
    let rows = b.pg.value(&count)?;
    println!("   {who}, {} kill -9: {again} records read again (of {read} in its lines); {rows} rows", k.inbox_kills);
    if rows.parse::<i64>().unwrap_or(0) != n {
        bail!("{who} after {} kills: {rows} rows of {n}", k.inbox_kills);
    }
    Ok(again)
}

/// Kafka append → inbox commit at INBOX_RATE for LAT_SECS (after WARM_SECS not measured), for
/// outboxd inbox and the hand loop, each on a topic of its own; and outboxd inbox's peak RSS.
/// With INBOX_BREAKDOWN=1 outboxd inbox runs with its per-batch debug lines on
/// (`RUST_LOG=info,outboxd::tools::inbox=debug`) and the report adds their breakdown; off by
/// default, since writing those lines is work the measured run would not otherwise do.
fn latency(b: &mut Bench, md: &mut String) -> Result<()> {
    let k = b.knobs.clone();
    let debug_lines = breakdown_asked()?;
    md.push_str(&format!(
        "\nLatency at {}/s for {} s (after {} s not measured): each row's commit timestamp − its record's Kafka append \
         time (LogAppendTime), read from the table; one producer paced on one schedule for the warm-up and the measured records, started once connected, linger.ms=5. The same \
         consumers, each on a topic of its own, started before the load.\n\n\
         | consumer | rows | p50 ms | p99 ms | max ms | peak RSS MiB |\n|---|---|---|---|---|---|\n",
        k.inbox_rate, k.lat_secs, k.warm_secs
    ));
    let mut parts = String::from(breakdown::DB_HEAD);
    let mut own = String::new();
    for outboxd in [true, false] {
        let name = if outboxd { "o" } else { "h" };
        let (topic, schema) = (format!("inbox.lat.{name}"), format!("ib_lat_{name}"));
        produce(b, &topic, 0, 0, "none", 0)?;
        let table = if outboxd {
            b.pg.exec(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))?;
            format!("{schema}.inbox")
        } else {
            hand_table(b, &schema)?
        };
        let log = b.work.join(format!("inbox_lat_{name}.log"));
        let cmd = if outboxd {
            let mut cmd = outboxd_cmd(b, &topic, &table, &schema, true);
            if debug_lines {
                // The per-batch lines `breakdown::from_log` reads.
                cmd.env("RUST_LOG", BREAKDOWN_LOG);
            }
            cmd
        } else {
            hand_cmd(b, &topic, &table, &schema, None)
        };
        let mut child = spawn(cmd, &log, None)?;
        if outboxd {
            // --start-from latest stores the partitions' starts before it assigns them.
            let q = format!("SELECT count(*) FROM {schema}.inbox_offsets");
            watch(&mut child, &log, || Ok(number(b, &q) >= 4))?;
        }
        std::thread::sleep(Duration::from_secs(3));
        let measured = k.inbox_rate * k.lat_secs;
        println!(
            "   {}: {measured} records at {}/s after {} not measured",
            if outboxd { "outboxd inbox" } else { "hand loop" },
            k.inbox_rate,
            k.inbox_rate * k.warm_secs
        );
        // One producer and one schedule for the warm-up and the measured records: a second
        // producer's start (connection, producer id) would send its first records as a burst.
        produce(b, &topic, measured, k.inbox_rate, "l", k.inbox_rate * k.warm_secs)?;
        let all = (k.inbox_rate * k.warm_secs + measured) as i64;
        let count = format!("SELECT count(*) FROM {table}");
        let hwm = watch(&mut child, &log, || Ok(b.pg.value(&count)?.parse::<i64>().unwrap_or(0) >= all))?;
        procs::terminate(child.id());
        reap(child)?;
        let r = b.pg.row(&format!(
            "WITH l AS (SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin) - kafka_timestamp) * 1000 AS ms \
                          FROM {table} WHERE event_id LIKE 'l-%') \
             SELECT count(*), round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1), \
                    round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1), round(max(ms)::numeric, 1) FROM l"
        ))?;
        let rss = hwm.map(|h| h as f64 / 1024.0);
        let who = if outboxd { "outboxd inbox" } else { "hand-written loop" };
        parts.push_str(&breakdown::from_table(b, who, &table)?);
        if outboxd && debug_lines {
            own = breakdown::from_log(&log)?;
        }
        let c = |i: usize| r.get(i).cloned().unwrap_or_else(|| "?".into());
        println!("   {who}: rows {} p50 {} p99 {} max {} ms, RSS {rss:?}", c(0), c(1), c(2), c(3));
        md.push_str(&format!(
            "| {who} | {} | {} | {} | {} | {} |\n",
            c(0),
            c(1),
            c(2),
            c(3),
            rss.map_or("?".into(), |v| format!("{v:.1}"))
        ));
        if outboxd {
            let p99: Option<f64> = r.get(2).and_then(|v| v.parse().ok());
            b.report.target(
                format!("outboxd inbox p99 Kafka append → inbox commit < 50 ms at {}/s", k.inbox_rate),
                p99.map_or("n/a".into(), |v| format!("{v:.1} ms")),
                at_most(p99, 50.0),
            );
            b.report.target(
                "outboxd inbox peak RSS < 64 MiB (latency run)",
                rss.map_or("n/a".into(), |v| format!("{v:.1} MiB")),
                at_most(rss, 64.0),
            );
        }
    }
    md.push_str(&format!(
        "\nWhere a row's time goes (the measured rows; parts that hold under any load): the wait from the Kafka \
         append to the start of its batch's statement (`received_at`, the transaction's start), and the statement \
         to its commit (`pg_xact_commit_timestamp`).\n\n{parts}\n{own}"
    ));
    if debug_lines {
        md.push_str(&format!(
            "\n(INBOX_BREAKDOWN=1: outboxd inbox ran with RUST_LOG={BREAKDOWN_LOG} in the latency run.)\n"
        ));
    }
    Ok(())
}

/// outboxd's log filter when the per-batch breakdown is asked for.
const BREAKDOWN_LOG: &str = "info,outboxd::tools::inbox=debug";

/// INBOX_BREAKDOWN: 1 for outboxd inbox's per-batch debug lines in the latency run (default 0).
fn breakdown_asked() -> Result<bool> {
    match std::env::var("INBOX_BREAKDOWN").ok().filter(|v| !v.is_empty()).as_deref() {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => bail!("INBOX_BREAKDOWN={v}: use 1 (outboxd inbox's per-batch debug lines) or 0"),
    }
}
