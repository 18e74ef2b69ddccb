//! `--key-converter` and `--value-converter`: the bytes of a record's key and value as Kafka
//! Connect's converters write them behind Debezium's EventRouter, so consumers of a Debezium
//! deployment read the same bytes from outboxd.
//!
//! * `string` (Connect's `StringConverter`, our default): the column's value as routed: a JSON
//!   column's exact text, text as its bytes, `bytea` raw.
//! * `json` (Connect's `JsonConverter` with `schemas.enable=false`): the value as JSON the way
//!   Debezium's PostgreSQL connector types the column: a string column (`text`, `varchar`, `bpchar`,
//!   `uuid`, and `json`/`jsonb`, which Debezium carries as `io.debezium.data.Json` strings) becomes
//!   a JSON string literal, an integer column its number, `boolean` `true`/`false`, `bytea` a base64
//!   string (Debezium's `binary.handling.mode=bytes`). A NULL key or payload is the JSON `null`
//!   (4 bytes: the key is then hashed like any other), as JsonConverter writes a null with a
//!   schema; only a tombstone of `--route-tombstone-on-empty-payload` has no value.
//! * `bytes` (Connect's `ByteArrayConverter`): a `bytea` column's raw bytes; Debezium fails on
//!   any other type with it, so outboxd refuses them when the route is compiled. (With
//!   `StringConverter`, Debezium writes a `bytea` value as Java's `[B@…` array name; outboxd writes
//!   the bytes, a documented deviation.)
//!
//! Other column types with `json` (timestamps, numeric, floats) are refused when the route is
//! compiled (in the key and the payload; envelope columns are typed by [`super::placed`]), and
//! `json` with an envelope placement
//! together with `--table-expand-json-payload` at start-up: Debezium turns those into Connect
//! structs whose JSON this module does not reproduce, and a silent difference would break
//! consumers at the switch. An envelope under `json` is written by the router (payload first, then
//! each envelope column in placement order, each as this module writes its type).

use base64::Engine as _;
use bytes::Bytes;

pub(crate) use super::expand::jackson_string;
use super::render::{BOOL, BYTEA, INT2, INT4, INT8, JSON, JSONB, TEXT, VARCHAR};

const BPCHAR: u32 = 1042;
const UUID: u32 = 2950;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Converter {
    /// Connect's StringConverter: the value as routed.
    #[default]
    String,
    /// Connect's JsonConverter with schemas.enable=false.
    Json,
    /// Connect's ByteArrayConverter: a `bytea` column's raw bytes (the only type it takes).
    Bytes,
    /// Confluent's AvroConverter (or Apicurio's): a JSON payload encoded as an Avro datum of the
    /// subject's latest schema in `--schema-registry-url`, in the Confluent wire format (value only;
    /// the router passes the JSON text on and [`crate::format`] encodes it).
    Avro,
    /// Confluent's JsonSchemaConverter: the JSON payload validated against the subject's latest
    /// JSON Schema, behind the Confluent wire-format header ([`crate::format`]).
    JsonSchema,
    /// Confluent's ProtobufConverter: the JSON payload as the first message of the subject's
    /// latest `.proto`, behind the Confluent wire-format header ([`crate::format`]).
    Protobuf,
}

/// Whether Debezium carries a column of this type as a Connect string (what its EventRouter's
/// JSON expansion takes).
pub fn is_string(type_oid: u32) -> bool {
    matches!(type_oid, TEXT | VARCHAR | BPCHAR | UUID | JSON | JSONB)
}

/// Whether `json` can write a column of this type the way Debezium and JsonConverter do.
pub fn json_supports(type_oid: u32) -> bool {
    matches!(type_oid, TEXT | VARCHAR | BPCHAR | UUID | JSON | JSONB | INT2 | INT4 | INT8 | BOOL | BYTEA)
}

/// Whether `converter` can write a column of this type the way Debezium and the Connect converter
/// do (`string` takes every type; the others refuse what Debezium would fail on or write
/// differently).
pub fn supports(converter: Converter, type_oid: u32) -> bool {
    match converter {
        Converter::String => true,
        Converter::Json => json_supports(type_oid),
        Converter::Bytes => type_oid == BYTEA,
        Converter::Avro | Converter::JsonSchema | Converter::Protobuf => {
            matches!(type_oid, JSON | JSONB | TEXT | VARCHAR)
        }
    }
}

/// Whether `converter` can write a key column of this type: as [`supports`], except that the
/// registry formats write a key as a string schema, so any column does (as its text).
pub fn supports_key(converter: Converter, type_oid: u32) -> bool {
    match converter {
        Converter::Avro | Converter::JsonSchema => true,
        other => supports(other, type_oid),
    }
}

/// A column type name for messages.
pub fn type_name(type_oid: u32) -> String {
    match type_oid {
        1114 => "timestamp".into(),
        1184 => "timestamptz".into(),
        1700 => "numeric".into(),
        700 => "real".into(),
        701 => "double precision".into(),
        1082 => "date".into(),
        TEXT => "text".into(),
        JSONB => "jsonb".into(),
        JSON => "json".into(),
        VARCHAR => "varchar".into(),
        UUID => "uuid".into(),
        INT8 => "bigint".into(),
        INT4 => "integer".into(),
        other => format!("type oid {other}"),
    }
}

/// `bytes` (the routed value of a column of `type_oid`) as `converter` writes it.
pub fn convert(converter: Converter, type_oid: u32, bytes: Bytes) -> Bytes {
    match converter {
        Converter::String | Converter::Bytes | Converter::Avro | Converter::JsonSchema | Converter::Protobuf => bytes,
        Converter::Json => match type_oid {
            INT2 | INT4 | INT8 => bytes,
            BOOL => bytes, // routed as true/false already
            BYTEA => jackson_string(&base64::engine::general_purpose::STANDARD.encode(&bytes)),
            _ => jackson_string(&String::from_utf8_lossy(&bytes)),
        },
    }
}

/// How one route's records are converted: the converters and what their output depends on.
#[derive(Clone, Copy, Debug)]
pub struct Conversion {
    pub key: Converter,
    pub value: Converter,
    pub key_type: u32,
    pub payload_type: u32,
    /// `--table-expand-json-payload` under `--value-converter json`: Debezium's expansion
    /// ([`super::expand`]) instead of ours.
    pub debezium_expand: bool,
    /// The payload is a JSON value Debezium has already turned into Connect data (a logical
    /// message's field, decoded by its DecodeLogicalDecodingMessageContent), so `json` writes it
    /// as that data, whatever its JSON type.
    pub decoded_payload: bool,
    /// `--route-tombstone-on-empty-payload`: a record without a value is a tombstone.
    pub tombstone: bool,
    /// The value is an envelope the router already wrote as JsonConverter does (`json` with an
    /// envelope placement): it is left as it is.
    pub envelope_written: bool,
}

impl Conversion {
    /// Rewrite the key and value in place (the record is not moved: it is a few hundred bytes).
    pub fn apply(&self, record: &mut super::Record) {
        use super::expand::{self, NotExpanded};
        record.key = match record.key.take() {
            Some(k) => Some(convert(self.key, self.key_type, k)),
            // JsonConverter writes a NULL column as the JSON `null` (four bytes, a key like any
            // other); only the tombstone rule's record has no schema and so no value.
            None if self.key == Converter::Json => Some(Bytes::from_static(b"null")),
            None => None,
        };
        let json = self.value == Converter::Json;
        let fallback = |what: &str, p: &Bytes, id: &str| {
            tracing::warn!(
                event_id = %id,
                "the payload holds {what}, where Debezium's task fails or its output is unpredictable; outboxd sends the payload as a JSON string"
            );
            jackson_string(&String::from_utf8_lossy(p))
        };
        record.payload = match record.payload.take() {
            Some(p) if self.envelope_written => Some(p),
            None if json && !self.tombstone => Some(Bytes::from_static(b"null")),
            None => None,
            Some(p) if json && self.decoded_payload => Some(match expand::value(&p) {
                Ok(v) => Bytes::from(v),
                Err(NotExpanded::Deviation(what)) => fallback(what, &p, &record.event_id),
                Err(NotExpanded::AsDebezium) => {
                    fallback("a value Debezium's decoder cannot type", &p, &record.event_id)
                }
            }),
            Some(p) if self.debezium_expand && is_string(self.payload_type) => Some(match expand::expand(&p) {
                Ok(v) => Bytes::from(v),
                Err(NotExpanded::Deviation(what)) => fallback(what, &p, &record.event_id),
                // Debezium keeps the string as well.
                Err(NotExpanded::AsDebezium) => jackson_string(&String::from_utf8_lossy(&p)),
            }),
            Some(p) => Some(convert(self.value, self.payload_type, p)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: Option<&'static str>, payload: Option<&'static str>) -> super::super::Record {
        super::super::Record {
            topic: "t".into(),
            key: key.map(|k| Bytes::from_static(k.as_bytes())),
            payload: payload.map(|p| Bytes::from_static(p.as_bytes())),
            headers: Vec::new(),
            partition: None,
            timestamp_ms: None,
            event_id: "e".into(),
            event_type: None,
        }
    }

    #[test]
    fn a_record_through_each_conversion() {
        let c = Conversion {
            key: Converter::Json,
            value: Converter::Json,
            key_type: TEXT,
            payload_type: JSONB,
            debezium_expand: false,
            decoded_payload: false,
            tombstone: false,
            envelope_written: false,
        };
        let kv = |c: &Conversion, k, p| {
            let mut r = record(k, p);
            c.apply(&mut r);
            (r.key, r.payload)
        };
        // NULLs are the JSON null; values are JSON strings.
        assert_eq!(kv(&c, None, None), (Some(Bytes::from_static(b"null")), Some(Bytes::from_static(b"null"))));
        assert_eq!(kv(&c, Some("k"), Some(r#"{"a": 1}"#)).1, Some(Bytes::from_static(br#""{\"a\": 1}""#)));
        // A tombstone of the tombstone rule has no value.
        assert_eq!(kv(&Conversion { tombstone: true, ..c }, Some("k"), None).1, None);
        // Debezium's expansion, and a decoded message payload of any JSON type.
        let expand = Conversion { debezium_expand: true, ..c };
        assert_eq!(kv(&expand, Some("k"), Some(r#"{"a": 1.50}"#)).1, Some(Bytes::from_static(br#"{"a":1.5}"#)));
        assert_eq!(kv(&expand, Some("k"), Some("[1]")).1, Some(Bytes::from_static(br#""[1]""#)));
        let decoded = Conversion { decoded_payload: true, ..c };
        assert_eq!(kv(&decoded, Some("k"), Some("[1]")).1, Some(Bytes::from_static(b"[1]")));
        assert_eq!(kv(&decoded, Some("k"), Some(r#""s""#)).1, Some(Bytes::from_static(br#""s""#)));
        // StringConverter leaves everything as routed.
        let s = Conversion { key: Converter::String, value: Converter::String, ..c };
        assert_eq!(kv(&s, None, Some("[1]")), (None, Some(Bytes::from_static(b"[1]"))));
    }

    #[test]
    fn json_writes_what_jsonconverter_writes() {
        let j = |oid, s: &[u8]| convert(Converter::Json, oid, Bytes::copy_from_slice(s));
        assert_eq!(j(JSONB, br#"{"a": 1, "u": "\u00fc"}"#), r#""{\"a\": 1, \"u\": \"\\u00fc\"}""#);
        assert_eq!(j(TEXT, "ü\n\"".as_bytes()), "\"ü\\n\\\"\"");
        // Jackson's spelling: surrogate pairs and upper-case hex; BMP characters raw.
        assert_eq!(j(TEXT, "😀 € \u{1f} \u{7f} /".as_bytes()), "\"\\uD83D\\uDE00 € \\u001F \u{7f} /\"");
        assert_eq!(j(INT8, b"-42"), "-42");
        assert_eq!(j(BYTEA, &[0, 255, 1]), "\"AP8B\"");
        assert_eq!(j(UUID, b"00000000-0000-4000-8000-000000000001"), "\"00000000-0000-4000-8000-000000000001\"");
        assert_eq!(convert(Converter::String, JSONB, Bytes::from_static(b"{}")), "{}");
        assert!(!json_supports(1700) && json_supports(BYTEA));
    }
}
