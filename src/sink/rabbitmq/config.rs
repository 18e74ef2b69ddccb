//! `--rabbitmq-url` and `--rabbitmq-exchange`: where the RabbitMQ sink publishes.
//!
//! The URL is kept as given and parsed once here ([`RabbitConfig::check`]) so a typo is a set-up
//! error naming the flag, not a reconnect loop. Its password never leaves this module unmasked:
//! [`RabbitConfig::url_masked`] is the form for logs, errors and `outboxd config`, and `Debug`
//! uses it too.

use std::path::PathBuf;
use std::str::FromStr;

use lapin::uri::{AMQPScheme, AMQPUri};

use crate::error::Definite;
use crate::secret::{shown_url, url_or_file};

/// Default when `--sink rabbitmq` is given without `--rabbitmq-url`: the local broker's default
/// virtual host, as guest (lapin's default user when the URL names none).
pub const DEFAULT_URL: &str = "amqp://127.0.0.1:5672/%2f";
/// AMQP 0-9-1 `shortstr`: exchange names, routing keys, message ids and header names.
pub const SHORTSTR_MAX: usize = 255;

#[derive(Clone, PartialEq, Eq)]
pub struct RabbitConfig {
    /// `amqp://[user:password@]host[:port][/vhost][?heartbeat=N]`, `amqps://` for TLS.
    pub url: String,
    /// The exchange every event is published to; empty is the default exchange, where the
    /// routing key (the topic) names the queue.
    pub exchange: String,
}

impl Default for RabbitConfig {
    fn default() -> Self {
        RabbitConfig { url: DEFAULT_URL.into(), exchange: String::new() }
    }
}

impl std::fmt::Debug for RabbitConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitConfig").field("url", &self.url_masked()).field("exchange", &self.exchange).finish()
    }
}

impl RabbitConfig {
    /// The parsed URL, or a one-line error naming the flag (the password masked).
    pub fn uri(&self) -> Result<AMQPUri, Definite> {
        let bad = |why: &str| {
            Definite::Config(format!(
                "--rabbitmq-url {:?} {why}; use amqp://[user:password@]host:5672/%2f, or amqps:// for TLS",
                self.url_masked()
            ))
        };
        let scheme = self.url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        if !matches!(scheme.as_deref(), Some("amqp" | "amqps")) {
            return Err(bad("is not an amqp:// or amqps:// URL"));
        }
        // The parser's own message may quote the URL, password included: not passed on.
        let mut uri = AMQPUri::from_str(&self.url).map_err(|_| bad("cannot be parsed"))?;
        debug_assert!(matches!(uri.scheme, AMQPScheme::AMQP | AMQPScheme::AMQPS));
        // The parser takes the host from the URL's domain name only, so an IP address would
        // silently become its default host ("localhost"); put it back.
        if let Some(ip) = ip_host(&self.url) {
            uri.authority.host = ip;
        }
        Ok(uri)
    }

    /// Parse the URL and check the exchange name, so bad values fail at start.
    pub fn check(&self) -> Result<(), Definite> {
        self.uri()?;
        if self.exchange.len() > SHORTSTR_MAX || self.exchange.contains(|c: char| c.is_control()) {
            return Err(Definite::Config(format!(
                "--rabbitmq-exchange {:?} must be at most {SHORTSTR_MAX} bytes without control characters",
                self.exchange
            )));
        }
        Ok(())
    }

    /// The URL with any password replaced by `****`.
    pub fn url_masked(&self) -> String {
        crate::secret::mask_url(&self.url)
    }
}

/// The host of `url` if it is an IP address (IPv6 without its brackets).
fn ip_host(url: &str) -> Option<String> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host_port = &authority[authority.rfind('@').map_or(0, |i| i + 1)..];
    let host = match host_port.strip_prefix('[') {
        Some(v6) => &v6[..v6.find(']')?],
        None => host_port.rsplit_once(':').map_or(host_port, |(h, _)| h),
    };
    host.parse::<std::net::IpAddr>().ok().map(|ip| ip.to_string())
}

/// How to reach RabbitMQ: the same flags for `outboxd run --sink rabbitmq` and the `dlq` tools.
#[derive(Debug, Clone, clap::Args)]
pub struct RabbitConnArgs {
    /// RabbitMQ for --sink rabbitmq: amqp://[user:password@]host:5672/%2f, amqps:// for TLS.
    #[arg(long, env = "OUTBOXD_RABBITMQ_URL", hide_env_values = true, default_value = crate::sink::rabbitmq::config::DEFAULT_URL)]
    pub rabbitmq_url: String,
    /// Read --rabbitmq-url from FILE (one line) instead, so its credentials stay out of argv and the
    /// environment (`ps`); only the file's path is ever shown.
    #[arg(long, env = "OUTBOXD_RABBITMQ_URL_FILE", value_name = "FILE", conflicts_with = "rabbitmq_url")]
    pub rabbitmq_url_file: Option<PathBuf>,
    /// Exchange to publish to (run) and to replay to (dlq replay), with the topic as routing key;
    /// empty: the default exchange (the routing key names the queue).
    #[arg(long, env = "OUTBOXD_RABBITMQ_EXCHANGE", default_value = "")]
    pub rabbitmq_exchange: String,
}

impl RabbitConnArgs {
    /// The RabbitMQ settings, the URL read from `--rabbitmq-url-file` when given; checked further
    /// when RabbitMQ is `used` (`--sink` or `--dlq-sink`).
    pub fn validate(&self, used: bool) -> Result<RabbitConfig, Definite> {
        let url = url_or_file("--rabbitmq-url-file", self.rabbitmq_url_file.as_deref(), &self.rabbitmq_url)?;
        let cfg = RabbitConfig { url, exchange: self.rabbitmq_exchange.clone() };
        if used {
            cfg.check()?;
        }
        Ok(cfg)
    }
}

impl RabbitConfig {
    /// The flags that rebuild this, for `outboxd config`; `file`: where the URL was read from.
    pub fn show(&self, file: Option<&std::path::Path>, push: &mut dyn FnMut(&'static str, String)) {
        let (k, v) = shown_url(file, "rabbitmq-url", "rabbitmq-url-file", self.url_masked());
        push(k, v);
        push("rabbitmq-exchange", self.exchange.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str, exchange: &str) -> RabbitConfig {
        RabbitConfig { url: url.into(), exchange: exchange.into() }
    }

    #[test]
    fn password_is_masked_everywhere() {
        let c = cfg("amqps://app:s3cr%40t@mq.example:5671/prod", "events");
        assert_eq!(c.url_masked(), "amqps://app:****@mq.example:5671/prod");
        assert!(!format!("{c:?}").contains("s3cr"));
        assert_eq!(cfg("amqp://guest@h/%2f", "").url_masked(), "amqp://guest@h/%2f");
        let e = cfg("http://u:hunter2@h", "").check().unwrap_err().to_string();
        assert!(e.contains("--rabbitmq-url") && !e.contains("hunter2"), "{e}");
    }

    #[test]
    fn urls_and_exchanges_are_checked() {
        for ok in [DEFAULT_URL, "amqp://u:p@h", "amqps://h:5671/vh?heartbeat=5", "AMQP://h"] {
            assert!(cfg(ok, "").check().is_ok(), "{ok}");
        }
        for bad in ["", "127.0.0.1:5672", "nats://h", "amqp://h:notaport"] {
            assert!(cfg(bad, "").check().is_err(), "{bad}");
        }
        assert!(cfg(DEFAULT_URL, "amq.topic").check().is_ok());
        let host = |u: &str| cfg(u, "").uri().unwrap().authority.host;
        assert_eq!(host("amqp://u:p@10.1.2.3:5672/%2f"), "10.1.2.3");
        assert_eq!(host("amqp://[::1]:5672"), "::1");
        assert_eq!(host("amqps://mq.example/vh"), "mq.example");
        assert!(cfg(DEFAULT_URL, &"x".repeat(256)).check().is_err());
        assert!(cfg(DEFAULT_URL, "a\nb").check().is_err());
    }
}
