//! The inbox scenario's third reader: Debezium's JDBC sink connector (3.5.0.Final, which Maven
//! Central has; 3.6.1.Final, the PostgreSQL connector's version here, it does not) on a Kafka Connect 4.4.0
//! standalone worker (`scripts/debezium fetch-jdbc`, then `start` with `CONNECT_PLUGIN_PATH`; G1
//! and C2 as in production), draining the same backlog into a table of the same database.
//!
//! The connector needs a structured value, and outboxd's records carry a JSON payload as plain
//! bytes (no schema), the aggregate id as key and the event id in the `id` header. The least that
//! works: StringConverter for key and value and two SMTs, Kafka's `HoistField$Value` (the string
//! becomes a struct of one field `payload`) and Debezium's `HeaderToValue` (copies the `id` and
//! `eventType` headers into fields `event_id` and `event_type`), then `insert.mode=upsert` with
//! `primary.key.mode=record_value` on `event_id`: `INSERT … ON CONFLICT (event_id) DO UPDATE`,
//! deduplication by the event id as the inbox does. (`primary.key.mode=record_header` takes every
//! header into the key, `eventType` too, whatever `primary.key.fields` says: tried, refused by
//! PostgreSQL for want of a matching unique index.) The table is created before the run
//! (`schema.evolution=none`) with `payload jsonb` (the JDBC URL's `stringtype=unspecified` lets
//! PostgreSQL cast the string) and a `received_at` default, so its rate is read from PostgreSQL
//! exactly as the other two readers' (rows / (last commit − first row)). Its wall time runs from
//! launching the worker (JVM start-up included) until the table holds all rows.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{table_rate, Drained, BACKLOG_TOPIC};
use crate::bench::Bench;
use crate::measure;

/// The row label in the tables.
pub const NAME: &str = "Debezium JDBC sink 3.5.0.Final";

/// The note under the drain table.
pub const INTRO: &str = "Debezium's JDBC sink connector 3.5.0.Final (Maven Central has no 3.6.1.Final of it) on a Kafka Connect 4.4.0 standalone worker (G1, C2), one task (tasks.max=1: one consumer, like the other two), `batch.size` the same: key and value StringConverter, two SMTs for the struct the connector needs (Kafka's `HoistField$Value`: the payload string into field `payload`; Debezium's `HeaderToValue`: the `id` and `eventType` headers into `event_id` and `event_type`), `insert.mode=upsert` with `primary.key.mode=record_value` on `event_id` (`INSERT … ON CONFLICT (event_id) DO UPDATE`, pgjdbc's batch of single-row statements, its defaults), into a table created beforehand (`event_id text PRIMARY KEY, event_type text, payload jsonb, received_at`), so its rows/s is read as the others'. Its wall time includes starting the JVM and the worker; its peak RSS is the worker JVM's. Connect commits the consumer offsets after the database commit, on its own schedule (at least once: the upsert absorbs what it reads again).";

/// `scripts/debezium fetch-jdbc`: the plugin directory (Connect's jars fetched too).
pub fn fetch() -> Result<PathBuf> {
    let out = Command::new("bash").args(["scripts/debezium", "fetch-jdbc"]).stderr(Stdio::inherit()).output()?;
    if !out.status.success() {
        bail!("scripts/debezium fetch-jdbc failed");
    }
    let dir = String::from_utf8(out.stdout)?.lines().last().context("fetch-jdbc printed no directory")?.to_owned();
    Ok(PathBuf::from(dir))
}

fn connector(b: &Bench, name: &str, table: &str) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "config": {
            "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
            "tasks.max": "1",
            "topics": BACKLOG_TOPIC,
            "connection.url": format!("jdbc:postgresql://127.0.0.1:{}/app?stringtype=unspecified", b.pg.port),
            "connection.username": "postgres",
            "connection.password": "unused",
            "insert.mode": "upsert",
            "primary.key.mode": "record_value",
            "primary.key.fields": "event_id",
            "schema.evolution": "none",
            "collection.name.format": table,
            "batch.size": b.knobs.inbox_batch.to_string(),
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "transforms": "wrap,headers",
            "transforms.wrap.type": "org.apache.kafka.connect.transforms.HoistField$Value",
            "transforms.wrap.field": "payload",
            "transforms.headers.type": "io.debezium.transforms.HeaderToValue",
            "transforms.headers.headers": "id,eventType",
            "transforms.headers.fields": "event_id,event_type",
            "transforms.headers.operation": "copy",
        }
    })
}

/// Whether the worker in `work` reports its connector or task FAILED.
fn failed(work: &Path) -> bool {
    Command::new("bash")
        .args(["scripts/debezium", "status"])
        .arg(work)
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("\"FAILED\""))
        .unwrap_or(false)
}

/// One drain of the backlog by a fresh connector (a fresh group) into a fresh table.
pub fn drain(b: &Bench, rep: usize, plugins: &Path) -> Result<Drained> {
    let schema = format!("ib_j{rep}");
    let table = format!("{schema}.inbox");
    b.pg.exec(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; CREATE TABLE {table} \
         (event_id text PRIMARY KEY, event_type text, payload jsonb NOT NULL, \
         received_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    ))?;
    let dir = b.work.join(format!("inbox_j{rep}"));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("connector.json");
    std::fs::write(&file, connector(b, &format!("inbox-jdbc-{rep}"), &table).to_string())?;
    let work = dir.join("worker");
    let t0 = Instant::now();
    let mut launcher = Command::new("bash")
        .args(["scripts/debezium", "start"])
        .arg(&work)
        .arg(&file)
        .arg(format!("127.0.0.1:{}", b.kafka_port()))
        .env("DEBEZIUM_FULL_JVM", "1")
        .env("CONNECT_PLUGIN_PATH", plugins)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("launcher.log"))?)
        .spawn()?;
    let n = b.knobs.inbox_n as i64;
    let count = format!("SELECT count(*) FROM {table}");
    let mut polls = 0u64;
    let result = loop {
        polls += 1;
        if let Some(st) = launcher.try_wait()? {
            // The launcher returns once the task is RUNNING; a task that fails later (a record
            // the table refuses) shows only in the status: checked every ~second.
            if st.success() && polls % 50 == 0 && failed(&work) {
                break Err(anyhow::anyhow!(
                    "the JDBC sink's task FAILED:\n{}",
                    crate::procs::tail(&work.join("connect.log"), 30)
                ));
            }
            if !st.success() {
                break Err(anyhow::anyhow!(
                    "scripts/debezium start failed: {}\n{}",
                    std::fs::read_to_string(dir.join("launcher.log")).unwrap_or_default(),
                    crate::procs::tail(&work.join("connect.log"), 30)
                ));
            }
        }
        if b.pg.value(&count)?.parse::<i64>().unwrap_or(0) >= n {
            let wall = t0.elapsed().as_secs_f64();
            let pid: Option<u32> = std::fs::read_to_string(work.join("pid")).ok().and_then(|p| p.trim().parse().ok());
            let hwm = pid.and_then(measure::hwm_kib);
            break Ok((wall, hwm));
        }
        if t0.elapsed() > Duration::from_secs(900) {
            break Err(anyhow::anyhow!(
                "the JDBC sink did not store {n} rows in 15 min:\n{}",
                crate::procs::tail(&work.join("connect.log"), 30)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = Command::new("bash").args(["scripts/debezium", "stop"]).arg(&work).arg("--kill").status();
    let _ = launcher.wait();
    let (wall, hwm) = result?;
    let (rows, rate) = table_rate(b, &table)?;
    Ok(Drained { rate, wall, rows, rss_mib: hwm.map(|h| h as f64 / 1024.0) })
}
