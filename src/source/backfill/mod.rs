//! `outboxd backfill`: re-publish rows still in the outbox table(s), for a lost slot, a new
//! consumer, or a fixed dead-letter cause.
//!
//! ```text
//!  outbox table ──page (keyset, range.rs/pages.rs)──▶ Route + masking (as `run`) ──▶ Sink ──▶ acks
//! ```
//!
//! The rows go through the router and sink of `run`, built from the same flags, and through the
//! same [`Relay`] (size check, held records, acks), and every record carries the header
//! `outboxd.backfill=true`. Nothing is confirmed anywhere: a backfill has no
//! slot and changes no row. Its only duty is to report the truth: each record counts as delivered
//! only when its delivery handle is acked; a refused, failed or dropped handle counts as
//! undelivered, a row the router refuses counts as bad, and either makes the exit code 1. The
//! relay's ledger is the [`Summary`] (one ticket for every record): no refusal reaches the
//! bad-event policy, since a backfill dead-letters nothing.
//!
//! Memory is bounded by one page (`--batch-size` rows) plus the records awaiting acks: before each
//! record the relay waits for room in its budgets (`--max-in-flight`, `--max-in-flight-bytes`, as
//! for `run` and `poll`), and the next page is read only once the last one was handed over. A
//! progress line goes to stderr every second, and a summary at the end. A broker outage stalls
//! the run (the sink retries), it does not fail rows.

mod pages;
pub mod range;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::config::Config;
use crate::error::{Definite, Error};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::relay::dead_letter::DeadLetter;
use crate::relay::route_masked;
use crate::relay::{Ack, Ledger, Position, Refused, RefusedBy, Relay, RelayConfig, Source, Ticket};
use crate::router::{OutboxRow, Route};
use crate::sink::{AnySink, Sink};
pub use range::Range;

/// The header every re-published record carries.
pub const HEADER: &str = "outboxd.backfill";

/// Counts for the progress line and the summary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub read: u64,
    pub delivered: u64,
    /// Rows the router refused (they would be bad events in `run`).
    pub bad: u64,
    /// Records the sink refused or could not deliver.
    pub undelivered: u64,
}

impl Summary {
    /// 0 when every row read was delivered.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.bad > 0 || self.undelivered > 0)
    }
}

/// Build the sink `cfg` names and run the backfill; the exit code.
pub async fn run(cfg: Config, range: Range) -> Result<u8, Error> {
    let health = Health::new(Duration::ZERO);
    let mut sink = AnySink::build(&cfg, health).await?;
    let summary = backfill(&cfg, &range, &mut sink).await?;
    Ok(summary.exit_code())
}

/// Re-publish every row of every `--table` in `range` through `sink`.
pub async fn backfill<S: Sink>(cfg: &Config, range: &Range, sink: &mut S) -> Result<Summary, Error> {
    if cfg.tables.is_empty() {
        return Err(Definite::Config(
            "backfill reads outbox tables, and --table names none (logical messages leave nothing to re-publish)"
                .into(),
        )
        .into());
    }
    let client = crate::pg::admin::connect(cfg).await?;
    pages::prepare_session(&client).await?;
    let mut run = Backfill::new(cfg, sink);
    for table in &cfg.tables {
        let mut pages = pages::Pages::describe(&client, cfg, table, range).await?;
        let route = Route::compile(&cfg.route, &pages.relation)?;
        let source = Source { position: Position::Unknown, table: Arc::from(route.table()) };
        loop {
            let page = pages.next(&client).await?;
            if page.is_empty() {
                break;
            }
            for tuple in &page {
                run.summary.read += 1;
                let row = OutboxRow { tuple, commit_time_us: crate::pg::replication::pg_now_us() };
                match route_masked(cfg, &route, row) {
                    Ok(mut record) => {
                        record.headers.push((HEADER.into(), Bytes::from_static(b"true")));
                        run.send(record, source.clone()).await?;
                    }
                    Err(bad) => {
                        tracing::error!(table = %route.table(), event_id = bad.event_id.as_deref(), reason = bad.code, message = %bad.message, "row not re-published: the router refuses it");
                        run.summary.bad += 1;
                    }
                }
                run.progress(false);
            }
        }
    }
    run.wait_until_at_most(0).await?;
    run.progress(true);
    let s = run.summary.clone();
    eprintln!(
        "outboxd backfill: done in {:.1}s: {} rows read, {} delivered, {} bad (refused by the router), {} undelivered",
        run.progress.started.elapsed().as_secs_f64(),
        s.read,
        s.delivered,
        s.bad,
        s.undelivered
    );
    Ok(s)
}

/// The backfill's ledger: every record is counted under one ticket, and its fate in the summary.
impl Ledger for Summary {
    fn add(&mut self, _t: Ticket, _n: usize) -> Result<(), Error> {
        Ok(())
    }

    fn done(&mut self, _t: Ticket) -> Result<(), Error> {
        self.delivered += 1;
        Ok(())
    }

    fn refused(&mut self, _t: Ticket, dl: &DeadLetter, _by: RefusedBy) -> Refused {
        undelivered(
            self,
            dl.event_id.as_deref().unwrap_or_default(),
            dl.original_topic.as_deref().unwrap_or_default(),
            dl.code,
            &dl.message,
        );
        Refused::Kept
    }

    fn failed(&mut self, ack: Ack, reason: String) -> Result<(), Error> {
        undelivered(self, ack.event_id(), &ack.topic, "delivery", &reason);
        Ok(())
    }
}

fn undelivered(summary: &mut Summary, event_id: &str, topic: &str, code: &str, reason: &str) {
    tracing::error!(event_id, topic, reason = code, message = reason, "record not delivered");
    summary.undelivered += 1;
}

/// The relay and the summary it reports into.
struct Backfill<'a, S: Sink> {
    relay: Relay<'a, S>,
    summary: Summary,
    progress: Progress,
}

impl<'a, S: Sink> Backfill<'a, S> {
    fn new(cfg: &Config, sink: &'a mut S) -> Self {
        // No refusal reaches the policy (the ledger keeps them all), so it is never consulted.
        let now = Instant::now();
        Backfill {
            relay: Relay::new(sink, RelayConfig::of(cfg), Metrics::new()),
            summary: Summary::default(),
            progress: Progress { started: now, last: now },
        }
    }

    /// Hand one record over once the relay has room for it, printing progress while it waits.
    async fn send(&mut self, record: crate::router::Record, source: Source) -> Result<(), Error> {
        let Backfill { relay, summary, progress } = self;
        relay.wait_for_room(summary, |s, in_flight| progress.line(s, in_flight, false)).await?;
        relay.send(summary, Ticket(0), record, source).await
    }

    /// Wait for acks until at most `limit` records are in flight, printing progress meanwhile.
    async fn wait_until_at_most(&mut self, limit: usize) -> Result<(), Error> {
        let Backfill { relay, summary, progress } = self;
        relay.wait_until_at_most(summary, limit, |s, in_flight| progress.line(s, in_flight, false)).await
    }

    fn progress(&mut self, force: bool) {
        self.progress.line(&self.summary, self.relay.in_flight(), force);
    }
}

/// The progress line's clock.
struct Progress {
    started: Instant,
    last: Instant,
}

impl Progress {
    /// One line on stderr at most every second (and always when `force`).
    fn line(&mut self, s: &Summary, in_flight: usize, force: bool) {
        if !force && self.last.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.last = Instant::now();
        eprintln!(
            "outboxd backfill: {} read, {} delivered, {} in flight, {} bad, {} undelivered ({:.0}s)",
            s.read,
            s.delivered,
            in_flight,
            s.bad,
            s.undelivered,
            self.started.elapsed().as_secs_f64()
        );
    }
}
