//! `outboxd dlq` against `--sink nats`: reading the dead-letter copies the NATS sink published to
//! the `--dlq-topic` subject, and republishing them to JetStream.
//!
//! Reading never consumes or deletes anything: no consumer is made; each copy is fetched with the
//! stream's message-get API (`STREAM.MSG.GET`, "next message on this subject from sequence N"),
//! from sequence 1 up to the last sequence the subject had when reading began (asked for once, at
//! open). A record's position is `0/<stream sequence>`, which is what replay progress
//! ([`crate::tools::dlq`]) keeps. A failed request is retried until `--read-timeout` passes without an
//! answer; reading then fails rather than returning a shortened DLQ.
//!
//! The sink carries the record key in a `key` header and adds `Nats-Msg-Id`; the reader turns the
//! first back into the key and drops the second. NATS headers are a map, so the original header
//! order is not kept (the sink did not keep it either): `id` comes first, the rest by name.
//!
//! Replay publishes each event to its destination subject with the original key (`key` header),
//! payload and headers minus `outboxd.*`, and `Nats-Msg-Id` set to the event id, as the sink sets it
//! for the original event: within the stream's duplicate window a rerun (progress lost) is dropped
//! by JetStream too. An event counts as replayed only on its PubAck.

use std::str::FromStr;
use std::time::{Duration, Instant};

use async_nats::header::HeaderName;
use async_nats::jetstream::context::{GetStreamByNameErrorKind, Publish};
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use async_nats::jetstream::{self, Context};
use async_nats::HeaderMap;
use bytes::Bytes;

use super::config::NatsConfig;
use super::valid_subject;
use crate::error::{Definite, Error};
use crate::sink::dead_letter::entry::Entry;
use crate::sink::dead_letter::{DlqRecord, PREFIX};

/// Connects for the tool: no retry at start (a tool should say the server is down, not hang).
pub async fn connect(cfg: &NatsConfig) -> Result<Context, Definite> {
    let url = cfg.url_masked();
    let mut opts = async_nats::ConnectOptions::new().name("outboxd-dlq").connection_timeout(Duration::from_secs(10));
    if let Some(creds) = &cfg.creds {
        opts = opts
            .credentials_file(creds)
            .await
            .map_err(|e| Definite::Config(format!("--nats-creds {}: {e}; give a NATS .creds file", creds.display())))?;
    }
    let client = opts
        .connect(cfg.url.as_str())
        .await
        .map_err(|e| Definite::Setup(format!("cannot connect to --nats-url {url}: {}; check the URL", e.kind())))?;
    Ok(jetstream::new(client))
}

/// Reads the DLQ subject; see the module doc.
pub struct NatsReader {
    stream: Stream<()>,
    stream_name: String,
    subject: String,
    /// Last sequence of the subject when reading began.
    last: u64,
    next: u64,
    timeout: Duration,
}

impl NatsReader {
    /// `None` when no stream holds the subject or the subject has no message.
    pub async fn open(js: &Context, subject: &str, timeout: Duration) -> Result<Option<NatsReader>, Definite> {
        if !valid_subject(subject) {
            return Err(Definite::Config(format!(
                "--dlq-topic {subject:?} is not a NATS subject (dot-separated tokens, no whitespace or wildcards)"
            )));
        }
        let stream_name = match js.stream_by_subject(subject).await {
            Ok(n) => n,
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(Definite::Setup(format!(
                    "cannot ask JetStream which stream holds subject {subject:?}: {e}"
                )))
            }
        };
        let stream = js
            .get_stream_no_info(&stream_name)
            .await
            .map_err(|e| Definite::Setup(format!("cannot open JetStream stream {stream_name:?}: {e}")))?;
        let last = match stream.get_last_raw_message_by_subject(subject).await {
            Ok(m) => m.sequence,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => 0,
            Err(e) => {
                return Err(Definite::Setup(format!(
                    "cannot read the last message of {subject:?} in stream {stream_name:?}: {e}"
                )))
            }
        };
        tracing::debug!(stream = %stream_name, last, "reading {subject} up to this sequence");
        Ok(Some(NatsReader { stream, stream_name, subject: subject.to_owned(), last, next: 1, timeout }))
    }

    pub fn stream_name(&self) -> &str {
        &self.stream_name
    }

    /// The next copy, `None` past the last sequence seen at open.
    pub async fn next(&mut self) -> Result<Option<DlqRecord>, Error> {
        let started = Instant::now();
        loop {
            if self.next > self.last {
                return Ok(None);
            }
            match self.stream.get_first_raw_message_by_subject(&self.subject, self.next).await {
                Ok(m) if m.sequence > self.last => return Ok(None),
                Ok(m) => {
                    self.next = m.sequence + 1;
                    return Ok(Some(record(m.sequence, &m.headers, m.payload)));
                }
                Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
                Err(e) if started.elapsed() < self.timeout => {
                    tracing::warn!(error = %e, "reading {} at sequence {}; retrying", self.subject, self.next);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    return Err(Definite::Setup(format!(
                        "reading {} in stream {} stalled at sequence {} of {} for --read-timeout {:?}: {e}; check the server, or raise --read-timeout",
                        self.subject, self.stream_name, self.next, self.last, self.timeout
                    ))
                    .into())
                }
            }
        }
    }
}

/// One stored message as a DLQ record: the `key` header back to the key, `Nats-Msg-Id` dropped.
fn record(sequence: u64, h: &HeaderMap, payload: Bytes) -> DlqRecord {
    let mut key = None;
    let mut headers: Vec<(String, Option<Vec<u8>>)> = Vec::new();
    for (name, values) in h.iter() {
        let name: &str = name.as_ref();
        for v in values {
            let v: &str = v.as_ref();
            match name {
                "key" => key = Some(v.as_bytes().to_vec()),
                "Nats-Msg-Id" => {}
                _ => headers.push((name.to_owned(), Some(v.as_bytes().to_vec()))),
            }
        }
    }
    headers.sort_by(|a, b| (a.0 != "id", &a.0).cmp(&(b.0 != "id", &b.0)));
    DlqRecord {
        partition: 0,
        offset: i64::try_from(sequence).unwrap_or(i64::MAX),
        key,
        payload_len: Some(payload.len()),
        payload: Some(payload.to_vec()),
        headers,
        timestamp_ms: None,
        time_ms: None,
        label: None,
        undecoded: Vec::new(),
        moved_later: false,
    }
}

/// The message replay publishes for `r`: original headers minus `outboxd.*`, the key, and the
/// event id as `Nats-Msg-Id`.
fn message(r: &DlqRecord) -> Result<(HeaderMap, Bytes), String> {
    let mut headers = HeaderMap::new();
    let mut add = |name: &str, value: &[u8]| -> Result<(), String> {
        let parsed = HeaderName::from_str(name).map_err(|_| format!("header name {name:?} is not valid in NATS"))?;
        let value = std::str::from_utf8(value)
            .ok()
            .filter(|v| !v.contains(['\r', '\n']))
            .ok_or_else(|| format!("header {name} is not UTF-8 without CR/LF"))?;
        headers.append(parsed, value);
        Ok(())
    };
    for (k, v) in r.headers.iter().filter(|(k, _)| !k.starts_with(PREFIX)) {
        add(k, v.as_deref().unwrap_or_default())?;
    }
    if let Some(k) = &r.key {
        add("key", k)?;
    }
    if let Some(id) = r.event_id() {
        add("Nats-Msg-Id", id.as_bytes())?;
    }
    Ok((headers, Bytes::from(r.payload.clone().unwrap_or_default())))
}

/// Publishes `batch` and waits for every PubAck: per event, `Ok(where it went)` or `Err(why)`.
pub async fn send_batch(js: &Context, batch: &[(Entry, String)]) -> Vec<Result<String, String>> {
    let mut pending = Vec::with_capacity(batch.len());
    for (e, dest) in batch {
        if !valid_subject(dest) {
            pending.push(Err(format!("{dest:?} is not a NATS subject")));
            continue;
        }
        let (headers, payload) = match message(&e.head) {
            Ok(m) => m,
            Err(why) => {
                pending.push(Err(why));
                continue;
            }
        };
        let publish = Publish::build().payload(payload).headers(headers);
        pending.push(js.send_publish(dest.clone(), publish).await.map_err(|e| e.to_string()));
    }
    let mut out = Vec::with_capacity(pending.len());
    for p in pending {
        out.push(match p {
            Ok(ack) => match ack.await {
                Ok(a) if a.duplicate => Ok(format!("{}/{} (duplicate, already stored)", a.stream, a.sequence)),
                Ok(a) => Ok(format!("{}/{}", a.stream, a.sequence)),
                Err(e) => Err(e.to_string()),
            },
            Err(why) => Err(why),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_header_becomes_the_key_and_the_msg_id_is_dropped() {
        let mut h = HeaderMap::new();
        h.insert("trace", "t-1");
        h.insert("id", "e-1");
        h.insert("key", "k-1");
        h.insert("Nats-Msg-Id", "e-1/dlq/00");
        h.insert("outboxd.error", "schema");
        let r = record(7, &h, Bytes::from_static(b"{}"));
        assert_eq!((r.partition, r.offset), (0, 7));
        assert_eq!(r.key.as_deref(), Some(&b"k-1"[..]));
        let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["id", "outboxd.error", "trace"]);
        let (out, payload) = message(&r).unwrap();
        assert_eq!(payload.as_ref(), b"{}");
        let mut got: Vec<(String, String)> =
            out.iter().flat_map(|(k, vs)| vs.iter().map(move |v| (k.to_string(), v.to_string()))).collect();
        got.sort();
        let want = [("Nats-Msg-Id", "e-1"), ("id", "e-1"), ("key", "k-1"), ("trace", "t-1")];
        assert_eq!(got, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }
}
