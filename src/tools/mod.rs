//! The subcommands other than the three that relay events (`run`, `poll`, `backfill`, whose code
//! is in [`crate::source`]): each a thin command over the same parts.
//! * [`check`]: `outboxd check`, whether PostgreSQL and the broker are ready, before a deploy;
//! * [`status`]: `outboxd status`, the slot, its lag and the outbox, as one report;
//! * [`schema_check`]: `outboxd schema check`, the `--schema-dir` contracts against the table;
//! * [`shadow`]: `outboxd shadow compare`, outboxd's topics against Debezium's, record by record;
//! * [`inbox`]: `outboxd inbox`, Kafka into the consumer's inbox table, each event once;
//! * [`dlq`]: `outboxd dlq`, list, inspect and replay the dead-letter queue of any sink.
//!
//! `outboxd decrypt` lives beside the encryption it undoes, in `router::mask`.

pub mod check;
pub mod dlq;
pub mod inbox;
pub mod schema_check;
pub mod shadow;
pub mod status;
