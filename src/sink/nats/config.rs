//! How outboxd reaches NATS JetStream (`--sink nats`): the server URL, an optional credentials
//! file and an optional stream to create at start; its flags ([`NatsConnArgs`], shared with the
//! `dlq` tools, and [`NatsArgs`]) and settings.
//!
//! The URL may carry `user:pass@` or a token (`nats://TOKEN@host`); [`NatsConfig::url_masked`] is the only form that reaches logs,
//! errors and `outboxd config` output.

use std::path::PathBuf;

use crate::error::Definite;
use crate::secret::{shown_url, url_or_file};

#[derive(Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// One or more comma-separated server URLs (`nats://user:pass@host:4222`, `tls://host`).
    pub url: String,
    /// A `.creds` file (JWT and NKey seed).
    pub creds: Option<PathBuf>,
    /// `--nats-create-stream NAME:SUBJECTS`: created with file storage at start if missing.
    pub create_stream: Option<StreamSpec>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSpec {
    pub name: String,
    pub subjects: Vec<String>,
}

impl std::fmt::Display for StreamSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.name, self.subjects.join(","))
    }
}

impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConfig")
            .field("url", &self.url_masked())
            .field("creds", &self.creds)
            .field("create_stream", &self.create_stream)
            .finish()
    }
}

impl NatsConfig {
    pub fn new(url: &str, creds: Option<PathBuf>, create_stream: Option<&str>) -> Result<NatsConfig, Definite> {
        if url.split(',').any(|u| u.trim().is_empty()) {
            return Err(Definite::Config(
                "--nats-url is empty; give nats://[user:pass@]host:4222 (comma-separated for several servers)".into(),
            ));
        }
        let create_stream = create_stream.map(StreamSpec::parse).transpose()?;
        Ok(NatsConfig { url: url.to_owned(), creds, create_stream })
    }

    /// The URLs with any password or token replaced by `****`.
    pub fn url_masked(&self) -> String {
        crate::secret::mask_url_list(&self.url)
    }
}

impl StreamSpec {
    fn parse(s: &str) -> Result<StreamSpec, Definite> {
        let bad = |why: &str| {
            Definite::Config(format!(
                "--nats-create-stream {s:?}: {why}; give NAME:SUBJECT[,SUBJECT...], e.g. OUTBOX:outbox.>"
            ))
        };
        let (name, subjects) = s.split_once(':').ok_or_else(|| bad("no ':' between the name and the subjects"))?;
        if name.is_empty() || name.contains(|c: char| c.is_whitespace() || ".*>/\\".contains(c)) {
            return Err(bad("the stream name is empty or has whitespace, '.', '*', '>', '/' or '\\'"));
        }
        let subjects: Vec<String> = subjects.split(',').map(|x| x.trim().to_owned()).collect();
        if subjects.iter().any(|x| x.is_empty() || x.contains(char::is_whitespace)) {
            return Err(bad("a subject is empty or has whitespace"));
        }
        Ok(StreamSpec { name: name.to_owned(), subjects })
    }
}

/// How to reach NATS: the same flags for `outboxd run --sink nats` and the `dlq` tools.
#[derive(Debug, Clone, clap::Args)]
pub struct NatsConnArgs {
    /// NATS server URL(s) for --sink nats: nats://[user:pass@]host:4222 (tls:// for TLS), comma-separated.
    #[arg(long, env = "OUTBOXD_NATS_URL", hide_env_values = true, default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Read --nats-url from FILE (one line) instead, so its credentials stay out of argv and the
    /// environment (`ps`); only the file's path is ever shown.
    #[arg(long, env = "OUTBOXD_NATS_URL_FILE", value_name = "FILE", conflicts_with = "nats_url")]
    pub nats_url_file: Option<PathBuf>,
    /// NATS credentials file (JWT and NKey seed) for --sink nats.
    #[arg(long, env = "OUTBOXD_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
}

/// The NATS flags of `--sink nats`: how to reach it, and the stream to create.
#[derive(Debug, Clone, clap::Args)]
pub struct NatsArgs {
    #[command(flatten)]
    pub conn: NatsConnArgs,
    /// Create this JetStream stream (file storage) at start if it is missing: NAME:SUBJECT[,SUBJECT...].
    #[arg(long, value_name = "NAME:SUBJECTS")]
    pub nats_create_stream: Option<String>,
}

impl NatsArgs {
    /// The NATS settings, the URL read from `--nats-url-file` when given.
    pub fn validate(&self) -> Result<NatsConfig, Definite> {
        let c = &self.conn;
        let url = url_or_file("--nats-url-file", c.nats_url_file.as_deref(), &c.nats_url)?;
        NatsConfig::new(&url, c.nats_creds.clone(), self.nats_create_stream.as_deref())
    }
}

impl NatsConfig {
    /// The flags that rebuild this, for `outboxd config`; `file`: where the URL was read from.
    pub fn show(&self, file: Option<&std::path::Path>, push: &mut dyn FnMut(&'static str, String)) {
        let (k, v) = shown_url(file, "nats-url", "nats-url-file", self.url_masked());
        push(k, v);
        if let Some(c) = &self.creds {
            push("nats-creds", c.display().to_string());
        }
        if let Some(s) = &self.create_stream {
            push("nats-create-stream", s.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_is_masked_and_nothing_else() {
        let c = NatsConfig::new("nats://app:s3cr:et@h1:4222,tls://h2:4222,nats://tok@h3", None, None).unwrap();
        assert_eq!(c.url_masked(), "nats://app:****@h1:4222,tls://h2:4222,nats://****@h3");
        assert!(!format!("{c:?}").contains("s3cr") && !format!("{c:?}").contains("tok@"));
        assert_eq!(NatsConfig::new("u:p@host:4222", None, None).unwrap().url_masked(), "u:****@host:4222");
    }

    #[test]
    fn create_stream_parses_and_rejects_bad_specs() {
        let c = NatsConfig::new("nats://h", None, Some("OUTBOX:outbox.>,dlq")).unwrap();
        let s = c.create_stream.unwrap();
        assert_eq!((s.name.as_str(), s.subjects.clone()), ("OUTBOX", vec!["outbox.>".to_owned(), "dlq".to_owned()]));
        assert_eq!(s.to_string(), "OUTBOX:outbox.>,dlq");
        for bad in ["OUTBOX", ":a", "A.B:a", "A:", "A:a,,b"] {
            assert!(NatsConfig::new("nats://h", None, Some(bad)).is_err(), "{bad}");
        }
        assert!(NatsConfig::new("", None, None).is_err());
    }
}
