//! The dead-letter queue: where bad events go ([`policy`] decides), and the `outboxd dlq` tools.

pub mod tool;
