//! The far side of the readers: a fresh one-broker Apache Kafka per scenario (so earlier records
//! do not pile up), started by the project's launcher `scripts/kafka`, optionally with a TLS
//! listener beside the plaintext one (tls scenario); and the webhook receiver of the http drain row.
//!
//! A `Service` is a child process with the port it serves, registered for cleanup at start and
//! stopped (SIGTERM, then reaped) by `stop`. A `Kafka` is a cluster directory: its teardown
//! (`scripts/kafka stop DIR --now`, kill -9) is registered for cleanup before the start, and the
//! launcher watches this driver's PID (`--parent`), so no broker outlives the run. The owner calls
//! `stop` before starting another.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::procs;

pub struct Service {
    pub port: u16,
    pub pid: u32,
    pub log: PathBuf,
    child: Child,
}

impl Service {
    /// Spawns `cmd` with stdout and stderr to `log`, and waits up to 10 s for `port` to listen.
    fn spawn(mut cmd: Command, port: u16, log: PathBuf) -> Result<Service> {
        let f = std::fs::File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .with_context(|| format!("starting {:?}", cmd.get_program()))?;
        let pid = child.id();
        procs::track(pid);
        let svc = Service { port, pid, log, child };
        procs::wait_port(port, 10, &svc.log)?;
        Ok(svc)
    }

    pub fn stop(mut self) {
        procs::terminate(self.pid);
        let _ = self.child.wait();
        procs::untrack(self.pid);
    }
}

/// The listeners a broker serves to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listeners {
    Plaintext,
    /// A plaintext and a TLS listener (DIR/tls/ca.pem is the CA of the latter's certificate).
    PlaintextAndTls,
}

/// A fresh one-broker Apache Kafka (KRaft, broker and controller in one JVM) from `scripts/kafka`.
pub struct Kafka {
    pub dir: PathBuf,
    /// The plaintext listener's port.
    pub port: u16,
    /// The TLS listener's port, when it has one.
    pub tls_port: Option<u16>,
    /// The broker's JVM (DIR/node-1/pid): the process the far-side CPU column counts.
    pub pid: u32,
    teardown: Vec<String>,
}

impl Kafka {
    /// Starts it in `dir` (which must not hold a cluster yet) and waits until it serves metadata.
    pub fn start(dir: &Path, listeners: Listeners) -> Result<Kafka> {
        let dir_s = dir.to_string_lossy().into_owned();
        let teardown: Vec<String> = ["bash", "scripts/kafka", "stop", &dir_s, "--now"].map(str::to_owned).into();
        // Registered first: a signal during the start (~6 s) must not leave the JVM behind either.
        // Cleanup then SIGTERMs the launcher (tracked below) before running the teardown.
        procs::on_cleanup(teardown.clone());
        let parent = std::process::id().to_string();
        let mut cmd = Command::new("bash");
        cmd.args(["scripts/kafka", "start", &dir_s, "--parent", &parent, "--listener", "plaintext"]);
        if listeners == Listeners::PlaintextAndTls {
            cmd.args(["--listener", "ssl"]);
        }
        let started = launch(cmd).context("Apache Kafka did not start (scripts/kafka start)");
        let kafka = started.and_then(|_| {
            let pid = std::fs::read_to_string(dir.join("node-1/pid"))?.trim().parse().context("DIR/node-1/pid")?;
            let tls_port = match listeners {
                Listeners::Plaintext => None,
                Listeners::PlaintextAndTls => Some(bootstrap_port(dir, "ssl")?),
            };
            Ok(Kafka {
                dir: dir.to_owned(),
                port: bootstrap_port(dir, "plaintext")?,
                tls_port,
                pid,
                teardown: teardown.clone(),
            })
        });
        if kafka.is_err() {
            run_quietly(&teardown);
            procs::off_cleanup(&teardown);
        }
        kafka
    }

    /// The CA that signed the TLS listener's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("tls/ca.pem")
    }

    /// Kills the broker (`scripts/kafka stop DIR --now`) and deletes its data (the logs stay).
    pub fn stop(self) {
        run_quietly(&self.teardown);
        procs::off_cleanup(&self.teardown);
        let _ = std::fs::remove_dir_all(self.dir.join("node-1/data"));
    }
}

/// Runs the launcher to completion, tracked while it runs; fails with its stderr when it fails.
fn launch(mut cmd: Command) -> Result<()> {
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let pid = child.id();
    procs::track(pid);
    let out = child.wait_with_output();
    procs::untrack(pid);
    let out = out?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The port of the one broker in DIR/bootstrap.KIND (`127.0.0.1:PORT`).
fn bootstrap_port(dir: &Path, kind: &str) -> Result<u16> {
    let path = dir.join(format!("bootstrap.{kind}"));
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let port = text.trim().rsplit(':').next().and_then(|p| p.parse().ok());
    port.with_context(|| format!("no port in {}: '{}'", path.display(), text.trim()))
}

fn run_quietly(cmd: &[String]) {
    let _ =
        Command::new(&cmd[0]).args(&cmd[1..]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status();
}

/// bench_webhook on a free port; its CPU goes in the far-side column of the http row.
pub fn webhook(examples: &Path, work: &Path) -> Result<Service> {
    let port = procs::free_port()?;
    let mut cmd = Command::new(examples.join("bench_webhook"));
    cmd.args(["--port", &port.to_string()]);
    Service::spawn(cmd, port, work.join("webhook.log"))
}
