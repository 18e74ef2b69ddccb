//! `outboxd poll`: relay the outbox table with ordinary queries, for databases where a
//! replication slot is not an option (no REPLICATION role, a fixed `wal_level`, a DBA who will
//! not have a slot pin WAL). The role needs SELECT and UPDATE on the table (DELETE too for
//! `--poll-delete` and `--retention`); the table needs `sql/05_poll.sql` (a `seq` column for
//! insertion order, `next_attempt_at`, indexes and the NOTIFY trigger).
//!
//! * `sql.rs`: every statement, from the configured names; the table check;
//! * `batch.rs`: one batch's records, acks and outcomes;
//! * this file: the loop, its wake-ups, the backlog metrics, retention, and reconnects.
//!
//! # The loop
//! Per batch, on one connection of its own: take aggregates (the *lock* statement), claim up to
//! `--poll-batch` of their rows in one SELECT, hand every record to the sink without waiting, wait
//! for all acks, then write the outcome in one statement per kind (acked rows: one UPDATE setting
//! the published-at column, or one DELETE with `--poll-delete`; failed tries; dead-lettered or
//! skipped rows), and only then release the aggregates. A row is marked only after its ack, so a
//! crash (kill -9) anywhere loses nothing: the rows of the batch in flight are claimed again, and
//! those are the only duplicates. An empty claim waits for a NOTIFY on `--poll-channel` (the
//! trigger sends one per INSERT statement, at commit) or `--poll-interval`, whichever comes first.
//!
//! # Per-aggregate order with any number of pollers
//! The guarantee: an event is never handed to the sink while an older unpublished event of its
//! aggregate (`--table-field-event-key`) exists, or is in flight in another poller. Older means a
//! smaller `seq` (the insertion order; `created_at` cannot order the rows of one transaction).
//!
//! *Why not `FOR UPDATE SKIP LOCKED` (the seed's loop).* SKIP LOCKED skips the locked row and takes
//! the next: while poller A holds event 1 of aggregate X, poller B takes event 2 of X and may
//! publish it first. Row locks protect rows; the order is a property of the aggregate.
//!
//! *The design: aggregates are locked, not rows.* A poller owns an aggregate while it holds the
//! session advisory lock `(table oid, hashtext(key))`, taken with `pg_try_advisory_lock` (never
//! waits) while scanning the unpublished rows oldest first, so a busy aggregate is skipped and the
//! scan goes on to free ones (that is how N pollers share a backlog). A second statement then
//! claims the unpublished rows of exactly the aggregates it owns, in `seq` order. Hash collisions
//! only make two aggregates share a lock. Session locks, not transaction locks: nothing stays open
//! while records are in flight, so a slow broker holds no snapshot back and bloats nothing. The
//! locks go at the end of the batch (`pg_advisory_unlock_all`, which also drops any lock the
//! scan took beyond the rows it returned) or with the session, when the process dies.
//!
//! Proof sketch. (1) While poller P owns X, no other poller sends X's events: sending needs the
//! claim, the claim needs the lock. (2) What P claims of X is a prefix of X's unpublished rows in
//! seq order: the claim reads all of X's unpublished rows, sorted, and the LIMIT cuts the sorted
//! list, so each aggregate keeps a prefix; the claim runs in a statement after the lock was taken,
//! so its snapshot sees everything the previous owner committed (it committed its marks before
//! releasing the lock). (3) Records of one aggregate go to one sink in claim order, and sinks keep
//! send order per key. (4) When P dies, its session ends and the lock goes; the next owner starts
//! again from X's oldest unpublished row, so a duplicate run starts at or before anything P may
//! still have had on the wire: the order of first occurrences holds.
//!
//! *One server session.* All of this needs the connection to stay one server session. A
//! transaction-mode pooler (PgBouncer `pool_mode=transaction`) breaks that silently, so it is
//! refused ([`own_session`] at start: the backend pid is stable and not shared with a second
//! connection; every batch's release checks the pid again; a vanished prepared statement,
//! SQLSTATE 26000, says the same).
//!
//! Assumption: events of one aggregate come from transactions that serialize on the aggregate
//! (the usual row lock or version check), so a smaller seq never commits after a larger one is
//! visible. `outboxd run` does not need this: it follows commit order.
//!
//! # Failures
//! A record the sink refuses for good (too large, an invalid topic or policy) is a failed try:
//! `attempts` + 1 (it counts failed tries only; a row published first time keeps 0), the error
//! text, and `next_attempt_at = now() + --poll-retry-backoff * 2^(tries-1)` (at most 10 minutes).
//! While an aggregate's head waits out its backoff, the aggregate is skipped: its later events
//! wait behind it (order). After `--poll-max-attempts` failed tries the row follows
//! `--on-bad-event`: `dlq` sends the copy to `--dlq-topic` and marks the row (published-at set,
//! error saying where it went) once the copy is acked; `skip` marks it with the error; `fail`
//! stops. A row the router cannot turn into a record takes the policy at once (routing it again
//! cannot change the result). Either way the aggregate's later rows in the same batch are not
//! sent. The one gap: a refusal that arrives in a delivery report (the broker refused after
//! taking the send) cannot recall the aggregate's later records already in flight in that batch,
//! so those may reach the topic while the refused one waits; from the next batch on they wait.
//! A broker outage is not a refusal: the sink retries, the batch waits, and no try is counted.

mod batch;
pub mod sql;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::time::Instant;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::{Definite, Error};
use crate::health::Handles;
use crate::pg::admin::{self, timed};
use crate::retry::backoff;
use crate::sink::Sink;
use batch::{Batch, BatchCtx, Fate};
use sql::{execute, quote_ident, Claimed, Queries, RETENTION_CHUNK};

/// How often `--retention` runs (and the backlog metrics at the latest, besides --lag-poll-interval).
const RETENTION_EVERY: Duration = Duration::from_secs(60);
/// Statements of [`RETENTION_CHUNK`] rows per retention round.
const RETENTION_CHUNKS: usize = 50;

/// Poll until shutdown. Transient trouble (a dropped connection, a restarting server) reconnects
/// after an exponential backoff; definite trouble ends the process.
pub async fn run<S: Sink>(cfg: &Config, sink: &mut S, handles: Handles) -> Result<(), Error> {
    let [table] = cfg.tables.as_slice() else {
        return Err(Definite::Config(format!(
            "outboxd poll relays one table, got {} --table flags; run one poller per table",
            cfg.tables.len()
        ))
        .into());
    };
    let mut attempt = 0u32;
    loop {
        handles.health.loop_tick();
        if handles.shutdown.is_cancelled() {
            return Ok(());
        }
        let mut reached = false;
        match session(cfg, table, sink, &handles, &mut reached).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() => {
                if reached {
                    attempt = 0;
                }
                let delay = backoff(attempt, cfg.reconnect_max_backoff);
                attempt = attempt.saturating_add(1);
                handles.metrics.pg_reconnects.increment(1);
                tracing::warn!(error = %e, ?delay, "poll session ended; reconnecting");
                tokio::select! {
                    _ = handles.shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// One connection's life: prepare, LISTEN, then batches until shutdown.
async fn session<S: Sink>(
    cfg: &Config,
    table: &crate::config::TableName,
    sink: &mut S,
    h: &Handles,
    reached: &mut bool,
) -> Result<(), Error> {
    let (tx, mut notes) = unbounded_channel();
    let client = admin::connect_listening(&cfg.postgres, tx).await?;
    let pid = own_session(&client, cfg).await?;
    let q = Queries::prepare(&client, cfg, table).await?;
    if !cfg.poll.channel.is_empty() {
        let listen = format!("LISTEN {}", quote_ident(&cfg.poll.channel));
        timed("LISTEN on --poll-channel", client.batch_execute(&listen)).await?;
    }
    *reached = true;
    h.health.set_streaming(true);
    h.metrics.pg_connected.set(1.0);
    tracing::info!(%table, target = %cfg.postgres, batch = cfg.poll.batch, channel = %cfg.poll.channel, "polling");
    let result = poll_loop(cfg, table, &client, (&q, pid), sink, h, &mut notes).await;
    h.health.set_streaming(false);
    h.metrics.pg_connected.set(0.0);
    result
}

async fn poll_loop<S: Sink>(
    cfg: &Config,
    table: &crate::config::TableName,
    client: &Client,
    (q, pid): (&Queries, i32),
    sink: &mut S,
    h: &Handles,
    notes: &mut UnboundedReceiver<tokio_postgres::Notification>,
) -> Result<(), Error> {
    let table_name: Arc<str> = Arc::from(table.to_string());
    let stats_every = cfg.lag_poll_interval.min(RETENTION_EVERY);
    let mut next_stats = Instant::now();
    let mut next_retention = Instant::now();
    loop {
        h.health.loop_tick();
        if h.shutdown.is_cancelled() {
            return Ok(());
        }
        if Instant::now() >= next_stats {
            backlog(client, q, h).await?;
            next_stats = Instant::now() + stats_every;
        }
        if let Some(keep) = cfg.poll.retention {
            if Instant::now() >= next_retention {
                retention(client, q, keep, &h.shutdown).await?;
                next_retention = Instant::now() + RETENTION_EVERY;
            }
        }
        // Wake-ups that arrived before this claim are covered by it.
        while notes.try_recv().is_ok() {}
        let ctx = BatchCtx {
            cfg,
            route: &q.route,
            table: table_name.clone(),
            metrics: &h.metrics,
            health: &h.health,
            shutdown: &h.shutdown,
        };
        let claimed = one_batch(client, (q, pid), cfg, ctx, sink).await?;
        if claimed > 0 {
            continue;
        }
        tokio::select! {
            _ = h.shutdown.cancelled() => return Ok(()),
            n = notes.recv() => if n.is_none() {
                return Err(crate::error::Transient::PgClosed { target: cfg.postgres.to_string() }.into());
            },
            _ = tokio::time::sleep(cfg.poll.interval) => {}
        }
    }
}

/// Lock, claim, send, wait, write, unlock. Returns the rows claimed.
async fn one_batch<S: Sink>(
    client: &Client,
    (q, pid): (&Queries, i32),
    cfg: &Config,
    ctx: BatchCtx<'_>,
    sink: &mut S,
) -> Result<usize, Error> {
    let limit = cfg.poll.batch as i64;
    let keys = timed("taking aggregates (advisory locks)", client.query(&q.lock, &[&limit])).await?;
    if keys.is_empty() {
        release(client, q, pid).await?;
        return Ok(0);
    }
    let mut named: Vec<String> = Vec::with_capacity(keys.len());
    let mut null_key = false;
    for r in &keys {
        match r.try_get::<_, Option<String>>(0) {
            Ok(Some(k)) => named.push(k),
            Ok(None) => null_key = true,
            Err(e) => return Err(Definite::Setup(format!("reading an aggregate key: {e}")).into()),
        }
    }
    let rows = timed("claiming rows", client.query(&q.claim, &[&named, &null_key, &limit])).await?;
    let claimed = rows.iter().map(Claimed::from_row).collect::<Result<Vec<_>, _>>()?;
    let n = claimed.len();
    let mut batch = Batch::new(ctx, sink);
    let sent = batch.run(claimed).await;
    // Write what resolved, even when the batch ended in an error: acked rows must not be sent again.
    let written = write_outcomes(client, q, cfg, &batch.rows.slots).await;
    drop(batch);
    release(client, q, pid).await?;
    sent?;
    written?;
    Ok(n)
}

/// Release every aggregate lock of this session, and check it is still the session that took
/// them (`pid`): a pooler that moved the connection is refused before it can hand the locks to
/// another poller again.
async fn release(client: &Client, q: &Queries, pid: i32) -> Result<(), Error> {
    let row = timed("releasing aggregates", client.query_one(&q.unlock, &[])).await?;
    let now: i32 = row.try_get(1).map_err(|e| Definite::Setup(format!("reading pg_backend_pid(): {e}")))?;
    if now != pid {
        return Err(moved(pid, now));
    }
    Ok(())
}

/// The backend pid changed between statements of one connection.
fn moved(before: i32, after: i32) -> Error {
    pooled(format!("the backend pid changed between statements of one connection ({before}, then {after})"))
}

fn pooled(what: String) -> Error {
    Definite::Setup(format!(
        "outboxd poll: {what}, so its session locks would not keep aggregates to one poller: {}",
        crate::pg::sqlstate::POOLER_HINT
    ))
    .into()
}

/// The poller's locks are session locks taken, used and released in separate statements, so its
/// connection must stay one server session. A transaction-mode pooler breaks that: it may hand
/// each statement to another server session, or two clients' statements to the same one. Seen
/// by backend pid: three probes on this connection agree, and a second connection, opened
/// meanwhile, has another session. Returns the session's pid.
async fn own_session(client: &Client, cfg: &Config) -> Result<i32, Error> {
    async fn backend_pid(c: &Client) -> Result<i32, Error> {
        // One simple-protocol message: a pooler cannot split it across sessions.
        let msgs = timed("asking pg_backend_pid()", c.simple_query("SELECT pg_backend_pid()")).await?;
        msgs.iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse::<i32>().ok()),
                _ => None,
            })
            .ok_or_else(|| Definite::Setup("pg_backend_pid() returned no row".into()).into())
    }
    let first = backend_pid(client).await?;
    let other = admin::connect_target(&cfg.postgres).await?;
    let theirs = backend_pid(&other).await?;
    for _ in 0..2 {
        let again = backend_pid(client).await?;
        if again != first {
            return Err(moved(first, again));
        }
    }
    drop(other);
    if theirs == first {
        return Err(pooled(format!("backend pid {first} answered on this connection and on a second one")));
    }
    Ok(first)
}

async fn write_outcomes(client: &Client, q: &Queries, cfg: &Config, slots: &[batch::Slot]) -> Result<(), Error> {
    let mut acked = Vec::new();
    let (mut f_seq, mut f_err, mut f_ms) = (Vec::new(), Vec::new(), Vec::new());
    let (mut d_seq, mut d_err, mut d_tries) = (Vec::new(), Vec::new(), Vec::new());
    for s in slots {
        match &s.fate {
            Fate::Acked => acked.push(s.seq),
            Fate::Retry { error } => {
                f_seq.push(s.seq);
                f_err.push(error.clone());
                let tries = (s.attempts.max(0) as u32).saturating_add(1);
                f_ms.push(cfg.poll.backoff_after(tries).as_millis() as i64);
            }
            Fate::Finished { error, tries } => {
                d_seq.push(s.seq);
                d_err.push(error.clone());
                d_tries.push(*tries);
            }
            Fate::Open { .. } | Fate::Held => {}
        }
    }
    if !acked.is_empty() {
        execute(client, "marking acked rows published", &q.published, &[&acked]).await?;
    }
    if !f_seq.is_empty() {
        execute(client, "recording failed tries", &q.failed, &[&f_seq, &f_err, &f_ms]).await?;
    }
    if !d_seq.is_empty() {
        execute(client, "marking dead-lettered or skipped rows", &q.finished, &[&d_seq, &d_err, &d_tries]).await?;
    }
    Ok(())
}

/// The seed's two backlog signals: unpublished rows and the age of the oldest.
async fn backlog(client: &Client, q: &Queries, h: &Handles) -> Result<(), Error> {
    let row = timed("measuring the backlog", client.query_one(&q.stats, &[])).await?;
    let count: i64 = row.try_get(0).unwrap_or(0);
    let age: Option<f64> = row.try_get(1).unwrap_or(None);
    h.metrics.poll_unpublished.set(count as f64);
    h.metrics.poll_oldest_age.set(age.unwrap_or(0.0).max(0.0));
    Ok(())
}

/// `--retention`: delete published rows older than `keep`, [`RETENTION_CHUNK`] per statement
/// and at most [`RETENTION_CHUNKS`] statements per round, so a large first clean-up never keeps
/// the poller from publishing for long (the rest goes in the next rounds).
async fn retention(client: &Client, q: &Queries, keep: Duration, shutdown: &CancellationToken) -> Result<(), Error> {
    let ms = keep.as_millis() as i64;
    let mut total = 0u64;
    for _ in 0..RETENTION_CHUNKS {
        let n = execute(client, "deleting published rows past --retention", &q.retention, &[&ms]).await?;
        total += n;
        if (n as i64) < RETENTION_CHUNK || shutdown.is_cancelled() {
            break;
        }
        tokio::task::yield_now().await;
    }
    if total > 0 {
        tracing::info!(rows = total, "--retention deleted published rows");
    }
    Ok(())
}
