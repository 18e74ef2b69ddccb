//! Process health: the facts `/healthz` and `/readyz` report, and their answers ([`Probe`]).
//! The HTTP server that carries them, with `/metrics` and the status page, is [`crate::serve`];
//! this module knows nothing of HTTP beyond a probe's status line and body, so the status page
//! ([`crate::status`]) can read [`Health`] without a circle.
//!
//! [`Health`] is a few atomics written where the facts change (session start/end, the sink's
//! connection state, each status update of the replication loop) and read by the HTTP server and the status page.
//!
//! - Live (`/healthz`) means the replication loop (or the supervisor between sessions) turned
//!   within `--health-stall-timeout`. The session loop turns at least once per
//!   `--status-interval` even when saturated or idle (its status timer is an arm of the loop), and
//!   the supervisor ticks through every backoff and through the bounded waits for Kafka of
//!   exactly-once ([`Health::ticking`]), so only a loop blocked inside one step, a wedge, goes
//!   quiet. That is the one failure a restart fixes, so it is the only one `/healthz` reports:
//!   a broker outage or a reconnecting PostgreSQL link is readiness, not liveness.
//! - Ready (`/readyz`) means streaming (so PostgreSQL is connected) and the sink reaches its
//!   destination (Kafka: the last delivery or metadata check succeeded; the others: their
//!   connection is up). A standby instance (another process holds the slot) is not
//!   ready, and its 503 body says "standby" so a probe or a person can tell it from a failure.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Shared readiness and liveness facts.
#[derive(Debug)]
pub struct Health {
    streaming: AtomicBool,
    /// Another process holds the slot; this one waits to take it over.
    standby: AtomicBool,
    /// The sink reaches its destination (every sink reports it, whatever its kind).
    sink_up: AtomicBool,
    /// Outbox events seen in the stream: a counter, so the per-event path pays one
    /// relaxed add and no clock read; the monitor turns changes into idle time.
    activity: AtomicU64,
    /// Loop ticks are stored as milliseconds since this instant (a monotonic clock).
    epoch: Instant,
    last_tick_ms: AtomicU64,
    /// No tick for this long means wedged; zero turns the check off.
    stall_timeout: Duration,
}

impl Health {
    /// Health whose `/healthz` fails after `stall_timeout` without a [`loop_tick`](Self::loop_tick)
    /// (zero: never). The clock starts now, so start-up has one timeout to reach the loop.
    pub fn new(stall_timeout: Duration) -> Arc<Health> {
        Arc::new(Health {
            streaming: AtomicBool::new(false),
            standby: AtomicBool::new(false),
            sink_up: AtomicBool::new(true),
            activity: AtomicU64::new(0),
            epoch: Instant::now(),
            last_tick_ms: AtomicU64::new(0),
            stall_timeout,
        })
    }

    /// The replication loop (or the supervisor between sessions) made progress. One clock read
    /// and a relaxed store: cheap next to decoding one WAL message.
    pub fn loop_tick(&self) {
        self.tick_at(Instant::now());
    }

    fn tick_at(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        self.last_tick_ms.store(ms, Ordering::Relaxed);
    }

    /// Await `step`, ticking every second meanwhile. For a step that waits on a destination with a
    /// bound of its own (the exactly-once producer's start, which waits for Kafka up to a
    /// timeout; aborting its transaction): a broker outage is readiness, not a wedge. The ticks
    /// come from the runtime's thread, so a blocked runtime still goes quiet.
    pub async fn ticking<F: std::future::Future>(&self, step: F) -> F::Output {
        self.ticking_for(Duration::MAX, step).await
    }

    /// [`Health::ticking`] for at most `limit`: a step that takes longer still runs, but the loop
    /// goes quiet, so a wait that never ends (a hung call) shows as a stall.
    pub async fn ticking_for<F: std::future::Future>(&self, limit: Duration, step: F) -> F::Output {
        tokio::pin!(step);
        let mut every = tokio::time::interval(Duration::from_secs(1));
        let started = Instant::now();
        loop {
            tokio::select! {
                biased;
                out = &mut step => return out,
                _ = every.tick(), if started.elapsed() < limit => self.loop_tick(),
            }
        }
    }

    /// Not wedged: the loop ticked within the stall timeout.
    pub fn live(&self) -> bool {
        self.stalled_for(Instant::now()).is_none()
    }

    /// `/healthz`'s answer: 200 while live, else 503 saying how long the loop has been quiet.
    pub fn healthz(&self) -> Probe {
        match self.stalled_for(Instant::now()) {
            None => Probe { ok: true, body: "ok\n".to_owned() },
            Some(quiet) => Probe {
                ok: false,
                body: format!("stalled: the replication loop made no progress for {}s\n", quiet.as_secs()),
            },
        }
    }

    /// `/readyz`'s answer: 200 while ready; a standby's 503 says so, to tell it from a failure.
    pub fn readyz(&self) -> Probe {
        let body = if self.ready() {
            "ready\n"
        } else if self.standby() {
            "standby: another process holds the replication slot; this one takes over when it is released\n"
        } else {
            "not ready\n"
        };
        Probe { ok: self.ready(), body: body.to_owned() }
    }

    /// How long the loop has been quiet at `now`, if that is longer than the stall timeout.
    fn stalled_for(&self, now: Instant) -> Option<Duration> {
        if self.stall_timeout.is_zero() {
            return None;
        }
        let last = self.epoch + Duration::from_millis(self.last_tick_ms.load(Ordering::Relaxed));
        let quiet = now.saturating_duration_since(last);
        (quiet > self.stall_timeout).then_some(quiet)
    }

    pub fn set_streaming(&self, v: bool) {
        self.streaming.store(v, Ordering::Relaxed);
    }

    pub fn set_standby(&self, v: bool) {
        self.standby.store(v, Ordering::Relaxed);
    }

    pub fn standby(&self) -> bool {
        self.standby.load(Ordering::Relaxed)
    }

    pub fn set_sink_up(&self, up: bool) {
        self.sink_up.store(up, Ordering::Relaxed);
    }

    pub fn sink_up(&self) -> bool {
        self.sink_up.load(Ordering::Relaxed)
    }

    /// An outbox event just came through the stream.
    pub fn activity(&self) {
        self.activity.fetch_add(1, Ordering::Relaxed);
    }

    /// How many events have come through so far.
    pub fn activity_count(&self) -> u64 {
        self.activity.load(Ordering::Relaxed)
    }

    pub fn streaming(&self) -> bool {
        self.streaming.load(Ordering::Relaxed)
    }

    pub fn ready(&self) -> bool {
        self.streaming() && self.sink_up()
    }
}

/// A probe's answer: 200 (`ok`) or 503, and a one-line plain-text body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub ok: bool,
    pub body: String,
}

/// What the process shares with every session: readiness, metric handles, the shutdown signal.
#[derive(Clone)]
pub struct Handles {
    pub health: Arc<Health>,
    pub metrics: crate::metrics::Metrics,
    pub shutdown: tokio_util::sync::CancellationToken,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_until_the_loop_is_quiet_longer_than_the_timeout() {
        let h = Health::new(Duration::from_secs(120));
        let t0 = h.epoch;
        // Start-up gets one timeout from creation.
        assert_eq!(h.stalled_for(t0 + Duration::from_secs(120)), None);
        assert_eq!(h.stalled_for(t0 + Duration::from_secs(121)), Some(Duration::from_secs(121)));
        h.tick_at(t0 + Duration::from_secs(100));
        assert_eq!(h.stalled_for(t0 + Duration::from_secs(220)), None);
        assert_eq!(h.stalled_for(t0 + Duration::from_millis(220_500)), Some(Duration::from_millis(120_500)));
        // A tick heals it.
        h.tick_at(t0 + Duration::from_secs(300));
        assert_eq!(h.stalled_for(t0 + Duration::from_secs(301)), None);
    }

    #[test]
    fn zero_timeout_never_stalls() {
        let h = Health::new(Duration::ZERO);
        assert_eq!(h.stalled_for(h.epoch + Duration::from_secs(86_400 * 365)), None);
        assert!(h.live());
    }

    #[test]
    fn real_clock_stalls_after_a_short_timeout() {
        let h = Health::new(Duration::from_millis(50));
        h.loop_tick();
        assert!(h.live());
        std::thread::sleep(Duration::from_millis(120));
        assert!(!h.live());
        h.loop_tick();
        assert!(h.live());
    }
}
