//! Handing one record to librdkafka through a topic handle kept per topic ([`TopicHandle`]).
//!
//! rdkafka's `BaseProducer::send` names the topic by a `CString` made per record, and librdkafka's
//! `rd_kafka_producev` then looks the name up in its topic list under the client's lock and takes
//! and drops a reference per record; its headers are built through `OwnedHeaders`' by-value
//! builder. Here the sink keeps librdkafka's topic object (`rd_kafka_topic_t`) per known topic, beside
//! its entry in the known-topic cache, and produces with `RD_KAFKA_V_RKT`, the headers added straight
//! to librdkafka's list. What librdkafka does with the record is the same: the same default topic
//! configuration (no per-topic one is given, as `producev` with a name gives none), `F_COPY` of key,
//! value and headers, the opaque handed to the delivery report (a [`super::sent::Slot`] of the
//! client's [`super::sent::InFlight`]).
//!
//! # Invariants
//! * A [`TopicHandle`] holds a reference to the producer, so the client outlives every topic object
//!   taken from it; dropping the handle releases exactly the reference `rd_kafka_topic_new` gave.
//! * [`produce`] leaves the [`Sent`] in flight only on success; on an error it comes back (as
//!   `BaseProducer::send` gives its record back), and the header list librdkafka did not take is
//!   destroyed here.

use std::ffi::{c_void, CString};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdkafka::bindings as rd;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{BaseProducer, Producer};

use super::events::DeliveryContext;
use super::sent::Sent;
use rdkafka::util::IntoOpaque;

/// librdkafka's object for one topic, taken once per topic the sink produces to.
pub struct TopicHandle {
    rkt: NonNull<rd::rd_kafka_topic_t>,
    /// Keeps the client alive for as long as the topic object.
    producer: Arc<BaseProducer<DeliveryContext>>,
}

// SAFETY: librdkafka's topic objects are reference counted and may be used and released from any
// thread (the library's own threads share them).
unsafe impl Send for TopicHandle {}
// SAFETY: as above; produce calls through a shared handle are thread-safe in librdkafka.
unsafe impl Sync for TopicHandle {}

impl std::fmt::Debug for TopicHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TopicHandle")
    }
}

/// Why there is no [`TopicHandle`] for a topic.
#[derive(Debug, PartialEq, Eq)]
pub enum NoHandle {
    /// The name cannot be a C string (a NUL byte): a fact about the record, a bad event.
    Name(String),
    /// librdkafka gave no object for a valid name: the client's failure, not the record's.
    Client(String),
}

impl TopicHandle {
    /// librdkafka's object for `topic`, or why there is none.
    pub fn new(producer: &Arc<BaseProducer<DeliveryContext>>, topic: &str) -> Result<TopicHandle, NoHandle> {
        let name =
            CString::new(topic).map_err(|_| NoHandle::Name(format!("topic name {topic:?} contains a NUL byte")))?;
        // SAFETY: the client pointer is valid while `producer` lives (kept in the handle); a null
        // configuration means the client's default topic configuration, which librdkafka copies.
        let rkt = unsafe { rd::rd_kafka_topic_new(producer.client().native_ptr(), name.as_ptr(), ptr::null_mut()) };
        match NonNull::new(rkt) {
            Some(rkt) => Ok(TopicHandle { rkt, producer: producer.clone() }),
            None => {
                // SAFETY: reads the calling thread's last error, which `rd_kafka_topic_new` set.
                let code = RDKafkaErrorCode::from(unsafe { rd::rd_kafka_last_error() });
                Err(NoHandle::Client(format!("librdkafka gave no topic object for topic {topic:?}: {code}")))
            }
        }
    }
}

impl Drop for TopicHandle {
    fn drop(&mut self) {
        // SAFETY: the reference taken in `new`, released once; the client is still alive.
        unsafe { rd::rd_kafka_topic_destroy(self.rkt.as_ptr()) }
    }
}

/// One record's parts, borrowed from the [`crate::router::Record`].
pub struct Parts<'a> {
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub headers: &'a [crate::router::Header],
    pub partition: Option<i32>,
    /// librdkafka's timestamp (0: stamp it with the send time).
    pub timestamp: i64,
}

fn raw(b: Option<&[u8]>) -> (*mut c_void, usize) {
    match b {
        Some(b) => (b.as_ptr() as *mut c_void, b.len()),
        None => (ptr::null_mut(), 0),
    }
}

/// Hand the record to `producer` on `topic`'s handle. On an error `sent` comes back unsent (none
/// only should the in-flight slab have lost it: a bug the caller reports).
///
/// The producer is named by the caller, not taken from the handle: a topic object belongs to the
/// client it was taken from, and a handle kept past a new producer (the sink rebuilt, with its
/// cache) would otherwise send on the old client without a word. Checked in debug builds.
#[allow(clippy::result_large_err)]
pub fn produce(
    producer: &Arc<BaseProducer<DeliveryContext>>,
    topic: &TopicHandle,
    parts: &Parts<'_>,
    sent: Sent,
) -> Result<(), (RDKafkaErrorCode, Option<Sent>)> {
    use rd::rd_kafka_vtype_t::*;
    debug_assert!(Arc::ptr_eq(producer, &topic.producer), "a topic handle of another producer");
    // SAFETY: a new, empty list owned here until librdkafka takes it.
    let headers = unsafe { rd::rd_kafka_headers_new(parts.headers.len()) };
    for (name, value) in parts.headers {
        // SAFETY: `headers` is valid; librdkafka copies the name and the value (sizes given, so
        // neither needs a terminating NUL).
        unsafe {
            rd::rd_kafka_header_add(
                headers,
                name.as_ptr() as *const std::ffi::c_char,
                name.len() as isize,
                value.as_ptr() as *const c_void,
                value.len() as isize,
            );
        }
    }
    let (payload, payload_len) = raw(parts.payload);
    let (key, key_len) = raw(parts.key);
    let in_flight = &producer.context().in_flight;
    let slot = in_flight.put(sent);
    // SAFETY: the arguments are those `BaseProducer::send` passes, with the topic object in place of
    // its name; `F_COPY` makes librdkafka copy key and value before returning; the pointers are
    // valid for the call.
    let err = unsafe {
        rd::rd_kafka_producev(
            producer.client().native_ptr(),
            RD_KAFKA_VTYPE_RKT,
            topic.rkt.as_ptr(),
            RD_KAFKA_VTYPE_PARTITION,
            parts.partition.unwrap_or(-1),
            RD_KAFKA_VTYPE_MSGFLAGS,
            rd::RD_KAFKA_MSG_F_COPY,
            RD_KAFKA_VTYPE_VALUE,
            payload,
            payload_len,
            RD_KAFKA_VTYPE_KEY,
            key,
            key_len,
            RD_KAFKA_VTYPE_OPAQUE,
            slot.into_ptr(),
            RD_KAFKA_VTYPE_TIMESTAMP,
            parts.timestamp,
            RD_KAFKA_VTYPE_HEADERS,
            headers,
            RD_KAFKA_VTYPE_END,
        )
    };
    if err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        // librdkafka owns the message and its headers now; its report takes the slot.
        return Ok(());
    }
    // SAFETY: on an error librdkafka did not take the headers: they are still ours.
    unsafe { rd::rd_kafka_headers_destroy(headers) };
    // Nor will a report come: the record is back in our hands.
    Err((err.into(), in_flight.take(slot)))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use rdkafka::config::ClientConfig;

    use super::*;
    use crate::sink::link::Link;

    /// A producer that never connects: topic objects are client-side.
    fn producer() -> Arc<BaseProducer<DeliveryContext>> {
        let health = crate::health::Health::new(std::time::Duration::from_secs(120));
        let context = DeliveryContext {
            link: Link::new("kafka", "Kafka", health),
            properties: Vec::new(),
            acks: AtomicU64::new(0),
            txn: None,
            in_flight: Default::default(),
        };
        let producer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create_with_context(context)
            .expect("a producer");
        Arc::new(producer)
    }

    /// Only a name that cannot be a C string is the record's fault (a bad event); librdkafka
    /// giving no object for a valid name (here: over its 512-byte limit) is the client's.
    #[test]
    fn only_a_nul_byte_in_the_name_is_the_records_fault() {
        let p = producer();
        assert!(TopicHandle::new(&p, "orders").is_ok());
        match TopicHandle::new(&p, "ord\0ers") {
            Err(NoHandle::Name(reason)) => assert!(reason.contains("NUL byte"), "{reason}"),
            other => panic!("expected a bad name, got {other:?}"),
        }
        match TopicHandle::new(&p, &"t".repeat(600)) {
            Err(NoHandle::Client(reason)) => assert!(reason.contains("no topic object"), "{reason}"),
            other => panic!("expected the client's failure, got {other:?}"),
        }
    }
}
