//! A dead-letter copy is always writable: what its sink cannot carry as it is travels escaped, in
//! headers every sink takes, and `outboxd dlq` reads it back byte for byte.
//!
//! A copy keeps the event's id, key and headers, and those may be the very thing the sink refused
//! (a NATS header value holding a line break, a RabbitMQ header name over 255 bytes, an event id
//! with control characters for HTTP). A refused copy stops the relay, and since every restart meets
//! that row first, the slot would hold WAL for good. So each sink states what it cannot carry
//! ([`Limits`], from [`super::Sink::copy_limits`]), the relay's
//! [`crate::sink::dead_letter::DeadLetter::into_copy`] applies the rules below to the copy before
//! sizing and chunking it, and the sink's writer names each copy record with [`copy_id`]:
//!
//! * a header the sink cannot carry as it is, name or value, becomes
//!   `outboxd.escaped-header.<n>: <name>=<value>` (`n` counts from 0 within the copy), both
//!   percent-encoded: letters and digits stay, every other byte is `%XX`. That is visible ASCII
//!   without spaces, which every sink carries unchanged;
//! * a key it cannot carry moves to `outboxd.escaped-key: <percent-encoded key>`, and the copy
//!   has no key;
//! * the sink's own message id (`Nats-Msg-Id`, AMQP `message-id`, HTTP `ce-id` and
//!   `Idempotency-Key`) is [`copy_id`]: `<event id>/dlq/<part>`, where the relay names the part
//!   ([`super::delivery::Delivery::copy_part`]: `<chunk id>/<chunk index>` for a chunk, and for a
//!   whole copy 32 hex digits hashed, like a chunk id, from the table, position, event id and
//!   payload), so no two chunks of a copy, and no two copies, share it (a deduplicating broker or
//!   receiver would drop one) while a copy written again after a crash gets the same ids. When the sink cannot take that text (a line break, over 255 bytes), the
//!   event id part is `sha256.<32 hex digits>` of it instead; the event id itself is always in the
//!   `id` header, escaped like any header when needed.
//!
//! Escaping can triple a header; what then no longer fits the sink moves into the copy's body
//! ([`super::moved`]), so a row's own header named `outboxd.moved` is escaped like a lookalike.
//!
//! Escaping never loses a byte, so deciding conservatively costs only readability: a sink's
//! limits also count as "cannot carry" what it would change on the way (NATS and HTTP trim the
//! whitespace around a header value). [`unescape_header`] and [`unescape_key`] are the inverse,
//! used by the `outboxd dlq` readers before anything else looks at a record.

use bytes::Bytes;
use percent_encoding::{percent_decode, percent_encode, NON_ALPHANUMERIC};
use sha2::{Digest, Sha256};

/// Escaped headers are named `outboxd.escaped-header.<n>`.
pub const H_ESCAPED_HEADER: &str = "outboxd.escaped-header";
/// An escaped key.
pub const H_ESCAPED_KEY: &str = "outboxd.escaped-key";

/// What a sink carries in a dead-letter copy as it is, byte for byte. Each returns `true` when
/// the sink takes the part unchanged.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A record header, name and value.
    pub header: fn(&str, &[u8]) -> bool,
    /// The record key.
    pub key: fn(&[u8]) -> bool,
    /// The text of the sink's own message id ([`copy_id`]).
    pub id: fn(&str) -> bool,
    /// The most bytes of key and headers a copy record carries; past it, headers move into the
    /// body ([`super::moved`]). `usize::MAX` when only the whole record's size is limited.
    pub header_bytes: usize,
}

fn any_header(_: &str, _: &[u8]) -> bool {
    true
}

fn any_bytes(_: &[u8]) -> bool {
    true
}

fn any_id(_: &str) -> bool {
    true
}

impl Limits {
    /// A sink that carries any bytes (Kafka, Redis).
    pub const ANY: Limits = Limits { header: any_header, key: any_bytes, id: any_id, header_bytes: usize::MAX };
}

/// Text a line-based header carries unchanged: UTF-8 without control characters and without
/// whitespace at either end (NATS and HTTP trim it).
pub fn plain_text(v: &[u8]) -> bool {
    match std::str::from_utf8(v) {
        Ok(s) => !s.chars().any(char::is_control) && s.trim() == s,
        Err(_) => false,
    }
}

fn encode(b: &[u8]) -> String {
    percent_encode(b, NON_ALPHANUMERIC).to_string()
}

/// Apply the rules of the module doc to a copy's headers and key under `limits`; returns the key
/// the copy keeps (`None` when it moved to [`H_ESCAPED_KEY`]).
pub fn make_writable(headers: &mut Vec<crate::router::Header>, key: Option<Bytes>, limits: &Limits) -> Option<Bytes> {
    let mut n = 0;
    for (name, value) in headers.iter_mut() {
        // A row's own header that looks escaped (or moved, see super::moved) is escaped too, so
        // reading back is unambiguous.
        if (limits.header)(name, value) && !is_escaped(name) && name != super::moved::H_MOVED {
            continue;
        }
        *value = Bytes::from(format!("{}={}", encode(name.as_bytes()), encode(value)));
        *name = format!("{H_ESCAPED_HEADER}.{n}").into();
        n += 1;
    }
    match key {
        Some(k) if !(limits.key)(&k) => {
            headers.push((H_ESCAPED_KEY.into(), Bytes::from(encode(&k))));
            None
        }
        key => key,
    }
}

/// Whether `name` is a header [`make_writable`] made.
pub fn is_escaped(name: &str) -> bool {
    name == H_ESCAPED_KEY
        || name.strip_prefix(H_ESCAPED_HEADER).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// The original header behind an `outboxd.escaped-header.<n>` value; `None` when it does not
/// decode (not `name=value`, or a name that is not UTF-8).
pub fn unescape_header(value: &[u8]) -> Option<(String, Vec<u8>)> {
    let eq = value.iter().position(|b| *b == b'=')?;
    let name = percent_decode(&value[..eq]).decode_utf8().ok()?.into_owned();
    Some((name, percent_decode(&value[eq + 1..]).collect()))
}

/// The original key behind an `outboxd.escaped-key` value.
pub fn unescape_key(value: &[u8]) -> Vec<u8> {
    percent_decode(value).collect()
}

/// The id a sink gives a dead-letter record (see the module doc): `<event id>/dlq/<part>`, with
/// the event id hashed when the sink cannot take the whole as it is (`limits.id`).
pub fn copy_id(event_id: &str, part: &str, limits: &Limits) -> String {
    let whole = format!("{event_id}/dlq/{part}");
    if (limits.id)(&whole) {
        return whole;
    }
    format!("sha256.{}/dlq/{part}", crate::hex::lower(&Sha256::digest(event_id.as_bytes())[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> Limits {
        Limits {
            header: |n, v| n.len() <= 8 && plain_text(v),
            key: plain_text,
            id: |s| s.len() <= 80 && plain_text(s.as_bytes()),
            header_bytes: usize::MAX,
        }
    }

    #[test]
    fn plain_text_is_what_line_based_headers_carry_unchanged() {
        for ok in [&b""[..], b"a b", b"caf\xc3\xa9", b"t-1"] {
            assert!(plain_text(ok), "{ok:?}");
        }
        for bad in [&b"a\nb"[..], b"a\rb", b"a\0", b" a", b"a\t", b"\xff", b"a\x7f"] {
            assert!(!plain_text(bad), "{bad:?}");
        }
    }

    #[test]
    fn escaped_headers_and_keys_read_back_byte_for_byte() {
        let long = "n".repeat(300);
        let mut headers: Vec<crate::router::Header> = vec![
            ("id".into(), Bytes::from_static(b"e-1")),
            ("note".into(), Bytes::from_static(b"line1\nline2")),
            (long.clone().into(), Bytes::from_static(b"v")),
            ("bin".into(), Bytes::from_static(b"\x00\xff=%&")),
        ];
        let original = headers.clone();
        assert_eq!(
            make_writable(&mut headers, Some(Bytes::from_static(b"k-1")), &strict()).as_deref(),
            Some(&b"k-1"[..])
        );
        let names: Vec<&str> = headers.iter().map(|(n, _)| &**n).collect();
        assert_eq!(names, ["id", "outboxd.escaped-header.0", "outboxd.escaped-header.1", "outboxd.escaped-header.2"]);
        assert_eq!(&headers[1].1[..], b"note=line1%0Aline2");
        for ((name, value), (was_name, was_value)) in headers.iter().zip(&original) {
            assert!(plain_text(value), "an escaped value is plain text: {value:?}");
            if is_escaped(name) {
                assert_eq!(unescape_header(value), Some((was_name.to_string(), was_value.to_vec())));
            } else {
                assert_eq!((name, value), (was_name, was_value));
            }
        }
        let mut headers = Vec::new();
        assert_eq!(make_writable(&mut headers, Some(Bytes::from_static(b"k\r\n1")), &strict()), None);
        let (h, v) = &headers[0];
        assert!(is_escaped(h) && plain_text(v));
        assert_eq!(unescape_key(v), b"k\r\n1");
        assert!(!is_escaped("outboxd.escaped-headers") && !is_escaped("outboxd.error"));
        let mut lookalike = vec![("outboxd.escaped-header.0".into(), Bytes::from_static(b"x"))];
        make_writable(&mut lookalike, None, &Limits::ANY);
        assert_eq!(unescape_header(&lookalike[0].1), Some(("outboxd.escaped-header.0".to_owned(), b"x".to_vec())));
        assert_eq!(unescape_header(b"no-equals-sign"), None);
        assert_eq!(unescape_header(b"%FF=x"), None, "a name must be UTF-8");
    }

    #[test]
    fn copy_ids_fit_the_sink() {
        assert_eq!(copy_id("e-1", "c0ffee/0", &Limits::ANY), "e-1/dlq/c0ffee/0");
        // An id the sink cannot take is replaced by its digest, the part kept.
        let bad = copy_id("e\n1", "c0ffee/3", &strict());
        assert!(bad.starts_with("sha256.") && bad.ends_with("/dlq/c0ffee/3") && plain_text(bad.as_bytes()), "{bad}");
        assert_eq!(bad, copy_id("e\n1", "c0ffee/3", &strict()), "the same copy, the same id");
        let long = copy_id(&"x".repeat(300), "0123456789abcdef", &strict());
        assert!((strict().id)(&long), "{long}");
    }
}
