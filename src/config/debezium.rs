//! `--debezium-config FILE`: run from an existing Debezium connector configuration.
//!
//! Reads a Kafka Connect REST body (`{"name": …, "config": {…}}`, or the bare config object) or a
//! `.properties` file (Debezium Server's `debezium.source.*`, `debezium.transforms.*`,
//! `debezium.sink.kafka.producer.*`), and turns it into flag values for `outboxd run`.
//!
//! Rules:
//! * EventRouter options the file leaves out take **Debezium's** defaults (`id`, `aggregateid`,
//!   `payload`, `route.by.field=aggregatetype`, replacement `outbox.event.${routedByValue}`, no
//!   headers expansion), so one file routes the same way in both tools.
//! * Flags given on the command line or in the environment win over the file ([`apply`]).
//! * Known keys that do not apply are reported at info; unknown keys in one warning; values we
//!   cannot honour (another decoder plugin, another transform type, an initial snapshot of a
//!   non-empty table) are errors that say what to change.
//! * The password only ever travels inside the URL value (and the Kafka credentials inside
//!   librdkafka properties, which `outboxd config` masks); messages name keys, never values.
//! * `${file:PATH:KEY}`, `${directory:DIR:FILE}` and `${env:NAME}` config-provider placeholders are
//!   resolved in every value first ([`providers`]).
//! * `database.sslmode`/`sslrootcert`/`sslcert`/`sslkey`/`sslpassword` become query parameters of
//!   the URL; Kafka producer settings (`producer.override.*`, `debezium.sink.kafka.producer.*`,
//!   `producer.*`, top-level `security.protocol`/`sasl.*`/`ssl.*`) are translated from Java client
//!   names to librdkafka's ([`producer`]).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::Definite;

mod apply;
pub mod offsets;
mod producer;
mod providers;

pub use apply::apply;

const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
const DECODE_MESSAGES: &str = "io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent";

/// Flag values (by clap argument id) read from a Debezium file, plus what to tell the operator.
#[derive(Debug, Default, Clone)]
pub struct Overlay {
    /// `(arg id, value)`; for repeatable flags the same id appears several times.
    pub values: Vec<(&'static str, String)>,
    /// Messages for the log: (is_warning, text).
    pub notes: Vec<(bool, String)>,
    /// `snapshot.mode` asks for an initial snapshot: only an empty outbox is acceptable.
    pub require_empty_tables: bool,
}

/// Keys Debezium knows that have no meaning for outboxd.
const NOT_APPLICABLE: &[&str] = &[
    "name",
    "connector.class",
    "tasks.max",
    "database.server.name",
    "topic.prefix",
    "schema.include.list",
    "schema.history.internal.kafka.topic",
    "schema.history.internal.kafka.bootstrap.servers",
    "decimal.handling.mode",
    "time.precision.mode",
    "include.schema.changes",
    "slot.drop.on.stop",
    "offset.storage",
    "offset.storage.file.filename",
    "offset.flush.interval.ms",
    "errors.tolerance",
    "errors.log.enable",
    "max.batch.size",
    "max.queue.size",
    "poll.interval.ms",
    "sink.type",
    "format.key",
    "format.value",
];

/// Read and translate a Debezium configuration file.
pub fn load(path: &Path) -> Result<Overlay, Definite> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Definite::Config(format!("--debezium-config {}: cannot read it: {e}", path.display())))?;
    let raw = if text.trim_start().starts_with('{') {
        parse_json(&text).map_err(|e| Definite::Config(format!("--debezium-config {}: {e}", path.display())))?
    } else {
        parse_properties(&text)
    };
    providers::resolve_all(normalize(raw))
        .and_then(|cfg| translate(&cfg))
        .map_err(|e| Definite::Config(format!("--debezium-config {}: {e}", path.display())))
}

/// A Connect REST body or a bare config object, values as strings.
fn parse_json(text: &str) -> Result<BTreeMap<String, String>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let obj = match v.get("config") {
        Some(c) => c,
        None => &v,
    };
    let map = obj.as_object().ok_or("expected a JSON object (a connector config, or {\"name\", \"config\"})")?;
    Ok(map
        .iter()
        .map(|(k, v)| {
            let s = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), s)
        })
        .collect())
}

/// Java `.properties`: `key=value` or `key: value`, `#`/`!` comments, `\` line continuations.
fn parse_properties(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim_start();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!')) {
            continue;
        }
        if let Some(cont) = line.strip_suffix('\\') {
            pending.push_str(cont);
            continue;
        }
        pending.push_str(line);
        let full = std::mem::take(&mut pending);
        let split = full.find(['=', ':']).unwrap_or(full.len());
        let (k, v) = full.split_at(split);
        let v = v.get(1..).unwrap_or("").trim();
        out.insert(k.trim().to_owned(), v.to_owned());
    }
    out
}

/// Map Debezium Server's prefixed keys onto connector keys.
fn normalize(raw: BTreeMap<String, String>) -> BTreeMap<String, String> {
    raw.into_iter()
        .filter_map(|(k, v)| {
            let k = if let Some(r) = k.strip_prefix("debezium.source.") {
                r.to_owned()
            } else if let Some(r) = k.strip_prefix("debezium.transforms") {
                format!("transforms{r}")
            } else if let Some(r) = k.strip_prefix("debezium.sink.kafka.producer.") {
                format!("producer.override.{r}")
            } else if let Some(r) = k.strip_prefix("debezium.sink.") {
                format!("sink.{r}")
            } else if let Some(r) = k.strip_prefix("debezium.format.") {
                format!("format.{r}")
            } else if k.starts_with("quarkus.") {
                return None;
            } else {
                k
            };
            Some((k, v))
        })
        .collect()
}

fn translate(cfg: &BTreeMap<String, String>) -> Result<Overlay, String> {
    let mut o = Overlay::default();
    let mut used: Vec<&str> = Vec::new();
    let mut get = |k: &'static str| -> Option<String> {
        let v = cfg.get(k).cloned();
        if v.is_some() {
            used.push(k);
        }
        v
    };

    for side in ["key", "value"] {
        let (class_key, schemas_key) = if side == "key" {
            ("key.converter", "key.converter.schemas.enable")
        } else {
            ("value.converter", "value.converter.schemas.enable")
        };
        let schemas = get(schemas_key);
        let flag = format!("{side}_converter");
        match get(class_key).as_deref().map(str::trim) {
            None => o.notes.push((
                false,
                format!(
                    "{class_key} is not set: Debezium uses the Connect worker's (Connect's own default is JsonConverter \
                     with schemas.enable=true); outboxd writes what StringConverter writes. Set {class_key} in the file if \
                     the worker's is another"
                ),
            )),
            Some("org.apache.kafka.connect.storage.StringConverter") => {
                o.values.push((if side == "key" { "key_converter" } else { "value_converter" }, "string".into()))
            }
            Some("org.apache.kafka.connect.converters.ByteArrayConverter") => {
                o.values.push((if side == "key" { "key_converter" } else { "value_converter" }, "bytes".into()))
            }
            Some("org.apache.kafka.connect.json.JsonConverter") => {
                if schemas.as_deref().map(str::trim) != Some("false") {
                    return Err(format!(
                        "{class_key}=JsonConverter with {schemas_key}={} writes Connect's schema envelope \
                         ({{\"schema\": …, \"payload\": …}}), which outboxd does not reproduce; set {schemas_key}=false \
                         (consumers then read the bare JSON) or use StringConverter",
                        schemas.as_deref().unwrap_or("true (the default)")
                    ));
                }
                o.values.push((if side == "key" { "key_converter" } else { "value_converter" }, "json".into()));
            }
            Some(
                c @ ("io.confluent.connect.avro.AvroConverter"
                | "io.apicurio.registry.utils.converter.AvroConverter"
                | "io.confluent.connect.json.JsonSchemaConverter"
                | "io.confluent.connect.protobuf.ProtobufConverter"),
            ) => {
                if side == "key" && c.ends_with("ProtobufConverter") {
                    return Err(format!(
                        "{class_key}={c}: outboxd writes registry keys as Avro or JSON Schema strings; use AvroConverter or JsonSchemaConverter for keys, or StringConverter"
                    ));
                }
                // Confluent's converter names the registry's root; Apicurio's its own API
                // (…/apis/registry/vN), whose Confluent-compatible twin outboxd speaks.
                let (url_key, apicurio_key) = if side == "key" {
                    ("key.converter.schema.registry.url", "key.converter.apicurio.registry.url")
                } else {
                    ("value.converter.schema.registry.url", "value.converter.apicurio.registry.url")
                };
                let url = get(url_key).or_else(|| get(apicurio_key).map(|u| ccompat_url(&u)));
                let Some(url) = url else {
                    return Err(format!("{class_key}={c} needs {url_key} (or {apicurio_key})"));
                };
                shared(&mut o, "schema_registry_url", url.trim().to_owned(), "name different registries")?;
                let format = if c.ends_with("JsonSchemaConverter") {
                    "json-schema"
                } else if c.ends_with("ProtobufConverter") {
                    "protobuf"
                } else {
                    "avro"
                };
                o.values.push((if side == "key" { "key_converter" } else { "value_converter" }, format.into()));
                // Registration on first use: Confluent's converters default to it, Apicurio's
                // do not; outboxd registers only --schema-dir files (and key schemas), and only
                // when asked, so an unset key is noted.
                let (auto_key, apicurio_auto) = if side == "key" {
                    ("key.converter.auto.register.schemas", "key.converter.apicurio.registry.auto-register")
                } else {
                    ("value.converter.auto.register.schemas", "value.converter.apicurio.registry.auto-register")
                };
                match get(auto_key).or_else(|| get(apicurio_auto)).map(|v| v.trim().to_ascii_lowercase()) {
                    Some(v) if v == "true" || v == "false" => {
                        shared(&mut o, "schema_auto_register", v, "disagree on registering schemas")?
                    }
                    Some(v) => return Err(format!("{auto_key}={v}: expected true or false")),
                    None if c.starts_with("io.confluent") => o.notes.push((
                        false,
                        format!(
                            "{auto_key} is not set: Confluent's converter registers the schema it derives by default; outboxd registers nothing unless --schema-auto-register is given (then --schema-dir files and key schemas)"
                        ),
                    )),
                    None => {}
                }
                if side == "value" {
                    if let Some(class) = get("value.converter.value.subject.name.strategy") {
                        let Some(strategy) = crate::format::SubjectStrategy::from_confluent_class(&class) else {
                            return Err(format!(
                                "value.converter.value.subject.name.strategy={class}: outboxd names subjects as TopicNameStrategy, RecordNameStrategy or TopicRecordNameStrategy do; use one of those"
                            ));
                        };
                        o.values.push(("subject_name_strategy", strategy.flag().into()));
                    }
                }
            }
            Some(other) => {
                return Err(format!(
                    "{class_key}={other}: outboxd writes what StringConverter, JsonConverter (schemas.enable=false), \
                     ByteArrayConverter and the Avro, JSON Schema and Protobuf converters write, not this converter's format; use one of \
                     those ({flag} string|json|bytes|avro|json-schema, or protobuf for values)"
                ))
            }
        }
    }
    match get("header.converter").as_deref().map(str::trim) {
        None | Some("org.apache.kafka.connect.storage.SimpleHeaderConverter") => {}
        Some(other) => {
            return Err(format!(
                "header.converter={other}: outboxd writes headers as Connect's default SimpleHeaderConverter does; remove the key"
            ))
        }
    }

    match get("plugin.name").as_deref() {
        None | Some("pgoutput") => {}
        Some(other) => {
            return Err(format!(
                "plugin.name={other} is not supported: outboxd reads pgoutput only; set plugin.name=pgoutput (a new slot is needed)"
            ))
        }
    }
    if let Some(class) = get("connector.class") {
        if !class.ends_with("PostgresConnector") {
            return Err(format!("connector.class {class} is not the PostgreSQL connector"));
        }
    }
    if let Some(t) = get("sink.type") {
        if t != "kafka" {
            return Err(format!("debezium.sink.type={t}: outboxd's file drop-in maps the kafka sink only"));
        }
    }

    // The connection, as one URL (explicit --postgres-url still wins).
    let host = get("database.hostname");
    let port = get("database.port");
    let user = get("database.user");
    let password = get("database.password");
    let dbname = get("database.dbname");
    let sslmode = get("database.sslmode");
    if host.is_some() || user.is_some() || dbname.is_some() {
        let enc = |s: &str| percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string();
        let auth = match (&user, &password) {
            (Some(u), Some(p)) => format!("{}:{}@", enc(u), enc(p)),
            (Some(u), None) => format!("{}@", enc(u)),
            _ => String::new(),
        };
        let mut url = format!(
            "postgres://{auth}{}:{}/{}?sslmode={}",
            host.as_deref().unwrap_or("localhost"),
            port.as_deref().unwrap_or("5432"),
            enc(dbname.as_deref().unwrap_or("postgres")),
            enc(sslmode.as_deref().unwrap_or("disable"))
        );
        for (key, param) in [
            ("database.sslrootcert", "sslrootcert"),
            ("database.sslcert", "sslcert"),
            ("database.sslkey", "sslkey"),
            ("database.sslpassword", "sslpassword"),
        ] {
            if let Some(v) = get(key) {
                url.push_str(&format!("&{param}={}", enc(&v)));
            }
        }
        o.values.push(("postgres_url", url));
    }
    o.values.push(("slot", get("slot.name").unwrap_or_else(|| "debezium".into())));
    if let Some(f) = get("slot.failover") {
        o.values.push(("slot_failover", f));
    }
    o.values.push(("publication", get("publication.name").unwrap_or_else(|| "dbz_publication".into())));
    match get("publication.autocreate.mode").as_deref() {
        // Debezium's default is all_tables; a publication of the outbox tables routes the same rows.
        None => o.values.push(("publication_autocreate", "filtered".into())),
        Some(m @ ("filtered" | "disabled")) => o.values.push(("publication_autocreate", m.into())),
        Some(other) => {
            return Err(format!(
                "publication.autocreate.mode={other} is not supported; use filtered (a publication of the outbox tables) or disabled"
            ))
        }
    }
    if let Some(list) = get("table.include.list") {
        for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if t.contains(['*', '+', '?', '[', '(', '|', '\\', '^', '$']) {
                return Err(format!(
                    "table.include.list entry {t:?} is a regular expression; list the outbox tables by name (schema.table)"
                ));
            }
            o.values.push(("tables", t.to_owned()));
        }
    }
    // Kafka Connect's exactly-once source support: `required` is our exactly-once delivery;
    // `requested` lets Connect fall back, so it stays at least once (said in a note).
    match get("exactly.once.support").map(|v| v.to_ascii_lowercase()).as_deref() {
        Some("required") => o.values.push(("delivery", "exactly-once".to_owned())),
        Some("requested") => o.notes.push((
            false,
            "exactly.once.support=requested: outboxd delivers at least once unless exactly-once is required".into(),
        )),
        Some(other) => return Err(format!("exactly.once.support={other:?}: expected required or requested")),
        None => {}
    }
    if let Some(ms) = get("heartbeat.interval.ms") {
        let n: u64 = ms.parse().map_err(|_| format!("heartbeat.interval.ms={ms:?} is not a number"))?;
        o.values.push(("heartbeat_interval", format!("{n}ms")));
    }
    if let Some(q) = get("heartbeat.action.query") {
        o.values.push(("heartbeat_action_query", q));
    }
    if let Some(t) = get("tombstones.on.delete") {
        o.notes.push((
            false,
            format!("tombstones.on.delete={t} does not apply: outboxd emits nothing for DELETEs on the outbox"),
        ));
    }
    match get("snapshot.mode").as_deref() {
        None | Some("never" | "no_data" | "nodata") => {}
        Some("initial" | "always" | "initial_only" | "when_needed") => o.require_empty_tables = true,
        Some(other) => {
            return Err(format!("snapshot.mode={other} is not supported; outboxd streams changes only (use never)"))
        }
    }

    // Logical messages: Debezium's prefix list, decoded into events by its
    // DecodeLogicalDecodingMessageContent transform before the EventRouter.
    let message_prefixes: Vec<String> = get("message.prefix.include.list")
        .map(|l| l.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    for p in &message_prefixes {
        if p.contains(['*', '+', '?', '[', '(', '|', '\\', '^', '$']) {
            return Err(format!(
                "message.prefix.include.list entry {p:?} is a regular expression; list the message prefixes exactly"
            ));
        }
        o.values.push(("messages_prefixes", p.clone()));
    }

    // Transforms: exactly one EventRouter, optionally after the message decoder; nothing else.
    let names: Vec<String> = get("transforms")
        .map(|t| t.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    let mut router: Option<String> = None;
    for n in &names {
        let ty = cfg.get(&format!("transforms.{n}.type")).cloned().unwrap_or_default();
        if ty == DECODE_MESSAGES && router.is_none() {
            if message_prefixes.is_empty() {
                o.notes.push((true, format!("transform {n:?} decodes logical messages, but message.prefix.include.list names no prefix: no message is an event")));
            }
            let null_include = format!("transforms.{n}.fields.null.include");
            if cfg.get(&null_include).is_some_and(|v| v.trim() == "true") {
                return Err(format!("{null_include}=true is not supported: outboxd drops null fields of a message, as the decoder's default does"));
            }
            continue;
        }
        if ty != EVENT_ROUTER {
            return Err(format!(
                "transform {n:?} has type {ty:?}; outboxd implements only {EVENT_ROUTER}: remove that transform or apply it downstream"
            ));
        }
        if let Some(first) = &router {
            return Err(format!("transforms {first:?} and {n:?} are both EventRouters; keep one"));
        }
        router = Some(n.clone());
    }
    let router_opts: BTreeMap<String, String> = match &router {
        Some(n) => {
            let prefix = format!("transforms.{n}.");
            cfg.iter().filter_map(|(k, v)| k.strip_prefix(&prefix).map(|o| (o.to_owned(), v.clone()))).collect()
        }
        None => {
            o.notes.push((
                false,
                "the file has no EventRouter transform; routing uses Debezium's EventRouter defaults".into(),
            ));
            BTreeMap::new()
        }
    };
    let mut router_used = vec!["type".to_owned()];
    let mut opt = |name: &str, default: &str| -> String {
        router_used.push(name.to_owned());
        router_opts.get(name).cloned().unwrap_or_else(|| default.to_owned())
    };
    o.values.push(("table_field_event_id", opt("table.field.event.id", "id")));
    o.values.push(("table_field_event_key", opt("table.field.event.key", "aggregateid")));
    o.values.push(("table_field_event_type", opt("table.field.event.type", "type")));
    o.values.push(("table_field_event_payload", opt("table.field.event.payload", "payload")));
    o.values.push(("table_field_event_timestamp", opt("table.field.event.timestamp", "")));
    // Debezium's own name is the boolean `table.fields.additional.error.on.missing`; the
    // error/ignore spelling `table.field.additional.missing` is accepted as well.
    let missing = opt("table.field.additional.missing", "error");
    let missing = match opt("table.fields.additional.error.on.missing", "").trim().to_ascii_lowercase().as_str() {
        "" => missing,
        "true" => "error".to_owned(),
        "false" => "ignore".to_owned(),
        other => other.to_owned(),
    };
    o.values.push(("table_field_additional_missing", missing));
    o.values.push(("route_by_field", opt("route.by.field", "aggregatetype")));
    o.values.push(("route_topic_regex", opt("route.topic.regex", "(?<routedByValue>.*)")));
    o.values.push(("route_topic_replacement", opt("route.topic.replacement", "outbox.event.${routedByValue}")));
    o.values.push(("route_tombstone_on_empty_payload", opt("route.tombstone.on.empty.payload", "false")));
    o.values.push(("table_op_invalid_behavior", opt("table.op.invalid.behavior", "warn")));
    o.values.push(("table_expand_json_payload", opt("table.expand.json.payload", "false")));
    o.values.push(("table_field_event_headers", opt("table.field.event.headers", "")));
    // Debezium's default is no placements: an absent option sets nothing, while an empty value is
    // passed on to be refused like an empty flag.
    router_used.push("table.fields.additional.placement".to_owned());
    if let Some(p) = router_opts.get("table.fields.additional.placement") {
        o.values.push(("table_fields_additional_placement", p.clone()));
    }
    // Debezium's tracing reads the span context from this column (default tracingspancontext, which
    // is outboxd's default too); outboxd passes it on as W3C headers.
    router_used.push("tracing.span.context.field".to_owned());
    if let Some(c) = router_opts.get("tracing.span.context.field") {
        o.values.push(("tracing_span_context_field", c.clone()));
    }
    for k in ["tracing.operation.name", "tracing.with.context.field.only"] {
        if router_opts.contains_key(k) {
            router_used.push(k.to_owned());
            o.notes.push((false, format!("transforms.*.{k}: outboxd creates no spans of its own; it passes the column's trace context on as traceparent/tracestate headers")));
        }
    }
    for k in ["table.field.event.schema.version", "table.field.event.payload.id", "debezium.op.invalid.behavior"] {
        if router_opts.contains_key(k) {
            router_used.push(k.to_owned());
            o.notes.push((false, format!("transforms.*.{k} does not apply to outboxd")));
        }
    }
    let unknown_router: Vec<String> = router_opts
        .keys()
        .filter(|k| !router_used.contains(k))
        .map(|k| format!("transforms.{}.{k}", router.as_deref().unwrap_or("?")))
        .collect();

    // Producer settings, least specific first so the most specific wins.
    let mut java: BTreeMap<String, String> = BTreeMap::new();
    for level in 0..3 {
        for (k, v) in cfg {
            if producer_level(k).is_some_and(|(l, _)| l == level) {
                java.insert(producer_level(k).map(|(_, p)| p.to_owned()).unwrap_or_default(), v.clone());
            }
        }
    }
    // Debezium's topic auto-creation defaults size the topics outboxd creates (-1: the broker's).
    for (key, id) in [
        ("topic.creation.default.partitions", "topic_partitions"),
        ("topic.creation.default.replication.factor", "topic_replication_factor"),
    ] {
        if let Some(v) = get(key) {
            match v.trim().parse::<i32>() {
                Ok(n) if n == -1 || n >= 1 => o.values.push((id, n.to_string())),
                _ => return Err(format!("{key}={v} is not a number of at least 1 or -1 (the broker's default)")),
            }
        }
    }
    if let Some(g) = get("topic.creation.groups") {
        o.notes.push((
            true,
            format!("topic.creation.groups={g}: outboxd sizes every topic it creates with topic.creation.default.*; create grouped topics yourself"),
        ));
    }
    let mapped = producer::map(&java)?;
    if let Some(b) = mapped.brokers {
        o.values.push(("kafka_brokers", b));
    }
    for (k, v) in mapped.properties {
        o.values.push(("kafka_properties", format!("{k}={v}")));
    }
    o.notes.extend(mapped.notes.into_iter().map(|n| (false, n)));

    let mut unknown = unknown_router;
    for k in cfg.keys() {
        if producer_level(k).is_some() || used.contains(&k.as_str()) || k.starts_with("transforms") {
            continue;
        }
        if k.starts_with("database.ssl") {
            o.notes.push((false, format!("{k} does not apply to outboxd; ignored")));
            continue;
        }
        if NOT_APPLICABLE.contains(&k.as_str()) || k.starts_with("schema.history") || k.ends_with(".converter") {
            o.notes.push((false, format!("{k} does not apply to outboxd; ignored")));
        } else {
            unknown.push(k.clone());
        }
    }
    if !unknown.is_empty() {
        o.notes.push((true, format!("ignoring keys outboxd does not know: {}", unknown.join(", "))));
    }
    Ok(o)
}

/// A producer setting's precedence (0 top-level security keys, 1 `producer.*`, 2
/// `producer.override.*`) and its Java client name.
fn producer_level(k: &str) -> Option<(u8, &str)> {
    if let Some(p) = k.strip_prefix("producer.override.") {
        Some((2, p))
    } else if let Some(p) = k.strip_prefix("producer.") {
        Some((1, p))
    } else if k == "security.protocol" || k.starts_with("sasl.") || k.starts_with("ssl.") {
        Some((0, k))
    } else {
        None
    }
}

/// Apicurio's native API root (`…/apis/registry/v2` or `v3`) as its Confluent-compatible one.
/// Set `flag`, which the key and value converters share, to `value`; an error naming the
/// conflict (`differ`) when the other side set it to something else.
fn shared(o: &mut Overlay, flag: &'static str, value: String, differ: &str) -> Result<(), String> {
    match o.values.iter().find(|(k, _)| *k == flag) {
        Some((_, other)) if *other != value => Err(format!(
            "key.converter and value.converter {differ} ({other} and {value}); outboxd has one --{} for both",
            flag.replace('_', "-")
        )),
        Some(_) => Ok(()),
        None => {
            o.values.push((flag, value));
            Ok(())
        }
    }
}

fn ccompat_url(url: &str) -> String {
    let u = url.trim().trim_end_matches('/');
    match u.rfind("/apis/registry/") {
        Some(i) => format!("{}/apis/ccompat/v7", &u[..i]),
        None => u.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn value<'a>(o: &'a Overlay, id: &str) -> Option<&'a str> {
        o.values.iter().rev().find(|(k, _)| *k == id).map(|(_, v)| v.as_str())
    }

    /// Kafka Connect's `exactly.once.support`: `required` is exactly-once delivery, `requested` stays
    /// at least once with a note, anything else is refused.
    #[test]
    fn exactly_once_support_maps_to_delivery() {
        let with = |v: &str| {
            let json = format!(
                r#"{{"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "database.hostname": "pg", "database.user": "u", "database.dbname": "app",
                "exactly.once.support": "{v}"}}"#
            );
            translate(&normalize(parse_json(&json).unwrap()))
        };
        assert_eq!(value(&with("required").unwrap(), "delivery"), Some("exactly-once"));
        let o = with("requested").unwrap();
        assert_eq!(value(&o, "delivery"), None);
        assert!(o.notes.iter().any(|(_, n)| n.contains("at least once")), "{:?}", o.notes);
        assert!(with("always").unwrap_err().contains("exactly.once.support"));
    }

    #[test]
    fn connector_json_like_the_seed() {
        let json = r#"{"name": "outbox-connector", "config": {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "database.hostname": "postgres", "database.port": "5432", "database.user": "replica",
            "database.password": "p@ss:word", "database.dbname": "app", "database.server.name": "app-pg",
            "plugin.name": "pgoutput", "publication.autocreate.mode": "filtered",
            "table.include.list": "public.outbox", "heartbeat.interval.ms": 5000,
            "tombstones.on.delete": "false", "transforms": "outbox",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "transforms.outbox.table.fields.additional.placement": "aggregate_type:header,event_type:header",
            "transforms.outbox.route.by.field": "event_type",
            "transforms.outbox.route.topic.replacement": "${routedByValue}.events",
            "transforms.outbox.table.field.event.id": "event_id",
            "transforms.outbox.table.field.event.key": "aggregate_id",
            "transforms.outbox.table.field.event.payload": "payload",
            "transforms.outbox.table.field.event.timestamp": "created_at",
            "producer.override.linger.ms": "10", "mystery.key": "1"}}"#;
        let o = translate(&normalize(parse_json(json).unwrap())).unwrap();
        assert_eq!(
            value(&o, "postgres_url"),
            Some("postgres://replica:p%40ss%3Aword@postgres:5432/app?sslmode=disable")
        );
        assert_eq!(value(&o, "route_by_field"), Some("event_type"));
        assert_eq!(value(&o, "route_topic_replacement"), Some("${routedByValue}.events"));
        assert_eq!(value(&o, "table_field_event_key"), Some("aggregate_id"));
        assert_eq!(value(&o, "tables"), Some("public.outbox"));
        assert_eq!(value(&o, "heartbeat_interval"), Some("5000ms"));
        assert_eq!(value(&o, "kafka_properties"), Some("linger.ms=10"));
        assert_eq!(value(&o, "slot"), Some("debezium"));
        let notes: Vec<&String> = o.notes.iter().map(|(_, n)| n).collect();
        assert!(notes.iter().any(|n| n.contains("database.server.name")), "{notes:?}");
        let warn: Vec<&String> = o.notes.iter().filter(|(w, _)| *w).map(|(_, n)| n).collect();
        assert_eq!(warn.len(), 1, "{warn:?}");
        assert!(warn[0].contains("mystery.key") && !warn[0].contains("p@ss"), "{warn:?}");
    }

    #[test]
    fn message_prefixes_and_debeziums_message_decoder() {
        let with = |extra: &[(&str, &str)]| {
            let mut m = map(&[
                ("message.prefix.include.list", "outbox, audit"),
                ("transforms", "decode,outbox"),
                ("transforms.decode.type", DECODE_MESSAGES),
                ("transforms.outbox.type", EVENT_ROUTER),
            ]);
            m.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            translate(&m)
        };
        let o = with(&[]).unwrap();
        let prefixes: Vec<&str> =
            o.values.iter().filter(|(id, _)| *id == "messages_prefixes").map(|(_, v)| v.as_str()).collect();
        assert_eq!(prefixes, ["outbox", "audit"]);
        assert!(!o.notes.iter().any(|(w, _)| *w), "{:?}", o.notes);
        let e = with(&[("transforms.decode.fields.null.include", "true")]).unwrap_err();
        assert!(e.contains("fields.null.include"), "{e}");
        let e = with(&[("message.prefix.include.list", "out.*")]).unwrap_err();
        assert!(e.contains("regular expression"), "{e}");
        // The decoder after the router is another transform: refused.
        let e = translate(&map(&[
            ("transforms", "outbox,decode"),
            ("transforms.decode.type", DECODE_MESSAGES),
            ("transforms.outbox.type", EVENT_ROUTER),
        ]))
        .unwrap_err();
        assert!(e.contains("decode"), "{e}");
    }

    #[test]
    fn slot_failover_is_mapped_and_known() {
        let o = translate(&map(&[("slot.failover", "true")])).unwrap();
        assert_eq!(value(&o, "slot_failover"), Some("true"));
        assert!(!o.notes.iter().any(|(w, n)| *w && n.contains("slot.failover")), "{:?}", o.notes);
        assert_eq!(value(&translate(&map(&[])).unwrap(), "slot_failover"), None);
    }

    #[test]
    fn left_out_router_options_take_debeziums_defaults() {
        let o = translate(&map(&[("transforms", "outbox"), ("transforms.outbox.type", EVENT_ROUTER)])).unwrap();
        assert_eq!(value(&o, "table_field_event_id"), Some("id"));
        assert_eq!(value(&o, "table_field_event_key"), Some("aggregateid"));
        assert_eq!(value(&o, "route_by_field"), Some("aggregatetype"));
        assert_eq!(value(&o, "route_topic_replacement"), Some("outbox.event.${routedByValue}"));
        assert_eq!(value(&o, "table_field_event_timestamp"), Some(""));
        assert_eq!(value(&o, "table_field_event_headers"), Some(""));
        assert_eq!(value(&o, "publication"), Some("dbz_publication"));
        assert_eq!(value(&o, "table_fields_additional_placement"), None, "no placements, and no empty value");
        assert_eq!(value(&o, "table_field_additional_missing"), Some("error"));
    }

    #[test]
    fn additional_placement_and_missing_options() {
        let router = |pairs: &[(&str, &str)]| {
            let mut m = map(&[("transforms", "outbox"), ("transforms.outbox.type", EVENT_ROUTER)]);
            m.extend(pairs.iter().map(|(k, v)| (format!("transforms.outbox.{k}"), v.to_string())));
            translate(&m).unwrap()
        };
        // An explicitly empty placement is passed on (and refused by validation), not dropped.
        let o = router(&[("table.fields.additional.placement", "")]);
        assert_eq!(value(&o, "table_fields_additional_placement"), Some(""));
        for (k, v, want) in [
            ("table.fields.additional.error.on.missing", "false", "ignore"),
            ("table.fields.additional.error.on.missing", "TRUE", "error"),
            ("table.field.additional.missing", "ignore", "ignore"),
        ] {
            let o = router(&[(k, v)]);
            assert_eq!(value(&o, "table_field_additional_missing"), Some(want), "{k}={v}");
            assert!(o.notes.iter().all(|(w, _)| !w), "{k} is known: {:?}", o.notes);
        }
    }

    #[test]
    fn topic_creation_defaults_size_the_topics_outboxd_creates() {
        let o = translate(&map(&[
            ("topic.creation.default.partitions", "6"),
            ("topic.creation.default.replication.factor", "-1"),
        ]))
        .unwrap();
        assert_eq!(value(&o, "topic_partitions"), Some("6"));
        assert_eq!(value(&o, "topic_replication_factor"), Some("-1"));
        assert!(o.notes.iter().all(|(w, _)| !w), "both keys are known: {:?}", o.notes);
        let o = translate(&map(&[])).unwrap();
        assert_eq!(value(&o, "topic_replication_factor"), None, "the flag's default (-1) stays");
        for bad in ["0", "-2", "three"] {
            let e = translate(&map(&[("topic.creation.default.replication.factor", bad)])).unwrap_err();
            assert!(e.contains("topic.creation.default.replication.factor") && e.contains(bad), "{e}");
        }
        let o = translate(&map(&[("topic.creation.groups", "compacted")])).unwrap();
        assert!(o.notes.iter().any(|(w, n)| *w && n.contains("topic.creation.groups")), "{:?}", o.notes);
    }

    #[test]
    fn debezium_server_properties() {
        let props = "# Debezium Server\n\
            debezium.sink.type=kafka\n\
            debezium.sink.kafka.producer.bootstrap.servers=k1:9092,k2:9092\n\
            debezium.sink.kafka.producer.compression.type=lz4\n\
            debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
            debezium.source.database.hostname = db\n\
            debezium.source.database.user: u\n\
            debezium.source.database.dbname=app\n\
            debezium.source.slot.name=outbox_slot\n\
            debezium.transforms=router\n\
            debezium.transforms.router.type=io.debezium.transforms.outbox.EventRouter\n\
            debezium.transforms.router.route.by.field=\\\n  event_type\n\
            quarkus.log.level=INFO\n";
        let o = translate(&normalize(parse_properties(props))).unwrap();
        assert_eq!(value(&o, "kafka_brokers"), Some("k1:9092,k2:9092"));
        assert_eq!(value(&o, "kafka_properties"), Some("compression.type=lz4"));
        assert_eq!(value(&o, "postgres_url"), Some("postgres://u@db:5432/app?sslmode=disable"));
        assert_eq!(value(&o, "slot"), Some("outbox_slot"));
        assert_eq!(value(&o, "route_by_field"), Some("event_type"));
        assert!(o.notes.iter().all(|(w, _)| !w), "{:?}", o.notes);
    }

    #[test]
    fn unsupported_values_are_errors_that_say_what_to_change() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("plugin.name", "decoderbufs")], "plugin.name=pgoutput"),
            (
                &[("transforms", "a"), ("transforms.a.type", "org.apache.kafka.connect.transforms.InsertField$Value")],
                "remove that transform",
            ),
            (
                &[("transforms", "a,b"), ("transforms.a.type", EVENT_ROUTER), ("transforms.b.type", EVENT_ROUTER)],
                "keep one",
            ),
            (&[("publication.autocreate.mode", "all_tables")], "use filtered"),
            (&[("table.include.list", "public.outbox_.*")], "regular expression"),
            (&[("snapshot.mode", "exported")], "use never"),
        ];
        for (pairs, want) in cases {
            let e = translate(&map(pairs)).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        let o = translate(&map(&[("snapshot.mode", "initial")])).unwrap();
        assert!(o.require_empty_tables);
    }

    #[test]
    fn database_tls_settings_go_into_the_url() {
        let o = translate(&map(&[
            ("database.hostname", "db.internal"),
            ("database.user", "replica"),
            ("database.dbname", "app"),
            ("database.sslmode", "verify-full"),
            ("database.sslrootcert", "/etc/certs/root ca.pem"),
            ("database.sslcert", "/etc/certs/client.crt"),
            ("database.sslkey", "/etc/certs/client.key"),
            ("database.sslpassword", "k&y=pw"),
        ]))
        .unwrap();
        assert_eq!(
            value(&o, "postgres_url"),
            Some(
                "postgres://replica@db.internal:5432/app?sslmode=verify%2Dfull&sslrootcert=%2Fetc%2Fcerts%2Froot%20ca%2Epem\
                 &sslcert=%2Fetc%2Fcerts%2Fclient%2Ecrt&sslkey=%2Fetc%2Fcerts%2Fclient%2Ekey&sslpassword=k%26y%3Dpw"
            )
        );
        assert!(o.notes.iter().all(|(w, _)| !w), "{:?}", o.notes);
    }

    fn kafka_props(o: &Overlay) -> Vec<&str> {
        o.values.iter().filter(|(k, _)| *k == "kafka_properties").map(|(_, v)| v.as_str()).collect()
    }

    #[test]
    fn connect_producer_overrides_map_to_librdkafka() {
        let o = translate(&map(&[
            ("producer.override.security.protocol", "SASL_SSL"),
            ("producer.override.sasl.mechanism", "SCRAM-SHA-256"),
            (
                "producer.override.sasl.jaas.config",
                "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"relay\" password=\"pw\";",
            ),
            ("producer.override.ssl.endpoint.identification.algorithm", ""),
            ("producer.compression.type", "gzip"),
            ("producer.override.compression.type", "zstd"),
            ("security.protocol", "PLAINTEXT"),
        ]))
        .unwrap();
        let p = kafka_props(&o);
        for want in [
            "security.protocol=sasl_ssl",
            "sasl.mechanisms=SCRAM-SHA-256",
            "sasl.username=relay",
            "sasl.password=pw",
            "ssl.endpoint.identification.algorithm=none",
            "compression.type=zstd",
        ] {
            assert!(p.contains(&want), "{want} in {p:?}");
        }
        assert!(!p.iter().any(|v| v.contains("jaas") || v.contains("gzip") || v.contains("PLAINTEXT")), "{p:?}");
        assert!(o.notes.iter().all(|(w, _)| !w), "{:?}", o.notes);
    }

    #[test]
    fn debezium_server_producer_security_and_refused_stores() {
        let props = "debezium.sink.type=kafka\n\
            debezium.sink.kafka.producer.bootstrap.servers=k:9093\n\
            debezium.sink.kafka.producer.security.protocol=SSL\n\
            debezium.sink.kafka.producer.ssl.truststore.type=PEM\n\
            debezium.sink.kafka.producer.ssl.truststore.location=/certs/ca.pem\n\
            debezium.source.database.hostname=db\n";
        let o = translate(&normalize(parse_properties(props))).unwrap();
        assert_eq!(value(&o, "kafka_brokers"), Some("k:9093"));
        assert_eq!(kafka_props(&o), vec!["ssl.ca.location=/certs/ca.pem", "security.protocol=ssl"]);
        let e = translate(&normalize(parse_properties(
            "debezium.sink.kafka.producer.ssl.truststore.location=/certs/truststore.jks\n",
        )))
        .unwrap_err();
        assert!(e.contains("keytool -importkeystore") && e.contains("ca.pem"), "{e}");
    }

    #[test]
    fn config_providers_resolve_before_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let secrets = dir.path().join("kafka.properties");
        std::fs::write(&secrets, "user=relay\npassword=hunter22\ndb=dbpass\n").unwrap();
        let s = secrets.display();
        let conf = dir.path().join("connector.json");
        std::fs::write(
            &conf,
            format!(
                r#"{{"name": "x", "config": {{
                "config.providers": "file",
                "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
                "database.hostname": "db", "database.user": "u", "database.dbname": "app",
                "database.password": "${{file:{s}:db}}",
                "producer.override.sasl.mechanism": "SCRAM-SHA-256",
                "producer.override.security.protocol": "SASL_PLAINTEXT",
                "producer.override.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"${{file:{s}:user}}\" password=\"${{file:{s}:password}}\";"
            }}}}"#
            ),
        )
        .unwrap();
        let o = load(&conf).unwrap();
        assert_eq!(value(&o, "postgres_url"), Some("postgres://u:dbpass@db:5432/app?sslmode=disable"));
        let p = kafka_props(&o);
        assert!(p.contains(&"sasl.username=relay") && p.contains(&"sasl.password=hunter22"), "{p:?}");
        assert!(o.notes.iter().all(|(w, n)| !w && !n.contains("hunter22")), "{:?}", o.notes);
        std::fs::write(&secrets, "user=relay\n").unwrap();
        let e = load(&conf).unwrap_err().to_string();
        assert!(e.contains("has no key") && e.contains("connector.json") && !e.contains('\n'), "{e}");
    }
}
