//! The daemon under test: [`Outboxd`] (spawned with its log captured), one-shot runs, and the
//! argument lists most tests start it with.

use super::*;
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
