//! [`AnySink`]: the sink `--sink` names, built from a validated [`Config`] in one place for every
//! command that sends records (`run`, `poll`, `backfill`).
//!
//! [`Sink`] uses `async fn`, so it has no `dyn` form; an enum over the sinks
//! ([`super::registry::OneSink`], made from the one list of sinks), each call forwarded to the
//! one inside, lets the loops stay generic over `S: Sink` and be compiled once for all sinks.
//! Tests still drive the loops with a sink of their own.
//!
//! With `--dlq-sink` (a sink other than `--sink`), dead-letter copies (deliveries marked
//! [`Delivery::is_dead_letter`]) go through a second sink of that kind, so the copies of a sink
//! whose dead letters cannot be read back (HTTP) land where `outboxd dlq` reads them. Each copy's
//! handle is resolved by the sink that took it, so the relay's guarantee is unchanged: nothing is
//! confirmed before its copy is acked. The second sink reports to a `Health` of its own (the
//! sink-up flag behind `/readyz` follows `--sink`), and either sink's failed task stops the loop.

use std::sync::Arc;

use super::delivery::Delivery;
use super::escape::Limits;
use super::registry::OneSink;
use super::{Boundary, Sink, SinkError};
use crate::config::Config;
use crate::debezium_offset::DebeziumOffset;
use crate::error::{Definite, Error};
use crate::health::Health;
use crate::lineage::Lineage;
use crate::router::Record;

/// The sink `--sink` chose, and the one `--dlq-sink` chose for dead letters, if another.
pub struct AnySink {
    main: OneSink,
    dlq: Option<OneSink>,
    failure: Option<crate::task::Failure>,
}

impl AnySink {
    /// Build the sink `cfg.sink` names, and the `--dlq-sink` one (see the module doc).
    pub async fn build(cfg: &Config, health: Arc<Health>) -> Result<AnySink, Definite> {
        let main = OneSink::build(cfg, cfg.sink, health.clone()).await?;
        let dlq = match cfg.dlq_sink.filter(|k| *k != cfg.sink) {
            Some(kind) => Some(OneSink::build(cfg, kind, Health::new(std::time::Duration::ZERO)).await?),
            None => None,
        };
        // One failure that fires when either sink's does.
        let failure = match (main.failure(), dlq.as_ref().and_then(OneSink::failure)) {
            (f, None) | (None, f) => f,
            (Some(a), Some(b)) => {
                let both = crate::task::Failure::default();
                for f in [a, b] {
                    let both = both.clone();
                    tokio::spawn(async move { both.report(f.wait().await) });
                }
                Some(both)
            }
        };
        Ok(AnySink { main, dlq, failure })
    }

    fn for_delivery(&mut self, delivery: &Delivery) -> &mut OneSink {
        match &mut self.dlq {
            Some(d) if delivery.is_dead_letter() => d,
            _ => &mut self.main,
        }
    }
}

impl Sink for AnySink {
    fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        self.for_delivery(&delivery).send(record, delivery)
    }

    fn blocked(&self) -> bool {
        self.main.blocked() || self.dlq.as_ref().is_some_and(OneSink::blocked)
    }

    // Exactly-once (the only settling sink) runs without a second sink.
    fn settling(&self) -> bool {
        self.main.settling()
    }

    async fn unblock(&mut self) -> Result<(), SinkError> {
        match &mut self.dlq {
            Some(d) if d.blocked() && !self.main.blocked() => d.unblock().await,
            _ => self.main.unblock().await,
        }
    }

    fn discard_held(&mut self) {
        self.main.discard_held();
        if let Some(d) = &mut self.dlq {
            d.discard_held();
        }
    }

    fn max_message_bytes(&self) -> Option<usize> {
        self.main.max_message_bytes()
    }

    // The sink's own answers (the same as for its events unless it writes copies elsewhere, as
    // SQS does: to its dead-letter queue, in base64).
    fn dead_letter_max_bytes(&self) -> Option<usize> {
        self.dlq.as_ref().unwrap_or(&self.main).dead_letter_max_bytes()
    }

    fn copy_limits(&self) -> Limits {
        self.main.copy_limits()
    }

    fn dead_letter_limits(&self) -> Limits {
        self.dlq.as_ref().unwrap_or(&self.main).dead_letter_limits()
    }

    fn failure(&self) -> Option<crate::task::Failure> {
        self.failure.clone()
    }

    // Exactly-once runs without a second sink (validation refuses --dlq-sink with it).
    async fn prepare(&mut self, lineage: &Lineage) -> Result<Option<DebeziumOffset>, Error> {
        self.main.prepare(lineage).await
    }

    async fn already_written(&mut self, records: &[&Record]) -> Result<Vec<bool>, Error> {
        self.main.already_written(records).await
    }

    fn boundary(&mut self, b: Boundary) {
        self.main.boundary(b)
    }

    fn finishing(&mut self) {
        self.main.finishing()
    }

    fn due(&self) -> Option<tokio::time::Instant> {
        self.main.due()
    }

    async fn commit(&mut self) -> Result<(), SinkError> {
        self.main.commit().await
    }

    async fn abandon(&mut self) {
        self.main.abandon().await
    }
}
