//! `outboxd dlq` against `--sink sqs`: reading the dead-letter copies the SQS sink sent to
//! `--sqs-dlq-queue-url` ([`super::message`] says their form), and sending them back to the queue.
//!
//! An SQS queue is read by taking messages, not by position: a received message is hidden from
//! every reader for a visibility timeout (`--sqs-visibility-timeout`), and is gone only when
//! deleted. So:
//! * Reading ([`SqsReader::next`]) receives pages of up to 10 messages with that timeout, and
//!   holds each one (its receipt handle, by the record's offset, a number counted per run) until
//!   the end, when [`SqsReader::release`] makes the ones still held visible again. A message seen
//!   again (its timeout ran out during a long run) is known by its `MessageId` and not read twice.
//!   Reading ends at a receive that brings nothing new.
//! * `replay` deletes a copy only **after** the queue accepted the event sent from it
//!   ([`SqsReader::replayed`], called with the positions the replay counted as acked). A replay
//!   stopped at any point (killed, a network failure, a throttled queue) leaves every copy it did
//!   not delete in the dead-letter queue, visible again after the timeout: nothing is lost, and an
//!   event sent but not yet deleted is sent again by the next run (at least once; on a FIFO queue
//!   SQS drops that second copy within its 5-minute deduplication window, the event id being the
//!   deduplication id). There is no progress file: the queue itself is the progress.
//! * On a FIFO dead-letter queue SQS hands out no more of a group (a key) while some of it is held:
//!   `replay` reads on after each batch it deleted ([`SqsReader::again`]), but a copy it holds
//!   without deleting (filtered out, no destination, failed, an incomplete chunk set) blocks its
//!   group's later copies until the release at the end. So it does not always reach them all:
//!   at the end it compares what it holds with the queue's counts ([`SqsReader::unreached`])
//!   and exits non-zero naming the number it did not reach. `list`, which deletes nothing, may
//!   show fewer than the queue holds, and says so.
//!
//! Replay sends each event as `--sink sqs` sends it ([`super::message::event_message`]: the
//! payload as the body, the headers but `outboxd.*` and the key as attributes, on a FIFO queue
//! group id = key and deduplication id = event id), so the message is the one the relay would have
//! written. On a FIFO queue a call holds one message of a group, and once one of a group was not
//! replayed (refused, failed, or its copy held back: no destination, no payload, unreadable) the
//! later ones of that group are not sent in this run, in any later batch ([`SqsTarget`] keeps
//! them for the whole run), so a key keeps its order. A copy left out by `--filter-reason` or
//! `--event-id` does not hold its key back: that selection is the operator's.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message as SqsMsg,
    MessageSystemAttributeName,
};
use aws_sdk_sqs::Client;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;

use super::message::{event_message, group_of, H_COPY_HEADERS, H_COPY_KEY};
use super::publisher::Failure;
use super::{queue_facts, QueueFacts, DEFAULT_MAX_BYTES};
use crate::error::{Definite, Error};
use crate::router::Record;
use crate::sink::aws::{class_of, sdk_config, setup_failure, AwsConfig, Class};
use crate::sink::dead_letter::entry::Entry;
use crate::sink::dead_letter::{DlqRecord, PREFIX};

/// Messages in one receive, delete or send call (SQS's limit).
const PAGE: usize = 10;
/// Tries of a batch whose messages SQS keeps throttling before replay reports them failed.
const TRIES: u32 = 8;
/// Tries of asking a destination what it is (FIFO, its size limit) before a batch to it fails.
const FACTS_TRIES: u32 = 4;

/// A message received and not yet deleted or released.
struct Held {
    id: String,
    receipt: String,
}

/// Reads `--sqs-dlq-queue-url`; see the module doc.
pub struct SqsReader {
    client: Client,
    url: String,
    visibility: i32,
    timeout: Duration,
    /// By the record's offset.
    held: BTreeMap<i64, Held>,
    /// Every message id read in this run, with its offset.
    seen: HashMap<String, i64>,
    next_offset: i64,
    page: VecDeque<DlqRecord>,
    done: bool,
    /// Some copy was deleted since reading last came to an end.
    deleted: bool,
}

/// The client for the AWS settings.
pub async fn client(aws: &AwsConfig) -> Client {
    Client::new(&sdk_config(aws).await)
}

impl SqsReader {
    /// `None` when the queue holds no message (visible or not).
    pub async fn open(
        aws: &AwsConfig,
        url: &str,
        visibility: Duration,
        timeout: Duration,
    ) -> Result<Option<SqsReader>, Definite> {
        let client = client(aws).await;
        match queue_facts(&client, "--sqs-dlq-queue-url", url).await {
            Err(r) => return Err(Definite::Setup(r.to_string())),
            Ok(None) => {
                return Err(Definite::Setup(format!(
                    "--sqs-dlq-queue-url {url}: no answer from SQS; check --aws-endpoint-url / --aws-region and the network"
                )))
            }
            Ok(Some(_)) => {}
        }
        Ok(Some(SqsReader {
            client,
            url: url.to_owned(),
            visibility: visibility.as_secs().clamp(1, 12 * 3600) as i32,
            timeout,
            held: BTreeMap::new(),
            seen: HashMap::new(),
            next_offset: 0,
            page: VecDeque::new(),
            done: false,
            deleted: false,
        }))
    }

    /// The next copy; `None` at a receive that brought nothing new.
    pub async fn next(&mut self) -> Result<Option<DlqRecord>, Error> {
        loop {
            if let Some(r) = self.page.pop_front() {
                return Ok(Some(r));
            }
            if self.done {
                return Ok(None);
            }
            let got = self.receive().await?;
            let mut new = 0;
            for m in got {
                let (Some(id), Some(receipt)) = (m.message_id(), m.receipt_handle()) else { continue };
                if let Some(&offset) = self.seen.get(id) {
                    // Seen before in this run: keep the newest receipt, which the delete needs.
                    if let Some(h) = self.held.get_mut(&offset) {
                        h.receipt = receipt.to_owned();
                    }
                    continue;
                }
                let offset = self.next_offset;
                self.next_offset += 1;
                self.seen.insert(id.to_owned(), offset);
                self.held.insert(offset, Held { id: id.to_owned(), receipt: receipt.to_owned() });
                self.page.push_back(record(&m, offset));
                new += 1;
            }
            if new == 0 {
                self.done = true;
            }
        }
    }

    /// Whether reading may bring more after it ended: a copy was deleted since, which on a FIFO
    /// queue frees the later messages of its group. Starts reading again if so.
    pub fn again(&mut self) -> bool {
        if self.done && self.deleted {
            self.done = false;
            self.deleted = false;
            return true;
        }
        false
    }

    async fn receive(&mut self) -> Result<Vec<SqsMsg>, Definite> {
        let started = Instant::now();
        loop {
            let asked = self
                .client
                .receive_message()
                .queue_url(&self.url)
                .max_number_of_messages(PAGE as i32)
                .visibility_timeout(self.visibility)
                .wait_time_seconds(1)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await;
            let why = match asked {
                Ok(out) => return Ok(out.messages.unwrap_or_default()),
                Err(e) => {
                    if let Some((what, fix)) = setup_failure(&e) {
                        return Err(Definite::Setup(format!("--sqs-dlq-queue-url {}: {what}; {fix}", self.url)));
                    }
                    let code = e.code().map(str::to_owned);
                    let text = e.message().map(str::to_owned).unwrap_or_else(|| DisplayErrorContext(&e).to_string());
                    if class_of(code.as_deref(), e.raw_response().map(|r| r.status().as_u16()), false) == Class::Setup {
                        return Err(Definite::Setup(format!(
                            "--sqs-dlq-queue-url {}: SQS refused ReceiveMessage ({}): {text}; check the URL and that the credentials may sqs:ReceiveMessage, sqs:DeleteMessage and sqs:ChangeMessageVisibility on it",
                            self.url,
                            code.unwrap_or_default()
                        )));
                    }
                    format!("{}: {text}", code.unwrap_or_else(|| "no answer".into()))
                }
            };
            if started.elapsed() >= self.timeout {
                return Err(Definite::Setup(format!(
                    "reading SQS queue {} stalled for --read-timeout {:?}: {why}; check the network, or raise --read-timeout",
                    self.url, self.timeout
                )));
            }
            tracing::warn!(error = %why, "receiving from SQS queue {}; retrying", self.url);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Delete the copies at `positions`, whose events the destination accepted. A delete that
    /// fails leaves the copy to come back after its timeout and be replayed again (at least
    /// once): it is logged, not an error.
    pub async fn replayed(&mut self, positions: &[(i32, i64)]) {
        let done: Vec<Held> = positions.iter().filter_map(|(_, o)| self.held.remove(o)).collect();
        for chunk in done.chunks(PAGE) {
            let entries: Vec<DeleteMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, h)| {
                    DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(&h.receipt).build().ok()
                })
                .collect();
            let mut tries = 0;
            loop {
                tries += 1;
                match self
                    .client
                    .delete_message_batch()
                    .queue_url(&self.url)
                    .set_entries(Some(entries.clone()))
                    .send()
                    .await
                {
                    Ok(out) => {
                        for f in out.failed() {
                            let id = f.id().parse::<usize>().ok().and_then(|i| chunk.get(i)).map(|h| h.id.as_str());
                            tracing::warn!(message = id.unwrap_or("?"), code = f.code(), "SQS did not delete a replayed dead letter; it comes back after the visibility timeout and a later replay sends it again");
                        }
                        self.deleted = true;
                        break;
                    }
                    Err(e) if tries < TRIES => {
                        tracing::warn!(error = %DisplayErrorContext(&e), "deleting replayed dead letters; retrying");
                        tokio::time::sleep(crate::retry::backoff(tries, Duration::from_secs(5))).await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %DisplayErrorContext(&e), "SQS did not delete {} replayed dead letters; they come back after the visibility timeout and a later replay sends them again", chunk.len());
                        break;
                    }
                }
            }
        }
    }

    /// How many copies the queue holds beyond those this run still holds, by the queue's
    /// approximate counts (visible + in flight), or `None` when it says none or does not answer.
    /// On a FIFO queue they are copies of groups this run held without deleting (filtered out,
    /// no destination, failed), which SQS hands out to no one until those are released. The
    /// counts lag deletes by a little, so a count above ours is asked again a few times first.
    pub async fn unreached(&self) -> Option<u64> {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        for tries in 1..=4 {
            let out = self
                .client
                .get_queue_attributes()
                .queue_url(&self.url)
                .attribute_names(A::ApproximateNumberOfMessages)
                .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
                .send()
                .await
                .ok()?;
            let count = |a: A| out.attributes().and_then(|m| m.get(&a)).and_then(|v| v.parse::<u64>().ok());
            let total = count(A::ApproximateNumberOfMessages)? + count(A::ApproximateNumberOfMessagesNotVisible)?;
            let beyond = total.saturating_sub(self.held.len() as u64);
            if beyond == 0 {
                return None;
            }
            if tries == 4 {
                return Some(beyond);
            }
            tokio::time::sleep(Duration::from_millis(500 * tries)).await;
        }
        None
    }

    /// Make every copy still held visible again, for the next reader (best effort: one not
    /// released becomes visible when its timeout runs out).
    pub async fn release(&mut self) {
        let held: Vec<Held> = std::mem::take(&mut self.held).into_values().collect();
        for chunk in held.chunks(PAGE) {
            let entries: Vec<ChangeMessageVisibilityBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, h)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(&h.receipt)
                        .visibility_timeout(0)
                        .build()
                        .ok()
                })
                .collect();
            let sent = self
                .client
                .change_message_visibility_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await;
            if let Err(e) = sent {
                tracing::warn!(error = %DisplayErrorContext(&e), "could not make {} dead letters visible again; they are when their visibility timeout runs out", chunk.len());
            }
        }
    }
}

/// A received copy as a DLQ record: the body `b64:PAYLOAD` or `null`, the headers from
/// [`H_COPY_HEADERS`], the key from [`H_COPY_KEY`]. A message not in that form (not written by
/// outboxd) is named in [`DlqRecord::undecoded`], so it is reported and never replayed.
fn record(m: &SqsMsg, offset: i64) -> DlqRecord {
    let mut undecoded = Vec::new();
    let body = m.body().unwrap_or_default();
    let payload = match body.strip_prefix("b64:") {
        Some(b) => STANDARD.decode(b).map_err(|_| undecoded.push("the body (base64)".to_owned())).ok(),
        None if body == "null" => None,
        None => {
            undecoded.push("the body (not an outboxd dead-letter copy)".to_owned());
            None
        }
    };
    let attrs = m.message_attributes();
    let text = |n: &str| attrs.and_then(|a| a.get(n)).and_then(|v| v.string_value()).map(str::to_owned);
    let headers = match text(H_COPY_HEADERS).map(|t| serde_json::from_str::<Vec<(String, String)>>(&t)) {
        Some(Ok(list)) => list
            .into_iter()
            .filter_map(|(n, v)| match STANDARD.decode(&v) {
                Ok(v) => Some((n, Some(v))),
                Err(_) => {
                    undecoded.push(format!("header {n} (base64)"));
                    None
                }
            })
            .collect(),
        _ => {
            undecoded.push(format!("attribute {H_COPY_HEADERS}"));
            Vec::new()
        }
    };
    let key = text(H_COPY_KEY)
        .and_then(|k| STANDARD.decode(k).map_err(|_| undecoded.push(format!("attribute {H_COPY_KEY}"))).ok());
    let sent =
        m.attributes().and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp)).and_then(|t| t.parse().ok());
    DlqRecord {
        partition: 0,
        offset,
        key,
        payload_len: payload.as_ref().map(Vec::len),
        payload,
        headers,
        timestamp_ms: None,
        time_ms: sent,
        label: Some(m.message_id().unwrap_or("-").to_owned()),
        undecoded,
        moved_later: false,
    }
}

/// The event replay sends for `r`: its key, payload and headers but `outboxd.*`.
fn replayed(r: &DlqRecord, dest: &str) -> Record {
    Record {
        topic: dest.to_owned(),
        key: r.key.clone().map(Bytes::from),
        payload: r.payload.clone().map(Bytes::from),
        headers: r
            .headers
            .iter()
            .filter(|(k, _)| !k.starts_with(PREFIX))
            .map(|(k, v)| (k.clone(), Bytes::from(v.clone().unwrap_or_default())))
            .collect(),
        partition: None,
        timestamp_ms: None,
        event_id: r.event_id().unwrap_or_default(),
        event_type: None,
    }
}

/// Where replay sends: the clients, and what each destination (an SQS queue URL, or an SNS topic
/// ARN for `--sink sns`) said of itself: FIFO or not, and the largest message it takes.
pub struct SqsTarget {
    client: Client,
    sns: aws_sdk_sns::Client,
    dests: HashMap<String, Result<(bool, usize), String>>,
    /// FIFO (destination, group) pairs with an event not replayed in this run: their later
    /// events are not sent either, in any later batch of the run (the key's order).
    blocked: HashSet<(String, String)>,
}

/// Entries stored (id, new message id), and entries failed (id, code, message).
type Answered = (Vec<(String, String)>, Vec<(String, String, String)>);

/// Whether `dest` is an SNS topic ARN rather than a queue URL.
fn is_topic(dest: &str) -> bool {
    dest.starts_with("arn:") && dest.split(':').nth(2) == Some("sns")
}

impl SqsTarget {
    pub async fn connect(aws: &AwsConfig) -> SqsTarget {
        let sdk = sdk_config(aws).await;
        SqsTarget {
            client: Client::new(&sdk),
            sns: aws_sdk_sns::Client::new(&sdk),
            dests: HashMap::new(),
            blocked: HashSet::new(),
        }
    }

    /// What `dest` said of itself. An answer, or a refusal, is kept for the run; no answer (a
    /// transient failure) is tried again with a backoff, up to [`FACTS_TRIES`] times, and is not
    /// kept, so the next batch for `dest` asks again.
    async fn facts(&mut self, dest: &str) -> Result<(bool, usize), String> {
        if let Some(f) = self.dests.get(dest) {
            return f.clone();
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let f = if is_topic(dest) {
                match crate::sink::sns::topic_fifo(&self.sns, dest).await {
                    Ok(Some(fifo)) => Some(Ok((fifo, DEFAULT_MAX_BYTES))),
                    Ok(None) => None,
                    Err(why) => Some(Err(why)),
                }
            } else {
                match queue_facts(&self.client, "destination queue", dest).await {
                    Ok(Some(QueueFacts { fifo, max_bytes })) => Some(Ok((fifo, max_bytes))),
                    Ok(None) => None,
                    Err(r) => Some(Err(r.to_string())),
                }
            };
            match f {
                Some(f) => {
                    self.dests.insert(dest.to_owned(), f.clone());
                    return f;
                }
                None if tries >= FACTS_TRIES => {
                    let service = if is_topic(dest) { "SNS" } else { "SQS" };
                    return Err(format!(
                        "{dest}: no answer from {service} after {tries} tries; left for a later run (check --aws-endpoint-url / --aws-region and the network)"
                    ));
                }
                None => {
                    tracing::warn!(destination = dest, "no answer asking what the destination is; retrying");
                    tokio::time::sleep(crate::retry::backoff(tries, Duration::from_secs(5))).await;
                }
            }
        }
    }

    /// One `SendMessageBatch` (a queue) or `PublishBatch` (a topic) call with `msgs`, entry ids
    /// their numbers.
    async fn call(&self, dest: &str, msgs: &[(usize, &super::message::Message)]) -> Result<Answered, Failure> {
        let failed =
            |id: &str, code: &str, m: Option<&str>| (id.to_owned(), code.to_owned(), m.unwrap_or("").to_owned());
        if is_topic(dest) {
            let entries = msgs
                .iter()
                .map(|(n, m)| {
                    crate::sink::sns::entry(*n, &m.body, &m.attributes, m.group.as_deref(), m.dedup.as_deref())
                })
                .collect();
            let call = self.sns.publish_batch().topic_arn(dest).set_publish_batch_request_entries(Some(entries));
            let out = call.send().await.map_err(|e| Failure::of("SNS PublishBatch", &e))?;
            Ok((
                out.successful()
                    .iter()
                    .filter_map(|s| Some((s.id()?.to_owned(), s.message_id().unwrap_or_default().to_owned())))
                    .collect(),
                out.failed().iter().map(|f| failed(f.id(), f.code(), f.message())).collect(),
            ))
        } else {
            let entries = msgs
                .iter()
                .map(|(n, m)| {
                    super::publisher::entry(*n, &m.body, &m.attributes, m.group.as_deref(), m.dedup.as_deref())
                })
                .collect();
            let call = self.client.send_message_batch().queue_url(dest).set_entries(Some(entries));
            let out = call.send().await.map_err(|e| Failure::of("SQS SendMessageBatch", &e))?;
            Ok((
                out.successful().iter().map(|s| (s.id().to_owned(), s.message_id().to_owned())).collect(),
                out.failed().iter().map(|f| failed(f.id(), f.code(), f.message())).collect(),
            ))
        }
    }
}

/// One event of a replay batch on its way.
struct Out {
    dest: String,
    msg: super::message::Message,
}

/// Sends `batch` (each event to its queue URL) and waits for every answer: per event,
/// `Ok(the new message id)` or `Err(why)`. `held` are the keys of copies this run holds without
/// replaying them (no destination, no payload, unreadable): on a FIFO destination their later
/// events are not sent. See the module doc for order on a FIFO queue.
pub async fn send_batch(
    t: &mut SqsTarget,
    batch: &[(Entry, String)],
    held: &HashSet<Option<Vec<u8>>>,
) -> Vec<Result<String, String>> {
    let held: HashSet<String> = held.iter().map(|k| group_of(k.as_deref(), false)).collect();
    let mut results: Vec<Option<Result<String, String>>> = vec![None; batch.len()];
    let mut outs: Vec<Option<Out>> = Vec::with_capacity(batch.len());
    for (i, (e, dest)) in batch.iter().enumerate() {
        let facts = t.facts(dest).await;
        let group = matches!(facts, Ok((true, _))).then(|| group_of(e.head.key.as_deref(), false));
        if let Some(g) = group.as_ref().filter(|g| held.contains(*g)) {
            t.blocked.insert((dest.clone(), g.clone()));
        }
        let built = match facts {
            Ok((fifo, max)) => event_message(&replayed(&e.head, dest), fifo, max)
                .map_err(|(code, why)| format!("SQS cannot take it ({code}): {why}")),
            Err(why) => Err(why),
        };
        outs.push(match built {
            Ok(msg) => Some(Out { dest: dest.clone(), msg }),
            Err(why) => {
                // Not sent: on a FIFO destination its key's later events wait for a later run.
                if let Some(g) = group {
                    t.blocked.insert((dest.clone(), g));
                }
                results[i] = Some(Err(why));
                None
            }
        });
    }
    let mut tries = 0u32;
    loop {
        let pending: Vec<usize> = (0..batch.len()).filter(|&i| results[i].is_none()).collect();
        if pending.is_empty() {
            break;
        }
        let call = pick(&pending, &outs, &mut t.blocked, &mut results);
        if call.is_empty() {
            continue;
        }
        let dest = outs[call[0]].as_ref().map(|o| o.dest.clone()).unwrap_or_default();
        let picked: Vec<(usize, &super::message::Message)> =
            call.iter().enumerate().filter_map(|(n, &i)| outs[i].as_ref().map(|o| (n, &o.msg))).collect();
        let mut retry = false;
        match t.call(&dest, &picked).await {
            Ok((successful, failed)) => {
                if !successful.is_empty() {
                    tries = 0;
                }
                for (id, message_id) in successful {
                    if let Some(&i) = id.parse::<usize>().ok().and_then(|n| call.get(n)) {
                        results[i] = Some(Ok(message_id));
                    }
                }
                for (id, code, message) in failed {
                    let Some(&i) = id.parse::<usize>().ok().and_then(|n| call.get(n)) else { continue };
                    match class_of(Some(&code), None, true) {
                        Class::Transient => retry = true,
                        _ => results[i] = Some(Err(format!("refused ({code}): {message}"))),
                    }
                }
                // Named neither way: sent again.
                retry |= call.iter().any(|&i| results[i].is_none());
            }
            Err(f) => {
                let why = match f.setup {
                    Some(why) => Some(why),
                    None if class_of(f.code.as_deref(), f.status, false) == Class::Setup => {
                        Some(format!("refused the call ({}): {}", f.code.unwrap_or_default(), f.text))
                    }
                    None => None,
                };
                match why {
                    Some(why) => call.iter().for_each(|&i| results[i] = Some(Err(why.clone()))),
                    None => {
                        tracing::warn!(error = %f.text, "a replay batch call failed; sending again after a backoff");
                        retry = true;
                    }
                }
            }
        }
        if retry {
            tries += 1;
            if tries >= TRIES {
                for r in results.iter_mut().filter(|r| r.is_none()) {
                    *r = Some(Err(format!("SQS still throttled or failing after {TRIES} tries")));
                }
                break;
            }
            tokio::time::sleep(crate::retry::backoff(tries, Duration::from_secs(5))).await;
        }
    }
    results.into_iter().map(|r| r.unwrap_or_else(|| Err("not sent".into()))).collect()
}

/// The events of the next call, in order: all to the first pending event's queue, at most
/// [`PAGE`], within the queue's size, one per FIFO group; an event of a group in `failed` (one
/// of its events was not replayed in this run, in this batch or an earlier one) is failed too,
/// and a group skipped for room stays skipped for this call (its order).
fn pick(
    pending: &[usize],
    outs: &[Option<Out>],
    failed: &mut HashSet<(String, String)>,
    results: &mut [Option<Result<String, String>>],
) -> Vec<usize> {
    // Refused events fail their group for the rest of the run.
    for (i, r) in results.iter().enumerate() {
        if let (Some(Err(_)), Some(Some(o))) = (r, outs.get(i)) {
            if let Some(g) = &o.msg.group {
                failed.insert((o.dest.clone(), g.clone()));
            }
        }
    }
    let mut call = Vec::new();
    let mut groups: HashSet<String> = HashSet::new();
    let mut skipped: HashSet<String> = HashSet::new();
    let mut bytes = 0usize;
    let mut dest: Option<&str> = None;
    for &i in pending {
        let Some(o) = &outs[i] else { continue };
        if let Some(g) = &o.msg.group {
            if failed.contains(&(o.dest.clone(), g.clone())) {
                results[i] = Some(Err("an earlier event of its key was not replayed; left for a later run".into()));
                continue;
            }
        }
        if dest.is_some_and(|d| d != o.dest) {
            continue;
        }
        let room = call.len() < PAGE && (call.is_empty() || bytes + o.msg.size <= DEFAULT_MAX_BYTES);
        match &o.msg.group {
            Some(g) if skipped.contains(g) || groups.contains(g) || !room => {
                skipped.insert(g.clone());
            }
            _ if !room => {}
            g => {
                if let Some(g) = g {
                    groups.insert(g.clone());
                }
                dest = Some(&o.dest);
                bytes += o.msg.size;
                call.push(i);
            }
        }
    }
    call
}

#[cfg(test)]
mod tests {
    use super::super::message::Value;
    use super::*;
    use aws_sdk_sqs::types::MessageAttributeValue;

    fn copy(body: &str, headers: &str, key: Option<&str>) -> SqsMsg {
        let mut m = SqsMsg::builder().message_id("m-1").receipt_handle("r-1").body(body).message_attributes(
            H_COPY_HEADERS,
            MessageAttributeValue::builder().data_type("String").string_value(headers).build().unwrap(),
        );
        if let Some(k) = key {
            m = m.message_attributes(
                H_COPY_KEY,
                MessageAttributeValue::builder().data_type("String").string_value(k).build().unwrap(),
            );
        }
        m.build()
    }

    #[test]
    fn a_copy_reads_back_byte_for_byte_and_a_foreign_message_is_named() {
        let payload = b"{\"n\":1}\x00\xff";
        let headers = serde_json::to_string(&[
            ("id", STANDARD.encode("e-1")),
            ("outboxd.error", STANDARD.encode("too_large")),
            ("trace", STANDARD.encode([0u8, 1, 2])),
        ])
        .unwrap();
        let m = copy(&format!("b64:{}", STANDARD.encode(payload)), &headers, Some(&STANDARD.encode("k-1")));
        let r = record(&m, 3);
        assert!(r.undecoded.is_empty(), "{:?}", r.undecoded);
        assert_eq!((r.payload.as_deref(), r.key.as_deref()), (Some(&payload[..]), Some(&b"k-1"[..])));
        assert_eq!(
            (r.event_id().as_deref(), r.reason(), r.position()),
            (Some("e-1"), "too_large".into(), "m-1".into())
        );
        let back = replayed(&r, "https://q");
        assert_eq!(
            back.headers,
            vec![("id".to_owned(), Bytes::from("e-1")), ("trace".to_owned(), Bytes::from(vec![0u8, 1, 2]))]
        );
        assert!(record(&copy("null", "[]", None), 0).payload.is_none());
        assert!(!record(&copy("hello", "[]", None), 0).undecoded.is_empty());
        assert!(!record(&copy("null", "not json", None), 0).undecoded.is_empty());
    }

    fn out(dest: &str, group: Option<&str>, size: usize) -> Option<Out> {
        let msg = super::super::message::Message {
            group: group.map(Into::into),
            dedup: None,
            body: String::new(),
            attributes: vec![("a".into(), Value::Text("b".into()))],
            size,
        };
        Some(Out { dest: dest.into(), msg })
    }

    /// A target whose every destination is known without asking (nothing listens at its
    /// endpoint, so an event that were sent would fail as "no answer", not as held back).
    fn target(dests: &[(&str, bool, usize)]) -> SqsTarget {
        let sqs = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        let sns = aws_sdk_sns::Config::builder()
            .behavior_version(aws_sdk_sns::config::BehaviorVersion::latest())
            .region(aws_sdk_sns::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        SqsTarget {
            client: Client::from_conf(sqs),
            sns: aws_sdk_sns::Client::from_conf(sns),
            dests: dests.iter().map(|(d, fifo, max)| (d.to_string(), Ok((*fifo, *max)))).collect(),
            blocked: HashSet::new(),
        }
    }

    fn entry(key: &str, id: &str, payload: usize) -> (Entry, String) {
        let head = DlqRecord {
            partition: 0,
            offset: 0,
            key: Some(key.as_bytes().to_vec()),
            payload: Some(vec![b'x'; payload]),
            payload_len: Some(payload),
            headers: vec![("id".into(), Some(id.as_bytes().to_vec()))],
            timestamp_ms: None,
            time_ms: None,
            label: None,
            undecoded: Vec::new(),
            moved_later: false,
        };
        (Entry { head, payload_len: Some(payload), chunks: 1, positions: vec![(0, 0)] }, "q".into())
    }

    /// Replay calls [`send_batch`] per 10 copies: a key whose event was not replayed in one call
    /// is held back in every later call of the run, and so is a key with a copy held unreplayed.
    #[tokio::test]
    async fn a_key_not_replayed_in_one_batch_is_held_back_in_the_later_batches() {
        let mut t = target(&[("q", true, 300)]);
        let none = HashSet::new();
        let first = send_batch(&mut t, &[entry("k", "e1", 400)], &none).await;
        assert!(matches!(&first[0], Err(w) if w.contains("cannot take it")), "{first:?}");
        let later = send_batch(&mut t, &[entry("k", "e2", 10)], &none).await;
        assert!(matches!(&later[0], Err(w) if w.contains("earlier event")), "{later:?}");
        let held: HashSet<Option<Vec<u8>>> = [Some(b"h".to_vec())].into();
        let behind = send_batch(&mut t, &[entry("h", "e3", 10)], &held).await;
        assert!(matches!(&behind[0], Err(w) if w.contains("earlier event")), "{behind:?}");
    }

    /// No answer from the destination is not kept: the next batch asks again.
    #[tokio::test]
    async fn no_answer_about_a_destination_is_asked_again_not_kept() {
        let mut t = target(&[]);
        for dest in ["http://127.0.0.1:9/1/q", "arn:aws:sns:us-east-1:1:t"] {
            let first = t.facts(dest).await;
            assert!(matches!(&first, Err(w) if w.contains("no answer")), "{first:?}");
            assert!(!t.dests.contains_key(dest), "a transient failure was kept for the run");
        }
    }

    #[test]
    fn a_call_holds_one_message_of_a_group_and_a_failed_group_stays_behind() {
        let outs = vec![out("q", Some("a"), 10), out("q", Some("a"), 10), out("q", Some("b"), 10), out("r", None, 10)];
        let mut results = vec![None; 4];
        let mut failed = HashSet::new();
        assert_eq!(pick(&[0, 1, 2, 3], &outs, &mut failed, &mut results), vec![0, 2]);
        results[0] = Some(Err("refused".into()));
        assert_eq!(pick(&[1, 2, 3], &outs, &mut failed, &mut results), vec![2]);
        assert!(matches!(&results[1], Some(Err(w)) if w.contains("earlier event")), "{results:?}");
        assert_eq!(pick(&[3], &outs, &mut failed, &mut results), vec![3]);
    }
}
