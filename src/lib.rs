//! outboxd: relay rows inserted into a PostgreSQL outbox table to Kafka, at-least-once, through a
//! dedicated pgoutput logical replication slot.
//!
//! Data path: [`pg::replication`] (WAL in) → [`pg::pgoutput`] (decode) → [`router`] (row → record, then [`router::mask`])
//! → [`relay`] (size check, bad-event policy, acks) → [`sink`] (Kafka, NATS JetStream, Redis
//! Streams, RabbitMQ, HTTP, stdout, null) → acks → [`source::wal::tracker`] (acked records →
//! confirmed LSN) → back to [`pg::replication`] as a standby status update. [`source::wal`] wires
//! one session together; [`source::poll`] and [`source::backfill`] feed the same relay from the
//! table; [`app`] runs sessions and reconnects; [`config`] validates flags.

pub mod app;
pub mod config;
pub mod debezium_offset;
pub mod error;
pub mod format;
pub mod health;
pub mod hex;
pub mod lineage;
pub mod lsn;
pub mod metrics;
pub mod otlp;
pub mod pg;
pub mod properties;
pub mod relay;
pub mod retry;
pub mod router;
pub mod secret;
pub mod serve;
pub mod sink;
pub mod source;
pub mod status;
pub mod task;
pub mod tools;
pub mod units;
