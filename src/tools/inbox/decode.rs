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
//! value, an enum its symbol, bytes, fixed, decimal and duration an array of byte values, uuid
//! its text, the date and time types their number; a NaN or infinite float has no JSON, so the
//! row keeps the bytes only); Protobuf with its JSON mapping, but field names as declared in the
//! `.proto`, 64-bit integers as numbers and fields at their default value included; JSON Schema as
//! the body's own JSON (the schema id is checked, the body is not validated again).
//!
//! Invariant: what is classified here is decided once, from the record and the registry's
//! answer, never from message text. A record that cannot be decoded ([`Failure::Bad`]: not the
//! wire format, an id the registry does not know, a schema that does not compile, a body that
//! does not decode or nests deeper than 128 levels) is a fact about that record: it is
//! dead-lettered and the inbox moves on. A registry that cannot be asked
//! ([`Failure::Unavailable`]) is never a fact about a record: the writer pauses and asks again.
//! Refused credentials, and a schema of another type than `--value-format` (a wrong flag or
//! registry URL would otherwise dead-letter the whole topic), are [`Failure::Definite`]: an
//! operator must act. A bad answer is kept [`RETRY_BAD_AFTER`] only, so
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
    /// `--schema-missing-timeout`: how long an unknown id is waited for before its records are bad.
    missing_timeout: Duration,
    /// Unknown ids and when the registry first said so.
    missing_since: HashMap<u32, Instant>,
}

impl Decoder {
    /// For `cfg.value`'s format (set by the config for `--value-format` avro, protobuf or json-schema).
    pub fn new(cfg: &RegistryConfig, missing_timeout: Duration) -> Result<Decoder, String> {
        let format = cfg.value.ok_or_else(|| "a registry decoder without a value format".to_owned())?;
        cap_avro_allocation();
        Ok(Decoder {
            registry: Registry::new(cfg)?,
            format,
            schemas: HashMap::new(),
            missing_timeout,
            missing_since: HashMap::new(),
        })
    }

    /// `payload` as JSON text (`None` for a datum JSON cannot hold, such as an Avro NaN: the row
    /// keeps the bytes only, as for a JSON value jsonb refuses); `at` names the record
    /// (TOPIC/PARTITION/OFFSET) in a bad record's message.
    pub async fn decode(&mut self, payload: &[u8], at: &str) -> Result<Option<String>, Failure> {
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
                .map(|v| Some(v.to_string())),
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
                self.missing_since.remove(&id);
                let kind = answer.schema_type.as_deref().unwrap_or("AVRO").to_ascii_uppercase();
                // A schema of another type than --value-format is the flag's (or the URL's)
                // mistake, not the record's: dead-lettering would empty the whole topic into the
                // dead-letter topic, so the inbox stops and names both.
                if let Err(why) = same_type(self.format, &kind) {
                    return Err(Failure::Definite(format!(
                        "schema id {id} of the registry {}: {why}; set --value-format to the producer's format \
                         (or --schema-registry-url to its registry)",
                        self.registry.shown()
                    )));
                }
                reader(self.format, &kind, &answer.schema).map(Arc::new).map_err(|why| {
                    (Instant::now(), SCHEMA_INVALID, format!("schema id {id} cannot be read with: {why}"))
                })
            }
            Err(e @ RegistryError::Unavailable { .. }) => return Err(Failure::Unavailable(e.to_string())),
            Err(e @ RegistryError::Refused { .. }) => return Err(Failure::Definite(e.to_string())),
            Err(RegistryError::NotRegistered { url, .. } | RegistryError::Missing { url, .. }) => {
                // Registered late (a producer ahead of its registration), or a wrong registry:
                // wait like an outage, for a bounded time, so one stray id cannot hold the inbox
                // forever. The time counts from the first answer, across records of the id.
                if self.missing_since.len() >= MAX_BAD_KEPT && !self.missing_since.contains_key(&id) {
                    self.missing_since.clear();
                }
                let since = *self.missing_since.entry(id).or_insert_with(Instant::now);
                if since.elapsed() < self.missing_timeout {
                    return Err(Failure::Unavailable(format!(
                        "schema id {id} is not in the registry {url} (a wrong --schema-registry-url, or not registered \
                         yet); its records wait up to --schema-missing-timeout {:?} before they are dead-lettered",
                        self.missing_timeout
                    )));
                }
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

/// Whether a schema the registry calls `kind` is of `--value-format`'s type.
fn same_type(format: Format, kind: &str) -> Result<(), String> {
    let (want, flag) = match format {
        Format::Avro => ("AVRO", "avro"),
        Format::Protobuf => ("PROTOBUF", "protobuf"),
        Format::JsonSchema => ("JSON", "json-schema"),
    };
    if kind != want {
        return Err(format!("it is a {kind} schema, and --value-format {flag} expects {want}"));
    }
    Ok(())
}

/// A reader of `--value-format` for a schema the registry calls `kind`.
fn reader(format: Format, kind: &str, schema: &str) -> Result<Reader, String> {
    same_type(format, kind)?;
    match format {
        Format::Avro => Schema::parse_str(schema).map(Reader::Avro).map_err(|e| format!("not an Avro schema: {e}")),
        Format::Protobuf => crate::format::protobuf::compile(schema).map(Reader::Protobuf),
        Format::JsonSchema => serde_json::from_str::<serde_json::Value>(schema)
            .map(|_| Reader::Json)
            .map_err(|e| format!("the JSON Schema is not JSON: {e}")),
    }
}

/// apache-avro's allocation cap, set once for the process (the first setting, or the first
/// decode, fixes it): before any decode.
fn cap_avro_allocation() {
    apache_avro::util::max_allocation_bytes(AVRO_MAX_ALLOCATION);
}

/// The schema id and the rest, from a value in the wire format.
fn frame(payload: &[u8]) -> Result<(u32, &[u8]), String> {
    match payload {
        // Registries declare the id a signed 32-bit int: a larger one is no schema's, and asking
        // for it gets a plain 404, which reads as an outage and would hold the inbox forever.
        [0, a, b, c, d, body @ ..] => match u32::from_be_bytes([*a, *b, *c, *d]) {
            id if id > i32::MAX as u32 => Err(format!("schema id {id} is beyond a registry's ids (at most 2^31-1)")),
            id => Ok((id, body)),
        },
        [0, ..] => Err(format!("{} bytes, shorter than the wire format's 5-byte header", payload.len())),
        [m, ..] => Err(format!("the first byte is {m}, not the wire format's magic byte 0")),
        [] => Err("an empty value, not the wire format".into()),
    }
}

/// The Avro datum as JSON; `None` for one JSON cannot hold (a NaN or infinite float).
fn avro_json(schema: &Schema, body: &[u8]) -> Result<Option<String>, String> {
    // First the bytes are checked to be one whole datum of bounded depth, which apache-avro's
    // recursion and its reading of the end as null need (see avro_walk).
    super::avro_walk::check(schema, body, AVRO_MAX_ALLOCATION)
        .map_err(|e| format!("the body is not an Avro datum of the schema: {e}"))?;
    let value = avro_value(schema, body)?;
    if !value.validate(schema) {
        return Err("the body is not an Avro datum of the schema".into());
    }
    Ok(serde_json::Value::try_from(value).ok().map(|v| v.to_string()))
}

/// apache-avro's reading of a datum the walk accepted.
fn avro_value(schema: &Schema, body: &[u8]) -> Result<apache_avro::types::Value, String> {
    let mut rest = body;
    let value = apache_avro::reader::datum::GenericDatumReader::builder(schema)
        .build()
        .and_then(|r| r.read_value(&mut rest))
        .map_err(|e| format!("the body is not an Avro datum of the schema: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes are left after the Avro datum", rest.len()));
    }
    Ok(value)
}

fn protobuf_json(file: &FileDescriptor, body: &[u8]) -> Result<Option<String>, String> {
    let (indexes, rest) = message_indexes(body)?;
    let message = message_at(file, &indexes)?;
    let msg = DynamicMessage::decode(message.clone(), rest)
        .map_err(|e| format!("the body is not a {} message: {e}", message.full_name()))?;
    let options =
        SerializeOptions::new().use_proto_field_name(true).stringify_64_bit_integers(false).skip_default_fields(false);
    let mut out = serde_json::Serializer::new(Vec::new());
    msg.serialize_with_options(&mut out, &options).map_err(|e| format!("a value JSON cannot hold: {e}"))?;
    String::from_utf8(out.into_inner()).map(Some).map_err(|e| format!("a value JSON cannot hold: {e}"))
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
        assert_eq!(
            json(&avro_json(&s, body).unwrap().unwrap()),
            json(r#"{"id":"o-2","amount_cents":-5,"note":"gift"}"#)
        );
        // Cut short, or with bytes left over: not a datum of the schema.
        assert!(avro_json(&s, &body[..body.len() - 2]).is_err());
        let mut longer = body.to_vec();
        longer.push(7);
        assert!(avro_json(&s, &longer).unwrap_err().contains("left after"));
        // A string length claiming gigabytes fails the record, not the allocator.
        assert!(avro_json(&s, &[0xfe, 0xff, 0xff, 0xff, 0x1f]).is_err());
        // Cut off before the trailing ["null", "string"] field: not a null note.
        let w = crate::format::avro::Writer::new(1, ORDER).unwrap();
        let bytes = w.encode(br#"{"id":"o-2","amount_cents":-5}"#).unwrap();
        let body = &frame(&bytes).unwrap().1;
        assert!(avro_json(&s, body).unwrap().is_some());
        let e = avro_json(&s, &body[..body.len() - 1]).unwrap_err();
        assert!(e.contains("cut short"), "{e}");
    }

    #[test]
    fn avro_allocations_are_capped_at_64_mib_once_a_decoder_exists() {
        Decoder::new(&cfg("http://127.0.0.1:9"), Duration::ZERO).unwrap();
        // A string claiming 100 MiB (over our cap, under apache-avro's default 512 MiB), read by
        // apache-avro itself (the walk would refuse it first for want of bytes).
        let mut len = Vec::new();
        let mut n = (100u64 << 20) << 1; // zigzag
        while n >= 0x80 {
            len.push((n as u8) | 0x80);
            n >>= 7;
        }
        len.push(n as u8);
        let e = avro_value(&Schema::String, &len).unwrap_err();
        assert!(e.contains(&AVRO_MAX_ALLOCATION.to_string()), "{e}");
    }

    #[test]
    fn deep_nesting_is_a_bad_record_not_a_stack_overflow() {
        let list =
            Schema::parse_str(r#"{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"]}]}"#)
                .unwrap();
        let mut deep = vec![2u8; 5000];
        deep.push(0);
        let e = avro_json(&list, &deep).unwrap_err();
        assert!(e.contains("deeper than 128"), "{e}");
        assert!(avro_json(&list, &[2, 2, 0]).unwrap().is_some());
        // Protobuf: prost's recursion limit (100) holds for prost-reflect's dynamic messages.
        let Reader::Protobuf(f) =
            reader(Format::Protobuf, "PROTOBUF", "syntax = \"proto3\";\nmessage Node { Node next = 1; }\n").unwrap()
        else {
            unreachable!()
        };
        let mut m: Vec<u8> = Vec::new();
        for _ in 0..5000 {
            let mut outer = vec![0x0a];
            prost::encoding::encode_varint(m.len() as u64, &mut outer);
            outer.extend_from_slice(&m);
            m = outer;
        }
        let mut body = vec![0];
        body.extend_from_slice(&m);
        assert!(protobuf_json(&f, &body).is_err());
    }

    #[test]
    fn an_avro_nan_keeps_the_row_without_json() {
        let s = Schema::parse_str(r#""double""#).unwrap();
        assert_eq!(avro_json(&s, &f64::NAN.to_le_bytes()), Ok(None));
        assert_eq!(avro_json(&s, &f64::INFINITY.to_le_bytes()), Ok(None));
        assert_eq!(avro_json(&s, &1.5f64.to_le_bytes()), Ok(Some("1.5".into())));
    }

    #[test]
    fn protobuf_decodes_what_the_encoder_writes_and_follows_the_indexes() {
        let w = crate::format::protobuf::Writer::new(2, SHOP).unwrap();
        let bytes = w.encode(br#"{"id":"o-1","amount_cents":1234,"items":["a"]}"#).unwrap();
        let (_, body) = frame(&bytes).unwrap();
        let Reader::Protobuf(f) = reader(Format::Protobuf, "PROTOBUF", SHOP).unwrap() else { unreachable!() };
        assert_eq!(
            json(&protobuf_json(&f, body).unwrap().unwrap()),
            json(r#"{"id":"o-1","amount_cents":1234,"items":["a"]}"#)
        );
        // Indexes [1] (count 1 → zigzag 2, index 1 → 2): the second message; [0, 0]: the nested one.
        let mut second = vec![2, 2];
        second.extend_from_slice(&[0x0a, 1, b'x', 0x12, 1, b'y']);
        assert_eq!(json(&protobuf_json(&f, &second).unwrap().unwrap()), json(r#"{"id":"x","reason":"y"}"#));
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

    fn cfg(url: &str) -> RegistryConfig {
        RegistryConfig {
            url: reqwest::Url::parse(url).unwrap(),
            user: None,
            password: None,
            ca_file: None,
            value: Some(Format::JsonSchema),
            key: None,
            strategy: crate::format::SubjectStrategy::Topic,
            auto_register: false,
            schema_dir: None,
        }
    }

    /// A registry on loopback answering every request 200 with `body`; its URL and the requests seen.
    fn registry(body: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        registry_answering(200, body)
    }

    fn registry_answering(status: u16, body: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (url, seen)
    }

    #[tokio::test]
    async fn an_id_beyond_2_31_is_a_bad_record_without_asking_the_registry() {
        let (url, seen) = registry(r#"{"schema":"{}","schemaType":"JSON"}"#);
        let mut d = Decoder::new(&cfg(&url), Duration::ZERO).unwrap();
        for id in [[0x80, 0, 0, 0], [0xff, 0xff, 0xff, 0xff]] {
            let mut v = vec![0];
            v.extend_from_slice(&id);
            v.extend_from_slice(b"{}");
            let Err(Failure::Bad(b)) = d.decode(&v, "t/0/1").await else { panic!("not bad") };
            assert_eq!(b.reason, NOT_WIRE_FORMAT, "{}", b.message);
        }
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0);
        // The largest valid id is asked for.
        assert_eq!(d.decode(&[0, 0x7f, 0xff, 0xff, 0xff, b'1'], "t/0/2").await, Ok(Some("1".into())));
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_schema_of_another_type_stops_the_inbox_naming_the_flag() {
        let (url, _) = registry(r#"{"schema":"\"string\""}"#);
        let mut d = Decoder::new(&cfg(&url), Duration::ZERO).unwrap();
        let Err(Failure::Definite(e)) = d.decode(&[0, 0, 0, 0, 7, b'1'], "t/0/1").await else { panic!("not definite") };
        assert!(e.contains("schema id 7") && e.contains("AVRO") && e.contains("--value-format json-schema"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[tokio::test]
    async fn deep_json_is_a_bad_record() {
        let (url, _) = registry(r#"{"schema":"{}","schemaType":"JSON"}"#);
        let mut d = Decoder::new(&cfg(&url), Duration::ZERO).unwrap();
        let mut v = vec![0, 0, 0, 0, 3];
        v.extend(std::iter::repeat_n(b'[', 5000).chain(std::iter::repeat_n(b']', 5000)));
        let Err(Failure::Bad(b)) = d.decode(&v, "t/0/1").await else { panic!("not bad") };
        assert_eq!(b.reason, UNDECODABLE);
    }

    #[tokio::test]
    async fn an_unknown_id_waits_for_the_timeout_then_is_a_bad_record() {
        let (url, seen) = registry_answering(404, r#"{"error_code":40403,"message":"Schema 5 not found"}"#);
        let mut d = Decoder::new(&cfg(&url), Duration::from_millis(600)).unwrap();
        let v = [0, 0, 0, 0, 5, b'1'];
        let Err(Failure::Unavailable(e)) = d.decode(&v, "t/0/1").await else { panic!("not a wait") };
        assert!(e.contains("schema id 5") && e.contains(&url) && e.contains("--schema-missing-timeout"), "{e}");
        tokio::time::sleep(Duration::from_millis(700)).await;
        let Err(Failure::Bad(b)) = d.decode(&v, "t/0/2").await else { panic!("not bad") };
        assert_eq!(b.reason, SCHEMA_MISSING, "{}", b.message);
        // Kept: the next record of the id is bad at once, without asking.
        let asked = seen.load(std::sync::atomic::Ordering::SeqCst);
        assert!(matches!(d.decode(&v, "t/0/3").await, Err(Failure::Bad(_))));
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), asked);
        // A timeout of 0: bad at once.
        let mut now = Decoder::new(&cfg(&url), Duration::ZERO).unwrap();
        assert!(matches!(now.decode(&v, "t/0/1").await, Err(Failure::Bad(b)) if b.reason == SCHEMA_MISSING));
    }
}
