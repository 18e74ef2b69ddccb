//! Record formats that need a schema registry, through `--schema-registry-url`:
//! `--value-converter avro` (Confluent's, or Apicurio's, AvroConverter), `json-schema`
//! (Confluent's JsonSchemaConverter) and `protobuf` (Confluent's ProtobufConverter), and
//! `--key-converter avro|json-schema` (the key, a string, under `<topic>-key`).
//!
//! The router hands on the payload column's JSON text; [`Encoder::encode`] turns it into the
//! Confluent wire format (byte `0`, the schema id as 4 bytes big-endian, then the Avro binary
//! datum, the JSON validated against its JSON Schema, or the message indexes and the Protobuf
//! message). The schema is the event type's file in `--schema-dir`, or the latest version of its
//! subject; the subject follows `--subject-name-strategy` ([`source`]). The relay calls it for
//! every record before the size check; dead-letter copies are not encoded (their topic has no
//! schema; they carry the original key and JSON).
//!
//! # Invariants
//! * What the registry says is classified once ([`registry`]): unreachable is [`Failure::Unavailable`]
//!   (the session stops before the event, nothing past it is confirmed, and the next session
//!   asks again), credentials refused is [`Failure::Definite`], and a subject without a schema, a
//!   schema not registered (or refused as incompatible or invalid when registering) or a payload
//!   that does not fit is [`Failure::Bad`], which `--on-bad-event` handles: never a crash loop.
//! * Schemas are resolved once per (topic, event type) per session and cached (Confluent's
//!   default cache TTL: a newer version registered later is used from the next session on). An
//!   answer that makes events bad is asked again after [`RETRY_BAD_AFTER`], so registering the
//!   missing schema (or fixing a file) takes effect without a restart.
//! * A record is changed only when both its key and its value are encoded: a bad event's
//!   dead-letter copy carries what the router made.
//! * Nothing here runs when no registry format is configured: the relay checks one `Option`.

pub mod avro;
mod avro_fit;
pub mod json_schema;
mod mismatch;
mod proto_fit;
pub mod protobuf;
pub mod registry;
pub mod source;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use reqwest::Url;

use registry::{Registry, RegistryError};
pub use source::SubjectStrategy;

/// The parts of a record [`Encoder::encode`] reads (topic, event type) and rewrites (key,
/// value), borrowed from the caller's record: this module knows bytes, not the router's types.
pub struct Fields<'a> {
    pub topic: &'a str,
    /// The event type's text, which picks the schema with `--schema-dir` or a per-record subject.
    pub event_type: Option<&'a Bytes>,
    pub key: &'a mut Option<Bytes>,
    /// `None` is a null value (tombstone), which stays null.
    pub payload: &'a mut Option<Bytes>,
}

/// `--schema-registry-*`. Its `Debug` shows the URL masked (a secret query value as `****`).
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    /// The API root, e.g. `http://registry:8081` or Apicurio's `http://registry:8080/apis/ccompat/v7`.
    pub url: Url,
    pub user: Option<String>,
    /// `--schema-registry-password-file`'s content, without one trailing newline.
    pub password: Option<Password>,
    pub ca_file: Option<PathBuf>,
    /// What the values are written as, when through the registry.
    pub value: Option<Format>,
    /// What the keys are written as (Avro or JSON Schema strings), when through the registry.
    pub key: Option<Format>,
    /// `--subject-name-strategy` (values).
    pub strategy: SubjectStrategy,
    /// `--schema-auto-register`: register file schemas (and the key schema) on first use.
    pub auto_register: bool,
    /// `--schema-dir`: schema files per event type.
    pub schema_dir: Option<PathBuf>,
}

impl std::fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("url", &crate::secret::mask_url(self.url.as_str()))
            .field("user", &self.user)
            .field("password", &self.password)
            .field("ca_file", &self.ca_file)
            .field("value", &self.value)
            .field("key", &self.key)
            .field("strategy", &self.strategy)
            .field("auto_register", &self.auto_register)
            .field("schema_dir", &self.schema_dir)
            .finish()
    }
}

/// A password read from a file: shown as the file's path only.
#[derive(Clone, PartialEq, Eq)]
pub struct Password {
    pub path: PathBuf,
    value: String,
}

impl Password {
    pub fn read(flag: &str, path: &std::path::Path) -> Result<Password, String> {
        // The same reading as --postgres-password-file's.
        let value = crate::secret::read_secret_file(flag, path).map_err(|e| e.to_string())?;
        if value.is_empty() {
            return Err(format!("{flag} {}: the file is empty; put the password there", path.display()));
        }
        Ok(Password { path: path.to_owned(), value })
    }

    pub fn expose(&self) -> &str {
        &self.value
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Password(from {})", self.path.display())
    }
}

/// Why a record could not be encoded.
#[derive(Debug)]
pub enum Failure {
    /// The record does not fit (no schema for its subject, or the payload not matching it).
    Bad { code: &'static str, reason: String },
    /// The registry cannot be asked now.
    Unavailable(String),
    /// An operator must act (credentials refused, a schema outboxd cannot use).
    Definite(String),
}

/// The registry formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Avro,
    JsonSchema,
    Protobuf,
}

impl Format {
    /// The registry's `schemaType` for it.
    fn schema_type(self) -> &'static str {
        match self {
            Format::Avro => "AVRO",
            Format::JsonSchema => "JSON",
            Format::Protobuf => "PROTOBUF",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Format::Avro => "avro",
            Format::JsonSchema => "json-schema",
            Format::Protobuf => "protobuf",
        }
    }
}

/// A subject's schema, ready to write with.
enum Writer {
    Avro(avro::Writer),
    Json(json_schema::Writer),
    Protobuf(protobuf::Writer),
}

impl Writer {
    fn new(format: Format, id: u32, schema: &str) -> Result<Writer, String> {
        match format {
            Format::Avro => avro::Writer::new(id, schema).map(Writer::Avro),
            Format::JsonSchema => json_schema::Writer::new(id, schema).map(Writer::Json),
            Format::Protobuf => protobuf::Writer::new(id, schema).map(Writer::Protobuf),
        }
    }

    fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            Writer::Avro(w) => w.encode(payload),
            Writer::Json(w) => w.encode(payload),
            Writer::Protobuf(w) => w.encode(payload),
        }
    }

    fn name(&self) -> Option<String> {
        match self {
            Writer::Avro(w) => w.name(),
            Writer::Json(w) => w.name(),
            Writer::Protobuf(w) => w.name(),
        }
    }
}

/// A resolved schema, or the bad-event code and reason of every record that needs it.
type Entry = Result<Arc<Writer>, (&'static str, String)>;

/// How long an answer that makes events bad (no schema, not registered, refused, a file that
/// cannot be used) is kept before the registry or the file is asked again: a fix takes effect
/// within it, without a restart. Good answers are kept for the session.
const RETRY_BAD_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Most schemas kept at once (topics × event types): past it the cache starts over, so rows with
/// ever new event types or topics cannot grow memory without bound (Confluent's clients cap
/// theirs at 1,000 per client).
const MAX_CACHED: usize = 10_000;

/// An [`Entry`] and when it was resolved.
#[derive(Clone)]
struct Cached {
    entry: Entry,
    at: std::time::Instant,
}

impl Cached {
    fn new(entry: Entry) -> Cached {
        Cached { entry, at: std::time::Instant::now() }
    }

    /// Still usable: good, or bad and recent (a good entry costs no clock read).
    fn fresh(&self) -> Option<&Entry> {
        (self.entry.is_ok() || self.at.elapsed() < RETRY_BAD_AFTER).then_some(&self.entry)
    }
}

/// The key schema of `format` that `--schema-auto-register` registers: a string (the JSON Schema
/// names its draft, which Apicurio needs to recognize it as one).
fn key_schema(format: Format) -> &'static str {
    match format {
        Format::Avro => "\"string\"",
        _ => r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"string"}"#,
    }
}

/// The encoder of one session.
pub struct Encoder {
    registry: Registry,
    value: Option<Format>,
    key: Option<Format>,
    strategy: SubjectStrategy,
    auto_register: bool,
    schema_dir: Option<PathBuf>,
    /// Whether the value schema depends on the event type (files, or a record strategy).
    per_type: bool,
    /// Per topic, per event type (`None` when the schema does not depend on it): the value schema.
    values: HashMap<String, HashMap<Option<Bytes>, Cached>>,
    /// Per topic: the key schema.
    keys: HashMap<String, Cached>,
    /// Entries in `values` and `keys` together (bounded by [`MAX_CACHED`]).
    cached: usize,
}

impl Encoder {
    pub fn new(cfg: &RegistryConfig) -> Result<Encoder, String> {
        Ok(Encoder {
            registry: Registry::new(cfg)?,
            value: cfg.value,
            key: cfg.key,
            strategy: cfg.strategy,
            auto_register: cfg.auto_register,
            schema_dir: cfg.schema_dir.clone(),
            per_type: cfg.schema_dir.is_some() || cfg.strategy != SubjectStrategy::Topic,
            values: HashMap::new(),
            keys: HashMap::new(),
            cached: 0,
        })
    }

    /// Encode a record's key and value in place (null stays null); on a failure they are
    /// unchanged. The router's `Record` hands its fields over as [`Fields`].
    pub async fn encode<'a>(&mut self, record: impl Into<Fields<'a>>) -> Result<(), Failure> {
        let record = record.into();
        let key = match (self.key, record.key.as_ref()) {
            (Some(format), Some(key)) => {
                let writer = match self.keys.get(record.topic).and_then(Cached::fresh) {
                    Some(w) => w.clone(),
                    None => {
                        let w = self.key_schema(format, record.topic).await?;
                        self.make_room();
                        self.keys.insert(record.topic.to_owned(), Cached::new(w.clone()));
                        w
                    }
                };
                let writer = writer.map_err(|(code, reason)| Failure::Bad { code, reason })?;
                let text = std::str::from_utf8(key).map_err(|_| Failure::Bad {
                    code: "schema_mismatch",
                    reason: "the key is not UTF-8 text, which a string key schema needs".into(),
                })?;
                let json = serde_json::to_vec(text).expect("a string serializes");
                let bytes = writer
                    .encode(&json)
                    .map_err(|reason| Failure::Bad { code: "schema_mismatch", reason: format!("key: {reason}") })?;
                Some(Bytes::from(bytes))
            }
            _ => None,
        };
        let value = match (self.value, record.payload.as_ref()) {
            (Some(format), Some(payload)) => {
                let event_type = if self.per_type { record.event_type.cloned() } else { None };
                let cached = self.values.get(record.topic).and_then(|m| m.get(&event_type)).and_then(Cached::fresh);
                let writer = match cached {
                    Some(w) => w.clone(),
                    None => {
                        let w = self.value_schema(format, record.topic, event_type.as_ref()).await?;
                        self.make_room();
                        self.values
                            .entry(record.topic.to_owned())
                            .or_default()
                            .insert(event_type, Cached::new(w.clone()));
                        w
                    }
                };
                let writer = writer.map_err(|(code, reason)| Failure::Bad { code, reason })?;
                let bytes =
                    writer.encode(payload).map_err(|reason| Failure::Bad { code: "schema_mismatch", reason })?;
                Some(Bytes::from(bytes))
            }
            _ => None,
        };
        if key.is_some() {
            *record.key = key;
        }
        if value.is_some() {
            *record.payload = value;
        }
        Ok(())
    }

    /// Count one more cached entry, starting over when the cache is full (a replaced stale entry
    /// counts again: the count only overestimates, so the bound holds).
    fn make_room(&mut self) {
        if self.cached >= MAX_CACHED {
            tracing::info!(entries = self.cached, "schema registry: the schema cache is full; starting it over");
            self.values.clear();
            self.keys.clear();
            self.cached = 0;
        }
        self.cached += 1;
    }

    /// The key schema of `topic`, under `<topic>-key`: a string schema registered there with
    /// --schema-auto-register, else the subject's latest version (any schema a string fits).
    async fn key_schema(&self, format: Format, topic: &str) -> Result<Entry, Failure> {
        let subject = format!("{topic}-key");
        if self.auto_register {
            self.by_content(format, &subject, key_schema(format), "the key schema").await
        } else {
            self.latest(format, &subject, "--key-converter").await
        }
    }

    /// The value schema of records of `topic` and `event_type`.
    async fn value_schema(&self, format: Format, topic: &str, event_type: Option<&Bytes>) -> Result<Entry, Failure> {
        let event_type = event_type.and_then(|t| std::str::from_utf8(t).ok());
        let file = match (&self.schema_dir, event_type) {
            (Some(dir), Some(t)) => match source::read_schema_file(dir, t, format) {
                Ok(file) => file,
                Err(reason) => return Ok(Err(("schema_invalid", reason))),
            },
            _ => None,
        };
        if let Some((path, text)) = file {
            // Parsed first: a file outboxd cannot use is named as such, before any subject.
            let parsed = match Writer::new(format, 0, &text) {
                Ok(w) => w,
                Err(e) => return Ok(Err(("schema_invalid", format!("schema file {}: {e}", path.display())))),
            };
            let name = match (self.strategy, parsed.name()) {
                (SubjectStrategy::Topic, _) => String::new(),
                (_, Some(name)) => name,
                (_, None) => {
                    return Ok(Err((
                        "schema_invalid",
                        format!(
                            "schema file {}: --subject-name-strategy {} needs a named schema (an Avro record, a Protobuf message, a JSON Schema with a title)",
                            path.display(),
                            self.strategy.flag()
                        ),
                    )))
                }
            };
            let subject = self.strategy.value_subject(topic, &name);
            let what = format!("schema file {}", path.display());
            return self.by_content(format, &subject, &text, &what).await;
        }
        let subject = match (self.strategy, event_type) {
            (SubjectStrategy::Topic, _) => format!("{topic}-value"),
            (strategy, Some(t)) => strategy.value_subject(topic, t),
            (strategy, None) => {
                return Ok(Err((
                    "schema_missing",
                    format!(
                        "--subject-name-strategy {} names the subject after the event type, and this event has none (or it is not UTF-8)",
                        strategy.flag()
                    ),
                )))
            }
        };
        self.latest(format, &subject, "--value-converter").await
    }

    /// `schema` under `subject`: registered with --schema-auto-register, else looked up.
    async fn by_content(&self, format: Format, subject: &str, schema: &str, what: &str) -> Result<Entry, Failure> {
        let kind = format.schema_type();
        let answer = if self.auto_register {
            self.registry.register(subject, schema, kind).await
        } else {
            self.registry.lookup(subject, schema, kind).await
        };
        let id = match answer {
            Ok(id) => id,
            Err(e) => return classify(e).map(|(code, reason)| Err((code, format!("{what}: {reason}")))),
        };
        match Writer::new(format, id, schema) {
            Ok(w) => {
                tracing::info!(subject, id, registered = self.auto_register, "schema registry: encoding with {what}");
                Ok(Ok(Arc::new(w)))
            }
            Err(e) => Ok(Err(("schema_invalid", format!("{what}: {e}")))),
        }
    }

    /// The latest version of `subject`, for `flag`'s format.
    async fn latest(&self, format: Format, subject: &str, flag: &str) -> Result<Entry, Failure> {
        let reg = match self.registry.latest(subject).await {
            Ok(reg) => reg,
            Err(e) => return classify(e).map(Err),
        };
        let kind = reg.schema_type.as_deref().unwrap_or("AVRO");
        let want = format.schema_type();
        if kind != want {
            return Ok(Err((
                "schema_mismatch",
                format!(
                    "subject {subject:?} holds a {kind} schema (id {}); {flag} {} needs a {want} one",
                    reg.id,
                    format.flag()
                ),
            )));
        }
        match Writer::new(format, reg.id, &reg.schema) {
            Ok(w) => {
                tracing::info!(subject, id = reg.id, "schema registry: encoding with the subject's latest schema");
                Ok(Ok(Arc::new(w)))
            }
            Err(e) => Ok(Err(("schema_mismatch", format!("subject {subject:?} (id {}): {e}", reg.id)))),
        }
    }
}

/// A registry error as a bad event's code and reason, or the failure that stops the session.
fn classify(e: RegistryError) -> Result<(&'static str, String), Failure> {
    match e.bad_event_code() {
        Some(code) => Ok((code, e.to_string())),
        None => match e {
            RegistryError::Refused { .. } => Err(Failure::Definite(e.to_string())),
            _ => Err(Failure::Unavailable(e.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_answers_are_asked_again_after_a_while_good_ones_are_kept() {
        let old = std::time::Instant::now() - RETRY_BAD_AFTER - std::time::Duration::from_secs(1);
        let bad = Cached { entry: Err(("schema_missing", "no schema".into())), at: old };
        assert!(bad.fresh().is_none(), "an old bad answer is asked again");
        let recent = Cached::new(Err(("schema_missing", "no schema".into())));
        assert!(recent.fresh().is_some_and(|e| e.is_err()), "a recent one is kept");
        let writer = Writer::new(Format::Avro, 1, "\"string\"").unwrap();
        let good = Cached { entry: Ok(Arc::new(writer)), at: old };
        assert!(good.fresh().is_some_and(|e| e.is_ok()), "a good answer is kept for the session");
    }
}
