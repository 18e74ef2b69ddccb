//! The AWS sinks' credential chain beyond environment variables, against a local AWS API that
//! checks them: moto with IAM authentication on (`client.py auth on`), where only an IAM user's
//! access key, or the keys STS gave for a role, sign a request it accepts. Each test makes an IAM
//! user allowed `sqs:*`, a user allowed only `sts:AssumeRole`, each with an access key, and a role
//! allowed `sqs:*` (`client.py iam-setup`) while moto still takes anything, then turns
//! authentication on and runs `outboxd check` and `outboxd run --sink sqs` with no
//! `AWS_ACCESS_KEY_ID` in the environment, only:
//! * a shared credentials file and a named profile (`--aws-profile`, `AWS_PROFILE`), and a profile
//!   of the config file with `role_arn` and `source_profile` (STS AssumeRole; the source
//!   profile's own keys are refused by SQS, so only the role's keys can have sent);
//! * web identity, as IRSA on EKS gives it (`AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_ARN`: STS
//!   AssumeRoleWithWebIdentity, which moto answers without verifying the token).
//!
//! A profile with a wrong secret fails `check` and `run` with one line naming the code and what
//! to check; no secret (the access keys' secrets, the secret keys and session tokens STS gave, as
//! moto's state lists them, the web identity token) appears in any output, with the SDK's own
//! logs at debug (`RUST_LOG` with `aws_config=debug,aws_smithy_runtime=debug`). The container
//! endpoint and the instance metadata service are proven in `aws_credential_endpoints.rs`
//! (tools/aws/cred_endpoint.py serves a role's keys in both formats; moto's own instance metadata
//! answers the IMDSv2 token PUT without the TTL header the SDK requires).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::aws::Moto;
use common::*;

/// moto with a standard queue, an IAM user and a role, authentication on.
struct Iam {
    moto: Moto,
    queue: String,
    key: String,
    secret: String,
    role: String,
    assumer_key: String,
    assumer_secret: String,
}

impl Iam {
    fn start() -> Iam {
        let moto = Moto::start();
        let queue = moto.create_queue("creds", false);
        let v: serde_json::Value = serde_json::from_str(&moto.client(&["iam-setup"])).expect("iam-setup JSON");
        let s = |k: &str| v[k].as_str().expect("iam-setup field").to_owned();
        moto.client(&["auth", "on"]);
        Iam {
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
    fn sts_issued(&self) -> Vec<String> {
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
    fn count(&self) -> usize {
        self.moto.client(&["auth", "off"]);
        let n = self.moto.client(&["queue-count", &self.queue]).trim().parse().expect("count");
        self.moto.client(&["auth", "on"]);
        n
    }
}

/// `outboxd ARGS` started with no `AWS_*` or `OUTBOXD_*` variable but `env`, `HOME` = `home` (its
/// ~/.aws is the test's), the instance metadata service off; its output goes to the file returned.
fn spawn(a: &[String], env: &[(&str, &str)], home: &Path) -> (Child, PathBuf) {
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

static SPAWNED: AtomicUsize = AtomicUsize::new(0);

/// [`spawn`], waited for: its exit code (`None`: still running after `timeout`, then killed) and
/// its output.
fn outboxd(a: &[String], env: &[(&str, &str)], home: &Path, timeout: Duration) -> (Option<i32>, String) {
    let (mut child, out) = spawn(a, env, home);
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
    (code, std::fs::read_to_string(&out).unwrap_or_default())
}

fn check_args(pg: &PgCluster, iam: &Iam, extra: &[&str]) -> Vec<String> {
    let mut a = args(&["check", "--postgres-url"]);
    a.push(pg.url());
    a.extend(args(&["--sink", "sqs", "--on-bad-event", "fail", "--sqs-queue-url", &iam.queue]));
    a.extend(args(&["--aws-endpoint-url", &iam.moto.url, "--aws-region", "us-east-1"]));
    a.extend(args(extra));
    a
}

/// `outboxd run` with `extra` and `env` relays 3 events into the queue: the slot is confirmed
/// past them and the queue holds them (so every SendMessageBatch was signed with keys moto knows).
fn relays(pg: &PgCluster, iam: &Iam, extra: &[&str], env: &[(&str, &str)], home: &Path) -> String {
    let before = iam.count();
    let mut a = daemon_args_pg_only(pg, &["--sink", "sqs", "--on-bad-event", "fail", "--sqs-queue-url", &iam.queue]);
    a.extend(args(&["--aws-endpoint-url", &iam.moto.url, "--aws-region", "us-east-1", "--status-interval", "200ms"]));
    a.extend(args(extra));
    let (mut child, out) = spawn(&a, env, home);
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

fn assert_no_secret<S: AsRef<str>>(texts: &[&str], secrets: &[S]) {
    for t in texts {
        for s in secrets.iter().map(AsRef::as_ref) {
            assert!(!t.contains(s), "a secret ({}...) appears in:\n{t}", &s[..4]);
        }
    }
}

/// A named profile of ~/.aws/credentials (by `--aws-profile` and by `AWS_PROFILE`) and a profile
/// of ~/.aws/config that assumes a role with it (`role_arn`, `source_profile`) authenticate
/// `check` and `run`; the default profile's wrong secret fails both with one line naming the
/// code and the fix; no secret is printed.
#[test]
fn shared_file_profiles_and_an_assumed_role_authenticate_and_a_wrong_secret_stops_with_one_line() {
    let iam = Iam::start();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let home = tempfile::Builder::new().prefix("outboxd-awshome-").tempdir().expect("tempdir");
    let aws = home.path().join(".aws");
    std::fs::create_dir(&aws).expect("~/.aws");
    let wrong = format!("{}WRONG", &iam.secret[..iam.secret.len() - 5]);
    std::fs::write(
        aws.join("credentials"),
        format!(
            "[default]\naws_access_key_id = {key}\naws_secret_access_key = {wrong}\n\n\
             [relay]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n\n\
             [assume-only]\naws_access_key_id = {akey}\naws_secret_access_key = {asecret}\n",
            key = iam.key,
            secret = iam.secret,
            akey = iam.assumer_key,
            asecret = iam.assumer_secret
        ),
    )
    .expect("credentials file");
    std::fs::write(
        aws.join("config"),
        format!(
            "[default]\nregion = us-east-1\n\n[profile assumer]\nrole_arn = {}\nsource_profile = assume-only\n",
            iam.role
        ),
    )
    .expect("config file");
    let mut outputs = Vec::new();
    // The role's STS calls go to moto too (--aws-endpoint-url is the sink's service only).
    let sts = ("AWS_ENDPOINT_URL_STS", iam.moto.url.as_str());

    for (extra, env) in [
        (vec!["--aws-profile", "relay"], vec![]),
        (vec![], vec![("AWS_PROFILE", "relay")]),
        (vec!["--aws-profile", "assumer"], vec![sts]),
    ] {
        let (code, out) = outboxd(&check_args(&pg, &iam, &extra), &env, home.path(), Duration::from_secs(60));
        assert_eq!(code, Some(0), "outboxd check {extra:?} {env:?}:\n{out}");
        outputs.push(out);
    }
    // The assuming user's own keys may not use the queue: what the role's profile sent, the
    // role's keys signed.
    let (code, out) =
        outboxd(&check_args(&pg, &iam, &["--aws-profile", "assume-only"]), &[], home.path(), Duration::from_secs(60));
    assert_eq!(code, Some(1), "outboxd check with keys allowed only sts:AssumeRole:\n{out}");
    outputs.push(out);
    outputs.push(relays(&pg, &iam, &["--aws-profile", "relay"], &[], home.path()));
    outputs.push(relays(&pg, &iam, &[], &[("AWS_PROFILE", "assumer"), sts], home.path()));

    // The default profile: the right key, a wrong secret.
    let (code, out) = outboxd(&check_args(&pg, &iam, &[]), &[], home.path(), Duration::from_secs(60));
    assert_eq!(code, Some(1), "outboxd check with a wrong secret:\n{out}");
    let line = out.lines().find(|l| l.contains("SignatureDoesNotMatch")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("--sqs-queue-url"), "{line}");
    assert!(out.contains(REFUSED), "the fix names the credentials:\n{out}");
    outputs.push(out);
    let mut a = daemon_args_pg_only(&pg, &["--sink", "sqs", "--on-bad-event", "fail", "--sqs-queue-url", &iam.queue]);
    a.extend(args(&["--aws-endpoint-url", &iam.moto.url, "--aws-region", "us-east-1"]));
    pg.insert_event("order", "k9", Some("paid"), "{\"n\": 2}", None);
    let (code, out) = outboxd(&a, &[], home.path(), Duration::from_secs(40));
    assert!(code.is_some_and(|c| c != 0), "outboxd run with a wrong secret still running or exit 0 ({code:?}):\n{out}");
    let line = out.lines().find(|l| l.contains("SignatureDoesNotMatch")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("--sqs-queue-url") && line.contains(REFUSED), "{line}");
    assert!(!out.contains("sending again after a backoff"), "a wrong secret is not retried:\n{out}");
    eprintln!("the wrong secret's line: {line}");
    outputs.push(out);

    // `outboxd config` resolves no credentials; what it prints of the flags: the profile's name,
    // and a password given by the environment masked. The AWS secrets in its environment too are
    // in none of it.
    let mut config = args(&["config"]);
    config.extend(args(&[
        "--sink",
        "sqs",
        "--on-bad-event",
        "fail",
        "--sqs-queue-url",
        &iam.queue,
        "--aws-profile",
        "relay",
    ]));
    let pg_password = "pw-7d1e-config-secret";
    let pg_url = format!("postgres://u:{pg_password}@127.0.0.1/db");
    let env = [
        ("OUTBOXD_POSTGRES_URL", pg_url.as_str()),
        ("AWS_SECRET_ACCESS_KEY", iam.secret.as_str()),
        ("AWS_SESSION_TOKEN", STS_TOKEN),
    ];
    let (code, out) = outboxd(&config, &env, home.path(), Duration::from_secs(20));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("--aws-profile relay"), "{out}");
    assert!(out.contains("--postgres-url 'postgres://u:****@127.0.0.1"), "{out}");
    assert!(!out.contains(pg_password), "{out}");
    outputs.push(out);
    let texts: Vec<&str> = outputs.iter().map(String::as_str).collect();
    let mut secrets = iam.sts_issued();
    secrets.extend([iam.secret.clone(), iam.assumer_secret.clone(), wrong.clone(), STS_TOKEN.to_owned()]);
    assert_no_secret(&texts, &secrets);
}

/// Web identity, as IRSA on EKS sets it up: a token file and a role ARN in the environment, STS
/// (AssumeRoleWithWebIdentity at the endpoint URL) trading the token for the role's keys, which
/// sign `check` and `run`. Neither the token nor the keys STS gave appear in any output.
#[test]
fn web_identity_authenticates_check_and_run_and_shows_no_token() {
    let iam = Iam::start();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let home = tempfile::Builder::new().prefix("outboxd-awshome-").tempdir().expect("tempdir");
    let token = "eyJhbGciOiJSUzI1NiJ9.outboxd-web-identity-token-7f3a9c.sig";
    let token_file = home.path().join("token");
    std::fs::write(&token_file, token).expect("token file");
    let token_path = token_file.to_string_lossy().into_owned();
    let env = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token_path.as_str()),
        ("AWS_ROLE_ARN", iam.role.as_str()),
        ("AWS_ROLE_SESSION_NAME", "outboxd-test"),
        ("AWS_ENDPOINT_URL_STS", iam.moto.url.as_str()),
    ];
    let (code, check) = outboxd(&check_args(&pg, &iam, &[]), &env, home.path(), Duration::from_secs(60));
    assert_eq!(code, Some(0), "outboxd check with web identity:\n{check}");
    let run = relays(&pg, &iam, &[], &env, home.path());

    // A token file that is not there: `check` and `run` stop at once, in one line saying how to
    // provide credentials (not "no answer from SQS", and `run` does not retry it for good).
    let missing = home.path().join("no-token").to_string_lossy().into_owned();
    let env = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", missing.as_str()),
        ("AWS_ROLE_ARN", iam.role.as_str()),
        ("AWS_ENDPOINT_URL_STS", iam.moto.url.as_str()),
    ];
    let (code, out) = outboxd(&check_args(&pg, &iam, &[]), &env, home.path(), Duration::from_secs(60));
    assert_eq!(code, Some(1), "outboxd check with a missing token file:\n{out}");
    // check prints the fault, then its fix on the next line.
    assert!(out.lines().any(|l| l.contains("no usable AWS credentials")), "{out}");
    assert!(out.contains("AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN"), "{out}");
    let mut a = daemon_args_pg_only(&pg, &["--sink", "sqs", "--on-bad-event", "fail", "--sqs-queue-url", &iam.queue]);
    a.extend(args(&["--aws-endpoint-url", &iam.moto.url, "--aws-region", "us-east-1"]));
    let (code, out) = outboxd(&a, &env, home.path(), Duration::from_secs(30));
    assert!(code.is_some_and(|c| c != 0), "outboxd run with a missing token file ({code:?}):\n{out}");
    assert!(out.contains("no usable AWS credentials"), "{out}");
    // STS not answering (a closed port): `check` names the credential chain's source, not the
    // queue's silence ("no answer from SQS" would send the user to the SQS endpoint).
    let env = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token_path.as_str()),
        ("AWS_ROLE_ARN", iam.role.as_str()),
        ("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:1"),
    ];
    let (code, no_sts) = outboxd(&check_args(&pg, &iam, &[]), &env, home.path(), Duration::from_secs(60));
    assert_eq!(code, Some(1), "outboxd check with STS unreachable:\n{no_sts}");
    assert!(no_sts.contains("credential chain's source did not answer"), "{no_sts}");
    assert!(!no_sts.contains("no answer from SQS"), "{no_sts}");
    // The session tokens moto's STS gives all begin with this; and the keys it gave, by its state.
    let mut secrets = iam.sts_issued();
    secrets.extend([token.to_owned(), iam.secret.clone(), STS_TOKEN.to_owned()]);
    assert_no_secret(&[&check, &run, &out, &no_sts], &secrets);
}

/// What the fix says when AWS refused the credentials themselves.
const REFUSED: &str = "the credentials were refused: check the access key and secret";

/// The start of every session token moto's STS hands out (moto/sts/utils.py).
const STS_TOKEN: &str = "FQoGZXIvYXdzEBYaD";
