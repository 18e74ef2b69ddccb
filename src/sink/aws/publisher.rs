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
//!
//! Backoff, per what failed: each job sent again waits its own backoff, grown by each of its own
//! failures and never reset by other jobs' successes, and holds its lane meanwhile. A key (a
//! Kinesis shard's hot key, a FIFO group) whose entries keep being throttled while others are
//! stored so slows down alone, instead of retrying at full speed because some other call went
//! through. A call that failed as a whole (the queue, stream or account throttled, no answer)
//! also pauses all sending, for a backoff that an answered call resets: the service answering is
//! what it waited for.
//! * anything else (no such queue or stream, access denied, a disabled KMS key), or a call the SDK
//!   could not make (no usable credentials, [`crate::sink::aws::setup_failure`]) → `fail()` with
//!   the code and what to check: the relay stops rather than dead-letter every event or retry for
//!   good.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::errors::Expiry;
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
            text: crate::sink::aws::error_text(e),
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
    /// Refused for good: `kind` and `reason` for the bad-event policy, with the record's parts.
    fn reject(self, kind: &'static str, reason: String);
}

/// [`Job`] for a job type with the fields `dlq`, `size`, `key`, `payload`, `headers` and
/// `delivery` (SQS's and Kinesis's jobs), so the services do not each write it out.
#[macro_export]
macro_rules! aws_job {
    ($t:ty) => {
        impl $crate::sink::aws::publisher::Job for $t {
            fn dlq(&self) -> bool {
                self.dlq
            }
            fn size(&self) -> usize {
                self.size
            }
            fn ack(self) {
                self.delivery.ack()
            }
            fn fail(self, reason: String) {
                self.delivery.fail(reason)
            }
            fn reject(self, kind: &'static str, reason: String) {
                self.delivery.reject(kind, reason, self.key, self.payload, self.headers);
            }
        }
    };
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
    /// A refusal of one entry for good (`code`, `message`) as the bad-event kind and reason.
    fn refusal(&self, code: &str, message: &str) -> (&'static str, String);
    /// Why a refusal of the setup (`code`, `text`) stops the relay, naming the flags to check.
    fn setup_reason(&self, code: &str, text: &str) -> String;
}

/// The lanes in flight, of the main destination (`[0]`) and of the dead-letter one (`[1]`).
/// Looked up by `&str`: [`take_batch`] asks for every waiting job, so the lookup allocates nothing.
type Busy = [HashSet<String>; 2];

/// A job that failed before: how many times, and when it may be sent again.
struct Retry {
    tries: u32,
    due: Instant,
}

/// The jobs not resolved yet and not in flight, by arrival number, with the lanes in flight, the
/// backoffs of the jobs that failed before, and how long calls have been answered "expired".
struct Queue<J> {
    waiting: BTreeMap<u64, J>,
    busy: Busy,
    retries: HashMap<u64, Retry>,
    expiry: Expiry,
}

impl<J> Queue<J> {
    /// `job` failed (or was not answered) at `now`: back at its place, to go after its backoff.
    fn again(&mut self, seq: u64, job: J, now: Instant) {
        let r = self.retries.entry(seq).or_insert(Retry { tries: 0, due: now });
        r.due = now + crate::retry::backoff(r.tries, MAX_BACKOFF);
        r.tries = r.tries.saturating_add(1);
        self.waiting.insert(seq, job);
    }
}

/// How a call ended, for the pause of all sending.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The service answered (whatever it said of each entry).
    Answered,
    /// The call failed as a whole and its jobs wait again.
    Failed,
    /// The call showed a fault of the setup; its jobs failed.
    Stopped,
}

/// The publisher: runs until the channel closes and nothing is left in flight.
pub async fn run<S: Service>(service: S, window: usize, mut rx: mpsc::Receiver<S::Job>) {
    let mut q = Queue {
        waiting: BTreeMap::new(),
        busy: Default::default(),
        retries: HashMap::new(),
        expiry: Expiry::default(),
    };
    let mut calls: FuturesUnordered<Call<S::Job>> = FuturesUnordered::new();
    let mut next_seq = 0u64;
    let mut attempt = 0u32;
    let mut paused_until: Option<Instant> = None;
    let mut open = true;
    loop {
        let now = Instant::now();
        if paused_until.is_some_and(|t| t <= now) {
            paused_until = None;
        }
        let mut wake = paused_until;
        while paused_until.is_none() && calls.len() < REQUESTS {
            let (batch, due) = take_batch(&service, &mut q, now);
            wake = due;
            if batch.is_empty() {
                break;
            }
            calls.push(service.send(batch));
        }
        if !open && q.waiting.is_empty() && calls.is_empty() {
            return;
        }
        tokio::select! {
            biased;
            Some((sent, answer)) = calls.next(), if !calls.is_empty() => {
                match settle(&service, sent, answer, &mut q, Instant::now()) {
                    Ended::Answered => attempt = 0,
                    Ended::Failed => {
                        paused_until = Some(Instant::now() + crate::retry::backoff(attempt, MAX_BACKOFF));
                        attempt = attempt.saturating_add(1);
                    }
                    Ended::Stopped => {}
                }
            }
            () = async { tokio::time::sleep_until(wake.expect("guarded")).await }, if wake.is_some() => {}
            job = rx.recv(), if open && q.waiting.len() < window => match job {
                Some(job) => {
                    q.waiting.insert(next_seq, job);
                    next_seq += 1;
                }
                None => open = false,
            },
        }
    }
}

/// The next batch: the oldest waiting jobs for one destination, at most one per free lane, none
/// before its backoff ends (nor its lane's later jobs), within the service's limits; and when the
/// first job passed over for its backoff may go.
fn take_batch<S: Service>(service: &S, q: &mut Queue<S::Job>, now: Instant) -> (Vec<(u64, S::Job)>, Option<Instant>) {
    let (max_entries, max_bytes) = service.limits();
    let mut picked: Vec<u64> = Vec::new();
    let mut held: HashSet<(usize, &str)> = HashSet::new();
    let mut next_due: Option<Instant> = None;
    let mut dlq = None;
    let mut bytes = 0usize;
    for (seq, job) in q.waiting.iter() {
        if picked.len() == max_entries {
            break;
        }
        let side = usize::from(job.dlq());
        let lane = service.lane(job);
        if lane.is_some_and(|l| q.busy[side].contains(l) || held.contains(&(side, l))) {
            continue;
        }
        if let Some(due) = q.retries.get(seq).map(|r| r.due).filter(|d| *d > now) {
            next_due = Some(next_due.map_or(due, |n| n.min(due)));
            if let Some(l) = lane {
                held.insert((side, l));
            }
            continue;
        }
        if dlq.is_some_and(|d| d != job.dlq()) {
            continue;
        }
        if bytes + job.size() > max_bytes && !picked.is_empty() {
            break;
        }
        if let Some(l) = lane {
            q.busy[side].insert(l.to_owned());
        }
        dlq = Some(job.dlq());
        bytes += job.size();
        picked.push(*seq);
    }
    let batch = picked.into_iter().filter_map(|s| q.waiting.remove(&s).map(|j| (s, j))).collect();
    (batch, next_due)
}

/// Resolve a call's jobs at `now`: acked, refused, failed, or back to wait their backoff.
fn settle<S: Service>(
    service: &S,
    sent: Vec<(u64, S::Job)>,
    answer: Answer,
    q: &mut Queue<S::Job>,
    now: Instant,
) -> Ended {
    for (_, job) in &sent {
        if let Some(l) = service.lane(job) {
            q.busy[usize::from(job.dlq())].remove(l);
        }
    }
    let entries = match answer {
        Ok(entries) => {
            q.expiry.answered();
            entries
        }
        Err(Failure { setup: Some(reason), .. }) => {
            tracing::error!(error = %reason, "a batch call could not be made");
            for (seq, job) in sent {
                q.retries.remove(&seq);
                job.fail(reason.clone());
            }
            return Ended::Stopped;
        }
        Err(f) => {
            let class = q.expiry.class(f.code.as_deref(), f.status, now);
            let code = f.code.unwrap_or_else(|| "no answer".into());
            if class == Class::Setup {
                let reason = service.setup_reason(&code, &f.text);
                tracing::error!(error = %reason, "the service refused a batch call");
                for (seq, job) in sent {
                    q.retries.remove(&seq);
                    job.fail(reason.clone());
                }
                return Ended::Stopped;
            }
            if super::errors::expired(&code) {
                tracing::warn!(code = %code, error = %f.text, entries = sent.len(), "AWS answered that the credentials (or the request's time) expired; sending again after a backoff while the SDK renews them (the relay stops if this lasts {} minutes)", super::errors::EXPIRED_FOR.as_secs() / 60);
            } else {
                tracing::warn!(code = %code, error = %f.text, entries = sent.len(), "a batch call failed; sending again after a backoff");
            }
            for (seq, job) in sent {
                q.again(seq, job, now);
            }
            return Ended::Failed;
        }
    };
    let mut retried = 0usize;
    let mut entries = entries.into_iter();
    for (seq, job) in sent {
        let entry = entries.next().unwrap_or(Entry::Missing);
        let again = match entry {
            Entry::Stored => {
                job.ack();
                None
            }
            // Neither stored nor refused in the answer: send it again.
            Entry::Missing => Some(job),
            Entry::Failed { code, message } => match class_of(Some(&code), None, true) {
                Class::Transient => Some(job),
                Class::BadEvent => {
                    let (kind, reason) = service.refusal(&code, &message);
                    job.reject(kind, reason);
                    None
                }
                Class::Setup => {
                    job.fail(service.setup_reason(&code, &message));
                    None
                }
            },
        };
        match again {
            Some(job) => {
                retried += 1;
                q.again(seq, job, now);
            }
            None => {
                q.retries.remove(&seq);
            }
        }
    }
    if retried > 0 {
        tracing::warn!(entries = retried, "some entries of a batch were not taken (throttling or a service error); sending them again after a backoff");
    }
    Ended::Answered
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
            out[i] = Entry::Failed { code: code.to_owned(), message: super::service_text(message) };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    //! Short answers (review A4): an answer that leaves entries out acks only what it names; the
    //! rest wait again (with their backoff), and nothing panics, whatever ids or counts come back.
    use std::sync::Arc;

    use crate::sink::acks::{ack_queue, AckReceiver, AckSender};
    use aws_sdk_kinesis::operation::put_records::PutRecordsOutput;
    use aws_sdk_kinesis::types::PutRecordsResultEntry;

    use super::*;
    use crate::sink::delivery::{Ack, Delivery, Outcome, Position, Source, Ticket};
    use crate::sink::kinesis::publisher as kinesis;
    use crate::sink::kinesis::record::Job as KJob;
    use crate::sink::sqs::message::Job as SJob;
    use crate::sink::sqs::publisher as sqs;

    fn delivery(n: u64, tx: &AckSender<Ack>) -> Delivery {
        let src = Source { position: Position::Lsn(crate::lsn::Lsn(n + 1)), table: Arc::from("public.outbox") };
        Delivery::new(Ticket(n), format!("e{n}").into(), "t".into(), src, tx.clone())
    }

    fn kjob(n: u64, tx: &AckSender<Ack>) -> (u64, KJob) {
        let job = KJob {
            dlq: false,
            partition_key: format!("k{n}"),
            data: bytes::Bytes::from_static(b"{}"),
            size: 4,
            keyed: true,
            key: None,
            payload: None,
            headers: Vec::new(),
            delivery: delivery(n, tx),
        };
        (n, job)
    }

    fn sjob(n: u64, tx: &AckSender<Ack>) -> (u64, SJob) {
        let job = SJob {
            dlq: false,
            group: Some(format!("k{n}")),
            dedup: Some(format!("e{n}")),
            body: "{}".into(),
            attributes: Vec::new(),
            size: 2,
            key: None,
            payload: None,
            headers: Vec::new(),
            delivery: delivery(n, tx),
        };
        (n, job)
    }

    /// A client that answers nothing (nothing listens on port 9): no test here sends.
    fn kinesis_target() -> kinesis::Target {
        let conf = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .region(aws_sdk_kinesis::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        kinesis::Target {
            client: aws_sdk_kinesis::Client::from_conf(conf),
            stream: "s".into(),
            dlq_stream: None,
            ordered: true,
        }
    }

    fn sqs_target() -> sqs::Target {
        let conf = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        sqs::Target {
            client: aws_sdk_sqs::Client::from_conf(conf),
            main: sqs::Main::Queue("http://127.0.0.1:9/1/q.fifo".into()),
            dlq_queue_url: None,
            batch_bytes: 1 << 18,
            flags: "--sqs-queue-url",
        }
    }

    fn queue<J>() -> Queue<J> {
        Queue { waiting: BTreeMap::new(), busy: Default::default(), retries: HashMap::new(), expiry: Expiry::default() }
    }

    /// The tickets resolved so far, with whether each was acked.
    fn resolved(rx: &mut AckReceiver<Ack>) -> Vec<(u64, bool)> {
        let mut out = Vec::new();
        while let Some(a) = rx.try_recv() {
            out.push((a.ticket.0, matches!(a.outcome, Outcome::Acked)));
        }
        out
    }

    fn stored(seq: &str) -> PutRecordsResultEntry {
        PutRecordsResultEntry::builder().sequence_number(seq).shard_id("shardId-000000000000").build()
    }

    #[tokio::test]
    async fn a_short_put_records_answer_acks_only_the_records_it_answers() {
        let (tx, mut rx) = ack_queue();
        let target = kinesis_target();
        let sent: Vec<(u64, KJob)> = (0..4).map(|n| kjob(n, &tx)).collect();
        // Two result entries for four records: the first stored, the second with neither a
        // sequence number nor a code.
        let out = PutRecordsOutput::builder()
            .records(stored("1"))
            .records(PutRecordsResultEntry::builder().build())
            .build()
            .expect("records are set");
        let answer = kinesis::entries(&out, sent.len());
        assert_eq!(answer, vec![Entry::Stored, Entry::Missing, Entry::Missing, Entry::Missing]);
        let mut q = queue();
        let now = Instant::now();
        assert_eq!(settle(&target, sent, Ok(answer), &mut q, now), Ended::Answered);
        assert_eq!(resolved(&mut rx), vec![(0, true)], "only the answered record is acked");
        assert_eq!(q.waiting.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3], "the others wait again");
        assert!(q.retries.values().all(|r| r.tries == 1 && r.due > now), "and after a backoff");
        assert!(q.busy.iter().all(HashSet::is_empty), "no key stays in flight");
        // Their next try is not before the backoff, nor are their keys' later records.
        let (batch, due) = take_batch(&target, &mut q, now);
        assert!(batch.is_empty() && due.is_some());
        let (batch, _) = take_batch(&target, &mut q, now + MAX_BACKOFF * 2);
        assert_eq!(batch.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1, 2, 3]);
        for (_, j) in batch {
            Job::ack(j);
        }
        // An empty Records list, and one longer than the call, panic nothing either.
        let out = PutRecordsOutput::builder().set_records(Some(Vec::new())).build().expect("set");
        assert_eq!(kinesis::entries(&out, 2), vec![Entry::Missing, Entry::Missing]);
        let out = PutRecordsOutput::builder().records(stored("1")).records(stored("2")).build().expect("set");
        assert_eq!(kinesis::entries(&out, 1), vec![Entry::Stored]);
    }

    #[tokio::test]
    async fn a_batch_answer_that_omits_an_entry_acks_only_the_entries_it_names() {
        let (tx, mut rx) = ack_queue();
        let target = sqs_target();
        let sent: Vec<(u64, SJob)> = (0..4).map(|n| sjob(n, &tx)).collect();
        // Entry 0 stored, 2 throttled, 1 and 3 named nowhere; ids out of range or not numbers
        // are passed over.
        let answer = by_id(4, ["0", "9", "x", "-1"], [("2", "RequestThrottled", "slow down"), ("44", "Bad", "?")]);
        assert_eq!(
            answer,
            vec![
                Entry::Stored,
                Entry::Missing,
                Entry::Failed { code: "RequestThrottled".into(), message: "slow down".into() },
                Entry::Missing
            ]
        );
        let mut q = queue();
        assert_eq!(settle(&target, sent, Ok(answer), &mut q, Instant::now()), Ended::Answered);
        assert_eq!(resolved(&mut rx), vec![(0, true)]);
        assert_eq!(q.waiting.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
        // A failed id wins over the same id listed as successful; an empty answer names nothing.
        assert_eq!(
            by_id(1, ["0"], [("0", "InternalError", "")])[0],
            Entry::Failed { code: "InternalError".into(), message: String::new() }
        );
        assert_eq!(by_id(2, [], []), vec![Entry::Missing, Entry::Missing]);
        for (_, j) in std::mem::take(&mut q.waiting) {
            Job::ack(j);
        }
    }

    #[tokio::test]
    async fn an_expired_session_sends_again_and_stops_the_relay_only_when_it_lasts() {
        let (tx, mut rx) = ack_queue();
        let target = sqs_target();
        let expired = || Failure {
            code: Some("ExpiredToken".into()),
            status: Some(403),
            text: "The security token included in the request is expired".into(),
            setup: None,
        };
        let mut q = queue();
        let t0 = Instant::now();
        let sent: Vec<(u64, SJob)> = (0..2).map(|n| sjob(n, &tx)).collect();
        assert_eq!(settle(&target, sent, Err(expired()), &mut q, t0), Ended::Failed);
        assert!(resolved(&mut rx).is_empty(), "nothing failed: the jobs wait again");
        let sent: Vec<(u64, SJob)> = std::mem::take(&mut q.waiting).into_iter().collect();
        let later = t0 + super::super::errors::EXPIRED_FOR;
        assert_eq!(settle(&target, sent, Err(expired()), &mut q, later), Ended::Stopped);
        assert_eq!(resolved(&mut rx), vec![(0, false), (1, false)], "expired for good: the relay stops");
    }
}
