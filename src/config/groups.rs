//! The flag groups the relaying commands (`run`, `poll`, `config`, `check`, `backfill`) are made
//! of, each a `clap::Args` a command flattens when it uses that group ([`super::flags`] says which
//! command takes which). A sink's own group lives in that sink's folder; `outboxd poll`'s in
//! [`super::poll`]; the exactly-once flags in `crate::sink::kafka::config`.
//!
//! Invariant: a flag is defined once, here or in its sink's folder, with its env name, default
//! and help; no two groups share an argument id (clap refuses the command otherwise, and
//! `--debezium-config` finds flags by id).

use std::path::PathBuf;

use super::{BadEventPolicy, InvalidOp, LogFormat, PublicationAutocreate, SinkKind};
use crate::router::contract::SchemaMissing;
use crate::router::placed::{BinaryMode, DecimalMode, IntervalMode, TimePrecision};
use crate::router::MissingPolicy;

/// Where the events are: the PostgreSQL server, the Debezium file that may stand in for flags,
/// and the outbox table(s) with their columns. Every relaying command takes it.
#[derive(Debug, Clone, clap::Args)]
pub struct SourceArgs {
    /// Read a Debezium connector config (Connect JSON or Debezium Server .properties); explicit flags win.
    #[arg(long, env = "OUTBOXD_DEBEZIUM_CONFIG")]
    pub debezium_config: Option<PathBuf>,
    /// PostgreSQL conninfo: a URL (postgres://user@host:5432/db?sslmode=verify-full) or libpq
    /// key=value pairs (host=db dbname=app sslmode=verify-full); libpq's PG* variables fill gaps.
    #[arg(long, env = "OUTBOXD_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// File holding the PostgreSQL password (one trailing newline is ignored), so it is not in argv.
    #[arg(long, env = "OUTBOXD_POSTGRES_PASSWORD_FILE")]
    pub postgres_password_file: Option<PathBuf>,
    /// An outbox table, as SCHEMA.TABLE; repeatable (the same options apply to each). An empty
    /// value (`--table ''`) means no table: events come only from --messages-prefix.
    #[arg(long = "table", default_value = "public.outbox")]
    pub tables: Vec<String>,
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
    /// How placed date and time columns are typed, as Debezium's `time.precision.mode`: `adaptive`
    /// (milliseconds up to 3 fraction digits, else microseconds) or `adaptive_time_microseconds`;
    /// `connect` and `isostring` refuse placed date/time columns.
    #[arg(long, value_enum, default_value_t = TimePrecision::Adaptive, value_name = "MODE")]
    pub time_precision_mode: TimePrecision,
    /// How placed `numeric` and `money` columns are typed, as Debezium's `decimal.handling.mode`:
    /// `precise` (a decimal), `double` or `string`.
    #[arg(long, value_enum, default_value_t = DecimalMode::Precise, value_name = "MODE")]
    pub decimal_handling_mode: DecimalMode,
    /// How placed `bytea` columns are typed, as Debezium's `binary.handling.mode`: `bytes` (Base64
    /// in a header), `base64`, `base64-url-safe` or `hex`.
    #[arg(long, value_enum, default_value_t = BinaryMode::Bytes, value_name = "MODE")]
    pub binary_handling_mode: BinaryMode,
    /// How placed `interval` columns are typed, as Debezium's `interval.handling.mode`: `numeric`
    /// (microseconds); `string` refuses placed interval columns.
    #[arg(long, value_enum, default_value_t = IntervalMode::Numeric, value_name = "MODE")]
    pub interval_handling_mode: IntervalMode,
    /// Parse `text` payloads as JSON and send them compact (Debezium `table.expand.json.payload`).
    #[arg(long, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub table_expand_json_payload: bool,
    /// jsonb column whose top-level keys become Kafka headers; empty disables. Default: `headers` when the table has it.
    #[arg(long)]
    pub table_field_event_headers: Option<String>,
    /// Column holding the writer's W3C trace context (a bare traceparent, or Debezium's
    /// properties text with traceparent= and tracestate= lines); it becomes the `traceparent` and
    /// `tracestate` headers on every sink (Debezium `tracing.span.context.field`). Empty disables.
    /// Default: `tracingspancontext` when the table has it.
    #[arg(long, env = "OUTBOXD_TRACING_SPAN_CONTEXT_FIELD", value_name = "COLUMN")]
    pub tracing_span_context_field: Option<String>,
}

/// How a row becomes a record: topic routing, key and value converters with the schema registry,
/// payload contracts, and masking. Every relaying command takes it.
#[derive(Debug, Clone, clap::Args)]
pub struct RouteArgs {
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
    #[command(flatten)]
    pub registry: RegistryArgs,
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
    /// Directory of JSON Schemas (draft 2020-12), one per event type: `DIR/<event_type>.json` must
    /// accept the payload of that type, or the event is bad (reason `schema`). Reloaded on SIGHUP.
    #[arg(long, env = "OUTBOXD_SCHEMA_DIR", value_name = "DIR")]
    pub schema_dir: Option<PathBuf>,
    /// With --schema-dir, what an event type without a schema file does: pass unchecked, or be a bad event.
    #[arg(long, env = "OUTBOXD_SCHEMA_MISSING", value_enum, default_value_t = SchemaMissing::Allow)]
    pub schema_missing: SchemaMissing,
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
}

/// The schema registry's connection: `run`'s converters encode through it, `inbox` decodes
/// through it (`--value-format`). One group, so both commands name it the same way.
#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// A Confluent-compatible schema registry's API root (Confluent, Karapace, or Apicurio's
    /// `…/apis/ccompat/v7`): for `run`'s --value-converter avro, json-schema and protobuf (and
    /// --key-converter avro and json-schema), whose value schema is the event type's file in
    /// --schema-dir (`<type>.avsc`, `.json`, `.proto`), else the latest version of its subject;
    /// for `inbox`'s --value-format, the schemas by the ids the records carry.
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
}

/// The replication slot and what streams through it: `run` only (and `check`, `config`).
#[derive(Debug, Clone, clap::Args)]
pub struct WalArgs {
    /// Reconnect when the replication connection has been silent this long (0 disables).
    #[arg(long, env = "OUTBOXD_WAL_RECEIVER_TIMEOUT", default_value = "60s")]
    pub wal_receiver_timeout: String,
    /// Logical replication slot owned by this outboxd (created with pgoutput if missing).
    #[arg(long, default_value = "outboxd")]
    pub slot: String,
    /// Publication the slot streams (see --publication-autocreate).
    #[arg(long, default_value = "outboxd")]
    pub publication: String,
    /// Transactional logical messages, `pg_logical_emit_message(true, PREFIX, <JSON object>)`, whose
    /// prefix equals PREFIX are events too; repeatable (comma-separated in the environment).
    /// Needs PostgreSQL 14 or later.
    #[arg(long = "messages-prefix", env = "OUTBOXD_MESSAGES_PREFIX", value_name = "PREFIX", value_delimiter = ',')]
    pub messages_prefixes: Vec<String>,
    /// What to do when the publication is missing.
    #[arg(long, value_enum, default_value_t = PublicationAutocreate::Filtered)]
    pub publication_autocreate: PublicationAutocreate,
    /// What an UPDATE on the outbox does: warn, error (both log and go on) or fatal (Debezium `table.op.invalid.behavior`).
    #[arg(long, value_enum, default_value_t = InvalidOp::Warn)]
    pub table_op_invalid_behavior: InvalidOp,
    /// Write a heartbeat (an empty transaction, which no logical decoding consumer sees) this
    /// often while no event arrives, so an idle slot moves; 0 disables.
    #[arg(long, env = "OUTBOXD_HEARTBEAT_INTERVAL", default_value = "30s")]
    pub heartbeat_interval: String,
    /// SQL run on the heartbeat interval (Debezium `heartbeat.action.query`).
    #[arg(long, env = "OUTBOXD_HEARTBEAT_ACTION_QUERY")]
    pub heartbeat_action_query: Option<String>,
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
    /// Take over from a stopped Debezium connector: its committed offset (what
    /// `GET /connectors/NAME/offsets` on Kafka Connect answers), so events Debezium delivered are
    /// not sent again. Run on Debezium's own slot (docs/src/debezium.md, Switching from Debezium).
    #[arg(long, env = "OUTBOXD_DEBEZIUM_OFFSETS", value_name = "FILE")]
    pub debezium_offsets: Option<PathBuf>,
}

/// How much may wait for acks at once: the relay's budgets, for every relaying command.
#[derive(Debug, Clone, clap::Args)]
pub struct BudgetArgs {
    /// Stop reading WAL while this many events wait for acks.
    #[arg(long, default_value_t = 10_000)]
    pub max_in_flight: usize,
    /// Stop reading WAL while this many bytes of events wait for acks (e.g. 64MiB, 512KiB, 1GB);
    /// whichever of this and --max-in-flight is reached first.
    #[arg(long, env = "OUTBOXD_MAX_IN_FLIGHT_BYTES", default_value = "64MiB")]
    pub max_in_flight_bytes: String,
}

/// A long-running relay's operations: logging, the metrics and status endpoint, spans, health,
/// reconnects and shutdown. `run` and `poll` take it; `backfill` is a one-shot tool.
#[derive(Debug, Clone, clap::Args)]
pub struct ProcessArgs {
    /// Export one OpenTelemetry span per traced event (a child of the row's trace context, from
    /// the event's timestamp to the sink's answer) over OTLP/HTTP to this base URL (e.g.
    /// http://collector:4318); the record's traceparent then names that span. Off by default.
    #[arg(long, env = "OUTBOXD_OTLP_ENDPOINT", hide_env_values = true, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// /healthz answers 503 once the replication loop has made no progress this long (a wedge);
    /// 0 disables. Must exceed twice --status-interval: a healthy loop turns at least that often.
    #[arg(long, env = "OUTBOXD_HEALTH_STALL_TIMEOUT", default_value = "120s")]
    pub health_stall_timeout: String,
    /// How long shutdown waits for in-flight acks.
    #[arg(long, default_value = "30s")]
    pub shutdown_timeout: String,
    /// How often to send a standby status update (e.g. 500ms, 10s, 2m).
    #[arg(long, default_value = "10s")]
    pub status_interval: String,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve /metrics, /healthz, /readyz and the status page (/ and /status.json) on this address;
    /// `off` disables.
    #[arg(long, env = "OUTBOXD_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_addr: String,
    #[command(flatten)]
    pub status_page: StatusPageArgs,
    /// How often to poll the slot's lag and safe WAL size over the ordinary connection.
    #[arg(long, env = "OUTBOXD_LAG_POLL_INTERVAL", default_value = "5s")]
    pub lag_poll_interval: String,
    /// Longest wait between reconnect attempts (exponential backoff with jitter).
    #[arg(long, env = "OUTBOXD_RECONNECT_MAX_BACKOFF", default_value = "30s")]
    pub reconnect_max_backoff: String,
}

/// Who may read the status page (/ and /status.json) on --metrics-addr: a token, and the Host
/// names it answers besides localhost and IP addresses. `run` and `poll` (in [`ProcessArgs`]) and
/// `outboxd inbox` take it; /metrics and the probes are never behind it.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusPageArgs {
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
}

/// Where the events go: the sink, where dead letters go, and every sink's own group (each defined
/// in its folder, `crate::sink::<name>::config`). This struct is the config side's list of sinks.
#[derive(Debug, Clone, clap::Args)]
pub struct SinkArgs {
    /// Where events go.
    #[arg(long, value_enum, default_value_t = SinkKind::Kafka)]
    pub sink: SinkKind,
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
    #[command(flatten)]
    pub kafka: crate::sink::kafka::config::KafkaArgs,
    #[command(flatten)]
    pub nats: crate::sink::nats::config::NatsArgs,
    #[command(flatten)]
    pub redis: crate::sink::redis::config::RedisArgs,
    #[command(flatten)]
    pub rabbitmq: crate::sink::rabbitmq::config::RabbitConnArgs,
    #[command(flatten)]
    pub http: crate::sink::http::config::HttpFlags,
    #[command(flatten)]
    pub aws: crate::sink::aws::AwsArgs,
    #[command(flatten)]
    pub sqs: crate::sink::sqs::config::SqsArgs,
    #[command(flatten)]
    pub sns: crate::sink::sns::config::SnsArgs,
    #[command(flatten)]
    pub kinesis: crate::sink::kinesis::config::KinesisArgs,
}
