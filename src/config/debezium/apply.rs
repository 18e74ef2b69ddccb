//! Merging a translated Debezium file ([`Overlay`]) under the `run` flags.
//!
//! The overlay names flags by their clap argument id (a string), so this is the one place that
//! maps those ids to [`Flags`] fields; an id it does not know is a bug, reported as such.

use clap::ValueEnum;

use super::Overlay;
use crate::config::{DeliveryMode, Flags, InvalidOp, PublicationAutocreate};
use crate::error::Definite;
use crate::router::{Converter, MissingPolicy};

/// Set every field the overlay names, unless the user set it explicitly.
pub fn apply(a: &mut Flags, o: &Overlay, explicit: &dyn Fn(&str) -> bool) -> Result<(), Definite> {
    let bad = |id: &str, v: &str| Definite::Config(format!("--debezium-config: value {v:?} for {id} is not valid"));
    let boolean = |id: &str, v: &str| match v.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(bad(id, v)),
    };
    let mut replaced_tables = false;
    let mut replaced_prefixes = false;
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
            "postgres_url" => a.source.postgres_url = Some(v),
            "slot" => a.wal.slot = v,
            "publication" => a.wal.publication = v,
            "publication_autocreate" => {
                a.wal.publication_autocreate = PublicationAutocreate::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            "messages_prefixes" => {
                if !replaced_prefixes {
                    a.wal.messages_prefixes.clear();
                    replaced_prefixes = true;
                }
                a.wal.messages_prefixes.push(v);
            }
            "tables" => {
                if !replaced_tables {
                    a.source.tables.clear();
                    replaced_tables = true;
                }
                a.source.tables.push(v);
            }
            "kafka_brokers" => a.sinks.kafka.client.kafka_brokers = v,
            "heartbeat_interval" => a.wal.heartbeat_interval = v,
            "delivery" => {
                let mode = DeliveryMode::from_str(&v, true).map_err(|_| bad(id, &v))?;
                match &mut a.delivery {
                    Some(d) => d.delivery = mode,
                    // `poll` and `backfill` take no --delivery: they deliver at least once.
                    None if mode == DeliveryMode::ExactlyOnce => return Err(Definite::Config(
                        "--debezium-config asks for exactly-once delivery (exactly.once.support=required), which only \
                         outboxd run gives (Kafka transactions); this command delivers at least once: use outboxd run"
                            .into(),
                    )),
                    None => {}
                }
            }
            "heartbeat_action_query" => a.wal.heartbeat_action_query = Some(v),
            "table_field_event_id" => a.source.table_field_event_id = v,
            "table_field_event_key" => a.source.table_field_event_key = v,
            "table_field_event_type" => a.source.table_field_event_type = v,
            "table_field_event_payload" => a.source.table_field_event_payload = v,
            "table_field_event_timestamp" => a.source.table_field_event_timestamp = v,
            "table_fields_additional_placement" => a.source.table_fields_additional_placement = Some(v),
            "table_field_additional_missing" => {
                a.source.table_field_additional_missing = MissingPolicy::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            "time_precision_mode" => {
                a.source.time_precision_mode = ValueEnum::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            "decimal_handling_mode" => {
                a.source.decimal_handling_mode = ValueEnum::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            "binary_handling_mode" => {
                a.source.binary_handling_mode = ValueEnum::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            "interval_handling_mode" => {
                a.source.interval_handling_mode = ValueEnum::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            "route_by_field" => a.route.route_by_field = v,
            "route_topic_regex" => a.route.route_topic_regex = v,
            "route_topic_replacement" => a.route.route_topic_replacement = v,
            "route_tombstone_on_empty_payload" => a.route.route_tombstone_on_empty_payload = boolean(id, &v)?,
            "table_op_invalid_behavior" => {
                a.wal.table_op_invalid_behavior = InvalidOp::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            "table_expand_json_payload" => a.source.table_expand_json_payload = boolean(id, &v)?,
            "table_field_event_headers" => a.source.table_field_event_headers = Some(v),
            "tracing_span_context_field" => a.source.tracing_span_context_field = Some(v),
            "slot_failover" => a.wal.slot_failover = boolean(id, &v)?,
            "key_converter" => a.route.key_converter = Converter::from_str(&v, true).map_err(|_| bad(id, &v))?,
            "value_converter" => a.route.value_converter = Converter::from_str(&v, true).map_err(|_| bad(id, &v))?,
            "schema_registry_url" => a.route.registry.schema_registry_url = Some(v),
            "schema_auto_register" => a.route.schema_auto_register = boolean(id, &v)?,
            "subject_name_strategy" => {
                a.route.subject_name_strategy =
                    crate::format::SubjectStrategy::from_str(&v, true).map_err(|_| bad(id, &v))?
            }
            other => return Err(Definite::Bug(format!("debezium overlay names unknown flag {other}"))),
        }
    }
    Ok(())
}
