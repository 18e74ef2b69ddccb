//! Replication commands other than `START_REPLICATION`, over the simple query protocol:
//! `IDENTIFY_SYSTEM`, `TIMELINE_HISTORY`, the primary check, and `ALTER_REPLICATION_SLOT`.
//!
//! Each answers with rows or an ErrorResponse; a server error is transient or definite by its
//! SQLSTATE ([`crate::error::sqlstate_is_transient`]), never by its text.

use postgres_protocol::message::{backend, frontend};

use fallible_iterator::FallibleIterator;

use super::{server_error, stream_error, ReplicationConn, ServerError, WalHistory};
use crate::config::postgres::SessionAttrs;
use crate::config::PgTarget;
use crate::error::{Definite, Error, Transient};
use crate::lsn::Lsn;

impl ReplicationConn {
    /// `IDENTIFY_SYSTEM`: the server's system identifier and current timeline, which together
    /// name the WAL history an LSN belongs to (a promoted standby has a new timeline; a different
    /// cluster behind the same address has another system identifier).
    pub async fn identify_system(&mut self) -> Result<WalHistory, Error> {
        self.identify().await.map(|(history, _)| history)
    }

    /// [`identify_system`](Self::identify_system), and the server's WAL position (`xlogpos`: on a
    /// primary, the end of the flushed WAL).
    pub async fn identify(&mut self) -> Result<(WalHistory, Lsn), Error> {
        let rows = self.simple_query("IDENTIFY_SYSTEM", stream_error).await?;
        let fields = rows.first().ok_or_else(|| self.protocol("IDENTIFY_SYSTEM returned no row"))?;
        let system_id = fields.first().cloned().flatten().unwrap_or_default();
        let timeline = fields.get(1).cloned().flatten().and_then(|t| t.parse::<u32>().ok());
        let xlogpos = fields.get(2).cloned().flatten().and_then(|l| l.parse::<Lsn>().ok());
        match (timeline, xlogpos) {
            (Some(timeline), Some(xlogpos)) if !system_id.is_empty() => {
                Ok((WalHistory { system_id, timeline }, xlogpos))
            }
            _ => Err(self.protocol("unreadable IDENTIFY_SYSTEM row").into()),
        }
    }

    /// `TIMELINE_HISTORY tli`: the history file of timeline `tli` (2 or later; timeline 1 has
    /// none) as text, for [`crate::lineage`].
    pub async fn timeline_history(&mut self, timeline: u32) -> Result<String, Error> {
        let failed = |e: ServerError| -> Error {
            if crate::error::sqlstate_is_transient(&e.code) {
                return Transient::PgServer { code: e.code, message: e.message }.into();
            }
            Definite::Setup(format!("TIMELINE_HISTORY {timeline} failed: {} ({})", e.message, e.code)).into()
        };
        let rows = self.simple_query(&format!("TIMELINE_HISTORY {timeline}"), failed).await?;
        let file = rows.first().and_then(|r| r.get(1)).cloned().flatten();
        file.ok_or_else(|| self.protocol("TIMELINE_HISTORY returned no file").into())
    }

    /// Fail with a transient error unless this server is a primary (and, for
    /// `target_session_attrs=read-write`, accepts writes). A walsender of `replication=database`
    /// runs plain SQL too.
    pub(super) async fn require_primary(&mut self, t: &PgTarget) -> Result<(), Error> {
        let rows = self
            .simple_query("SELECT pg_is_in_recovery()::text, current_setting('transaction_read_only')", |e| {
                Transient::PgServer { code: e.code, message: e.message }.into()
            })
            .await?;
        let field = |i: usize| rows.first().and_then(|r| r.get(i)).cloned().flatten();
        let in_recovery = field(0).as_deref() == Some("true");
        let read_only = field(1).as_deref() == Some("on");
        if in_recovery || (read_only && t.session_attrs == SessionAttrs::ReadWrite) {
            return Err(Transient::PgServer {
                code: "25006".into(),
                message: format!(
                    "{} is {}; the slot is used only on the primary",
                    self.target,
                    if in_recovery { "in recovery (a standby)" } else { "read-only (target_session_attrs=read-write)" }
                ),
            }
            .into());
        }
        Ok(())
    }

    /// `ALTER_REPLICATION_SLOT "slot" (FAILOVER true)` (PostgreSQL 17+): a replication command
    /// with no SQL function equivalent.
    pub async fn enable_failover(&mut self, slot: &str) -> Result<(), Error> {
        let sql = format!("ALTER_REPLICATION_SLOT {} (FAILOVER true)", crate::pg::ident::quote_ident(slot));
        let failed = |e: ServerError| -> Error {
            if crate::error::sqlstate_is_transient(&e.code) {
                return Transient::PgServer { code: e.code, message: e.message }.into();
            }
            Definite::Setup(format!(
                "--slot-failover: turning FAILOVER on for slot {slot:?} failed: {} ({}); the role needs REPLICATION \
                 and the server PostgreSQL 17+",
                e.message, e.code
            ))
            .into()
        };
        self.simple_query(&sql, failed).await.map(|_| ())
    }

    /// One simple-protocol command; its rows as text fields (NULL as `None`).
    async fn simple_query(
        &mut self,
        sql: &str,
        on_error: impl FnOnce(ServerError) -> Error,
    ) -> Result<Vec<Vec<Option<String>>>, Error> {
        frontend::query(sql, &mut self.wbuf).map_err(|e| self.io(e))?;
        self.flush().await?;
        let mut rows = Vec::new();
        let mut failed = None;
        loop {
            match self.read_message().await? {
                backend::Message::DataRow(row) => {
                    let buf = row.buffer();
                    let mut fields = Vec::new();
                    let mut ranges = row.ranges();
                    while let Some(r) = ranges.next().map_err(|e| self.io(e))? {
                        fields.push(r.and_then(|r| buf.get(r)).map(|b| String::from_utf8_lossy(b).into_owned()));
                    }
                    rows.push(fields);
                }
                // Read on to ReadyForQuery so the connection stays usable after an error.
                backend::Message::ErrorResponse(body) => failed = Some(server_error(&body)),
                backend::Message::ReadyForQuery(_) => {
                    return match failed {
                        Some(e) => Err(on_error(e)),
                        None => Ok(rows),
                    }
                }
                _ => {}
            }
        }
    }
}
