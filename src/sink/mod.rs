//! Sinks: where routed records go.
//!
//! A sink takes a [`Record`] and its [`Delivery`] handle and must eventually resolve the handle:
//! `ack()` once the record is durably accepted, `fail()` when it never will be. Dropping the handle
//! counts as failure, so a sink bug can stall the pipeline but never lose an event. `send` may wait
//! (for topic creation, or a full client queue); it returns an error only for faults that make the
//! sink unusable.

mod kafka;
mod simple;

pub use kafka::KafkaSink;
pub use simple::{NullSink, StdoutSink};

use crate::ack::Delivery;
use crate::error::Definite;
use crate::router::Record;

#[allow(async_fn_in_trait)]
pub trait Sink {
    /// Hand one record over. Ordering: records sent to the same topic and key keep send order.
    async fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), Definite>;
}
