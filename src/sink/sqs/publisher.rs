//! The SQS publisher task, also `--sink sns`'s: batches jobs into `SendMessageBatch` calls (10
//! messages, and no more bytes than the queue's `MaximumMessageSize`, SQS's limit on a whole
//! batch), or SNS `PublishBatch` calls ([`Main::Topic`], built by [`super::topic::publish`];
//! dead-letter copies still go to an SQS queue), keeps up to [`REQUESTS`] calls in flight, and
//! resolves each job's delivery from its batch entry's result ([`Outcome`], the same for both).
//!
//! Order on a FIFO queue: a group (a key) has **at most one message in flight**. A batch takes
//! the oldest waiting job of each group that has none in flight, so a key's next event is sent
//! only after SQS answered for the one before; a throttled or failed entry goes back to the
//! waiting jobs at its place (jobs are kept by arrival number), ahead of its group's later
//! events. Were two events of a key in flight at once, the first could fail while the second is
//! stored, and its retry would land after it. Standard queues keep no order, so any job may go.
//!
//! Results, per entry ([`crate::sink::aws::class_of`], decided on the code):
//! * accepted → `ack()`: SQS stored it (it answered the call);
//! * a fault of this message (too large, an invalid attribute) → `reject()`, for the bad-event
//!   policy;
//! * throttling or a service error, for an entry or the whole call, or no answer at all → waits
//!   again, and sending pauses for a backoff with jitter ([`crate::retry::backoff`]); nothing is
//!   acked, so the slot stays where it was;
//! * anything else (no such queue, access denied, a disabled KMS key), or a call the SDK could not
//!   make (no usable credentials, [`crate::sink::aws::setup_failure`]) → `fail()` with the code
//!   and what to check: the relay stops rather than dead-letter every event or retry for good.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;

use super::message::{Job, Value};
use crate::sink::aws::{class_of, setup_failure, Class};

/// `SendMessageBatch` calls in flight at once.
const REQUESTS: usize = 8;
/// Entries in one `SendMessageBatch` (SQS's limit).
const BATCH: usize = 10;
/// Jobs waiting here at most (the channel holds as many more).
pub const WINDOW: usize = 4096;
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Where the publisher writes.
pub struct Target {
    /// The SQS client: the queue's, and the dead-letter queue's of either sink.
    pub client: aws_sdk_sqs::Client,
    pub main: Main,
    pub dlq_queue_url: Option<String>,
    /// Bytes one batch may hold: the smaller `MaximumMessageSize` of the queues.
    pub batch_bytes: usize,
    /// The flags a refusal names, e.g. "--sqs-queue-url (and --sqs-dlq-queue-url)".
    pub flags: &'static str,
}

/// Where events (not dead-letter copies) go.
pub enum Main {
    /// `SendMessageBatch` to this SQS queue.
    Queue(String),
    /// `PublishBatch` to this SNS topic (`--sink sns`).
    Topic { client: aws_sdk_sns::Client, arn: String },
}

/// A batch call's answer, whichever the service: entry ids stored, and entries failed with their
/// code and message.
pub struct Outcome {
    pub successful: Vec<String>,
    pub failed: Vec<(String, String, String)>,
}

/// What a call came back with: the jobs sent (by arrival number) and the answer.
type Sent = (Vec<(u64, Job)>, Answer);
type Answer = Result<Outcome, Failure>;
/// A failed call: its code, HTTP status and text, and the fault of the setup it shows without
/// an answer (no usable credentials: [`setup_failure`]).
pub struct Failure {
    pub code: Option<String>,
    pub status: Option<u16>,
    pub text: String,
    pub setup: Option<String>,
}
pub type Call = Pin<Box<dyn Future<Output = Sent> + Send>>;

/// The group a job holds while in flight: its queue and group id (FIFO only).
fn lane(job: &Job) -> Option<(bool, String)> {
    job.group.as_ref().map(|g| (job.dlq, g.clone()))
}

/// The publisher: runs until the channel closes and nothing is left in flight.
pub async fn run(target: Target, mut rx: mpsc::Receiver<Job>) {
    let mut waiting: BTreeMap<u64, Job> = BTreeMap::new();
    let mut busy: HashSet<(bool, String)> = HashSet::new();
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
            let batch = take_batch(&mut waiting, &mut busy, target.batch_bytes);
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
                let retry = settle(sent, answer, &mut waiting, &mut busy, target.flags);
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

/// The next batch: the oldest waiting jobs for one queue, at most one per free group (FIFO),
/// within [`BATCH`] entries and `max_bytes`.
fn take_batch(
    waiting: &mut BTreeMap<u64, Job>,
    busy: &mut HashSet<(bool, String)>,
    max_bytes: usize,
) -> Vec<(u64, Job)> {
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
        if let Some(l) = lane(job) {
            if busy.contains(&l) {
                continue;
            }
        }
        if bytes + job.size > max_bytes && !picked.is_empty() {
            break;
        }
        if let Some(l) = lane(job) {
            busy.insert(l);
        }
        dlq = Some(job.dlq);
        bytes += job.size;
        picked.push(*seq);
    }
    picked.into_iter().filter_map(|s| waiting.remove(&s).map(|j| (s, j))).collect()
}

fn attribute(v: &Value) -> MessageAttributeValue {
    let b = MessageAttributeValue::builder();
    let b = match v {
        Value::Text(s) => b.data_type("String").string_value(s.clone()),
        Value::Binary(x) => b.data_type("Binary").binary_value(Blob::new(x.to_vec())),
    };
    b.build().expect("data_type is set")
}

/// Entry `i` of a `SendMessageBatch` call (also `outboxd dlq replay`'s, [`super::dlq`]).
pub(super) fn entry(
    i: usize,
    body: &str,
    attributes: &[(String, Value)],
    group: Option<&str>,
    dedup: Option<&str>,
) -> SendMessageBatchRequestEntry {
    let mut e = SendMessageBatchRequestEntry::builder().id(i.to_string()).message_body(body);
    for (name, v) in attributes {
        e = e.message_attributes(name.clone(), attribute(v));
    }
    if let Some(g) = group {
        e = e.message_group_id(g);
    }
    if let Some(d) = dedup {
        e = e.message_deduplication_id(d);
    }
    e.build().expect("id and body are set")
}

fn send(target: &Target, batch: Vec<(u64, Job)>) -> Call {
    let queue = match (batch.first().is_some_and(|(_, j)| j.dlq), &target.dlq_queue_url, &target.main) {
        (true, Some(d), _) => d.clone(),
        // A copy is made only with a dead-letter queue; never send one to the queue or topic.
        (true, None, _) => {
            let f = Failure {
                code: None,
                status: None,
                text: String::new(),
                setup: Some("bug: a dead-letter copy without --sqs-dlq-queue-url / --sns-dlq-queue-url".into()),
            };
            return Box::pin(async move { (batch, Err(f)) });
        }
        (_, _, Main::Queue(q)) => q.clone(),
        (_, _, Main::Topic { client, arn }) => return super::topic::publish(client, arn, batch),
    };
    let entries: Vec<SendMessageBatchRequestEntry> = batch
        .iter()
        .enumerate()
        .map(|(i, (_, job))| entry(i, &job.body, &job.attributes, job.group.as_deref(), job.dedup.as_deref()))
        .collect();
    let call = target.client.send_message_batch().queue_url(queue).set_entries(Some(entries));
    Box::pin(async move {
        let answer = match call.send().await {
            Ok(out) => Ok(Outcome {
                successful: out.successful().iter().map(|s| s.id().to_owned()).collect(),
                failed: out
                    .failed()
                    .iter()
                    .map(|f| (f.id().to_owned(), f.code().to_owned(), f.message().unwrap_or_default().to_owned()))
                    .collect(),
            }),
            Err(e) => Err(Failure::of("SQS SendMessageBatch", &e)),
        };
        (batch, answer)
    })
}

impl Failure {
    /// A call that failed as a whole, by its error (SQS's or SNS's).
    pub fn of<E>(call: &str, e: &aws_sdk_sqs::error::SdkError<E, aws_sdk_sqs::config::http::HttpResponse>) -> Failure
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        Failure {
            setup: setup_failure(e).map(|(what, fix)| format!("{call} was not sent: {what}; {fix}")),
            code: e.code().map(str::to_owned),
            status: e.raw_response().map(|r| r.status().as_u16()),
            text: e.message().map(str::to_owned).unwrap_or_else(|| DisplayErrorContext(e).to_string()),
        }
    }
}

/// Resolve a call's jobs; true when some must be sent again (after a backoff).
fn settle(
    sent: Vec<(u64, Job)>,
    answer: Answer,
    waiting: &mut BTreeMap<u64, Job>,
    busy: &mut HashSet<(bool, String)>,
    flags: &str,
) -> bool {
    for (_, job) in &sent {
        if let Some(l) = lane(job) {
            busy.remove(&l);
        }
    }
    let out = match answer {
        Ok(out) => out,
        Err(Failure { setup: Some(reason), .. }) => {
            tracing::error!(error = %reason, "a batch call could not be made");
            for (_, job) in sent {
                job.delivery.fail(reason.clone());
            }
            return false;
        }
        Err(f) => {
            let class = class_of(f.code.as_deref(), f.status, false);
            let code = f.code.unwrap_or_else(|| "no answer".into());
            if class == Class::Setup {
                let reason = setup_reason(&code, &f.text, flags);
                tracing::error!(error = %reason, "the service refused a batch call");
                for (_, job) in sent {
                    job.delivery.fail(reason.clone());
                }
                return false;
            }
            tracing::warn!(code = %code, error = %f.text, messages = sent.len(), "a batch call failed; sending again after a backoff");
            waiting.extend(sent);
            return true;
        }
    };
    let mut jobs: Vec<Option<(u64, Job)>> = sent.into_iter().map(Some).collect();
    let mut retry = false;
    for (id, code, message) in &out.failed {
        let Some(slot) = id.parse::<usize>().ok().and_then(|i| jobs.get_mut(i)) else { continue };
        let Some((seq, job)) = slot.take() else { continue };
        match class_of(Some(code), None, true) {
            Class::Transient => {
                retry = true;
                waiting.insert(seq, job);
            }
            Class::BadEvent => {
                let reason = format!("refused the message ({code}): {message}");
                let Job { key, payload, headers, delivery, .. } = job;
                delivery.reject("invalid_message", reason, key, payload, headers);
            }
            Class::Setup => job.delivery.fail(setup_reason(code, message, flags)),
        }
    }
    if retry {
        tracing::warn!("some messages of a batch were not taken (throttling or a service error); sending them again after a backoff");
    }
    // The entries not named as failed were stored.
    let succeeded: HashSet<&str> = out.successful.iter().map(String::as_str).collect();
    for (i, slot) in jobs.into_iter().enumerate() {
        if let Some((seq, job)) = slot {
            if succeeded.contains(i.to_string().as_str()) {
                job.delivery.ack();
            } else {
                // Neither stored nor refused in the answer: send it again.
                retry = true;
                waiting.insert(seq, job);
            }
        }
    }
    retry
}

fn setup_reason(code: &str, text: &str, flags: &str) -> String {
    format!(
        "AWS refused the call ({code}): {text}; check {flags}, --aws-region, and that the credentials may send to it (sqs:SendMessage, sns:Publish) and use its KMS key"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::delivery::{Delivery, Position, Source, Ticket};
    use std::sync::Arc;

    /// A copy with no dead-letter queue fails as a bug; it is never published to the topic.
    #[tokio::test]
    async fn a_dead_letter_copy_without_a_dead_letter_queue_fails_as_a_bug() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let src = Source { position: Position::Lsn(crate::lsn::Lsn(1)), table: Arc::from("public.outbox") };
        let job = Job {
            dlq: true,
            group: None,
            dedup: None,
            body: "b64:eA==".into(),
            attributes: Vec::new(),
            size: 8,
            key: None,
            payload: None,
            headers: Vec::new(),
            delivery: Delivery::new(Ticket(1), "e".into(), "t".into(), src, tx),
        };
        // Nothing listens on port 9: a call made would fail as "no answer", not as a bug.
        let sns = aws_sdk_sns::Config::builder()
            .behavior_version(aws_sdk_sns::config::BehaviorVersion::latest())
            .region(aws_sdk_sns::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        let sqs = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        let target = Target {
            client: aws_sdk_sqs::Client::from_conf(sqs),
            main: Main::Topic { client: aws_sdk_sns::Client::from_conf(sns), arn: "arn:aws:sns:us-east-1:1:t".into() },
            dlq_queue_url: None,
            batch_bytes: 1 << 18,
            flags: "--sns-topic-arn",
        };
        let (sent, answer) = send(&target, vec![(0, job)]).await;
        assert_eq!(sent.len(), 1);
        match answer {
            Err(Failure { setup: Some(why), .. }) => assert!(why.starts_with("bug:"), "{why}"),
            Err(f) => panic!("sent somewhere: {}", f.text),
            Ok(_) => panic!("sent somewhere"),
        }
    }
}
