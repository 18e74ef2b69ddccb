//! Where a record's schema comes from, and the subject it lives under.
//!
//! * **A schema file** of the event's type in `--schema-dir`: `<event_type>.avsc` (Avro),
//!   `<event_type>.json` (JSON Schema, the same file as the contract) or `<event_type>.proto`
//!   (Protobuf). Its id is looked up under its subject (Confluent's serializers with
//!   `auto.register.schemas=false`), or with `--schema-auto-register` the file is registered
//!   there (a compatibility refusal is then a bad event, `schema_incompatible`).
//! * **Otherwise, the subject's latest version** (Confluent's `use.latest.version`).
//!
//! Subjects follow `--subject-name-strategy` ([`SubjectStrategy`]), as Confluent's
//! `value.subject.name.strategy` does. The record name of the record strategies is the schema's
//! own full name when the schema comes from a file (as Confluent takes it from the serialized
//! object's schema) and the event type when it comes from the registry (there is no schema yet
//! to name it). Keys always use `<topic>-key`: its latest version, or with
//! `--schema-auto-register` a string schema registered there.
//!
//! # Invariants
//! * A file is read once per event type per session; a changed file takes effect from the next
//!   session (a restart, or any session the relay starts after an error). A file that cannot be
//!   read or used makes its events bad events (`schema_invalid`), never a stop.
//! * Only a plain event type names a file (no `/`, no leading `.`, no NUL): a row cannot make
//!   outboxd read outside the directory.

use std::path::{Path, PathBuf};

use super::Format;

/// `--subject-name-strategy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SubjectStrategy {
    /// `<topic>-value` (Confluent's TopicNameStrategy).
    #[default]
    Topic,
    /// The record's full name (RecordNameStrategy).
    Record,
    /// `<topic>-<record name>` (TopicRecordNameStrategy).
    TopicRecord,
}

impl SubjectStrategy {
    /// The value subject of a record of `topic` whose record name is `name`.
    pub fn value_subject(self, topic: &str, name: &str) -> String {
        match self {
            SubjectStrategy::Topic => format!("{topic}-value"),
            SubjectStrategy::Record => name.to_owned(),
            SubjectStrategy::TopicRecord => format!("{topic}-{name}"),
        }
    }

    /// The flag's value for it.
    pub fn flag(self) -> &'static str {
        match self {
            SubjectStrategy::Topic => "topic",
            SubjectStrategy::Record => "record",
            SubjectStrategy::TopicRecord => "topic-record",
        }
    }

    /// Confluent's class for it (`…serializers.subject.<Class>`), for the Debezium mapping.
    pub fn from_confluent_class(class: &str) -> Option<SubjectStrategy> {
        match class.trim().rsplit('.').next()? {
            "TopicNameStrategy" => Some(SubjectStrategy::Topic),
            "RecordNameStrategy" => Some(SubjectStrategy::Record),
            "TopicRecordNameStrategy" => Some(SubjectStrategy::TopicRecord),
            _ => None,
        }
    }
}

impl Format {
    /// The schema file's extension for this format.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Avro => "avsc",
            Format::JsonSchema => "json",
            Format::Protobuf => "proto",
        }
    }
}

/// The schema file of `event_type` in `dir` for `format`: `Ok(None)` when there is none (or the
/// type cannot name a file), an error (for a bad event, not a stop: it concerns this event type
/// only) when it exists and cannot be read.
pub fn read_schema_file(dir: &Path, event_type: &str, format: Format) -> Result<Option<(PathBuf, String)>, String> {
    if event_type.is_empty() || event_type.starts_with('.') || event_type.contains(['/', '\\', '\0']) {
        return Ok(None);
    }
    let path = dir.join(format!("{event_type}.{}", format.extension()));
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some((path, text))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("schema file {}: cannot read it ({e}); make it a readable UTF-8 file", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_strategy() {
        assert_eq!(SubjectStrategy::Topic.value_subject("shop.events", "shop.v1.Order"), "shop.events-value");
        assert_eq!(SubjectStrategy::Record.value_subject("shop.events", "shop.v1.Order"), "shop.v1.Order");
        assert_eq!(
            SubjectStrategy::TopicRecord.value_subject("shop.events", "shop.v1.Order"),
            "shop.events-shop.v1.Order"
        );
        assert_eq!(
            SubjectStrategy::from_confluent_class("io.confluent.kafka.serializers.subject.TopicRecordNameStrategy"),
            Some(SubjectStrategy::TopicRecord)
        );
        assert_eq!(SubjectStrategy::from_confluent_class("com.example.Mine"), None);
    }

    #[test]
    fn only_plain_event_types_name_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("order.placed.avsc"), "\"string\"").unwrap();
        std::fs::write(dir.path().join("secret"), "x").unwrap();
        let got = read_schema_file(dir.path(), "order.placed", Format::Avro).unwrap();
        assert_eq!(got.map(|(_, t)| t).as_deref(), Some("\"string\""));
        assert!(read_schema_file(dir.path(), "order.placed", Format::Protobuf).unwrap().is_none());
        for bad in ["", "../secret", ".hidden", "a/b", "nul\0"] {
            assert!(read_schema_file(dir.path(), bad, Format::Avro).unwrap().is_none(), "{bad:?}");
        }
    }
}
