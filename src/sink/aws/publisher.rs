//! The publisher task the AWS sinks share (`--sink sqs`, `sns`, `kinesis`): it batches jobs into a
//! service's batch call (`SendMessageBatch`, `PublishBatch`, `PutRecords`), keeps up to
//! [`REQUESTS`] calls in flight, and resolves each job's delivery from its entry of the answer.
//! Each service supplies, through [`Service`], its call, its batching limits and its answer turned
//! into one [`Entry`] per job sent; the order rule, the retries and the classing live here once.
//!
//! Order: a lane (a FIFO group, a Kinesis partition key) has **at most one job in flight**. A
//! batch takes the oldest waiting job of each lane that has none in flight, so a lane's next event
//! is sent only after the service answered for the one before; a throttled or failed entry goes
//! back to the waiting jobs at its place (jobs are kept by arrival number), ahead of its lane's
//! later events. The services answer each entry of a batch on its own: were two events of a lane
//! in flight at once, the first could be throttled while the second is stored, and its retry would
//! land after it. Jobs without a lane (standard queues and topics, keyless Kinesis records) keep
//! no order and are never held.
//!
//! Results, per entry ([`crate::sink::aws::class_of`], decided on the code):
//! * stored → `ack()`;
//! * a fault of this entry (too large, an invalid attribute) → `reject()`, for the bad-event policy;
//! * throttling or a service error, for an entry or the whole call, or no answer at all → waits
//!   again after a backoff with jitter ([`crate::retry::backoff`]); nothing is acked, so the slot
//!   stays where it was;
//! * anything else (no such queue or stream, access denied, a disabled KMS key), or a call the SDK
//!   could not make (no usable credentials, [`crate::sink::aws::setup_failure`]) → `fail()` with
//!   the code and what to check: the relay stops rather than dead-letter every event or retry for
//!   good.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;

use super::{class_of, setup_failure, Class};

/// Batch calls in flight at once.
pub const REQUESTS: usize = 8;
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a service's answer says of one job sent, at the job's place in the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// The service stored it.
    Stored,
    /// The service refused it, with the entry's code and message.
    Failed { code: String, message: String },
    /// The answer does not name it (a short answer): neither stored nor refused.
    Missing,
}

/// A call that failed as a whole: its code, HTTP status and text, and the fault of the setup it
/// shows without an answer (no usable credentials: [`setup_failure`]).
pub struct Failure {
    pub code: Option<String>,
    pub status: Option<u16>,
    pub text: String,
    pub setup: Option<String>,
}

impl Failure {
    /// A call named `call` (e.g. "SQS SendMessageBatch") that failed as a whole, by its error.
    pub fn of<E>(call: &str, e: &SdkError<E, aws_sdk_sqs::config::http::HttpResponse>) -> Failure
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

/// A call's answer: one [`Entry`] per job sent, in the order sent, or the call's failure.
pub type Answer = Result<Vec<Entry>, Failure>;
/// What a call came back with: the jobs sent (by arrival number) and the answer.
pub type Sent<J> = (Vec<(u64, J)>, Answer);
pub type Call<J> = Pin<Box<dyn Future<Output = Sent<J>> + Send>>;

/// One job on its way, with what its delivery needs.
pub trait Job: Send + 'static {
    /// To the dead-letter destination rather than the main one.
    fn dlq(&self) -> bool;
    /// What the service counts against a batch's bytes.
    fn size(&self) -> usize;
    fn ack(self);
    fn fail(self, reason: String);
    /// Refused for good by the service: `code` and `message` are the entry's.
    fn reject(self, code: &str, message: &str);
}

/// What one AWS service brings to the publisher.
pub trait Service: Send + 'static {
    type Job: Job;
    /// Entries in one call, and bytes.
    fn limits(&self) -> (usize, usize);
    /// The lane `job` holds while in flight (its group or partition key), `None` for a job that
    /// keeps no order.
    fn lane<'a>(&self, job: &'a Self::Job) -> Option<&'a str>;
    /// The call for `batch` (all of one destination).
    fn send(&self, batch: Vec<(u64, Self::Job)>) -> Call<Self::Job>;
    /// Why a refusal of the setup (`code`, `text`) stops the relay, naming the flags to check.
    fn setup_reason(&self, code: &str, text: &str) -> String;
}

/// The lanes in flight, of the main destination (`[0]`) and of the dead-letter one (`[1]`).
/// Looked up by `&str`: [`take_batch`] asks for every waiting job, so the lookup allocates nothing.
type Busy = [HashSet<String>; 2];

/// The publisher: runs until the channel closes and nothing is left in flight.
pub async fn run<S: Service>(service: S, window: usize, mut rx: mpsc::Receiver<S::Job>) {
    let mut waiting: BTreeMap<u64, S::Job> = BTreeMap::new();
    let mut busy: Busy = Default::default();
    let mut calls: FuturesUnordered<Call<S::Job>> = FuturesUnordered::new();
    let mut next_seq = 0u64;
    let mut attempt = 0u32;
    let mut paused_until: Option<tokio::time::Instant> = None;
    let mut open = true;
    loop {
        if paused_until.is_some_and(|t| t <= tokio::time::Instant::now()) {
            paused_until = None;
        }
        while paused_until.is_none() && calls.len() < REQUESTS {
            let batch = take_batch(&service, &mut waiting, &mut busy);
            if batch.is_empty() {
                break;
            }
            calls.push(service.send(batch));
        }
        if !open && waiting.is_empty() && calls.is_empty() {
            return;
        }
        let pause = paused_until;
        tokio::select! {
            biased;
            Some((sent, answer)) = calls.next(), if !calls.is_empty() => {
                let retry = settle(&service, sent, answer, &mut waiting, &mut busy);
                if retry {
                    paused_until = Some(tokio::time::Instant::now() + crate::retry::backoff(attempt, MAX_BACKOFF));
                    attempt = attempt.saturating_add(1);
                } else {
                    attempt = 0;
                }
            }
            () = async { tokio::time::sleep_until(pause.expect("guarded")).await }, if pause.is_some() => {}
            job = rx.recv(), if open && waiting.len() < window => match job {
                Some(job) => {
                    waiting.insert(next_seq, job);
                    next_seq += 1;
                }
                None => open = false,
            },
        }
    }
}

/// The next batch: the oldest waiting jobs for one destination, at most one per free lane, within
/// the service's limits.
fn take_batch<S: Service>(service: &S, waiting: &mut BTreeMap<u64, S::Job>, busy: &mut Busy) -> Vec<(u64, S::Job)> {
    let (max_entries, max_bytes) = service.limits();
    let mut picked: Vec<u64> = Vec::new();
    let mut dlq = None;
    let mut bytes = 0usize;
    for (seq, job) in waiting.iter() {
        if picked.len() == max_entries {
            break;
        }
        if dlq.is_some_and(|d| d != job.dlq()) {
            continue;
        }
        let side = usize::from(job.dlq());
        let lane = service.lane(job);
        if lane.is_some_and(|l| busy[side].contains(l)) {
            continue;
        }
        if bytes + job.size() > max_bytes && !picked.is_empty() {
            break;
        }
        if let Some(l) = lane {
            busy[side].insert(l.to_owned());
        }
        dlq = Some(job.dlq());
        bytes += job.size();
        picked.push(*seq);
    }
    picked.into_iter().filter_map(|s| waiting.remove(&s).map(|j| (s, j))).collect()
}

/// Resolve a call's jobs; true when some must be sent again (after a backoff).
fn settle<S: Service>(
    service: &S,
    sent: Vec<(u64, S::Job)>,
    answer: Answer,
    waiting: &mut BTreeMap<u64, S::Job>,
    busy: &mut Busy,
) -> bool {
    for (_, job) in &sent {
        if let Some(l) = service.lane(job) {
            busy[usize::from(job.dlq())].remove(l);
        }
    }
    let entries = match answer {
        Ok(entries) => entries,
        Err(Failure { setup: Some(reason), .. }) => {
            tracing::error!(error = %reason, "a batch call could not be made");
            for (_, job) in sent {
                job.fail(reason.clone());
            }
            return false;
        }
        Err(f) => {
            let class = class_of(f.code.as_deref(), f.status, false);
            let code = f.code.unwrap_or_else(|| "no answer".into());
            if class == Class::Setup {
                let reason = service.setup_reason(&code, &f.text);
                tracing::error!(error = %reason, "the service refused a batch call");
                for (_, job) in sent {
                    job.fail(reason.clone());
                }
                return false;
            }
            tracing::warn!(code = %code, error = %f.text, entries = sent.len(), "a batch call failed; sending again after a backoff");
            waiting.extend(sent);
            return true;
        }
    };
    let mut retry = false;
    let mut entries = entries.into_iter();
    for (seq, job) in sent {
        match entries.next().unwrap_or(Entry::Missing) {
            Entry::Stored => job.ack(),
            // Neither stored nor refused in the answer: send it again.
            Entry::Missing => {
                retry = true;
                waiting.insert(seq, job);
            }
            Entry::Failed { code, message } => match class_of(Some(&code), None, true) {
                Class::Transient => {
                    retry = true;
                    waiting.insert(seq, job);
                }
                Class::BadEvent => job.reject(&code, &message),
                Class::Setup => job.fail(service.setup_reason(&code, &message)),
            },
        }
    }
    if retry {
        tracing::warn!("some entries of a batch were not taken (throttling or a service error); sending them again after a backoff");
    }
    retry
}

/// A batch answer that names its entries by id (SQS's and SNS's: the id is the entry's place in
/// the call) as one [`Entry`] per job of a batch of `n`: a failed id wins over a successful one,
/// and an id the answer does not name, or names out of range, is [`Entry::Missing`].
pub fn by_id<'a>(
    n: usize,
    successful: impl IntoIterator<Item = &'a str>,
    failed: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
) -> Vec<Entry> {
    let mut out = vec![Entry::Missing; n];
    let place = |id: &str| id.parse::<usize>().ok().filter(|i| *i < n);
    for id in successful {
        if let Some(i) = place(id) {
            out[i] = Entry::Stored;
        }
    }
    for (id, code, message) in failed {
        if let Some(i) = place(id) {
            out[i] = Entry::Failed { code: code.to_owned(), message: message.to_owned() };
        }
    }
    out
}
