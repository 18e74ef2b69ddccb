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

use crate::config::postgres::PgHost;
use crate::config::postgres::SessionAttrs;
use crate::config::{Config, PgTarget, PublicationAutocreate, SslMode, TableName};
use crate::error::{Definite, Error, Transient};
use crate::lsn::Lsn;
use crate::pg::hosts::{self, Attempt};
use crate::pg::ident::{quote_ident, quote_table};
use crate::pg::sqlstate::query_error as db;
use crate::pg::tls;
use crate::router::{HeadersField, MissingPolicy};

/// Client-side bound on one admin step (connect and login, or one catalog query): a frozen link
/// must become a transient error, never a hang. The server-side `statement_timeout` is shorter.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Open an ordinary connection to the primary among `cfg.postgres`'s hosts (see
/// [`connect_primary`]); the connection task runs in the background.
pub async fn connect(cfg: &Config) -> Result<Client, Error> {
    connect_primary(&cfg.postgres).await
}

/// Like [`connect_target`], but only to a server that is not in recovery: hosts are tried in
/// order (skipping read-only ones, as libpq's `target_session_attrs=read-write` does) and the
/// server reached is asked `pg_is_in_recovery()`. The slot lives on the primary, so a standby is
/// never used for it; a server still in recovery is a transient error (a promotion may be under way).
pub async fn connect_primary(target: &PgTarget) -> Result<Client, Error> {
    let client = connect_with(target, true, None).await?;
    let row = timed("asking pg_is_in_recovery()", client.query_one("SELECT pg_is_in_recovery()", &[])).await?;
    if row.get::<_, bool>(0) {
        return Err(in_recovery(target));
    }
    Ok(client)
}

/// No host of `target` is a primary right now.
pub fn in_recovery(target: &PgTarget) -> Error {
    Transient::PgServer {
        code: "25006".into(),
        message: format!(
            "no server of {target} is a primary: the one reached is in recovery (a standby); list every host of \
             the cluster in --postgres-url so outboxd finds the primary, also after a failover"
        ),
    }
    .into()
}

/// Open an ordinary connection, over TLS as `sslmode` says, with a `statement_timeout`.
pub async fn connect_target(target: &PgTarget) -> Result<Client, Error> {
    connect_with(target, false, None).await
}

/// An ordinary connection to the primary (as [`connect_primary`] picks it) that forwards the
/// server's NOTIFY messages (after a `LISTEN`) to `notify`: `outboxd poll` updates rows there.
pub async fn connect_listening(
    target: &PgTarget,
    notify: UnboundedSender<tokio_postgres::Notification>,
) -> Result<Client, Error> {
    let client = connect_with(target, true, Some(notify)).await?;
    let row = timed("asking pg_is_in_recovery()", client.query_one("SELECT pg_is_in_recovery()", &[])).await?;
    if row.get::<_, bool>(0) {
        return Err(in_recovery(target));
    }
    Ok(client)
}

async fn connect_with(
    target: &PgTarget,
    primary: bool,
    notify: Option<UnboundedSender<tokio_postgres::Notification>>,
) -> Result<Client, Error> {
    // Each host and address within its own connect_timeout, as libpq and the replication
    // connection try them.
    let client = hosts::each_until_ok(target, |a| connect_one(target, a, primary, notify.clone())).await?;
    let set = format!("SET statement_timeout = {}", ADMIN_TIMEOUT.as_millis() * 2 / 3);
    timed("setting statement_timeout", client.batch_execute(&set)).await?;
    Ok(client)
}

/// One address of one host.
async fn connect_one(
    target: &PgTarget,
    a: Attempt,
    primary: bool,
    notify: Option<UnboundedSender<tokio_postgres::Notification>>,
) -> Result<Client, Error> {
    let mut pg = target.to_tokio_postgres(a.index, a.addr);
    // tokio-postgres's read-write check (`SHOW transaction_read_only`) also skips a standby, whose
    // transactions are all read-only; it is the nearest it has to libpq's `primary`.
    if (primary && target.hosts.len() > 1) || target.session_attrs != SessionAttrs::Any {
        pg.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    }
    // Over a Unix socket, or with sslmode=disable, the connection cannot use TLS: skip building
    // the OpenSSL context, which reads the system CA bundle (tens of milliseconds per connection).
    let tls_possible = target.tls.mode != SslMode::Disable && matches!(a.host, PgHost::Tcp(_));
    if !tls_possible {
        return match pg.connect(tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                drive(conn, notify);
                Ok(client)
            }
            Err(e) => Err(connect_error(target, &a, e)),
        };
    }
    let tls = tls::make_tls(&target.tls)?;
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
        // libpq's prefer: a TLS attempt that failed before the server said anything (a failed
        // handshake) is tried again in plaintext, as the replication connection does.
        Err(e) if target.tls.mode == SslMode::Prefer && e.as_db_error().is_none() => {
            tracing::info!(error = %full_text(&e), "TLS handshake failed; retrying in plaintext (sslmode=prefer)");
            pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
            pg.connect(tls).await
        }
        other => other,
    };
    match result {
        Ok((client, conn)) => {
            drive(conn, notify);
            Ok(client)
        }
        Err(e) => Err(connect_error(target, &a, e)),
    }
}

/// Run an admin connection in the background; with `notify`, forward its notifications.
fn drive<S, T>(
    mut conn: tokio_postgres::Connection<S, T>,
    notify: Option<UnboundedSender<tokio_postgres::Notification>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
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
}

/// One line per way a login can fail; TLS and login problems are definite.
fn connect_error(target: &PgTarget, a: &Attempt, e: tokio_postgres::Error) -> Error {
    let mode = target.tls.mode_given.as_str();
    let text = full_text(&e);
    let where_ = a.shown();
    if let Some(db) = e.as_db_error() {
        return super::login::refused(target, super::login::Conn::Ordinary, db.code().code(), db.message());
    }
    let lower = text.to_ascii_lowercase();
    if lower.contains("does not allow writes") {
        return in_recovery(target);
    }
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

/// Who our walsender was. A PID alone does not say it: PIDs are reused, and after a server restart
/// another instance's walsender can have the PID ours had. Its start time and application name
/// (as `pg_stat_activity` shows them) pin it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walsender {
    pub pid: i32,
    pub backend_start: String,
    pub application_name: String,
}

/// The identity of backend `pid` as the server reached by `client` sees it; `None` when it is not
/// there (another server) or its start time is hidden.
pub async fn walsender(client: &Client, pid: i32) -> Result<Option<Walsender>, Error> {
    let rows = timed(
        "reading our walsender's start time",
        client.query("SELECT backend_start::text, application_name FROM pg_stat_activity WHERE pid = $1", &[&pid]),
    )
    .await?;
    Ok(rows.first().and_then(|r| {
        let backend_start: Option<String> = r.get(0);
        let application_name: Option<String> = r.get(1);
        Some(Walsender { pid, backend_start: backend_start?, application_name: application_name.unwrap_or_default() })
    }))
}

/// Terminate `own` if it still holds our slot; true when it did. The caller passes only the
/// walsender its own earlier replication connection had, and it must match on PID, start time and
/// application name, so a slot held by another instance (a standby waiting its turn, or a
/// walsender that got our old PID after a restart) is never taken.
pub async fn terminate_own_walsender(client: &Client, slot: &str, own: &Walsender) -> Result<bool, Error> {
    let rows = timed(
        "ending our previous walsender",
        client.query(
            "SELECT pg_terminate_backend(s.active_pid) FROM pg_replication_slots s \
             JOIN pg_stat_activity a ON a.pid = s.active_pid \
             WHERE s.slot_name = $1 AND s.active_pid = $2 \
               AND a.backend_start::text = $3 AND a.application_name = $4",
            &[&slot, &own.pid, &own.backend_start, &own.application_name],
        ),
    )
    .await?;
    Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
}

/// The oldest PostgreSQL major version outboxd runs on.
pub const MIN_SERVER_MAJOR: u32 = 13;
/// The first major version whose pgoutput takes the `messages` option, so heartbeats
/// (`pg_logical_emit_message`) reach us decoded. On 13 they are written to WAL but never sent.
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

    /// Whether pgoutput can pass our heartbeat messages through (`messages` option).
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
        // No table (logical messages only): a publication of nothing still names the stream.
        let what = if all.is_empty() { String::new() } else { format!(" FOR TABLE {all}") };
        // A partitioned outbox publishes its inserts under its own name, not each partition's,
        // so the router recognises it whatever partition a row lands in.
        let with = if any_partitioned(client, cfg).await? { " WITH (publish_via_partition_root = true)" } else { "" };
        let sql = format!("CREATE PUBLICATION {}{what}{with}", quote_ident(&cfg.publication));
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
    if any_partitioned(client, cfg).await? {
        let via_root = client
            .query_one("SELECT pubviaroot FROM pg_publication WHERE pubname = $1", &[&cfg.publication])
            .await
            .map_err(|e| db("reading pg_publication.pubviaroot", e))?;
        if !via_root.get::<_, bool>(0) {
            return Err(Definite::Setup(format!(
                "publication {:?} publishes a partitioned outbox table under its partitions' names, which outboxd would ignore: ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
                cfg.publication,
                quote_ident(&cfg.publication)
            ))
            .into());
        }
    }
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

/// Whether any outbox table is partitioned (`PARTITION BY`, e.g. `sql/07_partitioned.sql`).
async fn any_partitioned(client: &Client, cfg: &Config) -> Result<bool, Error> {
    for t in &cfg.tables {
        let row = client
            .query_opt(
                "SELECT c.relkind = 'p' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&t.schema, &t.name],
            )
            .await
            .map_err(|e| db("reading pg_class", e))?;
        if row.is_some_and(|r| r.get::<_, bool>(0)) {
            return Ok(true);
        }
    }
    Ok(false)
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

/// What we know about our slot once it is usable.
#[derive(Debug, Clone, Copy)]
pub struct SlotState {
    pub confirmed_flush: Lsn,
    /// This call created the slot: nothing remembered from before can apply to it.
    pub created: bool,
    /// `--slot-failover` is set but the existing slot is not a failover slot yet: the caller turns
    /// it on over the replication connection (`ALTER_REPLICATION_SLOT`).
    pub enable_failover: bool,
}

/// May [`ensure_slot`] create a missing slot?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingSlot {
    /// First start (nothing was streamed from it yet), or `--slot-recreate-after-loss`.
    Create,
    /// This process streamed from the slot before: it was lost (a failover to a server that did
    /// not have it), and a new one would silently skip events. A definite error.
    Lost,
    /// `--debezium-offsets` on the first start: the slot is Debezium's and must be there; a new
    /// one would start after events Debezium never delivered.
    Adopt,
}

/// `--slot-failover` checks, at start-up and on every reconnect: PostgreSQL 17+ (a definite error
/// before), and a warning when the primary's `synchronized_standby_slots` is empty: then a
/// synchronized copy of the slot may lag what we confirmed, and a standby promoted at that moment
/// has a slot behind our position (events sent again: duplicates), or not yet the slot at all.
pub async fn check_failover(client: &Client, cfg: &Config, version: &ServerVersion) -> Result<(), Error> {
    if !cfg.slot_failover {
        return Ok(());
    }
    if version.major() < 17 {
        return Err(Definite::Setup(format!(
            "--slot-failover needs PostgreSQL 17 or later (failover slots), but {} runs {}: remove --slot-failover \
             (slot.failover in --debezium-config) or upgrade the server",
            cfg.postgres, version.text
        ))
        .into());
    }
    let row = timed(
        "reading synchronized_standby_slots",
        client.query_one("SELECT coalesce(current_setting('synchronized_standby_slots', true), '')", &[]),
    )
    .await?;
    let slots: String = row.get(0);
    if slots.trim().is_empty() {
        tracing::warn!(
            slot = %cfg.slot,
            "--slot-failover: the primary's synchronized_standby_slots is empty, so the walsender may send us \
             changes before a standby's synchronized copy of the slot may move past them; after a failover \
             the promoted standby's slot can be behind what outboxd confirmed (events are sent again) or missing. \
             Set synchronized_standby_slots to the standbys' physical slot names (see docs/src/failover.md)"
        );
    }
    Ok(())
}

/// Find or create the pgoutput slot. Busy → [`Transient::SlotBusy`]; lost or foreign → definite.
pub async fn ensure_slot(client: &Client, cfg: &Config, missing: MissingSlot) -> Result<SlotState, Error> {
    let q = "SELECT plugin::text, slot_type, database::text, active_pid, wal_status, confirmed_flush_lsn::text \
             FROM pg_replication_slots WHERE slot_name = $1";
    let mut row = client.query_opt(q, &[&cfg.slot]).await.map_err(|e| db("reading pg_replication_slots", e))?;
    let mut created = false;
    if row.is_none() && missing == MissingSlot::Lost {
        return Err(Definite::Setup(format!(
            "replication slot {:?} is gone from {}, though this process streamed from it: it was lost, most likely in a \
             failover to a standby that did not have it synchronized yet. Events committed after the last confirmed \
             position may never have been sent, so outboxd stops instead of creating a new slot. Recover: republish \
             the outbox rows since the last event your consumers saw with `outboxd backfill`, then start outboxd with \
             --slot-recreate-after-loss (or create the slot yourself). To keep the slot across failovers use \
             --slot-failover on PostgreSQL 17+ (docs/src/failover.md)",
            cfg.slot, cfg.postgres
        ))
        .into());
    }
    if row.is_none() && missing == MissingSlot::Adopt {
        return Err(Definite::Setup(format!(
            "--debezium-offsets: replication slot {:?} does not exist on {}; outboxd takes over Debezium's own slot so \
             that nothing committed after Debezium's position is missed: set --slot (or the file's slot.name) to the slot \
             Debezium used, and keep slot.drop.on.stop=false when stopping Debezium",
            cfg.slot, cfg.postgres
        ))
        .into());
    }
    if row.is_none() {
        let create = if cfg.slot_failover {
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
        } else {
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"
        };
        match client.execute(create, &[&cfg.slot]).await {
            Ok(_) => {
                created = true;
                tracing::info!(slot = %cfg.slot, failover = cfg.slot_failover, "created logical replication slot (pgoutput)")
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
    let enable_failover = cfg.slot_failover && !created && {
        let row = timed(
            "reading the slot's failover flag",
            client.query_opt("SELECT failover FROM pg_replication_slots WHERE slot_name = $1", &[&cfg.slot]),
        )
        .await?;
        !row.is_some_and(|r| r.get::<_, bool>(0))
    };
    Ok(SlotState { confirmed_flush, created, enable_failover })
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
