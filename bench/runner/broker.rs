//! The far side of the readers: a fresh in-memory tansu per scenario (so earlier records do not
//! pile up), the proxies the tls scenario puts in front of other tansus (stunnel for TLS, socat
//! for a plain hop), and the webhook receiver of the http drain row.
//!
//! Each is a `Service`: a child process with the port it serves, registered for cleanup at start
//! and stopped (SIGTERM, then reaped) by `stop`, which the owner calls before starting another.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

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

/// tansu with in-memory storage in `dir`, listening on a free port and advertising `advertised`
/// (its own port when `None`; a proxy's when one sits in front of it).
pub fn tansu(dir: &Path, port: u16, advertised: Option<u16>) -> Result<Service> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = Command::new("tansu");
    cmd.current_dir(dir).args([
        "broker",
        "--listener-url",
        &format!("tcp://127.0.0.1:{port}"),
        "--advertised-listener-url",
        &format!("tcp://127.0.0.1:{}", advertised.unwrap_or(port)),
        "--storage-engine",
        "memory://tansu/",
    ]);
    Service::spawn(cmd, port, dir.join("log")).context("tansu did not start")
}

/// A tansu behind a proxy: the broker advertises the proxy's port, so clients come back through it.
pub struct Proxied {
    pub proxy: Service,
    pub broker: Service,
}

impl Proxied {
    /// The proxy's port: where clients connect.
    pub fn port(&self) -> u16 {
        self.proxy.port
    }

    /// The processes whose CPU the far-side column counts.
    pub fn pids(&self) -> Vec<u32> {
        vec![self.broker.pid, self.proxy.pid]
    }

    pub fn stop(self) {
        self.proxy.stop();
        self.broker.stop();
    }
}

/// stunnel terminating TLS (the certificate in `certs`) in front of a fresh tansu. TCP_NODELAY
/// both ways, like the clients and the broker, so the hop adds no Nagle delay of its own.
pub fn stunnel_tansu(work: &Path, certs: &Path) -> Result<Proxied> {
    let (port, inner) = (procs::free_port()?, procs::free_port()?);
    let broker = tansu(&work.join("broker-tls"), inner, Some(port))?;
    let conf = work.join("stunnel.conf");
    std::fs::write(
        &conf,
        format!(
            "foreground = yes\npid =\ndebug = info\nsocket = l:TCP_NODELAY=1\nsocket = r:TCP_NODELAY=1\n[kafka]\n\
             accept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{inner}\ncert = {}\nkey = {}\n",
            certs.join("server.pem").display(),
            certs.join("server.key").display()
        ),
    )?;
    let program = if which("stunnel4") { "stunnel4" } else { "stunnel" };
    let mut cmd = Command::new(program);
    cmd.arg(&conf);
    let proxy = Service::spawn(cmd, port, work.join("stunnel.log"))?;
    Ok(Proxied { proxy, broker })
}

/// socat as a plain TCP hop in front of a fresh tansu: 16 KiB buffers, about stunnel's (a TLS
/// record's worth), instead of socat's default 8 KiB.
pub fn socat_tansu(work: &Path) -> Result<Proxied> {
    let (port, inner) = (procs::free_port()?, procs::free_port()?);
    let broker = tansu(&work.join("broker-hop"), inner, Some(port))?;
    let mut cmd = Command::new("socat");
    cmd.args([
        "-b",
        "16384",
        &format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,nodelay"),
        &format!("TCP:127.0.0.1:{inner},nodelay"),
    ]);
    let proxy = Service::spawn(cmd, port, work.join("socat.log"))?;
    Ok(Proxied { proxy, broker })
}

/// bench_webhook on a free port; its CPU goes in the far-side column of the http row.
pub fn webhook(examples: &Path, work: &Path) -> Result<Service> {
    let port = procs::free_port()?;
    let mut cmd = Command::new(examples.join("bench_webhook"));
    cmd.args(["--port", &port.to_string()]);
    Service::spawn(cmd, port, work.join("webhook.log"))
}

pub fn which(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
