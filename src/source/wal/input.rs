//! pgoutput's Relation and Insert messages as the router's input ([`Table`], [`Row`]).
//!
//! # Invariants
//! * A [`Table`] is built once per Relation message of an outbox table, not per row; its names
//!   are moved out of the message, not copied.
//! * A row is moved, not copied or converted: the decoder writes the router's own
//!   [`Row`] (a view of the message), so it goes over as it came off the wire.

use crate::pg::pgoutput::{Relation, TupleData};
use crate::router::{Column, Row, Table};

/// The router's description of a relation (its id, replica identity and type modifiers are the
/// session's business, not the router's).
pub fn table(rel: Relation) -> Table {
    Table {
        schema: rel.namespace,
        name: rel.name,
        columns: rel
            .columns
            .into_iter()
            .map(|c| Column { name: c.name, type_oid: c.type_oid, type_modifier: c.type_modifier })
            .collect(),
    }
}

/// An inserted tuple as a row for the router: the decoder already wrote the router's values.
pub fn row(tuple: TupleData) -> Row {
    tuple
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::pg::pgoutput::{Column as PgColumn, TupleValue};
    use crate::router::Field;

    #[test]
    fn a_relation_and_a_tuple_keep_names_types_and_values() {
        let rel = Relation {
            xid: None,
            id: 7,
            namespace: "app".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: vec![
                PgColumn { flags: 1, name: "event_id".into(), type_oid: 2950, type_modifier: -1 },
                PgColumn { flags: 0, name: "payload".into(), type_oid: 3802, type_modifier: -1 },
            ],
        };
        let t = table(rel);
        assert_eq!((t.schema.as_str(), t.name.as_str()), ("app", "outbox"));
        let cols: Vec<(&str, u32)> = t.columns.iter().map(|c| (c.name.as_str(), c.type_oid)).collect();
        assert_eq!(cols, [("event_id", 2950), ("payload", 3802)]);

        let r = row(TupleData::from(vec![
            TupleValue::Text(Bytes::from_static(b"{}")),
            TupleValue::Null,
            TupleValue::UnchangedToast,
            TupleValue::Binary(Bytes::from_static(b"\x01")),
        ]));
        assert_eq!(
            r.fields().collect::<Vec<_>>(),
            [Field::Text(b"{}"), Field::Null, Field::UnchangedToast, Field::Binary(b"\x01")]
        );
        // That a decoded row's values are the message's bytes, not copies, is pgoutput's
        // `tuple_values_are_zero_copy` (on the wire form the session decodes); here `row` only
        // passes the row on.
    }
}
