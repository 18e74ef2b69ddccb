//! `outboxd inbox`'s flags ([`InboxArgs`]) and the settings they validate into ([`InboxConfig`]).
//!
//! The command reads Kafka and writes the consumer's PostgreSQL, so it takes Kafka's client group
//! ([`KafkaClientArgs`], the `dlq` and `shadow` tools' too: brokers, `--kafka-property`,
//! `--kafka-property-file` for TLS and SASL secrets) and PostgreSQL's connection flags with the
//! same names and environment variables as `run` (the conninfo is parsed by [`PgTarget`], so
//! everything libpq offers, and the password never shows). Its own flags are `OUTBOXD_INBOX_*`.
//!
//! Invariant: nothing downstream re-validates; a bad value is a one-line error naming the flag and
//! the fix, before a connection is made. The inbox table's name is a plain lowercase identifier
//! (optionally schema-qualified), because the SQL file's object names are derived from it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::groups::{RegistryArgs, StatusPageArgs};
use super::{LogFormat, PgTarget};
use crate::error::Definite;
use crate::format::RegistryConfig;
use crate::sink::kafka::config::{KafkaClientArgs, KafkaConfig};
use crate::units::parse_duration;

/// Where a partition with no offset stored in PostgreSQL starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StartFrom {
    /// The oldest record Kafka still holds.
    Earliest,
    /// Records appended after the partition was first assigned.
    Latest,
    /// The offset the Kafka group (`--group`) has committed for the partition, else the oldest
    /// record: the migration path from a consumer that used the same group (docs/src/inbox.md);
    /// only while PostgreSQL holds no offset of the group at all (else the oldest record).
    Committed,
}

/// How record values are read into `payload_json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ValueFormat {
    /// The value's bytes, when they are one JSON document (else `payload_json` is NULL).
    Json,
    /// Confluent wire format, Avro (AvroConverter, `outboxd run --value-converter avro`).
    Avro,
    /// Confluent wire format, Protobuf (ProtobufConverter).
    Protobuf,
    /// Confluent wire format, JSON Schema (JsonSchemaConverter).
    JsonSchema,
}

/// Flags of `outboxd inbox`.
#[derive(Debug, Clone, clap::Args)]
pub struct InboxArgs {
    #[command(flatten)]
    pub kafka: KafkaClientArgs,
    /// The consumer's PostgreSQL conninfo (URL or key=value pairs), where the inbox table lives.
    #[arg(long, env = "OUTBOXD_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// File holding the PostgreSQL password (one trailing newline is ignored), so it is not in argv.
    #[arg(long, env = "OUTBOXD_POSTGRES_PASSWORD_FILE")]
    pub postgres_password_file: Option<PathBuf>,
    /// Topics to read, comma-separated.
    #[arg(long, env = "OUTBOXD_INBOX_TOPICS", value_delimiter = ',', conflicts_with = "topic_pattern")]
    pub topics: Vec<String>,
    /// Read every topic whose name matches this regex whole; a topic created later is picked up
    /// at the next metadata refresh (topic.metadata.refresh.interval.ms, 30 s here unless
    /// --kafka-property sets it). A POSIX extended regex, as librdkafka takes it: no (?:...) and
    /// no \d (write [0-9]).
    #[arg(long, env = "OUTBOXD_INBOX_TOPIC_PATTERN", value_name = "REGEX")]
    pub topic_pattern: Option<String>,
    /// The inbox table, as [SCHEMA.]TABLE (lowercase letters, digits, _); created with
    /// TABLE_offsets and the claim functions of sql/08_inbox.sql when missing.
    #[arg(long, env = "OUTBOXD_INBOX_TABLE", default_value = "public.inbox")]
    pub inbox_table: String,
    /// Kafka consumer group; also the key of the offsets stored beside the inbox table.
    #[arg(long, env = "OUTBOXD_INBOX_GROUP", default_value = "outboxd-inbox")]
    pub group: String,
    /// A header holding the event id, tried after `id` (which outboxd and Debezium's EventRouter
    /// send): the id is the `id` header, else this one (when it is another name), else
    /// TOPIC/PARTITION/OFFSET. The first of them a record carries decides; an empty one, or one
    /// not UTF-8, makes it a bad record.
    #[arg(long, env = "OUTBOXD_INBOX_EVENT_ID_HEADER", default_value = "id")]
    pub event_id_header: String,
    /// Header holding the event type, stored in the event_type column (NULL without it).
    #[arg(long, env = "OUTBOXD_INBOX_EVENT_TYPE_HEADER", default_value = "eventType")]
    pub event_type_header: String,
    /// Kafka topic that bad records are copied to, with the reason (`outboxd dlq` reads it): a
    /// record without a usable event id, or a row the inbox table refuses.
    #[arg(long, env = "OUTBOXD_DLQ_TOPIC", default_value = "outboxd.dlq")]
    pub dlq_topic: String,
    /// How record values become `payload_json`: `json` (the bytes, when they are JSON), or decoded
    /// from the Confluent wire format with the schema --schema-registry-url holds under the id
    /// each record carries: `avro`, `protobuf` or `json-schema`. The bytes stay in `payload`; a
    /// value that does not decode is dead-lettered; while the registry is away, the inbox waits.
    #[arg(long, env = "OUTBOXD_INBOX_VALUE_FORMAT", value_enum, default_value_t = ValueFormat::Json)]
    pub value_format: ValueFormat,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// With --value-format avro, protobuf or json-schema: how long a record whose schema id the
    /// registry does not know holds the inbox (readiness 503, asked again with backoff: it may be
    /// registered late) before it is dead-lettered as inbox_schema_missing; 0 dead-letters at once.
    #[arg(long, env = "OUTBOXD_INBOX_SCHEMA_MISSING_TIMEOUT", default_value = "5m", value_name = "DURATION")]
    pub schema_missing_timeout: String,
    /// After each PostgreSQL commit, and for the partitions an assignment hands over, also commit
    /// the stored next offsets to the group in Kafka (asynchronously, at most every 200 ms; a
    /// failed commit is sent again), for lag tools such as kafka-consumer-groups. PostgreSQL's
    /// offsets decide where a partition starts; the group's are read only by --start-from
    /// committed, for a partition with none in PostgreSQL, and are then the same. Costs one
    /// OffsetCommit request to the group coordinator per 200 ms while records arrive.
    #[arg(long, env = "OUTBOXD_INBOX_COMMIT_KAFKA_OFFSETS", num_args = 0..=1, default_value = "true", default_missing_value = "true", value_name = "BOOL")]
    pub commit_kafka_offsets: bool,
    /// Most records written in one PostgreSQL transaction.
    #[arg(long, env = "OUTBOXD_INBOX_BATCH_SIZE", default_value_t = 500)]
    pub batch_size: usize,
    /// Longest a record waits for its batch to fill before the batch is written.
    #[arg(long, env = "OUTBOXD_INBOX_BATCH_TIMEOUT", default_value = "20ms", value_name = "DURATION")]
    pub batch_timeout: String,
    /// Where a partition with no offset stored in PostgreSQL starts: `earliest`, `latest`, or
    /// `committed`: the offset the group (--group) has committed in Kafka, else the earliest (to
    /// take over from a consumer that used that group). The start is stored in PostgreSQL at the
    /// assignment; from then on, and for every partition with a stored offset, PostgreSQL's
    /// offset decides and the group's Kafka offsets are not read.
    #[arg(long, env = "OUTBOXD_INBOX_START_FROM", value_enum, default_value_t = StartFrom::Earliest)]
    pub start_from: StartFrom,
    /// Delete processed rows this long after they were processed (every minute); left out,
    /// processed rows stay. Rows younger than --dedupe-window stay in any case.
    #[arg(long, env = "OUTBOXD_INBOX_RETAIN", value_name = "DURATION")]
    pub retain: Option<String>,
    /// How long after it arrived a row's event id must still deduplicate (a late copy of the
    /// event, e.g. a replay); at least the longest a producer may send an event again.
    #[arg(long, env = "OUTBOXD_INBOX_DEDUPE_WINDOW", default_value = "168h", value_name = "DURATION")]
    pub dedupe_window: String,
    /// Serve /metrics, /healthz, /readyz and the status page (/ and /status.json) on this address;
    /// `off` disables.
    #[arg(long, env = "OUTBOXD_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_addr: String,
    // `run`'s `--status-page-token-file` and `--status-page-allowed-hosts`, the same group.
    #[command(flatten)]
    pub status_page: StatusPageArgs,
    /// /healthz answers 503 once the Kafka consumer's loop or the PostgreSQL writer's has made no
    /// progress this long (a wedge; a PostgreSQL or Kafka outage is readiness, not this); 0 disables.
    #[arg(long, env = "OUTBOXD_HEALTH_STALL_TIMEOUT", default_value = "120s", value_name = "DURATION")]
    pub health_stall_timeout: String,
    /// Longest wait between attempts to reach PostgreSQL again.
    #[arg(long, env = "OUTBOXD_RECONNECT_MAX_BACKOFF", default_value = "30s")]
    pub reconnect_max_backoff: String,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// `outboxd inbox`'s settings, validated.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    pub kafka: KafkaConfig,
    pub postgres: PgTarget,
    /// Either the topics, or a regex (anchored, as librdkafka's `^` subscriptions take it).
    pub subscription: Subscription,
    /// Schema and table, each a plain lowercase identifier.
    pub schema: String,
    pub table: String,
    pub group: String,
    pub event_id_header: String,
    pub event_type_header: String,
    pub dlq_topic: String,
    /// `--value-format` avro, protobuf or json-schema: the registry (`value` set) to decode with.
    pub registry: Option<RegistryConfig>,
    /// `--schema-missing-timeout`.
    pub schema_missing_timeout: Duration,
    /// `--commit-kafka-offsets`.
    pub commit_kafka_offsets: bool,
    pub batch_size: usize,
    pub batch_timeout: Duration,
    pub start_from: StartFrom,
    /// `--retain`: `None` keeps processed rows.
    pub retain: Option<Duration>,
    pub dedupe_window: Duration,
    pub metrics_addr: Option<SocketAddr>,
    /// `--status-page-token-file`: the page's token (shown as its file only).
    pub status_page_token: Option<crate::format::Password>,
    /// `--status-page-allowed-hosts`: Host names the page answers besides localhost and IPs.
    pub status_page_allowed_hosts: Vec<String>,
    /// `/healthz` fails after this long without progress (zero: never).
    pub health_stall_timeout: Duration,
    pub reconnect_max_backoff: Duration,
    pub log_format: LogFormat,
}

/// What the consumer subscribes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subscription {
    Topics(Vec<String>),
    /// librdkafka's regex subscription: `^(REGEX)$`, the user's regex matched whole.
    Pattern(String),
}

impl InboxConfig {
    pub fn from_args(a: &InboxArgs) -> Result<InboxConfig, Definite> {
        let kafka = KafkaConfig::for_tool(&a.kafka)?;
        let url = a.postgres_url.as_deref().unwrap_or_default();
        let fallbacks = super::postgres::Fallbacks {
            password_file: a.postgres_password_file.as_deref(),
            ..super::postgres::Fallbacks::process()
        };
        let postgres = PgTarget::parse_with(url, &fallbacks)?;
        let subscription = subscription(&a.topics, a.topic_pattern.as_deref())?;
        let (schema, table) = table_name(&a.inbox_table)?;
        if a.group.trim().is_empty() {
            return Err(Definite::Config("--group is empty; name the consumer group, e.g. orders-inbox".into()));
        }
        for (flag, v) in [
            ("--event-id-header", &a.event_id_header),
            ("--event-type-header", &a.event_type_header),
            ("--dlq-topic", &a.dlq_topic),
        ] {
            if v.trim().is_empty() {
                return Err(Definite::Config(format!("{flag} is empty; give a name, e.g. the default")));
            }
        }
        if a.batch_size == 0 || a.batch_size > 10_000 {
            return Err(Definite::Config(format!(
                "--batch-size {}: expected 1 to 10000 records per PostgreSQL transaction",
                a.batch_size
            )));
        }
        let metrics_addr = match a.metrics_addr.trim() {
            "off" | "" => None,
            s => Some(s.parse().map_err(|_| {
                Definite::Config(format!("--metrics-addr {s:?}: expected HOST:PORT such as 127.0.0.1:9464, or off"))
            })?),
        };
        let registry = registry(a.value_format, &a.registry)?;
        let (status_page_token, status_page_allowed_hosts) = super::validate::status_page_access(&a.status_page)?;
        Ok(InboxConfig {
            kafka,
            postgres,
            subscription,
            schema,
            table,
            group: a.group.clone(),
            event_id_header: a.event_id_header.clone(),
            event_type_header: a.event_type_header.clone(),
            dlq_topic: a.dlq_topic.clone(),
            registry,
            schema_missing_timeout: parse_duration("--schema-missing-timeout", &a.schema_missing_timeout)?,
            commit_kafka_offsets: a.commit_kafka_offsets,
            batch_size: a.batch_size,
            batch_timeout: parse_duration("--batch-timeout", &a.batch_timeout)?,
            start_from: a.start_from,
            retain: a.retain.as_deref().map(|r| parse_duration("--retain", r)).transpose()?,
            dedupe_window: parse_duration("--dedupe-window", &a.dedupe_window)?,
            metrics_addr,
            status_page_token,
            status_page_allowed_hosts,
            health_stall_timeout: stall_timeout(&a.health_stall_timeout)?,
            reconnect_max_backoff: parse_duration("--reconnect-max-backoff", &a.reconnect_max_backoff)?,
            log_format: a.log_format,
        })
    }
}

/// `--value-format` with `--schema-registry-*`: a registry format needs the URL, and the URL (or
/// its credentials) without one is refused rather than ignored.
fn registry(format: ValueFormat, a: &RegistryArgs) -> Result<Option<RegistryConfig>, Definite> {
    use crate::format::Format;
    let value = match format {
        ValueFormat::Json => None,
        ValueFormat::Avro => Some(Format::Avro),
        ValueFormat::Protobuf => Some(Format::Protobuf),
        ValueFormat::JsonSchema => Some(Format::JsonSchema),
    };
    let url = a.schema_registry_url.as_deref().filter(|u| !u.trim().is_empty());
    let given = url.is_some()
        || a.schema_registry_user.is_some()
        || a.schema_registry_password_file.is_some()
        || a.schema_registry_ca_file.is_some();
    match (value, url) {
        (None, _) if given => Err(Definite::Config(
            "--schema-registry-* has no effect with --value-format json; add --value-format avro, protobuf or \
             json-schema, or drop the registry flags"
                .into(),
        )),
        (None, _) => Ok(None),
        (Some(_), None) => Err(Definite::Config(
            "--value-format avro, protobuf and json-schema need --schema-registry-url (the registry holding the \
             schemas the records' ids name)"
                .into(),
        )),
        (Some(f), Some(url)) => {
            let cfg = RegistryConfig { value: Some(f), ..super::validate::registry_connection(a, url)? };
            // The CA file is read and parsed now, so the consumer never meets a bad one.
            crate::format::registry::Registry::new(&cfg).map_err(Definite::Config)?;
            Ok(Some(cfg))
        }
    }
}

/// The shortest `--health-stall-timeout` but 0: longer than the loops' one-second turns and than
/// the consumer thread's longest gap between beats (a watermark fetch and its pause).
pub const MIN_STALL: Duration = Duration::from_secs(5);

/// `--health-stall-timeout`: zero, or at least [`MIN_STALL`].
fn stall_timeout(s: &str) -> Result<Duration, Definite> {
    let d = parse_duration("--health-stall-timeout", s)?;
    if !d.is_zero() && d < MIN_STALL {
        return Err(Definite::Config(format!(
            "--health-stall-timeout {s}: expected 0 (off) or at least 5s (the loops turn about once a second)"
        )));
    }
    Ok(d)
}

fn subscription(topics: &[String], pattern: Option<&str>) -> Result<Subscription, Definite> {
    let topics: Vec<String> = topics.iter().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()).collect();
    match (topics.is_empty(), pattern) {
        (true, None) => Err(Definite::Config("no topic to read: give --topics LIST or --topic-pattern REGEX".into())),
        (false, Some(_)) => Err(Definite::Config("give --topics or --topic-pattern, not both".into())),
        (false, None) => Ok(Subscription::Topics(topics)),
        (true, Some(p)) => {
            regex::Regex::new(p)
                .map_err(|e| Definite::Config(format!("--topic-pattern {p:?} is not a valid regex: {e}")))?;
            // librdkafka compiles the subscription as a POSIX extended regex (regcomp): no
            // `(?...)` groups, and `\d` would quietly mean a plain `d` there.
            if p.contains("(?") || p.contains("\\d") || p.contains("\\D") {
                return Err(Definite::Config(format!(
                    "--topic-pattern {p:?}: librdkafka takes a POSIX extended regex; write (...) for (?:...), \
                     [0-9] for \\d"
                )));
            }
            Ok(Subscription::Pattern(format!("^({p})$")))
        }
    }
}

/// `[schema.]table`, each part a plain lowercase identifier of at most 50 bytes (the derived
/// names, `TABLE_offsets` and `TABLE_unprocessed_idx`, must stay within PostgreSQL's 63).
fn table_name(s: &str) -> Result<(String, String), Definite> {
    let (schema, table) = s.split_once('.').unwrap_or(("public", s));
    let plain = |p: &str| {
        !p.is_empty()
            && p.len() <= 50
            && p.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    if !plain(schema) || !plain(table) {
        return Err(Definite::Config(format!(
            "--inbox-table {s:?}: expected [SCHEMA.]TABLE in lowercase letters, digits and _ (at most 50 each), \
             e.g. public.inbox"
        )));
    }
    Ok((schema.to_owned(), table.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        assert_eq!(table_name("inbox").unwrap(), ("public".into(), "inbox".into()));
        assert_eq!(table_name("billing.inbox_2").unwrap(), ("billing".into(), "inbox_2".into()));
        for bad in ["", "Inbox", "a.b.c", "in box", "x;drop", ".inbox", "9inbox"] {
            assert!(table_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_stall_timeout_is_off_or_at_least_five_seconds() {
        assert_eq!(stall_timeout("0").unwrap(), Duration::ZERO);
        assert_eq!(stall_timeout("120s").unwrap(), Duration::from_secs(120));
        let e = stall_timeout("1s").unwrap_err().to_string();
        assert!(e.contains("--health-stall-timeout 1s") && e.contains("at least 5s"), "{e}");
    }

    #[test]
    fn a_registry_format_needs_the_url_and_the_url_needs_a_registry_format() {
        let none = RegistryArgs {
            schema_registry_url: None,
            schema_registry_user: None,
            schema_registry_password_file: None,
            schema_registry_ca_file: None,
        };
        let url = |u: &str| RegistryArgs { schema_registry_url: Some(u.into()), ..none.clone() };
        assert_eq!(registry(ValueFormat::Json, &none).unwrap(), None);
        let e = registry(ValueFormat::Avro, &none).unwrap_err().to_string();
        assert!(e.contains("need --schema-registry-url"), "{e}");
        let e = registry(ValueFormat::Json, &url("http://r:8081")).unwrap_err().to_string();
        assert!(e.contains("no effect with --value-format json"), "{e}");
        let e = registry(ValueFormat::Protobuf, &url("http://u:secret@r:8081")).unwrap_err().to_string();
        assert!(e.contains("credentials in the URL") && !e.contains("secret"), "{e}");
        let c = registry(ValueFormat::JsonSchema, &url("https://r:8081/apis/ccompat/v7")).unwrap().unwrap();
        assert_eq!(c.value, Some(crate::format::Format::JsonSchema));
        assert_eq!(c.url.as_str(), "https://r:8081/apis/ccompat/v7");
    }

    #[test]
    fn one_of_topics_or_pattern() {
        assert!(subscription(&[], None).is_err());
        assert!(subscription(&["a".into()], Some("b")).is_err());
        assert!(subscription(&[], Some("(")).is_err());
        assert_eq!(subscription(&[" a ".into(), "".into()], None).unwrap(), Subscription::Topics(vec!["a".into()]));
        assert_eq!(subscription(&[], Some("orders\\..*")).unwrap(), Subscription::Pattern("^(orders\\..*)$".into()));
        assert_eq!(subscription(&[], Some("a|b")).unwrap(), Subscription::Pattern("^(a|b)$".into()));
        for perl in ["(?:a|b)", "orders\\.v\\d", "(?i)orders"] {
            let e = subscription(&[], Some(perl)).unwrap_err().to_string();
            assert!(e.contains("POSIX extended"), "{perl}: {e}");
        }
    }
}
