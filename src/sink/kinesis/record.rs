//! One routed record as a Kinesis record, built without I/O: its partition key and data, or the
//! reason Kinesis could never take it, for the bad-event policy.
//!
//! * The partition key is the record key when Kinesis takes it as one (UTF-8, 1 to 256 UTF-16
//!   units); any other key (binary, longer) becomes `sha256.<32 hex digits>` of its bytes, so
//!   one key always lands on one shard. A keyless event has no order to keep: its partition key is
//!   its event id, which spreads keyless events over the shards.
//! * The data is the payload as routed, byte for byte (a null payload is empty data). Kinesis
//!   records have no headers: the event's headers (`id`, the additional placements) are not
//!   carried; a consumer that needs them must find them in the payload (see docs/src/kinesis.md).
//! * Kinesis takes up to 1 MiB of data and partition key together (or the stream's own
//!   `MaxRecordSizeInKiB`): a larger event is a bad event (`too_large`), refused here, before any
//!   request, as Kinesis would refuse the whole call.
//! * A dead-letter copy ([`Delivery::is_dead_letter`]) goes to `--kinesis-dlq-stream` as a JSON
//!   envelope, since its headers (`outboxd.error`...) matter and its key and payload may be any
//!   bytes: `{"key": B64|null, "headers": [[NAME, B64], ...], "payload": B64|null}` (standard
//!   base64), with the copy's event id as partition key, so the chunks of one copy share a shard.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::router::Record;
use crate::sink::delivery::Delivery;
use crate::sink::SinkError;

/// Kinesis's limit on one record, data and partition key together, unless the stream says its
/// own (`MaxRecordSizeInKiB`).
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;
/// The most characters of a partition key.
const MAX_KEY_CHARS: usize = 256;

/// One record on its way to Kinesis, with what a rejection needs.
pub struct Job {
    /// To `--kinesis-dlq-stream` (a dead-letter copy) rather than the stream.
    pub dlq: bool,
    pub partition_key: String,
    pub data: Bytes,
    /// What Kinesis counts against its limits: data and partition key.
    pub size: usize,
    /// Whether the record has a key of its own, whose order the publisher keeps.
    pub keyed: bool,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    pub headers: Vec<crate::router::Header>,
    pub delivery: Delivery,
}

crate::aws_job!(Job);

/// `k` as a partition key: itself when Kinesis takes it, else `sha256.<32 hex digits>` of it.
pub fn partition_key(k: &[u8]) -> String {
    match std::str::from_utf8(k) {
        // Counted in UTF-16 units: AWS's services count a string's length as Java does, so a key of
        // characters outside the BMP counts double; counting chars could pass a key Kinesis refuses
        // for the whole call.
        Ok(t) if !t.is_empty() && t.encode_utf16().count() <= MAX_KEY_CHARS => t.to_owned(),
        _ => format!("sha256.{}", crate::hex::lower(&Sha256::digest(k)[..16])),
    }
}

/// A dead-letter copy's data: the JSON envelope of the module doc.
pub fn envelope(key: Option<&Bytes>, headers: &[crate::router::Header], payload: Option<&Bytes>) -> Vec<u8> {
    let b64 = |b: Option<&Bytes>| b.map(|b| STANDARD.encode(b));
    let headers: Vec<(&str, String)> = headers.iter().map(|(n, v)| (&**n, STANDARD.encode(v))).collect();
    let v = serde_json::json!({ "key": b64(key), "headers": headers, "payload": b64(payload) });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Build the Kinesis record for `record`, or the rejection that Kinesis can never take it.
pub fn job(record: Record, delivery: Delivery, max_bytes: usize) -> Result<Job, Box<SinkError>> {
    let dlq = delivery.is_dead_letter();
    let (partition_key, data) = if dlq {
        let data = envelope(record.key.as_ref(), &record.headers, record.payload.as_ref());
        (partition_key(record.event_id.as_bytes()), Bytes::from(data))
    } else {
        let pk = match record.key.as_ref().filter(|k| !k.is_empty()) {
            Some(k) => partition_key(k),
            None => partition_key(record.event_id.as_bytes()),
        };
        (pk, record.payload.clone().unwrap_or_default())
    };
    let size = data.len() + partition_key.len();
    if size > max_bytes {
        let reason =
            format!("record of {size} bytes (data and partition key) exceeds the stream's limit of {max_bytes} bytes");
        return Err(Box::new(SinkError::Rejected { code: "too_large", reason, record: Box::new(record), delivery }));
    }
    let keyed = !dlq && record.key.as_ref().is_some_and(|k| !k.is_empty());
    let Record { key, payload, headers, .. } = record;
    Ok(Job { dlq, partition_key, data, size, keyed, key, payload, headers, delivery })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_are_the_key_or_its_hash() {
        assert_eq!(partition_key(b"order-1"), "order-1");
        assert_eq!(partition_key("ü".repeat(256).as_bytes()), "ü".repeat(256));
        assert_eq!(partition_key("😀".repeat(128).as_bytes()), "😀".repeat(128));
        assert!(partition_key("😀".repeat(129).as_bytes()).starts_with("sha256."));
        let long = partition_key(&[b'k'; 257]);
        assert!(long.starts_with("sha256.") && long.len() == 39 && partition_key(&[b'k'; 257]) == long);
        assert!(partition_key(&[0xff, 0]).starts_with("sha256."));
        assert!(partition_key(b"").starts_with("sha256."));
    }

    #[test]
    fn an_envelope_carries_any_bytes() {
        let e = envelope(Some(&Bytes::from_static(&[0xff])), &[("a".into(), Bytes::from_static(b"\0"))], None);
        let v: serde_json::Value = serde_json::from_slice(&e).unwrap();
        assert_eq!(v["key"], "/w==");
        assert_eq!(v["headers"][0][1], "AA==");
        assert!(v["payload"].is_null());
    }
}
