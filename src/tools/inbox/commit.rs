//! `--commit-kafka-offsets`: the next offsets stored in PostgreSQL, copied to the consumer
//! group's offsets in Kafka, so lag tools (kafka-consumer-groups, Burrow, a Kafka UI) see how far
//! the inbox is.
//!
//! Invariant: Kafka's copy is written only from offsets PostgreSQL has committed ([`Commits::stored`]
//! is called after the write's commit, and with the offsets read for partitions an assignment
//! hands over, so a takeover's copy does not wait for new records), so it is never ahead of
//! PostgreSQL's by this process; and
//! it is never read for a partition PostgreSQL has an offset of: such a partition starts at
//! PostgreSQL's offset ([`super::consumer`]), so a Kafka offset that is behind (a commit lost in a
//! crash or a rebalance), or ahead (set by hand), changes nothing but what lag tools show. (Only
//! `--start-from committed` reads the group's offset, for a partition with none in PostgreSQL,
//! and stores it there first; since nothing is copied to Kafka before PostgreSQL has an offset,
//! the two never disagree about such a partition.) Hence the commits are asynchronous; a failed one (a
//! rebalance in progress, an old generation) is merged back into the pending map, for the
//! partitions still assigned here ([`Commits::requeue`]), so the next turn sends it again: with no
//! traffic after a takeover, nothing else would carry those offsets to Kafka. It came from
//! PostgreSQL, so sending it again is never ahead of PostgreSQL either.
//!
//! The writer merges each batch's offsets into one pending map (the highest per partition); the
//! consumer thread, which owns the client, sends it at most every [`Commits::EVERY`] and before it
//! gives partitions up in a rebalance. So a fast stream costs one OffsetCommit request per
//! [`Commits::EVERY`], however many batches it commits.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::Part;

#[derive(Default)]
struct State {
    /// Per partition, the highest next offset stored and not yet sent to Kafka.
    pending: HashMap<Part, i64>,
    /// The partitions assigned here now (kept by the rebalance callback): a failed commit is
    /// sent again only for these; one given up belongs to its new owner's copy.
    assigned: HashSet<Part>,
    /// Per partition, the highest offset sent: an older one's failure, answered after a newer one
    /// went, is not sent again (it would move Kafka's copy back).
    sent: HashMap<Part, i64>,
    sent_at: Option<Instant>,
    /// After a failure, nothing is sent before this (unless a revocation or the end asks).
    hold_until: Option<Instant>,
    warned_at: Option<Instant>,
}

/// The offsets waiting to be committed to Kafka, shared by the writer and the consumer thread.
pub struct Commits {
    enabled: bool,
    state: Mutex<State>,
}

impl Commits {
    /// The shortest time between two commits.
    pub const EVERY: Duration = Duration::from_millis(200);
    /// The wait after a failed commit before it is sent again.
    const RETRY: Duration = Duration::from_secs(1);
    /// The shortest time between two warnings about failed commits.
    const WARN_EVERY: Duration = Duration::from_secs(60);

    pub fn new(enabled: bool) -> Commits {
        Commits { enabled, state: Mutex::new(State::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer: `next` (per partition, the next offset) is committed in PostgreSQL.
    pub fn stored(&self, next: &HashMap<Part, i64>) {
        if !self.enabled || next.is_empty() {
            return;
        }
        let mut st = self.state();
        for (part, n) in next {
            let e = st.pending.entry(part.clone()).or_insert(*n);
            *e = (*e).max(*n);
        }
    }

    /// The consumer thread: `parts` are assigned here now.
    pub fn assigned(&self, parts: &[Part]) {
        self.state().assigned.extend(parts.iter().cloned());
    }

    /// The consumer thread: `parts` are given up (after their last copy was sent); a failed
    /// commit of theirs is not sent again, nor anything still pending for them.
    pub fn revoked(&self, parts: &[Part]) {
        let mut st = self.state();
        for part in parts {
            st.assigned.remove(part);
            st.pending.remove(part);
            st.sent.remove(part);
        }
    }

    /// Offsets whose commit failed, back into the pending map (the highest per partition, so a
    /// newer offset stored meanwhile wins), only for partitions still assigned here; nothing is
    /// sent before [`Self::RETRY`].
    fn requeue(&self, failed: impl IntoIterator<Item = (Part, i64)>, now: Instant) {
        if !self.enabled {
            return;
        }
        let mut st = self.state();
        let mut any = false;
        for (part, n) in failed {
            if !st.assigned.contains(&part) || st.sent.get(&part).is_some_and(|s| *s > n) {
                continue;
            }
            let e = st.pending.entry(part).or_insert(n);
            *e = (*e).max(n);
            any = true;
        }
        if any {
            st.hold_until = Some(now + Self::RETRY);
        }
    }

    /// The pending offsets, when some are waiting and (unless `now_anyway`) the last send is
    /// [`Self::EVERY`] ago; they are taken, so each is sent once.
    fn take(&self, now: Instant, now_anyway: bool) -> Option<HashMap<Part, i64>> {
        let mut st = self.state();
        let due = now_anyway
            || (st.sent_at.is_none_or(|t| now.duration_since(t) >= Self::EVERY)
                && st.hold_until.is_none_or(|t| now >= t));
        if st.pending.is_empty() || !due {
            return None;
        }
        st.sent_at = Some(now);
        let offsets = std::mem::take(&mut st.pending);
        for (part, n) in &offsets {
            let e = st.sent.entry(part.clone()).or_insert(*n);
            *e = (*e).max(*n);
        }
        Some(offsets)
    }

    /// The consumer thread, each turn (`now_anyway`: before a revocation, and at the end, where
    /// closing the client waits for the commits in flight): send what is due.
    pub fn send<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>, now_anyway: bool) {
        let Some(offsets) = self.take(Instant::now(), now_anyway) else { return };
        let mut tpl = TopicPartitionList::with_capacity(offsets.len());
        for ((topic, p), n) in &offsets {
            if let Err(e) = tpl.add_partition_offset(topic, *p, Offset::Offset(*n)) {
                tracing::debug!(%topic, partition = p, "cannot list the offset to commit: {e}");
            }
        }
        if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
            self.failed(&e);
            self.requeue(offsets, Instant::now());
        }
    }

    /// librdkafka's answer to a commit (its commit callback): on a failure, the partitions that
    /// failed (all of them when the whole request did) go back into the pending map.
    pub fn answered(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        let whole = result.as_ref().err();
        let failed: Vec<(Part, i64)> = offsets
            .elements()
            .iter()
            .filter(|e| whole.is_some() || e.error().is_err())
            .filter_map(|e| match e.offset() {
                Offset::Offset(n) => Some(((e.topic().to_owned(), e.partition()), n)),
                _ => None,
            })
            .collect();
        if failed.is_empty() {
            return;
        }
        match whole {
            Some(e) => self.failed(e),
            None => {
                if let Some(Err(e)) = offsets.elements().iter().map(|e| e.error()).find(Result::is_err) {
                    self.failed(&e);
                }
            }
        }
        self.requeue(failed, Instant::now());
    }

    /// A failed commit: it is sent again ([`Self::requeue`]), so a debug line, and a warning at
    /// most every minute for an operator whose lag tools see old offsets meanwhile.
    fn failed(&self, e: &rdkafka::error::KafkaError) {
        let mut st = self.state();
        let now = Instant::now();
        if st.warned_at.is_none_or(|t| now.duration_since(t) >= Self::WARN_EVERY) {
            st.warned_at = Some(now);
            tracing::warn!(
                "committing the stored offsets to the group in Kafka failed: {e}; lag tools may show old offsets \
                 (the inbox reads its offsets from PostgreSQL only; --commit-kafka-offsets false stops these commits)"
            );
        } else {
            tracing::debug!("committing the stored offsets to Kafka failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(p: i32) -> Part {
        ("t".to_owned(), p)
    }

    #[test]
    fn batches_merge_to_the_highest_offset_and_are_sent_at_most_every_200_ms() {
        let c = Commits::new(true);
        let t0 = Instant::now();
        assert_eq!(c.take(t0, false), None, "nothing stored");
        c.stored(&HashMap::from([(part(0), 10), (part(1), 5)]));
        c.stored(&HashMap::from([(part(0), 12)]));
        c.stored(&HashMap::from([(part(0), 11)]));
        assert_eq!(c.take(t0, false), Some(HashMap::from([(part(0), 12), (part(1), 5)])));
        c.stored(&HashMap::from([(part(1), 6)]));
        assert_eq!(c.take(t0 + Duration::from_millis(100), false), None, "too soon");
        assert_eq!(c.take(t0 + Duration::from_millis(100), true), Some(HashMap::from([(part(1), 6)])), "a revocation");
        c.stored(&HashMap::from([(part(1), 7)]));
        assert_eq!(c.take(t0 + Duration::from_millis(350), false), Some(HashMap::from([(part(1), 7)])));
    }

    #[test]
    fn a_failed_commit_is_sent_again_for_partitions_still_assigned_only() {
        let c = Commits::new(true);
        let t0 = Instant::now();
        c.assigned(&[part(0), part(1), part(2)]);
        // A takeover's copy, sent once, and refused (a rebalance in progress): no traffic follows.
        c.stored(&HashMap::from([(part(0), 10), (part(1), 5), (part(2), 7)]));
        let sent = c.take(t0, false).unwrap();
        c.revoked(&[part(2)]);
        c.requeue(sent, t0);
        assert_eq!(c.take(t0 + Duration::from_millis(500), false), None, "held back a second after a failure");
        assert_eq!(
            c.take(t0 + Duration::from_secs(1), false),
            Some(HashMap::from([(part(0), 10), (part(1), 5)])),
            "sent again, but not for the partition given up"
        );
        // A newer offset stored meanwhile wins over the failed one.
        c.stored(&HashMap::from([(part(0), 12)]));
        c.requeue([(part(0), 10)], t0 + Duration::from_secs(2));
        assert_eq!(c.take(t0 + Duration::from_secs(4), false), Some(HashMap::from([(part(0), 12)])));
        // An older commit's failure answered after a newer one went is not sent again (it would
        // move Kafka's copy back, and stay there with no traffic).
        c.requeue([(part(0), 11)], t0 + Duration::from_secs(4));
        assert_eq!(c.take(t0 + Duration::from_secs(9), false), None);
        // A revocation sends at once, hold or not.
        c.requeue([(part(0), 12)], t0 + Duration::from_secs(9));
        assert_eq!(c.take(t0 + Duration::from_secs(9), true), Some(HashMap::from([(part(0), 12)])));
    }

    #[test]
    fn a_whole_failed_answer_requeues_every_listed_offset() {
        let c = Commits::new(true);
        c.assigned(&[part(0), part(1)]);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("t", 0, Offset::Offset(10)).unwrap();
        tpl.add_partition_offset("t", 1, Offset::Offset(4)).unwrap();
        let err = rdkafka::error::KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::IllegalGeneration);
        c.answered(Ok(()), &tpl);
        assert_eq!(c.take(Instant::now(), true), None, "a commit that succeeded is not sent again");
        c.answered(Err(err), &tpl);
        assert_eq!(c.take(Instant::now(), true), Some(HashMap::from([(part(0), 10), (part(1), 4)])));
    }

    #[test]
    fn off_means_nothing_is_kept() {
        let c = Commits::new(false);
        c.stored(&HashMap::from([(part(0), 10)]));
        assert_eq!(c.take(Instant::now(), true), None);
    }
}
