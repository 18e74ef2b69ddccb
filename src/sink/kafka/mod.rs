//! The Kafka sink: librdkafka's idempotent producer, with delivery handles riding as opaques.
//!
//! Each record's [`Delivery`] waits in the client's slab of records in flight, under the slot
//! librdkafka carries as the message's opaque ([`sent`]); the delivery report resolves it, on the
//! runtime's thread ([`events`]). So an ack means
//! the broker accepted the record under our `acks` setting, and nothing else does.
//!
//! Defaults, each overridable with `--kafka-property`: `enable.idempotence=true` and `acks=all` so
//! retries neither duplicate nor reorder within a partition; `message.timeout.ms=0` (retry forever)
//! so a broker outage stalls the pipeline instead of failing records; `partitioner=murmur2_random`
//! so keys land where Kafka's Java producer (Connect, Debezium) puts them. Topics are created through
//! the admin API before their first record, since many clusters disable auto-creation, and their
//! records wait until every partition's leader answers for it ([`topics::partitions_ready`]: Kafka before
//! 4.5 can lose the first records sent to a partition it has not applied yet). The clients
//! themselves are built by [`client`], like every other Kafka client of outboxd. Under
//! `--delivery exactly-once` the producer is transactional ([`txn`]).
//!
//! Errors that are about one record for good (too large, invalid topic, policy violation) come back
//! as rejections with the record's parts, for the bad-event policy. Everything else fails the
//! delivery, which stops the pipeline without advancing.
//!
//! `send` never waits. A record whose topic is still being created (the admin request runs as its
//! own task), or that librdkafka's queue has no room for, is held in order, and the sink reports
//! [`Sink::blocked`]; the replication loop then stops reading WAL and polls [`Sink::unblock`] as one
//! arm of its `select!`, so status updates, acks and shutdown keep their priority. `unblock` is
//! cancel-safe: held records live in the sink, not in the future. The known-topic cache is an LRU
//! of [`TOPIC_CACHE`] names; an evicted topic costs one more CreateTopics (answered "exists").
//!
//! Broker health: a delivery success marks Kafka up; a background check every few seconds marks it
//! up or down, so a stalled broker flips `/readyz` within seconds. The check needs both a metadata
//! answer and delivery progress: records outstanding with no ack for [`DELIVERY_STALL`] mean down,
//! even while some broker answers metadata (a cluster below `min.insync.replicas` does exactly
//! that: it answers, and refuses every write with NOT_ENOUGH_REPLICAS, which librdkafka retries).
//! Once down with records outstanding, only an ack marks it up again, so `/readyz` does not flap.

pub mod client;
mod condemned;
pub mod config;
pub mod dlq;
mod events;
mod produce;
pub mod reader;
mod sent;
mod takeover;
mod topics;
pub mod txn;
mod written;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer};

use super::delivery::Delivery;
use super::link::Link;
use super::{Boundary, Sink, SinkError};
use crate::debezium_offset::DebeziumOffset;
use crate::error::Error;
use crate::error::{Definite, Transient};
use crate::health::Health;
use crate::lineage::Lineage;
use crate::router::Record;
use client::{Retry, TopicError};
use config::KafkaConfig;
use events::{rejection_code, DeliveryContext};
use produce::{produce, NoHandle, Parts, TopicHandle};
use sent::Sent;
use topics::{partitions_ready, topic_exists};
pub use topics::{TopicCache, TOPIC_CACHE};

const METADATA_CHECK_EVERY: Duration = Duration::from_secs(3);
/// Records outstanding this long without a single ack: Kafka counts as down.
const DELIVERY_STALL: Duration = Duration::from_secs(10);
/// How long a full producer queue is left to drain before the next try.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(5);

/// A record `send` could not hand to librdkafka yet.
struct Held {
    record: Record,
    delivery: Delivery,
    /// The topic's metadata was refreshed for this record once already (an unknown partition
    /// may only be librdkafka's stale view after partitions were added).
    refreshed: bool,
}

/// A topic's CreateTopics, running as its own task so the loop never waits on it.
struct Creating {
    topic: String,
    task: tokio::task::JoinHandle<Result<bool, TopicError>>,
}

pub struct KafkaSink {
    producer: Arc<BaseProducer<DeliveryContext>>,
    /// Serves the delivery reports; aborted on drop. Should it end by itself, `failure` fires.
    reports: tokio::task::AbortHandle,
    failure: crate::task::Failure,
    admin: Arc<AdminClient<DefaultClientContext>>,
    properties: Arc<Vec<(String, String)>>,
    /// Topics known to exist, each with librdkafka's object for it ([`produce`]).
    known_topics: TopicCache<TopicHandle>,
    partitions: i32,
    replication: i32,
    max_message_bytes: usize,
    stop_checks: Arc<AtomicBool>,
    /// Records waiting for their topic or for queue space, in send order.
    held: VecDeque<Held>,
    creating: Option<Creating>,
    /// When a full queue may be tried again; kept here, not in `unblock`'s future, so the loop's
    /// other arms (acks arrive often) cannot keep restarting the wait.
    retry_at: Option<tokio::time::Instant>,
    /// `--delivery exactly-once`: the transactions ([`txn`]).
    txns: Option<Box<(txn::Txns, crate::metrics::TxnMetrics)>>,
    /// What built this sink, to build it again after the producer was fenced.
    built: Built,
}

#[derive(Clone)]
struct Built {
    cfg: KafkaConfig,
    max_in_flight: usize,
    max_in_flight_bytes: usize,
    health: Arc<Health>,
}

impl KafkaSink {
    pub fn new(
        cfg: &KafkaConfig,
        max_in_flight: usize,
        max_in_flight_bytes: usize,
        health: Arc<Health>,
    ) -> Result<KafkaSink, Definite> {
        KafkaSink::with_failure(cfg, max_in_flight, max_in_flight_bytes, health, crate::task::Failure::default())
    }

    /// [`KafkaSink::new`], reporting the death of its tasks through `failure` (a rebuilt sink
    /// keeps the one the loop already waits on).
    fn with_failure(
        cfg: &KafkaConfig,
        max_in_flight: usize,
        max_in_flight_bytes: usize,
        health: Arc<Health>,
        failure: crate::task::Failure,
    ) -> Result<KafkaSink, Definite> {
        let txns = cfg.transactions.clone().map(|t| txn::Txns::new(t, max_in_flight, max_in_flight_bytes));
        let mut defaults = vec![
            ("enable.idempotence", "true".into()),
            ("acks", "all".into()),
            ("message.timeout.ms", "0".into()),
            ("linger.ms", "5".into()),
            ("queue.buffering.max.messages", (max_in_flight.max(1) * 2).max(100_000).to_string()),
            // Room for twice our own byte budget (librdkafka's default, 1 GiB, at least), so
            // `--max-in-flight-bytes` stops reading WAL before librdkafka's queue is full.
            ("queue.buffering.max.kbytes", (max_in_flight_bytes / 512).clamp(1_048_576, 2_097_151).to_string()),
        ];
        if let Some(t) = &txns {
            defaults.extend(t.producer_defaults());
        }
        let c = client::producer_config(cfg, "outboxd", &defaults);
        let max_message_bytes = cfg
            .properties
            .iter()
            .rev()
            .find(|(k, _)| k == "message.max.bytes")
            .map(|(_, v)| v.parse::<usize>())
            .transpose()
            .map_err(|_| Definite::Config("--kafka-property message.max.bytes must be a number of bytes".into()))?
            .unwrap_or(1_000_000);
        let link = Link::new("kafka", "Kafka", health.clone());
        link.set(true, "");
        let context = DeliveryContext {
            link,
            properties: cfg.properties.clone(),
            acks: AtomicU64::new(0),
            txn: txns.as_ref().map(|t| t.written.clone()),
            in_flight: Default::default(),
        };
        let built = Built { cfg: cfg.clone(), max_in_flight, max_in_flight_bytes, health: health.clone() };
        let producer: BaseProducer<DeliveryContext> = client::create(&c, context, "producer", cfg)?;
        let admin =
            client::create(&client::admin_config(cfg, "outboxd-admin"), DefaultClientContext, "admin client", cfg)?;
        let producer = Arc::new(producer);
        let reports = events::spawn(producer.clone())
            .map_err(|e| Definite::Sink(format!("could not set up Kafka delivery reports: {e}")))?;
        let stop_checks = Arc::new(AtomicBool::new(false));
        spawn_metadata_checks(producer.clone(), stop_checks.clone());
        Ok(KafkaSink {
            producer,
            reports: failure.watch("the Kafka delivery-report task (no delivery would be resolved)", reports),
            failure,
            admin: Arc::new(admin),
            properties: Arc::new(cfg.properties.clone()),
            known_topics: TopicCache::new(TOPIC_CACHE),
            partitions: cfg.topic_partitions,
            replication: cfg.topic_replication_factor,
            max_message_bytes,
            stop_checks,
            held: VecDeque::new(),
            creating: None,
            retry_at: None,
            txns: txns.map(|t| Box::new((t, crate::metrics::TxnMetrics::new()))),
            built,
        })
    }

    /// Start creating `topic` in the background (retrying while the broker is unreachable).
    fn start_creating(&mut self, topic: &str) {
        let (admin, props) = (self.admin.clone(), self.properties.clone());
        let (name, partitions, replication) = (topic.to_owned(), self.partitions, self.replication);
        let producer = self.producer.clone();
        let task = tokio::spawn(async move {
            let r = client::ensure_topic(&admin, &name, partitions, replication, Retry::Forever, &props).await;
            let r = match r {
                // Kafka checks the CREATE permission before existence, so a producer allowed to
                // write only to pre-created topics is refused here: ask the topic's metadata.
                Err(TopicError { refused: Some(_), .. }) if topic_exists(admin, name.clone()).await => Ok(false),
                other => other,
            };
            if r.is_ok() {
                partitions_ready(producer, name).await;
            }
            r
        });
        self.creating = Some(Creating { topic: topic.to_owned(), task });
    }

    /// Refresh librdkafka's view of `topic` in the background (the same slot as topic creation).
    fn start_refreshing(&mut self, topic: &str) {
        let (producer, name) = (self.producer.clone(), topic.to_owned());
        let task = tokio::spawn(async move {
            // The producer's own metadata: that is the view the partition check uses.
            let _ = tokio::task::spawn_blocking(move || {
                producer.client().fetch_metadata(Some(&name), Duration::from_secs(10)).is_ok()
            })
            .await;
            Ok(false)
        });
        self.creating = Some(Creating { topic: topic.to_owned(), task });
    }

    /// Hand `held` to librdkafka now if its topic is known and the queue has room; otherwise give
    /// it back. A refusal of the record comes back as [`SinkError::Rejected`].
    // A rejection hands the whole record back for the bad-event policy; it is the rare path.
    #[allow(clippy::result_large_err)]
    fn try_produce(&mut self, held: Held) -> Result<Option<Held>, SinkError> {
        let Held { record, delivery, refreshed } = held;
        let bytes = delivery.bytes();
        let Some(topic) = self.known_topics.touch(&record.topic) else {
            if self.creating.is_none() {
                self.start_creating(&record.topic);
            }
            return Ok(Some(Held { record, delivery, refreshed }));
        };
        let parts = Parts {
            key: record.key.as_deref(),
            payload: record.payload.as_deref(),
            headers: &record.headers,
            partition: record.partition,
            timestamp: record.timestamp_ms.map_or(0, librdkafka_timestamp),
        };
        let produced = produce(&self.producer, topic, &parts, Sent::Record(delivery))
            .map_err(|(code, back)| (KafkaError::MessageProduction(code), back));
        match produced {
            Ok(()) => {
                if let Some((t, _)) = self.txns.as_deref_mut() {
                    t.produced(bytes);
                }
                Ok(None)
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                let delivery = Sent::given_back(back)?;
                self.retry_at.get_or_insert_with(|| tokio::time::Instant::now() + QUEUE_FULL_WAIT);
                Ok(Some(Held { record, delivery, refreshed }))
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::UnknownPartition), back)) if !refreshed => {
                let delivery = Sent::given_back(back)?;
                // One background task at a time: behind another topic's, this record waits its turn.
                let refreshed = self.creating.is_none();
                if refreshed {
                    self.start_refreshing(&record.topic);
                }
                Ok(Some(Held { record, delivery, refreshed }))
            }
            // Exactly-once: the producer's transaction state refuses the record (the open
            // transaction failed, or the producer was fenced); `Txns` decides what that means.
            Err((KafkaError::MessageProduction(code @ (RDKafkaErrorCode::State | RDKafkaErrorCode::Fatal)), back))
                if self.txns.is_some() =>
            {
                back.into_iter().for_each(Sent::disarm);
                let fatal = self.producer.client().fatal_error().map(|(c, _)| c);
                let (t, _) = self.txns.as_deref_mut().expect("checked above");
                Err(SinkError::Transient(t.produce_refused(code, fatal)))
            }
            Err((e, back)) => {
                let delivery = Sent::given_back(back)?;
                let reason = client::scrub(&e.to_string(), &self.properties);
                Err(match rejection_code(&e) {
                    Some(code) => SinkError::Rejected { code, reason, record: Box::new(record), delivery },
                    None => {
                        delivery.fail(reason.clone());
                        SinkError::Fatal(Definite::Delivery {
                            event_id: record.event_id.to_string(),
                            topic: record.topic.to_string(),
                            reason,
                        })
                    }
                })
            }
        }
    }

    /// An exactly-once commit runs in the background.
    fn committing(&self) -> bool {
        self.txns.as_deref().is_some_and(|(t, _)| t.committing())
    }

    /// Hand over held records in order until one has to wait again.
    #[allow(clippy::result_large_err)]
    fn flush_held(&mut self) -> Result<(), SinkError> {
        while let Some(h) = self.held.pop_front() {
            if let Some(h) = self.try_produce(h)? {
                self.held.push_front(h);
                break;
            }
        }
        Ok(())
    }
}

/// Ask the cluster for metadata every few seconds, and look at delivery progress: both make
/// broker health (see the module doc).
fn spawn_metadata_checks(producer: Arc<BaseProducer<DeliveryContext>>, stop: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new().name("outboxd-kafka-health".into()).spawn(move || {
        // Since when records have been outstanding with no ack (None: nothing outstanding, or an
        // ack since the last look).
        let mut waiting_since: Option<std::time::Instant> = None;
        let mut acks_seen = 0;
        let mut stalled_before = false;
        while !stop.load(Ordering::Relaxed) {
            let ctx = producer.context();
            let acks = ctx.acks.load(Ordering::Relaxed);
            let pending = producer.in_flight_count() > 0;
            waiting_since = match (pending, acks != acks_seen) {
                (false, _) | (true, true) => None,
                (true, false) => Some(waiting_since.unwrap_or_else(std::time::Instant::now)),
            };
            acks_seen = acks;
            let stalled = waiting_since.is_some_and(|since| since.elapsed() >= DELIVERY_STALL);
            if stalled && !stalled_before {
                tracing::warn!(
                    secs = DELIVERY_STALL.as_secs(),
                    "Kafka answers but acknowledges nothing (too few in-sync replicas, or a stalled leader?); not ready"
                );
            }
            stalled_before = stalled;
            // Down with records outstanding: only an ack (the delivery callback) brings it back;
            // a metadata answer alone does not prove that writes go through.
            let ok = !stalled
                && (ctx.link.is_up() || !pending)
                && producer.client().fetch_metadata(None, Duration::from_secs(2)).is_ok();
            ctx.kafka_up(ok, if stalled { "no acknowledgement for a while" } else { "no metadata answer" });
            std::thread::sleep(METADATA_CHECK_EVERY);
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start the Kafka health thread; /readyz will follow deliveries only");
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        self.stop_checks.store(true, Ordering::Relaxed);
        self.reports.abort();
        if let Some(c) = &self.creating {
            c.task.abort();
        }
    }
}

/// The sink's entry in the list of sinks ([`crate::sink::registry`]).
impl crate::sink::registered::Registered for KafkaSink {
    const READABLE_DEAD_LETTERS: bool = true;

    async fn build(cfg: &crate::config::Config, health: Arc<Health>) -> Result<Self, Definite> {
        KafkaSink::new(&cfg.kafka, cfg.max_in_flight, cfg.max_in_flight_bytes, health)
    }

    fn probe(_cfg: &crate::config::Config) -> crate::sink::registered::Probe {
        crate::sink::registered::Probe::Kafka
    }
}

impl Sink for KafkaSink {
    fn send(&mut self, record: Record, mut delivery: Delivery) -> Result<(), SinkError> {
        if let Some((t, _)) = self.txns.as_deref_mut() {
            delivery = t.placed(delivery);
            if let Some((code, reason)) = t.condemned(&delivery) {
                return Err(SinkError::Rejected { code, reason, record: Box::new(record), delivery });
            }
        }
        let held = Held { record, delivery, refreshed: false };
        // Behind held records: keep send order. During an exactly-once commit, the record waits
        // for the next transaction (librdkafka takes none while it commits).
        if !self.held.is_empty() || self.committing() {
            if let Some((t, _)) = self.txns.as_deref_mut().filter(|(t, _)| t.committing()) {
                t.holding();
            }
            self.held.push_back(held);
            return Ok(());
        }
        if let Some(h) = self.try_produce(held)? {
            self.held.push_back(h);
        }
        Ok(())
    }

    fn blocked(&self) -> bool {
        !self.held.is_empty() && !self.committing()
    }

    fn settling(&self) -> bool {
        self.committing()
    }

    async fn unblock(&mut self) -> Result<(), SinkError> {
        if let Some((t, m)) = self.txns.as_deref_mut().filter(|(t, _)| t.committing()) {
            // The commit ends; what was sent meanwhile goes into the next transaction.
            t.settle(&self.producer, m).await?;
            return self.flush_held();
        }
        if let Some(c) = self.creating.as_mut() {
            // Awaiting `&mut JoinHandle` is cancel-safe: the task keeps running if we are dropped.
            let outcome = (&mut c.task).await;
            let topic = std::mem::take(&mut c.topic);
            self.creating = None;
            match outcome {
                Ok(Ok(_)) => match TopicHandle::new(&self.producer, &topic) {
                    Ok(handle) => self.known_topics.insert(topic, handle),
                    // A name that cannot be a C string: every held record bound for it is
                    // refused, one per attempt, as below.
                    Err(NoHandle::Name(reason)) => {
                        if let Some(pos) = self.held.iter().position(|h| h.record.topic == topic) {
                            if let Some(Held { record, delivery, .. }) = self.held.remove(pos) {
                                let (code, record) = ("invalid_topic", Box::new(record));
                                return Err(SinkError::Rejected { code, reason, record, delivery });
                            }
                        }
                    }
                    // The client's failure, not the records': they stay unconfirmed and the
                    // next session sends them again, with a new client.
                    Err(NoHandle::Client(reason)) => {
                        return Err(SinkError::Transient(Transient::SinkClient { reason }))
                    }
                },
                Ok(Err(TopicError { refused: Some(code), error })) => {
                    // Every held record bound for this topic is refused with it; the first one
                    // goes back now, the rest meet the same answer on their own attempt.
                    if let Some(pos) = self.held.iter().position(|h| h.record.topic == topic) {
                        if let Some(Held { record, delivery, .. }) = self.held.remove(pos) {
                            let reason = error.to_string();
                            return Err(SinkError::Rejected { code, reason, record: Box::new(record), delivery });
                        }
                    }
                }
                Ok(Err(TopicError { refused: None, error })) => return Err(SinkError::Fatal(error)),
                Err(e) => return Err(SinkError::Fatal(Definite::Sink(format!("topic creation task ended: {e}")))),
            }
        } else {
            let at = *self.retry_at.get_or_insert_with(|| tokio::time::Instant::now() + QUEUE_FULL_WAIT);
            tokio::time::sleep_until(at).await;
            self.retry_at = None;
        }
        self.flush_held()
    }

    fn discard_held(&mut self) {
        // Handles fail on drop into the ended session's ack queue (closed: dropped there); the topic
        // task may finish.
        self.held.clear();
        self.retry_at = None;
    }

    async fn prepare(&mut self, lineage: &Lineage) -> Result<Option<DebeziumOffset>, Error> {
        if self.txns.as_deref().is_some_and(|(t, _)| t.is_fatal()) {
            // Fenced before: this producer is dead for good; a new one takes the id back.
            let b = self.built.clone();
            tracing::info!("exactly-once: building a new transactional producer (the last one was fenced)");
            let condemned = self.txns.as_deref_mut().map(|(t, _)| t.take_condemned()).unwrap_or_default();
            *self = KafkaSink::with_failure(
                &b.cfg,
                b.max_in_flight,
                b.max_in_flight_bytes,
                b.health,
                self.failure.clone(),
            )?;
            if let Some((t, _)) = self.txns.as_deref_mut() {
                t.keep_condemned(condemned);
            }
        }
        match self.txns.as_deref_mut() {
            Some((t, _)) => t.prepare(&self.producer, &self.admin, &self.built.cfg, lineage).await,
            None => Ok(None),
        }
    }

    async fn already_written(&mut self, records: &[&Record]) -> Result<Vec<bool>, Error> {
        let Some(wanted) = takeover::Wanted::of(records) else {
            return Err(Definite::Setup(
                "--debezium-offsets: outboxd's records carry no id header to match Debezium's by; take over in drop-in mode (--debezium-config)".into(),
            )
            .into());
        };
        let kafka = self.built.cfg.clone();
        tokio::task::spawn_blocking(move || takeover::written(&kafka, &wanted))
            .await
            .map_err(|e| Definite::Bug(format!("the takeover reader ended: {e}")))?
            .map_err(Error::from)
    }

    fn boundary(&mut self, b: Boundary) {
        if let Some((t, _)) = self.txns.as_deref_mut() {
            t.boundary(b);
        }
    }

    fn finishing(&mut self) {
        if let Some((t, _)) = self.txns.as_deref_mut() {
            t.finishing();
        }
    }

    fn due(&self) -> Option<tokio::time::Instant> {
        if !self.held.is_empty() {
            return None;
        }
        self.txns.as_deref().and_then(|(t, _)| t.due())
    }

    async fn commit(&mut self) -> Result<(), SinkError> {
        if !self.held.is_empty() {
            return Ok(());
        }
        match self.txns.as_deref_mut() {
            Some((t, m)) => t.commit(&self.producer, m).await,
            None => Ok(()),
        }
    }

    async fn abandon(&mut self) {
        if let Some((t, m)) = self.txns.as_deref_mut() {
            drop(t.abort(&self.producer, "the session ended".into(), m).await);
        }
    }

    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.max_message_bytes)
    }

    fn failure(&self) -> Option<crate::task::Failure> {
        Some(self.failure.clone())
    }
}

/// The record timestamp handed to librdkafka for `ms` (never negative: the router refuses
/// those). librdkafka reads 0 as "stamp it with the send time" (`rd_kafka_msg_new0`, the same for
/// `rd_kafka_producev`'s `RD_KAFKA_V_TIMESTAMP` and every path rust-rdkafka takes, the
/// transactional producer's too) and has no way to write 0 itself, so an instant inside the first
/// millisecond after the epoch goes out as 1: one millisecond off Debezium's 0, where the send
/// time would be decades off.
pub fn librdkafka_timestamp(ms: i64) -> i64 {
    if ms == 0 {
        1
    } else {
        ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_millisecond_is_not_the_send_time() {
        assert_eq!(librdkafka_timestamp(0), 1);
        assert_eq!(librdkafka_timestamp(1), 1);
        assert_eq!(librdkafka_timestamp(1_796_208_550_123), 1_796_208_550_123);
    }

    #[test]
    fn per_record_broker_errors_are_rejections() {
        let produce = |c| KafkaError::MessageProduction(c);
        assert_eq!(rejection_code(&produce(RDKafkaErrorCode::UnknownPartition)), Some("unknown_partition"));
        assert_eq!(rejection_code(&produce(RDKafkaErrorCode::InvalidTimestamp)), Some("invalid_timestamp"));
        assert_eq!(
            rejection_code(&produce(RDKafkaErrorCode::TopicAuthorizationFailed)),
            Some("topic_authorization_failed")
        );
        assert_eq!(rejection_code(&produce(RDKafkaErrorCode::MessageSizeTooLarge)), Some("too_large"));
        // Retriable trouble is never a bad event: it must hold the frontier, not skip the record.
        for c in [
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::ClusterAuthorizationFailed,
        ] {
            assert_eq!(rejection_code(&produce(c)), None, "{c:?}");
        }
    }
}
