//! The sinks' part of validation and of `outboxd config`: which sink, where dead letters go, the
//! delivery mode, and each sink's settings through its own group (validated and shown in its
//! folder, `crate::sink::<name>::config`).
//!
//! With [`super::SinkArgs`] this is the config side's one list of sinks: a new sink adds its
//! group there and a line in [`validate`] and [`show`].
//!
//! Invariant: only the sinks in use (`--sink`, `--dlq-sink`) must be reachable as configured;
//! the others' flags are parsed and range-checked only, so a default never fails a run.

use super::{Config, DeliveryMode, SinkArgs, SinkKind, UrlFiles};
use crate::error::Definite;
use crate::sink::aws::AwsConfig;
use crate::sink::http::config::HttpConfig;
use crate::sink::kafka::config::{DeliveryArgs, KafkaConfig};
use crate::sink::kinesis::config::KinesisConfig;
use crate::sink::nats::config::NatsConfig;
use crate::sink::rabbitmq::config::RabbitConfig;
use crate::sink::redis::config::RedisConfig;
use crate::sink::sns::config::SnsConfig;
use crate::sink::sqs::config::SqsConfig;
use crate::units::{millis, value_name};

/// The validated sink settings, moved into [`Config`] as they are.
pub(super) struct Sinks {
    pub sink: SinkKind,
    pub dlq_sink: Option<SinkKind>,
    pub delivery: DeliveryMode,
    pub kafka: KafkaConfig,
    pub nats: NatsConfig,
    pub redis: RedisConfig,
    pub rabbitmq: RabbitConfig,
    pub http: HttpConfig,
    pub aws: AwsConfig,
    pub sqs: SqsConfig,
    pub sns: SnsConfig,
    pub kinesis: KinesisConfig,
    pub url_files: UrlFiles,
}

/// `--sink`, `--dlq-sink`, `--delivery` and every sink's group. `debezium` holds the librdkafka
/// properties of `--debezium-config`; `slot` names the position (exactly-once) and the default
/// CloudEvents source (HTTP).
pub(super) fn validate(
    a: &SinkArgs,
    delivery: Option<&DeliveryArgs>,
    debezium: &[String],
    slot: &str,
) -> Result<Sinks, Definite> {
    let bad = |m: String| Definite::Config(m);
    let mode = delivery.map_or(DeliveryMode::AtLeastOnce, |d| d.delivery);
    let dlq_sink = match a.dlq_sink {
        Some(k) if k == a.sink => None,
        Some(k) if k.readable_dead_letters() => Some(k),
        Some(k) => {
            return Err(bad(format!(
                "--dlq-sink {} keeps no dead letters `outboxd dlq` can read; give {}",
                value_name(k),
                crate::sink::registry::readable_names()
            )))
        }
        None => None,
    };
    if mode == DeliveryMode::ExactlyOnce {
        if a.sink != SinkKind::Kafka {
            return Err(bad(format!(
                "--delivery exactly-once needs --sink kafka (Kafka transactions); --sink {} delivers at least once",
                value_name(a.sink)
            )));
        }
        if dlq_sink.is_some() {
            return Err(bad("--delivery exactly-once writes dead-letter copies in the same Kafka transaction as the \
                 events around them; drop --dlq-sink"
                .into()));
        }
    }
    let used = |k: SinkKind| a.sink == k || dlq_sink == Some(k);
    Ok(Sinks {
        sink: a.sink,
        dlq_sink,
        delivery: mode,
        kafka: a.kafka.validate(debezium, a.sink == SinkKind::Kafka, delivery, slot)?,
        nats: a.nats.validate()?,
        redis: a.redis.validate(used(SinkKind::Redis))?,
        rabbitmq: a.rabbitmq.validate(used(SinkKind::Rabbitmq))?,
        http: a.http.validate(slot, a.sink == SinkKind::Http)?,
        aws: a.aws.validate()?,
        sqs: a.sqs.validate(
            used(SinkKind::Sqs),
            a.on_bad_event == crate::config::BadEventPolicy::Dlq
                && (dlq_sink == Some(SinkKind::Sqs) || (dlq_sink.is_none() && a.sink == SinkKind::Sqs)),
        )?,
        sns: a.sns.validate(
            used(SinkKind::Sns),
            a.on_bad_event == crate::config::BadEventPolicy::Dlq
                && (dlq_sink == Some(SinkKind::Sns) || (dlq_sink.is_none() && a.sink == SinkKind::Sns)),
        )?,
        kinesis: a.kinesis.validate(
            used(SinkKind::Kinesis),
            a.on_bad_event == crate::config::BadEventPolicy::Dlq && (dlq_sink.is_none() && a.sink == SinkKind::Kinesis),
        )?,
        url_files: UrlFiles {
            nats: a.nats.conn.nats_url_file.clone(),
            redis: a.redis.conn.redis_url_file.clone(),
            rabbitmq: a.rabbitmq.rabbitmq_url_file.clone(),
            http: a.http.http_url_file.clone(),
        },
    })
}

/// The sink flags of `c`, as `outboxd config` prints them (URLs masked or shown as their file).
pub(super) fn show(c: &Config, push: &mut dyn FnMut(&'static str, String)) {
    push("sink", value_name(c.sink));
    c.kafka.show(push);
    let files = &c.url_files;
    c.nats.show(files.nats.as_deref(), push);
    c.redis.show(files.redis.as_deref(), push);
    c.rabbitmq.show(files.rabbitmq.as_deref(), push);
    c.http.show(files.http.as_deref(), push);
    c.aws.show(push);
    c.sqs.show(push);
    c.sns.show(push);
    c.kinesis.show(push);
}

/// `--delivery` and, with exactly-once, the transactions' flags.
pub(super) fn show_delivery(c: &Config, push: &mut dyn FnMut(&'static str, String)) {
    push("delivery", value_name(c.delivery));
    if let Some(t) = &c.kafka.transactions {
        push("transaction-interval", millis(t.interval));
        push("position-topic", t.position_topic.clone());
    }
}
