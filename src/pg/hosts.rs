//! Which servers a connection tries, in libpq's order, and how long each may take.
//!
//! libpq tries the hosts of a conninfo in order and, for a host name, each address it resolves
//! to. `connect_timeout` bounds each of those attempts on its own (the TCP connect, TLS, the login
//! and the `target_session_attrs` check alike), so a first host that drops packets costs one
//! timeout and then the next one is tried (PostgreSQL docs, "Parameter Key Words",
//! `connect_timeout`). Both PostgreSQL connections pick their server through [`each_until_ok`], so
//! they reach the same one.
//!
//! Invariants: no attempt outlives `connect_timeout` (0: no bound of its own, as in libpq); a transient failure moves on to the next
//! attempt, a definite one (a refused login, a certificate that does not verify) ends the search,
//! as libpq stops at a failed authentication; the error returned is the last attempt's.

use std::future::Future;
use std::net::IpAddr;

use crate::config::postgres::PgHost;
use crate::config::PgTarget;
use crate::error::{Definite, Error, Transient};

/// One server address to try.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// The host's position in [`PgTarget::hosts`] (its password file entry is looked up by it).
    pub index: usize,
    pub host: PgHost,
    pub port: u16,
    /// Where the TCP connection goes: `hostaddr`, or one address of the host name. `None` for a
    /// Unix socket.
    pub addr: Option<IpAddr>,
}

impl Attempt {
    /// The password for this host (see [`PgTarget::password_for`]).
    pub fn password<'t>(&self, t: &'t PgTarget) -> Option<&'t str> {
        t.password_for(self.index)
    }

    /// `host:port`, with the address when it is not the host itself, for messages.
    pub fn shown(&self) -> String {
        match (&self.host, self.addr) {
            (PgHost::Unix(d), _) => format!("{}/.s.PGSQL.{}", d.display(), self.port),
            (PgHost::Tcp(h), Some(a)) if *h != a.to_string() => format!("{h}:{} (address {a})", self.port),
            (PgHost::Tcp(h), _) => format!("{h}:{}", self.port),
        }
    }
}

/// Run `attempt` against each address of `t`'s hosts in order, each bounded by `connect_timeout`,
/// until one succeeds or fails definitely.
pub async fn each_until_ok<T, F, Fut>(t: &PgTarget, mut attempt: F) -> Result<T, Error>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut last: Option<Error> = None;
    for (index, (host, port)) in t.hosts.iter().enumerate() {
        let addrs = match addresses(t, index, host, *port).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "trying the next host, if any");
                last = Some(e);
                continue;
            }
        };
        for addr in addrs {
            let a = Attempt { index, host: host.clone(), port: *port, addr };
            let shown = a.shown();
            let e = match bounded(t, attempt(a)).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if e.is_transient() => e,
                Ok(Err(e)) => return Err(e),
                Err(_) => timed_out(t, &shown),
            };
            tracing::warn!(error = %e, "trying the next address or host, if any");
            last = Some(e);
        }
    }
    Err(last.unwrap_or_else(|| Definite::Config("--postgres-url names no host".into()).into()))
}

/// The addresses to try for one host: its `hostaddr`, or what its name resolves to (within
/// `connect_timeout`), or none for a Unix socket.
async fn addresses(t: &PgTarget, index: usize, host: &PgHost, port: u16) -> Result<Vec<Option<IpAddr>>, Error> {
    let name = match host {
        PgHost::Unix(_) => return Ok(vec![None]),
        PgHost::Tcp(name) => name,
    };
    if let Some(a) = t.hostaddrs.get(index).copied().flatten() {
        return Ok(vec![Some(a)]);
    }
    if let Ok(a) = name.parse::<IpAddr>() {
        return Ok(vec![Some(a)]);
    }
    let io = |source| Transient::PgIo { target: format!("{name}:{port}"), source };
    let found = match bounded(t, tokio::net::lookup_host((name.as_str(), port))).await {
        Ok(r) => r.map_err(io)?,
        Err(_) => return Err(timed_out(t, &format!("{name}:{port} (resolving the name)"))),
    };
    let mut out: Vec<Option<IpAddr>> = Vec::new();
    for s in found {
        if !out.contains(&Some(s.ip())) {
            out.push(Some(s.ip()));
        }
    }
    if out.is_empty() {
        return Err(io(std::io::Error::new(std::io::ErrorKind::NotFound, "the name has no address")).into());
    }
    Ok(out)
}

/// `f` within [`PgTarget::attempt_limit`] (`Err(())` when that passed), or unbounded.
async fn bounded<T>(t: &PgTarget, f: impl Future<Output = T>) -> Result<T, ()> {
    match t.attempt_limit() {
        Some(limit) => tokio::time::timeout(limit, f).await.map_err(|_| ()),
        None => Ok(f.await),
    }
}

fn timed_out(t: &PgTarget, shown: &str) -> Error {
    Transient::PgIo {
        target: shown.to_owned(),
        source: std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no connection and login within connect_timeout={}s", t.connect_timeout.as_secs()),
        ),
    }
    .into()
}
