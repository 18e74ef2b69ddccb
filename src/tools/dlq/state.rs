//! Replay progress of `outboxd dlq replay`: which DLQ offsets were republished and acked.
//!
//! `<state-dir>/<dlq-topic>.offsets.json`, e.g.
//! `{"version":1,"dlq_topic":"outboxd.dlq","replayed":{"0":[[0,4],[7,7]]}}`: per DLQ partition,
//! the inclusive offset ranges of records republished *and acked* (for a chunked copy, every chunk
//! record it was joined from). Only those are marked, so records skipped by a filter, without
//! destination or whose delivery failed stay replayable by a later run (a per-partition "next
//! offset" could not say "3 done, 2 filtered out"). The file is replaced atomically (temp, fsync,
//! rename); a crash between an ack and the rename republishes that batch again (at-least-once).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Definite;

/// A set of offsets kept as disjoint inclusive ranges (start → end).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct OffsetSet(BTreeMap<i64, i64>);

impl OffsetSet {
    fn contains(&self, o: i64) -> bool {
        self.0.range(..=o).next_back().is_some_and(|(_, &end)| end >= o)
    }

    fn insert(&mut self, o: i64) {
        if self.contains(o) {
            return;
        }
        let mut start = o;
        let mut end = o;
        if let Some((&s, &e)) = self.0.range(..o).next_back() {
            if e.checked_add(1) == Some(o) {
                start = s;
            }
        }
        if let Some(next_end) = o.checked_add(1).and_then(|n| self.0.remove(&n)) {
            end = next_end;
        }
        self.0.insert(start, end);
    }

    fn ranges(&self) -> Vec<(i64, i64)> {
        self.0.iter().map(|(&s, &e)| (s, e)).collect()
    }

    fn from_ranges(ranges: &[(i64, i64)]) -> Option<OffsetSet> {
        let mut set = OffsetSet::default();
        for &(s, e) in ranges {
            if s > e || s < 0 {
                return None;
            }
            // Ranges are few and small to rebuild; merge by inserting the endpoints' span.
            set.insert_range(s, e);
        }
        Some(set)
    }

    fn insert_range(&mut self, s: i64, e: i64) {
        // Absorb every range overlapping or adjacent to [s, e].
        let mut start = s;
        let mut end = e;
        let touching: Vec<i64> = self
            .0
            .range(..=e.saturating_add(1))
            .filter(|(_, &re)| re >= s.saturating_sub(1))
            .map(|(&rs, _)| rs)
            .collect();
        for rs in touching {
            let re = self.0.remove(&rs).unwrap_or(rs);
            start = start.min(rs);
            end = end.max(re);
        }
        self.0.insert(start, end);
    }
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    dlq_topic: String,
    /// partition → inclusive offset ranges republished and acknowledged.
    replayed: BTreeMap<i32, Vec<(i64, i64)>>,
}

pub(super) struct State {
    /// `None`: kept in memory only ([`State::unsaved`]).
    path: Option<PathBuf>,
    topic: String,
    replayed: BTreeMap<i32, OffsetSet>,
}

impl State {
    fn path_for(dir: &Path, topic: &str) -> PathBuf {
        dir.join(format!("{topic}.offsets.json"))
    }

    pub(super) fn load(dir: &Path, topic: &str) -> Result<State, Definite> {
        let path = Self::path_for(dir, topic);
        let mut state = State { path: Some(path.clone()), topic: topic.to_owned(), replayed: BTreeMap::new() };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(state),
            Err(e) => return Err(Definite::Setup(format!("cannot read replay state {}: {e}", path.display()))),
        };
        let bad = |why: String| {
            Definite::Config(format!(
                "replay state {} is unusable ({why}); fix or remove it (removing it allows republishing everything)",
                path.display()
            ))
        };
        let file: StateFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if file.version != 1 {
            return Err(bad(format!("version {} is not 1", file.version)));
        }
        if file.dlq_topic != topic {
            return Err(bad(format!("it belongs to DLQ topic {:?}, not {topic:?}", file.dlq_topic)));
        }
        for (p, ranges) in file.replayed {
            let set =
                OffsetSet::from_ranges(&ranges).ok_or_else(|| bad(format!("bad offset range in partition {p}")))?;
            state.replayed.insert(p, set);
        }
        Ok(state)
    }

    /// Progress of one run, never saved: for a DLQ that keeps its own (an SQS queue, whose
    /// replayed copies are deleted).
    pub(super) fn unsaved(topic: &str) -> State {
        State { path: None, topic: topic.to_owned(), replayed: BTreeMap::new() }
    }

    pub(super) fn contains(&self, partition: i32, offset: i64) -> bool {
        self.replayed.get(&partition).is_some_and(|s| s.contains(offset))
    }

    pub(super) fn insert(&mut self, partition: i32, offset: i64) {
        self.replayed.entry(partition).or_default().insert(offset);
    }

    /// Write temp, fsync, rename over, fsync the directory.
    pub(super) fn save(&self) -> Result<(), Definite> {
        let Some(path) = &self.path else { return Ok(()) };
        let fail = |what: &str, e: std::io::Error| {
            Definite::Setup(format!(
                "cannot save replay state {} ({what}): {e}; records replayed in this batch may be republished by the next run",
                path.display()
            ))
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| fail("create directory", e))?;
        let file = StateFile {
            version: 1,
            dlq_topic: self.topic.clone(),
            replayed: self.replayed.iter().map(|(&p, s)| (p, s.ranges())).collect(),
        };
        let mut text =
            serde_json::to_string(&file).map_err(|e| Definite::Bug(format!("serialising replay state: {e}")))?;
        text.push('\n');
        let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
        {
            let mut f = std::fs::File::create(&tmp).map_err(|e| fail("create temp file", e))?;
            f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(|e| fail("write temp file", e))?;
        }
        std::fs::rename(&tmp, path).map_err(|e| fail("rename", e))?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_set_merges_neighbours() {
        let mut s = OffsetSet::default();
        for o in [5, 3, 4, 10, 0, 11, 9] {
            s.insert(o);
        }
        assert_eq!(s.ranges(), vec![(0, 0), (3, 5), (9, 11)]);
        assert!(s.contains(4) && s.contains(11) && !s.contains(6) && !s.contains(1));
        s.insert(1);
        s.insert(2);
        assert_eq!(s.ranges(), vec![(0, 5), (9, 11)]);
        s.insert(4);
        assert_eq!(s.ranges(), vec![(0, 5), (9, 11)]);
    }

    #[test]
    fn offset_set_from_ranges_normalises_and_rejects_bad() {
        let s = OffsetSet::from_ranges(&[(5, 7), (0, 2), (3, 4), (10, 10)]).unwrap();
        assert_eq!(s.ranges(), vec![(0, 7), (10, 10)]);
        assert!(OffsetSet::from_ranges(&[(4, 3)]).is_none());
        assert!(OffsetSet::from_ranges(&[(-1, 3)]).is_none());
    }

    #[test]
    fn state_round_trips_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("nested");
        let mut st = State::load(&sub, "outboxd.dlq").unwrap();
        assert!(!st.contains(0, 0));
        st.insert(0, 0);
        st.insert(0, 1);
        st.insert(2, 7);
        st.save().unwrap();
        let text = std::fs::read_to_string(sub.join("outboxd.dlq.offsets.json")).unwrap();
        assert_eq!(text.trim(), r#"{"version":1,"dlq_topic":"outboxd.dlq","replayed":{"0":[[0,1]],"2":[[7,7]]}}"#);
        let again = State::load(&sub, "outboxd.dlq").unwrap();
        assert!(again.contains(0, 1) && again.contains(2, 7) && !again.contains(2, 6));
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1, "no temp file left");
        std::fs::write(sub.join("other.offsets.json"), text).unwrap();
        assert!(State::load(&sub, "other").is_err());
    }
}
