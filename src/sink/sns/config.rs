//! Where `--sink sns` publishes: the topic's ARN, and the SQS queue dead-letter copies go to;
//! their flags ([`SnsArgs`]) and validated settings ([`SnsConfig`]). A topic whose name ends in
//! `.fifo` is a FIFO topic (SNS's own rule), so FIFO needs no flag of its own; `outboxd check`
//! confirms the topic's `FifoTopic` attribute agrees. Dead letters go to an SQS queue, since SNS
//! keeps nothing to read back; `outboxd dlq --sink sqs` reads that queue.

use crate::error::Definite;
use crate::sink::sqs::config::check_url;

/// The SNS flags of `--sink sns`.
#[derive(Debug, Clone, clap::Args)]
pub struct SnsArgs {
    /// SNS topic ARN for --sink sns (arn:aws:sns:REGION:ACCOUNT:NAME; a name ending in .fifo is a
    /// FIFO topic: group id = key, deduplication id = event id).
    #[arg(long, env = "OUTBOXD_SNS_TOPIC_ARN", value_name = "ARN")]
    pub sns_topic_arn: Option<String>,
    /// SQS queue URL that dead-letter copies go to with --sink sns and --on-bad-event dlq (SNS keeps
    /// nothing to read back); `outboxd dlq --sink sqs --sqs-dlq-queue-url` reads it.
    #[arg(long, env = "OUTBOXD_SNS_DLQ_QUEUE_URL", hide_env_values = true, value_name = "URL")]
    pub sns_dlq_queue_url: Option<String>,
}

/// The validated SNS settings (empty unless `--sink sns`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnsConfig {
    pub topic_arn: String,
    pub dlq_queue_url: Option<String>,
}

impl SnsConfig {
    /// Whether `arn` names a FIFO topic.
    pub fn is_fifo(arn: &str) -> bool {
        arn.ends_with(".fifo")
    }
}

/// arn:PARTITION:sns:REGION:ACCOUNT:NAME, with a name SNS takes.
pub(crate) fn check_arn(arn: &str) -> Result<(), Definite> {
    let parts: Vec<&str> = arn.split(':').collect();
    let ok = parts.len() == 6
        && parts[0] == "arn"
        && parts[2] == "sns"
        && parts.iter().all(|p| !p.is_empty())
        && parts[5].len() <= 256
        && parts[5].chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(Definite::Config(format!(
            "--sns-topic-arn {arn:?} is not an SNS topic ARN; give arn:aws:sns:REGION:ACCOUNT:TOPIC (as `aws sns list-topics` prints it)"
        )))
    }
}

impl SnsArgs {
    /// `used`: `--sink sns` (the topic is then required); `dead_letters`: `--on-bad-event dlq`
    /// without another `--dlq-sink`, so copies need their queue.
    pub fn validate(&self, used: bool, dead_letters: bool) -> Result<SnsConfig, Definite> {
        if !used {
            return Ok(SnsConfig::default());
        }
        let topic_arn = self.sns_topic_arn.clone().ok_or_else(|| {
            Definite::Config(
                "--sink sns needs --sns-topic-arn (the topic's ARN, as `aws sns list-topics` prints it)".into(),
            )
        })?;
        check_arn(&topic_arn)?;
        match &self.sns_dlq_queue_url {
            Some(d) => check_url("--sns-dlq-queue-url", d)?,
            None if dead_letters => return Err(Definite::Config(
                "--sink sns with --on-bad-event dlq needs --sns-dlq-queue-url (an SQS queue for dead-letter copies), \
                     or --dlq-sink, or --on-bad-event fail|skip"
                    .into(),
            )),
            None => {}
        }
        Ok(SnsConfig { topic_arn, dlq_queue_url: self.sns_dlq_queue_url.clone() })
    }
}

impl SnsConfig {
    /// The flags that rebuild this, for `outboxd config` (an ARN and a queue URL hold no secret).
    pub fn show(&self, push: &mut dyn FnMut(&'static str, String)) {
        if !self.topic_arn.is_empty() {
            push("sns-topic-arn", self.topic_arn.clone());
        }
        if let Some(d) = &self.dlq_queue_url {
            push("sns-dlq-queue-url", d.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(t: Option<&str>, d: Option<&str>) -> SnsArgs {
        SnsArgs { sns_topic_arn: t.map(Into::into), sns_dlq_queue_url: d.map(Into::into) }
    }

    #[test]
    fn topic_arns_are_checked_and_fifo_is_the_name() {
        let t = "arn:aws:sns:eu-west-1:123456789012:orders.fifo";
        let c = args(Some(t), Some("http://127.0.0.1:5000/123456789012/dlq")).validate(true, true).unwrap();
        assert!(SnsConfig::is_fifo(&c.topic_arn));
        assert!(args(None, None).validate(false, true).is_ok());
        let e = args(None, None).validate(true, false).unwrap_err().to_string();
        assert!(e.contains("--sns-topic-arn"), "{e}");
        let e = args(Some(t), None).validate(true, true).unwrap_err().to_string();
        assert!(e.contains("--sns-dlq-queue-url"), "{e}");
        for bad in ["orders", "arn:aws:sqs:eu-west-1:1:q", "arn:aws:sns:eu-west-1:1:", "arn:aws:sns:r:1:a b"] {
            assert!(args(Some(bad), None).validate(true, false).is_err(), "{bad}");
        }
    }
}
