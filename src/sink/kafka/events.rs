//! librdkafka's delivery reports: what each one means ([`DeliveryContext`]: an ack, a record the
//! broker condemned, or a failure, and the broker's health), served on the runtime's own thread.
//!
//! librdkafka puts delivery reports (and client errors and log lines) on its main queue. rdkafka's
//! `ThreadedProducer` serves that queue from a thread of its own, which costs a thread wake-up per
//! batch of reports plus a cross-thread hand-off of every ack to the replication loop. Instead, the
//! queue signals one end of a socket pair whenever it turns non-empty
//! (`rd_kafka_queue_io_event_enable`), and a task on the runtime waits for the other end and serves
//! the queue. Delivery callbacks so run on the thread that runs the replication loop, in batches of
//! one broker response each.
//!
//! The pump serves the queue with librdkafka's own calls ([`serve_one`]) rather than rdkafka's
//! `BaseProducer::poll`, which builds a message vector, a reference-counted event and a borrowed
//! message and delivery result per report. Each event type is handled as rdkafka handles it, through
//! the same [`DeliveryContext`] callbacks (`error`, `log`, `stats_raw`, the delivery outcome), except
//! that a client error is reported once (rdkafka's producer poll reports it twice). Reports served by
//! rdkafka itself (the producer's `flush` and drop) go through [`DeliveryContext::report`] too.
//!
//! # Invariants
//! * The socket is drained before the queue is served, and the queue is served until it is empty
//!   before the next wait: a report enqueued after the last look leaves a byte behind, so no report
//!   waits for a wake-up that already happened.
//! * The queue is served once before the first wait (events queued while the client was being
//!   built never signal).
//! * librdkafka never writes to a closed descriptor: [`Pump`]'s drop turns the signal off before
//!   the socket closes, and drops the queue handle it took.
//! * At most [`SERVE_BATCH`] events are served before the task yields, so a flood of reports cannot
//!   starve the replication loop's other work.
//! * Every delivery report takes its record's [`Sent`] out of [`InFlight`] (once: a second report
//!   of a slot finds nothing, a bug that ends the session with a panic naming the record), and the event is destroyed only after all its messages were served
//!   (their key, value and headers are borrowed from it).

use std::ffi::{c_void, CStr};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream as StdStream;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use rdkafka::bindings as rd;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::util::IntoOpaque;
use rdkafka::ClientContext;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

use super::client;
use super::sent::{InFlight, Sent, Slot};
use crate::sink::link::Link;

/// Which broker errors condemn one record rather than the pipeline.
pub(super) fn rejection_code(e: &KafkaError) -> Option<&'static str> {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code()? {
        C::MessageSizeTooLarge | C::MessageBatchTooLarge | C::InvalidMessageSize => Some("too_large"),
        C::InvalidTopic => Some("invalid_topic"),
        C::PolicyViolation => Some("policy_violation"),
        C::InvalidRecord | C::InvalidMessage => Some("rejected"),
        // A `:partition` placement at or above the topic's partition count.
        C::UnknownPartition => Some("unknown_partition"),
        // A timestamp outside the broker's `message.timestamp.difference.max.ms` window.
        C::InvalidTimestamp => Some("invalid_timestamp"),
        // An ACL denies this one topic; other topics may still be fine.
        C::TopicAuthorizationFailed => Some("topic_authorization_failed"),
        _ => None,
    }
}

/// Resolves delivery handles from librdkafka's delivery reports, and tracks broker health.
pub struct DeliveryContext {
    /// Kafka's reachability as `/readyz`, the metrics and the log show it.
    pub(super) link: Link,
    /// The user's properties, to scrub secret values from librdkafka's error texts.
    pub(super) properties: Vec<(String, String)>,
    /// Successful deliveries so far: the health thread reads progress from it (no clock read on
    /// the per-record path).
    pub(super) acks: AtomicU64,
    /// `--delivery exactly-once`: reports are held here until the transaction commits.
    pub(super) txn: Option<Arc<super::written::Written>>,
    /// What each record librdkafka holds carries to its delivery report (its opaque is the slot).
    pub(super) in_flight: InFlight,
}

impl Drop for DeliveryContext {
    /// Records still in flight when the client goes away are not delivered: their handles fail
    /// on drop, except in a transaction, whose handles are disarmed (the next session sends the
    /// aborted transaction's records again; super::txn's invariant).
    fn drop(&mut self) {
        if self.txn.is_some() {
            for sent in self.in_flight.drain() {
                sent.disarm();
            }
        }
    }
}

impl DeliveryContext {
    pub(super) fn kafka_up(&self, up: bool, reason: &str) {
        self.link.set(up, reason);
    }
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => tracing::error!(target: "librdkafka", fac, "{log_message}"),
            L::Warning => tracing::warn!(target: "librdkafka", fac, "{log_message}"),
            L::Notice | L::Info => tracing::info!(target: "librdkafka", fac, "{log_message}"),
            L::Debug => tracing::debug!(target: "librdkafka", fac, "{log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::AllBrokersDown)) {
            self.kafka_up(false, "all brokers down");
        }
        let reason = client::scrub(reason, &self.properties);
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }
}

impl DeliveryContext {
    /// Resolve one message of a delivery report: `msg` is librdkafka's message, `slot` the opaque
    /// it carried.
    ///
    /// Only a failure reads more than the error code: the rejection path copies the key, the
    /// value and the headers the dead-letter copy needs.
    fn report(&self, msg: &rd::rd_kafka_message_t, slot: Slot) {
        let Some(sent) = self.in_flight.take(slot) else {
            // Every record the sink produces carries its slot, reported once: a bug, not a
            // record's fault. Loud, not a log line: a record never resolved would hold its
            // transaction's LSN back for good without a word. The pump's panic ends the session
            // (crate::task), and the next one sends again from the confirmed position.
            let topic = if msg.rkt.is_null() {
                String::from("?")
            } else {
                // SAFETY: `rkt` is the message's topic, valid while the event that holds `msg` is.
                unsafe { c_text(rd::rd_kafka_topic_name(msg.rkt)) }.to_string()
            };
            panic!(
                "a Kafka delivery report without its handle (topic {topic:?}, partition {}, error {:?}): \
                 the record cannot be resolved",
                msg.partition, msg.err
            );
        };
        if msg.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            self.acks.fetch_add(1, Ordering::Relaxed);
            if !self.link.is_up() {
                self.kafka_up(true, "");
            }
            match &self.txn {
                Some(held) => held.acked(sent),
                None => sent.ack(),
            }
            return;
        }
        // The same error value (and so the same text) rdkafka's own delivery result carries.
        let e = KafkaError::MessageProduction(msg.err.into());
        match &self.txn {
            // In a transaction, any failure aborts it: the next session sends the records again.
            Some(held) => held.failed(sent, client::scrub(&e.to_string(), &self.properties), rejection_code(&e)),
            // Outside a transaction only events are produced: a position record has no handle.
            None => {
                let Sent::Record(delivery) = sent else { return };
                match rejection_code(&e) {
                    Some(code) => {
                        // SAFETY: `msg` is a valid message of a live delivery report; the
                        // pointers and lengths it holds stay valid for the call (copied here).
                        let (key, payload, headers) = unsafe {
                            (
                                borrowed(msg.key as *const u8, msg.key_len).map(Bytes::copy_from_slice),
                                borrowed(msg.payload as *const u8, msg.len).map(Bytes::copy_from_slice),
                                headers_of(msg),
                            )
                        };
                        delivery.reject(code, e.to_string(), key, payload, headers)
                    }
                    None => delivery.fail(e.to_string()),
                }
            }
        }
    }
}

/// `len` bytes at `ptr`, or none for a null pointer.
///
/// # Safety
/// A non-null `ptr` must point to `len` readable bytes that outlive the returned slice.
unsafe fn borrowed<'a>(ptr: *const u8, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: the caller's promise.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }
}

/// A copy of the message's headers, in order (a header without a value has an empty one).
///
/// # Safety
/// `msg` must be a valid message of a live delivery report.
unsafe fn headers_of(msg: &rd::rd_kafka_message_t) -> Vec<crate::router::Header> {
    let mut hdrs: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `msg` is valid (the caller's promise); the list stays the message's.
    if unsafe { rd::rd_kafka_message_headers(msg, &mut hdrs) } != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        || hdrs.is_null()
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    for idx in 0.. {
        let (mut name, mut value, mut size) = (std::ptr::null(), std::ptr::null(), 0usize);
        // SAFETY: `hdrs` is the message's live list; out of range gives an error, not a read.
        let err = unsafe { rd::rd_kafka_header_get_all(hdrs, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            break;
        }
        // SAFETY: librdkafka's header names are NUL-terminated; the value is `size` bytes or null.
        let (name, value) = unsafe { (CStr::from_ptr(name), borrowed(value as *const u8, size)) };
        out.push((name.to_string_lossy().into_owned().into(), Bytes::copy_from_slice(value.unwrap_or_default())));
    }
    out
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Slot;

    /// Reports served by rdkafka's own `poll` (the producer's `flush`, and its drop) take the
    /// same way as the pump's.
    fn delivery(&self, result: &DeliveryResult<'_>, slot: Slot) {
        let msg = match result {
            Ok(m) | Err((_, m)) => m.ptr(),
        };
        // SAFETY: the borrowed message is valid for as long as `result` is.
        self.report(unsafe { &*msg }, slot)
    }
}

/// One event taken off the queue, destroyed when dropped.
struct Event(*mut rd::rd_kafka_event_t);

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event `rd_kafka_queue_poll` returned, destroyed once, after every message
        // borrowed from it was served.
        unsafe { rd::rd_kafka_event_destroy(self.0) }
    }
}

/// Serve one event of `queue`, if there is one: a delivery report's every message, a client
/// error, a log line, statistics, as rdkafka's `BaseProducer::poll` (and its client's event poll)
/// serves them through the same [`DeliveryContext`].
fn serve_one(queue: *mut rd::rd_kafka_queue_t, context: &DeliveryContext) {
    // SAFETY: `queue` is valid (the pump's); a zero timeout does not block.
    let ev = unsafe { rd::rd_kafka_queue_poll(queue, 0) };
    if ev.is_null() {
        return;
    }
    let ev = Event(ev);
    // SAFETY (for each call below): `ev.0` is a live event until `ev` drops at the end of this
    // function; the strings and messages read from it are used before then.
    match unsafe { rd::rd_kafka_event_type(ev.0) } {
        rd::RD_KAFKA_EVENT_DR => loop {
            let msg = unsafe { rd::rd_kafka_event_message_next(ev.0) };
            if msg.is_null() {
                break;
            }
            let msg = unsafe { &*msg };
            // SAFETY: every record of this client carries a `Slot` made by `into_ptr`.
            let slot = unsafe { Slot::from_ptr(msg._private) };
            context.report(msg, slot);
        },
        rd::RD_KAFKA_EVENT_ERROR => {
            let code = unsafe { rd::rd_kafka_event_error(ev.0) };
            let reason = unsafe { c_text(rd::rd_kafka_event_error_string(ev.0)) };
            context.error(KafkaError::Global(code.into()), reason.trim());
        }
        rd::RD_KAFKA_EVENT_LOG => {
            let (mut fac, mut text, mut level) = (std::ptr::null(), std::ptr::null(), 0);
            if unsafe { rd::rd_kafka_event_log(ev.0, &mut fac, &mut text, &mut level) } == 0 {
                let (fac, text) = unsafe { (c_text(fac), c_text(text)) };
                context.log(log_level(level), fac.trim(), text.trim());
            }
        }
        rd::RD_KAFKA_EVENT_STATS => {
            let json = unsafe { rd::rd_kafka_event_stats(ev.0) };
            if !json.is_null() {
                context.stats_raw(unsafe { CStr::from_ptr(json) }.to_bytes());
            }
        }
        // The context refreshes no OAuth token itself (librdkafka's own OIDC flow does, if set):
        // rdkafka consumes the event without a word, and so does the pump.
        rd::RD_KAFKA_EVENT_OAUTHBEARER_TOKEN_REFRESH => {
            // Should the context ever refresh tokens itself, this arm must call it.
            const _: () = assert!(!<DeliveryContext as ClientContext>::ENABLE_REFRESH_OAUTH_TOKEN);
        }
        _ => {
            let name = unsafe { c_text(rd::rd_kafka_event_name(ev.0)) };
            tracing::warn!(target: "librdkafka", "ignored event '{name}' on the producer's main queue");
        }
    }
}

/// librdkafka's text, or none for a null pointer.
///
/// # Safety
/// A non-null `p` must be a NUL-terminated string that outlives the returned text.
unsafe fn c_text<'a>(p: *const std::ffi::c_char) -> std::borrow::Cow<'a, str> {
    if p.is_null() {
        std::borrow::Cow::Borrowed("")
    } else {
        // SAFETY: the caller's promise.
        unsafe { CStr::from_ptr(p) }.to_string_lossy()
    }
}

/// librdkafka's syslog level as rdkafka names it.
fn log_level(level: i32) -> rdkafka::config::RDKafkaLogLevel {
    use rdkafka::config::RDKafkaLogLevel as L;
    match level {
        0 => L::Emerg,
        1 => L::Alert,
        2 => L::Critical,
        3 => L::Error,
        4 => L::Warning,
        5 => L::Notice,
        6 => L::Info,
        _ => L::Debug,
    }
}

/// Events served between two yields to the runtime.
const SERVE_BATCH: usize = 64;

/// The main queue's signal, and the handle kept on the queue while it is on.
struct Pump {
    queue: *mut rd::rd_kafka_queue_t,
    /// librdkafka writes here; kept open for as long as the signal is on.
    _writer: StdStream,
    reader: UnixStream,
    producer: Arc<BaseProducer<DeliveryContext>>,
}

// SAFETY: the queue handle is librdkafka's reference-counted, thread-safe queue object; the pump
// only passes it to librdkafka calls, which may be made from any thread.
unsafe impl Send for Pump {}

impl Pump {
    fn new(producer: Arc<BaseProducer<DeliveryContext>>) -> io::Result<Pump> {
        let (reader, writer) = StdStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        let reader = UnixStream::from_std(reader)?;
        // SAFETY: the client pointer is valid while `producer` lives, which the pump keeps; the
        // returned queue reference is released in `drop`.
        let queue = unsafe { rd::rd_kafka_queue_get_main(producer.client().native_ptr()) };
        if queue.is_null() {
            return Err(io::Error::other("librdkafka returned no main queue"));
        }
        const SIGNAL: &[u8] = b"!";
        // SAFETY: `queue` is valid; librdkafka copies the payload; the descriptor stays open until
        // `drop` has turned the signal off.
        unsafe { rd::rd_kafka_queue_io_event_enable(queue, writer.as_raw_fd(), SIGNAL.as_ptr() as *const c_void, 1) };
        Ok(Pump { queue, _writer: writer, reader, producer })
    }

    fn queued(&self) -> usize {
        // SAFETY: `queue` is valid until `drop`.
        unsafe { rd::rd_kafka_queue_length(self.queue) }
    }

    /// Read every pending signal byte. False once the socket is closed or broken.
    fn drain_signal(&self) -> bool {
        let mut buf = [0u8; 256];
        loop {
            match self.reader.try_read(&mut buf) {
                Ok(0) => return false,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }

    async fn run(self) {
        loop {
            let (mut served, mut idle) = (0usize, 0usize);
            loop {
                let before = self.queued();
                if before == 0 {
                    break;
                }
                // One event per call: a delivery-report event carries every message of one
                // broker response.
                serve_one(self.queue, self.producer.context());
                served += 1;
                // The length counts every op on the queue; should some op not come out of a
                // poll, back off rather than spin.
                idle = if self.queued() >= before { idle + 1 } else { 0 };
                if idle >= SERVE_BATCH {
                    idle = 0;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                } else if served % SERVE_BATCH == 0 {
                    tokio::task::yield_now().await;
                }
            }
            if self.reader.readable().await.is_err() || !self.drain_signal() {
                // The task ends; the sink's `failed` turns that into the session's error.
                tracing::error!("the Kafka delivery-report signal broke; deliveries are no longer resolved");
                return;
            }
        }
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        // SAFETY: `queue` is valid; -1 turns the signal off before `_writer` closes; the reference
        // taken in `new` is released exactly once.
        unsafe {
            rd::rd_kafka_queue_io_event_enable(self.queue, -1, std::ptr::null(), 0);
            rd::rd_kafka_queue_destroy(self.queue);
        }
    }
}

/// Serve `producer`'s delivery reports from a task on the current runtime until the task is
/// aborted. The task ends by itself only if the signal breaks; its owner must treat that (and a
/// panic) as fatal: [`crate::task`].
pub fn spawn(producer: Arc<BaseProducer<DeliveryContext>>) -> io::Result<JoinHandle<()>> {
    let pump = Pump::new(producer)?;
    Ok(tokio::spawn(async move {
        if crate::task::fault("kafka-reports") {
            panic!("fault injected by OUTBOXD_FAULT_END_TASK");
        }
        pump.run().await
    }))
}
