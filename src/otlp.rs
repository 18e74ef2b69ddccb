//! `--otlp-endpoint`: one OpenTelemetry span per event that carries W3C trace context (from the
//! trace context column, [`crate::router::trace`]), exported over OTLP/HTTP (protobuf, `POST
//! <endpoint>/v1/traces`).
//!
//! The span is a child of the writer's span (the row's `traceparent`), runs from the event's
//! timestamp (its `created_at`, or the commit time) to the sink's answer, and is named
//! `<topic> publish` (kind PRODUCER), with the topic, the event id, the WAL position and the
//! outcome (`acked`, `dead_lettered`, `skipped`, `failed`) as attributes. The record's
//! `traceparent` header is rewritten to name this span as the parent, so the consumer's span is
//! its child: writer → outboxd → consumer in one trace.
//!
//! # Invariants
//! * Off by default and free when off: the relay checks one `Option` per record ([`exporter`]).
//! * Nothing waits on the collector: finished spans go to a bounded queue; a full queue drops
//!   spans (counted in the log), a collector that fails loses that batch (logged, at most once a
//!   minute). Events are never held back by tracing.
//! * The export task is supervised like every background task: if it ends, the process says so.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use prost::Message;

/// Spans waiting for export at most; more are dropped.
const QUEUE: usize = 8192;
/// A batch is sent when this many spans wait, or every [`FLUSH_EVERY`].
const BATCH: usize = 512;
const FLUSH_EVERY: Duration = Duration::from_secs(1);

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

/// The exporter, when `--otlp-endpoint` is set ([`start`] ran).
pub fn exporter() -> Option<&'static Exporter> {
    EXPORTER.get()
}

/// Start exporting to `endpoint` (an OTLP/HTTP base URL, e.g. `http://collector:4318`). Call
/// once, inside the runtime. Returns the export task for supervision.
pub fn start(endpoint: &str, service: &str) -> tokio::task::JoinHandle<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let _ = EXPORTER.set(Exporter { tx, pending: Mutex::new(HashMap::new()), dropped: Default::default() });
    tokio::spawn(export_loop(url, service.to_owned(), rx))
}

/// A span under way: what the record's header named, and when it started.
struct Pending {
    trace_id: [u8; 16],
    parent: [u8; 8],
    span_id: [u8; 8],
    flags: u8,
    start_unix_nanos: u64,
    topic: String,
    lsn: Option<crate::lsn::Lsn>,
}

pub struct Exporter {
    tx: tokio::sync::mpsc::Sender<pb::Span>,
    /// Spans of records handed to the sink, by event id, until their outcome.
    pending: Mutex<HashMap<String, Pending>>,
    dropped: std::sync::atomic::AtomicU64,
}

impl Exporter {
    /// A record goes to the sink: if its headers carry a `traceparent`, open a span for it and
    /// make the header name that span as the parent.
    pub fn begin(
        &self,
        event_id: &str,
        topic: &str,
        timestamp_ms: Option<i64>,
        lsn: Option<crate::lsn::Lsn>,
        headers: &mut [crate::router::Header],
    ) {
        let Some((_, tp)) = headers.iter_mut().find(|(k, _)| k == "traceparent") else { return };
        let Some((trace_id, parent, flags)) = parse_traceparent(tp) else { return };
        let mut span_id = [0u8; 8];
        if openssl::rand::rand_bytes(&mut span_id).is_err() || span_id == [0; 8] {
            return;
        }
        *tp = Bytes::from(format!("00-{}-{}-{flags:02x}", crate::hex::lower(&trace_id), crate::hex::lower(&span_id)));
        let start_unix_nanos = match timestamp_ms {
            Some(ms) if ms > 0 => ms as u64 * 1_000_000,
            _ => now_nanos(),
        };
        let p = Pending { trace_id, parent, span_id, flags, start_unix_nanos, topic: topic.to_owned(), lsn };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(event_id.to_owned(), p);
    }

    /// The record of `event_id` has its outcome: end its span, if it has one.
    pub fn end(&self, event_id: &str, outcome: &'static str) {
        let Some(p) = self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(event_id) else { return };
        let mut attributes = vec![
            kv("messaging.system", "kafka-compatible"),
            kv("messaging.destination.name", &p.topic),
            kv("messaging.message.id", event_id),
            kv("outboxd.outcome", outcome),
        ];
        if let Some(lsn) = p.lsn {
            // Formatted here, for traced events only, not on every record's way in.
            attributes.push(kv("outboxd.lsn", &lsn.to_string()));
        }
        let ok = matches!(outcome, "acked");
        let span = pb::Span {
            trace_id: p.trace_id.to_vec(),
            span_id: p.span_id.to_vec(),
            parent_span_id: p.parent.to_vec(),
            name: format!("{} publish", p.topic),
            kind: pb::SPAN_KIND_PRODUCER,
            start_time_unix_nano: p.start_unix_nanos,
            end_time_unix_nano: now_nanos().max(p.start_unix_nanos),
            attributes,
            status: Some(pb::Status {
                message: if ok { String::new() } else { outcome.to_owned() },
                code: if ok { pb::STATUS_OK } else { pb::STATUS_ERROR },
            }),
            flags: u32::from(p.flags),
        };
        if self.tx.try_send(span).is_err() {
            self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The session ended: its records' spans will not end (they are sent again, with new spans).
    pub fn forget_pending(&self) {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

async fn export_loop(url: String, service: String, mut rx: tokio::sync::mpsc::Receiver<pb::Span>) {
    let client = match reqwest::Client::builder().timeout(Duration::from_secs(10)).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "OTLP export disabled: cannot build the HTTP client");
            return std::future::pending().await;
        }
    };
    let mut last_warning: Option<Instant> = None;
    let mut batch = Vec::new();
    loop {
        let deadline = tokio::time::sleep(FLUSH_EVERY);
        tokio::pin!(deadline);
        while batch.len() < BATCH {
            tokio::select! {
                s = rx.recv() => match s {
                    Some(s) => batch.push(s),
                    None => return,
                },
                _ = &mut deadline => break,
            }
        }
        if batch.is_empty() {
            continue;
        }
        let body = request(&service, std::mem::take(&mut batch)).encode_to_vec();
        let sent = client.post(&url).header("Content-Type", "application/x-protobuf").body(body).send().await;
        let failure = match sent {
            Ok(r) if r.status().is_success() => None,
            Ok(r) => Some(format!("HTTP {}", r.status().as_u16())),
            Err(e) => Some(e.without_url().to_string()),
        };
        let dropped = exporter().map_or(0, |e| e.dropped.swap(0, std::sync::atomic::Ordering::Relaxed));
        if (failure.is_some() || dropped > 0) && last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
            last_warning = Some(Instant::now());
            tracing::warn!(endpoint = %crate::secret::mask_url(&url), failure = failure.as_deref().unwrap_or("none"), dropped_spans = dropped, "OTLP export lost spans (events are not affected)");
        }
    }
}

fn request(service: &str, spans: Vec<pb::Span>) -> pb::ExportTraceServiceRequest {
    pb::ExportTraceServiceRequest {
        resource_spans: vec![pb::ResourceSpans {
            resource: Some(pb::Resource { attributes: vec![kv("service.name", service)] }),
            scope_spans: vec![pb::ScopeSpans {
                scope: Some(pb::InstrumentationScope {
                    name: "outboxd".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans,
            }],
        }],
    }
}

fn kv(key: &str, value: &str) -> pb::KeyValue {
    pb::KeyValue { key: key.to_owned(), value: Some(pb::AnyValue { string_value: Some(value.to_owned()) }) }
}

fn now_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// `00-<trace id>-<parent id>-<flags>` (the router validated it).
fn parse_traceparent(v: &[u8]) -> Option<([u8; 16], [u8; 8], u8)> {
    let s = std::str::from_utf8(v).ok()?;
    let mut parts = s.split('-');
    let (_version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let mut t = [0u8; 16];
    let mut p = [0u8; 8];
    for (i, out) in t.iter_mut().enumerate() {
        *out = u8::from_str_radix(trace.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    for (i, out) in p.iter_mut().enumerate() {
        *out = u8::from_str_radix(parent.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((t, p, u8::from_str_radix(flags, 16).ok()?))
}

/// The OTLP trace messages outboxd sends (opentelemetry-proto's `trace/v1`, `common/v1` and
/// `resource/v1`, the fields used here, with their numbers).
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub resource_spans: Vec<ResourceSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub scope_spans: Vec<ScopeSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub attributes: Vec<KeyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeSpans {
        #[prost(message, optional, tag = "1")]
        pub scope: Option<InstrumentationScope>,
        #[prost(message, repeated, tag = "2")]
        pub spans: Vec<Span>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InstrumentationScope {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }
    pub const SPAN_KIND_PRODUCER: i32 = 4;
    pub const STATUS_OK: i32 = 1;
    pub const STATUS_ERROR: i32 = 2;
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub span_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        pub parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub name: String,
        #[prost(int32, tag = "6")]
        pub kind: i32,
        #[prost(fixed64, tag = "7")]
        pub start_time_unix_nano: u64,
        #[prost(fixed64, tag = "8")]
        pub end_time_unix_nano: u64,
        #[prost(message, repeated, tag = "9")]
        pub attributes: Vec<KeyValue>,
        #[prost(message, optional, tag = "15")]
        pub status: Option<Status>,
        #[prost(fixed32, tag = "16")]
        pub flags: u32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        #[prost(string, tag = "2")]
        pub message: String,
        #[prost(int32, tag = "3")]
        pub code: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AnyValue {
        #[prost(string, optional, tag = "1")]
        pub string_value: Option<String>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_a_child_of_the_row_and_the_parent_of_the_record() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let e = Exporter { tx, pending: Mutex::new(HashMap::new()), dropped: Default::default() };
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut headers = vec![("id".into(), Bytes::from_static(b"e-1")), ("traceparent".into(), Bytes::from(tp))];
        e.begin("e-1", "orders.events", Some(1_700_000_000_000), Some(crate::lsn::Lsn(0x16B3748)), &mut headers);
        let written = String::from_utf8(headers[1].1.to_vec()).unwrap();
        assert!(written.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && written.ends_with("-01"), "{written}");
        assert_ne!(written, tp, "the header names outboxd's span");
        e.end("e-1", "acked");
        let span = rx.try_recv().unwrap();
        assert_eq!(crate::hex::lower(&span.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(crate::hex::lower(&span.parent_span_id), "00f067aa0ba902b7");
        assert_eq!(
            written,
            format!("00-{}-{}-01", crate::hex::lower(&span.trace_id), crate::hex::lower(&span.span_id))
        );
        assert_eq!(span.start_time_unix_nano, 1_700_000_000_000_000_000);
        assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
        assert_eq!(span.name, "orders.events publish");
        let lsn = span.attributes.iter().find(|a| a.key == "outboxd.lsn").and_then(|a| a.value.clone());
        assert_eq!(lsn.and_then(|v| v.string_value).as_deref(), Some("0/16B3748"));
        // The wire form decodes back (the field numbers are opentelemetry-proto's).
        let bytes = request("outboxd", vec![span.clone()]).encode_to_vec();
        let back = pb::ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.resource_spans[0].scope_spans[0].spans[0], span);
        // A record without trace context gets no span, and an unknown event ends nothing.
        let mut plain = vec![("id".into(), Bytes::from_static(b"e-2"))];
        e.begin("e-2", "t", None, None, &mut plain);
        e.end("e-2", "acked");
        assert!(rx.try_recv().is_err());
    }
}
