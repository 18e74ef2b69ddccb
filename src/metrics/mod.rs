//! Metrics: structs of handles, updated where state changes, never inside parsing code: [`Metrics`]
//! for the relay, [`TxnMetrics`] (exactly-once), [`LinkMetrics`] (a sink's link) and
//! [`ShadowMetrics`] (`shadow --follow`), [`InboxMetrics`] (`outboxd inbox`); no other module calls the `metrics` macros.
//! Each metric is described once, in [`catalog`] (its help text and the manual's table come from
//! there).
//!
//! The names are an interface (alert rules and dashboards in `config/` depend on them); the list,
//! with each one's type, labels and meaning, is [`catalog::ALL`].
//! LSNs are exported as plain numbers (bytes of WAL).
//!
//! Memory stays bounded with nobody scraping: the exporter keeps raw histogram samples until they
//! are folded into buckets, so [`install_recorder`] runs its upkeep on a timer instead of only on a
//! scrape; and `outboxd_events_total` gets a series for the first [`MAX_TOPIC_SERIES`] distinct
//! topics only (routing can make a topic out of any column value); events to later topics count
//! under `topic="(other)"`, a name no Kafka topic can have, with one warning.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::error::Definite;
use crate::lsn::Lsn;

pub mod catalog;
mod inbox;
mod link;
mod shadow;
mod txn;

pub use inbox::InboxMetrics;
pub use link::LinkMetrics;
pub use shadow::{ShadowFigures, ShadowMetrics};
pub use txn::TxnMetrics;

/// Distinct `topic` label values `outboxd_events_total` gets before the rest share [`OTHER_TOPIC`].
pub const MAX_TOPIC_SERIES: usize = 1000;
/// The label for events past the cap: parentheses are not legal in a Kafka topic name.
pub const OTHER_TOPIC: &str = "(other)";
/// How often the exporter folds raw histogram samples into buckets: per-transaction samples are
/// 8 to 16 bytes each, so a second of them is small at any rate we reach.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Install the Prometheus recorder globally and start its upkeep every `upkeep` on the current
/// tokio runtime. Returns the handle that renders `/metrics`.
pub fn install_recorder(upkeep: Duration) -> Result<PrometheusHandle, Definite> {
    let handle = builder()
        .and_then(|b| b.install_recorder())
        .map_err(|e| Definite::Config(format!("--metrics-addr: cannot install the metrics recorder: {e}")))?;
    catalog::describe_all();
    let h = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(upkeep);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            h.run_upkeep();
        }
    });
    Ok(handle)
}

/// Bucket bounds of `outboxd_commit_to_ack_seconds`: fine around the 20 ms latency target (so a
/// p99 near it is read, not interpolated across a 20–50 ms bucket), coarse beyond.
pub const COMMIT_TO_ACK_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

pub(crate) fn builder() -> Result<PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full("outboxd_commit_to_ack_seconds".into()), COMMIT_TO_ACK_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full("outboxd_kafka_transaction_commit_seconds".into()),
            COMMIT_TO_ACK_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("outboxd_kafka_transaction_records".into()),
            &[1.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0, 10000.0],
        )
}

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
    pub pg_reconnects: Counter,
    pub role_active: Gauge,
    pub role_standby: Gauge,
    /// `outboxd poll`: records handed to the sink for an outbox row (one per try).
    pub poll_tries: Counter,
    /// `outboxd poll`: tries the sink refused for good.
    pub poll_errors: Counter,
    /// `outboxd poll`: rows not yet published, as of the last backlog query.
    pub poll_unpublished: Gauge,
    /// `outboxd poll`: age of the oldest unpublished row (the outbox lag).
    pub poll_oldest_age: Gauge,
    /// Shared by every clone, so the cap holds for the process, not per session.
    topics: Arc<TopicSeries>,
}

/// The `outboxd_events_total{topic}` handles, at most `cap` of them plus the overflow one.
struct TopicSeries {
    cap: usize,
    by_topic: Mutex<HashMap<Box<str>, Counter>>,
    other: OnceLock<Counter>,
    warned: AtomicBool,
}

impl TopicSeries {
    fn counter(&self, topic: &str) -> Counter {
        // Uncontended (one runtime thread), and far cheaper than producing the event.
        let mut map = self.by_topic.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(topic) {
            return c.clone();
        }
        if map.len() < self.cap {
            let c = counter!("outboxd_events_total", "topic" => topic.to_owned());
            map.insert(topic.into(), c.clone());
            return c;
        }
        drop(map);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                cap = self.cap,
                topic,
                "outboxd_events_total has a series for {} topics already; events to further topics count under topic=\"{OTHER_TOPIC}\"",
                self.cap
            );
        }
        self.other.get_or_init(|| counter!("outboxd_events_total", "topic" => OTHER_TOPIC)).clone()
    }
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
    "outboxd_kafka_transactions_total",
    "outboxd_kafka_transaction_records",
    "outboxd_kafka_transaction_commit_seconds",
    "outboxd_connected",
    "outboxd_slot_safe_wal_size_bytes",
    "outboxd_reconnects_total",
    "outboxd_dlq_events_total",
    "outboxd_role",
    "outboxd_poll_unpublished_rows",
    "outboxd_poll_oldest_unpublished_age_seconds",
    "outboxd_poll_publish_tries_total",
    "outboxd_poll_publish_errors_total",
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
    "schema",
];

impl Metrics {
    pub fn new() -> Self {
        Self::with_topic_cap(MAX_TOPIC_SERIES)
    }

    fn with_topic_cap(cap: usize) -> Self {
        for reason in REASONS {
            counter!("outboxd_events_failed_total", "reason" => *reason).absolute(0);
            counter!("outboxd_dlq_events_total", "reason" => *reason).absolute(0);
        }
        // The exactly-once series (recorded by the Kafka sink) exist from the start in every
        // mode, at zero, like the other series of the catalogue.
        for outcome in ["committed", "aborted"] {
            counter!("outboxd_kafka_transactions_total", "outcome" => outcome).absolute(0);
        }
        drop(histogram!("outboxd_kafka_transaction_records"));
        drop(histogram!("outboxd_kafka_transaction_commit_seconds"));
        Metrics {
            in_flight: gauge!("outboxd_events_in_flight"),
            transactions: counter!("outboxd_transactions_total"),
            received_lsn: gauge!("outboxd_received_lsn"),
            confirmed_lsn: gauge!("outboxd_confirmed_flush_lsn"),
            lag_bytes: gauge!("outboxd_replication_lag_bytes"),
            lag_seconds: gauge!("outboxd_lag_seconds"),
            commit_to_ack: histogram!("outboxd_commit_to_ack_seconds"),
            pg_connected: gauge!("outboxd_connected", "component" => "postgres"),
            pg_reconnects: counter!("outboxd_reconnects_total", "component" => "postgres"),
            role_active: gauge!("outboxd_role", "role" => "active"),
            role_standby: gauge!("outboxd_role", "role" => "standby"),
            poll_tries: counter!("outboxd_poll_publish_tries_total"),
            poll_errors: counter!("outboxd_poll_publish_errors_total"),
            poll_unpublished: gauge!("outboxd_poll_unpublished_rows"),
            poll_oldest_age: gauge!("outboxd_poll_oldest_unpublished_age_seconds"),
            topics: Arc::new(TopicSeries {
                cap,
                by_topic: Mutex::new(HashMap::new()),
                other: OnceLock::new(),
                warned: AtomicBool::new(false),
            }),
        }
    }

    /// One event acked by the sink.
    pub fn acked(&self, topic: &str) {
        self.acked_n(topic, 1);
    }

    /// `n` events to `topic` acked by the sink (one series lookup for a run of acks).
    pub fn acked_n(&self, topic: &str, n: u64) {
        self.topics.counter(topic).increment(n);
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

    /// Which role this process has: streaming the slot (active), waiting for another process to
    /// release it (standby), or neither (starting, reconnecting).
    pub fn role(&self, active: bool, standby: bool) {
        self.role_active.set(if active { 1.0 } else { 0.0 });
        self.role_standby.set(if standby { 1.0 } else { 0.0 });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn series(body: &str) -> Vec<&str> {
        body.lines().filter(|l| l.starts_with("outboxd_events_total{")).collect()
    }

    #[test]
    fn topic_series_stop_at_the_cap_and_the_rest_count_as_other() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let m = Metrics::with_topic_cap(3);
            let clone = m.clone();
            for t in ["a", "b", "a", "c"] {
                m.acked(t);
            }
            // Past the cap, from any clone: the cap is per process, not per handle.
            for i in 0..50 {
                clone.acked(&format!("late-{i}"));
            }
            m.acked("b");
        });
        let body = handle.render();
        let mut got = series(&body);
        got.sort();
        assert_eq!(
            got,
            [
                "outboxd_events_total{topic=\"(other)\"} 50",
                "outboxd_events_total{topic=\"a\"} 2",
                "outboxd_events_total{topic=\"b\"} 2",
                "outboxd_events_total{topic=\"c\"} 1",
            ],
            "{body}"
        );
    }

    #[test]
    fn no_other_series_below_the_cap() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let m = Metrics::with_topic_cap(2);
            m.acked("x");
            m.acked("y");
            m.acked("x");
        });
        let body = handle.render();
        assert_eq!(series(&body).len(), 2, "{body}");
        assert!(!body.contains(OTHER_TOPIC), "{body}");
    }
    #[test]
    fn commit_to_ack_buckets_are_fine_around_the_20_ms_target() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let m = Metrics::with_topic_cap(1);
            for s in [0.011, 0.016, 0.019, 0.021, 0.042] {
                m.commit_to_ack.record(s);
            }
        });
        let body = handle.render();
        let bucket = |le: &str| {
            let line = format!("outboxd_commit_to_ack_seconds_bucket{{le=\"{le}\"}} ");
            body.lines().find_map(|l| l.strip_prefix(line.as_str())).map(|v| v.trim().to_owned())
        };
        // Cumulative counts: 20 ms holds three of five, 12.5 / 17.5 / 25 / 50 split the rest.
        assert_eq!(bucket("0.0125").as_deref(), Some("1"), "{body}");
        assert_eq!(bucket("0.0175").as_deref(), Some("2"), "{body}");
        assert_eq!(bucket("0.02").as_deref(), Some("3"), "{body}");
        assert_eq!(bucket("0.025").as_deref(), Some("4"), "{body}");
        assert_eq!(bucket("0.04").as_deref(), Some("4"), "{body}");
        assert_eq!(bucket("0.05").as_deref(), Some("5"), "{body}");
        assert!(COMMIT_TO_ACK_BUCKETS.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
    }
}
