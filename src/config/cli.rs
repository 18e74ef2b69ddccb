//! What clap parses: every subcommand's raw flags, with their env fallbacks, defaults and `--help`
//! text, and the value enums they share with the validated [`super::Config`].
//!
//! Nothing here is checked beyond what clap checks; [`super::Config::from_args`] validates `run`'s
//! flags, and [`super::Config::to_args`] is their inverse, so a `run` flag added here needs a line
//! in both (`config::tests::outboxd_config_prints_every_run_flag` fails until `to_args` has it;
//! give the round-trip generator there a strategy for it too).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::router::contract::SchemaMissing;
use crate::router::MissingPolicy;

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
    Poll(Box<RunArgs>),
    /// Print the effective configuration of `run` with the same flags, as flags (password masked).
    Config(Box<RunArgs>),
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
    /// Restore the --encrypt'ed fields of records (JSON lines, e.g. --sink stdout output) with the keyring.
    Decrypt(DecryptArgs),
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

/// Flags of `outboxd backfill`: a range, and every flag of `run` (connection, tables, routing, sink).
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
    pub run: RunArgs,
}

/// Flags of `outboxd decrypt`.
#[derive(Debug, Clone, clap::Args)]
pub struct DecryptArgs {
    /// The keyring JSON file the fields were sealed with (older keys included).
    #[arg(long, env = "OUTBOXD_ENCRYPT_KEY_FILE", value_name = "FILE")]
    pub encrypt_key_file: PathBuf,
    /// JSON lines to decrypt; stdin when left out or `-`.
    pub input: Option<PathBuf>,
    /// The event id sealed values are bound to, for lines that are bare values (a consumer's dump
    /// of one event); records as the stdout sink prints them carry it in their `id` header.
    #[arg(long, value_name = "ID")]
    pub event_id: Option<String>,
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

/// How `run` (and the commands sharing its flags) and the tools (`dlq`, `shadow`) reach Kafka.
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaClientArgs {
    /// Kafka bootstrap servers, comma-separated.
    #[arg(long, env = "OUTBOXD_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Extra librdkafka property KEY=VALUE; repeatable; wins over --kafka-property-file.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_properties: Vec<String>,
    /// Java .properties file of librdkafka properties (key=value lines), e.g. SASL/TLS credentials.
    #[arg(long, env = "OUTBOXD_KAFKA_PROPERTY_FILE", value_name = "FILE")]
    pub kafka_property_file: Option<PathBuf>,
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

/// How to reach NATS: the same flags for `outboxd run --sink nats` and the `dlq` tools.
#[derive(Debug, Clone, clap::Args)]
pub struct NatsConnArgs {
    /// NATS server URL(s) for --sink nats: nats://[user:pass@]host:4222 (tls:// for TLS), comma-separated.
    #[arg(long, env = "OUTBOXD_NATS_URL", hide_env_values = true, default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Read --nats-url from FILE (one line) instead, so its credentials stay out of argv and the
    /// environment (`ps`); only the file's path is ever shown.
    #[arg(long, env = "OUTBOXD_NATS_URL_FILE", value_name = "FILE", conflicts_with = "nats_url")]
    pub nats_url_file: Option<PathBuf>,
    /// NATS credentials file (JWT and NKey seed) for --sink nats.
    #[arg(long, env = "OUTBOXD_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
}

/// How to reach Redis: the same flags for `outboxd run --sink redis` and the `dlq` tools.
#[derive(Debug, Clone, clap::Args)]
pub struct RedisConnArgs {
    /// Redis for --sink redis: redis://[user:password@]host:6379/0, rediss:// for TLS.
    #[arg(long, env = "OUTBOXD_REDIS_URL", hide_env_values = true, default_value = crate::sink::redis::config::DEFAULT_URL)]
    pub redis_url: String,
    /// Read --redis-url from FILE (one line) instead, so its credentials stay out of argv and the
    /// environment (`ps`); only the file's path is ever shown.
    #[arg(long, env = "OUTBOXD_REDIS_URL_FILE", value_name = "FILE", conflicts_with = "redis_url")]
    pub redis_url_file: Option<PathBuf>,
}

/// How to reach RabbitMQ: the same flags for `outboxd run --sink rabbitmq` and the `dlq` tools.
#[derive(Debug, Clone, clap::Args)]
pub struct RabbitConnArgs {
    /// RabbitMQ for --sink rabbitmq: amqp://[user:password@]host:5672/%2f, amqps:// for TLS.
    #[arg(long, env = "OUTBOXD_RABBITMQ_URL", hide_env_values = true, default_value = crate::sink::rabbitmq::config::DEFAULT_URL)]
    pub rabbitmq_url: String,
    /// Read --rabbitmq-url from FILE (one line) instead, so its credentials stay out of argv and the
    /// environment (`ps`); only the file's path is ever shown.
    #[arg(long, env = "OUTBOXD_RABBITMQ_URL_FILE", value_name = "FILE", conflicts_with = "rabbitmq_url")]
    pub rabbitmq_url_file: Option<PathBuf>,
    /// Exchange to publish to (run) and to replay to (dlq replay), with the topic as routing key;
    /// empty: the default exchange (the routing key names the queue).
    #[arg(long, env = "OUTBOXD_RABBITMQ_EXCHANGE", default_value = "")]
    pub rabbitmq_exchange: String,
}

/// Which sink's dead letters the `dlq` tools read, and how to reach it: the same flags (and
/// environment variables) `outboxd run` takes for that sink.
#[derive(Debug, Clone, clap::Args)]
pub struct DlqSinkArgs {
    /// The sink `outboxd run` wrote the dead letters with: kafka, nats or redis can be read.
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

/// What a consumer sees of each committed outbox event (`--delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeliveryMode {
    /// Every event at least once; a crash or reconnect may repeat the events after the last
    /// confirmed transaction.
    AtLeastOnce,
    /// Every event exactly once to consumers that read with `isolation.level=read_committed`:
    /// records are written in Kafka transactions with outboxd's position (Kafka sink only).
    ExactlyOnce,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SinkKind {
    Kafka,
    Stdout,
    Null,
    /// NATS JetStream (--nats-url).
    Nats,
    /// Redis Streams: XADD to the stream named by the topic.
    Redis,
    /// RabbitMQ: persistent messages with publisher confirms (--rabbitmq-url).
    Rabbitmq,
    /// HTTP webhook: POST each event (or a batch) to --http-url; a 2xx response is the ack.
    Http,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Raw flags of `outboxd run`. Defaults follow `sql/01_outbox.sql` and Debezium's EventRouter.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Read a Debezium connector config (Connect JSON or Debezium Server .properties); explicit flags win.
    #[arg(long, env = "OUTBOXD_DEBEZIUM_CONFIG")]
    pub debezium_config: Option<PathBuf>,
    /// Take over from a stopped Debezium connector: its committed offset (what
    /// `GET /connectors/NAME/offsets` on Kafka Connect answers), so events Debezium delivered are
    /// not sent again. Run on Debezium's own slot (docs/src/debezium.md, Switching from Debezium).
    #[arg(long, env = "OUTBOXD_DEBEZIUM_OFFSETS", value_name = "FILE")]
    pub debezium_offsets: Option<PathBuf>,
    /// PostgreSQL conninfo: a URL (postgres://user@host:5432/db?sslmode=verify-full) or libpq
    /// key=value pairs (host=db dbname=app sslmode=verify-full); libpq's PG* variables fill gaps.
    #[arg(long, env = "OUTBOXD_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// File holding the PostgreSQL password (one trailing newline is ignored), so it is not in argv.
    #[arg(long, env = "OUTBOXD_POSTGRES_PASSWORD_FILE")]
    pub postgres_password_file: Option<PathBuf>,
    /// Reconnect when the replication connection has been silent this long (0 disables).
    #[arg(long, env = "OUTBOXD_WAL_RECEIVER_TIMEOUT", default_value = "60s")]
    pub wal_receiver_timeout: String,
    /// Logical replication slot owned by this outboxd (created with pgoutput if missing).
    #[arg(long, default_value = "outboxd")]
    pub slot: String,
    /// Publication the slot streams (see --publication-autocreate).
    #[arg(long, default_value = "outboxd")]
    pub publication: String,
    /// An outbox table, as SCHEMA.TABLE; repeatable (the same options apply to each). An empty
    /// value (`--table ''`) means no table: events come only from --messages-prefix.
    #[arg(long = "table", default_value = "public.outbox")]
    pub tables: Vec<String>,
    /// Transactional logical messages, `pg_logical_emit_message(true, PREFIX, <JSON object>)`, whose
    /// prefix equals PREFIX are events too; repeatable (comma-separated in the environment).
    /// Needs PostgreSQL 14 or later.
    #[arg(long = "messages-prefix", env = "OUTBOXD_MESSAGES_PREFIX", value_name = "PREFIX", value_delimiter = ',')]
    pub messages_prefixes: Vec<String>,
    /// What to do when the publication is missing.
    #[arg(long, value_enum, default_value_t = PublicationAutocreate::Filtered)]
    pub publication_autocreate: PublicationAutocreate,
    #[command(flatten)]
    pub kafka: KafkaClientArgs,
    /// librdkafka properties from --debezium-config, applied before the file and the flags.
    #[arg(skip)]
    pub debezium_kafka_properties: Vec<String>,
    #[command(flatten)]
    pub nats: NatsConnArgs,
    /// Create this JetStream stream (file storage) at start if it is missing: NAME:SUBJECT[,SUBJECT...].
    #[arg(long, value_name = "NAME:SUBJECTS")]
    pub nats_create_stream: Option<String>,
    /// Partitions for topics outboxd creates; -1: the broker's num.partitions (Debezium
    /// topic.creation.default.partitions).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub topic_partitions: i32,
    /// Replication factor for topics outboxd creates; -1: the broker's default.replication.factor,
    /// so a topic is as durable as the cluster (Debezium topic.creation.default.replication.factor).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub topic_replication_factor: i32,
    /// Column whose value picks the topic (Debezium `route.by.field`).
    #[arg(long, default_value = "event_type")]
    pub route_by_field: String,
    /// Regex applied to the route value; must match it whole (Debezium `route.topic.regex`).
    #[arg(long, default_value = "(?<routedByValue>.*)")]
    pub route_topic_regex: String,
    /// Topic template with `${group}` / `$N` from --route-topic-regex (Debezium `route.topic.replacement`).
    #[arg(long, default_value = "${routedByValue}.events")]
    pub route_topic_replacement: String,
    /// Emit a tombstone (null value; headers and partition kept) for a NULL, empty or blank payload (Debezium `route.tombstone.on.empty.payload`).
    #[arg(long, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub route_tombstone_on_empty_payload: bool,
    /// Column sent as Kafka header `id` (Debezium `table.field.event.id`).
    #[arg(long, default_value = "event_id")]
    pub table_field_event_id: String,
    /// Column used as the Kafka key; NULL means no key (Debezium `table.field.event.key`).
    #[arg(long, default_value = "aggregate_id")]
    pub table_field_event_key: String,
    /// Column holding the event type (Debezium `table.field.event.type`); usable in placements.
    #[arg(long, default_value = "event_type")]
    pub table_field_event_type: String,
    /// Column sent as the record value (Debezium `table.field.event.payload`).
    #[arg(long, default_value = "payload")]
    pub table_field_event_payload: String,
    /// Column used as the record timestamp; empty means the commit time (Debezium `table.field.event.timestamp`).
    #[arg(long, default_value = "created_at")]
    pub table_field_event_timestamp: String,
    /// Extra columns: `col:header[:alias]`, `col:envelope[:alias]`, `col:partition`, comma-separated (Debezium `table.fields.additional.placement`).
    /// Left out: none; an empty value is an error.
    #[arg(long)]
    pub table_fields_additional_placement: Option<String>,
    /// What a placement column missing from the table does: fail at start, or leave that placement out.
    #[arg(long, value_enum, default_value_t = MissingPolicy::Error)]
    pub table_field_additional_missing: MissingPolicy,
    /// What an UPDATE on the outbox does: warn, error (both log and go on) or fatal (Debezium `table.op.invalid.behavior`).
    #[arg(long, value_enum, default_value_t = InvalidOp::Warn)]
    pub table_op_invalid_behavior: InvalidOp,
    /// Parse `text` payloads as JSON and send them compact (Debezium `table.expand.json.payload`).
    #[arg(long, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub table_expand_json_payload: bool,
    /// How the key is written: `string` (Kafka Connect's StringConverter: the column as routed),
    /// `json` (JsonConverter with schemas.enable=false: a JSON string, number or boolean) or
    /// `bytes` (ByteArrayConverter: a bytea column's bytes); or, through --schema-registry-url,
    /// `avro` or `json-schema` (the key as a string schema under `<topic>-key`). Alias: --key-format.
    #[arg(long, alias = "key-format", env = "OUTBOXD_KEY_CONVERTER", value_enum, default_value_t = crate::router::Converter::String)]
    pub key_converter: crate::router::Converter,
    /// How the value is written: `string`, `json` or `bytes`, as for --key-converter; or, through
    /// --schema-registry-url in the Confluent wire format, `avro` (AvroConverter: the JSON payload
    /// as an Avro datum of its subject's latest schema), `json-schema` (JsonSchemaConverter: the
    /// JSON, validated against the subject's latest JSON Schema) or `protobuf` (ProtobufConverter:
    /// the JSON as the first message of the subject's latest .proto). Alias: --value-format.
    #[arg(long, alias = "value-format", env = "OUTBOXD_VALUE_CONVERTER", value_enum, default_value_t = crate::router::Converter::String)]
    pub value_converter: crate::router::Converter,
    /// A Confluent-compatible schema registry's API root (Confluent, Karapace, or Apicurio's
    /// `…/apis/ccompat/v7`) for --value-converter avro, json-schema and protobuf (and --key-converter
    /// avro and json-schema). The value schema is the event type's file in --schema-dir
    /// (`<type>.avsc`, `.json`, `.proto`), else the latest version of its subject.
    #[arg(long, env = "OUTBOXD_SCHEMA_REGISTRY_URL", hide_env_values = true, value_name = "URL")]
    pub schema_registry_url: Option<String>,
    /// Basic-auth user for --schema-registry-url.
    #[arg(long, env = "OUTBOXD_SCHEMA_REGISTRY_USER", value_name = "USER")]
    pub schema_registry_user: Option<String>,
    /// File holding the basic-auth password for --schema-registry-url (one trailing newline is dropped).
    #[arg(long, env = "OUTBOXD_SCHEMA_REGISTRY_PASSWORD_FILE", value_name = "PATH")]
    pub schema_registry_password_file: Option<std::path::PathBuf>,
    /// PEM CA certificate to trust for an https --schema-registry-url (besides the system's).
    #[arg(long, env = "OUTBOXD_SCHEMA_REGISTRY_CA_FILE", value_name = "PATH")]
    pub schema_registry_ca_file: Option<std::path::PathBuf>,
    /// The value's registry subject: `topic` (`<topic>-value`), `record` (the record's full name:
    /// the schema file's, else the event type) or `topic-record` (`<topic>-<record name>`), as
    /// Confluent's TopicNameStrategy, RecordNameStrategy and TopicRecordNameStrategy.
    #[arg(long, env = "OUTBOXD_SUBJECT_NAME_STRATEGY", value_enum, default_value_t = crate::format::SubjectStrategy::Topic)]
    pub subject_name_strategy: crate::format::SubjectStrategy,
    /// Register --schema-dir schema files (and the key's string schema) under their subjects on
    /// first use; a schema the subject's compatibility rule refuses is a bad event
    /// (`schema_incompatible`). Off: they must be registered already (`schema_missing` otherwise).
    #[arg(long, env = "OUTBOXD_SCHEMA_AUTO_REGISTER", num_args = 0..=1, default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub schema_auto_register: bool,
    /// jsonb column whose top-level keys become Kafka headers; empty disables. Default: `headers` when the table has it.
    #[arg(long)]
    pub table_field_event_headers: Option<String>,
    /// Column holding the writer's W3C trace context (a bare traceparent, or Debezium's
    /// properties text with traceparent= and tracestate= lines); it becomes the `traceparent` and
    /// `tracestate` headers on every sink (Debezium `tracing.span.context.field`). Empty disables.
    /// Default: `tracingspancontext` when the table has it.
    #[arg(long, env = "OUTBOXD_TRACING_SPAN_CONTEXT_FIELD", value_name = "COLUMN")]
    pub tracing_span_context_field: Option<String>,
    /// Export one OpenTelemetry span per traced event (a child of the row's trace context, from
    /// the event's timestamp to the sink's answer) over OTLP/HTTP to this base URL (e.g.
    /// http://collector:4318); the record's traceparent then names that span. Off by default.
    #[arg(long, env = "OUTBOXD_OTLP_ENDPOINT", hide_env_values = true, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Where events go.
    #[arg(long, value_enum, default_value_t = SinkKind::Kafka)]
    pub sink: SinkKind,
    /// at-least-once, or exactly-once (Kafka only): each event visible once to read_committed
    /// consumers, written in Kafka transactions together with outboxd's position (Debezium
    /// exactly.once.support=required).
    #[arg(long, env = "OUTBOXD_DELIVERY", value_enum, default_value_t = DeliveryMode::AtLeastOnce)]
    pub delivery: DeliveryMode,
    /// Exactly-once: how long a Kafka transaction stays open before it commits at the next
    /// PostgreSQL commit (acks, and so slot confirmation, wait for it).
    #[arg(long, env = "OUTBOXD_TRANSACTION_INTERVAL", default_value = "25ms", value_name = "DURATION")]
    pub transaction_interval: String,
    /// Exactly-once: the compacted topic holding outboxd's position, written in each Kafka
    /// transaction (keyed by system identifier and slot).
    #[arg(long, env = "OUTBOXD_POSITION_TOPIC", default_value = "outboxd.positions", value_name = "TOPIC")]
    pub position_topic: String,
    #[command(flatten)]
    pub redis: RedisConnArgs,
    /// Trim each stream to about this many entries (XADD MAXLEN ~ N); unset keeps every entry.
    #[arg(long, value_name = "N")]
    pub redis_maxlen: Option<u64>,
    #[command(flatten)]
    pub rabbitmq: RabbitConnArgs,
    /// Webhook URL for --sink http; `${topic}` becomes the routed topic (one encoded path segment).
    /// `user:password@` in it is sent as basic auth and masked everywhere.
    #[arg(long, env = "OUTBOXD_HTTP_URL", hide_env_values = true, default_value = "", value_name = "URL")]
    pub http_url: String,
    /// Read --http-url from FILE (one line) instead, so its credentials stay out of argv and the
    /// environment (`ps`); only the file's path is ever shown.
    #[arg(long, env = "OUTBOXD_HTTP_URL_FILE", value_name = "FILE", conflicts_with = "http_url")]
    pub http_url_file: Option<PathBuf>,
    /// CloudEvents `source` (header ce-source) of every event; default outboxd/<slot>.
    #[arg(long, env = "OUTBOXD_HTTP_SOURCE", value_name = "URI-REFERENCE")]
    pub http_source: Option<String>,
    /// Sign each request body with this secret (HMAC-SHA256): header Outboxd-Signature: t=...,v1=...
    #[arg(long, env = "OUTBOXD_HTTP_SIGNING_SECRET_FILE", value_name = "FILE")]
    pub http_signing_secret_file: Option<PathBuf>,
    /// Events per request: 1 posts each event alone (CloudEvents binary mode); more posts a JSON
    /// array (application/cloudevents-batch+json) that one 2xx acks whole.
    #[arg(long, env = "OUTBOXD_HTTP_BATCH", default_value_t = 1, value_name = "N")]
    pub http_batch: usize,
    /// Requests in flight at once; events of one key always share one lane, one request at a time.
    #[arg(long, env = "OUTBOXD_HTTP_CONCURRENCY", default_value_t = 8, value_name = "N")]
    pub http_concurrency: usize,
    /// Deadline for one request, response included; past it the request is retried.
    #[arg(long, env = "OUTBOXD_HTTP_TIMEOUT", default_value = "10s", value_name = "DURATION")]
    pub http_timeout: String,
    /// 4xx statuses that judge the event itself: it goes to the DLQ (or is skipped, or stops the
    /// pipeline, per --on-bad-event). Every other 4xx (401, 403, 404, 409 ...) is about the
    /// receiver, so the request is retried with backoff and /readyz says not ready meanwhile.
    #[arg(long, env = "OUTBOXD_HTTP_BAD_EVENT_STATUS", default_value = "400,413,415,422", value_name = "CODES")]
    pub http_bad_event_status: String,
    /// Signature scheme with --http-signing-secret-file: `v2` signs the path, every header outboxd
    /// sets and the body; `v1` (the old scheme, for receivers not yet moved) the body only.
    #[arg(long, env = "OUTBOXD_HTTP_SIGNATURE_VERSION", default_value = "v2", value_name = "v2|v1")]
    pub http_signature_version: String,
    /// Stop reading WAL while this many events wait for acks.
    #[arg(long, default_value_t = 10_000)]
    pub max_in_flight: usize,
    /// Stop reading WAL while this many bytes of events wait for acks (e.g. 64MiB, 512KiB, 1GB);
    /// whichever of this and --max-in-flight is reached first.
    #[arg(long, env = "OUTBOXD_MAX_IN_FLIGHT_BYTES", default_value = "64MiB")]
    pub max_in_flight_bytes: String,
    /// /healthz answers 503 once the replication loop has made no progress this long (a wedge);
    /// 0 disables. Must exceed twice --status-interval: a healthy loop turns at least that often.
    #[arg(long, env = "OUTBOXD_HEALTH_STALL_TIMEOUT", default_value = "120s")]
    pub health_stall_timeout: String,
    /// How often to send a standby status update (e.g. 500ms, 10s, 2m).
    #[arg(long, default_value = "10s")]
    pub status_interval: String,
    /// How long shutdown waits for in-flight acks.
    #[arg(long, default_value = "30s")]
    pub shutdown_timeout: String,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve /metrics, /healthz, /readyz and the status page (/ and /status.json) on this address;
    /// `off` disables.
    #[arg(long, env = "OUTBOXD_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_addr: String,
    /// The status page (/ and /status.json) answers only requests that carry the token in this
    /// file (`Authorization: Bearer TOKEN` or `?token=TOKEN`), for deployments that expose
    /// --metrics-addr; /metrics and the probes stay open.
    #[arg(long, env = "OUTBOXD_STATUS_PAGE_TOKEN_FILE", value_name = "FILE")]
    pub status_page_token_file: Option<PathBuf>,
    /// Host names the status page (/ and /status.json) answers besides localhost and IP
    /// addresses, comma-separated: `name`, `.domain` (it and its subdomains) or `*` (any). Others
    /// get 403, so a web page cannot read it through DNS rebinding; /metrics and the probes
    /// answer any Host.
    #[arg(long, env = "OUTBOXD_STATUS_PAGE_ALLOWED_HOSTS", value_name = "HOSTS", value_delimiter = ',')]
    pub status_page_allowed_hosts: Vec<String>,
    /// Directory of JSON Schemas (draft 2020-12), one per event type: `DIR/<event_type>.json` must
    /// accept the payload of that type, or the event is bad (reason `schema`). Reloaded on SIGHUP.
    #[arg(long, env = "OUTBOXD_SCHEMA_DIR", value_name = "DIR")]
    pub schema_dir: Option<PathBuf>,
    /// With --schema-dir, what an event type without a schema file does: pass unchecked, or be a bad event.
    #[arg(long, env = "OUTBOXD_SCHEMA_MISSING", value_enum, default_value_t = SchemaMissing::Allow)]
    pub schema_missing: SchemaMissing,
    /// What to do with an event that cannot be delivered as routed: stop, dead-letter it, or skip it.
    #[arg(long, env = "OUTBOXD_ON_BAD_EVENT", value_enum, default_value_t = BadEventPolicy::Dlq)]
    pub on_bad_event: BadEventPolicy,
    /// Dead-letter topic for --on-bad-event dlq.
    #[arg(long, env = "OUTBOXD_DLQ_TOPIC", default_value = "outboxd.dlq")]
    pub dlq_topic: String,
    /// Send dead-letter copies through this sink (with its own connection flags) instead of
    /// --sink, e.g. --sink http --dlq-sink redis, so `outboxd dlq` can read them back.
    #[arg(long, env = "OUTBOXD_DLQ_SINK", value_enum, value_name = "SINK")]
    pub dlq_sink: Option<SinkKind>,
    /// Emit a logical heartbeat message this often while no event arrives; 0 disables.
    #[arg(long, env = "OUTBOXD_HEARTBEAT_INTERVAL", default_value = "30s")]
    pub heartbeat_interval: String,
    /// SQL run on the heartbeat interval (Debezium `heartbeat.action.query`).
    #[arg(long, env = "OUTBOXD_HEARTBEAT_ACTION_QUERY")]
    pub heartbeat_action_query: Option<String>,
    /// How often to poll the slot's lag and safe WAL size over the ordinary connection.
    #[arg(long, env = "OUTBOXD_LAG_POLL_INTERVAL", default_value = "5s")]
    pub lag_poll_interval: String,
    /// Longest wait between reconnect attempts (exponential backoff with jitter).
    #[arg(long, env = "OUTBOXD_RECONNECT_MAX_BACKOFF", default_value = "30s")]
    pub reconnect_max_backoff: String,
    /// While another process holds the slot, wait this long (plus up to 20% jitter) between
    /// attempts to take it over (a standby instance).
    #[arg(long, env = "OUTBOXD_STANDBY_RETRY_INTERVAL", default_value = "5s")]
    pub standby_retry_interval: String,
    /// Make the slot a failover slot (PostgreSQL 17+; Debezium `slot.failover`): create it with
    /// FAILOVER, or turn FAILOVER on for an existing one, so a physical standby with
    /// sync_replication_slots=on keeps a copy.
    #[arg(long, env = "OUTBOXD_SLOT_FAILOVER", num_args = 0..=1, default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub slot_failover: bool,
    /// After this process has streamed, a missing slot (lost in a failover) is an error; with this
    /// flag, create a new one instead and accept that events committed since the old slot's
    /// position are not sent (republish them with `outboxd backfill`).
    #[arg(long, env = "OUTBOXD_SLOT_RECREATE_AFTER_LOSS", num_args = 0..=1, default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub slot_recreate_after_loss: bool,
    /// Mask a field before any sink sees it; repeatable. POINTER: a JSON Pointer into the payload
    /// (`/card/number`, `*` for every element: `/items/*/card`) or `headers/NAME[/...]`; ACTION:
    /// drop, redact (`"***"`), last4, or hash (HMAC-SHA256 hex, with --mask-key-file).
    #[arg(long = "mask", value_name = "POINTER=ACTION")]
    pub masks: Vec<String>,
    /// HMAC key for `hash` (raw bytes, one trailing newline ignored; at least 16 bytes).
    #[arg(long, env = "OUTBOXD_MASK_KEY_FILE", value_name = "FILE")]
    pub mask_key_file: Option<PathBuf>,
    /// Seal a field (XChaCha20-Poly1305, newest key of --encrypt-key-file); repeatable; POINTER as for --mask.
    #[arg(long = "encrypt", value_name = "POINTER")]
    pub encrypt: Vec<String>,
    /// Keyring JSON for --encrypt: {"keys": [{"kid": "...", "key": "<base64 of 32 bytes>"}, ...]}, newest last.
    #[arg(long, env = "OUTBOXD_ENCRYPT_KEY_FILE", value_name = "FILE")]
    pub encrypt_key_file: Option<PathBuf>,
    /// Apply --mask and --encrypt only to events whose type (--table-field-event-type) matches this regex whole.
    #[arg(long, value_name = "REGEX")]
    pub mask_event_type: Option<String>,
    /// `outboxd poll`: rows claimed per batch (one SELECT, one UPDATE after their acks).
    #[arg(long, env = "OUTBOXD_POLL_BATCH", default_value_t = 1000, help_heading = "Poll mode (outboxd poll)")]
    pub poll_batch: usize,
    /// `outboxd poll`: look for rows this often when no NOTIFY arrives (the fallback wake-up).
    #[arg(long, env = "OUTBOXD_POLL_INTERVAL", default_value = "1s", help_heading = "Poll mode (outboxd poll)")]
    pub poll_interval: String,
    /// `outboxd poll`: failed tries after which a refused row goes to --on-bad-event (dlq: the dead-letter topic).
    #[arg(long, env = "OUTBOXD_POLL_MAX_ATTEMPTS", default_value_t = 10, help_heading = "Poll mode (outboxd poll)")]
    pub poll_max_attempts: u32,
    /// `outboxd poll`: wait after the first failed try; doubles with each further one (at most 10m).
    #[arg(long, env = "OUTBOXD_POLL_RETRY_BACKOFF", default_value = "1s", help_heading = "Poll mode (outboxd poll)")]
    pub poll_retry_backoff: String,
    /// `outboxd poll`: DELETE acked rows instead of setting their published-at column (needs DELETE).
    #[arg(long, env = "OUTBOXD_POLL_DELETE", num_args = 0..=1, default_value = "false", default_missing_value = "true", value_name = "BOOL", help_heading = "Poll mode (outboxd poll)")]
    pub poll_delete: bool,
    /// `outboxd poll`: LISTEN channel the outbox trigger NOTIFYs (sql/05_poll.sql); empty: poll only.
    #[arg(
        long,
        env = "OUTBOXD_POLL_CHANNEL",
        default_value = "outboxd_outbox",
        help_heading = "Poll mode (outboxd poll)"
    )]
    pub poll_channel: String,
    /// `outboxd poll`: delete published rows older than this, in small batches (e.g. 7d as 168h); 0: keep them.
    #[arg(
        long,
        env = "OUTBOXD_RETENTION",
        default_value = "0",
        value_name = "DURATION",
        help_heading = "Poll mode (outboxd poll)"
    )]
    pub retention: String,
    /// `outboxd poll`: column giving insertion order (unique; sql/05_poll.sql adds it as an identity).
    #[arg(long, env = "OUTBOXD_POLL_FIELD_SEQ", default_value = "seq", help_heading = "Poll mode (outboxd poll)")]
    pub poll_field_seq: String,
    /// `outboxd poll`: column set when a row was published (NULL: not yet).
    #[arg(
        long,
        env = "OUTBOXD_POLL_FIELD_PUBLISHED_AT",
        default_value = "published_at",
        help_heading = "Poll mode (outboxd poll)"
    )]
    pub poll_field_published_at: String,
    /// `outboxd poll`: column counting failed tries (a row published on its first try keeps 0).
    #[arg(
        long,
        env = "OUTBOXD_POLL_FIELD_ATTEMPTS",
        default_value = "attempts",
        help_heading = "Poll mode (outboxd poll)"
    )]
    pub poll_field_attempts: String,
    /// `outboxd poll`: column holding the last failure's text.
    #[arg(long, env = "OUTBOXD_POLL_FIELD_ERROR", default_value = "error", help_heading = "Poll mode (outboxd poll)")]
    pub poll_field_error: String,
    /// `outboxd poll`: column holding when a failed row may be tried again.
    #[arg(
        long,
        env = "OUTBOXD_POLL_FIELD_NEXT_ATTEMPT_AT",
        default_value = "next_attempt_at",
        help_heading = "Poll mode (outboxd poll)"
    )]
    pub poll_field_next_attempt_at: String,
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
