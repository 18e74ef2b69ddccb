//! The AWS sinks' last two credential sources, end to end: the ECS/EKS container credentials
//! endpoint (`AWS_CONTAINER_CREDENTIALS_FULL_URI`, with `AWS_CONTAINER_AUTHORIZATION_TOKEN`) and
//! the EC2 instance metadata service (IMDSv2 at `AWS_EC2_METADATA_SERVICE_ENDPOINT`). moto's own
//! instance metadata cannot serve the SDK (its token answer lacks the
//! `x-aws-ec2-metadata-token-ttl-seconds` header) and nothing local serves the container endpoint,
//! so `tools/aws/cred_endpoint.py` serves both formats on loopback, with real keys: a role's,
//! assumed at moto's STS by a user allowed nothing else, while moto checks every signature and
//! permission (IAM authentication on). outboxd runs with no `AWS_*` key in its environment and an
//! empty HOME, so the endpoint is its only source of credentials:
//! * `check` passes and `run` relays 3 events into an SQS queue (the slot confirmed past them);
//! * the endpoint stopped (its port closed), `check` fails: the pass came from the endpoint;
//! * the endpoint serving a wrong secret, `check` fails with moto's SignatureDoesNotMatch: moto
//!   checked the keys the endpoint gave;
//! * no secret (the keys' secret, the session token, the wrong secret, the container
//!   authorization token) appears in any output, with the SDK's logs at debug.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::aws_auth::{assert_no_secret, relays, run_isolated, IamMoto};
use common::*;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// [`IamMoto`] and the role's keys from STS (AssumeRole by the user allowed only that).
struct Iam {
    aws: IamMoto,
    /// The role's keys: AccessKeyId, SecretAccessKey, Token.
    creds: serde_json::Value,
    secrets: Vec<String>,
}

impl Iam {
    fn start() -> Iam {
        let aws = IamMoto::start();
        let out = Command::new("bash")
            .arg(root().join("scripts/aws"))
            .arg("python")
            .arg(root().join("tools/aws/cred_endpoint.py"))
            .args(["assume", &aws.moto.url, &aws.role])
            .env("AWS_ACCESS_KEY_ID", &aws.assumer_key)
            .env("AWS_SECRET_ACCESS_KEY", &aws.assumer_secret)
            .output()
            .expect("cred_endpoint.py assume");
        assert!(out.status.success(), "assume: {}", String::from_utf8_lossy(&out.stderr));
        let creds: serde_json::Value = serde_json::from_slice(&out.stdout).expect("assume JSON");
        let secrets = vec![
            aws.secret.clone(),
            aws.assumer_secret.clone(),
            creds["SecretAccessKey"].as_str().expect("secret").to_owned(),
            creds["Token"].as_str().expect("token").to_owned(),
        ];
        Iam { aws, creds, secrets }
    }
}

/// tools/aws/cred_endpoint.py serving `creds`; killed at drop (its port then closed).
struct Endpoint {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Endpoint {
    fn start(dir: &Path, name: &str, creds: &serde_json::Value) -> Endpoint {
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, creds.to_string()).expect("creds file");
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new("bash")
            .arg(root().join("scripts/aws"))
            .arg("python")
            .arg(root().join("tools/aws/cred_endpoint.py"))
            .arg("serve")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("cred_endpoint.py serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("port line");
        let port = line.trim().parse().unwrap_or_else(|_| panic!("no port: {line:?}"));
        Endpoint { child, port, log }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The request lines it served (method, path, status).
    fn requests(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop();
    }
}

fn check(pg: &PgCluster, iam: &Iam, env: &[(&str, &str)], home: &Path) -> (Option<i32>, String) {
    let (code, out, _) = run_isolated(&iam.aws.check_args(pg, &[]), env, home, Duration::from_secs(60));
    (code, out)
}

/// The role's keys with the secret's last 5 characters changed.
fn wrong_secret(creds: &serde_json::Value) -> (serde_json::Value, String) {
    let mut wrong = creds.clone();
    let s = creds["SecretAccessKey"].as_str().expect("secret");
    let w = format!("{}WRONG", &s[..s.len() - 5]);
    wrong["SecretAccessKey"] = serde_json::Value::String(w.clone());
    (wrong, w)
}

/// The source under test, given the endpoint's base URL: its environment for outboxd.
type Source = fn(&str) -> Vec<(&'static str, String)>;

/// Against the endpoint `source` points outboxd at: `check` passes and `run` relays (the
/// endpoint asked for `path`); a wrong secret from it fails `check` with SignatureDoesNotMatch;
/// the endpoint stopped, `check` fails on "no usable AWS credentials" with `stopped_says`; no
/// secret is printed. `creds_extra` goes into the
/// endpoint's file (the container endpoint's required authorization).
fn proves(source: Source, path: &str, stopped_says: &str, creds_extra: &[(&str, &str)], mut secrets: Vec<String>) {
    let iam = Iam::start();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let home = tempfile::Builder::new().prefix("outboxd-awshome-").tempdir().expect("tempdir");
    let dir = tempfile::Builder::new().prefix("outboxd-credep-").tempdir().expect("tempdir");
    let mut creds = iam.creds.clone();
    for (k, v) in creds_extra {
        creds[*k] = serde_json::Value::String((*v).to_owned());
    }
    let mut endpoint = Endpoint::start(dir.path(), "good", &creds);
    let env_of = |url: &str| source(url);
    let owned = env_of(&endpoint.url());
    let env: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut outputs = Vec::new();

    let (code, out) = check(&pg, &iam, &env, home.path());
    assert_eq!(code, Some(0), "outboxd check through {path}:\n{out}\nendpoint:\n{}", endpoint.requests());
    outputs.push(out);
    outputs.push(relays(&pg, &iam.aws, &[], &env, home.path()));
    let served = endpoint.requests();
    assert!(served.contains(path), "the endpoint was not asked for {path}:\n{served}");

    // The same source serving a wrong secret: moto refuses the signature.
    let (wrong, w) = wrong_secret(&creds);
    secrets.push(w);
    let bad = Endpoint::start(dir.path(), "wrong", &wrong);
    let owned_bad = env_of(&bad.url());
    let env_bad: Vec<(&str, &str)> = owned_bad.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (code, out) = check(&pg, &iam, &env_bad, home.path());
    assert_eq!(code, Some(1), "outboxd check with the endpoint's wrong secret:\n{out}");
    assert!(out.contains("SignatureDoesNotMatch"), "{out}");
    assert!(bad.requests().contains(path), "{}", bad.requests());
    outputs.push(out);

    // The endpoint stopped, its port closed: nothing else can give credentials.
    endpoint.stop();
    let (code, out) = check(&pg, &iam, &env, home.path());
    assert_eq!(code, Some(1), "outboxd check with the endpoint stopped:\n{out}");
    let line = out.lines().find(|l| l.contains("no usable AWS credentials")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains(stopped_says), "{line}");
    outputs.push(out);

    secrets.extend(iam.secrets.iter().cloned());
    assert_no_secret(&outputs, &secrets);
}

/// What the container endpoint requires in the Authorization header (a secret too).
const CONTAINER_AUTH: &str = "outboxd-container-auth-5c1e9b";

/// The ECS/EKS container endpoint (`AWS_CONTAINER_CREDENTIALS_FULL_URI` on loopback, with the
/// authorization token EKS Pod Identity gives), the instance metadata service off.
#[test]
fn the_container_endpoint_authenticates_check_and_run() {
    fn source(url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", format!("{url}/creds")),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN", CONTAINER_AUTH.to_owned()),
            ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ]
    }
    proves(
        source,
        "GET /creds",
        "Connection refused",
        &[("Authorization", CONTAINER_AUTH)],
        vec![CONTAINER_AUTH.to_owned()],
    );
}

/// The instance metadata service, IMDSv2 (a session token first, then the role and its keys).
#[test]
fn the_instance_metadata_service_authenticates_check_and_run() {
    fn source(url: &str) -> Vec<(&'static str, String)> {
        vec![("AWS_EC2_METADATA_SERVICE_ENDPOINT", url.to_owned()), ("AWS_EC2_METADATA_DISABLED", "false".to_owned())]
    }
    let path = "GET /latest/meta-data/iam/security-credentials/outboxd-instance-role";
    proves(source, path, "could not communicate with IMDS", &[], vec![]);
}
