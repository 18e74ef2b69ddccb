//! The metrics `outboxd inbox` exports (`outboxd_inbox_*`, described in [`super::catalog`]): one
//! handle each, made once after the recorder is installed. The inbox decides the figures; this
//! module only exports them. The per-partition lag series are made as partitions are seen (a
//! group's partitions are few and fixed, so the label set stays bounded).

use metrics::{counter, gauge, Counter, Gauge};

/// The inbox's handles.
#[derive(Clone)]
pub struct InboxMetrics {
    rows: Counter,
    duplicates: Counter,
    unprocessed: Gauge,
    oldest: Gauge,
}

impl InboxMetrics {
    pub fn new() -> InboxMetrics {
        InboxMetrics {
            rows: counter!("outboxd_inbox_rows_total"),
            duplicates: counter!("outboxd_inbox_duplicates_total"),
            unprocessed: gauge!("outboxd_inbox_unprocessed_rows"),
            oldest: gauge!("outboxd_inbox_oldest_unprocessed_seconds"),
        }
    }

    /// A batch committed: `inserted` new rows, `duplicates` already there.
    pub fn written(&self, inserted: u64, duplicates: u64) {
        self.rows.increment(inserted);
        self.duplicates.increment(duplicates);
    }

    /// A bad record copied to the dead-letter topic.
    pub fn dead_lettered(&self, reason: &'static str) {
        counter!("outboxd_inbox_dlq_total", "reason" => reason).increment(1);
    }

    /// The table's backlog: unprocessed rows, and the age of the oldest in seconds.
    pub fn backlog(&self, rows: i64, oldest_seconds: f64) {
        self.unprocessed.set(rows as f64);
        self.oldest.set(oldest_seconds);
    }

    /// Records of a partition not read yet (its high watermark minus the consumer's position).
    pub fn lag(&self, topic: &str, partition: i32, records: i64) {
        gauge!("outboxd_inbox_lag_records", "topic" => topic.to_owned(), "partition" => partition.to_string())
            .set(records as f64);
    }

    /// How far behind a partition is in time: the age of the newest record read while records are
    /// left to read, else 0.
    pub fn lag_seconds(&self, topic: &str, partition: i32, seconds: f64) {
        gauge!("outboxd_inbox_lag_seconds", "topic" => topic.to_owned(), "partition" => partition.to_string())
            .set(seconds);
    }
}

impl Default for InboxMetrics {
    fn default() -> Self {
        Self::new()
    }
}
