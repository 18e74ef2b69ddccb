//! Shared integration-test harness for `outboxd`.
//!
//! Every test gets its own throw-away infrastructure:
//!
//! * [`PgCluster`] — a private PostgreSQL cluster (`initdb` into a tempdir,
//!   `wal_level = logical`, a free TCP port on 127.0.0.1 plus a unix socket in
//!   the tempdir), with database `app`, a SUPERUSER/REPLICATION role
//!   `outboxd` (SCRAM password [`PASSWORD`]) and a role `md5user` whose
//!   password is stored as MD5 (password [`MD5_PASSWORD`]).
//! * [`Broker`] — a private Apache Kafka cluster (KRaft) from `scripts/kafka`, the launcher users
//!   run too: one broker by default, more with [`Broker::options`]; see [`kafka`].
//! * [`debezium::Debezium`] — Debezium 3.6.1.Final on a Kafka Connect standalone worker, from
//!   `scripts/debezium`, for tests that compare outboxd with it.
//! * [`Outboxd`] — the daemon under test (`CARGO_BIN_EXE_outboxd`) with its
//!   stdout+stderr captured in a log file; [`run_to_exit`] for one-shot runs.
//!
//! Everything is torn down on `Drop` (processes killed, tempdirs removed).
//!
//! Server binaries must not run as root, so PostgreSQL is started as the
//! `postgres` OS user through `runuser` whenever the tests run as root.
//!
//! Other PostgreSQL major versions: [`PgCluster::start_version`] runs the server
//! binaries installed by `scripts/lib.sh`'s `ensure_pg_version MAJOR` into
//! `/opt/outboxd-pg/MAJOR/bin` (see [`pg_version_available`]); psql stays the
//! default installation's client (15), which talks to older servers.
//!
//! The harness is split by role: [`postgres`], [`kafka`], [`process`] (the daemon), [`assertions`],
//! and the services of single tests ([`debezium`], [`webhook`], [`netfault`], [`certs`], ...); this
//! file keeps what they all use (ports, waiting, tempdirs).
//!
//! Environment overrides: `PG_BINDIR` (directory with `initdb`/`pg_ctl`),
//! `KAFKA_LIBS` (the Kafka jars' directory, see `scripts/kafka`), `OUTBOXD_TEST_KEEP=1` (keep
//! tempdirs of dropped clusters/brokers/daemons for post-mortem inspection).
#![allow(dead_code)]

pub mod assertions;
pub mod aws;
pub mod aws_auth;
pub mod certs;
pub mod debezium;
pub mod dlq_copies;
pub mod inbox;
pub mod kafka;
pub mod netfault;
pub mod pg_tls;
pub mod poll;
pub mod postgres;
pub mod process;
pub mod registry;
pub mod secure_kafka;
pub mod webhook;

#[allow(unused_imports)]
pub use assertions::*;
#[allow(unused_imports)]
pub use kafka::{Broker, BrokerOptions, Consumed};
#[allow(unused_imports)]
pub use postgres::*;
#[allow(unused_imports)]
pub use process::*;

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Password of the `outboxd` role (stored as SCRAM-SHA-256).
pub const PASSWORD: &str = "secret-pw";
/// Name of the main test role (LOGIN REPLICATION SUPERUSER).
pub const USER: &str = "outboxd";
/// A role whose password is stored as MD5 (LOGIN REPLICATION SUPERUSER).
pub const MD5_USER: &str = "md5user";
/// Password of [`MD5_USER`].
pub const MD5_PASSWORD: &str = "md5-secret-pw";
/// Database created in every [`PgCluster`].
pub const DB: &str = "app";

// ---------------------------------------------------------------------------
// generic helpers
// ---------------------------------------------------------------------------

/// Ports handed out by [`free_port`] in this process, so that two tests in
/// the same binary never get the same one.
fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A TCP port on 127.0.0.1 that was free a moment ago and has not been
/// returned before by this process.  Another process may still grab it, so
/// callers that bind it in a child process retry with a fresh port on failure.
pub fn free_port() -> u16 {
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind 127.0.0.1:0").port();
        if handed_out().lock().unwrap().insert(port) {
            return port;
        }
    }
    panic!("could not find a fresh free port");
}

/// Polls `f` every 50 ms until it returns true (→ `true`) or `timeout`
/// passes (→ `false`).  `f` is always called at least once.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Async flavour of [`wait_until`] (does not block the runtime thread).
pub async fn wait_until_async<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `true` if something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_open(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Directory holding the repository's SQL files (`sql/01_outbox.sql`, ...).
pub fn sql_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("sql")
}

/// The `sql/*.sql` files in apply order (sorted by name).
pub fn sql_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(sql_dir())
        .expect("read sql/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    files
}

/// `prefix-<pid>-<n>`: unique within this machine for the life of the process
/// (handy for slot, topic and group names).
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

fn keep_tempdirs() -> bool {
    std::env::var_os("OUTBOXD_TEST_KEEP").is_some_and(|v| v != "0" && !v.is_empty())
}

fn make_tempdir(prefix: &str) -> TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().expect("create tempdir")
}

/// Removes (or, with `OUTBOXD_TEST_KEEP`, leaks and prints) a tempdir.
fn dispose_tempdir(dir: Option<TempDir>, what: &str) {
    if let Some(dir) = dir {
        if keep_tempdirs() {
            eprintln!("[harness] keeping {what} dir {}", dir.keep().display());
        }
    }
}

fn is_root() -> bool {
    // No libc dependency: ask `id`.
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
    })
}

/// Sends `signal` (e.g. "STOP", "CONT", "TERM", "KILL") to `pid` via kill(1).
pub fn send_signal(pid: u32, signal: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn read_lossy(path: &Path) -> String {
    fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

fn describe(out: &Output) -> String {
    format!(
        "status: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
