//! Raw flags to a validated [`Config`]: every value typed, every bad combination rejected with a
//! one-line message that names the flag and the fix. Runtime code never re-validates.
//!
//! [`Config::from_flags`] is a composition: one function per group (the sinks' in
//! [`super::sinks`] and each sink's folder, the poll loop's in [`super::poll`]); the checks that
//! span groups (exactly-once and the sink, the stall timeout and the status interval) sit with
//! the group that owns the later flag.

use std::sync::Arc;
use std::time::Duration;

use super::{
    debezium, postgres, BudgetArgs, Config, Flags, PgTarget, PollConfig, ProcessArgs, Relaying, RouteArgs, SourceArgs,
    StatusPageArgs, TableName,
};
use crate::error::Definite;
use crate::router::contract::{Contracts, SchemaMissing};
use crate::router::mask::{MaskSpec, Masking};
use crate::router::{HeadersField, Placement, PlacementTarget, RouteConfig, TopicRule};
use crate::units::{parse_duration, parse_size};

impl Config {
    /// Like [`Config::from_args`], first merging `--debezium-config` under the flags for which
    /// `explicit(arg_id)` says the user gave a value (command line or environment).
    pub fn from_args_with_file<A: Relaying + ?Sized>(
        a: &A,
        explicit: &dyn Fn(&str) -> bool,
    ) -> Result<Config, Definite> {
        let mut merged = a.flags()?;
        let Some(path) = merged.source.debezium_config.clone() else { return Config::from_flags(&merged) };
        let overlay = debezium::load(&path)?;
        debezium::apply(&mut merged, &overlay, explicit)?;
        let mut cfg = Config::from_flags(&merged)?;
        cfg.require_empty_tables = overlay.require_empty_tables;
        cfg.key_change_events = true;
        cfg.notes = overlay.notes;
        Ok(cfg)
    }

    /// A command's flags, validated (without `--debezium-config`).
    pub fn from_args<A: Relaying + ?Sized>(a: &A) -> Result<Config, Definite> {
        Config::from_flags(&a.flags()?)
    }

    /// Every group validated in turn (each rejects its own bad values), then combined.
    pub fn from_flags(a: &Flags) -> Result<Config, Definite> {
        let postgres = postgres_target(a)?;
        check_identifier("--slot", &a.wal.slot, true)?;
        check_identifier("--publication", &a.wal.publication, false)?;
        let (tables, messages_prefixes) = sources(a)?;
        let s = super::sinks::validate(&a.sinks, a.delivery.as_ref(), &a.debezium_kafka_properties, &a.wal.slot)?;
        let budget = budget(&a.budget)?;
        let (route, mask) = route(&a.source, &a.route)?;
        let registry = registry_config(&a.route)?;
        let process = &a.process;
        let status_interval = positive("--status-interval", &process.status_interval)?;
        let (status_page_token, status_page_allowed_hosts) = status_page_access(&process.status_page)?;
        let wal = &a.wal;
        Ok(Config {
            postgres,
            slot: wal.slot.clone(),
            publication: wal.publication.clone(),
            tables,
            messages_prefixes,
            publication_autocreate: wal.publication_autocreate,
            route,
            registry,
            otlp_endpoint: otlp_endpoint(process.otlp_endpoint.as_deref())?,
            op_invalid: wal.table_op_invalid_behavior,
            sink: s.sink,
            kafka: s.kafka,
            nats: s.nats,
            aws: s.aws,
            sqs: s.sqs,
            sns: s.sns,
            kinesis: s.kinesis,
            redis: s.redis,
            rabbitmq: s.rabbitmq,
            http: s.http,
            url_files: s.url_files,
            max_in_flight: budget.0,
            max_in_flight_bytes: budget.1,
            health_stall_timeout: health_stall_timeout(process, status_interval)?,
            status_interval,
            shutdown_timeout: parse_duration("--shutdown-timeout", &process.shutdown_timeout)?,
            wal_receiver_timeout: parse_duration("--wal-receiver-timeout", &wal.wal_receiver_timeout)?,
            log_format: process.log_format,
            metrics_addr: metrics_addr(&process.metrics_addr)?,
            status_page_token,
            status_page_allowed_hosts,
            on_bad_event: a.sinks.on_bad_event,
            delivery: s.delivery,
            dlq_sink: s.dlq_sink,
            dlq_topic: dlq_topic(&a.sinks.dlq_topic)?,
            heartbeat_interval: parse_duration("--heartbeat-interval", &wal.heartbeat_interval)?,
            heartbeat_action_query: wal.heartbeat_action_query.clone().filter(|q| !q.trim().is_empty()),
            lag_poll_interval: positive("--lag-poll-interval", &process.lag_poll_interval)?,
            mask,
            poll: PollConfig::from_args(&a.poll)?,
            require_empty_tables: false,
            key_change_events: false,
            debezium_offsets: match &wal.debezium_offsets {
                Some(path) => Some((path.clone(), debezium::offsets::DebeziumOffset::load(path)?)),
                None => None,
            },
            notes: Vec::new(),
            reconnect_max_backoff: parse_duration("--reconnect-max-backoff", &process.reconnect_max_backoff)?
                .max(Duration::from_millis(100)),
            standby_retry_interval: positive("--standby-retry-interval", &wal.standby_retry_interval)?,
            slot_failover: wal.slot_failover,
            slot_recreate_after_loss: wal.slot_recreate_after_loss,
        })
    }
}

fn bad(m: String) -> Definite {
    Definite::Config(m)
}

/// `--postgres-url` (or libpq's environment) and `--postgres-password-file`.
fn postgres_target(a: &Flags) -> Result<PgTarget, Definite> {
    // Without --postgres-url, libpq's environment alone may say where to go (PGHOST, ...).
    let url = a.source.postgres_url.as_deref().unwrap_or("");
    if url.is_empty() && std::env::var_os("PGHOST").is_none() {
        return Err(bad(
            "--postgres-url (or OUTBOXD_POSTGRES_URL, or PGHOST) is required, e.g. postgres://user@host:5432/db".into(),
        ));
    }
    let fallbacks = postgres::Fallbacks {
        password_file: a.source.postgres_password_file.as_deref(),
        ..postgres::Fallbacks::process()
    };
    PgTarget::parse_with(url, &fallbacks)
}

/// The `--table`s and `--messages-prefix`es: at least one of them names where events come from
/// (a table, for the commands that do not read the slot).
fn sources(a: &Flags) -> Result<(Vec<TableName>, Vec<String>), Definite> {
    let mut tables = Vec::new();
    // `--table ''` names no table: a relay of logical messages only.
    for t in a.source.tables.iter().filter(|t| !t.is_empty()) {
        let t = parse_table(t)?;
        if !tables.contains(&t) {
            tables.push(t);
        }
    }
    if !a.reads_wal {
        // poll and backfill read tables; a Debezium file's message prefixes do not apply.
        if tables.is_empty() {
            return Err(bad("--table is empty: name an outbox table (SCHEMA.TABLE); outboxd poll and backfill read \
                 tables (logical messages reach only outboxd run, through the slot)"
                .into()));
        }
        return Ok((tables, Vec::new()));
    }
    let messages_prefixes = check_prefixes(&a.wal.messages_prefixes)?;
    if tables.is_empty() && messages_prefixes.is_empty() {
        return Err(bad(
            "--table is empty and no --messages-prefix is given: name an outbox table (SCHEMA.TABLE) or a message prefix"
                .into(),
        ));
    }
    Ok((tables, messages_prefixes))
}

/// `--max-in-flight` and `--max-in-flight-bytes`.
fn budget(a: &BudgetArgs) -> Result<(usize, usize), Definite> {
    if a.max_in_flight == 0 {
        return Err(bad("--max-in-flight must be at least 1".into()));
    }
    let bytes = parse_size("--max-in-flight-bytes", &a.max_in_flight_bytes)?;
    if bytes < 1024 {
        return Err(bad(format!("--max-in-flight-bytes {:?} must be at least 1KiB", a.max_in_flight_bytes)));
    }
    Ok((a.max_in_flight, bytes))
}

/// The table's columns and the routing flags as a [`RouteConfig`], with the compiled masking.
fn route(src: &SourceArgs, r: &RouteArgs) -> Result<(RouteConfig, Masking), Definite> {
    for (flag, v) in [
        ("--route-by-field", &r.route_by_field),
        ("--table-field-event-key", &src.table_field_event_key),
        ("--table-field-event-id", &src.table_field_event_id),
        ("--table-field-event-payload", &src.table_field_event_payload),
    ] {
        if v.is_empty() {
            return Err(bad(format!("{flag} must name a column of the outbox table")));
        }
    }
    let topic = TopicRule::new(&r.route_topic_regex, &r.route_topic_replacement).map_err(bad)?;
    let placements = match src.table_fields_additional_placement.as_deref() {
        None => Vec::new(),
        Some(p) => Placement::parse_list(p).map_err(|e| bad(format!("--table-fields-additional-placement {e}")))?,
    };
    let column = |given: Option<&str>, default: &str| match given {
        None => HeadersField::IfPresent(default.into()),
        Some("") => HeadersField::Disabled,
        Some(c) => HeadersField::Required(c.into()),
    };
    // Compiled here, once: `run` uses this set, and `outboxd config` proves every file compiles.
    let contracts = match &r.schema_dir {
        Some(dir) => Some(Contracts::load(dir, r.schema_missing).map_err(bad)?),
        None if r.schema_missing == SchemaMissing::Reject => {
            return Err(bad("--schema-missing reject needs --schema-dir DIR (the schemas to require)".into()))
        }
        None => None,
    };
    let envelope = placements.iter().any(|p| matches!(p.target, PlacementTarget::Envelope(_)));
    let mask = Masking::compile(
        MaskSpec {
            masks: r.masks.clone(),
            encrypt: r.encrypt.clone(),
            mask_key_file: r.mask_key_file.clone(),
            encrypt_key_file: r.encrypt_key_file.clone(),
            event_type: r.mask_event_type.clone(),
        },
        envelope,
    )
    .map_err(bad)?;
    if r.value_converter == crate::router::Converter::Json && envelope {
        if src.table_expand_json_payload {
            return Err(bad("--value-converter json with an envelope placement and --table-expand-json-payload: Debezium expands the payload into a Connect struct inside its envelope, whose JSON outboxd does not reproduce; drop one of them, or use --value-converter string".into()));
        }
        if !mask.is_empty() {
            return Err(bad("--value-converter json with an envelope placement and --mask/--encrypt: the payload inside that envelope is a JSON string the masking rules cannot reach; use --value-converter string with --mask/--encrypt".into()));
        }
    }
    let route = RouteConfig {
        id_field: src.table_field_event_id.clone(),
        key_field: src.table_field_event_key.clone(),
        type_field: src.table_field_event_type.clone(),
        payload_field: src.table_field_event_payload.clone(),
        timestamp_field: Some(src.table_field_event_timestamp.clone()).filter(|s| !s.is_empty()),
        placements,
        additional_missing: src.table_field_additional_missing,
        route_by_field: r.route_by_field.clone(),
        topic: Arc::new(topic),
        tombstone_on_empty_payload: r.route_tombstone_on_empty_payload,
        expand_json_payload: src.table_expand_json_payload,
        key_converter: r.key_converter,
        value_converter: r.value_converter,
        headers_field: column(src.table_field_event_headers.as_deref(), "headers"),
        trace_field: column(src.tracing_span_context_field.as_deref(), "tracingspancontext"),
        contracts,
        mapping: crate::router::placed::Mapping {
            time_precision: src.time_precision_mode,
            decimal: src.decimal_handling_mode,
            binary: src.binary_handling_mode,
            interval: src.interval_handling_mode,
        },
    };
    Ok((route, mask))
}

/// A duration flag that must be greater than zero.
fn positive(flag: &str, v: &str) -> Result<Duration, Definite> {
    let d = parse_duration(flag, v)?;
    if d.is_zero() {
        return Err(bad(format!("{flag} must be greater than 0")));
    }
    Ok(d)
}

/// `--health-stall-timeout`: 0, or more than twice `--status-interval` (a healthy loop turns at
/// least that often).
fn health_stall_timeout(p: &ProcessArgs, status_interval: Duration) -> Result<Duration, Definite> {
    let d = parse_duration("--health-stall-timeout", &p.health_stall_timeout)?;
    if !d.is_zero() && d <= status_interval * 2 {
        return Err(bad(format!(
            "--health-stall-timeout {} must exceed twice --status-interval {} (or be 0 to disable)",
            p.health_stall_timeout, p.status_interval
        )));
    }
    Ok(d)
}

/// `--otlp-endpoint`: an http(s) base URL, kept without its trailing `/`; empty: none.
fn otlp_endpoint(given: Option<&str>) -> Result<Option<String>, Definite> {
    match given {
        None | Some("") => Ok(None),
        Some(u) => match reqwest::Url::parse(u) {
            Ok(p) if matches!(p.scheme(), "http" | "https") => Ok(Some(u.trim_end_matches('/').to_owned())),
            _ => Err(bad(format!(
                "--otlp-endpoint {}: use the collector's OTLP/HTTP base URL, e.g. http://collector:4318",
                super::secret::mask_url(u)
            ))),
        },
    }
}

/// `--metrics-addr`: HOST:PORT, or `off` (or empty) for none.
fn metrics_addr(s: &str) -> Result<Option<std::net::SocketAddr>, Definite> {
    match s {
        "off" | "" => Ok(None),
        s => s
            .parse()
            .map(Some)
            .map_err(|_| bad(format!("--metrics-addr {s:?}: expected HOST:PORT like 127.0.0.1:9464, or off"))),
    }
}

/// `--dlq-topic`: a legal Kafka topic name (every sink's dead letters are read back by it).
fn dlq_topic(t: &str) -> Result<String, Definite> {
    if t.is_empty() || t.len() > 249 || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(bad(format!("--dlq-topic {t:?} is not a legal Kafka topic name")));
    }
    Ok(t.to_owned())
}

pub(super) fn check_identifier(flag: &str, v: &str, slot: bool) -> Result<(), Definite> {
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

/// `--messages-prefix` values: non-empty, without duplicates, never our own heartbeat prefix.
fn check_prefixes(raw: &[String]) -> Result<Vec<String>, Definite> {
    let mut out: Vec<String> = Vec::new();
    for p in raw {
        if p.is_empty() || p.contains('\0') {
            return Err(Definite::Config(format!(
                "--messages-prefix {p:?}: give the exact prefix the producer passes to pg_logical_emit_message, e.g. outbox"
            )));
        }
        if p == super::HEARTBEAT_PREFIX {
            return Err(Definite::Config(format!(
                "--messages-prefix {p:?} is outboxd's own heartbeat prefix; pick another, e.g. outbox"
            )));
        }
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    Ok(out)
}

pub fn parse_table(s: &str) -> Result<TableName, Definite> {
    match s.split_once('.') {
        Some((schema, name)) if !schema.is_empty() && !name.is_empty() && !name.contains('.') => {
            Ok(TableName { schema: schema.to_owned(), name: name.to_owned() })
        }
        _ => Err(Definite::Config(format!("--table {s:?}: expected SCHEMA.TABLE, e.g. public.outbox"))),
    }
}

/// `--schema-registry-*`, checked against the converters.
fn registry_config(a: &RouteArgs) -> Result<Option<crate::format::RegistryConfig>, Definite> {
    use crate::format::Format;
    use crate::router::Converter;
    let key = match a.key_converter {
        Converter::Avro => Some(Format::Avro),
        Converter::JsonSchema => Some(Format::JsonSchema),
        Converter::Protobuf => {
            return Err(Definite::Config(
                "--key-converter protobuf: keys go through the registry as Avro or JSON Schema strings; use --key-converter avro, json-schema or string".into(),
            ))
        }
        _ => None,
    };
    let value = match a.value_converter {
        Converter::Avro => Some(Format::Avro),
        Converter::JsonSchema => Some(Format::JsonSchema),
        Converter::Protobuf => Some(Format::Protobuf),
        _ => None,
    };
    let uses = value.is_some() || key.is_some();
    let Some(url) = a.registry.schema_registry_url.as_deref() else {
        if uses {
            return Err(Definite::Config(
                "--value-converter and --key-converter avro, json-schema and protobuf need --schema-registry-url (the registry holding the subjects' schemas)".into(),
            ));
        }
        if a.schema_auto_register {
            return Err(Definite::Config(
                "--schema-auto-register has no effect without --schema-registry-url and a registry converter; drop it"
                    .into(),
            ));
        }
        if a.subject_name_strategy != crate::format::SubjectStrategy::Topic {
            return Err(Definite::Config(format!(
                "--subject-name-strategy {} has no effect without --value-converter avro, json-schema or protobuf; drop it",
                a.subject_name_strategy.flag()
            )));
        }
        return Ok(None);
    };
    if !uses {
        return Err(Definite::Config(format!(
            "--schema-registry-url {} has no effect without --value-converter (or --key-converter) avro, json-schema or protobuf; add one or drop the URL",
            super::secret::mask_url(url)
        )));
    }
    if value.is_none() && a.subject_name_strategy != crate::format::SubjectStrategy::Topic {
        return Err(Definite::Config(format!(
            "--subject-name-strategy {} names value subjects (keys use <topic>-key); it needs --value-converter avro, json-schema or protobuf",
            a.subject_name_strategy.flag()
        )));
    }
    let connection = registry_connection(&a.registry, url)?;
    let cfg = crate::format::RegistryConfig {
        value,
        key,
        strategy: a.subject_name_strategy,
        auto_register: a.schema_auto_register,
        schema_dir: a.schema_dir.clone(),
        ..connection
    };
    // The CA file is read and parsed now, so a session never meets a bad one.
    crate::format::registry::Registry::new(&cfg).map_err(Definite::Config)?;
    Ok(Some(cfg))
}

/// The registry's connection flags (`url` is --schema-registry-url's value), checked: an http(s)
/// URL without credentials in it, the password from its file with a user; a config with no
/// format, topic subjects, no files, for the caller to complete. `run` and `inbox` share it.
pub fn registry_connection(
    a: &super::groups::RegistryArgs,
    url: &str,
) -> Result<crate::format::RegistryConfig, Definite> {
    let parsed = reqwest::Url::parse(url).map_err(|e| {
        Definite::Config(format!("--schema-registry-url {}: not a URL ({e})", super::secret::mask_url(url)))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(Definite::Config(format!(
            "--schema-registry-url {}: use an http:// or https:// URL",
            super::secret::mask_url(url)
        )));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(Definite::Config(format!(
            "--schema-registry-url {}: credentials in the URL would show in ps and logs; use --schema-registry-user and --schema-registry-password-file",
            super::secret::mask_url(url)
        )));
    }
    let password = match &a.schema_registry_password_file {
        Some(p) => Some(crate::format::Password::read("--schema-registry-password-file", p).map_err(Definite::Config)?),
        None => None,
    };
    if password.is_some() && a.schema_registry_user.is_none() {
        return Err(Definite::Config("--schema-registry-password-file needs --schema-registry-user".into()));
    }
    Ok(crate::format::RegistryConfig {
        url: parsed,
        user: a.schema_registry_user.clone(),
        password,
        ca_file: a.schema_registry_ca_file.clone(),
        value: None,
        key: None,
        strategy: crate::format::SubjectStrategy::Topic,
        auto_register: false,
        schema_dir: None,
    })
}

/// `--status-page-token-file` (read now; a missing or empty file is an error) and
/// `--status-page-allowed-hosts` (each entry checked): the status page's access, the same for
/// `run`, `poll` and `outboxd inbox`.
pub(super) fn status_page_access(
    a: &StatusPageArgs,
) -> Result<(Option<crate::format::Password>, Vec<String>), Definite> {
    let token = match &a.status_page_token_file {
        Some(path) => Some(crate::format::Password::read("--status-page-token-file", path).map_err(bad)?),
        None => None,
    };
    let hosts = a.status_page_allowed_hosts.iter().map(|h| allowed_host(h)).collect::<Result<_, _>>().map_err(bad)?;
    Ok((token, hosts))
}

/// A `--status-page-allowed-hosts` entry, checked: a name, `.domain` or `*`; no port, no scheme.
fn allowed_host(entry: &str) -> Result<String, String> {
    let e = entry.trim();
    let name = e.strip_prefix('.').unwrap_or(e);
    let ok = e == "*"
        || !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
            && !name.starts_with('.');
    if ok {
        Ok(e.to_owned())
    } else {
        Err(format!(
            "--status-page-allowed-hosts {entry:?}: give host names (status.example.com), a domain with its subdomains (.example.com) or *, comma-separated, without port or scheme"
        ))
    }
}
