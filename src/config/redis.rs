//! `--redis-url` and `--redis-maxlen`: the Redis Streams sink's settings.
//!
//! The URL is kept as given (the client parses it when the sink starts, and [`RedisConfig::check`]
//! parses it once up front so a typo is a set-up error, not a retry loop). Its password never
//! leaves this module unmasked: [`RedisConfig::url_masked`] is what `outboxd config` prints.

use crate::error::Definite;

/// Default when `--sink redis` is given without `--redis-url`.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379/0";

#[derive(Clone, Debug, PartialEq, Eq)]
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
        mask_url(&self.url)
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

/// `scheme://user:secret@host/...` → `scheme://user:****@host/...`; a URL without a password is unchanged.
pub fn mask_url(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else { return url.to_owned() };
    let rest = &url[start..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let Some(at) = authority.rfind('@') else { return url.to_owned() };
    let userinfo = &authority[..at];
    let masked = match userinfo.find(':') {
        Some(colon) => format!("{}:****", &userinfo[..colon]),
        // `redis://secret@host`: redis-rs reads a lone userinfo as the password.
        None if !userinfo.is_empty() => "****".to_owned(),
        None => String::new(),
    };
    format!("{}{}{}", &url[..start], masked, &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(mask_url("redis://u:s3cr%40t@h:6379/0"), "redis://u:****@h:6379/0");
        assert_eq!(mask_url("rediss://:pw@h"), "rediss://:****@h");
        assert_eq!(mask_url("redis://pw@h/1"), "redis://****@h/1");
        assert_eq!(mask_url("redis://h:6379/0"), "redis://h:6379/0");
        assert_eq!(mask_url("unix:///run/redis.sock"), "unix:///run/redis.sock");
    }

    #[test]
    fn a_bad_url_names_the_flag_and_hides_the_password() {
        let c = RedisConfig { url: "http://u:hunter2@h".into(), maxlen: None };
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("--redis-url") && !e.contains("hunter2"), "{e}");
        assert!(RedisConfig { url: "redis://u:p@h:1/0".into(), maxlen: None }.check().is_ok());
    }
}
