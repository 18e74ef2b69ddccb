//! `outboxd dlq replay --sink kinesis`: putting the events of dead-letter copies back to a stream
//! (`--kinesis-stream`, or `--to-topic` naming another), as `--sink kinesis` would have put them
//! ([`super::record`]): the payload byte for byte as the data, the record key's partition key (the
//! event id for a keyless event). Reading the copies and the progress are [`super::dlq`]'s.
//!
//! Order: Kinesis answers each record of a `PutRecords` call on its own, so a call holds at most
//! one event of a key, and a key's next event goes in a later call, after the answer. A key with
//! an event not replayed in this run (refused, failed after [`TRIES`], or its copy held back on
//! the reader's side: no payload, unreadable) gets none of its later events in this run, in any
//! later batch: [`KinesisTarget`] keeps those keys for the whole run. A throttled record is sent
//! again (after a backoff) before any later event of its key.

use std::collections::HashSet;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use aws_sdk_kinesis::Client;

use super::record::{partition_key, MAX_RECORD_BYTES};
use crate::sink::aws::publisher::Failure;
use crate::sink::aws::{class_of, sdk_config, AwsConfig, Class};
use crate::sink::dead_letter::entry::Entry;

/// Records in one `PutRecords` (Kinesis's limit).
const PAGE: usize = 500;
/// Tries of a record Kinesis keeps throttling before replay reports it failed.
const TRIES: u32 = 8;

/// Where replay puts: the client, and the (stream, partition key) pairs with an event not
/// replayed in this run, whose later events are not sent either.
pub struct KinesisTarget {
    client: Client,
    blocked: HashSet<(String, String)>,
}

impl KinesisTarget {
    pub async fn connect(aws: &AwsConfig) -> KinesisTarget {
        KinesisTarget { client: Client::new(&sdk_config(aws).await), blocked: HashSet::new() }
    }
}

/// The partition key `e` is put with.
fn key_of(e: &Entry) -> String {
    match e.head.key.as_deref().filter(|k| !k.is_empty()) {
        Some(k) => partition_key(k),
        None => partition_key(e.head.event_id().unwrap_or_default().as_bytes()),
    }
}

/// Put each event of `batch` to its stream, in order per key; per event, where it landed
/// (`shard/sequence`) or why not. `held`: keys whose copies the reader held back in this run.
pub async fn send_batch(
    t: &mut KinesisTarget,
    batch: &[(Entry, String)],
    held: &HashSet<Option<Vec<u8>>>,
) -> Vec<Result<String, String>> {
    let mut results: Vec<Option<Result<String, String>>> = vec![None; batch.len()];
    let mut pending: Vec<usize> = (0..batch.len()).collect();
    while !pending.is_empty() {
        // One event of a key a round, in order; a blocked key's events are not sent.
        let mut round: Vec<usize> = Vec::new();
        let mut in_round: HashSet<(&str, String)> = HashSet::new();
        let mut later = Vec::new();
        for i in pending {
            let (e, dest) = &batch[i];
            let pk = key_of(e);
            let size = e.head.payload.as_ref().map_or(0, Vec::len) + pk.len();
            if held.contains(&e.head.key) || t.blocked.contains(&(dest.clone(), pk.clone())) {
                t.blocked.insert((dest.clone(), pk));
                results[i] = Some(Err("not sent: an earlier event of its key was not replayed in this run".into()));
            } else if size > MAX_RECORD_BYTES {
                // Kinesis would refuse the whole call for it; the stream's own larger limit is not
                // asked here.
                t.blocked.insert((dest.clone(), pk));
                results[i] = Some(Err(format!(
                    "record of {size} bytes (data and partition key) exceeds Kinesis's limit of {MAX_RECORD_BYTES} bytes"
                )));
            } else if in_round.insert((dest.as_str(), pk)) && round.len() < PAGE {
                round.push(i);
            } else {
                later.push(i);
            }
        }
        pending = later;
        let Some(&first) = round.first() else { continue };
        // One destination a call: the first's; the others wait for a later round.
        let dest = batch[first].1.clone();
        let (now, other): (Vec<usize>, Vec<usize>) = round.into_iter().partition(|i| batch[*i].1 == dest);
        pending.extend(other);
        pending.sort_unstable();
        for (i, r) in put(&t.client, &dest, batch, &now).await {
            if r.is_err() {
                t.blocked.insert((dest.clone(), key_of(&batch[i].0)));
            }
            results[i] = Some(r);
        }
    }
    results.into_iter().map(|r| r.unwrap_or_else(|| Err("not sent".into()))).collect()
}

/// What Kinesis said of one record of a call.
enum Got {
    /// Stored, at `shard/sequence`.
    Stored(String),
    /// Refused, with the code and message.
    Refused(String, String),
    /// Not stored: throttled, or not answered.
    Again,
}

/// One `PutRecords` of the events at `idx` (distinct keys) to `dest`, the throttled ones again
/// after a backoff, up to [`TRIES`]; each event's result.
async fn put(
    client: &Client,
    dest: &str,
    batch: &[(Entry, String)],
    idx: &[usize],
) -> Vec<(usize, Result<String, String>)> {
    let mut out = Vec::new();
    let mut left: Vec<usize> = idx.to_vec();
    for attempt in 0..TRIES {
        if left.is_empty() {
            break;
        }
        if attempt > 0 {
            tokio::time::sleep(crate::retry::backoff(attempt - 1, Duration::from_secs(5))).await;
        }
        let records: Vec<PutRecordsRequestEntry> = left
            .iter()
            .map(|&i| {
                let e = &batch[i].0;
                PutRecordsRequestEntry::builder()
                    .data(Blob::new(e.head.payload.clone().unwrap_or_default()))
                    .partition_key(key_of(e))
                    .build()
                    .expect("data and partition key are set")
            })
            .collect();
        let call = client.put_records().set_records(Some(records));
        let call = if dest.starts_with("arn:") { call.stream_arn(dest) } else { call.stream_name(dest) };
        let answers: Vec<Got> = match call.send().await {
            Ok(o) => {
                let rs = o.records();
                (0..left.len())
                    .map(|n| match rs.get(n).map(|r| (r, r.error_code(), r.sequence_number())) {
                        Some((r, Some(c), _)) => {
                            Got::Refused(c.to_owned(), r.error_message().unwrap_or_default().to_owned())
                        }
                        Some((r, None, Some(s))) => Got::Stored(format!("{}/{s}", r.shard_id().unwrap_or("-"))),
                        _ => Got::Again,
                    })
                    .collect()
            }
            Err(e) => {
                let f = Failure::of("Kinesis PutRecords", &e);
                if f.setup.is_some() || class_of(f.code.as_deref(), f.status, false) == Class::Setup {
                    let why = f.setup.unwrap_or_else(|| {
                        format!("Kinesis refused the call ({}): {}", f.code.unwrap_or_default(), f.text)
                    });
                    out.extend(left.drain(..).map(|i| (i, Err(why.clone()))));
                    break;
                }
                left.iter().map(|_| Got::Again).collect()
            }
        };
        let mut again = Vec::new();
        for (i, got) in left.iter().copied().zip(answers) {
            match got {
                Got::Stored(at) => out.push((i, Ok(at))),
                Got::Refused(code, message) if class_of(Some(&code), None, true) != Class::Transient => {
                    out.push((i, Err(format!("Kinesis refused the record ({code}): {message}"))))
                }
                Got::Refused(..) | Got::Again => again.push(i),
            }
        }
        left = again;
    }
    out.extend(left.into_iter().map(|i| (i, Err(format!("Kinesis kept throttling the record ({TRIES} tries)")))));
    out
}
