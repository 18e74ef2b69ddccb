//! The Kinesis side of the AWS publisher task ([`crate::sink::aws::publisher`]): `PutRecords`
//! calls of up to [`BATCH`] records and [`BATCH_BYTES`] of data and partition keys (Kinesis's
//! limits), each answer's `Records` turned into one entry per record, at its place ([`entries`]).
//!
//! Order: a job's lane is its partition key, so a key has at most one record in flight (the
//! shared task's rule): Kinesis answers each record of a `PutRecords` call on its own, and a
//! throttled record must not have its key's later records stored before it. Keyless events keep
//! no order (their partition key is their event id) and have no lane. The cost, measured in
//! bench/RESULTS.md: one key moves at most one record per round trip. A record too large is
//! refused before sending, in [`super::record`].

use aws_sdk_kinesis::operation::put_records::PutRecordsOutput;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;

use super::record::Job;
use crate::sink::aws::publisher::{self as shared, Call, Entry, Failure};

/// Records in one `PutRecords` (Kinesis's limit).
pub(super) const BATCH: usize = 500;
/// Data and partition key bytes in one `PutRecords` (Kinesis's limit: 5 MiB).
pub(super) const BATCH_BYTES: usize = 5 * 1024 * 1024;
/// Jobs waiting here at most (the channel holds as many more).
pub const WINDOW: usize = 8192;

/// Where the publisher writes.
pub struct Target {
    pub client: aws_sdk_kinesis::Client,
    pub stream: String,
    pub dlq_stream: Option<String>,
    /// Keep each key's order (always, but for `OUTBOXD_KINESIS_UNORDERED=1`, which only the
    /// benchmark and the test that shows the order check can fail set: see [`super::unordered`]).
    pub ordered: bool,
}

impl shared::Service for Target {
    type Job = Job;

    fn limits(&self) -> (usize, usize) {
        (BATCH, BATCH_BYTES)
    }

    fn refusal(&self, code: &str, message: &str) -> (&'static str, String) {
        ("invalid_record", format!("Kinesis refused the record ({code}): {message}"))
    }

    fn lane<'a>(&self, job: &'a Job) -> Option<&'a str> {
        (self.ordered && job.keyed).then_some(job.partition_key.as_str())
    }

    fn send(&self, batch: Vec<(u64, Job)>) -> Call<Job> {
        let stream = match (batch.first().is_some_and(|(_, j)| j.dlq), &self.dlq_stream) {
            (true, Some(d)) => d.clone(),
            _ => self.stream.clone(),
        };
        let records: Vec<PutRecordsRequestEntry> = batch
            .iter()
            .map(|(_, job)| {
                PutRecordsRequestEntry::builder()
                    .data(Blob::new(job.data.to_vec()))
                    .partition_key(job.partition_key.clone())
                    .build()
                    .expect("data and partition key are set")
            })
            .collect();
        let call = self.client.put_records().set_records(Some(records));
        let call = if stream.starts_with("arn:") { call.stream_arn(stream) } else { call.stream_name(stream) };
        Box::pin(async move {
            let answer = match call.send().await {
                Ok(out) => Ok(entries(&out, batch.len())),
                Err(e) => Err(Failure::of("Kinesis PutRecords", &e)),
            };
            (batch, answer)
        })
    }

    fn setup_reason(&self, code: &str, text: &str) -> String {
        let otherwise =
            "check --kinesis-stream (and --kinesis-dlq-stream), --aws-region, and that the credentials may \
                         kinesis:PutRecords on the stream (and use its KMS key)";
        format!("Kinesis refused the call ({code}): {text}; {}", crate::sink::aws::setup_fix(Some(code), otherwise))
    }
}

/// The answer's `Records` as one entry per record sent: they match the request's one for one, in
/// order. A record the answer leaves out (a short answer), or answers with neither a sequence
/// number nor an error code, is [`Entry::Missing`]: sent again, never acked.
pub(crate) fn entries(out: &PutRecordsOutput, sent: usize) -> Vec<Entry> {
    let results = out.records();
    (0..sent)
        .map(|i| match results.get(i) {
            None => Entry::Missing,
            Some(r) => match (r.error_code(), r.sequence_number()) {
                (Some(code), _) => Entry::Failed {
                    code: code.to_owned(),
                    message: crate::sink::aws::service_text(r.error_message().unwrap_or("")),
                },
                (None, Some(_)) => Entry::Stored,
                (None, None) => Entry::Missing,
            },
        })
        .collect()
}
