//! `outboxd decrypt`: restore sealed fields for a reader who holds the keyring.
//!
//! Input is JSON lines (a file or stdin), each either a **record** as `--sink stdout` prints it
//! (an object with `topic`, `headers` and `payload`) or a **value** as a consumer saw it. Every
//! sealed object ([`super::Sealed`]) in a record's payload or in a value is replaced by its
//! plaintext; in a record's headers, so is a header whose text is one, or a sealed object inside
//! a header's JSON text (a header is restored as a header is rendered: a string as its text, any
//! other value as JSON). Everything else in the line keeps its bytes. The line is printed back.
//!
//! Invariant: a value opens only at the place it was sealed for (its event's id and its path, see
//! [`super::crypto::Place`]): the event id is the record's `id` header, or `--event-id`; the path
//! is where the value sits in the payload (or value), or `headers/NAME/...`. A value moved to
//! another event or field, or found where no event id is known, stops the run with the line.

use std::borrow::Cow;
use std::io::{BufRead, Write};
use std::path::PathBuf;

use super::crypto::{Keyring, Place, Sealed};
use super::edit;
use crate::error::{Definite, Error};

/// Flags of `outboxd decrypt`.
#[derive(Debug, Clone, clap::Args)]
pub struct DecryptArgs {
    /// The keyring JSON file the fields were sealed with (older keys included).
    #[arg(long, env = "OUTBOXD_ENCRYPT_KEY_FILE", value_name = "FILE")]
    pub encrypt_key_file: PathBuf,
    /// JSON lines to decrypt; stdin when left out or `-`.
    pub input: Option<PathBuf>,
    /// The event id sealed values are bound to, for lines that are bare values (a consumer's dump
    /// of one event); records as the stdout sink prints them carry it in their `id` header.
    #[arg(long, value_name = "ID")]
    pub event_id: Option<String>,
}

/// Decrypt every line of the input to stdout; exit code 0, or an error naming the line.
pub fn run(a: &DecryptArgs) -> Result<u8, Error> {
    let ring = Keyring::load("--encrypt-key-file", &a.encrypt_key_file).map_err(Definite::Config)?;
    let input: Box<dyn BufRead> = match a.input.as_deref() {
        None => Box::new(std::io::stdin().lock()),
        Some(p) if p.as_os_str() == "-" => Box::new(std::io::stdin().lock()),
        Some(p) => Box::new(std::io::BufReader::new(
            std::fs::File::open(p)
                .map_err(|e| Definite::Config(format!("outboxd decrypt: cannot open {}: {e}", p.display())))?,
        )),
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| Definite::Config(format!("outboxd decrypt: reading line {}: {e}", n + 1)))?;
        if line.trim().is_empty() {
            continue;
        }
        let opened = decrypt_line(&line, &ring, a.event_id.as_deref())
            .map_err(|e| Definite::Config(format!("outboxd decrypt: line {}: {e}", n + 1)))?;
        writeln!(out, "{opened}").map_err(|e| Definite::Config(format!("outboxd decrypt: writing: {e}")))?;
    }
    out.flush().map_err(|e| Definite::Config(format!("outboxd decrypt: writing: {e}")))?;
    Ok(0)
}

/// One JSON line with its sealed values opened; `event_id` (`--event-id`) overrides a record's
/// `id` header and is the only source for a value line.
pub fn decrypt_line(line: &str, ring: &Keyring, event_id: Option<&str>) -> Result<String, String> {
    let opened = match edit::shape(line) {
        Ok(edit::Shape::Object(members)) if is_record(&members) => open_record(&members, ring, event_id)?,
        _ => open_value(line, "", ring, event_id)?,
    };
    Ok(opened.unwrap_or_else(|| line.to_owned()))
}

type Members<'a> = [(Cow<'a, str>, &'a serde_json::value::RawValue)];

/// A record as the stdout sink prints it: `topic`, `payload` and an object of `headers`.
fn is_record(members: &Members) -> bool {
    let has = |name: &str| members.iter().any(|(k, _)| k == name);
    has("topic")
        && has("payload")
        && members.iter().any(|(k, v)| k == "headers" && v.get().trim_start().starts_with('{'))
}

fn open_record(members: &Members, ring: &Keyring, event_id: Option<&str>) -> Result<Option<String>, String> {
    let headers = members.iter().find(|(k, _)| k == "headers").map(|(_, v)| v.get()).unwrap_or("{}");
    let Ok(edit::Shape::Object(headers)) = edit::shape(headers) else { return Ok(None) };
    let header_id =
        headers.iter().find(|(k, _)| k == "id").and_then(|(_, v)| serde_json::from_str::<String>(v.get()).ok());
    let id = event_id.or(header_id.as_deref());
    let mut changed = false;
    let mut parts = Vec::with_capacity(members.len());
    for (k, v) in members {
        let new = match k.as_ref() {
            "payload" => open_value(v.get(), "", ring, id)?,
            "headers" => open_headers(&headers, ring, id)?,
            _ => None,
        };
        changed |= new.is_some();
        parts.push(format!("{}:{}", edit::json_string(k), new.as_deref().unwrap_or(v.get())));
    }
    Ok(changed.then(|| format!("{{{}}}", parts.join(","))))
}

/// The headers object with sealed headers, and sealed values inside JSON headers, opened.
fn open_headers(headers: &Members, ring: &Keyring, id: Option<&str>) -> Result<Option<String>, String> {
    let mut changed = false;
    let mut parts = Vec::with_capacity(headers.len());
    for (name, v) in headers {
        let mut at = String::from("headers");
        edit::push_token(&mut at, name);
        let new = match serde_json::from_str::<String>(v.get()) {
            Ok(text) => match serde_json::from_str::<Sealed>(text.trim()) {
                Ok(s) => {
                    let plain = open_json(ring, &s, id, &at)?;
                    // Rendered as a header is: a string as its text, any other value as its JSON.
                    Some(serde_json::from_str::<String>(&plain).unwrap_or(plain))
                }
                Err(_) if text.trim_start().starts_with(['{', '[']) => open_value(&text, &at, ring, id)?,
                Err(_) => None,
            },
            Err(_) => None,
        };
        changed |= new.is_some();
        let shown = new.map(|t| edit::json_string(&t));
        parts.push(format!("{}:{}", edit::json_string(name), shown.as_deref().unwrap_or(v.get())));
    }
    Ok(changed.then(|| format!("{{{}}}", parts.join(","))))
}

/// `text` (a value at path `root`) with every sealed object in it opened; `None`: none found.
fn open_value(text: &str, root: &str, ring: &Keyring, id: Option<&str>) -> Result<Option<String>, String> {
    let mut path = root.to_owned();
    edit::walk(text, &mut path, &mut |raw, at| {
        let raw = raw.trim();
        if !raw.starts_with('{') {
            return Ok(None);
        }
        match serde_json::from_str::<Sealed>(raw) {
            Ok(s) => open_json(ring, &s, id, at).map(Some),
            Err(_) => Ok(None),
        }
    })
}

/// The plaintext of `s`, found at path `at` of event `id`, which must be JSON text.
fn open_json(ring: &Keyring, s: &Sealed, id: Option<&str>, at: &str) -> Result<String, String> {
    let place = id.map(|event_id| Place { event_id, path: at });
    let plain = ring.open(s, place).map_err(|e| format!("a value sealed with key {:?} {e}", s.kid))?;
    let text = String::from_utf8(plain).map_err(|_| format!("a value sealed with key {:?} is not UTF-8", s.kid))?;
    serde_json::from_str::<&serde_json::value::RawValue>(&text)
        .map_err(|_| format!("a value sealed with key {:?} is not JSON text", s.kid))?;
    Ok(text)
}
