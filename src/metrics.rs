//! Metrics: one struct of handles, updated where state changes, never inside parsing code.
//!
//! The names are an interface (alert rules and dashboards in `config/` depend on them):
//! `outboxd_events_total{topic}`, `outboxd_events_failed_total{reason}`,
//! `outboxd_dlq_events_total{reason}`, `outboxd_events_in_flight`, `outboxd_transactions_total`,
//! `outboxd_received_lsn`, `outboxd_confirmed_flush_lsn`, `outboxd_replication_lag_bytes`,
//! `outboxd_lag_seconds`, `outboxd_commit_to_ack_seconds`, `outboxd_connected{component}`,
//! `outboxd_slot_safe_wal_size_bytes`, `outboxd_reconnects_total{component}`.
//! LSNs are exported as plain numbers (bytes of WAL).

use std::collections::HashMap;

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

use crate::lsn::Lsn;

/// Handles for every metric outboxd exports. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    pub in_flight: Gauge,
    pub transactions: Counter,
    pub received_lsn: Gauge,
    pub confirmed_lsn: Gauge,
    pub lag_bytes: Gauge,
    pub lag_seconds: Gauge,
    pub commit_to_ack: Histogram,
    pub pg_connected: Gauge,
    pub kafka_connected: Gauge,
    pub pg_reconnects: Counter,
    pub kafka_reconnects: Counter,
    events_by_topic: HashMap<String, Counter>,
}

/// Every metric name outboxd exports: the interface alert rules and dashboards rely on.
pub const NAMES: &[&str] = &[
    "outboxd_events_total",
    "outboxd_events_failed_total",
    "outboxd_events_in_flight",
    "outboxd_transactions_total",
    "outboxd_received_lsn",
    "outboxd_confirmed_flush_lsn",
    "outboxd_replication_lag_bytes",
    "outboxd_lag_seconds",
    "outboxd_commit_to_ack_seconds",
    "outboxd_connected",
    "outboxd_slot_safe_wal_size_bytes",
    "outboxd_reconnects_total",
    "outboxd_dlq_events_total",
];

/// Every reason code a failed or dead-lettered event can carry; registered at zero so dashboards and
/// alerts see the series before the first failure.
pub const REASONS: &[&str] = &[
    "null_id",
    "null_route",
    "invalid_topic",
    "invalid_json",
    "bad_value",
    "too_large",
    "rejected",
    "policy_violation",
    "unknown_partition",
    "invalid_timestamp",
    "topic_authorization_failed",
    "delivery",
];

impl Metrics {
    pub fn new() -> Self {
        for reason in REASONS {
            counter!("outboxd_events_failed_total", "reason" => *reason).absolute(0);
            counter!("outboxd_dlq_events_total", "reason" => *reason).absolute(0);
        }
        Metrics {
            in_flight: gauge!("outboxd_events_in_flight"),
            transactions: counter!("outboxd_transactions_total"),
            received_lsn: gauge!("outboxd_received_lsn"),
            confirmed_lsn: gauge!("outboxd_confirmed_flush_lsn"),
            lag_bytes: gauge!("outboxd_replication_lag_bytes"),
            lag_seconds: gauge!("outboxd_lag_seconds"),
            commit_to_ack: histogram!("outboxd_commit_to_ack_seconds"),
            pg_connected: gauge!("outboxd_connected", "component" => "postgres"),
            kafka_connected: gauge!("outboxd_connected", "component" => "kafka"),
            pg_reconnects: counter!("outboxd_reconnects_total", "component" => "postgres"),
            kafka_reconnects: counter!("outboxd_reconnects_total", "component" => "kafka"),
            events_by_topic: HashMap::new(),
        }
    }

    /// One event acked by the sink.
    pub fn acked(&mut self, topic: &str) {
        if let Some(c) = self.events_by_topic.get(topic) {
            c.increment(1);
            return;
        }
        let c = counter!("outboxd_events_total", "topic" => topic.to_owned());
        c.increment(1);
        self.events_by_topic.insert(topic.to_owned(), c);
    }

    /// One event that could not be delivered as routed.
    pub fn failed(&self, reason: &'static str) {
        counter!("outboxd_events_failed_total", "reason" => reason).increment(1);
    }

    /// One event sent to the dead-letter topic.
    pub fn dead_lettered(&self, reason: &'static str) {
        counter!("outboxd_dlq_events_total", "reason" => reason).increment(1);
    }

    /// The slot's `safe_wal_size`: exported only while the server limits it, so "unlimited" never
    /// reads as "0 bytes left".
    pub fn safe_wal_size(&self, bytes: Option<i64>) {
        if let Some(b) = bytes {
            gauge!("outboxd_slot_safe_wal_size_bytes").set(b as f64);
        }
    }

    pub fn progress(&self, received: Lsn, confirmed: Lsn, in_flight: usize) {
        self.received_lsn.set(received.as_u64() as f64);
        self.confirmed_lsn.set(confirmed.as_u64() as f64);
        self.in_flight.set(in_flight as f64);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
