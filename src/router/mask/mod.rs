//! Personal data out of the stream: `--mask POINTER=ACTION`, `--encrypt POINTER` and
//! `--mask-event-type REGEX`, applied to a routed [`Record`] before any sink sees it.
//!
//! Pure, like the router: (record, event type) in, record or [`BadEvent`] out. Compiled once at
//! start ([`Masking::compile`]: pointers parsed into a trie, key files read).
//!
//! Invariants:
//! * an event no rule applies to (no rules, or its type does not match `--mask-event-type`) is
//!   returned as it came: same `Bytes`, nothing parsed; an event the rules apply to but change
//!   nothing in also keeps its bytes;
//! * payload rules need a JSON object or array (or `null`, which holds nothing): any other
//!   payload, such as text that is not JSON, is a bad event `unmaskable` rather than sent
//!   unmasked; so is a header a nested `headers/NAME/...` rule must look into that is not JSON;
//! * nothing unmasked leaves through the dead-letter path: [`Masking::scrub`] masks the payload a
//!   router-refused row carries, and drops it (saying why in `outboxd.payload.dropped`) when it
//!   cannot be masked; a record refused later (too large, rejected by the broker) was masked
//!   before it was sent;
//! * with an envelope placement the value is `{"payload": ..., ...}`; payload pointers address
//!   the inside of its `payload` member, as they would the bare payload.
//!
//! An event whose type is unknown (NULL, or a row the router refused early) gets the rules even
//! under `--mask-event-type`: masking too much is recoverable, leaking is not.

mod crypto;
pub mod decrypt;
mod edit;
mod rules;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use regex::Regex;

pub use crypto::{HashKey, Keyring, Sealed};
pub use rules::Action;
use rules::{parse_pointer, Node, Target, Token};

use super::{BadEvent, Record};

/// Reason code of an event the rules cannot be applied to.
pub const UNMASKABLE: &str = "unmaskable";

/// The masking flags as given: what `outboxd config` prints and what equality compares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaskSpec {
    /// `POINTER=ACTION`, in flag order.
    pub masks: Vec<String>,
    /// POINTERs to seal.
    pub encrypt: Vec<String>,
    pub mask_key_file: Option<PathBuf>,
    pub encrypt_key_file: Option<PathBuf>,
    pub event_type: Option<String>,
}

/// The compiled rules. `Debug` and equality see only the [`MaskSpec`]: keys never print.
#[derive(Clone, Default)]
pub struct Masking {
    spec: MaskSpec,
    envelope: bool,
    payload: Node,
    /// `payload` under a `payload` member, for envelope values.
    in_envelope: Node,
    headers: Node,
    event_type: Option<Regex>,
    hash_key: Option<Arc<HashKey>>,
    keyring: Option<Arc<Keyring>>,
}

impl PartialEq for Masking {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec && self.envelope == other.envelope
    }
}

impl std::fmt::Debug for Masking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Masking").field("spec", &self.spec).field("envelope", &self.envelope).finish()
    }
}

impl Masking {
    /// Parse the rules and read the key files. `envelope`: the value is an envelope object (an
    /// envelope placement is configured). Errors are one line naming the flag and the fix.
    pub fn compile(spec: MaskSpec, envelope: bool) -> Result<Masking, String> {
        let mut m = Masking { envelope, ..Masking::default() };
        let mut add = |flag: &str, text: &str, pointer: &str, action: Action| -> Result<(), String> {
            let (target, tokens) = parse_pointer(pointer).map_err(|e| format!("{flag} {text:?}: POINTER {e}"))?;
            match target {
                Target::Payload => m.payload.insert(&tokens, action),
                Target::Headers => m.headers.insert(&tokens, action),
            }
            Ok(())
        };
        for text in &spec.masks {
            let Some((pointer, action)) = text.rsplit_once('=') else {
                return Err(format!("--mask {text:?}: expected POINTER=ACTION, e.g. /card/number=last4"));
            };
            let action = Action::parse(action)
                .ok_or_else(|| format!("--mask {text:?}: ACTION {action:?} is not one of drop, redact, last4, hash"))?;
            add("--mask", text, pointer, action)?;
        }
        for text in &spec.encrypt {
            add("--encrypt", text, text, Action::Encrypt)?;
        }
        let uses = |a| m.payload.uses(a) || m.headers.uses(a);
        if uses(Action::Hash) {
            let path = spec
                .mask_key_file
                .as_deref()
                .ok_or("--mask ...=hash needs --mask-key-file FILE (the HMAC key, e.g. from `openssl rand -hex 32`)")?;
            m.hash_key = Some(Arc::new(HashKey::load(path)?));
        }
        if uses(Action::Encrypt) {
            let path = spec.encrypt_key_file.as_deref().ok_or(
                "--encrypt needs --encrypt-key-file FILE (a keyring: {\"keys\": [{\"kid\": \"k1\", \"key\": \"<base64 of 32 bytes>\"}]})",
            )?;
            m.keyring = Some(Arc::new(Keyring::load("--encrypt-key-file", path)?));
        }
        if let Some(re) = &spec.event_type {
            if m.payload.is_empty() && m.headers.is_empty() {
                return Err(format!(
                    "--mask-event-type {re:?} scopes no rules; add --mask or --encrypt, or leave it out"
                ));
            }
            let anchored = format!("^(?:{re})$");
            m.event_type = Some(Regex::new(&anchored).map_err(|e| {
                // regex's message spans lines (a caret under the spot); its last line says what is wrong.
                let e = e.to_string();
                let why = e.lines().last().unwrap_or_default().trim_start_matches("error: ").to_owned();
                format!("--mask-event-type {re:?} does not compile: {why}")
            })?);
        }
        m.in_envelope = Node { children: vec![(Token::Key("payload".into()), m.payload.clone())], actions: vec![] };
        m.spec = spec;
        Ok(m)
    }

    pub fn spec(&self) -> &MaskSpec {
        &self.spec
    }

    /// No rule at all: every record passes untouched.
    pub fn is_empty(&self) -> bool {
        self.payload.is_empty() && self.headers.is_empty()
    }

    /// The pipeline must look up event types (`--mask-event-type` is set).
    pub fn needs_event_type(&self) -> bool {
        self.event_type.is_some()
    }

    /// Whether the rules apply to an event of this type (`None`: unknown, so they do).
    pub fn applies(&self, event_type: Option<&str>) -> bool {
        !self.is_empty()
            && match (&self.event_type, event_type) {
                (Some(re), Some(t)) => re.is_match(t),
                _ => true,
            }
    }

    /// Mask a routed record. A record the rules cannot be applied to becomes a bad event that is
    /// already scrubbed (do not [`Masking::scrub`] it again).
    #[allow(clippy::result_large_err)]
    pub fn apply(&self, mut record: Record, event_type: Option<&str>) -> Result<Record, BadEvent> {
        if !self.applies(event_type) {
            return Ok(record);
        }
        let id: &str = &record.event_id;
        let masked = self.mask_payload(record.payload.as_ref(), self.envelope, id).and_then(|p| {
            let h = self.mask_headers(&record.headers, id)?;
            Ok((p, h))
        });
        match masked {
            Ok((p, h)) => {
                if let Some(p) = p {
                    record.payload = Some(p);
                }
                if let Some(h) = h {
                    record.headers = h;
                }
                Ok(record)
            }
            Err(why) => {
                let bad = BadEvent {
                    event_id: Some(record.event_id.into()),
                    code: UNMASKABLE,
                    message: why,
                    topic: Some(record.topic.into()),
                    key: record.key,
                    payload: record.payload,
                    // Headers the rules could not be applied to are not kept.
                    headers: Vec::new(),
                    payload_dropped: None,
                };
                Err(self.scrub_with(bad, self.envelope))
            }
        }
    }

    /// Make a router-refused row safe for the dead-letter topic: its payload masked, or left out
    /// (with `payload_dropped` saying why) when it cannot be. Call once per bad event.
    pub fn scrub(&self, bad: BadEvent, event_type: Option<&str>) -> BadEvent {
        if !self.applies(event_type) {
            return bad;
        }
        // A refused row carries the payload column's value, never an envelope, except a contract
        // violation: that is the routed record, envelope and headers included.
        let envelope = self.envelope && bad.code == super::contract::CODE;
        self.scrub_with(bad, envelope)
    }

    fn scrub_with(&self, mut bad: BadEvent, envelope: bool) -> BadEvent {
        let id = bad.event_id.clone().unwrap_or_default();
        match self.mask_payload(bad.payload.as_ref(), envelope, &id) {
            Ok(Some(p)) => bad.payload = Some(p),
            Ok(None) => {}
            Err(why) => {
                bad.payload = None;
                bad.payload_dropped = Some(why);
            }
        }
        if !bad.headers.is_empty() {
            match self.mask_headers(&bad.headers, &id) {
                Ok(Some(h)) => bad.headers = h,
                Ok(None) => {}
                // Keep only outboxd's own diagnostics: the rest could carry what the rules hide.
                Err(_) => bad.headers.retain(|(k, _)| k.starts_with(crate::router::HEADER_PREFIX)),
            }
        }
        bad
    }

    /// The masked payload of event `id`; `None` when unchanged.
    fn mask_payload(&self, payload: Option<&Bytes>, envelope: bool, id: &str) -> Result<Option<Bytes>, String> {
        let Some(p) = payload.filter(|_| !self.payload.is_empty()) else { return Ok(None) };
        let text = std::str::from_utf8(p).map_err(|_| not_maskable("payload", "is not UTF-8 JSON"))?;
        let inner = if envelope { envelope_payload(text)? } else { text };
        check_container(inner).map_err(|e| not_maskable("payload", &e))?;
        let root = if envelope { &self.in_envelope } else { &self.payload };
        let edited = edit::edit_children(text, root, &mut String::new(), &|a, v, at| self.act(a, v, id, at));
        Ok(edited.map_err(|e| not_maskable("payload", &e))?.map(Bytes::from))
    }

    /// The masked headers of event `id`; `None` when unchanged.
    fn mask_headers(
        &self,
        headers: &[crate::router::Header],
        id: &str,
    ) -> Result<Option<Vec<crate::router::Header>>, String> {
        if self.headers.is_empty() {
            return Ok(None);
        }
        let mut changed = false;
        let mut out = Vec::with_capacity(headers.len());
        'header: for (name, value) in headers {
            let mut cur: Option<String> = None;
            for (tok, node) in &self.headers.children {
                if !tok.matches_key(name) {
                    continue;
                }
                let what = format!("header {name:?}");
                let mut at = String::from("headers");
                edit::push_token(&mut at, name);
                let mut text = cur.take().unwrap_or_else(|| String::from_utf8_lossy(value).into_owned());
                if !node.children.is_empty() {
                    check_container(&text).map_err(|e| not_maskable(&what, &e))?;
                    if let Some(t) = edit::edit_children(&text, node, &mut at, &|a, v, at| self.act(a, v, id, at))
                        .map_err(|e| not_maskable(&what, &e))?
                    {
                        text = t;
                    }
                }
                // A header is the text of a JSON string, or the JSON text of any other value (as
                // the headers column is expanded): act on it as that value, render it back alike.
                for &a in &node.actions {
                    match self.act(a, &edit::json_string(&text), id, &at).map_err(|e| not_maskable(&what, &e))? {
                        None => {
                            changed = true;
                            continue 'header;
                        }
                        Some(v) if v.starts_with('"') => text = serde_json::from_str(&v).unwrap_or(v),
                        Some(v) => text = v,
                    }
                }
                cur = Some(text);
            }
            match cur {
                Some(t) if t.as_bytes() != &value[..] => {
                    changed = true;
                    out.push((name.clone(), Bytes::from(t)));
                }
                _ => out.push((name.clone(), value.clone())),
            }
        }
        Ok(changed.then_some(out))
    }

    /// One action on the JSON text of a value of event `id` at path `at`: its new JSON text, or
    /// `None` to drop it.
    fn act(&self, action: Action, raw: &str, id: &str, at: &str) -> Result<Option<String>, String> {
        Ok(Some(match action {
            Action::Drop => return Ok(None),
            Action::Redact => "\"***\"".to_owned(),
            Action::Last4 => edit::json_string(&edit::last4(&edit::value_text(raw)?)),
            Action::Hash => {
                let key = self.hash_key.as_ref().ok_or("no --mask-key-file loaded")?;
                edit::json_string(&key.hex(&edit::value_text(raw)?))
            }
            Action::Encrypt => {
                let ring = self.keyring.as_ref().ok_or("no --encrypt-key-file loaded")?;
                ring.seal(raw.trim().as_bytes(), id, at)?
            }
        }))
    }
}

fn not_maskable(what: &str, why: &str) -> String {
    format!("{what} {why}, so the --mask/--encrypt rules cannot apply to it")
}

/// Rules address members and elements: a value without any cannot be checked for them. Only
/// the first byte is looked at when it opens a container: the edit that follows parses it all
/// (and fails on bad JSON), so a payload is parsed once.
fn check_container(text: &str) -> Result<(), String> {
    let t = text.trim();
    if t.starts_with(['{', '[']) || t == "null" {
        return Ok(());
    }
    match edit::shape(t) {
        Ok(_) => Err("is a JSON scalar, not an object or array".into()),
        Err(e) => Err(format!("is not JSON ({e})")),
    }
}

/// The text of an envelope's `payload` member.
fn envelope_payload(text: &str) -> Result<&str, String> {
    match edit::shape(text) {
        Ok(edit::Shape::Object(members)) => {
            Ok(members.into_iter().find(|(k, _)| k == "payload").map_or("null", |(_, v)| v.get()))
        }
        _ => Err(not_maskable("payload", "envelope is not a JSON object")),
    }
}

#[cfg(test)]
mod tests;
