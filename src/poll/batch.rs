//! One batch: route the claimed rows, hand them all to the sink at once, collect their acks, and
//! sort every row into what the closing statements write.
//!
//! Each row's records carry a [`Delivery`] numbered by the row's place in the batch (the same
//! handle `run` uses, so every sink works unchanged, and a handle dropped unresolved is a failure,
//! never an ack). A row ends in one [`Fate`]:
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
//! Nothing here waits for a broker that is down: the records stay in flight (the sink retries
//! them) and the batch waits, so an outage costs time, never a try.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ack::{Ack, Delivery, Outcome, Position, Source, TxnId};
use crate::config::{BadEventPolicy, Config};
use crate::dlq::{copy_refused, record_size, DeadLetter};
use crate::error::{Definite, Error};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::pg::replication::pg_now_us;
use crate::pipeline::route_masked;
use crate::router::{OutboxRow, Record, Route};
use crate::sink::{Sink, SinkError};

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

pub struct Batch<'a, S: Sink> {
    ctx: BatchCtx<'a>,
    sink: &'a mut S,
    /// Fires when a task the sink depends on died ([`Sink::failure`]).
    sink_failure: crate::task::Failure,
    pub slots: Vec<Slot>,
    tx: UnboundedSender<Ack>,
    rx: UnboundedReceiver<Ack>,
    /// Dead-letter copies waiting to be sent, with their row: queued by the policy, sent by the
    /// loop (so resolving an ack never has to wait on the sink).
    copies: VecDeque<(usize, Record)>,
    /// Keys of aggregates one of whose rows was refused in this batch: their later rows wait.
    held: HashSet<Option<Bytes>>,
}

impl<'a, S: Sink> Batch<'a, S> {
    pub fn new(ctx: BatchCtx<'a>, sink: &'a mut S) -> Self {
        let (tx, rx) = unbounded_channel();
        let sink_failure = sink.failure().unwrap_or_default();
        Batch { ctx, sink, sink_failure, slots: Vec::new(), tx, rx, copies: VecDeque::new(), held: HashSet::new() }
    }

    /// Route and send every row, then wait for every record to resolve (or for the shutdown
    /// timeout after a shutdown request). A definite error (a `fail` policy, a failed delivery)
    /// ends the batch at once; the rows resolved so far stay in `slots` for the caller to write.
    pub async fn run(&mut self, rows: Vec<Claimed>) -> Result<(), Error> {
        let now_us = pg_now_us();
        for row in rows {
            let i = self.slots.len();
            self.slots.push(Slot {
                seq: row.seq,
                attempts: row.attempts,
                event_id: String::new(),
                fate: Fate::Open { pending: 1, dead_letter: None },
            });
            self.wait_unblocked().await?;
            self.send_row(i, &row, now_us).await?;
            self.send_copies().await?;
        }
        self.collect().await
    }

    /// Row `i`'s place: poll reads no WAL, so dead-letter copies carry the row's seq.
    fn source(&self, i: usize) -> Source {
        Source { position: Position::Seq(self.slots[i].seq), table: self.ctx.table.clone() }
    }

    async fn send_row(&mut self, i: usize, row: &Claimed, now_us: i64) -> Result<(), Error> {
        let out = OutboxRow { tuple: &row.tuple, commit_time_us: now_us };
        let record = match route_masked(self.ctx.cfg, self.ctx.route, out) {
            Ok(r) => r,
            Err(bad) => {
                // Routing is a fact about the row: trying again cannot change it.
                if self.hold(i, &bad.key) {
                    return Ok(());
                }
                self.held.insert(bad.key.clone());
                self.slots[i].event_id = bad.event_id.clone().unwrap_or_default();
                self.ctx.metrics.failed(bad.code);
                let dl = DeadLetter::from_bad_event(bad, self.source(i));
                return self.give_up(i, dl, 0);
            }
        };
        if self.hold(i, &record.key) {
            return Ok(());
        }
        self.slots[i].event_id = record.event_id.clone();
        self.ctx.metrics.poll_tries.increment(1);
        if let Some(max) = self.sink.max_message_bytes() {
            let size = record_size(record.key.as_ref(), record.payload.as_ref(), &record.headers);
            if size > max {
                let message = format!("record of {size} bytes exceeds message.max.bytes {max}");
                let dl = DeadLetter::from_record(record, "too_large", message, self.source(i));
                return self.refused(i, dl);
            }
        }
        let delivery = self.delivery(i, &record);
        match self.sink.send(record, delivery).await {
            Ok(()) => Ok(()),
            Err(e) => self.on_sink_error(e),
        }
    }

    /// Row `i` waits when an older row of its aggregate was refused in this batch (order).
    fn hold(&mut self, i: usize, key: &Option<Bytes>) -> bool {
        let held = self.held.contains(key);
        if held {
            self.slots[i].fate = Fate::Held;
        }
        held
    }

    fn delivery(&self, i: usize, record: &Record) -> Delivery {
        Delivery::new(
            TxnId::from_index(i as u64),
            record.event_id.clone(),
            record.topic.clone(),
            self.source(i),
            self.tx.clone(),
        )
    }

    fn on_sink_error(&mut self, e: SinkError) -> Result<(), Error> {
        match e {
            SinkError::Fatal(d) => Err(d.into()),
            SinkError::Rejected { code, reason, record, delivery } => {
                let i = delivery.txn().index() as usize;
                let dead_letter = delivery.is_dead_letter();
                delivery.disarm();
                if dead_letter {
                    return Err(copy_refused(record.event_id, record.topic, &reason).into());
                }
                let dl = DeadLetter::from_record(*record, code, reason, self.source(i));
                self.refused(i, dl)
            }
        }
    }

    /// The sink refused row `i`'s record for good: a failed try, and past the last one, the
    /// bad-event policy.
    fn refused(&mut self, i: usize, dl: DeadLetter) -> Result<(), Error> {
        let m = self.ctx.metrics;
        self.held.insert(dl.key.clone());
        m.poll_errors.increment(1);
        let tries = self.slots[i].attempts.saturating_add(1);
        if (tries as i64) < self.ctx.cfg.poll.max_attempts as i64 {
            tracing::warn!(event_id = %self.slots[i].event_id, seq = self.slots[i].seq, tries, reason = dl.code, message = %dl.message, "the sink refused the event; it will be tried again after a backoff");
            self.slots[i].fate = Fate::Retry { error: format!("{} ({})", dl.message, dl.code) };
            return Ok(());
        }
        m.failed(dl.code);
        self.give_up(i, dl, 1)
    }

    /// Row `i` will not be delivered as it is: `--on-bad-event`. `tries` is 1 when this ends a
    /// failed try (it counts), 0 for a row the router refused.
    fn give_up(&mut self, i: usize, dl: DeadLetter, tries: i32) -> Result<(), Error> {
        let total = self.slots[i].attempts.saturating_add(tries);
        let error = format!("{} ({}) after {total} failed tries", dl.message, dl.code);
        match self.ctx.cfg.on_bad_event {
            BadEventPolicy::Fail => Err(dl.into_failure(error).into()),
            BadEventPolicy::Skip => {
                tracing::error!(event_id = ?dl.event_id, seq = self.slots[i].seq, reason = dl.code, message = %dl.message, "skipping bad event (--on-bad-event skip)");
                self.slots[i].fate = Fate::Finished { error: format!("skipped: {error}"), tries };
                Ok(())
            }
            BadEventPolicy::Dlq => {
                let cfg = self.ctx.cfg;
                tracing::warn!(event_id = ?dl.event_id, seq = self.slots[i].seq, reason = dl.code, message = %dl.message, dlq = %cfg.dlq_topic, "sending bad event to the dead-letter topic");
                self.ctx.metrics.dead_lettered(dl.code);
                let max = self.sink.dead_letter_max_bytes().unwrap_or(usize::MAX);
                let records = dl.into_records(&cfg.dlq_topic, max);
                // Every chunk counts before any is sent: the row cannot finish on a partial copy.
                self.slots[i].fate = Fate::Open {
                    pending: records.len(),
                    dead_letter: Some((format!("dead-lettered to {}: {error}", cfg.dlq_topic), tries)),
                };
                self.copies.extend(records.into_iter().map(|r| (i, r)));
                Ok(())
            }
        }
    }

    /// Send the queued dead-letter copies.
    async fn send_copies(&mut self) -> Result<(), Error> {
        while let Some((i, record)) = self.copies.pop_front() {
            self.wait_unblocked().await?;
            let delivery = self.delivery(i, &record).for_dead_letter();
            if let Err(e) = self.sink.send(record, delivery).await {
                self.on_sink_error(e)?;
            }
        }
        Ok(())
    }

    /// Before a send: while the sink holds records it could not hand over, make it progress
    /// (acks still count meanwhile).
    async fn wait_unblocked(&mut self) -> Result<(), Error> {
        while self.sink.blocked() {
            tokio::select! {
                biased;
                Some(ack) = self.rx.recv() => self.on_ack(ack)?,
                r = self.sink.unblock() => if let Err(e) = r { self.on_sink_error(e)? },
                e = self.sink_failure.wait() => return Err(e.into()),
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => self.ctx.health.loop_tick(),
            }
        }
        Ok(())
    }

    fn open(&self) -> usize {
        self.slots.iter().filter(|s| matches!(s.fate, Fate::Open { .. })).count()
    }

    /// Wait until every record resolved; after a shutdown request, at most `--shutdown-timeout`.
    async fn collect(&mut self) -> Result<(), Error> {
        let mut deadline: Option<Instant> = None;
        loop {
            self.send_copies().await?;
            if self.open() == 0 {
                break;
            }
            if deadline.is_none() && self.ctx.shutdown.is_cancelled() {
                tracing::info!(open = self.open(), "shutdown requested; waiting for the batch's acks");
                deadline = Some(Instant::now() + self.ctx.cfg.shutdown_timeout);
            }
            let until = deadline.unwrap_or_else(|| Instant::now() + std::time::Duration::from_secs(3600));
            let blocked = self.sink.blocked();
            tokio::select! {
                biased;
                Some(ack) = self.rx.recv() => self.on_ack(ack)?,
                r = self.sink.unblock(), if blocked => if let Err(e) = r { self.on_sink_error(e)? },
                e = self.sink_failure.wait() => return Err(e.into()),
                _ = self.ctx.shutdown.cancelled(), if deadline.is_none() => {}
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => self.ctx.health.loop_tick(),
                _ = tokio::time::sleep_until(until), if deadline.is_some() => {
                    tracing::warn!(open = self.open(), "shutdown timeout: leaving the batch's unacked rows unpublished; they are claimed again on the next start");
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn on_ack(&mut self, ack: Ack) -> Result<(), Error> {
        let i = ack.txn.index() as usize;
        let Some(slot) = self.slots.get_mut(i) else {
            return Err(Definite::Bug(format!("ack for row {i} of a batch of {}", self.slots.len())).into());
        };
        match ack.outcome {
            Outcome::Acked => {
                if let Fate::Open { pending, dead_letter } = &mut slot.fate {
                    *pending = pending.saturating_sub(1);
                    if *pending == 0 {
                        slot.fate = match dead_letter.take() {
                            Some((error, tries)) => Fate::Finished { error, tries },
                            None => Fate::Acked,
                        };
                    }
                }
                if !ack.dead_letter {
                    self.ctx.metrics.acked(&ack.topic);
                }
                self.ctx.health.activity();
                Ok(())
            }
            Outcome::Failed { reason } => {
                self.ctx.metrics.failed("delivery");
                Err(Definite::Delivery { event_id: ack.event_id, topic: ack.topic, reason }.into())
            }
            Outcome::Rejected(refusal) => {
                if ack.dead_letter {
                    self.ctx.metrics.failed(refusal.code);
                    return Err(copy_refused(ack.event_id, ack.topic, &refusal.reason).into());
                }
                let dl = DeadLetter::from_refusal(ack.event_id, ack.topic, refusal, ack.source);
                self.refused(i, dl)
            }
        }
    }
}
