//! Which of some records are already on their topics, by their `id` header: how a takeover from
//! Debezium (`--debezium-offsets`) decides the changes that share the offset's LSN.
//!
//! A COPY writes a heap page's rows as one WAL record, so dozens of changes share one LSN, and
//! Debezium 3.6.1's offset says only `lsn_proc=<that LSN>`, not how many of them it sent. Its
//! records of them are in Kafka, each with the event id in its `id` header, so the session asks
//! here which ids are already on the topics the records route to.
//!
//! Invariants: an id is reported as written only if a record carrying exactly those header bytes
//! was read from that topic; every partition is read from the broker's answer to
//! `offsets_for_times(since)` up to the end it had when the read began, so nothing written before
//! the read started is missed. A read that cannot finish is an error, never a partial answer.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::client;
use super::config::KafkaConfig;
use super::reader::{is_partition_end, BaseReader, ReaderContext};
use crate::error::Definite;
use crate::router::Record;

/// How long one look-up may take (metadata, time index, reading to the end).
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// What to look for: these ids on these topics, in records stored at or after `since_ms`.
pub struct Wanted {
    pub ids: Vec<(String, Bytes)>,
    pub since_ms: i64,
}

/// How far before the records' own timestamps to start reading: Debezium stamps a record with
/// the time it processed the change (or the event's timestamp column, as outboxd does), and the
/// two hosts' clocks may differ.
const CLOCK_MARGIN_MS: i64 = 10 * 60 * 1000;

impl Wanted {
    /// The `id` header of each record (`None` for one without it) and where to start reading.
    pub fn of(records: &[&Record]) -> Option<Wanted> {
        let ids = records
            .iter()
            .map(|r| r.headers.iter().find(|(k, _)| k == "id").map(|(_, v)| (r.topic.to_string(), v.clone())))
            .collect::<Option<Vec<_>>>()?;
        let oldest = records.iter().filter_map(|r| r.timestamp_ms).min().unwrap_or(0);
        Some(Wanted { ids, since_ms: (oldest - CLOCK_MARGIN_MS).max(0) })
    }
}

/// For each of `wanted.ids`, whether a record with that `id` header is on its topic. Blocking:
/// run it off the runtime's threads.
pub fn written(kafka: &KafkaConfig, wanted: &Wanted) -> Result<Vec<bool>, Definite> {
    let cfg = client::consumer_config(
        kafka,
        "outboxd-takeover",
        &[
            ("group.id", "outboxd-takeover".into()),
            ("enable.auto.commit", "false".into()),
            ("isolation.level", "read_committed".into()),
            ("enable.partition.eof", "true".into()),
        ],
    );
    let consumer: BaseReader = client::create(&cfg, ReaderContext::new(kafka), "takeover reader", kafka)?;
    let fail = |what: String| Definite::Sink(format!("--debezium-offsets: cannot read {what} from {}", kafka.brokers));
    let mut topics: HashMap<&str, HashSet<&[u8]>> = HashMap::new();
    for (t, id) in &wanted.ids {
        topics.entry(t.as_str()).or_default().insert(id.as_ref());
    }
    let started = Instant::now();
    // (topic, partition) -> end offset when the read began.
    let mut ends: HashMap<(String, i32), i64> = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for topic in topics.keys() {
        let md =
            consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).map_err(|e| fail(format!("{topic}: {e}")))?;
        let partitions = md.topics().iter().find(|m| m.name() == *topic).map_or(0, |m| m.partitions().len()) as i32;
        let mut ask = TopicPartitionList::new();
        for p in 0..partitions {
            let (_, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .map_err(|e| fail(format!("the end of {topic}/{p}: {e}")))?;
            ends.insert((topic.to_string(), p), high);
            ask.add_partition_offset(topic, p, Offset::Offset(wanted.since_ms))
                .map_err(|e| Definite::Bug(format!("looking up {topic}/{p}: {e}")))?;
        }
        if partitions == 0 {
            continue;
        }
        let found = consumer
            .offsets_for_times(ask, Duration::from_secs(10))
            .map_err(|e| fail(format!("offsets by time of {topic}: {e}")))?;
        for p in 0..partitions {
            let key = (topic.to_string(), p);
            let start = match found.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) if ends.get(&key).is_some_and(|end| o < *end) => o,
                // No record that new: nothing to read there.
                _ => {
                    ends.remove(&key);
                    continue;
                }
            };
            tpl.add_partition_offset(topic, p, Offset::Offset(start))
                .map_err(|e| Definite::Bug(format!("assigning {topic}/{p}: {e}")))?;
        }
    }
    if ends.is_empty() {
        return Ok(vec![false; wanted.ids.len()]);
    }
    consumer.assign(&tpl).map_err(|e| fail(format!("the topics (assign): {e}")))?;
    let mut seen: HashSet<(String, Vec<u8>)> = HashSet::new();
    loop {
        let done = consumer.position().ok().is_some_and(|pos| {
            ends.iter().all(|((t, p), end)| {
                matches!(pos.find_partition(t, *p).map(|e| e.offset()), Some(Offset::Offset(o)) if o >= *end)
            })
        });
        if done {
            break;
        }
        if started.elapsed() > READ_TIMEOUT {
            return Err(fail(format!(
                "the records of {:?} to their end within {}s",
                topics.keys(),
                READ_TIMEOUT.as_secs()
            )));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let header = m.headers().and_then(|h| h.iter().find(|h| h.key == "id"));
                // A null `id` is Debezium's record of a NULL event id: no held change has one
                // (outboxd makes it a bad event), so it can match nothing and decides nothing.
                if header.as_ref().is_some_and(|h| h.value.is_none()) {
                    continue;
                }
                let Some(id) = header.and_then(|h| h.value) else {
                    return Err(Definite::Setup(format!(
                        "--debezium-offsets: the record at offset {} of {}/{} has no id header, so outboxd cannot tell \
                         which of the changes at the offset's LSN Debezium sent; set the connector's offsets by hand \
                         (or start without the flag and accept duplicates)",
                        m.offset(),
                        m.topic(),
                        m.partition()
                    )));
                };
                if topics.get(m.topic()).is_some_and(|ids| ids.contains(id)) {
                    seen.insert((m.topic().to_owned(), id.to_vec()));
                }
            }
            None => {}
            Some(Err(e)) if is_partition_end(&e) => {}
            Some(Err(e)) => tracing::warn!(error = %e, "reading the connector's topics"),
        }
    }
    Ok(wanted.ids.iter().map(|(t, id)| seen.contains(&(t.clone(), id.to_vec()))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: Option<&str>, ts: Option<i64>) -> Record {
        Record {
            topic: "t".into(),
            key: None,
            payload: None,
            headers: id.map(|i| ("id".into(), Bytes::copy_from_slice(i.as_bytes()))).into_iter().collect(),
            partition: None,
            timestamp_ms: ts,
            event_id: id.unwrap_or("").into(),
            event_type: None,
        }
    }

    #[test]
    fn reads_from_before_the_oldest_timestamp_and_needs_every_id() {
        let (a, b) =
            (record(Some("a"), Some(CLOCK_MARGIN_MS + 5_000)), record(Some("b"), Some(CLOCK_MARGIN_MS + 9_000)));
        let w = Wanted::of(&[&a, &b]).unwrap();
        assert_eq!(w.since_ms, 5_000);
        assert_eq!(w.ids, vec![("t".to_owned(), Bytes::from_static(b"a")), ("t".to_owned(), Bytes::from_static(b"b"))]);
        // Never before the epoch; a record without an id header cannot be matched.
        assert_eq!(Wanted::of(&[&record(Some("a"), Some(1))]).unwrap().since_ms, 0);
        assert!(Wanted::of(&[&a, &record(None, Some(1))]).is_none());
    }
}
