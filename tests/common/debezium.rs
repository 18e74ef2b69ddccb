//! Debezium 3.6.1.Final's PostgreSQL connector on a Kafka Connect 4.4.0 standalone worker, run
//! with `scripts/debezium` (the launcher users run too) beside outboxd: [`Debezium::start`] waits
//! until the connector and its task are RUNNING; drop kills the worker and removes its directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use tempfile::TempDir;

use super::{PgCluster, DB, PASSWORD, USER};

/// A PostgreSQL connector's class and database settings, pointed at `pg` (as the outboxd role).
pub fn pg_source(pg: &PgCluster) -> serde_json::Map<String, Value> {
    let v = json!({
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": "127.0.0.1",
        "database.port": pg.port().to_string(),
        "database.user": USER,
        "database.password": PASSWORD,
        "database.dbname": DB,
    });
    v.as_object().cloned().unwrap_or_default()
}

/// The seed article's connector JSON (`../shared/seed/outbox-article.txt`) as written, pointed
/// at `pg`: the REST body `{"name", "config"}`.
pub fn seed_connector(pg: &PgCluster) -> Value {
    let mut config = pg_source(pg);
    let seed = json!({
        "database.server.name": "app-pg",
        "plugin.name": "pgoutput",
        "publication.autocreate.mode": "filtered",
        "table.include.list": "public.outbox",
        "heartbeat.interval.ms": "5000",
        "tombstones.on.delete": "false",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.fields.additional.placement": "headers:header,aggregate_type:header,aggregate_id:header,event_type:header",
        "transforms.outbox.route.by.field": "event_type",
        "transforms.outbox.route.topic.replacement": "${r}.events",
        "transforms.outbox.table.field.event.id": "event_id",
        "transforms.outbox.table.field.event.key": "aggregate_id",
        "transforms.outbox.table.field.event.payload": "payload",
        "transforms.outbox.table.field.event.timestamp": "created_at"
    });
    config.extend(seed.as_object().cloned().unwrap_or_default());
    json!({ "name": "outbox-connector", "config": config })
}

pub fn debezium_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/debezium")
}

pub struct Debezium {
    dir: Option<TempDir>,
    /// The worker's REST API, `http://127.0.0.1:PORT`.
    pub rest: String,
}

impl Debezium {
    /// A worker running `connector` (a Connect REST body: `{"name", "config"}`) against the Kafka
    /// cluster at `bootstrap`; panics with the script's output when it does not reach RUNNING.
    pub fn start(connector: &serde_json::Value, bootstrap: &str) -> Debezium {
        Debezium::try_start(connector, bootstrap).unwrap_or_else(|e| panic!("Debezium did not start:\n{e}"))
    }

    /// Like [`Debezium::start`]; `Err` carries the script's stderr and the worker's log tail.
    pub fn try_start(connector: &serde_json::Value, bootstrap: &str) -> Result<Debezium, String> {
        let dir = tempfile::Builder::new().prefix("outboxd-debezium-").tempdir().expect("tempdir");
        let file = dir.path().join("connector.json");
        std::fs::write(&file, connector.to_string()).unwrap();
        let work = dir.path().join("worker");
        let out = Command::new("bash")
            .arg(debezium_script())
            .arg("start")
            .arg(&work)
            .arg(&file)
            .arg(bootstrap)
            .output()
            .expect("run scripts/debezium");
        let d = Debezium { dir: Some(dir), rest: String::from_utf8_lossy(&out.stdout).trim().to_owned() };
        if out.status.success() {
            Ok(d)
        } else {
            Err(format!("{}\n--- connect.log tail:\n{}", String::from_utf8_lossy(&out.stderr), tail(&d.log(), 40)))
        }
    }

    fn work(&self) -> PathBuf {
        self.dir.as_ref().expect("dir").path().join("worker")
    }

    /// The connector's status from the REST API (`{"connector": {"state"}, "tasks": [...]}`).
    pub fn status(&self) -> serde_json::Value {
        let out = Command::new("bash").arg(debezium_script()).arg("status").arg(self.work()).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// The states of the connector's tasks (`RUNNING`, `FAILED`, ...).
    pub fn task_states(&self) -> Vec<String> {
        self.status()["tasks"]
            .as_array()
            .map(|ts| ts.iter().map(|t| t["state"].as_str().unwrap_or("").to_owned()).collect())
            .unwrap_or_default()
    }

    /// The first task's failure trace, if it failed.
    pub fn task_trace(&self) -> String {
        self.status()["tasks"][0]["trace"].as_str().unwrap_or("").to_owned()
    }

    /// `scripts/debezium handover`: stop the connector, wait until STOPPED, and return its
    /// committed offsets (Connect's REST answer).
    pub fn handover(&self) -> serde_json::Value {
        let out = Command::new("bash").arg(debezium_script()).arg("handover").arg(self.work()).output().unwrap();
        assert!(out.status.success(), "handover: {}\n{}", String::from_utf8_lossy(&out.stderr), tail(&self.log(), 40));
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("handover printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// Kill the worker at once (kill -9), as a crash would.
    pub fn kill9(&self) {
        let _ = Command::new("bash").arg(debezium_script()).arg("stop").arg(self.work()).arg("--kill").status();
    }

    /// The worker's log (`connect.log`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.work().join("connect.log")).unwrap_or_default()
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Drop for Debezium {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(debezium_script()).arg("stop").arg(self.work()).arg("--kill").status();
        if std::env::var_os("OUTBOXD_TEST_KEEP").is_some() {
            if let Some(d) = self.dir.take() {
                eprintln!("[harness] keeping debezium dir {}", d.keep().display());
            }
        }
    }
}
