//! The Kafka sink: librdkafka's idempotent producer, with delivery handles riding as opaques.
//!
//! Each record carries its [`Delivery`] into librdkafka as the per-message opaque; the delivery
//! report callback (on the producer's polling thread) resolves it. So an ack means the broker
//! accepted the record under our `acks` setting, and nothing else does.
//!
//! Defaults, each overridable with `--kafka-property`: `enable.idempotence=true` and `acks=all` so
//! retries neither duplicate nor reorder within a partition; `message.timeout.ms=0` (retry forever)
//! so a broker outage stalls the pipeline instead of failing records. Topics are created through
//! the admin API before their first record, since many clusters disable auto-creation. The clients
//! themselves are built by [`super::kafka_client`], like every other Kafka client of outboxd.
//!
//! Errors that are about one record for good (too large, invalid topic, policy violation) come back
//! as rejections with the record's parts, for the bad-event policy. Everything else fails the
//! delivery, which stops the pipeline without advancing.
//!
//! Broker health: a delivery success marks Kafka up; a background metadata check every few seconds
//! marks it up or down, so a stalled broker flips `/readyz` within seconds.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use super::kafka_client::{self, Retry};
use super::{Sink, SinkError};
use crate::ack::Delivery;
use crate::config::KafkaConfig;
use crate::error::Definite;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::router::Record;

const METADATA_CHECK_EVERY: Duration = Duration::from_secs(3);

/// Which broker errors condemn one record rather than the pipeline.
fn rejection_code(e: &KafkaError) -> Option<&'static str> {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code()? {
        C::MessageSizeTooLarge | C::MessageBatchTooLarge | C::InvalidMessageSize => Some("too_large"),
        C::InvalidTopic => Some("invalid_topic"),
        C::PolicyViolation => Some("policy_violation"),
        C::InvalidRecord | C::InvalidMessage => Some("rejected"),
        _ => None,
    }
}

/// Resolves delivery handles from librdkafka's delivery reports, and tracks broker health.
pub struct DeliveryContext {
    health: Arc<Health>,
    metrics: Metrics,
    /// The user's properties, to scrub secret values from librdkafka's error texts.
    properties: Vec<(String, String)>,
}

impl DeliveryContext {
    fn kafka_up(&self, up: bool) {
        if up && !self.health.kafka_ok() {
            self.metrics.kafka_reconnects.increment(1);
            tracing::info!("Kafka is reachable again");
        } else if !up && self.health.kafka_ok() {
            tracing::warn!("Kafka is unreachable; holding events and retrying");
        }
        self.health.set_kafka(up);
        self.metrics.kafka_connected.set(if up { 1.0 } else { 0.0 });
    }
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => tracing::error!(target: "librdkafka", fac, "{log_message}"),
            L::Warning => tracing::warn!(target: "librdkafka", fac, "{log_message}"),
            L::Notice | L::Info => tracing::info!(target: "librdkafka", fac, "{log_message}"),
            L::Debug => tracing::debug!(target: "librdkafka", fac, "{log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::AllBrokersDown)) {
            self.kafka_up(false);
        }
        let reason = kafka_client::scrub(reason, &self.properties);
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<Delivery>;

    fn delivery(&self, result: &DeliveryResult<'_>, delivery: Box<Delivery>) {
        match result {
            Ok(_) => {
                if !self.health.kafka_ok() {
                    self.kafka_up(true);
                }
                delivery.ack()
            }
            Err((e, msg)) => match rejection_code(e) {
                Some(code) => {
                    let headers = msg
                        .headers()
                        .map(|hs| {
                            hs.iter()
                                .map(|h| (h.key.to_owned(), Bytes::copy_from_slice(h.value.unwrap_or_default())))
                                .collect()
                        })
                        .unwrap_or_default();
                    delivery.reject(
                        code,
                        e.to_string(),
                        msg.key().map(Bytes::copy_from_slice),
                        msg.payload().map(Bytes::copy_from_slice),
                        headers,
                    )
                }
                None => delivery.fail(e.to_string()),
            },
        }
    }
}

pub struct KafkaSink {
    producer: Arc<ThreadedProducer<DeliveryContext>>,
    admin: AdminClient<DefaultClientContext>,
    properties: Vec<(String, String)>,
    known_topics: HashSet<String>,
    partitions: i32,
    replication: i32,
    max_message_bytes: usize,
    stop_checks: Arc<AtomicBool>,
}

impl KafkaSink {
    pub fn new(
        cfg: &KafkaConfig,
        max_in_flight: usize,
        health: Arc<Health>,
        metrics: Metrics,
    ) -> Result<KafkaSink, Definite> {
        let c = kafka_client::producer_config(
            cfg,
            "outboxd",
            &[
                ("enable.idempotence", "true".into()),
                ("acks", "all".into()),
                ("message.timeout.ms", "0".into()),
                ("linger.ms", "5".into()),
                ("queue.buffering.max.messages", (max_in_flight.max(1) * 2).max(100_000).to_string()),
            ],
        );
        let max_message_bytes = cfg
            .properties
            .iter()
            .rev()
            .find(|(k, _)| k == "message.max.bytes")
            .map(|(_, v)| v.parse::<usize>())
            .transpose()
            .map_err(|_| Definite::Config("--kafka-property message.max.bytes must be a number of bytes".into()))?
            .unwrap_or(1_000_000);
        metrics.kafka_connected.set(1.0);
        let context = DeliveryContext { health, metrics, properties: cfg.properties.clone() };
        let producer: ThreadedProducer<DeliveryContext> = kafka_client::create(&c, context, "producer", cfg)?;
        let admin = kafka_client::create(
            &kafka_client::admin_config(cfg, "outboxd-admin"),
            DefaultClientContext,
            "admin client",
            cfg,
        )?;
        let producer = Arc::new(producer);
        let stop_checks = Arc::new(AtomicBool::new(false));
        spawn_metadata_checks(producer.clone(), stop_checks.clone());
        Ok(KafkaSink {
            producer,
            admin,
            properties: cfg.properties.clone(),
            known_topics: HashSet::new(),
            partitions: cfg.topic_partitions,
            replication: cfg.topic_replication_factor,
            max_message_bytes,
            stop_checks,
        })
    }

    /// Create `topic` unless we already did. Retries while the broker is unreachable.
    async fn ensure_topic(&mut self, topic: &str) -> Result<(), Definite> {
        if self.known_topics.contains(topic) {
            return Ok(());
        }
        kafka_client::ensure_topic(
            &self.admin,
            topic,
            self.partitions,
            self.replication,
            Retry::Forever,
            &self.properties,
        )
        .await?;
        self.known_topics.insert(topic.to_owned());
        Ok(())
    }
}

/// Ask the cluster for metadata every few seconds; the answer (or its absence) is broker health.
fn spawn_metadata_checks(producer: Arc<ThreadedProducer<DeliveryContext>>, stop: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new().name("outboxd-kafka-health".into()).spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let ok = producer.client().fetch_metadata(None, Duration::from_secs(2)).is_ok();
            producer.context().kafka_up(ok);
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
    }
}

impl Sink for KafkaSink {
    async fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        self.ensure_topic(&record.topic).await.map_err(SinkError::Fatal)?;
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (k, v) in &record.headers {
            headers = headers.insert(Header { key: k, value: Some(v.as_ref()) });
        }
        let mut br: BaseRecord<'_, [u8], [u8], Box<Delivery>> =
            BaseRecord::with_opaque_to(&record.topic, Box::new(delivery)).headers(headers);
        if let Some(k) = &record.key {
            br = br.key(k.as_ref());
        }
        if let Some(p) = &record.payload {
            br = br.payload(p.as_ref());
        }
        if let Some(p) = record.partition {
            br = br.partition(p);
        }
        if let Some(ts) = record.timestamp_ms {
            br = br.timestamp(ts);
        }
        loop {
            match self.producer.send(br) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    br = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, back)) => {
                    let delivery = *back.delivery_opaque;
                    return Err(match rejection_code(&e) {
                        Some(code) => {
                            SinkError::Rejected { code, reason: e.to_string(), record: Box::new(record), delivery }
                        }
                        None => {
                            let reason = e.to_string();
                            delivery.fail(reason.clone());
                            SinkError::Fatal(Definite::Delivery {
                                event_id: record.event_id.clone(),
                                topic: record.topic.clone(),
                                reason,
                            })
                        }
                    });
                }
            }
        }
    }

    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.max_message_bytes)
    }
}
