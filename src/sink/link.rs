//! One sink's link to its destination, as an operator sees it, reported the same way by every sink:
//! the sink flag behind `/readyz` ([`Health`]), `outboxd_connected{component}`,
//! `outboxd_reconnects_total{component}`, and one log line per change (a warning when the link is
//! lost or found down at start, an info line when it is back).
//!
//! Invariants: a reconnect is counted only on a down → up change (the start-up connect is none);
//! the log is written on changes only, never per retry; the state is an atomic, so a client's own
//! thread (librdkafka's) may report it through a shared reference.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::health::Health;
use crate::metrics::LinkMetrics;

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

pub struct Link {
    /// How log lines name the destination ("Kafka", "Redis", ...).
    name: &'static str,
    health: Arc<Health>,
    metrics: LinkMetrics,
    state: AtomicU8,
}

impl Link {
    /// `component` is the metrics label (`kafka`, `nats`, `redis`, `rabbitmq`, `http`).
    pub fn new(component: &'static str, name: &'static str, health: Arc<Health>) -> Link {
        Link { name, health, metrics: LinkMetrics::new(component), state: AtomicU8::new(UNKNOWN) }
    }

    /// The link is up (`true`) or down; `reason` says why it is down (logged on the change only).
    /// Returns whether this was a reconnect (a down → up change, counted).
    pub fn set(&self, up: bool, reason: &str) -> bool {
        let new = if up { UP } else { DOWN };
        let reconnect = match (self.state.swap(new, Ordering::Relaxed), up) {
            (DOWN, true) => {
                self.metrics.reconnected();
                tracing::info!("{} is reachable again", self.name);
                true
            }
            (UNKNOWN | UP, false) => {
                tracing::warn!(reason, "{} is unreachable; holding events and retrying", self.name);
                false
            }
            _ => false,
        };
        self.health.set_sink_up(up);
        self.metrics.connected(up);
        reconnect
    }

    /// Whether the link was last reported up.
    pub fn is_up(&self) -> bool {
        self.state.load(Ordering::Relaxed) == UP
    }

    /// Whether the link was last reported down (not merely never reported).
    pub fn is_down(&self) -> bool {
        self.state.load(Ordering::Relaxed) == DOWN
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reconnects_are_down_to_up_changes_only() {
        let health = Health::new(Duration::ZERO);
        let link = Link::new("test", "Test", health.clone());
        assert!(!link.set(true, ""), "the start-up connect is no reconnect");
        assert!(health.sink_up() && link.is_up());
        assert!(!link.set(true, ""));
        assert!(!link.set(false, "refused"));
        assert!(!link.set(false, "refused"));
        assert!(!health.sink_up() && !link.is_up());
        assert!(link.set(true, ""), "down, then up: one reconnect");
        assert!(!link.set(true, ""));
        // Down at start, then up: a reconnect too (the link was seen down).
        let late = Link::new("test2", "Test", Health::new(Duration::ZERO));
        assert!(!late.set(false, "refused"));
        assert!(late.set(true, ""));
    }
}
