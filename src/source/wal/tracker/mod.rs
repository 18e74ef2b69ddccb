//! The ack tracker: from in-flight transactions to the LSN we may confirm.
//!
//! This struct is the only owner of LSN progress. Nothing else keeps a copy of "what is
//! confirmed"; the replication loop asks [`AckTracker::confirmed`] whenever it writes a standby
//! status update.
//!
//! # Rules
//! * A transaction enters at BEGIN, gains one pending record per routed row, and gets its end LSN
//!   at COMMIT. Transactions are kept in commit order (pgoutput without streaming sends them that
//!   way), so the queue is ordered by end LSN.
//! * The confirmed frontier moves to a transaction's end LSN only when it is committed, all its
//!   records are acked, and every earlier transaction has moved the frontier already. Acks arrive
//!   out of order across partitions; order is restored here.
//! * A transaction with no records (another table's change, a logical message, or an empty commit)
//!   completes as soon as everything before it has. It is not queued behind a waiting one: at COMMIT
//!   it folds into the entry ahead of it (that entry's end LSN moves forward to its own), so the
//!   queue holds at most one entry per transaction with records in flight, plus the open one. A
//!   stalled record therefore costs memory for records, not for every transaction that follows.
//! * A keepalive's WAL end may move the frontier only while no transaction is open or queued: that
//!   WAL holds nothing for us, so confirming it stops an idle outbox from pinning WAL. One that
//!   arrives while we are busy is kept and applied when the queue empties: the stream is in
//!   order, so every transaction ending at or before it was received before it, and an empty
//!   queue means all of them were acked. Without this the slot could stay behind its WAL end for
//!   good: the server pings only while our reported write position is behind what it sent, and we
//!   report the keepalive's end as written as soon as it arrives.
//! * A failed record poisons its transaction: the frontier never passes it. The caller stops.
//! * The frontier never goes backwards. A commit whose end LSN is not after the previous one is a
//!   bug, reported as an error rather than clamped.
//!
//! The tracker is the WAL session's [`Ledger`] in the relay: the [`crate::relay::Delivery`] handle
//! of each record carries its transaction as the ticket, and dropping a handle unresolved counts
//! as a failure, so a sink that loses a record can never let the frontier pass it.

use std::collections::VecDeque;

use crate::error::{Definite, Error};
use crate::lsn::Lsn;
use crate::relay::dead_letter::DeadLetter;
use crate::relay::{Ledger, Refused, RefusedBy, Ticket};

/// Identifies a transaction for the life of one tracker. Monotonic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxnId(u64);

/// A transaction is the ticket its records carry through the relay.
impl From<TxnId> for Ticket {
    fn from(id: TxnId) -> Ticket {
        Ticket(id.0)
    }
}

/// The WAL session's ledger: a ticket is a transaction, and a record done is an ack that may move
/// the frontier. Every refusal goes to the bad-event policy.
impl Ledger for AckTracker {
    fn add(&mut self, t: Ticket, n: usize) -> Result<(), Error> {
        for _ in 0..n {
            self.record_for(TxnId(t.0))?;
        }
        Ok(())
    }

    fn done(&mut self, t: Ticket) -> Result<(), Error> {
        self.ack(TxnId(t.0))?;
        Ok(())
    }

    fn done_many(&mut self, t: Ticket, n: usize) -> Result<(), Error> {
        self.ack_n(TxnId(t.0), n)?;
        Ok(())
    }

    fn refused(&mut self, _t: Ticket, dl: &DeadLetter, _by: RefusedBy) -> Refused {
        Refused::Policy { reason: format!("{} ({})", dl.message, dl.code) }
    }
}

#[derive(Debug)]
struct Txn {
    id: TxnId,
    /// From BEGIN, µs since 2000-01-01; for lag and latency metrics only.
    commit_time_us: i64,
    /// `None` until COMMIT.
    end_lsn: Option<Lsn>,
    pending: usize,
}

/// Why the tracker refused an event. Every variant is either a protocol bug or a failed delivery.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AckError {
    #[error("BEGIN while transaction {0:?} is still open")]
    NestedBegin(TxnId),
    #[error("{0} without an open transaction")]
    NoOpenTxn(&'static str),
    #[error("commit end LSN {end} is not after the previous commit/frontier {prev}")]
    Backwards { end: Lsn, prev: Lsn },
    #[error("ack for unknown transaction {0:?}")]
    UnknownTxn(TxnId),
    #[error("{n} acks for transaction {id:?}, which has {pending} records in flight")]
    TooManyAcks { id: TxnId, n: usize, pending: usize },
}

/// A tracker error is a bug of the caller or of the protocol decoding, never a state to go on from.
impl From<AckError> for Error {
    fn from(e: AckError) -> Error {
        Definite::Bug(e.to_string()).into()
    }
}

/// Ordered in-flight transactions and the confirmed frontier.
#[derive(Debug)]
pub struct AckTracker {
    confirmed: Lsn,
    /// Highest end LSN handed to `commit`, for the monotonicity check.
    last_commit: Lsn,
    queue: VecDeque<Txn>,
    open: Option<TxnId>,
    next_id: u64,
    in_flight: usize,
    /// Commit times of transactions whose records were all acked (and that were committed) since
    /// the last [`AckTracker::drain_completed`]. Independent of the frontier: a transaction counts
    /// when its own last ack arrives, even if an earlier one still holds the frontier back.
    completed: Vec<i64>,
    /// The highest WAL end a keepalive reported; the frontier takes it whenever nothing is ours.
    wal_end: Lsn,
}

impl AckTracker {
    /// Start from the slot's `confirmed_flush_lsn`.
    pub fn new(confirmed: Lsn) -> Self {
        AckTracker {
            confirmed,
            last_commit: confirmed,
            queue: VecDeque::new(),
            open: None,
            next_id: 0,
            in_flight: 0,
            completed: Vec::new(),
            wal_end: confirmed,
        }
    }

    /// The LSN that is safe to send as the flush position.
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// Records handed to the sink and not yet acked.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// True while a transaction is open or any committed one waits for acks.
    pub fn busy(&self) -> bool {
        self.open.is_some() || !self.queue.is_empty()
    }

    /// BEGIN of a transaction that committed at `commit_time_us` (µs since 2000-01-01).
    pub fn begin(&mut self, commit_time_us: i64) -> Result<TxnId, AckError> {
        if let Some(open) = self.open {
            return Err(AckError::NestedBegin(open));
        }
        let id = TxnId(self.next_id);
        self.next_id += 1;
        self.queue.push_back(Txn { id, commit_time_us, end_lsn: None, pending: 0 });
        self.open = Some(id);
        Ok(id)
    }

    /// One more record of the open transaction is on its way to the sink.
    pub fn record(&mut self) -> Result<TxnId, AckError> {
        let id = self.open.ok_or(AckError::NoOpenTxn("record"))?;
        let txn = self.queue.back_mut().ok_or(AckError::NoOpenTxn("record"))?;
        txn.pending += 1;
        self.in_flight += 1;
        Ok(id)
    }

    /// One more record for a transaction that still has a record pending (a dead-letter copy
    /// replacing a rejected record: add the copy before resolving the original).
    pub fn record_for(&mut self, id: TxnId) -> Result<(), AckError> {
        let txn = self.get_mut(id)?;
        if txn.pending == 0 {
            return Err(AckError::UnknownTxn(id));
        }
        txn.pending += 1;
        self.in_flight += 1;
        Ok(())
    }

    /// Commit time of the open transaction (from its BEGIN), if one is open.
    pub fn open_commit_time(&self) -> Option<i64> {
        self.open.and_then(|_| self.queue.back()).map(|t| t.commit_time_us)
    }

    /// Commit time of the oldest transaction not yet confirmed, if any.
    pub fn oldest_commit_time(&self) -> Option<i64> {
        self.queue.front().map(|t| t.commit_time_us)
    }

    /// Commit times of the transactions fully acked since the last call (for the
    /// commit-to-ack histogram; the frontier may still be held back by an earlier transaction).
    pub fn drain_completed(&mut self, mut each: impl FnMut(i64)) {
        // Drained in place: the buffer keeps its capacity, so the hot path does not allocate.
        for t in self.completed.drain(..) {
            each(t);
        }
    }

    /// COMMIT of the open transaction. Returns the frontier after it.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<Lsn, AckError> {
        if self.open.is_some() && end_lsn <= self.last_commit {
            return Err(AckError::Backwards { end: end_lsn, prev: self.last_commit });
        }
        self.close_open(end_lsn)
    }

    /// COMMIT of a transaction the caller opened for a record decoded outside any transaction (a
    /// non-transactional logical message at `lsn`, sent to the dead-letter topic). Such a record
    /// may start exactly where the previous commit ended, so its end is `lsn` or that commit's
    /// end, whichever is later: confirming it never skips the record itself on a restart, since
    /// the server resends messages that start at or after the confirmed LSN.
    pub fn commit_standalone(&mut self, lsn: Lsn) -> Result<Lsn, AckError> {
        self.close_open(lsn.max(self.last_commit))
    }

    fn close_open(&mut self, end_lsn: Lsn) -> Result<Lsn, AckError> {
        let id = self.open.take().ok_or(AckError::NoOpenTxn("COMMIT"))?;
        self.last_commit = end_lsn;
        let txn = self.queue.back_mut().filter(|t| t.id == id).ok_or(AckError::UnknownTxn(id))?;
        txn.end_lsn = Some(end_lsn);
        if txn.pending == 0 {
            let t = txn.commit_time_us;
            self.completed.push(t);
            // Nothing of ours in it: once the entry ahead completes, the frontier may jump straight
            // to this commit. Carrying the end LSN forward keeps the queue bounded by records.
            if self.queue.len() >= 2 {
                self.queue.pop_back();
                if let Some(ahead) = self.queue.back_mut() {
                    ahead.end_lsn = Some(end_lsn);
                }
            }
        }
        self.advance();
        Ok(self.confirmed)
    }

    /// Entries in the queue (committed or open transactions not yet behind the frontier).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The sink confirmed one record of `id`. Returns the frontier after it.
    pub fn ack(&mut self, id: TxnId) -> Result<Lsn, AckError> {
        self.ack_n(id, 1)
    }

    /// The sink confirmed `n` records of `id` (a run of its acks): as `n` calls of
    /// [`AckTracker::ack`], with one lookup; `n == 0` changes nothing. More acks than `id` has
    /// pending is an error that changes nothing, so the frontier never passes a record still in
    /// flight.
    pub fn ack_n(&mut self, id: TxnId, n: usize) -> Result<Lsn, AckError> {
        let txn = self.get_mut(id)?;
        if txn.pending < n {
            return Err(AckError::TooManyAcks { id, n, pending: txn.pending });
        }
        if n == 0 {
            return Ok(self.confirmed);
        }
        txn.pending -= n;
        if txn.pending == 0 && txn.end_lsn.is_some() {
            let t = txn.commit_time_us;
            self.completed.push(t);
        }
        self.in_flight -= n;
        self.advance();
        Ok(self.confirmed)
    }

    /// A keepalive reported the server's WAL end. Moves the frontier only when nothing is ours;
    /// otherwise it is kept until the queue empties (see the module doc).
    pub fn keepalive(&mut self, wal_end: Lsn) -> Lsn {
        self.wal_end = self.wal_end.max(wal_end);
        self.advance();
        self.confirmed
    }

    fn get_mut(&mut self, id: TxnId) -> Result<&mut Txn, AckError> {
        // Ids increase along the queue but are not contiguous (empty transactions fold away).
        let idx = self.queue.binary_search_by_key(&id, |t| t.id).map_err(|_| AckError::UnknownTxn(id))?;
        Ok(&mut self.queue[idx])
    }

    fn advance(&mut self) {
        while let Some(t) = self.queue.front() {
            match t.end_lsn {
                Some(end) if t.pending == 0 => {
                    // end >= confirmed holds: commit() checked end > last_commit >= confirmed, and
                    // commit_standalone() takes end >= last_commit.
                    self.confirmed = end;
                    self.queue.pop_front();
                }
                _ => break,
            }
        }
        if !self.busy() && self.wal_end > self.confirmed {
            self.confirmed = self.wal_end;
            self.last_commit = self.last_commit.max(self.wal_end);
        }
    }
}

#[cfg(test)]
mod tests;
