//! Metrics: one struct of handles, updated where state changes.
//!
//! Exposed in Prometheus text format when `--metrics-addr` is set. LSNs are exported as plain
//! numbers (bytes of WAL); `outboxd_replication_lag_bytes` is the server's last reported WAL end
//! minus the LSN we have confirmed, which is what the slot pins.

use metrics::{counter, gauge, Counter, Gauge};

use crate::lsn::Lsn;

#[derive(Clone)]
pub struct Metrics {
    pub events_sent: Counter,
    pub events_acked: Counter,
    pub events_failed: Counter,
    pub transactions: Counter,
    pub in_flight: Gauge,
    pub confirmed_lsn: Gauge,
    pub server_wal_end: Gauge,
    pub lag_bytes: Gauge,
    pub status_updates: Counter,
    pub reconnects: Counter,
}

impl Metrics {
    pub fn new() -> Self {
        Metrics {
            events_sent: counter!("outboxd_events_sent_total"),
            events_acked: counter!("outboxd_events_acked_total"),
            events_failed: counter!("outboxd_events_failed_total"),
            transactions: counter!("outboxd_transactions_total"),
            in_flight: gauge!("outboxd_in_flight_events"),
            confirmed_lsn: gauge!("outboxd_confirmed_flush_lsn"),
            server_wal_end: gauge!("outboxd_server_wal_end_lsn"),
            lag_bytes: gauge!("outboxd_replication_lag_bytes"),
            status_updates: counter!("outboxd_standby_status_updates_total"),
            reconnects: counter!("outboxd_reconnects_total"),
        }
    }

    pub fn progress(&self, confirmed: Lsn, server_wal_end: Lsn, in_flight: usize) {
        self.confirmed_lsn.set(confirmed.as_u64() as f64);
        self.server_wal_end.set(server_wal_end.as_u64() as f64);
        self.lag_bytes.set(server_wal_end.as_u64().saturating_sub(confirmed.as_u64()) as f64);
        self.in_flight.set(in_flight as f64);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Start the Prometheus endpoint.
pub fn serve(addr: std::net::SocketAddr) -> Result<(), crate::error::Definite> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| crate::error::Definite::Config(format!("--metrics-addr {addr}: {e}")))
}
