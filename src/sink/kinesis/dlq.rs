//! `outboxd dlq` against `--sink kinesis`: reading the dead-letter copies the Kinesis sink put to
//! `--kinesis-dlq-stream` (JSON envelopes, [`super::record::envelope`]), and replay's progress.
//!
//! Reading ([`KinesisReader::open`]) lists the stream's shards (by shard id), reads each from its
//! start (`TRIM_HORIZON`, or after the shard's checkpoint, below) with `GetRecords` until a read
//! brings nothing and the shard is at its tip (or closed), and hands the copies out in the order
//! they were dead-lettered: by their source position (`outboxd.source.lsn`, then
//! `outboxd.source.seq`), then arrival time, then shard and sequence. A copy's partition key is its
//! event id, so one key's copies may be in different shards: reading shard by shard would replay
//! a key out of order. Everything is read before the first copy is handed out (the dead-letter
//! stream is small, and its copies are capped at 1 MiB each). Nothing is consumed: Kinesis keeps
//! records for the stream's retention, whatever reads them. A request that gets no answer or is
//! throttled is tried again until `--read-timeout` passes without one; reading then fails.
//!
//! Positions: a copy is at `shard/sequence number` (what `list` shows). For the tool, whose
//! progress is numbers, a copy's partition is its shard's place in the list of shards, and its
//! offset its place in this run's reading of that shard; neither is kept between runs.
//!
//! Replay's progress is the reader's own file ([`super::progress`]): per shard, a checkpoint
//! (every record up to that sequence number was replayed, or already done) and the sequence
//! numbers replayed past it. It is written after each batch the main stream accepted
//! ([`KinesisReader::replayed`]), never before. A run resumes after each
//! shard's checkpoint (`AFTER_SEQUENCE_NUMBER`) and skips the copies named done. Copies left out
//! (filtered, no destination, failed) are not marked, so the checkpoint stays before them and a
//! later run reads them again. A replay killed between the main stream's answer and the write
//! sends that batch again next time: nothing is lost, and those events are in the main stream
//! twice (Kinesis has no deduplication; at most one batch, 1000 events).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::error::ProvideErrorMetadata;
use aws_sdk_kinesis::types::{Record as KRecord, ShardIteratorType};
use aws_sdk_kinesis::Client;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::progress::{Identity, Progress};
use crate::error::{Definite, Error};
use crate::sink::aws::{class_of, sdk_config, AwsConfig, Class};
use crate::sink::dead_letter::{DlqRecord, H_LSN, H_SEQ};

/// Records asked for in one `GetRecords`.
const PAGE: i32 = 1000;

/// Reads `--kinesis-dlq-stream`; see the module doc.
pub struct KinesisReader {
    records: std::vec::IntoIter<DlqRecord>,
    shards: usize,
    /// (shard place, offset) → (shard id, sequence number), for this run.
    seqs: HashMap<(i32, i64), (String, String)>,
    /// Per shard id: the sequence numbers read in this run, in order (done ones too).
    read: BTreeMap<String, Vec<String>>,
    progress: Option<Progress>,
    skipped: u64,
}

/// A copy as read, with what orders it.
struct Read {
    order: (Option<u64>, Option<i64>, i64, i32, i64),
    record: DlqRecord,
}

impl KinesisReader {
    /// Read all of `stream`; `state_dir` for replay (its progress), `None` for `list`. `None`
    /// when the stream holds no copy to read.
    pub async fn open(
        aws: &AwsConfig,
        stream: &str,
        state_dir: Option<&Path>,
        timeout: Duration,
    ) -> Result<Option<KinesisReader>, Error> {
        let client = Client::new(&sdk_config(aws).await);
        let progress = match state_dir {
            Some(d) => Some(Progress::load(d, &identity(&client, stream, timeout).await?)?),
            None => None,
        };
        let mut shard_ids = list_shards(&client, stream, timeout).await?;
        shard_ids.sort();
        let mut all: Vec<Read> = Vec::new();
        let mut seqs = HashMap::new();
        let mut read: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut skipped = 0;
        for (place, shard) in shard_ids.iter().enumerate() {
            let place = i32::try_from(place).unwrap_or(i32::MAX);
            let p = progress.as_ref().and_then(|p| p.shards.get(shard)).cloned().unwrap_or_default();
            let mut offset = 0i64;
            for k in read_shard(&client, stream, shard, p.after.as_deref(), timeout).await? {
                let seq = k.sequence_number().to_owned();
                read.entry(shard.clone()).or_default().push(seq.clone());
                if p.done.contains(&seq) {
                    skipped += 1;
                    continue;
                }
                let record = record(&k, shard, place, offset);
                let arrival = k.approximate_arrival_timestamp().map_or(0, |t| t.to_millis().unwrap_or(0));
                let lsn = record.header(H_LSN).and_then(|l| l.parse::<crate::lsn::Lsn>().ok()).map(|l| l.0);
                let pseq = record.header(H_SEQ).and_then(|s| s.parse::<i64>().ok());
                seqs.insert((place, offset), (shard.clone(), seq));
                all.push(Read { order: (lsn, pseq, arrival, place, offset), record });
                offset += 1;
            }
        }
        // Nothing past the checkpoints is still a run that replays nothing, not an empty stream.
        let resumed = progress.as_ref().is_some_and(|p| p.shards.values().any(|s| s.after.is_some()));
        if all.is_empty() && skipped == 0 && !resumed {
            return Ok(None);
        }
        all.sort_by_key(|r| r.order);
        let records: Vec<DlqRecord> = all.into_iter().map(|r| r.record).collect();
        Ok(Some(KinesisReader { records: records.into_iter(), shards: shard_ids.len(), seqs, read, progress, skipped }))
    }

    pub fn next(&mut self) -> Option<DlqRecord> {
        self.records.next()
    }

    /// The stream's shards.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// Copies passed over because an earlier run replayed them.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The copies at `positions` were replayed and the main stream accepted them: mark them done,
    /// move each shard's checkpoint past the done records at its head, and write the file.
    pub fn replayed(&mut self, positions: &[(i32, i64)]) -> Result<(), Definite> {
        let Some(progress) = &mut self.progress else { return Ok(()) };
        if positions.is_empty() {
            return Ok(());
        }
        for p in positions {
            if let Some((shard, seq)) = self.seqs.get(p) {
                progress.shards.entry(shard.clone()).or_default().done.insert(seq.clone());
            }
        }
        for (shard, seqs) in &self.read {
            let Some(sp) = progress.shards.get_mut(shard) else { continue };
            let start = sp.after.as_ref().map_or(0, |a| seqs.iter().position(|s| s == a).map_or(0, |i| i + 1));
            for s in &seqs[start.min(seqs.len())..] {
                if !sp.done.remove(s) {
                    break;
                }
                sp.after = Some(s.clone());
            }
        }
        progress.save()
    }
}

/// What names the stream replay reads, for its progress file (`DescribeStreamSummary`).
async fn identity(client: &Client, stream: &str, timeout: Duration) -> Result<Identity, Error> {
    let out = retried(timeout, stream, "DescribeStreamSummary", || {
        let call = client.describe_stream_summary();
        let call = if stream.starts_with("arn:") { call.stream_arn(stream) } else { call.stream_name(stream) };
        call.send()
    })
    .await?;
    let s = out.stream_description_summary().ok_or_else(|| {
        Definite::Setup(format!("--kinesis-dlq-stream {stream}: DescribeStreamSummary answered no summary"))
    })?;
    Ok(Identity {
        name: s.stream_name().to_owned(),
        arn: s.stream_arn().to_owned(),
        created_ms: s.stream_creation_timestamp().to_millis().unwrap_or(0),
    })
}

/// The ids of the stream's shards (open and closed ones still holding records).
async fn list_shards(client: &Client, stream: &str, timeout: Duration) -> Result<Vec<String>, Error> {
    let mut ids = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let out = retried(timeout, stream, "ListShards", || {
            let call = client.list_shards();
            let call = match &token {
                Some(t) => call.next_token(t),
                None if stream.starts_with("arn:") => call.stream_arn(stream),
                None => call.stream_name(stream),
            };
            call.send()
        })
        .await?;
        ids.extend(out.shards().iter().map(|s| s.shard_id().to_owned()));
        match out.next_token() {
            Some(t) => token = Some(t.to_owned()),
            None => return Ok(ids),
        }
    }
}

/// Every record of `shard` (after `after`), in order, up to its tip as this read found it.
async fn read_shard(
    client: &Client,
    stream: &str,
    shard: &str,
    after: Option<&str>,
    timeout: Duration,
) -> Result<Vec<KRecord>, Error> {
    let it = retried(timeout, stream, "GetShardIterator", || {
        let call = client.get_shard_iterator().shard_id(shard);
        let call = if stream.starts_with("arn:") { call.stream_arn(stream) } else { call.stream_name(stream) };
        match after {
            Some(s) => call.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).starting_sequence_number(s),
            None => call.shard_iterator_type(ShardIteratorType::TrimHorizon),
        }
        .send()
    })
    .await?;
    let mut iterator = it.shard_iterator().map(str::to_owned);
    let mut out = Vec::new();
    while let Some(i) = iterator.take() {
        let page = retried(timeout, stream, "GetRecords", || {
            let call = client.get_records().shard_iterator(&i).limit(PAGE);
            let call = if stream.starts_with("arn:") { call.stream_arn(stream) } else { call };
            call.send()
        })
        .await?;
        let empty = page.records().is_empty();
        out.extend(page.records().iter().cloned());
        // The tip: a read that brought nothing with nothing behind it, or a closed shard's end.
        if empty && page.millis_behind_latest().unwrap_or(0) == 0 {
            break;
        }
        iterator = page.next_shard_iterator().map(str::to_owned);
    }
    Ok(out)
}

/// `call` until it is answered; a throttle or no answer is tried again with a backoff until
/// `timeout` passed, anything else fails at once naming the stream.
async fn retried<T, E, F, Fut>(timeout: Duration, stream: &str, what: &str, mut call: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, aws_sdk_kinesis::error::SdkError<E>>>,
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let started = Instant::now();
    let mut attempt = 0;
    loop {
        let e = match call().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let status = e.raw_response().map(|r| r.status().as_u16());
        let code = e.code().map(str::to_owned);
        let why = format!(
            "--kinesis-dlq-stream {stream}: {what} failed ({}): {}",
            code.as_deref().unwrap_or("no answer"),
            crate::sink::aws::error_text(&e)
        );
        if class_of(code.as_deref(), status, false) == Class::Setup {
            return Err(Definite::Setup(format!(
                "{why}; check the stream name, --aws-region, and that the credentials may kinesis:DescribeStreamSummary, ListShards, GetShardIterator and GetRecords on it"
            ))
            .into());
        }
        if started.elapsed() >= timeout {
            return Err(Definite::Setup(format!("{why}; no answer for --read-timeout")).into());
        }
        tokio::time::sleep(crate::retry::backoff(attempt, Duration::from_secs(5))).await;
        attempt += 1;
    }
}

/// A copy as the tool reads it: the envelope's key, headers and payload, at `shard/sequence`.
fn record(k: &KRecord, shard: &str, place: i32, offset: i64) -> DlqRecord {
    let mut undecoded = Vec::new();
    let env: Option<serde_json::Value> = serde_json::from_slice(k.data().as_ref()).ok();
    if env.is_none() {
        undecoded.push("the data (not an outboxd dead-letter envelope)".to_owned());
    }
    let env = env.unwrap_or_default();
    let mut b64 = |v: &serde_json::Value, what: &str| -> Option<Vec<u8>> {
        let s = v.as_str()?;
        STANDARD.decode(s).map_err(|_| undecoded.push(format!("{what} (base64)"))).ok()
    };
    let key = b64(&env["key"], "the key");
    let payload = b64(&env["payload"], "the payload");
    let mut headers = Vec::new();
    for h in env["headers"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let name = h[0].as_str().unwrap_or_default().to_owned();
        let value = b64(&h[1], &format!("header {name}"));
        if value.is_some() {
            headers.push((name, value));
        }
    }
    DlqRecord {
        partition: place,
        offset,
        key,
        payload_len: payload.as_ref().map(Vec::len),
        payload,
        headers,
        timestamp_ms: None,
        time_ms: k.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()),
        label: Some(format!("{shard}/{}", k.sequence_number())),
        undecoded,
        moved_later: false,
    }
}
