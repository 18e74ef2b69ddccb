//! The Kinesis Data Streams sink (`--sink kinesis`): `PutRecords` to `--kinesis-stream`.
//!
//! `send` builds the record at once ([`record`]: partition key = the record key, data = the
//! payload as routed) and rejects, for the bad-event policy, what Kinesis can never take (over the
//! stream's record size); everything else goes as a [`record::Job`] through a bounded channel to
//! the publisher task ([`publisher`]). A full channel holds the record here, in order, and reports
//! [`Sink::blocked`] ([`Handoff`]).
//!
//! An event is acked only once Kinesis answered the `PutRecords` call holding it with a sequence
//! number for its record: the slot is confirmed only past events Kinesis stored. One key's events
//! keep their order (one record of a key in flight, see [`publisher`]). Kinesis has no
//! deduplication: what a restart sends again (the events after the confirmed LSN) is stored again.
//!
//! Health: there is no connection to watch (each call is an HTTPS request); the sink is ready
//! once the stream answered at start, and a call that gets no answer is retried (and logged).

pub mod config;
pub mod dlq;
mod progress;
pub(crate) mod publisher;
pub mod record;
pub mod replay;

use std::sync::Arc;

use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::types::StreamStatus;
use tokio::sync::mpsc;

use super::delivery::Delivery;
use super::handoff::{held_in_handoff, Handoff};
use super::{Sink, SinkError};
use crate::error::Definite;
use crate::health::Health;
use crate::router::Record;
use crate::sink::aws::{class_of, sdk_config, setup_failure, setup_fix, AwsConfig, Class};
use config::KinesisConfig;
use record::MAX_RECORD_BYTES;

/// Room a dead-letter copy's envelope takes beyond its base64 (JSON, names), kept free.
const ENVELOPE_ROOM: usize = 16 * 1024;

pub struct KinesisSink {
    handoff: Handoff<record::Job>,
    max_bytes: usize,
    dlq_max_bytes: usize,
}

/// What a stream says of itself.
pub(crate) struct StreamFacts {
    pub status: StreamStatus,
    pub shards: i32,
    pub mode: String,
    pub max_bytes: usize,
}

/// Why a stream cannot be used: what is wrong, and what to do about it.
pub(crate) struct Refused {
    pub detail: String,
    pub fix: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.detail, self.fix)
    }
}

/// A refusal of `call` on `stream` from an SDK error, or `None` when the error is not the
/// setup's (no answer, throttling).
fn refusal<E, R>(e: &SdkError<E, R>, flag: &str, stream: &str, call: &str, status: Option<u16>) -> Option<Refused>
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
    R: std::fmt::Debug + 'static,
{
    if let Some((what, fix)) = setup_failure(e) {
        return Some(Refused { detail: format!("{flag} {stream}: {what}"), fix: fix.to_owned() });
    }
    let code = e.code().map(str::to_owned);
    if class_of(code.as_deref(), status, false) != Class::Setup {
        return None;
    }
    let code = code.unwrap_or_else(|| format!("HTTP {}", status.unwrap_or(0)));
    let text = crate::sink::aws::error_text(e);
    Some(Refused {
        detail: format!("{flag} {stream}: Kinesis answered {call} with {code}: {text}"),
        fix: setup_fix(
            Some(&code),
            "check the stream's name (or create it), --aws-region, and that the credentials may \
             kinesis:DescribeStreamSummary and kinesis:PutRecords on it",
        ),
    })
}

/// Ask Kinesis for the stream's summary. A refusal (no such stream, access denied) or a call the
/// SDK could not make is the error to show; `Ok(None)`: no answer now.
pub(crate) async fn stream_facts(
    client: &aws_sdk_kinesis::Client,
    flag: &str,
    stream: &str,
) -> Result<Option<StreamFacts>, Refused> {
    let call = client.describe_stream_summary();
    let call = if stream.starts_with("arn:") { call.stream_arn(stream) } else { call.stream_name(stream) };
    match call.send().await {
        Ok(out) => {
            let Some(s) = out.stream_description_summary() else { return Ok(None) };
            let max_kib = s.max_record_size_in_kib().and_then(|k| usize::try_from(k).ok()).filter(|k| *k > 0);
            Ok(Some(StreamFacts {
                status: s.stream_status().clone(),
                shards: s.open_shard_count(),
                mode: s.stream_mode_details().map_or("PROVISIONED".into(), |m| m.stream_mode().as_str().to_owned()),
                max_bytes: max_kib.map_or(MAX_RECORD_BYTES, |k| k * 1024),
            }))
        }
        Err(e) => {
            let status = e.raw_response().map(|r| r.status().as_u16());
            match refusal(&e, flag, stream, "DescribeStreamSummary", status) {
                Some(r) => Err(r),
                None => {
                    tracing::warn!(stream, error = %crate::sink::aws::context_text(&e), "Kinesis did not answer DescribeStreamSummary");
                    Ok(None)
                }
            }
        }
    }
}

/// Whether Kinesis refuses the credentials a write to `stream`, asked without writing: an empty
/// `PutRecords` call. Access denied (or no such stream) fails; `ValidationException` (no
/// records) or an answer passes. Where AWS validates such a call before it authorizes it, a
/// missing permission shows only at the first write, which then stops the relay with the code.
async fn writable(client: &aws_sdk_kinesis::Client, flag: &str, stream: &str) -> Result<(), Refused> {
    let call = client.put_records().set_records(Some(Vec::new()));
    let call = if stream.starts_with("arn:") { call.stream_arn(stream) } else { call.stream_name(stream) };
    match call.send().await {
        Ok(_) => Ok(()),
        Err(e) if e.code().is_some_and(|c| c.starts_with("ValidationException")) => Ok(()),
        Err(e) => {
            let status = e.raw_response().map(|r| r.status().as_u16());
            match refusal(&e, flag, stream, "PutRecords", status) {
                Some(r) => Err(r),
                None => Err(Refused {
                    detail: format!(
                        "{flag} {stream}: no answer to PutRecords ({})",
                        crate::sink::aws::context_text(&e)
                    ),
                    fix: "check --aws-endpoint-url / --aws-region and the network".into(),
                }),
            }
        }
    }
}

/// A stream that takes records: ACTIVE, or UPDATING (resharding, which goes on writing).
fn takes_records(s: &StreamStatus) -> bool {
    matches!(s, StreamStatus::Active | StreamStatus::Updating)
}

fn not_active(flag: &str, stream: &str, s: &StreamStatus) -> Refused {
    Refused {
        detail: format!("{flag} {stream}: the stream is {}, not ACTIVE", s.as_str()),
        fix: "wait until `aws kinesis describe-stream-summary` shows it ACTIVE, or give another stream".into(),
    }
}

impl KinesisSink {
    /// Build the client, read the streams' summaries (a stream Kinesis says is not there, not
    /// ours, or not ACTIVE stops the start) and start the publisher task.
    pub async fn connect(aws: &AwsConfig, cfg: &KinesisConfig, health: Arc<Health>) -> Result<KinesisSink, Definite> {
        let client = aws_sdk_kinesis::Client::new(&sdk_config(aws).await);
        let mut sizes = Vec::new();
        for (flag, stream) in std::iter::once(("--kinesis-stream", &cfg.stream))
            .chain(cfg.dlq_stream.iter().map(|s| ("--kinesis-dlq-stream", s)))
        {
            let facts = stream_facts(&client, flag, stream).await.map_err(|r| Definite::Setup(r.to_string()))?;
            if let Some(f) = &facts {
                if !takes_records(&f.status) {
                    return Err(Definite::Setup(not_active(flag, stream, &f.status).to_string()));
                }
                tracing::info!(stream = %stream, shards = f.shards, mode = %f.mode, max_bytes = f.max_bytes, "Kinesis stream ready");
            }
            sizes.push(facts.map_or(MAX_RECORD_BYTES, |f| f.max_bytes));
        }
        health.set_sink_up(true);
        let target = publisher::Target {
            client,
            stream: cfg.stream.clone(),
            dlq_stream: cfg.dlq_stream.clone(),
            ordered: !unordered(),
        };
        if !target.ordered {
            tracing::warn!("OUTBOXD_KINESIS_UNORDERED is set: a key's events may be reordered (benchmarks only)");
        }
        let (tx, rx) = mpsc::channel(publisher::WINDOW);
        let task = tokio::spawn(crate::sink::aws::publisher::run(target, publisher::WINDOW, rx));
        let handoff = Handoff::new(vec![tx], vec![task], "the Kinesis publisher task ended");
        let max_bytes = sizes[0];
        Ok(KinesisSink { handoff, max_bytes, dlq_max_bytes: sizes.get(1).copied().unwrap_or(max_bytes) })
    }
}

/// `OUTBOXD_KINESIS_UNORDERED=1` lifts the one-record-of-a-key-in-flight rule, for the benchmark
/// that measures what the rule costs and the test that shows its order check can fail. Never for
/// production: a throttled record's later records of its key are then stored before it.
fn unordered() -> bool {
    std::env::var("OUTBOXD_KINESIS_UNORDERED").is_ok_and(|v| v == "1")
}

/// The sink's entry in the list of sinks ([`crate::sink::registry`]).
impl crate::sink::registered::Registered for KinesisSink {
    /// `outboxd dlq --sink kinesis` reads `--kinesis-dlq-stream` ([`dlq`]).
    const READABLE_DEAD_LETTERS: bool = true;

    async fn build(cfg: &crate::config::Config, health: Arc<Health>) -> Result<Self, Definite> {
        KinesisSink::connect(&cfg.aws, &cfg.kinesis, health).await
    }

    fn probe(cfg: &crate::config::Config) -> crate::sink::registered::Probe {
        let (aws, k) = (cfg.aws.clone(), cfg.kinesis.clone());
        crate::sink::registered::Probe::Run(Box::pin(async move { check(&aws, &k).await }))
    }
}

/// `outboxd check`: each stream exists, is ACTIVE, and the credentials may write to it.
async fn check(aws: &AwsConfig, cfg: &KinesisConfig) -> crate::sink::registered::Verdict {
    use crate::sink::registered::Verdict;
    let sdk = match crate::sink::aws::check_sdk_config(aws).await {
        Ok(sdk) => sdk,
        Err((detail, fix)) => return Verdict::Fail { name: "kinesis", detail, fix: fix.to_owned() },
    };
    let client = aws_sdk_kinesis::Client::new(&sdk);
    let mut lines = Vec::new();
    for (flag, stream) in std::iter::once(("--kinesis-stream", &cfg.stream))
        .chain(cfg.dlq_stream.iter().map(|s| ("--kinesis-dlq-stream", s)))
    {
        let fail = |r: Refused| Verdict::Fail { name: "kinesis", detail: r.detail, fix: r.fix };
        let f = match stream_facts(&client, flag, stream).await {
            Err(r) => return fail(r),
            Ok(None) => {
                return fail(Refused {
                    detail: format!("{flag} {stream}: no answer from Kinesis"),
                    fix: "check --aws-endpoint-url / --aws-region and the network".into(),
                })
            }
            Ok(Some(f)) => f,
        };
        if f.status != StreamStatus::Active {
            return fail(not_active(flag, stream, &f.status));
        }
        if let Err(r) = writable(&client, flag, stream).await {
            return fail(r);
        }
        lines.push(format!(
            "{stream}: ACTIVE, {} mode, {} open shards, records up to {} bytes, PutRecords not refused",
            f.mode, f.shards, f.max_bytes
        ));
    }
    Verdict::Ok { name: "kinesis", detail: lines.join("; ") }
}

impl Sink for KinesisSink {
    fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError> {
        let max = if delivery.is_dead_letter() { self.dlq_max_bytes } else { self.max_bytes };
        match record::job(record, delivery, max) {
            Ok(job) => self.handoff.push(0, job),
            Err(e) => Err(*e),
        }
    }

    held_in_handoff!();

    /// A copy's key, headers and payload travel in base64 (4 bytes for 3) in a JSON envelope.
    fn dead_letter_max_bytes(&self) -> Option<usize> {
        Some((self.dlq_max_bytes.saturating_sub(ENVELOPE_ROOM) / 4 * 3).max(1024))
    }
}
