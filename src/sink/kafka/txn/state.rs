//! The exactly-once producer's transaction state, as one enum ([`State`]) that only this module
//! changes: [`Machine`]'s methods are the transitions.
//!
//! ```text
//!  Unprepared ──prepared──▶ Idle ──began──▶ Open ──commit_started──▶ Committing
//!                            ▲ ▲              │                          │
//!                            │ └───aborted────┘                          │
//!                            └───────────────commit_ended────────────────┘
//!  Idle ──still_open──▶ Open   (a commit failed; librdkafka holds it open, to be aborted)
//!  any ──failed──▶ Fatal       (final: a new producer is built before the next session)
//! ```
//!
//! # Invariants
//! * Records are counted ([`Batch`]) only while a transaction is open; a commit under way holds
//!   no open transaction, so nothing can be produced into a committing one.
//! * The first record held during a commit ([`Machine::holding`]) exists only while a commit
//!   runs, and becomes the start of the next transaction's interval when it opens.
//! * `Fatal` is final: no transition leaves it. The sink builds a new producer (and with it a
//!   new `Machine`) before the next session.

use std::time::Instant;

use rdkafka::error::KafkaError;

use crate::debezium_offset::DebeziumOffset;

/// A Kafka commit under way: the background task, and what it commits.
pub(super) struct Committing {
    pub(super) task: tokio::task::JoinHandle<Result<(), KafkaError>>,
    pub(super) position: DebeziumOffset,
    /// Records in the transaction, the position record included.
    pub(super) records: usize,
    pub(super) started: Instant,
}

/// What the open transaction holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Batch {
    /// When the transaction got its first record (or, for one opened after a commit, when the
    /// sink began holding the first record meant for it).
    pub(super) since: Option<Instant>,
    /// Records produced in it, and their bytes.
    pub(super) sent: usize,
    pub(super) bytes: usize,
}

/// Where the producer's transactions are.
enum State {
    /// init_transactions not done on this producer, or the position not read yet.
    Unprepared,
    /// Ready, with no transaction open (before the first one, after an abort, or after a commit
    /// whose next transaction could not begin).
    Idle,
    /// A Kafka transaction is open (begin_transaction called).
    Open(Batch),
    /// A commit runs in the background. `held_since`: when the sink began holding records for
    /// the next transaction, so a record that waited for the commit does not wait a whole
    /// interval more.
    Committing { commit: Committing, held_since: Option<Instant> },
    /// The producer failed for good (fenced, or a fatal librdkafka state, or an abort that did
    /// not go through): nothing more is done with it.
    Fatal,
}

/// The transaction state and its transitions.
pub(super) struct Machine {
    state: State,
}

impl Default for Machine {
    fn default() -> Self {
        Machine { state: State::Unprepared }
    }
}

impl Machine {
    /// init_transactions done and the position read: ready to begin.
    pub(super) fn prepared(&mut self) {
        if let State::Unprepared = self.state {
            self.state = State::Idle;
        }
    }

    /// begin_transaction succeeded; the interval counts from `since` (a record held during the
    /// last commit) or from the first record.
    pub(super) fn began(&mut self, since: Option<Instant>) {
        if let State::Idle = self.state {
            self.state = State::Open(Batch { since, ..Batch::default() });
        }
    }

    /// A record went into the open transaction.
    pub(super) fn produced(&mut self, bytes: usize) {
        if let State::Open(b) = &mut self.state {
            b.sent += 1;
            b.bytes += bytes;
            b.since.get_or_insert_with(Instant::now);
        }
    }

    /// The sink holds a record until the running commit ends.
    pub(super) fn holding(&mut self) {
        if let State::Committing { held_since, .. } = &mut self.state {
            held_since.get_or_insert_with(Instant::now);
        }
    }

    /// The open transaction is being committed by `commit`'s task.
    pub(super) fn commit_started(&mut self, commit: Committing) {
        if let State::Open(_) = self.state {
            self.state = State::Committing { commit, held_since: None };
        }
    }

    /// The running commit's task, to await.
    pub(super) fn commit_task(&mut self) -> Option<&mut tokio::task::JoinHandle<Result<(), KafkaError>>> {
        match &mut self.state {
            State::Committing { commit, .. } => Some(&mut commit.task),
            _ => None,
        }
    }

    /// The commit's task ended: no transaction is open until [`Machine::began`]. Returns the
    /// commit, and when the first record held for the next transaction arrived.
    pub(super) fn commit_ended(&mut self) -> Option<(Committing, Option<Instant>)> {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Committing { commit, held_since } => Some((commit, held_since)),
            other => {
                self.state = other;
                None
            }
        }
    }

    /// A commit failed without failing the producer: librdkafka still holds its `records` in
    /// an open transaction, to be aborted.
    pub(super) fn still_open(&mut self, records: usize) {
        if let State::Idle = self.state {
            self.state = State::Open(Batch { since: None, sent: records, bytes: 0 });
        }
    }

    /// The open transaction was aborted (or its abort was tried).
    pub(super) fn aborted(&mut self) {
        if let State::Open(_) = self.state {
            self.state = State::Idle;
        }
    }

    /// The producer failed for good. Returns whether it had already.
    pub(super) fn failed(&mut self) -> bool {
        let was = self.is_fatal();
        self.state = State::Fatal;
        was
    }

    pub(super) fn is_ready(&self) -> bool {
        !matches!(self.state, State::Unprepared)
    }

    pub(super) fn is_fatal(&self) -> bool {
        matches!(self.state, State::Fatal)
    }

    pub(super) fn is_committing(&self) -> bool {
        matches!(self.state, State::Committing { .. })
    }

    /// The open transaction, if one is.
    pub(super) fn open(&self) -> Option<Batch> {
        match self.state {
            State::Open(b) => Some(b),
            _ => None,
        }
    }

    /// When the first record held during the running commit arrived.
    #[cfg(test)]
    pub(super) fn held_since(&self) -> Option<Instant> {
        match self.state {
            State::Committing { held_since, .. } => held_since,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_count_only_in_an_open_transaction_and_fatal_is_final() {
        let mut m = Machine::default();
        m.produced(5);
        m.began(None);
        assert!(m.open().is_none() && !m.is_ready(), "nothing opens before the producer is prepared");
        m.prepared();
        m.began(None);
        m.produced(5);
        assert_eq!(m.open().map(|b| (b.sent, b.bytes)), Some((1, 5)));
        m.aborted();
        assert!(m.open().is_none() && m.is_ready());
        assert!(!m.failed(), "the first failure is new");
        assert!(m.failed(), "and the second is not");
        for step in [Machine::prepared, Machine::aborted] {
            step(&mut m);
        }
        m.began(None);
        m.still_open(3);
        assert!(m.is_fatal() && m.open().is_none(), "no transition leaves Fatal");
    }
}
