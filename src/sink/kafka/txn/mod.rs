//! Exactly-once delivery (`--delivery exactly-once`): the Kafka sink's transactions.
//!
//! ```text
//!  WAL session ── boundary(Begin/Change/Commit) ──▶ Txns ── position record ─┐
//!  relay ── send ──▶ producer (in the open Kafka transaction) ── records ────┤── commit ──▶ acks
//!  delivery reports ──▶ Written (held until the commit) ─────────────────────┘
//! ```
//!
//! A record is acked only when the Kafka transaction that holds it has committed. The ack
//! tracker is unchanged, so the slot is confirmed only past committed records. Each Kafka
//! transaction also carries outboxd's position (a record keyed `<system id>/<slot>` in the
//! compacted `--position-topic`), in the shape of a Debezium offset: the PostgreSQL transactions
//! whose commit record is before `lsn_commit` are delivered whole, and in the transaction it may
//! stop inside, the changes up to `lsn_proc`. A new session reads it with `read_committed` and
//! skips what it covers, even when the slot is behind (a crash between the Kafka commit and the
//! slot's confirmation). The position is stamped with the WAL history it was written on (its
//! timeline, and where that timeline began), and only the part of it that holds on the server's
//! history now is skipped by ([`crate::lineage`]): after a restore or a failover to a
//! lagging replica, the reused LSNs past the branch point are new events, not delivered ones.
//!
//! # Invariants
//! * A commit happens only where every change the session handed over was produced (nothing held
//!   by the sink), so the position never covers a record that is not in the transaction.
//! * A commit runs in the background ([`Txns::commit`] starts it, [`Txns::settle`] ends it): the
//!   session reads and routes on, and the sink holds what it sends until the next transaction
//!   is open. Its position was taken when it started, so the reading ahead never moves it.
//! * Whole PostgreSQL transactions go together while they fit. A Kafka transaction commits
//!   `--transaction-interval` after its first record (for records held during the previous
//!   commit, after the first of them arrived), at the next PostgreSQL commit, or at once
//!   when it holds half an in-flight budget (records or bytes): otherwise the budget would stop
//!   the reading before the timer. A PostgreSQL transaction past half a budget commits inside
//!   itself, with the position pointing at its last change.
//! * Delivery handles of an aborted transaction are disarmed, never failed: the session ends with
//!   a transient error and the next one resumes from the committed position.
//! * Errors are decided in one place ([`classify`]): fatal (fenced, or another fatal producer
//!   state) ends the session as a standby and rebuilds the producer before the next one; abortable
//!   ones abort and resume; retriable ones retry the same call.
//!
//! # Layout
//! [`Txns`] (here) follows the WAL session and drives the producer's calls; where the producer's
//! transaction is (unprepared, idle, open, committing, failed for good) is `state.rs`'s
//! one enum, changed only by its transitions. `call.rs` judges and retries one blocking call;
//! `position.rs` is the position record and its read-back; the held delivery reports are
//! [`super::written`], shared with the delivery-report callback.

mod call;
mod position;
mod state;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::client;
use super::condemned::{Condemned, Place};
use super::events::DeliveryContext;
use super::sent::Sent;
use super::written::Written;
use crate::debezium_offset::{DebeziumOffset, Partial};
use crate::error::{Definite, Error, Transient};
use crate::lineage::{Lineage, Stamp, Stored};
use crate::lsn::Lsn;
use crate::metrics::TxnMetrics;
use crate::sink::delivery::{Delivery, Position};
use crate::sink::kafka::config::{KafkaConfig, TxnConfig};
use crate::sink::{Boundary, SinkError};
use call::{blocking, classify, is_fenced, retrying, Verdict};
use position::{ensure_position_topic, read_position, StoredPosition};
use state::{Batch, Committing, Machine};

/// How long a Kafka transaction may stay open (`transaction.timeout.ms`, unless the user sets it).
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a blocking transaction call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The transactional state of the Kafka sink.
pub struct Txns {
    pub cfg: TxnConfig,
    pub written: Arc<Written>,
    /// The producer's transaction: unprepared, idle, open, committing, or failed for good; it
    /// changes only through [`Machine`]'s transitions.
    state: Machine,
    /// The session reads no more (shutdown): commit at the last whole change.
    finishing: bool,
    /// Limits past which a PostgreSQL transaction commits inside itself.
    max_records: usize,
    max_bytes: usize,
    /// Where the WAL session is.
    in_pg: Option<(Lsn, u32)>,
    last_change: Option<(Lsn, u64)>,
    /// The position after the last PostgreSQL transaction that committed.
    whole: Option<DebeziumOffset>,
    /// What the last Kafka commit stored (read at start), with the history it was written on.
    committed: Option<Stored>,
    /// The history this session's positions are written on.
    stamp: Option<Stamp>,
    /// Records the broker refused for good inside an aborted transaction, by their place in the
    /// stream: the next time they come, they go to the bad-event policy ([`Txns::forget`]).
    condemned: Condemned,
}

impl Txns {
    pub fn new(cfg: TxnConfig, max_in_flight: usize, max_in_flight_bytes: usize) -> Txns {
        Txns {
            cfg,
            written: Arc::new(Written::default()),
            state: Machine::default(),
            finishing: false,
            max_records: (max_in_flight / 2).max(1),
            max_bytes: (max_in_flight_bytes / 2).max(1),
            in_pg: None,
            last_change: None,
            whole: None,
            committed: None,
            stamp: None,
            condemned: Default::default(),
        }
    }

    /// The producer's settings for transactions.
    pub fn producer_defaults(&self) -> Vec<(&'static str, String)> {
        vec![
            ("transactional.id", self.cfg.id()),
            ("transaction.timeout.ms", TRANSACTION_TIMEOUT.as_millis().to_string()),
            // librdkafka wants it within the transaction timeout; an expired record aborts the
            // transaction (and the session), it is never lost.
            ("message.timeout.ms", TRANSACTION_TIMEOUT.as_millis().to_string()),
        ]
    }

    pub fn boundary(&mut self, b: Boundary) {
        match b {
            Boundary::Begin { final_lsn, xid } => {
                self.in_pg = Some((final_lsn, xid));
                self.last_change = None;
            }
            Boundary::Change { at } => {
                self.last_change = match self.last_change {
                    Some((l, n)) if l == at => Some((l, n + 1)),
                    _ => Some((at, 1)),
                };
            }
            Boundary::Commit => {
                if let Some((final_lsn, _)) = self.in_pg.take() {
                    self.whole = Some(DebeziumOffset { lsn_commit: Lsn(final_lsn.0 + 1), partial: None });
                }
                self.last_change = None;
            }
            // Its LSN (the message record's end) is at most the commit record of any transaction
            // after it, so storing it covers the message but none of those (the session's resume
            // passes over a message at or before `lsn_commit`). Without it, a message ahead of any
            // transaction left no position to commit, and its copy was sent again after a crash.
            Boundary::Standalone { at } if self.in_pg.is_none() => {
                self.whole = Some(DebeziumOffset { lsn_commit: at, partial: None });
            }
            Boundary::Standalone { .. } => {}
        }
    }

    /// A record went into the open transaction.
    pub fn produced(&mut self, bytes: usize) {
        self.state.produced(bytes);
    }

    /// The sink holds a record until the running commit ends (the first such record starts the
    /// next transaction's interval).
    pub fn holding(&mut self) {
        self.state.holding();
    }

    /// The session reads no more: what is open commits now, at the last whole change when inside
    /// a PostgreSQL transaction (whose end will not be read), rather than at the shutdown timeout.
    pub fn finishing(&mut self) {
        self.finishing = true;
        if let Some((final_lsn, xid)) = self.in_pg {
            tracing::info!(
                open_records = self.state.open().map_or(0, |b| b.sent),
                %final_lsn,
                xid,
                "shutdown inside a PostgreSQL transaction: what was read of it commits at its last whole change"
            );
        }
    }

    /// When the open transaction should commit.
    pub fn due(&self) -> Option<tokio::time::Instant> {
        let Batch { since: Some(opened), sent, bytes } = self.state.open()? else { return None };
        if sent == 0 {
            return None;
        }
        // Past half an in-flight budget: now, or the budget stops the reading before the timer.
        // Finishing (shutdown): now, as nothing more will come.
        let full = sent >= self.max_records || bytes >= self.max_bytes || self.finishing;
        match self.in_pg {
            None if full => Some(tokio::time::Instant::now()),
            None => Some(tokio::time::Instant::from_std(opened + self.cfg.interval)),
            // Inside a PostgreSQL transaction: only when full, and only after a change.
            Some(_) if full && self.last_change.is_some() => Some(tokio::time::Instant::now()),
            Some(_) => None,
        }
    }

    /// The position a commit now would store.
    fn position(&self) -> Option<DebeziumOffset> {
        match (self.in_pg, self.last_change) {
            (Some((final_lsn, xid)), Some((at, n))) => Some(DebeziumOffset {
                lsn_commit: final_lsn,
                partial: Some(Partial { xid, lsn_proc: at, events_at_proc: n }),
            }),
            _ => self.whole.clone(),
        }
    }

    /// Start: create the position topic, take the transactional id (fencing any other holder,
    /// and waiting out its open transaction), read the committed position, open a transaction.
    /// Returns the part of the position that holds on the server's history now (`lineage`).
    pub async fn prepare(
        &mut self,
        producer: &Arc<BaseProducer<DeliveryContext>>,
        admin: &Arc<AdminClient<DefaultClientContext>>,
        kafka: &KafkaConfig,
        lineage: &Lineage,
    ) -> Result<Option<DebeziumOffset>, Error> {
        if self.state.is_fatal() {
            // The sink builds a new producer (and a new `Txns`) before preparing again.
            return Err(Transient::TxnAborted { reason: "the Kafka producer failed for good".into() }.into());
        }
        if self.state.is_committing() {
            return Err(Definite::Bug("an exactly-once session prepared while a commit runs".into()).into());
        }
        if !self.state.is_ready() {
            ensure_position_topic(admin, &self.cfg.position_topic, kafka).await?;
            super::topics::partitions_ready(producer.clone(), self.cfg.position_topic.clone()).await;
            let p = producer.clone();
            let r = blocking(move || retrying(|| p.init_transactions(CALL_TIMEOUT))).await;
            if let Err(e) = r {
                return Err(match classify(&e) {
                    Verdict::Fatal if is_fenced(e.rdkafka_error_code()) => {
                        Transient::Fenced { reason: e.to_string() }.into()
                    }
                    _ => Definite::Sink(format!(
                        "cannot start Kafka transactions (init_transactions under transactional.id {:?}): {}; \
                         --delivery exactly-once needs brokers with transactions enabled (transaction.state.log.* \
                         settings, enough brokers for its replication factor)",
                        self.cfg.id(),
                        client::scrub(&e.to_string(), &kafka.properties)
                    ))
                    .into(),
                });
            }
            let (k, t) = (kafka.clone(), self.cfg.clone());
            let stored = tokio::task::spawn_blocking(move || read_position(&k, &t))
                .await
                .map_err(|e| Definite::Sink(format!("the position reader task failed: {e}")))??;
            tracing::info!(position = ?stored, topic = %self.cfg.position_topic, key = %self.cfg.key(), "exactly-once: committed position read");
            self.committed = stored;
            self.state.prepared();
        }
        self.in_pg = None;
        self.last_change = None;
        self.finishing = false;
        // Every session: the server may be another one now (a failover), on another history.
        let holds = self.committed.as_ref().and_then(|s| lineage.admit(s));
        let stamp = lineage.stamp();
        if self.stamp.is_some_and(|was| was != stamp) {
            let n = self.condemned.forget_all();
            if n > 0 {
                tracing::info!(records = n, "exactly-once: the server's WAL history changed; the records refused on the previous one are forgotten (their places name that history's changes)");
            }
        }
        self.stamp = Some(stamp);
        // The session restarts from the slot, which is never past what was committed.
        self.whole = holds.clone();
        if self.state.open().is_none() {
            producer.begin_transaction().map_err(|e| self.failure(e))?;
            self.state.began(None);
        }
        Ok(holds)
    }

    /// The producer failed for good (fenced): the sink builds a new one before the next session.
    pub fn is_fatal(&self) -> bool {
        self.state.is_fatal()
    }

    /// A commit runs in the background ([`Txns::commit`]); [`Txns::settle`] finishes it.
    pub fn committing(&self) -> bool {
        self.state.is_committing()
    }

    /// Start committing the open transaction if it is due: its position record goes in, and a
    /// background task waits for every record's report and commits. The session reads on
    /// meanwhile; the sink holds what it sends until [`Txns::settle`] opened the next transaction.
    pub async fn commit(
        &mut self,
        producer: &Arc<BaseProducer<DeliveryContext>>,
        metrics: &TxnMetrics,
    ) -> Result<(), SinkError> {
        if self.state.is_committing() || self.due().is_none_or(|at| at > tokio::time::Instant::now()) {
            return Ok(());
        }
        let Some(position) = self.position() else {
            return Err(SinkError::Fatal(Definite::Bug("an exactly-once commit without a position".into())));
        };
        let value = serde_json::to_vec(&StoredPosition::of(&position, self.stamp)).unwrap_or_default();
        let key = self.cfg.key();
        let slot = producer.context().in_flight.put(Sent::Position);
        let record = BaseRecord::with_opaque_to(&self.cfg.position_topic, slot).key(&key).payload(&value);
        if let Err((e, _)) = producer.send(record) {
            // No report will come for it.
            let _ = producer.context().in_flight.take(slot);
            return Err(self.abort(producer, format!("the position record was refused: {e}"), metrics).await);
        }
        let records = self.state.open().map_or(0, |b| b.sent) + 1;
        let (p, written) = (producer.clone(), self.written.clone());
        let task = tokio::spawn(async move {
            // Every record's report first, served by the runtime's own pump: the commit's flush
            // then has nothing left to wait for. (rdkafka's flush polls the queue in 100 ms
            // slices, which the pump drains first, so letting it wait costs up to 100 ms.)
            written.wait_for(records, CALL_TIMEOUT).await;
            let r = blocking(move || retrying(|| p.commit_transaction(CALL_TIMEOUT))).await;
            if r.is_ok() {
                // Reports served on the runtime thread may still be in their callbacks.
                written.wait_for(records, Duration::from_secs(5)).await;
            }
            r
        });
        // The next transaction begins when this one committed ([`Txns::settle`]).
        self.state.commit_started(Committing { task, position, records, started: Instant::now() });
        Ok(())
    }

    /// Wait for the commit started by [`Txns::commit`] (if any) and finish it: ack its records
    /// and open the next transaction, or abort. Cancel-safe: awaiting the task's handle takes
    /// nothing, and everything after it is synchronous (or an abort, which ends the session).
    pub async fn settle(
        &mut self,
        producer: &Arc<BaseProducer<DeliveryContext>>,
        metrics: &TxnMetrics,
    ) -> Result<(), SinkError> {
        let Some(task) = self.state.commit_task() else { return Ok(()) };
        let r = match task.await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "the Kafka commit task failed");
                Err(KafkaError::Canceled)
            }
        };
        let Some((Committing { position, records, started, .. }, held_since)) = self.state.commit_ended() else {
            return Ok(());
        };
        match r {
            Ok(()) => {
                let (acked, failed) = self.written.take();
                // The position record is not counted (see the metric's help).
                let events = acked.iter().filter(|s| matches!(s, Sent::Record(_))).count();
                metrics.committed(events, started.elapsed());
                acked.into_iter().for_each(|d| d.ack());
                self.committed = Some(Stored { offset: position, stamp: self.stamp });
                producer.begin_transaction().map_err(|e| SinkError::Transient(self.transient(e)))?;
                self.state.began(held_since);
                if failed.is_empty() {
                    return Ok(());
                }
                // librdkafka commits only when every record was written, so this should not
                // happen. If it does, the records are in Kafka and the position covers them:
                // end the session (their tickets would never complete) and resume past them.
                let reason = format!(
                    "Kafka committed a transaction whose delivery reports had {} failure(s), the first: {}",
                    failed.len(),
                    failed[0].1
                );
                failed.into_iter().for_each(|(d, _, _)| d.disarm());
                tracing::error!("{reason}");
                Err(SinkError::Transient(Transient::TxnAborted { reason }))
            }
            Err(e) => {
                let reason = client::scrub(&e.to_string(), &[]);
                Err(match classify(&e) {
                    Verdict::Fatal => {
                        metrics.aborted();
                        if let Some(d) = self.forget() {
                            return Err(SinkError::Fatal(d));
                        }
                        SinkError::Transient(self.transient(e))
                    }
                    _ => {
                        // Still open in librdkafka's eyes: abort it.
                        self.state.still_open(records);
                        self.abort(producer, format!("commit failed: {reason}"), metrics).await
                    }
                })
            }
        }
    }

    /// Abort the open transaction (the session ended, or a commit failed); its handles are
    /// disarmed. Returns the error the session ends with.
    pub async fn abort(
        &mut self,
        producer: &Arc<BaseProducer<DeliveryContext>>,
        reason: String,
        metrics: &TxnMetrics,
    ) -> SinkError {
        if self.state.is_committing() {
            // A commit under way ends first; its records are acked if it succeeds.
            if let Err(e) = Box::pin(self.settle(producer, metrics)).await {
                return e;
            }
        }
        let Some(Batch { sent: had, .. }) = self.state.open() else {
            if let Some(d) = self.forget() {
                return SinkError::Fatal(d);
            }
            return SinkError::Transient(Transient::TxnAborted { reason });
        };
        let p = producer.clone();
        let r = blocking(move || {
            // Let records already on their way land first: aborting while librdkafka is still
            // registering their partitions with the coordinator can end in INVALID_TXN_STATE,
            // a fatal producer state (then the producer is rebuilt; correct, but slower).
            let _ = p.flush(Duration::from_secs(5));
            let r = retrying(|| p.abort_transaction(CALL_TIMEOUT));
            // Reports of purged records come back failed; let them arrive before forgetting.
            let _ = p.flush(Duration::from_secs(5));
            r
        })
        .await;
        let copy_refused = self.forget();
        self.state.aborted();
        if had > 0 {
            metrics.aborted();
            tracing::warn!(records = had, %reason, "Kafka transaction aborted; the next session resumes from the committed position");
        }
        if let Some(d) = copy_refused {
            return SinkError::Fatal(d);
        }
        match r {
            Err(e) if classify(&e) == Verdict::Fatal => SinkError::Transient(self.transient(e)),
            Err(e) => {
                // The abort did not go through (the brokers unreachable): a new producer takes
                // the transactional id back at the next session, which aborts whatever the old
                // one left open.
                tracing::warn!(error = %e, "the Kafka transaction could not be aborted; a new producer is built for the next session");
                self.state.failed();
                SinkError::Transient(Transient::TxnAborted { reason })
            }
            Ok(()) => SinkError::Transient(Transient::TxnAborted { reason }),
        }
    }

    /// Forget the handles of an aborted transaction. A record the broker refused for good is
    /// condemned: the next session meets it again, and [`Txns::condemned`] hands it to
    /// `--on-bad-event` before it can abort another transaction. A refused dead-letter copy
    /// cannot be dead-lettered again: that stops the process, as in at-least-once mode.
    fn forget(&mut self) -> Option<Definite> {
        let mut stop = None;
        for (sent, reason, code) in self.written.disarm_all() {
            let d = match sent {
                Sent::Record(d) => d,
                Sent::Position => {
                    let topic = &self.cfg.position_topic;
                    tracing::error!(%topic, code, %reason, "the broker refused the position record inside a Kafka transaction; the transaction is aborted");
                    continue;
                }
            };
            let (event_id, topic) = (d.event_id().to_owned(), d.topic().to_owned());
            let (copy, place) = (d.is_dead_letter(), Place::of(&d));
            d.disarm();
            if copy {
                stop.get_or_insert_with(|| crate::sink::dead_letter::copy_refused(event_id, topic, &reason));
            } else if let Some(place) = place {
                tracing::warn!(%event_id, %topic, %place, code, %reason, "the broker refused a record inside a Kafka transaction; the transaction is aborted, and when the record comes again --on-bad-event applies to it first");
                self.condemned.insert(place, code, reason);
            } else {
                tracing::error!(%event_id, %topic, code, %reason, "the broker refused a record inside a Kafka transaction, and the record has no place in the stream to be known by; the transaction is aborted");
            }
        }
        stop
    }

    /// Name a record the session hands over now by its place: the change it came from is the
    /// last one the session reported ([`Boundary::Change`]).
    pub fn placed(&self, d: Delivery) -> Delivery {
        match (d.source().position, self.last_change) {
            (Position::Lsn(at), Some((last, nth))) if at == last && !d.is_dead_letter() => d.at_change(nth),
            _ => d,
        }
    }

    /// Is this record one the broker refused in an aborted transaction? Then it is taken out of
    /// the set and returned (its code and reason), for the bad-event policy.
    pub fn condemned(&mut self, d: &Delivery) -> Option<(&'static str, String)> {
        self.condemned.take(d)
    }

    /// The condemned records, for the producer built after this one failed for good.
    pub fn take_condemned(&mut self) -> Condemned {
        std::mem::take(&mut self.condemned)
    }

    pub fn keep_condemned(&mut self, c: Condemned) {
        self.condemned = c;
    }

    fn transient(&mut self, e: KafkaError) -> Transient {
        if classify(&e) == Verdict::Fatal {
            return self.gone_fatal(&e, is_fenced(e.rdkafka_error_code()), e.to_string());
        }
        Transient::TxnAborted { reason: e.to_string() }
    }

    /// The producer failed for good (`error`): logged once, marked for rebuilding, and the session
    /// ends as a standby when it was fenced, else aborts.
    fn gone_fatal(&mut self, error: &dyn std::fmt::Display, fenced: bool, reason: String) -> Transient {
        if !self.state.failed() {
            tracing::warn!(error = %error, transactional_id = %self.cfg.id(), "the Kafka producer is fenced or failed for good (another outboxd took over the transactional id?); nothing of its open transaction is committed, and a new producer is built when this process streams again");
        }
        if fenced {
            Transient::Fenced { reason }
        } else {
            Transient::TxnAborted { reason }
        }
    }

    /// A record refused at produce time because of the producer's transactional state: `State`
    /// (the open transaction failed, e.g. a timed-out record or the coordinator's own abort: it
    /// takes no more records; abort and resume) or `Fatal` (`fatal`: the producer's fatal error,
    /// e.g. fenced by a newer instance: stand by, and build a new producer for the next session).
    pub fn produce_refused(&mut self, code: RDKafkaErrorCode, fatal: Option<RDKafkaErrorCode>) -> Transient {
        if code != RDKafkaErrorCode::Fatal {
            return Transient::TxnAborted {
                reason: "the open Kafka transaction failed and takes no more records".into(),
            };
        }
        let reason = format!("the Kafka producer refuses records after a fatal error ({fatal:?})");
        self.gone_fatal(&format!("{fatal:?}"), is_fenced(fatal), reason)
    }

    fn failure(&mut self, e: KafkaError) -> Error {
        self.transient(e).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txns() -> Txns {
        let cfg = TxnConfig {
            system_id: "1".into(),
            slot: "s".into(),
            position_topic: "outboxd.positions".into(),
            interval: Duration::from_millis(100),
        };
        let mut t = Txns::new(cfg, 10, 1 << 20);
        t.state.prepared();
        t.state.began(None);
        t
    }

    #[test]
    fn whole_transactions_commit_after_their_commit_and_store_the_next_lsn() {
        let mut t = txns();
        t.boundary(Boundary::Begin { final_lsn: Lsn(100), xid: 7 });
        t.boundary(Boundary::Change { at: Lsn(50) });
        t.produced(10);
        assert_eq!(t.due(), None, "not inside a small transaction");
        t.boundary(Boundary::Commit);
        assert!(t.due().is_some());
        assert_eq!(t.position(), Some(DebeziumOffset { lsn_commit: Lsn(101), partial: None }));
    }

    #[test]
    fn a_transaction_past_half_the_budget_commits_inside_itself_at_its_last_change() {
        let mut t = txns();
        t.boundary(Boundary::Begin { final_lsn: Lsn(900), xid: 8 });
        for i in 0..5 {
            t.boundary(Boundary::Change { at: Lsn(100 + i) });
            t.produced(1);
        }
        t.boundary(Boundary::Change { at: Lsn(104) });
        t.produced(1);
        assert!(t.due().is_some_and(|d| d <= tokio::time::Instant::now()));
        assert_eq!(
            t.position(),
            Some(DebeziumOffset {
                lsn_commit: Lsn(900),
                partial: Some(Partial { xid: 8, lsn_proc: Lsn(104), events_at_proc: 2 })
            })
        );
    }

    #[test]
    fn a_message_outside_any_transaction_is_covered_by_the_next_position_even_on_a_fresh_start() {
        let mut t = txns();
        assert_eq!(t.position(), None, "nothing stored yet");
        t.produced(10);
        t.boundary(Boundary::Standalone { at: Lsn(200) });
        assert_eq!(t.position(), Some(DebeziumOffset { lsn_commit: Lsn(200), partial: None }));
        // A transaction whose commit record starts where the message ended is not covered.
        t.boundary(Boundary::Begin { final_lsn: Lsn(200), xid: 9 });
        t.boundary(Boundary::Standalone { at: Lsn(150) });
        t.boundary(Boundary::Commit);
        assert_eq!(t.position(), Some(DebeziumOffset { lsn_commit: Lsn(201), partial: None }));
    }

    #[test]
    fn a_shutdown_inside_a_transaction_commits_at_its_last_change_at_once() {
        let mut t = txns();
        t.boundary(Boundary::Begin { final_lsn: Lsn(900), xid: 8 });
        t.boundary(Boundary::Change { at: Lsn(100) });
        t.produced(1);
        t.boundary(Boundary::Change { at: Lsn(101) });
        t.produced(1);
        assert_eq!(t.due(), None, "inside a small transaction: it waits for the end");
        t.finishing();
        assert!(t.due().is_some_and(|d| d <= tokio::time::Instant::now()), "the end will not be read");
        assert_eq!(
            t.position(),
            Some(DebeziumOffset {
                lsn_commit: Lsn(900),
                partial: Some(Partial { xid: 8, lsn_proc: Lsn(101), events_at_proc: 1 })
            })
        );
    }

    #[tokio::test]
    async fn records_held_during_a_commit_start_the_next_interval() {
        let mut t = txns();
        t.produced(1);
        let (task, position) = (tokio::spawn(async { Ok(()) }), DebeziumOffset { lsn_commit: Lsn(1), partial: None });
        t.state.commit_started(Committing { task, position, records: 2, started: Instant::now() });
        t.holding();
        let held = t.state.held_since().expect("held");
        // The commit returns later; the next transaction's clock began at the first held record.
        let (_, since) = t.state.commit_ended().expect("a commit ran");
        t.state.began(since);
        t.produced(1);
        assert_eq!(t.state.open().and_then(|b| b.since), Some(held), "produced() keeps the earlier start");
        assert_eq!(t.due(), Some(tokio::time::Instant::from_std(held + t.cfg.interval)));
    }

    #[test]
    fn a_produce_refused_by_a_fenced_producer_stands_by_and_rebuilds_it() {
        let mut t = txns();
        let r = t.produce_refused(RDKafkaErrorCode::State, None);
        assert!(matches!(r, Transient::TxnAborted { .. }) && !t.is_fatal(), "{r:?}");
        let r = t.produce_refused(RDKafkaErrorCode::Fatal, Some(RDKafkaErrorCode::Fenced));
        assert!(matches!(r, Transient::Fenced { .. }) && t.is_fatal(), "{r:?}");
        let mut t = txns();
        let r = t.produce_refused(RDKafkaErrorCode::Fatal, Some(RDKafkaErrorCode::OutOfOrderSequenceNumber));
        assert!(matches!(r, Transient::TxnAborted { .. }) && t.is_fatal(), "{r:?}");
    }
}
