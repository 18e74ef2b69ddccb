//! One batch: route the claimed rows, hand them all to the sink at once, collect their acks, and
//! sort every row into what the closing statements write.
//!
//! The rows go to the sink through the [`Relay`], with the batch's rows as its ledger ([`Rows`]): a
//! record's ticket is its row's place in the batch. A row ends in one [`Fate`]:
//! * `Acked`: the sink took it → marked published (or deleted);
//! * `Retry`: the sink refused it for good and tries remain → one failed try recorded, with the
//!   error and the time of the next try;
//! * `Finished`: dead-lettered (its copy acked) or skipped → marked with the reason;
//! * `Open`: not resolved when the batch ended (shutdown timeout) → left as it is, claimed again;
//! * `Held`: not sent, because an older row of its aggregate was refused earlier in this batch →
//!   left as it is (it waits behind that row). Rows already in flight when a refusal arrives in a
//!   delivery report cannot be recalled; a refusal found before sending (too large, a refusal
//!   from `send`) holds every later row of the aggregate.
//!
//! A refusal by the sink is one failed try (`Retry`) while tries remain; after the last, and for a
//! row the router refuses (trying again cannot change it), `--on-bad-event` applies in the relay.
//!
//! The batch holds the relay's budgets like every source: before each record it waits for
//! [`Relay::room`] (`--max-in-flight`, `--max-in-flight-bytes`), so a batch larger than the budget
//! sends its rows as the acks of its earlier ones make room, in claim order (waiting never
//! reorders, so each aggregate's order holds).
//!
//! Nothing here waits for a broker that is down: the records stay in flight (the sink retries
//! them) and the batch waits, so an outage costs time, never a try.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::{Definite, Error};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::pg::replication::pg_now_us;
use crate::relay::dead_letter::DeadLetter;
use crate::relay::route_masked;
use crate::relay::{Ledger, Position, Refused, RefusedBy, Relay, RelayConfig, Settled, Source, Ticket};
use crate::router::{OutboxRow, Route};
use crate::sink::Sink;

use super::sql::Claimed;

/// What became of one row of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Records still unresolved (the row's own, or its dead-letter chunks, with the error and
    /// failed tries the row finishes with once they are acked).
    Open {
        pending: usize,
        dead_letter: Option<(String, i32)>,
    },
    Acked,
    Retry {
        error: String,
    },
    /// Done with an error: dead-lettered or skipped. `tries` failed tries to add.
    Finished {
        error: String,
        tries: i32,
    },
    /// Not sent: an older row of its aggregate was refused in this batch. Left as it is.
    Held,
}

/// One row in flight.
pub struct Slot {
    pub seq: i64,
    pub attempts: i32,
    pub event_id: String,
    pub fate: Fate,
    /// Failed tries this row ends with if the bad-event policy settles it (1 for the sink's
    /// refusal that used up its last try, 0 for the router's).
    tries: i32,
}

/// What a batch needs from the poller.
pub struct BatchCtx<'a> {
    pub cfg: &'a Config,
    pub route: &'a Route,
    pub table: Arc<str>,
    pub metrics: &'a Metrics,
    pub health: &'a Health,
    pub shutdown: &'a CancellationToken,
}

/// The batch's ledger: one ticket per row (its index), and the aggregates that wait.
pub struct Rows<'a> {
    cfg: &'a Config,
    metrics: &'a Metrics,
    health: &'a Health,
    pub slots: Vec<Slot>,
    /// Keys of aggregates one of whose rows was refused in this batch: their later rows wait.
    held: HashSet<Option<Bytes>>,
}

pub struct Batch<'a, S: Sink> {
    route: &'a Route,
    table: Arc<str>,
    shutdown: &'a CancellationToken,
    relay: Relay<'a, S>,
    pub rows: Rows<'a>,
}

impl<'a, S: Sink> Batch<'a, S> {
    pub fn new(ctx: BatchCtx<'a>, sink: &'a mut S) -> Self {
        Batch {
            route: ctx.route,
            table: ctx.table,
            shutdown: ctx.shutdown,
            relay: Relay::new(sink, RelayConfig::of(ctx.cfg), ctx.metrics.clone()).reporting_in_flight(),
            rows: Rows {
                cfg: ctx.cfg,
                metrics: ctx.metrics,
                health: ctx.health,
                slots: Vec::new(),
                held: HashSet::new(),
            },
        }
    }

    /// Route and send every row, then wait for every record to resolve (or for the shutdown
    /// timeout after a shutdown request). A definite error (a `fail` policy, a failed delivery)
    /// ends the batch at once; the rows resolved so far stay in `rows.slots` for the caller to
    /// write.
    pub async fn run(&mut self, rows: Vec<Claimed>) -> Result<(), Error> {
        let now_us = pg_now_us();
        for row in rows {
            // After a shutdown request the rows not handed over yet are left as they are: the
            // next claim takes them again.
            if !self.relay.wait_for_room_or(self.shutdown, &mut self.rows, Rows::tick).await? {
                break;
            }
            let i = self.rows.slots.len();
            self.rows.slots.push(Slot {
                seq: row.seq,
                attempts: row.attempts,
                event_id: String::new(),
                fate: Fate::Open { pending: 1, dead_letter: None },
                tries: 0,
            });
            self.send_row(i, &row, now_us).await?;
        }
        self.collect().await
    }

    /// Wait until every record resolved; after a shutdown request, at most `--shutdown-timeout`.
    async fn collect(&mut self) -> Result<(), Error> {
        let stop = (self.shutdown, self.rows.cfg.shutdown_timeout);
        let waiting = |rows: &Rows| {
            tracing::info!(open = rows.open(), "shutdown requested; waiting for the batch's acks");
        };
        if !self.relay.collect(&mut self.rows, Rows::open, stop, waiting, Rows::tick).await? {
            tracing::warn!(open = self.rows.open(), "shutdown timeout: leaving the batch's unacked rows unpublished; they are claimed again on the next start");
        }
        Ok(())
    }

    /// Row `i`'s place: poll reads no WAL, so dead-letter copies carry the row's seq.
    fn source(&self, i: usize) -> Source {
        Source { position: Position::Seq(self.rows.slots[i].seq), table: self.table.clone() }
    }

    async fn send_row(&mut self, i: usize, row: &Claimed, now_us: i64) -> Result<(), Error> {
        let out = OutboxRow { tuple: &row.tuple, commit_time_us: now_us };
        let source = self.source(i);
        let t = Ticket(i as u64);
        match route_masked(self.rows.cfg, self.route, out) {
            Ok(record) => {
                if self.rows.hold(i, &record.key) {
                    return Ok(());
                }
                self.rows.slots[i].event_id = record.event_id.to_string();
                self.rows.metrics.poll_tries.increment(1);
                self.relay.send(&mut self.rows, t, record, source).await
            }
            Err(bad) => {
                if self.rows.hold(i, &bad.key) {
                    return Ok(());
                }
                self.rows.slots[i].event_id = bad.event_id.clone().unwrap_or_default();
                self.relay.bad_row(&mut self.rows, t, bad, source).await
            }
        }
    }
}

impl Rows<'_> {
    /// Row `i` waits when an older row of its aggregate was refused in this batch (order).
    fn hold(&mut self, i: usize, key: &Option<Bytes>) -> bool {
        let held = self.held.contains(key);
        if held {
            self.slots[i].fate = Fate::Held;
        }
        held
    }

    /// About once a second while the batch waits in the relay: liveness.
    fn tick(&mut self, _in_flight: usize) {
        self.health.loop_tick();
    }

    fn open(&self) -> usize {
        self.slots.iter().filter(|s| matches!(s.fate, Fate::Open { .. })).count()
    }

    fn slot(&mut self, t: Ticket) -> Result<&mut Slot, Error> {
        let n = self.slots.len();
        self.slots
            .get_mut(t.0 as usize)
            .ok_or_else(|| Definite::Bug(format!("ticket for row {} of a batch of {n}", t.0)).into())
    }
}

impl Ledger for Rows<'_> {
    fn add(&mut self, t: Ticket, n: usize) -> Result<(), Error> {
        if let Fate::Open { pending, .. } = &mut self.slot(t)?.fate {
            *pending += n;
        }
        Ok(())
    }

    fn done(&mut self, t: Ticket) -> Result<(), Error> {
        self.health.activity();
        let slot = self.slot(t)?;
        if let Fate::Open { pending, dead_letter } = &mut slot.fate {
            *pending = pending.saturating_sub(1);
            if *pending == 0 {
                slot.fate = match dead_letter.take() {
                    Some((error, tries)) => Fate::Finished { error, tries },
                    None => Fate::Acked,
                };
            }
        }
        Ok(())
    }

    /// The sink's refusal is one failed try; past the last one, and for the router's, the policy.
    fn refused(&mut self, t: Ticket, dl: &DeadLetter, by: RefusedBy) -> Refused {
        self.held.insert(dl.key.clone());
        let Some(slot) = self.slots.get_mut(t.0 as usize) else {
            return Refused::Policy { reason: format!("{} ({})", dl.message, dl.code) };
        };
        let tries = match by {
            RefusedBy::Router | RefusedBy::Format => 0,
            RefusedBy::Sink => {
                self.metrics.poll_errors.increment(1);
                let tries = slot.attempts.saturating_add(1);
                if (tries as i64) < self.cfg.poll.max_attempts as i64 {
                    tracing::warn!(event_id = %slot.event_id, seq = slot.seq, tries, reason = dl.code, message = %dl.message, "the sink refused the event; it will be tried again after a backoff");
                    slot.fate = Fate::Retry { error: format!("{} ({})", dl.message, dl.code) };
                    return Refused::Kept;
                }
                1
            }
        };
        slot.tries = tries;
        let total = slot.attempts.saturating_add(tries);
        Refused::Policy { reason: format!("{} ({}) after {total} failed tries", dl.message, dl.code) }
    }

    fn settled(&mut self, t: Ticket, how: Settled, reason: &str) {
        let topic = &self.cfg.dlq_topic;
        let Some(slot) = self.slots.get_mut(t.0 as usize) else { return };
        let tries = slot.tries;
        slot.fate = match how {
            Settled::Skipped => Fate::Finished { error: format!("skipped: {reason}"), tries },
            // The row's own record is still open; the copy's chunks are added to it next.
            Settled::DeadLettered => {
                Fate::Open { pending: 1, dead_letter: Some((format!("dead-lettered to {topic}: {reason}"), tries)) }
            }
        };
    }
}
