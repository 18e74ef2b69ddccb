//! TLS for tokio-postgres (the ordinary connections of [`super::admin`]): the connector of
//! [`super::tls::connector`], and channel-binding data from [`super::tls::server_end_point`],
//! so both connections verify and bind alike.
//!
//! postgres-openssl would do the same but hashes the certificate for `tls-server-end-point` only
//! when its signature OID implies a digest, so a server with an RSA-PSS certificate could not be
//! reached with `channel_binding=require`; PostgreSQL hashes with the digest in the signature's
//! parameters. A failed handshake is a typed [`HandshakeError`] (the OpenSSL error and the verify
//! result), which [`super::admin`] finds in the error's source chain; [`MakeTls::handshake_started`]
//! says whether the server agreed to TLS at all, so a refusal needs no reading of error text.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use openssl::error::ErrorStack;
use openssl::ssl::{ConnectConfiguration, SslConnector};
use openssl::x509::X509VerifyResult;
use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio_openssl::SslStream;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use super::tls;
use crate::config::postgres::TlsSettings;
use crate::error::Definite;

/// Makes a [`Connector`] per host.
#[derive(Clone)]
pub struct MakeTls {
    connector: SslConnector,
    verify_hostname: bool,
    /// Set once a connector made here (or by a clone) begins a handshake, which tokio-postgres
    /// does only after the server answered SSLRequest with `S`.
    started: Arc<AtomicBool>,
}

impl MakeTls {
    /// The admin connection's TLS maker, verifying exactly as the replication connection does
    /// ([`tls::connector`], [`tls::verify_hostname`]) and binding channels with the same
    /// [`tls::server_end_point`].
    pub fn new(settings: &TlsSettings) -> Result<MakeTls, Definite> {
        Ok(MakeTls {
            connector: tls::connector(settings)?,
            verify_hostname: tls::verify_hostname(settings),
            started: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Whether the server agreed to TLS on a connection made with this maker (a handshake began).
    pub fn handshake_started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }
}

impl<S> MakeTlsConnect<S> for MakeTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type TlsConnect = Connector;
    type Error = ErrorStack;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Connector, ErrorStack> {
        let mut ssl = self.connector.configure()?;
        ssl.set_verify_hostname(self.verify_hostname);
        Ok(Connector { ssl, domain: domain.to_owned(), started: self.started.clone() })
    }
}

/// The handshake for one host.
pub struct Connector {
    ssl: ConnectConfiguration,
    domain: String,
    started: Arc<AtomicBool>,
}

impl<S> TlsConnect<S> for Connector
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    #[allow(clippy::type_complexity)]
    type Future = Pin<Box<dyn Future<Output = Result<Stream<S>, Self::Error>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            self.started.store(true, Ordering::Relaxed);
            let ssl = self.ssl.into_ssl(&self.domain)?;
            // Buffered as the replication connection is: many small TLS records per `recv`.
            let mut s = SslStream::new(ssl, BufReader::with_capacity(8192, stream))?;
            match Pin::new(&mut s).connect().await {
                Ok(()) => Ok(Stream(s)),
                Err(error) => Err(Box::new(HandshakeError { error, verify: s.ssl().verify_result() }) as _),
            }
        })
    }
}

/// A failed handshake: OpenSSL's error, then why the certificate did not verify (if it did not).
#[derive(Debug)]
pub struct HandshakeError {
    error: openssl::ssl::Error,
    verify: X509VerifyResult,
}

impl HandshakeError {
    /// Why the server's certificate did not verify; `None` when it did (or was not checked) and
    /// the handshake failed for another reason.
    pub fn verify_failure(&self) -> Option<&'static str> {
        (self.verify != X509VerifyResult::OK).then(|| self.verify.error_string())
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)?;
        if self.verify != X509VerifyResult::OK {
            write!(f, ": {}", self.verify)?;
        }
        Ok(())
    }
}

impl std::error::Error for HandshakeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// An established TLS stream.
pub struct Stream<S>(SslStream<BufReader<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for Stream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        match tls::server_end_point(self.0.ssl()) {
            Some(data) => ChannelBinding::tls_server_end_point(data),
            None => ChannelBinding::none(),
        }
    }
}
