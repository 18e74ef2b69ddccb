//! The TLS part of a [`super::PgTarget`]: libpq's `sslmode`, `sslrootcert`, `sslcert`, `sslkey`,
//! `sslcrl`, `sslpassword` and `channel_binding`, read from the conninfo or libpq's environment
//! (`PGSSLMODE`, ...) with libpq's defaults (`~/.postgresql/root.crt` and friends).
//!
//! Invariants: a mode that verifies always has a root to verify against; `require` with a root
//! certificate is upgraded to `verify-ca` as libpq does, while the mode as written is kept for
//! messages; every file named is readable when the target is built, so a typo fails at start-up
//! with the key and the path, not at the first connection.

use std::path::PathBuf;

use crate::error::Definite;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    fn parse(v: &str) -> Option<SslMode> {
        Some(match v {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// The server's certificate is checked against a root (verify-ca and stronger).
    pub fn verifies(self) -> bool {
        self >= SslMode::VerifyCa
    }
}

/// Trusted roots for the server certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootCert {
    File(PathBuf),
    /// The operating system's roots (`sslrootcert=system`).
    System,
}

/// TLS settings of both connections, libpq's keywords.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// Effective mode: `require` with a root certificate is already upgraded to `verify-ca`.
    pub mode: SslMode,
    /// The mode as written (for `outboxd config` and messages).
    pub mode_given: SslMode,
    pub root_cert: Option<RootCert>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub crl: Option<PathBuf>,
    /// Passphrase of an encrypted `sslkey`.
    pub key_password: Option<String>,
}

/// libpq's `channel_binding`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelBindingMode {
    Disable,
    Prefer,
    Require,
}

pub(super) fn tls_settings(
    get: &dyn Fn(&str) -> Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<TlsSettings, Definite> {
    let bad = |why: String| Definite::Config(format!("--postgres-url: {why}"));
    let pick = |k: &str, e: &str| get(k).or_else(|| env(e)).filter(|v| !v.is_empty());
    let home_file = |name: &str| {
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".postgresql").join(name)).filter(|p| p.exists())
    };
    let root_cert = match pick("sslrootcert", "PGSSLROOTCERT") {
        Some(v) if v == "system" => Some(RootCert::System),
        Some(v) => Some(RootCert::File(readable("sslrootcert", &v)?)),
        None => home_file("root.crt").map(RootCert::File),
    };
    let mode_given = match pick("sslmode", "PGSSLMODE") {
        Some(v) => SslMode::parse(&v).ok_or_else(|| {
            bad(format!("unknown sslmode {v:?}; use disable, allow, prefer, require, verify-ca or verify-full"))
        })?,
        // libpq: sslrootcert=system without an sslmode means verify-full.
        None if root_cert == Some(RootCert::System) => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if root_cert == Some(RootCert::System) && mode_given != SslMode::VerifyFull {
        return Err(bad(format!(
            "sslrootcert=system needs sslmode=verify-full (sslmode={} would not check the host name)",
            mode_given.as_str()
        )));
    }
    // libpq: `require` with a root certificate present verifies the chain, as verify-ca.
    let mode = if mode_given == SslMode::Require && root_cert.is_some() { SslMode::VerifyCa } else { mode_given };
    if mode.verifies() && root_cert.is_none() {
        return Err(bad(format!(
            "sslmode={} needs the CA that signed the server's certificate: pass sslrootcert=/path/to/ca.pem \
             (or sslrootcert=system for the OS roots with verify-full)",
            mode.as_str()
        )));
    }
    let cert = match pick("sslcert", "PGSSLCERT") {
        Some(v) => Some(readable("sslcert", &v)?),
        None => home_file("postgresql.crt"),
    };
    let key = match pick("sslkey", "PGSSLKEY") {
        Some(v) => Some(readable("sslkey", &v)?),
        None => cert.as_ref().and_then(|_| home_file("postgresql.key")),
    };
    if cert.is_some() != key.is_some() {
        return Err(bad("sslcert and sslkey go together: give both (client-certificate login) or neither".into()));
    }
    let crl = pick("sslcrl", "PGSSLCRL").map(|v| readable("sslcrl", &v)).transpose()?;
    Ok(TlsSettings { mode, mode_given, root_cert, cert, key, crl, key_password: get("sslpassword") })
}

fn readable(key: &str, v: &str) -> Result<PathBuf, Definite> {
    let p = PathBuf::from(v);
    std::fs::File::open(&p).map_err(|e| {
        Definite::Config(format!("--postgres-url: {key}={v}: cannot read the file ({e}); fix the path"))
    })?;
    Ok(p)
}
