//! A dead-letter copy's headers always fit its sink: what does not fit moves into the copy's body.
//!
//! Escaping ([`super::escape`]) can triple a header (a 400 KB value holding a line break becomes
//! 1.2 MB of `%XX`), and chunking only splits the payload. A copy whose headers alone exceed what
//! the sink takes (NATS counts the header block in `max_payload`; an HTTP receiver limits its
//! header section) would be refused, stop the relay, and meet the same row on every restart. So,
//! after escaping, [`fit`] moves header entries out of the copy, largest first, and the key when
//! it is larger than what is left to move, until the rest fits `budget`:
//!
//! * the copy's body becomes `<section><payload>`, the section being JSON:
//!   `{"headers": [[<index>, <name>, <base64 value>], ...], "key": <base64>, "no_payload": true}`
//!   (`key` only when the key moved, `no_payload` only when the event had none). Each header is
//!   kept exactly as the copy would have carried it (escaped or not), with its index in the copy's
//!   header list;
//! * the copy gains the header `outboxd.moved: <length of the section in bytes>`, and is chunked
//!   like any other when the body is too large for one record.
//!
//! [`restore`] is the inverse: it takes the section off the front of the (joined) body and puts
//! every entry back at its index, which gives back the copy's header list as escaping left it,
//! byte for byte; [`super::escape`]'s readers then undo the escaping. A row's own header named
//! `outboxd.moved` is always escaped ([`super::escape::make_writable`]), so an unescaped one is
//! ours.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The header that says a copy's body starts with moved headers, and how many bytes they take.
pub const H_MOVED: &str = "outboxd.moved";

/// What moved, as it is written at the front of the body.
#[derive(Default, Serialize, Deserialize)]
struct Section {
    #[serde(default)]
    headers: Vec<(usize, String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    no_payload: bool,
}

/// Bytes the key and headers take, counted as [`crate::sink::dead_letter::record_size`] does.
fn size(headers: &[crate::router::Header], key: Option<&Bytes>) -> usize {
    headers.iter().map(|(n, v)| n.len() + v.len() + 8).sum::<usize>() + key.map_or(0, Bytes::len)
}

/// Move headers (largest first) and, when it is the larger, the key into the body until the key
/// and headers take at most `budget` bytes; see the module doc. Headers named in `kept` (the
/// copy's own bounded facts: its reason, its source position) never move. Does nothing when they
/// fit, or when the kept headers alone leave no room (then moving cannot make the copy fit, and
/// the copy is written as it is).
pub fn fit(
    headers: &mut Vec<crate::router::Header>,
    key: &mut Option<Bytes>,
    payload: &mut Option<Bytes>,
    budget: usize,
    kept: &[&str],
) {
    let mut total = size(headers, key.as_ref());
    if total <= budget {
        return;
    }
    let stays = |name: &str| kept.contains(&name);
    let kept_size: usize = headers.iter().filter(|(n, _)| stays(n)).map(|(n, v)| n.len() + v.len() + 8).sum();
    // Room for the `outboxd.moved` header itself.
    let budget = budget.saturating_sub(H_MOVED.len() + 20 + 8);
    if kept_size >= budget {
        return;
    }
    let mut order: Vec<usize> = (0..headers.len()).filter(|&i| !stays(&headers[i].0)).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(headers[i].0.len() + headers[i].1.len()));
    let mut moving = vec![false; headers.len()];
    let mut section = Section::default();
    let mut next = order.into_iter().peekable();
    while total > budget {
        let header_len = next.peek().map_or(0, |&i| headers[i].0.len() + headers[i].1.len() + 8);
        match key.as_ref() {
            Some(k) if k.len() >= header_len => {
                total -= k.len();
                section.key = key.take().map(|k| STANDARD.encode(k));
            }
            _ => match next.next() {
                Some(i) => {
                    total -= header_len;
                    moving[i] = true;
                }
                None => break,
            },
        }
    }
    let mut kept = Vec::with_capacity(headers.len());
    for (i, (name, value)) in std::mem::take(headers).into_iter().enumerate() {
        if moving[i] {
            section.headers.push((i, name.into_owned(), STANDARD.encode(&value)));
        } else {
            kept.push((name, value));
        }
    }
    *headers = kept;
    section.no_payload = payload.is_none();
    let mut body = serde_json::to_vec(&section).unwrap_or_default();
    headers.push((H_MOVED.into(), Bytes::from(body.len().to_string())));
    body.extend_from_slice(payload.as_deref().unwrap_or_default());
    *payload = Some(Bytes::from(body));
}

/// The inverse of [`fit`] on a record as read back (a whole copy, or a chunked one once joined):
/// `Ok(false)` when nothing moved; an error (the record is unreadable) when the section does not
/// decode or does not match the record.
pub fn restore(
    headers: &mut Vec<(String, Option<Vec<u8>>)>,
    key: &mut Option<Vec<u8>>,
    payload: &mut Option<Vec<u8>>,
) -> Result<bool, String> {
    let Some(at) = headers.iter().position(|(n, _)| n == H_MOVED) else { return Ok(false) };
    let (_, len) = headers.remove(at);
    let len: usize = std::str::from_utf8(len.as_deref().unwrap_or_default())
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| format!("{H_MOVED} is not a length"))?;
    let body = payload.take().unwrap_or_default();
    if body.len() < len {
        return Err(format!("{H_MOVED} says {len} bytes, the body has {}", body.len()));
    }
    let section: Section =
        serde_json::from_slice(&body[..len]).map_err(|e| format!("the moved headers do not decode: {e}"))?;
    let decode = |v: &str| STANDARD.decode(v).map_err(|e| format!("a moved value is not base64: {e}"));
    for (i, name, value) in section.headers {
        if i > headers.len() {
            return Err(format!("moved header {name:?} has index {i}, past the {} headers", headers.len()));
        }
        headers.insert(i, (name, Some(decode(&value)?)));
    }
    if let Some(k) = section.key {
        *key = Some(decode(&k)?);
    }
    *payload = (!section.no_payload).then(|| body[len..].to_vec());
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_back(h: &[crate::router::Header]) -> Vec<(String, Option<Vec<u8>>)> {
        h.iter().map(|(n, v)| (n.to_string(), Some(v.to_vec()))).collect()
    }

    #[test]
    fn what_does_not_fit_moves_into_the_body_and_comes_back_in_place() {
        let original: Vec<crate::router::Header> = vec![
            ("id".into(), Bytes::from_static(b"e-1")),
            ("big".into(), Bytes::from(vec![b'%'; 50_000])),
            ("trace".into(), Bytes::from_static(b"t-1")),
            ("bigger".into(), Bytes::from(vec![0xff; 60_000])),
            ("outboxd.error".into(), Bytes::from_static(b"invalid_header")),
        ];
        for (key, payload) in [
            (Some(Bytes::from_static(b"k")), Some(Bytes::from_static(b"{}"))),
            (Some(Bytes::from(vec![b'k'; 70_000])), None),
            (None, Some(Bytes::new())),
        ] {
            let (mut h, mut k, mut p) = (original.clone(), key.clone(), payload.clone());
            fit(&mut h, &mut k, &mut p, 8192, &[]);
            assert!(size(&h, k.as_ref()) <= 8192, "fits: {}", size(&h, k.as_ref()));
            let names: Vec<&str> = h.iter().map(|(n, _)| &**n).collect();
            assert_eq!(names, ["id", "trace", "outboxd.error", H_MOVED], "the small ones stay, in order");
            let (mut rh, mut rk, mut rp) = (read_back(&h), k.map(|k| k.to_vec()), p.map(|p| p.to_vec()));
            assert_eq!(restore(&mut rh, &mut rk, &mut rp), Ok(true));
            assert_eq!(rh, read_back(&original), "every header back in its place, byte for byte");
            assert_eq!(rk, key.map(|k| k.to_vec()));
            assert_eq!(rp, payload.map(|p| p.to_vec()));
        }
    }

    #[test]
    fn a_copy_that_fits_is_left_alone_and_a_bad_section_is_an_error() {
        let mut h = vec![("id".into(), Bytes::from_static(b"e-1"))];
        let (mut k, mut p) = (None, Some(Bytes::from_static(b"{}")));
        fit(&mut h, &mut k, &mut p, 8192, &[]);
        assert_eq!((h.len(), p.as_deref()), (1, Some(&b"{}"[..])));
        let (mut rh, mut rk, mut rp) = (read_back(&h), None, Some(b"{}".to_vec()));
        assert_eq!(restore(&mut rh, &mut rk, &mut rp), Ok(false));
        let past = br#"{"headers":[[5,"a","eA=="]]}"#;
        let past_len = past.len().to_string();
        for (len, body) in [("99", &b"{}"[..]), ("2", b"{x"), ("x", b"{}"), (past_len.as_str(), &past[..])] {
            let mut rh = vec![(H_MOVED.to_owned(), Some(len.as_bytes().to_vec()))];
            let mut rp = Some(body.to_vec());
            assert!(restore(&mut rh, &mut None, &mut rp).is_err(), "{len} {body:?}");
        }
    }
}
