//! One blocking transaction call to librdkafka: what its error means ([`classify`], the one
//! place that decides it), how it is retried, and how it runs off the runtime's thread.
//!
//! # Invariants
//! * Every transaction error is judged by [`classify`] alone: fatal (fenced, or another fatal
//!   producer state), abortable, or retriable; nothing else looks at a transaction error's kind.
//! * A call is retried only while librdkafka says the same call may succeed, and at most 5 times.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// What one blocking transaction call's error means.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Retry,
    Abort,
    Fatal,
}

/// The one place that decides what a transaction error means.
pub(super) fn classify(e: &KafkaError) -> Verdict {
    match e {
        KafkaError::Transaction(t) if t.is_fatal() => Verdict::Fatal,
        KafkaError::Transaction(t) if t.txn_requires_abort() => Verdict::Abort,
        KafkaError::Transaction(t) if t.is_retriable() => Verdict::Retry,
        // The flush before a commit timed out: the records are not all written; abort them.
        KafkaError::Flush(_) => Verdict::Abort,
        _ => match e.rdkafka_error_code() {
            Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch) => Verdict::Fatal,
            _ => Verdict::Abort,
        },
    }
}

/// Whether the producer lost its transactional id to a newer one (fenced).
pub(super) fn is_fenced(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch | RDKafkaErrorCode::Fenced)
    )
}

/// Retry a transaction call while librdkafka says the same call may succeed.
pub(super) fn retrying(mut call: impl FnMut() -> Result<(), KafkaError>) -> Result<(), KafkaError> {
    let mut tries = 0;
    loop {
        match call() {
            Err(e) if classify(&e) == Verdict::Retry && tries < 5 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(200 * tries));
            }
            other => return other,
        }
    }
}

/// A blocking librdkafka call, off the runtime's only thread.
pub(super) async fn blocking(f: impl FnOnce() -> Result<(), KafkaError> + Send + 'static) -> Result<(), KafkaError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "a Kafka transaction call's task failed");
            Err(KafkaError::Canceled)
        }
    }
}
