//! The consumer thread's heartbeat, for `/healthz`: the writer ticks [`crate::health::Health`]
//! only while the consumer thread is alive too, so a wedge on either side fails the probe.
//!
//! Alive means the thread turned its poll loop within the stall timeout, or it is waiting on the
//! writer (a full channel while PostgreSQL is away, a rebalance's answer): that wait is the
//! writer's, which ticks for itself, and a PostgreSQL outage is readiness, not a wedge.
//!
//! Invariant: two relaxed atomics, written by the consumer thread per poll, read once a second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Beat {
    epoch: Instant,
    last_ms: AtomicU64,
    waiting: AtomicBool,
}

impl Beat {
    pub fn new() -> Beat {
        Beat { epoch: Instant::now(), last_ms: AtomicU64::new(0), waiting: AtomicBool::new(false) }
    }

    /// The poll loop turned.
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    fn beat_at(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Run `f`, a wait on the writer, counted as alive however long it takes.
    pub fn waiting_on_writer<T>(&self, f: impl FnOnce() -> T) -> T {
        self.waiting.store(true, Ordering::Relaxed);
        let out = f();
        self.waiting.store(false, Ordering::Relaxed);
        self.beat();
        out
    }

    /// Whether the thread turned within `stall` (always, for a zero `stall`: the check is off).
    pub fn alive(&self, stall: Duration) -> bool {
        self.alive_at(Instant::now(), stall)
    }

    fn alive_at(&self, now: Instant, stall: Duration) -> bool {
        if stall.is_zero() || self.waiting.load(Ordering::Relaxed) {
            return true;
        }
        let last = self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(last) < stall
    }
}

impl Default for Beat {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_thread_is_dead_unless_it_waits_on_the_writer() {
        let b = Beat::new();
        let stall = Duration::from_secs(10);
        let t0 = b.epoch;
        b.beat_at(t0 + Duration::from_secs(5));
        assert!(b.alive_at(t0 + Duration::from_secs(14), stall));
        assert!(!b.alive_at(t0 + Duration::from_secs(15), stall));
        assert!(b.alive_at(t0 + Duration::from_secs(1000), Duration::ZERO), "zero turns the check off");
        b.waiting.store(true, Ordering::Relaxed);
        assert!(b.alive_at(t0 + Duration::from_secs(1000), stall), "a wait on the writer is not a wedge");
        b.waiting_on_writer(|| ());
        assert!(!b.waiting.load(Ordering::Relaxed));
        assert!(b.alive(stall), "leaving the wait counts as a turn");
    }
}
