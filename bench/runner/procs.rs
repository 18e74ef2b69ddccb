//! The processes and clusters the benchmark starts, and their cleanup.
//!
//! Invariant: everything long-lived the driver starts (Kafka brokers, receivers, outboxd under
//! test, PostgreSQL clusters) is registered here the moment it exists, and `cleanup` stops all of
//! it: at the end of the run, on an error, and on SIGINT/SIGTERM (a watcher thread). Nothing is
//! stopped by name; only the PIDs, data directories and teardown commands registered here (a
//! Kafka cluster is registered as `scripts/kafka stop DIR --now`, which kills the PIDs in DIR).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

struct Registry {
    pids: Vec<u32>,
    /// (pg_ctl, data directory) of every cluster started.
    clusters: Vec<(PathBuf, PathBuf)>,
    /// Commands to run at cleanup (e.g. deleting the RabbitMQ queue), in registration order.
    teardown: Vec<Vec<String>>,
    /// The work directory, removed at cleanup unless it is to be kept.
    work: Option<(PathBuf, bool)>,
    done: bool,
}

static REGISTRY: Mutex<Registry> =
    Mutex::new(Registry { pids: Vec::new(), clusters: Vec::new(), teardown: Vec::new(), work: None, done: false });

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut r = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut r)
}

pub fn track(pid: u32) {
    with(|r| r.pids.push(pid));
}

pub fn untrack(pid: u32) {
    with(|r| r.pids.retain(|p| *p != pid));
}

pub fn track_cluster(pg_ctl: PathBuf, data: PathBuf) {
    with(|r| r.clusters.push((pg_ctl, data)));
}

pub fn on_cleanup(cmd: Vec<String>) {
    with(|r| r.teardown.push(cmd));
}

/// Drops a teardown command registered by `on_cleanup` (its owner has run it already).
pub fn off_cleanup(cmd: &[String]) {
    with(|r| r.teardown.retain(|c| c.as_slice() != cmd));
}

pub fn track_work(dir: PathBuf, keep: bool) {
    with(|r| r.work = Some((dir, keep)));
}

/// Sends SIGTERM to one process.
pub fn terminate(pid: u32) {
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).stderr(Stdio::null()).status();
}

/// Stops everything registered, once. A second caller (the main thread after a signal) waits
/// until the first has finished, so the process never exits halfway through.
pub fn cleanup() {
    let mut r = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    if r.done {
        return;
    }
    r.done = true;
    for pid in std::mem::take(&mut r.pids) {
        terminate(pid);
    }
    for cmd in std::mem::take(&mut r.teardown) {
        let _ = Command::new(&cmd[0]).args(&cmd[1..]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
    for (pg_ctl, data) in std::mem::take(&mut r.clusters) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(pg_ctl)
            .arg("-D")
            .arg(data)
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    match r.work.take() {
        Some((dir, true)) => println!("work dir kept: {}", dir.display()),
        Some((dir, false)) => {
            let _ = std::fs::remove_dir_all(dir);
        }
        None => {}
    }
}

/// A thread that runs `cleanup` and exits on SIGINT or SIGTERM, so an interrupted run leaves no
/// cluster or broker behind.
pub fn cleanup_on_signal() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::spawn(move || {
        rt.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            eprintln!("bench/run: interrupted; stopping what it started");
            cleanup();
            std::process::exit(130);
        })
    });
    Ok(())
}

/// A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's choice).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

/// Waits up to `secs` for something to listen on `port`; on failure shows the tail of `log`.
pub fn wait_port(port: u16, secs: u64, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if listening(port) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("nothing listens on {port}; see {}:\n{}", log.display(), tail(log, 20))
}

/// Waits up to `secs` for `needle` to appear in the file `path`.
pub fn wait_for_text(path: &Path, needle: &str, secs: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if std::fs::read_to_string(path).is_ok_and(|s| s.contains(needle)) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out waiting for '{needle}' in {}:\n{}", path.display(), tail(path, 20))
}

/// The last `n` lines of a log file, for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs a command to completion; its stdout as text. Fails with its stderr when it fails.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).output()?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A `bash -c` running one function of `scripts/lib.sh` with arguments.
pub fn lib_sh(function: &str, args: &[&str]) -> Command {
    let mut c = Command::new("bash");
    c.arg("-c").arg(format!("source scripts/lib.sh && {function} \"$@\"")).arg("lib.sh").args(args);
    c
}
