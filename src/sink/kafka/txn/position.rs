//! Outboxd's position in the position topic (`--position-topic`): the record each Kafka
//! transaction carries ([`StoredPosition`], in the shape of a Debezium offset, stamped with the WAL
//! history it was written on), and reading the last committed one back at start
//! ([`read_position`]).
//!
//! # Invariants
//! * The position is read with `read_committed` up to the end of every partition: a position of
//!   an aborted transaction is never seen, and the last committed one wins.
//! * A record under our key that does not parse as a position is a definite error naming the
//!   topic and the fix; a tombstone clears the position (nothing is skipped).

use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::debezium_offset::{DebeziumOffset, Partial};
use crate::error::{Definite, Error, Transient};
use crate::lineage::{Stamp, Stored};
use crate::lsn::Lsn;
use crate::sink::kafka::client;
use crate::sink::kafka::config::{KafkaConfig, TxnConfig};

/// How long reading the committed position may wait (other writers' open transactions hold the
/// read back until they end, at most their transaction timeout).
const POSITION_READ_TIMEOUT: Duration = Duration::from_secs(150);

/// The position record's value.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(super) struct StoredPosition {
    /// Transactions whose commit record starts before this were delivered whole.
    lsn_commit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    xid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lsn_proc: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    events_at_proc: Option<u64>,
    /// The timeline the LSNs are on; absent in positions of an outboxd before it was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeline: Option<u32>,
    /// Where that timeline began (its switch point; `0/0` for timeline 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeline_began: Option<String>,
}

impl StoredPosition {
    pub(super) fn of(o: &DebeziumOffset, stamp: Option<Stamp>) -> StoredPosition {
        StoredPosition {
            lsn_commit: o.lsn_commit.to_string(),
            xid: o.partial.map(|p| p.xid),
            lsn_proc: o.partial.map(|p| p.lsn_proc.to_string()),
            events_at_proc: o.partial.map(|p| p.events_at_proc),
            timeline: stamp.map(|s| s.timeline),
            timeline_began: stamp.and_then(|s| s.begins).map(|l| l.to_string()),
        }
    }

    pub(super) fn stored(&self) -> Option<Stored> {
        let lsn_commit = self.lsn_commit.parse::<Lsn>().ok()?;
        let partial = match (self.xid, self.lsn_proc.as_deref(), self.events_at_proc) {
            (Some(xid), Some(p), Some(n)) => Some(Partial { xid, lsn_proc: p.parse().ok()?, events_at_proc: n }),
            _ => None,
        };
        let begins = match self.timeline_began.as_deref() {
            Some(l) => Some(l.parse::<Lsn>().ok()?),
            None => None,
        };
        let stamp = self.timeline.map(|timeline| Stamp { timeline, begins });
        Some(Stored { offset: DebeziumOffset { lsn_commit, partial }, stamp })
    }
}

/// The position topic: compacted, one partition (a record per slot), the brokers' replication.
/// Not allowed to create it: it may exist; the position read says if it does not.
pub(super) async fn ensure_position_topic(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    kafka: &KafkaConfig,
) -> Result<(), Error> {
    let compact = [("cleanup.policy", "compact")];
    match client::ensure_topic_with(admin, topic, 1, -1, &compact, client::Retry::Forever, &kafka.properties).await {
        Ok(_) | Err(client::TopicError { refused: Some("topic_authorization_failed"), .. }) => Ok(()),
        Err(e) => Err(e.error.into()),
    }
}

/// The last committed position for our key, read with `read_committed` up to the end.
pub(super) fn read_position(kafka: &KafkaConfig, t: &TxnConfig) -> Result<Option<Stored>, Error> {
    let cfg = client::consumer_config(
        kafka,
        "outboxd-position",
        &[
            ("group.id", format!("outboxd-position-{}", t.key())),
            ("enable.auto.commit", "false".into()),
            ("isolation.level", "read_committed".into()),
            ("enable.partition.eof", "true".into()),
        ],
    );
    let consumer: crate::sink::kafka::reader::BaseReader =
        client::create(&cfg, crate::sink::kafka::reader::ReaderContext::new(kafka), "position reader", kafka)?;
    let (topic, key) = (&t.position_topic, t.key());
    let unreadable = |what: String| -> Error {
        Transient::TxnAborted { reason: format!("cannot read the position topic {topic:?}: {what}") }.into()
    };
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).map_err(|e| unreadable(e.to_string()))?;
    let partitions = md.topics().iter().find(|m| m.name() == topic).map_or(0, |m| m.partitions().len()) as i32;
    if partitions == 0 {
        return Err(unreadable("it has no partitions (does it exist?)".into()));
    }
    let mut ends = Vec::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (_, high) =
            consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).map_err(|e| unreadable(e.to_string()))?;
        ends.push(high);
        tpl.add_partition_offset(topic, p, Offset::Beginning).map_err(|e| unreadable(e.to_string()))?;
    }
    consumer.assign(&tpl).map_err(|e| unreadable(e.to_string()))?;
    let mut latest: Option<Stored> = None;
    let started = Instant::now();
    loop {
        let done = consumer.position().ok().is_some_and(|pos| {
            (0..partitions).all(|p| {
                let end = ends[p as usize];
                end == 0
                    || matches!(pos.find_partition(topic, p).map(|e| e.offset()), Some(Offset::Offset(o)) if o >= end)
            })
        });
        if done {
            return Ok(latest);
        }
        if started.elapsed() > POSITION_READ_TIMEOUT {
            return Err(unreadable(format!(
                "its end was not reached in {}s (an open transaction of another writer?)",
                POSITION_READ_TIMEOUT.as_secs()
            )));
        }
        match consumer.poll(Duration::from_millis(100)) {
            // A tombstone: the operator removed the position (after a restore outboxd cannot
            // recognise, see the guarantees chapter); nothing is skipped.
            Some(Ok(m)) if m.key() == Some(key.as_bytes()) && m.payload().is_none() => latest = None,
            Some(Ok(m)) if m.key() == Some(key.as_bytes()) => {
                let parsed = m.payload().and_then(|v| serde_json::from_slice::<StoredPosition>(v).ok());
                match parsed.and_then(|s| s.stored()) {
                    Some(o) => latest = Some(o),
                    None => {
                        return Err(Definite::Sink(format!(
                            "the position record for {:?} in {topic:?} at offset {} is not outboxd's; use another --position-topic",
                            key,
                            m.offset()
                        ))
                        .into())
                    }
                }
            }
            Some(Ok(_)) | None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => tracing::warn!(error = %e, "reading the position topic"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_position_round_trips_with_its_history_and_reads_an_unstamped_one() {
        let stamp = Some(Stamp { timeline: 2, begins: Some(Lsn(0x3000028)) });
        for o in [
            DebeziumOffset { lsn_commit: Lsn(0x1_0000_0010), partial: None },
            DebeziumOffset {
                lsn_commit: Lsn(5),
                partial: Some(Partial { xid: 3, lsn_proc: Lsn(4), events_at_proc: 2 }),
            },
        ] {
            let json = serde_json::to_vec(&StoredPosition::of(&o, stamp)).unwrap();
            let back: StoredPosition = serde_json::from_slice(&json).unwrap();
            assert_eq!(back.stored(), Some(Stored { offset: o, stamp }));
        }
        // Written by an outboxd that did not stamp positions: read, without a stamp.
        let old: StoredPosition = serde_json::from_str(r#"{"lsn_commit":"0/16B3F40"}"#).unwrap();
        let want = DebeziumOffset { lsn_commit: Lsn(0x16B3F40), partial: None };
        assert_eq!(old.stored(), Some(Stored { offset: want, stamp: None }));
        let json = String::from_utf8(
            serde_json::to_vec(&StoredPosition::of(&DebeziumOffset { lsn_commit: Lsn(1), partial: None }, stamp))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(json, r#"{"lsn_commit":"0/1","timeline":2,"timeline_began":"0/3000028"}"#);
    }
}
