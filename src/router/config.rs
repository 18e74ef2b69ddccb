//! The routing configuration: which columns feed which parts of a record, how the topic is named,
//! and what the converters write ([`RouteConfig`]), built once from the flags by `config`.
//!
//! # Invariants
//! * Nothing here reads a table: names are checked against a table's columns when a route is
//!   compiled for it ([`super::Route::compile`]), so one configuration serves every table version.
//! * A placement list is never empty: "no placements" is the flag left out.

use std::sync::Arc;

use super::contract::Contracts;
use super::converter::Converter;
use super::topic::TopicRule;

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
    /// ([`trace`](super::trace)); the same three cases as the headers column.
    pub trace_field: HeadersField,
    /// `--schema-dir`: payload contracts per event type (read from `type_field`).
    pub contracts: Option<Contracts>,
    /// `--key-converter`, `--value-converter`: the bytes Connect's converters would write.
    pub key_converter: Converter,
    pub value_converter: Converter,
    /// The connector options that change how Debezium types a placed column
    /// (`time.precision.mode` and the like, [`super::placed`]).
    pub mapping: super::placed::Mapping,
}
