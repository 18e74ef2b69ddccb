//! Set-up checks and catalog queries over an ordinary (non-replication) connection.
//!
//! Everything here runs before streaming starts, and each failure becomes one line that says what
//! is wrong and what to change. We create the publication (per `--publication-autocreate`) and the
//! slot when they are missing, but never drop, recreate or take over a slot: a slot held by another
//! process is reported as [`Transient::SlotBusy`] so the caller can wait for it, which is how a
//! standby outboxd takes over.

use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::config::{Config, PgTarget, PublicationAutocreate, SslMode, TableName};
use crate::error::{Definite, Error, Transient};
use crate::lsn::Lsn;
use crate::pg::tls;
use crate::router::{HeadersField, MissingPolicy};

/// Client-side bound on one admin step (connect and login, or one catalog query): a frozen link
/// must become a transient error, never a hang. The server-side `statement_timeout` is shorter.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Open an ordinary connection to `cfg.postgres`; the connection task runs in the background.
pub async fn connect(cfg: &Config) -> Result<Client, Error> {
    connect_target(&cfg.postgres).await
}

/// Open an ordinary connection, over TLS as `sslmode` says, with a `statement_timeout`.
pub async fn connect_target(target: &PgTarget) -> Result<Client, Error> {
    connect_with(target, None).await
}

/// [`connect_target`], forwarding the server's NOTIFY messages (after a `LISTEN`) to `notify`.
pub async fn connect_listening(
    target: &PgTarget,
    notify: UnboundedSender<tokio_postgres::Notification>,
) -> Result<Client, Error> {
    connect_with(target, Some(notify)).await
}

async fn connect_with(
    target: &PgTarget,
    notify: Option<UnboundedSender<tokio_postgres::Notification>>,
) -> Result<Client, Error> {
    let limit = target.connect_timeout + Duration::from_secs(5);
    let client = match tokio::time::timeout(limit, connect_inner(target, notify)).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Transient::PgServer {
                code: "08001".into(),
                message: format!("connecting to {target} took over {}s", limit.as_secs()),
            }
            .into())
        }
    };
    let set = format!("SET statement_timeout = {}", ADMIN_TIMEOUT.as_millis() * 2 / 3);
    timed("setting statement_timeout", client.batch_execute(&set)).await?;
    Ok(client)
}

async fn connect_inner(
    target: &PgTarget,
    notify: Option<UnboundedSender<tokio_postgres::Notification>>,
) -> Result<Client, Error> {
    let tls = tls::make_tls(&target.tls)?;
    let mut pg = target.to_tokio_postgres();
    let first = pg.connect(tls.clone()).await;
    let result = match first {
        // libpq's allow: plaintext first, TLS when the server refuses that login.
        Err(e)
            if target.tls.mode == SslMode::Allow
                && e.code() == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION) =>
        {
            pg.ssl_mode(tokio_postgres::config::SslMode::Require);
            pg.connect(tls).await
        }
        other => other,
    };
    match result {
        Ok((client, mut conn)) => {
            tokio::spawn(async move {
                let Some(notify) = notify else {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "admin connection closed");
                    }
                    return;
                };
                // Driving the connection by hand is what surfaces its asynchronous messages.
                let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                while let Some(m) = futures_util::StreamExt::next(&mut messages).await {
                    match m {
                        Ok(tokio_postgres::AsyncMessage::Notification(n)) => drop(notify.send(n)),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "listening connection closed");
                            break;
                        }
                    }
                }
            });
            Ok(client)
        }
        Err(e) => Err(connect_error(target, e)),
    }
}

/// One line per way a login can fail; TLS and login problems are definite.
fn connect_error(target: &PgTarget, e: tokio_postgres::Error) -> Error {
    let mode = target.tls.mode_given.as_str();
    let text = full_text(&e);
    let where_ = target.first_host();
    if let Some(db) = e.as_db_error() {
        let msg = db.message();
        let c = db.code();
        let login = *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION;
        return if *c == SqlState::INVALID_PASSWORD {
            Definite::Setup(format!(
                "password authentication failed for user {:?} at {target}: check the password \
                 (--postgres-url, --postgres-password-file, PGPASSWORD or ~/.pgpass)",
                target.user
            ))
            .into()
        } else if login && (msg.contains("no encryption") || msg.contains("SSL off")) {
            Definite::Config(format!(
                "PostgreSQL at {where_} accepts this login only over TLS ({msg}), but sslmode={mode} \
                 sent it in plaintext: use sslmode=require or stronger"
            ))
            .into()
        } else if login && msg.contains("certificate") {
            Definite::Config(format!(
                "PostgreSQL at {where_} refused the client certificate ({msg}): its CN must be the user \
                 name, or map it with pg_ident.conf"
            ))
            .into()
        } else if login {
            Definite::Setup(format!("PostgreSQL at {target} refused the login: {msg}")).into()
        } else if *c == SqlState::INVALID_CATALOG_NAME {
            Definite::Setup(format!("database {:?} does not exist at {target}", target.dbname)).into()
        } else if crate::error::sqlstate_is_transient(c.code()) {
            Transient::PgServer { code: c.code().to_owned(), message: msg.to_owned() }.into()
        } else {
            Definite::Setup(format!("PostgreSQL at {target} refused the connection: {msg} ({})", c.code())).into()
        };
    }
    let lower = text.to_ascii_lowercase();
    if lower.contains("password missing") {
        return Definite::Setup(format!(
            "PostgreSQL at {target} asks for a password, but none was given: put it in --postgres-url, \
             --postgres-password-file, PGPASSWORD or ~/.pgpass"
        ))
        .into();
    }
    if lower.contains("server does not support tls") {
        return Definite::Config(format!(
            "PostgreSQL at {where_} does not accept TLS (sslmode={mode}): turn ssl on in postgresql.conf, \
             or use sslmode=prefer to allow plaintext"
        ))
        .into();
    }
    if lower.contains("channel binding") {
        return Definite::Config(format!(
            "channel_binding=require, but PostgreSQL at {where_} did not log us in with SCRAM-SHA-256-PLUS \
             ({text}): use TLS with scram-sha-256 in pg_hba.conf, or channel_binding=prefer"
        ))
        .into();
    }
    if lower.contains("certificate verify failed") || lower.contains("tls handshake") || lower.contains("ssl routines")
    {
        let verify = lower.contains("certificate verify failed");
        let reason = if verify {
            text.rsplit_once('(').map(|(_, r)| r.trim_end_matches(')').to_owned()).unwrap_or_else(|| text.clone())
        } else {
            text.clone()
        };
        return tls::handshake_failure(&where_, &target.tls, &reason, verify);
    }
    Transient::PgServer {
        code: "08001".into(),
        message: format!(
            "cannot reach PostgreSQL at {target}: {text}; check host, port and that the server is running"
        ),
    }
    .into()
}

/// The error and its sources on one line (tokio-postgres keeps the OpenSSL reason in a source).
fn full_text(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let t = x.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = x.source();
    }
    s
}

/// Bound one admin step by [`ADMIN_TIMEOUT`].
pub async fn timed<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(ADMIN_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| db(what, e)),
        Err(_) => Err(Transient::PgServer {
            code: "57014".into(),
            message: format!("{what}: no answer in {}s", ADMIN_TIMEOUT.as_secs()),
        }
        .into()),
    }
}

/// Terminate the walsender with this PID if it still holds our slot; true when it did. The
/// caller passes only a PID that its own earlier replication connection had, so a slot held by
/// another instance (a standby waiting its turn) is never taken.
pub async fn terminate_own_walsender(client: &Client, slot: &str, pid: i32) -> Result<bool, Error> {
    let rows = timed(
        "ending our previous walsender",
        client.query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active_pid = $2",
            &[&slot, &pid],
        ),
    )
    .await?;
    Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
}

/// A failed query: transient or definite by SQLSTATE class ([`crate::error::sqlstate_is_transient`]).
pub(crate) fn db(what: &str, e: tokio_postgres::Error) -> Error {
    let msg = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_else(|| e.to_string());
    match e.code() {
        None => Transient::PgServer { code: "08006".into(), message: format!("{what}: {msg}") }.into(),
        Some(c) if crate::error::sqlstate_is_transient(c.code()) => {
            Transient::PgServer { code: c.code().to_owned(), message: format!("{what}: {msg}") }.into()
        }
        Some(_) => Definite::Setup(format!("{what}: {msg}")).into(),
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
    if r.contracts.is_some() && !have.contains(&r.type_field) {
        return Err(Definite::Setup(format!(
            "table {table} has no column {:?} (the event type, set by --table-field-event-type) that --schema-dir needs to pick a schema; add the column or point the flag at it",
            r.type_field
        ))
        .into());
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

pub(crate) fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

pub(crate) fn quote_table(t: &TableName) -> String {
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
    /// This call created the slot: nothing remembered from before can apply to it.
    pub created: bool,
}

/// Find or create the pgoutput slot. Busy → [`Transient::SlotBusy`]; lost or foreign → definite.
pub async fn ensure_slot(client: &Client, cfg: &Config) -> Result<SlotState, Error> {
    let q = "SELECT plugin::text, slot_type, database::text, active_pid, wal_status, confirmed_flush_lsn::text \
             FROM pg_replication_slots WHERE slot_name = $1";
    let mut row = client.query_opt(q, &[&cfg.slot]).await.map_err(|e| db("reading pg_replication_slots", e))?;
    let mut created = false;
    if row.is_none() {
        match client.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", &[&cfg.slot]).await {
            Ok(_) => {
                created = true;
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
    Ok(SlotState { confirmed_flush, created })
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
