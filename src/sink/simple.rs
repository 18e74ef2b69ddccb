//! The trivial sinks: `null` acks at once (for benchmarks), `stdout` prints one JSON line per event.

use std::io::Write;
use std::time::Duration;

use serde_json::value::RawValue;

use super::Sink;
use crate::ack::Delivery;
use crate::error::Definite;
use crate::router::Record;

/// Discards records and acks them immediately.
#[derive(Debug, Default)]
pub struct NullSink;

impl Sink for NullSink {
    async fn send(&mut self, _record: Record, delivery: Delivery) -> Result<(), Definite> {
        delivery.ack();
        Ok(())
    }

    async fn flush(&mut self, _timeout: Duration) {}
}

/// Prints `{"topic","key","headers","payload","timestamp"}` per event; acks after the line is written.
pub struct StdoutSink {
    out: std::io::BufWriter<std::io::Stdout>,
}

impl Default for StdoutSink {
    fn default() -> Self {
        StdoutSink {
            out: std::io::BufWriter::new(std::io::stdout()),
        }
    }
}

/// Render bytes as JSON when they are valid JSON text, else as a string.
fn json_or_string(b: &[u8]) -> serde_json::Value {
    let s = String::from_utf8_lossy(b);
    match serde_json::from_str::<Box<RawValue>>(&s) {
        Ok(raw) => {
            serde_json::from_str(raw.get()).unwrap_or(serde_json::Value::String(s.into_owned()))
        }
        Err(_) => serde_json::Value::String(s.into_owned()),
    }
}

pub fn record_json(r: &Record) -> serde_json::Value {
    let headers: serde_json::Map<String, serde_json::Value> = r
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                serde_json::Value::String(String::from_utf8_lossy(v).into_owned()),
            )
        })
        .collect();
    serde_json::json!({
        "topic": r.topic,
        "key": r.key.as_ref().map(|k| String::from_utf8_lossy(k).into_owned()),
        "headers": headers,
        "payload": r.payload.as_ref().map(|p| json_or_string(p)),
        "timestamp": r.timestamp_ms,
    })
}

impl Sink for StdoutSink {
    async fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), Definite> {
        let line = record_json(&record);
        let res = serde_json::to_writer(&mut self.out, &line)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"))
            .and_then(|()| self.out.flush());
        match res {
            Ok(()) => {
                delivery.ack();
                Ok(())
            }
            Err(e) => {
                delivery.fail(e.to_string());
                Err(Definite::Sink(format!("writing to stdout failed: {e}")))
            }
        }
    }

    async fn flush(&mut self, _timeout: Duration) {
        let _ = self.out.flush();
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
            timestamp_ms: Some(7),
            event_id: "e-1".into(),
        };
        let v = record_json(&r);
        assert_eq!(v["payload"]["a"][1], 2);
        assert_eq!(v["headers"]["id"], "e-1");
        assert_eq!(v["key"], "42");
        assert_eq!(v["topic"], "t.events");
    }
}
