//! What a failed statement on an ordinary connection means: the one mapping from a
//! [`tokio_postgres::Error`] to our two classes, used by the catalog checks, `poll`, `backfill`
//! and the tools (`status`, `check`, `schema check`).
//!
//! The class is decided by the SQLSTATE alone ([`crate::error::sqlstate_is_transient`], shared with
//! the walsender connection), never by the message text, which `lc_messages` may translate. An
//! error with no SQLSTATE is the connection itself failing (closed, reset): transient. The server's
//! message is quoted as it wrote it, after what we were doing.

use tokio_postgres::error::SqlState;

use crate::error::{Definite, Error, Transient};

/// What a connection through a transaction-mode pooler is told: outboxd needs its connection to
/// stay one server session (named prepared statements, and `outboxd poll`'s session locks).
pub const POOLER_HINT: &str = "the connection goes through a transaction-mode pooler (PgBouncer \
     pool_mode=transaction, Supabase's pooler port 6543), which hands statements to any server session; \
     point --postgres-url at PostgreSQL itself or at a session-mode pool";

/// A failed statement while doing `what`: transient or definite by SQLSTATE class.
/// 26000 (a prepared statement this connection made is gone) can only mean a pooler moved the
/// connection to another server session: definite, with [`POOLER_HINT`].
pub fn query_error(what: &str, e: tokio_postgres::Error) -> Error {
    let msg = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_else(|| e.to_string());
    match e.code() {
        None => Transient::PgServer { code: "08006".into(), message: format!("{what}: {msg}") }.into(),
        Some(c) if *c == SqlState::INVALID_SQL_STATEMENT_NAME => {
            Definite::Setup(format!("{what}: {msg}: {POOLER_HINT}")).into()
        }
        Some(c) if crate::error::sqlstate_is_transient(c.code()) => {
            Transient::PgServer { code: c.code().to_owned(), message: format!("{what}: {msg}") }.into()
        }
        Some(_) => Definite::Setup(format!("{what}: {msg}")).into(),
    }
}

/// Whether a failed write was refused for the data it carried (class 22, a data exception; class
/// 23, an integrity constraint violation), so the same statement may pass for other rows: the
/// inbox dead-letters such a row; any other definite failure is the table or the role's.
pub fn is_row_fault(code: &str) -> bool {
    code.starts_with("22") || code.starts_with("23")
}

/// For a command that runs once and exits (`status`, `check`, `schema check`): a transient failure
/// said to be one, in a line naming the server and that running the command again may pass. A server that
/// cannot be reached, is shutting down or starting up (class 08, 57P01-57P05, a socket error) is
/// "not reachable now"; another transient failure (a cancelled statement, a deadlock) keeps its
/// text. The SQLSTATE stays. Definite errors are returned as they are.
pub fn for_tool(target: &crate::config::PgTarget, e: Error) -> Error {
    let Error::Transient(t) = e else { return e };
    let (code, detail) = match t {
        Transient::PgServer { code, message } => (code, message),
        other => ("08006".to_owned(), other.to_string()),
    };
    let message = if code.starts_with("08") || code.starts_with("57P0") {
        format!(
            "PostgreSQL at {target} is not reachable now ({detail}); retry: this passes once the server is back \
             (a restart, a failover or a dropped connection); if it is up, check host and port"
        )
    } else {
        format!("{detail}; this may pass by itself: retry")
    };
    Transient::PgServer { code, message }.into()
}
