//! The SNS sink (`--sink sns`): `PublishBatch` to `--sns-topic-arn`, standard or FIFO.
//!
//! What SNS and SQS share is shared, not copied: an event becomes the same message
//! ([`crate::sink::sqs::message`]: the payload as the body, the headers and the key as at most 10
//! message attributes, on a FIFO topic group id = key and deduplication id = event id, and the
//! same bad-event rules; SNS takes 256 KiB a message and a batch), and the same publisher task
//! ([`crate::sink::sqs::publisher`]) batches by 10 and 256 KiB, keeps at most one message of a
//! FIFO group in flight, retries throttling with backoff and jitter, and acks an event only once
//! SNS answered with its entry among the successful ones: the slot is confirmed only past events
//! SNS accepted. The SNS calls themselves ([`crate::sink::sqs::topic`]) live beside that
//! publisher, which makes them; this module adds the sink, its start and the check.
//!
//! Order: on a FIFO topic one key's events keep their order (SNS passes the group to FIFO queues
//! subscribed with it); a standard topic keeps none. Dead letters go to an SQS queue,
//! `--sns-dlq-queue-url`, in the SQS sink's copy form, so `outboxd dlq --sink sqs` reads them.

pub mod config;

use std::sync::Arc;

use super::delivery::Delivery;
use super::handoff::{held_in_handoff, Handoff};
use super::sqs::message::{self, Job, Queues};
use super::sqs::publisher;
use super::sqs::topic::topic_fifo;
use super::sqs::{queue_facts, DEFAULT_MAX_BYTES};
use super::{Sink, SinkError};
use crate::error::Definite;
use crate::health::Health;
use crate::router::Record;
use crate::sink::aws::{sdk_config, AwsConfig};
use crate::sink::escape::Limits;
use config::SnsConfig;

/// SNS's limit on a message (and on a whole `PublishBatch`).
const MAX_BYTES: usize = 256 * 1024;

pub struct SnsSink {
    handoff: Handoff<Job>,
    queues: Queues,
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
        let task = tokio::spawn(crate::sink::aws::publisher::run(target, publisher::WINDOW, rx));
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
    let fail = |detail: String, fix: &str| Verdict::Fail { name: "sns", detail, fix: fix.to_owned() };
    let sdk = match crate::sink::aws::check_sdk_config(aws).await {
        Ok(sdk) => sdk,
        Err((detail, fix)) => return fail(detail, fix),
    };
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
    fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
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
