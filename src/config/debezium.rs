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
pub use crate::debezium_offset as offsets;
mod producer;
mod providers;
mod translate;

pub use apply::apply;
use translate::translate;

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
