//! Pairing legacy events with their shadow copies and tallying the outcome; pure, no I/O.
//!
//! An event waits in `pending` (per side, by id) until its pair arrives from the other side; then
//! both are compared ([`super::diff`]) and forgotten, except for a 64-bit hash of the id in
//! `paired`, so a later copy of the same event (at-least-once delivery repeats events) counts as a
//! duplicate rather than as an event with no pair. Memory therefore grows with the events still
//! unmatched (their payloads) plus 16 bytes or so per paired id; `--max-pending` caps the first,
//! and in `--follow` mode [`Pairer::expire`] and [`Pairer::forget_paired_before`] bound both.
//!
//! `--since` makes the window: events before it may still pair with events in it (their copy on
//! the other side can be older, by up to `--max-lag`), but a pair of two events before the
//! window is not counted, and an event before it left without a pair is not reported.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use super::diff::{diff, Ignore, Payload};

/// Which topic an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Legacy = 0,
    Shadow = 1,
}

impl Side {
    pub const BOTH: [Side; 2] = [Side::Legacy, Side::Shadow];

    pub fn name(self) -> &'static str {
        match self {
            Side::Legacy => "legacy",
            Side::Shadow => "shadow",
        }
    }

    fn other(self) -> Side {
        match self {
            Side::Legacy => Side::Shadow,
            Side::Shadow => Side::Legacy,
        }
    }
}

/// One record, identified.
#[derive(Clone, Debug)]
pub struct Event {
    pub id: String,
    /// The record's timestamp (CreateTime or LogAppendTime), when it has one.
    pub timestamp_ms: Option<i64>,
    pub payload: Payload,
    /// False for records before `--since` read only so that events in the window find their pair.
    pub in_window: bool,
}

/// What feeding one event did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fed {
    Matched,
    Different(Vec<String>),
    /// Waits for its pair.
    Pending,
    /// Another copy of an event already seen on this side.
    Duplicate,
    /// Paired, but both before the window: not counted.
    OutsideWindow,
}

/// More events wait for their pair than `--max-pending` allows.
#[derive(Debug, PartialEq, Eq)]
pub struct TooManyPending(pub usize);

/// The lag between the two copies of an event: shadow timestamp minus legacy timestamp.
/// The median is over the last [`LAG_WINDOW`] pairs, so memory stays fixed in `--follow` mode.
#[derive(Clone, Debug, Default)]
pub struct Lags {
    recent: VecDeque<i64>,
    pub count: u64,
    pub max: Option<i64>,
    pub min: Option<i64>,
}

pub const LAG_WINDOW: usize = 100_000;

impl Lags {
    fn add(&mut self, ms: i64) {
        if self.recent.len() == LAG_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(ms);
        self.count += 1;
        self.max = Some(self.max.map_or(ms, |m| m.max(ms)));
        self.min = Some(self.min.map_or(ms, |m| m.min(ms)));
    }

    /// The median (the lower one of an even count).
    pub fn p50(&self) -> Option<i64> {
        let mut v: Vec<i64> = self.recent.iter().copied().collect();
        if v.is_empty() {
            return None;
        }
        let mid = (v.len() - 1) / 2;
        Some(*v.select_nth_unstable(mid).1)
    }
}

/// The counts, and the first `limit` ids of each kind of problem.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub records: [u64; 2],
    pub matched: u64,
    pub different: Vec<(String, Vec<String>)>,
    pub different_count: u64,
    /// Events whose pair never came, by the side they are on.
    pub only: [Vec<String>; 2],
    pub only_count: [u64; 2],
    pub duplicates: [u64; 2],
    /// Records without the `--match-by` id; they cannot be checked, so they fail the run.
    pub unidentified: [u64; 2],
    pub lags: Lags,
}

impl Tally {
    /// Everything paired and matched.
    pub fn ok(&self) -> bool {
        self.different_count == 0 && self.only_count == [0, 0] && self.unidentified == [0, 0]
    }

    pub fn unidentified(&mut self, side: Side) {
        self.records[side as usize] += 1;
        self.unidentified[side as usize] += 1;
    }
}

struct Waiting {
    timestamp_ms: Option<i64>,
    payload: Payload,
    in_window: bool,
}

/// The pairing state; see the module doc.
pub struct Pairer {
    ignore: Ignore,
    limit: usize,
    max_pending: usize,
    pending: [HashMap<String, Waiting>; 2],
    /// Hash of each paired id, with the pair's newest timestamp (for [`Pairer::forget_paired_before`]).
    paired: HashMap<u64, i64>,
    pub tally: Tally,
}

fn id_hash(id: &str) -> u64 {
    // SipHash with fixed keys: the same id always hashes alike within a run.
    let mut h = DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

impl Pairer {
    pub fn new(ignore: Ignore, limit: usize, max_pending: usize) -> Pairer {
        Pairer {
            ignore,
            limit,
            max_pending,
            pending: [HashMap::new(), HashMap::new()],
            paired: HashMap::new(),
            tally: Tally::default(),
        }
    }

    pub fn pending(&self, side: Side) -> usize {
        self.pending[side as usize].len()
    }

    pub fn feed(&mut self, side: Side, ev: Event) -> Result<Fed, TooManyPending> {
        let (s, o) = (side as usize, side.other() as usize);
        let hash = id_hash(&ev.id);
        if self.pending[s].contains_key(&ev.id) || self.paired.contains_key(&hash) {
            if ev.in_window {
                self.tally.records[s] += 1;
                self.tally.duplicates[s] += 1;
            }
            return Ok(Fed::Duplicate);
        }
        let Some(other) = self.pending[o].remove(&ev.id) else {
            if self.pending[0].len() + self.pending[1].len() >= self.max_pending {
                return Err(TooManyPending(self.max_pending));
            }
            if ev.in_window {
                self.tally.records[s] += 1;
            }
            let w = Waiting { timestamp_ms: ev.timestamp_ms, payload: ev.payload, in_window: ev.in_window };
            self.pending[s].insert(ev.id, w);
            return Ok(Fed::Pending);
        };
        let newest = ev.timestamp_ms.max(other.timestamp_ms).unwrap_or(i64::MIN);
        self.paired.insert(hash, newest);
        if !ev.in_window && !other.in_window {
            return Ok(Fed::OutsideWindow);
        }
        if ev.in_window {
            self.tally.records[s] += 1;
        }
        if !other.in_window {
            self.tally.records[o] += 1;
        }
        let (legacy, shadow) = match side {
            Side::Legacy => ((&ev.payload, ev.timestamp_ms), (&other.payload, other.timestamp_ms)),
            Side::Shadow => ((&other.payload, other.timestamp_ms), (&ev.payload, ev.timestamp_ms)),
        };
        if let (Some(l), Some(sh)) = (legacy.1, shadow.1) {
            self.tally.lags.add(sh.saturating_sub(l));
        }
        let paths = diff(legacy.0, shadow.0, &self.ignore);
        if paths.is_empty() {
            self.tally.matched += 1;
            return Ok(Fed::Matched);
        }
        self.tally.different_count += 1;
        if self.tally.different.len() < self.limit {
            self.tally.different.push((ev.id, paths.clone()));
        }
        Ok(Fed::Different(paths))
    }

    /// Gives up on the events of `side` with a timestamp before `before_ms` (and on those without
    /// a timestamp, which Kafka's record format has not produced since 0.10): they count as having
    /// no pair. Returns how many.
    pub fn expire(&mut self, side: Side, before_ms: i64) -> usize {
        let gone: Vec<(String, Waiting)> = {
            let p = &mut self.pending[side as usize];
            let ids: Vec<String> = p
                .iter()
                .filter(|(_, w)| w.timestamp_ms.unwrap_or(i64::MIN) < before_ms)
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter().filter_map(|id| p.remove_entry(&id)).collect()
        };
        let n = gone.len();
        self.report_unpaired(side, gone);
        n
    }

    /// Forgets paired ids whose newest timestamp is before `before_ms`: a copy arriving later
    /// would count as unpaired. Keeps `--follow` memory bounded.
    pub fn forget_paired_before(&mut self, before_ms: i64) {
        self.paired.retain(|_, t| *t >= before_ms);
    }

    /// The end of a one-shot run: everything still waiting has no pair.
    pub fn finish(&mut self) {
        for side in Side::BOTH {
            let gone: Vec<(String, Waiting)> = self.pending[side as usize].drain().collect();
            self.report_unpaired(side, gone);
        }
    }

    fn report_unpaired(&mut self, side: Side, mut gone: Vec<(String, Waiting)>) {
        gone.retain(|(_, w)| w.in_window);
        // By id: arrival order across partitions is not stable from run to run.
        gone.sort_by(|a, b| a.0.cmp(&b.0));
        let s = side as usize;
        self.tally.only_count[s] += gone.len() as u64;
        let room = self.limit.saturating_sub(self.tally.only[s].len());
        self.tally.only[s].extend(gone.into_iter().take(room).map(|(id, _)| id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: &str, ts: i64, payload: &str) -> Event {
        Event {
            id: id.into(),
            timestamp_ms: Some(ts),
            payload: Payload::from_bytes(Some(payload.as_bytes())),
            in_window: true,
        }
    }

    fn pairer() -> Pairer {
        Pairer::new(Ignore::parse(&["/sentAt".into()]).unwrap(), 100, 1000)
    }

    #[test]
    fn pairs_in_either_order_and_reports_what_is_left() {
        let mut p = pairer();
        assert_eq!(p.feed(Side::Legacy, ev("a", 1000, r#"{"x":1,"sentAt":1}"#)), Ok(Fed::Pending));
        assert_eq!(p.feed(Side::Shadow, ev("b", 1000, r#"{"x":1}"#)), Ok(Fed::Pending));
        assert_eq!(p.feed(Side::Shadow, ev("a", 1250, r#"{"x":1.0,"sentAt":2}"#)), Ok(Fed::Matched));
        assert_eq!(p.feed(Side::Legacy, ev("b", 1100, r#"{"x":2}"#)), Ok(Fed::Different(vec!["/x".into()])));
        assert_eq!(p.feed(Side::Legacy, ev("e", 1200, "{}")), Ok(Fed::Pending));
        assert_eq!(p.feed(Side::Shadow, ev("d", 1300, "{}")), Ok(Fed::Pending));
        assert_eq!(p.feed(Side::Legacy, ev("c", 1400, "{}")), Ok(Fed::Pending));
        p.finish();
        let t = &p.tally;
        assert_eq!(t.records, [4, 3]);
        assert_eq!(t.matched, 1);
        assert_eq!(t.different, vec![("b".to_string(), vec!["/x".to_string()])]);
        assert_eq!(t.only, [vec!["c".to_string(), "e".into()], vec!["d".to_string()]], "sorted by id");
        assert_eq!(t.only_count, [2, 1]);
        assert_eq!((t.lags.count, t.lags.p50(), t.lags.min, t.lags.max), (2, Some(-100), Some(-100), Some(250)));
        assert!(!t.ok());
    }

    #[test]
    fn repeated_copies_are_duplicates_not_orphans() {
        let mut p = pairer();
        p.feed(Side::Shadow, ev("a", 1, "{}")).unwrap();
        assert_eq!(p.feed(Side::Shadow, ev("a", 2, "{}")), Ok(Fed::Duplicate), "again while pending");
        p.feed(Side::Legacy, ev("a", 1, "{}")).unwrap();
        assert_eq!(p.feed(Side::Shadow, ev("a", 3, "{}")), Ok(Fed::Duplicate), "again after pairing");
        assert_eq!(p.feed(Side::Legacy, ev("a", 3, "{}")), Ok(Fed::Duplicate));
        p.finish();
        assert_eq!((p.tally.matched, p.tally.duplicates, p.tally.records), (1, [1, 2], [2, 3]));
        assert!(p.tally.ok(), "duplicates alone do not fail a run");
    }

    #[test]
    fn events_before_the_window_only_help_pairing() {
        let mut p = pairer();
        let old = |id: &str| Event { in_window: false, ..ev(id, 1, "{}") };
        p.feed(Side::Legacy, old("edge")).unwrap();
        p.feed(Side::Legacy, old("both-old")).unwrap();
        p.feed(Side::Shadow, old("both-old")).unwrap();
        p.feed(Side::Shadow, old("old-orphan")).unwrap();
        assert_eq!(p.feed(Side::Shadow, ev("edge", 2, "{}")), Ok(Fed::Matched));
        p.finish();
        assert_eq!((p.tally.matched, p.tally.only_count, p.tally.records), (1, [0, 0], [1, 1]));
        assert!(p.tally.ok());
    }

    #[test]
    fn lists_are_capped_counts_are_not_and_pending_is_bounded() {
        let mut p = Pairer::new(Ignore::default(), 2, 5);
        for i in 0..5 {
            p.feed(Side::Legacy, ev(&format!("l{i}"), i, "{}")).unwrap();
        }
        assert_eq!(p.feed(Side::Shadow, ev("s", 0, "{}")), Err(TooManyPending(5)));
        assert_eq!(p.feed(Side::Shadow, ev("l0", 0, "{}")), Ok(Fed::Matched), "a pair still fits");
        p.finish();
        assert_eq!((p.tally.only[0].len(), p.tally.only_count[0]), (2, 4));
    }

    #[test]
    fn expiry_gives_up_on_old_events_and_forgetting_bounds_paired_ids() {
        let mut p = pairer();
        p.feed(Side::Legacy, ev("a", 100, "{}")).unwrap();
        p.feed(Side::Legacy, ev("b", 200, "{}")).unwrap();
        p.feed(Side::Shadow, ev("c", 100, "{}")).unwrap();
        assert_eq!(p.expire(Side::Legacy, 150), 1);
        assert_eq!((p.pending(Side::Legacy), p.pending(Side::Shadow)), (1, 1));
        assert_eq!(p.tally.only, [vec!["a".to_string()], vec![]]);
        p.feed(Side::Shadow, ev("b", 210, "{}")).unwrap();
        assert_eq!(p.feed(Side::Legacy, ev("b", 200, "{}")), Ok(Fed::Duplicate));
        p.forget_paired_before(300);
        assert_eq!(p.feed(Side::Legacy, ev("b", 200, "{}")), Ok(Fed::Pending), "forgotten");
    }

    #[test]
    fn median_of_an_even_count_is_the_lower_one() {
        let mut l = Lags::default();
        assert_eq!(l.p50(), None);
        for ms in [40, 10, 30, 20] {
            l.add(ms);
        }
        assert_eq!(l.p50(), Some(20));
        // Timestamps come from the network: extreme ones saturate, never overflow.
        let mut p = pairer();
        p.feed(Side::Legacy, ev("x", i64::MAX, "{}")).unwrap();
        p.feed(Side::Shadow, ev("x", i64::MIN, "{}")).unwrap();
        assert_eq!(p.tally.lags.min, Some(i64::MIN));
    }
}
