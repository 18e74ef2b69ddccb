//! The keys behind `hash` and `--encrypt`, and the sealed-field format.
//!
//! * [`HashKey`]: HMAC-SHA256 keyed with the bytes of `--mask-key-file` (less one trailing
//!   newline). The keyed state is built once and cloned per value, so a pseudonym costs one
//!   HMAC of the value's text.
//! * [`Keyring`]: `--encrypt-key-file`, a JSON document `{"keys": [{"kid": "...", "key": "<base64
//!   of 32 bytes>"}, ...]}`. The **last** key seals new values; every key opens values sealed
//!   with its `kid`, so keys rotate by appending (and old ones are removed once no reader needs
//!   the events they sealed).
//! * A sealed value is the JSON object [`Sealed`]:
//!   `{"outboxd_enc":2,"alg":"XC20P","kid":"2026-06","nonce":"<base64, 24 bytes>","ct":"<base64>"}`.
//!   XChaCha20-Poly1305 with a random 192-bit nonce (random nonces of that size never need a
//!   counter, however many values one key seals); `ct` is the ciphertext followed by the 16-byte
//!   tag. The additional data ([`aad`]) binds the value to its [`Place`]: the `kid`, the event's
//!   id and the value's path in the record. So a value can neither be relabelled to another key
//!   nor moved to another event or field: it then fails to open. The plaintext is the field's
//!   JSON text, so opening it restores strings, numbers and objects alike.
//! * Version 1 values (additional data: the `kid` alone) are still opened, unbound.
//!
//! Errors never contain key bytes: they name the file and what is wrong with it.

use std::path::Path;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Shortest `--mask-key-file` accepted: a shorter HMAC key makes pseudonyms guessable.
pub const MIN_HASH_KEY: usize = 16;
/// The `alg` of [`Sealed`] values.
pub const ALG: &str = "XC20P";
/// The format version new values are sealed with (`outboxd_enc`).
pub const VERSION: u32 = 2;
/// The first format, whose additional data is the `kid` alone: still opened, never written.
pub const VERSION_KID_ONLY: u32 = 1;

/// Where a sealed value belongs: its event's id (`""` for a dead-letter copy of a row that had
/// none) and its path in the record: a JSON Pointer into the record's value (`/card/number`;
/// `/payload/card/number` in an envelope), or `headers/NAME[/...]` for a header.
#[derive(Clone, Copy, Debug)]
pub struct Place<'a> {
    pub event_id: &'a str,
    pub path: &'a str,
}

/// The additional authenticated data of a version 2 value: a label, then the `kid`, the event id
/// and the path, each as a 4-byte big-endian length and its bytes (so no part can bleed into the
/// next).
fn aad(kid: &str, place: Place) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + kid.len() + place.event_id.len() + place.path.len() + 12);
    out.extend_from_slice(b"outboxd_enc/2");
    for part in [kid, place.event_id, place.path] {
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part.as_bytes());
    }
    out
}

/// The keyed HMAC-SHA256 of `hash`.
#[derive(Clone)]
pub struct HashKey {
    mac: Hmac<Sha256>,
}

impl HashKey {
    /// Read `--mask-key-file`: raw bytes, one trailing newline (`\n` or `\r\n`) dropped.
    pub fn load(path: &Path) -> Result<HashKey, String> {
        let shown = path.display();
        let mut bytes = std::fs::read(path).map_err(|e| {
            format!("--mask-key-file {shown}: cannot read it ({e}); give a readable file of random bytes")
        })?;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        HashKey::from_bytes(&bytes).map_err(|e| format!("--mask-key-file {shown}: {e}"))
    }

    pub fn from_bytes(key: &[u8]) -> Result<HashKey, String> {
        if key.len() < MIN_HASH_KEY {
            return Err(format!(
                "holds {} bytes, fewer than {MIN_HASH_KEY}; write a random key, e.g. `openssl rand -hex 32 > FILE`",
                key.len()
            ));
        }
        let mac =
            <Hmac<Sha256> as hmac::KeyInit>::new_from_slice(key).map_err(|e| format!("unusable HMAC key: {e}"))?;
        Ok(HashKey { mac })
    }

    /// Lower-case hex of HMAC-SHA256(key, text).
    pub fn hex(&self, text: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(text.as_bytes());
        let tag = mac.finalize().into_bytes();
        let mut out = String::with_capacity(64);
        for b in tag.iter() {
            out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        out
    }
}

/// A sealed field, as it appears in the payload (and, as JSON text, in a header).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Sealed {
    pub outboxd_enc: u32,
    pub alg: String,
    pub kid: String,
    pub nonce: String,
    pub ct: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyringFile {
    keys: Vec<KeyEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    kid: String,
    key: String,
}

/// The keys of `--encrypt-key-file`, oldest first; the last one seals.
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<(String, XChaCha20Poly1305)>,
}

impl Keyring {
    /// Read and check `--encrypt-key-file`; `flag` names it in errors (`outboxd decrypt` has its own).
    pub fn load(flag: &str, path: &Path) -> Result<Keyring, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{flag} {shown}: cannot read it ({e}); give the keyring JSON file"))?;
        Keyring::parse(&text).map_err(|e| format!("{flag} {shown}: {e}"))
    }

    pub fn parse(text: &str) -> Result<Keyring, String> {
        let hint = r#"expected {"keys": [{"kid": "2026-06", "key": "<base64 of 32 random bytes>"}]}, e.g. key from `openssl rand -base64 32`"#;
        // serde's message may quote a value it choked on, and that may be key material: say where only.
        let file: KeyringFile = serde_json::from_str(text)
            .map_err(|e| format!("is not a keyring (line {}, column {}); {hint}", e.line(), e.column()))?;
        if file.keys.is_empty() {
            return Err(format!("has no keys; {hint}"));
        }
        let mut keys: Vec<(String, XChaCha20Poly1305)> = Vec::new();
        for (i, k) in file.keys.iter().enumerate() {
            if k.kid.is_empty() || k.kid.len() > 64 {
                return Err(format!("key {i} has a kid of {} bytes; give each key a kid of 1-64 bytes", k.kid.len()));
            }
            if keys.iter().any(|(kid, _)| *kid == k.kid) {
                return Err(format!("kid {:?} appears twice; each key needs its own kid", k.kid));
            }
            let bytes = B64.decode(k.key.trim()).map_err(|_| format!("key {:?} is not base64; {hint}", k.kid))?;
            if bytes.len() != 32 {
                return Err(format!("key {:?} is {} bytes, not 32; {hint}", k.kid, bytes.len()));
            }
            let cipher =
                XChaCha20Poly1305::new_from_slice(&bytes).map_err(|_| format!("key {:?} is unusable", k.kid))?;
            keys.push((k.kid.clone(), cipher));
        }
        Ok(Keyring { keys })
    }

    /// The kid new values are sealed with.
    pub fn current(&self) -> &str {
        self.keys.last().map_or("", |(kid, _)| kid)
    }

    /// `plaintext` sealed with the newest key and bound to event `event_id` and `path` (see
    /// [`Place`]), as the JSON text of a [`Sealed`] object.
    pub fn seal(&self, plaintext: &[u8], event_id: &str, path: &str) -> Result<String, String> {
        let (kid, cipher) = self.keys.last().ok_or("the keyring is empty")?;
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let aad = aad(kid, Place { event_id, path });
        let ct = cipher
            .encrypt(&nonce, Payload { msg: plaintext, aad: &aad })
            .map_err(|_| "encryption failed".to_owned())?;
        let sealed = Sealed {
            outboxd_enc: VERSION,
            alg: ALG.into(),
            kid: kid.clone(),
            nonce: B64.encode(nonce),
            ct: B64.encode(ct),
        };
        serde_json::to_string(&sealed).map_err(|e| e.to_string())
    }

    /// The plaintext of a sealed value, with the key its `kid` names. A version 2 value opens
    /// only at its own `place` (`None`: the place is unknown, and it does not open); a version 1
    /// value opens anywhere.
    pub fn open(&self, s: &Sealed, place: Option<Place>) -> Result<Vec<u8>, String> {
        if !(s.outboxd_enc == VERSION || s.outboxd_enc == VERSION_KID_ONLY) || s.alg != ALG {
            return Err(format!(
                "has format {} {:?}; this outboxd reads {VERSION_KID_ONLY} and {VERSION} {ALG:?}",
                s.outboxd_enc, s.alg
            ));
        }
        let aad = match (s.outboxd_enc, place) {
            (VERSION_KID_ONLY, _) => s.kid.as_bytes().to_vec(),
            (_, Some(place)) => aad(&s.kid, place),
            (_, None) => {
                return Err("is bound to its event's id, which this input does not give: decrypt the records \
                     as the stdout sink prints them (their `id` header), or give --event-id"
                    .into())
            }
        };
        let Some((_, cipher)) = self.keys.iter().find(|(kid, _)| *kid == s.kid) else {
            return Err("cannot open: that key id is not in the keyring; add that key to the keyring file".into());
        };
        let nonce =
            B64.decode(&s.nonce).ok().filter(|n| n.len() == 24).ok_or("has a nonce that is not 24 bytes of base64")?;
        let ct = B64.decode(&s.ct).map_err(|_| "has a ct that is not base64".to_owned())?;
        cipher.decrypt(XNonce::from_slice(&nonce), Payload { msg: &ct, aad: &aad }).map_err(|_| {
            match place.filter(|_| s.outboxd_enc == VERSION) {
                Some(p) => format!(
                    "at {} of event {:?} does not open with that key (moved there from another event or field, \
                     a different key under that id, or altered)",
                    p.path, p.event_id
                ),
                None => "does not open with that key (a different key under that id, or altered)".to_owned(),
            }
        })
    }
}
