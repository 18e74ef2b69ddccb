//! The walsender connection: startup, authentication, `START_REPLICATION`, and the CopyBoth stream.
//!
//! Spec: PostgreSQL docs, "Frontend/Backend Protocol" (startup and authentication) and "Streaming
//! Replication Protocol" (XLogData `w`, Primary keepalive `k`, Standby status update `r`).
//!
//! # LSN contract (what we tell the server, and when)
//! * The flush/apply position we send is always [`crate::ack::AckTracker::confirmed`]: the end LSN
//!   of a transaction whose records, and those of every earlier transaction, the sink has acked.
//!   The server treats it as `confirmed_flush_lsn` and may recycle WAL before it, so sending more
//!   would lose events on a crash; sending less only repeats them.
//! * A keepalive's WAL end may advance that position only while no transaction is open or
//!   waiting for acks (the tracker enforces it).
//! * We reply at once when a keepalive asks for a reply, and otherwise on the status timer, so the
//!   server's `wal_sender_timeout` never fires while we wait for a slow broker.
//! * The write position we report is the last WAL end received; it is informational only.
//!
//! This module owns the socket and framing and nothing else: it does not decide LSNs.
//! Errors are [`Transient`] (socket trouble, server shut down) or [`Definite`] (login refused,
//! the slot or publication is wrong), as the server's SQLSTATE says.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::{backend, frontend};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::config::{PgHost, PgTarget};
use crate::error::{Definite, Error, Transient};
use crate::lsn::Lsn;

trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

/// A server error: SQLSTATE and message.
#[derive(Debug, Clone)]
pub struct ServerError {
    pub code: String,
    pub message: String,
}

/// An authenticated replication connection, before or during streaming.
pub struct ReplicationConn {
    sock: Box<dyn Socket>,
    rbuf: BytesMut,
    wbuf: BytesMut,
    target: String,
}

/// One message of the replication stream.
#[derive(Debug)]
pub enum WalMessage {
    /// XLogData: a pgoutput message starting at `wal_start`.
    Data { wal_start: Lsn, wal_end: Lsn, data: Bytes },
    /// Primary keepalive.
    Keepalive { wal_end: Lsn, reply_requested: bool },
}

/// µs since 2000-01-01, as the protocol wants clocks.
fn pg_now_us() -> i64 {
    let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    unix.as_micros() as i64 - 946_684_800_000_000
}

impl ReplicationConn {
    /// Connect with `replication=database` and authenticate (trust, password, md5, SCRAM-SHA-256).
    pub async fn connect(t: &PgTarget) -> Result<ReplicationConn, Error> {
        let target = t.to_string();
        let io_err = |source| Transient::PgIo { target: target.clone(), source };
        let sock: Box<dyn Socket> = match &t.host {
            PgHost::Tcp(h) => {
                let s = tokio::time::timeout(t.connect_timeout, tokio::net::TcpStream::connect((h.as_str(), t.port)))
                    .await
                    .map_err(|_| io_err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")))?
                    .map_err(io_err)?;
                s.set_nodelay(true).map_err(io_err)?;
                Box::new(s)
            }
            PgHost::Unix(dir) => {
                let path = dir.join(format!(".s.PGSQL.{}", t.port));
                Box::new(tokio::net::UnixStream::connect(path).await.map_err(io_err)?)
            }
        };
        let mut conn = ReplicationConn {
            sock,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::new(),
            target: target.clone(),
        };
        let params = [
            ("user", t.user.as_str()),
            ("database", t.dbname.as_str()),
            ("replication", "database"),
            ("application_name", t.application_name.as_str()),
            // pgoutput prints timestamptz in the walsender's settings; pin them for the router.
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
        ];
        frontend::startup_message(params.iter().copied(), &mut conn.wbuf).map_err(io_err)?;
        conn.flush().await?;
        conn.authenticate(t).await?;
        Ok(conn)
    }

    async fn authenticate(&mut self, t: &PgTarget) -> Result<(), Error> {
        let need_password = || {
            Definite::Setup(format!(
                "PostgreSQL at {} asks for a password, but --postgres-url has none; add it as postgres://user:PASSWORD@host/db",
                t
            ))
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            match self.read_message().await? {
                backend::Message::AuthenticationOk => {}
                backend::Message::AuthenticationCleartextPassword => {
                    let pw = t.password.as_deref().ok_or_else(need_password)?;
                    frontend::password_message(pw.as_bytes(), &mut self.wbuf).map_err(|e| self.io(e))?;
                    self.flush().await?;
                }
                backend::Message::AuthenticationMd5Password(body) => {
                    let pw = t.password.as_deref().ok_or_else(need_password)?;
                    let hash = postgres_protocol::authentication::md5_hash(t.user.as_bytes(), pw.as_bytes(), body.salt());
                    frontend::password_message(hash.as_bytes(), &mut self.wbuf).map_err(|e| self.io(e))?;
                    self.flush().await?;
                }
                backend::Message::AuthenticationSasl(body) => {
                    let pw = t.password.as_deref().ok_or_else(need_password)?;
                    let mut mechs = body.mechanisms();
                    let mut has_scram = false;
                    while let Some(m) = mechs.next().map_err(|e| self.io(e))? {
                        has_scram |= m == SCRAM_SHA_256;
                    }
                    if !has_scram {
                        return Err(Definite::Setup(format!(
                            "PostgreSQL at {t} offers no SASL mechanism outboxd supports (SCRAM-SHA-256 without channel binding)"
                        ))
                        .into());
                    }
                    let s = ScramSha256::new(pw.as_bytes(), ChannelBinding::unsupported());
                    frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), &mut self.wbuf).map_err(|e| self.io(e))?;
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
                }
                backend::Message::ErrorResponse(body) => return Err(classify(t, server_error(&body))),
                backend::Message::ParameterStatus(_) | backend::Message::BackendKeyData(_) => {}
                backend::Message::NoticeResponse(_) => {}
                backend::Message::ReadyForQuery(_) => return Ok(()),
                backend::Message::AuthenticationGss
                | backend::Message::AuthenticationSspi
                | backend::Message::AuthenticationKerberosV5
                | backend::Message::AuthenticationScmCredential => {
                    return Err(Definite::Setup(format!(
                        "PostgreSQL at {t} wants an authentication method outboxd does not support; use trust, md5 or scram-sha-256 in pg_hba.conf"
                    ))
                    .into())
                }
                _ => return Err(self.protocol("unexpected message during startup").into()),
            }
        }
    }

    /// `START_REPLICATION ... LOGICAL` with pgoutput protocol 1. Consumes `self` into a stream.
    pub async fn start_replication(
        mut self,
        slot: &str,
        start: Lsn,
        publication: &str,
        messages: bool,
    ) -> Result<ReplicationStream, Error> {
        let pubs = publication.replace('"', "\"\"").replace('\'', "''");
        // `messages` (PostgreSQL 14+) lets our heartbeat messages through.
        let messages = if messages { ", messages 'true'" } else { "" };
        let sql = format!(
            "START_REPLICATION SLOT \"{slot}\" LOGICAL {start} (proto_version '1', publication_names '\"{pubs}\"'{messages})"
        );
        frontend::query(&sql, &mut self.wbuf).map_err(|e| self.io(e))?;
        self.flush().await?;
        loop {
            // CopyBothResponse ('W') is not in postgres-protocol's backend enum; frame it here.
            if self.fill_frame().await? == b'W' {
                let (_, len) = frame_header(&self.rbuf).ok_or_else(|| self.protocol("short frame"))?;
                self.rbuf.advance(1 + len);
                return Ok(ReplicationStream { conn: self, last_received: start });
            }
            match self.read_message().await? {
                backend::Message::ErrorResponse(body) => {
                    let e = server_error(&body);
                    return Err(match e.code.as_str() {
                        // object_in_use: another walsender holds the slot.
                        "55006" => Transient::PgServer { code: e.code, message: e.message }.into(),
                        _ => Definite::Setup(format!(
                            "START_REPLICATION on slot {slot:?} failed: {} ({})",
                            e.message, e.code
                        ))
                        .into(),
                    });
                }
                backend::Message::NoticeResponse(_) | backend::Message::ParameterStatus(_) => {}
                _ => return Err(self.protocol("unexpected reply to START_REPLICATION").into()),
            }
        }
    }

    /// Wait until a whole frame is buffered; return its tag.
    async fn fill_frame(&mut self) -> Result<u8, Transient> {
        loop {
            if let Some((tag, len)) = frame_header(&self.rbuf) {
                if self.rbuf.len() > len {
                    return Ok(tag);
                }
            }
            self.read_more().await?;
        }
    }

    async fn read_more(&mut self) -> Result<(), Transient> {
        if self.rbuf.capacity() - self.rbuf.len() < 8 * 1024 {
            self.rbuf.reserve(64 * 1024);
        }
        let n = self.sock.read_buf(&mut self.rbuf).await.map_err(|e| self.io(e))?;
        if n == 0 {
            return Err(Transient::PgClosed { target: self.target.clone() });
        }
        Ok(())
    }

    async fn read_message(&mut self) -> Result<backend::Message, Transient> {
        loop {
            if let Some(m) = backend::Message::parse(&mut self.rbuf).map_err(|e| self.io(e))? {
                return Ok(m);
            }
            self.read_more().await?;
        }
    }

    async fn flush(&mut self) -> Result<(), Transient> {
        let buf = self.wbuf.split();
        self.sock.write_all(&buf).await.map_err(|e| self.io(e))?;
        self.sock.flush().await.map_err(|e| self.io(e))
    }

    fn io(&self, source: std::io::Error) -> Transient {
        Transient::PgIo { target: self.target.clone(), source }
    }

    fn protocol(&self, what: &str) -> Definite {
        Definite::Protocol { lsn: Lsn::ZERO, detail: format!("{what} from {}", self.target) }
    }
}

/// Tag and body length (excluding the tag) of the frame at the start of `buf`, if its header is in.
fn frame_header(buf: &[u8]) -> Option<(u8, usize)> {
    if buf.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    Some((buf[0], len.max(4)))
}

fn server_error(body: &backend::ErrorResponseBody) -> ServerError {
    let (mut code, mut message) = (String::new(), String::new());
    let mut fields = body.fields();
    while let Ok(Some(f)) = fields.next() {
        match f.type_() {
            b'C' => code = String::from_utf8_lossy(f.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(f.value_bytes()).into_owned(),
            _ => {}
        }
    }
    ServerError { code, message }
}

/// Startup errors: login problems are definite (the operator must fix them), the rest transient.
fn classify(t: &PgTarget, e: ServerError) -> Error {
    match e.code.as_str() {
        "28P01" => Definite::Setup(format!(
            "password authentication failed for user {:?} at {t}: check the password in --postgres-url",
            t.user
        ))
        .into(),
        "28000" => Definite::Setup(format!(
            "PostgreSQL at {t} refused the replication login ({}): the role needs REPLICATION and pg_hba.conf a 'replication' line",
            e.message
        ))
        .into(),
        "3D000" => Definite::Setup(format!("database {:?} does not exist at {t}: fix the database in --postgres-url", t.dbname)).into(),
        "42501" => Definite::Setup(format!("{} at {t}: grant the role REPLICATION (ALTER ROLE {} REPLICATION)", e.message, t.user)).into(),
        _ => Transient::PgServer { code: e.code, message: e.message }.into(),
    }
}

/// Parse the body of one CopyData frame of the replication stream (`w` XLogData or `k` keepalive).
/// Pure: never panics; a short, long or unknown message is an error naming what was wrong.
pub fn parse_copy_data(mut b: Bytes) -> Result<WalMessage, String> {
    let Some(&tag) = b.first() else {
        return Err("empty replication message".into());
    };
    b.advance(1);
    match tag {
        b'w' => {
            if b.len() < 24 {
                return Err(format!("XLogData header needs 24 bytes, got {}", b.len()));
            }
            let wal_start = Lsn(b.get_u64());
            let wal_end = Lsn(b.get_u64());
            let _send_time = b.get_i64();
            Ok(WalMessage::Data { wal_start, wal_end, data: b })
        }
        b'k' => {
            if b.len() != 17 {
                return Err(format!("keepalive must be 17 bytes, got {}", b.len()));
            }
            let wal_end = Lsn(b.get_u64());
            let _send_time = b.get_i64();
            Ok(WalMessage::Keepalive { wal_end, reply_requested: b.get_u8() == 1 })
        }
        t => Err(format!("unknown replication message tag 0x{t:02x}")),
    }
}

/// An error the walsender sent mid-stream. Most are the server going away (transient); a missing
/// publication or removed WAL will not fix themselves.
fn stream_error(e: ServerError) -> Error {
    match e.code.as_str() {
        "42704" => Definite::Setup(format!(
            "the server stopped streaming: {} — recreate the publication (see sql/04_publication.sql) and restart",
            e.message
        ))
        .into(),
        "58P01" => Definite::Setup(format!(
            "the server stopped streaming: {} — the slot lost WAL it needs; events may be missing, reconcile the outbox by hand",
            e.message
        ))
        .into(),
        _ => Transient::PgServer { code: e.code, message: e.message }.into(),
    }
}

/// The CopyBoth phase: WAL in, status updates out.
pub struct ReplicationStream {
    conn: ReplicationConn,
    last_received: Lsn,
}

impl ReplicationStream {
    /// Next XLogData or keepalive. Cancel-safe: partial frames stay buffered.
    pub async fn next(&mut self) -> Result<WalMessage, Error> {
        loop {
            let tag = self.conn.fill_frame().await?;
            match tag {
                b'd' => {
                    let Some(backend::Message::CopyData(body)) =
                        backend::Message::parse(&mut self.conn.rbuf).map_err(|e| self.conn.io(e))?
                    else {
                        return Err(self.conn.protocol("bad CopyData frame").into());
                    };
                    let msg = self.parse_copy_data(body.into_bytes())?;
                    match &msg {
                        WalMessage::Data { wal_end, .. } | WalMessage::Keepalive { wal_end, .. } => {
                            self.last_received = self.last_received.max(*wal_end);
                        }
                    }
                    return Ok(msg);
                }
                b'c' => return Err(Transient::PgClosed { target: self.conn.target.clone() }.into()),
                _ => match self.conn.read_message().await? {
                    backend::Message::ErrorResponse(body) => return Err(stream_error(server_error(&body))),
                    backend::Message::NoticeResponse(_) | backend::Message::ParameterStatus(_) => {}
                    // The stream is over (e.g. CommandComplete after a server shutdown): reconnect.
                    _ => {
                        return Err(Transient::PgServer {
                            code: "08P01".into(),
                            message: format!("replication stream ended with message {:?}", tag as char),
                        }
                        .into())
                    }
                },
            }
        }
    }

    fn parse_copy_data(&self, b: Bytes) -> Result<WalMessage, Definite> {
        parse_copy_data(b).map_err(|detail| Definite::Protocol { lsn: self.last_received, detail })
    }

    /// Standby status update: flush = apply = `confirmed`.
    pub async fn send_status(&mut self, confirmed: Lsn) -> Result<(), Error> {
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(self.last_received.max(confirmed).0);
        body.put_u64(confirmed.0);
        body.put_u64(confirmed.0);
        body.put_i64(pg_now_us());
        body.put_u8(0);
        frontend::CopyData::new(body.freeze()).map_err(|e| self.conn.io(e))?.write(&mut self.conn.wbuf);
        Ok(self.conn.flush().await?)
    }

    /// Highest WAL end seen from the server.
    pub fn last_received(&self) -> Lsn {
        self.last_received
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_data_framing() {
        let mut k = vec![b'k'];
        k.extend_from_slice(&0x1_0000_0010u64.to_be_bytes());
        k.extend_from_slice(&7i64.to_be_bytes());
        k.push(1);
        match parse_copy_data(Bytes::from(k.clone())).unwrap() {
            WalMessage::Keepalive { wal_end, reply_requested } => {
                assert_eq!(wal_end, Lsn(0x1_0000_0010));
                assert!(reply_requested);
            }
            other => panic!("{other:?}"),
        }
        let mut w = vec![b'w'];
        w.extend_from_slice(&5u64.to_be_bytes());
        w.extend_from_slice(&9u64.to_be_bytes());
        w.extend_from_slice(&0i64.to_be_bytes());
        w.extend_from_slice(b"Bpayload");
        match parse_copy_data(Bytes::from(w)).unwrap() {
            WalMessage::Data { wal_start, wal_end, data } => {
                assert_eq!((wal_start, wal_end), (Lsn(5), Lsn(9)));
                assert_eq!(&data[..], b"Bpayload");
            }
            other => panic!("{other:?}"),
        }
        for cut in 0..k.len() {
            assert!(parse_copy_data(Bytes::copy_from_slice(&k[..cut])).is_err());
        }
        k.push(0);
        assert!(parse_copy_data(Bytes::from(k)).is_err(), "trailing byte after keepalive");
        assert!(parse_copy_data(Bytes::from_static(b"z")).is_err());
    }
}
