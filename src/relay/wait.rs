//! The budgets and the waiting: how much a source may have handed to the sink and not yet
//! resolved, and the loops a source waits in until that changes.
//!
//! Every source (the WAL session, a poll batch, a backfill) asks the same question before it hands
//! over the next record, [`Relay::room`], against the same [`Budget`] (`--max-in-flight` records
//! and `--max-in-flight-bytes` bytes). A source with a `select!` of its own (the WAL session,
//! beside its WAL stream and status timer) reads no more while `room` says no; a source that only
//! waits for acks uses [`Relay::wait_for_room`].
//!
//! # Invariants
//! * A source that asks before every record never has more than `Budget::records` records in
//!   flight. Bytes may overshoot by one record: a record always fits when nothing is in flight,
//!   however large, so a budget delays a record but never refuses it (the size check against the
//!   sink's own limit is the relay's `send`). A dead-letter copy's chunks are handed over together
//!   when the policy settles a refusal (they complete one ticket), so they may overshoot too.
//! * Waiting never reorders: the source hands its records over in its own order, it only pauses.
//! * Every loop here handles acks and the sink's held records as they come (through
//!   [`Relay::wake`] and [`Relay::handle`]), and calls the source's `tick` about once a second, so
//!   a source waiting on a stalled sink still ticks its liveness or prints its progress.

use std::time::Duration;

use tokio::time::{interval_at, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{Ledger, Relay};
use crate::config::Config;
use crate::error::Error;
use crate::sink::Sink;

/// How often a waiting source's `tick` runs.
pub const TICK: Duration = Duration::from_secs(1);

/// `--max-in-flight` and `--max-in-flight-bytes`: what may be handed to the sink and not yet
/// resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub records: usize,
    pub bytes: usize,
}

impl Budget {
    pub fn of(cfg: &Config) -> Budget {
        Budget { records: cfg.max_in_flight, bytes: cfg.max_in_flight_bytes }
    }

    /// Is there room for one more record beside `records` records of `bytes` bytes?
    pub fn admits(&self, records: usize, bytes: usize) -> bool {
        records < self.records && bytes < self.bytes
    }
}

impl<S: Sink> Relay<'_, S> {
    /// May the source hand over one more record? Not while the sink holds records or a budget is
    /// spent.
    pub fn room(&self) -> bool {
        self.cfg.budget.admits(self.in_flight, self.in_flight_bytes) && !self.sink.blocked()
    }

    /// Wait until [`Relay::room`] says yes: the source may hand over one more record.
    pub async fn wait_for_room<L: Ledger>(
        &mut self,
        ledger: &mut L,
        tick: impl FnMut(&mut L, usize),
    ) -> Result<(), Error> {
        self.wait_while(ledger, |r| !r.room(), None, tick).await.map(drop)
    }

    /// [`Relay::wait_for_room`], or until `shutdown` is cancelled: `Ok(false)` then, and the
    /// source hands over nothing more (a stalled sink must not keep a shutdown waiting for room).
    pub async fn wait_for_room_or<L: Ledger>(
        &mut self,
        shutdown: &CancellationToken,
        ledger: &mut L,
        tick: impl FnMut(&mut L, usize),
    ) -> Result<bool, Error> {
        self.wait_while(ledger, |r| !r.room(), Some(shutdown), tick).await
    }

    /// Wait until the sink holds nothing.
    pub async fn until_unblocked<L: Ledger>(
        &mut self,
        ledger: &mut L,
        tick: impl FnMut(&mut L, usize),
    ) -> Result<(), Error> {
        self.wait_while(ledger, |r| r.sink.blocked(), None, tick).await.map(drop)
    }

    /// Wait until at most `limit` records are in flight (0: every record resolved).
    pub async fn wait_until_at_most<L: Ledger>(
        &mut self,
        ledger: &mut L,
        limit: usize,
        tick: impl FnMut(&mut L, usize),
    ) -> Result<(), Error> {
        self.wait_while(ledger, |r| r.in_flight > limit, None, tick).await.map(drop)
    }

    /// Wait until `open(ledger)` is 0; once `shutdown` is cancelled, for at most `timeout` more
    /// (`on_shutdown` runs when it is). `Ok(false)`: the timeout ended the wait with records still
    /// open.
    pub async fn collect<L: Ledger>(
        &mut self,
        ledger: &mut L,
        open: impl Fn(&L) -> usize,
        (shutdown, timeout): (&CancellationToken, Duration),
        on_shutdown: impl FnOnce(&L),
        mut tick: impl FnMut(&mut L, usize),
    ) -> Result<bool, Error> {
        let mut ticks = ticker();
        let mut on_shutdown = Some(on_shutdown);
        let mut deadline: Option<Instant> = None;
        while open(ledger) > 0 {
            if deadline.is_none() && shutdown.is_cancelled() {
                if let Some(f) = on_shutdown.take() {
                    f(ledger);
                }
                deadline = Some(Instant::now() + timeout);
            }
            let until = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                biased;
                w = self.wake() => self.handle(ledger, w).await?,
                _ = shutdown.cancelled(), if deadline.is_none() => {}
                _ = ticks.tick() => tick(ledger, self.in_flight),
                _ = tokio::time::sleep_until(until), if deadline.is_some() => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Handle what wakes the relay while `waiting` holds, ticking meanwhile. `Ok(false)`: `cancel`
    /// ended the wait first.
    async fn wait_while<L: Ledger>(
        &mut self,
        ledger: &mut L,
        waiting: impl Fn(&Self) -> bool,
        cancel: Option<&CancellationToken>,
        mut tick: impl FnMut(&mut L, usize),
    ) -> Result<bool, Error> {
        if !waiting(self) {
            return Ok(true);
        }
        let never = CancellationToken::new();
        let cancel = cancel.unwrap_or(&never);
        let mut ticks = ticker();
        while waiting(self) {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Ok(false),
                w = self.wake() => self.handle(ledger, w).await?,
                _ = ticks.tick() => tick(ledger, self.in_flight),
            }
        }
        Ok(true)
    }
}

/// Ticks every [`TICK`], the first one [`TICK`] from now (a short wait does not tick).
fn ticker() -> tokio::time::Interval {
    let mut t = interval_at(Instant::now() + TICK, TICK);
    t.set_missed_tick_behavior(MissedTickBehavior::Delay);
    t
}

#[cfg(test)]
mod tests {
    use super::Budget;

    #[test]
    fn a_budget_admits_below_both_limits_only() {
        let b = Budget { records: 3, bytes: 100 };
        assert!(b.admits(0, 0));
        assert!(b.admits(2, 99));
        assert!(!b.admits(3, 0), "the record budget is spent");
        assert!(!b.admits(0, 100), "the byte budget is spent");
    }

    #[test]
    fn one_record_of_any_size_fits_when_nothing_is_in_flight() {
        // The budget is checked before a record, against what is already in flight: a record
        // larger than the byte budget still goes when it would be alone.
        let b = Budget { records: 1, bytes: 1024 };
        assert!(b.admits(0, 0));
        assert!(!b.admits(1, 0));
    }
}
