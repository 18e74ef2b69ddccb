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
//! the writer goes); a failure (PostgreSQL away) is logged and the connection made again at the next
//! chore, never an end. The writer checks the task each second, so a panic would not go unseen.
//! When they are due is decided by the clock, not by counted turns ([`Chores`]).

use std::time::{Duration, Instant};

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use super::store::{self, Names};
use crate::config::inbox::InboxConfig;
use crate::metrics::InboxMetrics;
use crate::pg::admin::connect_primary;

/// When the writer's periodic chores are next due: the backlog gauges every [`Chores::BACKLOG`],
/// pruning every [`Chores::PRUNE`] (the first 30 s after the start).
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

/// Start the chores task; it stops when `stop` is cancelled.
pub(super) fn spawn(cfg: &InboxConfig, names: Names, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    let (target, retain, window) = (cfg.postgres.clone(), cfg.retain, cfg.dedupe_window);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut chores = Chores::new(Instant::now());
        let mut client: Option<Client> = None;
        let metrics = InboxMetrics::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (backlog_due, prune_due) = chores.due(Instant::now());
            let prune_due = prune_due && retain.is_some();
            if !backlog_due && !prune_due {
                continue;
            }
            if client.as_ref().is_none_or(Client::is_closed) {
                // The writer reports PostgreSQL being away; here it only means no gauges for now.
                match connect_primary(&target).await {
                    Ok(c) => client = Some(c),
                    Err(e) => {
                        tracing::debug!("the inbox chores cannot connect: {e}; trying again at the next one");
                        continue;
                    }
                }
            }
            let Some(c) = client.as_ref() else { continue };
            if backlog_due {
                backlog(c, &names, &metrics).await;
            }
            if let (true, Some(retain)) = (prune_due, retain) {
                prune(c, &names, retain, window).await;
            }
        }
    })
}

/// The backlog gauges, from the table; a failure only leaves them as they were.
async fn backlog(client: &Client, names: &Names, metrics: &InboxMetrics) {
    let sql = format!(
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(received_at)), 0)::float8 \
           FROM {} WHERE processed_at IS NULL",
        names.inbox()
    );
    let t0 = Instant::now();
    match client.query_one(&sql, &[]).await {
        Ok(r) => {
            tracing::debug!(ms = format_args!("{:.2}", t0.elapsed().as_secs_f64() * 1000.0), "backlog read");
            metrics.backlog(r.get(0), r.get(1))
        }
        Err(e) => tracing::debug!("reading the inbox backlog: {e}"),
    }
}

/// `--retain`: rounds of `inbox_prune` until a round deletes less than a full one (at most ten a
/// minute). A failure waits for the next minute.
async fn prune(client: &Client, names: &Names, retain: Duration, window: Duration) {
    for _ in 0..10 {
        match store::prune(client, names, retain, window).await {
            Ok(n) if n > 0 => {
                tracing::info!(rows = n, "pruned processed inbox rows (--retain)");
                if n < store::PRUNE_ROUND {
                    return;
                }
            }
            Ok(_) => return,
            Err(e) => return tracing::warn!("{e}; trying again in a minute"),
        }
    }
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
}
