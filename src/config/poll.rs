//! `outboxd poll`'s settings: the batch loop's knobs and the bookkeeping column names, validated
//! once from the `--poll-*` and `--retention` flags (they sit in `RunArgs`, so `outboxd config`
//! shows them and `run` ignores them).

use std::time::Duration;

use super::units::parse_duration;
use super::RunArgs;
use crate::error::Definite;

/// The longest wait between two tries of a refused row, however many tries failed.
pub const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(600);

/// Everything `outboxd poll` adds to the `run` configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollConfig {
    /// Rows claimed per batch.
    pub batch: usize,
    /// The fallback wake-up when no NOTIFY arrives.
    pub interval: Duration,
    /// Failed tries after which a refused row follows `--on-bad-event`.
    pub max_attempts: u32,
    /// Wait after the first failed try; doubled per further try, capped at [`MAX_RETRY_BACKOFF`].
    pub retry_backoff: Duration,
    /// DELETE acked rows instead of marking them.
    pub delete: bool,
    /// LISTEN channel; empty: no LISTEN.
    pub channel: String,
    /// Published rows older than this are deleted; `None`: kept.
    pub retention: Option<Duration>,
    pub columns: PollColumns,
}

/// The bookkeeping columns, by name (the aggregate is `--table-field-event-key`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollColumns {
    pub seq: String,
    pub published_at: String,
    pub attempts: String,
    pub error: String,
    pub next_attempt_at: String,
}

impl PollConfig {
    pub fn from_args(a: &RunArgs) -> Result<PollConfig, Definite> {
        let bad = |m: String| Definite::Config(m);
        if a.poll_batch == 0 || a.poll_batch > 100_000 {
            return Err(bad(format!("--poll-batch {} must be between 1 and 100000", a.poll_batch)));
        }
        let interval = parse_duration("--poll-interval", &a.poll_interval)?;
        if interval < Duration::from_millis(10) {
            return Err(bad(format!("--poll-interval {:?} must be at least 10ms", a.poll_interval)));
        }
        if a.poll_max_attempts == 0 {
            return Err(bad("--poll-max-attempts must be at least 1".into()));
        }
        let retry_backoff = parse_duration("--poll-retry-backoff", &a.poll_retry_backoff)?;
        if retry_backoff.is_zero() || retry_backoff > MAX_RETRY_BACKOFF {
            return Err(bad(format!("--poll-retry-backoff {:?} must be between 1ms and 10m", a.poll_retry_backoff)));
        }
        if a.poll_channel.len() > 63 || a.poll_channel.contains('\0') {
            return Err(bad(format!("--poll-channel {:?}: must be at most 63 characters", a.poll_channel)));
        }
        let retention = parse_duration("--retention", &a.retention)?;
        let columns = PollColumns {
            seq: a.poll_field_seq.clone(),
            published_at: a.poll_field_published_at.clone(),
            attempts: a.poll_field_attempts.clone(),
            error: a.poll_field_error.clone(),
            next_attempt_at: a.poll_field_next_attempt_at.clone(),
        };
        for (flag, v) in [
            ("--poll-field-seq", &columns.seq),
            ("--poll-field-published-at", &columns.published_at),
            ("--poll-field-attempts", &columns.attempts),
            ("--poll-field-error", &columns.error),
            ("--poll-field-next-attempt-at", &columns.next_attempt_at),
        ] {
            if v.is_empty() || v.contains('\0') {
                return Err(bad(format!("{flag} must name a column of the outbox table")));
            }
        }
        Ok(PollConfig {
            batch: a.poll_batch,
            interval,
            max_attempts: a.poll_max_attempts,
            retry_backoff,
            delete: a.poll_delete,
            channel: a.poll_channel.clone(),
            retention: Some(retention).filter(|d| !d.is_zero()),
            columns,
        })
    }

    /// The wait after `failed` failed tries (1 or more).
    pub fn backoff_after(&self, failed: u32) -> Duration {
        let factor = 1u32 << failed.saturating_sub(1).min(20);
        self.retry_backoff.saturating_mul(factor).min(MAX_RETRY_BACKOFF)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let mut c = PollConfig {
            batch: 1,
            interval: Duration::from_secs(1),
            max_attempts: 10,
            retry_backoff: Duration::from_secs(1),
            delete: false,
            channel: String::new(),
            retention: None,
            columns: PollColumns {
                seq: "s".into(),
                published_at: "p".into(),
                attempts: "a".into(),
                error: "e".into(),
                next_attempt_at: "n".into(),
            },
        };
        assert_eq!(c.backoff_after(1), Duration::from_secs(1));
        assert_eq!(c.backoff_after(2), Duration::from_secs(2));
        assert_eq!(c.backoff_after(4), Duration::from_secs(8));
        assert_eq!(c.backoff_after(40), MAX_RETRY_BACKOFF);
        c.retry_backoff = Duration::from_millis(100);
        assert_eq!(c.backoff_after(3), Duration::from_millis(400));
    }
}
