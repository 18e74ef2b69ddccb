//! The Kafka sink: librdkafka's idempotent producer, with delivery handles riding as opaques.
//!
//! Each record carries its [`Delivery`] into librdkafka as the per-message opaque; the delivery
//! report callback (on the producer's polling thread) resolves it. So an ack means the broker
//! accepted the record under our `acks` setting, and nothing else does.
//!
//! Defaults, each overridable with `--kafka-property`: `enable.idempotence=true` and `acks=all` so
//! retries neither duplicate nor reorder within a partition; `message.timeout.ms=0` (retry forever)
//! so a broker outage stalls the pipeline instead of failing records. Topics are created through
//! the admin API before their first record, since many clusters disable auto-creation.

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use super::Sink;
use crate::ack::Delivery;
use crate::config::KafkaConfig;
use crate::error::Definite;
use crate::router::Record;

/// Resolves delivery handles from librdkafka's delivery reports.
pub struct DeliveryContext;

impl ClientContext for DeliveryContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", fac, "{log_message}")
            }
            L::Warning => tracing::warn!(target: "librdkafka", fac, "{log_message}"),
            L::Notice | L::Info => tracing::info!(target: "librdkafka", fac, "{log_message}"),
            L::Debug => tracing::debug!(target: "librdkafka", fac, "{log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<Delivery>;

    fn delivery(&self, result: &DeliveryResult<'_>, delivery: Box<Delivery>) {
        match result {
            Ok(_) => delivery.ack(),
            Err((e, _)) => delivery.fail(e.to_string()),
        }
    }
}

pub struct KafkaSink {
    producer: ThreadedProducer<DeliveryContext>,
    admin: AdminClient<DefaultClientContext>,
    known_topics: HashSet<String>,
    partitions: i32,
    replication: i32,
}

impl KafkaSink {
    pub fn new(cfg: &KafkaConfig, max_in_flight: usize) -> Result<KafkaSink, Definite> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &cfg.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "0")
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", (max_in_flight.max(1) * 2).max(100_000).to_string())
            .set("client.id", "outboxd");
        for (k, v) in &cfg.properties {
            c.set(k, v);
        }
        let producer: ThreadedProducer<DeliveryContext> = c.create_with_context(DeliveryContext).map_err(|e| {
            Definite::Config(format!("Kafka producer config rejected: {e}; check --kafka-property values"))
        })?;
        let mut ac = ClientConfig::new();
        ac.set("bootstrap.servers", &cfg.brokers);
        for (k, v) in &cfg.properties {
            // Connection settings (security.*, sasl.*, ssl.*) matter to the admin client too.
            if k.starts_with("security.") || k.starts_with("sasl.") || k.starts_with("ssl.") || k.starts_with("socket.")
            {
                ac.set(k, v);
            }
        }
        let admin = ac.create().map_err(|e| Definite::Config(format!("Kafka admin client config rejected: {e}")))?;
        Ok(KafkaSink {
            producer,
            admin,
            known_topics: HashSet::new(),
            partitions: cfg.topic_partitions,
            replication: cfg.topic_replication_factor,
        })
    }

    /// Create `topic` unless we already did. Retries while the broker is unreachable.
    async fn ensure_topic(&mut self, topic: &str) -> Result<(), Definite> {
        if self.known_topics.contains(topic) {
            return Ok(());
        }
        let opts = AdminOptions::new()
            .operation_timeout(Some(Duration::from_secs(10)))
            .request_timeout(Some(Duration::from_secs(15)));
        let new = NewTopic::new(topic, self.partitions, TopicReplication::Fixed(self.replication));
        let mut backoff = Duration::from_millis(200);
        loop {
            match self.admin.create_topics([&new], &opts).await {
                Ok(results) => {
                    for r in results {
                        match r {
                            Ok(_) => tracing::info!(topic, partitions = self.partitions, "created topic"),
                            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                            Err((_, code @ (RDKafkaErrorCode::InvalidTopic
                            | RDKafkaErrorCode::InvalidPartitions
                            | RDKafkaErrorCode::InvalidReplicationFactor
                            | RDKafkaErrorCode::TopicAuthorizationFailed
                            | RDKafkaErrorCode::ClusterAuthorizationFailed))) => {
                                return Err(Definite::Sink(format!(
                                    "cannot create topic {topic:?}: {code}; create it yourself or fix --topic-partitions/--topic-replication-factor"
                                )))
                            }
                            Err((_, code)) => {
                                tracing::warn!(topic, %code, "topic creation failed; retrying");
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(Duration::from_secs(5));
                                continue;
                            }
                        }
                    }
                    self.known_topics.insert(topic.to_owned());
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(topic, error = %e, "Kafka admin request failed; retrying (broker unreachable?)");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

impl Sink for KafkaSink {
    async fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), Definite> {
        self.ensure_topic(&record.topic).await?;
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
                    let reason = e.to_string();
                    back.delivery_opaque.fail(reason.clone());
                    return Err(Definite::Delivery {
                        event_id: record.event_id.clone(),
                        topic: record.topic.clone(),
                        reason,
                    });
                }
            }
        }
    }
}
