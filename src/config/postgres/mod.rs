//! Where and how to reach PostgreSQL: one parsed [`PgTarget`] for both connections.
//!
//! `--postgres-url` takes a URL (`postgres://user:pass@host:port/db?sslmode=verify-full`) or a
//! libpq key/value string (`host=db port=5432 dbname=app sslmode=verify-full`), both read as libpq
//! reads them ([`super::conninfo`]); a libpq keyword outboxd does not support is refused by name.
//! Missing values fall back to libpq's environment (`PGHOST`, `PGPORT`, ...), then to libpq's
//! defaults. The password comes, in this order, from the conninfo, `--postgres-password-file`,
//! `PGPASSWORD`, then the password file (`passfile`, `PGPASSFILE`, `~/.pgpass`), which is looked
//! up for each host on its own, as libpq does.
//!
//! Invariants: the replication connection and the admin connection are both derived from the
//! one `PgTarget`, so they can never disagree; `Display` and `Debug` never show a password or a
//! key passphrase.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::pgpass;
use crate::error::Definite;
pub use crate::secret::read_secret_file;

pub(crate) mod host;
mod tls;

pub use host::PgHost;
pub(crate) use host::DEFAULT_SOCKET_DIR;
use tls::tls_settings;
pub use tls::{ChannelBindingMode, RootCert, SslMode, TlsSettings};

/// TCP keepalive settings (libpq's `keepalives*`); seconds. Defaults notice a dead peer in about
/// a minute, where the kernel's defaults would take over two hours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalives {
    pub enabled: bool,
    pub idle: Duration,
    pub interval: Duration,
    pub count: u32,
}

impl Default for Keepalives {
    fn default() -> Self {
        Keepalives { enabled: true, idle: Duration::from_secs(30), interval: Duration::from_secs(10), count: 3 }
    }
}

/// libpq's `target_session_attrs`, the kinds outboxd can use. Whatever it says, outboxd never
/// uses a server in recovery for the slot (`pg_is_in_recovery()`), so `any` and `primary` behave
/// alike; `read-write` also skips a primary whose `transaction_read_only` is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionAttrs {
    Any,
    Primary,
    ReadWrite,
}

impl SessionAttrs {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::Primary => "primary",
            SessionAttrs::ReadWrite => "read-write",
        }
    }
}

/// Where the password came from; decides how `outboxd config` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordSource {
    Conninfo,
    File(PathBuf),
    Env,
    Passfile(PathBuf),
}

/// Where and as whom to connect to PostgreSQL. `Display` omits the password.
#[derive(Clone, PartialEq, Eq)]
pub struct PgTarget {
    /// Hosts with their ports, tried in order.
    pub hosts: Vec<(PgHost, u16)>,
    /// libpq's `hostaddr`: empty, or one entry per host (then connections go to the address,
    /// and the host name is used for TLS and the password file). An empty entry (`None`) leaves
    /// its host to be reached by name, as in libpq.
    pub hostaddrs: Vec<Option<std::net::IpAddr>>,
    pub user: String,
    /// The password from the conninfo, `--postgres-password-file` or `PGPASSWORD`: every host's.
    pub password: Option<String>,
    /// Without such a password, each host's from the password file (libpq looks every host up
    /// on its own), by position in `hosts`; see [`PgTarget::password_for`].
    pub host_passwords: Vec<Option<String>>,
    pub password_source: Option<PasswordSource>,
    pub dbname: String,
    pub application_name: String,
    pub options: Option<String>,
    /// Each host and address attempt's bound (libpq's `connect_timeout`, 10 s when not given);
    /// zero: no bound of its own, as in libpq ([`PgTarget::attempt_limit`]).
    pub connect_timeout: Duration,
    pub tcp_user_timeout: Option<Duration>,
    pub keepalives: Keepalives,
    pub tls: TlsSettings,
    pub channel_binding: ChannelBindingMode,
    /// Which server of `hosts` to settle on; see [`SessionAttrs`].
    pub session_attrs: SessionAttrs,
}

/// What must be percent-encoded inside a conninfo URL's parts (dots, dashes and slashes stay readable).
const URL_RESERVED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'\'')
    .add(b',')
    .add(b'/')
    .add(b':')
    .add(b'<')
    .add(b'>')
    .add(b'=')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}')
    .add(b'+');

/// The libpq keywords outboxd reads; any other libpq keyword is refused by name.
const SUPPORTED: &[&str] = &[
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
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslrootcert",
    "sslcrl",
    "target_session_attrs",
];

/// Where a value not in the conninfo comes from.
pub struct Fallbacks<'a> {
    /// libpq environment lookup (`PGHOST`, ...); tests pass a map.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// `--postgres-password-file`.
    pub password_file: Option<&'a Path>,
}

impl Fallbacks<'_> {
    /// The process environment and no password file.
    pub fn process() -> Fallbacks<'static> {
        Fallbacks { env: &|k| std::env::var(k).ok().filter(|v| !v.is_empty()), password_file: None }
    }
}

impl PgTarget {
    /// How long one host or address attempt may take (connect, TLS, login, the primary check):
    /// `connect_timeout`, or no bound of its own when it is 0 (libpq: wait indefinitely; the
    /// supervisor's own bound on the set-up checks still ends a wait that never does).
    pub fn attempt_limit(&self) -> Option<Duration> {
        (!self.connect_timeout.is_zero()).then_some(self.connect_timeout)
    }

    /// Parse with the process environment as libpq's fallbacks.
    pub fn parse(conninfo: &str) -> Result<PgTarget, Definite> {
        PgTarget::parse_with(conninfo, &Fallbacks::process())
    }

    pub fn parse_with(conninfo: &str, fb: &Fallbacks<'_>) -> Result<PgTarget, Definite> {
        let bad = |why: String| Definite::Config(format!("--postgres-url: {why}"));
        let s = conninfo.trim();
        if !super::conninfo::is_uri(s) && s.contains("://") {
            return Err(bad(
                "must start with postgres:// or postgresql://, or be key=value pairs like host=db dbname=app".into(),
            ));
        }
        let pairs = super::conninfo::parse(s).map_err(bad)?;
        if let Some((k, _)) = pairs.iter().find(|(k, _)| !SUPPORTED.contains(&k.as_str())) {
            return Err(bad(format!("{k} is a libpq parameter outboxd does not support; remove it")));
        }
        // The last value of a keyword counts; an empty one is as good as none (as in libpq),
        // except where noted.
        let get = |k: &str| pairs.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        let env = |k: &str| (fb.env)(k);
        let given = |k: &str, e: &str| get(k).filter(|v| !v.is_empty()).or_else(|| env(e));

        let (hosts, hostaddrs) =
            hosts_of(given("host", "PGHOST"), given("hostaddr", "PGHOSTADDR"), given("port", "PGPORT")).map_err(bad)?;
        let user = given("user", "PGUSER").or_else(|| env("USER")).unwrap_or_else(|| "postgres".into());
        let dbname = given("dbname", "PGDATABASE").unwrap_or_else(|| user.clone());
        let application_name = given("application_name", "PGAPPNAME")
            .or_else(|| get("fallback_application_name").filter(|v| !v.is_empty()))
            .unwrap_or_else(|| "outboxd".into());
        let connect_timeout = match given("connect_timeout", "PGCONNECT_TIMEOUT") {
            Some(v) => Duration::from_secs(
                v.trim().parse::<u64>().map_err(|_| bad(format!("connect_timeout {v:?} is not whole seconds")))?,
            ),
            None => Duration::from_secs(10),
        };
        // libpq reads tcp_user_timeout in milliseconds; 0 leaves the system default.
        let tcp_user_timeout = match get("tcp_user_timeout").filter(|v| !v.is_empty()) {
            Some(v) => Some(Duration::from_millis(
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| bad(format!("tcp_user_timeout {v:?} is not whole milliseconds")))?,
            ))
            .filter(|d| !d.is_zero()),
            None => None,
        };
        if let Some(enc) = given("client_encoding", "PGCLIENTENCODING") {
            if !matches!(enc.to_ascii_lowercase().as_str(), "utf8" | "utf-8" | "unicode" | "auto") {
                return Err(bad(format!("client_encoding={enc}: outboxd speaks UTF8 only; remove it")));
            }
        }

        // Password: conninfo, --postgres-password-file, PGPASSWORD, then the password file.
        let (password, password_source) = if let Some(p) = get("password").filter(|p| !p.is_empty()) {
            (Some(p), Some(PasswordSource::Conninfo))
        } else if let Some(f) = fb.password_file {
            (Some(read_secret_file("--postgres-password-file", f)?), Some(PasswordSource::File(f.to_owned())))
        } else if let Some(p) = env("PGPASSWORD") {
            (Some(p), Some(PasswordSource::Env))
        } else {
            (None, None)
        };
        let mut host_passwords = Vec::new();
        let mut password_source = password_source;
        if password.is_none() {
            let file = given("passfile", "PGPASSFILE").map(PathBuf::from).or_else(default_pgpass);
            if let Some(f) = file.filter(|f| f.exists()) {
                host_passwords = pgpass::lookup_each(&f, &hosts, &dbname, &user);
                if host_passwords.iter().any(Option::is_some) {
                    password_source = Some(PasswordSource::Passfile(f));
                }
            }
        }

        let tls = tls_settings(&get, &env)?;
        let channel_binding = match given("channel_binding", "PGCHANNELBINDING").as_deref() {
            None | Some("prefer") => ChannelBindingMode::Prefer,
            Some("disable") => ChannelBindingMode::Disable,
            Some("require") => ChannelBindingMode::Require,
            Some(other) => {
                return Err(bad(format!("unknown channel_binding {other:?}; use disable, prefer or require")))
            }
        };
        if channel_binding == ChannelBindingMode::Require && tls.mode == SslMode::Disable {
            return Err(bad(
                "channel_binding=require needs TLS, but sslmode=disable; use sslmode=require or stronger".into()
            ));
        }
        let secs = |k: &str| -> Result<Option<u64>, Definite> {
            get(k)
                .map(|v| v.trim().parse::<u64>().map_err(|_| bad(format!("{k} {v:?} is not whole seconds"))))
                .transpose()
        };
        let d = Keepalives::default();
        let keepalives = Keepalives {
            enabled: get("keepalives").is_none_or(|v| v.trim() != "0"),
            idle: secs("keepalives_idle")?.filter(|s| *s > 0).map_or(d.idle, Duration::from_secs),
            interval: secs("keepalives_interval")?.filter(|s| *s > 0).map_or(d.interval, Duration::from_secs),
            count: secs("keepalives_count")?.filter(|s| *s > 0).map_or(d.count, |c| c.min(u32::MAX as u64) as u32),
        };
        let session_attrs = match get("target_session_attrs").or_else(|| env("PGTARGETSESSIONATTRS")).as_deref() {
            None | Some("any") => SessionAttrs::Any,
            Some("primary") => SessionAttrs::Primary,
            Some("read-write") => SessionAttrs::ReadWrite,
            Some(other) => {
                return Err(bad(format!(
                    "target_session_attrs={other:?}: outboxd needs the primary (the slot lives there); use any, primary or read-write"
                )))
            }
        };
        Ok(PgTarget {
            session_attrs,
            hosts,
            hostaddrs,
            user,
            password,
            host_passwords,
            password_source,
            dbname,
            application_name,
            options: given("options", "PGOPTIONS"),
            connect_timeout,
            tcp_user_timeout,
            keepalives,
            tls,
            channel_binding,
        })
    }

    /// The password for the host at `index` of `hosts`: the one given for all, or that host's
    /// password file entry.
    pub fn password_for(&self, index: usize) -> Option<&str> {
        self.password.as_deref().or_else(|| self.host_passwords.get(index)?.as_deref())
    }

    /// A URL that reconnects to the same place; the password shows as `****`, and only when it
    /// was written in the conninfo (a password file is shown as its flag instead).
    pub fn to_url_masked(&self) -> String {
        let enc = |s: &str| percent_encoding::utf8_percent_encode(s, URL_RESERVED).to_string();
        let auth = match self.password_source {
            Some(PasswordSource::Conninfo) => format!("{}:****", enc(&self.user)),
            _ => enc(&self.user),
        };
        let mut q: Vec<(String, String)> = Vec::new();
        let mut tcp = Vec::new();
        for (h, p) in &self.hosts {
            match h {
                PgHost::Tcp(h) if h.contains(':') => tcp.push(format!("[{h}]:{p}")),
                PgHost::Tcp(h) => tcp.push(format!("{}:{p}", enc(h))),
                PgHost::Unix(d) => {
                    q.push(("host".into(), d.display().to_string()));
                    q.push(("port".into(), p.to_string()));
                }
            }
        }
        if !self.hostaddrs.is_empty() {
            let a: Vec<String> = self.hostaddrs.iter().map(|a| a.map(|a| a.to_string()).unwrap_or_default()).collect();
            q.push(("hostaddr".into(), a.join(",")));
        }
        q.push(("sslmode".into(), self.tls.mode_given.as_str().into()));
        match &self.tls.root_cert {
            Some(RootCert::File(f)) => q.push(("sslrootcert".into(), f.display().to_string())),
            Some(RootCert::System) => q.push(("sslrootcert".into(), "system".into())),
            None => {}
        }
        for (k, v) in [("sslcert", &self.tls.cert), ("sslkey", &self.tls.key), ("sslcrl", &self.tls.crl)] {
            if let Some(v) = v {
                q.push((k.into(), v.display().to_string()));
            }
        }
        if self.tls.key_password.is_some() {
            q.push(("sslpassword".into(), "****".into()));
        }
        q.push((
            "channel_binding".into(),
            match self.channel_binding {
                ChannelBindingMode::Disable => "disable",
                ChannelBindingMode::Prefer => "prefer",
                ChannelBindingMode::Require => "require",
            }
            .into(),
        ));
        q.push(("application_name".into(), self.application_name.clone()));
        if self.session_attrs != SessionAttrs::Any {
            q.push(("target_session_attrs".into(), self.session_attrs.as_str().into()));
        }
        q.push(("connect_timeout".into(), self.connect_timeout.as_secs().to_string()));
        if let Some(o) = &self.options {
            q.push(("options".into(), o.clone()));
        }
        if let Some(t) = self.tcp_user_timeout {
            q.push(("tcp_user_timeout".into(), t.as_millis().to_string()));
        }
        let k = &self.keepalives;
        q.push(("keepalives".into(), if k.enabled { "1" } else { "0" }.into()));
        q.push(("keepalives_idle".into(), k.idle.as_secs().to_string()));
        q.push(("keepalives_interval".into(), k.interval.as_secs().to_string()));
        q.push(("keepalives_count".into(), k.count.to_string()));
        let query: Vec<String> =
            q.iter().map(|(k, v)| format!("{k}={}", if v == "****" { v.clone() } else { enc(v) })).collect();
        format!("postgres://{auth}@{}/{}?{}", tcp.join(","), enc(&self.dbname), query.join("&"))
    }

    /// The equivalent tokio-postgres configuration of an ordinary (non-replication) session to
    /// the host at `index` of `hosts`, its TCP connection going to `addr` (for a host name, one of
    /// its addresses). One host at a time: the hosts are tried by `pg::hosts`, as libpq tries
    /// them, each with its own password. TLS itself is set up by `pg::tls`; this only carries the
    /// mode tokio-postgres understands.
    pub fn to_tokio_postgres(&self, index: usize, addr: Option<std::net::IpAddr>) -> tokio_postgres::Config {
        use tokio_postgres::config::{ChannelBinding, SslMode as TpMode};
        let mut c = tokio_postgres::Config::new();
        if let Some((h, p)) = self.hosts.get(index) {
            match h {
                PgHost::Tcp(h) => c.host(h),
                PgHost::Unix(d) => c.host_path(d),
            };
            c.port(*p);
        }
        if let Some(a) = addr {
            c.hostaddr(a);
        }
        if let Some(limit) = self.attempt_limit() {
            c.connect_timeout(limit);
        }
        c.user(&self.user)
            .dbname(&self.dbname)
            .application_name(&self.application_name)
            .keepalives(self.keepalives.enabled)
            .keepalives_idle(self.keepalives.idle)
            .keepalives_interval(self.keepalives.interval)
            .keepalives_retries(self.keepalives.count)
            .channel_binding(match self.channel_binding {
                ChannelBindingMode::Disable => ChannelBinding::Disable,
                ChannelBindingMode::Prefer => ChannelBinding::Prefer,
                ChannelBindingMode::Require => ChannelBinding::Require,
            })
            .ssl_mode(match self.tls.mode {
                SslMode::Disable | SslMode::Allow => TpMode::Disable,
                SslMode::Prefer => TpMode::Prefer,
                _ => TpMode::Require,
            });
        if let Some(o) = &self.options {
            c.options(o);
        }
        if let Some(t) = self.tcp_user_timeout {
            c.tcp_user_timeout(t);
        }
        if let Some(p) = self.password_for(index) {
            c.password(p);
        }
        c
    }
}

impl std::fmt::Display for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .map(|(h, p)| match h {
                PgHost::Tcp(h) => format!("{h}:{p}"),
                PgHost::Unix(d) => format!("{}:{p}", d.display()),
            })
            .collect();
        write!(f, "postgres://{}@{}/{}", self.user, hosts.join(","), self.dbname)
    }
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgTarget({self}, sslmode={})", self.tls.mode.as_str())
    }
}

fn host_of(h: &str) -> PgHost {
    if h.starts_with('/') {
        PgHost::Unix(PathBuf::from(h))
    } else {
        PgHost::Tcp(h.to_owned())
    }
}

fn default_pgpass() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass"))
}

/// libpq's host, hostaddr and port lists, as hosts with ports and addresses. An empty host entry
/// is the default socket directory (or its hostaddr); an empty hostaddr entry leaves its host to
/// be reached by name; a missing port is 5432; one port serves every host.
#[allow(clippy::type_complexity)]
fn hosts_of(
    host: Option<String>,
    hostaddr: Option<String>,
    port: Option<String>,
) -> Result<(Vec<(PgHost, u16)>, Vec<Option<std::net::IpAddr>>), String> {
    let names: Vec<String> = host.map(|h| h.split(',').map(str::to_owned).collect()).unwrap_or_default();
    let mut addrs = Vec::new();
    for a in hostaddr.iter().flat_map(|a| a.split(',')) {
        addrs.push(match a.trim() {
            "" => None,
            a => Some(
                a.parse::<std::net::IpAddr>()
                    .map_err(|_| format!("hostaddr {a:?} is not a numeric IP address; put a host name in host="))?,
            ),
        });
    }
    if !names.is_empty() && !addrs.is_empty() && names.len() != addrs.len() {
        return Err(format!(
            "{} host names but {} hostaddr values; give one address per host",
            names.len(),
            addrs.len()
        ));
    }
    let n = names.len().max(addrs.len()).max(1);
    let mut hosts: Vec<PgHost> = Vec::with_capacity(n);
    for i in 0..n {
        let name = names.get(i).map(String::as_str).unwrap_or("");
        hosts.push(match (name, addrs.get(i).copied().flatten()) {
            ("", Some(ip)) => PgHost::Tcp(ip.to_string()),
            ("", None) => PgHost::Unix(PathBuf::from(DEFAULT_SOCKET_DIR)),
            (n, Some(ip)) if n.starts_with('/') => {
                return Err(format!(
                    "host {n} is a socket directory but hostaddr {ip} is given for it; give one or the other"
                ))
            }
            (n, _) => host_of(n),
        });
    }
    let mut ports = Vec::new();
    for p in port.iter().flat_map(|p| p.split(',')) {
        ports.push(match p.trim() {
            "" => 5432,
            p => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| format!("port {p:?} is not a port number"))?,
        });
    }
    let ports = match ports.len() {
        0 => vec![5432; n],
        1 => vec![ports[0]; n],
        m if m == n => ports,
        m => return Err(format!("{n} hosts but {m} ports; give one port, or one per host")),
    };
    Ok((hosts.into_iter().zip(ports).collect(), addrs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse_env(s: &str, env: &[(&str, &str)]) -> Result<PgTarget, Definite> {
        let map: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let lookup = move |k: &str| map.get(k).cloned();
        PgTarget::parse_with(s, &Fallbacks { env: &lookup, password_file: None })
    }

    #[test]
    fn multi_host_and_target_session_attrs_in_both_forms() {
        let url = parse_env("postgres://u@a:5432,b:5433/db?target_session_attrs=read-write", &[]).unwrap();
        let kv = parse_env("host=a,b port=5432,5433 user=u dbname=db target_session_attrs=read-write", &[]).unwrap();
        let want = vec![(PgHost::Tcp("a".into()), 5432), (PgHost::Tcp("b".into()), 5433)];
        assert_eq!(url.hosts, want);
        assert_eq!(kv.hosts, want);
        assert_eq!(url.session_attrs, SessionAttrs::ReadWrite);
        assert_eq!(kv.session_attrs, SessionAttrs::ReadWrite);
        let p = parse_env("host=a,b dbname=db target_session_attrs=primary", &[]).unwrap();
        assert_eq!(p.session_attrs, SessionAttrs::Primary);
        assert_eq!(parse_env("host=a dbname=db", &[]).unwrap().session_attrs, SessionAttrs::Any);
        let env = parse_env("host=a dbname=db", &[("PGTARGETSESSIONATTRS", "primary")]).unwrap();
        assert_eq!(env.session_attrs, SessionAttrs::Primary);
        // The masked URL keeps it, so `outboxd config` output reconnects the same way.
        let again = parse_env(&url.to_url_masked(), &[]).unwrap();
        assert_eq!(again.session_attrs, SessionAttrs::ReadWrite);
        assert_eq!(again.hosts, want);
        for bad in ["standby", "read-only", "prefer-standby", "nonsense"] {
            let e = parse_env(&format!("host=a,b target_session_attrs={bad}"), &[]).unwrap_err().to_string();
            assert!(e.contains("target_session_attrs") && e.contains("primary"), "{bad}: {e}");
        }
    }

    #[test]
    fn url_with_password_is_parsed_and_redacted() {
        let t = parse_env("postgres://bob:s%40cret@db.example:6432/app?sslmode=disable", &[]).unwrap();
        assert_eq!(t.hosts, vec![(PgHost::Tcp("db.example".into()), 6432)]);
        assert_eq!((t.user.as_str(), t.dbname.as_str()), ("bob", "app"));
        assert_eq!(t.password.as_deref(), Some("s@cret"));
        let shown = format!("{t} {t:?} {}", t.to_url_masked());
        assert!(!shown.contains("s@cret") && !shown.contains("s%40cret"), "{shown}");
    }

    #[test]
    fn key_value_form_and_url_agree() {
        let kv = parse_env(r"host=db port=6000 dbname=app user=relay password='it\'s x' sslmode=disable", &[]).unwrap();
        let url = parse_env("postgresql://relay:it%27s%20x@db:6000/app?sslmode=disable", &[]).unwrap();
        assert!(kv == url, "{kv:?} vs {url:?}");
        assert_eq!(kv.password.as_deref(), Some("it's x"));
    }

    #[test]
    fn unix_socket_directory() {
        let t = parse_env("postgresql://me@/app?host=/tmp/pg&port=5544", &[]).unwrap();
        assert_eq!(t.hosts, vec![(PgHost::Unix("/tmp/pg".into()), 5544)]);
        assert_eq!(t.dbname, "app");
        assert_eq!(t.tls.mode, SslMode::Prefer);
    }

    #[test]
    fn libpq_environment_fills_gaps_but_never_overrides() {
        let env = [
            ("PGHOST", "envhost"),
            ("PGPORT", "7777"),
            ("PGUSER", "envuser"),
            ("PGDATABASE", "envdb"),
            ("PGPASSWORD", "envpw"),
            ("PGAPPNAME", "envapp"),
            ("PGCONNECT_TIMEOUT", "3"),
            ("PGSSLMODE", "disable"),
        ];
        let t = parse_env("", &env).unwrap();
        assert_eq!(t.hosts, vec![(PgHost::Tcp("envhost".into()), 7777)]);
        assert_eq!((t.user.as_str(), t.dbname.as_str(), t.application_name.as_str()), ("envuser", "envdb", "envapp"));
        assert_eq!(t.password.as_deref(), Some("envpw"));
        assert_eq!(t.password_source, Some(PasswordSource::Env));
        assert_eq!(t.connect_timeout, Duration::from_secs(3));
        assert_eq!(t.attempt_limit(), Some(Duration::from_secs(3)));
        // 0: no bound of its own, as in libpq (it was raised to 1 s).
        let zero = PgTarget::parse("postgres://u@h/db?connect_timeout=0").expect("url");
        assert_eq!(zero.attempt_limit(), None);
        assert_eq!(PgTarget::parse("postgres://u@h/db").expect("url").attempt_limit(), Some(Duration::from_secs(10)));
        assert_eq!(t.tls.mode, SslMode::Disable);
        let t = parse_env("host=h port=1 user=u dbname=d password=p sslmode=prefer", &env).unwrap();
        assert_eq!(t.hosts, vec![(PgHost::Tcp("h".into()), 1)]);
        assert_eq!((t.user.as_str(), t.dbname.as_str(), t.password.as_deref()), ("u", "d", Some("p")));
        assert_eq!(t.tls.mode, SslMode::Prefer);
    }

    #[test]
    fn password_file_and_pgpass() {
        let dir = tempfile::tempdir().unwrap();
        let pwf = dir.path().join("pw");
        std::fs::write(&pwf, "from-file\n").unwrap();
        let lookup = |_: &str| None;
        let t = PgTarget::parse_with("host=h user=u", &Fallbacks { env: &lookup, password_file: Some(&pwf) }).unwrap();
        assert_eq!(t.password.as_deref(), Some("from-file"), "one trailing newline is dropped");
        assert!(!t.to_url_masked().contains("****"), "a file password is not shown as a URL password");

        let pass = dir.path().join("pgpass");
        std::fs::write(&pass, "# comment\nother:*:*:*:nope\nh:5432:app:u:pa\\:ss:word\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(0o600)).unwrap();
        let p = pass.display().to_string();
        let t = parse_env("host=h user=u dbname=app", &[("PGPASSFILE", &p)]).unwrap();
        assert_eq!(t.password_for(0), Some("pa:ss:word"));
        // Each host is looked up on its own, as libpq does.
        let t = parse_env("host=other,h user=u dbname=app", &[("PGPASSFILE", &p)]).unwrap();
        assert_eq!((t.password_for(0), t.password_for(1)), (Some("nope"), Some("pa:ss:word")));
        std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(0o644)).unwrap();
        let t = parse_env("host=h user=u dbname=app", &[("PGPASSFILE", &p)]).unwrap();
        assert_eq!(t.password_for(0), None, "a world-readable password file is ignored, as libpq does");
    }

    #[test]
    fn tls_modes_follow_libpq() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "x").unwrap();
        let ca = ca.display().to_string();
        let t = parse_env(&format!("host=h sslmode=require sslrootcert={ca}"), &[]).unwrap();
        assert_eq!(t.tls.mode, SslMode::VerifyCa, "require with a root cert verifies the chain");
        assert_eq!(t.tls.mode_given, SslMode::Require);
        let e = parse_env("host=h sslmode=verify-full", &[("HOME", "/nonexistent")]).unwrap_err().to_string();
        assert!(e.contains("sslrootcert=/path/to/ca.pem"), "{e}");
        let e = parse_env("host=h sslmode=bogus", &[]).unwrap_err().to_string();
        assert!(e.contains("verify-full"), "{e}");
        let e = parse_env("host=h sslrootcert=/no/such/ca.pem sslmode=verify-ca", &[]).unwrap_err().to_string();
        assert!(e.contains("/no/such/ca.pem") && e.contains("cannot read"), "{e}");
        let t = parse_env("host=h sslrootcert=system", &[]).unwrap();
        assert_eq!(t.tls.mode, SslMode::VerifyFull);
        assert!(parse_env("host=h sslrootcert=system sslmode=require", &[]).is_err());
        let e = parse_env("host=h sslmode=disable channel_binding=require", &[]).unwrap_err().to_string();
        assert!(e.contains("channel_binding=require"), "{e}");
    }

    #[test]
    fn masked_url_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "x").unwrap();
        let src = format!(
            "host=a,b port=1,2 user=u password=secret dbname=d sslmode=verify-full sslrootcert={} \
             application_name=x connect_timeout=4 keepalives_idle=7 channel_binding=require sslpassword=kp",
            ca.display()
        );
        let t = parse_env(&src, &[]).unwrap();
        let url = t.to_url_masked();
        assert!(!url.contains("secret") && !url.contains("kp&") && !url.ends_with("=kp"), "{url}");
        let mut again = parse_env(&url, &[]).unwrap();
        again.password = t.password.clone();
        again.password_source = t.password_source.clone();
        again.tls.key_password = t.tls.key_password.clone();
        assert!(again == t, "{url}\n{again:?}\n{t:?}");
    }

    #[test]
    fn unknown_keywords_and_bad_forms_are_refused_clearly() {
        let e = parse_env("postgres://u:pw@h/db?bogus=1", &[]).unwrap_err().to_string();
        assert!(e.contains("bogus") && !e.contains("pw"), "{e}");
        assert!(parse_env("mysql://h/db", &[]).is_err());
        assert!(parse_env("postgres://h:99999/db", &[]).is_err());
        assert!(parse_env("host=h dbname", &[]).is_err());
        assert!(parse_env("host=h password='open", &[]).is_err());
    }
}
