//! The inbox's bad records, copied to the Kafka dead-letter topic (`--dlq-topic`) in the model
//! every writer and reader shares ([`crate::sink::dead_letter`]), so `outboxd dlq list` and
//! `replay` read them: the original key, payload and headers, `outboxd.error` (the reason code),
//! `outboxd.error.message`, `outboxd.original.topic`, and where it was read:
//! `outboxd.source.table` = `TOPIC/PARTITION`, `outboxd.source.seq` = the record's offset.
//!
//! Invariant: a copy is acked by Kafka before the offset that passes its record over is stored,
//! so a crash in between dead-letters the record again (a second copy) rather than losing it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::record::{Bad, Received};
use crate::config::KafkaConfig;
use crate::error::{Definite, Error, Transient};
use crate::sink::dead_letter::DeadLetter;
use crate::sink::delivery::{Position, Source};
use crate::sink::kafka::client;

/// Largest dead-letter record; a larger copy is chunked (Kafka's default `message.max.bytes`).
const MAX_BYTES: usize = 1_000_000;

/// The dead-letter producer.
pub struct DeadLetters {
    producer: FutureProducer,
    topic: String,
}

impl DeadLetters {
    pub fn new(kafka: &KafkaConfig, topic: &str) -> Result<DeadLetters, Definite> {
        let defaults =
            [("enable.idempotence", "true".to_owned()), ("acks", "all".into()), ("message.timeout.ms", "60000".into())];
        let c = client::producer_config(kafka, "outboxd-inbox-dlq", &defaults);
        let producer = client::create(&c, DefaultClientContext, "producer", kafka)?;
        Ok(DeadLetters { producer, topic: topic.to_owned() })
    }

    /// Send the copy of `r` with `bad`'s reason and wait for Kafka's ack. A failure is transient:
    /// the writer sends this copy again (only this one), and the offset does not move past it
    /// meanwhile.
    pub async fn send(&self, r: &Received, bad: &Bad) -> Result<(), Error> {
        let headers =
            r.headers.iter().map(|(k, v)| (k.clone().into(), Bytes::from(v.clone().unwrap_or_default()))).collect();
        let copy = DeadLetter {
            event_id: None,
            code: bad.reason,
            message: bad.message.clone(),
            original_topic: Some(r.topic.clone()),
            key: r.key.clone().map(Bytes::from),
            payload: r.payload.clone().map(Bytes::from),
            headers,
            source: Source {
                position: Position::Seq(r.offset),
                table: Arc::from(format!("{}/{}", r.topic, r.partition)),
            },
        };
        for rec in copy.into_records(&self.topic, MAX_BYTES) {
            let mut hs = OwnedHeaders::new_with_capacity(rec.headers.len());
            for (k, v) in &rec.headers {
                hs = hs.insert(Header { key: k, value: Some(v.as_ref()) });
            }
            let mut fr: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&rec.topic).headers(hs);
            if let Some(k) = &rec.key {
                fr = fr.key(k.as_ref());
            }
            if let Some(p) = &rec.payload {
                fr = fr.payload(p.as_ref());
            }
            if let Some(p) = rec.partition {
                fr = fr.partition(p);
            }
            self.producer.send(fr, Duration::from_secs(30)).await.map_err(|(e, _)| {
                Error::Transient(Transient::DeadLetter {
                    reason: format!("the dead-letter copy of {} to {} failed: {e}", r.position(), self.topic),
                })
            })?;
        }
        tracing::warn!(reason = bad.reason, dlq_topic = %self.topic, "bad record dead-lettered: {}", bad.message);
        Ok(())
    }
}
