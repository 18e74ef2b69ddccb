//! The batch the inbox writer gathers between two writes, its bounds, and [`Halt`]: how the
//! writer stops short of writing it.
//!
//! Invariants: `next` holds, per partition, one past the last record taken into the batch (rows
//! and bad records alike), so the batch's write stores exactly what it holds; `start` holds what
//! the writer expected of each partition before the batch's first record of it, so a batch
//! abandoned on shutdown can give its partitions back ([`Batch::start`]) and the writer never
//! expects an offset past records that were neither written nor dead-lettered. The size bound
//! counts bad records too: a long run of them is bounded in memory and reaches its write (and
//! the dead-letter topic) like rows do.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::record::{Bad, Received, Row};
use super::Part;
use crate::error::{Definite, Error};

/// The records gathered since the last write.
#[derive(Default)]
pub(super) struct Batch {
    pub rows: Vec<Row>,
    /// Records that cannot be rows: dead-lettered before the batch's offsets are stored.
    pub bad: Vec<(Bad, Received)>,
    /// Per partition, one past the last record taken (bad ones included).
    pub next: HashMap<Part, i64>,
    /// Per partition, the offset the writer expected before this batch's first record of it.
    pub start: HashMap<Part, i64>,
    pub since: Option<Instant>,
    /// The first record's age (ms since its Kafka timestamp) when the writer took it: the time
    /// it spent in Kafka, the consumer and the channel (the per-batch debug line reports it).
    pub first_age_ms: Option<i64>,
}

impl Batch {
    /// `part`'s record at `offset` is taken, the writer having expected `expected`.
    pub fn taken(&mut self, part: Part, offset: i64, expected: i64) {
        self.start.entry(part.clone()).or_insert(expected);
        self.next.insert(part, offset + 1);
        self.since.get_or_insert_with(Instant::now);
    }

    /// Whether `size` records (`--batch-size`) are in hand, rows and bad records together.
    pub fn full(&self, size: usize) -> bool {
        self.rows.len() + self.bad.len() >= size
    }

    /// When the batch is due by `--batch-timeout`, once it holds anything.
    pub fn deadline(&self, timeout: Duration) -> Option<Instant> {
        self.since.map(|s| s + timeout)
    }

    /// Whether the batch is due at `now`: checked while a chunk is taken too, since a channel
    /// that never empties leaves the writer's deadline arm no turn.
    pub fn overdue(&self, timeout: Duration, now: Instant) -> bool {
        self.deadline(timeout).is_some_and(|d| now >= d)
    }
}

/// Why the writer's work stopped short of its end: a failure, or shutdown while it waited (for
/// the registry, PostgreSQL, or a dead-letter copy) with records taken that are neither written
/// nor dead-lettered. After `Stopped` nothing more is taken or written: the rest of a chunk, and
/// the batch in hand, would store an offset past those records (and Kafka's copy would follow).
pub(super) enum Halt {
    Failed(Error),
    Stopped,
}

impl From<Error> for Halt {
    fn from(e: Error) -> Halt {
        Halt::Failed(e)
    }
}

impl From<Definite> for Halt {
    fn from(e: Definite) -> Halt {
        Halt::Failed(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(offset: i64) -> (Bad, Received) {
        let r = Received {
            topic: "t".into(),
            partition: 0,
            offset,
            key: None,
            payload: Some(b"x".to_vec()),
            headers: Vec::new(),
            timestamp_ms: None,
        };
        (Bad { reason: "no_event_id", message: "no id".into() }, r)
    }

    #[test]
    fn bad_records_count_toward_the_size_bound() {
        let mut b = Batch::default();
        for n in 0..4 {
            b.taken(("t".into(), 0), n, n);
            b.bad.push(bad(n));
            assert!(!b.full(5), "{n}");
        }
        b.taken(("t".into(), 0), 4, 4);
        b.bad.push(bad(4));
        assert!(b.full(5), "five bad records fill a batch of five");
        assert_eq!(b.next[&("t".to_owned(), 0)], 5);
        assert_eq!(b.start[&("t".to_owned(), 0)], 0, "the start is the first record's");
    }

    #[test]
    fn a_batch_is_overdue_by_its_first_record_and_not_before() {
        let mut b = Batch::default();
        let t = Duration::from_millis(100);
        assert!(!b.overdue(t, Instant::now() + Duration::from_secs(3600)), "empty: never due");
        b.taken(("t".into(), 0), 7, 7);
        let first = b.since.unwrap();
        b.taken(("t".into(), 0), 8, 8);
        assert_eq!(b.since, Some(first), "later records do not move the deadline");
        assert!(!b.overdue(t, first + Duration::from_millis(99)));
        assert!(b.overdue(t, first + t));
    }
}
