//! Event contracts: `--schema-dir DIR` holds one JSON Schema (draft 2020-12) per event type,
//! `DIR/<event_type>.json`, that the payload of that event type must satisfy.
//!
//! Invariants:
//! * A [`SchemaSet`] is a whole directory compiled at once: every file compiled, or the set is not
//!   made. [`Contracts`] holds the set in use behind an [`ArcSwap`], so a reload (SIGHUP) replaces
//!   it atomically while the pipeline keeps reading without a lock; a reload that fails leaves the
//!   old set in place. An event is checked against one set from start to end.
//! * Schemas are self-contained: the crate runs without its HTTP and file resolvers, so a `$ref`
//!   outside the file fails to compile instead of fetching anything at run time.
//! * Messages never quote payload values (they may be personal data, and they reach logs and DLQ
//!   headers): only instance paths, property names and what the schema expected.
//! * Only payloads are checked, and only when the event type has a schema (or
//!   `--schema-missing reject` asks for one). A NULL payload (a tombstone) is not checked.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;

/// Reason code of a payload that breaks its contract (and of a missing schema under `reject`).
pub const CODE: &str = "schema";
/// Dead-letter header with the first validation errors, a JSON array of `{"path", "message"}`.
pub const H_ERRORS: &str = "outboxd.schema.errors";
/// Validation errors kept per event: enough to fix a producer, small enough for a header.
pub const MAX_ERRORS: usize = 5;
/// Longest message kept per error, in bytes.
pub const MAX_MESSAGE: usize = 160;

/// What an event type without a schema file does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemaMissing {
    /// Deliver it unchecked.
    Allow,
    /// It is a bad event (reason `schema`).
    Reject,
}

/// One compiled schema and the file it came from (for messages).
struct Schema {
    file: PathBuf,
    validator: jsonschema::Validator,
}

/// Every schema of one directory, compiled, by event type.
pub struct SchemaSet {
    schemas: HashMap<String, Schema>,
}

impl SchemaSet {
    /// Compile every `*.json` file of `dir` (hidden files and other names are ignored). The error
    /// is one line naming the directory or file and the fix.
    pub fn load(dir: &Path) -> Result<SchemaSet, String> {
        let read_err = |e: std::io::Error| {
            format!(
                "--schema-dir {}: cannot read it ({e}); point it at a readable directory of <event_type>.json schemas",
                dir.display()
            )
        };
        let mut schemas = HashMap::new();
        for entry in std::fs::read_dir(dir).map_err(read_err)? {
            let path = entry.map_err(read_err)?.path();
            let Some(name) = path.file_name() else { continue };
            let Some(name) = name.to_str() else {
                return Err(format!(
                    "schema file {}: the name is not UTF-8; rename it to <event_type>.json",
                    path.display()
                ));
            };
            let Some(event_type) = name.strip_suffix(".json") else { continue };
            if name.starts_with('.') || path.is_dir() {
                continue;
            }
            let validator = compile_file(&path)?;
            schemas.insert(event_type.to_owned(), Schema { file: path, validator });
        }
        Ok(SchemaSet { schemas })
    }

    pub fn len(&self) -> usize {
        self.schemas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.schemas.is_empty()
    }

    /// Check one event. `event_type` is `None` for a NULL type column; `payload` `None` for a NULL
    /// payload.
    pub fn check(&self, missing: SchemaMissing, event_type: Option<&str>, payload: Option<&[u8]>) -> Verdict {
        let Some(schema) = event_type.and_then(|t| self.schemas.get(t)) else {
            return match missing {
                SchemaMissing::Allow => Verdict::Unchecked,
                SchemaMissing::Reject => Verdict::Violation(Violation::missing(event_type)),
            };
        };
        let Some(payload) = payload else { return Verdict::Unchecked };
        let instance: serde_json::Value = match serde_json::from_slice(payload) {
            Ok(v) => v,
            Err(e) => {
                return Verdict::Violation(Violation {
                    message: format!(
                        "the payload is not JSON ({}), but event type {:?} has a schema ({}); only JSON payloads can be checked",
                        json_error_position(&e),
                        event_type.unwrap_or_default(),
                        schema.file.display()
                    ),
                    errors: Vec::new(),
                })
            }
        };
        let mut errors = Vec::new();
        let mut total = 0;
        for e in schema.validator.iter_errors(&instance) {
            total += 1;
            if errors.len() < MAX_ERRORS {
                let path = e.instance_path().as_str();
                let path = if path.is_empty() { "/".to_owned() } else { path.to_owned() };
                errors.push(SchemaError { path, message: cut(e.masked().to_string(), MAX_MESSAGE) });
            }
        }
        if total == 0 {
            return Verdict::Valid;
        }
        let first = &errors[0];
        let more = match total - 1 {
            0 => String::new(),
            1 => " (and 1 more error)".to_owned(),
            n => format!(" (and {n} more errors)"),
        };
        Verdict::Violation(Violation {
            message: format!(
                "the payload violates the schema of event type {:?} ({}): at {}: {}{more}",
                event_type.unwrap_or_default(),
                schema.file.display(),
                first.path,
                first.message
            ),
            errors,
        })
    }
}

/// serde_json's error without the input: its category and where.
fn json_error_position(e: &serde_json::Error) -> String {
    let what = match e.classify() {
        serde_json::error::Category::Io => "unreadable",
        serde_json::error::Category::Syntax => "syntax error",
        serde_json::error::Category::Data => "bad data",
        serde_json::error::Category::Eof => "ends early",
    };
    format!("{what} at line {} column {}", e.line(), e.column())
}

fn compile_file(path: &Path) -> Result<jsonschema::Validator, String> {
    let text = std::fs::read(path)
        .map_err(|e| format!("schema file {}: cannot read it ({e}); fix its permissions", path.display()))?;
    let schema: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
        format!("schema file {}: not JSON ({e}); fix the file or move it out of --schema-dir", path.display())
    })?;
    jsonschema::draft202012::options().should_validate_formats(true).build(&schema).map_err(|e| {
        let at = e.instance_path().as_str();
        let at = if at.is_empty() { String::new() } else { format!(" at {at}") };
        format!(
            "schema file {}: not a valid draft 2020-12 schema{at}: {e}; fix it (schemas must be self-contained: no $ref to other files or URLs)",
            path.display()
        )
    })
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max - 3;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
        s.push_str("...");
    }
    s
}

/// One validation error: where in the payload, and what the schema expected.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SchemaError {
    /// JSON Pointer into the payload (`/` for the whole payload).
    pub path: String,
    pub message: String,
}

/// Why an event breaks its contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// One line: the event type, the schema file and the first error.
    pub message: String,
    /// The first [`MAX_ERRORS`] validation errors; empty when the payload is not JSON or there
    /// is no schema.
    pub errors: Vec<SchemaError>,
}

impl Violation {
    fn missing(event_type: Option<&str>) -> Violation {
        let message = match event_type {
            Some(t) => format!("event type {t:?} has no schema ({t}.json) and --schema-missing is reject; add the schema or pass --schema-missing allow"),
            None => "the event type column is NULL, so no schema applies, and --schema-missing is reject".to_owned(),
        };
        Violation { message, errors: Vec::new() }
    }

    /// The [`H_ERRORS`] header, when there are validation errors to report.
    pub fn header(&self) -> Option<super::Header> {
        if self.errors.is_empty() {
            return None;
        }
        let json = serde_json::to_string(&self.errors).unwrap_or_default();
        Some((H_ERRORS.into(), Bytes::from(json)))
    }
}

/// The outcome of checking one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Its schema accepts the payload.
    Valid,
    /// Nothing to check: no schema under `allow`, or a NULL payload.
    Unchecked,
    Violation(Violation),
}

/// The contracts in force: the directory, the missing-schema policy and the compiled set, shared
/// by every clone (the pipeline's routes and the SIGHUP handler).
#[derive(Clone)]
pub struct Contracts {
    dir: PathBuf,
    missing: SchemaMissing,
    set: Arc<ArcSwap<SchemaSet>>,
}

impl Contracts {
    pub fn load(dir: &Path, missing: SchemaMissing) -> Result<Contracts, String> {
        let set = SchemaSet::load(dir)?;
        Ok(Contracts { dir: dir.to_owned(), missing, set: Arc::new(ArcSwap::from_pointee(set)) })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn missing(&self) -> SchemaMissing {
        self.missing
    }

    /// Schemas in the set in use.
    pub fn len(&self) -> usize {
        self.set.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Compile the directory again and put the new set in force; on error the old set stays and
    /// the error says so. Returns the number of schemas now in force.
    pub fn reload(&self) -> Result<usize, String> {
        match SchemaSet::load(&self.dir) {
            Ok(set) => {
                let n = set.len();
                self.set.store(Arc::new(set));
                Ok(n)
            }
            Err(e) => Err(format!("{e} (still using the {} schemas loaded before)", self.len())),
        }
    }

    /// Check one event against the set in force.
    pub fn check(&self, event_type: Option<&str>, payload: Option<&[u8]>) -> Verdict {
        self.set.load().check(self.missing, event_type, payload)
    }
}

/// Two configurations are equal when they name the same directory and policy; the compiled sets
/// are what the files say.
impl PartialEq for Contracts {
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir && self.missing == other.missing
    }
}

impl std::fmt::Debug for Contracts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contracts")
            .field("dir", &self.dir)
            .field("missing", &self.missing)
            .field("schemas", &self.len())
            .finish()
    }
}

#[cfg(test)]
#[path = "contract_tests.rs"]
mod tests;
