//! Which flag groups ([`super::groups`], the sinks' folders, [`super::poll`]) each relaying command
//! takes, and [`Flags`]: all of them at once, the one shape [`super::Config`] is validated from.
//!
//! | command    | relay: source, route, sinks, budget | wal | delivery | process | poll |
//! |------------|-------------------------------------|-----|----------|---------|------|
//! | `run`      | yes                                 | yes | yes      | yes     |      |
//! | `check`    | yes                                 | yes | yes      | yes     |      |
//! | `config`   | yes                                 | yes | yes      | yes     | yes  |
//! | `poll`     | yes                                 |     |          | yes     | yes  |
//! | `backfill` | yes                                 |     |          |         | seq  |
//!
//! (`seq`: `--poll-field-seq` alone, the order backfill pages rows in.)
//!
//! Invariant: a group a command does not take is at its clap defaults in [`Flags`], never read
//! from the environment, so an `OUTBOXD_*` variable meant for another command changes nothing.
//! `delivery` is the exception: absent, it is `None`, so `poll` and `backfill` cannot hold
//! exactly-once at all; nor can they hold logical messages as their only events
//! ([`Flags::reads_wal`]).

use clap::{Args, FromArgMatches};

use super::groups::{BudgetArgs, ProcessArgs, RouteArgs, SinkArgs, SourceArgs, WalArgs};
use super::poll::{PollLoopArgs, SeqColumnArgs};
use crate::error::Definite;
use crate::sink::kafka::config::{DeliveryArgs, DeliveryMode};

/// The groups every relaying command takes: where the events are, how they are routed, where
/// they go, and how many may wait for acks.
#[derive(Debug, Clone, clap::Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub route: RouteArgs,
    #[command(flatten)]
    pub sinks: SinkArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
}

/// Flags of `outboxd run`. Defaults follow `sql/01_outbox.sql` and Debezium's EventRouter.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub relay: RelayArgs,
    #[command(flatten)]
    pub wal: WalArgs,
    #[command(flatten)]
    pub delivery: DeliveryArgs,
    #[command(flatten)]
    pub process: ProcessArgs,
}

/// Flags of `outboxd poll`: those of `run` without the slot, WAL and exactly-once ones, plus the
/// `--poll-*` flags and `--retention`.
#[derive(Debug, Clone, clap::Args)]
pub struct PollArgs {
    #[command(flatten)]
    pub relay: RelayArgs,
    #[command(flatten)]
    pub process: ProcessArgs,
    #[command(flatten)]
    pub poll: PollLoopArgs,
}

/// Flags of `outboxd config`: every flag of `run` and of `poll`, so it prints both.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub poll: PollLoopArgs,
}

/// Flags of `outboxd check`: every flag of `run` (only the connection, slot, publication, table,
/// column, routing and sink ones are used), plus `--json`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Machine-readable output: {"ok", "failures", "warnings", "checks": [{name, status, detail, fix}]}.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `outboxd backfill`: a range, and the connection, table, routing, sink and budget flags
/// of `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct BackfillArgs {
    /// Rows with created_at (--table-field-event-timestamp) at or after this: RFC 3339
    /// (2026-12-01T00:00:00Z) or a duration back from now (90m, 36h, 7d).
    #[arg(long, env = "OUTBOXD_BACKFILL_SINCE", value_name = "TIME")]
    pub since: Option<String>,
    /// Rows with created_at before this (same forms as --since).
    #[arg(long, env = "OUTBOXD_BACKFILL_UNTIL", value_name = "TIME")]
    pub until: Option<String>,
    /// Rows with event_id (--table-field-event-id) at or above this, in the column's own order.
    #[arg(long, env = "OUTBOXD_BACKFILL_FROM_EVENT_ID", value_name = "ID")]
    pub from_event_id: Option<String>,
    /// Rows with event_id at or below this.
    #[arg(long, env = "OUTBOXD_BACKFILL_TO_EVENT_ID", value_name = "ID")]
    pub to_event_id: Option<String>,
    /// Rows read per query (keyset pagination: each page is one short query, no long snapshot).
    #[arg(long, env = "OUTBOXD_BACKFILL_BATCH_SIZE", default_value_t = 1000)]
    pub batch_size: usize,
    #[command(flatten)]
    pub relay: RelayArgs,
    #[command(flatten)]
    pub seq: SeqColumnArgs,
}

/// Every group a relaying command can take, as [`super::Config::from_flags`] reads them.
#[derive(Debug, Clone)]
pub struct Flags {
    pub source: SourceArgs,
    pub wal: WalArgs,
    pub route: RouteArgs,
    pub sinks: SinkArgs,
    /// `None` for the commands that deliver at least once only (`poll`, `backfill`).
    pub delivery: Option<DeliveryArgs>,
    pub budget: BudgetArgs,
    pub process: ProcessArgs,
    pub poll: PollLoopArgs,
    /// librdkafka properties from `--debezium-config`, applied before the file and the flags.
    pub debezium_kafka_properties: Vec<String>,
    /// The command reads the slot (`run`, `check`, `config`), so logical messages can be events;
    /// `poll` and `backfill` read tables only.
    pub reads_wal: bool,
}

/// A relaying command's flags, as [`Flags`].
pub trait Relaying {
    fn flags(&self) -> Result<Flags, Definite>;
}

impl<T: Relaying + ?Sized> Relaying for Box<T> {
    fn flags(&self) -> Result<Flags, Definite> {
        (**self).flags()
    }
}

impl Relaying for Flags {
    fn flags(&self) -> Result<Flags, Definite> {
        Ok(self.clone())
    }
}

impl RelayArgs {
    /// These groups with the command's others; a group the command does not take (`None`) at its
    /// defaults. Only the commands that take the WAL group read the slot.
    fn with(
        &self,
        wal: Option<&WalArgs>,
        delivery: Option<&DeliveryArgs>,
        process: Option<&ProcessArgs>,
        poll: PollLoopArgs,
    ) -> Result<Flags, Definite> {
        Ok(Flags {
            source: self.source.clone(),
            route: self.route.clone(),
            sinks: self.sinks.clone(),
            budget: self.budget.clone(),
            reads_wal: wal.is_some(),
            wal: wal.cloned().map_or_else(defaults, Ok)?,
            delivery: delivery.cloned(),
            process: process.cloned().map_or_else(defaults, Ok)?,
            poll,
            debezium_kafka_properties: Vec::new(),
        })
    }
}

impl Relaying for RunArgs {
    fn flags(&self) -> Result<Flags, Definite> {
        self.relay.with(Some(&self.wal), Some(&self.delivery), Some(&self.process), defaults()?)
    }
}

impl Relaying for CheckArgs {
    fn flags(&self) -> Result<Flags, Definite> {
        self.run.flags()
    }
}

impl Relaying for ConfigArgs {
    fn flags(&self) -> Result<Flags, Definite> {
        Ok(Flags { poll: self.poll.clone(), ..self.run.flags()? })
    }
}

impl Relaying for PollArgs {
    fn flags(&self) -> Result<Flags, Definite> {
        refuse_exactly_once_from_env("outboxd poll")?;
        self.relay.with(None, None, Some(&self.process), self.poll.clone())
    }
}

impl Relaying for BackfillArgs {
    fn flags(&self) -> Result<Flags, Definite> {
        refuse_exactly_once_from_env("outboxd backfill")?;
        self.relay.with(None, None, None, PollLoopArgs { seq: self.seq.clone(), ..defaults()? })
    }
}

/// `poll` and `backfill` take no `--delivery`, so clap never reads `OUTBOXD_DELIVERY` for them; an
/// environment shared with `run` that asks for exactly-once must not be dropped without a word
/// (its consumers expect no duplicates), so it is refused, as a Debezium file asking for it is.
fn refuse_exactly_once_from_env(command: &str) -> Result<(), Definite> {
    let asked = std::env::var("OUTBOXD_DELIVERY")
        .is_ok_and(|v| <DeliveryMode as clap::ValueEnum>::from_str(v.trim(), true) == Ok(DeliveryMode::ExactlyOnce));
    if asked {
        return Err(Definite::Config(format!(
            "OUTBOXD_DELIVERY=exactly-once is set, but {command} delivers at least once (only outboxd run writes \
             Kafka transactions): unset it for this command, or use outboxd run"
        )));
    }
    Ok(())
}

/// A group a command does not take, at its clap defaults (its environment variables unread).
fn defaults<T: Args + FromArgMatches>() -> Result<T, Definite> {
    let cmd = T::augment_args(clap::Command::new("defaults")).mut_args(|a| a.env(None::<&str>));
    let bug = |e: clap::Error| Definite::Bug(format!("a flag group's defaults do not parse: {e}"));
    cmd.try_get_matches_from(["defaults"]).and_then(|m| T::from_arg_matches(&m)).map_err(bug)
}
