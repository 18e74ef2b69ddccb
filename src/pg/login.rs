//! What a refused connection means, for both PostgreSQL client stacks (the ordinary connections of
//! [`super::admin`] and the walsender connection of [`super::replication`]): one place, one text.
//!
//! Decisions come from the SQLSTATE and from what we asked for (`sslmode`, a client certificate),
//! never from the server's message text, which `lc_messages` may translate. The message is quoted
//! as the server wrote it; the hints name what to change for each way the SQLSTATE can arise.

use crate::config::{PgTarget, SslMode};
use crate::error::{Definite, Error, Transient};

/// Which connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conn {
    /// An ordinary connection (catalog checks, `poll`, `backfill`, the tools).
    Ordinary,
    /// The walsender connection of `run`.
    Replication,
}

/// The error for a connection the server refused with `code` (SQLSTATE) and `message`.
pub fn refused(t: &PgTarget, conn: Conn, code: &str, message: &str) -> Error {
    match code {
        "28P01" => Definite::Setup(format!(
            "password authentication failed for user {:?} at {t}: check the password (--postgres-url, \
             --postgres-password-file, PGPASSWORD or ~/.pgpass)",
            t.user
        ))
        .into(),
        // pg_hba.conf has no line that takes this login: which line is missing depends on how we
        // came, so say each that applies. Every fix is a setting, ours or the server's.
        "28000" => {
            let mut hints = Vec::new();
            if conn == Conn::Replication {
                hints.push("the role needs REPLICATION and pg_hba.conf a 'replication' line for it".to_owned());
            }
            if t.tls.mode <= SslMode::Prefer {
                hints.push(format!(
                    "if pg_hba.conf takes this login only over TLS (hostssl), sslmode={} may have sent it in \
                     plaintext: use sslmode=require or stronger",
                    t.tls.mode_given.as_str()
                ));
            }
            if t.tls.mode > SslMode::Disable {
                hints.push(match t.tls.cert {
                    Some(_) => "with a client certificate (pg_hba.conf cert), its CN must be the user name, or \
                                be mapped in pg_ident.conf"
                        .to_owned(),
                    None => "if pg_hba.conf asks for a client certificate (cert), pass sslcert= and sslkey=".to_owned(),
                });
            }
            let what = if conn == Conn::Replication { "the replication login" } else { "the login" };
            Definite::Config(format!("PostgreSQL at {t} refused {what} ({message}): {}", hints.join("; "))).into()
        }
        "3D000" => Definite::Setup(format!(
            "database {:?} does not exist at {t}: fix the database in --postgres-url",
            t.dbname
        ))
        .into(),
        "42501" if conn == Conn::Replication => {
            Definite::Setup(format!("{message} at {t}: grant the role REPLICATION (ALTER ROLE {} REPLICATION)", t.user))
                .into()
        }
        c if crate::error::sqlstate_is_transient(c) => {
            Transient::PgServer { code: c.to_owned(), message: message.to_owned() }.into()
        }
        c => Definite::Setup(format!("PostgreSQL at {t} refused the connection: {message} ({c})")).into(),
    }
}

/// The server asked for a password and none was given (none in the conninfo, the password file
/// flag, `PGPASSWORD` or the password file): known before the login, so no server text is read.
pub fn password_missing(t: &PgTarget) -> Definite {
    Definite::Setup(format!(
        "PostgreSQL at {t} asks for a password, but none was given: put it in --postgres-url, \
         --postgres-password-file, PGPASSWORD or ~/.pgpass"
    ))
}

/// [`password_missing`], when it is inferred (no password was given and the login failed in the
/// client, neither by a server error nor by a socket error): the client's own words follow, in case
/// the server asked for something else (an authentication method the client does not speak).
pub fn password_missing_inferred(t: &PgTarget, client_said: &str) -> Definite {
    match password_missing(t) {
        Definite::Setup(m) => Definite::Setup(format!("{m} (the client said: {client_said})")),
        other => other,
    }
}
