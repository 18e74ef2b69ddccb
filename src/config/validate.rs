//! Raw flags to a validated [`Config`]: every value typed, every bad combination rejected with a
//! one-line message that names the flag and the fix. Runtime code never re-validates.

use std::sync::Arc;
use std::time::Duration;

use super::secret::read_url_file;
use super::units::{parse_duration, parse_size};
use super::{
    debezium, postgres, Config, DeliveryMode, KafkaConfig, PgTarget, PollConfig, RunArgs, SinkKind, TableName, UrlFiles,
};
use crate::error::Definite;
use crate::router::contract::{Contracts, SchemaMissing};
use crate::router::mask::{MaskSpec, Masking};
use crate::router::{HeadersField, Placement, PlacementTarget, RouteConfig, TopicRule};
use crate::sink::http::config::{HttpArgs, HttpConfig};
use crate::sink::nats::config::NatsConfig;
use crate::sink::rabbitmq::config::RabbitConfig;
use crate::sink::redis::config::RedisConfig;

impl Config {
    /// Like [`Config::from_args`], first merging `--debezium-config` under the flags for which
    /// `explicit(arg_id)` says the user gave a value (command line or environment).
    pub fn from_args_with_file(a: &RunArgs, explicit: &dyn Fn(&str) -> bool) -> Result<Config, Definite> {
        let Some(path) = &a.debezium_config else { return Config::from_args(a) };
        let overlay = debezium::load(path)?;
        let mut merged = a.clone();
        debezium::apply(&mut merged, &overlay, explicit)?;
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
        // `--table ''` names no table: a relay of logical messages only.
        for t in a.tables.iter().filter(|t| !t.is_empty()) {
            let t = parse_table(t)?;
            if !tables.contains(&t) {
                tables.push(t);
            }
        }
        let messages_prefixes = check_prefixes(&a.messages_prefixes)?;
        if tables.is_empty() && messages_prefixes.is_empty() {
            return Err(bad(
                "--table is empty and no --messages-prefix is given: name an outbox table (SCHEMA.TABLE) or a message prefix".into(),
            ));
        }
        let (properties, property_file) = KafkaConfig::load_properties(
            &a.debezium_kafka_properties,
            a.kafka.kafka_property_file.as_deref(),
            &a.kafka.kafka_properties,
        )?;
        if a.sink == SinkKind::Kafka && a.kafka.kafka_brokers.trim().is_empty() {
            return Err(bad("--kafka-brokers is empty; give host:port[,host:port]".into()));
        }
        let url_files = UrlFiles {
            nats: a.nats.nats_url_file.clone(),
            redis: a.redis.redis_url_file.clone(),
            rabbitmq: a.rabbitmq.rabbitmq_url_file.clone(),
            http: a.http_url_file.clone(),
        };
        let from_file = |flag: &str, file: &Option<std::path::PathBuf>, given: &String| match file {
            Some(p) => read_url_file(flag, p),
            None => Ok(given.clone()),
        };
        let nats_url = from_file("--nats-url-file", &url_files.nats, &a.nats.nats_url)?;
        let http_url = from_file("--http-url-file", &url_files.http, &a.http_url)?;
        let redis = RedisConfig {
            url: from_file("--redis-url-file", &url_files.redis, &a.redis.redis_url)?,
            maxlen: a.redis_maxlen,
        };
        let dlq_sink = match a.dlq_sink {
            Some(k) if k == a.sink => None,
            Some(k @ (SinkKind::Kafka | SinkKind::Nats | SinkKind::Redis | SinkKind::Rabbitmq)) => Some(k),
            Some(k) => {
                return Err(bad(format!(
                    "--dlq-sink {k:?} keeps no dead letters `outboxd dlq` can read; give kafka, nats, redis or rabbitmq"
                )
                .to_lowercase()))
            }
            None => None,
        };
        if a.delivery == DeliveryMode::ExactlyOnce {
            if a.sink != SinkKind::Kafka {
                return Err(bad(format!(
                    "--delivery exactly-once needs --sink kafka (Kafka transactions); --sink {} delivers at least once",
                    super::show::value_name(a.sink)
                )));
            }
            if dlq_sink.is_some() {
                return Err(bad(
                    "--delivery exactly-once writes dead-letter copies in the same Kafka transaction as the events \
                     around them; drop --dlq-sink"
                        .into(),
                ));
            }
        }
        if a.sink == SinkKind::Redis || dlq_sink == Some(SinkKind::Redis) {
            redis.check()?;
            if redis.maxlen == Some(0) {
                return Err(bad(
                    "--redis-maxlen 0 would trim every event away; give at least 1, or leave it unset".into()
                ));
            }
        }
        let rabbitmq = RabbitConfig {
            url: from_file("--rabbitmq-url-file", &url_files.rabbitmq, &a.rabbitmq.rabbitmq_url)?,
            exchange: a.rabbitmq.rabbitmq_exchange.clone(),
        };
        if a.sink == SinkKind::Rabbitmq || dlq_sink == Some(SinkKind::Rabbitmq) {
            rabbitmq.check()?;
        }
        let http = HttpConfig::new(HttpArgs {
            url: &http_url,
            source: a.http_source.as_deref(),
            slot: &a.slot,
            signing_secret_file: a.http_signing_secret_file.as_deref(),
            batch: a.http_batch,
            concurrency: a.http_concurrency,
            timeout: parse_duration("--http-timeout", &a.http_timeout)?,
            bad_event_status: &a.http_bad_event_status,
            signature_version: &a.http_signature_version,
            required: a.sink == SinkKind::Http,
        })?;
        if a.topic_partitions < 1 && a.topic_partitions != -1 {
            return Err(bad(format!(
                "--topic-partitions {} must be at least 1, or -1 for the broker's num.partitions",
                a.topic_partitions
            )));
        }
        if a.topic_replication_factor < 1 && a.topic_replication_factor != -1 {
            return Err(bad(format!(
                "--topic-replication-factor {} must be at least 1, or -1 for the broker's default.replication.factor",
                a.topic_replication_factor
            )));
        }
        if a.max_in_flight == 0 {
            return Err(bad("--max-in-flight must be at least 1".into()));
        }
        let max_in_flight_bytes = parse_size("--max-in-flight-bytes", &a.max_in_flight_bytes)?;
        if max_in_flight_bytes < 1024 {
            return Err(bad(format!("--max-in-flight-bytes {:?} must be at least 1KiB", a.max_in_flight_bytes)));
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
        let placements = match a.table_fields_additional_placement.as_deref() {
            None => Vec::new(),
            Some(p) => Placement::parse_list(p).map_err(|e| bad(format!("--table-fields-additional-placement {e}")))?,
        };
        let headers_field = match a.table_field_event_headers.as_deref() {
            None => HeadersField::IfPresent("headers".into()),
            Some("") => HeadersField::Disabled,
            Some(c) => HeadersField::Required(c.into()),
        };
        let trace_field = match a.tracing_span_context_field.as_deref() {
            None => HeadersField::IfPresent("tracingspancontext".into()),
            Some("") => HeadersField::Disabled,
            Some(c) => HeadersField::Required(c.into()),
        };
        // Compiled here, once: `run` uses this set, and `outboxd config` proves every file compiles.
        let contracts = match &a.schema_dir {
            Some(dir) => Some(Contracts::load(dir, a.schema_missing).map_err(bad)?),
            None if a.schema_missing == SchemaMissing::Reject => {
                return Err(bad("--schema-missing reject needs --schema-dir DIR (the schemas to require)".into()))
            }
            None => None,
        };
        let mask = Masking::compile(
            MaskSpec {
                masks: a.masks.clone(),
                encrypt: a.encrypt.clone(),
                mask_key_file: a.mask_key_file.clone(),
                encrypt_key_file: a.encrypt_key_file.clone(),
                event_type: a.mask_event_type.clone(),
            },
            placements.iter().any(|p| matches!(p.target, PlacementTarget::Envelope(_))),
        )
        .map_err(bad)?;
        if a.value_converter == crate::router::Converter::Json
            && placements.iter().any(|p| matches!(p.target, PlacementTarget::Envelope(_)))
        {
            if a.table_expand_json_payload {
                return Err(bad("--value-converter json with an envelope placement and --table-expand-json-payload: Debezium expands the payload into a Connect struct inside its envelope, whose JSON outboxd does not reproduce; drop one of them, or use --value-converter string".into()));
            }
            if !mask.is_empty() {
                return Err(bad("--value-converter json with an envelope placement and --mask/--encrypt: the payload inside that envelope is a JSON string the masking rules cannot reach; use --value-converter string with --mask/--encrypt".into()));
            }
        }
        let registry = registry_config(a)?;
        let otlp_endpoint = match a.otlp_endpoint.as_deref() {
            None | Some("") => None,
            Some(u) => match reqwest::Url::parse(u) {
                Ok(p) if matches!(p.scheme(), "http" | "https") => Some(u.trim_end_matches('/').to_owned()),
                _ => {
                    return Err(Definite::Config(format!(
                        "--otlp-endpoint {}: use the collector's OTLP/HTTP base URL, e.g. http://collector:4318",
                        super::secret::mask_url(u)
                    )))
                }
            },
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
            messages_prefixes,
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
                key_converter: a.key_converter,
                value_converter: a.value_converter,
                headers_field,
                trace_field,
                contracts,
            },
            registry,
            otlp_endpoint,
            op_invalid: a.table_op_invalid_behavior,
            sink: a.sink,
            kafka: KafkaConfig {
                brokers: a.kafka.kafka_brokers.clone(),
                properties,
                property_file,
                topic_partitions: a.topic_partitions,
                topic_replication_factor: a.topic_replication_factor,
                transactions: match a.delivery {
                    DeliveryMode::AtLeastOnce => None,
                    DeliveryMode::ExactlyOnce => Some(super::TxnConfig {
                        system_id: String::new(),
                        slot: a.slot.clone(),
                        position_topic: {
                            if a.position_topic.trim().is_empty() {
                                return Err(bad(
                                    "--position-topic is empty; name a topic (default outboxd.positions)".into()
                                ));
                            }
                            a.position_topic.clone()
                        },
                        interval: parse_duration("--transaction-interval", &a.transaction_interval)?,
                    }),
                },
            },
            nats: NatsConfig::new(&nats_url, a.nats.nats_creds.clone(), a.nats_create_stream.as_deref())?,
            redis,
            rabbitmq,
            http,
            url_files,
            max_in_flight: a.max_in_flight,
            max_in_flight_bytes,
            health_stall_timeout: {
                let d = parse_duration("--health-stall-timeout", &a.health_stall_timeout)?;
                if !d.is_zero() && d <= status_interval * 2 {
                    return Err(bad(format!(
                        "--health-stall-timeout {} must exceed twice --status-interval {} (or be 0 to disable)",
                        a.health_stall_timeout, a.status_interval
                    )));
                }
                d
            },
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
            status_page_token: match &a.status_page_token_file {
                Some(path) => Some(crate::format::Password::read("--status-page-token-file", path).map_err(bad)?),
                None => None,
            },
            status_page_allowed_hosts: a
                .status_page_allowed_hosts
                .iter()
                .map(|h| allowed_host(h))
                .collect::<Result<_, _>>()
                .map_err(bad)?,
            on_bad_event: a.on_bad_event,
            delivery: a.delivery,
            dlq_sink,
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
            mask,
            poll: PollConfig::from_args(a)?,
            require_empty_tables: false,
            debezium_offsets: match &a.debezium_offsets {
                Some(path) => Some((path.clone(), debezium::offsets::DebeziumOffset::load(path)?)),
                None => None,
            },
            notes: Vec::new(),
            reconnect_max_backoff: parse_duration("--reconnect-max-backoff", &a.reconnect_max_backoff)?
                .max(Duration::from_millis(100)),
            standby_retry_interval: {
                let d = parse_duration("--standby-retry-interval", &a.standby_retry_interval)?;
                if d.is_zero() {
                    return Err(bad("--standby-retry-interval must be greater than 0".into()));
                }
                d
            },
            slot_failover: a.slot_failover,
            slot_recreate_after_loss: a.slot_recreate_after_loss,
        })
    }
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
fn registry_config(a: &RunArgs) -> Result<Option<crate::format::RegistryConfig>, Definite> {
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
    let Some(url) = a.schema_registry_url.as_deref() else {
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
    let cfg = crate::format::RegistryConfig {
        url: parsed,
        user: a.schema_registry_user.clone(),
        password,
        ca_file: a.schema_registry_ca_file.clone(),
        value,
        key,
        strategy: a.subject_name_strategy,
        auto_register: a.schema_auto_register,
        schema_dir: a.schema_dir.clone(),
    };
    // The CA file is read and parsed now, so a session never meets a bad one.
    crate::format::registry::Registry::new(&cfg).map_err(Definite::Config)?;
    Ok(Some(cfg))
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
