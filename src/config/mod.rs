//! Flags in, a validated [`Config`] out, and back.
//!
//! Two layers, as in ripgrep: the flag groups are what clap parses (strings, env fallbacks,
//! defaults), each command taking the groups it uses ([`RunArgs`], [`PollArgs`], ...; all of them
//! together are [`Flags`]); [`Config::from_args`] turns them into typed values and rejects every bad combination with a
//! one-line message that names the flag and the fix. Nothing downstream re-validates.
//! [`Config::to_args`] is the inverse, printed by `outboxd config`: parsed again it gives an equal
//! `Config` (a property test holds it to that), with secrets masked.
//!
//! * `cli.rs`: the subcommands, the tools' flags and the value enums;
//! * `flags.rs`: which groups each relaying command takes, and [`Flags`];
//! * `groups.rs`: the groups shared by the relaying commands (a sink's group is in its folder);
//! * `validate.rs`: [`Flags`] to `Config`;
//! * `show.rs`: `Config` back to flags;
//! * `inbox.rs`: `outboxd inbox`'s flags and settings (it reads Kafka into PostgreSQL);
//! * `poll.rs`: `outboxd poll`'s flags, and its batch, wake-up, retry and column settings;
//! * `postgres.rs`: the conninfo, parsed into a [`PgTarget`] whose `Display` never shows the
//!   password, so it can be logged and put into errors safely;
//! * `debezium.rs`: `--debezium-config`, translated into flag values and merged under the flags.
//!
//! The flags and settings of each sink (Kafka, NATS, Redis, RabbitMQ, HTTP) are defined, validated,
//! masked and defaulted in that sink's own folder (`crate::sink::<name>::config`); this module keeps
//! what is shared, including masking of URLs ([`crate::secret`], re-exported here as `secret`).

use std::net::SocketAddr;
use std::time::Duration;

mod cli;
pub mod conninfo;
pub mod debezium;
mod flags;
mod groups;
pub mod inbox;
mod pgpass;
mod poll;
pub mod postgres;
pub use crate::properties;
pub use crate::secret;
mod show;
mod sinks;
mod validate;

pub use crate::sink::kafka::config::{
    is_secret, parse_property_flags, read_property_file, shown, DeliveryMode, KafkaClientArgs, KafkaConfig,
    LoadedProperties, PropertyFile, TxnConfig,
};
pub(crate) use crate::units::value_name;
pub use crate::units::{parse_duration, parse_size};
pub use cli::{
    BadEventPolicy, Cli, Command, DlqCommand, DlqCommonArgs, DlqListArgs, DlqReplayArgs, DlqSinkArgs, InvalidOp,
    LogFormat, PublicationAutocreate, SchemaCheckArgs, SchemaCommand, ShadowCommand, ShadowCompareArgs, SinkKind,
    StatusArgs,
};
pub use flags::{BackfillArgs, CheckArgs, ConfigArgs, Flags, PollArgs, RelayArgs, Relaying, RunArgs};
pub use groups::{BudgetArgs, ProcessArgs, RouteArgs, SinkArgs, SourceArgs, StatusPageArgs, WalArgs};
pub use inbox::{InboxArgs, InboxConfig};
pub use poll::{PollColumns, PollConfig, PollLoopArgs, SeqColumnArgs, MAX_RETRY_BACKOFF};
pub use postgres::{PgHost, PgTarget, SslMode};
pub use validate::parse_table;

use crate::router::mask::Masking;
use crate::router::RouteConfig;

/// Prefix of the logical messages outboxd emits as heartbeats (and skips when it reads them).
pub const HEARTBEAT_PREFIX: &str = "outboxd.heartbeat";

/// `SCHEMA.TABLE`, unquoted as PostgreSQL stores it in the catalogs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// Where a sink URL came from a file (`--nats-url-file` ...): `outboxd config` shows the path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UrlFiles {
    pub nats: Option<std::path::PathBuf>,
    pub redis: Option<std::path::PathBuf>,
    pub rabbitmq: Option<std::path::PathBuf>,
    pub http: Option<std::path::PathBuf>,
}

/// Everything `outboxd run` needs, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub postgres: PgTarget,
    pub slot: String,
    pub publication: String,
    /// May be empty when `messages_prefixes` is not.
    pub tables: Vec<TableName>,
    /// `--messages-prefix`: prefixes of transactional logical messages that are events (exact match).
    pub messages_prefixes: Vec<String>,
    pub publication_autocreate: PublicationAutocreate,
    pub route: RouteConfig,
    /// `--value-converter avro`: the schema registry ([`crate::format`]).
    pub registry: Option<crate::format::RegistryConfig>,
    /// `--otlp-endpoint`: where spans are exported ([`crate::otlp`]).
    pub otlp_endpoint: Option<String>,
    pub op_invalid: InvalidOp,
    pub sink: SinkKind,
    pub kafka: KafkaConfig,
    pub nats: crate::sink::nats::config::NatsConfig,
    /// `--redis-url`, `--redis-maxlen` (used by `--sink redis`).
    pub redis: crate::sink::redis::config::RedisConfig,
    /// `--rabbitmq-url`, `--rabbitmq-exchange` (used by `--sink rabbitmq`).
    pub rabbitmq: crate::sink::rabbitmq::config::RabbitConfig,
    /// `--http-*` (used by `--sink http`).
    pub http: crate::sink::http::config::HttpConfig,
    /// `--aws-*` (used by the AWS sinks).
    pub aws: crate::sink::aws::AwsConfig,
    /// `--sqs-*` (used by `--sink sqs`).
    pub sqs: crate::sink::sqs::config::SqsConfig,
    /// `--sns-*` (used by `--sink sns`).
    pub sns: crate::sink::sns::config::SnsConfig,
    /// `--kinesis-*` (used by `--sink kinesis`).
    pub kinesis: crate::sink::kinesis::config::KinesisConfig,
    /// The `--*-url-file` options given: those URLs are shown by path only.
    pub url_files: UrlFiles,
    pub max_in_flight: usize,
    pub max_in_flight_bytes: usize,
    /// Zero: /healthz never reports a stall.
    pub health_stall_timeout: Duration,
    pub status_interval: Duration,
    pub shutdown_timeout: Duration,
    /// Silence on the replication connection after which it is dropped; zero: never.
    pub wal_receiver_timeout: Duration,
    pub log_format: LogFormat,
    pub metrics_addr: Option<SocketAddr>,
    /// `--status-page-token-file`: the status page's token (shown as its file's path only).
    pub status_page_token: Option<crate::format::Password>,
    /// `--status-page-allowed-hosts`: the names besides localhost and addresses the page answers.
    pub status_page_allowed_hosts: Vec<String>,
    pub on_bad_event: BadEventPolicy,
    /// `--delivery`: at-least-once, or exactly-once through Kafka transactions.
    pub delivery: DeliveryMode,
    pub dlq_topic: String,
    /// `--dlq-sink`: the sink dead-letter copies go through when it is not `sink`.
    pub dlq_sink: Option<SinkKind>,
    /// Zero: no heartbeats.
    pub heartbeat_interval: Duration,
    pub heartbeat_action_query: Option<String>,
    pub lag_poll_interval: Duration,
    pub reconnect_max_backoff: Duration,
    /// Pause between attempts to take over a slot held by another process (before jitter).
    pub standby_retry_interval: Duration,
    /// Create the slot with FAILOVER (or turn it on); PostgreSQL 17+.
    pub slot_failover: bool,
    /// A slot missing after this process streamed is re-created instead of being an error.
    pub slot_recreate_after_loss: bool,
    /// `--mask`, `--encrypt` and their keys, compiled.
    pub mask: Masking,
    /// The `--poll-*` flags and `--retention`, for `outboxd poll`.
    pub poll: PollConfig,
    /// The outbox tables must be empty at start (a Debezium file asked for an initial snapshot).
    pub require_empty_tables: bool,
    /// An UPDATE that changes an outbox row's primary key is the new row's event, with Debezium's
    /// `__debezium.oldkey` header (`--debezium-config` only: what Debezium publishes for it).
    pub key_change_events: bool,
    /// `--debezium-offsets`: events Debezium delivered before outboxd took over its slot.
    pub debezium_offsets: Option<(std::path::PathBuf, debezium::offsets::DebeziumOffset)>,
    /// Messages from loading the configuration, for the log once it is up: (is_warning, text).
    pub notes: Vec<(bool, String)>,
}

#[cfg(test)]
mod tests;
