//! How long to wait before trying again: one backoff for every reconnect and retry loop (the
//! replication session, poll, and each sink's publisher), so they spread the same way.
//!
//! Invariant: the delay grows from 250 ms, doubling per attempt, never beyond `max`, plus up to a
//! quarter of it in jitter, and never panics for any attempt number.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Exponential backoff with jitter for reconnect attempt `attempt` (0-based), capped at `max`.
pub fn backoff(attempt: u32, max: Duration) -> Duration {
    let base = Duration::from_millis(250u64.saturating_mul(1 << attempt.min(10))).min(max);
    // Jitter from the clock's low bits: enough to spread a fleet's reconnects, no RNG needed.
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).subsec_nanos() as u64;
    let jitter = base.as_millis() as u64 / 4;
    base + Duration::from_millis(if jitter == 0 { 0 } else { nanos % jitter })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_from_250_ms_and_stays_under_its_cap_plus_a_quarter() {
        let max = Duration::from_secs(30);
        let first = backoff(0, max);
        assert!(first >= Duration::from_millis(250) && first < Duration::from_millis(313), "{first:?}");
        let third = backoff(2, max);
        assert!(third >= Duration::from_secs(1) && third < Duration::from_millis(1250), "{third:?}");
        for attempt in [10, 31, 32, 1000, u32::MAX] {
            let d = backoff(attempt, max);
            assert!(d >= max && d <= max + max / 4, "attempt {attempt}: {d:?}");
        }
    }
}
