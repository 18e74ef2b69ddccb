//! The HTTP webhook sink's settings (`--sink http`): the URL template, the CloudEvents source, the
//! signing secret, batching, lanes and the request timeout.
//!
//! `--http-url` may carry `user:password@`: [`HttpConfig::new`] moves it out of the URL into
//! [`HttpConfig::basic_auth`], so the URL the sink requests (and that reqwest puts into its error
//! messages) never holds it; [`HttpConfig::url_masked`] is what `outboxd config` prints. The signing
//! secret is read once here and only its file's path is ever shown ([`SigningSecret`]'s `Debug`).

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Url;

use crate::error::Definite;
use crate::secret::{shown_url, url_or_file};

/// The placeholder for the router's topic in `--http-url`.
pub const TOPIC_PLACEHOLDER: &str = "${topic}";
/// Most events per request body with `--http-batch`.
pub const MAX_BATCH: usize = 10_000;
/// Most lanes (requests in flight at once).
pub const MAX_CONCURRENCY: usize = 1024;

#[derive(Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// The template as given, password included (shown only through [`HttpConfig::url_masked`]).
    pub url: String,
    /// The template without its userinfo; `${topic}` still in it.
    pub target: String,
    /// User and password from the URL's userinfo, sent as `Authorization: Basic`.
    pub basic_auth: Option<BasicAuth>,
    /// CloudEvents `source` (`ce-source`); `outboxd/<slot>` unless `--http-source` says otherwise.
    pub source: String,
    pub signing_secret: Option<SigningSecret>,
    /// Events per request: 1 sends one event per POST (binary mode), more a JSON batch.
    pub batch: usize,
    /// Lanes, each with one request in flight; a key always uses the same lane.
    pub concurrency: usize,
    /// Whole-request deadline (connect, send, response head and body).
    pub timeout: Duration,
    /// `--http-bad-event-status`: the 4xx answers that make an event bad; other 4xx are retried.
    pub bad_event_status: Vec<u16>,
    /// `--http-signature-version v1`: sign the body only (the old scheme); v2 otherwise.
    pub signature_v1: bool,
}

/// User and optional password for `Authorization: Basic`.
pub type BasicAuth = (String, Option<String>);

/// `--http-signing-secret-file`: the path (shown) and the key (never shown).
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret {
    pub path: PathBuf,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningSecret({})", self.path.display())
    }
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("url", &self.url_masked())
            .field("source", &self.source)
            .field("signing_secret", &self.signing_secret)
            .field("batch", &self.batch)
            .field("concurrency", &self.concurrency)
            .field("timeout", &self.timeout)
            .field("bad_event_status", &self.bad_event_status)
            .field("signature_v1", &self.signature_v1)
            .finish()
    }
}

/// The raw flag values [`HttpConfig::new`] checks.
pub struct HttpArgs<'a> {
    pub url: &'a str,
    pub source: Option<&'a str>,
    pub slot: &'a str,
    pub signing_secret_file: Option<&'a std::path::Path>,
    pub batch: usize,
    pub concurrency: usize,
    pub timeout: Duration,
    pub bad_event_status: &'a str,
    /// `--http-signature-version`: `v2` or `v1`.
    pub signature_version: &'a str,
    /// `--sink http`: the URL must be usable. Otherwise only the numbers are checked (the URL's
    /// default is empty) so other sinks never fail on HTTP flags they do not use.
    pub required: bool,
}

impl HttpConfig {
    pub fn new(a: HttpArgs<'_>) -> Result<HttpConfig, Definite> {
        let bad = |m: String| Definite::Config(m);
        if a.batch == 0 || a.batch > MAX_BATCH {
            return Err(bad(format!("--http-batch {} must be 1 to {MAX_BATCH}", a.batch)));
        }
        if a.concurrency == 0 || a.concurrency > MAX_CONCURRENCY {
            return Err(bad(format!("--http-concurrency {} must be 1 to {MAX_CONCURRENCY}", a.concurrency)));
        }
        if a.timeout.is_zero() {
            return Err(bad("--http-timeout must be greater than 0".into()));
        }
        let source = match a.source {
            Some("") => return Err(bad("--http-source is empty; give a URI-reference such as outboxd/orders".into())),
            Some(s) if s.chars().any(char::is_control) => {
                return Err(bad(format!(
                    "--http-source {s:?} has control characters, which the ce-source header cannot carry"
                )))
            }
            Some(s) => s.to_owned(),
            None => format!("outboxd/{}", a.slot),
        };
        let (target, basic_auth) = if a.url.is_empty() {
            if a.required {
                return Err(bad(
                    "--http-url is required with --sink http, e.g. https://hooks.example.com/outbox/${topic}".into(),
                ));
            }
            (String::new(), None)
        } else {
            split_userinfo(a.url)?
        };
        let signing_secret = match a.signing_secret_file {
            None => None,
            Some(p) => Some(SigningSecret { path: p.to_owned(), key: read_secret(p)? }),
        };
        Ok(HttpConfig {
            url: a.url.to_owned(),
            target,
            basic_auth,
            source,
            signing_secret,
            batch: a.batch,
            concurrency: a.concurrency,
            timeout: a.timeout,
            bad_event_status: parse_statuses(a.bad_event_status)?,
            signature_v1: match a.signature_version {
                "v2" => false,
                "v1" => true,
                other => {
                    return Err(bad(format!(
                        "--http-signature-version {other:?} is not v2 or v1; v2 signs the path and headers too, v1 the body only"
                    )))
                }
            },
        })
    }

    /// Whether a 4xx `status` judges the event (bad event) rather than the receiver (retry).
    pub fn is_bad_event_status(&self, status: u16) -> bool {
        self.bad_event_status.contains(&status)
    }

    /// The URL template with any password, secret query value and the path after its first
    /// segment (a webhook's key, commonly) replaced by `****` ([`crate::secret::mask_webhook_url`]).
    pub fn url_masked(&self) -> String {
        crate::secret::mask_webhook_url(&self.url)
    }

    /// The URL for `topic`: the template with `${topic}` replaced by the topic, percent-encoded
    /// as one path segment (so `/`, `?`, `#` and spaces in a topic cannot change the URL's shape).
    pub fn url_for(&self, topic: &str) -> Result<Url, String> {
        let encoded = percent_encoding::utf8_percent_encode(topic, SEGMENT).to_string();
        let text = self.target.replace(TOPIC_PLACEHOLDER, &encoded);
        Url::parse(&text).map_err(|e| format!("--http-url with topic {topic:?} is not a valid URL: {e}"))
    }
}

/// Everything but RFC 3986's unreserved characters is encoded in a topic's path segment.
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Check the template and move its userinfo into basic-auth credentials.
fn split_userinfo(url: &str) -> Result<(String, Option<BasicAuth>), Definite> {
    let masked = crate::secret::mask_webhook_url(url);
    let bad = |why: String| {
        Definite::Config(format!(
            "--http-url {masked:?}: {why}; give http(s)://[user:password@]host[:port]/path, optionally with ${{topic}}"
        ))
    };
    // Parsed with a sample topic in place: the template itself need not be a URL (`${` in a host).
    let mut parsed = Url::parse(&url.replace(TOPIC_PLACEHOLDER, "topic")).map_err(|e| bad(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(format!("scheme {:?} is not http or https", parsed.scheme())));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host".into()));
    }
    let host_part = url.split_once("://").map_or("", |(_, rest)| rest);
    let authority = &host_part[..host_part.find(['/', '?', '#']).unwrap_or(host_part.len())];
    if authority.contains(TOPIC_PLACEHOLDER) {
        return Err(bad("${topic} may appear in the path or query, not in the host".into()));
    }
    let auth = if parsed.username().is_empty() && parsed.password().is_none() {
        None
    } else {
        let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
        let user = decode(parsed.username());
        let pass = parsed.password().map(decode);
        // Both succeed on an http(s) URL with a host.
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        Some((user, pass))
    };
    // The template minus its userinfo: cut the text, keeping `${topic}` as written.
    let target = match (auth.is_some(), authority.rfind('@')) {
        (true, Some(at)) => {
            let scheme_end = url.len() - host_part.len();
            format!("{}{}", &url[..scheme_end], &host_part[at + 1..])
        }
        _ => url.to_owned(),
    };
    Ok((target, auth))
}

/// `--http-bad-event-status`: comma-separated 4xx codes other than 408 and 429 (those two are
/// always retried); empty means no answer makes an event bad.
fn parse_statuses(text: &str) -> Result<Vec<u16>, Definite> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let code: u16 = part.parse().ok().filter(|c| (400..500).contains(c) && *c != 408 && *c != 429).ok_or_else(|| {
            Definite::Config(format!(
                "--http-bad-event-status {text:?}: {part:?} is not a 4xx status other than 408 and 429; give codes such as 400,413,415,422"
            ))
        })?;
        if !out.contains(&code) {
            out.push(code);
        }
    }
    Ok(out)
}

fn read_secret(p: &std::path::Path) -> Result<Vec<u8>, Definite> {
    let mut key = std::fs::read(p)
        .map_err(|e| Definite::Config(format!("--http-signing-secret-file {}: cannot read it ({e})", p.display())))?;
    if key.last() == Some(&b'\n') {
        key.pop();
        if key.last() == Some(&b'\r') {
            key.pop();
        }
    }
    if key.len() < 16 {
        return Err(Definite::Config(format!(
            "--http-signing-secret-file {}: the secret has fewer than 16 bytes; use a long random string",
            p.display()
        )));
    }
    Ok(key)
}

/// The flags of `--sink http`.
#[derive(Debug, Clone, clap::Args)]
pub struct HttpFlags {
    /// Webhook URL for --sink http; `${topic}` becomes the routed topic (one encoded path segment).
    /// `user:password@` in it is sent as basic auth and masked everywhere.
    #[arg(long, env = "OUTBOXD_HTTP_URL", hide_env_values = true, default_value = "", value_name = "URL")]
    pub http_url: String,
    /// Read --http-url from FILE (one line) instead, so its credentials stay out of argv and the
    /// environment (`ps`); only the file's path is ever shown.
    #[arg(long, env = "OUTBOXD_HTTP_URL_FILE", value_name = "FILE", conflicts_with = "http_url")]
    pub http_url_file: Option<PathBuf>,
    /// CloudEvents `source` (header ce-source) of every event; default outboxd/<slot>.
    #[arg(long, env = "OUTBOXD_HTTP_SOURCE", value_name = "URI-REFERENCE")]
    pub http_source: Option<String>,
    /// Sign each request body with this secret (HMAC-SHA256): header Outboxd-Signature: t=...,v1=...
    #[arg(long, env = "OUTBOXD_HTTP_SIGNING_SECRET_FILE", value_name = "FILE")]
    pub http_signing_secret_file: Option<PathBuf>,
    /// Events per request: 1 posts each event alone (CloudEvents binary mode); more posts a JSON
    /// array (application/cloudevents-batch+json) that one 2xx acks whole.
    #[arg(long, env = "OUTBOXD_HTTP_BATCH", default_value_t = 1, value_name = "N")]
    pub http_batch: usize,
    /// Requests in flight at once; events of one key always share one lane, one request at a time.
    #[arg(long, env = "OUTBOXD_HTTP_CONCURRENCY", default_value_t = 8, value_name = "N")]
    pub http_concurrency: usize,
    /// Deadline for one request, response included; past it the request is retried.
    #[arg(long, env = "OUTBOXD_HTTP_TIMEOUT", default_value = "10s", value_name = "DURATION")]
    pub http_timeout: String,
    /// 4xx statuses that judge the event itself: it goes to the DLQ (or is skipped, or stops the
    /// pipeline, per --on-bad-event). Every other 4xx (401, 403, 404, 409 ...) is about the
    /// receiver, so the request is retried with backoff and /readyz says not ready meanwhile.
    #[arg(long, env = "OUTBOXD_HTTP_BAD_EVENT_STATUS", default_value = "400,413,415,422", value_name = "CODES")]
    pub http_bad_event_status: String,
    /// Signature scheme with --http-signing-secret-file: `v2` signs the path, every header outboxd
    /// sets and the body; `v1` (the old scheme, for receivers not yet moved) the body only.
    #[arg(long, env = "OUTBOXD_HTTP_SIGNATURE_VERSION", default_value = "v2", value_name = "v2|v1")]
    pub http_signature_version: String,
}

impl HttpFlags {
    /// The HTTP settings, the URL read from `--http-url-file` when given. `slot` names the default
    /// CloudEvents source; `required`: HTTP is `--sink`, so the URL must be usable.
    pub fn validate(&self, slot: &str, required: bool) -> Result<HttpConfig, Definite> {
        let url = url_or_file("--http-url-file", self.http_url_file.as_deref(), &self.http_url)?;
        HttpConfig::new(HttpArgs {
            url: &url,
            source: self.http_source.as_deref(),
            slot,
            signing_secret_file: self.http_signing_secret_file.as_deref(),
            batch: self.http_batch,
            concurrency: self.http_concurrency,
            timeout: crate::units::parse_duration("--http-timeout", &self.http_timeout)?,
            bad_event_status: &self.http_bad_event_status,
            signature_version: &self.http_signature_version,
            required,
        })
    }
}

impl HttpConfig {
    /// The flags that rebuild this, for `outboxd config`; `file`: where the URL was read from.
    pub fn show(&self, file: Option<&std::path::Path>, push: &mut dyn FnMut(&'static str, String)) {
        if !self.url.is_empty() {
            let (k, v) = shown_url(file, "http-url", "http-url-file", self.url_masked());
            push(k, v);
        }
        push("http-source", self.source.clone());
        if let Some(s) = &self.signing_secret {
            push("http-signing-secret-file", s.path.display().to_string());
        }
        push("http-batch", self.batch.to_string());
        push("http-concurrency", self.concurrency.to_string());
        push("http-timeout", crate::units::millis(self.timeout));
        push("http-signature-version", if self.signature_v1 { "v1" } else { "v2" }.to_owned());
        push("http-bad-event-status", self.bad_event_status.iter().map(u16::to_string).collect::<Vec<_>>().join(","));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str) -> Result<HttpConfig, Definite> {
        HttpConfig::new(HttpArgs {
            url,
            source: None,
            slot: "outboxd",
            signing_secret_file: None,
            batch: 1,
            concurrency: 8,
            timeout: Duration::from_secs(10),
            bad_event_status: "400,413,415,422",
            signature_version: "v2",
            required: true,
        })
    }

    #[test]
    fn userinfo_becomes_basic_auth_and_is_masked() {
        let c = cfg("https://app:s3cr%40t@hooks.example.com:8443/in/${topic}?v=1").unwrap();
        assert_eq!(c.target, "https://hooks.example.com:8443/in/${topic}?v=1");
        assert_eq!(c.basic_auth, Some(("app".into(), Some("s3cr@t".into()))));
        assert_eq!(c.url_masked(), "https://app:****@hooks.example.com:8443/in/${topic}?v=1");
        assert!(!format!("{c:?}").contains("s3cr"));
        assert_eq!(c.source, "outboxd/outboxd");
        let plain = cfg("http://127.0.0.1:9000/hook").unwrap();
        assert_eq!((plain.target.as_str(), plain.basic_auth), ("http://127.0.0.1:9000/hook", None));
    }

    #[test]
    fn the_topic_is_one_encoded_path_segment() {
        let c = cfg("http://h/in/${topic}/x").unwrap();
        assert_eq!(c.url_for("order.paid-v1_x~").unwrap().as_str(), "http://h/in/order.paid-v1_x~/x");
        assert_eq!(c.url_for("a/b?c#d é").unwrap().as_str(), "http://h/in/a%2Fb%3Fc%23d%20%C3%A9/x");
    }

    #[test]
    fn bad_urls_name_the_flag_and_hide_the_password() {
        for bad in ["", "ftp://h/x", "http://", "not a url", "http://${topic}.example.com/", "nats://u:pw@h"] {
            let e = cfg(bad).unwrap_err().to_string();
            assert!(e.contains("--http-url") && !e.contains("pw@") && !e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn numbers_and_secret_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, "0123456789abcdef-secret\n").unwrap();
        fn args(batch: usize, concurrency: usize, file: Option<&std::path::Path>) -> HttpArgs<'_> {
            HttpArgs {
                url: "http://h/x",
                source: Some("src"),
                slot: "s",
                signing_secret_file: file,
                batch,
                concurrency,
                timeout: Duration::from_secs(1),
                bad_event_status: "400,413,415,422",
                signature_version: "v2",
                required: true,
            }
        }
        assert!(HttpConfig::new(args(0, 1, None)).unwrap_err().to_string().contains("--http-batch"));
        assert!(HttpConfig::new(args(1, 0, None)).unwrap_err().to_string().contains("--http-concurrency"));
        let e = HttpConfig::new(args(1, 1, Some(&short))).unwrap_err().to_string();
        assert!(e.contains("fewer than 16") && !e.contains("abc"), "{e}");
        let c = HttpConfig::new(args(5, 2, Some(&good))).unwrap();
        assert_eq!(c.signing_secret.as_ref().unwrap().key, b"0123456789abcdef-secret");
        assert!(!format!("{c:?}").contains("0123456789abcdef"));
        assert_eq!(c.source, "src");
        let e = HttpConfig::new(HttpArgs { source: Some("a\nb"), ..args(1, 1, None) }).unwrap_err().to_string();
        assert!(e.contains("--http-source"), "{e}");
    }

    #[test]
    fn bad_event_statuses_are_4xx_codes_but_408_and_429() {
        let with = |codes| HttpConfig::new(HttpArgs { bad_event_status: codes, ..args_for("http://h/x") });
        let c = with(" 400, 422,400 ").unwrap();
        assert_eq!(c.bad_event_status, vec![400, 422]);
        assert!(c.is_bad_event_status(422) && !c.is_bad_event_status(401) && !c.is_bad_event_status(409));
        assert!(with("").unwrap().bad_event_status.is_empty());
        for bad in ["408", "429", "500", "399", "4xx", "400;401"] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.contains("--http-bad-event-status") && e.contains("400,413,415,422"), "{bad}: {e}");
        }
    }

    fn args_for(url: &str) -> HttpArgs<'_> {
        HttpArgs {
            url,
            source: None,
            slot: "s",
            signing_secret_file: None,
            batch: 1,
            concurrency: 1,
            timeout: Duration::from_secs(1),
            bad_event_status: "400,413,415,422",
            signature_version: "v2",
            required: true,
        }
    }
}
