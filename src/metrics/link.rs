//! One sink's link metrics: `outboxd_connected{component}` and
//! `outboxd_reconnects_total{component}` (described in [`super::catalog`] like every other
//! metric). The handles are made once per link, so a change costs an atomic store; when a change
//! counts as a reconnect is [`crate::sink::link`]'s decision, not this module's.

use metrics::{Counter, Gauge};

/// The two series of one sink link, labelled with its `component`.
pub struct LinkMetrics {
    connected: Gauge,
    reconnects: Counter,
}

impl LinkMetrics {
    /// `component` is the metrics label (`kafka`, `nats`, `redis`, `rabbitmq`, `http`).
    pub fn new(component: &'static str) -> LinkMetrics {
        LinkMetrics {
            connected: metrics::gauge!("outboxd_connected", "component" => component),
            reconnects: metrics::counter!("outboxd_reconnects_total", "component" => component),
        }
    }

    /// The link is up (1) or down (0).
    pub fn connected(&self, up: bool) {
        self.connected.set(if up { 1.0 } else { 0.0 });
    }

    /// One down → up change.
    pub fn reconnected(&self) {
        self.reconnects.increment(1);
    }
}
