//! `--commit-kafka-offsets`: the next offsets stored in PostgreSQL, copied to the consumer
//! group's offsets in Kafka, so lag tools (kafka-consumer-groups, Burrow, a Kafka UI) see how far
//! the inbox is.
//!
//! Invariant: Kafka's copy is written only from offsets PostgreSQL has committed ([`Commits::stored`]
//! is called after the write's commit, and with the offsets read for partitions an assignment
//! hands over, so a takeover's copy does not wait for new records), so it is never ahead of
//! PostgreSQL's by this process; and
//! it is never read: a partition starts at PostgreSQL's offset ([`super::consumer`]), so a Kafka
//! offset that is behind (a commit lost in a crash or a rebalance), or ahead (set by hand), changes
//! nothing but what lag tools show. Hence the commits are asynchronous and their failures only
//! logged.
//!
//! The writer merges each batch's offsets into one pending map (the highest per partition); the
//! consumer thread, which owns the client, sends it at most every [`Commits::EVERY`] and before it
//! gives partitions up in a rebalance. So a fast stream costs one OffsetCommit request per
//! [`Commits::EVERY`], however many batches it commits.

use std::collections::HashMap;
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
    sent_at: Option<Instant>,
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

    /// The pending offsets, when some are waiting and (unless `now_anyway`) the last send is
    /// [`Self::EVERY`] ago; they are taken, so each is sent once.
    fn take(&self, now: Instant, now_anyway: bool) -> Option<HashMap<Part, i64>> {
        let mut st = self.state();
        let due = now_anyway || st.sent_at.is_none_or(|t| now.duration_since(t) >= Self::EVERY);
        if st.pending.is_empty() || !due {
            return None;
        }
        st.sent_at = Some(now);
        Some(std::mem::take(&mut st.pending))
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
        }
    }

    /// librdkafka's answer to a commit (its commit callback).
    pub fn answered(&self, result: KafkaResult<()>) {
        if let Err(e) = result {
            self.failed(&e);
        }
    }

    /// A failed commit: nothing depends on it (the next one carries newer offsets), so a debug
    /// line, and a warning at most every minute for an operator whose lag tools see nothing.
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
    fn off_means_nothing_is_kept() {
        let c = Commits::new(false);
        c.stored(&HashMap::from([(part(0), 10)]));
        assert_eq!(c.take(Instant::now(), true), None);
    }
}
