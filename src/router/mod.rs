//! The router: one outbox row in, one Kafka-shaped [`Record`] out, as Debezium's Outbox EventRouter
//! would build it.
//!
//! Pure and synchronous. Column positions and types are resolved once per [`Table`] (a table version) into
//! a [`Route`]; per row the work is index lookups and, only when an option asks for it, JSON work.
//!
//! * topic: [`topic::TopicRule`] applied to the route-by column's value;
//! * key: the key column (NULL means no key);
//! * value: the payload column — JSON columns and text as their exact bytes, `bytea` raw; with
//!   envelope placements configured, always a JSON object `{"payload": …, alias: …}` (even when
//!   `--table-field-additional-missing ignore` dropped every envelope column, so one topic keeps one
//!   shape); NULL is a null value. With `--route-tombstone-on-empty-payload`, a NULL, empty or
//!   whitespace-only text payload is a tombstone (null value, no envelope) that keeps its headers
//!   and partition, as Debezium's does;
//! * headers: `id`, then the expanded top-level keys of the headers column, then header placements;
//! * partition: a `col:partition` placement; timestamp: the timestamp column, else the commit time.
//!
//! With `--schema-dir`, a routed record whose payload breaks its event type's contract
//! ([`contract`]) is refused too; without it, that step is one `Option` test per row.
//!
//! A row that cannot become a record is a [`BadEvent`] carrying what could be salvaged (key,
//! payload, intended topic, headers) so the caller can stop, dead-letter or skip it.
//!
//! [`mask`] is the step after routing: `--mask`/`--encrypt` rewrite the record (and scrub a bad
//! event's salvage) before anything else sees it.

mod build;
mod config;
pub mod contract;
pub mod converter;
mod expand;
pub mod mask;
pub mod message;
pub mod oid;
pub mod placed;
pub mod render;
pub mod row;
mod timestamp;
pub mod topic;
pub mod trace;

use std::sync::Arc;

use bytes::Bytes;
/// UTF-8 text over [`Bytes`]: a record's topic (one per route-by value, from the topic memo) and
/// event id (a slice of the WAL message it came in), which its delivery handle and its ack share
/// with it rather than copy.
pub use bytestring::ByteString as Text;

use crate::error::Definite;
use contract::Contracts;
/// A header's name: borrowed for the fixed names outboxd writes itself (`id`, `traceparent`, the
/// fixed `outboxd.*` ones), so the header every record carries costs no allocation; owned for
/// names a row, a dead-letter copy or a sink's read-back brings, and for numbered ones such as
/// `outboxd.escaped-header.N`.
pub type HeaderName = std::borrow::Cow<'static, str>;
/// One record header: its name and its value's bytes.
pub type Header = (HeaderName, Bytes);

/// The prefix of every header outboxd itself adds to a record (dead-letter copies, masking).
pub const HEADER_PREFIX: &str = "outboxd.";

pub use config::{HeadersField, MissingPolicy, Placement, PlacementTarget, RouteConfig};
pub use converter::Converter;
use render::as_string;
pub use row::{Column, Field, OutboxRow, Row, Table, Value, WireRow};
use topic::TopicMemo;
pub use topic::TopicRule;

/// One event, ready for a sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub topic: Text,
    pub key: Option<Bytes>,
    /// `None` is a null value (tombstone).
    pub payload: Option<Bytes>,
    pub headers: Vec<Header>,
    pub partition: Option<i32>,
    pub timestamp_ms: Option<i64>,
    /// For error messages and logs.
    pub event_id: Text,
    /// The `--table-field-event-type` column's text, when the table has it and it is not NULL
    /// (sinks with a type attribute use it, e.g. the webhook's `ce-type`).
    pub event_type: Option<Bytes>,
}

/// A record as the registry formats read and rewrite it (`--value-converter avro` and the like):
/// the router knows the formats' input, the formats know nothing of the router.
impl<'a> From<&'a mut Record> for crate::format::Fields<'a> {
    fn from(r: &'a mut Record) -> Self {
        crate::format::Fields {
            topic: &r.topic,
            event_type: r.event_type.as_ref(),
            key: &mut r.key,
            payload: &mut r.payload,
        }
    }
}

/// A row that cannot be routed, with what could be salvaged for a dead-letter record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadEvent {
    pub event_id: Option<String>,
    /// Stable reason code (`null_id`, `null_route`, `invalid_topic`, `invalid_json`, `bad_value`,
    /// `schema`).
    pub code: &'static str,
    pub message: String,
    pub topic: Option<String>,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    /// Headers for the dead-letter copy: the record's own when it was routed (a contract
    /// violation), plus any that explain the failure (`outboxd.schema.errors`).
    pub headers: Vec<Header>,
    /// Why `payload` was left out of the dead-letter copy: the masking rules could not be
    /// applied to it ([`mask::Masking::scrub`]).
    pub payload_dropped: Option<String>,
}

impl BadEvent {
    pub fn into_definite(self) -> Definite {
        Definite::Route { event_id: self.event_id.unwrap_or_else(|| "(unknown)".into()), reason: self.message }
    }
}

#[derive(Clone, Copy, Debug)]
struct Col {
    idx: usize,
    type_oid: u32,
    /// The type modifier (-1 for none), which types a placed column.
    typmod: i32,
}

/// Column positions for one version of one outbox relation.
#[derive(Clone, Debug)]
pub struct Route {
    table: String,
    id: Col,
    key: Col,
    route_by: Col,
    payload: Col,
    timestamp: Option<Col>,
    headers: Option<Col>,
    /// The trace context column ([`trace`]), and whether a bad value was logged already.
    trace: Option<Col>,
    trace_warned: Arc<std::sync::atomic::AtomicBool>,
    /// The event type column, when the table has it (only `--mask-event-type` reads it).
    event_type: Option<Col>,
    placements: Vec<(Col, PlacementTarget)>,
    /// How Debezium types the placed columns ([`placed`]).
    mapping: placed::Mapping,
    topic: Arc<TopicRule>,
    /// Topics already built from route-by values of this relation.
    topics: TopicMemo,
    tombstone: bool,
    expand_json: bool,
    /// An envelope placement is configured, whether or not its column exists: the value is
    /// always an envelope then (Debezium decides this from the configuration, not the row).
    envelope: bool,
    /// The event type column and the contracts its values select, with `--schema-dir` (boxed:
    /// routes are kept per relation, and most run without contracts).
    contract: Option<Box<(Col, Contracts)>>,
    /// `--key-converter`, `--value-converter` and what they depend on.
    conversion: converter::Conversion,
    /// An envelope under `--value-converter json`: written as JsonConverter writes Debezium's
    /// envelope struct (the payload first, then each envelope column in placement order, each
    /// typed as Debezium types its column), not as outboxd's own JSON object.
    json_envelope: bool,
}

impl Route {
    /// Resolve the configured columns against a table's description.
    pub fn compile(cfg: &RouteConfig, rel: &Table) -> Result<Route, Definite> {
        let table = format!("{}.{}", rel.schema, rel.name);
        let find = |col: &str| {
            rel.columns.iter().position(|c| c.name == col).map(|idx| Col {
                idx,
                type_oid: rel.columns[idx].type_oid,
                typmod: rel.columns[idx].type_modifier,
            })
        };
        let need = |col: &str, flag: &str| {
            find(col).ok_or_else(|| {
                Definite::Setup(format!(
                    "table {table} has no column {col:?} (set by {flag}); add the column or change the flag"
                ))
            })
        };
        let mut placements = Vec::new();
        for p in &cfg.placements {
            match (find(&p.column), cfg.additional_missing) {
                (Some(c), _) => placements.push((c, p.target.clone())),
                (None, MissingPolicy::Ignore) => {}
                (None, MissingPolicy::Error) => {
                    return Err(Definite::Setup(format!(
                        "table {table} has no column {:?} (named in --table-fields-additional-placement); add it, fix the placement, or pass --table-field-additional-missing ignore",
                        p.column
                    )))
                }
            }
        }
        let headers = match &cfg.headers_field {
            HeadersField::IfPresent(c) => find(c),
            HeadersField::Required(c) => Some(need(c, "--table-field-event-headers")?),
            HeadersField::Disabled => None,
        };
        let trace = match &cfg.trace_field {
            HeadersField::IfPresent(c) => find(c),
            HeadersField::Required(c) => Some(need(c, "--tracing-span-context-field")?),
            HeadersField::Disabled => None,
        };
        let contract = match &cfg.contracts {
            Some(c) => {
                let col = find(&cfg.type_field).ok_or_else(|| {
                    Definite::Setup(format!(
                        "table {table} has no column {:?} (the event type, set by --table-field-event-type) that --schema-dir needs to pick a schema; add the column or point the flag at it",
                        cfg.type_field
                    ))
                })?;
                Some(Box::new((col, c.clone())))
            }
            None => None,
        };
        let key = need(&cfg.key_field, "--table-field-event-key")?;
        let payload = need(&cfg.payload_field, "--table-field-event-payload")?;
        for (conv, col, flag, ok) in [
            (cfg.key_converter, key, "--key-converter", converter::supports_key as fn(Converter, u32) -> bool),
            (cfg.value_converter, payload, "--value-converter", converter::supports),
        ] {
            if !ok(conv, col.type_oid) {
                let (name, ty) = (&rel.columns[col.idx].name, converter::type_name(col.type_oid));
                return Err(Definite::Setup(
                    if matches!(conv, Converter::Avro | Converter::JsonSchema | Converter::Protobuf) {
                        format!("{flag} {}: column {name:?} of {table} is a {ty}; the registry formats take the payload as JSON text: use a json, jsonb or text column", match conv { Converter::Avro => "avro", Converter::JsonSchema => "json-schema", _ => "protobuf" })
                    } else if conv == Converter::Json {
                        format!("{flag} json: column {name:?} of {table} is a {ty}, which Debezium turns into a Connect type whose JSON outboxd does not reproduce; use {flag} string, or a text, uuid, json, integer, boolean or bytea column")
                    } else {
                        format!("{flag} bytes (ByteArrayConverter): column {name:?} of {table} is a {ty}, and the converter takes only bytea (Debezium fails on it too); use {flag} string")
                    },
                ));
            }
        }
        let envelope = cfg.placements.iter().any(|p| matches!(p.target, PlacementTarget::Envelope(_)));
        let json_envelope = envelope && cfg.value_converter == Converter::Json;
        for (col, target) in &placements {
            // Header and JsonConverter envelope columns are written as Debezium writes them;
            // outboxd's own envelope (StringConverter) is a documented difference of its own.
            let written = match target {
                PlacementTarget::Header(_) => true,
                PlacementTarget::Envelope(_) => json_envelope,
                PlacementTarget::Partition => false,
            };
            if let Some(why) = placed::refusal(col.type_oid, cfg.mapping).filter(|_| written) {
                let name = &rel.columns[col.idx].name;
                return Err(Definite::Setup(format!(
                    "--table-fields-additional-placement: column {name:?} of {table} {why}"
                )));
            }
        }
        Ok(Route {
            json_envelope,
            contract,
            conversion: converter::Conversion {
                key: cfg.key_converter,
                value: cfg.value_converter,
                key_type: key.type_oid,
                payload_type: payload.type_oid,
                debezium_expand: cfg.expand_json_payload && cfg.value_converter == Converter::Json,
                decoded_payload: false,
                tombstone: cfg.tombstone_on_empty_payload,
                envelope_written: json_envelope,
            },
            id: need(&cfg.id_field, "--table-field-event-id")?,
            key,
            route_by: need(&cfg.route_by_field, "--route-by-field")?,
            payload,
            timestamp: match &cfg.timestamp_field {
                Some(c) => Some(need(c, "--table-field-event-timestamp")?),
                None => None,
            },
            headers,
            trace,
            trace_warned: Default::default(),
            event_type: find(&cfg.type_field),
            placements,
            mapping: cfg.mapping,
            topic: cfg.topic.clone(),
            topics: TopicMemo::default(),
            tombstone: cfg.tombstone_on_empty_payload,
            expand_json: cfg.expand_json_payload && cfg.value_converter != Converter::Json,
            envelope,
            table,
        })
    }

    /// Mark the payload column as a decoded JSON value (logical messages).
    pub(crate) fn payload_is_decoded_json(&mut self) {
        self.conversion.decoded_payload = true;
    }

    /// The key and value as `--key-converter` and `--value-converter` write them (after masking,
    /// which reads the routed JSON).
    #[inline]
    pub fn convert(&self, mut record: Record) -> Record {
        self.convert_in_place(&mut record);
        record
    }

    /// [`Route::convert`] on a record where it lies (the per-row path: no move of the record).
    #[inline]
    pub fn convert_in_place(&self, record: &mut Record) {
        self.conversion.apply(record);
    }

    /// `schema.table` of the relation this route was compiled for.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Whether the table has the `--table-field-event-type` column.
    pub fn has_event_type(&self) -> bool {
        self.event_type.is_some()
    }

    /// The row's event type as text; `None` when NULL, absent or unreadable.
    pub fn event_type(&self, row: OutboxRow<'_>) -> Option<String> {
        let c = self.event_type?;
        match row.tuple.get(c.idx) {
            Some(Field::Text(b)) => as_string(c.type_oid, b).ok(),
            _ => None,
        }
    }

    /// Turn one inserted row into a record that keeps its contract.
    // Bad events are rare; carrying their salvage inline beats a box on every good row.
    #[allow(clippy::result_large_err)]
    pub fn route(&self, row: OutboxRow<'_>) -> Result<Record, BadEvent> {
        let record = self.build(row)?;
        match &self.contract {
            None => Ok(record),
            Some(c) => build::enforce(row, c.0, self.payload, &c.1, record),
        }
    }
}

/// Kafka's topic rules: 1-249 of `[A-Za-z0-9._-]`, and not `.` or `..`.
pub(crate) fn check_topic(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!("topic {t:?} is not a legal Kafka topic name (1-249 of A-Z a-z 0-9 . _ -)"))
    }
}

/// µs between 1970-01-01 and 2000-01-01.
const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

pub fn pg_us_to_unix_ms(us: i64) -> i64 {
    us.saturating_add(PG_EPOCH_OFFSET_US).div_euclid(1000)
}

#[cfg(test)]
mod tests;
