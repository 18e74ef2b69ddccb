//! outboxd: relay rows inserted into a PostgreSQL outbox table to Kafka, at-least-once, through a
//! dedicated pgoutput logical replication slot.
//!
//! Data path: [`pg::replication`] (WAL in) → [`pg::pgoutput`] (decode) → [`router`] (row → record, then [`router::mask`])
//! → [`sink`] (Kafka, NATS JetStream, Redis Streams, RabbitMQ, HTTP, stdout, null) → [`ack`] (acked records → confirmed LSN) → back to
//! [`pg::replication`] as a standby status update. [`pipeline`] wires one session together;
//! [`app`] runs sessions and reconnects; [`config`] validates flags.

pub mod ack;
pub mod app;
pub mod backfill;
pub mod check;
pub mod config;
pub mod dlq;
pub mod error;
pub mod health;
pub mod lsn;
pub mod metrics;
pub mod pg;
pub mod pipeline;
pub mod poll;
pub mod retry;
pub mod router;
pub mod schema_check;
pub mod shadow;
pub mod sink;
pub mod status;
pub mod task;
