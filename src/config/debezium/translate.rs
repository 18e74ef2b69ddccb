//! Translating a Debezium connector configuration (its keys normalized, placeholders resolved)
//! into flag values by clap argument id ([`Overlay`]): one function per part of the file, in the
//! order they are read. [`super::apply`] then sets those flags in the command's groups.
//!
//! Invariant: every key read is recorded ([`Keys::get`]), so the keys left over at the end are
//! reported as not applying or unknown, never silently dropped.

use std::collections::BTreeMap;

use super::{producer, Overlay, DECODE_MESSAGES, EVENT_ROUTER, NOT_APPLICABLE};

/// The configuration, and which of its keys were read.
struct Keys<'a> {
    cfg: &'a BTreeMap<String, String>,
    used: Vec<&'static str>,
}

impl Keys<'_> {
    fn get(&mut self, k: &'static str) -> Option<String> {
        let v = self.cfg.get(k).cloned();
        if v.is_some() {
            self.used.push(k);
        }
        v
    }
}

/// The flag values, notes and requirements a Debezium configuration stands for.
pub(super) fn translate(cfg: &BTreeMap<String, String>) -> Result<Overlay, String> {
    let mut o = Overlay::default();
    let keys = &mut Keys { cfg, used: Vec::new() };
    for side in ["key", "value"] {
        converter(keys, &mut o, side)?;
    }
    connector(keys)?;
    connection(keys, &mut o);
    slot_and_publication(keys, &mut o)?;
    delivery_and_heartbeats(keys, &mut o)?;
    type_mapping(keys, &mut o);
    let message_prefixes = messages(keys, &mut o)?;
    let unknown_router = router(keys, &mut o, &message_prefixes)?;
    producer_settings(keys, &mut o)?;
    leftovers(keys, unknown_router, &mut o);
    Ok(o)
}

/// `key.converter` or `value.converter` (`side`), with its registry settings.
fn converter(keys: &mut Keys, o: &mut Overlay, side: &str) -> Result<(), String> {
    let (class_key, schemas_key) = if side == "key" {
        ("key.converter", "key.converter.schemas.enable")
    } else {
        ("value.converter", "value.converter.schemas.enable")
    };
    let schemas = keys.get(schemas_key);
    let flag = format!("{side}_converter");
    match keys.get(class_key).as_deref().map(str::trim) {
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
            let url = keys.get(url_key).or_else(|| keys.get(apicurio_key).map(|u| ccompat_url(&u)));
            let Some(url) = url else {
                return Err(format!("{class_key}={c} needs {url_key} (or {apicurio_key})"));
            };
            shared(o, "schema_registry_url", url.trim().to_owned(), "name different registries")?;
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
            match keys.get(auto_key).or_else(|| keys.get(apicurio_auto)).map(|v| v.trim().to_ascii_lowercase()) {
                Some(v) if v == "true" || v == "false" => {
                    shared(o, "schema_auto_register", v, "disagree on registering schemas")?
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
                if let Some(class) = keys.get("value.converter.value.subject.name.strategy") {
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
    Ok(())
}

/// The connector options that change how Debezium types a column, which placed columns follow
/// (`--time-precision-mode` and the like; a value outboxd does not take is refused when the
/// flags are parsed, and one it does not write is refused for the placed column it affects).
fn type_mapping(keys: &mut Keys, o: &mut Overlay) {
    for (key, flag) in [
        ("time.precision.mode", "time_precision_mode"),
        ("decimal.handling.mode", "decimal_handling_mode"),
        ("binary.handling.mode", "binary_handling_mode"),
        ("interval.handling.mode", "interval_handling_mode"),
    ] {
        if let Some(v) = keys.get(key) {
            o.values.push((flag, v.trim().to_owned()));
        }
    }
}

/// The header converter, the decoder plugin, the connector class and Debezium Server's sink: only
/// what outboxd reproduces.
fn connector(keys: &mut Keys) -> Result<(), String> {
    match keys.get("header.converter").as_deref().map(str::trim) {
        None | Some("org.apache.kafka.connect.storage.SimpleHeaderConverter") => {}
        Some(other) => {
            return Err(format!(
                "header.converter={other}: outboxd writes headers as Connect's default SimpleHeaderConverter does; remove the key"
            ))
        }
    }

    match keys.get("plugin.name").as_deref() {
        None | Some("pgoutput") => {}
        Some(other) => {
            return Err(format!(
                "plugin.name={other} is not supported: outboxd reads pgoutput only; set plugin.name=pgoutput (a new slot is needed)"
            ))
        }
    }
    if let Some(class) = keys.get("connector.class") {
        if !class.ends_with("PostgresConnector") {
            return Err(format!("connector.class {class} is not the PostgreSQL connector"));
        }
    }
    if let Some(t) = keys.get("sink.type") {
        if t != "kafka" {
            return Err(format!("debezium.sink.type={t}: outboxd's file drop-in maps the kafka sink only"));
        }
    }
    Ok(())
}

/// The connection, as one URL (explicit --postgres-url still wins).
fn connection(keys: &mut Keys, o: &mut Overlay) {
    let host = keys.get("database.hostname");
    let port = keys.get("database.port");
    let user = keys.get("database.user");
    let password = keys.get("database.password");
    let dbname = keys.get("database.dbname");
    let sslmode = keys.get("database.sslmode");
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
            if let Some(v) = keys.get(key) {
                url.push_str(&format!("&{param}={}", enc(&v)));
            }
        }
        o.values.push(("postgres_url", url));
    }
}

/// The slot, the publication and the outbox tables.
fn slot_and_publication(keys: &mut Keys, o: &mut Overlay) -> Result<(), String> {
    o.values.push(("slot", keys.get("slot.name").unwrap_or_else(|| "debezium".into())));
    if let Some(f) = keys.get("slot.failover") {
        o.values.push(("slot_failover", f));
    }
    o.values.push(("publication", keys.get("publication.name").unwrap_or_else(|| "dbz_publication".into())));
    match keys.get("publication.autocreate.mode").as_deref() {
        // Debezium's default is all_tables; a publication of the outbox tables routes the same rows.
        None => o.values.push(("publication_autocreate", "filtered".into())),
        Some(m @ ("filtered" | "disabled")) => o.values.push(("publication_autocreate", m.into())),
        Some(other) => {
            return Err(format!(
                "publication.autocreate.mode={other} is not supported; use filtered (a publication of the outbox tables) or disabled"
            ))
        }
    }
    if let Some(list) = keys.get("table.include.list") {
        for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if t.contains(['*', '+', '?', '[', '(', '|', '\\', '^', '$']) {
                return Err(format!(
                    "table.include.list entry {t:?} is a regular expression; list the outbox tables by name (schema.table)"
                ));
            }
            o.values.push(("tables", t.to_owned()));
        }
    }
    Ok(())
}

/// Exactly-once support, heartbeats, tombstones and the snapshot mode.
fn delivery_and_heartbeats(keys: &mut Keys, o: &mut Overlay) -> Result<(), String> {
    // Kafka Connect's exactly-once source support: `required` is our exactly-once delivery;
    // `requested` lets Connect fall back, so it stays at least once (said in a note).
    match keys.get("exactly.once.support").map(|v| v.to_ascii_lowercase()).as_deref() {
        Some("required") => o.values.push(("delivery", "exactly-once".to_owned())),
        Some("requested") => o.notes.push((
            false,
            "exactly.once.support=requested: outboxd delivers at least once unless exactly-once is required".into(),
        )),
        Some(other) => return Err(format!("exactly.once.support={other:?}: expected required or requested")),
        None => {}
    }
    // Heartbeats only as the connector asks: Debezium's default is none (0), and a tool that writes
    // WAL the connector never did surprises whoever runs both during a migration.
    let heartbeat_ms = match keys.get("heartbeat.interval.ms") {
        Some(ms) => ms.parse::<u64>().map_err(|_| format!("heartbeat.interval.ms={ms:?} is not a number"))?,
        None => 0,
    };
    o.values.push(("heartbeat_interval", format!("{heartbeat_ms}ms")));
    if let Some(q) = keys.get("heartbeat.action.query") {
        o.values.push(("heartbeat_action_query", q));
    }
    if let Some(t) = keys.get("tombstones.on.delete") {
        o.notes.push((
            false,
            format!("tombstones.on.delete={t} does not apply: outboxd emits nothing for DELETEs on the outbox"),
        ));
    }
    match keys.get("snapshot.mode").as_deref() {
        None | Some("never" | "no_data" | "nodata") => {}
        Some("initial" | "always" | "initial_only" | "when_needed") => o.require_empty_tables = true,
        Some(other) => {
            return Err(format!("snapshot.mode={other} is not supported; outboxd streams changes only (use never)"))
        }
    }
    Ok(())
}

/// The logical-message prefixes that are events.
fn messages(keys: &mut Keys, o: &mut Overlay) -> Result<Vec<String>, String> {
    // Logical messages: Debezium's prefix list, decoded into events by its
    // DecodeLogicalDecodingMessageContent transform before the EventRouter.
    let message_prefixes: Vec<String> = keys
        .get("message.prefix.include.list")
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
    Ok(message_prefixes)
}

/// The transforms (one EventRouter, optionally after the message decoder) and the router's
/// options; the router options outboxd does not know, for the warning.
fn router(keys: &mut Keys, o: &mut Overlay, message_prefixes: &[String]) -> Result<Vec<String>, String> {
    let cfg = keys.cfg;
    // Transforms: exactly one EventRouter, optionally after the message decoder; nothing else.
    let names: Vec<String> = keys
        .get("transforms")
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
    // Debezium 3.6.1 as shipped (no OpenTelemetry jars in its plugin) writes no traceparent, so
    // the column is read only when the connector names it; otherwise none, where outboxd's own
    // default would read `tracingspancontext` when the table has it.
    router_used.push("tracing.span.context.field".to_owned());
    let trace = router_opts.get("tracing.span.context.field").cloned().unwrap_or_default();
    o.values.push(("tracing_span_context_field", trace));
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
    let unknown: Vec<String> = router_opts
        .keys()
        .filter(|k| !router_used.contains(k))
        .map(|k| format!("transforms.{}.{k}", router.as_deref().unwrap_or("?")))
        .collect();
    Ok(unknown)
}

/// The producer settings, as librdkafka properties, and the sizes of the topics outboxd creates.
fn producer_settings(keys: &mut Keys, o: &mut Overlay) -> Result<(), String> {
    let cfg = keys.cfg;
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
        if let Some(v) = keys.get(key) {
            match v.trim().parse::<i32>() {
                Ok(n) if n == -1 || n >= 1 => o.values.push((id, n.to_string())),
                _ => return Err(format!("{key}={v} is not a number of at least 1 or -1 (the broker's default)")),
            }
        }
    }
    if let Some(g) = keys.get("topic.creation.groups") {
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
    Ok(())
}

/// The keys nothing read: noted as not applying, or warned about as unknown.
fn leftovers(keys: &Keys, unknown_router: Vec<String>, o: &mut Overlay) {
    let cfg = keys.cfg;
    let mut unknown = unknown_router;
    for k in cfg.keys() {
        if producer_level(k).is_some() || keys.used.contains(&k.as_str()) || k.starts_with("transforms") {
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
}

/// A producer setting's precedence (0 top-level security keys, 1 `producer.*`, 2
/// `producer.override.*`) and its Java client name.
pub(super) fn producer_level(k: &str) -> Option<(u8, &str)> {
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

/// Apicurio's native API root (`…/apis/registry/v2` or `v3`) as its Confluent-compatible one.
fn ccompat_url(url: &str) -> String {
    let u = url.trim().trim_end_matches('/');
    match u.rfind("/apis/registry/") {
        Some(i) => format!("{}/apis/ccompat/v7", &u[..i]),
        None => u.to_owned(),
    }
}
