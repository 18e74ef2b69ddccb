//! The exactly-once producer's metrics (`--delivery exactly-once`): Kafka transactions by
//! outcome, records per committed transaction, and how long a commit took. Described in
//! [`super::catalog`] like every other metric; the bucket bounds are set in [`super::builder`].

use std::time::Duration;

/// The exactly-once metrics.
#[derive(Clone)]
pub struct TxnMetrics {
    committed: metrics::Counter,
    aborted: metrics::Counter,
    records: metrics::Histogram,
    latency: metrics::Histogram,
}

impl Default for TxnMetrics {
    fn default() -> Self {
        TxnMetrics::new()
    }
}

impl TxnMetrics {
    pub fn new() -> TxnMetrics {
        TxnMetrics {
            committed: metrics::counter!("outboxd_kafka_transactions_total", "outcome" => "committed"),
            aborted: metrics::counter!("outboxd_kafka_transactions_total", "outcome" => "aborted"),
            records: metrics::histogram!("outboxd_kafka_transaction_records"),
            latency: metrics::histogram!("outboxd_kafka_transaction_commit_seconds"),
        }
    }

    pub fn committed(&self, records: usize, took: Duration) {
        self.committed.increment(1);
        self.records.record(records as f64);
        self.latency.record(took.as_secs_f64());
    }

    pub fn aborted(&self) {
        self.aborted.increment(1);
    }
}
