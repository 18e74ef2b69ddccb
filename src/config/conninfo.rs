//! libpq's two connection-string forms, read the way libpq reads them (`conninfo_parse` and
//! `conninfo_uri_parse_options` in `fe-connect.c`), into `(keyword, value)` pairs in order.
//!
//! * URI: `postgres[ql]://[user[:password]@][host][:port][,...][/dbname][?param=value&...]`.
//!   Every part is percent-decoded; an escape that is not two hex digits, or `%00`, is an error.
//!   Hosts may be `[IPv6]`; `host:port` pairs separated by commas become one `host` and one
//!   `port` list, as libpq stores them (`a:1,b` is `host=a,b port=1,`). `ssl=true` is libpq's
//!   JDBC alias of `sslmode=require`.
//! * key/value: `key = value` separated by white space; a value is single-quoted or ends at white
//!   space, and `\` escapes the next character in both.
//!
//! Invariants: a keyword libpq does not know is an error naming it (libpq refuses it too);
//! error messages never contain a password or a query value, only keywords and the part of the
//! URI that is wrong when that part cannot hold a secret. Empty values are kept (the caller
//! treats them as libpq does); a keyword given twice is kept twice, and the last one counts.

/// Every keyword libpq (PostgreSQL 18) accepts; which of them outboxd supports is decided by
/// the caller ([`super::postgres`]).
pub const LIBPQ_KEYWORDS: &[&str] = &[
    "service",
    "user",
    "password",
    "passfile",
    "channel_binding",
    "connect_timeout",
    "dbname",
    "host",
    "hostaddr",
    "port",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "sslmode",
    "sslnegotiation",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslcertmode",
    "sslpassword",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "sslkeylogfile",
    "requirepeer",
    "require_auth",
    "min_protocol_version",
    "max_protocol_version",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "gssencmode",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "replication",
    "target_session_attrs",
    "load_balance_hosts",
    "scram_client_key",
    "scram_server_key",
    "oauth_issuer",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
];

/// Whether `s` is in libpq's URI form (the prefixes are case-sensitive in libpq).
pub fn is_uri(s: &str) -> bool {
    s.starts_with("postgresql://") || s.starts_with("postgres://")
}

/// The pairs of a connection string in either form.
pub fn parse(s: &str) -> Result<Vec<(String, String)>, String> {
    let pairs = if is_uri(s) { parse_uri(s)? } else { parse_keywords(s)? };
    for (k, _) in &pairs {
        if !LIBPQ_KEYWORDS.contains(&k.as_str()) {
            return Err(format!("unknown parameter {k:?} (libpq has no such connection parameter); remove it"));
        }
    }
    Ok(pairs)
}

/// libpq's `keyword = value` form.
fn parse_keywords(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    loop {
        while it.next_if(|c| c.is_ascii_whitespace()).is_some() {}
        if it.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = it.next_if(|c| *c != '=' && !c.is_ascii_whitespace()) {
            key.push(c);
        }
        while it.next_if(|c| c.is_ascii_whitespace()).is_some() {}
        if it.next() != Some('=') {
            return Err(format!(
                "missing \"=\" after {key:?}; give a URL like postgres://user@host:5432/db or key=value pairs like host=db dbname=app"
            ));
        }
        while it.next_if(|c| c.is_ascii_whitespace()).is_some() {}
        let mut val = String::new();
        if it.next_if_eq(&'\'').is_some() {
            loop {
                match it.next() {
                    Some('\\') => val.extend(it.next()),
                    Some('\'') => break,
                    Some(c) => val.push(c),
                    None => return Err(format!("the quoted value of {key} has no closing quote")),
                }
            }
        } else {
            while let Some(c) = it.next_if(|c| !c.is_ascii_whitespace()) {
                if c == '\\' {
                    val.extend(it.next());
                } else {
                    val.push(c);
                }
            }
        }
        out.push((key, val));
    }
}

/// libpq's percent-decoding of one URI part; `what` names the part in errors, and `show` says
/// whether the part may be quoted (never a password or a query value).
fn decode(text: &str, what: &str, show: bool) -> Result<String, String> {
    let shown = if show { format!(" {text:?}") } else { String::new() };
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let hex = |j: usize| b.get(j).and_then(|c| (*c as char).to_digit(16));
        let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
            return Err(format!(
                "the {what}{shown} has a % that is not followed by two hex digits; write a literal % as %25"
            ));
        };
        let c = (hi << 4 | lo) as u8;
        if c == 0 {
            return Err(format!("the {what}{shown} holds %00, which libpq forbids"));
        }
        out.push(c);
        i += 3;
    }
    String::from_utf8(out).map_err(|_| format!("the {what}{shown} is not UTF-8 once percent-decoded"))
}

/// libpq's URI form.
fn parse_uri(s: &str) -> Result<Vec<(String, String)>, String> {
    let rest = s.strip_prefix("postgresql://").or_else(|| s.strip_prefix("postgres://")).unwrap_or(s);
    let b = rest.as_bytes();
    let mut out: Vec<(String, String)> = Vec::new();
    let mut p = 0;
    // Credentials: libpq looks ahead for '@' up to the first '/' only (not '?').
    let at = b.iter().position(|c| *c == b'@' || *c == b'/').filter(|i| b[*i] == b'@');
    if let Some(at) = at {
        let cred = &rest[..at];
        let (user, password) = match cred.split_once(':') {
            Some((u, pw)) => (u, Some(pw)),
            None => (cred, None),
        };
        if !user.is_empty() {
            out.push(("user".into(), decode(user, "user name", true)?));
        }
        if let Some(pw) = password.filter(|pw| !pw.is_empty()) {
            out.push(("password".into(), decode(pw, "password", false)?));
        }
        p = at + 1;
    }
    // Hosts and ports, comma-separated.
    let (mut hosts, mut ports) = (String::new(), String::new());
    let mut end: Option<u8>;
    loop {
        let host;
        if b.get(p) == Some(&b'[') {
            let start = p + 1;
            let Some(close) = b[start..].iter().position(|c| *c == b']').map(|i| start + i) else {
                return Err("an IPv6 host address has no closing \"]\"".into());
            };
            if close == start {
                return Err("an IPv6 host address may not be empty (\"[]\")".into());
            }
            host = &rest[start..close];
            p = close + 1;
            if let Some(&c) = b.get(p) {
                if !matches!(c, b':' | b'/' | b'?' | b',') {
                    return Err(format!(
                        "unexpected {:?} after the IPv6 host address [{host}]; expected \":\" (a port), \"/\" or \"?\"",
                        c as char
                    ));
                }
            }
        } else {
            let start = p;
            while p < b.len() && !matches!(b[p], b':' | b'/' | b'?' | b',') {
                p += 1;
            }
            host = &rest[start..p];
        }
        hosts.push_str(host);
        end = b.get(p).copied();
        if end == Some(b':') {
            let start = p + 1;
            p = start;
            while p < b.len() && !matches!(b[p], b'/' | b'?' | b',') {
                p += 1;
            }
            ports.push_str(&rest[start..p]);
            end = b.get(p).copied();
        }
        if end != Some(b',') {
            break;
        }
        p += 1;
        hosts.push(',');
        ports.push(',');
    }
    if !hosts.is_empty() {
        out.push(("host".into(), decode(&hosts, "host", true)?));
    }
    if !ports.is_empty() {
        out.push(("port".into(), decode(&ports, "port", true)?));
    }
    if end == Some(b'/') {
        let start = p + 1;
        p = start;
        while p < b.len() && b[p] != b'?' {
            p += 1;
        }
        let db = &rest[start..p];
        if !db.is_empty() {
            out.push(("dbname".into(), decode(db, "database name", true)?));
        }
        end = b.get(p).copied();
    }
    if end == Some(b'?') {
        // As libpq: parameters end at '&' or the end; a trailing '&' ends the list, an empty
        // parameter between two is an error.
        let mut q = &rest[p + 1..];
        while !q.is_empty() {
            let (param, next) = q.split_once('&').unwrap_or((q, ""));
            q = next;
            let mut kv = param.splitn(3, '=');
            let key = kv.next().unwrap_or_default();
            let Some(value) = kv.next() else {
                let key = decode(key, "query parameter name", true)?;
                return Err(format!("the query parameter {key:?} has no \"=\"; write {key}=VALUE"));
            };
            let key = decode(key, "query parameter name", true)?;
            if kv.next().is_some() {
                return Err(format!(
                    "the query parameter {key:?} has a second \"=\"; percent-encode it in the value as %3D"
                ));
            }
            let value = decode(value, &format!("value of {key}"), false)?;
            if key == "ssl" && value == "true" {
                out.push(("sslmode".into(), "require".into()));
            } else {
                out.push((key, value));
            }
        }
    }
    Ok(out)
}
