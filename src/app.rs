//! The supervisor: set-up checks once, then replication sessions until shutdown.
//!
//! Set-up failures (unreachable server, bad login, `wal_level`, missing table or column, lost
//! slot) are definite and end the process with their message. After streaming has started once,
//! transient failures (a dropped connection, a server restart) start a new session from the slot's
//! `confirmed_flush_lsn`: records that were in flight are sent again, which is the at-least-once
//! window. A slot held by another process is waited for, never taken over.

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::{Error, Transient};
use crate::metrics::Metrics;
use crate::pg::admin;
use crate::pg::replication::ReplicationConn;
use crate::pipeline::{backoff, Session};
use crate::sink::Sink;

const SLOT_BUSY_RETRY: std::time::Duration = std::time::Duration::from_secs(3);

/// Run until shutdown. Returns `Ok` after a clean drain.
pub async fn run<S: Sink>(cfg: &Config, sink: &mut S, shutdown: CancellationToken) -> Result<(), Error> {
    let metrics = Metrics::new();
    {
        let client = admin::connect(cfg).await?;
        admin::check_wal_level(&client).await?;
        admin::check_tables(&client, cfg).await?;
        admin::ensure_publication(&client, cfg).await?;
    }
    let mut attempt = 0u32;
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        match session(cfg, sink, &metrics, shutdown.clone()).await {
            Ok(()) => return Ok(()),
            Err(Error::Transient(Transient::SlotBusy { slot, pid })) => {
                tracing::warn!(
                    slot,
                    pid,
                    "replication slot is held by another process; waiting for it to be released (standby)"
                );
                attempt = 0;
                wait(&shutdown, SLOT_BUSY_RETRY).await;
            }
            Err(Error::Transient(Transient::PgServer { code, message })) if code == "55006" => {
                tracing::warn!(slot = %cfg.slot, %message, "replication slot is in use; waiting for it to be released (standby)");
                wait(&shutdown, SLOT_BUSY_RETRY).await;
            }
            Err(e) if e.is_transient() => {
                let delay = backoff(attempt);
                attempt += 1;
                metrics.reconnects.increment(1);
                tracing::warn!(error = %e, ?delay, "replication session ended; reconnecting from the confirmed LSN");
                wait(&shutdown, delay).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn wait(shutdown: &CancellationToken, d: std::time::Duration) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(d) => {}
    }
}

/// One session: (re)check the slot, connect, stream.
async fn session<S: Sink>(
    cfg: &Config,
    sink: &mut S,
    metrics: &Metrics,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let slot = {
        let client = admin::connect(cfg).await.map_err(as_transient)?;
        admin::ensure_slot(&client, cfg).await?
    };
    let conn = ReplicationConn::connect(&cfg.postgres).await?;
    let stream = conn.start_replication(&cfg.slot, slot.confirmed_flush, &cfg.publication).await?;
    tracing::info!(slot = %cfg.slot, publication = %cfg.publication, start = %slot.confirmed_flush, target = %cfg.postgres, "streaming");
    Session::new(cfg, sink, metrics, stream, slot.confirmed_flush).run(shutdown).await
}

/// Set-up already succeeded once, so a failing reconnect is the server's hiccup, not bad config.
fn as_transient(e: Error) -> Error {
    match e {
        Error::Definite(d) => Transient::PgServer { code: "08001".into(), message: d.to_string() }.into(),
        t => t,
    }
}
