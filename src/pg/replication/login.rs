//! Opening the walsender connection: one loop over the target's hosts and addresses, TCP with
//! keepalives, TLS per `sslmode` (with libpq's `prefer` and `allow` fallbacks), the startup
//! message with `replication=database`, and authentication (trust, password, md5, SCRAM-SHA-256
//! and SCRAM-SHA-256-PLUS with `channel_binding`).
//!
//! A refused login is classed by its SQLSTATE in [`crate::pg::login`], shared with the ordinary
//! connections; socket trouble is transient. The password is never put in an error.

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS};
use postgres_protocol::message::{backend, frontend};

use tokio::time::Instant;

use super::{server_error, ReplicationConn, ServerError, Socket};
use crate::config::postgres::ChannelBindingMode;
use crate::config::{PgHost, PgTarget, SslMode};
use crate::error::{Definite, Error, Transient};
use crate::pg::hosts::{self, Attempt};
use crate::pg::tls::{self, Negotiated};

impl ReplicationConn {
    /// Connect with `replication=database` and authenticate (trust, password, md5, SCRAM-SHA-256
    /// with or without channel binding, client certificates), over TLS as `sslmode` says. Hosts
    /// and their addresses are tried in order, each within its own `connect_timeout`
    /// ([`hosts`]); the first that logs us in and is a primary wins. A server in recovery (or,
    /// with `target_session_attrs=read-write`, one whose transactions are read-only) is skipped:
    /// the slot is only ever used on the primary.
    pub async fn connect(t: &PgTarget) -> Result<ReplicationConn, Error> {
        hosts::each_until_ok(t, |a| async move {
            let mut c = Self::connect_one(t, &a).await?;
            c.require_primary(t).await?;
            Ok(c)
        })
        .await
    }

    /// One address of one host; the host name is still what TLS verifies.
    async fn connect_one(t: &PgTarget, a: &Attempt) -> Result<ReplicationConn, Error> {
        let (h, addr) = match (&a.host, a.addr) {
            (PgHost::Tcp(h), Some(addr)) => (h.as_str(), addr),
            (PgHost::Unix(dir), _) => {
                let path = dir.join(format!(".s.PGSQL.{}", a.port));
                let s = tokio::net::UnixStream::connect(&path)
                    .await
                    .map_err(|source| Transient::PgIo { target: path.display().to_string(), source })?;
                return Self::login(t, a, Box::new(s), None).await;
            }
            (PgHost::Tcp(_), None) => {
                return Err(Definite::Bug(format!("{}: no address to connect to", a.shown())).into())
            }
        };
        match t.tls.mode {
            SslMode::Disable => Self::login(t, a, Box::new(tcp_connect(t, a, addr).await?), None).await,
            // libpq's allow: plaintext first, TLS if the server refuses that login.
            SslMode::Allow => match Self::login(t, a, Box::new(tcp_connect(t, a, addr).await?), None).await {
                Err(Error::Definite(e)) => {
                    tracing::info!(error = %e, "plaintext login refused; retrying over TLS (sslmode=allow)");
                    Self::login_tls(t, a, h, addr).await
                }
                other => other,
            },
            _ => Self::login_tls(t, a, h, addr).await,
        }
    }

    async fn login_tls(t: &PgTarget, a: &Attempt, h: &str, addr: std::net::IpAddr) -> Result<ReplicationConn, Error> {
        let tcp = tcp_connect(t, a, addr).await?;
        match tls::negotiate(tcp, h, a.port, &t.tls).await {
            Ok(Negotiated::Tls(s)) => {
                let cb = tls::server_end_point(s.ssl());
                Self::login(t, a, s, cb).await
            }
            Ok(Negotiated::Plain(s)) => Self::login(t, a, Box::new(s), None).await,
            // libpq's prefer: a failed handshake falls back to plaintext on a new socket.
            Err(e) if e.is_transient() && t.tls.mode == SslMode::Prefer => {
                tracing::info!(error = %e, "TLS handshake failed; retrying in plaintext (sslmode=prefer)");
                Self::login(t, a, Box::new(tcp_connect(t, a, addr).await?), None).await
            }
            Err(e) => Err(e),
        }
    }

    pub(super) async fn login(
        t: &PgTarget,
        a: &Attempt,
        sock: Box<dyn Socket>,
        cb: Option<Vec<u8>>,
    ) -> Result<ReplicationConn, Error> {
        let target = t.to_string();
        let mut conn = ReplicationConn {
            sock,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::new(),
            target: target.clone(),
            backend_pid: None,
            last_rx: Instant::now(),
        };
        let mut params = vec![
            ("user", t.user.as_str()),
            ("database", t.dbname.as_str()),
            ("replication", "database"),
            ("application_name", t.application_name.as_str()),
            // pgoutput prints timestamptz in the walsender's settings; pin them for the router.
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
        ];
        if let Some(o) = &t.options {
            params.push(("options", o.as_str()));
        }
        frontend::startup_message(params.iter().copied(), &mut conn.wbuf)
            .map_err(|source| Transient::PgIo { target: target.clone(), source })?;
        conn.flush().await?;
        conn.authenticate(t, a.password(t), cb).await?;
        Ok(conn)
    }

    async fn authenticate(&mut self, t: &PgTarget, password: Option<&str>, cb: Option<Vec<u8>>) -> Result<(), Error> {
        let need_password = || crate::pg::login::password_missing(t);
        let require_cb = t.channel_binding == ChannelBindingMode::Require;
        let no_cb = || {
            Definite::Config(format!(
                "PostgreSQL at {t} logged us in without SCRAM channel binding, but channel_binding=require: \
                 use scram-sha-256 in pg_hba.conf over TLS, or channel_binding=prefer"
            ))
        };
        let mut scram: Option<ScramSha256> = None;
        let mut bound = false;
        // The server proved it knows the password (SCRAM server signature verified). Once a SCRAM
        // exchange started, AuthenticationOk counts only after that: otherwise anyone in the path
        // could answer "OK" and serve forged WAL (libpq and tokio-postgres refuse it too).
        let mut scram_verified = false;
        loop {
            match self.read_message().await? {
                backend::Message::AuthenticationOk => {
                    if scram.is_some() && !scram_verified {
                        return Err(Definite::Setup(format!(
                            "PostgreSQL at {t} said the login succeeded before completing SCRAM authentication \
                             (no server signature): refusing the connection; check for something between outboxd \
                             and the server"
                        ))
                        .into());
                    }
                    // A bound exchange got here only verified (just above).
                    if require_cb && !bound {
                        return Err(no_cb().into());
                    }
                }
                backend::Message::AuthenticationCleartextPassword => {
                    if require_cb {
                        return Err(no_cb().into());
                    }
                    let pw = password.ok_or_else(need_password)?;
                    frontend::password_message(pw.as_bytes(), &mut self.wbuf).map_err(|e| self.io(e))?;
                    self.flush().await?;
                }
                backend::Message::AuthenticationMd5Password(body) => {
                    if require_cb {
                        return Err(no_cb().into());
                    }
                    let pw = password.ok_or_else(need_password)?;
                    let hash = postgres_protocol::authentication::md5_hash(t.user.as_bytes(), pw.as_bytes(), body.salt());
                    frontend::password_message(hash.as_bytes(), &mut self.wbuf).map_err(|e| self.io(e))?;
                    self.flush().await?;
                }
                backend::Message::AuthenticationSasl(body) => {
                    let pw = password.ok_or_else(need_password)?;
                    let mut mechs = body.mechanisms();
                    let (mut has_scram, mut has_plus) = (false, false);
                    while let Some(m) = mechs.next().map_err(|e| self.io(e))? {
                        has_scram |= m == SCRAM_SHA_256;
                        has_plus |= m == SCRAM_SHA_256_PLUS;
                    }
                    let use_cb = t.channel_binding != ChannelBindingMode::Disable;
                    let (mech, binding) = match (&cb, has_plus) {
                        (Some(data), true) if use_cb => (SCRAM_SHA_256_PLUS, ChannelBinding::tls_server_end_point(data.clone())),
                        _ if require_cb => {
                            return Err(Definite::Config(format!(
                                "channel_binding=require, but PostgreSQL at {t} offers no SCRAM-SHA-256-PLUS{}: \
                                 it needs TLS and PostgreSQL 11+, or use channel_binding=prefer",
                                if cb.is_none() { " (this connection is not TLS)" } else { "" }
                            ))
                            .into())
                        }
                        (Some(_), _) if use_cb && has_scram => (SCRAM_SHA_256, ChannelBinding::unrequested()),
                        _ if has_scram => (SCRAM_SHA_256, ChannelBinding::unsupported()),
                        _ => {
                            return Err(Definite::Setup(format!(
                                "PostgreSQL at {t} offers no SASL mechanism outboxd supports (SCRAM-SHA-256, SCRAM-SHA-256-PLUS)"
                            ))
                            .into())
                        }
                    };
                    bound = mech == SCRAM_SHA_256_PLUS;
                    let s = ScramSha256::new(pw.as_bytes(), binding);
                    frontend::sasl_initial_response(mech, s.message(), &mut self.wbuf).map_err(|e| self.io(e))?;
                    self.flush().await?;
                    scram = Some(s);
                }
                backend::Message::AuthenticationSaslContinue(body) => {
                    let s = scram.as_mut().ok_or_else(|| self.protocol("SASL continue before SASL start"))?;
                    s.update(body.data()).map_err(|e| Definite::Setup(format!("SCRAM exchange with {t} failed: {e}")))?;
                    frontend::sasl_response(s.message(), &mut self.wbuf).map_err(|e| self.io(e))?;
                    self.flush().await?;
                }
                backend::Message::AuthenticationSaslFinal(body) => {
                    let s = scram.as_mut().ok_or_else(|| self.protocol("SASL final before SASL start"))?;
                    s.finish(body.data())
                        .map_err(|e| Definite::Setup(format!("SCRAM server signature from {t} did not verify: {e}")))?;
                    scram_verified = true;
                }
                backend::Message::ErrorResponse(body) => return Err(classify(t, server_error(&body))),
                backend::Message::BackendKeyData(k) => self.backend_pid = Some(k.process_id()),
                backend::Message::ParameterStatus(_) => {}
                backend::Message::NoticeResponse(_) => {}
                backend::Message::ReadyForQuery(_) => return Ok(()),
                backend::Message::AuthenticationGss
                | backend::Message::AuthenticationSspi
                | backend::Message::AuthenticationKerberosV5
                | backend::Message::AuthenticationScmCredential => {
                    return Err(Definite::Setup(format!(
                        "PostgreSQL at {t} wants an authentication method outboxd does not support; use trust, md5, scram-sha-256 or cert in pg_hba.conf"
                    ))
                    .into())
                }
                _ => return Err(self.protocol("unexpected message during startup").into()),
            }
        }
    }
}

/// A TCP connection to `addr` (libpq's `hostaddr`, or an address of the host name) with
/// keepalives (and `tcp_user_timeout`) as the conninfo says.
async fn tcp_connect(t: &PgTarget, a: &Attempt, addr: std::net::IpAddr) -> Result<tokio::net::TcpStream, Transient> {
    let io = |source| Transient::PgIo { target: a.shown(), source };
    let s = tokio::net::TcpStream::connect((addr, a.port)).await.map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    let sock = socket2::SockRef::from(&s);
    if t.keepalives.enabled {
        let k = socket2::TcpKeepalive::new()
            .with_time(t.keepalives.idle)
            .with_interval(t.keepalives.interval)
            .with_retries(t.keepalives.count);
        sock.set_tcp_keepalive(&k).map_err(io)?;
    }
    if let Some(ut) = t.tcp_user_timeout {
        sock.set_tcp_user_timeout(Some(ut)).map_err(io)?;
    }
    Ok(s)
}

/// Startup errors: login problems are definite (the operator must fix them), the rest transient
/// ([`crate::pg::login`], shared with the ordinary connections).
fn classify(t: &PgTarget, e: ServerError) -> Error {
    crate::pg::login::refused(t, crate::pg::login::Conn::Replication, &e.code, &e.message)
}
