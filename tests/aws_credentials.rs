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

use std::path::Path;
use std::time::Duration;

use common::aws_auth::{assert_no_secret, relays, run_isolated, IamMoto as Iam};
use common::*;

/// `outboxd ARGS` as [`run_isolated`] runs it: its exit code and output.
fn outboxd(a: &[String], env: &[(&str, &str)], home: &Path, timeout: Duration) -> (Option<i32>, String) {
    let (code, out, _) = run_isolated(a, env, home, timeout);
    (code, out)
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
        let (code, out) = outboxd(&iam.check_args(&pg, &extra), &env, home.path(), Duration::from_secs(60));
        assert_eq!(code, Some(0), "outboxd check {extra:?} {env:?}:\n{out}");
        outputs.push(out);
    }
    // The assuming user's own keys may not use the queue: what the role's profile sent, the
    // role's keys signed.
    let (code, out) =
        outboxd(&iam.check_args(&pg, &["--aws-profile", "assume-only"]), &[], home.path(), Duration::from_secs(60));
    assert_eq!(code, Some(1), "outboxd check with keys allowed only sts:AssumeRole:\n{out}");
    outputs.push(out);
    outputs.push(relays(&pg, &iam, &["--aws-profile", "relay"], &[], home.path()));
    outputs.push(relays(&pg, &iam, &[], &[("AWS_PROFILE", "assumer"), sts], home.path()));

    // The default profile: the right key, a wrong secret.
    let (code, out) = outboxd(&iam.check_args(&pg, &[]), &[], home.path(), Duration::from_secs(60));
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
    let (code, check) = outboxd(&iam.check_args(&pg, &[]), &env, home.path(), Duration::from_secs(60));
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
    let (code, out) = outboxd(&iam.check_args(&pg, &[]), &env, home.path(), Duration::from_secs(60));
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
    let (code, no_sts) = outboxd(&iam.check_args(&pg, &[]), &env, home.path(), Duration::from_secs(60));
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
