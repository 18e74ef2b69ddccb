//! Topics the Kafka sink writes to: which ones are known to exist ([`TopicCache`], a bounded
//! LRU), whether the cluster has one ([`topic_exists`]), and waiting until a new topic's
//! partitions answer before its first records go ([`partitions_ready`]).
//!
//! # Invariants
//! * The cache never holds more than its cap: a miss past it forgets the least recently used
//!   name, which costs one more CreateTopics (answered "exists"), never a lost record.
//! * Every cluster call here is blocking in librdkafka, so it runs off the runtime's thread.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, Producer};

use super::events::DeliveryContext;

/// Topics remembered as existing. Beyond it the least recently used is forgotten.
pub const TOPIC_CACHE: usize = 10_000;
/// How long a new topic's partitions may take to answer before records go anyway.
const PARTITIONS_READY_WAIT: Duration = Duration::from_secs(30);

/// Least-recently-used set of topic names known to exist, each with a value of its own (the
/// sink's: librdkafka's topic object, [`super::produce::TopicHandle`]). Looked up per record:
/// foldhash, not SipHash (the names are the routes' own).
#[derive(Debug)]
pub struct TopicCache<V = ()> {
    cap: usize,
    clock: u64,
    used: HashMap<String, (u64, V), foldhash::fast::RandomState>,
}

impl<V> TopicCache<V> {
    pub fn new(cap: usize) -> Self {
        TopicCache { cap: cap.max(1), clock: 0, used: HashMap::default() }
    }

    /// `topic`'s value if it is known; marks it used.
    pub fn touch(&mut self, topic: &str) -> Option<&V> {
        self.clock += 1;
        match self.used.get_mut(topic) {
            Some((t, v)) => {
                *t = self.clock;
                Some(v)
            }
            None => None,
        }
    }

    pub fn insert(&mut self, topic: String, value: V) {
        if self.used.len() >= self.cap && !self.used.contains_key(&topic) {
            // Linear, but only on a miss past the cap, which already costs an admin round trip.
            if let Some(oldest) = self.used.iter().min_by_key(|(_, (t, _))| *t).map(|(k, _)| k.clone()) {
                self.used.remove(&oldest);
            }
        }
        self.clock += 1;
        self.used.insert(topic, (self.clock, value));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.used.len()
    }
}

/// Whether the cluster knows `topic` with at least one partition. A blocking client call, so off
/// the runtime's thread.
pub(super) async fn topic_exists(admin: Arc<AdminClient<DefaultClientContext>>, topic: String) -> bool {
    tokio::task::spawn_blocking(move || {
        admin
            .inner()
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .map(|m| m.topics().iter().any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()))
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}

/// Wait until the leader of every partition of `topic` answers for it (ListOffsets), at most
/// [`PARTITIONS_READY_WAIT`]. Before that, the first records to a just-created partition can be
/// lost without an error: the broker refuses a first produce request with NOT_LEADER while it has
/// not applied the partition yet, accepts the next one (a later sequence, with no producer state
/// to check it against), and the retried first request then looks already written (KAFKA-15591,
/// fixed in Kafka 4.5; seen here as 1497 of 1500 records acked and stored). Past the wait the
/// records go anyway, with a warning: the probe is a guard, not a gate.
pub(super) async fn partitions_ready(producer: Arc<BaseProducer<DeliveryContext>>, topic: String) {
    let started = std::time::Instant::now();
    let ready = tokio::task::spawn_blocking(move || {
        let client = producer.client();
        while started.elapsed() < PARTITIONS_READY_WAIT {
            let partitions = client
                .fetch_metadata(Some(&topic), Duration::from_secs(5))
                .ok()
                .and_then(|m| {
                    m.topics().iter().find(|t| t.name() == topic && t.error().is_none()).map(|t| t.partitions().len())
                })
                .unwrap_or(0);
            let answered = partitions > 0
                && (0..partitions as i32).all(|p| client.fetch_watermarks(&topic, p, Duration::from_secs(5)).is_ok());
            if answered {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(topic)
    })
    .await;
    if let Ok(Err(topic)) = ready {
        tracing::warn!(
            topic,
            secs = PARTITIONS_READY_WAIT.as_secs(),
            "a partition leader of the topic has not answered for it yet; producing anyway"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_cache_forgets_the_least_recently_used() {
        let mut c = TopicCache::new(3);
        for t in ["a", "b", "c"] {
            c.insert(t.into(), ());
        }
        assert!(c.touch("a").is_some());
        c.insert("d".into(), ());
        assert_eq!(c.len(), 3);
        assert!(c.touch("b").is_none(), "b was least recently used");
        assert!(c.touch("a").is_some() && c.touch("c").is_some() && c.touch("d").is_some());
        for i in 0..10_000 {
            c.insert(format!("t{i}"), ());
        }
        assert_eq!(c.len(), 3, "bounded whatever the number of distinct topics");
    }
}
