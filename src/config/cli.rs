//! What clap parses: the subcommands, the flags of the tools (`status`, `dlq`, `schema`, `shadow`),
//! and the value enums the flags share with the validated [`super::Config`]. The relaying
//! commands' flags are groups ([`super::flags`] composes them per command).
//!
//! Nothing here is checked beyond what clap checks; [`super::Config::from_args`] validates the
//! relaying commands' flags, and [`super::Config::to_args`] is their inverse, so a flag added to a
//! group needs a line in both (`config::tests::outboxd_config_prints_every_run_flag` fails until
//! `to_args` has it; give the round-trip generator there a strategy for it too).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use super::flags::{BackfillArgs, CheckArgs, ConfigArgs, PollArgs, RunArgs};
use crate::router::contract::SchemaMissing;
use crate::sink::kafka::config::KafkaClientArgs;
use crate::sink::nats::config::NatsConnArgs;
use crate::sink::rabbitmq::config::RabbitConnArgs;
use crate::sink::redis::config::RedisConnArgs;

#[derive(Debug, Parser)]
#[command(
    name = "outboxd",
    version,
    about = "Relay a PostgreSQL outbox table to Kafka through a logical replication slot, at-least-once"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stream outbox inserts to the sink until SIGINT/SIGTERM.
    Run(Box<RunArgs>),
    /// Poll the outbox table instead of a replication slot (no REPLICATION, any wal_level): claim
    /// batches in per-aggregate order, mark them published after their acks; the `--poll-*` flags.
    Poll(Box<PollArgs>),
    /// Print the effective configuration of `run` with the same flags, as flags (password masked).
    Config(Box<ConfigArgs>),
    /// Show the slot, the publication and the server settings outboxd depends on.
    Status(StatusArgs),
    /// Preflight with the flags of `run`: print a table of checks, each failure with its fix.
    /// Exit 0 when nothing fails (warnings keep 0), 1 otherwise.
    Check(Box<CheckArgs>),
    /// Inspect and replay the dead-letter topic.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Check payloads against `--schema-dir` contracts, e.g. in a producer's CI.
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// Validate a migration to the outbox: compare the legacy topic with the shadow topic.
    #[command(subcommand)]
    Shadow(ShadowCommand),
    /// Re-publish rows still in the outbox table(s), by created_at or event_id range, through the
    /// router and sink of `run` (header outboxd.backfill=true). Exit 0 when every row was delivered.
    Backfill(Box<BackfillArgs>),
    /// Read Kafka into an inbox table of the consumer's PostgreSQL, each event once: the records
    /// and each partition's next offset in one transaction (sql/08_inbox.sql; until SIGINT/SIGTERM).
    Inbox(Box<super::inbox::InboxArgs>),
    /// Restore the --encrypt'ed fields of records (JSON lines, e.g. --sink stdout output) with the keyring.
    Decrypt(crate::router::mask::decrypt::DecryptArgs),
}

#[derive(Debug, Subcommand)]
pub enum SchemaCommand {
    /// Validate sample payloads (--sample) or the rows still in the outbox table (--from-table)
    /// against DIR/<event_type>.json; print each violation. Exit 0 when all pass, 1 otherwise.
    Check(SchemaCheckArgs),
}

/// Flags of `outboxd schema check`.
#[derive(Debug, Clone, clap::Args)]
pub struct SchemaCheckArgs {
    /// The schema directory, as for `run --schema-dir`.
    pub dir: PathBuf,
    /// JSON lines file, one event a line: {"event_type": "order.paid.v1", "payload": {...}} (an
    /// optional "id" names it in the output).
    #[arg(long, value_name = "FILE", conflicts_with = "from_table", required_unless_present = "from_table")]
    pub sample: Option<PathBuf>,
    /// Read the rows still in the outbox table(s) instead (--postgres-url, --table, --table-field-*).
    #[arg(long)]
    pub from_table: bool,
    /// What an event type without a schema file does, as for `run`.
    #[arg(long, value_enum, default_value_t = SchemaMissing::Allow)]
    pub schema_missing: SchemaMissing,
    /// PostgreSQL URL, as for `run` (with --from-table).
    #[arg(long, env = "OUTBOXD_POSTGRES_URL", hide_env_values = true, default_value = "")]
    pub postgres_url: String,
    /// File holding the PostgreSQL password, as for `run`.
    #[arg(long, env = "OUTBOXD_POSTGRES_PASSWORD_FILE")]
    pub postgres_password_file: Option<PathBuf>,
    /// An outbox table, as SCHEMA.TABLE; repeatable.
    #[arg(long = "table", default_value = "public.outbox")]
    pub tables: Vec<String>,
    /// Column with the event id, shown with each violation.
    #[arg(long, default_value = "event_id")]
    pub table_field_event_id: String,
    /// Column with the event type that picks the schema.
    #[arg(long, default_value = "event_type")]
    pub table_field_event_type: String,
    /// Column with the payload.
    #[arg(long, default_value = "payload")]
    pub table_field_event_payload: String,
}

/// Flags of `outboxd status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// PostgreSQL URL, as for `run`.
    #[arg(long, env = "OUTBOXD_POSTGRES_URL", hide_env_values = true, default_value = "")]
    pub postgres_url: String,
    /// File holding the PostgreSQL password, as for `run`.
    #[arg(long, env = "OUTBOXD_POSTGRES_PASSWORD_FILE")]
    pub postgres_password_file: Option<PathBuf>,
    /// Slot to report on.
    #[arg(long, default_value = "outboxd")]
    pub slot: String,
    /// Publication to report on.
    #[arg(long, default_value = "outboxd")]
    pub publication: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Count DLQ records by reason and show the first ones.
    List(DlqListArgs),
    /// Republish DLQ records to their original topic (or --to-topic).
    Replay(DlqReplayArgs),
}

/// Flags shared by the `dlq` subcommands.
#[derive(Debug, Clone, clap::Args)]
pub struct DlqCommonArgs {
    #[command(flatten)]
    pub kafka: KafkaClientArgs,
    #[command(flatten)]
    pub sink: DlqSinkArgs,
    /// The dead-letter topic (a Kafka topic, a NATS subject, a Redis stream key).
    #[arg(long, default_value = "outboxd.dlq")]
    pub dlq_topic: String,
    /// Fail when reading the DLQ gets nothing for this long before reaching the end the topic had
    /// when reading began (a broker that stopped answering); a shorter silence only waits.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub read_timeout: String,
}

/// Which sink's dead letters the `dlq` tools read, and how to reach it: the same flags (and
/// environment variables) `outboxd run` takes for that sink.
#[derive(Debug, Clone, clap::Args)]
pub struct DlqSinkArgs {
    /// The sink `outboxd run` wrote the dead letters with: kafka, nats, redis, rabbitmq, sqs, sns
    /// or kinesis can be read.
    #[arg(long, value_enum, default_value_t = SinkKind::Kafka)]
    pub sink: SinkKind,
    #[command(flatten)]
    pub nats: NatsConnArgs,
    #[command(flatten)]
    pub redis: RedisConnArgs,
    #[command(flatten)]
    pub rabbitmq: RabbitConnArgs,
    /// The stream queue (x-queue-type: stream) bound to --dlq-topic that holds the dead letters;
    /// default: the --dlq-topic name.
    #[arg(long, value_name = "QUEUE")]
    pub rabbitmq_dlq_queue: Option<String>,
    #[command(flatten)]
    pub aws: crate::sink::aws::AwsArgs,
    #[command(flatten)]
    pub sqs: crate::sink::sqs::config::SqsArgs,
    #[command(flatten)]
    pub sns: crate::sink::sns::config::SnsArgs,
    #[command(flatten)]
    pub kinesis: crate::sink::kinesis::config::KinesisArgs,
    /// With --sink sqs or sns: how long the dead letters list or replay received stay hidden from other
    /// readers of the dead-letter queue (a replay stopped midway leaves its copies hidden this long).
    #[arg(long, default_value = "2m", value_name = "DURATION")]
    pub sqs_visibility_timeout: String,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DlqListArgs {
    #[command(flatten)]
    pub common: DlqCommonArgs,
    /// How many records to show.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DlqReplayArgs {
    #[command(flatten)]
    pub common: DlqCommonArgs,
    /// Only records whose `outboxd.error` reason equals this.
    #[arg(long)]
    pub filter_reason: Option<String>,
    /// Only the record with this event id.
    #[arg(long)]
    pub event_id: Option<String>,
    /// Republish here instead of each record's original topic.
    #[arg(long)]
    pub to_topic: Option<String>,
    /// Where replay progress (offsets) is kept, so a second run does not republish.
    #[arg(long, default_value = ".outboxd-dlq-state")]
    pub state_dir: PathBuf,
    /// Show what would be replayed; publish nothing, record nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Subcommand)]
pub enum ShadowCommand {
    /// Pair the events of --legacy-topic and --shadow-topic and report what differs; exit 0 when
    /// every event has its pair and they match, 1 otherwise.
    Compare(ShadowCompareArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct ShadowCompareArgs {
    #[command(flatten)]
    pub kafka: KafkaClientArgs,
    /// The topic the old publishing path writes.
    #[arg(long)]
    pub legacy_topic: String,
    /// The topic the outbox writes the `.shadow` copies to (e.g. order.paid.v1.shadow.events).
    #[arg(long)]
    pub shadow_topic: String,
    /// What makes two records the same event: header:NAME (outboxd sends the event id as header
    /// `id`), key, or field:/json/pointer into the payload.
    #[arg(long, value_name = "header:NAME|key|field:/POINTER")]
    pub match_by: String,
    /// JSON Pointer whose differences do not count (and those below it); `*` matches any one key
    /// or array element, e.g. /items/*/sentAt; repeatable.
    #[arg(long, value_name = "POINTER")]
    pub ignore: Vec<String>,
    /// Only events with a record timestamp newer than this long ago (e.g. 30m, 24h); default:
    /// the whole of both topics.
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// How far apart the two copies of an event may be in time: --since also reads this much
    /// before its start to find pairs, and --follow gives up on an event's pair after it.
    #[arg(long, default_value = "1m", value_name = "DURATION")]
    pub max_lag: String,
    /// Keep reading and export the counts on --metrics-addr, printing a report every
    /// --report-interval, until SIGINT/SIGTERM.
    #[arg(long)]
    pub follow: bool,
    /// With --follow: serve /metrics here; `off` disables.
    #[arg(long, default_value = "127.0.0.1:9465")]
    pub metrics_addr: String,
    /// With --follow: how often to print the report.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub report_interval: String,
    /// Machine-readable output: one JSON object per report.
    #[arg(long)]
    pub json: bool,
    /// Ids listed per kind of problem (the counts are always complete).
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// Fail when more events than this wait for their pair (each holds its payload in memory).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_pending: usize,
    /// Fail when reading gets nothing for this long before reaching the end the topics had when
    /// reading began.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub read_timeout: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PublicationAutocreate {
    /// Create `FOR TABLE <table>` when the publication is missing (Debezium's `filtered`).
    Filtered,
    /// A missing publication is an error.
    Disabled,
}

/// The sinks' value enum is made from the sinks' one list, `crate::sink::registry`.
pub use crate::sink::registry::SinkKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// What an UPDATE of an outbox row does (Debezium's `table.op.invalid.behavior`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InvalidOp {
    Warn,
    Error,
    Fatal,
}

/// What happens to an event that cannot be delivered as routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BadEventPolicy {
    /// Stop with an error naming the event; nothing after it is confirmed.
    Fail,
    /// Send it to --dlq-topic with the reason in headers; the DLQ ack counts as its ack.
    Dlq,
    /// Log it at error level, count it, and go on.
    Skip,
}
