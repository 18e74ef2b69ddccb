//! The race (`bench/run debezium`): pg_recvlogical, outboxd --sink kafka and Debezium 3.6.1.Final
//! on a Kafka Connect 4.4.0 standalone worker (`scripts/debezium`, `DEBEZIUM_FULL_JVM=1`: G1 and
//! the C2 compiler, as a production JVM runs), on the same backlogs, cluster and broker, in
//! rotating order, in three transaction shapes: N single-row transactions, N_BIG rows in
//! BIG_TXN_ROWS-row transactions, and one DBZ_HUGE-row transaction.
//!
//! Debezium is run as a user would run it: the connector JSON with the EventRouter on the bench's
//! outbox (routed by `event_type` to `dbz.${routedByValue}.events`, key `aggregate_id`), its own
//! slot created before the backlog (`snapshot.mode=no_data`: stream from the slot), Connect's and
//! Debezium's defaults for everything else (producer acks=all with idempotence, linger.ms=5 in
//! Kafka 4; max.batch.size 2048). Its time runs from launching the worker to the moment the
//! brokers hold all N records of the run (the sum of its topics' high watermarks, polled every
//! 50 ms): JVM start-up included, as for outboxd its start-up is included. The time to its first
//! record is reported beside. Its CPU is the worker JVM's user + system time at that moment, its
//! peak RSS the JVM's VmHWM. Each topic is created before the backlog with one partition, like
//! outboxd's (the broker's `num.partitions`), so no run times a topic creation.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

use crate::bench::Bench;
use crate::drain::{run_backlog, Backlog};
use crate::measure;
use crate::readers::{local, Kind, Sample};
use crate::tables::{self, DRAIN_HEADER};

/// The event types bench_fill writes (bench/fill.sql): Debezium's topics are `dbz.<type>.events`.
pub const EVENT_TYPES: [&str; 5] =
    ["order.created.v1", "order.paid.v1", "order.shipped.v1", "order.delivered.v1", "order.cancelled.v1"];

fn topics() -> Vec<String> {
    EVENT_TYPES.iter().map(|t| format!("dbz.{t}.events")).collect()
}

pub fn debezium(b: &mut Bench) -> Result<()> {
    let k = b.knobs.clone();
    b.new_broker(crate::broker::Listeners::Plaintext)?;
    let prep = Command::new("bash").args(["scripts/debezium", "fetch"]).stdout(Stdio::null()).status()?;
    if !prep.success() {
        bail!("scripts/debezium fetch failed");
    }
    create_topics(b)?;
    let rds = [local(Kind::Recv), local(Kind::Kafka), local(Kind::Debezium)];
    let shapes = [
        ("dbz_drain", k.n, 1, format!("{} × 1-row txns", k.n)),
        ("dbz_bigtx", k.n_big, k.big_txn_rows, format!("{} rows, {}-row txns", k.n_big, k.big_txn_rows)),
        ("dbz_huge", k.dbz_huge, k.dbz_huge, format!("1 txn of {} rows", k.dbz_huge)),
    ];
    let mut md = String::new();
    let mut first = String::new();
    let shapes = if k.dbz_drain { &shapes[..] } else { &[] };
    for (key, rows, per_txn, title) in shapes {
        run_backlog(b, &Backlog { key, rows: *rows, per_txn: *per_txn, reps: k.reps, readers: &rds })?;
        let (rows_md, _) = tables::drain_rows(&b.raw, key, *rows, title, &rds, k.http_batch);
        md.push_str(&rows_md);
        let runs: Vec<(f64, f64)> = b
            .raw
            .iter()
            .filter(|r| r.key == *key && r.reader.kind == Kind::Debezium)
            .filter_map(|r| r.sample.first_secs.map(|f| (f, r.sample.secs)))
            .collect();
        let firsts: Vec<f64> = runs.iter().map(|(f, _)| *f).collect();
        // The rate once records flow: rows over the time from the first record to the last.
        let rates: Vec<f64> = runs.iter().filter(|(f, s)| s > f).map(|(f, s)| *rows as f64 / (s - f)).collect();
        if let (Some(f), Some(r)) = (crate::stats::Spread::of(&firsts), crate::stats::Spread::of(&rates)) {
            first.push_str(&format!("| {title} | {} | {} |\n", f.cell(), crate::stats::commas(r.median)));
        }
    }
    let latency = if k.dbz_latency { crate::race_latency::race_latency(b)? } else { String::new() };
    let drain = if k.dbz_drain {
        format!(
            "Debezium 3.6.1.Final on a Kafka Connect 4.4.0 standalone worker (JVM: G1, C2; heap ≤ 1 GiB), its \
             time and CPU from launching the worker until the brokers hold every record (JVM start-up \
             included); outboxd's from its start until the slot is confirmed past the backlog.\n\n\
             {DRAIN_HEADER}\n{md}\n\
             Debezium's time from launching the worker to its first record on the brokers, and its rate from \
             then on (rows / time from the first record to the last):\n\n\
             | backlog | seconds to the first record | events/s after it (median) |\n|---|---|---|\n{first}\n"
        )
    } else {
        String::new()
    };
    b.report.section(&format!(
        "### The race: pg_recvlogical, outboxd and Debezium on Kafka Connect (median of {})\n\n{drain}{latency}",
        k.reps
    ));
    Ok(())
}

/// Debezium's topics, one partition each, before any backlog.
fn create_topics(b: &Bench) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", format!("127.0.0.1:{}", b.kafka_port())).create()?;
    let names = topics();
    let new: Vec<NewTopic> = names.iter().map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1))).collect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    for r in rt.block_on(admin.create_topics(&new, &AdminOptions::new()))? {
        if let Err((t, e)) = r {
            bail!("creating {t}: {e}");
        }
    }
    Ok(())
}

/// Records on Debezium's topics now: the sum of their high watermarks.
fn records(c: &BaseConsumer) -> Result<i64> {
    let mut sum = 0;
    for t in topics() {
        let (_, high) =
            c.fetch_watermarks(&t, 0, Duration::from_secs(5)).with_context(|| format!("watermarks of {t}"))?;
        sum += high;
    }
    Ok(sum)
}

/// The connector JSON of one run: Debezium's own slot `slot`, the bench's publication, records
/// routed to `replacement` (`${routedByValue}` in it), stamped from the column `timestamp` if
/// given (else the EventRouter's default: the time Debezium processed the event).
pub fn connector(b: &Bench, slot: &str, replacement: &str, timestamp: Option<&str>) -> serde_json::Value {
    let mut c = serde_json::json!({
        "name": format!("bench-{slot}"),
        "config": {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "database.hostname": "127.0.0.1",
            "database.port": b.pg.port.to_string(),
            "database.user": "postgres",
            "database.password": "unused-trust-auth",
            "database.dbname": "app",
            "topic.prefix": "bench",
            "plugin.name": "pgoutput",
            "slot.name": slot,
            "publication.name": "outboxd",
            "publication.autocreate.mode": "disabled",
            "table.include.list": "public.outbox",
            "snapshot.mode": "no_data",
            "transforms": "outbox",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "transforms.outbox.route.by.field": "event_type",
            "transforms.outbox.route.topic.replacement": replacement,
            "transforms.outbox.table.field.event.id": "event_id",
            "transforms.outbox.table.field.event.key": "aggregate_id",
            "transforms.outbox.table.field.event.payload": "payload"
        }
    });
    if let Some(column) = timestamp {
        c["config"]["transforms.outbox.table.field.event.timestamp"] = column.into();
    }
    c
}

/// Launches `scripts/debezium start` for `connector` in `dir/worker` (G1 and C2, as in
/// production); the launcher exits once the task is RUNNING, the worker stays.
pub fn launch(b: &Bench, dir: &Path, connector: &serde_json::Value) -> Result<std::process::Child> {
    std::fs::create_dir_all(dir)?;
    let file = dir.join("connector.json");
    std::fs::write(&file, connector.to_string())?;
    Ok(Command::new("bash")
        .args(["scripts/debezium", "start"])
        .arg(dir.join("worker"))
        .arg(&file)
        .arg(format!("127.0.0.1:{}", b.kafka_port()))
        .env("DEBEZIUM_FULL_JVM", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("launcher.log"))?)
        .spawn()?)
}

/// Stops the worker in `work` at once and waits (up to 30 s) until its walsender lets go of `slot`.
pub fn stop(b: &Bench, work: &Path, slot: &str) {
    let _ = Command::new("bash").args(["scripts/debezium", "stop"]).arg(work).arg("--kill").status();
    let wait = Instant::now();
    while b.pg.slot_active(slot).unwrap_or(false) && wait.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One Debezium run on `slot` until the brokers hold `rows` more records than before it.
pub fn run(b: &Bench, slot: &str, rows: u64) -> Result<Sample> {
    let dir = b.work.join(format!("{slot}-debezium"));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", format!("127.0.0.1:{}", b.kafka_port()))
        .set("group.id", "bench-watermarks")
        .create()?;
    let before = records(&consumer)?;
    let work = dir.join("worker");
    let t0 = Instant::now();
    let mut launcher = launch(b, &dir, &connector(b, slot, "dbz.${routedByValue}.events", None))?;
    let mut first = None;
    let deadline = t0 + Duration::from_secs(1800);
    let result = loop {
        if let Some(status) = launcher.try_wait()? {
            if !status.success() {
                break Err(anyhow::anyhow!(
                    "scripts/debezium start failed: {}\n{}",
                    std::fs::read_to_string(dir.join("launcher.log")).unwrap_or_default(),
                    crate::procs::tail(&work.join("connect.log"), 30)
                ));
            }
        }
        let got = records(&consumer)? - before;
        if got > 0 && first.is_none() {
            first = Some(t0.elapsed().as_secs_f64());
        }
        if got >= rows as i64 {
            let secs = t0.elapsed().as_secs_f64();
            let pid: Option<u32> = std::fs::read_to_string(work.join("pid")).ok().and_then(|p| p.trim().parse().ok());
            let cpu = pid.and_then(measure::proc_cpu);
            let hwm = pid.and_then(measure::hwm_kib);
            break Ok(Sample { secs, cpu, hwm_kib: hwm, walsender: None, first_secs: first });
        }
        if Instant::now() > deadline {
            break Err(anyhow::anyhow!(
                "Debezium on {slot}: {got} of {rows} records after 30 min\n{}",
                crate::procs::tail(&work.join("connect.log"), 30)
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = launcher.wait();
    // The walsender must let go of the slot before the next reader's run.
    stop(b, &work, slot);
    result
}
