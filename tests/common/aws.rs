//! A private moto server (a local SQS, SNS and Kinesis API, in memory) per test, started with
//! `scripts/aws` (which builds its pinned virtualenv on first use), and the boto3 side of the tests,
//! `tools/aws/client.py`, to create destinations and read back what outboxd sent. Killed at drop.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One SQS message as read back: the body, the message attributes (name, value bytes), and on a
/// FIFO queue the group and deduplication ids.
#[derive(Debug, Clone)]
pub struct SqsMessage {
    pub body: Vec<u8>,
    pub attributes: Vec<(String, Vec<u8>)>,
    pub group: Option<String>,
    pub dedup: Option<String>,
}

pub struct Moto {
    dir: tempfile::TempDir,
    /// http://127.0.0.1:PORT, for --aws-endpoint-url.
    pub url: String,
    pub port: u16,
}

impl Moto {
    pub fn start() -> Moto {
        let dir = tempfile::Builder::new().prefix("outboxd-moto-").tempdir().expect("tempdir");
        let out = Command::new("bash")
            .arg(root().join("scripts/aws"))
            .arg("start")
            .arg(dir.path())
            .arg("--parent")
            .arg(std::process::id().to_string())
            .output()
            .expect("run scripts/aws");
        assert!(
            out.status.success(),
            "scripts/aws start failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(dir.path().join("moto.log")).unwrap_or_default()
        );
        let url = String::from_utf8_lossy(&out.stdout).trim().lines().last().unwrap_or_default().to_owned();
        let port = std::fs::read_to_string(dir.path().join("port")).expect("port").trim().parse().expect("port");
        Moto { dir, url, port }
    }

    /// The server's log (one access-log line per request).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("moto.log")
    }

    /// Run tools/aws/client.py CMD ARGS against this server; its stdout (asserting it succeeded).
    pub fn client(&self, args: &[&str]) -> String {
        let out = Command::new("bash")
            .arg(root().join("scripts/aws"))
            .arg("python")
            .arg(root().join("tools/aws/client.py"))
            .arg(&self.url)
            .args(args)
            .output()
            .expect("run tools/aws/client.py");
        assert!(out.status.success(), "client.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Create an SQS queue (FIFO if `fifo`: the name must end in `.fifo`); its URL.
    pub fn create_queue(&self, name: &str, fifo: bool) -> String {
        let mut args = vec!["create-queue", name];
        if fifo {
            args.push("fifo");
        }
        self.client(&args).trim().to_owned()
    }

    /// Receive and delete everything in the queue until it stayed empty for `quiet_secs`.
    pub fn drain_queue(&self, url: &str, quiet_secs: u32) -> Vec<SqsMessage> {
        let quiet = quiet_secs.to_string();
        let b64 = |s: &str| base64_decode(s);
        self.client(&["drain-queue", url, &quiet])
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("client.py line");
                let attributes = v["attributes"]
                    .as_object()
                    .map(|m| m.iter().map(|(k, v)| (k.clone(), b64(v.as_str().unwrap_or_default()))).collect())
                    .unwrap_or_default();
                SqsMessage {
                    body: b64(v["body"].as_str().unwrap_or_default()),
                    attributes,
                    group: v["group"].as_str().map(str::to_owned),
                    dedup: v["dedup"].as_str().map(str::to_owned),
                }
            })
            .collect()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(root().join("scripts/aws"))
            .arg("stop")
            .arg(self.dir.path())
            .arg("--kill")
            .status();
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).expect("base64 from client.py")
}

/// `tools/aws/throttle_proxy.py` in front of a [`Moto`]: a share of SendMessageBatch calls is
/// answered ThrottlingException, as many again lose a random part of their entries to a per-entry
/// throttle (the rest reach the server). Killed at drop.
pub struct ThrottleProxy {
    child: std::process::Child,
    dir: tempfile::TempDir,
    /// http://127.0.0.1:PORT, for --aws-endpoint-url.
    pub url: String,
}

impl ThrottleProxy {
    pub fn start(moto: &Moto, share: f64) -> ThrottleProxy {
        Self::start_mode(moto, share, None)
    }

    /// With `mode` `Some("sns-entries")`: PublishBatch entries fail one by one instead of whole
    /// calls (throttled, or refused when their message holds `refuse-pvi` / `refuse-ip`).
    pub fn start_mode(moto: &Moto, share: f64, mode: Option<&str>) -> ThrottleProxy {
        let dir = tempfile::Builder::new().prefix("outboxd-throttle-").tempdir().expect("tempdir");
        let (port_file, stats) = (dir.path().join("port"), dir.path().join("stats"));
        let child = Command::new("bash")
            .arg(root().join("scripts/aws"))
            .arg("python")
            .arg(root().join("tools/aws/throttle_proxy.py"))
            .arg(&moto.url)
            .arg(&port_file)
            .arg(&stats)
            .arg(share.to_string())
            .args(mode)
            .spawn()
            .expect("start throttle_proxy.py");
        let ok = super::wait_until(std::time::Duration::from_secs(30), || port_file.exists());
        assert!(ok, "throttle_proxy.py did not start");
        let port = std::fs::read_to_string(&port_file).expect("port");
        ThrottleProxy { child, dir, url: format!("http://127.0.0.1:{}", port.trim()) }
    }

    /// What was injected: (whole calls throttled, entries throttled).
    pub fn injected(&self) -> (u64, u64) {
        let s = std::fs::read_to_string(self.dir.path().join("stats")).unwrap_or_default();
        let num =
            |k: &str| s.split_whitespace().find_map(|p| p.strip_prefix(k)).and_then(|v| v.parse().ok()).unwrap_or(0);
        (num("whole="), num("entries="))
    }

    /// In the `hot:KEY:N` mode: each send of an entry of KEY, its time (Unix seconds) and whether
    /// it was refused.
    pub fn hot_attempts(&self) -> Vec<(f64, bool)> {
        let s = std::fs::read_to_string(self.dir.path().join("stats.hot")).unwrap_or_default();
        s.lines()
            .filter_map(|l| l.split_once(' '))
            .filter_map(|(t, what)| Some((t.parse().ok()?, what == "refused")))
            .collect()
    }
}

impl Drop for ThrottleProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
