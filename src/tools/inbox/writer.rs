//! The PostgreSQL side of `outboxd inbox`: records from the consumer thread gathered into batches
//! (`--batch-size`, `--batch-timeout`) and written with their partitions' next offsets in one
//! statement ([`super::store::write_batch`]); the answers to the consumer's rebalances.
//!
//! The loop, one `tokio::select!` in this priority: shutdown, then the one-second turn (`/healthz`;
//! the backlog gauges and `--retain` run beside it, on a connection of their own: [`chores`]), then the
//! consumer's input, then the batch's deadline. Its state is the batch being gathered ([`Batch`]) and, per assigned
//! partition, the next offset it expects ([`Writer::next`]): a record below it was stored already
//! (fetched again after a seek or a rebalance) and is dropped before it costs a row.
//!
//! A failed write is retried whole (the batch is idempotent: `ON CONFLICT DO NOTHING`, offsets
//! that only grow) while PostgreSQL is away, with `/readyz` answering 503 and the consumer held
//! back by the full channel; nothing is acknowledged anywhere until the write commits. An idle
//! writer checks its connection ([`PROBE_EVERY`] after its last success, one bounded `SELECT 1`,
//! or one attempt to connect, per tick; never a wait for PostgreSQL), so `/readyz` answers 503
//! through an outage with no records flowing too, and a revocation is still answered. A write
//! PostgreSQL refuses for its data (SQLSTATE class 22 or 23, [`store::WriteError`]) is retried row
//! by row, and a row refused alone is a bad record, as is a record without a usable event id:
//! copied to `--dlq-topic` with its reason ([`super::dead`]), acked, and passed over, its offset
//! moving on with the batch. Any other refusal (no privilege, no table, a trigger's exception)
//! stops the inbox with nothing dead-lettered and no offset moved. A stored offset outside the
//! partition's log stops it too ([`Writer::check_range`]), rather than records being skipped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_postgres::{Client, Statement};
use tokio_util::sync::CancellationToken;

use super::batch::{Batch, Halt};
use super::beat::Beat;
use super::chores;
use super::commit::Commits;
use super::consumer::{start_of, Input, Part};
use super::dead::DeadLetters;
use super::decode::{Decoder, Failure};
use super::lag::Lag;
use super::record::{to_row, Bad, Naming, Received};
use super::store::{self, Names, WriteError};
use crate::config::inbox::{InboxConfig, StartFrom};
use crate::error::{Definite, Error};
use crate::health::Health;
use crate::metrics::InboxMetrics;
use crate::pg::admin::connect_primary;
use crate::status::inbox::inbox_board;

pub struct Writer {
    cfg: InboxConfig,
    names: Names,
    naming: Naming,
    sql: String,
    /// The connection, and the batch statement prepared on it (parsed once per connection, so a
    /// batch is one round trip: Bind and Execute).
    client: Option<(Client, Statement)>,
    health: Arc<Health>,
    /// The consumer thread's heartbeat: the writer's ticks count only while it beats too.
    beat: Arc<Beat>,
    /// The consumer's stall was logged (once per stall).
    stalled: bool,
    dead: DeadLetters,
    metrics: InboxMetrics,
    /// Assigned partitions and the next offset each expects.
    next: HashMap<Part, i64>,
    /// Records (topic, partition, offset) of the batch in hand dead-lettered already.
    refused: std::collections::HashSet<(String, i32, i64)>,
    batch: Batch,
    /// `--value-format avro|protobuf|json-schema`: values decoded for `payload_json`.
    decoder: Option<Decoder>,
    /// Stored offsets for Kafka's copy (`--commit-kafka-offsets`).
    commits: Arc<Commits>,
    /// Stored offsets for the lag gauges.
    lag: Arc<Lag>,
    /// When a step last succeeded on the connection: an idle writer checks it after
    /// [`PROBE_EVERY`] without one ([`Writer::probe_due`]).
    last_ok: Instant,
}

/// An idle writer checks its connection this long after its last success, so `/readyz` answers
/// 503 during a PostgreSQL outage with no records flowing (documented: docs/src/inbox.md).
pub const PROBE_EVERY: Duration = Duration::from_secs(5);
/// The longest a check may take: a server that stops answering is an outage too.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

impl Writer {
    pub fn new(cfg: InboxConfig, health: Arc<Health>, beat: Arc<Beat>) -> Result<Writer, Definite> {
        let names = Names { schema: cfg.schema.clone(), table: cfg.table.clone() };
        let naming = Naming {
            event_id_headers: Naming::event_id_headers(&cfg.event_id_header),
            event_type_header: cfg.event_type_header.clone(),
        };
        let sql = store::batch_sql(&names);
        let dead = DeadLetters::new(&cfg.kafka, &cfg.dlq_topic)?;
        let decoder = cfg
            .registry
            .as_ref()
            .map(|r| Decoder::new(r, cfg.schema_missing_timeout))
            .transpose()
            .map_err(Definite::Config)?;
        let commits = Arc::new(Commits::new(cfg.commit_kafka_offsets));
        Ok(Writer {
            cfg,
            names,
            naming,
            sql,
            client: None,
            health,
            beat,
            stalled: false,
            dead,
            metrics: InboxMetrics::new(),
            next: HashMap::new(),
            refused: Default::default(),
            batch: Batch::default(),
            decoder,
            commits,
            lag: Arc::new(Lag::default()),
            last_ok: Instant::now(),
        })
    }

    /// The stored offsets for Kafka's copy, which the consumer thread sends.
    pub fn commits(&self) -> Arc<Commits> {
        self.commits.clone()
    }

    /// The lag's state, which the consumer thread and its lag thread share.
    pub fn lag(&self) -> Arc<Lag> {
        self.lag.clone()
    }

    /// Connect and make sure the schema is there; a definite failure (bad credentials, no
    /// permission) ends the command, a transient one is for the caller to retry.
    pub async fn prepare(&mut self) -> Result<(), Error> {
        let client = connect_primary(&self.cfg.postgres).await?;
        store::ensure_schema(&client, &self.names).await?;
        let statement = store::prepare_batch(&client, &self.sql).await.map_err(WriteError::into_error)?;
        self.client = Some((client, statement));
        self.health.set_streaming(true);
        inbox_board().writer(None);
        Ok(())
    }

    /// Run until `shutdown`; the batch in hand is written first, then the consumer is let go,
    /// unless shutdown came while something taken waited ([`Halt::Stopped`]): then nothing more is
    /// written, and those records are read again after the restart.
    pub async fn run(&mut self, rx: &mut mpsc::Receiver<Input>, shutdown: &CancellationToken) -> Result<(), Error> {
        let ended = match self.serve(rx, shutdown).await {
            Ok(()) => self.flush(shutdown).await,
            halt => halt,
        };
        match ended {
            Ok(()) => Ok(()),
            Err(Halt::Stopped) => {
                tracing::info!("stopped while waiting; the records not written are read again after the restart");
                Ok(())
            }
            Err(Halt::Failed(e)) => Err(e),
        }
    }

    /// The loop of [`Writer::run`], until shutdown or a halt.
    async fn serve(&mut self, rx: &mut mpsc::Receiver<Input>, shutdown: &CancellationToken) -> Result<(), Halt> {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        // A turn delayed by a long write is taken once, not caught up in a burst.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The backlog gauges and --retain, on a connection of their own (chores.rs says why); they
        // stop with this loop, however it ends.
        let stop_chores = shutdown.child_token();
        let chores = chores::spawn(&self.cfg, self.names.clone(), self.health.clone(), stop_chores.clone());
        let _stop_chores = stop_chores.clone().drop_guard();
        loop {
            let deadline = self.batch.deadline(self.cfg.batch_timeout);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                // Before the input: in a catch-up the channel is never empty, and an arm after
                // `recv` would never run (no /healthz tick, no backlog, no prune: a liveness probe
                // would kill a healthy drain). Ready once a second, it cannot starve the input.
                _ = tick.tick() => {
                    let alive = self.tick();
                    if !alive && !self.stalled {
                        tracing::error!(
                            stall = ?self.cfg.health_stall_timeout,
                            "the Kafka consumer thread made no progress for --health-stall-timeout; /healthz fails"
                        );
                    }
                    self.stalled = !alive;
                    if self.probe_due(Instant::now()) {
                        // Nothing to write: one check, so an outage makes /readyz 503 now and its
                        // end 200 again, without waiting here for PostgreSQL to come back.
                        self.probe_once(shutdown).await?;
                    }
                    // Ended by anything but the shutdown (which it may have seen first): a panic.
                    if chores.is_finished() && !stop_chores.is_cancelled() {
                        return Err(Definite::TaskEnded {
                            task: "the inbox chores (backlog gauges, --retain)".into(),
                            how: "it panicked".into(),
                        }.into());
                    }
                }
                input = rx.recv() => match input {
                    Some(i) => {
                        // The consumer had nothing more buffered and nothing waits behind it: write
                        // now rather than wait out --batch-timeout (a lone record's latency); in a
                        // catch-up the channel is never empty and batches fill.
                        let idle = matches!(i, Input::Records(_, true));
                        self.take(i, shutdown).await?;
                        if idle && rx.is_empty() {
                            self.flush(shutdown).await?;
                        }
                    }
                    None => return Err(Definite::TaskEnded {
                        task: "the Kafka consumer thread".into(),
                        how: "its channel closed".into(),
                    }.into()),
                },
                _ = sleep_until(deadline), if deadline.is_some() => self.flush(shutdown).await?,
            }
        }
        Ok(())
    }

    async fn take(&mut self, input: Input, shutdown: &CancellationToken) -> Result<(), Halt> {
        match input {
            Input::Records(rs, _) => {
                for r in rs {
                    // The rest of the chunk is read again after the restart; the batch in hand
                    // holds a prefix of it, and is written.
                    if shutdown.is_cancelled() {
                        break;
                    }
                    self.record(r, shutdown).await?;
                    // The loop's deadline arm gets no turn while the channel stays full.
                    if self.batch.overdue(self.cfg.batch_timeout, Instant::now()) {
                        self.flush(shutdown).await?;
                    }
                }
            }
            Input::Assign(parts, committed, reply) => {
                self.flush(shutdown).await?;
                let names: Vec<Part> = parts.iter().map(|(p, _)| p.clone()).collect();
                let Some(Done::Loaded(loaded)) = self.retrying(shutdown, Step::Load(&names)).await? else {
                    return Err(Halt::Stopped);
                };
                let stored = loaded.offsets;
                // --start-from committed reads the group's Kafka offsets only for the cut-over
                // itself: while PostgreSQL holds no offset of the group. After it, the group's
                // offsets in Kafka are the inbox's own copy (--commit-kafka-offsets), and a
                // partition missing from PostgreSQL (a restore, a lagging replica, a row deleted)
                // starting there would skip what lies between: it starts at the earliest instead.
                let committed = if loaded.group_known && !committed.is_empty() {
                    let ignored: Vec<_> = names.iter().filter(|p| !stored.contains_key(*p)).collect();
                    if !ignored.is_empty() {
                        tracing::warn!(
                            partitions = ?ignored,
                            "--start-from committed: group {} already has offsets stored in {}, so these partitions \
                             with none there start at the earliest, not at the group's offsets in Kafka; drop \
                             --start-from committed once the cut-over is done (docs/src/inbox.md)",
                            self.cfg.group,
                            self.names.offsets()
                        );
                    }
                    HashMap::new()
                } else {
                    committed
                };
                let mut starts = Vec::with_capacity(parts.len());
                let mut fresh = HashMap::new();
                for (part, range) in parts {
                    let at = match (stored.get(&part).copied(), self.cfg.start_from) {
                        (Some(n), _) => {
                            self.check_range(&part, n, range)?;
                            Some(n)
                        }
                        // Stored before the partition is assigned, so a kill or a rebalance before
                        // its first batch starts it here again, not at a later end.
                        (None, StartFrom::Latest) => {
                            fresh.insert(part.clone(), range.1);
                            Some(range.1)
                        }
                        // The group's offset in Kafka, checked like a stored one and stored
                        // the same way, so from now on PostgreSQL's offset decides.
                        (None, StartFrom::Committed) if committed.contains_key(&part) => {
                            let n = committed[&part];
                            self.check_committed(&part, n, range)?;
                            fresh.insert(part.clone(), n);
                            Some(n)
                        }
                        // The first record seen sets its position.
                        (None, StartFrom::Earliest | StartFrom::Committed) => None,
                    };
                    starts.push((part, start_of(at, self.cfg.start_from), at));
                }
                if !fresh.is_empty() {
                    let first = Batch { next: fresh, ..Batch::default() };
                    if !matches!(self.retrying(shutdown, Step::Write(&first)).await?, Some(Done::Written(Some(_)))) {
                        return Err(Halt::Stopped);
                    }
                    tracing::info!(partitions = ?first.next, "--start-from: stored where the new partitions start");
                }
                let starts = starts
                    .into_iter()
                    .map(|(part, off, at)| {
                        inbox_board().assigned(&part.0, part.1, at);
                        self.next.insert(part.clone(), at.unwrap_or(i64::MIN));
                        (part, off)
                    })
                    .collect();
                // Kafka's copy follows the stored offsets of partitions taken over too, not only
                // those of the next batch: the previous owner's last copy may be lost (kill -9
                // within its 200 ms, `--commit-kafka-offsets false` there), and with no traffic a
                // lag tool would show the old offset for good. Read from PostgreSQL, so committed
                // there: never ahead of it. Here, after the range checks and the --start-from
                // latest write: only partitions actually taken are handed over.
                self.commits.stored(&stored);
                let _ = reply.send(starts);
            }
            Input::OutOfRange(ranges) => {
                for (part, range) in ranges {
                    if let Some(&n) = self.next.get(&part).filter(|n| **n != i64::MIN) {
                        self.check_range(&part, n, range)?;
                    }
                }
                return Err(Definite::Setup(format!(
                    "Kafka reported a read position outside a partition's log (auto.offset.reset=error); nothing was \
                     skipped: compare each partition's next_offset in {} with the topic's offsets (docs/src/inbox.md, \
                     'Offsets out of range') and start again",
                    self.names.offsets()
                ))
                .into());
            }
            Input::Revoke(parts, reply) => {
                self.flush(shutdown).await?;
                for p in &parts {
                    self.next.remove(p);
                    inbox_board().revoked(&p.0, p.1);
                }
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    /// One record into the batch (written when full), unless it was stored already.
    async fn record(&mut self, r: Received, shutdown: &CancellationToken) -> Result<(), Halt> {
        let part = (r.topic.clone(), r.partition);
        let expected = match self.next.get(&part) {
            Some(n) if r.offset >= *n => *n,
            // Stored already, or a partition no longer ours: nothing to do.
            _ => return Ok(()),
        };
        let decoded = self.decode(&r, shutdown).await?;
        self.next.insert(part.clone(), r.offset + 1);
        if self.batch.since.is_none() {
            self.batch.first_age_ms = r.timestamp_ms.map(|ts| jiff::Timestamp::now().as_millisecond() - ts);
        }
        self.batch.taken(part, r.offset, expected);
        match (to_row(r, &self.naming), decoded) {
            (Ok(mut row), Ok(json)) => {
                if let Some(json) = json {
                    // The same rule as for JSON values: what jsonb refuses stays bytes only.
                    row.payload_json = super::record::jsonb_text(json.as_bytes());
                }
                self.batch.rows.push(row);
            }
            (Ok(row), Err(bad)) => self.batch.bad.push((bad, row.received())),
            (Err(bad), _) => self.batch.bad.push(*bad),
        }
        if self.batch.full(self.cfg.batch_size) {
            self.flush(shutdown).await?;
        }
        Ok(())
    }

    /// With `--value-format` avro, protobuf or json-schema, `r`'s value decoded to JSON
    /// (`Ok(None)` for a null value, or without a registry format), or why it is a bad record.
    /// While the registry cannot be asked, the batch in hand is written, `/readyz` answers 503,
    /// and the registry is asked again with backoff: never a dead letter. [`Halt::Stopped`] when
    /// shutdown came first (the record is not taken; it is read again after the restart).
    async fn decode(
        &mut self,
        r: &Received,
        shutdown: &CancellationToken,
    ) -> Result<Result<Option<String>, Bad>, Halt> {
        let Some(payload) = r.payload.as_deref() else { return Ok(Ok(None)) };
        let mut attempt = 0u32;
        loop {
            let Some(decoder) = self.decoder.as_mut() else { return Ok(Ok(None)) };
            match decoder.decode(payload, &r.position()).await {
                Ok(json) => {
                    if attempt > 0 {
                        tracing::info!("the schema registry answers again; resuming");
                        self.health.set_streaming(true);
                        inbox_board().writer(None);
                    }
                    return Ok(Ok(json));
                }
                Err(Failure::Bad(bad)) => return Ok(Err(bad)),
                Err(Failure::Definite(e)) => return Err(Definite::Config(e).into()),
                Err(Failure::Unavailable(e)) => {
                    if attempt == 0 {
                        self.flush(shutdown).await?;
                    }
                    tracing::warn!("{e}; waiting for the registry, nothing is dead-lettered (readiness 503 meanwhile)");
                    self.health.set_streaming(false);
                    inbox_board().writer(Some(&format!("waiting for the schema registry: {e}")));
                    let wait = crate::retry::backoff(attempt, self.cfg.reconnect_max_backoff);
                    attempt = attempt.saturating_add(1);
                    tokio::select! {
                        _ = shutdown.cancelled() => return Err(Halt::Stopped),
                        _ = self.sleep_ticking(wait) => {}
                    }
                }
            }
        }
    }

    /// A turn of the writer's loop for `/healthz`, counted only while the consumer thread is alive
    /// too ([`Beat::alive`]), so a wedge on either side fails the probe. Whether it counted.
    fn tick(&self) -> bool {
        let alive = self.beat.alive(self.cfg.health_stall_timeout);
        if alive {
            self.health.loop_tick();
        }
        alive
    }

    /// Sleep `d` (a backoff, up to `--reconnect-max-backoff`), ticking every second meanwhile: a
    /// wait for PostgreSQL or Kafka is readiness, not a wedge, however long the backoff.
    async fn sleep_ticking(&self, d: Duration) {
        let end = Instant::now() + d;
        loop {
            self.tick();
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        }
    }

    /// A stored offset must lie within the partition's log (`low..=high`); outside it the records
    /// in between are gone (below: the retention deleted them) or the offset belongs to another
    /// log (beyond: the topic was created again). Either way the inbox stops, naming the fix.
    fn check_range(&self, (topic, p): &Part, n: i64, (low, high): (i64, i64)) -> Result<(), Definite> {
        if (low..=high).contains(&n) {
            return Ok(());
        }
        let why = if n < low {
            format!("below the first record Kafka still holds, {low}: records {n} to {} were deleted (retention) before the inbox stored them", low - 1)
        } else {
            format!("beyond the partition's end, {high}: the topic was probably deleted and created again")
        };
        let lit = |s: &str| format!("'{}'", s.replace('\'', "''"));
        Err(Definite::Setup(format!(
            "partition {topic}/{p}: the offset stored for group {group} in {offsets} is {n}, {why}; nothing was read. \
             To read from the first record Kafka holds, run \
             UPDATE {offsets} SET next_offset = {low} WHERE group_id = {g} AND topic = {t} AND kafka_partition = {p}; \
             and start again (docs/src/inbox.md, 'Offsets out of range')",
            group = self.cfg.group,
            offsets = self.names.offsets(),
            g = lit(&self.cfg.group),
            t = lit(topic),
        )))
    }

    /// Whether the connection is due a check at `now`: nothing in hand and no success for
    /// [`PROBE_EVERY`] (a busy writer's writes are its checks).
    fn probe_due(&self, now: Instant) -> bool {
        self.batch.next.is_empty() && now.saturating_duration_since(self.last_ok) >= PROBE_EVERY
    }

    /// An idle writer's check: one attempt (connecting first when the client was dropped), bounded
    /// by [`PROBE_TIMEOUT`] and the shutdown. A transient failure turns readiness off and drops the
    /// client, and the next tick tries again: the writer never waits here for PostgreSQL, so a
    /// revocation or a shutdown is answered meanwhile. A definite failure stops the inbox, as a
    /// write's would.
    async fn probe_once(&mut self, shutdown: &CancellationToken) -> Result<(), Error> {
        let was_up = self.health.streaming();
        let result = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = tokio::time::timeout(PROBE_TIMEOUT, async {
                if self.client.is_none() {
                    self.prepare().await?;
                }
                self.probe().await
            }) => r,
        };
        let failure = match result {
            Ok(Ok(())) => {
                if !was_up {
                    tracing::info!("PostgreSQL reachable again; resuming");
                }
                self.last_ok = Instant::now();
                self.health.set_streaming(true);
                inbox_board().writer(None);
                return Ok(());
            }
            Ok(Err(Error::Transient(e))) => e.to_string(),
            Ok(Err(e)) => return Err(e),
            Err(_) => format!("checking the connection: no answer in {}s", PROBE_TIMEOUT.as_secs()),
        };
        if was_up {
            tracing::warn!("{failure}; nothing to write meanwhile (readiness 503), checking again every second");
        }
        inbox_board().writer(Some(&failure));
        self.client = None;
        self.health.set_streaming(false);
        Ok(())
    }

    /// One round trip on the connection, bounded by [`PROBE_TIMEOUT`]; its failure is classified
    /// by SQLSTATE like a write's (a closed connection is transient, class 08).
    async fn probe(&mut self) -> Result<(), Error> {
        let (client, _) = self.client.as_ref().ok_or_else(not_connected)?;
        match tokio::time::timeout(PROBE_TIMEOUT, client.simple_query("SELECT 1")).await {
            Ok(r) => r.map(drop).map_err(|e| crate::pg::sqlstate::query_error("checking the connection", e)),
            Err(_) => Err(crate::error::Transient::PgServer {
                code: "57014".into(),
                message: format!("checking the connection: no answer in {}s", PROBE_TIMEOUT.as_secs()),
            }
            .into()),
        }
    }

    /// `--start-from committed`: the group's Kafka offset `n` must lie in the partition's log,
    /// else nothing is read (below: records the old consumer never committed are gone).
    fn check_committed(&self, (topic, p): &Part, n: i64, (low, high): (i64, i64)) -> Result<(), Definite> {
        if (low..=high).contains(&n) {
            return Ok(());
        }
        Err(Definite::Setup(format!(
            "partition {topic}/{p}: --start-from committed: group {group} has committed offset {n} in Kafka, outside \
             the partition's log ({low} to {high}); nothing was read or stored. Set the group's offset with \
             kafka-consumer-groups --reset-offsets (or insert the start into {offsets}) and start again \
             (docs/src/inbox.md, 'Migrating a consumer that deduplicates by hand')",
            group = self.cfg.group,
            offsets = self.names.offsets(),
        )))
    }

    async fn load(&mut self, parts: &[Part]) -> Result<store::Stored, Error> {
        let (client, _) = self.client.as_ref().ok_or_else(not_connected)?;
        store::load_offsets(client, &self.names, &self.cfg.group, parts).await
    }

    /// Write the batch in hand, retrying while PostgreSQL is away. [`Halt::Stopped`] when
    /// shutdown came first: the batch is abandoned, and its partitions' expected offsets go back
    /// to its start, so nothing after it can be stored past its records.
    async fn flush(&mut self, shutdown: &CancellationToken) -> Result<(), Halt> {
        if self.batch.next.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        let started = Instant::now();
        let mut copied = true;
        for (bad, r) in &batch.bad {
            if !self.dead_letter(r, bad, shutdown).await {
                copied = false;
                break;
            }
        }
        let written = if copied { self.retrying(shutdown, Step::Write(&batch)).await } else { Ok(None) };
        // Rows dead-lettered by this batch's attempts: none is copied twice while it is retried.
        self.refused.clear();
        let Some(Done::Written(Some(n))) = written? else {
            for (part, start) in &batch.start {
                if let Some(next) = self.next.get_mut(part) {
                    *next = (*next).min(*start);
                }
            }
            return Err(Halt::Stopped);
        };
        for ((topic, p), next) in &batch.next {
            inbox_board().stored(topic, *p, *next);
        }
        self.metrics.written(n as u64, (batch.rows.len() as u64).saturating_sub(n as u64));
        // Where a batch's time went (bench/run inbox reads these): its first record's age when
        // taken, the gathering until the write started, the write and its commit.
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        tracing::debug!(
            records = batch.rows.len(),
            inserted = n,
            first_age_ms = batch.first_age_ms.unwrap_or(-1),
            gather_ms = format_args!("{:.2}", batch.since.map_or(0.0, |s| ms(started.saturating_duration_since(s)))),
            write_ms = format_args!("{:.2}", ms(started.elapsed())),
            "batch written"
        );
        Ok(())
    }

    /// Copy `r` to the dead-letter topic, waiting and sending again while Kafka does not ack it
    /// (so a failed copy never makes the batch, and the copies of its other rows, go again);
    /// false when shutdown came first.
    async fn dead_letter(&self, r: &Received, bad: &Bad, shutdown: &CancellationToken) -> bool {
        let mut attempt = 0;
        while let Err(e) = self.dead.send(r, bad).await {
            tracing::warn!("{e}; sending it again");
            inbox_board().writer(Some(&format!("waiting for a dead-letter copy: {e}")));
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = self.sleep_ticking(crate::retry::backoff(attempt, self.cfg.reconnect_max_backoff)) => {}
            }
            attempt += 1;
        }
        if attempt > 0 {
            inbox_board().writer(None);
        }
        self.metrics.dead_lettered(bad.reason);
        crate::status::board().dead_lettered(None, Some(&r.topic), bad.reason, &bad.message);
        true
    }

    /// One batch; a batch PostgreSQL refuses for its data (SQLSTATE class 22 or 23, see
    /// [`store::WriteError`]) is written row by row, and a row refused alone is dead-lettered and
    /// passed over. Any other refusal stops the inbox, with nothing dead-lettered. `None` when
    /// shutdown came while a copy waited for Kafka.
    async fn write(&mut self, batch: &Batch, shutdown: &CancellationToken) -> Result<Option<i64>, Error> {
        let (client, stmt) = self.client.as_ref().ok_or_else(not_connected)?;
        let group = &self.cfg.group;
        match store::write_batch(client, stmt, group, &batch.rows, &batch.next).await {
            Ok(w) => return Ok(Some(w.inserted)),
            Err(WriteError::Row(e)) if !batch.rows.is_empty() => {
                tracing::warn!("the batch was refused ({e}); writing its rows one by one");
            }
            Err(e) => return Err(e.into_error()),
        }
        let mut inserted = 0;
        for row in &batch.rows {
            let at = (row.topic.clone(), row.partition, row.offset);
            if self.refused.contains(&at) {
                continue;
            }
            let (client, stmt) = self.client.as_ref().ok_or_else(not_connected)?;
            let next = HashMap::from([((row.topic.clone(), row.partition), row.offset + 1)]);
            match store::write_batch(client, stmt, group, std::slice::from_ref(row), &next).await {
                Ok(w) => inserted += w.inserted,
                Err(WriteError::Row(e)) => {
                    let why = format!(
                        "record {}/{}/{} (event {}) refused by the inbox table: {e}",
                        row.topic, row.partition, row.offset, row.event_id
                    );
                    let bad = Bad { reason: "inbox_refused", message: why };
                    if !self.dead_letter(&row.received(), &bad, shutdown).await {
                        return Ok(None);
                    }
                    self.refused.insert(at);
                }
                Err(e) => return Err(e.into_error()),
            }
        }
        let (client, stmt) = self.client.as_ref().ok_or_else(not_connected)?;
        store::write_batch(client, stmt, group, &[], &batch.next).await.map_err(WriteError::into_error)?;
        Ok(Some(inserted))
    }

    /// Run `step` until it succeeds, reconnecting with backoff after a transient failure;
    /// `None` when shutdown came first. `/readyz` answers 503 meanwhile.
    async fn retrying(&mut self, shutdown: &CancellationToken, step: Step<'_>) -> Result<Option<Done>, Error> {
        let mut attempt = 0u32;
        loop {
            if self.client.is_some() {
                let done = match step {
                    Step::Load(parts) => self.load(parts).await.map(Done::Loaded),
                    Step::Write(batch) => self.write(batch, shutdown).await.map(Done::Written),
                };
                match done {
                    Ok(v) => {
                        // Only a batch whose offsets PostgreSQL committed: `Written(None)` is a
                        // shutdown before them, and Kafka must never be ahead of PostgreSQL.
                        if let (Step::Write(batch), Done::Written(Some(_))) = (step, &v) {
                            self.commits.stored(&batch.next);
                            self.lag.stored(&batch.next);
                        }
                        self.last_ok = Instant::now();
                        self.health.set_streaming(true);
                        return Ok(Some(v));
                    }
                    Err(Error::Transient(e)) => {
                        tracing::warn!("{e}; retrying, nothing is lost (readiness 503 meanwhile)");
                        inbox_board().writer(Some(&e.to_string()));
                        self.client = None;
                    }
                    Err(e) => return Err(e),
                }
            }
            self.health.set_streaming(false);
            let wait = crate::retry::backoff(attempt, self.cfg.reconnect_max_backoff);
            attempt = attempt.saturating_add(1);
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(None),
                _ = self.sleep_ticking(wait) => {}
            }
            match self.prepare().await {
                Ok(()) => tracing::info!("PostgreSQL reachable again; resuming"),
                Err(Error::Transient(e)) => tracing::warn!("PostgreSQL still not reachable: {e}"),
                Err(e) => return Err(e),
            }
        }
    }
}

/// What [`Writer::retrying`] repeats.
#[derive(Clone, Copy)]
enum Step<'b> {
    Load(&'b [Part]),
    Write(&'b Batch),
}

/// What a [`Step`] gave.
enum Done {
    Loaded(store::Stored),
    Written(Option<i64>),
}

fn not_connected() -> Error {
    crate::error::Transient::PgServer { code: "08003".into(), message: "not connected".into() }.into()
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
