//! Flags in, a validated [`Config`] out.
//!
//! Two layers, as in ripgrep: [`RunArgs`] is what clap parses (strings, env fallbacks, defaults);
//! [`Config::from_args`] turns it into typed values and rejects every bad combination with a
//! one-line message that names the flag and the fix. Nothing downstream re-validates.
//!
//! The PostgreSQL conninfo is parsed by [`postgres`] into a [`PgTarget`], whose `Display` never
//! shows the password, so it can be logged and put into errors safely.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

pub mod debezium;
pub mod postgres;
pub mod properties;

pub use postgres::{PgHost, PgTarget, SslMode};

use crate::error::Definite;
use crate::router::{HeadersField, MissingPolicy, Placement, RouteConfig, TopicRule};

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
    /// Print the effective configuration of `run` with the same flags, as flags (password masked).
    Config(Box<RunArgs>),
    /// Show the slot, the publication and the server settings outboxd depends on.
    Status(StatusArgs),
    /// Inspect and replay the dead-letter topic.
    #[command(subcommand)]
    Dlq(DlqCommand),
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
    /// Kafka bootstrap servers.
    #[arg(long, env = "OUTBOXD_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Extra librdkafka property KEY=VALUE; repeatable; after --kafka-property-file.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_properties: Vec<String>,
    /// Java .properties file of librdkafka properties (key=value lines), e.g. credentials.
    #[arg(long, env = "OUTBOXD_KAFKA_PROPERTY_FILE", value_name = "FILE")]
    pub kafka_property_file: Option<PathBuf>,
    /// The dead-letter topic.
    #[arg(long, default_value = "outboxd.dlq")]
    pub dlq_topic: String,
    /// Fail when reading the DLQ gets nothing for this long before reaching the end the topic had
    /// when reading began (a broker that stopped answering); a shorter silence only waits.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub read_timeout: String,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PublicationAutocreate {
    /// Create `FOR TABLE <table>` when the publication is missing (Debezium's `filtered`).
    Filtered,
    /// A missing publication is an error.
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SinkKind {
    Kafka,
    Stdout,
    Null,
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
    /// An outbox table, as SCHEMA.TABLE; repeatable (the same options apply to each).
    #[arg(long = "table", default_value = "public.outbox")]
    pub tables: Vec<String>,
    /// What to do when the publication is missing.
    #[arg(long, value_enum, default_value_t = PublicationAutocreate::Filtered)]
    pub publication_autocreate: PublicationAutocreate,
    /// Kafka bootstrap servers, comma-separated.
    #[arg(long, env = "OUTBOXD_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Extra librdkafka producer property KEY=VALUE; repeatable; wins over --kafka-property-file.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_properties: Vec<String>,
    /// Java .properties file of librdkafka properties (key=value lines), e.g. SASL/TLS credentials.
    #[arg(long, env = "OUTBOXD_KAFKA_PROPERTY_FILE", value_name = "FILE")]
    pub kafka_property_file: Option<PathBuf>,
    /// librdkafka properties from --debezium-config, applied before the file and the flags.
    #[arg(skip)]
    pub debezium_kafka_properties: Vec<String>,
    /// Partitions for topics outboxd creates.
    #[arg(long, default_value_t = 1)]
    pub topic_partitions: i32,
    /// Replication factor for topics outboxd creates.
    #[arg(long, default_value_t = 1)]
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
    /// Emit a tombstone (null value, no headers) for a NULL or empty payload (Debezium `route.tombstone.on.empty.payload`).
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
    #[arg(long, default_value = "")]
    pub table_fields_additional_placement: String,
    /// What a placement column missing from the table does: fail at start, or leave that placement out.
    #[arg(long, value_enum, default_value_t = MissingPolicy::Error)]
    pub table_field_additional_missing: MissingPolicy,
    /// What an UPDATE on the outbox does: warn, error (both log and go on) or fatal (Debezium `table.op.invalid.behavior`).
    #[arg(long, value_enum, default_value_t = InvalidOp::Warn)]
    pub table_op_invalid_behavior: InvalidOp,
    /// Parse `text` payloads as JSON and send them compact (Debezium `table.expand.json.payload`).
    #[arg(long, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub table_expand_json_payload: bool,
    /// jsonb column whose top-level keys become Kafka headers; empty disables. Default: `headers` when the table has it.
    #[arg(long)]
    pub table_field_event_headers: Option<String>,
    /// Where events go.
    #[arg(long, value_enum, default_value_t = SinkKind::Kafka)]
    pub sink: SinkKind,
    /// Stop reading WAL while this many events wait for acks.
    #[arg(long, default_value_t = 10_000)]
    pub max_in_flight: usize,
    /// How often to send a standby status update (e.g. 500ms, 10s, 2m).
    #[arg(long, default_value = "10s")]
    pub status_interval: String,
    /// How long shutdown waits for in-flight acks.
    #[arg(long, default_value = "30s")]
    pub shutdown_timeout: String,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve /metrics, /healthz and /readyz on this address; `off` disables.
    #[arg(long, env = "OUTBOXD_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_addr: String,
    /// What to do with an event that cannot be delivered as routed: stop, dead-letter it, or skip it.
    #[arg(long, env = "OUTBOXD_ON_BAD_EVENT", value_enum, default_value_t = BadEventPolicy::Dlq)]
    pub on_bad_event: BadEventPolicy,
    /// Dead-letter topic for --on-bad-event dlq.
    #[arg(long, env = "OUTBOXD_DLQ_TOPIC", default_value = "outboxd.dlq")]
    pub dlq_topic: String,
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
}

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

/// What an UPDATE of an outbox row does (Debezium's `table.op.invalid.behavior`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InvalidOp {
    Warn,
    Error,
    Fatal,
}

/// How to reach Kafka; every client is built from it by [`crate::sink::kafka_client`].
#[derive(Clone)]
pub struct KafkaConfig {
    pub brokers: String,
    /// Passed to librdkafka as given, after our defaults: those from `--debezium-config`, then
    /// `--kafka-property-file`, then `--kafka-property` (a later key wins).
    pub properties: Vec<(String, String)>,
    /// Which of `properties` came from `--kafka-property-file`, so `outboxd config` names the file.
    pub property_file: Option<PropertyFile>,
    /// Partitions of topics outboxd creates; `-1`: the broker's default (`dlq` tools).
    pub topic_partitions: i32,
    /// Replication factor of topics outboxd creates; `-1`: the broker's default.
    pub topic_replication_factor: i32,
}

/// The `--kafka-property-file` and the index range of its entries in [`KafkaConfig::properties`].
#[derive(Clone, Debug)]
pub struct PropertyFile {
    pub path: PathBuf,
    pub range: std::ops::Range<usize>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::sink::kafka_client::shown;
        let props: Vec<String> = self.properties.iter().map(|(k, v)| format!("{k}={}", shown(k, v))).collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("properties", &props)
            .field("property_file", &self.property_file)
            .field("topic_partitions", &self.topic_partitions)
            .field("topic_replication_factor", &self.topic_replication_factor)
            .finish()
    }
}

/// Merged librdkafka properties and where the file's are among them.
pub type LoadedProperties = (Vec<(String, String)>, Option<PropertyFile>);

impl KafkaConfig {
    /// Properties from Debezium, the file, then the flags, each checked.
    pub fn load_properties(
        debezium: &[String],
        file: Option<&std::path::Path>,
        flags: &[String],
    ) -> Result<LoadedProperties, Definite> {
        use crate::sink::kafka_client;
        let mut props = kafka_client::parse_property_flags(debezium)
            .map_err(|e| Definite::Config(format!("--debezium-config: {e}")))?;
        let file = match file {
            Some(path) => {
                let start = props.len();
                props.extend(kafka_client::read_property_file(path)?);
                Some(PropertyFile { path: path.to_owned(), range: start..props.len() })
            }
            None => None,
        };
        props.extend(kafka_client::parse_property_flags(flags)?);
        Ok((props, file))
    }
}

/// Everything `outboxd run` needs, validated.
#[derive(Clone, Debug)]
pub struct Config {
    pub postgres: PgTarget,
    pub slot: String,
    pub publication: String,
    pub tables: Vec<TableName>,
    pub publication_autocreate: PublicationAutocreate,
    pub route: RouteConfig,
    pub op_invalid: InvalidOp,
    pub sink: SinkKind,
    pub kafka: KafkaConfig,
    pub max_in_flight: usize,
    pub status_interval: Duration,
    pub shutdown_timeout: Duration,
    /// Silence on the replication connection after which it is dropped; zero: never.
    pub wal_receiver_timeout: Duration,
    pub log_format: LogFormat,
    pub metrics_addr: Option<SocketAddr>,
    pub on_bad_event: BadEventPolicy,
    pub dlq_topic: String,
    /// Zero: no heartbeats.
    pub heartbeat_interval: Duration,
    pub heartbeat_action_query: Option<String>,
    pub lag_poll_interval: Duration,
    pub reconnect_max_backoff: Duration,
    /// The outbox tables must be empty at start (a Debezium file asked for an initial snapshot).
    pub require_empty_tables: bool,
    /// Messages from loading the configuration, for the log once it is up: (is_warning, text).
    pub notes: Vec<(bool, String)>,
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

impl Config {
    /// Like [`Config::from_args`], first merging `--debezium-config` under the flags for which
    /// `explicit(arg_id)` says the user gave a value (command line or environment).
    pub fn from_args_with_file(a: &RunArgs, explicit: &dyn Fn(&str) -> bool) -> Result<Config, Definite> {
        let Some(path) = &a.debezium_config else { return Config::from_args(a) };
        let overlay = debezium::load(path)?;
        let mut merged = a.clone();
        apply_overlay(&mut merged, &overlay, explicit)?;
        let mut cfg = Config::from_args(&merged)?;
        cfg.require_empty_tables = overlay.require_empty_tables;
        cfg.notes = overlay.notes;
        Ok(cfg)
    }

    pub fn from_args(a: &RunArgs) -> Result<Config, Definite> {
        let bad = |m: String| Definite::Config(m);
        // Without --postgres-url, libpq's environment alone may say where to go (PGHOST, ...).
        let url = a.postgres_url.as_deref().unwrap_or("");
        if url.is_empty() && std::env::var_os("PGHOST").is_none() {
            return Err(bad(
                "--postgres-url (or OUTBOXD_POSTGRES_URL, or PGHOST) is required, e.g. postgres://user@host:5432/db"
                    .into(),
            ));
        }
        let fallbacks = postgres::Fallbacks {
            password_file: a.postgres_password_file.as_deref(),
            ..postgres::Fallbacks::process()
        };
        let postgres = PgTarget::parse_with(url, &fallbacks)?;
        check_identifier("--slot", &a.slot, true)?;
        check_identifier("--publication", &a.publication, false)?;
        let mut tables = Vec::new();
        for t in &a.tables {
            let t = parse_table(t)?;
            if !tables.contains(&t) {
                tables.push(t);
            }
        }
        let (properties, property_file) = KafkaConfig::load_properties(
            &a.debezium_kafka_properties,
            a.kafka_property_file.as_deref(),
            &a.kafka_properties,
        )?;
        if a.sink == SinkKind::Kafka && a.kafka_brokers.trim().is_empty() {
            return Err(bad("--kafka-brokers is empty; give host:port[,host:port]".into()));
        }
        if a.topic_partitions < 1 {
            return Err(bad(format!("--topic-partitions {} must be at least 1", a.topic_partitions)));
        }
        if a.topic_replication_factor < 1 {
            return Err(bad(format!("--topic-replication-factor {} must be at least 1", a.topic_replication_factor)));
        }
        if a.max_in_flight == 0 {
            return Err(bad("--max-in-flight must be at least 1".into()));
        }
        for (flag, v) in [
            ("--route-by-field", &a.route_by_field),
            ("--table-field-event-key", &a.table_field_event_key),
            ("--table-field-event-id", &a.table_field_event_id),
            ("--table-field-event-payload", &a.table_field_event_payload),
        ] {
            if v.is_empty() {
                return Err(bad(format!("{flag} must name a column of the outbox table")));
            }
        }
        let topic = TopicRule::new(&a.route_topic_regex, &a.route_topic_replacement).map_err(bad)?;
        let placements = Placement::parse_list(&a.table_fields_additional_placement)
            .map_err(|e| bad(format!("--table-fields-additional-placement {e}")))?;
        let headers_field = match a.table_field_event_headers.as_deref() {
            None => HeadersField::IfPresent("headers".into()),
            Some("") => HeadersField::Disabled,
            Some(c) => HeadersField::Required(c.into()),
        };
        let status_interval = parse_duration("--status-interval", &a.status_interval)?;
        if status_interval.is_zero() {
            return Err(bad("--status-interval must be greater than 0".into()));
        }
        Ok(Config {
            postgres,
            slot: a.slot.clone(),
            publication: a.publication.clone(),
            tables,
            publication_autocreate: a.publication_autocreate,
            route: RouteConfig {
                id_field: a.table_field_event_id.clone(),
                key_field: a.table_field_event_key.clone(),
                type_field: a.table_field_event_type.clone(),
                payload_field: a.table_field_event_payload.clone(),
                timestamp_field: Some(a.table_field_event_timestamp.clone()).filter(|s| !s.is_empty()),
                placements,
                additional_missing: a.table_field_additional_missing,
                route_by_field: a.route_by_field.clone(),
                topic: Arc::new(topic),
                tombstone_on_empty_payload: a.route_tombstone_on_empty_payload,
                expand_json_payload: a.table_expand_json_payload,
                headers_field,
            },
            op_invalid: a.table_op_invalid_behavior,
            sink: a.sink,
            kafka: KafkaConfig {
                brokers: a.kafka_brokers.clone(),
                properties,
                property_file,
                topic_partitions: a.topic_partitions,
                topic_replication_factor: a.topic_replication_factor,
            },
            max_in_flight: a.max_in_flight,
            status_interval,
            shutdown_timeout: parse_duration("--shutdown-timeout", &a.shutdown_timeout)?,
            wal_receiver_timeout: parse_duration("--wal-receiver-timeout", &a.wal_receiver_timeout)?,
            log_format: a.log_format,
            metrics_addr: match a.metrics_addr.as_str() {
                "off" | "" => None,
                s => Some(s.parse().map_err(|_| {
                    bad(format!("--metrics-addr {s:?}: expected HOST:PORT like 127.0.0.1:9464, or off"))
                })?),
            },
            on_bad_event: a.on_bad_event,
            dlq_topic: {
                if a.dlq_topic.is_empty()
                    || a.dlq_topic.len() > 249
                    || !a.dlq_topic.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                {
                    return Err(bad(format!("--dlq-topic {:?} is not a legal Kafka topic name", a.dlq_topic)));
                }
                a.dlq_topic.clone()
            },
            heartbeat_interval: parse_duration("--heartbeat-interval", &a.heartbeat_interval)?,
            heartbeat_action_query: a.heartbeat_action_query.clone().filter(|q| !q.trim().is_empty()),
            lag_poll_interval: {
                let d = parse_duration("--lag-poll-interval", &a.lag_poll_interval)?;
                if d.is_zero() {
                    return Err(bad("--lag-poll-interval must be greater than 0".into()));
                }
                d
            },
            require_empty_tables: false,
            notes: Vec::new(),
            reconnect_max_backoff: parse_duration("--reconnect-max-backoff", &a.reconnect_max_backoff)?
                .max(Duration::from_millis(100)),
        })
    }
}

impl Config {
    /// The configuration as `outboxd run` flags; the password shows as `****`.
    pub fn to_flags(&self) -> Vec<String> {
        let mut f = vec!["outboxd run".to_owned()];
        let mut push = |k: &str, v: &str| f.push(format!("--{k} {}", shell_quote(v)));
        push("postgres-url", &self.postgres.to_url_masked());
        if let Some(postgres::PasswordSource::File(f)) = &self.postgres.password_source {
            push("postgres-password-file", &f.display().to_string());
        }
        push("slot", &self.slot);
        push("publication", &self.publication);
        for t in &self.tables {
            push("table", &t.to_string());
        }
        push(
            "publication-autocreate",
            if self.publication_autocreate == PublicationAutocreate::Filtered { "filtered" } else { "disabled" },
        );
        push(
            "sink",
            match self.sink {
                SinkKind::Kafka => "kafka",
                SinkKind::Stdout => "stdout",
                SinkKind::Null => "null",
            },
        );
        push("kafka-brokers", &self.kafka.brokers);
        let file = self.kafka.property_file.as_ref();
        for (i, (k, v)) in self.kafka.properties.iter().enumerate() {
            if let Some(f) = file.filter(|f| f.range.start == i) {
                push("kafka-property-file", &f.path.display().to_string());
            }
            if file.is_some_and(|f| f.range.contains(&i)) {
                continue;
            }
            push("kafka-property", &format!("{k}={}", crate::sink::kafka_client::shown(k, v)));
        }
        if let Some(f) = file.filter(|f| f.range.start == self.kafka.properties.len()) {
            push("kafka-property-file", &f.path.display().to_string());
        }
        push("topic-partitions", &self.kafka.topic_partitions.to_string());
        push("topic-replication-factor", &self.kafka.topic_replication_factor.to_string());
        let r = &self.route;
        push("route-by-field", &r.route_by_field);
        push("route-topic-regex", r.topic.regex_text());
        push("route-topic-replacement", r.topic.replacement_text());
        push("route-tombstone-on-empty-payload", &r.tombstone_on_empty_payload.to_string());
        push("table-field-event-id", &r.id_field);
        push("table-field-event-key", &r.key_field);
        push("table-field-event-type", &r.type_field);
        push("table-field-event-payload", &r.payload_field);
        push("table-field-event-timestamp", r.timestamp_field.as_deref().unwrap_or(""));
        let placements: Vec<String> = r
            .placements
            .iter()
            .map(|p| match &p.target {
                crate::router::PlacementTarget::Header(a) => format!("{}:header:{a}", p.column),
                crate::router::PlacementTarget::Envelope(a) => format!("{}:envelope:{a}", p.column),
                crate::router::PlacementTarget::Partition => format!("{}:partition", p.column),
            })
            .collect();
        push("table-fields-additional-placement", &placements.join(","));
        push(
            "table-field-additional-missing",
            if r.additional_missing == MissingPolicy::Error { "error" } else { "ignore" },
        );
        push(
            "table-op-invalid-behavior",
            match self.op_invalid {
                InvalidOp::Warn => "warn",
                InvalidOp::Error => "error",
                InvalidOp::Fatal => "fatal",
            },
        );
        push("table-expand-json-payload", &r.expand_json_payload.to_string());
        match &r.headers_field {
            HeadersField::IfPresent(_) => {}
            HeadersField::Required(c) => push("table-field-event-headers", c),
            HeadersField::Disabled => push("table-field-event-headers", ""),
        }
        push("max-in-flight", &self.max_in_flight.to_string());
        push("status-interval", &format!("{}ms", self.status_interval.as_millis()));
        push("shutdown-timeout", &format!("{}ms", self.shutdown_timeout.as_millis()));
        push("wal-receiver-timeout", &format!("{}ms", self.wal_receiver_timeout.as_millis()));
        push("log-format", if self.log_format == LogFormat::Json { "json" } else { "text" });
        push("metrics-addr", &self.metrics_addr.map_or("off".to_owned(), |a| a.to_string()));
        push(
            "on-bad-event",
            match self.on_bad_event {
                BadEventPolicy::Fail => "fail",
                BadEventPolicy::Dlq => "dlq",
                BadEventPolicy::Skip => "skip",
            },
        );
        push("dlq-topic", &self.dlq_topic);
        push("heartbeat-interval", &format!("{}ms", self.heartbeat_interval.as_millis()));
        if let Some(q) = &self.heartbeat_action_query {
            push("heartbeat-action-query", q);
        }
        push("lag-poll-interval", &format!("{}ms", self.lag_poll_interval.as_millis()));
        push("reconnect-max-backoff", &format!("{}ms", self.reconnect_max_backoff.as_millis()));
        f
    }
}

/// Single-quote for a POSIX shell when needed.
fn shell_quote(v: &str) -> String {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@".contains(&b)) {
        v.to_owned()
    } else {
        format!("'{}'", v.replace('\'', "'\\''"))
    }
}

/// Set every field the overlay names, unless the user set it explicitly.
fn apply_overlay(a: &mut RunArgs, o: &debezium::Overlay, explicit: &dyn Fn(&str) -> bool) -> Result<(), Definite> {
    let bad = |id: &str, v: &str| Definite::Config(format!("--debezium-config: value {v:?} for {id} is not valid"));
    let boolean = |id: &str, v: &str| match v.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(bad(id, v)),
    };
    let mut replaced_tables = false;
    // Producer settings merge under the flags instead of yielding to any one of them: a
    // `--kafka-property linger.ms=1` must not drop the file's SASL settings.
    a.debezium_kafka_properties =
        o.values.iter().filter(|(id, _)| *id == "kafka_properties").map(|(_, v)| v.clone()).collect();
    for (id, v) in &o.values {
        if explicit(id) || *id == "kafka_properties" {
            continue;
        }
        let v = v.clone();
        match *id {
            "postgres_url" => a.postgres_url = Some(v),
            "slot" => a.slot = v,
            "publication" => a.publication = v,
            "publication_autocreate" => {
                a.publication_autocreate = PublicationAutocreate::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            "tables" => {
                if !replaced_tables {
                    a.tables.clear();
                    replaced_tables = true;
                }
                a.tables.push(v);
            }
            "kafka_brokers" => a.kafka_brokers = v,
            "heartbeat_interval" => a.heartbeat_interval = v,
            "heartbeat_action_query" => a.heartbeat_action_query = Some(v),
            "table_field_event_id" => a.table_field_event_id = v,
            "table_field_event_key" => a.table_field_event_key = v,
            "table_field_event_type" => a.table_field_event_type = v,
            "table_field_event_payload" => a.table_field_event_payload = v,
            "table_field_event_timestamp" => a.table_field_event_timestamp = v,
            "table_fields_additional_placement" => a.table_fields_additional_placement = v,
            "table_field_additional_missing" => {
                a.table_field_additional_missing = MissingPolicy::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            "route_by_field" => a.route_by_field = v,
            "route_topic_regex" => a.route_topic_regex = v,
            "route_topic_replacement" => a.route_topic_replacement = v,
            "route_tombstone_on_empty_payload" => a.route_tombstone_on_empty_payload = boolean(id, &v)?,
            "table_op_invalid_behavior" => {
                a.table_op_invalid_behavior = InvalidOp::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            "table_expand_json_payload" => a.table_expand_json_payload = boolean(id, &v)?,
            "table_field_event_headers" => a.table_field_event_headers = Some(v),
            other => return Err(Definite::Bug(format!("debezium overlay names unknown flag {other}"))),
        }
    }
    Ok(())
}

fn check_identifier(flag: &str, v: &str, slot: bool) -> Result<(), Definite> {
    let ok = !v.is_empty()
        && v.len() <= 63
        && if slot {
            v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        } else {
            !v.contains('\0')
        };
    if ok {
        Ok(())
    } else if slot {
        Err(Definite::Config(format!("{flag} {v:?}: slot names are 1-63 characters of a-z, 0-9 and _")))
    } else {
        Err(Definite::Config(format!("{flag} {v:?}: must be 1-63 characters")))
    }
}

fn parse_table(s: &str) -> Result<TableName, Definite> {
    match s.split_once('.') {
        Some((schema, name)) if !schema.is_empty() && !name.is_empty() && !name.contains('.') => {
            Ok(TableName { schema: schema.to_owned(), name: name.to_owned() })
        }
        _ => Err(Definite::Config(format!("--table {s:?}: expected SCHEMA.TABLE, e.g. public.outbox"))),
    }
}

/// `500ms`, `10s`, `2m`, `1h`; a bare number is seconds.
pub fn parse_duration(flag: &str, s: &str) -> Result<Duration, Definite> {
    let bad = || Definite::Config(format!("{flag} {s:?}: expected a duration like 500ms, 10s or 2m"));
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let d = |s| parse_duration("--x", s);
        assert_eq!(d("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(d("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(d("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(d("7").unwrap(), Duration::from_secs(7));
        for s in ["", "s", "10x", "-1s", "1.5s"] {
            let e = d(s).unwrap_err().to_string();
            assert!(e.contains("--x") && e.contains("500ms"), "{e}");
        }
    }

    #[test]
    fn table_and_identifiers() {
        assert_eq!(parse_table("public.outbox").unwrap().to_string(), "public.outbox");
        assert!(parse_table("outbox").is_err());
        assert!(check_identifier("--slot", "Bad-Slot", true).is_err());
        assert!(check_identifier("--slot", "outboxd_1", true).is_ok());
    }

    #[test]
    fn cli_defaults_validate() {
        let cli = Cli::try_parse_from(["outboxd", "run", "--postgres-url", "postgres://u@127.0.0.1/db"]).unwrap();
        let Command::Run(a) = cli.command else { panic!("run") };
        let c = Config::from_args(&a).unwrap();
        assert_eq!(c.slot, "outboxd");
        assert_eq!(c.tables[0].to_string(), "public.outbox");
        assert_eq!(c.status_interval, Duration::from_secs(10));
        assert_eq!(c.max_in_flight, 10_000);
        assert_eq!(c.route.timestamp_field.as_deref(), Some("created_at"));
    }

    #[test]
    fn kafka_property_conflicts_are_rejected() {
        let cli = Cli::try_parse_from([
            "outboxd",
            "run",
            "--postgres-url",
            "postgres://u@h/db",
            "--kafka-property",
            "bootstrap.servers=x:1",
        ])
        .unwrap();
        let Command::Run(a) = cli.command else { panic!("run") };
        assert!(Config::from_args(&a).unwrap_err().to_string().contains("--kafka-brokers"));
    }
}
