//! `outboxd dlq list` and `outboxd dlq replay`.
//!
//! Both read every partition of `--dlq-topic` with `assign()` from the beginning (no group, no
//! commits) until 1.5 s pass without a record (5 s before the first; 5 min at most): watermarks are
//! not trusted to find the end. `replay` sends each matching record to `--to-topic` or its
//! `outboxd.original.topic` with the original key, payload, CreateTime and headers minus
//! `outboxd.*`, through an idempotent producer, creating a missing topic. Records without a
//! destination, or whose payload the DLQ did not keep (`outboxd.payload.size`, no value: sending
//! would make a tombstone), are reported and left for a later run.
//!
//! Progress: `<state-dir>/<dlq-topic>.offsets.json`, e.g.
//! `{"version":1,"dlq_topic":"outboxd.dlq","replayed":{"0":[[0,4],[7,7]]}}`: per DLQ partition,
//! the inclusive offset ranges of records republished *and acked*. Only those are marked, so
//! records skipped by a filter, without destination or whose delivery failed stay replayable by a
//! later run (a per-partition "next offset" could not say "3 done, 2 filtered out"). The file is
//! replaced atomically (temp, fsync, rename) after each acked batch of up to 1000; a crash between
//! ack and rename republishes that batch again (at-least-once). Delete it if the DLQ topic is
//! recreated; do not run two replays on one state dir at once. `--dry-run` writes nothing.
//! Records to replay are held in memory between reading and publishing.
//!
//! The consumer, producer and admin client come from [`crate::sink::kafka_client`], so
//! `--kafka-property` and `--kafka-property-file` mean here what they mean for `outboxd run`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, DefaultConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, Timestamp, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::{H_ERROR as H_REASON, H_LSN, H_MESSAGE, H_SIZE, H_TABLE, H_TOPIC, PREFIX};
use crate::config::{DlqCommand, DlqCommonArgs, DlqListArgs, DlqReplayArgs, KafkaConfig};
use crate::error::{Definite, Error};
use crate::sink::kafka_client::{self, Retry};

/// Stop reading this long after the last record.
const QUIET: Duration = Duration::from_millis(1500);
/// Before the first record, wait this long (connecting and the first fetch take a while).
const FIRST_RECORD_WAIT: Duration = Duration::from_secs(5);
/// Never read for longer than this (a DLQ that keeps growing).
const READ_CAP: Duration = Duration::from_secs(300);
/// Records sent before waiting for their acks and saving progress.
const BATCH: usize = 1000;
/// Per-record lines printed for skipped or failed records before summarising the rest.
const MAX_LINES: usize = 50;
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

const H_ID: &str = "id";

/// Returns the process exit code.
pub async fn run(cmd: DlqCommand) -> Result<u8, Error> {
    match cmd {
        DlqCommand::List(a) => list(&a).await,
        DlqCommand::Replay(a) => replay(&a).await,
    }
}

// ---------------------------------------------------------------------------
// reading the DLQ
// ---------------------------------------------------------------------------

/// One DLQ record as read back.
struct DlqRecord {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    /// Length of the payload as read (`list` drops the payload itself).
    payload_len: Option<usize>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    /// The record's CreateTime, kept on replay.
    timestamp_ms: Option<i64>,
}

impl DlqRecord {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v.as_deref().unwrap_or_default()).into_owned())
    }

    fn reason(&self) -> String {
        self.header(H_REASON).unwrap_or_else(|| "unknown".into())
    }

    fn event_id(&self) -> Option<String> {
        self.header(H_ID)
    }

    fn original_topic(&self) -> Option<String> {
        self.header(H_TOPIC).filter(|t| !t.is_empty())
    }

    /// The DLQ dropped the payload (too large to keep).
    fn payload_not_kept(&self) -> bool {
        self.payload.is_none() && self.header(H_SIZE).is_some()
    }

    fn position(&self) -> String {
        format!("{}/{}", self.partition, self.offset)
    }

    fn id_shown(&self) -> String {
        self.event_id().unwrap_or_else(|| "-".into())
    }
}

/// Validated common flags.
struct Common {
    kafka: KafkaConfig,
    topic: String,
}

impl Common {
    fn from_args(a: &DlqCommonArgs) -> Result<Common, Definite> {
        if a.kafka_brokers.trim().is_empty() {
            return Err(Definite::Config("--kafka-brokers is empty; give host:port[,host:port]".into()));
        }
        if a.dlq_topic.is_empty() {
            return Err(Definite::Config("--dlq-topic must not be empty (default outboxd.dlq)".into()));
        }
        let (properties, property_file) =
            KafkaConfig::load_properties(&[], a.kafka_property_file.as_deref(), &a.kafka_properties)?;
        Ok(Common {
            kafka: KafkaConfig {
                brokers: a.kafka_brokers.clone(),
                properties,
                property_file,
                // Topics replay creates take the broker's defaults.
                topic_partitions: -1,
                topic_replication_factor: -1,
            },
            topic: a.dlq_topic.clone(),
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
        ];
        let c = kafka_client::consumer_config(&self.kafka, "outboxd-dlq-tool", &defaults);
        kafka_client::create(&c, DefaultConsumerContext, "consumer", &self.kafka)
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

/// Partition count of `topic`, `None` when the broker does not know it.
fn partition_count(consumer: &StreamConsumer, topic: &str, brokers: &str) -> Result<Option<i32>, Definite> {
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

/// Reads the whole DLQ, handing each record to `each`. Returns the partition count, or `None`
/// when the topic does not exist.
async fn read_dlq(common: &Common, mut each: impl FnMut(DlqRecord)) -> Result<Option<i32>, Error> {
    let consumer = common.consumer()?;
    let Some(partitions) = partition_count(&consumer, &common.topic, &common.kafka.brokers)? else {
        return Ok(None);
    };
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&common.topic, p, Offset::Beginning)
            .map_err(|e| Definite::Bug(format!("assigning {}/{p}: {e}", common.topic)))?;
    }
    consumer.assign(&tpl).map_err(|e| Definite::Setup(format!("cannot assign {} partitions: {e}", common.topic)))?;

    let start = Instant::now();
    let cap = start + READ_CAP;
    let mut last_record: Option<Instant> = None;
    let mut count = 0u64;
    loop {
        let quiet_end = match last_record {
            Some(t) => t + QUIET,
            None => start + FIRST_RECORD_WAIT,
        };
        let now = Instant::now();
        if now >= cap {
            tracing::warn!(
                records = count,
                "stopped reading {} after {:?}; it is still growing, results are partial",
                common.topic,
                READ_CAP
            );
            break;
        }
        if now >= quiet_end {
            break;
        }
        let wait = quiet_end.min(cap) - now;
        match tokio::time::timeout(wait, consumer.recv()).await {
            Err(_) => {}
            Ok(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|hs| hs.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
                    .unwrap_or_default();
                let timestamp_ms = match m.timestamp() {
                    Timestamp::CreateTime(t) => Some(t),
                    _ => None,
                };
                each(DlqRecord {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec),
                    payload_len: m.payload().map(<[u8]>::len),
                    headers,
                    timestamp_ms,
                });
                count += 1;
                last_record = Some(Instant::now());
            }
            Ok(Err(KafkaError::PartitionEOF(_))) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "reading {}", common.topic),
        }
    }
    tracing::debug!(records = count, partitions, "read {}", common.topic);
    Ok(Some(partitions))
}

// ---------------------------------------------------------------------------
// dlq list
// ---------------------------------------------------------------------------

async fn list(a: &DlqListArgs) -> Result<u8, Error> {
    let common = Common::from_args(&a.common)?;
    let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
    let mut rows: Vec<DlqRecord> = Vec::new();
    let partitions = read_dlq(&common, |mut r| {
        *by_reason.entry(r.reason()).or_default() += 1;
        r.payload = None; // not shown; keeps memory small
        rows.push(r);
    })
    .await?;
    rows.sort_by_key(|r| (r.partition, r.offset));
    let total = rows.len();
    rows.truncate(a.limit);

    if a.json {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "partition": r.partition,
                    "offset": r.offset,
                    "event_id": r.event_id(),
                    "reason": r.reason(),
                    "original_topic": r.original_topic(),
                    "message": r.header(H_MESSAGE),
                    "key": r.key.as_deref().map(|k| String::from_utf8_lossy(k).into_owned()),
                    "payload_bytes": r.payload_len,
                    "original_payload_size": r.header(H_SIZE).and_then(|s| s.parse::<u64>().ok()),
                    "source_lsn": r.header(H_LSN),
                    "source_table": r.header(H_TABLE),
                })
            })
            .collect();
        let out = serde_json::json!({
            "dlq_topic": common.topic,
            "exists": partitions.is_some(),
            "partitions": partitions.unwrap_or(0),
            "total": total,
            "by_reason": by_reason,
            "records": records,
        });
        println!("{out}");
        return Ok(0);
    }

    let Some(partitions) = partitions else {
        println!("{}: topic does not exist (no dead letters yet)", common.topic);
        return Ok(0);
    };
    println!(
        "{}: {total} record{} in {partitions} partition{}",
        common.topic,
        if total == 1 { "" } else { "s" },
        if partitions == 1 { "" } else { "s" }
    );
    let width = by_reason.keys().map(String::len).max().unwrap_or(0);
    for (reason, n) in &by_reason {
        println!("  {reason:<width$}  {n}");
    }
    if !rows.is_empty() {
        println!("first {} of {total}:", rows.len());
        println!("  PART/OFFSET\tEVENT ID\tREASON\tORIGINAL TOPIC\tMESSAGE");
        for r in &rows {
            println!(
                "  {}\t{}\t{}\t{}\t{}",
                r.position(),
                r.id_shown(),
                r.reason(),
                r.original_topic().unwrap_or_else(|| "-".into()),
                one_line(&r.header(H_MESSAGE).unwrap_or_default()),
            );
        }
    }
    Ok(0)
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r', '\t'], " ")
}

// ---------------------------------------------------------------------------
// replay progress
// ---------------------------------------------------------------------------

/// A set of offsets kept as disjoint inclusive ranges (start → end).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct OffsetSet(BTreeMap<i64, i64>);

impl OffsetSet {
    fn contains(&self, o: i64) -> bool {
        self.0.range(..=o).next_back().is_some_and(|(_, &end)| end >= o)
    }

    fn insert(&mut self, o: i64) {
        if self.contains(o) {
            return;
        }
        let mut start = o;
        let mut end = o;
        if let Some((&s, &e)) = self.0.range(..o).next_back() {
            if e.checked_add(1) == Some(o) {
                start = s;
            }
        }
        if let Some(next_end) = o.checked_add(1).and_then(|n| self.0.remove(&n)) {
            end = next_end;
        }
        self.0.insert(start, end);
    }

    fn ranges(&self) -> Vec<(i64, i64)> {
        self.0.iter().map(|(&s, &e)| (s, e)).collect()
    }

    fn from_ranges(ranges: &[(i64, i64)]) -> Option<OffsetSet> {
        let mut set = OffsetSet::default();
        for &(s, e) in ranges {
            if s > e || s < 0 {
                return None;
            }
            // Ranges are few and small to rebuild; merge by inserting the endpoints' span.
            set.insert_range(s, e);
        }
        Some(set)
    }

    fn insert_range(&mut self, s: i64, e: i64) {
        // Absorb every range overlapping or adjacent to [s, e].
        let mut start = s;
        let mut end = e;
        let touching: Vec<i64> = self
            .0
            .range(..=e.saturating_add(1))
            .filter(|(_, &re)| re >= s.saturating_sub(1))
            .map(|(&rs, _)| rs)
            .collect();
        for rs in touching {
            let re = self.0.remove(&rs).unwrap_or(rs);
            start = start.min(rs);
            end = end.max(re);
        }
        self.0.insert(start, end);
    }
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    dlq_topic: String,
    /// partition → inclusive offset ranges republished and acknowledged.
    replayed: BTreeMap<i32, Vec<(i64, i64)>>,
}

struct State {
    path: PathBuf,
    topic: String,
    replayed: BTreeMap<i32, OffsetSet>,
}

impl State {
    fn path_for(dir: &Path, topic: &str) -> PathBuf {
        dir.join(format!("{topic}.offsets.json"))
    }

    fn load(dir: &Path, topic: &str) -> Result<State, Definite> {
        let path = Self::path_for(dir, topic);
        let mut state = State { path: path.clone(), topic: topic.to_owned(), replayed: BTreeMap::new() };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(state),
            Err(e) => return Err(Definite::Setup(format!("cannot read replay state {}: {e}", path.display()))),
        };
        let bad = |why: String| {
            Definite::Config(format!(
                "replay state {} is unusable ({why}); fix or remove it (removing it allows republishing everything)",
                path.display()
            ))
        };
        let file: StateFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if file.version != 1 {
            return Err(bad(format!("version {} is not 1", file.version)));
        }
        if file.dlq_topic != topic {
            return Err(bad(format!("it belongs to DLQ topic {:?}, not {topic:?}", file.dlq_topic)));
        }
        for (p, ranges) in file.replayed {
            let set =
                OffsetSet::from_ranges(&ranges).ok_or_else(|| bad(format!("bad offset range in partition {p}")))?;
            state.replayed.insert(p, set);
        }
        Ok(state)
    }

    fn contains(&self, partition: i32, offset: i64) -> bool {
        self.replayed.get(&partition).is_some_and(|s| s.contains(offset))
    }

    fn insert(&mut self, partition: i32, offset: i64) {
        self.replayed.entry(partition).or_default().insert(offset);
    }

    /// Write temp, fsync, rename over, fsync the directory.
    fn save(&self) -> Result<(), Definite> {
        let fail = |what: &str, e: std::io::Error| {
            Definite::Setup(format!(
                "cannot save replay state {} ({what}): {e}; records replayed in this batch may be republished by the next run",
                self.path.display()
            ))
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| fail("create directory", e))?;
        let file = StateFile {
            version: 1,
            dlq_topic: self.topic.clone(),
            replayed: self.replayed.iter().map(|(&p, s)| (p, s.ranges())).collect(),
        };
        let mut text =
            serde_json::to_string(&file).map_err(|e| Definite::Bug(format!("serialising replay state: {e}")))?;
        text.push('\n');
        let tmp = self.path.with_extension(format!("json.tmp.{}", std::process::id()));
        {
            let mut f = std::fs::File::create(&tmp).map_err(|e| fail("create temp file", e))?;
            f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(|e| fail("write temp file", e))?;
        }
        std::fs::rename(&tmp, &self.path).map_err(|e| fail("rename", e))?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// dlq replay
// ---------------------------------------------------------------------------

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
    let mut state = State::load(&a.state_dir, &common.topic)?;

    let mut to_replay: Vec<(DlqRecord, String)> = Vec::new();
    let mut no_destination: Vec<DlqRecord> = Vec::new();
    let mut no_payload: Vec<DlqRecord> = Vec::new();
    let mut already_done = 0u64;
    let exists = read_dlq(&common, |r| {
        if a.filter_reason.as_ref().is_some_and(|want| *want != r.reason()) {
            return;
        }
        if a.event_id.as_ref().is_some_and(|want| Some(want) != r.event_id().as_ref()) {
            return;
        }
        if state.contains(r.partition, r.offset) {
            already_done += 1;
            return;
        }
        let dest = a.to_topic.clone().or_else(|| r.original_topic());
        let Some(dest) = dest.filter(|d| *d != common.topic) else {
            no_destination.push(r);
            return;
        };
        if r.payload_not_kept() {
            no_payload.push(r);
            return;
        }
        to_replay.push((r, dest));
    })
    .await?
    .is_some();
    if !exists {
        println!("{}: topic does not exist (no dead letters yet)", common.topic);
    }
    to_replay.sort_by_key(|(r, _)| (r.partition, r.offset));
    no_destination.sort_by_key(|r| (r.partition, r.offset));
    no_payload.sort_by_key(|r| (r.partition, r.offset));

    report_lines(&no_destination, "skipped (no original topic; use --to-topic)", |r| {
        format!("{} id={} reason={}", r.position(), r.id_shown(), r.reason())
    });
    report_lines(&no_payload, "skipped (the DLQ did not keep the payload)", |r| {
        format!(
            "{} id={} reason={} size={}",
            r.position(),
            r.id_shown(),
            r.reason(),
            r.header(H_SIZE).unwrap_or_default()
        )
    });

    if a.dry_run {
        for (r, dest) in &to_replay {
            println!("would replay {} id={} reason={} -> {dest}", r.position(), r.id_shown(), r.reason());
        }
        println!(
            "dry run, nothing published or recorded: would replay {}, skipped {} (no destination), already done {already_done}{}",
            to_replay.len(),
            no_destination.len(),
            extra_summary(no_payload.len(), 0),
        );
        return Ok(0);
    }

    // (position, event id, destination, reason)
    let mut failures: Vec<(String, String, String, String)> = Vec::new();
    let failed = |r: &DlqRecord, dest: &str, why: String| (r.position(), r.id_shown(), dest.to_owned(), why);
    let mut replayed = 0usize;
    if !to_replay.is_empty() {
        let producer = common.producer()?;
        let admin = common.admin()?;
        let consumer = common.consumer()?;
        let destinations: BTreeSet<String> = to_replay.iter().map(|(_, d)| d.clone()).collect();
        let mut unusable: BTreeMap<String, String> = BTreeMap::new();
        for d in &destinations {
            if let Err(e) = ensure_topic(&admin, &consumer, &common, d).await {
                tracing::error!(topic = %d, "{e}");
                unusable.insert(d.clone(), e);
            }
        }
        let (ready, blocked): (Vec<_>, Vec<_>) = to_replay.into_iter().partition(|(_, d)| !unusable.contains_key(d));
        for (r, d) in blocked {
            failures.push(failed(&r, &d, unusable[&d].clone()));
        }

        let mut queue = ready.into_iter().peekable();
        while queue.peek().is_some() {
            let batch: Vec<(DlqRecord, String)> = queue.by_ref().take(BATCH).collect();
            let mut pending = Vec::with_capacity(batch.len());
            for (i, (r, dest)) in batch.iter().enumerate() {
                match send(&producer, r, dest).await {
                    Ok(f) => pending.push((i, f)),
                    Err(e) => failures.push(failed(r, dest, e)),
                }
            }
            let mut acked = 0usize;
            for (i, f) in pending {
                let (r, dest) = &batch[i];
                match f.await {
                    Ok(Ok(d)) => {
                        println!("sent {} id={} -> {dest} {}/{}", r.position(), r.id_shown(), d.partition, d.offset);
                        state.insert(r.partition, r.offset);
                        acked += 1;
                    }
                    Ok(Err((e, _))) => failures.push(failed(r, dest, e.to_string())),
                    Err(_) => failures.push(failed(r, dest, "producer dropped the delivery report".into())),
                }
            }
            if acked > 0 {
                state.save()?;
                replayed += acked;
            }
        }
    }

    report_lines(&failures, "FAILED (not recorded; a later run retries them)", |(pos, id, dest, why)| {
        format!("{pos} id={id} -> {dest}: {why}")
    });
    println!(
        "replayed {replayed}, skipped {} (no destination), already done {already_done}{}",
        no_destination.len(),
        extra_summary(no_payload.len(), failures.len()),
    );
    if let Some((_, event_id, topic, reason)) = failures.into_iter().next() {
        return Err(Definite::Delivery { event_id, topic, reason }.into());
    }
    Ok(0)
}

fn extra_summary(no_payload: usize, failed: usize) -> String {
    let mut s = String::new();
    if no_payload > 0 {
        s.push_str(&format!(", skipped {no_payload} (payload not kept)"));
    }
    if failed > 0 {
        s.push_str(&format!(", failed {failed}"));
    }
    s
}

/// Prints one line per record (at most [`MAX_LINES`]) under a heading.
fn report_lines<T>(records: &[T], heading: &str, line: impl Fn(&T) -> String) {
    if records.is_empty() {
        return;
    }
    println!("{} {heading}:", records.len());
    for r in records.iter().take(MAX_LINES) {
        println!("  {}", line(r));
    }
    if records.len() > MAX_LINES {
        println!("  ... and {} more", records.len() - MAX_LINES);
    }
}

/// Enqueues the record for `dest`: original key, payload, timestamp, non-`outboxd.*` headers.
async fn send(
    producer: &FutureProducer,
    r: &DlqRecord,
    dest: &str,
) -> Result<rdkafka::producer::DeliveryFuture, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_set_merges_neighbours() {
        let mut s = OffsetSet::default();
        for o in [5, 3, 4, 10, 0, 11, 9] {
            s.insert(o);
        }
        assert_eq!(s.ranges(), vec![(0, 0), (3, 5), (9, 11)]);
        assert!(s.contains(4) && s.contains(11) && !s.contains(6) && !s.contains(1));
        s.insert(1);
        s.insert(2);
        assert_eq!(s.ranges(), vec![(0, 5), (9, 11)]);
        s.insert(4);
        assert_eq!(s.ranges(), vec![(0, 5), (9, 11)]);
    }

    #[test]
    fn offset_set_from_ranges_normalises_and_rejects_bad() {
        let s = OffsetSet::from_ranges(&[(5, 7), (0, 2), (3, 4), (10, 10)]).unwrap();
        assert_eq!(s.ranges(), vec![(0, 7), (10, 10)]);
        assert!(OffsetSet::from_ranges(&[(4, 3)]).is_none());
        assert!(OffsetSet::from_ranges(&[(-1, 3)]).is_none());
    }

    #[test]
    fn state_round_trips_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("nested");
        let mut st = State::load(&sub, "outboxd.dlq").unwrap();
        assert!(!st.contains(0, 0));
        st.insert(0, 0);
        st.insert(0, 1);
        st.insert(2, 7);
        st.save().unwrap();
        let text = std::fs::read_to_string(sub.join("outboxd.dlq.offsets.json")).unwrap();
        assert_eq!(text.trim(), r#"{"version":1,"dlq_topic":"outboxd.dlq","replayed":{"0":[[0,1]],"2":[[7,7]]}}"#);
        let again = State::load(&sub, "outboxd.dlq").unwrap();
        assert!(again.contains(0, 1) && again.contains(2, 7) && !again.contains(2, 6));
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1, "no temp file left");
        std::fs::write(sub.join("other.offsets.json"), text).unwrap();
        assert!(State::load(&sub, "other").is_err());
    }
}
