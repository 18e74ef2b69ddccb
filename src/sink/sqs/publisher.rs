//! The SQS side of the AWS publisher task ([`crate::sink::aws::publisher`]), also `--sink sns`'s:
//! `SendMessageBatch` calls (10 messages, and no more bytes than the queue's
//! `MaximumMessageSize`, SQS's limit on a whole batch), or SNS `PublishBatch` calls
//! ([`Main::Topic`], built by [`super::topic::publish`]; dead-letter copies still go to an SQS
//! queue), each answer turned into one entry per message by its ids ([`by_id`]).
//!
//! Order on a FIFO queue or topic: a job's lane is its group (a key), so a group has at most one
//! message in flight (the shared task's rule); standard queues and topics keep no order, so their
//! jobs have no lane and any may go.

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};

use super::message::{Job, Value};
use crate::sink::aws::publisher::{self as shared, by_id};
pub use crate::sink::aws::publisher::{Call, Failure};

/// Entries in one `SendMessageBatch` (SQS's limit).
const BATCH: usize = 10;
/// Jobs waiting here at most (the channel holds as many more).
pub const WINDOW: usize = 4096;

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

impl shared::Service for Target {
    type Job = Job;

    fn limits(&self) -> (usize, usize) {
        (BATCH, self.batch_bytes)
    }

    fn refusal(&self, code: &str, message: &str) -> (&'static str, String) {
        ("invalid_message", format!("refused the message ({code}): {message}"))
    }

    /// The group, on a FIFO queue or topic (per destination: the main one or the dead-letter one).
    fn lane<'a>(&self, job: &'a Job) -> Option<&'a str> {
        job.group.as_deref()
    }

    fn send(&self, batch: Vec<(u64, Job)>) -> Call<Job> {
        send(self, batch)
    }

    fn setup_reason(&self, code: &str, text: &str) -> String {
        let otherwise = format!(
            "check {}, --aws-region, and that the credentials may send to it (sqs:SendMessage, sns:Publish) and use its KMS key",
            self.flags
        );
        format!("AWS refused the call ({code}): {text}; {}", crate::sink::aws::setup_fix(Some(code), &otherwise))
    }
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

fn send(target: &Target, batch: Vec<(u64, Job)>) -> Call<Job> {
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
            Ok(out) => Ok(by_id(
                batch.len(),
                out.successful().iter().map(|s| s.id()),
                out.failed().iter().map(|f| (f.id(), f.code(), f.message().unwrap_or_default())),
            )),
            Err(e) => Err(Failure::of("SQS SendMessageBatch", &e)),
        };
        (batch, answer)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::delivery::{Delivery, Position, Source, Ticket};
    use std::sync::Arc;

    /// A copy with no dead-letter queue fails as a bug; it is never published to the topic.
    #[tokio::test]
    async fn a_dead_letter_copy_without_a_dead_letter_queue_fails_as_a_bug() {
        let (tx, _rx) = crate::sink::acks::ack_queue();
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
