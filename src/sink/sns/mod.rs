//! The SNS sink (`--sink sns`): `PublishBatch` to `--sns-topic-arn`, standard or FIFO.
//!
//! What SNS and SQS share is shared, not copied: an event becomes the same message
//! ([`crate::sink::sqs::message`]: the payload as the body, the headers and the key as at most 10
//! message attributes, on a FIFO topic group id = key and deduplication id = event id, and the
//! same bad-event rules; SNS takes 256 KiB a message and a batch), and the same publisher task
//! ([`crate::sink::sqs::publisher`]) batches by 10 and 256 KiB, keeps at most one message of a
//! FIFO group in flight, retries throttling with backoff and jitter, and acks an event only once
//! SNS answered with its entry among the successful ones: the slot is confirmed only past events
//! SNS accepted. This module adds the call ([`publish`]), the topic's facts, and the check.
//!
//! Order: on a FIFO topic one key's events keep their order (SNS passes the group to FIFO queues
//! subscribed with it); a standard topic keeps none. Dead letters go to an SQS queue,
//! `--sns-dlq-queue-url`, in the SQS sink's copy form, so `outboxd dlq --sink sqs` reads them.

pub mod config;

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_sns::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_sns::primitives::Blob;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};

use super::delivery::Delivery;
use super::handoff::{held_in_handoff, Handoff};
use super::sqs::message::{self, Job, Queues, Value};
use super::sqs::publisher::{self, Call, Failure, Outcome};
use super::sqs::{queue_facts, DEFAULT_MAX_BYTES};
use super::{Sink, SinkError};
use crate::error::Definite;
use crate::health::Health;
use crate::router::Record;
use crate::sink::aws::{class_of, sdk_config, setup_failure, AwsConfig, Class};
use crate::sink::escape::Limits;
use config::SnsConfig;

/// SNS's limit on a message (and on a whole `PublishBatch`).
const MAX_BYTES: usize = 256 * 1024;

pub struct SnsSink {
    handoff: Handoff<Job>,
    queues: Queues,
}

fn attribute(v: &Value) -> MessageAttributeValue {
    let b = MessageAttributeValue::builder();
    let b = match v {
        Value::Text(s) => b.data_type("String").string_value(s.clone()),
        Value::Binary(x) => b.data_type("Binary").binary_value(Blob::new(x.to_vec())),
    };
    b.build().expect("data_type is set")
}

/// Entry `i` of a `PublishBatch` call (also `outboxd dlq replay`'s).
pub(crate) fn entry(
    i: usize,
    body: &str,
    attributes: &[(String, Value)],
    group: Option<&str>,
    dedup: Option<&str>,
) -> PublishBatchRequestEntry {
    let attributes: HashMap<String, MessageAttributeValue> =
        attributes.iter().map(|(n, v)| (n.clone(), attribute(v))).collect();
    PublishBatchRequestEntry::builder()
        .id(i.to_string())
        .message(body)
        .set_message_attributes((!attributes.is_empty()).then_some(attributes))
        .set_message_group_id(group.map(str::to_owned))
        .set_message_deduplication_id(dedup.map(str::to_owned))
        .build()
        .expect("id and message are set")
}

/// The `PublishBatch` call for `batch` (the publisher's [`publisher::Main::Topic`]).
pub(crate) fn publish(client: &aws_sdk_sns::Client, arn: &str, batch: Vec<(u64, Job)>) -> Call {
    let entries: Vec<PublishBatchRequestEntry> = batch
        .iter()
        .enumerate()
        .map(|(i, (_, job))| entry(i, &job.body, &job.attributes, job.group.as_deref(), job.dedup.as_deref()))
        .collect();
    let call = client.publish_batch().topic_arn(arn).set_publish_batch_request_entries(Some(entries));
    Box::pin(async move {
        let answer = match call.send().await {
            Ok(out) => Ok(Outcome {
                successful: out.successful().iter().filter_map(|s| s.id().map(str::to_owned)).collect(),
                failed: out
                    .failed()
                    .iter()
                    .map(|f| (f.id().to_owned(), f.code().to_owned(), f.message().unwrap_or_default().to_owned()))
                    .collect(),
            }),
            Err(e) => Err(Failure::of("SNS PublishBatch", &e)),
        };
        (batch, answer)
    })
}

/// Why the topic cannot be used, or `Ok(None)`: no answer now; `Ok(Some(fifo))`: it is there.
pub(crate) async fn topic_fifo(client: &aws_sdk_sns::Client, arn: &str) -> Result<Option<bool>, String> {
    match client.get_topic_attributes().topic_arn(arn).send().await {
        Ok(out) => Ok(Some(out.attributes().and_then(|a| a.get("FifoTopic")).is_some_and(|v| v == "true"))),
        Err(e) => {
            if let Some((what, fix)) = setup_failure(&e) {
                return Err(format!("--sns-topic-arn {arn}: {what}; {fix}"));
            }
            let status = e.raw_response().map(|r| r.status().as_u16());
            let code = e.code().map(str::to_owned);
            if class_of(code.as_deref(), status, false) == Class::Setup {
                let code = code.unwrap_or_else(|| format!("HTTP {}", status.unwrap_or(0)));
                let text = e.message().map(str::to_owned).unwrap_or_else(|| DisplayErrorContext(&e).to_string());
                Err(format!(
                    "--sns-topic-arn {arn}: SNS answered {code}: {text}; check the ARN (or create the topic), --aws-region, and that the credentials may sns:GetTopicAttributes and sns:Publish on it"
                ))
            } else {
                tracing::warn!(topic = arn, error = %DisplayErrorContext(&e), "SNS did not answer GetTopicAttributes");
                Ok(None)
            }
        }
    }
}

impl SnsSink {
    /// Build the clients, ask for the topic's and the dead-letter queue's attributes (a topic or
    /// queue that is not there, or not ours, stops the start) and start the publisher task.
    pub async fn connect(aws: &AwsConfig, cfg: &SnsConfig, health: Arc<Health>) -> Result<SnsSink, Definite> {
        let sdk = sdk_config(aws).await;
        let sns = aws_sdk_sns::Client::new(&sdk);
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let fifo = topic_fifo(&sns, &cfg.topic_arn).await.map_err(Definite::Setup)?;
        let dlq = match &cfg.dlq_queue_url {
            Some(u) => queue_facts(&sqs, "--sns-dlq-queue-url", u).await.map_err(|r| Definite::Setup(r.to_string()))?,
            None => None,
        };
        let queues = Queues {
            fifo: fifo.unwrap_or_else(|| SnsConfig::is_fifo(&cfg.topic_arn)),
            dlq_fifo: dlq.as_ref().map_or_else(
                || cfg.dlq_queue_url.as_deref().is_some_and(crate::sink::sqs::config::SqsConfig::is_fifo),
                |f| f.fifo,
            ),
            max_bytes: MAX_BYTES,
            dlq_max_bytes: dlq.as_ref().map_or(DEFAULT_MAX_BYTES, |f| f.max_bytes),
        };
        health.set_sink_up(true);
        let target = publisher::Target {
            client: sqs,
            main: publisher::Main::Topic { client: sns, arn: cfg.topic_arn.clone() },
            dlq_queue_url: cfg.dlq_queue_url.clone(),
            batch_bytes: queues.max_bytes.min(queues.dlq_max_bytes),
            flags: "--sns-topic-arn (and --sns-dlq-queue-url)",
        };
        let (tx, rx) = tokio::sync::mpsc::channel(publisher::WINDOW);
        let task = tokio::spawn(publisher::run(target, rx));
        let handoff = Handoff::new(vec![tx], vec![task], "the SNS publisher task ended");
        tracing::info!(topic = %cfg.topic_arn, fifo = queues.fifo, "SNS topic ready");
        Ok(SnsSink { handoff, queues })
    }
}

/// The sink's entry in the list of sinks ([`crate::sink::registry`]).
impl crate::sink::registered::Registered for SnsSink {
    /// `outboxd dlq --sink sns` reads `--sns-dlq-queue-url` (an SQS queue) and replays to the topic.
    const READABLE_DEAD_LETTERS: bool = true;

    async fn build(cfg: &crate::config::Config, health: Arc<Health>) -> Result<Self, Definite> {
        SnsSink::connect(&cfg.aws, &cfg.sns, health).await
    }

    fn probe(cfg: &crate::config::Config) -> crate::sink::registered::Probe {
        let (aws, sns) = (cfg.aws.clone(), cfg.sns.clone());
        crate::sink::registered::Probe::Run(Box::pin(async move { check(&aws, &sns).await }))
    }
}

/// `outboxd check`: the topic answers GetTopicAttributes and is FIFO exactly when its name says;
/// the dead-letter queue answers GetQueueAttributes.
async fn check(aws: &AwsConfig, cfg: &SnsConfig) -> crate::sink::registered::Verdict {
    use crate::sink::registered::Verdict;
    let sdk = sdk_config(aws).await;
    let fail = |detail: String, fix: &str| Verdict::Fail { name: "sns", detail, fix: fix.to_owned() };
    let named = SnsConfig::is_fifo(&cfg.topic_arn);
    let mut lines = match topic_fifo(&aws_sdk_sns::Client::new(&sdk), &cfg.topic_arn).await {
        Err(why) => return fail(why, "see above"),
        Ok(None) => {
            return fail(
                format!("--sns-topic-arn {}: no answer from SNS", cfg.topic_arn),
                "check --aws-endpoint-url / --aws-region and the network",
            )
        }
        Ok(Some(fifo)) if fifo != named => {
            return fail(
                format!(
                    "--sns-topic-arn {}: the name says FIFO={named} but the topic's FifoTopic is {fifo}",
                    cfg.topic_arn
                ),
                "give the topic's own ARN",
            )
        }
        Ok(Some(fifo)) => vec![format!("{}: {} topic", cfg.topic_arn, if fifo { "FIFO" } else { "standard" })],
    };
    if let Some(url) = &cfg.dlq_queue_url {
        match queue_facts(&aws_sdk_sqs::Client::new(&sdk), "--sns-dlq-queue-url", url).await {
            Err(r) => return fail(r.detail, &r.fix),
            Ok(None) => return fail(format!("--sns-dlq-queue-url {url}: no answer from SQS"), "check the network"),
            Ok(Some(f)) => lines.push(format!("dead letters to {url}, messages up to {} bytes", f.max_bytes)),
        }
    }
    Verdict::Ok { name: "sns", detail: lines.join("; ") }
}

impl Sink for SnsSink {
    async fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        match message::job(record, delivery, &self.queues) {
            Ok(job) => self.handoff.push(0, job),
            Err(e) => Err(*e),
        }
    }

    held_in_handoff!();

    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.queues.max_bytes)
    }

    /// As for SQS: a copy's payload travels in base64 beside its headers (~6 KiB at most).
    fn dead_letter_max_bytes(&self) -> Option<usize> {
        Some((self.queues.dlq_max_bytes.saturating_sub(8 * 1024) / 4 * 3).max(1024))
    }

    fn copy_limits(&self) -> Limits {
        message::COPY_LIMITS
    }
}
