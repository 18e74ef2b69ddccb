//! The Kafka side of `outboxd inbox`: one consumer in a thread of its own, polling records and
//! handing them, in order, to the writer ([`super::writer`]) over a bounded channel.
//!
//! Where a partition starts is decided in the rebalance callback, which runs on this thread: on
//! an assignment it reads each partition's range in Kafka (its watermarks), hands them to the
//! writer, which checks the offsets stored in PostgreSQL against them (and stores where a new
//! partition starts under `--start-from latest` or `committed`), and waits for the answer before
//! it assigns, so fetching starts there and never at the group's Kafka offsets (`--start-from
//! committed` reads those once, here, for partitions PostgreSQL has no offset of, and the writer
//! stores them before anything is fetched); on a
//! revocation it waits until the writer has written (or dropped) what it holds of those
//! partitions. A blocking wait is right here: this thread does nothing else, and a rebalance
//! must not finish before the positions are known. The writer runs on the tokio runtime, so the
//! two never wait on each other's thread.
//!
//! Kafka's reachability is the inbox's sink flag behind `/readyz` ([`Link`], as `run`'s Kafka sink
//! reports it): down when librdkafka reports every broker down or an authentication failure, up
//! again with the next record polled or the next statistics that show a broker up (every 5 s).
//!
//! Invariant: records reach the channel in the order librdkafka returns them (per partition, the
//! log's order), and the thread never ends silently: when it stops, the channel closes and the
//! writer reports it. A position Kafka does not hold is never skipped over: `auto.offset.reset`
//! is `error`, and that error stops the inbox ([`Input::OutOfRange`]).
//!
//! The lag gauges are [`super::lag`]'s: this thread notes where each assigned partition starts and
//! each record it reads, and runs the lag's own thread beside it ([`lag::watch`]), which asks Kafka
//! for the ends with the same client, so the gauges move while this thread waits on the writer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{Headers, Message};
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::ClientContext;
use tokio::sync::mpsc;

use super::beat::Beat;
use super::commit::Commits;
use super::lag::{self, Lag};
use super::record::Received;
use crate::config::inbox::{InboxConfig, StartFrom, Subscription};
use crate::error::Definite;
use crate::health::Health;
use crate::metrics::InboxMetrics;
use crate::sink::kafka::client;
use crate::sink::link::Link;

/// How long one watermark fetch may take, and the pause before the next after a failed one
/// ([`Context::ranges`]); together under [`MIN_STALL`](crate::config::inbox::MIN_STALL) (a unit test holds it).
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(2);
const WATERMARK_PAUSE: Duration = Duration::from_secs(1);

/// `topic.metadata.refresh.interval.ms` with `--topic-pattern` (unless --kafka-property sets it):
/// how soon a matching topic created later is read.
const PATTERN_REFRESH_MS: &str = "30000";

pub use super::Part;

/// A partition's range in Kafka: its low and high watermarks (the first offset it still holds,
/// and one past its last; with read_committed, its last stable offset).
pub type Range = (i64, i64);

/// Most records handed to the writer in one [`Input::Records`]: one wake-up of the writer per
/// chunk, not per record (on two busy cores, a wake-up per record cost more than the record).
pub const CHUNK: usize = 64;

/// What the consumer thread tells the writer.
pub enum Input {
    /// Records in the log's order per partition; `idle`: librdkafka had nothing more buffered
    /// when the chunk was sent, so the writer need not wait for its batch to fill.
    Records(Vec<Received>, bool),
    /// Partitions about to be assigned, with their ranges and (`--start-from committed` only)
    /// the offsets the group has committed in Kafka for them: answer with where each starts (a
    /// dropped answer takes none of them).
    Assign(Vec<(Part, Range)>, HashMap<Part, i64>, std_mpsc::SyncSender<Vec<(Part, Offset)>>),
    /// Partitions about to be taken away: answer once nothing of them is held any more.
    Revoke(Vec<Part>, std_mpsc::SyncSender<()>),
    /// librdkafka found a position outside a partition's log (`auto.offset.reset=error`): the
    /// assigned partitions' ranges now, for the writer to name the one(s) out of range and stop.
    OutOfRange(Vec<(Part, Range)>),
}

/// Where a partition starts: its stored next offset, else `--start-from` (`committed` with
/// nothing committed is `earliest`; one committed was stored, so it comes here as `stored`).
pub fn start_of(stored: Option<i64>, start_from: StartFrom) -> Offset {
    match (stored, start_from) {
        (Some(n), _) => Offset::Offset(n),
        (None, StartFrom::Earliest | StartFrom::Committed) => Offset::Beginning,
        (None, StartFrom::Latest) => Offset::End,
    }
}

/// Where an assigned partition starts, as an offset: a stored one, else its range's start or end.
fn start_offset(start: Offset, (low, high): Range) -> Option<i64> {
    match start {
        Offset::Offset(n) => Some(n),
        Offset::Beginning => Some(low),
        Offset::End => Some(high),
        _ => None,
    }
}

struct Context {
    tx: mpsc::Sender<Input>,
    /// `--start-from`: with `committed`, an assignment reads the group's Kafka offsets too.
    start_from: StartFrom,
    stop: Arc<AtomicBool>,
    metrics: InboxMetrics,
    beat: Arc<Beat>,
    /// The stored offsets for Kafka's copy (`--commit-kafka-offsets`), sent from this thread.
    commits: Arc<Commits>,
    /// The lag's state: where each assigned partition starts, and the records read.
    lag: Arc<Lag>,
    /// Records polled and not handed over yet (at most [`CHUNK`]); sent before anything else
    /// goes to the writer, so the channel keeps the order of the polls and the rebalances.
    pending: Mutex<Vec<Received>>,
    /// The last chunk handed over was a full one, not marked idle: the next poll that finds
    /// nothing sends an empty idle chunk, else a burst that ends on a full chunk waits out
    /// `--batch-timeout` in the writer.
    unmarked: AtomicBool,
    /// Kafka's reachability as `/readyz`, the metrics and the log show it.
    link: Link,
    /// The user's Kafka properties, to scrub secret values from librdkafka's error texts.
    properties: Vec<(String, String)>,
}

impl ClientContext for Context {
    /// librdkafka's global errors: every broker down, or the login refused (wrong credentials, a
    /// certificate not trusted), turn readiness off until Kafka answers again.
    fn error(&self, error: KafkaError, reason: &str) {
        use RDKafkaErrorCode as C;
        let reason = client::scrub(reason, &self.properties);
        match error.rdkafka_error_code() {
            Some(C::AllBrokersDown) => self.link.set(false, "all brokers down"),
            Some(C::Authentication | C::SaslAuthenticationFailed | C::SSL) => self.link.set(false, &reason),
            _ => false,
        };
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }

    /// librdkafka's statistics (every `statistics.interval.ms`, 5 s by default here): only Kafka's
    /// reachability comes from them (a broker up again). The lag is [`super::lag`]'s, which does
    /// not wait for this thread's polls.
    fn stats(&self, statistics: Statistics) {
        if !self.link.is_up() && statistics.brokers.values().any(|b| b.state == "UP") {
            self.link.set(true, "");
        }
    }
}

impl ConsumerContext for Context {
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        self.commits.answered(result, offsets);
    }

    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let parts: Vec<Part> = tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect();
        let cooperative = matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative);
        self.forget(&parts);
        let done = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let (reply, answer) = std_mpsc::sync_channel(1);
                let ranged = self.ranges(consumer, &parts);
                let ranges: HashMap<Part, Range> = ranged.iter().flatten().cloned().collect();
                let committed = match self.start_from {
                    StartFrom::Committed => self.committed(consumer, &parts),
                    _ => Some(HashMap::new()),
                };
                let asked = ranged.zip(committed).and_then(|(r, c)| self.ask(Input::Assign(r, c, reply), &answer));
                match asked {
                    Some(starts) => {
                        for (part, off) in starts {
                            let at = ranges.get(&part).and_then(|r| start_offset(off, *r));
                            self.lag.assigned(&part, at);
                            if let Err(e) = tpl.set_partition_offset(&part.0, part.1, off) {
                                tracing::error!(topic = %part.0, partition = part.1, "cannot set the start offset: {e}");
                            }
                        }
                        self.commits.assigned(&parts);
                        tracing::info!(partitions = ?parts, "assigned; starting at the offsets stored in PostgreSQL");
                        if cooperative {
                            consumer.incremental_assign(tpl)
                        } else {
                            consumer.assign(tpl)
                        }
                    }
                    // Shutting down: take nothing.
                    None => unassign(consumer, tpl, cooperative),
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let (reply, answer) = std_mpsc::sync_channel(1);
                self.ask(Input::Revoke(parts.clone(), reply), &answer);
                // The writer has stored what it held of them: Kafka's copy follows before they go.
                self.commits.send(consumer, true);
                self.commits.revoked(&parts);
                tracing::info!(partitions = ?parts, "revoked");
                unassign(consumer, tpl, cooperative)
            }
            other => {
                tracing::warn!("rebalance error {other:?}; releasing the assignment");
                self.commits.revoked(&parts);
                unassign(consumer, tpl, cooperative)
            }
        };
        if let Err(e) = done {
            tracing::error!("the rebalance could not be applied: {e}");
        }
    }
}

impl Context {
    /// Partitions that change hands: their lag gauges go to 0 (the instance that holds them now
    /// reports theirs; [`lag::watch`] sets them again here only while assigned here).
    fn forget(&self, parts: &[Part]) {
        self.lag.forget(parts, &self.metrics);
    }

    /// Each partition's watermarks, asked again every second while Kafka does not answer;
    /// `None` when shutting down. The thread beats before every fetch, so with many partitions or
    /// Kafka away its beats are at most [`WATERMARK_TIMEOUT`] + [`WATERMARK_PAUSE`] apart, less
    /// than the shortest `--health-stall-timeout` ([`MIN_STALL`](crate::config::inbox::MIN_STALL)): a slow Kafka is readiness, not a wedge.
    fn ranges(&self, consumer: &BaseConsumer<Self>, parts: &[Part]) -> Option<Vec<(Part, Range)>> {
        let mut out = Vec::with_capacity(parts.len());
        for (topic, p) in parts {
            loop {
                self.beat.beat();
                match consumer.fetch_watermarks(topic, *p, WATERMARK_TIMEOUT) {
                    Ok(r) => break out.push(((topic.clone(), *p), r)),
                    Err(e) if !self.stop.load(Ordering::Relaxed) => {
                        tracing::warn!(%topic, partition = p, "cannot read the partition's range yet: {e}; retrying");
                        // The watermark query goes to the leader the metadata cache names; after a
                        // leader died during the group join, that cache can keep answering "unknown
                        // partition" (seen for minutes): ask for the topic's metadata again first.
                        self.beat.beat();
                        let _ = consumer.fetch_metadata(Some(topic), WATERMARK_TIMEOUT);
                        std::thread::sleep(WATERMARK_PAUSE);
                    }
                    Err(_) => return None,
                }
            }
        }
        Some(out)
    }

    /// `--start-from committed`: the offsets the group has committed in Kafka for `parts` (a
    /// partition with none is left out), asked again every second while Kafka does not answer;
    /// `None` when shutting down. Read before the writer loads PostgreSQL's, and used only for
    /// partitions that have none there, so a stored offset always wins.
    fn committed(&self, consumer: &BaseConsumer<Self>, parts: &[Part]) -> Option<HashMap<Part, i64>> {
        let mut tpl = TopicPartitionList::with_capacity(parts.len());
        for (topic, p) in parts {
            tpl.add_partition(topic, *p);
        }
        loop {
            self.beat.beat();
            let got = consumer.committed_offsets(tpl.clone(), WATERMARK_TIMEOUT).and_then(|list| {
                let mut out = HashMap::new();
                for e in list.elements() {
                    e.error()?;
                    if let Offset::Offset(n) = e.offset() {
                        out.insert((e.topic().to_owned(), e.partition()), n);
                    }
                }
                Ok(out)
            });
            match got {
                Ok(out) => {
                    tracing::info!(group_offsets = ?out, "--start-from committed: read the group's offsets in Kafka");
                    return Some(out);
                }
                Err(e) if !self.stop.load(Ordering::Relaxed) => {
                    tracing::warn!("cannot read the group's committed offsets yet: {e}; retrying");
                    std::thread::sleep(WATERMARK_PAUSE);
                }
                Err(_) => return None,
            }
        }
    }

    /// Send `input` and wait for the writer's answer; `None` when shutting down or the writer is gone.
    fn ask<T>(&self, input: Input, answer: &std_mpsc::Receiver<T>) -> Option<T> {
        self.hand_over(false)?;
        self.send(input)?;
        self.beat.waiting_on_writer(|| loop {
            match answer.recv_timeout(Duration::from_millis(200)) {
                Ok(v) => return Some(v),
                Err(std_mpsc::RecvTimeoutError::Timeout) if !self.stop.load(Ordering::Relaxed) => continue,
                Err(_) => return None,
            }
        })
    }

    /// Hand `input` to the writer, waiting while its channel is full; `None` when it is gone.
    fn send(&self, input: Input) -> Option<()> {
        self.beat.waiting_on_writer(|| self.tx.blocking_send(input).ok())
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<Received>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Send the records polled so far, if any, as one chunk (an empty one only to mark idle
    /// what the last chunk did not); `None` when the writer is gone.
    fn hand_over(&self, idle: bool) -> Option<()> {
        let chunk = std::mem::take(&mut *self.pending());
        let unmarked = self.unmarked.swap(!idle && !chunk.is_empty(), Ordering::Relaxed);
        if chunk.is_empty() && !(idle && unmarked) {
            self.unmarked.store(unmarked, Ordering::Relaxed);
            return Some(());
        }
        self.send(Input::Records(chunk, idle))
    }
}

fn unassign(consumer: &BaseConsumer<Context>, tpl: &TopicPartitionList, cooperative: bool) -> KafkaResult<()> {
    if cooperative {
        consumer.incremental_unassign(tpl)
    } else {
        consumer.unassign()
    }
}

/// The running consumer thread.
pub struct Running {
    pub thread: std::thread::JoinHandle<()>,
    pub stop: Arc<AtomicBool>,
}

/// Create the consumer, subscribe, and start its thread; records and rebalances go to `tx`.
pub fn start(
    cfg: &InboxConfig,
    tx: mpsc::Sender<Input>,
    beat: Arc<Beat>,
    commits: Arc<Commits>,
    health: Arc<Health>,
    lag: Arc<Lag>,
) -> Result<Running, Definite> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut defaults = vec![
        ("group.id", cfg.group.clone()),
        ("enable.auto.commit", "false".to_owned()),
        ("enable.auto.offset.store", "false".to_owned()),
        // outboxd's exactly-once output arrives whole; aborted records never reach the inbox.
        ("isolation.level", "read_committed".to_owned()),
        ("enable.partition.eof", "false".to_owned()),
        // Kafka's reachability (a broker up again) is read from them.
        ("statistics.interval.ms", "5000".to_owned()),
    ];
    // A --topic-pattern subscription finds a topic created later at the next metadata refresh:
    // librdkafka's default of 5 min (measured: 301 s, tests/inbox_migrate.rs) is too slow to
    // notice, one Metadata request every 30 s is cheap. --kafka-property overrides it.
    if matches!(cfg.subscription, Subscription::Pattern(_)) {
        defaults.push(("topic.metadata.refresh.interval.ms", PATTERN_REFRESH_MS.to_owned()));
    }
    let mut conf = client::consumer_config(&cfg.kafka, "outboxd-inbox", &defaults);
    // Never librdkafka's default `latest`: a stored offset below the log's start (the inbox was
    // away longer than the retention) or beyond its end (the topic was created again) would jump
    // to the end and skip records. Set after --kafka-property, since the guarantee rests on it.
    conf.set("auto.offset.reset", "error");
    let context = Context {
        tx,
        start_from: cfg.start_from,
        stop: stop.clone(),
        metrics: InboxMetrics::new(),
        beat,
        commits,
        lag: lag.clone(),
        pending: Mutex::new(Vec::with_capacity(CHUNK)),
        unmarked: AtomicBool::new(false),
        link: Link::new("kafka", "Kafka", health),
        properties: cfg.kafka.properties.clone(),
    };
    let consumer: BaseConsumer<Context> = client::create(&conf, context, "consumer", &cfg.kafka)?;
    let topics: Vec<&str> = match &cfg.subscription {
        Subscription::Topics(t) => t.iter().map(String::as_str).collect(),
        Subscription::Pattern(p) => vec![p.as_str()],
    };
    consumer.subscribe(&topics).map_err(|e| {
        Definite::Config(format!("cannot subscribe to {topics:?}: {e}; check --topics/--topic-pattern"))
    })?;
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("inbox-consumer".into())
        .spawn(move || with_lag(&consumer, &lag, || poll_loop(&consumer, &flag)))
        .map_err(|e| Definite::Setup(format!("cannot start the consumer thread: {e}")))?;
    Ok(Running { thread, stop })
}

/// Run `body` (the poll loop) with [`lag::watch`] beside it on a thread of its own, sharing the
/// client; the watch ends (and is waited for) when `body` returns, before the client closes. A
/// watch that cannot start or panics is an error in the log, never the inbox's end: only the
/// gauges stop.
fn with_lag(consumer: &BaseConsumer<Context>, lag: &Lag, body: impl FnOnce()) {
    std::thread::scope(|s| {
        let (done, watching) = std_mpsc::channel::<()>();
        let started = std::thread::Builder::new().name("inbox-lag".into()).spawn_scoped(s, move || {
            let run = std::panic::AssertUnwindSafe(|| lag::watch(consumer, lag, &watching));
            if std::panic::catch_unwind(run).is_err() {
                tracing::error!("the inbox's lag thread panicked; the lag gauges are no longer updated");
            }
        });
        if let Err(e) = started {
            tracing::error!("cannot start the inbox's lag thread: {e}; the lag gauges are not updated");
        }
        body();
        drop(done);
    });
}

/// Poll until told to stop or the writer is gone. Errors librdkafka reports per poll (a broker
/// down, a topic not there yet) are logged and polled past: the client reconnects by itself;
/// except a position out of a partition's range, which the writer is told of, and the thread ends.
///
/// While records are buffered in librdkafka they are taken without waiting and handed over in
/// chunks of [`CHUNK`]; the first poll that finds nothing sends what is gathered marked idle, so a
/// lone record is written at once rather than after `--batch-timeout`.
fn poll_loop(consumer: &BaseConsumer<Context>, stop: &AtomicBool) {
    let ctx = consumer.context();
    while !stop.load(Ordering::Relaxed) {
        ctx.beat.beat();
        ctx.commits.send(consumer, false);
        let idle = ctx.pending().is_empty();
        let wait = if idle { Duration::from_millis(100) } else { Duration::ZERO };
        match consumer.poll(wait) {
            None => {
                if idle {
                    read_to(consumer, &ctx.lag);
                }
                if ctx.hand_over(true).is_none() {
                    break;
                }
            }
            Some(Ok(m)) => {
                if !ctx.link.is_up() {
                    ctx.link.set(true, "");
                }
                let r = received(&m);
                ctx.lag.read(&r.topic, r.partition, r.offset, r.timestamp_ms);
                let full = {
                    let mut p = ctx.pending();
                    p.push(r);
                    p.len() >= CHUNK
                };
                if full && ctx.hand_over(false).is_none() {
                    break;
                }
            }
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset))) => {
                let parts: Vec<Part> = consumer
                    .assignment()
                    .map(|a| a.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect())
                    .unwrap_or_default();
                let ranges = ctx.ranges(consumer, &parts).unwrap_or_default();
                let _ = ctx.hand_over(false).and_then(|()| ctx.send(Input::OutOfRange(ranges)));
                break;
            }
            Some(Err(e)) => tracing::warn!("Kafka consumer: {e}"),
        }
    }
    // What the writer stored last; closing the client (when it drops) waits for the commit.
    consumer.context().commits.send(consumer, true);
    tracing::info!("Kafka consumer stopping");
}

/// Nothing more to read: the positions go to the lag, which counts offsets stepped over without a
/// record (commit markers) as done once every record read is stored. From this thread, after it
/// noted every record it was given, so a position never runs ahead of the notes.
fn read_to(consumer: &BaseConsumer<Context>, lag: &Lag) {
    let Ok(positions) = consumer.position() else { return };
    lag.read_to(positions.elements().iter().filter_map(|e| match e.offset() {
        Offset::Offset(n) => Some((e.topic().to_owned(), e.partition(), n)),
        _ => None,
    }));
}

/// Owned copies of a record's parts (no librdkafka borrow outlives the poll).
fn received(m: &rdkafka::message::BorrowedMessage<'_>) -> Received {
    let headers = m
        .headers()
        .map(|hs| hs.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
        .unwrap_or_default();
    Received {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec),
        headers,
        timestamp_ms: m.timestamp().to_millis(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watermark_fetch_and_its_pause_fit_in_the_shortest_stall_timeout() {
        assert!(WATERMARK_TIMEOUT + WATERMARK_PAUSE < crate::config::inbox::MIN_STALL);
    }

    #[test]
    fn a_partition_starts_at_its_stored_offset_else_its_ranges_start_or_end() {
        assert_eq!(start_offset(Offset::Offset(7), (3, 10)), Some(7));
        assert_eq!(start_offset(Offset::Beginning, (3, 10)), Some(3));
        assert_eq!(start_offset(Offset::End, (3, 10)), Some(10));
        assert_eq!(start_offset(Offset::Invalid, (3, 10)), None);
    }
}
