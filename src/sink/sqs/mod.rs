//! The SQS sink (`--sink sqs`): `SendMessageBatch` to `--sqs-queue-url`, standard or FIFO.
//!
//! `send` builds the message at once ([`message`]: body, attributes, FIFO group and
//! deduplication ids) and rejects, for the bad-event policy, what SQS can never take (too large,
//! more than 10 attributes, a body that is not SQS text); everything else goes as a
//! [`message::Job`] through a bounded channel to the publisher task ([`publisher`]). A full
//! channel holds the record here, in order, and reports [`Sink::blocked`] ([`Handoff`]).
//!
//! An event is acked only once SQS answered the `SendMessageBatch` call holding it with the
//! entry among the successful ones: the slot is confirmed only past events SQS stored. On a FIFO
//! queue one key's events keep their order (one in flight per group, see [`publisher`]), and SQS
//! drops, within its 5-minute deduplication window, the copies a restart sends again (the
//! deduplication id is the event id). A standard queue keeps no order and no deduplication.
//!
//! Health: there is no connection to watch (each call is an HTTPS request); the sink is ready
//! once the queue answered at start, and a call that gets no answer is retried (and logged).

pub mod config;
pub mod dlq;
pub mod message;
pub(crate) mod publisher;
mod replay;
pub(crate) mod topic;

use std::sync::Arc;

use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::QueueAttributeName;
use tokio::sync::mpsc;

use super::delivery::Delivery;
use super::handoff::{held_in_handoff, Handoff};
use super::{Sink, SinkError};
use crate::error::Definite;
use crate::health::Health;
use crate::router::Record;
use crate::sink::aws::{class_of, sdk_config, setup_failure, setup_fix, AwsConfig, Class};
use crate::sink::escape::Limits;
use config::SqsConfig;
use message::Queues;

/// SQS's default `MaximumMessageSize`, used until the queue says its own.
pub(crate) const DEFAULT_MAX_BYTES: usize = 256 * 1024;

pub struct SqsSink {
    handoff: Handoff<message::Job>,
    queues: Queues,
}

/// What a queue says of itself: FIFO or not, and its `MaximumMessageSize`.
pub(crate) struct QueueFacts {
    pub fifo: bool,
    pub max_bytes: usize,
}

/// Why a queue cannot be used: what is wrong, and what to do about it.
pub(crate) struct Refused {
    pub detail: String,
    pub fix: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.detail, self.fix)
    }
}

/// Ask SQS for the queue's attributes. A refusal (no such queue, access denied) or a call the SDK
/// could not make (no usable credentials) is the error to show; `Ok(None)`: no answer now (the
/// publisher will retry).
pub(crate) async fn queue_facts(
    client: &aws_sdk_sqs::Client,
    flag: &str,
    url: &str,
) -> Result<Option<QueueFacts>, Refused> {
    let asked = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::FifoQueue)
        .attribute_names(QueueAttributeName::MaximumMessageSize)
        .send()
        .await;
    match asked {
        Ok(out) => {
            let attrs = out.attributes();
            let fifo = attrs.and_then(|a| a.get(&QueueAttributeName::FifoQueue)).is_some_and(|v| v == "true");
            let max_bytes = attrs
                .and_then(|a| a.get(&QueueAttributeName::MaximumMessageSize))
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_MAX_BYTES);
            Ok(Some(QueueFacts { fifo, max_bytes }))
        }
        Err(e) => {
            if let Some((what, fix)) = setup_failure(&e) {
                return Err(Refused { detail: format!("{flag} {url}: {what}"), fix: fix.to_owned() });
            }
            let status = e.raw_response().map(|r| r.status().as_u16());
            let code = e.code().map(str::to_owned);
            if class_of(code.as_deref(), status, false) == Class::Setup {
                let code = code.unwrap_or_else(|| format!("HTTP {}", status.unwrap_or(0)));
                let text = crate::sink::aws::error_text(&e);
                let fix = setup_fix(
                    Some(&code),
                    "check the URL (or create the queue), --aws-region, and that the credentials may sqs:GetQueueAttributes and sqs:SendMessage on it",
                );
                Err(Refused { detail: format!("{flag} {url}: SQS answered {code}: {text}"), fix })
            } else {
                tracing::warn!(queue = url, error = %crate::sink::aws::context_text(&e), "SQS did not answer GetQueueAttributes; going on with the defaults");
                Ok(None)
            }
        }
    }
}

impl SqsSink {
    /// Build the client, read the queues' attributes (a queue SQS says is not there, or not ours,
    /// stops the start) and start the publisher task.
    pub async fn connect(aws: &AwsConfig, cfg: &SqsConfig, health: Arc<Health>) -> Result<SqsSink, Definite> {
        let client = aws_sdk_sqs::Client::new(&sdk_config(aws).await);
        let main = queue_facts(&client, "--sqs-queue-url", &cfg.queue_url)
            .await
            .map_err(|r| Definite::Setup(r.to_string()))?;
        let dlq = match &cfg.dlq_queue_url {
            Some(u) => {
                queue_facts(&client, "--sqs-dlq-queue-url", u).await.map_err(|r| Definite::Setup(r.to_string()))?
            }
            None => None,
        };
        let named_fifo = SqsConfig::is_fifo(&cfg.queue_url);
        let dlq_named_fifo = cfg.dlq_queue_url.as_deref().is_some_and(SqsConfig::is_fifo);
        let queues = Queues {
            fifo: main.as_ref().map_or(named_fifo, |f| f.fifo),
            dlq_fifo: dlq.as_ref().map_or(dlq_named_fifo, |f| f.fifo),
            max_bytes: main.as_ref().map_or(DEFAULT_MAX_BYTES, |f| f.max_bytes),
            dlq_max_bytes: dlq.as_ref().map_or(DEFAULT_MAX_BYTES, |f| f.max_bytes),
        };
        health.set_sink_up(true);
        let target = publisher::Target {
            client,
            main: publisher::Main::Queue(cfg.queue_url.clone()),
            dlq_queue_url: cfg.dlq_queue_url.clone(),
            batch_bytes: queues.max_bytes.min(queues.dlq_max_bytes),
            flags: "--sqs-queue-url (and --sqs-dlq-queue-url)",
        };
        let (tx, rx) = mpsc::channel(publisher::WINDOW);
        let task = tokio::spawn(crate::sink::aws::publisher::run(target, publisher::WINDOW, rx));
        let handoff = Handoff::new(vec![tx], vec![task], "the SQS publisher task ended");
        tracing::info!(queue = %cfg.queue_url, fifo = queues.fifo, max_bytes = queues.max_bytes, "SQS queue ready");
        Ok(SqsSink { handoff, queues })
    }
}

/// The sink's entry in the list of sinks ([`crate::sink::registry`]).
impl crate::sink::registered::Registered for SqsSink {
    /// `outboxd dlq --sink sqs` reads `--sqs-dlq-queue-url` ([`dlq`]).
    const READABLE_DEAD_LETTERS: bool = true;

    async fn build(cfg: &crate::config::Config, health: Arc<Health>) -> Result<Self, Definite> {
        SqsSink::connect(&cfg.aws, &cfg.sqs, health).await
    }

    fn probe(cfg: &crate::config::Config) -> crate::sink::registered::Probe {
        let (aws, sqs) = (cfg.aws.clone(), cfg.sqs.clone());
        crate::sink::registered::Probe::Run(Box::pin(async move { check(&aws, &sqs).await }))
    }
}

/// `outboxd check`: each queue answers GetQueueAttributes, and is FIFO exactly when its name says.
async fn check(aws: &AwsConfig, cfg: &SqsConfig) -> crate::sink::registered::Verdict {
    use crate::sink::registered::Verdict;
    let sdk = match crate::sink::aws::check_sdk_config(aws).await {
        Ok(sdk) => sdk,
        Err((detail, fix)) => return Verdict::Fail { name: "sqs", detail, fix: fix.to_owned() },
    };
    let client = aws_sdk_sqs::Client::new(&sdk);
    let mut lines = Vec::new();
    for (flag, url) in std::iter::once(("--sqs-queue-url", &cfg.queue_url))
        .chain(cfg.dlq_queue_url.iter().map(|u| ("--sqs-dlq-queue-url", u)))
    {
        match queue_facts(&client, flag, url).await {
            Err(Refused { detail, fix }) => return Verdict::Fail { name: "sqs", detail, fix },
            Ok(None) => {
                return Verdict::Fail {
                    name: "sqs",
                    detail: format!("{flag} {url}: no answer from SQS"),
                    fix: "check --aws-endpoint-url / --aws-region and the network".into(),
                }
            }
            Ok(Some(f)) if f.fifo != SqsConfig::is_fifo(url) => {
                return Verdict::Fail {
                    name: "sqs",
                    detail: format!(
                        "{flag} {url}: the name says FIFO={} but the queue's FifoQueue is {}",
                        SqsConfig::is_fifo(url),
                        f.fifo
                    ),
                    fix: "give the queue's own URL".into(),
                }
            }
            Ok(Some(f)) => lines.push(format!(
                "{url}: {} queue, messages up to {} bytes",
                if f.fifo { "FIFO" } else { "standard" },
                f.max_bytes
            )),
        }
    }
    Verdict::Ok { name: "sqs", detail: lines.join("; ") }
}

impl Sink for SqsSink {
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

    /// A copy's payload travels in base64 (4 bytes for 3) beside its headers, which take at most
    /// ~6 KiB as base64 in JSON ([`message::COPY_HEADER_BYTES`]).
    fn dead_letter_max_bytes(&self) -> Option<usize> {
        Some((self.queues.dlq_max_bytes.saturating_sub(8 * 1024) / 4 * 3).max(1024))
    }

    fn copy_limits(&self) -> Limits {
        message::COPY_LIMITS
    }
}
