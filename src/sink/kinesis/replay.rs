//! `outboxd dlq replay --sink kinesis`: putting the events of dead-letter copies back to a stream
//! (`--kinesis-stream`, or `--to-topic` naming another), as `--sink kinesis` would have put them
//! ([`super::record`]): the payload byte for byte as the data, the record key's partition key (the
//! event id for a keyless event). Reading the copies and the progress are [`super::dlq`]'s.
//!
//! Order: Kinesis answers each record of a `PutRecords` call on its own, so a call holds at most
//! one event of a key, and a key's next event goes in a later call, after the answer. A key with
//! an event not replayed in this run (refused, failed after [`TRIES`], or its copy held back on
//! the reader's side: no payload, unreadable; see [`Held`]) gets none of its later events in
//! this run, in any later batch: [`KinesisTarget`] keeps those keys for the whole run. Its
//! earlier events still go. A throttled record is sent again (after a backoff) before any later
//! event of its key.
//!
//! Size: a call carries at most 500 records and 5 MiB of data and partition keys, the limits
//! `--sink kinesis` keeps ([`super::publisher`]); Kinesis refuses a larger call as a whole.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use aws_sdk_kinesis::Client;

use super::publisher::{BATCH as PAGE, BATCH_BYTES};
use super::record::{partition_key, MAX_RECORD_BYTES};
use crate::sink::aws::publisher::Failure;
use crate::sink::aws::{class_of, sdk_config, AwsConfig, Class};
use crate::sink::dead_letter::entry::Entry;
use crate::sink::dead_letter::held::Held;

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

/// A (stream, partition key) pair.
type Key = (String, String);

/// Put each event of `batch` to its stream, in order per key; per event, where it landed
/// (`shard/sequence`) or why not. `held`: keys whose copies the reader held back in this run
/// (blocking only the events read after the held copy).
pub async fn send_batch(t: &mut KinesisTarget, batch: &[(Entry, String)], held: &Held) -> Vec<Result<String, String>> {
    let mut results: Vec<Option<Result<String, String>>> = vec![None; batch.len()];
    // Per key, the first event of this batch not replayed: the key's events after it are not sent.
    let mut failed_at: HashMap<Key, usize> = HashMap::new();
    for (i, (e, dest)) in batch.iter().enumerate() {
        if held.blocks(e.head.key.as_deref(), batch.len(), i) {
            failed_at.entry((dest.clone(), key_of(e))).or_insert(i);
            results[i] = Some(Err(NOT_SENT.into()));
        }
    }
    let mut pending: Vec<usize> = (0..batch.len()).filter(|&i| results[i].is_none()).collect();
    while !pending.is_empty() {
        let (now, later) = next_round(batch, &pending, &t.blocked, &mut failed_at, &mut results);
        pending = later;
        let Some(&first) = now.first() else { continue };
        let dest = batch[first].1.clone();
        for (i, r) in put(&t.client, &dest, batch, &now).await {
            if r.is_err() {
                let at = failed_at.entry((dest.clone(), key_of(&batch[i].0))).or_insert(i);
                *at = (*at).min(i);
            }
            results[i] = Some(r);
        }
    }
    t.blocked.extend(failed_at.into_keys());
    results.into_iter().map(|r| r.unwrap_or_else(|| Err("not sent".into()))).collect()
}

/// Why an event of a key with an earlier event not replayed is not sent.
const NOT_SENT: &str = "not sent: an earlier event of its key was not replayed in this run";

/// The next `PutRecords` of `pending` (in order), and what waits for a later one. A call goes to
/// one stream (the first pending event's), holds at most one event of a key (the key's first
/// pending one), at most [`PAGE`] records and [`BATCH_BYTES`] of data and partition keys
/// (Kinesis refuses a larger call as a whole); a key passed over for room stays out of the call
/// (its order). An event of a key `blocked` in an earlier batch, or after an event of its key
/// `failed_at` in this one, is failed here, and so is one over [`MAX_RECORD_BYTES`].
fn next_round(
    batch: &[(Entry, String)],
    pending: &[usize],
    blocked: &HashSet<Key>,
    failed_at: &mut HashMap<Key, usize>,
    results: &mut [Option<Result<String, String>>],
) -> (Vec<usize>, Vec<usize>) {
    let mut round: Vec<usize> = Vec::new();
    let mut bytes = 0usize;
    let mut in_round: HashSet<Key> = HashSet::new();
    let mut later = Vec::new();
    for &i in pending {
        let (e, dest) = &batch[i];
        let key = (dest.clone(), key_of(e));
        let size = e.head.payload.as_ref().map_or(0, Vec::len) + key.1.len();
        if blocked.contains(&key) || failed_at.get(&key).is_some_and(|&f| f < i) {
            failed_at.entry(key).or_insert(i);
            results[i] = Some(Err(NOT_SENT.into()));
        } else if size > MAX_RECORD_BYTES {
            // Kinesis would refuse the whole call for it; the stream's own larger limit is not
            // asked here.
            failed_at.entry(key).or_insert(i);
            results[i] = Some(Err(format!(
                "record of {size} bytes (data and partition key) exceeds Kinesis's limit of {MAX_RECORD_BYTES} bytes"
            )));
        } else if in_round.insert(key)
            && round.len() < PAGE
            && bytes + size <= BATCH_BYTES
            && round.first().is_none_or(|&f| batch[f].1 == *dest)
        {
            bytes += size;
            round.push(i);
        } else {
            later.push(i);
        }
    }
    (round, later)
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
                        Some((r, Some(c), _)) => Got::Refused(
                            c.to_owned(),
                            crate::sink::aws::service_text(r.error_message().unwrap_or_default()),
                        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, id: &str, payload: usize) -> (Entry, String) {
        (Entry::for_test(key, id, payload), "s".into())
    }

    /// 100 copies of 60 KiB (6 MB) are more than one `PutRecords` may carry: a call is cut at
    /// 5 MiB, and the rest go in the next, in order.
    #[test]
    fn a_call_is_cut_at_five_mib() {
        let batch: Vec<_> = (0..100).map(|n| entry(&format!("k{n}"), &format!("e{n}"), 60 * 1024)).collect();
        let mut results = vec![None; batch.len()];
        let pending: Vec<usize> = (0..batch.len()).collect();
        let (now, later) = next_round(&batch, &pending, &HashSet::new(), &mut HashMap::new(), &mut results);
        let bytes: usize = now.iter().map(|&i| 60 * 1024 + key_of(&batch[i].0).len()).sum();
        assert!(bytes <= 5 * 1024 * 1024, "a call of {bytes} bytes ({} records)", now.len());
        assert_eq!(now.len(), 85);
        assert_eq!([now, later].concat(), pending, "every event once, in order");
        assert!(results.iter().all(Option::is_none));
    }

    /// A key's events go one a call, in order; one that failed fails its key's later events
    /// only, in this batch and in later ones.
    #[test]
    fn a_failed_event_fails_only_its_keys_later_events() {
        let batch = vec![entry("a", "1", 10), entry("a", "2", 2 << 20), entry("a", "3", 10), entry("b", "4", 10)];
        let mut results = vec![None; batch.len()];
        let mut failed_at = HashMap::new();
        let (now, later) = next_round(&batch, &[0, 1, 2, 3], &HashSet::new(), &mut failed_at, &mut results);
        assert_eq!((now, later), (vec![0, 3], vec![]), "{results:?}");
        assert!(matches!(&results[1], Some(Err(w)) if w.contains("exceeds")), "{results:?}");
        assert!(matches!(&results[2], Some(Err(w)) if w.contains("earlier event")), "{results:?}");
        assert!(results[0].is_none() && results[3].is_none(), "the earlier event and another key still go");
        let blocked: HashSet<Key> = failed_at.into_keys().collect();
        let next = vec![entry("a", "5", 10)];
        let mut results = vec![None];
        let (now, _) = next_round(&next, &[0], &blocked, &mut HashMap::new(), &mut results);
        assert!(now.is_empty() && results[0].is_some(), "a later batch");
    }

    /// A copy held back after an event of its key was put into the unsent batch does not keep
    /// that earlier event back; only the later ones. A keyless held copy blocks nothing.
    #[tokio::test]
    async fn a_held_copy_blocks_only_its_keys_later_events() {
        let conf = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .region(aws_sdk_kinesis::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        let mut t = KinesisTarget { client: Client::from_conf(conf), blocked: HashSet::new() };
        let mut held = Held::default();
        // Read: a#1 (batched), a copy of a held, a#2 (batched), a keyless copy held, a keyless event.
        held.pushed();
        held.hold(Some(b"a"));
        held.hold(None);
        held.pushed();
        // Every event that is sent fails at once (too large), so the test needs no server.
        held.pushed();
        let mut keyless = entry("", "3", 2 << 20);
        keyless.0.head.key = None;
        let batch = vec![entry("a", "1", 2 << 20), entry("a", "2", 10), keyless];
        let r = send_batch(&mut t, &batch, &held).await;
        assert!(matches!(&r[0], Err(w) if w.contains("exceeds")), "a#1 was held back: {r:?}");
        assert!(matches!(&r[1], Err(w) if w.contains("earlier event")), "{r:?}");
        assert!(matches!(&r[2], Err(w) if w.contains("exceeds")), "the keyless event was held back: {r:?}");
    }
}
