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
//! Replay ([`super::replay`]) sends each event as `--sink sqs` sends it ([`super::message::event_message`]: the
//! payload as the body, the headers but `outboxd.*` and the key as attributes, on a FIFO queue
//! group id = key and deduplication id = event id), so the message is the one the relay would have
//! written. On a FIFO queue a call holds one message of a group, and once one of a group was not
//! replayed (refused, failed, or its copy held back: no destination, no payload, unreadable) the
//! later ones of that group are not sent in this run, in any later batch ([`SqsTarget`] keeps
//! them for the whole run), so a key keeps its order. A copy left out by `--filter-reason` or
//! `--event-id` does not hold its key back: that selection is the operator's.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message as SqsMsg,
    MessageSystemAttributeName,
};
use aws_sdk_sqs::Client;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;

use super::message::{H_COPY_HEADERS, H_COPY_KEY};
use super::queue_facts;
use crate::error::{Definite, Error};
use crate::router::Record;
use crate::sink::aws::{class_of, sdk_config, setup_failure, AwsConfig, Class};
use crate::sink::dead_letter::{DlqRecord, PREFIX};

/// Messages in one receive or delete call (SQS's limit).
const PAGE: usize = 10;
/// Tries of a batch whose messages SQS keeps throttling before replay reports them failed.
const TRIES: u32 = 8;

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
                    let text = crate::sink::aws::error_text(&e);
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
                        tracing::warn!(error = %crate::sink::aws::context_text(&e), "deleting replayed dead letters; retrying");
                        tokio::time::sleep(crate::retry::backoff(tries, Duration::from_secs(5))).await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::sink::aws::context_text(&e), "SQS did not delete {} replayed dead letters; they come back after the visibility timeout and a later replay sends them again", chunk.len());
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
                tracing::warn!(error = %crate::sink::aws::context_text(&e), "could not make {} dead letters visible again; they are when their visibility timeout runs out", chunk.len());
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
pub(super) fn replayed(r: &DlqRecord, dest: &str) -> Record {
    Record {
        topic: dest.into(),
        key: r.key.clone().map(Bytes::from),
        payload: r.payload.clone().map(Bytes::from),
        headers: r
            .headers
            .iter()
            .filter(|(k, _)| !k.starts_with(PREFIX))
            .map(|(k, v)| (k.clone().into(), Bytes::from(v.clone().unwrap_or_default())))
            .collect(),
        partition: None,
        timestamp_ms: None,
        event_id: r.event_id().unwrap_or_default().into(),
        event_type: None,
    }
}

pub use super::replay::{send_batch, SqsTarget};

#[cfg(test)]
mod tests {
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
            vec![("id".into(), Bytes::from("e-1")), ("trace".into(), Bytes::from(vec![0u8, 1, 2]))]
        );
        assert!(record(&copy("null", "[]", None), 0).payload.is_none());
        assert!(!record(&copy("hello", "[]", None), 0).undecoded.is_empty());
        assert!(!record(&copy("null", "not json", None), 0).undecoded.is_empty());
    }
}
