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
//!   (every source reads text, as pgoutput sends it). A WAL row is a view of its message (offsets,
//!   not a `Bytes` per column); the router reads values as slices and takes a shared slice only of
//!   those a record keeps, so handing a row to the router copies no field.

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

/// One column's value as a source hands it over when it builds a [`Row`] from values of its own
/// (`outboxd poll`, `outboxd backfill`, logical messages, tests).
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// One column's value as the router reads it: borrowed from the [`Row`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field<'a> {
    Null,
    UnchangedToast,
    Text(&'a [u8]),
    Binary(&'a [u8]),
}

/// One row's values, in its [`Table`]'s column order.
///
/// A row decoded from pgoutput is a view of the message it came in: the message's `Bytes` and
/// one cell (kind, offset, length) per column in one allocation, so decoding takes no reference
/// per column; a value is handed out as a `&[u8]` ([`Row::get`]) or, where a record keeps it, as
/// a shared slice of the message ([`Row::share`]). The cells are on the heap, not inline: a row
/// travels inside every decoded message, which is moved a few times on its way, and a large
/// inline array cost more in copies than the allocation it saved. Rows other sources build from their own
/// values ([`From<Vec<Value>>`]) keep those values as they are.
#[derive(Clone)]
pub struct Row(Repr);

#[derive(Clone)]
enum Repr {
    Values(Vec<Value>),
    Wire { buf: Bytes, cells: Vec<Cell> },
}

/// A column of a [`Repr::Wire`] row: `buf[start..start + len]` for text and binary values.
/// Offsets are `u32`: [`WireRow::push`] refuses a buffer they cannot address, and the decoder,
/// which fills rows with [`WireRow::push_within`], checks the message's length against `u32`
/// before its loop and each value's length against the bytes left.
#[derive(Clone, Copy, Debug)]
struct Cell {
    start: u32,
    len: u32,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Null,
    UnchangedToast,
    Text,
    Binary,
}

impl Default for Row {
    fn default() -> Self {
        Row(Repr::Values(Vec::new()))
    }
}

impl From<Vec<Value>> for Row {
    fn from(values: Vec<Value>) -> Self {
        Row(Repr::Values(values))
    }
}

impl Row {
    /// How many columns the row has.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Values(v) => v.len(),
            Repr::Wire { cells, .. } => cells.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Column `i`'s value; `None` past the last column.
    #[inline(always)]
    pub fn get(&self, i: usize) -> Option<Field<'_>> {
        match &self.0 {
            Repr::Values(v) => v.get(i).map(|v| match v {
                Value::Null => Field::Null,
                Value::UnchangedToast => Field::UnchangedToast,
                Value::Text(b) => Field::Text(b),
                Value::Binary(b) => Field::Binary(b),
            }),
            Repr::Wire { buf, cells } => {
                let c = cells.get(i)?;
                // In bounds by construction (`WireRow::push`, or the decoder's checks before
                // `WireRow::push_within`); `get` keeps even a bug panic-free
                // in release builds, and says so loudly in tests.
                debug_assert!(c.start as usize + c.len as usize <= buf.len(), "cell {i} outside its message");
                let bytes = || buf.get(c.start as usize..c.start as usize + c.len as usize).unwrap_or_default();
                Some(match c.kind {
                    Kind::Null => Field::Null,
                    Kind::UnchangedToast => Field::UnchangedToast,
                    Kind::Text => Field::Text(bytes()),
                    Kind::Binary => Field::Binary(bytes()),
                })
            }
        }
    }

    /// Column `i`'s text or binary value as shared bytes (a reference on the message, not a
    /// copy); `None` for NULL, an unchanged TOAST value or past the last column.
    #[inline(always)]
    pub fn share(&self, i: usize) -> Option<Bytes> {
        match &self.0 {
            Repr::Values(v) => match v.get(i)? {
                Value::Text(b) | Value::Binary(b) => Some(b.clone()),
                Value::Null | Value::UnchangedToast => None,
            },
            Repr::Wire { buf, cells } => {
                let c = cells.get(i).filter(|c| matches!(c.kind, Kind::Text | Kind::Binary))?;
                let (start, end) = (c.start as usize, c.start as usize + c.len as usize);
                debug_assert!(end <= buf.len(), "cell {i} outside its message");
                (end <= buf.len()).then(|| buf.slice(start..end))
            }
        }
    }

    /// Column `i`'s value as shared bytes when it is text; `None` otherwise.
    #[inline(always)]
    pub fn share_text(&self, i: usize) -> Option<Bytes> {
        match &self.0 {
            Repr::Values(v) => match v.get(i)? {
                Value::Text(b) => Some(b.clone()),
                _ => None,
            },
            Repr::Wire { buf, cells } => {
                let c = cells.get(i).filter(|c| c.kind == Kind::Text)?;
                let (start, end) = (c.start as usize, c.start as usize + c.len as usize);
                debug_assert!(end <= buf.len(), "cell {i} outside its message");
                (end <= buf.len()).then(|| buf.slice(start..end))
            }
        }
    }

    /// Every column's value, in order.
    pub fn fields(&self) -> impl Iterator<Item = Field<'_>> {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

#[cfg(test)]
impl Row {
    /// The values packed into one buffer and viewed as the WAL source's rows are (tests of the
    /// router read rows in that form).
    pub(crate) fn packed(values: Vec<Value>) -> Row {
        let mut buf = Vec::new();
        let spans: Vec<_> = values
            .iter()
            .map(|v| match v {
                Value::Text(b) | Value::Binary(b) => {
                    buf.extend_from_slice(b);
                    Some((buf.len() - b.len()..buf.len(), matches!(v, Value::Binary(_))))
                }
                Value::Null | Value::UnchangedToast => None,
            })
            .collect();
        let mut row = WireRow::new(Bytes::from(buf), values.len());
        for (v, span) in values.iter().zip(spans) {
            match (v, span) {
                (_, Some((range, binary))) => assert!(row.push(range, binary)),
                (Value::Null, None) => row.null(),
                (_, None) => row.unchanged_toast(),
            }
        }
        row.finish()
    }
}

/// Two rows are equal when their values are, however they are held.
impl PartialEq for Row {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.fields().eq(other.fields())
    }
}

impl Eq for Row {}

impl std::fmt::Debug for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.fields()).finish()
    }
}

/// A [`Row`] over a received message, built cell by cell as the decoder reads the tuple.
pub struct WireRow {
    buf: Bytes,
    cells: Vec<Cell>,
}

impl WireRow {
    /// A row over `buf` with room for `columns` cells.
    pub fn new(buf: Bytes, columns: usize) -> WireRow {
        WireRow { buf, cells: Vec::with_capacity(columns) }
    }

    #[inline(always)]
    pub fn null(&mut self) {
        self.cells.push(Cell { start: 0, len: 0, kind: Kind::Null });
    }

    #[inline(always)]
    pub fn unchanged_toast(&mut self) {
        self.cells.push(Cell { start: 0, len: 0, kind: Kind::UnchangedToast });
    }

    /// A text (`binary == false`) or binary value at `buf[range]`. `false` when the range is not
    /// within the buffer or not addressable in 32 bits; the caller reads the tuple another way.
    #[must_use]
    #[inline(always)]
    pub fn push(&mut self, range: std::ops::Range<usize>, binary: bool) -> bool {
        let (Ok(start), Ok(len)) = (u32::try_from(range.start), u32::try_from(range.len())) else { return false };
        if range.start > range.end || range.end > self.buf.len() {
            return false;
        }
        let kind = if binary { Kind::Binary } else { Kind::Text };
        self.cells.push(Cell { start, len, kind });
        true
    }

    /// A text (`binary == false`) or binary value at `buf[start..start + len]`, which the caller
    /// has checked lies within the buffer (the decoder's loop, which already compared the length
    /// with the bytes left). A cell outside it would still never panic: [`Row`]'s reads are
    /// checked and give nothing for it (and fail a debug assertion).
    #[inline(always)]
    pub fn push_within(&mut self, start: u32, len: u32, binary: bool) {
        debug_assert!(start as usize + len as usize <= self.buf.len(), "cell outside its message");
        let kind = if binary { Kind::Binary } else { Kind::Text };
        self.cells.push(Cell { start, len, kind });
    }

    pub fn finish(self) -> Row {
        Row(Repr::Wire { buf: self.buf, cells: self.cells })
    }
}

/// One inserted row of an outbox table with the context the router needs.
#[derive(Clone, Copy, Debug)]
pub struct OutboxRow<'a> {
    pub tuple: &'a Row,
    /// Commit time of the row's transaction, µs since 2000-01-01 UTC.
    pub commit_time_us: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Vec<Value> {
        vec![
            Value::Text(Bytes::from_static(b"abc")),
            Value::Null,
            Value::UnchangedToast,
            Value::Binary(Bytes::from_static(&[0, 0xff])),
            Value::Text(Bytes::new()),
        ]
    }

    #[test]
    fn a_wire_row_reads_as_the_values_it_was_built_from() {
        let (wire, vals) = (Row::packed(values()), Row::from(values()));
        assert_eq!(wire, vals);
        assert_eq!(format!("{wire:?}"), format!("{vals:?}"));
        assert_eq!(wire.len(), 5);
        for i in 0..7 {
            assert_eq!(wire.get(i), vals.get(i), "{i}");
            assert_eq!(wire.share(i), vals.share(i), "{i}");
            assert_eq!(wire.share_text(i), vals.share_text(i), "{i}");
        }
        assert_eq!(wire.get(5), None);
        assert_eq!(wire.share(1), None);
        assert_eq!(wire.share(3).as_deref(), Some(&[0, 0xff][..]));
        assert_eq!((wire.share_text(0).as_deref(), wire.share_text(3)), (Some(&b"abc"[..]), None));
        assert_ne!(wire, Row::packed(values()[..4].to_vec()));
    }

    #[test]
    fn a_cell_outside_the_buffer_is_refused() {
        let mut row = WireRow::new(Bytes::from_static(b"abcd"), 2);
        assert!(!row.push(2..5, false));
        assert!(!row.push(5..9, true));
        assert!(row.push(0..4, false));
        assert!(row.push(4..4, false));
        let row = row.finish();
        assert_eq!(row.fields().collect::<Vec<_>>(), [Field::Text(b"abcd"), Field::Text(b"")]);
    }
}
