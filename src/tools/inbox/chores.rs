//! The inbox's periodic chores: the backlog gauges (every 5 s) and `--retain`'s pruning (every
//! minute), in a task of their own on a PostgreSQL connection of their own.
//!
//! Why not on the writer's connection, between batches: a connection runs one statement at a
//! time, and the backlog's `count(*)` over the unprocessed rows (tens of milliseconds with a few
//! tens of thousands of them, more on a busy box) or a pruning round held every batch behind it:
//! at 5,000 records/s that was the p99 of Kafka append → inbox commit (bench/RESULTS.md). Here they
//! run beside the writes (neither locks what the other touches: the backlog reads, pruning deletes
//! processed rows only) and the writer never waits for them.
//!
//! Invariant: the task ends only with the writer (its token is the writer's child, cancelled when
//! the writer goes); a failure (PostgreSQL away, no connection slot left) is logged and the
//! connection made again at the next chore, never an end. The writer checks the task each second,
//! so a panic would not go unseen. When they are due is decided by the clock, not by counted turns
//! ([`Chores`]). The writer comes first for a connection: while it is not connected (`/readyz`
//! 503) the chores hold none, and after a refusal for resources (SQLSTATE class 53, e.g. 53300 too
//! many connections for the role) they close theirs and wait [`Outage::HOLD`]; so after a
//! PostgreSQL restart they never keep the last slot the writer needs. Chores failing for longer
//! than [`Outage::WARN_AFTER`] are a warning (at most one a minute), not a silent debug line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use super::store::{self, Names};
use crate::config::inbox::InboxConfig;
use crate::error::{Error, Transient};
use crate::health::Health;
use crate::metrics::InboxMetrics;
use crate::pg::admin::{connect_primary, timed, ADMIN_TIMEOUT};

/// When the chores are next due: the backlog gauges every [`Chores::BACKLOG`], pruning every
/// [`Chores::PRUNE`] (the first 30 s after the start).
pub(super) struct Chores {
    backlog: Instant,
    prune: Instant,
}

impl Chores {
    const BACKLOG: Duration = Duration::from_secs(5);
    const PRUNE: Duration = Duration::from_secs(60);

    pub fn new(now: Instant) -> Chores {
        Chores { backlog: now, prune: now + Duration::from_secs(30) }
    }

    /// Whether the backlog and the pruning are due at `now`; a due one is set to its next time.
    pub fn due(&mut self, now: Instant) -> (bool, bool) {
        let next = |at: &mut Instant, every: Duration| {
            let due = now >= *at;
            if due {
                *at = now + every;
            }
            due
        };
        (next(&mut self.backlog, Self::BACKLOG), next(&mut self.prune, Self::PRUNE))
    }
}

/// The chores' failures in a row: when they began, when the last warning went, and how long the
/// chores keep off PostgreSQL after a refusal for resources.
#[derive(Default)]
struct Outage {
    since: Option<Instant>,
    warned: Option<Instant>,
    hold_until: Option<Instant>,
}

impl Outage {
    /// Failing this long is a warning; also the shortest time between two.
    const WARN_AFTER: Duration = Duration::from_secs(60);
    /// The wait after a refusal for resources (class 53) before the chores connect again.
    const HOLD: Duration = Duration::from_secs(30);

    /// Whether the chores keep off PostgreSQL at `now`.
    fn held(&self, now: Instant) -> bool {
        self.hold_until.is_some_and(|t| now < t)
    }

    /// A chore failed at `now` (`resources`: SQLSTATE class 53); how long they have failed when a
    /// warning is due.
    fn failed(&mut self, now: Instant, resources: bool) -> Option<Duration> {
        if resources {
            self.hold_until = Some(now + Self::HOLD);
        }
        let since = *self.since.get_or_insert(now);
        let failing = now.duration_since(since);
        let due = failing >= Self::WARN_AFTER && self.warned.is_none_or(|t| now.duration_since(t) >= Self::WARN_AFTER);
        if due {
            self.warned = Some(now);
        }
        due.then_some(failing)
    }

    /// A chore succeeded: whether an outage that was warned about ended.
    fn ok(&mut self) -> bool {
        let warned = self.warned.is_some();
        *self = Outage::default();
        warned
    }
}

/// A refusal for insufficient resources (SQLSTATE class 53: too many connections, out of memory,
/// disk full): the one slot left may be the writer's.
fn for_resources(e: &Error) -> bool {
    matches!(e, Error::Transient(Transient::PgServer { code, .. }) if code.starts_with("53"))
}

/// Start the chores task; it stops when `stop` is cancelled. With neither `--retain` nor
/// `--metrics-addr` it has nothing to do and makes no connection.
pub(super) fn spawn(
    cfg: &InboxConfig,
    names: Names,
    health: Arc<Health>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (target, retain, window) = (cfg.postgres.clone(), cfg.retain, cfg.dedupe_window);
    // The backlog feeds the gauges, which only /metrics and the status page show.
    let gauges = cfg.metrics_addr.is_some();
    if !gauges && retain.is_none() {
        return tokio::spawn(async move { stop.cancelled().await });
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut chores = Chores::new(Instant::now());
        let mut client: Option<Client> = None;
        let mut outage = Outage::default();
        let metrics = InboxMetrics::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            // The writer is reconnecting (or has not connected yet): the slot is its.
            if !health.streaming() {
                client = None;
                continue;
            }
            let now = Instant::now();
            let (backlog_due, prune_due) = chores.due(now);
            let (backlog_due, prune_due) = (backlog_due && gauges, prune_due && retain.is_some());
            if (!backlog_due && !prune_due) || outage.held(now) {
                continue;
            }
            let done =
                run_due(&mut client, &target, &names, &metrics, backlog_due, retain.filter(|_| prune_due), window)
                    .await;
            match done {
                Ok(()) => {
                    if outage.ok() {
                        tracing::info!("the inbox chores (backlog gauges, --retain) reach PostgreSQL again");
                    }
                }
                Err(e) => {
                    let resources = for_resources(&e);
                    if e.is_transient() {
                        // Closed, timed out, or refused for resources: a new connection next time.
                        client = None;
                    }
                    match outage.failed(Instant::now(), resources) {
                        Some(failing) => tracing::warn!(
                            "the inbox chores have failed for {}s: {e}; meanwhile --retain prunes nothing and the backlog \
                             gauges (outboxd_inbox_unprocessed_rows, outboxd_inbox_oldest_unprocessed_seconds) are not \
                             updated. Each inbox process needs two connections (the role's CONNECTION LIMIT at least 2)",
                            failing.as_secs()
                        ),
                        None => tracing::debug!("the inbox chores failed: {e}; trying again at the next one"),
                    }
                }
            }
        }
    })
}

/// The chores due now, connecting first if needed; the first failure ends the round.
async fn run_due(
    client: &mut Option<Client>,
    target: &crate::config::PgTarget,
    names: &Names,
    metrics: &InboxMetrics,
    backlog_due: bool,
    prune: Option<Duration>,
    window: Duration,
) -> Result<(), Error> {
    if client.as_ref().is_none_or(Client::is_closed) {
        *client = Some(connect_primary(target).await?);
    }
    let Some(c) = client.as_ref() else { return Ok(()) };
    if backlog_due {
        backlog(c, names, metrics).await?;
    }
    if let Some(retain) = prune {
        self::prune(c, names, retain, window).await?;
    }
    Ok(())
}

/// The backlog gauges, from the table; a failure leaves them as they were. Bounded by
/// [`ADMIN_TIMEOUT`] here too: a server that stops answering must not hold the chores for good.
async fn backlog(client: &Client, names: &Names, metrics: &InboxMetrics) -> Result<(), Error> {
    let sql = format!(
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(received_at)), 0)::float8 \
           FROM {} WHERE processed_at IS NULL",
        names.inbox()
    );
    let t0 = Instant::now();
    let r = timed("reading the inbox backlog", client.query_one(&sql, &[])).await?;
    tracing::debug!(ms = format_args!("{:.2}", t0.elapsed().as_secs_f64() * 1000.0), "backlog read");
    metrics.backlog(r.get(0), r.get(1));
    Ok(())
}

/// `--retain`: rounds of `inbox_prune` until a round deletes less than a full one (at most ten a
/// minute), each bounded by [`ADMIN_TIMEOUT`]. A failure waits for the next minute.
async fn prune(client: &Client, names: &Names, retain: Duration, window: Duration) -> Result<(), Error> {
    for _ in 0..10 {
        let round = tokio::time::timeout(ADMIN_TIMEOUT, store::prune(client, names, retain, window)).await;
        let n = round.unwrap_or_else(|_| {
            Err(Transient::PgServer {
                code: "57014".into(),
                message: format!("pruning the inbox (--retain): no answer in {}s", ADMIN_TIMEOUT.as_secs()),
            }
            .into())
        })?;
        if n > 0 {
            tracing::info!(rows = n, "pruned processed inbox rows (--retain)");
        }
        if n < store::PRUNE_ROUND {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chores_come_by_the_clock_however_late_the_turns() {
        let t0 = Instant::now();
        let mut c = Chores::new(t0);
        assert_eq!(c.due(t0), (true, false), "the backlog at once, pruning after 30 s");
        assert_eq!(c.due(t0 + Duration::from_secs(4)), (false, false));
        // One turn 40 s late (a long write): both are due once, not once per missed turn.
        assert_eq!(c.due(t0 + Duration::from_secs(40)), (true, true));
        assert_eq!(c.due(t0 + Duration::from_secs(41)), (false, false));
        assert_eq!(c.due(t0 + Duration::from_secs(45)), (true, false));
        assert_eq!(c.due(t0 + Duration::from_secs(100)), (true, true));
    }

    #[test]
    fn failing_chores_warn_after_a_minute_at_most_once_a_minute_and_give_way_after_class_53() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut o = Outage::default();
        assert_eq!(o.failed(t0, false), None, "a first failure is no warning");
        assert!(!o.held(t0), "only a refusal for resources holds the chores off");
        assert_eq!(o.failed(t0 + s(30), false), None);
        assert_eq!(o.failed(t0 + s(61), false), Some(s(61)), "failing for over a minute");
        assert_eq!(o.failed(t0 + s(90), false), None, "not again within the minute");
        assert_eq!(o.failed(t0 + s(125), true), Some(s(125)));
        assert!(o.held(t0 + s(150)) && !o.held(t0 + s(155)), "30 s off PostgreSQL after class 53");
        assert!(o.ok(), "the end of a warned outage is said");
        assert!(!o.ok());
        assert_eq!(o.failed(t0 + s(200), false), None, "a new outage counts from its start");
        let e = |code: &str| Error::from(Transient::PgServer { code: code.into(), message: String::new() });
        assert!(for_resources(&e("53300")) && for_resources(&e("53200")));
        assert!(!for_resources(&e("08006")) && !for_resources(&e("57014")));
    }
}
