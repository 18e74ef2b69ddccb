//! `--redis-url` and `--redis-maxlen`: the Redis Streams sink's settings.
//!
//! The URL is kept as given (the client parses it when the sink starts, and [`RedisConfig::check`]
//! parses it once up front so a typo is a set-up error, not a retry loop). Its password never
//! leaves this module unmasked: [`RedisConfig::url_masked`] (password, `?pass=`) is what `outboxd
//! config`, errors and `Debug` show.

use crate::error::Definite;

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
