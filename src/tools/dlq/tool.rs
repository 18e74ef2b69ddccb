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
//! The consumer, producer and admin client come from [`crate::sink::kafka::client`], so
//! `--kafka-property` and `--kafka-property-file` mean here what they mean for `outboxd run`.
//!
//! `--sink` picks where the DLQ lives, as for `outboxd run`: Kafka (the default, as above), NATS
//! JetStream ([`crate::sink::nats::dlq`]) or Redis Streams ([`crate::sink::redis::dlq`]), with that sink's own
//! connection flags. Only the record source ([`Source`]) and the republishing client ([`Target`])
//! differ; collecting, chunk joining, filters, batching and the progress state are the same code
//! for all three, so the guarantees are too: a batch is recorded only after every event in it was
//! acknowledged (PubAck, XADD reply). Each sink's state file is its own: `<dlq-topic>` (Kafka),
//! `nats.<subject>`, `redis.<percent-encoded key>`. The other sinks are refused with one line
//! saying why ([`super::sinks`]).
//!
//! SQS ([`crate::sink::sqs::dlq`]) differs in progress only: its queue is the progress. Replay
//! goes a batch (up to 10) a receive, deletes the copies of the events the queue accepted after
//! each batch ([`Source::replayed`]), reads on while deleting frees more ([`Source::again`]), and
//! at the end makes the copies it left visible again ([`Source::release`]); nothing is saved.

use std::collections::BTreeMap;

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::FutureProducer;

use super::chunk;
use super::entry::{Collector, Entry, Fed};
use super::report::{unreadable_line, Report};
use super::sinks::{ensure_topic, send, Common, Source, Target, Via};
use super::state::State;
use super::{H_LSN, H_MESSAGE, H_PAYLOAD_DROPPED, H_SEQ, H_SIZE, H_TABLE};
use crate::config::{DlqCommand, DlqListArgs, DlqReplayArgs};
use crate::error::{Definite, Error};
use crate::sink::dead_letter::held::Held;
use crate::sink::dead_letter::DlqRecord;
use crate::sink::kafka::reader::StreamReader;

/// Events sent before waiting for their acks and saving progress.
const BATCH: usize = 1000;
/// Payload bytes held before publishing what is ready.
const BATCH_BYTES: usize = 32 << 20;

/// Returns the process exit code.
pub async fn run(cmd: DlqCommand) -> Result<u8, Error> {
    match cmd {
        DlqCommand::List(a) => list(&a).await,
        DlqCommand::Replay(a) => replay(&a).await,
    }
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
    let mut unreached = None;
    if let Some(mut reader) = common.source(None).await? {
        partitions = Some(match &reader {
            Source::Kafka(r) => r.partitions(),
            Source::Nats(r) => {
                stream_name = Some(r.stream_name().to_owned());
                1
            }
            Source::Redis(_) | Source::Rabbitmq(_) | Source::Sqs(_) => 1,
            Source::Kinesis(r) => i32::try_from(r.shards()).unwrap_or(i32::MAX),
        });
        // Read in a block so that the copies held are released on an error too.
        let read = async {
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
            Ok::<(), Error>(())
        }
        .await;
        unreached = if read.is_ok() { reader.unreached().await } else { None };
        reader.release().await;
        read?;
    }
    let leftovers = collector.finish();
    rows.sort_by_key(|e| (e.head.partition, e.head.offset));
    let position_heading = match common.via {
        Via::Kafka => "PART/OFFSET",
        Via::Nats(_) => "0/SEQUENCE",
        Via::Redis(_) => "ENTRY ID",
        Via::Rabbitmq(..) => "0/OFFSET",
        Via::Sqs(_) => "MESSAGE ID",
        Via::Kinesis(..) => "SHARD/SEQUENCE",
    };
    let total = rows.len();
    rows.truncate(a.limit);

    if a.json {
        let records: Vec<serde_json::Value> = rows.iter().map(entry_json).collect();
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
            "sink": match common.via {
                Via::Kafka => "kafka",
                Via::Nats(_) => "nats",
                Via::Redis(_) => "redis",
                Via::Rabbitmq(..) => "rabbitmq",
                Via::Sqs(_) => "sqs",
                Via::Kinesis(..) => "kinesis",
            },
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
        (Via::Rabbitmq(_, q), _) => println!("{}: {total} record{plural} in RabbitMQ stream queue {q}", common.topic),
        (Via::Sqs(_), _) => println!("{}: {total} record{plural} in the SQS queue", common.topic),
        (Via::Kinesis(..), _) => println!("{}: {total} record{plural} in the Kinesis stream", common.topic),
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
    if let Some(n) = unreached {
        println!("{n} more in the queue not reached (a FIFO group is handed out no further while its earlier copies are held; they are not counted above)");
    }
    Ok(0)
}

/// One dead-lettered record as `dlq list --json` shows it.
fn entry_json(e: &Entry) -> serde_json::Value {
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
        // As restored (the original names and values), text shown lossily.
        "headers": r.headers.iter().map(|(k, v)| {
            serde_json::json!([k, v.as_deref().map(|v| String::from_utf8_lossy(v).into_owned())])
        }).collect::<Vec<_>>(),
    })
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
    let sqs = matches!(common.via, Via::Sqs(_));
    // SQS and Kinesis keep their own progress (the queue; the reader's file), never the State's.
    let own_progress = sqs || matches!(common.via, Via::Kinesis(..));
    if own_progress && a.to_topic.is_none() && common.default_destination().is_none() {
        return Err(Definite::Config(
            "outboxd dlq replay needs where the events go back to: --sqs-queue-url (--sink sqs), --sns-topic-arn (--sink sns), --kinesis-stream (--sink kinesis) or --to-topic"
                .into(),
        )
        .into());
    }
    // SQS: the queue is the progress (a replayed copy is deleted), so nothing is kept on disk.
    let mut state = if own_progress {
        State::unsaved(&common.state_name())
    } else {
        State::load(&a.state_dir, &common.state_name())?
    };
    // SQS: a batch a receive, so copies are deleted (and a FIFO group freed) as replay goes.
    let batch_max = if sqs { 10 } else { BATCH };
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
    let mut publisher =
        Publisher { common: &common, clients: None, topics: BTreeMap::new(), target: None, held: Held::default() };
    let mut collector = Collector::default();
    let mut batch: Vec<(Entry, String)> = Vec::new();
    let mut batch_bytes = 0usize;

    let Some(mut reader) = common.source(Some(&a.state_dir)).await? else {
        println!("{}", common.absent());
        println!("replayed 0, skipped 0 (no destination), already done 0");
        return Ok(0);
    };
    let unwanted = |r: &DlqRecord| {
        a.filter_reason.as_ref().is_some_and(|want| *want != r.reason())
            || a.event_id.as_ref().is_some_and(|want| Some(want) != r.event_id().as_ref())
    };
    // Read and send in a block so that the copies held are released on an error too.
    let read = async {
        loop {
            while let Some(r) = reader.next().await? {
                // Every chunk carries the event's headers, so filters apply record by record; a chunk
                // whose headers partly moved into the body is judged once joined.
                if !r.moved_later && unwanted(&r) {
                    continue;
                }
                if state.contains(r.partition, r.offset) {
                    if collector.seen_done(&r) {
                        out.already_done += 1;
                    }
                    continue;
                }
                let e = match collector.feed(r) {
                    Fed::Entry(e) if unwanted(&e.head) => continue,
                    Fed::Entry(e) => e,
                    Fed::Pending => continue,
                    Fed::Unreadable(r, why) => {
                        publisher.held.hold(r.key.as_deref());
                        out.unusable.push(|| unreadable_line(&r, &why));
                        continue;
                    }
                };
                let dest =
                    a.to_topic.clone().or_else(|| common.default_destination()).or_else(|| e.head.original_topic());
                let Some(dest) = dest.filter(|d| *d != common.topic) else {
                    publisher.held.hold(e.head.key.as_deref());
                    out.no_destination
                        .push(|| format!("{} id={} reason={}", e.head.position(), e.head.id_shown(), e.head.reason()));
                    continue;
                };
                if e.head.payload_not_kept() {
                    publisher.held.hold(e.head.key.as_deref());
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
                publisher.held.pushed();
                if batch.len() >= batch_max || batch_bytes + collector.held_bytes() >= BATCH_BYTES {
                    let done = publisher.publish(std::mem::take(&mut batch), &mut state, &mut out).await?;
                    reader.replayed(&done).await?;
                    batch_bytes = 0;
                }
            }
            let done = publisher.publish(std::mem::take(&mut batch), &mut state, &mut out).await?;
            reader.replayed(&done).await?;
            batch_bytes = 0;
            if !reader.again() {
                break;
            }
        }
        Ok::<(), Error>(())
    }
    .await;
    let unreached = if read.is_ok() && !a.dry_run { reader.unreached().await } else { None };
    reader.release().await;
    read?;
    if let Source::Kinesis(r) = &reader {
        out.already_done += r.skipped();
    }
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
    if let Some(n) = unreached {
        eprintln!(
            "error: {n} dead letters in {} were not reached: SQS hands out no more of a FIFO group while copies of it are held (filtered out, without a destination or incomplete); run replay again without the filter, or move those copies",
            common.topic
        );
        return Ok(1);
    }
    Ok(0)
}

/// Sends batches; its clients are made at the first batch.
struct Publisher<'a> {
    common: &'a Common,
    clients: Option<(FutureProducer, AdminClient<DefaultClientContext>, StreamReader)>,
    /// Destination topic → whether it exists (or why it cannot be used).
    topics: BTreeMap<String, Result<(), String>>,
    /// The client for the sinks other than Kafka, made at the first batch.
    target: Option<Target>,
    /// SQS, Kinesis: keys of copies held without being replayed (no destination, no payload,
    /// unreadable), whose later events must not be sent in this run.
    held: Held,
}

impl Publisher<'_> {
    /// Sends `batch`, waits for every ack, records the acked events and saves the state; the
    /// DLQ positions of the acked events.
    async fn publish(
        &mut self,
        batch: Vec<(Entry, String)>,
        state: &mut State,
        out: &mut Outcome,
    ) -> Result<Vec<(i32, i64)>, Error> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        if !matches!(self.common.via, Via::Kafka) {
            return self.publish_other(batch, state, out).await;
        }
        if self.clients.is_none() {
            self.clients = Some((self.common.producer()?, self.common.admin()?, self.common.consumer()?));
        }
        let Some((producer, admin, consumer)) = &self.clients else { return Ok(Vec::new()) };
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
        let mut done = Vec::new();
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
                    done.extend_from_slice(&e.positions);
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
        Ok(done)
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
    ) -> Result<Vec<(i32, i64)>, Error> {
        if self.target.is_none() {
            self.target = self.common.target().await?;
        }
        let results = match &mut self.target {
            Some(Target::Nats(js)) => crate::sink::nats::dlq::send_batch(js, &batch).await,
            Some(Target::Redis(conn)) => crate::sink::redis::dlq::send_batch(conn, &batch).await,
            Some(Target::Rabbitmq { chan, exchange, .. }) => {
                crate::sink::rabbitmq::dlq::send_batch(chan, exchange, &batch).await
            }
            Some(Target::Sqs(t)) => crate::sink::sqs::dlq::send_batch(t, &batch, &self.held).await,
            Some(Target::Kinesis(t)) => crate::sink::kinesis::replay::send_batch(t, &batch, &self.held).await,
            None => return Err(Definite::Bug("no replay client for this sink".into()).into()),
        };
        let mut acked = 0usize;
        let mut done = Vec::new();
        for ((e, dest), result) in batch.iter().zip(results) {
            match result {
                Ok(at) => {
                    println!("sent {} id={} -> {dest} {at}", e.head.position(), e.head.id_shown());
                    for &(p, o) in &e.positions {
                        state.insert(p, o);
                    }
                    done.extend_from_slice(&e.positions);
                    acked += 1;
                }
                Err(why) => out.fail(e, dest, why),
            }
        }
        if acked > 0 {
            state.save()?;
            out.replayed += acked;
        }
        Ok(done)
    }
}
