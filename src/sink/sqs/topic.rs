//! The SNS calls the shared SQS/SNS publisher and `outboxd dlq replay` make: a `PublishBatch`
//! entry and call ([`entry`], [`publish`]), and the topic's facts ([`topic_fifo`]). They live here,
//! beside the publisher that sends them, so the SNS sink (`crate::sink::sns`) builds on this folder
//! and nothing here refers back to it. An event is acked only for an entry SNS lists among the
//! successful ones; a failed or missing entry goes back to the publisher to be retried or refused.

use std::collections::HashMap;

use aws_sdk_sns::error::ProvideErrorMetadata;
use aws_sdk_sns::primitives::Blob;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};

use super::message::{Job, Value};
use crate::sink::aws::publisher::by_id;
use crate::sink::aws::publisher::{Call, Failure};
use crate::sink::aws::{class_of, setup_failure, setup_fix, Class};

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
pub(crate) fn publish(client: &aws_sdk_sns::Client, arn: &str, batch: Vec<(u64, Job)>) -> Call<Job> {
    let entries: Vec<PublishBatchRequestEntry> = batch
        .iter()
        .enumerate()
        .map(|(i, (_, job))| entry(i, &job.body, &job.attributes, job.group.as_deref(), job.dedup.as_deref()))
        .collect();
    let call = client.publish_batch().topic_arn(arn).set_publish_batch_request_entries(Some(entries));
    Box::pin(async move {
        let answer = match call.send().await {
            Ok(out) => Ok(by_id(
                batch.len(),
                out.successful().iter().filter_map(|s| s.id()),
                out.failed().iter().map(|f| (f.id(), f.code(), f.message().unwrap_or_default())),
            )),
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
                let text = crate::sink::aws::error_text(&e);
                let fix = setup_fix(
                    Some(&code),
                    "check the ARN (or create the topic), --aws-region, and that the credentials may sns:GetTopicAttributes and sns:Publish on it",
                );
                Err(format!("--sns-topic-arn {arn}: SNS answered {code}: {text}; {fix}"))
            } else {
                tracing::warn!(topic = arn, error = %crate::sink::aws::context_text(&e), "SNS did not answer GetTopicAttributes");
                Ok(None)
            }
        }
    }
}
