//! `--value-format avro|protobuf|json-schema`: a record value in the Confluent wire format (what
//! `outboxd run --value-converter …` and Confluent's serializers write) decoded to JSON for the
//! inbox's `payload_json` column; the original bytes go to `payload` unchanged.
//!
//! The wire format: byte `0`, the writer's schema id (4 bytes, big-endian), for Protobuf the
//! message indexes (a zigzag varint count, then as many zigzag varints; a single `0` byte means
//! the first message of the file), then the body. The schema is asked of the registry by id
//! (`GET /schemas/ids/{id}`, through the same client as `run`'s encoder: auth, TLS, the bounded
//! answers) and kept for the process: an id never changes its schema.
//!
//! How a value maps to JSON: Avro by value (a record or map is an object, a union its branch's
//! value, an enum its symbol, bytes and fixed an array of numbers, logical types their underlying
//! number); Protobuf with its JSON mapping, but field names as declared in the `.proto`, 64-bit
//! integers as numbers and fields at their default value included; JSON Schema as the body's own
//! JSON (the schema id is checked, the body is not validated again).
//!
//! Invariant: what is classified here is decided once, from the record and the registry's
//! answer, never from message text. A record that cannot be decoded ([`Failure::Bad`]: not the
//! wire format, an id the registry does not know, a schema of another format or one that does
//! not compile, a body that does not decode) is a fact about that record: it is dead-lettered and
//! the inbox moves on. A registry that cannot be asked ([`Failure::Unavailable`]) is never a fact
//! about a record: the writer pauses and asks again. Refused credentials are
//! [`Failure::Definite`]: an operator must act. A bad answer is kept [`RETRY_BAD_AFTER`] only, so
//! registering a missing schema takes effect without a restart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apache_avro::Schema;
use prost_reflect::{DynamicMessage, FileDescriptor, MessageDescriptor, SerializeOptions};

use super::record::Bad;
use crate::format::registry::{Registry, RegistryError};
use crate::format::{Format, RegistryConfig};

/// The dead-letter reasons (`outboxd.error`) of records that cannot be decoded.
pub const NOT_WIRE_FORMAT: &str = "inbox_not_wire_format";
pub const SCHEMA_MISSING: &str = "inbox_schema_missing";
pub const SCHEMA_INVALID: &str = "inbox_schema_invalid";
pub const UNDECODABLE: &str = "inbox_undecodable";

/// How long an answer that makes records bad is kept before the registry is asked again.
const RETRY_BAD_AFTER: Duration = Duration::from_secs(30);
/// Bad answers kept at most; past it the expired ones go (corrupt records can carry any id).
const MAX_BAD_KEPT: usize = 1024;
/// The most Protobuf message indexes read (nesting depth); a longer list is a corrupt record.
const MAX_INDEXES: u64 = 64;
/// The most an Avro length in a record may claim: no record comes near it, and a corrupt length
/// then fails the record instead of allocating apache-avro's default 512 MiB.
const AVRO_MAX_ALLOCATION: usize = 64 << 20;

/// Why a value was not decoded.
#[derive(Debug, PartialEq)]
pub enum Failure {
    /// The record itself: dead-lettered with this reason.
    Bad(Bad),
    /// The registry cannot be asked now: wait and ask again.
    Unavailable(String),
    /// An operator must act (credentials refused).
    Definite(String),
}

/// A registered schema, ready to read with.
enum Reader {
    Avro(Schema),
    Protobuf(FileDescriptor),
    Json,
}

/// A schema by id, or the bad answer and when it was given.
type Entry = Result<Arc<Reader>, (Instant, &'static str, String)>;

pub struct Decoder {
    registry: Registry,
    format: Format,
    schemas: HashMap<u32, Entry>,
}

impl Decoder {
    /// For `cfg.value`'s format (set by the config for `--value-format` avro, protobuf or json-schema).
    pub fn new(cfg: &RegistryConfig) -> Result<Decoder, String> {
        let format = cfg.value.ok_or_else(|| "a registry decoder without a value format".to_owned())?;
        apache_avro::util::max_allocation_bytes(AVRO_MAX_ALLOCATION);
        Ok(Decoder { registry: Registry::new(cfg)?, format, schemas: HashMap::new() })
    }

    /// `payload` as JSON text; `at` names the record (TOPIC/PARTITION/OFFSET) in a bad record's message.
    pub async fn decode(&mut self, payload: &[u8], at: &str) -> Result<String, Failure> {
        let bad =
            |reason: &'static str, why: String| Failure::Bad(Bad { reason, message: format!("record {at}: {why}") });
        let (id, body) = frame(payload).map_err(|why| bad(NOT_WIRE_FORMAT, why))?;
        let reader = self.reader(id).await.map_err(|f| match f {
            Failure::Bad(b) => bad(b.reason, b.message),
            other => other,
        })?;
        let json = match &*reader {
            Reader::Avro(schema) => avro_json(schema, body),
            Reader::Protobuf(file) => protobuf_json(file, body),
            Reader::Json => serde_json::from_slice::<serde_json::Value>(body)
                .map_err(|e| format!("the body is not JSON: {e}"))
                .map(|v| v.to_string()),
        };
        json.map_err(|why| bad(UNDECODABLE, format!("{why} (schema id {id})")))
    }

    /// The reader of schema `id`: kept, else asked of the registry.
    async fn reader(&mut self, id: u32) -> Result<Arc<Reader>, Failure> {
        match self.schemas.get(&id) {
            Some(Ok(r)) => return Ok(r.clone()),
            Some(Err((since, reason, why))) if since.elapsed() < RETRY_BAD_AFTER => {
                return Err(Failure::Bad(Bad { reason, message: why.clone() }))
            }
            _ => {}
        }
        let entry = match self.registry.by_id(id).await {
            Ok(answer) => {
                let kind = answer.schema_type.as_deref().unwrap_or("AVRO").to_ascii_uppercase();
                reader(self.format, &kind, &answer.schema).map(Arc::new).map_err(|why| {
                    (Instant::now(), SCHEMA_INVALID, format!("schema id {id} cannot be read with: {why}"))
                })
            }
            Err(e @ RegistryError::Unavailable { .. }) => return Err(Failure::Unavailable(e.to_string())),
            Err(e @ RegistryError::Refused { .. }) => return Err(Failure::Definite(e.to_string())),
            Err(RegistryError::NotRegistered { url, .. } | RegistryError::Missing { url, .. }) => {
                Err((Instant::now(), SCHEMA_MISSING, format!("schema id {id} is not in the registry {url}")))
            }
            Err(e) => Err((Instant::now(), SCHEMA_INVALID, e.to_string())),
        };
        if self.schemas.len() >= MAX_BAD_KEPT {
            self.schemas.retain(|_, e| e.as_ref().err().is_none_or(|(t, ..)| t.elapsed() < RETRY_BAD_AFTER));
        }
        self.schemas.insert(id, entry.clone());
        entry.map_err(|(_, reason, message)| Failure::Bad(Bad { reason, message }))
    }
}

/// A reader of `--value-format` for a schema the registry calls `kind`.
fn reader(format: Format, kind: &str, schema: &str) -> Result<Reader, String> {
    let want = match format {
        Format::Avro => "AVRO",
        Format::Protobuf => "PROTOBUF",
        Format::JsonSchema => "JSON",
    };
    if kind != want {
        return Err(format!("it is a {kind} schema, and --value-format expects {want}"));
    }
    match format {
        Format::Avro => Schema::parse_str(schema).map(Reader::Avro).map_err(|e| format!("not an Avro schema: {e}")),
        Format::Protobuf => crate::format::protobuf::compile(schema).map(Reader::Protobuf),
        Format::JsonSchema => serde_json::from_str::<serde_json::Value>(schema)
            .map(|_| Reader::Json)
            .map_err(|e| format!("the JSON Schema is not JSON: {e}")),
    }
}

/// The schema id and the rest, from a value in the wire format.
fn frame(payload: &[u8]) -> Result<(u32, &[u8]), String> {
    match payload {
        [0, a, b, c, d, body @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), body)),
        [0, ..] => Err(format!("{} bytes, shorter than the wire format's 5-byte header", payload.len())),
        [m, ..] => Err(format!("the first byte is {m}, not the wire format's magic byte 0")),
        [] => Err("an empty value, not the wire format".into()),
    }
}

fn avro_json(schema: &Schema, body: &[u8]) -> Result<String, String> {
    let mut rest = body;
    let value = apache_avro::reader::datum::GenericDatumReader::builder(schema)
        .build()
        .and_then(|r| r.read_value(&mut rest))
        .map_err(|e| format!("the body is not an Avro datum of the schema: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes are left after the Avro datum", rest.len()));
    }
    // apache-avro reads a string cut short by the end of the body as null; the value must still
    // be one of the schema's.
    if !value.validate(schema) {
        return Err("the body is not an Avro datum of the schema: it is cut short".into());
    }
    serde_json::Value::try_from(value).map(|v| v.to_string()).map_err(|e| format!("a value JSON cannot hold: {e}"))
}

fn protobuf_json(file: &FileDescriptor, body: &[u8]) -> Result<String, String> {
    let (indexes, rest) = message_indexes(body)?;
    let message = message_at(file, &indexes)?;
    let msg = DynamicMessage::decode(message.clone(), rest)
        .map_err(|e| format!("the body is not a {} message: {e}", message.full_name()))?;
    let options =
        SerializeOptions::new().use_proto_field_name(true).stringify_64_bit_integers(false).skip_default_fields(false);
    let mut out = serde_json::Serializer::new(Vec::new());
    msg.serialize_with_options(&mut out, &options).map_err(|e| format!("a value JSON cannot hold: {e}"))?;
    String::from_utf8(out.into_inner()).map_err(|e| format!("a value JSON cannot hold: {e}"))
}

/// The message indexes and the message's bytes after them.
fn message_indexes(body: &[u8]) -> Result<(Vec<u64>, &[u8]), String> {
    let mut rest = body;
    let next = |rest: &mut &[u8]| -> Result<u64, String> {
        let n = prost::encoding::decode_varint(rest).map_err(|_| "the message indexes are cut short".to_owned())?;
        Ok((n >> 1) ^ (n & 1).wrapping_neg()) // zigzag
    };
    let count = next(&mut rest)?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    if count > MAX_INDEXES {
        return Err(format!("{count} message indexes, more than {MAX_INDEXES}"));
    }
    let indexes = (0..count).map(|_| next(&mut rest)).collect::<Result<Vec<_>, _>>()?;
    Ok((indexes, rest))
}

/// The message the indexes name: the first picks a top-level message, each next one a nested one.
fn message_at(file: &FileDescriptor, indexes: &[u64]) -> Result<MessageDescriptor, String> {
    let missing = || format!("the message indexes {indexes:?} name no message of the schema");
    let (first, nested) = indexes.split_first().ok_or_else(missing)?;
    let mut m = usize::try_from(*first).ok().and_then(|i| file.messages().nth(i)).ok_or_else(missing)?;
    for i in nested {
        m = usize::try_from(*i).ok().and_then(|i| m.child_messages().nth(i)).ok_or_else(missing)?;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{"type":"record","name":"Order","namespace":"shop.v1","fields":[
        {"name":"id","type":"string"},{"name":"amount_cents","type":"long"},
        {"name":"note","type":["null","string"],"default":null}]}"#;

    const SHOP: &str = r#"syntax = "proto3";
package shop.v1;
message OrderCreated { string id = 1; int64 amount_cents = 2; repeated string items = 3;
  message Address { string city = 1; } }
message OrderCancelled { string id = 1; string reason = 2; }
"#;

    fn avro() -> Reader {
        reader(Format::Avro, "AVRO", ORDER).unwrap()
    }

    fn json(s: &str) -> serde_json::Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn avro_decodes_what_the_encoder_writes() {
        let w = crate::format::avro::Writer::new(1, ORDER).unwrap();
        let bytes = w.encode(br#"{"id":"o-2","amount_cents":-5,"note":"gift"}"#).unwrap();
        let (id, body) = frame(&bytes).unwrap();
        assert_eq!(id, 1);
        let Reader::Avro(s) = avro() else { unreachable!() };
        assert_eq!(json(&avro_json(&s, body).unwrap()), json(r#"{"id":"o-2","amount_cents":-5,"note":"gift"}"#));
        // Cut short, or with bytes left over: not a datum of the schema.
        assert!(avro_json(&s, &body[..body.len() - 2]).is_err());
        let mut longer = body.to_vec();
        longer.push(7);
        assert!(avro_json(&s, &longer).unwrap_err().contains("left after"));
        // A string length claiming gigabytes fails the record, not the allocator.
        assert!(avro_json(&s, &[0xfe, 0xff, 0xff, 0xff, 0x1f]).is_err());
    }

    #[test]
    fn protobuf_decodes_what_the_encoder_writes_and_follows_the_indexes() {
        let w = crate::format::protobuf::Writer::new(2, SHOP).unwrap();
        let bytes = w.encode(br#"{"id":"o-1","amount_cents":1234,"items":["a"]}"#).unwrap();
        let (_, body) = frame(&bytes).unwrap();
        let Reader::Protobuf(f) = reader(Format::Protobuf, "PROTOBUF", SHOP).unwrap() else { unreachable!() };
        assert_eq!(json(&protobuf_json(&f, body).unwrap()), json(r#"{"id":"o-1","amount_cents":1234,"items":["a"]}"#));
        // Indexes [1] (count 1 → zigzag 2, index 1 → 2): the second message; [0, 0]: the nested one.
        let mut second = vec![2, 2];
        second.extend_from_slice(&[0x0a, 1, b'x', 0x12, 1, b'y']);
        assert_eq!(json(&protobuf_json(&f, &second).unwrap()), json(r#"{"id":"x","reason":"y"}"#));
        assert_eq!(message_at(&f, &[0, 0]).unwrap().full_name(), "shop.v1.OrderCreated.Address");
        assert!(message_at(&f, &[5]).is_err());
        assert!(message_indexes(&[0x80]).is_err(), "a varint cut short");
        assert!(protobuf_json(&f, &[0, 0xff]).is_err(), "a corrupt message");
    }

    #[test]
    fn the_frame_and_the_schema_type_are_checked() {
        assert!(frame(b"{\"a\":1}").unwrap_err().contains("magic byte 0"));
        assert!(frame(&[0, 0, 1]).unwrap_err().contains("shorter"));
        assert_eq!(frame(&[0, 0, 0, 1, 0]).unwrap(), (256, &[][..]));
        let e = reader(Format::Avro, "PROTOBUF", SHOP).err().unwrap();
        assert!(e.contains("PROTOBUF schema") && e.contains("expects AVRO"), "{e}");
        assert!(reader(Format::Protobuf, "PROTOBUF", "message {").is_err());
        assert!(matches!(reader(Format::JsonSchema, "JSON", "{}"), Ok(Reader::Json)));
    }
}
