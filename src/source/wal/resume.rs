//! Taking over from Debezium (`--debezium-offsets`): the events of the stream that Debezium's
//! committed offset says it delivered are not sent again. The same rule resumes exactly-once
//! delivery from the position committed in Kafka with the records (`--delivery exactly-once`),
//! which has the same shape: the part of it that holds on the server's WAL history now
//! ([`crate::lineage`]).
//!
//! The rule ([`crate::debezium_offset`] explains the offset's keys): a transaction whose
//! commit record starts before `lsn_commit` is skipped whole; in the transaction Debezium was in
//! the middle of (its xid), the changes before `lsn_proc` are skipped, and of the changes at
//! `lsn_proc` (a COPY's rows share one LSN) those the position counts, or, for Debezium's offset,
//! which counts none, those whose records are on the topics ([`super::shared_lsn`]); everything
//! else is sent. A
//! logical message decoded outside any transaction is skipped when it ends at or before
//! `lsn_commit` (an exactly-once position stored for such a message is its end).
//! Skipped events are never handed to the sink, but their transactions still pass through the ack
//! tracker, so the slot's confirmed position moves over them as over any transaction without
//! events. The rule depends on the stream only, so a new session (a reconnect, a restart with the
//! same flag) applies it again with the same result.

use crate::debezium_offset::DebeziumOffset;
use crate::lsn::Lsn;

/// Whether Debezium delivered a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    No,
    Yes,
    /// One of the changes sharing the offset's `lsn_proc`: not known from the offset alone.
    Ask,
}

impl From<bool> for Seen {
    fn from(yes: bool) -> Seen {
        if yes {
            Seen::Yes
        } else {
            Seen::No
        }
    }
}

/// Per session: what the current transaction's events are.
pub struct Resume {
    offset: DebeziumOffset,
    /// In a transaction Debezium delivered whole.
    whole: bool,
    /// In the transaction Debezium was in the middle of.
    partial: bool,
    /// Events seen at the partial transaction's `lsn_proc`.
    at_proc: u64,
    skipped: u64,
    /// The summary was logged (after the first transaction that was sent, even in part).
    reported: bool,
    /// Where the offset came from, for the log.
    what: &'static str,
}

impl Resume {
    /// Debezium's committed offset (`--debezium-offsets`).
    pub fn new(offset: DebeziumOffset) -> Resume {
        Resume {
            offset,
            whole: false,
            partial: false,
            at_proc: 0,
            skipped: 0,
            reported: false,
            what: "--debezium-offsets",
        }
    }

    /// The position an exactly-once Kafka sink committed with its records.
    pub fn committed(offset: DebeziumOffset) -> Resume {
        Resume { what: "exactly-once", ..Resume::new(offset) }
    }

    pub fn begin(&mut self, final_lsn: Lsn, xid: u32) {
        self.whole = final_lsn < self.offset.lsn_commit;
        self.partial = !self.whole && self.offset.partial.is_some_and(|p| p.xid == xid);
        self.at_proc = 0;
    }

    /// Whether the event at `at` in the current transaction was delivered by Debezium (a yes is
    /// counted as skipped). [`Seen::Ask`]: it is one of the changes at the offset's `lsn_proc`,
    /// and the offset does not say how many of those were sent (Debezium's never does); the
    /// session decides them together ([`super::shared_lsn`]) and reports with [`Resume::skip`].
    pub fn delivered(&mut self, at: Lsn) -> Seen {
        let seen = if self.whole {
            Seen::Yes
        } else if !self.partial {
            Seen::No
        } else {
            match self.offset.partial {
                Some(p) if at == p.lsn_proc && p.events_at_proc == 0 => Seen::Ask,
                Some(p) if at == p.lsn_proc => {
                    self.at_proc += 1;
                    Seen::from(self.at_proc <= p.events_at_proc)
                }
                Some(p) => Seen::from(at < p.lsn_proc),
                None => Seen::No,
            }
        };
        self.skipped += (seen == Seen::Yes) as u64;
        seen
    }

    /// Count `n` events decided after [`Seen::Ask`] as delivered.
    pub fn skip(&mut self, n: u64) {
        self.skipped += n;
    }

    /// Whether a logical message decoded outside any transaction at `at` (its record's end) was
    /// handled before: a stored position past it says so. Such a message ends where the next
    /// record begins, at most at the commit record of a transaction after it, so `at` equal to
    /// `lsn_commit` is the message the position was stored for, never a later one.
    pub fn standalone(&mut self, at: Lsn) -> bool {
        let yes = at <= self.offset.lsn_commit;
        self.skipped += yes as u64;
        yes
    }

    /// At a commit: once a transaction past Debezium's position ends, say how many were skipped.
    pub fn commit(&mut self) {
        if !self.whole && !self.reported {
            self.reported = true;
            tracing::info!(
                skipped = self.skipped,
                lsn_commit = %self.offset.lsn_commit,
                "{}: resumed from the committed position; {} event(s) already delivered were not sent again",
                self.what,
                self.skipped
            );
        }
        self.whole = false;
        self.partial = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::debezium_offset::Partial;

    #[test]
    fn skips_whole_transactions_before_the_commit_lsn_and_the_partial_one_up_to_lsn_proc() {
        let off = DebeziumOffset {
            lsn_commit: Lsn(1000),
            partial: Some(Partial { xid: 42, lsn_proc: Lsn(1200), events_at_proc: 0 }),
        };
        let mut r = Resume::new(off);
        // Committed before: every event, whatever its change LSN.
        r.begin(Lsn(900), 40);
        assert!(r.delivered(Lsn(50)) == Seen::Yes && r.delivered(Lsn(1300)) == Seen::Yes);
        r.commit();
        // The partial transaction, interleaved: changes below lsn_proc were delivered, later not.
        r.begin(Lsn(1500), 42);
        assert_eq!(r.delivered(Lsn(800)), Seen::Yes);
        assert_eq!(r.delivered(Lsn(1200)), Seen::Ask);
        r.skip(1);
        assert_eq!(r.delivered(Lsn(1201)), Seen::No);
        r.commit();
        // Another transaction with changes below lsn_proc: not Debezium's, so sent.
        r.begin(Lsn(1600), 43);
        assert_eq!(r.delivered(Lsn(1100)), Seen::No);
        r.commit();
        assert_eq!(r.skipped, 4);
    }

    #[test]
    fn several_changes_at_lsn_proc_count() {
        let off = DebeziumOffset {
            lsn_commit: Lsn(10),
            partial: Some(Partial { xid: 7, lsn_proc: Lsn(20), events_at_proc: 2 }),
        };
        let mut r = Resume::new(off);
        r.begin(Lsn(30), 7);
        let got: Vec<Seen> = (0..3).map(|_| r.delivered(Lsn(20))).collect();
        assert_eq!(got, [Seen::Yes, Seen::Yes, Seen::No]);
    }

    #[test]
    fn a_message_outside_any_transaction_counts_as_handled_up_to_the_commit_lsn() {
        // Stored after the message that ended at 500: it, and what came before, were handled.
        let mut r = Resume::committed(DebeziumOffset { lsn_commit: Lsn(500), partial: None });
        assert!(r.standalone(Lsn(400)) && r.standalone(Lsn(500)));
        assert!(!r.standalone(Lsn(501)));
        // A transaction committing where that message ended came after it: not delivered.
        r.begin(Lsn(500), 3);
        assert_eq!(r.delivered(Lsn(450)), Seen::No);
    }

    #[test]
    fn a_commit_offset_skips_nothing_after_it() {
        let mut r = Resume::new(DebeziumOffset { lsn_commit: Lsn(10), partial: None });
        r.begin(Lsn(10), 1);
        assert_eq!(r.delivered(Lsn(5)), Seen::No);
    }
}
