//! Kafka's dead-letter reader: the whole DLQ topic for `outboxd dlq list` and `replay`, every partition from the
//! beginning with `assign()` (no group, no commits), up to the end it had when reading began.
//! `outboxd shadow compare` reads its two topics with the same reader, from a time
//! ([`DlqReader::open_from`]) and, with `--follow`, past the end ([`DlqReader::next_live`]).
//!
//! That end is each partition's high watermark, asked for before the first read. Reading never
//! stops before every partition has reached it (a record at or past it was read, or librdkafka
//! reported the partition's end), however long the broker is silent meanwhile: a broker hiccup
//! only delays the answer. When `--read-timeout` passes without a record or an end report while
//! waiting for one, reading fails and says where each partition stands; it never returns a silently
//! shortened DLQ. The time a caller spends between two [`DlqReader::next`] calls (replay publishing
//! a batch) does not count.
//!
//! After every partition reached its watermark, records are still taken until [`SETTLE`] passes
//! without one, for at most [`GROWTH_CAP`]: tansu's in-memory storage reports the watermark as its
//! last batch's base offset + 1, so the rest of that batch lies past it, and records written
//! meanwhile are welcome too.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, Timestamp, TopicPartitionList};

use crate::error::{Definite, Error};
pub use crate::sink::dead_letter::DlqRecord;
use crate::sink::kafka::reader::StreamReader;

/// After the watermarks: stop when this passes without a record.
pub const SETTLE: Duration = Duration::from_secs(1);
/// After the watermarks: stop after this long however busy the topic is (a DLQ being written to).
pub const GROWTH_CAP: Duration = Duration::from_secs(30);
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

impl DlqRecord {
    fn from_message(m: &BorrowedMessage<'_>) -> DlqRecord {
        let headers = m
            .headers()
            .map(|hs| hs.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        let timestamp_ms = match m.timestamp() {
            Timestamp::CreateTime(t) => Some(t),
            _ => None,
        };
        let time_ms = m.timestamp().to_millis();
        DlqRecord {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            payload_len: m.payload().map(<[u8]>::len),
            headers,
            timestamp_ms,
            time_ms,
            label: None,
            undecoded: Vec::new(),
            moved_later: false,
        }
    }
}

/// Partition count of `topic`, `None` when the broker does not know it.
pub fn partition_count(consumer: &StreamReader, topic: &str, brokers: &str) -> Result<Option<i32>, Definite> {
    let md = consumer.fetch_metadata(Some(topic), METADATA_TIMEOUT).map_err(|e| {
        Definite::Setup(format!("cannot read metadata of topic {topic:?} from {brokers}: {e}; check --kafka-brokers"))
    })?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    match t.error() {
        None => {}
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => return Ok(None),
        Some(e) => {
            return Err(Definite::Setup(format!("metadata of topic {topic:?}: {:?}", RDKafkaErrorCode::from(e))))
        }
    }
    Ok(Some(t.partitions().len() as i32).filter(|n| *n > 0))
}

/// Reads the DLQ to its end; see the module doc.
pub struct DlqReader {
    consumer: StreamReader,
    topic: String,
    timeout: Duration,
    watch: EndWatch,
    read: u64,
}

impl DlqReader {
    /// Asks for the watermarks and assigns every partition. `None` when the topic does not exist.
    /// The consumer must have `enable.partition.eof` on, or a partition whose last offsets are
    /// not records (transaction markers) can only end by timing out.
    pub fn open(
        consumer: StreamReader,
        topic: &str,
        brokers: &str,
        timeout: Duration,
    ) -> Result<Option<DlqReader>, Definite> {
        DlqReader::open_from(consumer, topic, brokers, timeout, None)
    }

    /// [`DlqReader::open`], starting each partition at its first record with a timestamp at or
    /// after `from_ms` (the broker's answer to `offsets_for_times`) when given. Brokers answer by
    /// their time index, which may start a little early (tansu answers with the time a batch was
    /// stored, or offset 0); callers that need an exact cut filter by timestamp as well.
    pub fn open_from(
        consumer: StreamReader,
        topic: &str,
        brokers: &str,
        timeout: Duration,
        from_ms: Option<i64>,
    ) -> Result<Option<DlqReader>, Definite> {
        let Some(partitions) = partition_count(&consumer, topic, brokers)? else {
            return Ok(None);
        };
        let deadline = Instant::now() + timeout;
        let mut ends = Vec::with_capacity(partitions as usize);
        for p in 0..partitions {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match consumer.fetch_watermarks(topic, p, left.min(Duration::from_secs(5))) {
                    Ok(w) => break ends.push(w),
                    Err(e) if left > Duration::ZERO => {
                        tracing::warn!(error = %e, "asking for the end offset of {topic}/{p}; retrying");
                        std::thread::sleep(Duration::from_millis(200).min(left));
                    }
                    Err(e) => {
                        return Err(Definite::Setup(format!(
                            "cannot read the end offset of {topic}/{p} from {brokers} within --read-timeout {timeout:?}: {e}"
                        )))
                    }
                }
            }
        }
        if let Some(ts) = from_ms {
            let mut ask = TopicPartitionList::new();
            for p in 0..partitions {
                ask.add_partition_offset(topic, p, Offset::Offset(ts))
                    .map_err(|e| Definite::Bug(format!("looking up {topic}/{p}: {e}")))?;
            }
            let found = consumer
                .offsets_for_times(ask, timeout)
                .map_err(|e| Definite::Setup(format!("cannot look up offsets by time in {topic} on {brokers}: {e}")))?;
            for (p, (low, high)) in ends.iter_mut().enumerate() {
                // The watch starts where reading starts. Offset::End: no record that new.
                match found.find_partition(topic, p as i32).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => *low = o.clamp(*low, *high),
                    Some(Offset::End) => *low = *high,
                    _ => {}
                }
            }
        }
        let mut tpl = TopicPartitionList::new();
        for (p, (low, _)) in ends.iter().enumerate() {
            let start = if from_ms.is_some() { Offset::Offset(*low) } else { Offset::Beginning };
            tpl.add_partition_offset(topic, p as i32, start)
                .map_err(|e| Definite::Bug(format!("assigning {topic}/{p}: {e}")))?;
        }
        consumer.assign(&tpl).map_err(|e| Definite::Setup(format!("cannot assign {topic} partitions: {e}")))?;
        tracing::debug!(?ends, "reading {topic} up to these (low, high) watermarks");
        Ok(Some(DlqReader {
            consumer,
            topic: topic.to_owned(),
            timeout,
            watch: EndWatch::new(&ends, Instant::now()),
            read: 0,
        }))
    }

    /// The next record, waiting as long as it takes: reading past the end for `--follow`.
    /// Cancel-safe (the consumer's `recv` is), so it can be one arm of a `select!`.
    pub async fn next_live(&mut self) -> DlqRecord {
        loop {
            match self.consumer.recv().await {
                Ok(m) => {
                    self.read += 1;
                    return DlqRecord::from_message(&m);
                }
                Err(KafkaError::PartitionEOF(_)) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "reading {}", self.topic);
                    // Errors can repeat at once (a broker down); do not spin on them.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    pub fn partitions(&self) -> i32 {
        self.watch.parts.len() as i32
    }

    /// The next record, `None` at the end.
    pub async fn next(&mut self) -> Result<Option<DlqRecord>, Error> {
        let entered = Instant::now();
        loop {
            let until = match self.watch.decide(Instant::now(), entered, self.timeout) {
                Decision::End => {
                    tracing::debug!(records = self.read, "read {}", self.topic);
                    return Ok(None);
                }
                Decision::Stalled => {
                    return Err(Definite::Setup(format!(
                        "reading {} stalled: nothing arrived for --read-timeout {:?} before the end it had when reading began ({}; {} records read); check the brokers, or raise --read-timeout",
                        self.topic,
                        self.timeout,
                        self.watch.describe(),
                        self.read
                    ))
                    .into())
                }
                Decision::WaitUntil(t) => t,
            };
            match tokio::time::timeout_at(tokio::time::Instant::from_std(until), self.consumer.recv()).await {
                Err(_) => {}
                Ok(Ok(m)) => {
                    self.watch.on_record(m.partition(), m.offset(), Instant::now());
                    self.read += 1;
                    return Ok(Some(DlqRecord::from_message(&m)));
                }
                Ok(Err(KafkaError::PartitionEOF(p))) => self.watch.on_end(p, Instant::now()),
                Ok(Err(e)) => tracing::warn!(error = %e, "reading {}", self.topic),
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Decision {
    WaitUntil(Instant),
    End,
    Stalled,
}

#[derive(Debug)]
struct Part {
    /// High watermark when reading began.
    end: i64,
    /// Next offset to read.
    next: i64,
    /// librdkafka reported the end of the partition.
    at_end: bool,
}

/// Where reading stands against the watermarks; pure, so the stopping rule is unit-tested.
#[derive(Debug)]
struct EndWatch {
    parts: Vec<Part>,
    reached_at: Option<Instant>,
    /// Last record or end report.
    last_activity: Instant,
}

impl EndWatch {
    fn new(watermarks: &[(i64, i64)], now: Instant) -> EndWatch {
        let parts: Vec<Part> =
            watermarks.iter().map(|&(low, high)| Part { end: high, next: low.max(0), at_end: high <= low }).collect();
        let mut w = EndWatch { parts, reached_at: None, last_activity: now };
        w.check(now);
        w
    }

    fn on_record(&mut self, partition: i32, offset: i64, now: Instant) {
        if let Some(p) = self.parts.get_mut(partition as usize) {
            p.next = p.next.max(offset.saturating_add(1));
        }
        self.last_activity = now;
        self.check(now);
    }

    fn on_end(&mut self, partition: i32, now: Instant) {
        if let Some(p) = self.parts.get_mut(partition as usize) {
            p.at_end = true;
        }
        self.last_activity = now;
        self.check(now);
    }

    fn check(&mut self, now: Instant) {
        if self.reached_at.is_none() && self.parts.iter().all(|p| p.at_end || p.next >= p.end) {
            self.reached_at = Some(now);
        }
    }

    /// `entered`: when the caller started waiting; quiet time before it does not count.
    fn decide(&self, now: Instant, entered: Instant, timeout: Duration) -> Decision {
        let quiet_since = self.last_activity.max(entered);
        let (t, then) = match self.reached_at {
            None => (quiet_since + timeout, Decision::Stalled),
            Some(r) => ((quiet_since + SETTLE).min(r + GROWTH_CAP), Decision::End),
        };
        if now >= t {
            then
        } else {
            Decision::WaitUntil(t)
        }
    }

    /// `partition 0 at offset 3 of 10, partition 1 done`.
    fn describe(&self) -> String {
        let each = self.parts.iter().enumerate().map(|(i, p)| {
            if p.at_end || p.next >= p.end {
                format!("partition {i} done")
            } else {
                format!("partition {i} at offset {} of {}", p.next, p.end)
            }
        });
        each.collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(60);

    #[test]
    fn silence_before_the_watermark_waits_for_the_timeout_not_for_a_quiet_spell() {
        let t0 = Instant::now();
        let mut w = EndWatch::new(&[(0, 10), (0, 0)], t0);
        w.on_record(0, 3, t0);
        // A broker pause of many seconds: still waiting, up to the read timeout.
        let later = t0 + Duration::from_secs(30);
        assert_eq!(w.decide(later, t0, T), Decision::WaitUntil(t0 + T));
        assert_eq!(w.decide(t0 + T, t0, T), Decision::Stalled);
        assert_eq!(w.describe(), "partition 0 at offset 4 of 10, partition 1 done");
        // Time the caller spent elsewhere (publishing) does not count.
        let back = t0 + Duration::from_secs(100);
        assert_eq!(w.decide(back, back, T), Decision::WaitUntil(back + T));
    }

    #[test]
    fn after_the_watermarks_a_short_quiet_spell_ends_reading() {
        let t0 = Instant::now();
        let mut w = EndWatch::new(&[(0, 2), (5, 6)], t0);
        w.on_record(0, 0, t0);
        w.on_record(0, 1, t0);
        assert!(matches!(w.decide(t0, t0, T), Decision::WaitUntil(t) if t == t0 + T), "partition 1 not read");
        let t1 = t0 + Duration::from_secs(2);
        w.on_record(1, 5, t1);
        assert_eq!(w.decide(t1, t1, T), Decision::WaitUntil(t1 + SETTLE));
        // Under-reported watermark: more records past it keep reading going.
        let t2 = t1 + Duration::from_millis(500);
        w.on_record(1, 6, t2);
        assert_eq!(w.decide(t2, t2, T), Decision::WaitUntil(t2 + SETTLE));
        assert_eq!(w.decide(t2 + SETTLE, t2, T), Decision::End);
    }

    #[test]
    fn an_end_report_counts_as_reaching_the_watermark() {
        let t0 = Instant::now();
        let mut w = EndWatch::new(&[(0, 9)], t0);
        w.on_record(0, 6, t0);
        w.on_end(0, t0); // offsets 7 and 8 are transaction markers
        assert_eq!(w.decide(t0 + SETTLE, t0, T), Decision::End);
    }

    #[test]
    fn empty_topics_end_after_the_quiet_spell_and_growth_is_capped() {
        let t0 = Instant::now();
        let w = EndWatch::new(&[(0, 0), (4, 4)], t0);
        assert_eq!(w.decide(t0 + SETTLE, t0, T), Decision::End);
        let mut w = EndWatch::new(&[(0, 0)], t0);
        let mut now = t0;
        for o in 0..100 {
            now += Duration::from_millis(500);
            w.on_record(0, o, now);
        }
        assert_eq!(w.decide(now, now, T), Decision::End, "still growing after {GROWTH_CAP:?}");
    }
}
