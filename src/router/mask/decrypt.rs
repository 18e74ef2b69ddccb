//! `outboxd decrypt`: restore sealed fields for a reader who holds the keyring.
//!
//! Input is JSON lines (a file or stdin), such as `--sink stdout` prints records or a consumer
//! dumps payloads. Every sealed object ([`super::Sealed`]) anywhere in a line is replaced by its
//! plaintext, and so is every string whose text is one (a sealed header, as the stdout sink shows
//! headers: as strings); a header is restored as a header is rendered, a string as its text and
//! any other value as JSON. Everything else in the line keeps its bytes. The line is printed back.

use std::io::{BufRead, Write};

use super::crypto::{Keyring, Sealed};
use super::edit;
use crate::config::DecryptArgs;
use crate::error::{Definite, Error};

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
        let opened = decrypt_line(&line, &ring)
            .map_err(|e| Definite::Config(format!("outboxd decrypt: line {}: {e}", n + 1)))?;
        writeln!(out, "{opened}").map_err(|e| Definite::Config(format!("outboxd decrypt: writing: {e}")))?;
    }
    out.flush().map_err(|e| Definite::Config(format!("outboxd decrypt: writing: {e}")))?;
    Ok(0)
}

/// One JSON document with its sealed values opened.
pub fn decrypt_line(line: &str, ring: &Keyring) -> Result<String, String> {
    let opened = edit::walk(line, &mut |raw| {
        let raw = raw.trim();
        if raw.starts_with('{') {
            return match serde_json::from_str::<Sealed>(raw) {
                Ok(s) => open_json(ring, &s).map(Some),
                Err(_) => Ok(None),
            };
        }
        if raw.starts_with('"') {
            let Ok(text) = serde_json::from_str::<String>(raw) else { return Ok(None) };
            let Ok(s) = serde_json::from_str::<Sealed>(text.trim()) else { return Ok(None) };
            let plain = open_json(ring, &s)?;
            // Rendered as a header is: a string as its text, any other value as its JSON.
            let text = serde_json::from_str::<String>(&plain).unwrap_or(plain);
            return Ok(Some(edit::json_string(&text)));
        }
        Ok(None)
    })?;
    Ok(opened.unwrap_or_else(|| line.to_owned()))
}

/// The plaintext of `s`, which must be JSON text.
fn open_json(ring: &Keyring, s: &Sealed) -> Result<String, String> {
    let plain = ring.open(s).map_err(|e| format!("a value sealed with key {:?}: {e}", s.kid))?;
    let text = String::from_utf8(plain).map_err(|_| format!("a value sealed with key {:?} is not UTF-8", s.kid))?;
    serde_json::from_str::<&serde_json::value::RawValue>(&text)
        .map_err(|_| format!("a value sealed with key {:?} is not JSON text", s.kid))?;
    Ok(text)
}
