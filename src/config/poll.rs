//! `outboxd poll`'s flags ([`PollLoopArgs`]) and settings: the batch loop's knobs and the
//! bookkeeping column names, validated once from the `--poll-*` and `--retention` flags. `outboxd
//! config` takes them too (to print them); `run` does not. `backfill` takes only
//! `--poll-field-seq` ([`SeqColumnArgs`]), the order of rows it re-publishes.

use std::time::Duration;

use crate::error::Definite;
use crate::units::parse_duration;

/// The longest wait between two tries of a refused row, however many tries failed.
pub const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(600);

/// `outboxd poll`'s own flags: the batch loop and its bookkeeping columns.
#[derive(Debug, Clone, clap::Args)]
pub struct PollLoopArgs {
    /// `outboxd poll`: rows claimed per batch (one SELECT, one UPDATE after their acks).
    #[arg(long, env = "OUTBOXD_POLL_BATCH", default_value_t = 1000, help_heading = "Poll mode (outboxd poll)")]
    pub poll_batch: usize,
    /// `outboxd poll`: look for rows this often when no NOTIFY arrives (the fallback wake-up).
    #[arg(long, env = "OUTBOXD_POLL_INTERVAL", default_value = "1s", help_heading = "Poll mode (outboxd poll)")]
    pub poll_interval: String,
    /// `outboxd poll`: failed tries after which a refused row goes to --on-bad-event (dlq: the dead-letter topic).
    #[arg(long, env = "OUTBOXD_POLL_MAX_ATTEMPTS", default_value_t = 10, help_heading = "Poll mode (outboxd poll)")]
    pub poll_max_attempts: u32,
    /// `outboxd poll`: wait after the first failed try; doubles with each further one (at most 10m).
    #[arg(long, env = "OUTBOXD_POLL_RETRY_BACKOFF", default_value = "1s", help_heading = "Poll mode (outboxd poll)")]
    pub poll_retry_backoff: String,
    /// `outboxd poll`: DELETE acked rows instead of setting their published-at column (needs DELETE).
    #[arg(long, env = "OUTBOXD_POLL_DELETE", num_args = 0..=1, default_value = "false", default_missing_value = "true", value_name = "BOOL", help_heading = "Poll mode (outboxd poll)")]
    pub poll_delete: bool,
    /// `outboxd poll`: LISTEN channel the outbox trigger NOTIFYs (sql/05_poll.sql); empty: poll only.
    #[arg(
        long,
        env = "OUTBOXD_POLL_CHANNEL",
        default_value = "outboxd_outbox",
        help_heading = "Poll mode (outboxd poll)"
    )]
    pub poll_channel: String,
    /// `outboxd poll`: delete published rows older than this, in small batches (e.g. 7d as 168h); 0: keep them.
    #[arg(
        long,
        env = "OUTBOXD_RETENTION",
        default_value = "0",
        value_name = "DURATION",
        help_heading = "Poll mode (outboxd poll)"
    )]
    pub retention: String,
    #[command(flatten)]
    pub seq: SeqColumnArgs,
    /// `outboxd poll`: column set when a row was published (NULL: not yet).
    #[arg(
        long,
        env = "OUTBOXD_POLL_FIELD_PUBLISHED_AT",
        default_value = "published_at",
        help_heading = "Poll mode (outboxd poll)"
    )]
    pub poll_field_published_at: String,
    /// `outboxd poll`: column counting failed tries (a row published on its first try keeps 0).
    #[arg(
        long,
        env = "OUTBOXD_POLL_FIELD_ATTEMPTS",
        default_value = "attempts",
        help_heading = "Poll mode (outboxd poll)"
    )]
    pub poll_field_attempts: String,
    /// `outboxd poll`: column holding the last failure's text.
    #[arg(long, env = "OUTBOXD_POLL_FIELD_ERROR", default_value = "error", help_heading = "Poll mode (outboxd poll)")]
    pub poll_field_error: String,
    /// `outboxd poll`: column holding when a failed row may be tried again.
    #[arg(
        long,
        env = "OUTBOXD_POLL_FIELD_NEXT_ATTEMPT_AT",
        default_value = "next_attempt_at",
        help_heading = "Poll mode (outboxd poll)"
    )]
    pub poll_field_next_attempt_at: String,
}

/// The column giving insertion order: `poll` claims rows by it, `backfill` orders by it.
#[derive(Debug, Clone, clap::Args)]
pub struct SeqColumnArgs {
    /// `outboxd poll`: column giving insertion order (unique; sql/05_poll.sql adds it as an identity).
    #[arg(long, env = "OUTBOXD_POLL_FIELD_SEQ", default_value = "seq", help_heading = "Poll mode (outboxd poll)")]
    pub poll_field_seq: String,
}

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
    pub fn from_args(a: &PollLoopArgs) -> Result<PollConfig, Definite> {
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
            seq: a.seq.poll_field_seq.clone(),
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

    /// The flags that rebuild this, for `outboxd config`.
    pub fn show(&self, push: &mut dyn FnMut(&'static str, String)) {
        let ms = crate::units::millis;
        push("poll-batch", self.batch.to_string());
        push("poll-interval", ms(self.interval));
        push("poll-max-attempts", self.max_attempts.to_string());
        push("poll-retry-backoff", ms(self.retry_backoff));
        push("poll-delete", self.delete.to_string());
        push("poll-channel", self.channel.clone());
        push("retention", ms(self.retention.unwrap_or_default()));
        let c = &self.columns;
        push("poll-field-seq", c.seq.clone());
        push("poll-field-published-at", c.published_at.clone());
        push("poll-field-attempts", c.attempts.clone());
        push("poll-field-error", c.error.clone());
        push("poll-field-next-attempt-at", c.next_attempt_at.clone());
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
