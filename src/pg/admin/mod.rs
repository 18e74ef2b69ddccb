//! Ordinary (non-replication) connections and what runs over them before streaming starts.
//!
//! This file owns the connection: which host (through [`crate::pg::hosts`], as the walsender
//! connection; the primary only, where the slot lives, checked by us in each attempt), TLS per
//! `sslmode` with libpq's fallbacks, a `statement_timeout`, and [`ADMIN_TIMEOUT`] on every step so
//! a frozen link becomes a transient error, never a hang. What a failed connect means is decided
//! in [`refused`], by type and SQLSTATE. The catalog checks are in [`catalog`],
//! the publication and the slot in [`slot`]; each failure becomes one line that says what is wrong
//! and what to change. We create the publication (per `--publication-autocreate`) and the slot when
//! they are missing, but never drop, recreate or take over a slot.

use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::config::postgres::PgHost;
use crate::config::postgres::SessionAttrs;
use crate::config::{Config, PgTarget, SslMode};
use crate::error::{Error, Transient};
use crate::pg::admin_tls;
use crate::pg::hosts::{self, Attempt};
use crate::pg::sqlstate::query_error as db;

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
    connect_with(target, true, None).await
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
    connect_with(target, true, Some(notify)).await
}

async fn connect_with(
    target: &PgTarget,
    primary: bool,
    notify: Option<UnboundedSender<tokio_postgres::Notification>>,
) -> Result<Client, Error> {
    // Each host and address within its own connect_timeout, the primary check included, as libpq
    // and the replication connection try them.
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
    // Over a Unix socket, or with sslmode=disable, the connection cannot use TLS: skip building
    // the OpenSSL context, which reads the system CA bundle (tens of milliseconds per connection).
    let tls_possible = target.tls.mode != SslMode::Disable && matches!(a.host, PgHost::Tcp(_));
    let client = if !tls_possible {
        match pg.connect(tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                drive(conn, notify);
                client
            }
            Err(e) => return Err(refused::connect_error(target, &a, &pg, None, e)),
        }
    } else {
        let tls = admin_tls::MakeTls::new(&target.tls)?;
        let result = match pg.connect(tls.clone()).await {
            // libpq's allow: plaintext first, TLS when the server refuses that login.
            Err(e)
                if target.tls.mode == SslMode::Allow
                    && e.code() == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION) =>
            {
                pg.ssl_mode(tokio_postgres::config::SslMode::Require);
                pg.connect(tls.clone()).await
            }
            // libpq's prefer: a TLS attempt that failed before the server said anything (a failed
            // handshake) is tried again in plaintext, as the replication connection does.
            Err(e) if target.tls.mode == SslMode::Prefer && e.as_db_error().is_none() => {
                tracing::info!(error = %refused::full_text(&e), "TLS handshake failed; retrying in plaintext (sslmode=prefer)");
                pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
                pg.connect(tls.clone()).await
            }
            other => other,
        };
        match result {
            Ok((client, conn)) => {
                drive(conn, notify);
                client
            }
            Err(e) => return Err(refused::connect_error(target, &a, &pg, Some(&tls), e)),
        }
    };
    // The primary check, ours (as the replication connection's, not tokio-postgres's): with
    // `primary`, a server in recovery; with several hosts or target_session_attrs, also one whose
    // transactions are read-only (libpq's read-write check). Either is passed over for the next host.
    let read_write = (primary && target.hosts.len() > 1) || target.session_attrs != SessionAttrs::Any;
    if primary || read_write {
        let sql = "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'";
        let row = timed("asking pg_is_in_recovery()", client.query_one(sql, &[])).await?;
        if (primary && row.get::<_, bool>(0)) || (read_write && row.get::<_, bool>(1)) {
            return Err(in_recovery(target));
        }
    }
    Ok(client)
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

pub mod catalog;
mod refused;
pub mod slot;

pub use catalog::*;
pub use slot::*;
