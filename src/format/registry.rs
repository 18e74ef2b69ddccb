//! A client of a Confluent-compatible schema registry (Confluent Schema Registry, Apicurio
//! Registry's `/apis/ccompat/v7`, Karapace): the few calls outboxd needs.
//!
//! Answers are classified here, once: the registry unreachable, timing out or failing (5xx) is
//! [`RegistryError::Unavailable`] (the session stops, nothing past the event is confirmed, and it
//! is tried again); credentials refused (401, 403) is [`RegistryError::Refused`] (an operator must
//! act); a subject with no schema (404, `error_code` 40401), a schema not registered under its
//! subject (40403), a schema the subject's compatibility rule refuses (409) and a schema the
//! registry cannot parse (422) are facts about the events that need it, which go to
//! `--on-bad-event` ([`RegistryError::bad_event_code`]).
//!
//! The password never appears in a URL, a log line or an error: it is sent as `Authorization:
//! Basic` only, and reqwest's errors are built from the URL without userinfo. The URL in errors is
//! masked as `outboxd config` shows it (a secret query value, e.g. `?apikey=`, as `****`).
//!
//! Every answer is read to at most [`MAX_ANSWER`] bytes: a registry (or whatever answers at its
//! URL) cannot make outboxd hold an unbounded body. A longer answer is
//! [`RegistryError::Unavailable`], naming the limit.

use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::Deserialize;

use super::RegistryConfig;

/// How long one registry call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest answer read. Schemas are kilobytes; a few MiB leaves room for very large ones.
pub const MAX_ANSWER: usize = 4 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    #[error("schema registry {url} unavailable: {reason}")]
    Unavailable { url: String, reason: String },
    #[error("schema registry {url} refused outboxd's credentials (HTTP {status}); check --schema-registry-user and --schema-registry-password-file")]
    Refused { url: String, status: u16 },
    #[error("no schema is registered under subject {subject:?} in {url} (register one, e.g. POST {url}/subjects/{subject}/versions)")]
    Missing { url: String, subject: String },
    #[error("the schema is not registered under subject {subject:?} in {url} (register it, or run with --schema-auto-register)")]
    NotRegistered { url: String, subject: String },
    #[error("registry {url} refused the schema for subject {subject:?} as incompatible with the subject's versions: {message}")]
    Incompatible { url: String, subject: String, message: String },
    #[error("registry {url} refused the schema for subject {subject:?} as invalid: {message}")]
    Invalid { url: String, subject: String, message: String },
}

impl RegistryError {
    /// The bad-event reason code of an answer about the schema or subject itself; `None` for
    /// an outage or refused credentials.
    pub fn bad_event_code(&self) -> Option<&'static str> {
        match self {
            RegistryError::Missing { .. } | RegistryError::NotRegistered { .. } => Some("schema_missing"),
            RegistryError::Incompatible { .. } => Some("schema_incompatible"),
            RegistryError::Invalid { .. } => Some("schema_invalid"),
            RegistryError::Unavailable { .. } | RegistryError::Refused { .. } => None,
        }
    }
}

/// The warning for credentials sent in clear text: a user (and password) with an `http://`
/// registry URL, which anyone on the path can read from every call's `Authorization` header.
/// Logged once at start; `None` with `https://` or without a user.
pub fn cleartext_credentials(cfg: &RegistryConfig) -> Option<String> {
    let user = cfg.user.as_ref()?;
    (cfg.url.scheme() == "http").then(|| {
        format!(
            "--schema-registry-url {} is http://: the basic-auth credentials of --schema-registry-user {user:?} cross the network in clear text on every call; use https:// (with --schema-registry-ca-file for a private CA)",
            crate::secret::mask_url(cfg.url.as_str())
        )
    })
}

/// What `POST /subjects/{subject}` and `POST /subjects/{subject}/versions` answer: the id.
#[derive(Deserialize)]
struct IdAnswer {
    id: u32,
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

/// What `GET /schemas/ids/{id}` answers: the schema's text and type (no id).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ById {
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
            shown: crate::secret::mask_url(cfg.url.as_str().trim_end_matches('/')),
            client,
            user: cfg.user.clone(),
            password: cfg.password.as_ref().map(|p| p.expose().to_owned()),
        })
    }

    /// The registry's URL for messages, secrets masked.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The latest version registered under `subject`.
    pub async fn latest(&self, subject: &str) -> Result<Registered, RegistryError> {
        let body = self.call(reqwest::Method::GET, &["subjects", subject, "versions", "latest"], None, subject).await?;
        serde_json::from_slice::<Registered>(&body).map_err(|e| self.unavailable(format!("unreadable answer: {e}")))
    }

    /// The schema registered under `id` (`GET /schemas/ids/{id}`), for a reader of the wire
    /// format. An id the registry does not know (404, `error_code` 40403) is
    /// [`RegistryError::NotRegistered`] with the subject `schema id N`; a 404 that is not the
    /// registry's is [`RegistryError::Unavailable`], as for every call.
    pub async fn by_id(&self, id: u32) -> Result<ById, RegistryError> {
        let id_text = id.to_string();
        let name = format!("schema id {id}");
        // `json` is None, so a 40401/40403 answer reads as Missing or NotRegistered; both mean
        // the id is unknown here.
        let body =
            self.call(reqwest::Method::GET, &["schemas", "ids", &id_text], None, &name).await.map_err(|e| match e {
                RegistryError::Missing { url, subject } => RegistryError::NotRegistered { url, subject },
                other => other,
            })?;
        serde_json::from_slice::<ById>(&body).map_err(|e| self.unavailable(format!("unreadable answer: {e}")))
    }

    /// The id of `schema` (of the registry's `schema_type`) under `subject`, which must hold it
    /// already (Confluent's serializers with `auto.register.schemas=false`).
    pub async fn lookup(&self, subject: &str, schema: &str, schema_type: &str) -> Result<u32, RegistryError> {
        let req = serde_json::json!({"schema": schema, "schemaType": schema_type});
        let body = self.call(reqwest::Method::POST, &["subjects", subject], Some(&req), subject).await?;
        Ok(serde_json::from_slice::<IdAnswer>(&body)
            .map_err(|e| self.unavailable(format!("unreadable answer: {e}")))?
            .id)
    }

    /// Register `schema` under `subject` (a no-op answering the id when it is there already).
    pub async fn register(&self, subject: &str, schema: &str, schema_type: &str) -> Result<u32, RegistryError> {
        let req = serde_json::json!({"schema": schema, "schemaType": schema_type});
        let body = self.call(reqwest::Method::POST, &["subjects", subject, "versions"], Some(&req), subject).await?;
        Ok(serde_json::from_slice::<IdAnswer>(&body)
            .map_err(|e| self.unavailable(format!("unreadable answer: {e}")))?
            .id)
    }

    /// One call below the API root; the answer's body on success, else the classified error.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &[&str],
        json: Option<&serde_json::Value>,
        subject: &str,
    ) -> Result<bytes::Bytes, RegistryError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|_| self.unavailable("the URL cannot have a path".into()))?
            .pop_if_empty()
            .extend(path);
        let mut req = self
            .client
            .request(method, url)
            .header("Accept", "application/vnd.schemaregistry.v1+json, application/json");
        if let Some(body) = json {
            req = req.header("Content-Type", "application/vnd.schemaregistry.v1+json").body(body.to_string());
        }
        if let Some(user) = &self.user {
            req = req.basic_auth(user, self.password.as_ref());
        }
        let resp = req.send().await.map_err(|e| self.unavailable(e.without_url().to_string()))?;
        let status = resp.status();
        if status.is_success() {
            return self.body(resp).await;
        }
        let url = self.shown.clone();
        let subject = subject.to_owned();
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                Err(RegistryError::Refused { url, status: status.as_u16() })
            }
            StatusCode::NOT_FOUND => {
                match self.error_body(resp).await {
                    // 40401: no such subject; 40402: no such version. A lookup of a schema
                    // (`json` given) in a missing subject means the schema is not registered.
                    Some(b) if (b.error_code == 40401 || b.error_code == 40402) && json.is_none() => {
                        Err(RegistryError::Missing { url, subject })
                    }
                    Some(b) if b.error_code == 40401 || b.error_code == 40403 => {
                        Err(RegistryError::NotRegistered { url, subject })
                    }
                    // A 404 that is not the registry's: a wrong URL path.
                    _ => Err(self
                        .unavailable("HTTP 404 (is the URL the registry's API root, e.g. …/apis/ccompat/v7?)".into())),
                }
            }
            StatusCode::CONFLICT => {
                let message = self.error_body(resp).await.map(|b| b.message).unwrap_or_default();
                Err(RegistryError::Incompatible { url, subject, message: first_line(&message) })
            }
            StatusCode::UNPROCESSABLE_ENTITY => {
                let message = self.error_body(resp).await.map(|b| b.message).unwrap_or_default();
                Err(RegistryError::Invalid { url, subject, message: first_line(&message) })
            }
            _ => {
                let b = self.error_body(resp).await;
                let detail = b.map(|b| format!(": {} (error_code {})", b.message, b.error_code)).unwrap_or_default();
                Err(self.unavailable(format!("HTTP {}{detail}", status.as_u16())))
            }
        }
    }

    fn unavailable(&self, reason: String) -> RegistryError {
        RegistryError::Unavailable { url: self.shown.clone(), reason }
    }

    /// The answer's body, read to at most [`MAX_ANSWER`] bytes: a longer one (by its
    /// Content-Length, or once that many bytes arrived) is an error, not memory.
    async fn body(&self, mut resp: reqwest::Response) -> Result<bytes::Bytes, RegistryError> {
        let too_long = || {
            self.unavailable(format!("the answer is longer than {} MiB; is the URL the registry's?", MAX_ANSWER >> 20))
        };
        if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
            return Err(too_long());
        }
        let mut body = bytes::BytesMut::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.unavailable(e.without_url().to_string()))? {
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(too_long());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    }

    /// A refusal's `{error_code, message}`, when its body (bounded too) is one.
    async fn error_body(&self, resp: reqwest::Response) -> Option<ErrorBody> {
        serde_json::from_slice(&self.body(resp).await.ok()?).ok()
    }
}

/// A registry message cut to its first line and 300 characters (they can quote whole schemas).
fn first_line(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default();
    match line.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;
    use crate::format::{Format, SubjectStrategy};

    /// A real HTTP server on loopback answering every request with `status` and `body`, with a
    /// Content-Length or (`chunked`) without one; its URL.
    fn server(status: u16, body: Vec<u8>, chunked: bool) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming().take(8) {
                let Ok(mut conn) = conn else { continue };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                let _ = if chunked {
                    write!(conn, "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
                        .and_then(|()| {
                            for part in body.chunks(64 << 10) {
                                write!(conn, "{:x}\r\n", part.len())?;
                                conn.write_all(part)?;
                                conn.write_all(b"\r\n")?;
                            }
                            conn.write_all(b"0\r\n\r\n")
                        })
                } else {
                    write!(conn, "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())
                        .and_then(|()| conn.write_all(&body))
                };
            }
        });
        format!("http://{addr}/api?apikey=s3cr3t-key")
    }

    fn registry(url: &str) -> Registry {
        Registry::new(&cfg(url)).unwrap()
    }

    fn cfg(url: &str) -> RegistryConfig {
        RegistryConfig {
            url: Url::parse(url).unwrap(),
            user: None,
            password: None,
            ca_file: None,
            value: Some(Format::Avro),
            key: None,
            strategy: SubjectStrategy::Topic,
            auto_register: false,
            schema_dir: None,
        }
    }

    /// A schema answer as JSON, padded with spaces to `len` bytes.
    fn answer(len: usize) -> Vec<u8> {
        let mut b = br#"{"id": 7, "schema": "\"string\""}"#.to_vec();
        b.resize(len, b' ');
        b
    }

    #[tokio::test]
    async fn answers_are_read_to_a_bound_and_the_url_is_masked() {
        // Just under the bound: read.
        let r = registry(&server(200, answer(MAX_ANSWER), false));
        assert_eq!(r.latest("s").await.unwrap().id, 7);
        // Over it, said by Content-Length or only by the bytes: refused, with the limit named.
        for chunked in [false, true] {
            for status in [200, 500] {
                let r = registry(&server(status, answer(MAX_ANSWER + 1), chunked));
                let e = r.latest("s").await.unwrap_err().to_string();
                if status == 200 {
                    assert!(e.contains("longer than 4 MiB"), "{e}");
                }
                assert!(e.contains("apikey=****") && !e.contains("s3cr3t"), "{e}");
                assert!(!e.contains('\n') && e.len() < 400, "{e}");
            }
        }
    }

    #[test]
    fn credentials_over_http_are_warned_of_once_https_not() {
        let mut cfg = cfg("http://r:8081");
        assert_eq!(cleartext_credentials(&cfg), None, "no user, no warning");
        cfg.user = Some("outboxd".into());
        let w = cleartext_credentials(&cfg).unwrap();
        assert!(w.contains("clear text") && w.contains("https://"), "{w}");
        cfg.url = Url::parse("https://r:8081?token=abc").unwrap();
        assert_eq!(cleartext_credentials(&cfg), None);
    }
}
