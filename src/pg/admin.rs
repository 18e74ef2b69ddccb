//! Set-up checks and catalog queries over an ordinary (non-replication) connection.
//!
//! Everything here runs before streaming starts, and each failure becomes one line that says what
//! is wrong and what to change. We create the publication (per `--publication-autocreate`) and the
//! slot when they are missing, but never drop, recreate or take over a slot: a slot held by another
//! process is reported as [`Transient::SlotBusy`] so the caller can wait for it, which is how a
//! standby outboxd takes over.

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

use crate::config::{Config, PublicationAutocreate, TableName};
use crate::error::{Definite, Error, Transient};
use crate::lsn::Lsn;
use crate::router::{HeadersField, MissingPolicy};

/// Open an ordinary connection; the connection task runs in the background.
pub async fn connect(cfg: &Config) -> Result<Client, Error> {
    let target = &cfg.postgres;
    match target.to_tokio_postgres().connect(NoTls).await {
        Ok((client, conn)) => {
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "admin connection closed");
                }
            });
            Ok(client)
        }
        Err(e) => Err(match e.code() {
            Some(c) if *c == SqlState::INVALID_PASSWORD => Definite::Setup(format!(
                "password authentication failed for user {:?} at {target}: check the password in --postgres-url",
                target.user
            ))
            .into(),
            Some(c) if *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => Definite::Setup(format!(
                "PostgreSQL at {target} refused the login: {}",
                e.as_db_error().map(|d| d.message()).unwrap_or("no pg_hba.conf entry")
            ))
            .into(),
            Some(c) if *c == SqlState::INVALID_CATALOG_NAME => {
                Definite::Setup(format!("database {:?} does not exist at {target}", target.dbname)).into()
            }
            _ if e.to_string().contains("password missing") => {
                Definite::Setup(format!("PostgreSQL at {target} asks for a password, but --postgres-url has none"))
                    .into()
            }
            _ => Definite::Setup(format!(
                "cannot reach PostgreSQL at {target}: {e}; check host, port and that the server is running"
            ))
            .into(),
        }),
    }
}

fn db(what: &str, e: tokio_postgres::Error) -> Error {
    let msg = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_else(|| e.to_string());
    if e.is_closed() || e.as_db_error().is_none() {
        Transient::PgServer { code: "08006".into(), message: format!("{what}: {msg}") }.into()
    } else {
        Definite::Setup(format!("{what}: {msg}")).into()
    }
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
    for (col, flag) in need {
        if !have.iter().any(|h| h == col) {
            return Err(Definite::Setup(format!(
                "table {table} has no column {col:?} (needed by {flag}); add the column or change {flag}"
            ))
            .into());
        }
    }
    Ok(())
}

/// `snapshot.mode=initial` in a Debezium file: outboxd takes no snapshots, so existing rows would
/// be skipped silently. Refuse unless every outbox table is empty.
pub async fn check_empty(client: &Client, cfg: &Config) -> Result<(), Error> {
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

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn quote_table(t: &TableName) -> String {
    format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.name))
}

/// The publication exists (created per `--publication-autocreate`) and publishes every table's inserts.
pub async fn ensure_publication(client: &Client, cfg: &Config) -> Result<(), Error> {
    let all: Vec<String> = cfg.tables.iter().map(quote_table).collect();
    let all = all.join(", ");
    let exists = client
        .query_opt("SELECT pubinsert FROM pg_publication WHERE pubname = $1", &[&cfg.publication])
        .await
        .map_err(|e| db("reading pg_publication", e))?;
    let Some(row) = exists else {
        if cfg.publication_autocreate == PublicationAutocreate::Disabled {
            return Err(Definite::Setup(format!(
                "publication {:?} does not exist and --publication-autocreate is disabled: run CREATE PUBLICATION {} FOR TABLE {all}",
                cfg.publication,
                quote_ident(&cfg.publication),
            ))
            .into());
        }
        let sql = format!("CREATE PUBLICATION {} FOR TABLE {all}", quote_ident(&cfg.publication));
        match client.batch_execute(&sql).await {
            Ok(()) => tracing::info!(publication = %cfg.publication, tables = %all, "created publication"),
            // Another instance won the race; fall through to the membership check.
            Err(e) if e.code() == Some(&SqlState::DUPLICATE_OBJECT) => {}
            Err(e) => {
                return Err(db(&format!("creating publication {:?} (the role must own {all})", cfg.publication), e))
            }
        }
        return Ok(());
    };
    let pubinsert: bool = row.get(0);
    if !pubinsert {
        return Err(Definite::Setup(format!(
            "publication {:?} does not publish inserts: ALTER PUBLICATION {} SET (publish = 'insert')",
            cfg.publication,
            quote_ident(&cfg.publication)
        ))
        .into());
    }
    for table in &cfg.tables {
        let member = client
            .query_opt(
                "SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
                &[&cfg.publication, &table.schema, &table.name],
            )
            .await
            .map_err(|e| db("reading pg_publication_tables", e))?;
        if member.is_none() {
            return Err(Definite::Setup(format!(
                "publication {:?} does not include {table}: ALTER PUBLICATION {} ADD TABLE {}",
                cfg.publication,
                quote_ident(&cfg.publication),
                quote_table(table)
            ))
            .into());
        }
    }
    Ok(())
}

/// What we know about our slot once it is usable.
#[derive(Debug, Clone, Copy)]
pub struct SlotState {
    pub confirmed_flush: Lsn,
}

/// Find or create the pgoutput slot. Busy → [`Transient::SlotBusy`]; lost or foreign → definite.
pub async fn ensure_slot(client: &Client, cfg: &Config) -> Result<SlotState, Error> {
    let q = "SELECT plugin::text, slot_type, database::text, active_pid, wal_status, confirmed_flush_lsn::text \
             FROM pg_replication_slots WHERE slot_name = $1";
    let mut row = client.query_opt(q, &[&cfg.slot]).await.map_err(|e| db("reading pg_replication_slots", e))?;
    if row.is_none() {
        match client.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", &[&cfg.slot]).await {
            Ok(_) => {
                tracing::info!(slot = %cfg.slot, "created logical replication slot (pgoutput)")
            }
            Err(e) if e.code() == Some(&SqlState::DUPLICATE_OBJECT) => {}
            Err(e) => {
                return Err(db(&format!("creating replication slot {:?} (the role needs REPLICATION)", cfg.slot), e))
            }
        }
        row = client.query_opt(q, &[&cfg.slot]).await.map_err(|e| db("reading pg_replication_slots", e))?;
    }
    let row =
        row.ok_or_else(|| Definite::Setup(format!("replication slot {:?} vanished right after creation", cfg.slot)))?;
    let plugin: Option<String> = row.get(0);
    let slot_type: String = row.get(1);
    let database: Option<String> = row.get(2);
    let active_pid: Option<i32> = row.get(3);
    let wal_status: Option<String> = row.get(4);
    let confirmed: Option<String> = row.get(5);
    if slot_type != "logical" || plugin.as_deref() != Some("pgoutput") {
        return Err(Definite::Setup(format!(
            "slot {:?} exists but is {slot_type} with plugin {}; outboxd needs a logical pgoutput slot: pick another --slot",
            cfg.slot,
            plugin.as_deref().unwrap_or("none")
        ))
        .into());
    }
    if database.as_deref() != Some(cfg.postgres.dbname.as_str()) {
        return Err(Definite::Setup(format!(
            "slot {:?} belongs to database {:?}, not {:?}: pick another --slot or connect to that database",
            cfg.slot,
            database.unwrap_or_default(),
            cfg.postgres.dbname
        ))
        .into());
    }
    if wal_status.as_deref() == Some("lost") {
        return Err(Definite::Setup(format!(
            "slot {:?} has wal_status 'lost': the WAL it needs was removed (max_slot_wal_keep_size), so events may be missing. \
             Reconcile the outbox by hand, then drop the slot and start again",
            cfg.slot
        ))
        .into());
    }
    if let Some(pid) = active_pid {
        return Err(Transient::SlotBusy { slot: cfg.slot.clone(), pid }.into());
    }
    let confirmed_flush = match confirmed {
        Some(s) => s.parse().map_err(|e| Definite::Setup(format!("slot {:?}: {e}", cfg.slot)))?,
        None => Lsn::ZERO,
    };
    Ok(SlotState { confirmed_flush })
}

/// Whether the publication exists.
pub async fn publication_exists(client: &Client, name: &str) -> Result<bool, Error> {
    let row = client
        .query_opt("SELECT 1 FROM pg_publication WHERE pubname = $1", &[&name])
        .await
        .map_err(|e| db("reading pg_publication", e))?;
    Ok(row.is_some())
}

/// The slot's lag as the server sees it.
#[derive(Debug, Clone, Copy)]
pub struct SlotLag {
    /// `pg_current_wal_lsn() - confirmed_flush_lsn`.
    pub lag_bytes: i64,
    /// `safe_wal_size`, when `max_slot_wal_keep_size` limits the slot.
    pub safe_wal_size: Option<i64>,
}

pub async fn slot_lag(client: &Client, slot: &str) -> Result<Option<SlotLag>, Error> {
    let row = client
        .query_opt(
            "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::int8, safe_wal_size::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| db("reading the slot's lag", e))?;
    Ok(row.map(|r| SlotLag { lag_bytes: r.get::<_, Option<i64>>(0).unwrap_or(0), safe_wal_size: r.get(1) }))
}

/// Current WAL insert position, for lag metrics.
pub async fn current_wal_lsn(client: &Client) -> Result<Lsn, Error> {
    let row = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map_err(|e| db("reading pg_current_wal_lsn", e))?;
    let s: String = row.get(0);
    s.parse().map_err(|e: crate::lsn::ParseLsnError| Definite::Setup(e.to_string()).into())
}
