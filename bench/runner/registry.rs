//! A private Apicurio Registry for the `avro` scenario, started with `scripts/registry` (in
//! memory, loopback), and the Avro schema of bench/fill.sql's payload.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// bench/fill.sql's payload as an Avro record (the same for the five event types).
pub const BENCH_SCHEMA: &str = r#"{"type": "record", "name": "OrderEvent", "namespace": "bench.v1", "fields": [
  {"name": "orderId", "type": "long"},
  {"name": "customerId", "type": "string"},
  {"name": "status", "type": "string"},
  {"name": "currency", "type": "string"},
  {"name": "total", "type": "double"},
  {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item", "fields": [
    {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}, {"name": "price", "type": "double"}]}}},
  {"name": "shipTo", "type": {"type": "record", "name": "Address", "fields": [
    {"name": "street", "type": "string"}, {"name": "city", "type": "string"}, {"name": "country", "type": "string"}]}}
]}"#;

pub struct Registry {
    dir: PathBuf,
    /// The Confluent-compatible API root.
    pub url: String,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/registry")
}

impl Registry {
    pub fn start(dir: &Path) -> Result<Registry> {
        std::fs::create_dir_all(dir)?;
        println!("   starting Apicurio Registry in {}", dir.display());
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir)
            .arg("--parent")
            .arg(std::process::id().to_string())
            .output()
            .context("scripts/registry start")?;
        if !out.status.success() {
            bail!("scripts/registry start failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let url = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().trim().to_owned();
        Ok(Registry { dir: dir.to_owned(), url })
    }

    /// Register `schema` (Avro) under `subject`.
    pub fn register(&self, subject: &str, schema: &str) -> Result<()> {
        let body = serde_json::json!({"schema": schema, "schemaType": "AVRO"}).to_string();
        let out = Command::new("curl")
            .args(["-sS", "-f", "-X", "POST", "-H", "Content-Type: application/json", "--data-binary", &body])
            .arg(format!("{}/subjects/{subject}/versions", self.url))
            .output()
            .context("curl")?;
        if !out.status.success() {
            bail!("registering {subject}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    pub fn stop(self) {
        let _ = Command::new("bash").arg(script()).arg("stop").arg(&self.dir).status();
    }
}
