//! The two classes of failure, and nothing else.
//!
//! * [`Transient`]: the world hiccuped (a socket closed, the server restarted, a broker call timed
//!   out). The cure is to reconnect and resume from the slot's confirmed LSN; no data is at risk
//!   because nothing past an acked record was ever confirmed.
//! * [`Definite`]: a fact about the configuration, the database or the data that retrying cannot
//!   change. The message names the thing and tells the operator what to change; the process exits.
//!
//! Functions that can only fail one way return that class; the pipeline returns [`Error`].
//! Messages never contain a password: connection targets are printed through
//! [`crate::config::PgTarget`]'s redacting `Display`.

use crate::lsn::Lsn;

/// A failure that a reconnect may cure.
#[derive(Debug, thiserror::Error)]
pub enum Transient {
    #[error("connection to PostgreSQL at {target} lost: {source}")]
    PgIo {
        target: String,
        #[source]
        source: std::io::Error,
    },
    #[error("PostgreSQL at {target} closed the replication stream")]
    PgClosed { target: String },
    #[error("PostgreSQL reported {code}: {message}")]
    PgServer { code: String, message: String },
    #[error("replication slot \"{slot}\" is in use by PID {pid}")]
    SlotBusy { slot: String, pid: i32 },
    /// `--delivery exactly-once`: the open Kafka transaction was aborted; the next session
    /// resumes from the last committed position.
    #[error("Kafka transaction aborted: {reason}; resuming from the last committed position")]
    TxnAborted { reason: String },
    /// The schema registry cannot be asked now (`--value-converter avro`): nothing past the event
    /// waiting for its schema is confirmed, and the next session asks again.
    #[error("{reason}; nothing after the event waiting for its schema is confirmed, retrying")]
    Registry { reason: String },
    /// `outboxd inbox`: a bad record's dead-letter copy was not acked; its offset does not move
    /// past it, and the batch is tried again.
    #[error("{reason}; the record's offset stays until its copy is acked, retrying")]
    DeadLetter { reason: String },
    /// The sink's client could not do what a working client does (librdkafka gave no topic
    /// object for a valid name): the session ends, and the next one starts with a new client.
    #[error("{reason}; retrying with a new client")]
    SinkClient { reason: String },
    /// Another instance took over the transactional id (and so the slot): this one stands by.
    #[error("fenced by another outboxd with the same transactional.id ({reason}); standing by")]
    Fenced { reason: String },
}

/// A failure that needs an operator: retrying would give the same answer.
#[derive(Debug, thiserror::Error)]
pub enum Definite {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Setup(String),
    #[error("pgoutput protocol error at {lsn}: {detail}")]
    Protocol { lsn: Lsn, detail: String },
    #[error("cannot route event {event_id}: {reason}; nothing after it is confirmed, fix the row or the routing flags and restart")]
    Route { event_id: String, reason: String },
    #[error("delivery of event {event_id} to topic {topic} failed: {reason}")]
    Delivery { event_id: String, topic: String, reason: String },
    #[error("sink error: {0}")]
    Sink(String),
    #[error("internal invariant broken: {0}")]
    Bug(String),
    #[error("{task} ended while it was still needed ({how}); exiting so that a supervisor restarts outboxd")]
    TaskEnded { task: String, how: String },
}

/// Any failure of a pipeline run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Transient(#[from] Transient),
    #[error(transparent)]
    Definite(#[from] Definite),
}

impl Error {
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Transient(_))
    }
}

/// Whether a server error with this SQLSTATE may pass by itself; the one place that decides it,
/// for both connections. Transient: connection trouble (class 08), insufficient resources (53),
/// operator intervention such as a shutdown or a server starting up (57P01-57P05), a cancelled
/// statement (57014, our own timeouts), serialization failures and deadlocks (40001, 40P01), an
/// object in use (55006, a slot another walsender still holds) and system errors (58000, 58030).
/// The rest (28 authentication, 42 syntax and access, 3D000 no database, ...) need an operator.
pub fn sqlstate_is_transient(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P0")
        || matches!(code, "57014" | "40001" | "40P01" | "55006" | "58000" | "58030")
}

#[cfg(test)]
mod tests {
    use super::sqlstate_is_transient;

    #[test]
    fn sqlstate_classes() {
        for c in ["08006", "08001", "53300", "53100", "57P01", "57P03", "40001", "40P01", "55006", "57014"] {
            assert!(sqlstate_is_transient(c), "{c}");
        }
        for c in ["28P01", "28000", "42501", "42P01", "42704", "3D000", "22P02", "58P01", "XX000"] {
            assert!(!sqlstate_is_transient(c), "{c}");
        }
    }
}
