//! Which sink `outboxd dlq` reads (`--sink`, as for `outboxd run`) and the clients for it: the
//! validated flags ([`Common`]), the record source ([`Source`]: Kafka's [`DlqReader`], NATS's
//! [`NatsReader`], Redis's [`RedisReader`], RabbitMQ's [`RabbitReader`], SQS's [`SqsReader`]), the
//! republishing client of the sinks other than Kafka ([`Target`]), and Kafka replay's sending and
//! topic creation.
//!
//! Invariants: only Kafka, NATS, Redis, RabbitMQ (a stream queue) and SQS are readable, every
//! other `--sink` is refused with one line ([`unreadable_sink`]); connection errors show URLs
//! masked; each sink's replay state has a name of its own ([`Common::state_name`]), so a Kafka
//! topic and a NATS subject of the same name never share progress. An SQS queue keeps its own
//! progress (a replayed copy is deleted, [`Source::replayed`]), so its state is never saved.

use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use super::chunk;
use super::PREFIX;
use crate::config::{parse_duration, DlqCommonArgs, KafkaConfig, SinkKind};
use crate::error::{Definite, Error};
use crate::secret::read_url_file;
use crate::sink::kafka::client::{self as kafka_client, Retry};
use crate::sink::kafka::dlq::{partition_count, DlqReader, DlqRecord};
use crate::sink::kafka::reader::{ReaderContext, StreamReader};
use crate::sink::kinesis::dlq::KinesisReader;
use crate::sink::kinesis::replay::KinesisTarget;
use crate::sink::moved;
use crate::sink::nats::config::NatsConfig;
use crate::sink::nats::dlq::NatsReader;
use crate::sink::rabbitmq::config::RabbitConfig;
use crate::sink::rabbitmq::dlq::RabbitReader;
use crate::sink::redis::config::RedisConfig;
use crate::sink::redis::dlq::RedisReader;
use crate::sink::sqs::dlq::{SqsReader, SqsTarget};

/// The sink whose dead letters are read, with its validated connection settings.
pub(super) enum Via {
    Kafka,
    Nats(NatsConfig),
    Redis(RedisConfig),
    /// The settings and the stream queue to read.
    Rabbitmq(RabbitConfig, String),
    Sqs(SqsVia),
    /// The AWS settings, and `--kinesis-stream`: replay's destination unless `--to-topic`.
    Kinesis(crate::sink::aws::AwsConfig, Option<String>),
}

/// `outboxd dlq --sink sqs`: the queue of dead letters ([`Common::topic`]), where replay sends.
pub(super) struct SqsVia {
    pub(super) aws: crate::sink::aws::AwsConfig,
    /// `--sqs-queue-url` (`--sink sqs`) or `--sns-topic-arn` (`--sink sns`): replay's destination
    /// unless `--to-topic` names another queue or topic.
    pub(super) queue_url: Option<String>,
    pub(super) visibility: Duration,
}

/// What a replay state's file name keeps of a Redis key or RabbitMQ queue name as it is; the rest
/// is percent-encoded, so any name gives a plain file name.
const FILE_NAME_KEEPS: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'.').remove(b'-').remove(b'_');

/// Validated common flags.
pub(super) struct Common {
    pub(super) kafka: KafkaConfig,
    pub(super) via: Via,
    pub(super) topic: String,
    pub(super) read_timeout: Duration,
}

/// Where the DLQ is read from: the sink's own reader.
pub(super) enum Source {
    Kafka(DlqReader),
    Nats(NatsReader),
    Redis(RedisReader),
    Rabbitmq(Box<RabbitReader>),
    Sqs(Box<SqsReader>),
    Kinesis(Box<KinesisReader>),
}

impl Source {
    /// The next copy, with what was escaped or moved to make it writable restored
    /// ([`DlqRecord::restore`]), so filters, listing and replay see the original event; a chunk
    /// with moved headers is restored once joined ([`DlqRecord::moved_later`]).
    pub(super) async fn next(&mut self) -> Result<Option<DlqRecord>, Error> {
        let mut r = match self {
            Source::Kafka(r) => r.next().await,
            Source::Nats(r) => r.next().await,
            Source::Redis(r) => r.next().await,
            Source::Rabbitmq(r) => r.next().await,
            Source::Sqs(r) => r.next().await,
            Source::Kinesis(r) => Ok(r.next()),
        }?;
        if let Some(r) = &mut r {
            // A chunk's moved headers are in the joined body only.
            if r.header(chunk::H_ID).is_some() && r.header(moved::H_MOVED).is_some() {
                r.moved_later = true;
            } else {
                r.restore();
            }
        }
        Ok(r)
    }

    /// The events at `positions` were replayed and acked: an SQS queue deletes their copies
    /// ([`SqsReader::replayed`]); the others keep them, and the progress file says they are done.
    pub(super) async fn replayed(&mut self, positions: &[(i32, i64)]) -> Result<(), Definite> {
        match self {
            Source::Sqs(r) => r.replayed(positions).await,
            Source::Kinesis(r) => r.replayed(positions)?,
            _ => {}
        }
        Ok(())
    }

    /// Whether reading may go on after it ended (an SQS FIFO queue frees a group's later copies
    /// once its earlier ones are deleted: [`SqsReader::again`]).
    pub(super) fn again(&mut self) -> bool {
        match self {
            Source::Sqs(r) => r.again(),
            _ => false,
        }
    }

    /// Copies an SQS queue holds that reading did not reach ([`SqsReader::unreached`]); call
    /// before [`Source::release`]. `None` for the other sinks, which are read to their end.
    pub(super) async fn unreached(&self) -> Option<u64> {
        match self {
            Source::Sqs(r) => r.unreached().await,
            _ => None,
        }
    }

    /// Reading is over: an SQS queue's copies still held are made visible again.
    pub(super) async fn release(&mut self) {
        if let Source::Sqs(r) = self {
            r.release().await;
        }
    }
}

/// Where replayed events go: the same sink.
pub(super) enum Target {
    Nats(async_nats::jetstream::Context),
    Redis(redis::aio::MultiplexedConnection),
    /// A channel in confirm mode on a connection kept open, and the exchange.
    Rabbitmq {
        _conn: Box<lapin::Connection>,
        chan: Box<lapin::Channel>,
        exchange: String,
    },
    Sqs(Box<SqsTarget>),
    Kinesis(Box<KinesisTarget>),
}

impl Common {
    pub(super) fn from_args(a: &DlqCommonArgs) -> Result<Common, Definite> {
        let kafka = KafkaConfig::for_tool(&a.kafka)?;
        if a.dlq_topic.is_empty() {
            return Err(Definite::Config("--dlq-topic must not be empty (default outboxd.dlq)".into()));
        }
        let read_timeout = parse_duration("--read-timeout", &a.read_timeout)?;
        if read_timeout.is_zero() {
            return Err(Definite::Config("--read-timeout must be more than 0, e.g. 60s".into()));
        }
        let s = &a.sink;
        let url = |flag: &str, file: &Option<std::path::PathBuf>, given: &str| match file {
            Some(p) => read_url_file(flag, p),
            None => Ok(given.to_owned()),
        };
        let via = match s.sink {
            SinkKind::Kafka => Via::Kafka,
            SinkKind::Nats => Via::Nats(NatsConfig::new(
                &url("--nats-url-file", &s.nats.nats_url_file, &s.nats.nats_url)?,
                s.nats.nats_creds.clone(),
                None,
            )?),
            SinkKind::Redis => {
                let c = RedisConfig {
                    url: url("--redis-url-file", &s.redis.redis_url_file, &s.redis.redis_url)?,
                    maxlen: None,
                };
                c.check()?;
                Via::Redis(c)
            }
            SinkKind::Rabbitmq => {
                let c = RabbitConfig {
                    url: url("--rabbitmq-url-file", &s.rabbitmq.rabbitmq_url_file, &s.rabbitmq.rabbitmq_url)?,
                    exchange: s.rabbitmq.rabbitmq_exchange.clone(),
                };
                c.check()?;
                let queue = s.rabbitmq_dlq_queue.clone().unwrap_or_else(|| a.dlq_topic.clone());
                if queue.is_empty() {
                    return Err(Definite::Config("--rabbitmq-dlq-queue must not be empty".into()));
                }
                Via::Rabbitmq(c, queue)
            }
            SinkKind::Sqs | SinkKind::Sns => {
                // SNS's dead letters are in an SQS queue; replay publishes to the topic.
                let (flag, url, dest) = if s.sink == SinkKind::Sns {
                    ("--sns-dlq-queue-url", &s.sns.sns_dlq_queue_url, &s.sns.sns_topic_arn)
                } else {
                    ("--sqs-dlq-queue-url", &s.sqs.sqs_dlq_queue_url, &s.sqs.sqs_queue_url)
                };
                let url = url.clone().ok_or_else(|| {
                    Definite::Config(format!(
                        "outboxd dlq --sink {} needs {flag} (the SQS queue of dead letters)",
                        crate::config::value_name(s.sink)
                    ))
                })?;
                crate::sink::sqs::config::check_url(flag, &url)?;
                match (dest, s.sink) {
                    (Some(a), SinkKind::Sns) => crate::sink::sns::config::check_arn(a)?,
                    (Some(q), _) => crate::sink::sqs::config::check_url("--sqs-queue-url", q)?,
                    (None, _) => {}
                }
                let visibility = parse_duration("--sqs-visibility-timeout", &s.sqs_visibility_timeout)?;
                if visibility < Duration::from_secs(1) || visibility > Duration::from_secs(12 * 3600) {
                    return Err(Definite::Config(
                        "--sqs-visibility-timeout must be from 1s to 12h (SQS's range), e.g. 2m".into(),
                    ));
                }
                let sqs = SqsVia { aws: s.aws.validate()?, queue_url: dest.clone(), visibility };
                return Ok(Common { kafka, via: Via::Sqs(sqs), topic: url, read_timeout });
            }
            SinkKind::Kinesis => {
                let k = &s.kinesis;
                let stream = k.kinesis_dlq_stream.clone().filter(|d| !d.is_empty()).ok_or_else(|| {
                    Definite::Config(
                        "outboxd dlq --sink kinesis needs --kinesis-dlq-stream (the stream of dead letters)".into(),
                    )
                })?;
                let via = Via::Kinesis(s.aws.validate()?, k.kinesis_stream.clone().filter(|m| !m.is_empty()));
                return Ok(Common { kafka, via, topic: stream, read_timeout });
            }
            other => return Err(Definite::Config(unreadable_sink(other))),
        };
        Ok(Common { kafka, via, topic: a.dlq_topic.clone(), read_timeout })
    }

    /// The replay state's name: the Kafka topic as before; other sinks' DLQs get their own file.
    pub(super) fn state_name(&self) -> String {
        match &self.via {
            Via::Kafka => self.topic.clone(),
            Via::Nats(_) => format!("nats.{}", self.topic),
            Via::Redis(_) => format!("redis.{}", percent_encoding::utf8_percent_encode(&self.topic, FILE_NAME_KEEPS)),
            Via::Rabbitmq(_, queue) => {
                format!("rabbitmq.{}", percent_encoding::utf8_percent_encode(queue, FILE_NAME_KEEPS))
            }
            // Never saved: the queue itself is the progress (see crate::sink::sqs::dlq).
            Via::Sqs(_) => format!("sqs.{}", percent_encoding::utf8_percent_encode(&self.topic, FILE_NAME_KEEPS)),
            // Never saved: the reader keeps its own progress (see crate::sink::kinesis::dlq).
            Via::Kinesis(..) => {
                format!("kinesis.{}", percent_encoding::utf8_percent_encode(&self.topic, FILE_NAME_KEEPS))
            }
        }
    }

    /// What `list` and `replay` say when there is nothing to read.
    pub(super) fn absent(&self) -> String {
        match &self.via {
            Via::Kafka => format!("{}: topic does not exist (no dead letters yet)", self.topic),
            Via::Nats(_) => format!("{}: no JetStream stream holds this subject (no dead letters yet)", self.topic),
            Via::Redis(_) => format!("{}: the Redis stream is missing or empty (no dead letters yet)", self.topic),
            Via::Rabbitmq(_, q) => {
                format!("{}: RabbitMQ queue {q:?} does not exist (no dead letters read)", self.topic)
            }
            Via::Sqs(_) => format!("{}: the SQS queue is empty (no dead letters)", self.topic),
            Via::Kinesis(..) => format!("{}: the Kinesis stream holds no dead letters", self.topic),
        }
    }

    /// The sink's DLQ reader; `None` when there is nothing to read.
    /// `state_dir`: replay's, where a Kinesis reader keeps its progress; `None` for `list`.
    pub(super) async fn source(&self, state_dir: Option<&std::path::Path>) -> Result<Option<Source>, Error> {
        Ok(match &self.via {
            Via::Kafka => self.reader()?.map(Source::Kafka),
            Via::Nats(c) => {
                let js = crate::sink::nats::dlq::connect(c).await?;
                NatsReader::open(&js, &self.topic, self.read_timeout).await?.map(Source::Nats)
            }
            Via::Redis(c) => {
                let conn = crate::sink::redis::dlq::connect(c).await?;
                RedisReader::open(conn, &self.topic, self.read_timeout).await?.map(Source::Redis)
            }
            Via::Rabbitmq(c, queue) => {
                RabbitReader::open(c, queue, self.read_timeout).await?.map(|r| Source::Rabbitmq(Box::new(r)))
            }
            Via::Sqs(c) => SqsReader::open(&c.aws, &self.topic, c.visibility, self.read_timeout)
                .await?
                .map(|r| Source::Sqs(Box::new(r))),
            Via::Kinesis(aws, _) => KinesisReader::open(aws, &self.topic, state_dir, self.read_timeout)
                .await?
                .map(|r| Source::Kinesis(Box::new(r))),
        })
    }

    /// The client replay publishes with, for the sinks other than Kafka.
    pub(super) async fn target(&self) -> Result<Option<Target>, Definite> {
        Ok(match &self.via {
            Via::Kafka => None,
            Via::Nats(c) => Some(Target::Nats(crate::sink::nats::dlq::connect(c).await?)),
            Via::Redis(c) => Some(Target::Redis(crate::sink::redis::dlq::connect(c).await?)),
            Via::Rabbitmq(c, _) => {
                let (conn, chan) = crate::sink::rabbitmq::dlq::connect(c).await?;
                Some(Target::Rabbitmq { _conn: Box::new(conn), chan: Box::new(chan), exchange: c.exchange.clone() })
            }
            Via::Sqs(c) => Some(Target::Sqs(Box::new(SqsTarget::connect(&c.aws).await))),
            Via::Kinesis(aws, _) => Some(Target::Kinesis(Box::new(KinesisTarget::connect(aws).await))),
        })
    }

    /// Where replay sends an event that has no `--to-topic`: `--sqs-queue-url` or `--sns-topic-arn`
    /// (an SQS copy's original topic names no queue); `None`: its original topic.
    pub(super) fn default_destination(&self) -> Option<String> {
        match &self.via {
            Via::Sqs(c) => c.queue_url.clone(),
            Via::Kinesis(_, stream) => stream.clone(),
            _ => None,
        }
    }

    pub(super) fn consumer(&self) -> Result<StreamReader, Definite> {
        let defaults = [
            ("group.id", "outboxd-dlq-tool".to_owned()),
            ("enable.auto.commit", "false".into()),
            ("enable.auto.offset.store", "false".into()),
            ("auto.offset.reset", "earliest".into()),
            ("allow.auto.create.topics", "false".into()),
            ("isolation.level", "read_uncommitted".into()),
            ("fetch.wait.max.ms", "100".into()),
            // The reader's end: a partition's last offsets may be markers, not records.
            ("enable.partition.eof", "true".into()),
        ];
        let c = kafka_client::consumer_config(&self.kafka, "outboxd-dlq-tool", &defaults);
        kafka_client::create(&c, ReaderContext::new(&self.kafka), "consumer", &self.kafka)
    }

    /// The DLQ reader; `None` when the topic does not exist.
    pub(super) fn reader(&self) -> Result<Option<DlqReader>, Definite> {
        DlqReader::open(self.consumer()?, &self.topic, &self.kafka.brokers, self.read_timeout)
    }

    pub(super) fn producer(&self) -> Result<FutureProducer, Definite> {
        let defaults = [
            ("enable.idempotence", "true".to_owned()),
            ("acks", "all".into()),
            ("message.timeout.ms", "120000".into()),
        ];
        let c = kafka_client::producer_config(&self.kafka, "outboxd-dlq-replay", &defaults);
        kafka_client::create(&c, DefaultClientContext, "producer", &self.kafka)
    }

    pub(super) fn admin(&self) -> Result<AdminClient<DefaultClientContext>, Definite> {
        let c = kafka_client::admin_config(&self.kafka, "outboxd-dlq-replay");
        kafka_client::create(&c, DefaultClientContext, "admin client", &self.kafka)
    }
}

/// Why `outboxd dlq` refuses `--sink kind`, and what to do instead.
fn unreadable_sink(kind: SinkKind) -> String {
    let readable = crate::sink::registry::readable_names();
    match kind {
        SinkKind::Http => format!(
            "--sink http: a webhook receiver's dead letters cannot be read back; `outboxd dlq` reads --sink \
             {readable} (see docs/src/dead-letters.md)"
        ),
        other => format!(
            "--sink {}: this sink keeps no dead letters to read; `outboxd dlq` reads --sink {readable}",
            crate::config::value_name(other)
        ),
    }
}

/// Enqueues the record for `dest`: original key, payload, timestamp, non-`outboxd.*` headers.
pub(super) async fn send(producer: &FutureProducer, r: &DlqRecord, dest: &str) -> Result<DeliveryFuture, String> {
    let kept = r.headers.iter().filter(|(k, _)| !k.starts_with(PREFIX));
    let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
    for (k, v) in kept {
        headers = headers.insert(Header { key: k, value: v.as_deref() });
    }
    loop {
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(dest).headers(headers.clone());
        if let Some(k) = &r.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(p) = &r.payload {
            rec = rec.payload(p.as_slice());
        }
        if let Some(ts) = r.timestamp_ms {
            rec = rec.timestamp(crate::sink::kafka::librdkafka_timestamp(ts));
        }
        match producer.send_result(rec) {
            Ok(f) => return Ok(f),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err((e, _)) => return Err(e.to_string()),
        }
    }
}

/// Creates `topic` unless the broker already knows it (broker defaults for partitions and
/// replication, see [`kafka_client::ensure_topic`]), then waits until the metadata shows it, so
/// the first send does not race the creation.
pub(super) async fn ensure_topic(
    admin: &AdminClient<DefaultClientContext>,
    consumer: &StreamReader,
    common: &Common,
    topic: &str,
) -> Result<(), String> {
    if partition_count(consumer, topic, &common.kafka.brokers).map_err(|e| e.to_string())?.is_some() {
        return Ok(());
    }
    let k = &common.kafka;
    kafka_client::ensure_topic(
        admin,
        topic,
        k.topic_partitions,
        k.topic_replication_factor,
        Retry::For(Duration::from_secs(15)),
        &k.properties,
    )
    .await
    .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = partition_count(consumer, topic, &common.kafka.brokers) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("topic {topic:?} was created but does not show in the metadata"))
}

#[cfg(test)]
mod tests {
    use super::unreadable_sink;
    use crate::config::SinkKind;

    /// The refusals name the readable sinks, which the list of sinks decides
    /// (`crate::sink::registry`), in the words they had when each message listed them itself.
    #[test]
    fn an_unreadable_sink_is_refused_naming_the_readable_ones() {
        assert_eq!(
            unreadable_sink(SinkKind::Http),
            "--sink http: a webhook receiver's dead letters cannot be read back; `outboxd dlq` reads --sink kafka, \
             nats, redis, rabbitmq, sqs, sns or kinesis (see docs/src/dead-letters.md)"
        );
        assert_eq!(
            unreadable_sink(SinkKind::Null),
            "--sink null: this sink keeps no dead letters to read; `outboxd dlq` reads --sink kafka, nats, redis, \
             rabbitmq, sqs, sns or kinesis"
        );
    }
}
