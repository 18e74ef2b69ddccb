//! What the webhook sink puts on the wire, kept apart from I/O: one event as a CloudEvents
//! binary-mode request (headers + payload body), a batch as a CloudEvents JSON batch, and the
//! `Outboxd-Signature` header. Pure functions, unit-tested below.
//!
//! # Header mapping (binary mode, one event per request)
//! * body: the payload bytes, unchanged; `Content-Type: application/json` when they are JSON,
//!   `application/octet-stream` otherwise; a tombstone (null payload) has an empty body and no
//!   `Content-Type`;
//! * `ce-specversion: 1.0`, `ce-id` (event id), `ce-source` (`--http-source`), `ce-type` (the event
//!   type column, when not NULL), `ce-time` (the record timestamp as RFC 3339), `ce-subject` (the
//!   key, when not NULL);
//! * `Idempotency-Key` (= `ce-id`), `key` (the key), and every record header under its own name:
//!   the router's `id` first, then the expanded headers column and header placements. HTTP header
//!   names are case-insensitive and travel lower-cased.
//!
//! A dead-letter copy's `ce-id` and `Idempotency-Key` are its copy id
//! ([`crate::sink::escape::copy_id`]: `<event id>/dlq/<chunk id>/<index>` for a chunk):
//! dead-letter chunks share their event's id, and a receiver deduplicating by it would drop all
//! but the first.
//!
//! A record header whose name is not an HTTP token, or one outboxd sets itself or that frames the
//! request ([`RESERVED`]), or whose value holds control characters (CR, LF, NUL, ...), cannot be
//! sent faithfully: the record is a bad event (`invalid_header`), never silently renamed. Its
//! dead-letter copy carries such parts escaped ([`COPY_LIMITS`]).
//!
//! # Batch mode (`--http-batch N`, N > 1)
//! The body is a JSON array, `Content-Type: application/cloudevents-batch+json`; each element holds
//! `specversion`, `id`, `source`, `type`, `time`, `subject` and `partitionkey` (the key), then
//! `datacontenttype: application/json` with the payload verbatim as `data`, or the payload as
//! `data_base64` when it is not JSON, and no data at all for a tombstone. Record headers go in the
//! extension attribute `outboxdheaders`, a string holding a JSON object of name → value (`traceparent`
//! and `tracestate` also as the distributed-tracing extension's attributes; a
//! CloudEvents attribute must be a string, so the object is serialized once more). Batch mode
//! therefore needs UTF-8 keys and header values; others are bad events (`invalid_header`).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use sha2::Sha256;

use crate::router::Record;
use crate::sink::escape::{copy_id, plain_text, Limits};

pub const BATCH_CONTENT_TYPE: &str = "application/cloudevents-batch+json";
pub const SIGNATURE_HEADER: &str = "outboxd-signature";
/// With the v2 signature: the names of the headers it covers, in the order it covers them.
pub const SIGNED_HEADERS_HEADER: &str = "outboxd-signed-headers";

/// Header names a record may not carry: outboxd's own, and those that frame or route the request.
pub const RESERVED: &[&str] = &[
    "key",
    "idempotency-key",
    SIGNATURE_HEADER,
    SIGNED_HEADERS_HEADER,
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "host",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "authorization",
    "proxy-authorization",
    "proxy-connection",
];

/// One event's parts, validated by [`check`] for the mode it will be sent in.
#[derive(Debug)]
pub struct Event {
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    pub headers: Vec<crate::router::Header>,
    pub event_type: Option<Bytes>,
    pub timestamp_ms: Option<i64>,
    /// `ce-id` and `Idempotency-Key`.
    pub ce_id: String,
}

impl Event {
    /// The event id as `ce-id`, or a dead-letter copy's own ([`copy_id`]) for `copy_part`.
    pub fn ce_id(record: &Record, copy_part: Option<&str>) -> String {
        match copy_part {
            Some(part) => copy_id(&record.event_id, part, &COPY_LIMITS),
            None => record.event_id.to_string(),
        }
    }

    pub fn from_record(record: Record, ce_id: String) -> Event {
        Event {
            key: record.key,
            payload: record.payload,
            headers: record.headers,
            event_type: record.event_type,
            timestamp_ms: record.timestamp_ms,
            ce_id,
        }
    }
}

/// Why `record` cannot be sent faithfully with `ce_id` ([`Event::ce_id`]), if it cannot. `batch`:
/// it goes in a JSON batch body, which also needs UTF-8 (it may be sent alone too, after a batch
/// was refused).
pub fn check(record: &Record, ce_id: &str, batch: bool) -> Result<(), String> {
    for (name, value) in &record.headers {
        let lower = name.to_ascii_lowercase();
        if HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!(
                "header name {name:?} is not a valid HTTP header name (letters, digits, !#$%&'*+-.^_`|~)"
            ));
        }
        if RESERVED.contains(&lower.as_str()) || lower.starts_with("ce-") {
            return Err(format!("header name {name:?} is one outboxd sets itself or that frames the HTTP request"));
        }
        if HeaderValue::from_bytes(value).is_err() {
            return Err(format!("header {name}: the value holds control characters, which HTTP headers cannot carry"));
        }
        if batch && std::str::from_utf8(value).is_err() {
            return Err(format!("header {name}: the value is not UTF-8, which a JSON batch needs"));
        }
    }
    for (what, v) in [("key", &record.key), ("event type", &record.event_type)] {
        let Some(v) = v else { continue };
        if HeaderValue::from_bytes(v).is_err() {
            return Err(format!("the {what} holds control characters, which HTTP headers cannot carry"));
        }
        if batch && std::str::from_utf8(v).is_err() {
            return Err(format!("the {what} is not UTF-8, which a JSON batch needs"));
        }
    }
    // The id goes into headers verbatim too.
    if HeaderValue::from_str(ce_id).is_err() {
        return Err("the event id holds control characters, which HTTP headers cannot carry".into());
    }
    Ok(())
}

/// What a dead-letter copy carries as it is ([`crate::sink::escape`]): header names [`check`]
/// takes, values, key and `ce-id` as [`plain_text`] (UTF-8 for batch mode; no control characters;
/// no surrounding whitespace, which HTTP strips).
pub const COPY_LIMITS: Limits = Limits {
    header: |name, value| {
        let lower = name.to_ascii_lowercase();
        HeaderName::from_bytes(name.as_bytes()).is_ok()
            && !RESERVED.contains(&lower.as_str())
            && !lower.starts_with("ce-")
            && plain_text(value)
    },
    key: plain_text,
    id: |id| plain_text(id.as_bytes()),
    header_bytes: COPY_HEADER_BYTES,
};

/// The most bytes of headers a dead-letter copy sends: receivers limit the header section (Node's
/// default is 16 KiB in all, nginx's 8 KiB a line), and the copy adds `ce-*` headers of its own.
/// Past it, headers move into the body ([`crate::sink::moved`]).
pub const COPY_HEADER_BYTES: usize = 8 * 1024;

/// RFC 3339 in UTC, e.g. `2026-12-03T12:58:42.123Z`.
pub fn rfc3339(ms: i64) -> Option<String> {
    jiff::Timestamp::from_millisecond(ms).ok().map(|t| t.to_string())
}

fn is_json(payload: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_ok()
}

/// Headers and body of `event` alone (binary mode). Errors only for an event [`check`] refused.
pub fn single(event: &Event, source: &str) -> Result<(HeaderMap, Bytes), String> {
    let mut h = HeaderMap::with_capacity(10 + event.headers.len());
    let val = |v: &[u8]| HeaderValue::from_bytes(v).map_err(|_| "a header value holds control characters".to_owned());
    h.insert("ce-specversion", HeaderValue::from_static("1.0"));
    h.insert("ce-id", val(event.ce_id.as_bytes())?);
    h.insert("idempotency-key", val(event.ce_id.as_bytes())?);
    h.insert("ce-source", val(source.as_bytes())?);
    if let Some(t) = &event.event_type {
        h.insert("ce-type", val(t)?);
    }
    if let Some(t) = event.timestamp_ms.and_then(rfc3339) {
        h.insert("ce-time", val(t.as_bytes())?);
    }
    if let Some(k) = &event.key {
        h.insert("ce-subject", val(k)?);
        h.insert("key", val(k)?);
    }
    for (name, value) in &event.headers {
        let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("header name {name:?} is not valid"))?;
        h.append(n, val(value)?);
    }
    let body = event.payload.clone().unwrap_or_default();
    if let Some(p) = &event.payload {
        let ct = if is_json(p) { "application/json" } else { "application/octet-stream" };
        h.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    Ok((h, body))
}

/// Append `event` as one element of a JSON batch to `out` (no separator).
pub fn batch_element(event: &Event, source: &str, out: &mut Vec<u8>) -> Result<(), String> {
    let utf8 = |v: &Bytes| std::str::from_utf8(v).map(str::to_owned).map_err(|_| "not UTF-8".to_owned());
    let mut m = serde_json::Map::new();
    m.insert("specversion".into(), "1.0".into());
    m.insert("id".into(), event.ce_id.clone().into());
    m.insert("source".into(), source.into());
    if let Some(t) = &event.event_type {
        m.insert("type".into(), utf8(t)?.into());
    }
    if let Some(t) = event.timestamp_ms.and_then(rfc3339) {
        m.insert("time".into(), t.into());
    }
    if let Some(k) = &event.key {
        let k = utf8(k)?;
        m.insert("subject".into(), k.clone().into());
        m.insert("partitionkey".into(), k.into());
    }
    if !event.headers.is_empty() {
        let mut hm = serde_json::Map::new();
        for (name, value) in &event.headers {
            hm.insert(name.to_string(), utf8(value)?.into());
        }
        m.insert("outboxdheaders".into(), serde_json::Value::Object(hm).to_string().into());
        // W3C trace context as CloudEvents' distributed-tracing extension attributes.
        for name in ["traceparent", "tracestate"] {
            if let Some((_, v)) = event.headers.iter().find(|(k, _)| k == name) {
                m.insert(name.into(), utf8(v)?.into());
            }
        }
    }
    // The element without its data, then the payload spliced in verbatim (a JSON payload keeps
    // its exact bytes: no re-serialization).
    let head = serde_json::Value::Object(m).to_string();
    out.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    match &event.payload {
        None => {}
        Some(p) if is_json(p) => {
            out.extend_from_slice(br#","datacontenttype":"application/json","data":"#);
            out.extend_from_slice(p);
        }
        Some(p) => {
            out.extend_from_slice(br#","datacontenttype":"application/octet-stream","data_base64":""#);
            out.extend_from_slice(B64.encode(p).as_bytes());
            out.push(b'"');
        }
    }
    out.push(b'}');
    Ok(())
}

/// The v2 signature of a request: `(Outboxd-Signature, Outboxd-Signed-Headers)` values. The HMAC
/// covers what a receiver relies on, so none of it can be changed on a replay:
///
/// ```text
/// <t>\n<path and query as sent>\n<signed header names, comma-separated>\n
/// <value of each, in that order, one per line (several values of one name joined by ", ";
///  each without surrounding spaces and tabs, as HTTP delivers it)>\n
/// <body>
/// ```
///
/// The signed headers are every header outboxd sets (`ce-*`, `idempotency-key`, `key`,
/// `content-type`, the record's headers), so the event id, type, subject and headers, and the
/// topic in the URL path, are all covered. Values never hold CR or LF ([`check`]).
pub fn signature_v2(
    key: &[u8],
    unix_seconds: u64,
    path_and_query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> (String, String) {
    let mut names: Vec<&str> = Vec::new();
    for name in headers.keys() {
        if !names.contains(&name.as_str()) {
            names.push(name.as_str());
        }
    }
    let names_text = names.join(",");
    let mut mac = <Hmac<Sha256> as hmac::KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(format!("{unix_seconds}\n{path_and_query}\n{names_text}\n").as_bytes());
    for name in &names {
        // As HTTP delivers a field value: without leading or trailing spaces and tabs.
        let values: Vec<&[u8]> = headers.get_all(*name).iter().map(|v| trim_ows(v.as_bytes())).collect();
        mac.update(&values.join(&b", "[..]));
        mac.update(b"\n");
    }
    mac.update(body);
    (format!("t={unix_seconds},v2={}", crate::hex::lower(&mac.finalize().into_bytes())), names_text)
}

/// `v` without the optional whitespace (spaces, tabs) HTTP strips around a field value.
fn trim_ows(v: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = v.iter().position(|b| !ows(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &v[start..end]
}

/// The v1 signature (`--http-signature-version v1`, for receivers not yet moved):
/// `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`. It covers the body only.
pub fn signature(key: &[u8], unix_seconds: u64, body: &[u8]) -> String {
    // HMAC takes keys of any length; the config requires at least 16 bytes.
    let mut mac = <Hmac<Sha256> as hmac::KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(unix_seconds.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={unix_seconds},v1={}", crate::hex::lower(&mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(payload: Option<&'static [u8]>, headers: &[(&str, &'static [u8])]) -> Record {
        Record {
            topic: "t".into(),
            key: Some(Bytes::from_static(b"agg-1")),
            payload: payload.map(Bytes::from_static),
            headers: headers.iter().map(|(k, v)| (k.to_string().into(), Bytes::copy_from_slice(v))).collect(),
            partition: None,
            timestamp_ms: Some(1_700_000_000_123),
            event_id: "e-1".into(),
            event_type: Some(Bytes::from_static(b"order.paid.v1")),
        }
    }

    fn event(payload: Option<&'static [u8]>, headers: &[(&str, &'static [u8])]) -> Event {
        let r = record(payload, headers);
        let id = Event::ce_id(&r, None);
        Event::from_record(r, id)
    }

    #[test]
    fn binary_mode_headers_and_body() {
        check(&record(Some(br#"{"a": 1}"#), &[("id", b"e-1"), ("traceId", b"t 1")]), "e-1", false).unwrap();
        let e = event(Some(br#"{"a": 1}"#), &[("id", b"e-1"), ("traceId", b"t 1")]);
        let (h, body) = single(&e, "outboxd/s").unwrap();
        assert_eq!(&body[..], br#"{"a": 1}"#);
        let get = |n: &str| h.get(n).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(get("ce-specversion").as_deref(), Some("1.0"));
        assert_eq!(get("ce-id").as_deref(), Some("e-1"));
        assert_eq!(get("idempotency-key").as_deref(), Some("e-1"));
        assert_eq!(get("ce-type").as_deref(), Some("order.paid.v1"));
        assert_eq!(get("ce-time").as_deref(), Some("2023-11-14T22:13:20.123Z"));
        assert_eq!(get("ce-subject").as_deref(), Some("agg-1"));
        assert_eq!(get("key").as_deref(), Some("agg-1"));
        assert_eq!(get("ce-source").as_deref(), Some("outboxd/s"));
        assert_eq!(get("traceid").as_deref(), Some("t 1"));
        assert_eq!(get("content-type").as_deref(), Some("application/json"));
        let (h, body) = single(&event(None, &[]), "s").unwrap();
        assert!(body.is_empty() && h.get("content-type").is_none(), "a tombstone has no body");
        let (h, _) = single(&event(Some(b"not json"), &[]), "s").unwrap();
        assert_eq!(h["content-type"], "application/octet-stream");
    }

    #[test]
    fn headers_that_cannot_travel_are_refused() {
        for (name, value) in [
            ("bad name", &b"v"[..]),
            ("", b"v"),
            ("Content-Length", b"1"),
            ("ce-id", b"x"),
            ("Key", b"x"),
            ("x", b"a\r\nb"),
            ("x", b"a\0"),
        ] {
            let r =
                Record { headers: vec![(name.to_owned().into(), Bytes::copy_from_slice(value))], ..record(None, &[]) };
            assert!(check(&r, "e-1", false).is_err(), "{name:?}: {value:?}");
        }
        let latin1 = record(None, &[("x", b"\xe9")]);
        assert!(check(&latin1, "e-1", false).is_ok() && check(&latin1, "e-1", true).is_err());
        assert!(check(&record(None, &[]), "e\n1", false).is_err(), "an id with control characters");
    }

    #[test]
    fn batch_elements_are_cloudevents_json() {
        let mut out = b"[".to_vec();
        let tp: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        batch_element(&event(Some(br#"{"a":  [1]}"#), &[("id", b"e-1"), ("traceparent", tp)]), "src", &mut out)
            .unwrap();
        out.push(b',');
        batch_element(&event(Some(b"\x00raw"), &[]), "src", &mut out).unwrap();
        out.push(b',');
        batch_element(&event(None, &[]), "src", &mut out).unwrap();
        out.push(b']');
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.contains(r#""data":{"a":  [1]}"#), "payload verbatim: {text}");
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v[0]["id"], "e-1");
        assert_eq!(v[0]["type"], "order.paid.v1");
        assert_eq!(v[0]["subject"], "agg-1");
        assert_eq!(v[0]["partitionkey"], "agg-1");
        assert_eq!(v[0]["time"], "2023-11-14T22:13:20.123Z");
        assert_eq!(v[0]["datacontenttype"], "application/json");
        let hs: serde_json::Value = serde_json::from_str(v[0]["outboxdheaders"].as_str().unwrap()).unwrap();
        assert_eq!(hs["id"], "e-1");
        assert_eq!(v[0]["traceparent"].as_str().map(str::as_bytes), Some(tp), "distributed-tracing extension");
        assert_eq!(B64.decode(v[1]["data_base64"].as_str().unwrap()).unwrap(), b"\x00raw");
        assert!(v[2].get("data").is_none() && v[2].get("data_base64").is_none());
    }

    #[test]
    fn v2_covers_the_path_and_every_header_outboxd_sets() {
        let mut h = HeaderMap::new();
        h.insert("ce-id", HeaderValue::from_static("e-1"));
        h.insert("ce-type", HeaderValue::from_static("order.paid.v1"));
        h.append("trace", HeaderValue::from_static("a"));
        h.append("trace", HeaderValue::from_static("b "));
        let key = b"0123456789abcdef";
        let (sig, names) = signature_v2(key, 1_700_000_000, "/in/t?x=1", &h, b"{}");
        assert_eq!(names, "ce-id,ce-type,trace");
        // printf '1700000000\n/in/t?x=1\nce-id,ce-type,trace\ne-1\norder.paid.v1\na, b\n{}' | openssl dgst -sha256 -hmac 0123456789abcdef
        let mut mac = <Hmac<Sha256> as hmac::KeyInit>::new_from_slice(key).unwrap();
        mac.update(b"1700000000\n/in/t?x=1\nce-id,ce-type,trace\ne-1\norder.paid.v1\na, b\n{}");
        assert_eq!(sig, format!("t=1700000000,v2={}", crate::hex::lower(&mac.finalize().into_bytes())));
        // Any covered part changed: another signature.
        let mut other = h.clone();
        other.insert("ce-type", HeaderValue::from_static("order.refunded.v1"));
        assert_ne!(signature_v2(key, 1_700_000_000, "/in/t?x=1", &other, b"{}").0, sig);
        assert_ne!(signature_v2(key, 1_700_000_000, "/in/u?x=1", &h, b"{}").0, sig);
    }

    #[test]
    fn signature_is_hmac_of_timestamp_dot_body() {
        // echo -n '1700000000.{"a":1}' | openssl dgst -sha256 -hmac 0123456789abcdef
        let s = signature(b"0123456789abcdef", 1_700_000_000, br#"{"a":1}"#);
        assert_eq!(s, "t=1700000000,v1=9eb18f493f8ec135d9eb2dad817c369bb4e9cbfa818657897a7437c1cd8c3a23");
    }

    #[test]
    fn dead_letter_copies_escape_what_cannot_travel() {
        use crate::sink::escape::make_writable;
        let mut r = record(Some(b"{}"), &[("id", b"e\n1"), ("Content-Length", b"9"), ("x", b"a\r\nb"), ("y", b" pad")]);
        r.event_id = "e\n1".into();
        r.key = Some(Bytes::from_static(b"k\n1"));
        r.event_type = None;
        assert!(check(&r, &r.event_id, true).is_err());
        r.key = make_writable(&mut r.headers, r.key.take(), &COPY_LIMITS);
        let ce_id = Event::ce_id(&r, Some("0123456789abcdef"));
        check(&r, &ce_id, true).unwrap();
        check(&r, &ce_id, false).unwrap();
        assert!(ce_id.starts_with("sha256.") && ce_id.contains("/dlq/"), "{ce_id}");
        let got: Vec<(&str, &[u8])> = r.headers.iter().map(|(k, v)| (&**k, &v[..])).collect();
        assert_eq!(
            got,
            vec![
                ("outboxd.escaped-header.0", &b"id=e%0A1"[..]),
                ("outboxd.escaped-header.1", b"Content%2DLength=9"),
                ("outboxd.escaped-header.2", b"x=a%0D%0Ab"),
                ("outboxd.escaped-header.3", b"y=%20pad"),
                ("outboxd.escaped-key", b"k%0A1"),
            ]
        );
        assert_eq!(r.key, None);
        assert!(r.headers.iter().all(|(n, v)| (COPY_LIMITS.header)(n, v)), "every escaped header is writable");
    }

    #[test]
    fn dead_letter_copies_get_their_own_id() {
        let r = Record {
            topic: "dlq".into(),
            key: None,
            payload: Some(Bytes::from_static(b"chunk")),
            headers: vec![],
            partition: None,
            timestamp_ms: None,
            event_id: "e-9".into(),
            event_type: None,
        };
        let id = Event::ce_id(&r, Some("c0ffee/2"));
        assert_eq!(id, "e-9/dlq/c0ffee/2");
        assert_eq!(Event::ce_id(&r, None), "e-9");
    }
}
