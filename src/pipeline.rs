//! One replication session: WAL in, records out, acks back, status updates up.
//!
//! ```text
//!  ReplicationStream ──XLogData──▶ Decoder ──Insert──▶ Route ──Record+Delivery──▶ Sink
//!        ▲                                                                          │
//!        └────────── status update (flush = tracker.confirmed()) ◀── AckTracker ◀──┘ acks
//! ```
//!
//! The loop is one `tokio::select!` with this priority (`biased`):
//! 1. shutdown: stop reading WAL and drain;
//! 2. acks: they free capacity and move the frontier, so they go before new work;
//! 3. the status timer: the server must hear from us even when we are saturated;
//! 4. new WAL, read only while fewer than `--max-in-flight` records await acks (backpressure).
//!
//! The session has two states, [`Phase::Streaming`] and [`Phase::Draining`]. Draining waits for
//! in-flight acks up to `--shutdown-timeout`, then sends a final status update. Every LSN that
//! leaves this module comes from the [`AckTracker`]; see `pg::replication` for the contract.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::{interval, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::ack::{Ack, AckTracker, Delivery, Outcome};
use crate::config::Config;
use crate::error::{Definite, Error};
use crate::lsn::Lsn;
use crate::metrics::Metrics;
use crate::pg::pgoutput::{Decoder, LogicalMessage};
use crate::pg::replication::{ReplicationStream, WalMessage};
use crate::router::{OutboxRow, Route};
use crate::sink::Sink;

/// What we know about a relation id.
enum RelationEntry {
    Outbox(Route),
    Other,
}

/// The open transaction's context that rows need.
struct OpenTxn {
    commit_time_us: i64,
}

enum Phase {
    Streaming,
    Draining { deadline: Instant },
}

pub struct Session<'a, S: Sink> {
    cfg: &'a Config,
    sink: &'a mut S,
    metrics: &'a Metrics,
    stream: ReplicationStream,
    decoder: Decoder,
    tracker: AckTracker,
    relations: HashMap<u32, RelationEntry>,
    open: Option<OpenTxn>,
    acks_tx: UnboundedSender<Ack>,
    acks_rx: UnboundedReceiver<Ack>,
    server_wal_end: Lsn,
}

impl<'a, S: Sink> Session<'a, S> {
    pub fn new(cfg: &'a Config, sink: &'a mut S, metrics: &'a Metrics, stream: ReplicationStream, start: Lsn) -> Self {
        let (acks_tx, acks_rx) = unbounded_channel();
        Session {
            cfg,
            sink,
            metrics,
            stream,
            decoder: Decoder::new(1),
            tracker: AckTracker::new(start),
            relations: HashMap::new(),
            open: None,
            acks_tx,
            acks_rx,
            server_wal_end: start,
        }
    }

    /// Run until shutdown (Ok) or an error. On any exit, the last status update sent carries only
    /// acked progress.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), Error> {
        let result = self.run_inner(shutdown).await;
        if result.is_err() {
            // Safe even on failure: the tracker never includes unacked records.
            let _ = self.send_status().await;
        }
        result
    }

    async fn run_inner(&mut self, shutdown: CancellationToken) -> Result<(), Error> {
        let mut ticker = interval(self.cfg.status_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut phase = Phase::Streaming;
        loop {
            match phase {
                Phase::Streaming => {
                    let can_read = self.tracker.in_flight() < self.cfg.max_in_flight;
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => {
                            tracing::info!(in_flight = self.tracker.in_flight(), "shutdown requested; draining in-flight events");
                            phase = Phase::Draining { deadline: Instant::now() + self.cfg.shutdown_timeout };
                        }
                        Some(ack) = self.acks_rx.recv() => self.on_acks(ack)?,
                        _ = ticker.tick() => self.send_status().await?,
                        msg = self.stream.next(), if can_read => self.on_wal(msg?).await?,
                    }
                }
                Phase::Draining { deadline } => {
                    if self.tracker.in_flight() == 0 {
                        break;
                    }
                    tokio::select! {
                        biased;
                        Some(ack) = self.acks_rx.recv() => self.on_acks(ack)?,
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
        let confirmed = self.tracker.confirmed();
        self.stream.send_status(confirmed).await?;
        self.metrics.status_updates.increment(1);
        self.metrics.progress(confirmed, self.server_wal_end, self.tracker.in_flight());
        tracing::trace!(%confirmed, "standby status update");
        Ok(())
    }

    /// Apply one ack and any others already queued.
    fn on_acks(&mut self, first: Ack) -> Result<(), Error> {
        let mut next = Some(first);
        while let Some(ack) = next {
            match ack.outcome {
                Outcome::Acked => {
                    self.tracker.ack(ack.txn).map_err(|e| Definite::Bug(e.to_string()))?;
                    self.metrics.events_acked.increment(1);
                }
                Outcome::Failed { reason } => {
                    self.metrics.events_failed.increment(1);
                    return Err(Definite::Delivery { event_id: ack.event_id, topic: ack.topic, reason }.into());
                }
            }
            next = self.acks_rx.try_recv().ok();
        }
        self.metrics.progress(self.tracker.confirmed(), self.server_wal_end, self.tracker.in_flight());
        Ok(())
    }

    async fn on_wal(&mut self, msg: WalMessage) -> Result<(), Error> {
        match msg {
            WalMessage::Keepalive { wal_end, reply_requested } => {
                self.server_wal_end = self.server_wal_end.max(wal_end);
                self.tracker.keepalive(wal_end);
                if reply_requested {
                    self.send_status().await?;
                }
                Ok(())
            }
            WalMessage::Data { wal_start, wal_end, data } => {
                self.server_wal_end = self.server_wal_end.max(wal_end);
                let msg = self
                    .decoder
                    .decode(data)
                    .map_err(|e| Definite::Protocol { lsn: wal_start, detail: e.to_string() })?;
                self.on_logical(wal_start, msg).await
            }
        }
    }

    async fn on_logical(&mut self, at: Lsn, msg: LogicalMessage) -> Result<(), Error> {
        let bug = |e: crate::ack::AckError| Definite::Bug(format!("{e} (at {at})"));
        match msg {
            LogicalMessage::Begin(b) => {
                self.tracker.begin().map_err(bug)?;
                self.open = Some(OpenTxn { commit_time_us: b.commit_time });
            }
            LogicalMessage::Commit(c) => {
                self.open = None;
                self.tracker.commit(c.end_lsn).map_err(bug)?;
                self.metrics.transactions.increment(1);
            }
            LogicalMessage::Relation(rel) => {
                let entry = if self.cfg.tables.iter().any(|t| t.schema == rel.namespace && t.name == rel.name) {
                    RelationEntry::Outbox(Route::compile(&self.cfg.route, &rel)?)
                } else {
                    RelationEntry::Other
                };
                self.relations.insert(rel.id, entry);
            }
            LogicalMessage::Insert(ins) => match self.relations.get(&ins.relation_id) {
                Some(RelationEntry::Outbox(route)) => {
                    let commit_time_us = self
                        .open
                        .as_ref()
                        .map(|o| o.commit_time_us)
                        .ok_or_else(|| Definite::Protocol { lsn: at, detail: "INSERT outside a transaction".into() })?;
                    let record =
                        route.route(OutboxRow { tuple: &ins.tuple, commit_time_us }).map_err(|b| b.into_definite())?;
                    let txn = self.tracker.record().map_err(bug)?;
                    let delivery =
                        Delivery::new(txn, record.event_id.clone(), record.topic.clone(), self.acks_tx.clone());
                    self.sink.send(record, delivery).await?;
                    self.metrics.events_sent.increment(1);
                }
                Some(RelationEntry::Other) => {}
                None => {
                    return Err(Definite::Protocol {
                        lsn: at,
                        detail: format!("INSERT for relation {} before its Relation message", ins.relation_id),
                    }
                    .into())
                }
            },
            LogicalMessage::Update(u) => self.ignored(u.relation_id, "UPDATE", at),
            LogicalMessage::Delete(d) => self.ignored(d.relation_id, "DELETE", at),
            LogicalMessage::Truncate(t) => {
                for id in t.relation_ids {
                    self.ignored(id, "TRUNCATE", at);
                }
            }
            LogicalMessage::Origin(_) | LogicalMessage::Type(_) | LogicalMessage::Message(_) => {}
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

    /// Debezium logs and skips non-INSERT operations on the outbox; so do we.
    fn ignored(&self, relation_id: u32, op: &str, at: Lsn) {
        if let Some(RelationEntry::Outbox(route)) = self.relations.get(&relation_id) {
            tracing::info!(%at, table = route.table(), op, "ignoring non-INSERT change on the outbox table");
        }
    }
}

/// How long to wait before reconnecting after a transient failure.
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1 << attempt.min(4))).min(Duration::from_secs(8))
}
