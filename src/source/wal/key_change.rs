//! An UPDATE that changes an outbox row's primary key, as Debezium's drop-in asks for it.
//!
//! Debezium's PostgreSQL connector turns such an UPDATE into a delete of the old key and a create
//! of the new row, the create carrying a `__debezium.oldkey` header (the old key struct as
//! Connect's `SimpleHeaderConverter` writes it: `{"event_id":"…"}`); the EventRouter drops the
//! delete and publishes the create as an event, that header first. With `--debezium-config`
//! outboxd does the same; in plain mode an UPDATE is never an event (`--table-op-invalid-behavior`).
//!
//! # Invariants
//! * Only a table whose replica identity is its primary key (`DEFAULT`) is read this way: pgoutput
//!   then sends the old key (`K`) exactly when the key changed (or was stored out of line), and
//!   its key columns are the primary key Debezium keys by. Under `FULL` every column is flagged
//!   as key, and under `USING INDEX` the flagged columns are not the primary key, so neither
//!   gives Debezium's key; such UPDATEs stay what they are in plain mode.
//! * An old key equal to the new row's is no key change (a key stored out of line is sent too).

use bytes::Bytes;

use crate::pg::pgoutput::{OldKind, Relation, TupleData};
use crate::router::render::as_json;
use crate::router::Field;

/// The header Debezium's create record carries the old key in.
pub const OLD_KEY_HEADER: &str = "__debezium.oldkey";

/// The primary-key columns of an outbox table: (index, name, type oid), in table order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyColumns(Vec<(usize, String, u32)>);

impl KeyColumns {
    /// The key columns of `rel`, when its replica identity is its primary key.
    pub fn of(rel: &Relation) -> Option<KeyColumns> {
        if rel.replica_identity != b'd' {
            return None;
        }
        let cols: Vec<_> = rel
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.flags & 1 == 1)
            .map(|(i, c)| (i, c.name.clone(), c.type_oid))
            .collect();
        (!cols.is_empty()).then_some(KeyColumns(cols))
    }

    /// The `__debezium.oldkey` value when `old` is a key image other than `new`'s key; `None` when
    /// the UPDATE kept its key (or sent no key image).
    pub fn old_key(&self, old: Option<&(OldKind, TupleData)>, new: &TupleData) -> Option<Bytes> {
        let Some((OldKind::Key, old)) = old else { return None };
        let changed = self.0.iter().any(|(i, _, _)| match (old.get(*i), new.get(*i)) {
            // An unchanged out-of-line value is the same value.
            (_, Some(Field::UnchangedToast)) | (Some(Field::UnchangedToast), _) => false,
            (a, b) => a != b,
        });
        if !changed {
            return None;
        }
        // Built by hand: the fields in key order, as Connect's struct keeps them.
        let mut out = String::from("{");
        for (n, (i, name, type_oid)) in self.0.iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            out.push_str(&serde_json::Value::String(name.clone()).to_string());
            out.push(':');
            let v = match old.get(*i) {
                Some(Field::Text(b)) => as_json(*type_oid, b)
                    .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(b).into_owned())),
                _ => serde_json::Value::Null,
            };
            out.push_str(&v.to_string());
        }
        out.push('}');
        Some(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::pgoutput::Column;
    use crate::router::Value;

    fn rel(identity: u8) -> Relation {
        let col = |flags, name: &str, type_oid| Column { flags, name: name.into(), type_oid, type_modifier: -1 };
        Relation {
            xid: None,
            id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: identity,
            columns: vec![col(1, "event_id", 2950), col(0, "payload", 25), col(1, "n", 20)],
        }
    }

    fn tuple(vals: &[Option<&'static str>]) -> TupleData {
        TupleData::from(
            vals.iter()
                .map(|v| v.map_or(Value::Null, |s| Value::Text(Bytes::from_static(s.as_bytes()))))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn a_changed_primary_key_gives_the_old_key_in_key_order() {
        let k = KeyColumns::of(&rel(b'd')).unwrap();
        let new = tuple(&[Some("b"), Some("x"), Some("7")]);
        let old = (OldKind::Key, tuple(&[Some("a"), None, Some("7")]));
        assert_eq!(k.old_key(Some(&old), &new).as_deref(), Some(&br#"{"event_id":"a","n":7}"#[..]));
        // The same key (stored out of line, say): no key change.
        let same = (OldKind::Key, tuple(&[Some("b"), None, Some("7")]));
        assert_eq!(k.old_key(Some(&same), &new), None);
        // No old image: the key did not change.
        assert_eq!(k.old_key(None, &new), None);
    }

    #[test]
    fn only_a_primary_key_identity_is_read() {
        assert_eq!(KeyColumns::of(&rel(b'f')), None);
        assert_eq!(KeyColumns::of(&rel(b'i')), None);
        assert_eq!(KeyColumns::of(&rel(b'n')), None);
    }
}
