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

use std::ffi::c_void;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream as StdStream;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use rdkafka::bindings as rd;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

use super::client;
use super::sent::Sent;
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

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<Sent>;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Box<Sent>) {
        match result {
            Ok(_) => {
                self.acks.fetch_add(1, Ordering::Relaxed);
                if !self.link.is_up() {
                    self.kafka_up(true, "");
                }
                match &self.txn {
                    Some(held) => held.acked(*sent),
                    None => sent.ack(),
                }
            }
            // In a transaction, any failure aborts it: the next session sends the records again.
            Err((e, _)) if self.txn.is_some() => {
                if let Some(held) = &self.txn {
                    held.failed(*sent, client::scrub(&e.to_string(), &self.properties), rejection_code(e));
                }
            }
            // Outside a transaction only events are produced: a position record has no handle.
            Err((e, msg)) => {
                let Sent::Record(delivery) = *sent else { return };
                match rejection_code(e) {
                    Some(code) => {
                        let headers = msg
                            .headers()
                            .map(|hs| {
                                hs.iter()
                                    .map(|h| (h.key.to_owned(), Bytes::copy_from_slice(h.value.unwrap_or_default())))
                                    .collect()
                            })
                            .unwrap_or_default();
                        delivery.reject(
                            code,
                            e.to_string(),
                            msg.key().map(Bytes::copy_from_slice),
                            msg.payload().map(Bytes::copy_from_slice),
                            headers,
                        )
                    }
                    None => delivery.fail(e.to_string()),
                }
            }
        }
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
                // One event per call (a zero timeout): a delivery-report event carries every
                // message of one broker response.
                self.producer.poll(Duration::ZERO);
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
