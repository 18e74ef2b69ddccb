//! Which WAL history a stored position belongs to, and how much of it still holds on the server
//! now. `--delivery exactly-once` keeps its position in Kafka, where it outlives the server's
//! history: a point-in-time restore or a failover must not make it skip new events.
//!
//! An LSN names a place in one history of the cluster, not in the cluster. A promoted standby or
//! a restore that ends recovery continues on a new timeline, which shares WAL with its parent
//! only up to the switch point where it began; past that point the same LSNs hold other
//! transactions. A restore that keeps the timeline (a disk snapshot, a copied data directory)
//! reuses LSNs as well, and nothing in the server's history shows it. So the position is stored
//! with its timeline and the LSN where that timeline began ([`Stamp`]), and [`Lineage::admit`]
//! decides how much of it the session may skip by:
//!
//! * The stored timeline is on the current history (`TIMELINE_HISTORY` of the current timeline)
//!   and began at the same LSN there:
//!   - it is the current timeline: the whole position, unless it lies beyond the server's WAL end
//!     (`IDENTIFY_SYSTEM`'s flush position); no position from this history can, so the server
//!     was restored to an earlier point of the same timeline, and nothing is skipped;
//!   - it is an ancestor this history left at a branch point before the position (a restore, a
//!     failover to a lagging replica): the position cut back to the branch point. The WAL before
//!     it is shared, so the transactions there were delivered; those after it are this history's
//!     own and are sent.
//! * Anything else (another branch, another timeline under the same number, a history file that
//!   cannot be read): nothing is skipped.
//!
//! Skipping less than the position sends again what was delivered, and the log says so; skipping
//! more would lose events, which this never does. A position stored by an older outboxd has no
//! stamp: it is taken as the current timeline's, with the WAL-end check.
//!
//! Pure: the history file is read on the replication connection ([`crate::pg::replication::read_lineage`]).

use crate::debezium_offset::DebeziumOffset;
use crate::lsn::Lsn;

/// The history a position was written on: its timeline, and the LSN where that timeline began
/// (`0/0` for timeline 1; `None` when the writer could not read its history file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub timeline: u32,
    pub begins: Option<Lsn>,
}

/// A position committed with the records, and the history it was written on (`None`: written
/// by an outboxd that did not stamp positions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub offset: DebeziumOffset,
    pub stamp: Option<Stamp>,
}

/// One timeline of the current history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    timeline: u32,
    begins: Lsn,
    /// Where this history left it (the switch point); `None` for the current timeline.
    ends: Option<Lsn>,
}

/// The server's WAL history at the start of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lineage {
    timeline: u32,
    /// `IDENTIFY_SYSTEM`'s WAL position: on a primary, the end of the flushed WAL.
    wal_end: Lsn,
    /// Oldest first, the current timeline last; `None` when the history file could not be read
    /// (then only the current timeline's number is known).
    spans: Option<Vec<Span>>,
}

/// How much of a stored position holds on the current history.
#[derive(Debug, PartialEq, Eq)]
pub enum Fit {
    /// All of it.
    Holds,
    /// Up to this branch point: where the current history left the position's timeline.
    UpTo(Lsn),
    /// None: it lies beyond the server's WAL end on the same timeline (a restore kept it).
    BeyondEnd,
    /// None: its timeline is not on the current history.
    OffHistory,
}

impl Lineage {
    /// Timeline 1: no history file, it began at `0/0`.
    pub fn first(wal_end: Lsn) -> Lineage {
        Lineage { timeline: 1, wal_end, spans: Some(vec![Span { timeline: 1, begins: Lsn::ZERO, ends: None }]) }
    }

    /// Only the current timeline's number is known (its history file could not be read).
    pub fn unknown(timeline: u32, wal_end: Lsn) -> Lineage {
        Lineage { timeline, wal_end, spans: None }
    }

    /// From the history file of `timeline` (`TIMELINE_HISTORY`): one line per ancestor,
    /// `parentTLI <tab> switchpoint <tab> reason`, oldest first; `#` comments and blank lines
    /// are allowed. Pure; a malformed file is an error naming the line.
    pub fn from_history(timeline: u32, wal_end: Lsn, file: &str) -> Result<Lineage, String> {
        let mut spans = Vec::new();
        let mut begins = Lsn::ZERO;
        for line in file.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let mut fields = line.split_whitespace();
            let parent = fields.next().and_then(|t| t.parse::<u32>().ok());
            let switch = fields.next().and_then(|l| l.parse::<Lsn>().ok());
            let (Some(parent), Some(switch)) = (parent, switch) else {
                return Err(format!("unreadable line {line:?} in the history file of timeline {timeline}"));
            };
            let ordered = spans.last().is_none_or(|s: &Span| s.timeline < parent) && switch >= begins;
            if !ordered || parent >= timeline {
                return Err(format!("line {line:?} is out of order in the history file of timeline {timeline}"));
            }
            spans.push(Span { timeline: parent, begins, ends: Some(switch) });
            begins = switch;
        }
        spans.push(Span { timeline, begins, ends: None });
        Ok(Lineage { timeline, wal_end, spans: Some(spans) })
    }

    /// What a position written now is stamped with.
    pub fn stamp(&self) -> Stamp {
        let begins = self.spans.as_ref().and_then(|s| s.last()).map(|s| s.begins);
        Stamp { timeline: self.timeline, begins }
    }

    /// How much of `stored` holds here (see the module doc).
    pub fn fit(&self, stored: &Stored) -> Fit {
        let Some(stamp) = stored.stamp else { return self.within_end(&stored.offset) };
        let span = match &self.spans {
            None if stamp.timeline == self.timeline => return self.within_end(&stored.offset),
            None => return Fit::OffHistory,
            Some(spans) => spans.iter().find(|s| s.timeline == stamp.timeline),
        };
        match span {
            // A stamp without its begin (its writer could not read the history file) names its
            // timeline by number only: that number may be another branch's among the ancestors,
            // so it counts only for the current timeline (with the WAL-end check).
            Some(s) if stamp.begins.map_or(s.ends.is_none(), |b| b == s.begins) => match s.ends {
                None => self.within_end(&stored.offset),
                Some(branch) if before(&stored.offset, branch) => Fit::Holds,
                Some(branch) => Fit::UpTo(branch),
            },
            _ => Fit::OffHistory,
        }
    }

    /// The part of `stored` the session may skip by, if any; what was cut is logged.
    pub fn admit(&self, stored: &Stored) -> Option<DebeziumOffset> {
        let (at, was) = (stored.offset.lsn_commit, stored.stamp.map(|s| s.timeline));
        let now = self.timeline;
        match self.fit(stored) {
            Fit::Holds => Some(stored.offset.clone()),
            Fit::UpTo(branch) => {
                tracing::warn!(stored_lsn = %at, stored_timeline = ?was, timeline = now, %branch, "exactly-once: the committed position lies past the point where this server's history left its timeline (a restore, or a failover to a lagging replica); events committed before the branch point are not sent again, events after it are this history's and are sent");
                Some(DebeziumOffset { lsn_commit: branch, partial: None })
            }
            Fit::BeyondEnd => {
                tracing::warn!(stored_lsn = %at, stored_timeline = ?was, timeline = now, wal_end = %self.wal_end, "exactly-once: the committed position lies beyond the server's WAL end on the same timeline (restored to an earlier point, e.g. from a disk snapshot); nothing is skipped by it: events from the slot's position on are sent, some perhaps again");
                None
            }
            Fit::OffHistory => {
                tracing::warn!(stored_lsn = %at, stored = ?stored.stamp, timeline = now, history = ?self.spans, "exactly-once: the committed position was written on a timeline that is not on this server's history; nothing is skipped by it: events from the slot's position on are sent, some perhaps again");
                None
            }
        }
    }

    fn within_end(&self, offset: &DebeziumOffset) -> Fit {
        // Every position names a transaction whose commit was decoded, so flushed WAL:
        // `lsn_commit` is at most that commit's end.
        if offset.lsn_commit > self.wal_end {
            Fit::BeyondEnd
        } else {
            Fit::Holds
        }
    }
}

/// Whether everything `offset` covers lies before `branch`. A whole position covers the
/// transactions whose commit record starts before `lsn_commit`; a partial one also the commit
/// record at `lsn_commit` itself (the transaction it stops inside), which must be shared too.
fn before(offset: &DebeziumOffset, branch: Lsn) -> bool {
    match offset.partial {
        None => offset.lsn_commit <= branch,
        Some(_) => offset.lsn_commit < branch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::debezium_offset::Partial;

    fn whole(lsn: u64, stamp: Option<(u32, u64)>) -> Stored {
        Stored {
            offset: DebeziumOffset { lsn_commit: Lsn(lsn), partial: None },
            stamp: stamp.map(|(timeline, b)| Stamp { timeline, begins: Some(Lsn(b)) }),
        }
    }

    /// Timeline 3: timeline 1 left at 0x100, timeline 2 at 0x300.
    fn third() -> Lineage {
        let file = "1\t0/100\tno recovery target specified\n\n2\t0/300\tbefore 2000-01-01 00:00:00+00\n";
        Lineage::from_history(3, Lsn(0x1000), file).unwrap()
    }

    #[test]
    fn a_history_file_parses_into_spans_and_stamps_the_current_timeline() {
        let l = third();
        assert_eq!(l.stamp(), Stamp { timeline: 3, begins: Some(Lsn(0x300)) });
        assert_eq!(Lineage::first(Lsn(5)).stamp(), Stamp { timeline: 1, begins: Some(Lsn::ZERO) });
        assert_eq!(Lineage::unknown(4, Lsn(5)).stamp(), Stamp { timeline: 4, begins: None });
        for bad in ["x\t0/1\tr", "1\tzz\tr", "2\t0/1\n1\t0/2", "1\t0/5\n2\t0/4", "3\t0/1"] {
            assert!(Lineage::from_history(3, Lsn(0), bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_current_timeline_holds_up_to_the_wal_end() {
        let l = third();
        assert_eq!(l.fit(&whole(0x800, Some((3, 0x300)))), Fit::Holds);
        assert_eq!(l.fit(&whole(0x1000, Some((3, 0x300)))), Fit::Holds);
        // A restore that kept the timeline: the position is past everything the server has.
        assert_eq!(l.fit(&whole(0x1001, Some((3, 0x300)))), Fit::BeyondEnd);
        // An older outboxd's position: taken as the current timeline's.
        assert_eq!(l.fit(&whole(0x800, None)), Fit::Holds);
        assert_eq!(l.fit(&whole(0x2000, None)), Fit::BeyondEnd);
    }

    #[test]
    fn an_ancestor_holds_before_its_branch_point_and_is_cut_back_to_it_after() {
        let l = third();
        // A failover to a caught-up replica: the position is before the switch point; kept
        // whole, so nothing is sent twice.
        assert_eq!(l.fit(&whole(0x250, Some((2, 0x100)))), Fit::Holds);
        assert_eq!(l.fit(&whole(0x300, Some((2, 0x100)))), Fit::Holds);
        assert_eq!(l.admit(&whole(0x250, Some((2, 0x100)))), Some(whole(0x250, None).offset));
        // A restore or a lagging replica: past the switch point, only the shared part.
        assert_eq!(l.fit(&whole(0x301, Some((2, 0x100)))), Fit::UpTo(Lsn(0x300)));
        assert_eq!(l.fit(&whole(0x900, Some((1, 0)))), Fit::UpTo(Lsn(0x100)));
        assert_eq!(l.admit(&whole(0x900, Some((1, 0)))), Some(whole(0x100, None).offset));
        // Inside a transaction whose commit record starts at the switch point: that commit is
        // the new history's, so the position is cut.
        let inside = Stored {
            offset: DebeziumOffset {
                lsn_commit: Lsn(0x300),
                partial: Some(Partial { xid: 9, lsn_proc: Lsn(0x2F0), events_at_proc: 1 }),
            },
            stamp: Some(Stamp { timeline: 2, begins: Some(Lsn(0x100)) }),
        };
        assert_eq!(l.fit(&inside), Fit::UpTo(Lsn(0x300)));
    }

    #[test]
    fn other_branches_and_reused_timeline_numbers_skip_nothing() {
        let l = third();
        // Timeline 4 is not on this history (a later branch, then a restore to before it).
        assert_eq!(l.fit(&whole(0x200, Some((4, 0x300)))), Fit::OffHistory);
        assert_eq!(l.admit(&whole(0x200, Some((4, 0x300)))), None);
        // Timeline 2 of another branch (it began elsewhere): a number reused after a restore.
        assert_eq!(l.fit(&whole(0x200, Some((2, 0x180)))), Fit::OffHistory);
        assert_eq!(l.fit(&whole(0x200, Some((3, 0x280)))), Fit::OffHistory);
        // A stamp written without its history file: the timeline's number only, which counts for
        // the current timeline and never for an ancestor (the number may be another branch's).
        assert_eq!(
            l.fit(&Stored { stamp: Some(Stamp { timeline: 2, begins: None }), ..whole(0x200, None) }),
            Fit::OffHistory
        );
        assert_eq!(
            l.fit(&Stored { stamp: Some(Stamp { timeline: 3, begins: None }), ..whole(0x200, None) }),
            Fit::Holds
        );
        // The history unreadable now: only the current timeline's positions count.
        let u = Lineage::unknown(3, Lsn(0x1000));
        assert_eq!(u.fit(&whole(0x200, Some((3, 0x300)))), Fit::Holds);
        assert_eq!(u.fit(&whole(0x200, Some((2, 0x100)))), Fit::OffHistory);
        assert_eq!(u.fit(&whole(0x2000, Some((3, 0x300)))), Fit::BeyondEnd);
    }

    #[test]
    fn timeline_one_holds_everything_up_to_the_wal_end() {
        let l = Lineage::first(Lsn(0x500));
        assert_eq!(l.fit(&whole(0x500, Some((1, 0)))), Fit::Holds);
        assert_eq!(l.fit(&whole(0x501, Some((1, 0)))), Fit::BeyondEnd);
        // Written on timeline 2, read on a timeline 1 server (restored from before the promotion).
        assert_eq!(l.fit(&whole(0x100, Some((2, 0x80)))), Fit::OffHistory);
    }
}
