//! The router's input: what a source knows of an outbox table ([`Table`]) and of one of its rows
//! ([`Row`]), whichever way the row was read.
//!
//! The WAL source turns pgoutput's Relation and Insert messages into these (`source::wal::input`;
//! the decoder writes the values as [`Value`]s already),
//! `outboxd poll` and `outboxd backfill` build them from their own queries; the router knows
//! nothing of where a row came from.
//!
//! # Invariants
//! * A [`Table`] is described once per table version (a Relation message, a poller's start-up, a
//!   backfill's start), not per row: [`super::Route::compile`] resolves names and types from it.
//! * A [`Row`]'s values are in the table's column order, each in PostgreSQL's text output form
//!   (every source reads text, as pgoutput sends it); the values are shared `Bytes`, so handing a
//!   row to the router copies no field.

use bytes::Bytes;

/// An outbox table as the router needs it: its name and its columns in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub schema: String,
    pub name: String,
    pub columns: Vec<Column>,
}

/// One column of a [`Table`]: its name and its type's oid (the router reads values by type).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub type_oid: u32,
    /// The type modifier (`atttypmod`: a `numeric`'s scale, a `timestamp`'s precision), -1 for
    /// none; placed columns are typed by it as Debezium types them.
    pub type_modifier: i32,
}

/// One column's value in a [`Row`].
#[derive(Clone, Debug, PartialEq, Eq)]
// pgoutput's decoder writes these directly (`pg::pgoutput::TupleValue` is this type).
pub enum Value {
    Null,
    /// pgoutput's marker for a TOASTed value an UPDATE left unchanged: the row has no value for
    /// it, so the router refuses it when it needs the column.
    UnchangedToast,
    /// The value in PostgreSQL's text output format.
    Text(Bytes),
    /// A value in binary format, which no source asks for: the router refuses it rather than
    /// misread it.
    Binary(Bytes),
}

/// One row's values, in its [`Table`]'s column order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Row(pub Vec<Value>);

/// One inserted row of an outbox table with the context the router needs.
#[derive(Clone, Copy, Debug)]
pub struct OutboxRow<'a> {
    pub tuple: &'a Row,
    /// Commit time of the row's transaction, µs since 2000-01-01 UTC.
    pub commit_time_us: i64,
}
