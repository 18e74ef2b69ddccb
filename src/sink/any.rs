//! [`AnySink`]: the sink `--sink` names, built from a validated [`Config`] in one place for every
//! command that sends records (`run`, `poll`, `backfill`).
//!
//! [`Sink`] uses `async fn`, so it has no `dyn` form; an enum over the sinks, each call forwarded
//! to the one inside, lets the loops stay generic over `S: Sink` and be compiled once for all
//! sinks. Tests still drive the loops with a sink of their own.

use std::sync::Arc;

use super::{HttpSink, KafkaSink, NatsSink, NullSink, RabbitSink, RedisSink, Sink, SinkError, StdoutSink};
use crate::ack::Delivery;
use crate::config::{Config, SinkKind};
use crate::error::Definite;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::router::Record;

/// One of the sinks, as `--sink` chose it.
pub enum AnySink {
    Kafka(KafkaSink),
    Stdout(StdoutSink),
    Null(NullSink),
    Nats(NatsSink),
    Redis(RedisSink),
    Rabbitmq(RabbitSink),
    Http(HttpSink),
}

impl AnySink {
    /// Build the sink `cfg.sink` names. NATS and RabbitMQ connect here (a server that is down is
    /// waited for in the background; a refused login or bad settings are errors); the others
    /// connect in the background. Every sink reports its connection to `health`.
    pub async fn build(cfg: &Config, health: Arc<Health>, metrics: Metrics) -> Result<AnySink, Definite> {
        Ok(match cfg.sink {
            SinkKind::Kafka => {
                AnySink::Kafka(KafkaSink::new(&cfg.kafka, cfg.max_in_flight, cfg.max_in_flight_bytes, health, metrics)?)
            }
            SinkKind::Stdout => AnySink::Stdout(StdoutSink::default()),
            SinkKind::Null => AnySink::Null(NullSink),
            SinkKind::Nats => AnySink::Nats(NatsSink::connect(&cfg.nats, health).await?),
            SinkKind::Redis => AnySink::Redis(RedisSink::new(&cfg.redis, health)?),
            SinkKind::Rabbitmq => AnySink::Rabbitmq(RabbitSink::connect(&cfg.rabbitmq, health).await?),
            SinkKind::Http => AnySink::Http(HttpSink::new(&cfg.http, health)?),
        })
    }
}

/// `$body` with `$s` bound to the sink inside `$any`.
macro_rules! each {
    ($any:expr, $s:ident => $body:expr) => {
        match $any {
            AnySink::Kafka($s) => $body,
            AnySink::Stdout($s) => $body,
            AnySink::Null($s) => $body,
            AnySink::Nats($s) => $body,
            AnySink::Redis($s) => $body,
            AnySink::Rabbitmq($s) => $body,
            AnySink::Http($s) => $body,
        }
    };
}

impl Sink for AnySink {
    async fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        each!(self, s => s.send(record, delivery).await)
    }

    fn blocked(&self) -> bool {
        each!(self, s => s.blocked())
    }

    async fn unblock(&mut self) -> Result<(), SinkError> {
        each!(self, s => s.unblock().await)
    }

    fn discard_held(&mut self) {
        each!(self, s => s.discard_held())
    }

    fn max_message_bytes(&self) -> Option<usize> {
        each!(self, s => s.max_message_bytes())
    }

    fn failure(&self) -> Option<crate::task::Failure> {
        each!(self, s => s.failure())
    }
}
