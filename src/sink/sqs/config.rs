//! Where `--sink sqs` writes: the queue's URL, and the queue dead-letter copies go to; their flags
//! ([`SqsArgs`]) and validated settings ([`SqsConfig`]). A queue whose name ends in `.fifo` is a
//! FIFO queue (SQS's own rule), so FIFO needs no flag of its own; `outboxd check` confirms the
//! queue's `FifoQueue` attribute agrees.

use crate::error::Definite;

/// The SQS flags of `--sink sqs`.
#[derive(Debug, Clone, clap::Args)]
pub struct SqsArgs {
    /// SQS queue URL for --sink sqs (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME; a name ending
    /// in .fifo is a FIFO queue: group id = key, deduplication id = event id).
    #[arg(long, env = "OUTBOXD_SQS_QUEUE_URL", hide_env_values = true, value_name = "URL")]
    pub sqs_queue_url: Option<String>,
    /// SQS queue URL that dead-letter copies go to with --sink sqs (or --dlq-sink sqs) and
    /// --on-bad-event dlq; `outboxd dlq --sink sqs` reads it.
    #[arg(long, env = "OUTBOXD_SQS_DLQ_QUEUE_URL", hide_env_values = true, value_name = "URL")]
    pub sqs_dlq_queue_url: Option<String>,
}

/// The validated SQS settings (empty unless `--sink sqs` or `--dlq-sink sqs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SqsConfig {
    pub queue_url: String,
    pub dlq_queue_url: Option<String>,
}

impl SqsConfig {
    /// Whether `url` names a FIFO queue.
    pub fn is_fifo(url: &str) -> bool {
        url.trim_end_matches('/').ends_with(".fifo")
    }
}

pub(crate) fn check_url(flag: &str, url: &str) -> Result<(), Definite> {
    // scheme://host/.../QUEUE: a host, and a queue name after it.
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    let parts: Vec<&str> = rest.map(|r| r.trim_end_matches('/').split('/').collect()).unwrap_or_default();
    let ok = !url.contains('@')
        && parts.len() >= 2
        && !parts[0].is_empty()
        && parts.last().is_some_and(|n| !n.is_empty() && !n.contains(':'));
    if ok {
        Ok(())
    } else {
        Err(Definite::Config(format!(
            "{flag} {url:?} is not an SQS queue URL; give https://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE"
        )))
    }
}

impl SqsArgs {
    /// `used`: `--sink sqs` (the queue URL is then required); `dead_letters`: copies go through
    /// this sink (`--on-bad-event dlq` without another `--dlq-sink`), so they need their queue.
    pub fn validate(&self, used: bool, dead_letters: bool) -> Result<SqsConfig, Definite> {
        if !used {
            return Ok(SqsConfig::default());
        }
        let queue_url = self.sqs_queue_url.clone().ok_or_else(|| {
            Definite::Config(
                "--sink sqs needs --sqs-queue-url (the queue's URL, as `aws sqs get-queue-url` prints it)".into(),
            )
        })?;
        check_url("--sqs-queue-url", &queue_url)?;
        if let Some(d) = &self.sqs_dlq_queue_url {
            check_url("--sqs-dlq-queue-url", d)?;
            if d == &queue_url {
                return Err(Definite::Config(
                    "--sqs-dlq-queue-url is --sqs-queue-url; give a queue of its own for dead-letter copies".into(),
                ));
            }
        } else if dead_letters {
            return Err(Definite::Config(
                "--sink sqs with --on-bad-event dlq needs --sqs-dlq-queue-url (a queue for dead-letter copies), \
                 or --dlq-sink, or --on-bad-event fail|skip"
                    .into(),
            ));
        }
        Ok(SqsConfig { queue_url, dlq_queue_url: self.sqs_dlq_queue_url.clone() })
    }
}

impl SqsConfig {
    /// The flags that rebuild this, for `outboxd config` (queue URLs hold no secret).
    pub fn show(&self, push: &mut dyn FnMut(&'static str, String)) {
        if !self.queue_url.is_empty() {
            push("sqs-queue-url", self.queue_url.clone());
        }
        if let Some(d) = &self.dlq_queue_url {
            push("sqs-dlq-queue-url", d.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(q: Option<&str>, d: Option<&str>) -> SqsArgs {
        SqsArgs { sqs_queue_url: q.map(Into::into), sqs_dlq_queue_url: d.map(Into::into) }
    }

    #[test]
    fn queue_urls_are_checked_and_fifo_is_the_name() {
        let q = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo";
        let c = args(Some(q), Some("http://127.0.0.1:5000/123456789012/dlq")).validate(true, true).unwrap();
        assert!(SqsConfig::is_fifo(&c.queue_url) && !SqsConfig::is_fifo(c.dlq_queue_url.as_deref().unwrap()));
        assert!(args(None, None).validate(false, true).is_ok());
        let e = args(None, None).validate(true, false).unwrap_err().to_string();
        assert!(e.contains("--sqs-queue-url"), "{e}");
        let e = args(Some(q), None).validate(true, true).unwrap_err().to_string();
        assert!(e.contains("--sqs-dlq-queue-url"), "{e}");
        for bad in ["orders", "https://sqs.x/", "https://u:p@sqs.x/1/q"] {
            assert!(args(Some(bad), None).validate(true, false).is_err(), "{bad}");
        }
    }
}
