//! `--table-expand-json-payload` under `--value-converter json`: the value Debezium's EventRouter
//! (`table.expand.json.payload=true`) and Connect's JsonConverter (`schemas.enable=false`) write
//! for a JSON text payload, byte for byte.
//!
//! Debezium parses the text with Jackson, infers a Connect schema from it and builds a struct
//! (`JsonSchemaData`, default `table.json.payload.null.behavior=ignore` and empty-array behaviour
//! `ignore`); JsonConverter then writes the struct. What that gives, and what this module does:
//! * Only a top-level object expands. Any other JSON (array, string, number, `null`), or text that
//!   is not JSON, stays the string it was: a JSON string literal of the text.
//! * A field whose value is `null` or an empty array has no schema and is left out; an object
//!   keeps its fields in the text's order (the first of duplicate names, with the last value).
//! * Numbers: an integer token is an INT32 when it fits, else an INT64; a token with a fraction or
//!   an exponent is a FLOAT64, written as Java's `Double.toString` writes it (`1.5`, `1000.0`,
//!   `1.0E-7`, `1.23456789123E8`).
//! * An array takes the schema of its first non-null element; elements of another JSON type, or
//!   numbers of another of the three number types, make the expansion fail, and so does an array
//!   with only nulls: the payload then stays a string, as in Debezium.
//! * An array of objects merges the element schemas; elements lacking a field get `null` there.
//!
//! Where Debezium's task fails instead of writing anything (an integer beyond 64 bits, an array of
//! objects whose common field changes number type) or its output depends on a `HashSet`'s
//! iteration order (an array of objects of different shapes), outboxd keeps the payload a string
//! and logs a warning for the event: a documented deviation (docs/src/debezium.md, the table of differences).

use std::fmt::Write as _;

use bytes::Bytes;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value as Jackson's tree keeps it: object fields in order, integer tokens apart from
/// fractional ones.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    /// An integer token that fits 64 bits.
    Int(i64),
    /// An integer token beyond 64 bits (Jackson's BigInteger) or a float token; `true` for the
    /// former when known.
    Float(f64, bool),
    Str(String),
    Arr(Vec<Node>),
    Obj(Vec<(String, Node)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Node, E> {
                Ok(Node::Bool(b))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
                Ok(i64::try_from(v).map_or(Node::Float(v as f64, true), Node::Int))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Float(v, false))
            }
            fn visit_str<E>(self, s: &str) -> Result<Node, E> {
                Ok(Node::Str(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<Node, E> {
                Ok(Node::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut v = Vec::new();
                while let Some(n) = a.next_element()? {
                    v.push(n);
                }
                Ok(Node::Arr(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut v: Vec<(String, Node)> = Vec::new();
                while let Some((k, n)) = a.next_entry::<String, Node>()? {
                    match v.iter_mut().find(|(name, _)| *name == k) {
                        Some(slot) => slot.1 = n,
                        None => v.push((k, n)),
                    }
                }
                Ok(Node::Obj(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Connect schema types the inference produces.
#[derive(Debug, Clone, PartialEq)]
enum Schema {
    Str,
    Bool,
    I32,
    I64,
    F64,
    Arr(Box<Schema>),
    Struct(Vec<(String, Schema)>),
}

/// Why an expansion does not happen.
#[derive(Debug, PartialEq)]
pub enum NotExpanded {
    /// Debezium keeps the string too (no warning needed).
    AsDebezium,
    /// Debezium fails its task or writes an order outboxd cannot predict: a deviation.
    Deviation(&'static str),
}

fn number_schema(n: &Node) -> Option<Schema> {
    match n {
        Node::Int(v) if i32::try_from(*v).is_ok() => Some(Schema::I32),
        Node::Int(_) => Some(Schema::I64),
        Node::Float(..) => Some(Schema::F64),
        _ => None,
    }
}

fn kind(n: &Node) -> u8 {
    match n {
        Node::Null => 0,
        Node::Bool(_) => 1,
        Node::Int(_) | Node::Float(..) => 2,
        Node::Str(_) => 3,
        Node::Arr(_) => 4,
        Node::Obj(_) => 5,
    }
}

fn schema_of(n: &Node) -> Result<Option<Schema>, NotExpanded> {
    Ok(match n {
        Node::Null => None,
        Node::Bool(_) => Some(Schema::Bool),
        Node::Str(_) => Some(Schema::Str),
        Node::Float(_, true) => return Err(NotExpanded::Deviation("an integer beyond 64 bits")),
        Node::Int(_) | Node::Float(..) => number_schema(n),
        Node::Arr(items) if items.is_empty() => None,
        Node::Arr(items) => Some(Schema::Arr(Box::new(element_schema(items)?))),
        Node::Obj(fields) => {
            let mut out: Vec<(String, Schema)> = Vec::new();
            for (name, v) in fields {
                if let Some(s) = schema_of(v)? {
                    out.push((name.clone(), s));
                }
            }
            Some(Schema::Struct(out))
        }
    })
}

fn element_schema(items: &[Node]) -> Result<Schema, NotExpanded> {
    let mut sample: Option<&Node> = None;
    for n in items.iter().filter(|n| **n != Node::Null) {
        match sample {
            None => sample = Some(n),
            Some(s) if kind(s) != kind(n) => return Err(NotExpanded::AsDebezium),
            Some(s) if kind(s) == 2 && number_schema(s) != number_schema(n) => return Err(NotExpanded::AsDebezium),
            Some(_) => {}
        }
    }
    let Some(sample) = sample else { return Err(NotExpanded::AsDebezium) };
    if let Node::Obj(_) = sample {
        let mut shapes: Vec<Schema> = Vec::new();
        for n in items.iter().filter(|n| matches!(n, Node::Obj(_))) {
            if let Some(s) = schema_of(n)? {
                if !shapes.contains(&s) {
                    shapes.push(s);
                }
            }
        }
        return match shapes.as_slice() {
            [one] => Ok(one.clone()),
            _ => Err(NotExpanded::Deviation("an array of objects of different shapes")),
        };
    }
    schema_of(sample)?.ok_or(NotExpanded::AsDebezium)
}

/// A JSON string literal as Jackson writes it ([`jackson_string`]).
fn string(out: &mut String, s: &str) {
    out.push_str(&String::from_utf8_lossy(&jackson_string(s)));
}

/// A JSON string literal as Jackson (JsonConverter's writer) spells it: `\"`, `\\`, the short
/// escapes `\b \t \n \f \r`, other control characters as `\u00XX`, and characters outside the
/// Basic Multilingual Plane as a surrogate pair `\uD83D\uDE00` (all upper-case hex); everything
/// else as UTF-8. serde_json differs in the last two (lower-case hex, raw 4-byte UTF-8), which
/// the parity test against Debezium found.
pub(crate) fn jackson_string(s: &str) -> Bytes {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c if (c as u32) > 0xFFFF => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{:04X}", u);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    Bytes::from(out)
}

/// The struct of `n` under `schema`, as JsonConverter writes it.
fn write(out: &mut String, n: Option<&Node>, schema: &Schema) -> Result<(), NotExpanded> {
    let Some(n) = n.filter(|n| **n != Node::Null) else {
        out.push_str("null");
        return Ok(());
    };
    match (schema, n) {
        (Schema::Str, Node::Str(s)) => string(out, s),
        (Schema::Bool, Node::Bool(b)) => out.push_str(if *b { "true" } else { "false" }),
        (Schema::I32 | Schema::I64, Node::Int(v)) if number_schema(n) == Some(schema.clone()) => {
            let _ = write!(out, "{v}");
        }
        (Schema::F64, Node::Float(v, false)) => out.push_str(&super::placed::java::double(*v)),
        (Schema::Arr(item), Node::Arr(items)) => {
            out.push('[');
            for (i, e) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(out, Some(e), item)?;
            }
            out.push(']');
        }
        (Schema::Struct(fields), Node::Obj(values)) => {
            out.push('{');
            for (i, (name, s)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(out, name);
                out.push(':');
                write(out, values.iter().find(|(k, _)| k == name).map(|(_, v)| v), s)?;
            }
            out.push('}');
        }
        // A value that does not fit the schema: Debezium's Struct.put fails the task.
        _ => return Err(NotExpanded::Deviation("a value of another type than the schema inferred for its field")),
    }
    Ok(())
}

/// The expanded payload, or why it stays a string.
pub fn expand(text: &[u8]) -> Result<String, NotExpanded> {
    let node: Node = serde_json::from_slice(text).map_err(|_| NotExpanded::AsDebezium)?;
    if !matches!(node, Node::Obj(_)) {
        return Err(NotExpanded::AsDebezium);
    }
    let Some(schema) = schema_of(&node)? else { return Err(NotExpanded::AsDebezium) };
    let mut out = String::new();
    write(&mut out, Some(&node), &schema)?;
    Ok(out)
}

/// Any JSON value as Debezium's decoder types it and JsonConverter writes it: a logical message's
/// field (DecodeLogicalDecodingMessageContent infers the whole message with the same rules).
pub fn value(text: &[u8]) -> Result<String, NotExpanded> {
    let node: Node = serde_json::from_slice(text).map_err(|_| NotExpanded::AsDebezium)?;
    let Some(schema) = schema_of(&node)? else { return Err(NotExpanded::Deviation("a null or empty-array payload")) };
    let mut out = String::new();
    write(&mut out, Some(&node), &schema)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(s: &str) -> Result<String, NotExpanded> {
        expand(s.as_bytes())
    }

    /// What Debezium 3.6.1 with JsonConverter (schemas.enable=false) wrote for these jsonb values
    /// (tests/debezium_parity.rs checks the same against the real thing).
    #[test]
    fn as_debezium_wrote_them() {
        assert_eq!(x(r#"{"a": 1}"#).unwrap(), r#"{"a":1}"#);
        assert_eq!(
            x(r#"{"e": 1000, "f": 1.50, "i": 2147483648, "s": 5, "neg": 0.0}"#).unwrap(),
            r#"{"e":1000,"f":1.5,"i":2147483648,"s":5,"neg":0.0}"#
        );
        assert_eq!(
            x(r#"{"ctrl": "\u0001\u001f", "u": "😀"}"#).unwrap(),
            r#"{"ctrl":"\u0001\u001F","u":"\uD83D\uDE00"}"#
        );
        assert_eq!(x("{}").unwrap(), "{}");
        for same in ["[1, 2]", r#""s""#, "42", "null", "not json", r#"{"a": [1, "a"]}"#, r#"{"n": [1, 2.5]}"#] {
            assert_eq!(x(same), Err(NotExpanded::AsDebezium), "{same}");
        }
    }

    #[test]
    fn nulls_and_empty_arrays_are_left_out_and_missing_fields_are_null() {
        assert_eq!(x(r#"{"n": null, "l": [], "o": {}, "b": true}"#).unwrap(), r#"{"o":{},"b":true}"#);
        assert_eq!(x(r#"{"a": [{"x": 1}, null, {"x": 2}]}"#).unwrap(), r#"{"a":[{"x":1},null,{"x":2}]}"#);
        assert_eq!(x(r#"{"a": [[1], [2, 3]]}"#).unwrap(), r#"{"a":[[1],[2,3]]}"#);
        assert!(matches!(x(r#"{"a": [{"x": 1}, {"y": 2}]}"#), Err(NotExpanded::Deviation(_))));
        assert!(matches!(x(r#"{"big": 12345678901234567890}"#), Err(NotExpanded::Deviation(_))));
        assert_eq!(x(r#"{"a": [null, null]}"#), Err(NotExpanded::AsDebezium));
    }

    #[test]
    fn doubles_as_java_writes_them() {
        for (v, java) in [
            (1.5, "1.5"),
            (1000.0, "1000.0"),
            (0.001, "0.001"),
            (0.0001, "1.0E-4"),
            (1e7, "1.0E7"),
            (123456789.123, "1.23456789123E8"),
            (9999999.0, "9999999.0"),
            (-2.5e-7, "-2.5E-7"),
            (0.1, "0.1"),
            (100.25, "100.25"),
        ] {
            assert_eq!(super::super::placed::java::double(v), java, "{v}");
        }
    }
}
