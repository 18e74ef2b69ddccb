//! What the AWS credential tests share (tests/aws_credentials.rs, tests/aws_credential_endpoints.rs,
//! tests/sqs_edges.rs): moto with IAM authentication on and the users and role
//! `tools/aws/client.py iam-setup` makes ([`IamMoto`]); outboxd run with no credential source but
//! the ones a test gives it ([`spawn_isolated`], [`run_isolated`]); the run that proves keys moto
//! accepted ([`relays`]); and the check that no secret was printed ([`assert_no_secret`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::aws::Moto;
use super::postgres::PgCluster;
use super::{args, daemon_args_pg_only, outboxd_bin, wait_until};

/// moto with a standard queue `creds`, an IAM user allowed `sqs:*` (`key`, `secret`), a role
/// allowed `sqs:*`, and a user allowed only to assume it (`assumer_*`); authentication on, so only
/// those keys (and the ones STS gives for the role) are accepted.
pub struct IamMoto {
    pub moto: Moto,
    pub queue: String,
    pub key: String,
    pub secret: String,
    pub role: String,
    pub assumer_key: String,
    pub assumer_secret: String,
}

impl IamMoto {
    pub fn start() -> IamMoto {
        let moto = Moto::start();
        let queue = moto.create_queue("creds", false);
        let v: serde_json::Value = serde_json::from_str(&moto.client(&["iam-setup"])).expect("iam-setup JSON");
        let s = |k: &str| v[k].as_str().expect("iam-setup field").to_owned();
        moto.client(&["auth", "on"]);
        IamMoto {
            queue,
            key: s("key"),
            secret: s("secret"),
            role: s("role"),
            assumer_key: s("assumer_key"),
            assumer_secret: s("assumer_secret"),
            moto,
        }
    }

    /// The secret keys and session tokens moto's STS handed out so far (at least one asserted).
    pub fn sts_issued(&self) -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(&self.moto.client(&["sts-issued"])).expect("sts-issued JSON");
        let issued: Vec<String> = v
            .as_array()
            .expect("a list")
            .iter()
            .flat_map(|r| [r["secret"].as_str(), r["token"].as_str()])
            .map(|s| s.expect("secret and token").to_owned())
            .collect();
        assert!(!issued.is_empty(), "STS handed out no keys: the role was not assumed");
        issued
    }

    /// What the queue holds, read with authentication off for the moment.
    pub fn count(&self) -> usize {
        self.moto.client(&["auth", "off"]);
        let n = self.moto.client(&["queue-count", &self.queue]).trim().parse().expect("count");
        self.moto.client(&["auth", "on"]);
        n
    }

    /// `outboxd check` of the `--sink sqs` relay into [`queue`](Self::queue), with `extra`.
    pub fn check_args(&self, pg: &PgCluster, extra: &[&str]) -> Vec<String> {
        let mut a = args(&["check", "--postgres-url"]);
        a.push(pg.url());
        a.extend(args(&["--sink", "sqs", "--on-bad-event", "fail", "--sqs-queue-url", &self.queue]));
        a.extend(args(&["--aws-endpoint-url", &self.moto.url, "--aws-region", "us-east-1"]));
        a.extend(args(extra));
        a
    }
}

/// `outboxd ARGS` started with no `AWS_*` or `OUTBOXD_*` variable but `env`, `HOME` = `home` (its
/// ~/.aws is the test's), the SDK's logs at debug, and the instance metadata service off unless
/// `env` says `AWS_EC2_METADATA_DISABLED=false` (`env` comes last, so it wins, `RUST_LOG` too);
/// its output goes to the file returned.
pub fn spawn_isolated(a: &[String], env: &[(&str, &str)], home: &Path) -> (Child, PathBuf) {
    static SPAWNED: AtomicUsize = AtomicUsize::new(0);
    let out = home.join(format!("outboxd-{}-{}.out", a[0], SPAWNED.fetch_add(1, Ordering::Relaxed)));
    let file = std::fs::File::create(&out).expect("output file");
    let mut cmd = Command::new(outboxd_bin());
    for (k, _) in std::env::vars_os() {
        let name = k.to_string_lossy();
        if name.starts_with("AWS_") || name.starts_with("OUTBOXD_") {
            cmd.env_remove(&k);
        }
    }
    cmd.args(a)
        .env("HOME", home)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("RUST_LOG", "outboxd=debug,aws_config=debug,aws_smithy_runtime=debug,aws_sdk_sts=debug,info")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("clone"))
        .stderr(file);
    (cmd.spawn().expect("spawn outboxd"), out)
}

/// [`spawn_isolated`], waited for: its exit code (`None`: still running after `timeout`, then
/// killed), its output, and how long it ran.
pub fn run_isolated(
    a: &[String],
    env: &[(&str, &str)],
    home: &Path,
    timeout: Duration,
) -> (Option<i32>, String, Duration) {
    let (mut child, out) = spawn_isolated(a, env, home);
    let start = Instant::now();
    let mut code = None;
    while start.elapsed() < timeout {
        if let Some(status) = child.try_wait().expect("try_wait") {
            code = Some(status.code().unwrap_or(-1));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if code.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    (code, std::fs::read_to_string(&out).unwrap_or_default(), start.elapsed())
}

/// `outboxd run` with `extra` and `env` relays 3 events into the queue: the slot is confirmed
/// past them and the queue holds them (so every SendMessageBatch was signed with keys moto knows).
/// Its output.
pub fn relays(pg: &PgCluster, iam: &IamMoto, extra: &[&str], env: &[(&str, &str)], home: &Path) -> String {
    let before = iam.count();
    let mut a = daemon_args_pg_only(pg, &["--sink", "sqs", "--on-bad-event", "fail", "--sqs-queue-url", &iam.queue]);
    a.extend(args(&["--aws-endpoint-url", &iam.moto.url, "--aws-region", "us-east-1", "--status-interval", "200ms"]));
    a.extend(args(extra));
    let (mut child, out) = spawn_isolated(&a, env, home);
    // The events go in once the slot is there (the first run creates it), so they are in it.
    let slot = || pg.psql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'outboxd'").trim() == "1";
    assert!(
        wait_until(Duration::from_secs(40), slot),
        "no slot: {}",
        std::fs::read_to_string(&out).unwrap_or_default()
    );
    for i in 0..3 {
        pg.insert_event("order", &format!("k{i}"), Some("paid"), "{\"n\": 1}", None);
    }
    let end = pg.current_lsn();
    let confirmed = pg.wait_slot_confirms(&end, Duration::from_secs(40));
    let exited = child.try_wait().expect("try_wait");
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(confirmed, "slot not confirmed past {end}; outboxd exited {exited:?}:\n{log}");
    assert_eq!(iam.count(), before + 3, "{log}");
    log
}

/// No text in `texts` holds any of `secrets`.
pub fn assert_no_secret<T: AsRef<str>, S: AsRef<str>>(texts: &[T], secrets: &[S]) {
    for t in texts.iter().map(AsRef::as_ref) {
        for s in secrets.iter().map(AsRef::as_ref) {
            assert!(!t.contains(s), "a secret ({}...) appears in:\n{t}", &s[..4]);
        }
    }
}
