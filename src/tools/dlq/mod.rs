//! The `outboxd dlq` tools ([`tool`]), which read the dead-letter queue of the sink `--sink`
//! names (`sinks`): Kafka, NATS JetStream, Redis Streams, a RabbitMQ stream queue or an SQS queue (each read by
//! the `dlq` module in its sink's folder, e.g. [`crate::sink::kafka::dlq`], [`crate::sink::nats::dlq`]), and
//! list, inspect and replay what is there. The copies themselves are
//! written by the relay under the record model of [`crate::sink::dead_letter`] (header names,
//! chunks, a record as read back, the events a reader makes of them), re-exported here for the
//! tools. What a sink could not carry in a copy
//! travels escaped ([`crate::sink::escape`]); every source's records are restored before use
//! ([`crate::sink::dead_letter::DlqRecord::restore_escaped`]).

mod report;
mod sinks;
mod state;
pub mod tool;

pub use crate::sink::dead_letter::{chunk, entry};
pub use crate::sink::dead_letter::{
    DeadLetter, H_ERROR, H_LSN, H_MESSAGE, H_PAYLOAD_DROPPED, H_SEQ, H_SIZE, H_TABLE, H_TOPIC, PREFIX,
};
