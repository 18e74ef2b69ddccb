//! `--redis-url` and `--redis-maxlen`: the Redis Streams sink's flags ([`RedisConnArgs`], shared
//! with the `dlq` tools, and [`RedisArgs`]) and settings.
//!
//! The URL is kept as given (the client parses it when the sink starts, and [`RedisConfig::check`]
//! parses it once up front so a typo is a set-up error, not a retry loop). Its password never
//! leaves this module unmasked: [`RedisConfig::url_masked`] (password, `?pass=`) is what `outboxd
//! config`, errors and `Debug` show.

use std::path::PathBuf;

use crate::error::Definite;
use crate::secret::{shown_url, url_or_file};

/// Default when `--sink redis` is given without `--redis-url`.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379/0";

#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[user[:password]@]host[:port][/db]`, `rediss://` for TLS, `unix:///path`.
    pub url: String,
    /// `XADD ... MAXLEN ~ N`: approximate trimming; `None` keeps every entry.
    pub maxlen: Option<u64>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig { url: DEFAULT_URL.into(), maxlen: None }
    }
}

impl RedisConfig {
    /// Parse the URL once so a bad one fails at start with the flag's name.
    pub fn check(&self) -> Result<(), Definite> {
        redis::Client::open(self.url.as_str()).map(|_| ()).map_err(|e| {
            Definite::Config(format!(
                "--redis-url {:?} is not a Redis URL ({}); use redis://[user:password@]host:6379/0 or rediss:// for TLS",
                self.url_masked(),
                e.kind_str()
            ))
        })
    }

    /// The URL with any password replaced by `****`.
    pub fn url_masked(&self) -> String {
        crate::secret::mask_url(&self.url)
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig").field("url", &self.url_masked()).field("maxlen", &self.maxlen).finish()
    }
}

trait KindStr {
    fn kind_str(&self) -> String;
}

impl KindStr for redis::RedisError {
    /// The error's category only: its text may quote the URL, password included.
    fn kind_str(&self) -> String {
        format!("{:?}", self.kind())
    }
}

/// How to reach Redis: the same flags for `outboxd run --sink redis` and the `dlq` tools.
#[derive(Debug, Clone, clap::Args)]
pub struct RedisConnArgs {
    /// Redis for --sink redis: redis://[user:password@]host:6379/0, rediss:// for TLS.
    #[arg(long, env = "OUTBOXD_REDIS_URL", hide_env_values = true, default_value = crate::sink::redis::config::DEFAULT_URL)]
    pub redis_url: String,
    /// Read --redis-url from FILE (one line) instead, so its credentials stay out of argv and the
    /// environment (`ps`); only the file's path is ever shown.
    #[arg(long, env = "OUTBOXD_REDIS_URL_FILE", value_name = "FILE", conflicts_with = "redis_url")]
    pub redis_url_file: Option<PathBuf>,
}

/// The Redis flags of `--sink redis`: how to reach it, and stream trimming.
#[derive(Debug, Clone, clap::Args)]
pub struct RedisArgs {
    #[command(flatten)]
    pub conn: RedisConnArgs,
    /// Trim each stream to about this many entries (XADD MAXLEN ~ N); unset keeps every entry.
    #[arg(long, value_name = "N")]
    pub redis_maxlen: Option<u64>,
}

impl RedisArgs {
    /// The Redis settings, the URL read from `--redis-url-file` when given; checked further when
    /// Redis is `used` (`--sink` or `--dlq-sink`).
    pub fn validate(&self, used: bool) -> Result<RedisConfig, Definite> {
        let c = &self.conn;
        let url = url_or_file("--redis-url-file", c.redis_url_file.as_deref(), &c.redis_url)?;
        let cfg = RedisConfig { url, maxlen: self.redis_maxlen };
        if used {
            cfg.check()?;
            if cfg.maxlen == Some(0) {
                return Err(Definite::Config(
                    "--redis-maxlen 0 would trim every event away; give at least 1, or leave it unset".into(),
                ));
            }
        }
        Ok(cfg)
    }
}

impl RedisConfig {
    /// The flags that rebuild this, for `outboxd config`; `file`: where the URL was read from.
    pub fn show(&self, file: Option<&std::path::Path>, push: &mut dyn FnMut(&'static str, String)) {
        let (k, v) = shown_url(file, "redis-url", "redis-url-file", self.url_masked());
        push(k, v);
        if let Some(n) = self.maxlen {
            push("redis-maxlen", n.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_in_the_url_and_in_debug() {
        let c = RedisConfig { url: "redis+unix:///run/redis.sock?db=1&pass=hunter2".into(), maxlen: None };
        assert_eq!(c.url_masked(), "redis+unix:///run/redis.sock?db=1&pass=****");
        let c = RedisConfig { url: "redis://u:hunter2@h:6379/0".into(), maxlen: Some(5) };
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
    }

    #[test]
    fn a_bad_url_names_the_flag_and_hides_the_password() {
        let c = RedisConfig { url: "http://u:hunter2@h".into(), maxlen: None };
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("--redis-url") && !e.contains("hunter2"), "{e}");
        assert!(RedisConfig { url: "redis://u:p@h:1/0".into(), maxlen: None }.check().is_ok());
    }
}
