//! Catalog checks before streaming: the server's version and what it can decode, `wal_level`,
//! and each outbox table's columns and emptiness (for Debezium's `snapshot.mode`).
//!
//! Read-only: nothing here changes the database. Each failure is one line naming what is wrong and
//! what to change; a failed query is classed by its SQLSTATE ([`crate::pg::sqlstate`]).

use tokio_postgres::Client;

use super::timed;
use crate::config::{Config, TableName};
use crate::error::{Definite, Error};
use crate::pg::ident::quote_table;
use crate::pg::sqlstate::query_error as db;
use crate::router::{HeadersField, MissingPolicy};
/// The oldest PostgreSQL major version outboxd runs on.
pub const MIN_SERVER_MAJOR: u32 = 13;
/// The first major version whose pgoutput takes the `messages` option, so logical messages
/// (`--messages-prefix` events) reach us decoded. On 13 they are written to WAL but never sent.
pub const MESSAGES_SINCE_MAJOR: u32 = 14;

/// The server's version: `server_version_num` (e.g. 170004) and the human text (e.g. "17.4").
#[derive(Debug, Clone)]
pub struct ServerVersion {
    pub num: u32,
    pub text: String,
}

impl ServerVersion {
    pub fn major(&self) -> u32 {
        self.num / 10000
    }

    /// Whether pgoutput can pass logical messages through (`messages` option).
    pub fn decodes_messages(&self) -> bool {
        self.major() >= MESSAGES_SINCE_MAJOR
    }

    /// `Err` with a one-line reason for a server older than [`MIN_SERVER_MAJOR`].
    pub fn check_supported(&self) -> Result<(), Definite> {
        if self.major() < MIN_SERVER_MAJOR {
            return Err(Definite::Setup(format!(
                "unsupported version: PostgreSQL {} is too old; outboxd needs PostgreSQL {MIN_SERVER_MAJOR} or newer \
                 (13 to 18 are tested): upgrade the server",
                self.text
            )));
        }
        Ok(())
    }
}

/// Read the server's version.
pub async fn server_version(client: &Client) -> Result<ServerVersion, Error> {
    let row = timed(
        "reading the server version",
        client.query_one("SELECT current_setting('server_version_num'), current_setting('server_version')", &[]),
    )
    .await?;
    let num: String = row.get(0);
    let text: String = row.get(1);
    let num = num
        .trim()
        .parse()
        .map_err(|_| Definite::Setup(format!("the server reported server_version_num {num:?}, not a number")))?;
    // "16.4 (Debian 16.4-1.pgdg120+1)": the first word is enough.
    let text = text.split_whitespace().next().unwrap_or_default().to_owned();
    Ok(ServerVersion { num, text })
}

/// `wal_level` must be `logical`.
pub async fn check_wal_level(client: &Client) -> Result<(), Error> {
    let row = client.query_one("SHOW wal_level", &[]).await.map_err(|e| db("reading wal_level", e))?;
    let level: String = row.get(0);
    if level != "logical" {
        return Err(Definite::Setup(format!(
            "wal_level is '{level}' but outboxd needs 'logical': run ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"
        ))
        .into());
    }
    Ok(())
}

/// Every outbox table exists and has the columns the router needs.
pub async fn check_tables(client: &Client, cfg: &Config) -> Result<(), Error> {
    for table in &cfg.tables {
        check_table(client, cfg, table).await?;
    }
    Ok(())
}

async fn check_table(client: &Client, cfg: &Config, table: &TableName) -> Result<(), Error> {
    let rows = client
        .query(
            "SELECT a.attname::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
            &[&table.schema, &table.name],
        )
        .await
        .map_err(|e| db("reading the outbox table's columns", e))?;
    if rows.is_empty() {
        return Err(Definite::Setup(format!(
            "table {table} does not exist (or has no columns): create it (see sql/01_outbox.sql) or point --table at it"
        ))
        .into());
    }
    let have: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    for (col, flag) in needed_columns(cfg) {
        if !have.iter().any(|h| h == col) {
            return Err(Definite::Setup(format!(
                "table {table} has no column {col:?} (needed by {flag}); add the column or change {flag}"
            ))
            .into());
        }
    }
    let r = &cfg.route;
    if r.contracts.is_some() && !have.contains(&r.type_field) {
        return Err(Definite::Setup(format!(
            "table {table} has no column {:?} (the event type, set by --table-field-event-type) that --schema-dir needs to pick a schema; add the column or point the flag at it",
            r.type_field
        ))
        .into());
    }
    Ok(())
}

/// The columns every outbox table must have, each with the flag that names it: routed (topic),
/// key, id and payload first, then the optional ones this configuration uses.
pub fn needed_columns(cfg: &Config) -> Vec<(&str, &'static str)> {
    let r = &cfg.route;
    let mut need = vec![
        (r.route_by_field.as_str(), "--route-by-field"),
        (r.key_field.as_str(), "--table-field-event-key"),
        (r.id_field.as_str(), "--table-field-event-id"),
        (r.payload_field.as_str(), "--table-field-event-payload"),
    ];
    if let Some(ts) = &r.timestamp_field {
        need.push((ts, "--table-field-event-timestamp"));
    }
    if let HeadersField::Required(h) = &r.headers_field {
        need.push((h, "--table-field-event-headers"));
    }

    if r.additional_missing == MissingPolicy::Error {
        for p in &r.placements {
            need.push((&p.column, "--table-fields-additional-placement"));
        }
    }
    need
}

/// `snapshot.mode=initial` in a Debezium file: outboxd takes no snapshots, so existing rows would
/// be skipped silently. Refuse unless every outbox table is empty.
pub async fn check_empty(client: &Client, cfg: &Config) -> Result<(), Error> {
    // Debezium snapshots only on its first start (no offsets yet): on an existing slot, or when
    // taking over a Debezium connector's offsets, this is a resumption.
    let slot_exists = client
        .query_opt("SELECT 1 FROM pg_replication_slots WHERE slot_name = $1", &[&cfg.slot])
        .await
        .map_err(|e| db("reading pg_replication_slots", e))?
        .is_some();
    if slot_exists || cfg.debezium_offsets.is_some() {
        tracing::info!(slot = %cfg.slot, "snapshot.mode: the slot exists, so this is no first start and the outbox need not be empty");
        return Ok(());
    }
    for t in &cfg.tables {
        let row = client
            .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {})", quote_table(t)), &[])
            .await
            .map_err(|e| db(&format!("reading {t}"), e))?;
        if row.get::<_, bool>(0) {
            return Err(Definite::Setup(format!(
                "snapshot.mode asks for an initial snapshot, but outboxd streams only new rows and {t} is not empty: \
                 set snapshot.mode=never (or no_data) in the file, and republish old rows yourself if they were never sent"
            ))
            .into());
        }
    }
    Ok(())
}

/// `--messages-prefix` needs pgoutput's `messages` option, which PostgreSQL 14 added.
pub fn check_messages_supported(version: &ServerVersion) -> Result<(), Definite> {
    if !version.decodes_messages() {
        return Err(Definite::Setup(format!(
            "--messages-prefix needs PostgreSQL {MESSAGES_SINCE_MAJOR} or later (pgoutput sends logical messages only from {MESSAGES_SINCE_MAJOR} on), but the server is {}: upgrade it, or write events to an outbox table instead",
            version.text
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_before_13_are_refused_and_messages_start_at_14() {
        let v = |num, text: &str| ServerVersion { num, text: text.into() };
        let old = v(120022, "12.22").check_supported().unwrap_err().to_string();
        assert!(old.contains("unsupported version") && old.contains("12.22") && old.contains("13 or newer"), "{old}");
        assert!(v(90624, "9.6.24").check_supported().is_err());
        for (num, text) in [(130023, "13.23"), (140023, "14.23"), (150018, "15.18"), (180004, "18.4")] {
            assert!(v(num, text).check_supported().is_ok(), "{text}");
        }
        assert!(!v(130023, "13.23").decodes_messages());
        assert!(v(140000, "14.0").decodes_messages());
        assert_eq!(v(170010, "17.10").major(), 17);
    }
}
