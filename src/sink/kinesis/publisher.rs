//! The Kinesis publisher task: batches jobs into `PutRecords` calls (up to [`BATCH`] records and
//! [`BATCH_BYTES`] of data and partition keys, Kinesis's limits), keeps up to [`REQUESTS`] calls
//! in flight, and resolves each job's delivery from its entry of the answer.
//!
//! Order: a key has **at most one record in flight**. A batch takes the oldest waiting job of
//! each key that has none in flight, so a key's next event is sent only after Kinesis answered
//! for the one before; a throttled or failed record goes back to the waiting jobs at its place
//! (jobs are kept by arrival number), ahead of its key's later events. Kinesis answers each record
//! of a `PutRecords` call on its own: were two events of a key in one call (or in two calls at
//! once), the first could be throttled while the second is stored, and its retry would land after
//! it. Keyless events keep no order (their partition key is their event id) and are never held.
//! The cost, measured in bench/RESULTS.md: one key moves at most one record per round trip.
//!
//! Results, per record ([`crate::sink::aws::class_of`], decided on the code):
//! * a sequence number → `ack()`: Kinesis stored it;
//! * `ProvisionedThroughputExceededException`, `InternalFailure`, a throttled KMS key, for a record
//!   or the whole call, or no answer at all → waits again, and sending pauses for a backoff with
//!   jitter ([`crate::retry::backoff`]); nothing is acked, so the slot stays where it was;
//! * a fault of this record → `reject()`, for the bad-event policy (too large is refused before
//!   sending, in [`super::record`]);
//! * anything else (no such stream, access denied, a disabled KMS key), or a call the SDK could
//!   not make (no usable credentials, [`crate::sink::aws::setup_failure`]) → `fail()` with the
//!   code and what to check: the relay stops rather than dead-letter every event or retry for good.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_kinesis::operation::put_records::PutRecordsOutput;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;

use super::record::Job;
use crate::sink::aws::{class_of, setup_failure, Class};

/// `PutRecords` calls in flight at once.
const REQUESTS: usize = 8;
/// Records in one `PutRecords` (Kinesis's limit).
const BATCH: usize = 500;
/// Data and partition key bytes in one `PutRecords` (Kinesis's limit: 5 MiB).
const BATCH_BYTES: usize = 5 * 1024 * 1024;
/// Jobs waiting here at most (the channel holds as many more).
pub const WINDOW: usize = 8192;
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Where the publisher writes.
pub struct Target {
    pub client: aws_sdk_kinesis::Client,
    pub stream: String,
    pub dlq_stream: Option<String>,
    /// Keep each key's order (always, but for `OUTBOXD_KINESIS_UNORDERED=1`, which only the
    /// benchmark and the test that shows the order check can fail set: see [`super::unordered`]).
    pub ordered: bool,
}

/// What a call came back with: the jobs sent (by arrival number) and the answer.
type Sent = (Vec<(u64, Job)>, Answer);
type Answer = Result<PutRecordsOutput, Failure>;
/// A failed call: its code, HTTP status and text, and the fault of the setup it shows without
/// an answer (no usable credentials: [`setup_failure`]).
struct Failure {
    code: Option<String>,
    status: Option<u16>,
    text: String,
    setup: Option<String>,
}
type Call = Pin<Box<dyn Future<Output = Sent> + Send>>;

/// The partition keys in flight, of the stream (`[0]`) and of the dead-letter stream (`[1]`).
/// Looked up by `&str`: [`take_batch`] asks for every waiting job, so the lookup allocates nothing.
type Busy = [HashSet<String>; 2];

/// The key a job holds while in flight: its stream and partition key (keyed events only).
fn lane(job: &Job, ordered: bool) -> Option<(usize, &str)> {
    (ordered && job.keyed).then_some((usize::from(job.dlq), job.partition_key.as_str()))
}

/// The publisher: runs until the channel closes and nothing is left in flight.
pub async fn run(target: Target, mut rx: mpsc::Receiver<Job>) {
    let mut waiting: BTreeMap<u64, Job> = BTreeMap::new();
    let mut busy: Busy = Default::default();
    let mut calls: FuturesUnordered<Call> = FuturesUnordered::new();
    let mut next_seq = 0u64;
    let mut attempt = 0u32;
    let mut paused_until: Option<tokio::time::Instant> = None;
    let mut open = true;
    loop {
        if paused_until.is_some_and(|t| t <= tokio::time::Instant::now()) {
            paused_until = None;
        }
        while paused_until.is_none() && calls.len() < REQUESTS {
            let batch = take_batch(&mut waiting, &mut busy, target.ordered);
            if batch.is_empty() {
                break;
            }
            calls.push(send(&target, batch));
        }
        if !open && waiting.is_empty() && calls.is_empty() {
            return;
        }
        let pause = paused_until;
        tokio::select! {
            biased;
            Some((sent, answer)) = calls.next(), if !calls.is_empty() => {
                let retry = settle(sent, answer, &mut waiting, &mut busy, target.ordered);
                if retry {
                    paused_until = Some(tokio::time::Instant::now() + crate::retry::backoff(attempt, MAX_BACKOFF));
                    attempt = attempt.saturating_add(1);
                } else {
                    attempt = 0;
                }
            }
            () = async { tokio::time::sleep_until(pause.expect("guarded")).await }, if pause.is_some() => {}
            job = rx.recv(), if open && waiting.len() < WINDOW => match job {
                Some(job) => {
                    waiting.insert(next_seq, job);
                    next_seq += 1;
                }
                None => open = false,
            },
        }
    }
}

/// The next batch: the oldest waiting jobs for one stream, at most one per free key, within
/// [`BATCH`] records and [`BATCH_BYTES`].
fn take_batch(waiting: &mut BTreeMap<u64, Job>, busy: &mut Busy, ordered: bool) -> Vec<(u64, Job)> {
    let mut picked: Vec<u64> = Vec::new();
    let mut dlq = None;
    let mut bytes = 0usize;
    for (seq, job) in waiting.iter() {
        if picked.len() == BATCH {
            break;
        }
        if dlq.is_some_and(|d| d != job.dlq) {
            continue;
        }
        let l = lane(job, ordered);
        if l.is_some_and(|(s, k)| busy[s].contains(k)) {
            continue;
        }
        if bytes + job.size > BATCH_BYTES && !picked.is_empty() {
            break;
        }
        if let Some((s, k)) = l {
            busy[s].insert(k.to_owned());
        }
        dlq = Some(job.dlq);
        bytes += job.size;
        picked.push(*seq);
    }
    picked.into_iter().filter_map(|s| waiting.remove(&s).map(|j| (s, j))).collect()
}

fn send(target: &Target, batch: Vec<(u64, Job)>) -> Call {
    let stream = match (batch.first().is_some_and(|(_, j)| j.dlq), &target.dlq_stream) {
        (true, Some(d)) => d.clone(),
        _ => target.stream.clone(),
    };
    let entries: Vec<PutRecordsRequestEntry> = batch
        .iter()
        .map(|(_, job)| {
            PutRecordsRequestEntry::builder()
                .data(Blob::new(job.data.to_vec()))
                .partition_key(job.partition_key.clone())
                .build()
                .expect("data and partition key are set")
        })
        .collect();
    let call = target.client.put_records().set_records(Some(entries));
    let call = if stream.starts_with("arn:") { call.stream_arn(stream) } else { call.stream_name(stream) };
    Box::pin(async move {
        let answer = call.send().await.map_err(|e| Failure {
            setup: setup_failure(&e).map(|(what, fix)| format!("Kinesis PutRecords was not sent: {what}; {fix}")),
            code: e.code().map(str::to_owned),
            status: e.raw_response().map(|r| r.status().as_u16()),
            text: e.message().map(str::to_owned).unwrap_or_else(|| DisplayErrorContext(&e).to_string()),
        });
        (batch, answer)
    })
}

/// Resolve a call's jobs; true when some must be sent again (after a backoff).
fn settle(
    sent: Vec<(u64, Job)>,
    answer: Answer,
    waiting: &mut BTreeMap<u64, Job>,
    busy: &mut Busy,
    ordered: bool,
) -> bool {
    for (_, job) in &sent {
        if let Some((s, k)) = lane(job, ordered) {
            busy[s].remove(k);
        }
    }
    let out = match answer {
        Ok(out) => out,
        Err(Failure { setup: Some(reason), .. }) => {
            tracing::error!(error = %reason, "Kinesis PutRecords could not be made");
            for (_, job) in sent {
                job.delivery.fail(reason.clone());
            }
            return false;
        }
        Err(f) => {
            let class = class_of(f.code.as_deref(), f.status, false);
            let code = f.code.unwrap_or_else(|| "no answer".into());
            if class == Class::Setup {
                let reason = setup_reason(&code, &f.text);
                tracing::error!(error = %reason, "Kinesis refused a PutRecords call");
                for (_, job) in sent {
                    job.delivery.fail(reason.clone());
                }
                return false;
            }
            tracing::warn!(code = %code, error = %f.text, records = sent.len(), "Kinesis PutRecords failed; sending again after a backoff");
            waiting.extend(sent);
            return true;
        }
    };
    // The answer's records match the request's one for one, in order.
    let results = out.records();
    let mut retry = false;
    for (i, (seq, job)) in sent.into_iter().enumerate() {
        let Some(r) = results.get(i) else {
            // No answer for this record: send it again.
            retry = true;
            waiting.insert(seq, job);
            continue;
        };
        let Some(code) = r.error_code() else {
            if r.sequence_number().is_some() {
                job.delivery.ack();
            } else {
                retry = true;
                waiting.insert(seq, job);
            }
            continue;
        };
        match class_of(Some(code), None, true) {
            Class::Transient => {
                retry = true;
                waiting.insert(seq, job);
            }
            Class::BadEvent => {
                let reason = format!("Kinesis refused the record ({code}): {}", r.error_message().unwrap_or(""));
                let Job { key, payload, headers, delivery, .. } = job;
                delivery.reject("invalid_record", reason, key, payload, headers);
            }
            Class::Setup => job.delivery.fail(setup_reason(code, r.error_message().unwrap_or(""))),
        }
    }
    if retry {
        tracing::warn!(
            failed = out.failed_record_count().unwrap_or(0),
            "Kinesis did not take some records of a PutRecords call (throughput exceeded or an internal failure); sending them again after a backoff"
        );
    }
    retry
}

fn setup_reason(code: &str, text: &str) -> String {
    format!(
        "Kinesis refused the call ({code}): {text}; check --kinesis-stream (and --kinesis-dlq-stream), --aws-region, and that the credentials may kinesis:PutRecords on the stream (and use its KMS key)"
    )
}
