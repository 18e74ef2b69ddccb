//! Exactly-once: records the broker refused for good inside a Kafka transaction, which was
//! therefore aborted. The next session reads them again; [`Condemned::take`] hands each to
//! `--on-bad-event` before it is produced, so it cannot abort another transaction.
//!
//! A record is known here by its place in the stream ([`Place`]): the LSN of the change it came
//! from, which of the changes at that LSN it is (a COPY's rows share one LSN), and its topic. Never
//! by its event id: an empty id, or two rows with one id, would otherwise condemn the wrong record
//! or none, and every session would abort on the same record again. The place depends on the WAL
//! only, so a new session (which reads the same transactions again from their start) meets the
//! same places. Dead-letter copies have no place: a refused copy stops the process instead.

use std::collections::HashMap;

use crate::lsn::Lsn;
use crate::sink::delivery::{Delivery, Position};

/// Where in the stream a record came from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    at: Lsn,
    nth: u64,
    topic: String,
}

impl Place {
    /// The place of a record the WAL session handed over (`None` for a dead-letter copy, or a
    /// record from no WAL change).
    pub fn of(d: &Delivery) -> Option<Place> {
        match d.source().position {
            Position::Lsn(at) if !d.is_dead_letter() && d.nth() > 0 => {
                Some(Place { at, nth: d.nth(), topic: d.topic().to_owned() })
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "change {} at {} to {}", self.nth, self.at, self.topic)
    }
}

/// The condemned records, with the broker's code and reason for each.
#[derive(Debug, Default)]
pub struct Condemned(HashMap<Place, (&'static str, String)>);

impl Condemned {
    pub fn insert(&mut self, place: Place, code: &'static str, reason: String) {
        self.0.insert(place, (code, reason));
    }

    /// Forget every condemned record: their places name another WAL history's changes (the
    /// server is another one now), where the same LSN may hold a different record.
    pub fn forget_all(&mut self) -> usize {
        let n = self.0.len();
        self.0.clear();
        n
    }

    /// Was this record condemned? Then it leaves the set, and its code and reason come back.
    pub fn take(&mut self, d: &Delivery) -> Option<(&'static str, String)> {
        if self.0.is_empty() {
            return None;
        }
        self.0.remove(&Place::of(d)?)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sink::delivery::{Source, Ticket};

    fn record(id: &str, at: u64, nth: u64) -> Delivery {
        let (tx, _) = crate::sink::acks::ack_queue();
        let source = Source { position: Position::Lsn(Lsn(at)), table: Arc::from("public.outbox") };
        Delivery::new(Ticket(1), id.into(), "t".into(), source, tx).at_change(nth)
    }

    #[test]
    fn a_changed_history_forgets_every_place() {
        let mut c = Condemned::default();
        c.insert(Place::of(&record("e", 100, 1)).unwrap(), "msg_size_too_large", "too big".into());
        assert_eq!(c.forget_all(), 1);
        assert_eq!(c.take(&record("e", 100, 1)), None, "the same place on the new history is another record");
    }

    #[test]
    fn records_are_known_by_their_place_not_their_event_id() {
        let mut c = Condemned::default();
        // Two records with one id (or none) at one LSN (a COPY): only the refused one is condemned.
        let refused = record("", 100, 2);
        c.insert(Place::of(&refused).expect("a place"), "too_large", "too big".into());
        refused.disarm();
        let first = record("", 100, 1);
        assert_eq!(c.take(&first), None, "the other record at that LSN goes on");
        first.disarm();
        let again = record("", 100, 2);
        assert_eq!(c.take(&again), Some(("too_large", "too big".into())));
        assert_eq!(c.take(&again), None, "once");
        again.disarm();
    }

    #[test]
    fn dead_letter_copies_and_unplaced_records_are_never_condemned() {
        let copy = record("e", 100, 1).for_dead_letter("0".into());
        assert_eq!(Place::of(&copy), None);
        copy.disarm();
        let unplaced = record("e", 100, 0);
        assert_eq!(Place::of(&unplaced), None);
        unplaced.disarm();
    }
}
