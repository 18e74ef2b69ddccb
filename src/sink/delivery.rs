//! The handle a sink resolves for each record, and what comes back to the relay.
//!
//! A [`Delivery`] travels with its record into a sink. The sink resolves it exactly once: `ack()`
//! once the destination durably took the record, `reject()` when the destination refuses this
//! record for good, `fail()` when it can never be delivered. Each becomes an [`Ack`] on the relay's
//! queue ([`super::acks`]). Dropping a handle unresolved reports a failure, so a sink that loses a
//! record can never let a source count it as delivered.
//!
//! The handle carries its source's [`Ticket`], a number the relay never interprets: the WAL
//! session's transaction, poll's row in its batch, nothing for backfill (see [`crate::relay::Ledger`]).

use std::sync::Arc;

use bytes::Bytes;

use super::acks::AckSender;
use crate::lsn::Lsn;
use crate::router::Text;

/// What a record is counted under in its source's ledger. Opaque to the relay and the sinks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

/// The outcome a sink reports for one record.
#[derive(Debug)]
pub enum Outcome {
    Acked,
    /// Never delivered, and retrying will not help or was not possible. The pipeline stops.
    Failed {
        reason: String,
    },
    /// The broker refused this record for good (too large, invalid topic, policy); the record's
    /// parts come back so the bad-event policy can dead-letter them. Boxed: the rare case, and
    /// every ack through the relay's queue is moved at the size of the largest outcome.
    Rejected(Box<Refusal>),
}

/// A record the destination refused for good, as its delivery report gave it back.
#[derive(Debug)]
pub struct Refusal {
    pub code: &'static str,
    pub reason: String,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    pub headers: Vec<(String, Bytes)>,
}

/// Where a record came from, for dead-letter headers and error messages.
#[derive(Clone, Debug)]
pub struct Source {
    pub position: Position,
    pub table: Arc<str>,
}

/// Where in its source a record was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// `run`: the WAL position of the row's change or of the logical message.
    Lsn(Lsn),
    /// `poll`, which reads no WAL: the row's `--poll-field-seq` value.
    Seq(i64),
    /// `backfill`: none is kept (it confirms nothing and dead-letters nothing).
    Unknown,
}

/// `X/Y` for an LSN (as PostgreSQL prints `pg_lsn`), `seq N` for a polled row, `-` otherwise.
impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Position::Lsn(lsn) => lsn.fmt(f),
            Position::Seq(n) => write!(f, "seq {n}"),
            Position::Unknown => f.write_str("-"),
        }
    }
}

/// A resolved delivery, sent back to the replication loop.
#[derive(Debug)]
pub struct Ack {
    pub ticket: Ticket,
    pub event_id: Text,
    pub topic: Text,
    pub source: Source,
    /// This record was itself a dead-letter copy: it may not be dead-lettered again.
    pub dead_letter: bool,
    /// The record's size, counted against `--max-in-flight-bytes` until this ack.
    pub bytes: usize,
    pub outcome: Outcome,
}

/// The per-record handle a sink must resolve. Dropped unresolved means failed.
#[derive(Debug)]
pub struct Delivery {
    ticket: Ticket,
    // The record's own text, shared (a reference count each, not a copy).
    event_id: Text,
    topic: Text,
    source: Source,
    /// On a dead-letter copy: which part of the copy it is ([`Delivery::copy_part`]).
    copy_part: Option<String>,
    bytes: usize,
    /// Which of the changes at its LSN the record came from (1 for the first; a COPY's rows share
    /// one LSN); 0 when not known. With the LSN it names the record by its place in the stream.
    nth: u64,
    tx: Option<AckSender<Ack>>,
}

impl Delivery {
    pub fn new(ticket: Ticket, event_id: Text, topic: Text, source: Source, tx: AckSender<Ack>) -> Self {
        Delivery { ticket, event_id, topic, source, copy_part: None, bytes: 0, nth: 0, tx: Some(tx) }
    }

    /// The record came from the `nth` change at its LSN (see [`Delivery::nth`]).
    pub fn at_change(mut self, nth: u64) -> Self {
        self.nth = nth;
        self
    }

    /// Which of the changes at its LSN the record came from (1 for the first); 0 when not known.
    pub fn nth(&self) -> u64 {
        self.nth
    }

    /// Count `bytes` for this record against the in-flight byte budget until it resolves.
    pub fn with_bytes(mut self, bytes: usize) -> Self {
        self.bytes = bytes;
        self
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Mark this delivery as carrying `part` of a dead-letter copy: what tells its records apart
    /// in the sink's own message id ([`super::escape::copy_id`]).
    pub fn for_dead_letter(mut self, part: String) -> Self {
        self.copy_part = Some(part);
        self
    }

    pub fn ticket(&self) -> Ticket {
        self.ticket
    }

    /// This handle carries a dead-letter copy.
    pub fn is_dead_letter(&self) -> bool {
        self.copy_part.is_some()
    }

    /// On a dead-letter copy, which part of it this record is: `<chunk id>/<chunk index>` for a
    /// chunk, for a whole copy an id from its table, position, event id and payload
    /// ([`crate::sink::dead_letter::copy_part`]).
    pub fn copy_part(&self) -> Option<&str> {
        self.copy_part.as_deref()
    }

    pub fn event_id(&self) -> &str {
        &self.event_id
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    pub fn ack(mut self) {
        self.send(Outcome::Acked);
    }

    /// Give up the handle without reporting: the caller has resolved the record in the tracker
    /// itself (a rejected record whose bad-event policy ran synchronously).
    pub fn disarm(mut self) {
        self.tx = None;
    }

    pub fn fail(mut self, reason: impl Into<String>) {
        self.send(Outcome::Failed { reason: reason.into() });
    }

    pub fn reject(
        mut self,
        code: &'static str,
        reason: impl Into<String>,
        key: Option<Bytes>,
        payload: Option<Bytes>,
        headers: Vec<(String, Bytes)>,
    ) {
        self.send(Outcome::Rejected(Box::new(Refusal { code, reason: reason.into(), key, payload, headers })));
    }

    fn send(&mut self, outcome: Outcome) {
        if let Some(tx) = self.tx.take() {
            // The loop may be gone (shutdown); then nobody needs the outcome.
            tx.send(Ack {
                ticket: self.ticket,
                event_id: std::mem::take(&mut self.event_id),
                topic: std::mem::take(&mut self.topic),
                source: self.source.clone(),
                dead_letter: self.copy_part.is_some(),
                bytes: self.bytes,
                outcome,
            });
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.send(Outcome::Failed { reason: "the sink dropped the record without a result".into() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_delivery_reports_failure() {
        let (tx, mut rx) = super::super::acks::ack_queue();
        let src = Source { position: Position::Lsn(Lsn(1)), table: Arc::from("public.outbox") };
        let d = Delivery::new(Ticket(3), "e1".into(), "t".into(), src.clone(), tx.clone());
        drop(d);
        let ack = rx.try_recv().unwrap();
        assert!(matches!(ack.outcome, Outcome::Failed { .. }));
        assert_eq!(ack.ticket, Ticket(3));
        Delivery::new(Ticket(4), "e2".into(), "t".into(), src, tx).ack();
        let ack = rx.try_recv().unwrap();
        assert!(matches!(ack.outcome, Outcome::Acked));
        assert!(rx.try_recv().is_none(), "ack() must not also report a failure on drop");
    }
}
