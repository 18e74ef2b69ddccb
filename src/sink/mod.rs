//! Sinks: where routed records go.
//!
//! A sink takes a [`Record`] and its [`Delivery`] handle and must eventually resolve the handle:
//! `ack()` once the record is durably accepted, `reject()` when the destination refuses this record
//! for good, `fail()` when it can never be delivered. Dropping the handle counts as failure, so a
//! sink bug can stall the pipeline but never lose an event. `send` may wait (for topic creation, or
//! a full client queue).

mod kafka;
pub mod kafka_client;
mod simple;

pub use kafka::KafkaSink;
pub use simple::{NullSink, StdoutSink};

use crate::ack::Delivery;
use crate::error::Definite;
use crate::router::Record;

/// Why `send` did not take a record.
#[derive(Debug)]
pub enum SinkError {
    /// The destination refused this record for good; the record and its unresolved handle come
    /// back for the bad-event policy.
    Rejected { code: &'static str, reason: String, record: Box<Record>, delivery: Delivery },
    /// The sink cannot go on.
    Fatal(Definite),
}

#[allow(async_fn_in_trait)]
pub trait Sink {
    /// Hand one record over. Ordering: records sent to the same topic and key keep send order.
    async fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError>;

    /// The largest record the destination takes, if it has a limit.
    fn max_message_bytes(&self) -> Option<usize> {
        None
    }
}
