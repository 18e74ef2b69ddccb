//! A client of a Confluent-compatible schema registry (Confluent Schema Registry, Apicurio
//! Registry's `/apis/ccompat/v7`, Karapace): the few calls outboxd needs.
//!
//! Answers are classified here, once: the registry unreachable, timing out or failing (5xx) is
//! [`RegistryError::Unavailable`] (the session stops, nothing past the event is confirmed, and it
//! is tried again); credentials refused (401, 403) is [`RegistryError::Refused`] (an operator must
//! act); a subject with no schema (404, `error_code` 40401) is [`RegistryError::Missing`], a fact
//! about the events routed to it, which go to `--on-bad-event`.
//!
//! The password never appears in a URL, a log line or an error: it is sent as `Authorization:
//! Basic` only, and reqwest's errors are built from the URL without userinfo.

use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::Deserialize;

use super::RegistryConfig;

/// How long one registry call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    #[error("schema registry {url} unavailable: {reason}")]
    Unavailable { url: String, reason: String },
    #[error("schema registry {url} refused outboxd's credentials (HTTP {status}); check --schema-registry-user and --schema-registry-password-file")]
    Refused { url: String, status: u16 },
    #[error("no schema is registered under subject {subject:?} in {url} (register one, e.g. POST {url}/subjects/{subject}/versions)")]
    Missing { url: String, subject: String },
}

/// A registered schema: its id (what the wire format carries) and its text.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Registered {
    pub id: u32,
    pub schema: String,
    /// `AVRO` when absent (the registry's convention).
    #[serde(rename = "schemaType", default)]
    pub schema_type: Option<String>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: i64,
    #[serde(default)]
    message: String,
}

pub struct Registry {
    base: Url,
    shown: String,
    client: reqwest::Client,
    user: Option<String>,
    password: Option<String>,
}

impl Registry {
    pub fn new(cfg: &RegistryConfig) -> Result<Registry, String> {
        let mut builder = reqwest::Client::builder().timeout(CALL_TIMEOUT).connect_timeout(Duration::from_secs(5));
        if let Some(path) = &cfg.ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| format!("--schema-registry-ca-file {}: cannot read it: {e}", path.display()))?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| format!("--schema-registry-ca-file {}: not a PEM certificate: {e}", path.display()))?;
            builder = builder.add_root_certificate(cert);
        }
        let client = builder.build().map_err(|e| format!("cannot build the schema registry client: {e}"))?;
        Ok(Registry {
            base: cfg.url.clone(),
            shown: cfg.url.as_str().trim_end_matches('/').to_owned(),
            client,
            user: cfg.user.clone(),
            password: cfg.password.as_ref().map(|p| p.expose().to_owned()),
        })
    }

    /// The latest version registered under `subject`.
    pub async fn latest(&self, subject: &str) -> Result<Registered, RegistryError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|_| self.unavailable("the URL cannot have a path".into()))?
            .pop_if_empty()
            .extend(["subjects", subject, "versions", "latest"]);
        let mut req = self.client.get(url).header("Accept", "application/vnd.schemaregistry.v1+json, application/json");
        if let Some(user) = &self.user {
            req = req.basic_auth(user, self.password.as_ref());
        }
        let resp = req.send().await.map_err(|e| self.unavailable(e.without_url().to_string()))?;
        let status = resp.status();
        if status.is_success() {
            let body = resp.bytes().await.map_err(|e| self.unavailable(e.without_url().to_string()))?;
            return serde_json::from_slice::<Registered>(&body)
                .map_err(|e| self.unavailable(format!("unreadable answer: {e}")));
        }
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                Err(RegistryError::Refused { url: self.shown.clone(), status: status.as_u16() })
            }
            StatusCode::NOT_FOUND => {
                let body = error_body(resp).await;
                match body {
                    Some(b) if b.error_code == 40401 || b.error_code == 40402 => {
                        Err(RegistryError::Missing { url: self.shown.clone(), subject: subject.to_owned() })
                    }
                    // A 404 that is not the registry's: a wrong URL path.
                    _ => Err(self
                        .unavailable("HTTP 404 (is the URL the registry's API root, e.g. …/apis/ccompat/v7?)".into())),
                }
            }
            _ => {
                let b = error_body(resp).await;
                let detail = b.map(|b| format!(": {} (error_code {})", b.message, b.error_code)).unwrap_or_default();
                Err(self.unavailable(format!("HTTP {}{detail}", status.as_u16())))
            }
        }
    }

    fn unavailable(&self, reason: String) -> RegistryError {
        RegistryError::Unavailable { url: self.shown.clone(), reason }
    }
}

async fn error_body(resp: reqwest::Response) -> Option<ErrorBody> {
    serde_json::from_slice(&resp.bytes().await.ok()?).ok()
}
