//! The trivial sinks: `null` acks at once (for benchmarks), `stdout` prints one JSON line per event.

use std::io::Write;

use serde::Serialize;
use serde_json::value::RawValue;

use super::delivery::Delivery;
use super::{Sink, SinkError};
use crate::error::Definite;
use crate::router::Record;

/// Discards records and acks them immediately.
#[derive(Debug, Default)]
pub struct NullSink;

/// The null sink's entry in the list of sinks ([`crate::sink::registry`]).
impl crate::sink::registered::Registered for NullSink {
    async fn build(
        _cfg: &crate::config::Config,
        _health: std::sync::Arc<crate::health::Health>,
    ) -> Result<Self, Definite> {
        Ok(NullSink)
    }

    fn probe(_cfg: &crate::config::Config) -> crate::sink::registered::Probe {
        crate::sink::registered::Probe::Nothing(NO_BROKER)
    }
}

/// The stdout sink's entry in the list of sinks ([`crate::sink::registry`]).
impl crate::sink::registered::Registered for StdoutSink {
    async fn build(
        _cfg: &crate::config::Config,
        _health: std::sync::Arc<crate::health::Health>,
    ) -> Result<Self, Definite> {
        Ok(StdoutSink::default())
    }

    fn probe(_cfg: &crate::config::Config) -> crate::sink::registered::Probe {
        crate::sink::registered::Probe::Nothing(NO_BROKER)
    }
}

/// What `outboxd check` says of the sinks here.
const NO_BROKER: &str = "no broker to check (--sink stdout or null)";

impl Sink for NullSink {
    fn send(&mut self, _record: Record, delivery: Delivery) -> Result<(), SinkError> {
        delivery.ack();
        Ok(())
    }
}

/// Prints `{"topic","key","headers","payload","timestamp"}` per event; acks after the line is written.
pub struct StdoutSink {
    out: std::io::BufWriter<std::io::Stdout>,
}

impl Default for StdoutSink {
    fn default() -> Self {
        StdoutSink { out: std::io::BufWriter::new(std::io::stdout()) }
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum Payload<'a> {
    /// Valid JSON text is embedded verbatim, byte for byte.
    Json(&'a RawValue),
    Text(std::borrow::Cow<'a, str>),
}

#[derive(Serialize)]
struct Line<'a> {
    topic: &'a str,
    key: Option<std::borrow::Cow<'a, str>>,
    headers: std::collections::BTreeMap<&'a str, std::borrow::Cow<'a, str>>,
    payload: Option<Payload<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<i32>,
    timestamp: Option<i64>,
}

/// One JSON line for `r`; the payload keeps its exact text when it is JSON.
pub fn record_json(r: &Record) -> String {
    let payload = r.payload.as_ref().map(|p| {
        match std::str::from_utf8(p).ok().and_then(|s| serde_json::from_str::<&RawValue>(s).ok()) {
            Some(raw) => Payload::Json(raw),
            None => Payload::Text(String::from_utf8_lossy(p)),
        }
    });
    let line = Line {
        topic: &r.topic,
        key: r.key.as_ref().map(|k| String::from_utf8_lossy(k)),
        headers: r.headers.iter().map(|(k, v)| (&**k, String::from_utf8_lossy(v))).collect(),
        payload,
        partition: r.partition,
        timestamp: r.timestamp_ms,
    };
    // Serializing borrowed strings and validated raw JSON cannot fail.
    serde_json::to_string(&line).unwrap_or_default()
}

impl Sink for StdoutSink {
    fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        let line = record_json(&record);
        let res = self
            .out
            .write_all(line.as_bytes())
            .and_then(|()| self.out.write_all(b"\n"))
            .and_then(|()| self.out.flush());
        match res {
            Ok(()) => {
                delivery.ack();
                Ok(())
            }
            Err(e) => {
                delivery.fail(e.to_string());
                Err(SinkError::Fatal(Definite::Sink(format!("writing to stdout failed: {e}"))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn stdout_json_keeps_payload_as_json() {
        let r = Record {
            topic: "t.events".into(),
            key: Some(Bytes::from_static(b"42")),
            payload: Some(Bytes::from_static(br#"{"a": [1, 2]}"#)),
            headers: vec![("id".into(), Bytes::from_static(b"e-1"))],
            partition: None,
            timestamp_ms: Some(7),
            event_id: "e-1".into(),
            event_type: None,
        };
        let line = record_json(&r);
        assert!(line.contains(r#""payload":{"a": [1, 2]}"#), "payload must be verbatim: {line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["payload"]["a"][1], 2);
        assert_eq!(v["headers"]["id"], "e-1");
        assert_eq!(v["key"], "42");
        assert_eq!(v["topic"], "t.events");
    }
}
