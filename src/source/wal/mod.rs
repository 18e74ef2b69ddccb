//! One replication session: WAL in, records out, acks back, status updates up.
//!
//! ```text
//!  ReplicationStream ──XLogData──▶ Decoder ──Insert──▶ Route ──Record+Delivery──▶ Sink
//!        ▲                                                                          │
//!        └────────── status update (flush = tracker.confirmed()) ◀── AckTracker ◀──┘ acks
//! ```
//!
//! Records go to the sink through the [`Relay`], with the [`AckTracker`] as its ledger: a
//! record's ticket is its transaction. The loop is one `tokio::select!` with this priority
//! (`biased`):
//! 1. shutdown: stop reading WAL and drain;
//! 2. the relay: acks (they free capacity and move the frontier, so they go before new work), the
//!    sink's held records while it is blocked (a topic being created, a full client queue), and
//!    the death of a task the sink depends on;
//! 3. the status timer: the server must hear from us even when we are saturated;
//! 4. new WAL, read only while fewer than `--max-in-flight` records and `--max-in-flight-bytes`
//!    bytes await acks and the sink is not blocked (backpressure); the messages of a burst already
//!    buffered follow in the same turn, up to [`WAL_BURST`], each after the same backpressure
//!    check, so the arms above wait at most one burst;
//! 5. the liveness tick (`--wal-receiver-timeout`): ask the server for a reply after half of it
//!    without a byte, end the session after all of it. It runs only while we read, so
//!    backpressure is not silence.
//!
//! The session has two states, [`Phase::Streaming`] and [`Phase::Draining`]. Draining waits for
//! in-flight acks up to `--shutdown-timeout`, then sends a final status update. Every LSN that
//! leaves this module comes from the [`AckTracker`]; see `pg::replication` for the contract.
//!
//! A row's record is routed and handed to the sink without an await in the usual case
//! ([`Relay::offer`], from [`Session::change_now`]): it is built in one frame and moved into the
//! sink, not carried through each `async fn`'s state. Only what must wait (a value format's
//! registry, the bad-event policy, a record over the sink's size limit, a sink's error) goes
//! through [`Relay::finish`], boxed.
//!
//! Transactional logical messages with a `--messages-prefix` prefix are events of their
//! transaction, routed and acked exactly as rows ([`message`]).
//!
//! With `--debezium-offsets`, events a stopped Debezium connector already delivered are not
//! handed to the sink ([`resume`]); their transactions still move the frontier.
//!
//! Bad events (a row the router refuses, a record the broker rejects for good) follow
//! `--on-bad-event` in the relay: `fail` stops here, `dlq` sends a copy to the dead-letter topic
//! whose ack stands in for the event's, `skip` counts and logs it. Every record, a refused row's
//! too, is counted in its transaction before the relay sees it. Retriable delivery trouble is
//! never a bad event: librdkafka retries it forever and the frontier waits.

mod input;
mod key_change;
mod message;
mod resume;
mod shared_lsn;
pub mod tracker;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::pg::replication::pg_now_us as now_pg_us;

use tokio::time::{interval, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, InvalidOp, HEARTBEAT_PREFIX};
use crate::error::{Definite, Error};
use crate::health::Health;
use crate::lsn::Lsn;
use crate::metrics::Metrics;
use crate::pg::pgoutput::{Decoder, LogicalMessage};
use crate::pg::replication::{WalMessage, WalSource};
use crate::relay::{route_masked, Ledger, Pending, Position, Relay, RelayConfig, Source, Ticket, Wake};
use crate::router::{BadEvent, OutboxRow, Record, Route};
use crate::sink::{Boundary, Sink};
use resume::Seen;
use tracker::AckTracker;

/// What we know about a relation id.
enum RelationEntry {
    // Boxed: a Route is large and most relations of a publication are not outboxes.
    Outbox(Box<Route>, Arc<str>, Option<key_change::KeyColumns>),
    Other,
}

/// Buffered WAL messages handled per turn of the session loop besides the one that woke it.
const WAL_BURST: usize = 128;

enum Phase {
    Streaming,
    Draining { deadline: Instant },
}

/// Shared handles a session reports to.
/// How long an exactly-once abort at a session's end counts as live: beyond its calls' own
/// bounds (the flushes, the abort's retries, a commit under way settling first).
const ABANDON_LIVE_FOR: std::time::Duration = std::time::Duration::from_secs(600);

pub struct Context<'a> {
    pub cfg: &'a Config,
    pub metrics: Metrics,
    pub health: Arc<Health>,
}

pub struct Session<'a, S: Sink, W: WalSource> {
    cfg: &'a Config,
    relay: Relay<'a, S>,
    metrics: Metrics,
    health: Arc<Health>,
    stream: W,
    decoder: Decoder,
    tracker: AckTracker,
    /// By relation oid, looked up per row: foldhash, not SipHash (the keys come from the server).
    relations: HashMap<u32, RelationEntry, foldhash::fast::RandomState>,
    /// `--messages-prefix`: the route of logical-message events, compiled at the first one.
    messages: Option<message::Messages>,
    /// `--debezium-offsets`: what Debezium delivered before this slot was ours.
    resume: Option<resume::Resume>,
    /// The changes at Debezium's `lsn_proc` while they are read, to be decided together.
    shared: Option<shared_lsn::SharedLsn>,
}

impl<'a, S: Sink, W: WalSource> Session<'a, S, W> {
    pub fn new(ctx: Context<'a>, sink: &'a mut S, stream: W, start: Lsn) -> Self {
        Session {
            cfg: ctx.cfg,
            relay: Relay::new(sink, RelayConfig::of(ctx.cfg), ctx.metrics.clone()),
            metrics: ctx.metrics,
            health: ctx.health,
            stream,
            decoder: Decoder::new(1),
            tracker: AckTracker::new(start),
            relations: HashMap::default(),
            messages: None,
            resume: ctx.cfg.debezium_offsets.as_ref().map(|(_, o)| resume::Resume::new(o.clone())),
            shared: None,
        }
    }

    /// Skip what an exactly-once sink committed before this session (see [`Sink::prepare`]); it
    /// takes the place of `--debezium-offsets`, which it always covers once it exists.
    pub fn resume_from(mut self, committed: Option<crate::debezium_offset::DebeziumOffset>) -> Self {
        if let Some(offset) = committed {
            self.resume = Some(resume::Resume::committed(offset));
        }
        self
    }

    /// Run until shutdown (Ok) or an error. On any exit, the last status update sent carries only
    /// acked progress, and `confirmed` is left at the frontier reached: every record before it is
    /// acked, so the next session may start there even if the server did not persist it.
    pub async fn run(mut self, shutdown: CancellationToken, confirmed: &mut Lsn) -> Result<(), Error> {
        self.health.set_streaming(true);
        self.metrics.pg_connected.set(1.0);
        let result = self.run_inner(shutdown).await;
        self.relay.sink().discard_held();
        // Exactly-once: aborting waits for Kafka; an outage is not a wedge, but an abort (with the
        // commit it may wait for) that outlasts every bound of its calls is: the loop goes quiet.
        self.health.ticking_for(ABANDON_LIVE_FOR, self.relay.sink().abandon()).await;
        self.health.set_streaming(false);
        self.metrics.pg_connected.set(0.0);
        // Acks that arrived after the loop ended still count.
        self.relay.drain_acked(|t| self.tracker.done(t).is_ok());
        *confirmed = (*confirmed).max(self.tracker.confirmed());
        match &result {
            // Safe even on failure: the tracker never includes unacked records.
            Err(_) => drop(self.send_status().await),
            Ok(()) => self.stream.close().await,
        }
        result
    }

    /// May the loop read more WAL? Not while the sink holds records or a budget is spent.
    fn can_read(&self) -> bool {
        self.relay.room()
    }

    /// Act on what woke the relay, then count what it completed.
    async fn on_relay(&mut self, w: Wake) -> Result<(), Error> {
        let acks = matches!(w, Wake::Ack(_));
        self.relay.handle(&mut self.tracker, w).await?;
        if acks {
            self.record_completed();
            self.publish_progress();
        }
        Ok(())
    }

    async fn run_inner(&mut self, shutdown: CancellationToken) -> Result<(), Error> {
        let mut ticker = interval(self.cfg.status_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let live_period = self.stream.liveness_period();
        let mut liveness = interval(live_period.unwrap_or(Duration::from_secs(3600)));
        liveness.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut phase = Phase::Streaming;
        loop {
            match phase {
                Phase::Streaming => {
                    let can_read = self.can_read();
                    if !can_read {
                        self.stream.pause_liveness();
                    }
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => {
                            tracing::info!(in_flight = self.tracker.in_flight(), "shutdown requested; draining in-flight events");
                            self.relay.finishing();
                            phase = Phase::Draining { deadline: Instant::now() + self.cfg.shutdown_timeout };
                        }
                        w = self.relay.wake() => self.on_relay(w).await?,
                        _ = ticker.tick() => self.send_status().await?,
                        msg = self.stream.next(), if can_read => {
                            self.on_wal(msg?).await?;
                            self.on_buffered_wal().await?;
                        }
                        // After the WAL arm: data already waiting always wins over a deadline.
                        _ = liveness.tick(), if can_read && live_period.is_some() => {
                            let confirmed = self.tracker.confirmed();
                            self.stream.check_liveness(confirmed).await?;
                        }
                    }
                }
                Phase::Draining { deadline } => {
                    if self.tracker.in_flight() == 0 {
                        break;
                    }
                    tokio::select! {
                        biased;
                        w = self.relay.wake() => self.on_relay(w).await?,
                        _ = ticker.tick() => self.send_status().await?,
                        _ = tokio::time::sleep_until(deadline) => {
                            tracing::warn!(in_flight = self.tracker.in_flight(), "shutdown timeout: exiting with events unacked; they will be sent again on restart");
                            break;
                        }
                    }
                }
            }
        }
        self.send_status().await?;
        tracing::info!(confirmed = %self.tracker.confirmed(), "final status update sent");
        Ok(())
    }

    async fn send_status(&mut self) -> Result<(), Error> {
        // Liveness for /healthz: the status timer outranks new WAL in the select!, so a turning
        // loop gets here at least every --status-interval; ticking here, not per message, keeps
        // the clock read off the per-event path.
        self.health.loop_tick();
        let confirmed = self.tracker.confirmed();
        self.stream.send_status(confirmed).await?;
        self.publish_progress();
        let lag = self.tracker.oldest_commit_time().map_or(0.0, |t| (now_pg_us() - t).max(0) as f64 / 1e6);
        self.metrics.lag_seconds.set(lag);
        tracing::trace!(%confirmed, "standby status update");
        Ok(())
    }

    fn publish_progress(&self) {
        self.metrics.progress(self.stream.last_received(), self.tracker.confirmed(), self.tracker.in_flight());
        crate::status::board().set_in_flight_bytes(self.relay.in_flight_bytes());
    }

    /// Count transactions the tracker confirmed, and their commit-to-ack latency.
    fn record_completed(&mut self) {
        // The clock is read only when a transaction completed: this runs at every COMMIT, and
        // with an asynchronous sink most commits complete nothing yet (a clock read is ~100
        // instructions, as much as a small event's routing step).
        // The counter moves once per call (each batch of acks applied, and each COMMIT), by what
        // completed since the last.
        let mut now = None;
        let mut n = 0;
        let m = &self.metrics;
        self.tracker.drain_completed(|commit_time| {
            let now = *now.get_or_insert_with(now_pg_us);
            n += 1;
            m.commit_to_ack.record((now - commit_time).max(0) as f64 / 1e6);
        });
        if n > 0 {
            m.transactions.increment(n);
        }
    }

    /// The messages of a burst that are buffered already, up to [`WAL_BURST`], each handled as
    /// the `select!`'s WAL arm would, without a turn of the loop per message (a turn builds and
    /// polls every arm's future: most of a small event's cost). Backpressure is checked before
    /// each one; acks, the status timer and shutdown wait at most one burst.
    async fn on_buffered_wal(&mut self) -> Result<(), Error> {
        for _ in 0..WAL_BURST {
            if !self.can_read() {
                break;
            }
            let Some(msg) = self.stream.try_next() else { break };
            self.on_wal(msg?).await?;
        }
        Ok(())
    }

    async fn on_wal(&mut self, msg: WalMessage) -> Result<(), Error> {
        match msg {
            WalMessage::Keepalive { wal_end, reply_requested } => {
                self.tracker.keepalive(wal_end);
                if reply_requested {
                    self.send_status().await?;
                }
                Ok(())
            }
            WalMessage::Data { wal_start, data, .. } => {
                let msg = self
                    .decoder
                    .decode(data)
                    .map_err(|e| Definite::Protocol { lsn: wal_start, detail: e.to_string() })?;
                self.on_logical(wal_start, msg).await
            }
        }
    }

    async fn on_logical(&mut self, at: Lsn, msg: LogicalMessage) -> Result<(), Error> {
        let bug = |e: crate::source::wal::tracker::AckError| Definite::Bug(format!("{e} (at {at})"));
        if self.shared.as_ref().is_some_and(|s| s.at != at || !matches!(msg, LogicalMessage::Insert(_))) {
            self.decide_shared().await?;
        }
        match msg {
            LogicalMessage::Begin(b) => {
                self.tracker.begin(b.commit_time).map_err(bug)?;
                self.relay.sink().boundary(Boundary::Begin { final_lsn: b.final_lsn, xid: b.xid });
                if let Some(r) = &mut self.resume {
                    r.begin(b.final_lsn, b.xid);
                }
            }
            LogicalMessage::Commit(c) => {
                if let Some(r) = &mut self.resume {
                    r.commit();
                }
                self.relay.sink().boundary(Boundary::Commit);
                self.tracker.commit(c.end_lsn).map_err(bug)?;
                self.record_completed();
            }
            LogicalMessage::Relation(rel) => {
                let id = rel.id;
                let entry = if self.cfg.tables.iter().any(|t| t.schema == rel.namespace && t.name == rel.name) {
                    let keys = if self.cfg.key_change_events { key_change::KeyColumns::of(&rel) } else { None };
                    let route = Route::compile(&self.cfg.route, &input::table(rel))?;
                    let table: Arc<str> = Arc::from(route.table());
                    if self.cfg.mask.needs_event_type() && !route.has_event_type() {
                        return Err(Definite::Setup(format!(
                            "table {} has no column {:?} (set by --table-field-event-type), which --mask-event-type reads; add the column or point the flag at the event type column",
                            route.table(),
                            self.cfg.route.type_field
                        ))
                        .into());
                    }
                    RelationEntry::Outbox(Box::new(route), table, keys)
                } else {
                    RelationEntry::Other
                };
                self.relations.insert(id, entry);
            }
            LogicalMessage::Insert(ins) => {
                let (route, table) = match self.relations.get(&ins.relation_id) {
                    Some(RelationEntry::Outbox(route, table, _)) => (route, table.clone()),
                    Some(RelationEntry::Other) => return Ok(()),
                    None => {
                        return Err(Definite::Protocol {
                            lsn: at,
                            detail: format!("INSERT for relation {} before its Relation message", ins.relation_id),
                        }
                        .into())
                    }
                };
                let seen = self.resume.as_mut().map_or(Seen::No, |r| r.delivered(at));
                let commit_time_us = self
                    .tracker
                    .open_commit_time()
                    .ok_or_else(|| Definite::Protocol { lsn: at, detail: "INSERT outside a transaction".into() })?;
                // Routed and handed over without an await in the usual case: the record goes from
                // the router's frame to the sink's, not through each async layer's state.
                let pending = {
                    let routed =
                        route_masked(self.cfg, route, OutboxRow { tuple: &input::row(ins.tuple), commit_time_us });
                    self.change_now(at, seen, routed, Source { position: Position::Lsn(at), table }, false)?
                };
                if let Some(p) = pending {
                    Box::pin(self.relay.finish(&mut self.tracker, p)).await?;
                }
            }
            LogicalMessage::Update(u) => self.on_update(*u, at).await?,
            LogicalMessage::Delete(d) => {
                if let Some(RelationEntry::Outbox(_, table, _)) = self.relations.get(&d.relation_id) {
                    tracing::debug!(%at, %table, "DELETE on the outbox produces no event");
                }
            }
            LogicalMessage::Truncate(t) => {
                for id in t.relation_ids {
                    if let Some(RelationEntry::Outbox(_, table, _)) = self.relations.get(&id) {
                        tracing::info!(%at, %table, "TRUNCATE on the outbox produces no event");
                    }
                }
            }
            LogicalMessage::Message(m) if self.cfg.messages_prefixes.contains(&m.prefix) => {
                if m.flags & 1 == 1 {
                    self.relay.sink().boundary(Boundary::Change { at });
                    // A logical message has its LSN to itself: the offset's one was sent.
                    match self.resume.as_mut().map(|r| (r.delivered(at), r)) {
                        Some((Seen::Yes, _)) => return Ok(()),
                        Some((Seen::Ask, r)) => {
                            r.skip(1);
                            return Ok(());
                        }
                        _ => {}
                    }
                }
                self.on_event_message(at, m).await?;
            }
            LogicalMessage::Message(m) => {
                // An earlier outboxd's heartbeat (a non-transactional message; ours now is an
                // empty transaction, see `app`) carries no events: like a keepalive, it may move an
                // idle frontier to its own LSN.
                if m.flags & 1 == 0 && m.prefix == HEARTBEAT_PREFIX {
                    self.tracker.keepalive(at);
                    self.health.activity();
                }
            }
            LogicalMessage::Origin(_) | LogicalMessage::Type(_) => {}
            other @ (LogicalMessage::StreamStart(_)
            | LogicalMessage::StreamStop
            | LogicalMessage::StreamCommit(_)
            | LogicalMessage::StreamAbort(_)
            | LogicalMessage::BeginPrepare(_)
            | LogicalMessage::Prepare(_)
            | LogicalMessage::CommitPrepared(_)
            | LogicalMessage::RollbackPrepared(_)
            | LogicalMessage::StreamPrepare(_)) => {
                return Err(Definite::Protocol {
                    lsn: at,
                    detail: format!("server sent {other:?}, but outboxd asked for neither streaming nor two-phase"),
                }
                .into())
            }
        }
        Ok(())
    }

    /// One routed change at `at`, as `--debezium-offsets` saw it: held to be decided with the
    /// others at the offset's LSN ([`shared_lsn`]; its Change boundary goes out then), else
    /// counted (a position inside a transaction numbers every change at its LSN, a COPY's rows
    /// share one, delivered ones included), then skipped when Debezium delivered it or sent.
    /// `after_unsent`: Debezium made an unpublished change at this LSN before this one.
    async fn change(
        &mut self,
        at: Lsn,
        seen: Seen,
        routed: Result<Record, BadEvent>,
        source: Source,
        after_unsent: bool,
    ) -> Result<(), Error> {
        match self.change_now(at, seen, routed, source, after_unsent)? {
            None => Ok(()),
            // Boxed: the registry's and the policy's states stay out of every WAL message's future.
            Some(p) => Box::pin(self.relay.finish(&mut self.tracker, p)).await,
        }
    }

    /// [`Session::change`] up to its first await: what is left, if anything, is for
    /// [`Relay::finish`].
    #[allow(clippy::result_large_err)]
    #[inline]
    fn change_now(
        &mut self,
        at: Lsn,
        seen: Seen,
        routed: Result<Record, BadEvent>,
        source: Source,
        after_unsent: bool,
    ) -> Result<Option<Box<Pending>>, Error> {
        match seen {
            Seen::Ask => {
                let shared = self.shared.get_or_insert_with(|| shared_lsn::SharedLsn::new(at));
                shared.after_unsent |= after_unsent;
                shared.held.push((routed, source));
                Ok(None)
            }
            Seen::Yes => {
                self.relay.sink().boundary(Boundary::Change { at });
                Ok(None)
            }
            Seen::No => {
                self.relay.sink().boundary(Boundary::Change { at });
                self.emit_now(routed, source)
            }
        }
    }

    /// Send those of the changes at Debezium's `lsn_proc` it did not ([`shared_lsn`]).
    async fn decide_shared(&mut self) -> Result<(), Error> {
        let Some(batch) = self.shared.take() else { return Ok(()) };
        let (at, n) = (batch.at, batch.held.len());
        let looked_up = !batch.decided_by_offset();
        let delivered = if !looked_up {
            1
        } else {
            let refuse = |m: String| Error::from(Definite::Setup(format!("--debezium-offsets: {m}")));
            if let Some(id) = batch.repeated_id() {
                return Err(refuse(format!(
                    "event id {id:?} occurs twice among the {n} events at {at} (the LSN of Debezium's offset), so its \
                     record on the topic cannot tell which of them Debezium sent; start without --debezium-offsets \
                     (those events may then be sent twice)"
                )));
            }
            let written = self.relay.sink().already_written(&batch.records()).await?;
            batch.delivered(&written).map_err(refuse)?
        };
        if looked_up {
            tracing::info!(%at, changes = n, delivered, "--debezium-offsets: {n} change(s) share the offset's LSN; {delivered} of them are on their topics and are not sent again");
        }
        if let Some(r) = &mut self.resume {
            r.skip(delivered as u64);
        }
        for (i, (routed, source)) in batch.held.into_iter().enumerate() {
            self.relay.sink().boundary(Boundary::Change { at });
            if i >= delivered {
                self.emit(routed, source).await?;
            }
        }
        Ok(())
    }

    /// A routed (and masked) event goes to the sink; a refused one to the bad-event policy. Either
    /// is counted in the open transaction first.
    #[allow(clippy::result_large_err)]
    async fn emit(&mut self, routed: Result<Record, BadEvent>, source: Source) -> Result<(), Error> {
        match self.emit_now(routed, source)? {
            None => Ok(()),
            // Boxed: the registry's and the policy's states stay out of every WAL message's future.
            Some(p) => Box::pin(self.relay.finish(&mut self.tracker, p)).await,
        }
    }

    /// [`Session::emit`] up to its first await (none for a record the sink takes).
    #[allow(clippy::result_large_err)]
    #[inline]
    fn emit_now(&mut self, routed: Result<Record, BadEvent>, source: Source) -> Result<Option<Box<Pending>>, Error> {
        self.health.activity();
        let t = Ticket::from(self.tracker.record()?);
        Ok(match routed {
            Ok(record) => self.relay.offer(t, record, source).err(),
            Err(bad) => Some(Box::new(Pending::Bad(t, bad, source))),
        })
    }

    /// An UPDATE of an outbox row: with `--debezium-config` one that changes the primary key is
    /// the new row's event, as Debezium publishes it ([`key_change`]); any other follows
    /// Debezium's `table.op.invalid.behavior`.
    async fn on_update(&mut self, u: crate::pg::pgoutput::Update, at: Lsn) -> Result<(), Error> {
        let Some(RelationEntry::Outbox(route, table, keys)) = self.relations.get(&u.relation_id) else {
            return Ok(());
        };
        if let Some(old_key) = keys.as_ref().and_then(|k| k.old_key(u.old.as_ref(), &u.new)) {
            let table = table.clone();
            let seen = self.resume.as_mut().map_or(Seen::No, |r| r.delivered(at));
            let commit_time_us = self
                .tracker
                .open_commit_time()
                .ok_or_else(|| Definite::Protocol { lsn: at, detail: "UPDATE outside a transaction".into() })?;
            let mut routed = route_masked(self.cfg, route, OutboxRow { tuple: &input::row(u.new), commit_time_us });
            if let Ok(record) = &mut routed {
                record.headers.insert(0, (key_change::OLD_KEY_HEADER.into(), old_key));
            }
            // Debezium's delete and create share its LSN: the offset may name it with the
            // create unsent.
            return self.change(at, seen, routed, Source { position: Position::Lsn(at), table }, true).await;
        }
        let what = "UPDATE on the outbox produces no event (only INSERTs are events)";
        match self.cfg.op_invalid {
            InvalidOp::Warn => tracing::warn!(%at, %table, "{what}"),
            InvalidOp::Error => tracing::error!(%at, %table, "{what}"),
            InvalidOp::Fatal => {
                return Err(Definite::Setup(format!(
                    "UPDATE of a row of {table} at {at} and --table-op-invalid-behavior is fatal; outbox rows must only be inserted"
                ))
                .into())
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
