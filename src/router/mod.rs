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

pub mod contract;
pub mod converter;
mod expand;
pub mod mask;
pub mod message;
pub mod oid;
pub mod render;
pub mod row;
mod timestamp;
pub mod topic;
pub mod trace;

use std::sync::Arc;

use bytes::Bytes;

use crate::error::Definite;
use contract::{Contracts, Verdict};
/// The prefix of every header outboxd itself adds to a record (dead-letter copies, masking).
pub const HEADER_PREFIX: &str = "outboxd.";

pub use converter::Converter;
use render::{as_bytes, as_json, as_string, is_json, is_text};
pub use row::{Column, OutboxRow, Row, Table, Value};
use topic::TopicMemo;
pub use topic::TopicRule;

/// One event, ready for a sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub key: Option<Bytes>,
    /// `None` is a null value (tombstone).
    pub payload: Option<Bytes>,
    pub headers: Vec<(String, Bytes)>,
    pub partition: Option<i32>,
    pub timestamp_ms: Option<i64>,
    /// For error messages and logs.
    pub event_id: String,
    /// The `--table-field-event-type` column's text, when the table has it and it is not NULL
    /// (sinks with a type attribute use it, e.g. the webhook's `ce-type`).
    pub event_type: Option<Bytes>,
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
    pub headers: Vec<(String, Bytes)>,
    /// Why `payload` was left out of the dead-letter copy: the masking rules could not be
    /// applied to it ([`mask::Masking::scrub`]).
    pub payload_dropped: Option<String>,
}

impl BadEvent {
    pub fn into_definite(self) -> Definite {
        Definite::Route { event_id: self.event_id.unwrap_or_else(|| "(unknown)".into()), reason: self.message }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementTarget {
    Header(String),
    Envelope(String),
    Partition,
}

/// `col:header[:alias]`, `col:envelope[:alias]` or `col:partition`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub column: String,
    pub target: PlacementTarget,
}

impl Placement {
    /// Parse Debezium's comma-separated `table.fields.additional.placement`. An empty entry
    /// (`""`, `"a:header,,b:header"`, a trailing comma) is an error, as it is for Debezium: it is
    /// a typo more often than an intent. "No placements" is the flag left out, not an empty value.
    pub fn parse_list(s: &str) -> Result<Vec<Placement>, String> {
        if s.trim().is_empty() {
            return Err("is empty; leave the flag out for no placements, or give col:header[:alias], col:envelope[:alias] or col:partition".into());
        }
        s.split(',')
            .map(str::trim)
            .map(|p| {
                if p.is_empty() {
                    return Err(format!("{s:?} has an empty entry; remove the extra comma"));
                }
                let f: Vec<&str> = p.split(':').collect();
                let bad = || format!("{p:?}: expected col:header[:alias], col:envelope[:alias] or col:partition");
                let (col, kind, alias) = match f.as_slice() {
                    [c, k] => (*c, *k, *c),
                    [c, k, a] => (*c, *k, *a),
                    _ => return Err(bad()),
                };
                if col.is_empty() || alias.is_empty() {
                    return Err(bad());
                }
                let target = match kind {
                    "header" => PlacementTarget::Header(alias.to_owned()),
                    "envelope" => PlacementTarget::Envelope(alias.to_owned()),
                    "partition" if f.len() == 2 => PlacementTarget::Partition,
                    _ => return Err(bad()),
                };
                Ok(Placement { column: col.to_owned(), target })
            })
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MissingPolicy {
    Error,
    Ignore,
}

/// Which column's JSON object is expanded into headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadersField {
    /// Our default `headers`: used when the table has it.
    IfPresent(String),
    /// Named explicitly: the table must have it.
    Required(String),
    Disabled,
}

/// Which columns feed which parts of a record, and how the topic is named.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteConfig {
    pub id_field: String,
    pub key_field: String,
    pub type_field: String,
    pub payload_field: String,
    /// `None`: use the transaction's commit time.
    pub timestamp_field: Option<String>,
    pub placements: Vec<Placement>,
    pub additional_missing: MissingPolicy,
    pub route_by_field: String,
    pub topic: Arc<TopicRule>,
    pub tombstone_on_empty_payload: bool,
    pub expand_json_payload: bool,
    pub headers_field: HeadersField,
    /// `--tracing-span-context-field`: the column holding the writer's W3C trace context
    /// ([`trace`]); the same three cases as the headers column.
    pub trace_field: HeadersField,
    /// `--schema-dir`: payload contracts per event type (read from `type_field`).
    pub contracts: Option<Contracts>,
    /// `--key-converter`, `--value-converter`: the bytes Connect's converters would write.
    pub key_converter: Converter,
    pub value_converter: Converter,
}

#[derive(Clone, Copy, Debug)]
struct Col {
    idx: usize,
    type_oid: u32,
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
            rel.columns.iter().position(|c| c.name == col).map(|idx| Col { idx, type_oid: rel.columns[idx].type_oid })
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
        if json_envelope {
            for (col, target) in &placements {
                if matches!(target, PlacementTarget::Envelope(_)) && !converter::json_supports(col.type_oid) {
                    let (name, ty) = (&rel.columns[col.idx].name, converter::type_name(col.type_oid));
                    return Err(Definite::Setup(format!(
                        "--value-converter json: envelope column {name:?} of {table} is a {ty}, which Debezium turns into a Connect type whose JSON outboxd does not reproduce; use --value-converter string, or place a text, uuid, json, integer, boolean or bytea column"
                    )));
                }
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
            topic: cfg.topic.clone(),
            topics: TopicMemo::default(),
            tombstone: cfg.tombstone_on_empty_payload,
            expand_json: cfg.expand_json_payload && cfg.value_converter != Converter::Json,
            envelope,
            table,
        })
    }

    /// The trace context column's value as `traceparent` and `tracestate` headers (they replace
    /// any of those names from the headers column). A value that is not trace context is left
    /// out: the event goes without it, and the first such value per table is logged.
    fn trace_context(&self, v: &[u8], event_id: &str, headers: &mut Vec<(String, Bytes)>) {
        match trace::parse(v) {
            Ok(ctx) => {
                headers.retain(|(k, _)| k != "traceparent" && k != "tracestate");
                headers.push(("traceparent".into(), Bytes::from(ctx.traceparent)));
                if let Some(s) = ctx.tracestate {
                    headers.push(("tracestate".into(), Bytes::from(s)));
                }
            }
            Err(e) => {
                if !self.trace_warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(table = %self.table, %event_id, "the trace context column of this event is not W3C trace context ({e}); events without valid trace context go without traceparent (logged once per table)");
                }
            }
        }
    }

    /// Mark the payload column as a decoded JSON value (logical messages).
    pub(crate) fn payload_is_decoded_json(&mut self) {
        self.conversion.decoded_payload = true;
    }

    /// The key and value as `--key-converter` and `--value-converter` write them (after masking,
    /// which reads the routed JSON).
    pub fn convert(&self, record: Record) -> Record {
        self.conversion.apply(record)
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
        match row.tuple.0.get(c.idx) {
            Some(Value::Text(b)) => as_string(c.type_oid, b).ok(),
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
            Some(c) => enforce(row, c.0, self.payload, &c.1, record),
        }
    }

    /// Turn one inserted row into a record, contracts aside.
    #[allow(clippy::result_large_err)]
    fn build(&self, row: OutboxRow<'_>) -> Result<Record, BadEvent> {
        let cols = &row.tuple.0;
        let value = |c: Col| -> Result<Option<&Bytes>, String> {
            match cols.get(c.idx) {
                Some(Value::Text(b)) => Ok(Some(b)),
                Some(Value::Null) => Ok(None),
                Some(Value::UnchangedToast) => Err(format!("column {} arrived as an unchanged TOAST value", c.idx)),
                Some(Value::Binary(_)) => Err(format!("column {} arrived in binary format", c.idx)),
                None => Err(format!("row has {} columns, expected at least {}", cols.len(), c.idx + 1)),
            }
        };
        // Salvage first, so every error can carry the event's id, key and payload.
        let event_id = || value(self.id).ok().flatten().map(|b| String::from_utf8_lossy(b).into_owned());
        let key_raw = value(self.key).ok().flatten();
        let payload_raw = value(self.payload).ok().flatten();
        let key = key_raw.map(|k| as_bytes(self.key.type_oid, k)).transpose();
        let payload = payload_raw.map(|p| as_bytes(self.payload.type_oid, p)).transpose();
        // Salvage for a dead-letter copy is built only when a row is bad: the converted value when
        // it converts, else the raw text.
        let salvage =
            |raw: Option<&Bytes>, type_oid: u32| raw.map(|v| as_bytes(type_oid, v).unwrap_or_else(|_| v.clone()));
        let bad = |code: &'static str, message: String, topic: Option<String>| BadEvent {
            event_id: event_id(),
            code,
            message,
            topic,
            key: salvage(key_raw, self.key.type_oid),
            payload: salvage(payload_raw, self.payload.type_oid),
            headers: Vec::new(),
            payload_dropped: None,
        };
        let id = match value(self.id) {
            Ok(Some(_)) => event_id().unwrap_or_default(),
            Ok(None) => return Err(bad("null_id", "the event id column is NULL".into(), None)),
            Err(e) => return Err(bad("bad_value", e, None)),
        };
        let routed = match value(self.route_by) {
            Ok(Some(v)) => v,
            Ok(None) => return Err(bad("null_route", "the route-by column is NULL".into(), None)),
            Err(e) => return Err(bad("bad_value", e, None)),
        };
        let topic = match self.topics.get(routed) {
            Some(topic) => topic,
            None => {
                let value = as_string(self.route_by.type_oid, routed).map_err(|e| bad("bad_value", e, None))?;
                let topic = self.topic.topic(&value);
                if let Err(e) = check_topic(&topic) {
                    return Err(bad("invalid_topic", e, Some(topic)));
                }
                self.topics.put(routed, &topic);
                topic
            }
        };
        let fail = |code: &'static str, message: String| bad(code, message, Some(topic.clone()));
        let key = key.map_err(|e| fail("bad_value", e))?;
        let mut payload = payload.map_err(|e| fail("bad_value", e))?;
        if self.expand_json && is_text(self.payload.type_oid) {
            if let Some(p) = &payload {
                match serde_json::from_slice::<serde_json::Value>(p) {
                    Ok(v) => payload = Some(Bytes::from(v.to_string())),
                    Err(e) => tracing::warn!(event_id = %id, error = %e, "payload is not JSON; sending it as text"),
                }
            }
        }
        // Debezium's test is `payload.toString().trim().isEmpty()`: text that is empty or only
        // whitespace (Java's trim drops every char <= U+0020). A `bytea` value's toString is never
        // empty, so only a NULL one counts.
        let empty = match &payload {
            None => true,
            Some(_) if self.payload.type_oid == render::BYTEA => false,
            Some(p) => p.iter().all(|b| *b <= b' '),
        };
        let timestamp_ms = match self.timestamp {
            Some(c) => match value(c).map_err(|e| fail("bad_value", e))? {
                Some(b) => timestamp::epoch_ms(c.type_oid, b).map_err(|e| fail("bad_value", e))?,
                None => Some(pg_us_to_unix_ms(row.commit_time_us)),
            },
            None => Some(pg_us_to_unix_ms(row.commit_time_us)),
        };
        let mut headers = vec![("id".to_owned(), Bytes::copy_from_slice(id.as_bytes()))];
        if let Some(c) = self.headers {
            if let Some(h) = value(c).map_err(|e| fail("bad_value", e))? {
                expand_headers(h, &mut headers).map_err(|e| fail("invalid_json", e))?;
            }
        }
        if let Some(c) = self.trace {
            if let Some(v) = value(c).map_err(|e| fail("bad_value", e))? {
                self.trace_context(v, &id, &mut headers);
            }
        }
        let mut envelope: Option<serde_json::Map<String, serde_json::Value>> = None;
        // The envelope's columns under `--value-converter json`, as JsonConverter writes them.
        let mut json_fields: Vec<(&String, Bytes)> = Vec::new();
        let mut partition = None;
        for (c, target) in &self.placements {
            let v = value(*c).map_err(|e| fail("bad_value", e))?;
            match target {
                PlacementTarget::Header(alias) => {
                    if let Some(v) = v {
                        let b = if is_json(c.type_oid) {
                            v.clone()
                        } else {
                            Bytes::from(as_string(c.type_oid, v).map_err(|e| fail("bad_value", e))?)
                        };
                        headers.push((alias.clone(), b));
                    }
                }
                PlacementTarget::Envelope(alias) if self.json_envelope => {
                    let j = match v {
                        Some(v) => converter::convert(
                            Converter::Json,
                            c.type_oid,
                            as_bytes(c.type_oid, v).map_err(|e| fail("bad_value", e))?,
                        ),
                        None => Bytes::from_static(b"null"),
                    };
                    json_fields.push((alias, j));
                }
                PlacementTarget::Envelope(alias) => {
                    let j = match v {
                        Some(v) => as_json(c.type_oid, v).map_err(|e| fail("bad_value", e))?,
                        None => serde_json::Value::Null,
                    };
                    envelope.get_or_insert_with(serde_json::Map::new).insert(alias.clone(), j);
                }
                PlacementTarget::Partition => {
                    let Some(v) = v else { continue };
                    let p = std::str::from_utf8(v).ok().and_then(|s| s.parse::<i32>().ok()).filter(|p| *p >= 0);
                    partition = Some(p.ok_or_else(|| {
                        fail(
                            "bad_value",
                            format!(
                                "partition column value {:?} is not a non-negative integer",
                                String::from_utf8_lossy(v)
                            ),
                        )
                    })?);
                }
            }
        }
        if self.tombstone && empty {
            // Headers and partition stay: consumers of a compacted topic still see which event
            // deleted the key.
            return Ok(Record {
                topic,
                key,
                payload: None,
                headers,
                partition,
                timestamp_ms,
                event_id: id,
                event_type: self.raw_event_type(cols),
            });
        }
        if self.json_envelope {
            let p = match &payload {
                None => Bytes::from_static(b"null"),
                // A logical message's payload, which Debezium's decoder has typed already.
                Some(p) if self.conversion.decoded_payload => expand::value(p)
                    .map(Bytes::from)
                    .unwrap_or_else(|_| converter::jackson_string(&String::from_utf8_lossy(p))),
                Some(p) => converter::convert(Converter::Json, self.payload.type_oid, p.clone()),
            };
            let mut out = Vec::with_capacity(
                p.len() + 16 + json_fields.iter().map(|(a, v)| a.len() + v.len() + 4).sum::<usize>(),
            );
            out.extend_from_slice(b"{\"payload\":");
            out.extend_from_slice(&p);
            for (alias, v) in &json_fields {
                out.push(b',');
                out.extend_from_slice(&converter::jackson_string(alias));
                out.push(b':');
                out.extend_from_slice(v);
            }
            out.push(b'}');
            payload = Some(Bytes::from(out));
        } else if let Some(mut env) = envelope.or_else(|| self.envelope.then(serde_json::Map::new)) {
            let p = match &payload {
                None => serde_json::Value::Null,
                Some(p)
                    if is_json(self.payload.type_oid)
                        || (self.expand_json && serde_json::from_slice::<serde_json::Value>(p).is_ok()) =>
                {
                    serde_json::from_slice(p).unwrap_or(serde_json::Value::Null)
                }
                Some(p) => serde_json::Value::String(String::from_utf8_lossy(p).into_owned()),
            };
            env.insert("payload".into(), p);
            payload = Some(Bytes::from(serde_json::Value::Object(env).to_string()));
        }
        let event_type = self.raw_event_type(cols);
        Ok(Record { topic, key, payload, headers, partition, timestamp_ms, event_id: id, event_type })
    }

    /// The event type column's text as sent (a cheap `Bytes` clone, no conversion).
    fn raw_event_type(&self, cols: &[Value]) -> Option<Bytes> {
        match cols.get(self.event_type?.idx) {
            Some(Value::Text(b)) => Some(b.clone()),
            _ => None,
        }
    }
}

/// Check a routed record's payload column (as the producer wrote it, before any envelope) against
/// the contract of its event type. A violation keeps the whole record for the dead-letter copy.
#[allow(clippy::result_large_err)]
fn enforce(
    row: OutboxRow<'_>,
    type_col: Col,
    payload_col: Col,
    contracts: &Contracts,
    record: Record,
) -> Result<Record, BadEvent> {
    let text = |c: Col| match row.tuple.0.get(c.idx) {
        Some(Value::Text(b)) => Some(b),
        _ => None,
    };
    let event_type = text(type_col).and_then(|b| as_string(type_col.type_oid, b).ok());
    // A tombstone (no value) has nothing to check; otherwise the column converted when the record
    // was built, so it converts again.
    let payload = match record.payload {
        None => None,
        Some(_) => text(payload_col).and_then(|b| as_bytes(payload_col.type_oid, b).ok()),
    };
    let violation = match contracts.check(event_type.as_deref(), payload.as_deref()) {
        Verdict::Valid | Verdict::Unchecked => return Ok(record),
        Verdict::Violation(v) => v,
    };
    let mut headers = record.headers;
    headers.extend(violation.header());
    Err(BadEvent {
        event_id: Some(record.event_id),
        code: contract::CODE,
        message: violation.message,
        topic: Some(record.topic),
        key: record.key,
        payload: record.payload,
        headers,
        payload_dropped: None,
    })
}

/// Each top-level key of a JSON object becomes a header: strings as their text, others as JSON.
fn expand_headers(json: &[u8], out: &mut Vec<(String, Bytes)>) -> Result<(), String> {
    if json == b"{}" {
        return Ok(());
    }
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(json).map_err(|e| format!("the headers column is not a JSON object: {e}"))?;
    for (k, v) in map {
        let b = match v {
            serde_json::Value::String(s) => Bytes::from(s),
            other => Bytes::from(other.to_string()),
        };
        out.push((k, b));
    }
    Ok(())
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
