//! What a failed tokio-postgres connect means: one line per way an ordinary connection can fail,
//! decided from types and from what we asked, never from the error's text.
//!
//! * The server refused the login (an `ErrorResponse`): its SQLSTATE, in [`crate::pg::login`],
//!   shared with the walsender connection.
//! * Our TLS connector failed ([`HandshakeError`] or an OpenSSL error stack in the source chain):
//!   [`tls::handshake_failure`], as the walsender connection decides it.
//! * The socket failed (an `io::Error` in the chain) or closed: transient, the server may be
//!   restarting.
//! * Otherwise tokio-postgres stopped the login itself, and what we asked says why: TLS was
//!   required but no handshake began (the server said no), no password was given (the server
//!   asked for one), or `channel_binding=require` (the server did not bind). Anything left is
//!   transient, as an unexplained failure was before.

use tokio_postgres::config::SslMode as DriverSslMode;

use crate::config::postgres::ChannelBindingMode;
use crate::config::PgTarget;
use crate::error::{Error, Transient};
use crate::pg::admin_tls::{HandshakeError, MakeTls};
use crate::pg::hosts::Attempt;
use crate::pg::{login, tls};

/// The error for a failed connect of `a`, given how it was asked (`pg`) and the TLS maker used.
pub(super) fn connect_error(
    target: &PgTarget,
    a: &Attempt,
    pg: &tokio_postgres::Config,
    maker: Option<&MakeTls>,
    e: tokio_postgres::Error,
) -> Error {
    if let Some(db) = e.as_db_error() {
        return login::refused(target, login::Conn::Ordinary, db.code().code(), db.message());
    }
    let text = full_text(&e);
    let where_ = a.shown();
    if let Some(h) = in_chain::<HandshakeError>(&e) {
        return match h.verify_failure() {
            Some(reason) => tls::handshake_failure(&where_, &target.tls, reason, true),
            None => tls::handshake_failure(&where_, &target.tls, &text, false),
        };
    }
    if in_chain::<openssl::error::ErrorStack>(&e).is_some() {
        return tls::handshake_failure(&where_, &target.tls, &text, false);
    }
    if e.is_closed() || in_chain::<std::io::Error>(&e).is_some() {
        return unreachable(target, &text);
    }
    let tls_asked = pg.get_ssl_mode() == DriverSslMode::Require;
    if tls_asked && !maker.is_some_and(MakeTls::handshake_started) {
        return tls::not_offered(&where_, &target.tls).into();
    }
    if a.password(target).is_none() {
        return login::password_missing_inferred(target, &text).into();
    }
    if target.channel_binding == ChannelBindingMode::Require {
        return crate::error::Definite::Config(format!(
            "channel_binding=require, but PostgreSQL at {where_} did not log us in with SCRAM-SHA-256-PLUS \
             ({text}): use TLS with scram-sha-256 in pg_hba.conf, or channel_binding=prefer"
        ))
        .into();
    }
    unreachable(target, &text)
}

/// The server could not be reached or dropped the connection: it may be back soon.
fn unreachable(target: &PgTarget, text: &str) -> Error {
    Transient::PgServer {
        code: "08001".into(),
        message: format!(
            "cannot reach PostgreSQL at {target}: {text}; check host, port and that the server is running"
        ),
    }
    .into()
}

/// The first error of type `T` in `e`'s source chain.
fn in_chain<'e, T: std::error::Error + 'static>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e T> {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if let Some(t) = x.downcast_ref::<T>() {
            return Some(t);
        }
        cur = x.source();
    }
    None
}

/// The error and its sources on one line (tokio-postgres keeps the OpenSSL reason in a source).
pub(super) fn full_text(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let t = x.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = x.source();
    }
    s
}
