//! Where `--sink kinesis` writes: the stream, and the stream dead-letter copies go to; their flags
//! ([`KinesisArgs`]) and validated settings ([`KinesisConfig`]). A stream is named by its name or
//! its ARN (`arn:aws:kinesis:REGION:ACCOUNT:stream/NAME`), as the Kinesis API takes either.

use crate::error::Definite;

/// The Kinesis flags of `--sink kinesis`.
#[derive(Debug, Clone, clap::Args)]
pub struct KinesisArgs {
    /// Kinesis data stream for --sink kinesis, by name or ARN (PutRecords; partition key = the
    /// record key, data = the payload as routed; headers are not carried).
    #[arg(long, env = "OUTBOXD_KINESIS_STREAM", value_name = "NAME")]
    pub kinesis_stream: Option<String>,
    /// Kinesis data stream that dead-letter copies go to with --sink kinesis and --on-bad-event
    /// dlq (each copy's data is a JSON envelope of its key, headers and payload; `outboxd dlq`
    /// does not read Kinesis yet: use --dlq-sink where it must).
    #[arg(long, env = "OUTBOXD_KINESIS_DLQ_STREAM", value_name = "NAME")]
    pub kinesis_dlq_stream: Option<String>,
}

/// The validated Kinesis settings (empty unless `--sink kinesis`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KinesisConfig {
    pub stream: String,
    pub dlq_stream: Option<String>,
}

/// Whether `s` is a stream name Kinesis takes (`[a-zA-Z0-9_.-]{1,128}`) or a stream ARN.
fn stream_ok(s: &str) -> bool {
    let name = match s.strip_prefix("arn:") {
        Some(rest) => match rest.split_once(":stream/") {
            Some((head, name)) if head.split(':').count() == 4 && head.contains("kinesis") => name,
            _ => return false,
        },
        None => s,
    };
    !name.is_empty() && name.len() <= 128 && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

fn check(flag: &str, s: &str) -> Result<(), Definite> {
    if stream_ok(s) {
        Ok(())
    } else {
        Err(Definite::Config(format!(
            "{flag} {s:?} is not a Kinesis stream; give its name ([A-Za-z0-9_.-], up to 128) or its ARN \
             (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)"
        )))
    }
}

impl KinesisArgs {
    /// `used`: `--sink kinesis` (the stream is then required); `dead_letters`: copies go through
    /// this sink (`--on-bad-event dlq` without another `--dlq-sink`), so they need their stream.
    pub fn validate(&self, used: bool, dead_letters: bool) -> Result<KinesisConfig, Definite> {
        if !used {
            return Ok(KinesisConfig::default());
        }
        let stream = self.kinesis_stream.clone().ok_or_else(|| {
            Definite::Config("--sink kinesis needs --kinesis-stream (the data stream's name or ARN)".into())
        })?;
        check("--kinesis-stream", &stream)?;
        if let Some(d) = &self.kinesis_dlq_stream {
            check("--kinesis-dlq-stream", d)?;
            if d == &stream {
                return Err(Definite::Config(
                    "--kinesis-dlq-stream is --kinesis-stream; give a stream of its own for dead-letter copies".into(),
                ));
            }
        } else if dead_letters {
            return Err(Definite::Config(
                "--sink kinesis with --on-bad-event dlq needs --kinesis-dlq-stream (a stream for dead-letter \
                 copies), or --dlq-sink, or --on-bad-event fail|skip"
                    .into(),
            ));
        }
        Ok(KinesisConfig { stream, dlq_stream: self.kinesis_dlq_stream.clone() })
    }
}

impl KinesisConfig {
    /// The flags that rebuild this, for `outboxd config` (stream names hold no secret).
    pub fn show(&self, push: &mut dyn FnMut(&'static str, String)) {
        if !self.stream.is_empty() {
            push("kinesis-stream", self.stream.clone());
        }
        if let Some(d) = &self.dlq_stream {
            push("kinesis-dlq-stream", d.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: Option<&str>, d: Option<&str>) -> KinesisArgs {
        KinesisArgs { kinesis_stream: s.map(Into::into), kinesis_dlq_stream: d.map(Into::into) }
    }

    #[test]
    fn streams_are_names_or_arns_and_dead_letters_need_their_own() {
        let arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders";
        let c = args(Some(arn), Some("orders-dlq")).validate(true, true).unwrap();
        assert_eq!(c.stream, arn);
        assert!(args(None, None).validate(false, true).is_ok());
        let e = args(None, None).validate(true, false).unwrap_err().to_string();
        assert!(e.contains("--kinesis-stream"), "{e}");
        let e = args(Some("orders"), None).validate(true, true).unwrap_err().to_string();
        assert!(e.contains("--kinesis-dlq-stream"), "{e}");
        let e = args(Some("orders"), Some("orders")).validate(true, true).unwrap_err().to_string();
        assert!(e.contains("of its own"), "{e}");
        for bad in ["", "a b", "arn:aws:sqs:x:1:q", &"s".repeat(129)] {
            assert!(args(Some(bad), None).validate(true, false).is_err(), "{bad}");
        }
    }
}
