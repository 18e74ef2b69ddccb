//! Secrets in sink URLs: the one masker every sink URL passes through before it is shown (logs,
//! errors, `outboxd config`, `Debug`), and the reader of the `--*-url-file` options that keep a
//! URL out of argv and the environment (so out of `ps` and `/proc/PID/environ`), and of the
//! `--*-password-file` style options ([`read_secret_file`]). It stands on the ground floor, beside
//! [`crate::error`], so that `config`, `format` and the sinks all reach it downward.
//!
//! Invariants of [`mask_url`]: a userinfo password, a lone userinfo where it is a credential (a
//! NATS token, a Redis password; not an AMQP or HTTP user name) and the value of every query parameter whose name says secret ([`is_secret_name`])
//! come out as `****`; nothing else changes, so a masked URL still says where outboxd connects.
//! A webhook URL is a capability: its path often is the secret (`/services/T…/B…/XXXX`), so
//! [`mask_webhook_url`] masks too every path segment after the first, except `${topic}`.
//! A URL read from a file is shown by its file's path only (each config's `url_file`).

use std::path::Path;

use crate::error::Definite;

/// Shown instead of a secret value, wherever outboxd prints one.
pub const MASK: &str = "****";

/// `url` with its secrets replaced by `****` (see the module doc).
pub fn mask_url(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let (scheme, rest) = url.split_at(start);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let masked = match userinfo.find(':') {
                Some(colon) => format!("{}:{MASK}", &userinfo[..colon]),
                None if !userinfo.is_empty() && lone_userinfo_is_secret(scheme) => MASK.to_owned(),
                None => userinfo.to_owned(),
            };
            format!("{masked}{}", &authority[at..])
        }
        None => authority.to_owned(),
    };
    format!("{scheme}{authority}{}", mask_query(tail))
}

/// A webhook URL (`--http-url`) masked as [`mask_url`] masks it, and with every path segment after
/// the first shown as `****`, except a `${topic}` segment: `https://hooks.slack.com/services/****/
/// ****/****`. The first segment says which receiver it is; the rest of a webhook's path is
/// commonly its key, and outboxd cannot tell a key from a name.
pub fn mask_webhook_url(url: &str) -> String {
    let masked = mask_url(url);
    let start = masked.find("://").map_or(0, |i| i + 3);
    let Some(slash) = masked[start..].find('/').map(|i| start + i) else { return masked };
    // Only the path: a `?` or `#` ends it (a `/` inside the query is not a segment).
    let end = masked[slash..].find(['?', '#']).map_or(masked.len(), |i| slash + i);
    let segments: Vec<&str> = masked[slash + 1..end].split('/').collect();
    let path: Vec<&str> = segments
        .iter()
        .enumerate()
        .map(|(i, seg)| if i == 0 || seg.is_empty() || *seg == "${topic}" { seg } else { MASK })
        .collect();
    format!("{}/{}{}", &masked[..slash], path.join("/"), &masked[end..])
}

/// Whether a userinfo without `:` is a credential under `scheme` (`nats://TOKEN@`, where redis-rs
/// reads `redis://PASSWORD@`) rather than a user name (`amqp://guest@`, `https://user@`).
fn lone_userinfo_is_secret(scheme: &str) -> bool {
    let s = scheme.trim_end_matches("://").to_ascii_lowercase();
    !matches!(s.as_str(), "amqp" | "amqps" | "http" | "https" | "postgres" | "postgresql")
}

/// A comma-separated list of URLs (NATS), each masked.
pub fn mask_url_list(urls: &str) -> String {
    urls.split(',').map(mask_url).collect::<Vec<_>>().join(",")
}

/// The path-and-query part with secret query values masked.
fn mask_query(tail: &str) -> String {
    let Some(q) = tail.find('?') else { return tail.to_owned() };
    let frag = tail[q..].find('#').map_or(tail.len(), |f| q + f);
    let pairs: Vec<String> = tail[q + 1..frag]
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if is_secret_name(name) => format!("{name}={MASK}"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{}?{}{}", &tail[..q], pairs.join("&"), &tail[frag..])
}

/// Query parameter names whose value is a credential: `pass`, `password`, `token`, `secret`,
/// `apikey`, `sig`, `auth` ... (matched case-insensitively, as parts of the name).
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["pass", "pwd", "token", "secret", "key", "sig", "auth", "credential"].iter().any(|s| n.contains(s))
}

/// The URL in `path` (one line; a trailing newline is ignored) for `flag` (`--redis-url-file`
/// ...). Errors name the flag and the path, never the file's content.
pub fn read_url_file(flag: &str, path: &Path) -> Result<String, Definite> {
    let bad = |why: String| Definite::Config(format!("{flag} {}: {why}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it ({e})")))?;
    let url = text.strip_suffix('\n').map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
    if url.trim().is_empty() || url.contains(['\n', '\r']) {
        return Err(bad("the file must hold the URL on one line".into()));
    }
    Ok(url.to_owned())
}

/// A secret file's contents without one trailing newline (as `echo` and Kubernetes secrets leave).
pub fn read_secret_file(flag: &str, path: &Path) -> Result<String, Definite> {
    let s = std::fs::read_to_string(path).map_err(|e| {
        Definite::Config(format!("{flag} {}: cannot read it ({e}); fix the path or its permissions", path.display()))
    })?;
    let s = s.strip_suffix("\r\n").or_else(|| s.strip_suffix('\n')).unwrap_or(&s);
    Ok(s.to_owned())
}

/// A sink URL: read from `file` (given with `file_flag`, `--redis-url-file` ...) when there is
/// one, else `given`.
pub fn url_or_file(file_flag: &str, file: Option<&Path>, given: &str) -> Result<String, Definite> {
    match file {
        Some(p) => read_url_file(file_flag, p),
        None => Ok(given.to_owned()),
    }
}

/// How `outboxd config` shows a sink URL: as its file's flag and path when it was read from one
/// (never the file's text), else as the URL flag with `masked`.
pub fn shown_url(
    file: Option<&Path>,
    flag: &'static str,
    file_flag: &'static str,
    masked: String,
) -> (&'static str, String) {
    file.map_or((flag, masked), |p| (file_flag, p.display().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_tokens_and_secret_query_values_are_masked() {
        for (url, want) in [
            ("redis://u:s3cr%40t@h:6379/0", "redis://u:****@h:6379/0"),
            ("rediss://:pw@h", "rediss://:****@h"),
            ("redis://pw@h/1", "redis://****@h/1"),
            ("nats://s3cr3t-token@h:4222", "nats://****@h:4222"),
            ("redis+unix:///run/redis.sock?db=1&pass=hunter2", "redis+unix:///run/redis.sock?db=1&pass=****"),
            ("https://h/in?token=abc&v=1#x", "https://h/in?token=****&v=1#x"),
            ("https://h/in?X-Api-Key=abc&Signature=def", "https://h/in?X-Api-Key=****&Signature=****"),
            ("redis://h:6379/0", "redis://h:6379/0"),
            ("unix:///run/redis.sock", "unix:///run/redis.sock"),
            ("u:p@host:4222", "u:****@host:4222"),
            ("amqp://guest@h/%2f", "amqp://guest@h/%2f"),
            ("https://user@h/in", "https://user@h/in"),
        ] {
            assert_eq!(mask_url(url), want, "{url}");
        }
        assert_eq!(mask_url_list("nats://a:b@h1,tls://h2,nats://tok@h3"), "nats://a:****@h1,tls://h2,nats://****@h3");
    }

    #[test]
    fn a_webhook_path_shows_its_first_segment_and_topic_only() {
        for (url, want) in [
            (
                "https://hooks.slack.com/services/T0123/B4567/XXXXsecretXXXX",
                "https://hooks.slack.com/services/****/****/****",
            ),
            ("https://u:pw@h:8443/in/${topic}?token=abc&v=1", "https://u:****@h:8443/in/${topic}?token=****&v=1"),
            ("https://discord.com/api/webhooks/123/s3cr3t/", "https://discord.com/api/****/****/****/"),
            ("http://127.0.0.1:8080/in/${topic}", "http://127.0.0.1:8080/in/${topic}"),
            ("https://h/outbox?t=${topic}&x=/a/b", "https://h/outbox?t=${topic}&x=/a/b"),
            ("https://h", "https://h"),
            ("https://h/", "https://h/"),
            ("https://h/in/s3cr3t#frag/x", "https://h/in/****#frag/x"),
        ] {
            assert_eq!(mask_webhook_url(url), want, "{url}");
        }
    }

    #[test]
    fn url_files_hold_one_line_and_errors_never_show_it() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, "redis://:hunter2@h:6379/0\r\n").unwrap();
        assert_eq!(read_url_file("--redis-url-file", &good).unwrap(), "redis://:hunter2@h:6379/0");
        let two = dir.path().join("two");
        std::fs::write(&two, "redis://:hunter2@h\nredis://other\n").unwrap();
        let e = read_url_file("--redis-url-file", &two).unwrap_err().to_string();
        assert!(e.contains("--redis-url-file") && e.contains("one line") && !e.contains("hunter2"), "{e}");
        let e = read_url_file("--nats-url-file", &dir.path().join("absent")).unwrap_err().to_string();
        assert!(e.starts_with("--nats-url-file ") && e.contains("cannot read"), "{e}");
    }
}
