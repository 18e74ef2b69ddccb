//! Record formats that need a schema registry, through `--schema-registry-url`:
//! `--value-converter avro` (Confluent's, or Apicurio's, AvroConverter), `json-schema`
//! (Confluent's JsonSchemaConverter) and `protobuf` (Confluent's ProtobufConverter).
//!
//! The router hands on the payload column's JSON text; [`Encoder::encode`] turns it into the
//! Confluent wire format (byte `0`, the schema id as 4 bytes big-endian, then the Avro binary
//! datum, the JSON validated against its JSON Schema, or the message indexes and the Protobuf
//! message),
//! with the latest schema registered under the topic's subject (`<topic>-value`, Confluent's
//! TopicNameStrategy). The relay calls it for every record before the size check; dead-letter
//! copies are not encoded (their topic has no schema; they carry the original JSON).
//!
//! # Invariants
//! * What the registry says is classified once ([`registry`]): unreachable is [`Failure::Unavailable`]
//!   (the session stops before the event, nothing past it is confirmed, and the next session
//!   asks again), credentials refused is [`Failure::Definite`], and a subject without a schema or a
//!   payload that does not fit it is [`Failure::Bad`], which `--on-bad-event` handles: never a
//!   crash loop.
//! * Schemas are fetched once per topic per session and cached (Confluent's `use.latest.version`
//!   with its default cache TTL: a schema registered later is used from the next session on).
//! * Nothing here runs when no registry format is configured: the relay checks one `Option`.

pub mod avro;
pub mod json_schema;
pub mod protobuf;
pub mod registry;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use reqwest::Url;

use crate::router::Record;
use registry::{Registry, RegistryError};

/// `--schema-registry-*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryConfig {
    /// The API root, e.g. `http://registry:8081` or Apicurio's `http://registry:8080/apis/ccompat/v7`.
    pub url: Url,
    pub user: Option<String>,
    /// `--schema-registry-password-file`'s content, without one trailing newline.
    pub password: Option<Password>,
    pub ca_file: Option<PathBuf>,
    /// What the values are written as.
    pub format: Format,
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
        let value = crate::config::postgres::read_secret_file(flag, path).map_err(|e| e.to_string())?;
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
    fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            Writer::Avro(w) => w.encode(payload),
            Writer::Json(w) => w.encode(payload),
            Writer::Protobuf(w) => w.encode(payload),
        }
    }
}

/// The value encoder of one session.
pub struct Encoder {
    registry: Registry,
    format: Format,
    /// Per topic: the subject's latest schema and its id, or why it has none.
    schemas: HashMap<String, Result<Arc<Writer>, (&'static str, String)>>,
}

impl Encoder {
    pub fn new(cfg: &RegistryConfig) -> Result<Encoder, String> {
        Ok(Encoder { registry: Registry::new(cfg)?, format: cfg.format, schemas: HashMap::new() })
    }

    /// Encode `record`'s value in place (a null value stays null).
    pub async fn encode(&mut self, record: &mut Record) -> Result<(), Failure> {
        let Some(payload) = record.payload.as_ref() else { return Ok(()) };
        let writer = match self.schemas.get(&record.topic) {
            Some(w) => w.clone(),
            None => {
                let w = self.fetch(&record.topic).await?;
                self.schemas.insert(record.topic.clone(), w.clone());
                w
            }
        };
        let writer = writer.map_err(|(code, reason)| Failure::Bad { code, reason })?;
        let bytes = writer.encode(payload).map_err(|reason| Failure::Bad { code: "schema_mismatch", reason })?;
        record.payload = Some(Bytes::from(bytes));
        Ok(())
    }

    async fn fetch(&self, topic: &str) -> Result<Result<Arc<Writer>, (&'static str, String)>, Failure> {
        let subject = format!("{topic}-value");
        match self.registry.latest(&subject).await {
            Ok(reg) => {
                let kind = reg.schema_type.as_deref().unwrap_or("AVRO");
                let want = self.format.schema_type();
                if kind != want {
                    return Ok(Err((
                        "schema_mismatch",
                        format!(
                            "subject {subject:?} holds a {kind} schema (id {}); --value-converter {} needs a {want} one",
                            reg.id,
                            self.format.flag()
                        ),
                    )));
                }
                let writer = match self.format {
                    Format::Avro => avro::Writer::new(reg.id, &reg.schema).map(Writer::Avro),
                    Format::JsonSchema => json_schema::Writer::new(reg.id, &reg.schema).map(Writer::Json),
                    Format::Protobuf => protobuf::Writer::new(reg.id, &reg.schema).map(Writer::Protobuf),
                };
                match writer {
                    Ok(w) => {
                        tracing::info!(
                            subject,
                            id = reg.id,
                            "schema registry: encoding with the subject's latest schema"
                        );
                        Ok(Ok(Arc::new(w)))
                    }
                    Err(e) => Ok(Err(("schema_mismatch", format!("subject {subject:?} (id {}): {e}", reg.id)))),
                }
            }
            Err(e @ RegistryError::Missing { .. }) => Ok(Err(("schema_missing", e.to_string()))),
            Err(e @ RegistryError::Refused { .. }) => Err(Failure::Definite(e.to_string())),
            Err(e @ RegistryError::Unavailable { .. }) => Err(Failure::Unavailable(e.to_string())),
        }
    }
}
