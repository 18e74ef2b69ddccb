//! `outboxd dlq list` and `outboxd dlq replay`.
//!
//! Both read the whole of `--dlq-topic` ([`super::read`]: up to the end it had when reading
//! began, waiting out broker hiccups, failing after `--read-timeout` of silence rather than
//! returning a shortened DLQ) and turn records into events ([`super::entry`]: chunk records of one
//! copy become one event). `list` shows one line per event; `replay` sends each matching event to
//! `--to-topic` or its `outboxd.original.topic` with the original key, payload (a chunked copy's
//! joined byte for byte), CreateTime and headers minus `outboxd.*`, through an idempotent producer,
//! creating a missing topic. Events without a destination, copies from older versions that kept
//! no payload, chunk sets missing a chunk and sets whose chunks do not join are reported and left
//! for a later run; none is ever sent in part.
//!
//! Replay streams: it publishes in batches of at most [`BATCH`] events or [`BATCH_BYTES`] of
//! payload (chunk sets still being collected count towards the bytes), waits for their acks,
//! records them ([`super::state`]), and reads on. Memory is bounded by that, plus librdkafka's
//! fetch queue, plus chunk sets that are incomplete when their last chunk is missing.
//!
//! The consumer, producer and admin client come from [`crate::sink::kafka_client`], so
//! `--kafka-property` and `--kafka-property-file` mean here what they mean for `outboxd run`.
//!
//! `--sink` picks where the DLQ lives, as for `outboxd run`: Kafka (the default, as above), NATS
//! JetStream ([`super::nats`]) or Redis Streams ([`super::redis`]), with that sink's own
//! connection flags. Only the record source ([`Source`]) and the republishing client ([`Target`])
//! differ; collecting, chunk joining, filters, batching and the progress state are the same code
//! for all three, so the guarantees are too: a batch is recorded only after every event in it was
//! acknowledged (PubAck, XADD reply). Each sink's state file is its own: `<dlq-topic>` (Kafka),
//! `nats.<subject>`, `redis.<percent-encoded key>`. The other sinks are refused with one line
//! saying why ([`unreadable_sink`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{DefaultConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use super::chunk;
use super::entry::{Collector, Entry, Fed};
use super::nats::NatsReader;
use super::read::{partition_count, DlqReader, DlqRecord};
use super::redis::RedisReader;
use super::state::State;
use super::{H_LSN, H_MESSAGE, H_PAYLOAD_DROPPED, H_SEQ, H_SIZE, H_TABLE, PREFIX};
use crate::config::redis::RedisConfig;
use crate::config::secret::read_url_file;
use crate::config::{
    parse_duration, DlqCommand, DlqCommonArgs, DlqListArgs, DlqReplayArgs, KafkaConfig, NatsConfig, SinkKind,
};
use crate::error::{Definite, Error};
use crate::sink::kafka_client::{self, Retry};

/// Events sent before waiting for their acks and saving progress.
const BATCH: usize = 1000;
/// Payload bytes held before publishing what is ready.
const BATCH_BYTES: usize = 32 << 20;
/// Per-record lines printed for skipped or failed records before summarising the rest.
const MAX_LINES: usize = 50;

/// Returns the process exit code.
pub async fn run(cmd: DlqCommand) -> Result<u8, Error> {
    match cmd {
        DlqCommand::List(a) => list(&a).await,
        DlqCommand::Replay(a) => replay(&a).await,
    }
}

/// The sink whose dead letters are read, with its validated connection settings.
enum Via {
    Kafka,
    Nats(NatsConfig),
    Redis(RedisConfig),
}

/// Validated common flags.
struct Common {
    kafka: KafkaConfig,
    via: Via,
    topic: String,
    read_timeout: Duration,
}

/// Where the DLQ is read from: the sink's own reader.
enum Source {
    Kafka(DlqReader),
    Nats(NatsReader),
    Redis(RedisReader),
}

impl Source {
    async fn next(&mut self) -> Result<Option<DlqRecord>, Error> {
        match self {
            Source::Kafka(r) => r.next().await,
            Source::Nats(r) => r.next().await,
            Source::Redis(r) => r.next().await,
        }
    }
}

/// Where replayed events go: the same sink.
enum Target {
    Nats(async_nats::jetstream::Context),
    Redis(redis::aio::MultiplexedConnection),
}

impl Common {
    fn from_args(a: &DlqCommonArgs) -> Result<Common, Definite> {
        let kafka = KafkaConfig::for_tool(&a.kafka)?;
        if a.dlq_topic.is_empty() {
            return Err(Definite::Config("--dlq-topic must not be empty (default outboxd.dlq)".into()));
        }
        let read_timeout = parse_duration("--read-timeout", &a.read_timeout)?;
        if read_timeout.is_zero() {
            return Err(Definite::Config("--read-timeout must be more than 0, e.g. 60s".into()));
        }
        let s = &a.sink;
        let url = |flag: &str, file: &Option<std::path::PathBuf>, given: &str| match file {
            Some(p) => read_url_file(flag, p),
            None => Ok(given.to_owned()),
        };
        let via = match s.sink {
            SinkKind::Kafka => Via::Kafka,
            SinkKind::Nats => Via::Nats(NatsConfig::new(
                &url("--nats-url-file", &s.nats_url_file, &s.nats_url)?,
                s.nats_creds.clone(),
                None,
            )?),
            SinkKind::Redis => {
                let c = RedisConfig { url: url("--redis-url-file", &s.redis_url_file, &s.redis_url)?, maxlen: None };
                c.check()?;
                Via::Redis(c)
            }
            other => return Err(Definite::Config(unreadable_sink(other))),
        };
        Ok(Common { kafka, via, topic: a.dlq_topic.clone(), read_timeout })
    }

    /// The replay state's name: the Kafka topic as before; other sinks' DLQs get their own file.
    fn state_name(&self) -> String {
        match &self.via {
            Via::Kafka => self.topic.clone(),
            Via::Nats(_) => format!("nats.{}", self.topic),
            Via::Redis(_) => {
                const KEEP: &percent_encoding::AsciiSet =
                    &percent_encoding::NON_ALPHANUMERIC.remove(b'.').remove(b'-').remove(b'_');
                format!("redis.{}", percent_encoding::utf8_percent_encode(&self.topic, KEEP))
            }
        }
    }

    /// What `list` and `replay` say when there is nothing to read.
    fn absent(&self) -> String {
        match &self.via {
            Via::Kafka => format!("{}: topic does not exist (no dead letters yet)", self.topic),
            Via::Nats(_) => format!("{}: no JetStream stream holds this subject (no dead letters yet)", self.topic),
            Via::Redis(_) => format!("{}: the Redis stream is missing or empty (no dead letters yet)", self.topic),
        }
    }

    /// The sink's DLQ reader; `None` when there is nothing to read.
    async fn source(&self) -> Result<Option<Source>, Definite> {
        Ok(match &self.via {
            Via::Kafka => self.reader()?.map(Source::Kafka),
            Via::Nats(c) => {
                let js = super::nats::connect(c).await?;
                NatsReader::open(&js, &self.topic, self.read_timeout).await?.map(Source::Nats)
            }
            Via::Redis(c) => {
                let conn = super::redis::connect(c).await?;
                RedisReader::open(conn, &self.topic, self.read_timeout).await?.map(Source::Redis)
            }
        })
    }

    /// The client replay publishes with, for the sinks other than Kafka.
    async fn target(&self) -> Result<Option<Target>, Definite> {
        Ok(match &self.via {
            Via::Kafka => None,
            Via::Nats(c) => Some(Target::Nats(super::nats::connect(c).await?)),
            Via::Redis(c) => Some(Target::Redis(super::redis::connect(c).await?)),
        })
    }

    fn consumer(&self) -> Result<StreamConsumer, Definite> {
        let defaults = [
            ("group.id", "outboxd-dlq-tool".to_owned()),
            ("enable.auto.commit", "false".into()),
            ("enable.auto.offset.store", "false".into()),
            ("auto.offset.reset", "earliest".into()),
            ("allow.auto.create.topics", "false".into()),
            ("isolation.level", "read_uncommitted".into()),
            ("fetch.wait.max.ms", "100".into()),
            // The reader's end: a partition's last offsets may be markers, not records.
            ("enable.partition.eof", "true".into()),
        ];
        let c = kafka_client::consumer_config(&self.kafka, "outboxd-dlq-tool", &defaults);
        kafka_client::create(&c, DefaultConsumerContext, "consumer", &self.kafka)
    }

    /// The DLQ reader; `None` when the topic does not exist.
    fn reader(&self) -> Result<Option<DlqReader>, Definite> {
        DlqReader::open(self.consumer()?, &self.topic, &self.kafka.brokers, self.read_timeout)
    }

    fn producer(&self) -> Result<FutureProducer, Definite> {
        let defaults = [
            ("enable.idempotence", "true".to_owned()),
            ("acks", "all".into()),
            ("message.timeout.ms", "120000".into()),
        ];
        let c = kafka_client::producer_config(&self.kafka, "outboxd-dlq-replay", &defaults);
        kafka_client::create(&c, DefaultClientContext, "producer", &self.kafka)
    }

    fn admin(&self) -> Result<AdminClient<DefaultClientContext>, Definite> {
        let c = kafka_client::admin_config(&self.kafka, "outboxd-dlq-replay");
        kafka_client::create(&c, DefaultClientContext, "admin client", &self.kafka)
    }
}

/// Lines about skipped or failed events: the first [`MAX_LINES`] and a count.
struct Report {
    heading: &'static str,
    lines: Vec<String>,
    count: usize,
}

impl Report {
    fn new(heading: &'static str) -> Report {
        Report { heading, lines: Vec::new(), count: 0 }
    }

    fn push(&mut self, line: impl FnOnce() -> String) {
        self.count += 1;
        if self.lines.len() < MAX_LINES {
            self.lines.push(line());
        }
    }

    fn print(&self) {
        if self.count == 0 {
            return;
        }
        println!("{} {}:", self.count, self.heading);
        for l in &self.lines {
            println!("  {l}");
        }
        if self.count > self.lines.len() {
            println!("  ... and {} more", self.count - self.lines.len());
        }
    }
}

/// Why `outboxd dlq` refuses `--sink kind`, and what to do instead.
fn unreadable_sink(kind: SinkKind) -> String {
    match kind {
        SinkKind::Http => "--sink http: a webhook receiver's dead letters cannot be read back; `outboxd dlq` reads --sink kafka, nats or redis (see the README, \"Bad events and the dead-letter topic\")".into(),
        SinkKind::Rabbitmq => "--sink rabbitmq: `outboxd dlq` cannot read RabbitMQ dead letters yet (they are messages routed by --dlq-topic; read them from the queue bound to it); it reads --sink kafka, nats or redis".into(),
        other => format!("--sink {other:?}: this sink keeps no dead letters to read; `outboxd dlq` reads --sink kafka, nats or redis").to_lowercase(),
    }
}

fn unreadable_line(r: &DlqRecord, why: &str) -> String {
    format!("{} id={} reason={}: {why}", r.position(), r.id_shown(), r.reason())
}

// ---------------------------------------------------------------------------
// dlq list
// ---------------------------------------------------------------------------

async fn list(a: &DlqListArgs) -> Result<u8, Error> {
    let common = Common::from_args(&a.common)?;
    let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
    let mut rows: Vec<Entry> = Vec::new();
    let mut unreadable = Report::new("unreadable (never replayed)");
    let mut collector = Collector::default();
    let mut partitions = None;
    let mut stream_name = None;
    if let Some(mut reader) = common.source().await? {
        partitions = Some(match &reader {
            Source::Kafka(r) => r.partitions(),
            Source::Nats(r) => {
                stream_name = Some(r.stream_name().to_owned());
                1
            }
            Source::Redis(_) => 1,
        });
        while let Some(mut r) = reader.next().await? {
            // Payloads are not shown; chunks keep theirs until their set is checked.
            if r.header(chunk::H_ID).is_none() {
                r.payload = None;
            }
            match collector.feed(r) {
                Fed::Entry(mut e) => {
                    e.head.payload = None;
                    *by_reason.entry(e.head.reason()).or_default() += 1;
                    rows.push(e);
                }
                Fed::Pending => {}
                Fed::Unreadable(r, why) => unreadable.push(|| unreadable_line(&r, &why)),
            }
        }
    }
    let leftovers = collector.finish();
    rows.sort_by_key(|e| (e.head.partition, e.head.offset));
    let position_heading = match common.via {
        Via::Kafka => "PART/OFFSET",
        Via::Nats(_) => "0/SEQUENCE",
        Via::Redis(_) => "ENTRY ID",
    };
    let total = rows.len();
    rows.truncate(a.limit);

    if a.json {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|e| {
                let r = &e.head;
                serde_json::json!({
                    "partition": r.partition,
                    "offset": r.offset,
                    "position": r.position(),
                    "event_id": r.event_id(),
                    "reason": r.reason(),
                    "original_topic": r.original_topic(),
                    "message": r.header(H_MESSAGE),
                    "key": r.key.as_deref().map(|k| String::from_utf8_lossy(k).into_owned()),
                    "payload_bytes": e.payload_len,
                    "chunks": e.chunks,
                    "original_payload_size": r.header(H_SIZE).and_then(|s| s.parse::<u64>().ok()),
                    "source_lsn": r.header(H_LSN),
                    "source_seq": r.header(H_SEQ).and_then(|s| s.parse::<i64>().ok()),
                    "source_table": r.header(H_TABLE),
                })
            })
            .collect();
        let incomplete: Vec<serde_json::Value> = leftovers
            .iter()
            .map(|l| {
                serde_json::json!({
                    "partition": l.head.partition,
                    "offset": l.head.offset,
                    "event_id": l.head.event_id(),
                    "chunk_id": l.chunk_id,
                    "state": l.state,
                    "duplicate": l.duplicate,
                })
            })
            .collect();
        let out = serde_json::json!({
            "sink": match common.via { Via::Kafka => "kafka", Via::Nats(_) => "nats", Via::Redis(_) => "redis" },
            "nats_stream": stream_name,
            "dlq_topic": common.topic,
            "exists": partitions.is_some(),
            "partitions": partitions.unwrap_or(0),
            "total": total,
            "by_reason": by_reason,
            "records": records,
            "incomplete": incomplete,
            "unreadable": unreadable.lines,
        });
        println!("{out}");
        return Ok(0);
    }

    let Some(partitions) = partitions else {
        println!("{}", common.absent());
        return Ok(0);
    };
    let plural = if total == 1 { "" } else { "s" };
    match (&common.via, &stream_name) {
        (Via::Nats(_), Some(stream)) => {
            println!("{}: {total} record{plural} in JetStream stream {stream}", common.topic)
        }
        (Via::Redis(_), _) => println!("{}: {total} record{plural} in the Redis stream", common.topic),
        _ => println!(
            "{}: {total} record{plural} in {partitions} partition{}",
            common.topic,
            if partitions == 1 { "" } else { "s" }
        ),
    }
    let width = by_reason.keys().map(String::len).max().unwrap_or(0);
    for (reason, n) in &by_reason {
        println!("  {reason:<width$}  {n}");
    }
    if !rows.is_empty() {
        println!("first {} of {total}:", rows.len());
        println!("  {position_heading}\tEVENT ID\tREASON\tORIGINAL TOPIC\tMESSAGE");
        for e in &rows {
            let r = &e.head;
            println!(
                "  {}\t{}\t{}\t{}\t{}{}",
                r.position(),
                r.id_shown(),
                r.reason(),
                r.original_topic().unwrap_or_else(|| "-".into()),
                one_line(&r.header(H_MESSAGE).unwrap_or_default()),
                if e.chunks > 1 {
                    format!(" [{} bytes in {} chunks]", e.payload_len.unwrap_or(0), e.chunks)
                } else {
                    String::new()
                },
            );
        }
    }
    let mut incomplete = Report::new("incomplete chunk sets (never replayed in part)");
    for l in &leftovers {
        incomplete.push(|| l.line());
    }
    incomplete.print();
    unreadable.print();
    Ok(0)
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r', '\t'], " ")
}

// ---------------------------------------------------------------------------
// dlq replay
// ---------------------------------------------------------------------------

/// Counts and lines of one replay run.
struct Outcome {
    replayed: usize,
    would_replay: usize,
    already_done: u64,
    no_destination: Report,
    no_payload: Report,
    unusable: Report,
    failures: Report,
    /// For the exit error.
    first_failure: Option<(String, String, String)>,
}

impl Outcome {
    fn fail(&mut self, e: &Entry, dest: &str, why: String) {
        let r = &e.head;
        self.failures.push(|| format!("{} id={} -> {dest}: {why}", r.position(), r.id_shown()));
        if self.first_failure.is_none() {
            self.first_failure = Some((r.id_shown(), dest.to_owned(), why));
        }
    }

    fn extra(&self) -> String {
        let mut s = String::new();
        if self.no_payload.count > 0 {
            s.push_str(&format!(", skipped {} (payload not kept)", self.no_payload.count));
        }
        if self.unusable.count > 0 {
            s.push_str(&format!(", skipped {} (incomplete or unreadable)", self.unusable.count));
        }
        if self.failures.count > 0 {
            s.push_str(&format!(", failed {}", self.failures.count));
        }
        s
    }
}

async fn replay(a: &DlqReplayArgs) -> Result<u8, Error> {
    let common = Common::from_args(&a.common)?;
    match a.to_topic.as_deref() {
        Some("") => return Err(Definite::Config("--to-topic must not be empty".into()).into()),
        Some(t) if t == common.topic => {
            return Err(Definite::Config(format!(
                "--to-topic {t:?} is the DLQ topic itself; name the topic the events belong to"
            ))
            .into())
        }
        _ => {}
    }
    let mut state = State::load(&a.state_dir, &common.state_name())?;
    let mut out = Outcome {
        replayed: 0,
        would_replay: 0,
        already_done: 0,
        no_destination: Report::new("skipped (no original topic; use --to-topic)"),
        no_payload: Report::new("skipped (the DLQ did not keep the payload)"),
        unusable: Report::new("skipped (incomplete chunk set or unreadable; never replayed in part)"),
        failures: Report::new("FAILED (not recorded; a later run retries them)"),
        first_failure: None,
    };
    let mut publisher = Publisher { common: &common, clients: None, topics: BTreeMap::new(), target: None };
    let mut collector = Collector::default();
    let mut batch: Vec<(Entry, String)> = Vec::new();
    let mut batch_bytes = 0usize;

    let Some(mut reader) = common.source().await? else {
        println!("{}", common.absent());
        println!("replayed 0, skipped 0 (no destination), already done 0");
        return Ok(0);
    };
    while let Some(r) = reader.next().await? {
        // Every chunk carries the event's headers, so filters apply record by record.
        if a.filter_reason.as_ref().is_some_and(|want| *want != r.reason()) {
            continue;
        }
        if a.event_id.as_ref().is_some_and(|want| Some(want) != r.event_id().as_ref()) {
            continue;
        }
        if state.contains(r.partition, r.offset) {
            if collector.seen_done(&r) {
                out.already_done += 1;
            }
            continue;
        }
        let e = match collector.feed(r) {
            Fed::Entry(e) => e,
            Fed::Pending => continue,
            Fed::Unreadable(r, why) => {
                out.unusable.push(|| unreadable_line(&r, &why));
                continue;
            }
        };
        let dest = a.to_topic.clone().or_else(|| e.head.original_topic());
        let Some(dest) = dest.filter(|d| *d != common.topic) else {
            out.no_destination
                .push(|| format!("{} id={} reason={}", e.head.position(), e.head.id_shown(), e.head.reason()));
            continue;
        };
        if e.head.payload_not_kept() {
            let r = &e.head;
            out.no_payload.push(|| {
                let why = match r.header(H_PAYLOAD_DROPPED) {
                    Some(d) => format!("payload dropped: {d}"),
                    None => format!("size={}", r.header(H_SIZE).unwrap_or_default()),
                };
                format!("{} id={} reason={} {why}", r.position(), r.id_shown(), r.reason())
            });
            continue;
        }
        if a.dry_run {
            println!(
                "would replay {} id={} reason={} -> {dest}",
                e.head.position(),
                e.head.id_shown(),
                e.head.reason()
            );
            out.would_replay += 1;
            continue;
        }
        batch_bytes += e.payload_len.unwrap_or(0);
        batch.push((e, dest));
        if batch.len() >= BATCH || batch_bytes + collector.held_bytes() >= BATCH_BYTES {
            publisher.publish(std::mem::take(&mut batch), &mut state, &mut out).await?;
            batch_bytes = 0;
        }
    }
    publisher.publish(batch, &mut state, &mut out).await?;
    for l in collector.finish() {
        out.unusable.push(|| l.line());
    }

    out.no_destination.print();
    out.no_payload.print();
    out.unusable.print();
    if a.dry_run {
        println!(
            "dry run, nothing published or recorded: would replay {}, skipped {} (no destination), already done {}{}",
            out.would_replay,
            out.no_destination.count,
            out.already_done,
            out.extra(),
        );
        return Ok(0);
    }
    out.failures.print();
    println!(
        "replayed {}, skipped {} (no destination), already done {}{}",
        out.replayed,
        out.no_destination.count,
        out.already_done,
        out.extra(),
    );
    if let Some((event_id, topic, reason)) = out.first_failure {
        return Err(Definite::Delivery { event_id, topic, reason }.into());
    }
    Ok(0)
}

/// Sends batches; its clients are made at the first batch.
struct Publisher<'a> {
    common: &'a Common,
    clients: Option<(FutureProducer, AdminClient<DefaultClientContext>, StreamConsumer)>,
    /// Destination topic → whether it exists (or why it cannot be used).
    topics: BTreeMap<String, Result<(), String>>,
    /// The client for the sinks other than Kafka, made at the first batch.
    target: Option<Target>,
}

impl Publisher<'_> {
    /// Sends `batch`, waits for every ack, records the acked events and saves the state.
    async fn publish(
        &mut self,
        batch: Vec<(Entry, String)>,
        state: &mut State,
        out: &mut Outcome,
    ) -> Result<(), Error> {
        if batch.is_empty() {
            return Ok(());
        }
        if !matches!(self.common.via, Via::Kafka) {
            return self.publish_other(batch, state, out).await;
        }
        if self.clients.is_none() {
            self.clients = Some((self.common.producer()?, self.common.admin()?, self.common.consumer()?));
        }
        let Some((producer, admin, consumer)) = &self.clients else { return Ok(()) };
        let mut pending = Vec::with_capacity(batch.len());
        for (e, dest) in batch {
            if !self.topics.contains_key(&dest) {
                let ready = ensure_topic(admin, consumer, self.common, &dest).await;
                if let Err(why) = &ready {
                    tracing::error!(topic = %dest, "{why}");
                }
                self.topics.insert(dest.clone(), ready);
            }
            if let Some(Err(why)) = self.topics.get(&dest) {
                let why = why.clone();
                out.fail(&e, &dest, why);
                continue;
            }
            match send(producer, &e.head, &dest).await {
                Ok(f) => pending.push((e, dest, f)),
                Err(why) => out.fail(&e, &dest, why),
            }
        }
        let mut acked = 0usize;
        for (e, dest, f) in pending {
            match f.await {
                Ok(Ok(d)) => {
                    println!(
                        "sent {} id={} -> {dest} {}/{}",
                        e.head.position(),
                        e.head.id_shown(),
                        d.partition,
                        d.offset
                    );
                    for &(p, o) in &e.positions {
                        state.insert(p, o);
                    }
                    acked += 1;
                }
                Ok(Err((err, _))) => out.fail(&e, &dest, err.to_string()),
                Err(_) => out.fail(&e, &dest, "producer dropped the delivery report".into()),
            }
        }
        if acked > 0 {
            state.save()?;
            out.replayed += acked;
        }
        Ok(())
    }
}

impl Publisher<'_> {
    /// [`Publisher::publish`] through NATS or Redis: sends the batch, waits for every answer,
    /// records the events acked and saves the state.
    async fn publish_other(
        &mut self,
        batch: Vec<(Entry, String)>,
        state: &mut State,
        out: &mut Outcome,
    ) -> Result<(), Error> {
        if self.target.is_none() {
            self.target = self.common.target().await?;
        }
        let results = match &mut self.target {
            Some(Target::Nats(js)) => super::nats::send_batch(js, &batch).await,
            Some(Target::Redis(conn)) => super::redis::send_batch(conn, &batch).await,
            None => return Err(Definite::Bug("no replay client for this sink".into()).into()),
        };
        let mut acked = 0usize;
        for ((e, dest), result) in batch.iter().zip(results) {
            match result {
                Ok(at) => {
                    println!("sent {} id={} -> {dest} {at}", e.head.position(), e.head.id_shown());
                    for &(p, o) in &e.positions {
                        state.insert(p, o);
                    }
                    acked += 1;
                }
                Err(why) => out.fail(e, dest, why),
            }
        }
        if acked > 0 {
            state.save()?;
            out.replayed += acked;
        }
        Ok(())
    }
}

/// Enqueues the record for `dest`: original key, payload, timestamp, non-`outboxd.*` headers.
async fn send(producer: &FutureProducer, r: &DlqRecord, dest: &str) -> Result<DeliveryFuture, String> {
    let kept = r.headers.iter().filter(|(k, _)| !k.starts_with(PREFIX));
    let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
    for (k, v) in kept {
        headers = headers.insert(Header { key: k, value: v.as_deref() });
    }
    loop {
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(dest).headers(headers.clone());
        if let Some(k) = &r.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(p) = &r.payload {
            rec = rec.payload(p.as_slice());
        }
        if let Some(ts) = r.timestamp_ms {
            rec = rec.timestamp(ts);
        }
        match producer.send_result(rec) {
            Ok(f) => return Ok(f),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err((e, _)) => return Err(e.to_string()),
        }
    }
}

/// Creates `topic` unless the broker already knows it (broker defaults for partitions and
/// replication, see [`kafka_client::ensure_topic`]), then waits until the metadata shows it, so
/// the first send does not race the creation.
async fn ensure_topic(
    admin: &AdminClient<DefaultClientContext>,
    consumer: &StreamConsumer,
    common: &Common,
    topic: &str,
) -> Result<(), String> {
    if partition_count(consumer, topic, &common.kafka.brokers).map_err(|e| e.to_string())?.is_some() {
        return Ok(());
    }
    let k = &common.kafka;
    kafka_client::ensure_topic(
        admin,
        topic,
        k.topic_partitions,
        k.topic_replication_factor,
        Retry::For(Duration::from_secs(15)),
        &k.properties,
    )
    .await
    .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = partition_count(consumer, topic, &common.kafka.brokers) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("topic {topic:?} was created but does not show in the metadata"))
}
