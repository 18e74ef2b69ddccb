//! The changes that share the LSN of Debezium's offset (`--debezium-offsets`), held until all of
//! them are read, then split into those Debezium sent and the rest.
//!
//! A COPY (and anything else PostgreSQL writes with a heap multi-insert) logs a page's rows as one
//! WAL record, so dozens of changes share one LSN. Debezium 3.6.1's offset names that LSN
//! (`lsn_proc`) and nothing about how many of its changes went out. Debezium sends changes in
//! stream order, so what it sent of them is a prefix; which prefix is read back from its records
//! in Kafka by their `id` header ([`crate::sink::Sink::already_written`]).
//!
//! Invariants:
//! * One INSERT at the LSN needs no look-up: the offset was stored for it, so it was sent. A
//!   key-changing UPDATE is always looked up, and may have been sent or not: Debezium turns it
//!   into a delete and a create at that one LSN, and its offset may have been stored for the
//!   delete alone (the EventRouter drops the delete, Connect still commits its offset).
//! * Otherwise the prefix is exact or refused: the records must carry distinct ids, at least one
//!   must be found (the offset was stored for a change Debezium sent), and every record before
//!   the last one found must be found too. Anything else (retention removed them, another
//!   routing, ids used twice) is a start-up error naming what to do, never a guess.
//! * The held changes reach the sink in their order, each after its `Boundary::Change`, exactly
//!   as if it had been decided when read.

use std::collections::HashSet;

use crate::lsn::Lsn;
use crate::relay::Source;
use crate::router::{BadEvent, Record};

/// Changes at the offset's `lsn_proc`, routed, in stream order.
pub struct SharedLsn {
    pub at: Lsn,
    pub held: Vec<(Result<Record, BadEvent>, Source)>,
    /// Debezium made a change at this LSN before the held ones (a key-changing UPDATE's delete),
    /// so its offset may name the LSN with none of them sent.
    pub after_unsent: bool,
}

impl SharedLsn {
    pub fn new(at: Lsn) -> SharedLsn {
        SharedLsn { at, held: Vec::new(), after_unsent: false }
    }

    /// Whether the offset alone decides: one INSERT at the LSN was sent.
    pub fn decided_by_offset(&self) -> bool {
        self.held.len() == 1 && !self.after_unsent
    }

    /// The records to look up: the routed ones, in order (refused rows have none).
    pub fn records(&self) -> Vec<&Record> {
        self.held.iter().filter_map(|(r, _)| r.as_ref().ok()).collect()
    }

    /// Whether ids repeat among the records: then a found id cannot name one change.
    pub fn repeated_id(&self) -> Option<String> {
        let mut seen = HashSet::new();
        self.records().into_iter().find(|r| !seen.insert((&r.topic, &r.event_id))).map(|r| r.event_id.to_string())
    }

    /// How many of the held changes, from the first, Debezium delivered, given for each of
    /// [`SharedLsn::records`] whether it is on its topic.
    pub fn delivered(&self, written: &[bool]) -> Result<usize, String> {
        let n = self.held.len();
        let mut found = written.iter();
        let marks: Vec<Option<bool>> =
            self.held.iter().map(|(r, _)| r.as_ref().ok().map(|_| *found.next().unwrap_or(&false))).collect();
        let Some(last) = marks.iter().rposition(|m| *m == Some(true)) else {
            if self.after_unsent {
                return Ok(0);
            }
            return Err(format!(
                "none of the {n} events at {} (the LSN of Debezium's offset) is on its topic, though Debezium sent at \
                 least one of them: the topic's retention removed them, or the routing differs from the connector's; \
                 restore them or start without --debezium-offsets (those events may then be sent twice)",
                self.at
            ));
        };
        if let Some(gap) = marks[..last].iter().position(|m| *m == Some(false)) {
            return Err(format!(
                "of the {n} events at {} (the LSN of Debezium's offset), the {} is not on its topic but a later one is: \
                 Debezium sends them in order, so some were removed (retention?) or routed elsewhere; start without \
                 --debezium-offsets (those events may then be sent twice)",
                self.at,
                ordinal(gap + 1)
            ));
        }
        Ok(last + 1)
    }
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::relay::Position;

    fn record(id: &str) -> Record {
        Record {
            topic: "outbox.event.order".into(),
            key: None,
            payload: None,
            headers: vec![("id".into(), bytes::Bytes::copy_from_slice(id.as_bytes()))],
            partition: None,
            timestamp_ms: Some(1),
            event_id: id.into(),
            event_type: None,
        }
    }

    fn batch(ids: &[&str]) -> SharedLsn {
        let mut b = SharedLsn::new(Lsn(0x100));
        for id in ids {
            b.held.push((Ok(record(id)), Source { position: Position::Lsn(Lsn(0x100)), table: Arc::from("outbox") }));
        }
        b
    }

    #[test]
    fn the_found_prefix_is_what_was_delivered() {
        let b = batch(&["a", "b", "c", "d"]);
        assert_eq!(b.delivered(&[true, true, false, false]), Ok(2));
        assert_eq!(b.delivered(&[true, true, true, true]), Ok(4));
        assert_eq!(b.delivered(&[true, false, false, false]), Ok(1));
    }

    #[test]
    fn what_cannot_be_decided_is_refused() {
        let b = batch(&["a", "b", "c"]);
        let none = b.delivered(&[false, false, false]).unwrap_err();
        assert!(none.contains("none of the 3 events at 0/100") && none.contains("retention"), "{none}");
        let gap = b.delivered(&[false, true, false]).unwrap_err();
        assert!(gap.contains("the 1st is not on its topic"), "{gap}");
        assert_eq!(batch(&["a", "b", "a"]).repeated_id().as_deref(), Some("a"));
        assert_eq!(b.repeated_id(), None);
    }

    #[test]
    fn a_key_change_alone_at_the_offset_is_looked_up_and_may_be_unsent() {
        let mut b = batch(&["a"]);
        assert!(b.decided_by_offset());
        b.after_unsent = true;
        assert!(!b.decided_by_offset());
        assert_eq!(b.delivered(&[false]), Ok(0));
        assert_eq!(b.delivered(&[true]), Ok(1));
    }

    #[test]
    fn ordinals() {
        let got: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101].into_iter().map(ordinal).collect();
        assert_eq!(got, ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st"]);
    }
}
