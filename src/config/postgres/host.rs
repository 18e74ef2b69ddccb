//! One server address of a conninfo: a TCP host name or a Unix socket directory, and libpq's
//! default socket directory. Below both [`super`] (which parses hosts into a [`super::PgTarget`])
//! and [`crate::config::pgpass`] (which matches each host against the password file), so neither
//! needs the other's items.

use std::path::PathBuf;

/// One host to try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PgHost {
    Tcp(String),
    /// Directory holding `.s.PGSQL.<port>`.
    Unix(PathBuf),
}

/// libpq's default socket directory on Debian.
pub(crate) const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";
