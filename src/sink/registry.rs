//! The one list of sinks. The `sinks!` table below names each sink once, with its `--sink` value
//! (and that value's help) and its type; from it come [`SinkKind`] (the value enum of `--sink`,
//! `--dlq-sink` and `outboxd dlq --sink`), [`OneSink`] (one of the sinks, built by kind) and the
//! dispatch of every [`Sink`] call to the sink inside.
//!
//! What the shared code needs beyond [`Sink`] each sink exports from its folder through
//! [`Registered`] (in `registered.rs`, below the sinks, so the arrows point one way: this table
//! uses the sinks, the sinks use only the trait): how it is built from the validated [`Config`],
//! what `outboxd check` probes, and whether `outboxd dlq` reads its dead letters back. So adding
//! a sink is its folder, a line here, and its flag group's lines on the config side (see the
//! module doc of [`crate::sink`]).
//!
//! Invariants: [`OneSink`] is an enum, so every call is a `match` and a direct call (no `dyn`, no
//! allocation per record: [`Sink`] has `async fn`s, which have no `dyn` form anyway); the table's
//! order is the order `--help` lists the values in and the order of the readable sinks in
//! messages ([`readable_names`]).

use std::sync::Arc;

use super::delivery::Delivery;
use super::escape::Limits;
use super::http::HttpSink;
use super::kafka::KafkaSink;
use super::kinesis::KinesisSink;
use super::nats::NatsSink;
use super::rabbitmq::RabbitSink;
use super::redis::RedisSink;
use super::registered::{Probe, Registered};
use super::simple::{NullSink, StdoutSink};
use super::sns::SnsSink;
use super::sqs::SqsSink;
use super::{Boundary, Sink, SinkError};
use crate::config::Config;
use crate::debezium_offset::DebeziumOffset;
use crate::error::{Definite, Error};
use crate::health::Health;
use crate::lineage::Lineage;
use crate::router::Record;

/// The table: `Variant => Type`, each variant with its `--help` text as doc comments. The
/// `--sink` value is the variant's name in lower case (clap's `ValueEnum`).
macro_rules! sinks {
    ($( $(#[$doc:meta])* $kind:ident => $ty:ty, )*) => {
        /// The sinks, as `--sink` and `--dlq-sink` name them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
        pub enum SinkKind {
            $( $(#[$doc])* $kind, )*
        }

        impl SinkKind {
            /// Every sink, in the table's order.
            pub const ALL: &'static [SinkKind] = &[$( SinkKind::$kind, )*];

            /// Whether `outboxd dlq` reads back this sink's dead letters.
            pub fn readable_dead_letters(self) -> bool {
                match self { $( SinkKind::$kind => <$ty as Registered>::READABLE_DEAD_LETTERS, )* }
            }

            /// What `outboxd check` probes for this sink.
            pub(crate) fn probe(self, cfg: &Config) -> Probe {
                match self { $( SinkKind::$kind => <$ty as Registered>::probe(cfg), )* }
            }
        }

        /// One of the sinks.
        pub(super) enum OneSink {
            $( $kind($ty), )*
        }

        impl OneSink {
            /// Build the sink `kind` names (see [`Registered::build`]).
            pub(super) async fn build(cfg: &Config, kind: SinkKind, health: Arc<Health>) -> Result<OneSink, Definite> {
                Ok(match kind {
                    $( SinkKind::$kind => OneSink::$kind(<$ty as Registered>::build(cfg, health).await?), )*
                })
            }
        }

        impl Sink for OneSink {
            fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
                match self { $( OneSink::$kind(s) => s.send(record, delivery), )* }
            }

            fn blocked(&self) -> bool {
                match self { $( OneSink::$kind(s) => s.blocked(), )* }
            }

            fn settling(&self) -> bool {
                match self { $( OneSink::$kind(s) => s.settling(), )* }
            }

            async fn unblock(&mut self) -> Result<(), SinkError> {
                match self { $( OneSink::$kind(s) => s.unblock().await, )* }
            }

            fn discard_held(&mut self) {
                match self { $( OneSink::$kind(s) => s.discard_held(), )* }
            }

            fn max_message_bytes(&self) -> Option<usize> {
                match self { $( OneSink::$kind(s) => s.max_message_bytes(), )* }
            }

            fn copy_limits(&self) -> Limits {
                match self { $( OneSink::$kind(s) => s.copy_limits(), )* }
            }

            fn dead_letter_max_bytes(&self) -> Option<usize> {
                match self { $( OneSink::$kind(s) => s.dead_letter_max_bytes(), )* }
            }

            fn dead_letter_limits(&self) -> Limits {
                match self { $( OneSink::$kind(s) => s.dead_letter_limits(), )* }
            }

            fn failure(&self) -> Option<crate::task::Failure> {
                match self { $( OneSink::$kind(s) => s.failure(), )* }
            }

            async fn prepare(&mut self, lineage: &Lineage) -> Result<Option<DebeziumOffset>, Error> {
                match self { $( OneSink::$kind(s) => s.prepare(lineage).await, )* }
            }

            async fn already_written(&mut self, records: &[&Record]) -> Result<Vec<bool>, Error> {
                match self { $( OneSink::$kind(s) => s.already_written(records).await, )* }
            }

            fn boundary(&mut self, b: Boundary) {
                match self { $( OneSink::$kind(s) => s.boundary(b), )* }
            }

            fn finishing(&mut self) {
                match self { $( OneSink::$kind(s) => s.finishing(), )* }
            }

            fn due(&self) -> Option<tokio::time::Instant> {
                match self { $( OneSink::$kind(s) => s.due(), )* }
            }

            async fn commit(&mut self) -> Result<(), SinkError> {
                match self { $( OneSink::$kind(s) => s.commit().await, )* }
            }

            async fn abandon(&mut self) {
                match self { $( OneSink::$kind(s) => s.abandon().await, )* }
            }
        }
    };
}

sinks! {
    Kafka => KafkaSink,
    Stdout => StdoutSink,
    Null => NullSink,
    /// NATS JetStream (--nats-url).
    Nats => NatsSink,
    /// Redis Streams: XADD to the stream named by the topic.
    Redis => RedisSink,
    /// RabbitMQ: persistent messages with publisher confirms (--rabbitmq-url).
    Rabbitmq => RabbitSink,
    /// HTTP webhook: POST each event (or a batch) to --http-url; a 2xx response is the ack.
    Http => HttpSink,
    /// Amazon SQS: SendMessageBatch to --sqs-queue-url (standard or FIFO).
    Sqs => SqsSink,
    /// Amazon SNS: PublishBatch to --sns-topic-arn (standard or FIFO).
    Sns => SnsSink,
    /// Amazon Kinesis Data Streams: PutRecords to --kinesis-stream.
    Kinesis => KinesisSink,
}

/// The `--sink` values whose dead letters `outboxd dlq` reads, as a sentence lists them:
/// "kafka, nats, redis, rabbitmq, sqs, sns or kinesis".
pub fn readable_names() -> String {
    let names: Vec<String> =
        SinkKind::ALL.iter().filter(|k| k.readable_dead_letters()).map(|k| crate::units::value_name(*k)).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::{readable_names, SinkKind};

    #[test]
    fn the_readable_sinks_in_a_sentence() {
        assert_eq!(readable_names(), "kafka, nats, redis, rabbitmq, sqs, sns or kinesis");
        assert!(!SinkKind::Http.readable_dead_letters());
    }
}
