//! Why a JSON payload does not fit a Protobuf message, as a [`Mismatch`] naming the field.
//!
//! It walks the payload with the message's descriptor: objects into messages and maps, arrays
//! into repeated fields. Each leaf (a scalar, an enum, a well-known type such as
//! `google.protobuf.Timestamp` with its own JSON form) is judged by prost-reflect itself, by
//! reading `{"field": value}` into the parent message, so the explanation agrees with the encoder
//! on what fits (Protobuf's JSON mapping: 64-bit integers as numbers or strings, enums by name or
//! number, bytes as base64); only the words are ours.

use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{json, Value};

use super::mismatch::{list, quoted, Mismatch, Path, Step};

/// The first place where `json` does not fit `message`; `None` when the walk finds none.
pub fn explain(message: &MessageDescriptor, json: &Value) -> Option<Mismatch> {
    fit_message(message, json, &Path::default()).err()
}

fn fit_message(desc: &MessageDescriptor, json: &Value, at: &Path) -> Result<(), Mismatch> {
    let Value::Object(fields) = json else {
        return Err(Mismatch::expected(at, &format!("a message {} (an object)", desc.full_name()), json));
    };
    for (name, value) in fields {
        let here = at.with(Step::Field(name.clone()));
        let Some(field) = desc.get_field_by_name(name).or_else(|| desc.get_field_by_json_name(name)) else {
            return Err(Mismatch::new(&here, format!("message {} has no such field", desc.full_name())));
        };
        if value.is_null() {
            // The mapping's "the default"; judged as a whole below when it is not.
            leaf(desc, &field, name, value.clone(), value, &here)?;
        } else if field.is_map() {
            let Value::Object(entries) = value else {
                return Err(Mismatch::expected(&here, "a map (an object)", value));
            };
            let Kind::Message(entry) = field.kind() else { continue };
            let value_field = entry.map_entry_value_field();
            for (k, v) in entries {
                let at_key = here.with(Step::Key(k.clone()));
                match value_field.kind() {
                    Kind::Message(m) if !well_known(&m) => fit_message(&m, v, &at_key)?,
                    _ => leaf(desc, &field, name, json!({ k: v }), v, &at_key)?,
                }
            }
        } else if field.is_list() {
            let Value::Array(items) = value else {
                return Err(Mismatch::expected(&here, &format!("a list of {}", expectation(&field.kind())), value));
            };
            for (i, v) in items.iter().enumerate() {
                let at_item = here.with(Step::Index(i));
                match field.kind() {
                    Kind::Message(m) if !well_known(&m) => fit_message(&m, v, &at_item)?,
                    _ => leaf(desc, &field, name, json!([v]), v, &at_item)?,
                }
            }
        } else {
            match field.kind() {
                Kind::Message(m) if !well_known(&m) => fit_message(&m, value, &here)?,
                _ => leaf(desc, &field, name, value.clone(), value, &here)?,
            }
        }
    }
    Ok(())
}

/// Whether the library reads `{name: as_field}` into `parent`; if not, the mismatch of `value`
/// (the part of `as_field` the path names) in words.
fn leaf(
    parent: &MessageDescriptor,
    field: &FieldDescriptor,
    name: &str,
    as_field: Value,
    value: &Value,
    at: &Path,
) -> Result<(), Mismatch> {
    if DynamicMessage::deserialize(parent.clone(), json!({ name: as_field })).is_ok() {
        return Ok(());
    }
    let kind = if field.is_map() {
        match field.kind() {
            Kind::Message(entry) => entry.map_entry_value_field().kind(),
            k => k,
        }
    } else {
        field.kind()
    };
    if let (Kind::Enum(e), Value::String(s)) = (&kind, value) {
        if e.get_value_by_name(s).is_none() {
            let names: Vec<String> = e.values().map(|v| v.name().to_owned()).collect();
            return Err(Mismatch::new(
                at,
                format!("{} is not one of the enum {}'s names {}", quoted(s), e.name(), list(&names)),
            ));
        }
    }
    Err(Mismatch::expected(at, &expectation(&kind), value))
}

/// Google's well-known types, which have JSON forms of their own (a Timestamp is a string).
fn well_known(m: &MessageDescriptor) -> bool {
    m.full_name().starts_with("google.protobuf.")
}

/// What a field of `kind` takes in Protobuf's JSON mapping, in words.
fn expectation(kind: &Kind) -> String {
    match kind {
        Kind::Double => "a double (a number)".into(),
        Kind::Float => "a float (a number)".into(),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => "an int32 (a 32-bit integer)".into(),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => "an int64 (a 64-bit integer, as a number or a string)".into(),
        Kind::Uint32 | Kind::Fixed32 => "a uint32 (a 32-bit integer, not negative)".into(),
        Kind::Uint64 | Kind::Fixed64 => "a uint64 (a 64-bit integer, not negative, as a number or a string)".into(),
        Kind::Bool => "a boolean".into(),
        Kind::String => "a string".into(),
        Kind::Bytes => "bytes (a base64 string)".into(),
        Kind::Enum(e) => {
            let names: Vec<String> = e.values().map(|v| v.name().to_owned()).collect();
            format!("one of the enum {}'s names {} (or its number)", e.name(), list(&names))
        }
        Kind::Message(m) if well_known(m) => format!("a {} (in its JSON form)", m.full_name()),
        Kind::Message(m) => format!("a message {} (an object)", m.full_name()),
    }
}

#[cfg(test)]
mod tests {
    const SHOP: &str = r#"syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
message Order {
  int32 amount = 1;
  double price = 2;
  Currency currency = 3;
  repeated Line lines = 4;
  map<string, int64> attrs = 5;
  google.protobuf.Timestamp at = 6;
  uint32 count = 7;
  bytes blob = 8;
  repeated string tags = 9;
  message Line { string sku = 1; int64 qty = 2; }
}
enum Currency { EUR = 0; USD = 1; }
"#;

    /// Each case: a payload, and the reason given for it.
    #[test]
    fn each_mismatch_names_its_field_and_the_expectation_in_words() {
        let w = super::super::protobuf::Writer::new(4, SHOP).unwrap();
        let reason = |payload: &str| w.encode(payload.as_bytes()).unwrap_err();
        let prefix = "the payload does not fit message shop.v1.Order (schema id 4): ";
        assert!(w.encode(br#"{"amount": 1, "price": "NaN", "currency": "USD", "attrs": {"k": "5"}, "at": "2026-12-05T00:00:00Z"}"#).is_ok());
        for (payload, want) in [
            (
                r#"{"amount": 1099511627776}"#,
                r#"field "amount": expected an int32 (a 32-bit integer), got 1099511627776"#,
            ),
            (r#"{"price": "twelve"}"#, r#"field "price": expected a double (a number), got a string "twelve""#),
            (r#"{"currency": "JPY"}"#, r#"field "currency": "JPY" is not one of the enum Currency's names [EUR, USD]"#),
            (
                r#"{"lines": [{"sku": "a"}, {"sku": "b", "qty": "two"}]}"#,
                r#"field "lines[1].qty": expected an int64 (a 64-bit integer, as a number or a string), got a string "two""#,
            ),
            (
                r#"{"lines": [{"sku": "a", "size": 1}]}"#,
                r#"field "lines[0].size": message shop.v1.Order.Line has no such field"#,
            ),
            (
                r#"{"attrs": {"k": true}}"#,
                r#"field "attrs["k"]": expected an int64 (a 64-bit integer, as a number or a string), got true"#,
            ),
            (
                r#"{"at": "yesterday"}"#,
                r#"field "at": expected a google.protobuf.Timestamp (in its JSON form), got a string "yesterday""#,
            ),
            (r#"{"count": -1}"#, r#"field "count": expected a uint32 (a 32-bit integer, not negative), got -1"#),
            (r#"{"blob": 5}"#, r#"field "blob": expected bytes (a base64 string), got 5"#),
            (r#"{"tags": "a"}"#, r#"field "tags": expected a list of a string, got a string "a""#),
            (r#"{"tags": ["a", 5]}"#, r#"field "tags[1]": expected a string, got 5"#),
            (r#"{"nope": 1}"#, r#"field "nope": message shop.v1.Order has no such field"#),
            (r#"[1]"#, r#"the payload: expected a message shop.v1.Order (an object), got an array of 1 item"#),
        ] {
            assert_eq!(reason(payload).strip_prefix(prefix), Some(want), "{payload}");
        }
    }
}
