//! The walsender connection: startup, authentication, `START_REPLICATION`, and the CopyBoth stream.
//!
//! Spec: PostgreSQL docs, "Frontend/Backend Protocol" (startup and authentication) and "Streaming
//! Replication Protocol" (XLogData `w`, Primary keepalive `k`, Standby status update `r`).
//!
//! # LSN contract (what we tell the server, and when)
//! * The flush/apply position we send is always [`crate::source::wal::tracker::AckTracker::confirmed`]: the end LSN
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

use tokio::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::message::{backend, frontend};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{Definite, Error, Transient};
use crate::lineage::Lineage;
use crate::lsn::Lsn;

mod commands;
mod login;

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
    /// The walsender's PID (BackendKeyData), so a later session can end a walsender of ours
    /// that a dead link left holding the slot.
    backend_pid: Option<i32>,
    /// When bytes last arrived from the server.
    last_rx: Instant,
}

/// Which WAL history an LSN belongs to: the server's system identifier and timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalHistory {
    pub system_id: String,
    pub timeline: u32,
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
pub fn pg_now_us() -> i64 {
    let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    unix.as_micros() as i64 - 946_684_800_000_000
}

impl ReplicationConn {
    /// The walsender's PID, from BackendKeyData.
    pub fn backend_pid(&self) -> Option<i32> {
        self.backend_pid
    }

    /// `START_REPLICATION ... LOGICAL` with pgoutput protocol 1. Consumes `self` into a stream.
    pub async fn start_replication(
        mut self,
        slot: &str,
        start: Lsn,
        publication: &str,
        messages: bool,
        receiver_timeout: Duration,
    ) -> Result<ReplicationStream, Error> {
        // The publication list is a string literal holding quoted identifiers.
        let pubs = super::ident::quote_ident(publication).replace('\'', "''");
        let slot = super::ident::quote_ident(slot);
        // `messages` (PostgreSQL 14+) lets the --messages-prefix events through.
        let messages = if messages { ", messages 'true'" } else { "" };
        let sql = format!(
            "START_REPLICATION SLOT {slot} LOGICAL {start} (proto_version '1', publication_names '{pubs}'{messages})"
        );
        frontend::query(&sql, &mut self.wbuf).map_err(|e| self.io(e))?;
        self.flush().await?;
        loop {
            // CopyBothResponse ('W') is not in postgres-protocol's backend enum; frame it here.
            if self.fill_frame().await? == b'W' {
                let (_, len) = frame_header(&self.rbuf).ok_or_else(|| self.protocol("short frame"))?;
                self.rbuf.advance(1 + len);
                return Ok(ReplicationStream { conn: self, last_received: start, receiver_timeout, pinged: false });
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
        self.last_rx = Instant::now();
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

/// The fixed header of one CopyData body of the replication stream, read in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyDataHeader {
    /// XLogData; its payload is the rest of the body after [`XLOG_HEADER`] bytes.
    Data {
        wal_start: Lsn,
        wal_end: Lsn,
    },
    Keepalive {
        wal_end: Lsn,
        reply_requested: bool,
    },
}

/// XLogData's header: the tag, start and end LSNs and the send time.
const XLOG_HEADER: usize = 1 + 24;

/// Read the header of a CopyData body (`w` XLogData or `k` keepalive) without taking the body
/// apart. Pure: never panics; a short, long or unknown message is an error naming what was wrong.
fn copy_data_header(b: &[u8]) -> Result<CopyDataHeader, String> {
    // Total, so nothing here can panic; the lengths are checked before any field is read.
    let word = |at: usize| b.get(at..at + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()).map_or(0, u64::from_be_bytes);
    match b.first() {
        None => Err("empty replication message".into()),
        Some(b'w') => {
            if b.len() < XLOG_HEADER {
                return Err(format!("XLogData header needs 24 bytes, got {}", b.len() - 1));
            }
            Ok(CopyDataHeader::Data { wal_start: Lsn(word(1)), wal_end: Lsn(word(9)) })
        }
        Some(b'k') => {
            if b.len() != 1 + 17 {
                return Err(format!("keepalive must be 17 bytes, got {}", b.len() - 1));
            }
            Ok(CopyDataHeader::Keepalive { wal_end: Lsn(word(1)), reply_requested: b.get(17) == Some(&1) })
        }
        Some(t) => Err(format!("unknown replication message tag 0x{t:02x}")),
    }
}

/// Parse the body of one CopyData frame of the replication stream (`w` XLogData or `k` keepalive).
/// Pure: never panics; a short, long or unknown message is an error naming what was wrong.
pub fn parse_copy_data(mut b: Bytes) -> Result<WalMessage, String> {
    Ok(match copy_data_header(&b)? {
        CopyDataHeader::Data { wal_start, wal_end } => {
            b.advance(XLOG_HEADER);
            WalMessage::Data { wal_start, wal_end, data: b }
        }
        CopyDataHeader::Keepalive { wal_end, reply_requested } => WalMessage::Keepalive { wal_end, reply_requested },
    })
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
///
/// Liveness, as PostgreSQL's own walreceiver does it: an idle walsender may stay silent while we
/// keep sending status updates, so after half of `--wal-receiver-timeout` without a byte we send
/// a status update that asks for a reply; with still nothing at the full timeout the link is
/// taken as dead (a half-open TCP connection never closes by itself) and the session ends with a
/// transient error. Time spent not reading (backpressure) does not count.
pub struct ReplicationStream {
    conn: ReplicationConn,
    last_received: Lsn,
    receiver_timeout: Duration,
    /// A reply-requesting status update went out since the last byte arrived.
    pinged: bool,
}

impl ReplicationStream {
    /// Next XLogData or keepalive. Cancel-safe: partial frames stay buffered.
    pub async fn next(&mut self) -> Result<WalMessage, Error> {
        loop {
            let tag = self.conn.fill_frame().await?;
            match tag {
                b'd' => return self.take_copy_data(),
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

    /// The next message when a whole CopyData frame is buffered already; `None` when reading one
    /// would need the socket (or the next frame is not CopyData: [`ReplicationStream::next`]
    /// handles those). No I/O, so the session can drain a burst without a `select!` turn per
    /// message.
    pub fn try_next(&mut self) -> Option<Result<WalMessage, Error>> {
        match frame_header(&self.conn.rbuf) {
            Some((b'd', len)) if self.conn.rbuf.len() > len => Some(self.take_copy_data()),
            _ => None,
        }
    }

    /// Take the CopyData frame at the head of the buffer (its header checked and the whole frame
    /// buffered by the caller) and parse its body. The header is read in place; only an XLogData
    /// payload is split off the read buffer (not copied: it, and every value decoded from it,
    /// share that allocation), so a frame costs at most one reference count.
    fn take_copy_data(&mut self) -> Result<WalMessage, Error> {
        let Some((_, len)) = frame_header(&self.conn.rbuf) else {
            return Err(self.conn.protocol("short CopyData frame").into());
        };
        // A length field below its own 4 bytes is a corrupt stream, not a message: reconnect, as
        // postgres-protocol's parser (which read these frames before) made it an I/O error.
        if u32::from_be_bytes([self.conn.rbuf[1], self.conn.rbuf[2], self.conn.rbuf[3], self.conn.rbuf[4]]) < 4 {
            let source = std::io::Error::new(std::io::ErrorKind::InvalidData, "CopyData frame length below 4");
            return Err(self.conn.io(source).into());
        }
        // Tag (1 byte), then the length (4 bytes, counting itself), then the body.
        self.pinged = false;
        let header = match copy_data_header(&self.conn.rbuf[5..1 + len]) {
            Ok(header) => header,
            Err(detail) => {
                // The bad frame is consumed all the same, as before the header was read in place.
                self.conn.rbuf.advance(1 + len);
                return Err(Definite::Protocol { lsn: self.last_received, detail }.into());
            }
        };
        let msg = match header {
            CopyDataHeader::Data { wal_start, wal_end } => {
                self.conn.rbuf.advance(5 + XLOG_HEADER);
                let data = self.conn.rbuf.split_to(len - 4 - XLOG_HEADER).freeze();
                WalMessage::Data { wal_start, wal_end, data }
            }
            CopyDataHeader::Keepalive { wal_end, reply_requested } => {
                self.conn.rbuf.advance(1 + len);
                WalMessage::Keepalive { wal_end, reply_requested }
            }
        };
        match &msg {
            WalMessage::Data { wal_end, .. } | WalMessage::Keepalive { wal_end, .. } => {
                self.last_received = self.last_received.max(*wal_end);
            }
        }
        Ok(msg)
    }

    /// Standby status update: flush = apply = `confirmed`.
    pub async fn send_status(&mut self, confirmed: Lsn) -> Result<(), Error> {
        self.status(confirmed, false).await
    }

    async fn status(&mut self, confirmed: Lsn, reply: bool) -> Result<(), Error> {
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(self.last_received.max(confirmed).0);
        body.put_u64(confirmed.0);
        body.put_u64(confirmed.0);
        body.put_i64(pg_now_us());
        body.put_u8(u8::from(reply));
        frontend::CopyData::new(body.freeze()).map_err(|e| self.conn.io(e))?.write(&mut self.conn.wbuf);
        // A frozen link can fill the send buffer; never wait on it longer than on silence.
        let limit = if self.receiver_timeout.is_zero() { Duration::from_secs(60) } else { self.receiver_timeout };
        match tokio::time::timeout(limit, self.conn.flush()).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(self.silent("sending a status update blocked").into()),
        }
    }

    /// How often [`ReplicationStream::check_liveness`] should run: an eighth of the receive
    /// timeout, between 50 ms and 1 s; `None` when the timeout is off. A fixed tick keeps the
    /// per-message path free of timer work.
    pub fn liveness_period(&self) -> Option<Duration> {
        (!self.receiver_timeout.is_zero())
            .then(|| (self.receiver_timeout / 8).clamp(Duration::from_millis(50), Duration::from_secs(1)))
    }

    /// Ask for a reply at half the timeout; fail at the full timeout.
    pub async fn check_liveness(&mut self, confirmed: Lsn) -> Result<(), Error> {
        if self.receiver_timeout.is_zero() {
            return Ok(());
        }
        let silent = self.conn.last_rx.elapsed();
        if silent >= self.receiver_timeout {
            return Err(self.silent("no message").into());
        }
        if !self.pinged && silent >= self.receiver_timeout / 2 {
            self.pinged = true;
            tracing::debug!(?silent, "replication connection quiet; asking the server for a reply");
            self.status(confirmed, true).await?;
        }
        Ok(())
    }

    /// We are not reading (backpressure): silence from now on is not the server's.
    pub fn pause_liveness(&mut self) {
        self.conn.last_rx = Instant::now();
        self.pinged = false;
    }

    fn silent(&self, what: &str) -> Transient {
        Transient::PgIo {
            target: self.conn.target.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "{what} from the server for {}s (--wal-receiver-timeout); the link looks dead",
                    self.receiver_timeout.as_secs()
                ),
            ),
        }
    }

    /// End the stream as the protocol wants (CopyDone, then Terminate), so the server logs a clean
    /// disconnect. Best effort, bounded: a dead link is simply dropped.
    pub async fn close(mut self) {
        frontend::copy_done(&mut self.conn.wbuf);
        frontend::terminate(&mut self.conn.wbuf);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.conn.flush()).await;
    }

    /// Highest WAL end seen from the server.
    pub fn last_received(&self) -> Lsn {
        self.last_received
    }
}

/// Where a session's WAL comes from: the walsender stream in production, a scripted source in the
/// pipeline's own tests. Every method keeps the meaning documented on [`ReplicationStream`].
#[allow(async_fn_in_trait)]
pub trait WalSource {
    /// Next message. Must be cancel-safe: the loop polls it as one arm of a `select!`.
    async fn next(&mut self) -> Result<WalMessage, Error>;
    /// The next message if it is at hand without waiting (already buffered), else `None`; the
    /// default never has one. Messages come in the same order `next` gives them.
    fn try_next(&mut self) -> Option<Result<WalMessage, Error>> {
        None
    }
    /// Standby status update with flush = apply = `confirmed`.
    async fn send_status(&mut self, confirmed: Lsn) -> Result<(), Error>;
    /// How often [`WalSource::check_liveness`] should run; `None`: never.
    fn liveness_period(&self) -> Option<Duration>;
    async fn check_liveness(&mut self, confirmed: Lsn) -> Result<(), Error>;
    /// We stopped reading (backpressure): silence from now on is ours, not the server's.
    fn pause_liveness(&mut self);
    /// End the stream cleanly.
    async fn close(self);
    /// Highest WAL end seen.
    fn last_received(&self) -> Lsn;
}

impl WalSource for ReplicationStream {
    async fn next(&mut self) -> Result<WalMessage, Error> {
        ReplicationStream::next(self).await
    }
    fn try_next(&mut self) -> Option<Result<WalMessage, Error>> {
        ReplicationStream::try_next(self)
    }
    async fn send_status(&mut self, confirmed: Lsn) -> Result<(), Error> {
        ReplicationStream::send_status(self, confirmed).await
    }
    fn liveness_period(&self) -> Option<Duration> {
        ReplicationStream::liveness_period(self)
    }
    async fn check_liveness(&mut self, confirmed: Lsn) -> Result<(), Error> {
        ReplicationStream::check_liveness(self, confirmed).await
    }
    fn pause_liveness(&mut self) {
        ReplicationStream::pause_liveness(self)
    }
    async fn close(self) {
        ReplicationStream::close(self).await
    }
    fn last_received(&self) -> Lsn {
        ReplicationStream::last_received(self)
    }
}

/// The lineage of `timeline`, asked of the server on the replication connection before
/// `START_REPLICATION`. A history file the server cannot give (or that cannot be parsed) is
/// logged and leaves the lineage [`unknown`](Lineage::unknown), which skips nothing stored on
/// another timeline.
pub async fn read_lineage(conn: &mut ReplicationConn, timeline: u32, wal_end: Lsn) -> Result<Lineage, Error> {
    if timeline <= 1 {
        return Ok(Lineage::first(wal_end));
    }
    let parsed = match conn.timeline_history(timeline).await {
        Ok(file) => Lineage::from_history(timeline, wal_end, &file),
        Err(e) if e.is_transient() => return Err(e),
        Err(e) => Err(e.to_string()),
    };
    Ok(parsed.unwrap_or_else(|reason| {
        tracing::warn!(timeline, %reason, "the server's timeline history cannot be read; an exactly-once position stored on another timeline will not be skipped by");
        Lineage::unknown(timeline, wal_end)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PgTarget;
    use tokio::io::DuplexStream;

    /// One step of a fake server: read one client message, or send raw backend bytes.
    enum Step {
        Read,
        Send(Vec<u8>),
    }

    /// A fake server on the other end of `sock`: reads the startup message, then runs `steps`.
    async fn fake_server(mut sock: DuplexStream, steps: Vec<Step>) {
        // Startup: length-prefixed, no type byte.
        let mut len = [0u8; 4];
        if sock.read_exact(&mut len).await.is_err() {
            return;
        }
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize - 4];
        let _ = sock.read_exact(&mut body).await;
        for step in steps {
            match step {
                Step::Read => {
                    let mut head = [0u8; 5];
                    if sock.read_exact(&mut head).await.is_err() {
                        return;
                    }
                    let mut b = vec![0u8; u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize - 4];
                    let _ = sock.read_exact(&mut b).await;
                }
                Step::Send(r) => {
                    if sock.write_all(&r).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    fn auth(code: i32, extra: &[u8]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend_from_slice(&((8 + extra.len()) as i32).to_be_bytes());
        m.extend_from_slice(&code.to_be_bytes());
        m.extend_from_slice(extra);
        m
    }

    fn ready() -> Vec<u8> {
        vec![b'Z', 0, 0, 0, 5, b'I']
    }

    async fn login_against(url: &str, cb: Option<Vec<u8>>, steps: Vec<Step>) -> Result<(), Error> {
        let t = PgTarget::parse(url).expect("url");
        let (client, server) = tokio::io::duplex(64 * 1024);
        let srv = tokio::spawn(fake_server(server, steps));
        let a = crate::pg::hosts::Attempt { index: 0, host: t.hosts[0].0.clone(), port: t.hosts[0].1, addr: None };
        let login = ReplicationConn::login(&t, &a, Box::new(client), cb);
        let r = tokio::time::timeout(Duration::from_secs(10), login).await.expect("login hung").map(|_| ());
        srv.abort();
        r
    }

    /// A server (or a man in the middle) that offers SCRAM-SHA-256-PLUS, takes the client's first
    /// message and answers AuthenticationOk without the SCRAM exchange: refused, under
    /// channel_binding=require and prefer alike.
    #[tokio::test]
    async fn authentication_ok_before_scram_completes_is_refused() {
        let mechs = b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0";
        for mode in ["require", "prefer"] {
            let url = format!("postgres://u:pw@db.example/app?sslmode=require&channel_binding={mode}");
            let steps = vec![Step::Send(auth(10, mechs)), Step::Read, Step::Send(auth(0, b"")), Step::Send(ready())];
            let r = login_against(&url, Some(vec![7u8; 32]), steps).await;
            let e = r.expect_err("a login without the server's SCRAM signature must fail");
            assert!(e.to_string().contains("before completing SCRAM"), "{mode}: {e}");
            assert!(!e.to_string().contains("pw@"), "{e}");
        }
        // Plain SCRAM without TLS, the same skip.
        let steps =
            vec![Step::Send(auth(10, b"SCRAM-SHA-256\0\0")), Step::Read, Step::Send(auth(0, b"")), Step::Send(ready())];
        let r = login_against("postgres://u:pw@db.example/app?sslmode=disable", None, steps).await;
        assert!(r.is_err_and(|e| e.to_string().contains("before completing SCRAM")));
    }

    /// Under channel_binding=require, a server that asks for a cleartext or MD5 password, or lets
    /// us in with no authentication at all, is refused before any password is sent (as libpq).
    #[tokio::test]
    async fn channel_binding_require_refuses_password_and_trust_logins() {
        let url = "postgres://u:pw@db.example/app?sslmode=require&channel_binding=require";
        for first in [auth(3, b""), auth(5, &[1, 2, 3, 4]), auth(0, b"")] {
            let steps = vec![Step::Send(first.clone()), Step::Read, Step::Send(auth(0, b"")), Step::Send(ready())];
            let r = login_against(url, Some(vec![7u8; 32]), steps).await;
            let e = r.expect_err("must be refused");
            assert!(e.to_string().contains("channel_binding=require"), "{first:?}: {e}");
        }
        // Without require, trust is fine (a sanity check that the fake server works).
        let steps = vec![Step::Send(auth(0, b"")), Step::Send(ready())];
        let ok = login_against("postgres://u:pw@db.example/app?sslmode=disable", None, steps).await;
        assert!(ok.is_ok(), "{ok:?}");
    }

    /// One CopyData frame holding XLogData with `payload` at `lsn`.
    fn xlog_frame(lsn: u64, payload: &[u8]) -> Vec<u8> {
        let mut body = vec![b'w'];
        body.extend_from_slice(&lsn.to_be_bytes());
        body.extend_from_slice(&(lsn + 1).to_be_bytes());
        body.extend_from_slice(&0i64.to_be_bytes());
        body.extend_from_slice(payload);
        let mut f = vec![b'd'];
        f.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        f.extend_from_slice(&body);
        f
    }

    /// A replication stream reading `sock`, nothing buffered, at LSN 0 (`pinged` as given).
    fn stream_over(sock: tokio::io::DuplexStream, pinged: bool) -> ReplicationStream {
        let conn = ReplicationConn {
            sock: Box::new(sock),
            rbuf: BytesMut::new(),
            wbuf: BytesMut::new(),
            target: "test".into(),
            backend_pid: None,
            last_rx: Instant::now(),
        };
        ReplicationStream { conn, last_received: Lsn(0), receiver_timeout: Duration::ZERO, pinged }
    }

    /// `try_next` hands out whole buffered CopyData frames in order, without I/O; a partial frame
    /// or a frame of another kind is left for `next`, which reads the rest or reports it.
    #[tokio::test]
    async fn try_next_takes_only_whole_buffered_copy_data() {
        let (client, mut server) = tokio::io::duplex(64 * 1024);
        let mut s = stream_over(client, false);
        assert!(s.try_next().is_none(), "nothing buffered yet");
        let third = xlog_frame(30, b"Cthird");
        let mut burst = [xlog_frame(10, b"Bfirst"), xlog_frame(20, b"Isecond")].concat();
        burst.extend_from_slice(&third[..7]);
        server.write_all(&burst).await.unwrap();
        let data = |m: WalMessage| match m {
            WalMessage::Data { wal_start, data, .. } => (wal_start, data),
            other => panic!("{other:?}"),
        };
        // `next` reads the burst and gives the first frame; the second is then at hand.
        assert_eq!(data(s.next().await.unwrap()), (Lsn(10), Bytes::from_static(b"Bfirst")));
        assert_eq!(data(s.try_next().unwrap().unwrap()), (Lsn(20), Bytes::from_static(b"Isecond")));
        assert_eq!(s.last_received(), Lsn(21));
        assert!(s.try_next().is_none(), "the third frame is not whole yet");
        server.write_all(&third[7..]).await.unwrap();
        assert_eq!(data(s.next().await.unwrap()), (Lsn(30), Bytes::from_static(b"Cthird")));
        // A frame that is not CopyData (here ErrorResponse) is `next`'s to report.
        let mut err = vec![b'E', 0, 0, 0, 0];
        for (code, text) in [(b'C', "57P01"), (b'M', "terminating")] {
            err.push(code);
            err.extend_from_slice(text.as_bytes());
            err.push(0);
        }
        err.push(0);
        let len = (err.len() - 1) as u32;
        err[1..5].copy_from_slice(&len.to_be_bytes());
        server.write_all(&err).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(s.try_next().is_none());
        assert!(s.next().await.is_err());
        // A CopyData frame too short for its header is an error, not a panic.
        let (client, mut server) = tokio::io::duplex(1024);
        s.conn.sock = Box::new(client);
        s.conn.rbuf.clear();
        server.write_all(&[b'd', 0, 0, 0, 1]).await.unwrap();
        let e = s.next().await.expect_err("a length field below 4 is an error");
        // A corrupt stream reconnects (as when postgres-protocol read these frames); it does not stop outboxd.
        assert!(e.is_transient(), "{e}");
    }

    /// Keepalives are read in place and dropped from the buffer; an XLogData payload is exactly
    /// its frame's body past the 25-byte header; a frame with an unknown tag is an error and is
    /// consumed, so the frames after it still parse.
    #[tokio::test]
    async fn take_copy_data_reads_headers_in_place() {
        let (client, _server) = tokio::io::duplex(1024);
        let mut s = stream_over(client, true);
        let frame = |body: &[u8]| {
            let mut f = vec![b'd'];
            f.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
            f.extend_from_slice(body);
            f
        };
        let mut keepalive = vec![b'k'];
        keepalive.extend_from_slice(&40u64.to_be_bytes());
        keepalive.extend_from_slice(&0i64.to_be_bytes());
        keepalive.push(1);
        let buffered = [
            frame(&keepalive),
            xlog_frame(50, b"Iafter"),
            frame(b"zjunk"),
            xlog_frame(60, b""),
            xlog_frame(70, b"Ctail"),
        ]
        .concat();
        s.conn.rbuf.extend_from_slice(&buffered);
        match s.try_next().unwrap().unwrap() {
            WalMessage::Keepalive { wal_end, reply_requested } => {
                assert_eq!((wal_end, reply_requested), (Lsn(40), true))
            }
            other => panic!("{other:?}"),
        }
        assert!(!s.pinged, "a frame counts as the server's answer");
        match s.try_next().unwrap().unwrap() {
            WalMessage::Data { wal_start, wal_end, data } => {
                assert_eq!((wal_start, wal_end, &data[..]), (Lsn(50), Lsn(51), &b"Iafter"[..]))
            }
            other => panic!("{other:?}"),
        }
        let e = s.try_next().unwrap().expect_err("unknown tag");
        assert!(e.to_string().contains("0x7a"), "{e}");
        match s.try_next().unwrap().unwrap() {
            WalMessage::Data { wal_start, data, .. } => assert_eq!((wal_start, data.len()), (Lsn(60), 0)),
            other => panic!("{other:?}"),
        }
        match s.try_next().unwrap().unwrap() {
            WalMessage::Data { wal_start, data, .. } => assert_eq!((wal_start, &data[..]), (Lsn(70), &b"Ctail"[..])),
            other => panic!("{other:?}"),
        }
        assert!(s.try_next().is_none() && s.conn.rbuf.is_empty());
        assert_eq!(s.last_received(), Lsn(71));
    }

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
