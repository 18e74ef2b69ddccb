//! The waiting: the loops a source waits in until the relay has room for its next record, the
//! sink holds nothing, or its records are acked.
//!
//! Every source (the WAL session, a poll batch, a backfill) asks the same question before it
//! hands over the next record, [`Relay::room`]: the sink holds nothing and the [`super::Budget`]
//! (`--max-in-flight` records, `--max-in-flight-bytes` bytes) admits one more. A source with a
//! `select!` of its own (the WAL session, beside its WAL stream and status timer) reads no more
//! while `room` says no; a source that only waits for acks uses [`Relay::wait_for_room`].
//!
//! # Invariants
//! * A source that asks before every record never has more than the budget's records in flight,
//!   and its bytes pass the budget by one record at most. A dead-letter copy's chunks are handed
//!   over together when the policy settles a refusal (they complete one ticket), so they may
//!   overshoot too.
//! * Waiting never reorders: the source hands its records over in its own order, it only pauses.
//! * Every loop here handles acks and the sink's held records as they come (through
//!   [`Relay::wake`] and [`Relay::handle`]), and calls the source's `tick` about once a second, so
//!   a source waiting on a stalled sink still ticks its liveness or prints its progress.

use std::time::Duration;

use tokio::time::{interval_at, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{Ledger, Relay};
use crate::error::Error;
use crate::sink::Sink;

/// How often a waiting source's `tick` runs.
pub const TICK: Duration = Duration::from_secs(1);

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
