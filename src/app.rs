//! The supervisor: set-up checks once, then replication sessions until shutdown, plus the monitor
//! task (lag polling, heartbeats).
//!
//! Set-up failures (unreachable server, bad login, `wal_level`, missing table or column, lost
//! slot) are definite and end the process with their message. After streaming has started once,
//! transient failures (a dropped connection, a server restart, a walsender timeout) start a new
//! session after an exponential backoff with jitter, from the later of the slot's
//! `confirmed_flush_lsn` and the frontier this process already reached. PostgreSQL persists a
//! logical slot's `confirmed_flush_lsn` lazily (only when `restart_lsn` or `catalog_xmin` moves),
//! so after a server restart the slot can be far behind what we confirmed; starting at our own
//! frontier makes the server skip transactions that committed before it, and only records that
//! were in flight are sent again, which is the at-least-once window. A slot held by another
//! process is waited for (this process is then a standby: `outboxd_role{role="standby"}`, /readyz
//! says so) every `--standby-retry-interval` plus jitter, never taken over, and never dropped.
//! Once this process has streamed, a missing slot is a definite error (lost in a failover), not
//! something to recreate, unless `--slot-recreate-after-loss` says so.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::{Definite, Error, Transient};
use crate::health::Health;
use crate::lineage::Lineage;
use crate::lsn::Lsn;
use crate::pg::admin;
use crate::pg::replication::{ReplicationConn, WalHistory};
use crate::retry::backoff;
use crate::sink::Sink;
use crate::source::wal::{Context, Session};

/// How long a session waits for the exactly-once producer to start (it may wait out another
/// instance's open transaction, up to its `transaction.timeout.ms`).
const EXACTLY_ONCE_PREPARE_TIMEOUT: Duration = Duration::from_secs(180);

/// The heartbeat: a transaction that takes a transaction id and changes nothing, so its commit
/// record is WAL that no logical decoding consumer sees at all: decoding replays no transaction
/// that made no change (not even an empty BEGIN/COMMIT, on any version; tests/ops.rs and
/// tests/compat.rs peek with test_decoding's `skip-empty-xacts` off to show it); a logical message, which this was before, is captured by any Debezium connector on the
/// database (it captures every prefix by default). What the slot needs is only WAL past its
/// position: the walsender reads past the commit and its keepalive carries the WAL end, which
/// the session confirms while nothing is in flight (`source::wal::tracker`).
const HEARTBEAT_SQL: &str = "SELECT txid_current()";

/// How often the monitor wakes; finer than any sensible lag-poll or heartbeat interval.
const MONITOR_TICK: Duration = Duration::from_millis(250);

pub use crate::health::Handles;

/// Run until shutdown. Returns `Ok` after a clean drain.
pub async fn run<S: Sink>(cfg: &Config, sink: &mut S, handles: Handles) -> Result<(), Error> {
    {
        let client = admin::connect(cfg).await?;
        let version = admin::server_version(&client).await?;
        version.check_supported()?;
        admin::check_wal_level(&client).await?;
        if !cfg.messages_prefixes.is_empty() {
            admin::check_messages_supported(&version)?;
        }
        admin::check_tables(&client, cfg).await?;
        if cfg.require_empty_tables {
            admin::check_empty(&client, cfg).await?;
        }
        admin::ensure_publication(&client, cfg).await?;
    }
    let shutdown = handles.shutdown.clone();
    let mut monitor = tokio::spawn(monitor(cfg.clone(), handles.clone()));
    let supervised = supervise(cfg, sink, handles);
    tokio::pin!(supervised);
    // The monitor returns by itself only on shutdown; any other end (a panic) stops the process
    // rather than stream on without lag metrics and heartbeats (an idle slot would pin WAL).
    let result = tokio::select! {
        r = &mut supervised => r,
        joined = &mut monitor => match joined {
            Ok(()) if shutdown.is_cancelled() => supervised.await,
            other => Err(crate::task::ended("the monitor task (lag metrics and heartbeats)", other).into()),
        },
    };
    monitor.abort();
    result
}

/// `--delivery exactly-once`: name the transactional producer after the database it reads (its
/// system identifier, which a physical standby shares, so the name survives a failover) and the
/// slot. Runs before the sink is built.
pub async fn identify_for_transactions(cfg: &mut Config) -> Result<(), Error> {
    if cfg.kafka.transactions.is_none() {
        return Ok(());
    }
    let mut conn = ReplicationConn::connect(&cfg.postgres).await?;
    let history = match tokio::time::timeout(admin::ADMIN_TIMEOUT, conn.identify_system()).await {
        Ok(r) => r?,
        Err(_) => return Err(stalled("IDENTIFY_SYSTEM")),
    };
    drop(conn);
    if let Some(t) = cfg.kafka.transactions.as_mut() {
        t.identify(&history.system_id);
        tracing::info!(transactional_id = %t.id(), "exactly-once delivery: Kafka transactions under this transactional.id");
    }
    Ok(())
}

async fn supervise<S: Sink>(cfg: &Config, sink: &mut S, handles: Handles) -> Result<(), Error> {
    let Handles { health, metrics, shutdown } = handles;
    let mut attempt = 0u32;
    let mut state = SessionState::default();
    loop {
        health.loop_tick();
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let ctx = Context { cfg, metrics: metrics.clone(), health: health.clone() };
        let mut reached_stream = false;
        let result = session(ctx, sink, shutdown.clone(), &mut state, &mut reached_stream).await;
        if reached_stream {
            attempt = 0;
        }
        let busy = match &result {
            Err(Error::Transient(Transient::SlotBusy { pid, .. })) => Some(format!("PID {pid}")),
            // START_REPLICATION lost the race to another instance: object_in_use.
            Err(Error::Transient(Transient::PgServer { code, message })) if code == "55006" => Some(message.clone()),
            // Exactly-once: another instance's producer took over the transactional id.
            Err(Error::Transient(Transient::Fenced { reason })) => Some(reason.clone()),
            _ => None,
        };
        health.set_standby(busy.is_some());
        metrics.role(false, busy.is_some());
        match result {
            Ok(()) => return Ok(()),
            Err(_) if busy.is_some() => {
                let delay = standby_delay(cfg.standby_retry_interval);
                tracing::warn!(
                    slot = %cfg.slot,
                    holder = busy.as_deref().unwrap_or_default(),
                    ?delay,
                    "replication slot is held by another process; standing by to take it over when it is released"
                );
                attempt = 0;
                wait(&health, &shutdown, delay).await;
            }
            Err(e) if e.is_transient() => {
                let delay = backoff(attempt, cfg.reconnect_max_backoff);
                attempt = attempt.saturating_add(1);
                metrics.pg_reconnects.increment(1);
                tracing::warn!(error = %e, ?delay, "replication session ended; reconnecting from the confirmed LSN");
                wait(&health, &shutdown, delay).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `--standby-retry-interval` plus up to a fifth of it, from the clock's low bits, so two standbys
/// do not knock on the slot in step.
fn standby_delay(interval: Duration) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let spread = interval.as_millis() as u64 / 5;
    interval + Duration::from_millis(if spread == 0 { 0 } else { nanos as u64 % spread })
}

/// Sleep `d` or until shutdown, ticking liveness each second: backing off is progress.
async fn wait(health: &Health, shutdown: &CancellationToken, d: Duration) {
    let until = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < until {
        health.loop_tick();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(until.min(tokio::time::Instant::now() + Duration::from_secs(1))) => {}
        }
    }
}

/// What one session leaves for the next.
#[derive(Default)]
struct SessionState {
    streamed_once: bool,
    /// The walsender PID of our last replication connection: if a dead link left it holding the
    /// slot, it is ours to end.
    own_walsender: Option<admin::Walsender>,
    /// The frontier reached by this process (every record before it was acked by the sink), and
    /// the WAL history it belongs to: it is only a position on that server's timeline.
    confirmed: Option<(Lsn, WalHistory)>,
}

/// One session: re-check the publication and slot, connect, stream.
async fn session<S: Sink>(
    ctx: Context<'_>,
    sink: &mut S,
    shutdown: CancellationToken,
    state: &mut SessionState,
    reset_backoff: &mut bool,
) -> Result<(), Error> {
    let cfg = ctx.cfg;
    let checks = async {
        let client = admin::connect(cfg).await.map_err(as_transient)?;
        if state.streamed_once && !admin::publication_exists(&client, &cfg.publication).await? {
            return Err(Definite::Setup(format!(
                "publication {:?} was dropped while outboxd was running; recreate it (see sql/04_publication.sql) and restart",
                cfg.publication
            ))
            .into());
        }
        // Per session: after a failover the server (and its version) may be another one.
        let version = admin::server_version(&client).await?;
        version.check_supported()?;
        admin::check_failover(&client, cfg, &version).await?;
        // Once this process has streamed, a missing slot was lost (a failover), not never made.
        let missing = if state.streamed_once && !cfg.slot_recreate_after_loss {
            admin::MissingSlot::Lost
        } else if !state.streamed_once && cfg.debezium_offsets.is_some() {
            admin::MissingSlot::Adopt
        } else {
            admin::MissingSlot::Create
        };
        let slot = take_slot(&client, cfg, state.own_walsender.as_ref(), missing).await?;
        Ok::<_, Error>((slot, client))
    };
    // The connection may try every host (and address) for up to connect_timeout each first.
    let hosts = u32::try_from(cfg.postgres.hosts.len()).unwrap_or(u32::MAX);
    let bound = admin::ADMIN_TIMEOUT * 2 + cfg.postgres.connect_timeout.saturating_mul(hosts.saturating_mul(2));
    let (slot, client) = match tokio::time::timeout(bound, checks).await {
        Ok(r) => r?,
        Err(_) => return Err(stalled("the slot and publication checks")),
    };
    ctx.health.loop_tick();
    let mut conn = ReplicationConn::connect(&cfg.postgres).await?;
    ctx.health.loop_tick();
    // Who our walsender is, to end it (and only it) should a dead link leave it holding the slot.
    state.own_walsender = match conn.backend_pid() {
        Some(pid) => tokio::time::timeout(admin::ADMIN_TIMEOUT, admin::walsender(&client, pid))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten(),
        None => None,
    };
    drop(client);
    let (history, wal_end) = match tokio::time::timeout(admin::ADMIN_TIMEOUT, conn.identify()).await {
        Ok(r) => r?,
        Err(_) => return Err(stalled("IDENTIFY_SYSTEM")),
    };
    // Exactly-once skips by a position stored in Kafka: only as much of it as holds on the
    // server's WAL history now (a restore or a failover reuses LSNs past the branch point).
    let lineage = if cfg.kafka.transactions.is_some() {
        match tokio::time::timeout(
            admin::ADMIN_TIMEOUT,
            crate::pg::replication::read_lineage(&mut conn, history.timeline, wal_end),
        )
        .await
        {
            Ok(r) => r?,
            Err(_) => return Err(stalled("TIMELINE_HISTORY")),
        }
    } else {
        // Only the exactly-once sink reads it; nothing to ask the server for.
        Lineage::unknown(history.timeline, wal_end)
    };
    if slot.enable_failover {
        match tokio::time::timeout(admin::ADMIN_TIMEOUT, conn.enable_failover(&cfg.slot)).await {
            Ok(r) => r?,
            Err(_) => return Err(stalled("ALTER_REPLICATION_SLOT")),
        }
        tracing::info!(slot = %cfg.slot, "turned FAILOVER on for the existing slot (--slot-failover)");
    }
    // pgoutput's `messages` option carries the --messages-prefix events; pgoutput before 14 rejects
    // it (prefixes are refused there). Our heartbeats need no decoding (see `monitor`).
    let messages = !cfg.messages_prefixes.is_empty();
    let from = resume_point(&slot, state.confirmed.as_ref(), &history, wal_end);
    // Exactly-once: the Kafka producer takes its transactional id (fencing any other holder) and
    // reads the position committed with the records; the session skips what it covers (the part
    // of it that holds on the server's WAL history now). While Kafka is unreachable this waits (up
    // to the timeout, then the supervisor retries): the process is live, only not ready.
    let prepare = ctx.health.ticking(sink.prepare(&lineage));
    let committed = match tokio::time::timeout(EXACTLY_ONCE_PREPARE_TIMEOUT, prepare).await {
        Ok(r) => r?,
        Err(_) => return Err(stalled("the Kafka transactional producer's start (init_transactions, position read)")),
    };
    let start = conn.start_replication(&cfg.slot, from, &cfg.publication, messages, cfg.wal_receiver_timeout);
    let stream = match tokio::time::timeout(admin::ADMIN_TIMEOUT, start).await {
        Ok(r) => r?,
        Err(_) => return Err(stalled("START_REPLICATION")),
    };
    state.streamed_once = true;
    ctx.health.set_standby(false);
    ctx.metrics.role(true, false);
    // Reaching the stream again resets the backoff: the next outage starts from a short delay.
    *reset_backoff = true;
    tracing::info!(slot = %cfg.slot, publication = %cfg.publication, start = %from, target = %cfg.postgres, "streaming");
    let mut reached = from;
    let result = Session::new(ctx, sink, stream, from).resume_from(committed).run(shutdown, &mut reached).await;
    state.confirmed = Some((reached, history));
    result
}

/// Where a session starts: the slot's position, or the later frontier this process reached if
/// the server has not persisted it yet. Ours counts only on the same WAL history (system
/// identifier and timeline) and for a slot that existed before: after a failover, a promoted
/// standby's slot or a recreated one, our LSN names another history's position, and skipping to
/// it could skip events. Nor when it lies past the server's WAL end (`wal_end`): no position of
/// this history can, so the server was put back to an earlier point of it (a disk snapshot, a
/// copied data directory) while this process ran, and the LSNs from the slot on are reused.
fn resume_point(slot: &admin::SlotState, ours: Option<&(Lsn, WalHistory)>, now: &WalHistory, wal_end: Lsn) -> Lsn {
    match ours {
        Some((lsn, seen)) if *lsn > slot.confirmed_flush && !slot.created && seen == now && *lsn <= wal_end => {
            tracing::info!(slot_lsn = %slot.confirmed_flush, ours = %lsn, "the slot is behind what this process confirmed (not yet persisted by the server); resuming from ours");
            *lsn
        }
        Some((lsn, seen)) if *lsn > slot.confirmed_flush => {
            tracing::warn!(slot_lsn = %slot.confirmed_flush, ours = %lsn, before = ?seen, now = ?now, created = slot.created, %wal_end, "the server's WAL history or the slot changed since this process confirmed (or the server's WAL ends before what it confirmed: restored to an earlier point); resuming from the slot (events after it are sent again)");
            slot.confirmed_flush
        }
        _ => slot.confirmed_flush,
    }
}

fn stalled(what: &str) -> Error {
    Transient::PgServer { code: "57014".into(), message: format!("{what} got no answer in time; retrying") }.into()
}

/// [`admin::ensure_slot`], except that a slot still held by our own previous walsender (a dead
/// link that PostgreSQL has not noticed yet, until its `wal_sender_timeout`) is taken back at once
/// by ending that walsender. A slot held by any other walsender (another PID, or our old PID with
/// another start time or application name) is left alone: a standby waits.
async fn take_slot(
    client: &Client,
    cfg: &Config,
    own: Option<&admin::Walsender>,
    missing: admin::MissingSlot,
) -> Result<admin::SlotState, Error> {
    let mut ended = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match admin::ensure_slot(client, cfg, missing).await {
            Err(Error::Transient(Transient::SlotBusy { pid, .. })) if own.is_some_and(|o| o.pid == pid) => {
                if let (false, Some(own)) = (ended, own) {
                    ended = admin::terminate_own_walsender(client, &cfg.slot, own).await?;
                    if ended {
                        tracing::warn!(pid, slot = %cfg.slot, "our previous walsender still held the slot (dead link); ended it");
                    }
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(Transient::SlotBusy { slot: cfg.slot.clone(), pid }.into());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// Set-up already succeeded once, so a failing reconnect is the server's hiccup, not bad config.
fn as_transient(e: Error) -> Error {
    match e {
        Error::Definite(d) => Transient::PgServer { code: "08001".into(), message: d.to_string() }.into(),
        t => t,
    }
}

/// Background duties over an ordinary connection: poll the slot's lag and safe WAL size, and emit
/// heartbeats (plus `--heartbeat-action-query`) while no event flows. Failures here are logged and
/// retried; they never stop the pipeline. Returns only on shutdown; a panic stops the process
/// ([`run`]).
async fn monitor(cfg: Config, handles: Handles) {
    let Handles { health, metrics, shutdown } = handles;
    let mut client: Option<Client> = None;
    // None: poll at once. (`now - interval` would panic on a monotonic clock younger than it.)
    let mut last_poll: Option<tokio::time::Instant> = None;
    let mut last_action = tokio::time::Instant::now();
    // Idle time, from changes of the activity counter (the hot path never reads a clock).
    let (mut seen, mut last_activity) = (health.activity_count(), tokio::time::Instant::now());
    if crate::task::fault("monitor") {
        panic!("fault injected by OUTBOXD_FAULT_END_TASK");
    }
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(MONITOR_TICK) => {}
        }
        if health.activity_count() != seen {
            seen = health.activity_count();
            last_activity = tokio::time::Instant::now();
        }
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            client = admin::connect(&cfg).await.ok();
        }
        let Some(c) = client.as_ref() else { continue };
        if last_poll.is_none_or(|t| t.elapsed() >= cfg.lag_poll_interval) {
            last_poll = Some(tokio::time::Instant::now());
            match tokio::time::timeout(admin::ADMIN_TIMEOUT, admin::slot_lag(c, &cfg.slot)).await {
                Ok(Ok(Some(lag))) => {
                    metrics.lag_bytes.set(lag.lag_bytes as f64);
                    metrics.safe_wal_size(lag.safe_wal_size);
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "lag poll failed"),
                // A frozen link: drop this connection and make a new one next tick.
                Err(_) => {
                    tracing::warn!("lag poll got no answer; reconnecting the monitor's connection");
                    client = None;
                    continue;
                }
            }
        }
        if cfg.heartbeat_interval.is_zero() || !health.streaming() {
            continue;
        }
        if last_activity.elapsed() >= cfg.heartbeat_interval {
            // Counted as activity now, so one heartbeat goes out per quiet interval.
            last_activity = tokio::time::Instant::now();
            if let Err(e) = admin::timed("heartbeat", c.batch_execute(HEARTBEAT_SQL)).await {
                tracing::warn!(error = %e, "heartbeat failed");
            }
        }
        if let Some(q) = &cfg.heartbeat_action_query {
            if last_action.elapsed() >= cfg.heartbeat_interval {
                last_action = tokio::time::Instant::now();
                if let Err(e) = admin::timed("--heartbeat-action-query", c.batch_execute(q)).await {
                    tracing::warn!(error = %e, "--heartbeat-action-query failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const END: Lsn = Lsn(10_000);

    fn history(system_id: &str, timeline: u32) -> WalHistory {
        WalHistory { system_id: system_id.into(), timeline }
    }

    #[test]
    fn our_frontier_counts_only_on_the_same_history_and_slot() {
        let slot = |lsn, created| admin::SlotState { confirmed_flush: Lsn(lsn), created, enable_failover: false };
        let ours = (Lsn(500), history("7300", 1));
        // Same server, slot behind (not persisted yet): ours.
        assert_eq!(resume_point(&slot(100, false), Some(&ours), &history("7300", 1), END), Lsn(500));
        // Slot ahead of ours: the slot.
        assert_eq!(resume_point(&slot(900, false), Some(&ours), &history("7300", 1), END), Lsn(900));
        // A promoted standby (new timeline), another cluster, a recreated slot: the slot.
        assert_eq!(resume_point(&slot(100, false), Some(&ours), &history("7300", 2), END), Lsn(100));
        assert_eq!(resume_point(&slot(100, false), Some(&ours), &history("9999", 1), END), Lsn(100));
        assert_eq!(resume_point(&slot(100, true), Some(&ours), &history("7300", 1), END), Lsn(100));
        // First session: the slot.
        assert_eq!(resume_point(&slot(100, false), None, &history("7300", 1), END), Lsn(100));
        // The server's WAL ends before ours (put back to an earlier point of the same history
        // while this process ran): the slot, or the reused LSNs below ours would be skipped.
        assert_eq!(resume_point(&slot(100, false), Some(&ours), &history("7300", 1), Lsn(499)), Lsn(100));
        assert_eq!(resume_point(&slot(100, false), Some(&ours), &history("7300", 1), Lsn(500)), Lsn(500));
    }
}
