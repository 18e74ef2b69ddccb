//! TLS to PostgreSQL, with libpq's `sslmode` semantics, for both connections.
//!
//! One OpenSSL stack serves the whole process: librdkafka needs OpenSSL for Kafka TLS anyway, so
//! the PostgreSQL side uses the same library (one set of CA paths, one `SSL_CERT_FILE`, one thing
//! to patch), through `tokio-openssl` on both connections (tokio-postgres's side is
//! [`super::admin_tls`], which builds on this module; nothing here uses it). Both get their connector from [`connector`], so they verify alike:
//!
//! | sslmode | chain checked | host name checked |
//! |---|---|---|
//! | `allow`, `prefer`, `require` (no root cert) | no | no |
//! | `verify-ca` (and `require` with a root cert) | yes | no |
//! | `verify-full` | yes | yes |
//!
//! The server's one-byte answer to SSLRequest is read straight from the socket, before any
//! buffering, so bytes a man in the middle appends to it cannot be taken as TLS-protected
//! (CVE-2021-23222). Trust is exactly what `sslrootcert` names, as in libpq: a file means only the
//! certificates in it, `system` the system store. OpenSSL's `SslConnector::builder` always loads
//! the system store, so the connector starts from an empty store instead (which also spares the
//! modes that verify nothing the cost of reading the whole CA bundle per connection).
//! Failures that retrying cannot fix (a certificate that does not verify, a
//! server without TLS under `require`) are [`Definite::Config`] errors whose one line names
//! host:port, the sslmode, the reason and the fix.

use std::path::Path;
use std::pin::Pin;

use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::PKey;
use openssl::ssl::{SslConnector, SslMethod, SslRef, SslVerifyMode, SslVersion};
use openssl::x509::store::{X509Lookup, X509StoreBuilder};
use openssl::x509::verify::X509VerifyFlags;
use openssl::x509::X509Ref;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

use crate::config::postgres::{RootCert, TlsSettings};
use crate::config::SslMode;
use crate::error::{Definite, Error, Transient};

/// Build the OpenSSL connector the settings describe. Bad files are configuration errors.
pub fn connector(tls: &TlsSettings) -> Result<SslConnector, Definite> {
    let cfg_err = |what: &str, e: openssl::error::ErrorStack| {
        Definite::Config(format!("--postgres-url: {what}: {e}; check the file is PEM and matches the others"))
    };
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(|e| cfg_err("initialising OpenSSL", e))?;
    // The builder trusts the system store; start from nothing and add what sslrootcert names.
    let empty = X509StoreBuilder::new().map_err(|e| cfg_err("initialising OpenSSL", e))?.build();
    b.set_cert_store(empty);
    b.set_min_proto_version(Some(SslVersion::TLS1_2)).map_err(|e| cfg_err("TLS version", e))?;
    if tls.mode.verifies() {
        b.set_verify(SslVerifyMode::PEER);
        match &tls.root_cert {
            Some(RootCert::File(f)) => {
                b.set_ca_file(f).map_err(|e| cfg_err(&format!("sslrootcert={}", f.display()), e))?
            }
            Some(RootCert::System) => b.set_default_verify_paths().map_err(|e| cfg_err("sslrootcert=system", e))?,
            None => return Err(Definite::Bug("verify mode without a root certificate".into())),
        }
        if let Some(crl) = &tls.crl {
            let lookup = b
                .cert_store_mut()
                .add_lookup(X509Lookup::file())
                .map_err(|e| cfg_err(&format!("sslcrl={}", crl.display()), e))?;
            lookup
                .load_crl_file(crl, openssl::ssl::SslFiletype::PEM)
                .map_err(|e| cfg_err(&format!("sslcrl={}", crl.display()), e))?;
            b.cert_store_mut()
                .set_flags(X509VerifyFlags::CRL_CHECK)
                .map_err(|e| cfg_err(&format!("sslcrl={}", crl.display()), e))?;
        }
    } else {
        b.set_verify(SslVerifyMode::NONE);
    }
    if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
        b.set_certificate_chain_file(cert).map_err(|e| cfg_err(&format!("sslcert={}", cert.display()), e))?;
        let pem = std::fs::read(key)
            .map_err(|e| Definite::Config(format!("--postgres-url: sslkey={}: cannot read it ({e})", key.display())))?;
        let pkey = match &tls.key_password {
            Some(pw) => PKey::private_key_from_pem_passphrase(&pem, pw.as_bytes()),
            None => PKey::private_key_from_pem(&pem),
        }
        .map_err(|_| key_error(key, tls.key_password.is_some()))?;
        b.set_private_key(&pkey).map_err(|e| cfg_err(&format!("sslkey={}", key.display()), e))?;
        b.check_private_key().map_err(|e| cfg_err("sslcert and sslkey do not match", e))?;
    }
    Ok(b.build())
}

fn key_error(key: &Path, had_password: bool) -> Definite {
    Definite::Config(format!(
        "--postgres-url: sslkey={} is not a readable PEM private key{}",
        key.display(),
        if had_password { " (or sslpassword is wrong)" } else { "; if it is encrypted, pass sslpassword=..." }
    ))
}

/// Whether to check the host name for this mode.
pub fn verify_hostname(tls: &TlsSettings) -> bool {
    tls.mode == SslMode::VerifyFull
}

/// Outcome of asking a server for TLS on a fresh TCP socket.
pub enum Negotiated {
    /// TLS over a read-buffered socket: the walsender sends each message as its own small TLS
    /// record, and OpenSSL reads a record in two calls (header, body); the buffer turns those
    /// into one `recv` per many records. Only after the SSLRequest answer, which is read
    /// unbuffered (CVE-2021-23222: nothing sent before the handshake may be taken as TLS data).
    Tls(Box<SslStream<BufReader<TcpStream>>>),
    /// The server said no and the mode allows plaintext.
    Plain(TcpStream),
}

/// Send SSLRequest and, if the server agrees, run the TLS handshake.
pub async fn negotiate(mut tcp: TcpStream, host: &str, port: u16, tls: &TlsSettings) -> Result<Negotiated, Error> {
    let where_ = format!("{host}:{port}");
    let io = |source| Transient::PgIo { target: where_.clone(), source };
    let mut req = bytes::BytesMut::new();
    postgres_protocol::message::frontend::ssl_request(&mut req);
    tcp.write_all(&req).await.map_err(io)?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.map_err(io)?;
    match answer[0] {
        b'S' => {}
        b'N' if tls.mode <= SslMode::Prefer => return Ok(Negotiated::Plain(tcp)),
        b'N' => return Err(not_offered(&where_, tls).into()),
        // An ErrorResponse here is a pre-7.x server or not PostgreSQL at all.
        other => {
            return Err(Definite::Config(format!(
                "{where_} answered SSLRequest with byte 0x{other:02x}, not S or N: is it PostgreSQL?"
            ))
            .into())
        }
    }
    let cfg_err = |e: openssl::error::ErrorStack| Definite::Config(format!("TLS setup for {where_}: {e}"));
    let mut conf = connector(tls)?.configure().map_err(cfg_err)?;
    conf.set_verify_hostname(verify_hostname(tls));
    let ssl = conf.into_ssl(host).map_err(cfg_err)?;
    let mut stream = SslStream::new(ssl, BufReader::with_capacity(64 * 1024, tcp)).map_err(cfg_err)?;
    if let Err(e) = Pin::new(&mut stream).connect().await {
        let verify = stream.ssl().verify_result();
        let reason = if verify != openssl::x509::X509VerifyResult::OK {
            verify.error_string().to_owned()
        } else {
            e.to_string()
        };
        return Err(handshake_failure(&where_, tls, &reason, verify != openssl::x509::X509VerifyResult::OK));
    }
    Ok(Negotiated::Tls(Box::new(stream)))
}

/// The server said no to TLS, and `sslmode` requires it.
pub fn not_offered(where_: &str, tls: &TlsSettings) -> Definite {
    Definite::Config(format!(
        "PostgreSQL at {where_} does not accept TLS (sslmode={}): turn ssl on in postgresql.conf, or use \
         sslmode=prefer to allow plaintext",
        tls.mode_given.as_str()
    ))
}

/// A failed handshake: a certificate problem is definite and says what to pass; anything else
/// (the link dropped mid-handshake) is transient.
pub fn handshake_failure(where_: &str, tls: &TlsSettings, reason: &str, verify_failed: bool) -> Error {
    let lower = reason.to_ascii_lowercase();
    let mode = tls.mode_given.as_str();
    if !verify_failed && !lower.contains("certificate") && !lower.contains("alert") {
        return Transient::PgIo {
            target: where_.to_owned(),
            source: std::io::Error::other(format!("TLS handshake failed: {reason}")),
        }
        .into();
    }
    let fix = if lower.contains("hostname mismatch") || lower.contains("ip address mismatch") {
        "connect with a host name the server's certificate lists, or use sslmode=verify-ca to check only the chain"
    } else if lower.contains("expired") || lower.contains("not yet valid") {
        "renew the server's certificate (or check this machine's clock)"
    } else if lower.contains("revoked") {
        "the server's certificate is revoked by sslcrl: give the server a new certificate"
    } else if lower.contains("alert") && tls.cert.is_some() {
        "the server refused our client certificate: check sslcert/sslkey and the server's ssl_ca_file"
    } else if lower.contains("alert") {
        "the server wants a client certificate: pass sslcert=/path/client.crt sslkey=/path/client.key"
    } else {
        "pass sslrootcert=/path/to/ca.pem with the CA that signed the server's certificate"
    };
    Definite::Config(format!("TLS to PostgreSQL at {where_} failed (sslmode={mode}): {reason}; {fix}")).into()
}

/// `tls-server-end-point` channel-binding data (RFC 5929): the server certificate hashed with
/// the digest of its signature, SHA-256 for MD5 and SHA-1. The digest is found as PostgreSQL's
/// server finds it (`be_tls_get_certificate_hash`, with `X509_get_signature_info`), so an RSA-PSS
/// signature hashes with the digest in its parameters. `None` when the signature has no digest
/// PostgreSQL could use (Ed25519): the server cannot bind such a channel either.
pub fn server_end_point(ssl: &SslRef) -> Option<Vec<u8>> {
    let cert = ssl.peer_certificate()?;
    let digest = match signature_digest(&cert)? {
        Nid::MD5 | Nid::SHA1 => MessageDigest::sha256(),
        nid => MessageDigest::from_nid(nid)?,
    };
    cert.digest(digest).ok().map(|d| d.to_vec())
}

extern "C" {
    // OpenSSL 1.1.1 and later; openssl-sys has no binding for it.
    fn X509_get_signature_info(
        x: *mut std::ffi::c_void,
        mdnid: *mut std::ffi::c_int,
        pknid: *mut std::ffi::c_int,
        secbits: *mut std::ffi::c_int,
        flags: *mut u32,
    ) -> std::ffi::c_int;
}

/// The digest of a certificate's signature; for RSA-PSS the one its parameters name, which
/// `Nid::signature_algorithms` cannot see (it knows only OIDs that imply a digest).
fn signature_digest(cert: &X509Ref) -> Option<Nid> {
    use foreign_types::ForeignTypeRef;
    let mut md: std::ffi::c_int = 0;
    let null = std::ptr::null_mut();
    // SAFETY: `cert` is a live X509 for the call; OpenSSL only reads it (and fills its internal,
    // locked extension cache); the out pointers are either valid or null, which it allows.
    let ok = unsafe { X509_get_signature_info(cert.as_ptr().cast(), &mut md, null, null, std::ptr::null_mut()) };
    (ok == 1 && md != Nid::UNDEF.as_raw()).then(|| Nid::from_raw(md))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(pem: &str) -> openssl::x509::X509 {
        openssl::x509::X509::from_pem(pem.as_bytes()).unwrap()
    }

    /// The digest comes from the signature's parameters for RSA-PSS (the OID names none), and
    /// from the OID otherwise; server_end_point then maps SHA-1 to SHA-256.
    #[test]
    fn the_signature_digest_is_the_one_postgresql_hashes_with() {
        let pss = cert(include_str!("../../tests/data/cert-rsa-pss-sha384.pem"));
        assert_eq!(pss.signature_algorithm().object().nid(), Nid::RSASSAPSS);
        assert_eq!(signature_digest(&pss), Some(Nid::SHA384));
        let sha1 = cert(include_str!("../../tests/data/cert-rsa-sha1.pem"));
        assert_eq!(signature_digest(&sha1), Some(Nid::SHA1));
    }
}
