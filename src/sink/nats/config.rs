//! How outboxd reaches NATS JetStream (`--sink nats`): the server URL, an optional credentials
//! file and an optional stream to create at start.
//!
//! The URL may carry `user:pass@` or a token (`nats://TOKEN@host`); [`NatsConfig::url_masked`] is the only form that reaches logs,
//! errors and `outboxd config` output.

use std::path::PathBuf;

use crate::error::Definite;

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
