//! The relay engine: the one loop body that drives a sink for every source.
//!
//! ```text
//!  source (WAL session, poll batch, backfill) ──Record + Ticket──▶ Relay ──Record + Delivery──▶ Sink
//!        ▲                                                          │  ▲                          │
//!        └──────── Ledger: add / done / refused / failed ◀──────────┘  └────────── Ack ◀──────────┘
//! ```
//!
//! A source counts each record under a [`Ticket`] in its own [`Ledger`] before handing it here:
//! the WAL session's ledger is the LSN tracker (a ticket is a transaction), poll's is its batch's
//! row fates (a ticket is a row), backfill's is its summary (one ticket for everything). The relay
//! owns what they all share, once:
//! * the ack queue ([`crate::sink::acks`]), and the count and bytes of records handed to the sink
//!   and not yet resolved;
//! * the budgets (`--max-in-flight`, `--max-in-flight-bytes`) every source checks before handing
//!   over more ([`budget`], [`Relay::room`]), and the loops a source waits in for room, for the
//!   sink's held records, or for its acks ([`wait`]);
//! * the size check against the sink's limit before a record is sent;
//! * the sink's held records ([`Sink::blocked`] / [`Sink::unblock`]) and its background tasks'
//!   failure, as one cancel-safe [`Relay::wake`] a source puts in its own `select!` beside its own
//!   arms (WAL, status timer, shutdown), with [`Relay::handle`] in the arm's body;
//! * a refusal (by the router or, for good, by the sink) → the ledger says whether
//!   `--on-bad-event` applies ([`Refused::Policy`]) or it keeps the record itself (poll's next try,
//!   backfill's count) → `fail` stops, `skip` resolves, `dlq` sends a copy ([`dead_letter`]), in
//!   chunks when it is over the sink's limit ([`chunk`]);
//! * routing and masking a row before anything can see it ([`route_masked`]).
//!
//! The handle a sink resolves ([`Delivery`]) and what comes back ([`Ack`]) are the sinks' contract
//! and live beside them, in [`crate::sink::delivery`].
//!
//! # Invariants
//! * A ticket completes only through [`Ledger::done`], called once per record counted under it: on
//!   the sink's ack, on a skip, or on the ack of each dead-letter chunk (a run of consecutive acks
//!   of one ticket arrives as one [`Ledger::done_many`], before anything later reaches the
//!   ledger). A copy's chunks are all counted ([`Ledger::add`]) before the original is resolved
//!   and before any chunk is sent, so a ticket never completes on a partial copy.
//! * A dead-letter copy is never dead-lettered again: its refusal stops the source.
//! * Nothing here waits on the destination: `send` hands over or the sink holds the record, and
//!   the source stops reading while [`Relay::room`] says no.

pub mod budget;
mod took;
pub mod wait;

pub use crate::sink::dead_letter::{self, chunk};

use crate::config::BadEventPolicy;
use crate::config::Config;
use crate::error::{Definite, Error, Transient};
use crate::format::{Encoder, Failure, RegistryConfig};
use crate::metrics::Metrics;
use crate::router::{BadEvent, OutboxRow, Record, Route, Text};
use crate::sink::acks::{ack_queue, AckReceiver, AckSender};
pub use crate::sink::delivery::{About, Ack, Delivery, Outcome, Position, Refusal, Source, Ticket};
use crate::sink::{Sink, SinkError};
pub use budget::Budget;
use dead_letter::{copy_part, copy_refused, record_size, DeadLetter};

/// Where a source keeps the fate of its records: what a [`Ticket`] means is its own business.
pub trait Ledger {
    /// `n` more records (dead-letter chunks) are counted under `t`, whose own record is still open.
    fn add(&mut self, t: Ticket, n: usize) -> Result<(), Error>;

    /// One record counted under `t` is finished: acked by the sink, skipped, or a chunk of its
    /// dead-letter copy acked.
    fn done(&mut self, t: Ticket) -> Result<(), Error>;

    /// `n` records counted under `t` are finished: a run of acks of one ticket (the records of one
    /// transaction, acked in a row), as `n` calls of [`Ledger::done`] would finish them.
    fn done_many(&mut self, t: Ticket, n: usize) -> Result<(), Error> {
        for _ in 0..n {
            self.done(t)?;
        }
        Ok(())
    }

    /// The record of `t` will not be delivered as it is. [`Refused::Policy`] hands it to
    /// `--on-bad-event`; [`Refused::Kept`] means the ledger resolved it itself.
    fn refused(&mut self, t: Ticket, dl: &DeadLetter, by: RefusedBy) -> Refused;

    /// The policy settled the record of `t` (before the copy's chunks are counted): poll writes
    /// the reason on its row. `reason` is what [`Refused::Policy`] gave.
    fn settled(&mut self, _t: Ticket, _how: Settled, _reason: &str) {}

    /// A record could never be delivered (the sink's `fail()`, or a dropped handle). Stops the
    /// source unless the ledger only reports (backfill).
    fn failed(&mut self, ack: Ack, reason: String) -> Result<(), Error> {
        Err(Definite::Delivery { event_id: ack.event_id().into(), topic: ack.topic.into(), reason }.into())
    }
}

/// Who refused a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusedBy {
    /// The router: a fact about the row, the same on every try.
    Router,
    /// The destination, for good (too large, a refusal from `send` or in a delivery report).
    Sink,
    /// The value format: the payload does not fit its registered schema, or its subject has none
    /// (a fact about the row, the same on every try, like the router's).
    Format,
}

/// What a ledger makes of a refusal.
#[derive(Debug)]
pub enum Refused {
    /// Apply `--on-bad-event`; `reason` is the text a `fail` stops with.
    Policy { reason: String },
    /// The ledger resolved it (poll tries again later; backfill counts it undelivered).
    Kept,
}

/// How the policy settled a bad event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    Skipped,
    /// A copy goes to the dead-letter topic (named in [`RelayConfig`]).
    DeadLettered,
}

/// What [`Relay::offer`] could not finish without an await; [`Relay::finish`] does the rest.
pub(crate) enum Pending {
    /// A value format is configured: the record is encoded (which may await the registry).
    Format(Ticket, Record, Source),
    /// The sink did not take the record, or it is over the sink's size limit.
    NotTaken(Ticket, NotTaken),
    /// The router refused the row: the bad-event policy.
    Bad(Ticket, BadEvent, Source),
}

/// Why [`Relay::hand_over`] did not hand a record over.
pub(crate) enum NotTaken {
    /// Over the sink's size limit: a bad event.
    Refused(DeadLetter),
    /// What the sink's `send` said.
    Sink(SinkError),
}

/// What woke the relay; feed it to [`Relay::handle`].
pub enum Wake {
    Ack(Ack),
    Unblocked(Result<(), SinkError>),
    SinkFailed(Error),
    /// The sink's open transaction is due ([`Sink::due`]).
    Due,
}

/// The relay's share of the configuration.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    pub on_bad_event: BadEventPolicy,
    pub dlq_topic: String,
    /// `--value-converter avro`: the registry the values are encoded with ([`crate::format`]).
    pub registry: Option<RegistryConfig>,
    /// What may be in flight at once ([`Relay::room`]).
    pub budget: Budget,
}

impl RelayConfig {
    pub fn of(cfg: &Config) -> RelayConfig {
        RelayConfig {
            on_bad_event: cfg.on_bad_event,
            dlq_topic: cfg.dlq_topic.clone(),
            registry: cfg.registry.clone(),
            budget: Budget::of(cfg),
        }
    }
}

pub struct Relay<'a, S: Sink> {
    sink: &'a mut S,
    cfg: RelayConfig,
    metrics: Metrics,
    /// The acks' way back ([`crate::sink::acks`]): a clone of `tx` rides in every delivery handle.
    tx: AckSender<Ack>,
    rx: AckReceiver<Ack>,
    /// Fires when a task the sink depends on died ([`Sink::failure`]).
    sink_failure: crate::task::Failure,
    /// Records handed to the sink and not yet resolved, and their bytes.
    in_flight: usize,
    in_flight_bytes: usize,
    /// `outboxd_events_in_flight`, when this relay's source reports it through the relay (poll).
    in_flight_gauge: Option<metrics::Gauge>,
    /// The value encoder (`--value-converter avro`), or why it could not be built.
    format: Option<Result<Encoder, String>>,
    /// Acked records per topic not yet added to `outboxd_events_total` ([`Relay::on_acks`]).
    acked: Vec<(Text, u64)>,
}

impl<'a, S: Sink> Relay<'a, S> {
    pub fn new(sink: &'a mut S, cfg: RelayConfig, metrics: Metrics) -> Self {
        let (tx, rx) = ack_queue();
        let sink_failure = sink.failure().unwrap_or_default();
        let format = cfg.registry.as_ref().map(Encoder::new);
        Relay {
            sink,
            cfg,
            metrics,
            tx,
            rx,
            sink_failure,
            in_flight: 0,
            in_flight_bytes: 0,
            in_flight_gauge: None,
            format,
            acked: Vec::new(),
        }
    }

    /// Keep `outboxd_events_in_flight` at this relay's count (for a source that has no count of
    /// its own to report: the WAL session reports its tracker's).
    pub fn reporting_in_flight(mut self) -> Self {
        self.in_flight_gauge = Some(self.metrics.in_flight.clone());
        self
    }

    /// The session reads no more (shutdown): see [`Sink::finishing`].
    pub fn finishing(&mut self) {
        self.sink.finishing();
    }

    pub fn sink(&mut self) -> &mut S {
        self.sink
    }

    /// Records handed to the sink and not yet resolved.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Bytes of the records handed to the sink and not yet resolved.
    pub fn in_flight_bytes(&self) -> usize {
        self.in_flight_bytes
    }

    pub fn blocked(&self) -> bool {
        self.sink.blocked()
    }

    /// Wait for an ack, a step on the sink's held records (only while it holds some), or the death
    /// of a task it depends on. Cancel-safe: nothing is taken before it is returned.
    pub async fn wake(&mut self) -> Wake {
        let blocked = self.sink.blocked();
        let stepping = blocked || self.sink.settling();
        let due = if blocked { None } else { self.sink.due() };
        // `select!` builds every arm's future, the disabled ones too, on every call: the sink's
        // step is built lazily and boxed when first polled (only while stepping), so the wake
        // future a source's loop builds per turn does not carry the largest sink's step inline.
        let sink = &mut *self.sink;
        tokio::select! {
            biased;
            ack = self.rx.recv() => Wake::Ack(ack),
            r = async { Box::pin(sink.unblock()).await }, if stepping => Wake::Unblocked(r),
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => Wake::Due,
            e = self.sink_failure.wait() => Wake::SinkFailed(e.into()),
        }
    }

    /// Act on what [`Relay::wake`] returned: an ack (and every other already queued), or the sink's
    /// step.
    pub async fn handle(&mut self, ledger: &mut impl Ledger, wake: Wake) -> Result<(), Error> {
        match wake {
            Wake::Ack(ack) => self.on_acks(ledger, ack).await,
            Wake::Unblocked(Ok(())) => Ok(()),
            // The rare paths are boxed: this future is built per wake.
            Wake::Unblocked(Err(e)) => Box::pin(self.on_sink_error(ledger, e)).await,
            Wake::SinkFailed(e) => Err(e),
            Wake::Due => match Box::pin(self.sink.commit()).await {
                Ok(()) => Ok(()),
                Err(e) => Box::pin(self.on_sink_error(ledger, e)).await,
            },
        }
    }

    /// After the source's loop ended: hand every ack already queued to `done` (its ticket), until
    /// it returns false. Each is taken as [`Relay::apply_acks`] takes it ([`Relay::took`]: counted
    /// in `outboxd_events_total`, its span ended); failures and refusals are dropped after that,
    /// as nothing acts on them any more.
    pub fn drain_acked(&mut self, mut done: impl FnMut(Ticket) -> bool) {
        while let Some(ack) = self.rx.try_recv() {
            if let Ok(t) = self.took(ack) {
                if !done(t) {
                    break;
                }
            }
        }
        self.count_acked();
    }

    /// Send a record counted under `t`, checking its size first.
    ///
    /// The usual record (no value format; it fits; the sink takes it) is handed over without an
    /// await ([`Relay::hand_over`]). What awaits — the registry's encoding, the bad-event policy
    /// — is boxed, so this future, which a source builds and moves per record, holds little more
    /// than its arguments.
    pub async fn send(
        &mut self,
        ledger: &mut impl Ledger,
        t: Ticket,
        record: Record,
        source: Source,
    ) -> Result<(), Error> {
        match self.offer(t, record, source) {
            Ok(()) => Ok(()),
            Err(pending) => Box::pin(self.finish(ledger, pending)).await,
        }
    }

    /// [`Relay::send`] for a source whose per-record path is synchronous (the WAL session): hands
    /// the record over when nothing needs an await, else returns what does, for
    /// [`Relay::finish`]. The record is moved once, into the sink, rather than into each `async
    /// fn`'s state on the way (a `Record` is ~200 bytes).
    #[inline]
    pub(crate) fn offer(&mut self, t: Ticket, record: Record, source: Source) -> Result<(), Box<Pending>> {
        if self.format.is_some() {
            return Err(Box::new(Pending::Format(t, record, source)));
        }
        self.hand_over(t, record, source).map_err(|slow| Box::new(Pending::NotTaken(t, *slow)))
    }

    /// The part of a send [`Relay::offer`] left: the registry's encoding, the bad-event policy,
    /// a sink's error.
    pub(crate) async fn finish(&mut self, ledger: &mut impl Ledger, pending: Box<Pending>) -> Result<(), Error> {
        match *pending {
            Pending::Format(t, record, source) => self.send_formatted(ledger, t, record, source).await,
            Pending::NotTaken(t, slow) => self.not_taken(ledger, t, slow).await,
            Pending::Bad(t, bad, source) => self.bad_row(ledger, t, bad, source).await,
        }
    }

    /// [`Relay::send`] with a value format: encode, then hand over.
    async fn send_formatted(
        &mut self,
        ledger: &mut impl Ledger,
        t: Ticket,
        record: Record,
        source: Source,
    ) -> Result<(), Error> {
        let mut record = record;
        if let Some(format) = self.format.as_mut() {
            let encoder = format.as_mut().map_err(|e| Definite::Config(e.clone()))?;
            match encoder.encode(&mut record).await {
                Ok(()) => {}
                Err(Failure::Bad { code, reason }) => {
                    let dl = DeadLetter::from_record(record, code, reason, source);
                    return self.refused(ledger, t, dl, RefusedBy::Format).await;
                }
                Err(Failure::Unavailable(reason)) => return Err(Transient::Registry { reason }.into()),
                Err(Failure::Definite(reason)) => return Err(Definite::Config(reason).into()),
            }
        }
        match self.hand_over(t, record, source) {
            Ok(()) => Ok(()),
            Err(slow) => self.not_taken(ledger, t, *slow).await,
        }
    }

    /// What follows a record [`Relay::hand_over`] could not hand over.
    async fn not_taken(&mut self, ledger: &mut impl Ledger, t: Ticket, slow: NotTaken) -> Result<(), Error> {
        match slow {
            NotTaken::Refused(dl) => self.refused(ledger, t, dl, RefusedBy::Sink).await,
            NotTaken::Sink(e) => self.on_sink_error(ledger, e).await,
        }
    }

    /// The synchronous part of a send: trace context, the size check, the delivery handle, the
    /// sink's `send`. Boxed error: the rare case, and the common one returns nothing.
    fn hand_over(&mut self, t: Ticket, record: Record, source: Source) -> Result<(), Box<NotTaken>> {
        let mut record = record;
        if let Some(otlp) = crate::otlp::exporter() {
            let lsn = match source.position {
                Position::Lsn(l) => Some(l),
                _ => None,
            };
            otlp.begin(&record.event_id, &record.topic, record.timestamp_ms, lsn, &mut record.headers);
        }
        let size = record_size(record.key.as_ref(), record.payload.as_ref(), &record.headers);
        if let Some(max) = self.sink.max_message_bytes() {
            if size > max {
                let message = format!("record of {size} bytes exceeds message.max.bytes {max}");
                let dl = DeadLetter::from_record(record, "too_large", message, source);
                return Err(Box::new(NotTaken::Refused(dl)));
            }
        }
        let delivery = self.delivery(t, &record, size, source);
        self.sink.send(record, delivery).map_err(|e| Box::new(NotTaken::Sink(e)))
    }

    /// A row the router refused, counted under `t`.
    pub async fn bad_row(
        &mut self,
        ledger: &mut impl Ledger,
        t: Ticket,
        bad: BadEvent,
        source: Source,
    ) -> Result<(), Error> {
        self.refused(ledger, t, DeadLetter::from_bad_event(bad, source), RefusedBy::Router).await
    }

    fn delivery(&mut self, t: Ticket, record: &Record, bytes: usize, source: Source) -> Delivery {
        self.in_flight += 1;
        self.in_flight_bytes += bytes;
        self.report_in_flight();
        Delivery::of(t, &record.event_id, record.topic.clone(), source, self.tx.clone()).with_bytes(bytes)
    }

    /// One record left the sink's hands without an ack through the queue.
    fn resolved(&mut self, bytes: usize) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(bytes);
        self.report_in_flight();
    }

    /// The in-flight gauge and the status page's in-flight bytes, as they change, for a source
    /// that reports through the relay (`poll`). The WAL session reports both itself, with each
    /// status update, so its per-record path does no more than this `None` check.
    fn report_in_flight(&self) {
        if let Some(g) = &self.in_flight_gauge {
            g.set(self.in_flight as f64);
            crate::status::board().set_in_flight_bytes(self.in_flight_bytes);
        }
    }

    /// What `send`, `unblock` or `commit` failed with: a refusal of one record goes to the ledger
    /// and the policy.
    async fn on_sink_error(&mut self, ledger: &mut impl Ledger, e: SinkError) -> Result<(), Error> {
        match e {
            SinkError::Fatal(d) => Err(d.into()),
            SinkError::Transient(t) => Err(t.into()),
            SinkError::Rejected { code, reason, record, delivery } => {
                self.resolved(delivery.bytes());
                let t = delivery.ticket();
                let copy = delivery.is_dead_letter();
                let source = delivery.source().clone();
                // Resolved here, not through the ack queue.
                delivery.disarm();
                if copy {
                    self.metrics.failed(code);
                    return Err(copy_refused(record.event_id, record.topic, &reason).into());
                }
                let dl = DeadLetter::from_record(*record, code, reason, source);
                self.refused(ledger, t, dl, RefusedBy::Sink).await
            }
        }
    }

    /// Apply one ack and every other already queued.
    async fn on_acks(&mut self, ledger: &mut impl Ledger, first: Ack) -> Result<(), Error> {
        let r = self.apply_acks(ledger, first).await;
        self.count_acked();
        r
    }

    /// Acks of one ticket that follow each other (the records of a transaction, acked in a row)
    /// reach the ledger as one [`Ledger::done_many`]: the WAL session's tracker finds the
    /// transaction and tries to move its frontier once per run, not once per record. The run is
    /// handed over before anything else reaches the ledger, so while nothing fails it sees the
    /// same calls in the same order, only grouped. When `done_many` fails (a bug, which stops the
    /// session), none of the run is applied, and an ack that already passed [`Relay::took`] may
    /// never reach the ledger: both on the safe side, nothing more is confirmed.
    async fn apply_acks(&mut self, ledger: &mut impl Ledger, first: Ack) -> Result<(), Error> {
        let mut next = Some(first);
        let mut run: Option<(Ticket, usize)> = None;
        while let Some(ack) = next {
            match self.took(ack) {
                Ok(t) => match &mut run {
                    Some((r, n)) if *r == t => *n += 1,
                    _ => {
                        if let Some((r, n)) = run.replace((t, 1)) {
                            ledger.done_many(r, n)?;
                        }
                    }
                },
                Err(ack) => {
                    // Earlier acks reach the ledger before this one's fate.
                    if let Some((r, n)) = run.take() {
                        ledger.done_many(r, n)?;
                    }
                    // Boxed: the rare path, kept out of the future built per run of acks.
                    Box::pin(self.not_acked(ledger, ack)).await?;
                }
            }
            next = self.rx.try_recv();
        }
        match run {
            Some((r, n)) => ledger.done_many(r, n),
            None => Ok(()),
        }
    }

    /// A failure or a refusal [`Relay::took`] handed back.
    async fn not_acked(&mut self, ledger: &mut impl Ledger, ack: Ack) -> Result<(), Error> {
        match ack.outcome {
            // `took` hands back only failures and refusals.
            Outcome::Acked => {}
            Outcome::Failed { ref reason } => {
                self.metrics.failed("delivery");
                let reason = reason.clone();
                ledger.failed(ack, reason)?;
            }
            Outcome::Rejected(refusal) => {
                // `Delivery::reject` always says who the record was.
                let Some(about) = ack.about else {
                    return Err(Definite::Bug("a refused record's ack without its event id".into()).into());
                };
                if ack.dead_letter {
                    self.metrics.failed(refusal.code);
                    return Err(copy_refused(about.event_id, ack.topic, &refusal.reason).into());
                }
                let dl = DeadLetter::from_refusal(about.event_id, ack.topic, *refusal, about.source);
                self.refused(ledger, ack.ticket, dl, RefusedBy::Sink).await?;
            }
        }
        Ok(())
    }

    /// A record of `t` will not be delivered as it is: the ledger, then `--on-bad-event`.
    async fn refused(
        &mut self,
        ledger: &mut impl Ledger,
        t: Ticket,
        dl: DeadLetter,
        by: RefusedBy,
    ) -> Result<(), Error> {
        let reason = match ledger.refused(t, &dl, by) {
            Refused::Kept => return Ok(()),
            Refused::Policy { reason } => reason,
        };
        self.metrics.failed(dl.code);
        match self.cfg.on_bad_event {
            BadEventPolicy::Fail => Err(match by {
                RefusedBy::Router => {
                    Definite::Route { event_id: dl.event_id.unwrap_or_else(|| "(unknown)".into()), reason: dl.message }
                }
                RefusedBy::Sink | RefusedBy::Format => dl.into_failure(reason),
            }
            .into()),
            BadEventPolicy::Skip => {
                if let (Some(otlp), Some(id)) = (crate::otlp::exporter(), dl.event_id.as_deref()) {
                    otlp.end(id, "skipped");
                }
                tracing::error!(event_id = dl.event_id.as_deref(), reason = dl.code, message = %dl.message, source = %dl.source.position, "skipping bad event (--on-bad-event skip)");
                ledger.settled(t, Settled::Skipped, &reason);
                ledger.done(t)
            }
            BadEventPolicy::Dlq => {
                tracing::warn!(event_id = dl.event_id.as_deref(), reason = dl.code, message = %dl.message, source = %dl.source.position, dlq = %self.cfg.dlq_topic, "sending bad event to the dead-letter topic");
                self.metrics.dead_lettered(dl.code);
                crate::status::board().dead_lettered(
                    dl.event_id.as_deref(),
                    dl.original_topic.as_deref(),
                    dl.code,
                    &dl.message,
                );
                let max = self.sink.dead_letter_max_bytes().unwrap_or(usize::MAX);
                let source = dl.source.clone();
                let records = dl.into_copy(&self.cfg.dlq_topic, max, &self.sink.dead_letter_limits());
                ledger.settled(t, Settled::DeadLettered, &reason);
                // Every chunk counts before the original resolves and before any is sent.
                ledger.add(t, records.len())?;
                ledger.done(t)?;
                for record in records {
                    let bytes = record_size(record.key.as_ref(), record.payload.as_ref(), &record.headers);
                    let delivery =
                        self.delivery(t, &record, bytes, source.clone()).for_dead_letter(copy_part(&record, &source));
                    // Chunks not sent stay counted, so a refusal never lets the ticket complete.
                    match self.sink.send(record, delivery) {
                        Ok(()) => {}
                        Err(SinkError::Fatal(d)) => return Err(d.into()),
                        Err(SinkError::Transient(t)) => return Err(t.into()),
                        Err(SinkError::Rejected { reason, record, delivery, .. }) => {
                            self.resolved(delivery.bytes());
                            delivery.disarm();
                            return Err(copy_refused(record.event_id, record.topic, &reason).into());
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

impl<S: Sink> Drop for Relay<'_, S> {
    /// The session ended: spans of records without an outcome will not get one (they are sent
    /// again by the next session, with spans of their own).
    fn drop(&mut self) {
        if let Some(otlp) = crate::otlp::exporter() {
            otlp.forget_pending();
        }
        // Nothing counts what this relay handed over any more; the source's next relay starts at 0.
        if let Some(g) = &self.in_flight_gauge {
            g.set(0.0);
        }
    }
}

/// Route one row (of a table, or of a logical message's synthetic relation) and mask it, before
/// anything can see it: the sink, a log line, a dead-letter copy.
#[allow(clippy::result_large_err)]
pub(crate) fn route_masked(cfg: &Config, route: &Route, row: OutboxRow<'_>) -> Result<Record, BadEvent> {
    let mask = &cfg.mask;
    let event_type = if mask.needs_event_type() { route.event_type(row) } else { None };
    let event_type = event_type.as_deref();
    let mut record = match route.route(row) {
        Ok(record) => record,
        Err(bad) => return Err(mask.scrub(bad, event_type)),
    };
    // Tested here rather than in `apply`, so a record no rule touches is not moved through it.
    if mask.applies(event_type) {
        record = mask.apply(record, event_type)?;
    }
    route.convert_in_place(&mut record);
    Ok(record)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::lsn::Lsn;
    use crate::sink::NullSink;
    use crate::source::wal::tracker::AckTracker;

    fn record(id: u64) -> Record {
        record_on("orders", id)
    }

    /// A small event `e{id}` on `topic` (took.rs's tests share it).
    pub(super) fn record_on(topic: &str, id: u64) -> Record {
        Record {
            topic: Text::from(topic),
            key: None,
            payload: Some(bytes::Bytes::from_static(b"{}")),
            headers: Vec::new(),
            partition: None,
            timestamp_ms: None,
            event_id: Text::from(format!("e{id}")),
            event_type: None,
        }
    }

    pub(super) fn cfg() -> RelayConfig {
        RelayConfig {
            on_bad_event: BadEventPolicy::Fail,
            dlq_topic: "dlq".into(),
            registry: None,
            budget: Budget { records: 100, bytes: 1 << 20 },
        }
    }

    /// Acks of several transactions interleaved, one record still in flight: the runs the relay
    /// groups per ticket ([`Relay::apply_acks`]) never let the tracker confirm past that record,
    /// and a failure behind a run reaches the ledger after the run's acks.
    #[tokio::test]
    async fn grouped_acks_never_confirm_past_a_record_in_flight() {
        let mut sink = NullSink;
        let mut relay = Relay::new(&mut sink, cfg(), Metrics::new());
        let source = Source { position: Position::Lsn(Lsn(1)), table: Arc::from("public.outbox") };
        let mut tracker = AckTracker::new(Lsn(0));
        let mut handles = Vec::new();
        for (end, records) in [(10, 3), (20, 2)] {
            tracker.begin(0).unwrap();
            for _ in 0..records {
                let t = Ticket::from(tracker.record().unwrap());
                let n = handles.len() as u64;
                handles.push(Some(relay.delivery(t, &record(n), 10, source.clone())));
            }
            tracker.commit(Lsn(end)).unwrap();
        }
        let mut ack = |i: usize| handles[i].take().expect("not acked yet").ack();
        // b, a, a, b: all of the second transaction, two of the first's three.
        for i in [3, 0, 1, 4] {
            ack(i);
        }
        let first = relay.rx.try_recv().expect("queued");
        relay.handle(&mut tracker, Wake::Ack(first)).await.unwrap();
        assert_eq!(tracker.confirmed(), Lsn(0), "confirmed past the first transaction's third record");
        assert_eq!((tracker.in_flight(), relay.in_flight()), (1, 1));
        ack(2);
        let first = relay.rx.try_recv().expect("queued");
        relay.handle(&mut tracker, Wake::Ack(first)).await.unwrap();
        assert_eq!(tracker.confirmed(), Lsn(20));

        // A run of acks, then a failure: the run is counted, the failure stops the relay.
        tracker.begin(0).unwrap();
        let t = Ticket::from(tracker.record().unwrap());
        tracker.record().unwrap();
        tracker.record().unwrap();
        tracker.commit(Lsn(30)).unwrap();
        let d: Vec<Delivery> = (0..3).map(|n| relay.delivery(t, &record(10 + n), 10, source.clone())).collect();
        let mut d = d.into_iter();
        d.next().unwrap().ack();
        d.next().unwrap().ack();
        drop(d.next());
        let first = relay.rx.try_recv().expect("queued");
        let err = relay.handle(&mut tracker, Wake::Ack(first)).await.expect_err("a dropped handle fails");
        assert!(err.to_string().contains("e12"), "the failure names its record: {err}");
        assert_eq!(tracker.in_flight(), 1, "the two acks before the failure were counted");
        assert_eq!(tracker.confirmed(), Lsn(20));
    }
}
