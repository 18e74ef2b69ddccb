//! The context of outboxd's Kafka readers (the `dlq` and `shadow` tools, the exactly-once
//! position reader): librdkafka's log lines and client errors as tracing lines, with secret
//! property values scrubbed, and the end of a partition as the normal event it is.
//!
//! The readers run with `enable.partition.eof`, because reaching the end is how they know they
//! are done. librdkafka delivers that end on the consumer's queue (where the reader sees it as
//! `KafkaError::PartitionEOF`) and, after the partition is unassigned or the client closes, on
//! its main queue too, which rdkafka's default context logs as an ERROR ("Global error:
//! PartitionEOF"). Here it is a debug line; every other client error stays an ERROR.

use rdkafka::consumer::{BaseConsumer, ConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;

use super::client;
use super::config::KafkaConfig;

/// A reader's context: the user's properties, to scrub secret values from librdkafka's texts.
pub struct ReaderContext {
    properties: Vec<(String, String)>,
}

/// A streaming reader with [`ReaderContext`].
pub type StreamReader = StreamConsumer<ReaderContext>;
/// A polling reader with [`ReaderContext`].
pub type BaseReader = BaseConsumer<ReaderContext>;

impl ReaderContext {
    pub fn new(cfg: &KafkaConfig) -> ReaderContext {
        ReaderContext { properties: cfg.properties.clone() }
    }
}

/// Whether a client error only says a partition's end was reached.
pub fn is_partition_end(error: &KafkaError) -> bool {
    matches!(error, KafkaError::PartitionEOF(_))
        || matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::PartitionEOF))
}

impl ClientContext for ReaderContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        let message = client::scrub(log_message, &self.properties);
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => tracing::error!(target: "librdkafka", fac, "{message}"),
            L::Warning => tracing::warn!(target: "librdkafka", fac, "{message}"),
            L::Notice | L::Info => tracing::info!(target: "librdkafka", fac, "{message}"),
            L::Debug => tracing::debug!(target: "librdkafka", fac, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let reason = client::scrub(reason, &self.properties);
        if is_partition_end(&error) {
            tracing::debug!(target: "librdkafka", "end of a partition reached: {reason}");
        } else {
            tracing::error!(target: "librdkafka", %error, "{reason}");
        }
    }
}

impl ConsumerContext for ReaderContext {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_partition_end_is_normal() {
        assert!(is_partition_end(&KafkaError::PartitionEOF(3)));
        assert!(is_partition_end(&KafkaError::Global(RDKafkaErrorCode::PartitionEOF)));
        assert!(!is_partition_end(&KafkaError::Global(RDKafkaErrorCode::AllBrokersDown)));
        assert!(!is_partition_end(&KafkaError::MessageConsumption(RDKafkaErrorCode::UnknownTopicOrPartition)));
    }
}
