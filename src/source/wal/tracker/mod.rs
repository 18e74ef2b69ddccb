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
        let txn = self.get_mut(id)?;
        if txn.pending == 0 {
            return Err(AckError::UnknownTxn(id));
        }
        txn.pending -= 1;
        if txn.pending == 0 && txn.end_lsn.is_some() {
            let t = txn.commit_time_us;
            self.completed.push(t);
        }
        self.in_flight -= 1;
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
mod tests {
    use super::*;

    fn lsn(n: u64) -> Lsn {
        Lsn(n)
    }

    #[test]
    fn frontier_waits_for_every_record_of_a_transaction() {
        let mut t = AckTracker::new(lsn(100));
        let a = t.begin(0).unwrap();
        t.record().unwrap();
        t.record().unwrap();
        assert_eq!(t.commit(lsn(200)).unwrap(), lsn(100));
        assert_eq!(t.ack(a).unwrap(), lsn(100));
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.ack(a).unwrap(), lsn(200));
        assert!(!t.busy());
    }

    #[test]
    fn a_standalone_record_waits_for_its_ack_and_never_goes_backwards() {
        let mut t = AckTracker::new(lsn(100));
        let a = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(200)).unwrap();
        // A non-transactional message starting right where that commit ended.
        let b = t.begin(0).unwrap();
        t.record().unwrap();
        assert_eq!(t.commit_standalone(lsn(200)).unwrap(), lsn(100));
        assert_eq!(t.ack(b).unwrap(), lsn(100), "the earlier transaction is not acked yet");
        assert_eq!(t.ack(a).unwrap(), lsn(200));
        // One at a later LSN moves the frontier to it once acked; an earlier LSN is clamped up.
        let c = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit_standalone(lsn(260)).unwrap();
        assert_eq!(t.confirmed(), lsn(200));
        assert_eq!(t.ack(c).unwrap(), lsn(260));
        t.begin(0).unwrap();
        assert_eq!(t.commit_standalone(lsn(10)).unwrap(), lsn(260));
        // A real commit must still be strictly later.
        t.begin(0).unwrap();
        assert!(t.commit(lsn(260)).is_err());
    }

    #[test]
    fn out_of_order_acks_across_transactions() {
        let mut t = AckTracker::new(lsn(0));
        let a = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(10)).unwrap();
        let b = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(20)).unwrap();
        let c = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(30)).unwrap();
        // Later transactions acked first: nothing may be confirmed yet.
        assert_eq!(t.ack(c).unwrap(), lsn(0));
        assert_eq!(t.ack(b).unwrap(), lsn(0));
        // The first ack releases all three at once.
        assert_eq!(t.ack(a).unwrap(), lsn(30));
    }

    #[test]
    fn ack_before_commit_does_not_confirm() {
        let mut t = AckTracker::new(lsn(5));
        let a = t.begin(0).unwrap();
        t.record().unwrap();
        assert_eq!(t.ack(a).unwrap(), lsn(5));
        assert_eq!(t.commit(lsn(9)).unwrap(), lsn(9));
    }

    #[test]
    fn empty_transactions_complete_in_order() {
        let mut t = AckTracker::new(lsn(0));
        let a = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(10)).unwrap();
        t.begin(0).unwrap();
        // Empty, but behind an unacked one: must wait.
        assert_eq!(t.commit(lsn(20)).unwrap(), lsn(0));
        assert_eq!(t.ack(a).unwrap(), lsn(20));
        // Empty with nothing ahead: completes at commit.
        t.begin(0).unwrap();
        assert_eq!(t.commit(lsn(25)).unwrap(), lsn(25));
    }

    #[test]
    fn empty_transactions_behind_a_stalled_record_take_no_memory() {
        let mut t = AckTracker::new(lsn(0));
        let a = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(10)).unwrap();
        for i in 0..100_000u64 {
            t.begin(0).unwrap();
            assert_eq!(t.commit(lsn(20 + i)).unwrap(), lsn(0), "the stalled record holds the frontier");
        }
        assert_eq!(t.queued(), 1, "empty transactions folded into the stalled one");
        // A transaction with a record after the flood, then more empties behind it.
        let b = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(200_000)).unwrap();
        t.begin(0).unwrap();
        t.commit(lsn(200_010)).unwrap();
        assert_eq!(t.queued(), 2);
        // Acking `a` releases the flood, but not `b` or what folded into it.
        assert_eq!(t.ack(a).unwrap(), lsn(20 + 99_999));
        assert_eq!(t.ack(b).unwrap(), lsn(200_010));
        assert_eq!(t.queued(), 0);
        let mut n = 0;
        t.drain_completed(|_| n += 1);
        assert_eq!(n, 100_003, "every transaction is still counted once");
    }

    #[test]
    fn acks_find_their_transaction_after_folding() {
        let mut t = AckTracker::new(lsn(0));
        let a = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(10)).unwrap();
        t.begin(0).unwrap();
        t.commit(lsn(20)).unwrap();
        let c = t.begin(0).unwrap();
        t.record().unwrap();
        t.record().unwrap();
        t.commit(lsn(30)).unwrap();
        assert_eq!(t.ack(c).unwrap(), lsn(0));
        assert_eq!(t.ack(a).unwrap(), lsn(20));
        assert_eq!(t.ack(c).unwrap(), lsn(30));
        assert!(t.ack(TxnId(1)).is_err(), "the folded transaction has no records to ack");
    }

    #[test]
    fn keepalive_advances_only_when_idle() {
        let mut t = AckTracker::new(lsn(10));
        assert_eq!(t.keepalive(lsn(50)), lsn(50));
        // A smaller wal_end never moves us back.
        assert_eq!(t.keepalive(lsn(40)), lsn(50));
        let a = t.begin(0).unwrap();
        assert_eq!(t.keepalive(lsn(60)), lsn(50), "open transaction blocks keepalive");
        t.record().unwrap();
        t.commit(lsn(70)).unwrap();
        assert_eq!(t.keepalive(lsn(80)), lsn(50), "unacked record blocks keepalive");
        assert_eq!(t.ack(a).unwrap(), lsn(80), "the WAL end kept while busy applies at the last ack");
        assert_eq!(t.keepalive(lsn(90)), lsn(90));
    }

    #[test]
    fn a_keepalive_seen_while_busy_applies_once_the_queue_empties() {
        let mut t = AckTracker::new(lsn(10));
        let a = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(20)).unwrap();
        // WAL past our commit that holds nothing for us (another table, a running-xacts record).
        assert_eq!(t.keepalive(lsn(40)), lsn(10), "an unacked record holds the frontier");
        let b = t.begin(0).unwrap();
        t.record().unwrap();
        assert_eq!(t.ack(a).unwrap(), lsn(20), "a transaction is open: the kept WAL end waits");
        t.commit(lsn(50)).unwrap();
        assert_eq!(t.confirmed(), lsn(20));
        // Nothing is ours once b is acked: its end is past the kept one, so the frontier is its end.
        assert_eq!(t.ack(b).unwrap(), lsn(50));
        // A keepalive before the ack with no later transaction: the ack alone reaches the WAL end.
        let c = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(60)).unwrap();
        t.keepalive(lsn(90));
        assert_eq!(t.ack(c).unwrap(), lsn(90), "the kept WAL end applies when the last ack empties the queue");
        // And the monotonicity check moved with it.
        t.begin(0).unwrap();
        assert!(matches!(t.commit(lsn(90)), Err(AckError::Backwards { .. })));
    }

    #[test]
    fn backwards_commit_and_nesting_are_errors() {
        let mut t = AckTracker::new(lsn(100));
        t.begin(0).unwrap();
        assert!(matches!(t.begin(0), Err(AckError::NestedBegin(_))));
        assert_eq!(t.commit(lsn(100)), Err(AckError::Backwards { end: lsn(100), prev: lsn(100) }));
        let mut t = AckTracker::new(lsn(0));
        assert!(matches!(t.record(), Err(AckError::NoOpenTxn(_))));
        assert!(matches!(t.commit(lsn(1)), Err(AckError::NoOpenTxn(_))));
        t.begin(0).unwrap();
        t.commit(lsn(50)).unwrap();
        t.begin(0).unwrap();
        assert!(matches!(t.commit(lsn(40)), Err(AckError::Backwards { .. })));
    }

    #[test]
    fn stray_acks_are_errors() {
        let mut t = AckTracker::new(lsn(0));
        let a = t.begin(0).unwrap();
        t.record().unwrap();
        t.commit(lsn(5)).unwrap();
        t.ack(a).unwrap();
        assert_eq!(t.ack(a), Err(AckError::UnknownTxn(a)));
        assert_eq!(t.ack(TxnId(99)), Err(AckError::UnknownTxn(TxnId(99))));
    }

    /// Every interleaving of acks over a few transactions: the frontier is always the end LSN of
    /// the longest fully-acked committed prefix, and never decreases.
    #[test]
    fn exhaustive_small_interleavings() {
        // Transactions with 0..=2 records each; acks in every permutation order.
        let sizes = [2usize, 0, 1, 2];
        let mut records = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            for _ in 0..n {
                records.push(i);
            }
        }
        let mut perm: Vec<usize> = (0..records.len()).collect();
        let mut count = 0;
        loop {
            let mut t = AckTracker::new(lsn(0));
            let ids: Vec<TxnId> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let id = t.begin(0).unwrap();
                    for _ in 0..n {
                        t.record().unwrap();
                    }
                    t.commit(lsn(10 * (i as u64 + 1))).unwrap();
                    id
                })
                .collect();
            let mut acked = vec![0usize; sizes.len()];
            let mut prev = t.confirmed();
            for &p in &perm {
                let txn = records[p];
                acked[txn] += 1;
                let now = t.ack(ids[txn]).unwrap();
                assert!(now >= prev);
                prev = now;
                let prefix = (0..sizes.len()).take_while(|&i| acked[i] == sizes[i]).count();
                let expect = if prefix == 0 { 0 } else { 10 * prefix as u64 };
                assert_eq!(now, lsn(expect), "perm {perm:?}");
            }
            assert_eq!(t.confirmed(), lsn(40));
            count += 1;
            if !next_permutation(&mut perm) {
                break;
            }
        }
        assert_eq!(count, 120);
    }

    fn next_permutation(v: &mut [usize]) -> bool {
        let Some(i) = (1..v.len()).rev().find(|&i| v[i - 1] < v[i]) else {
            return false;
        };
        let j = (i..v.len()).rev().find(|&j| v[j] > v[i - 1]).unwrap();
        v.swap(i - 1, j);
        v[i..].reverse();
        true
    }
}

#[cfg(test)]
mod more_tests {
    use super::*;

    #[test]
    fn dead_letter_copy_keeps_the_transaction_open_until_it_is_acked() {
        let mut t = AckTracker::new(Lsn(0));
        let a = t.begin(77).unwrap();
        t.record().unwrap();
        t.commit(Lsn(10)).unwrap();
        assert_eq!(t.oldest_commit_time(), Some(77));
        // The original is rejected: add the DLQ copy, then resolve the original.
        t.record_for(a).unwrap();
        assert_eq!(t.ack(a).unwrap(), Lsn(0), "the copy is still pending");
        assert_eq!(t.ack(a).unwrap(), Lsn(10));
        let mut done = Vec::new();
        t.drain_completed(|c| done.push(c));
        assert_eq!(done, vec![77]);
        t.drain_completed(|c| done.push(c));
        assert_eq!(done, vec![77], "drained once");
        assert_eq!(t.oldest_commit_time(), None);
        assert!(t.record_for(a).is_err(), "a finished transaction takes no more records");
    }

    #[test]
    fn a_transaction_completes_on_its_own_last_ack_not_on_the_frontier() {
        let mut t = AckTracker::new(Lsn(0));
        let a = t.begin(1).unwrap();
        t.record().unwrap();
        t.commit(Lsn(10)).unwrap();
        let b = t.begin(2).unwrap();
        t.record().unwrap();
        t.commit(Lsn(20)).unwrap();
        t.ack(b).unwrap();
        let mut done = Vec::new();
        t.drain_completed(|c| done.push(c));
        assert_eq!(done, vec![2], "b is fully acked although a holds the frontier");
        assert_eq!(t.confirmed(), Lsn(0));
        t.ack(a).unwrap();
        t.drain_completed(|c| done.push(c));
        assert_eq!(done, vec![2, 1]);
        assert_eq!(t.confirmed(), Lsn(20));
        // An empty transaction completes at its commit.
        t.begin(3).unwrap();
        t.commit(Lsn(30)).unwrap();
        t.drain_completed(|c| done.push(c));
        assert_eq!(done, vec![2, 1, 3]);
    }
}
