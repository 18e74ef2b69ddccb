//! The inbox's lag per assigned partition, `outboxd_inbox_lag_records` and
//! `outboxd_inbox_lag_seconds`: facts about Kafka's end against what PostgreSQL has committed, so
//! they keep moving while the writer waits (a PostgreSQL outage), when they matter most.
//!
//! * **Records**: the partition's end (its last stable offset, as read_committed sees it) minus
//!   the next offset stored in PostgreSQL (the start of the assignment, then each committed
//!   batch's). Records produced during an outage raise it; the writer's commits lower it. Once
//!   everything read is stored, the consumer's position counts instead when it is further: it
//!   has stepped over offsets that hold no record (a transaction's commit marker, aborted
//!   records), so a caught-up partition behind a transactional producer reads 0, not 1.
//! * **Seconds**: the age, by its Kafka timestamp, of the oldest record read and not yet stored;
//!   0 when there is none (caught up, or nothing read yet past the stored offset). While
//!   PostgreSQL is away the oldest record waiting is the same one, so the age grows with the clock.
//!
//! Who writes what: the consumer thread sets a partition's start at its assignment, notes each
//! record it reads ([`Lag::read`]) and, when it finds nothing more to read, its positions
//! ([`Lag::read_to`]), and forgets partitions that change hands; the writer reports the
//! offsets each commit stored ([`Lag::stored`]); a thread of its own ([`watch`]) asks Kafka for
//! the ends every [`EVERY`] (one ListOffsets request per leader, whatever the consumer thread is
//! doing: it may be waiting on a full channel for hours) and sets the gauges.
//!
//! Invariant: a partition's figures exist only while it is assigned here; the records noted are
//! those read at or past the stored offset, in offset order, so the first is the oldest not
//! stored. They are bounded by what the writer can hold (its channel and its batch): a record is
//! dropped from the note once a commit stores past it.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc as std_mpsc;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::Part;
use crate::metrics::InboxMetrics;

/// How often the ends are asked for and the gauges set.
pub const EVERY: Duration = Duration::from_secs(1);
/// How long one ask for the ends may take; a Kafka that does not answer leaves the last ends.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// One assigned partition.
#[derive(Debug, Default)]
struct Track {
    /// The next offset stored in PostgreSQL (or where the assignment starts); `None` while not
    /// known (`--start-from earliest` on a partition never stored: its first record sets it).
    stored: Option<i64>,
    /// Records read at or past `stored`: offset and Kafka timestamp (ms), oldest first.
    unstored: VecDeque<(i64, Option<i64>)>,
    /// The partition's end, from the last answer.
    end: Option<i64>,
    /// The consumer's position when it last found nothing to read: every offset below it was
    /// read (and noted) or holds no record. Set by the same thread that notes the records.
    read_to: Option<i64>,
}

impl Track {
    fn store(&mut self, next: i64) {
        let stored = self.stored.map_or(next, |s| s.max(next));
        self.stored = Some(stored);
        while self.unstored.front().is_some_and(|(o, _)| *o < stored) {
            self.unstored.pop_front();
        }
    }

    /// Records and seconds at `now_ms`; `None` until the end and the stored offset are known.
    fn figures(&self, now_ms: i64) -> Option<(i64, i64, f64)> {
        let (end, stored) = (self.end?, self.stored?);
        // Nothing read waits to be stored: what lies between the stored offset and the position
        // holds no record (a commit marker), so it is not lag.
        let done = match self.read_to {
            Some(r) if self.unstored.is_empty() => stored.max(r),
            _ => stored,
        };
        let records = (end - done).max(0);
        let oldest = self.unstored.front().and_then(|(_, ts)| *ts);
        // A clock behind the broker's gives 0, never a negative age.
        let secs = match (records, oldest) {
            (0, _) | (_, None) => 0.0,
            (_, Some(ts)) => (now_ms - ts).max(0) as f64 / 1000.0,
        };
        Some((end, records, secs))
    }
}

/// The lag's state, shared by the consumer thread, the writer and [`watch`]'s thread. Keyed by
/// topic then partition, so noting a record allocates nothing.
#[derive(Default)]
pub struct Lag {
    parts: Mutex<HashMap<String, HashMap<i32, Track>>>,
}

impl Lag {
    fn parts(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<i32, Track>>> {
        self.parts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The consumer: `part` is assigned here, starting at `start` (its stored offset, or its
    /// range's start or end).
    pub fn assigned(&self, (topic, p): &Part, start: Option<i64>) {
        let track = Track { stored: start, ..Track::default() };
        self.parts().entry(topic.clone()).or_default().insert(*p, track);
    }

    /// The consumer: these partitions change hands; nothing of them is reported here any more,
    /// and their gauges go to 0 (the instance they move to reports them). Under the same lock as
    /// [`watch`]'s publishing, so figures taken before cannot set them back afterwards.
    pub fn forget(&self, parts: &[Part], metrics: &InboxMetrics) {
        let mut all = self.parts();
        for (topic, p) in parts {
            metrics.lag(topic, *p, 0);
            metrics.lag_seconds(topic, *p, 0.0);
            if let Some(t) = all.get_mut(topic) {
                t.remove(p);
                if t.is_empty() {
                    all.remove(topic);
                }
            }
        }
    }

    /// The consumer read a record (a partition not assigned here is ignored).
    pub fn read(&self, topic: &str, p: i32, offset: i64, timestamp_ms: Option<i64>) {
        let mut all = self.parts();
        let Some(track) = all.get_mut(topic).and_then(|t| t.get_mut(&p)) else { return };
        match track.stored {
            Some(s) if offset < s => {}
            // Read again after a seek: the note already holds it (offsets only grow in it).
            _ if track.unstored.back().is_some_and(|(o, _)| *o >= offset) => {}
            _ => track.unstored.push_back((offset, timestamp_ms)),
        }
    }

    /// The consumer, finding nothing more to read: its position in each assigned partition.
    pub fn read_to(&self, positions: impl IntoIterator<Item = (String, i32, i64)>) {
        let mut all = self.parts();
        for (topic, p, position) in positions {
            if let Some(track) = all.get_mut(&topic).and_then(|t| t.get_mut(&p)) {
                track.read_to = Some(position);
            }
        }
    }

    /// The writer: PostgreSQL committed these next offsets.
    pub fn stored(&self, next: &HashMap<Part, i64>) {
        let mut all = self.parts();
        for ((topic, p), n) in next {
            if let Some(track) = all.get_mut(topic).and_then(|t| t.get_mut(p)) {
                track.store(*n);
            }
        }
    }

    fn assigned_parts(&self) -> Vec<Part> {
        self.parts().iter().flat_map(|(t, ps)| ps.keys().map(|p| (t.clone(), *p))).collect()
    }

    fn set_end(&self, topic: &str, p: i32, end: i64) {
        if let Some(track) = self.parts().get_mut(topic).and_then(|t| t.get_mut(&p)) {
            track.end = Some(end);
        }
    }

    /// Per assigned partition whose figures are known: (topic, partition, end, records, seconds).
    #[cfg(test)]
    fn figures(&self, now_ms: i64) -> Vec<(String, i32, i64, i64, f64)> {
        let mut out = Vec::new();
        self.each(now_ms, |topic, p, end, records, secs| out.push((topic.to_owned(), p, end, records, secs)));
        out
    }

    /// Calls `f` with each assigned partition's known figures, under the lock.
    fn each(&self, now_ms: i64, mut f: impl FnMut(&str, i32, i64, i64, f64)) {
        let all = self.parts();
        for (topic, ps) in all.iter() {
            for (p, track) in ps {
                if let Some((end, records, secs)) = track.figures(now_ms) {
                    f(topic, *p, end, records, secs);
                }
            }
        }
    }
}

/// Every [`EVERY`] until `done` closes: ask Kafka for the assigned partitions' ends and set the
/// gauges and the status page. A failed ask is logged at debug and keeps the last ends (the
/// seconds still grow); the consumer thread reports Kafka's trouble already.
pub fn watch<C: ConsumerContext>(consumer: &BaseConsumer<C>, lag: &Lag, done: &std_mpsc::Receiver<()>) {
    let metrics = InboxMetrics::new();
    while let Err(std_mpsc::RecvTimeoutError::Timeout) = done.recv_timeout(EVERY) {
        let parts = lag.assigned_parts();
        if parts.is_empty() {
            continue;
        }
        let mut tpl = TopicPartitionList::with_capacity(parts.len());
        for (topic, p) in &parts {
            // An offset of -1 asks for the latest: the end, under read_committed the last stable offset.
            if let Err(e) = tpl.add_partition_offset(topic, *p, Offset::End) {
                tracing::debug!(%topic, partition = p, "cannot ask for the partition's end: {e}");
            }
        }
        match consumer.offsets_for_times(tpl, ASK_TIMEOUT) {
            Ok(ends) => {
                for e in ends.elements() {
                    if let (Offset::Offset(end), Ok(())) = (e.offset(), e.error()) {
                        lag.set_end(e.topic(), e.partition(), end);
                    }
                }
            }
            Err(e) => tracing::debug!("cannot read the partitions' ends for the lag: {e}; keeping the last"),
        }
        let now_ms = jiff::Timestamp::now().as_millisecond();
        // Set under the lock: a partition forgotten meanwhile is not set back to its old figures.
        lag.each(now_ms, |topic, p, end, records, secs| {
            metrics.lag(topic, p, records);
            metrics.lag_seconds(topic, p, secs);
            crate::status::inbox::inbox_board().lag(topic, p, end, records, Some(secs));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(p: i32) -> Part {
        ("t".to_owned(), p)
    }

    fn one(lag: &Lag, now_ms: i64) -> Option<(i64, f64)> {
        lag.figures(now_ms).into_iter().find(|f| f.1 == 0).map(|f| (f.3, f.4))
    }

    #[test]
    fn the_lag_grows_while_nothing_is_stored_and_falls_with_the_commits() {
        let lag = Lag::default();
        lag.assigned(&part(0), Some(100));
        assert_eq!(one(&lag, 0), None, "no end known yet");
        lag.set_end("t", 0, 100);
        assert_eq!(one(&lag, 50_000), Some((0, 0.0)), "caught up");
        // Records arrive; the writer cannot store them (PostgreSQL away).
        lag.read("t", 0, 100, Some(10_000));
        lag.read("t", 0, 101, Some(11_000));
        lag.set_end("t", 0, 102);
        assert_eq!(one(&lag, 12_000), Some((2, 2.0)));
        lag.set_end("t", 0, 150);
        assert_eq!(one(&lag, 20_000), Some((50, 10.0)), "more produced, the same oldest record older");
        // Stored through 100: the oldest waiting is 101.
        lag.stored(&HashMap::from([(part(0), 101)]));
        assert_eq!(one(&lag, 20_000), Some((49, 9.0)));
        lag.stored(&HashMap::from([(part(0), 150)]));
        assert_eq!(one(&lag, 20_000), Some((0, 0.0)));
        // A stale, lower commit never moves it back.
        lag.stored(&HashMap::from([(part(0), 120)]));
        assert_eq!(one(&lag, 20_000), Some((0, 0.0)));
    }

    #[test]
    fn records_read_again_or_below_the_stored_offset_are_not_noted_twice() {
        let lag = Lag::default();
        lag.assigned(&part(0), Some(10));
        lag.set_end("t", 0, 20);
        lag.read("t", 0, 9, Some(1_000));
        lag.read("t", 0, 10, Some(2_000));
        lag.read("t", 0, 10, Some(2_000));
        lag.read("t", 0, 11, Some(3_000));
        let parts = lag.parts();
        let t = &parts["t"][&0];
        assert_eq!(t.unstored, VecDeque::from([(10, Some(2_000)), (11, Some(3_000))]));
    }

    #[test]
    fn a_partition_without_a_start_takes_its_first_commit_and_one_that_goes_is_forgotten() {
        let lag = Lag::default();
        lag.assigned(&part(0), None);
        lag.assigned(&part(1), Some(0));
        lag.set_end("t", 0, 30);
        lag.read("t", 0, 5, Some(1_000));
        assert_eq!(one(&lag, 5_000), None, "no stored offset known");
        lag.stored(&HashMap::from([(part(0), 6)]));
        assert_eq!(one(&lag, 5_000), Some((24, 0.0)), "nothing read past the stored offset: no age known");
        lag.read("t", 7, 1, Some(1_000));
        lag.forget(&[part(0), part(1)], &InboxMetrics::new());
        assert!(lag.parts().is_empty(), "an emptied topic goes too");
        lag.read("t", 0, 40, Some(1_000));
        assert!(lag.figures(9_000).is_empty(), "a record of a partition not assigned here is ignored");
    }

    #[test]
    fn a_clock_behind_the_brokers_gives_no_negative_age() {
        let lag = Lag::default();
        lag.assigned(&part(0), Some(0));
        lag.set_end("t", 0, 1);
        lag.read("t", 0, 0, Some(12_000));
        assert_eq!(one(&lag, 10_000), Some((1, 0.0)));
    }

    #[test]
    fn a_commit_marker_past_the_last_stored_record_is_not_lag_once_the_consumer_stepped_over_it() {
        let lag = Lag::default();
        lag.assigned(&part(0), Some(0));
        // Records 0..10 of one transaction, its commit marker at 10: the end is 11.
        for o in 0..10 {
            lag.read("t", 0, o, Some(1_000));
        }
        lag.set_end("t", 0, 11);
        lag.read_to([("t".to_owned(), 0, 11)]);
        assert_eq!(one(&lag, 2_000), Some((11, 1.0)), "read, not stored: the stored offset counts");
        lag.stored(&HashMap::from([(part(0), 10)]));
        assert_eq!(one(&lag, 2_000), Some((0, 0.0)), "all stored, the marker stepped over");
        // A new transaction read but not stored: the stored offset counts again.
        lag.read("t", 0, 11, Some(1_500));
        lag.set_end("t", 0, 13);
        assert_eq!(one(&lag, 2_000), Some((3, 0.5)));
        lag.stored(&HashMap::from([(part(0), 12)]));
        assert_eq!(one(&lag, 2_000), Some((1, 0.0)), "the new marker counts until the consumer passes it");
        lag.read_to([("t".to_owned(), 0, 13)]);
        assert_eq!(one(&lag, 2_000), Some((0, 0.0)));
        // A position below the stored offset (a seek back) never raises the lag.
        lag.read_to([("t".to_owned(), 0, 5)]);
        assert_eq!(one(&lag, 2_000), Some((1, 0.0)));
    }
}
