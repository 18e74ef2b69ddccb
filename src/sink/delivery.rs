//! The handle a sink resolves for each record, and what comes back to the relay.
//!
//! A [`Delivery`] travels with its record into a sink. The sink resolves it exactly once: `ack()`
//! once the destination durably took the record, `reject()` when the destination refuses this
//! record for good, `fail()` when it can never be delivered. Each becomes an [`Ack`] on the relay's
//! queue ([`super::acks`]). Dropping a handle unresolved reports a failure, so a sink that loses a
//! record can never let a source count it as delivered.
//!
//! Both are on every record's path, so both stay small: the handle keeps its own copy of the event
//! id inline when it is short (never a slice of the read buffer; see `EventId`), and an ack carries
//! who the record was ([`About`]) only on a failure or a refusal, or while traces are exported.
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
    pub headers: Vec<crate::router::Header>,
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

/// A resolved delivery, sent back to the relay. Slim on the usual path (an ack with no trace
/// exporter): a ticket, a size, the topic for `outboxd_events_total` and the outcome; who the record
/// was ([`About`]) rides along only where something reads it.
#[derive(Debug)]
pub struct Ack {
    pub ticket: Ticket,
    /// The record's size, counted against `--max-in-flight-bytes` until this ack.
    pub bytes: usize,
    pub topic: Text,
    /// This record was itself a dead-letter copy: it may not be dead-lettered again.
    pub dead_letter: bool,
    pub outcome: Outcome,
    /// Always there on a failure or a refusal (their messages and dead-letter copies name the
    /// record); on an ack only while traces are exported (the record's span ends with it).
    pub about: Option<Box<About>>,
}

/// Who a resolved record was: its event id and where it came from.
#[derive(Debug)]
pub struct About {
    pub event_id: Text,
    pub source: Source,
}

impl Ack {
    /// The record's event id, or `""` on an ack that carries none (see [`Ack::about`]).
    pub fn event_id(&self) -> &str {
        self.about.as_ref().map_or("", |a| &a.event_id)
    }
}

/// A record's event id as its delivery handle keeps it: inline when it is short (a UUID's 36
/// characters fit), else in an allocation of its own. Never a slice of the record's own text: that
/// is a slice of the WAL message it came in, and that message a slice of the session's read buffer
/// (64 KiB, or several MiB after a big row); a handle lives until the sink's ack (a Kafka delivery
/// report, an exactly-once commit), long after the record is dropped, so sharing the slice would
/// keep one whole read buffer alive per record in flight, outside what `--max-in-flight-bytes`
/// counts. Inline, the usual id costs a copy of its bytes instead of an allocation and its free.
#[derive(Clone)]
enum EventId {
    /// `buf[..len]` holds a copy of a whole `&str`.
    Inline {
        len: u8,
        buf: [u8; INLINE_ID],
    },
    Heap(Box<str>),
}

/// The longest event id kept inline: the enum stays 48 bytes.
const INLINE_ID: usize = 46;

impl EventId {
    fn new(id: &str) -> EventId {
        let b = id.as_bytes();
        if b.len() <= INLINE_ID {
            let mut buf = [0u8; INLINE_ID];
            buf[..b.len()].copy_from_slice(b);
            EventId::Inline { len: b.len() as u8, buf }
        } else {
            EventId::Heap(id.into())
        }
    }

    fn as_str(&self) -> &str {
        match self {
            EventId::Inline { len, buf } => {
                let b = buf.get(..usize::from(*len)).unwrap_or_default();
                // `new` copied exactly these bytes from a whole `&str`, so this never fails; checked
                // anyway (it runs only off the per-record path: failures, refusals, traces, Debug).
                std::str::from_utf8(b).unwrap_or_default()
            }
            EventId::Heap(s) => s,
        }
    }
}

impl std::fmt::Debug for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// The per-record handle a sink must resolve. Dropped unresolved means failed.
#[derive(Debug)]
pub struct Delivery {
    ticket: Ticket,
    event_id: EventId,
    /// The record's own topic text, shared (a reference count, not a copy): the route's, never a
    /// slice of a message (`router::topic`).
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
        Delivery::of(ticket, &event_id, topic, source, tx)
    }

    /// [`Delivery::new`] with the event id borrowed: the handle keeps its own copy ([`EventId`]).
    pub fn of(ticket: Ticket, event_id: &str, topic: Text, source: Source, tx: AckSender<Ack>) -> Self {
        Delivery {
            ticket,
            event_id: EventId::new(event_id),
            topic,
            source,
            copy_part: None,
            bytes: 0,
            nth: 0,
            tx: Some(tx),
        }
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
        self.event_id.as_str()
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
        headers: Vec<crate::router::Header>,
    ) {
        self.send(Outcome::Rejected(Box::new(Refusal { code, reason: reason.into(), key, payload, headers })));
    }

    fn send(&mut self, outcome: Outcome) {
        if let Some(tx) = self.tx.take() {
            // Who the record was, only where it is read: a failure or a refusal names it, and an
            // exported trace ends its span with it (`relay::took`).
            let about = (!matches!(outcome, Outcome::Acked) || crate::otlp::exporter().is_some())
                .then(|| Box::new(About { event_id: Text::from(self.event_id.as_str()), source: self.source.clone() }));
            // The loop may be gone (shutdown); then nobody needs the outcome.
            tx.send(Ack {
                ticket: self.ticket,
                bytes: self.bytes,
                topic: std::mem::take(&mut self.topic),
                dead_letter: self.copy_part.is_some(),
                outcome,
                about,
            });
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        // Checked first: every resolved handle is dropped too, and the failure's text is an
        // allocation (and its free) that only an unresolved one needs.
        if self.tx.is_some() {
            self.send(Outcome::Failed { reason: "the sink dropped the record without a result".into() });
        }
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
        assert_eq!(ack.event_id(), "e1", "a failure names its record");
        Delivery::new(Ticket(4), "e2".into(), "t".into(), src, tx).ack();
        let ack = rx.try_recv().unwrap();
        assert!(matches!(ack.outcome, Outcome::Acked));
        assert!(ack.about.is_none(), "an ack without a trace exporter carries nothing it does not need");
        assert!(rx.try_recv().is_none(), "ack() must not also report a failure on drop");
    }

    #[test]
    fn event_ids_short_and_long_read_back_whole() {
        let long = "é".repeat(40);
        for id in
            ["", "e", "0190b6c2-7f1d-7c3e-9a55-2f1e3c4d5e6f", &"x".repeat(INLINE_ID), &"x".repeat(INLINE_ID + 1), &long]
        {
            let e = EventId::new(id);
            assert_eq!(e.as_str(), id);
            assert_eq!(matches!(e, EventId::Inline { .. }), id.len() <= INLINE_ID, "{id}");
        }
        assert_eq!(std::mem::size_of::<EventId>(), 48);
    }

    /// A handle's id is its own copy: the record's text (a slice of the session's read buffer)
    /// is not kept alive by a handle waiting for its ack.
    #[test]
    fn a_delivery_id_does_not_keep_the_read_buffer() {
        let buffer = Bytes::from(vec![b'x'; 64 * 1024]);
        for len in [36, 200] {
            let id = Text::try_from(buffer.slice(100..100 + len)).expect("UTF-8");
            let (tx, _rx) = super::super::acks::ack_queue();
            let src = Source { position: Position::Lsn(Lsn(1)), table: Arc::from("public.outbox") };
            let d = Delivery::of(Ticket(1), &id, "t".into(), src, tx);
            drop(id);
            assert_eq!(d.event_id(), "x".repeat(len));
            assert!(buffer.is_unique(), "the handle's id still shares the read buffer");
            d.disarm();
        }
    }
}
