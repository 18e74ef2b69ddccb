//! `--sink sqs` edges against a local SQS (moto's server mode, one per test, from `scripts/aws`):
//! no usable AWS credentials stop `outboxd run` at start (and fail `outboxd check`) with one line
//! saying how to provide them, rather than retrying for good; a header SQS would lose (a name two
//! headers share, or `key`) makes the event a bad event, dead-lettered, never sent without it.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use common::aws::{Moto, SqsMessage};
use common::aws_auth::run_isolated;
use common::*;

/// moto takes any credentials; these keep the SDK from looking for real ones.
const ENV: &[(&str, &str)] = &[("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test-secret")];

fn attr(m: &SqsMessage, name: &str) -> Option<String> {
    m.attributes.iter().find(|(k, _)| k == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

/// `outboxd ARGS` with no credentials anywhere: no `AWS_*` (nor `OUTBOXD_*`) variable, `HOME` an
/// empty directory (no ~/.aws), the instance metadata service off ([`run_isolated`]). Its exit
/// code (`None`: still running after `timeout`, then killed), its output, and how long it ran.
fn run_without_credentials(a: &[String], home: &Path, timeout: Duration) -> (Option<i32>, String, Duration) {
    run_isolated(a, &[("RUST_LOG", "outboxd=debug,info")], home, timeout)
}

/// No credentials at all: `outboxd run` exits at once, non-zero, with one line naming the missing
/// credentials, the flag of the queue it could not ask, and how to provide them; it does not go
/// on "with the defaults" and retry forever. `outboxd check` fails the same way.
#[test]
fn no_credentials_stop_the_start_with_one_line_saying_how_to_provide_them() {
    let moto = Moto::start();
    let queue = moto.create_queue("nocreds", false);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let home = tempfile::Builder::new().prefix("outboxd-nohome-").tempdir().expect("tempdir");
    let flags = ["--sink", "sqs", "--on-bad-event", "fail", "--sqs-queue-url", &queue, "--aws-endpoint-url", &moto.url];
    let mut run = daemon_args_pg_only(&pg, &flags);
    run.extend(args(&["--aws-region", "us-east-1", "--status-interval", "200ms"]));
    let (code, text, took) = run_without_credentials(&run, home.path(), Duration::from_secs(30));
    assert!(code.is_some(), "outboxd run still running after {took:?} without credentials:\n{text}");
    assert_ne!(code, Some(0), "{text}");
    let line = text.lines().find(|l| l.contains("no usable AWS credentials")).unwrap_or_else(|| panic!("{text}"));
    for part in ["--sqs-queue-url", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "--aws-profile"] {
        assert!(line.contains(part), "{part} not in the error line: {line}");
    }
    assert!(!text.contains("going on with the defaults"), "{text}");
    assert!(!text.contains("sending again after a backoff"), "{text}");

    let mut check = args(&["check", "--postgres-url"]);
    check.push(pg.url());
    check.extend(flags.iter().map(|s| s.to_string()));
    check.extend(args(&["--aws-region", "us-east-1"]));
    let (code, text, took) = run_without_credentials(&check, home.path(), Duration::from_secs(30));
    assert_eq!(code, Some(1), "outboxd check after {took:?}:\n{text}");
    assert!(text.contains("no usable AWS credentials") && text.contains("AWS_ACCESS_KEY_ID"), "{text}");
}

/// SQS message attributes are a map by name: an event whose headers column repeats the `id`
/// header (the event id's), or names a header `key` (the record key's attribute), is the bad
/// event `invalid_header`, dead-lettered with every header; it is never sent with one of the two
/// lost. An event beside them with a header of its own reaches the queue.
#[test]
fn a_header_name_given_twice_is_an_invalid_header_dead_lettered_not_sent_with_one_lost() {
    let moto = Moto::start();
    let queue = moto.create_queue("dups", false);
    let dlq = moto.create_queue("dups-dlq", false);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut a = daemon_args_pg_only(&pg, &["--sink", "sqs", "--sqs-queue-url", &queue, "--sqs-dlq-queue-url", &dlq]);
    a.extend(args(&["--aws-endpoint-url", &moto.url, "--aws-region", "us-east-1", "--status-interval", "200ms"]));
    let mut d = Outboxd::spawn_with_env(&a, ENV);
    assert!(d.wait_for_streaming(Duration::from_secs(60)), "{}", d.log());
    let twice = pg.insert_event("t", "a", Some("dup"), "{\"n\": 1}", Some("{\"id\": \"spoofed\"}"));
    let keyed = pg.insert_event("t", "b", Some("keyed"), "{\"n\": 2}", Some("{\"key\": \"other\"}"));
    let fine = pg.insert_event("t", "c", Some("fine"), "{\"n\": 3}", Some("{\"trace\": \"t1\"}"));
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(60)), "slot behind\n{}", d.log());
    let main = moto.drain_queue(&queue, 1);
    let ids: Vec<String> = main.iter().filter_map(|m| attr(m, "id")).collect();
    assert_eq!(ids, vec![fine.clone()], "only the event with distinct header names reaches the queue: {main:?}");
    assert_eq!(attr(&main[0], "trace").as_deref(), Some("t1"));
    let copies = moto.drain_queue(&dlq, 1);
    let mut dead = HashSet::new();
    for c in &copies {
        let headers: Vec<(String, String)> =
            serde_json::from_str(&attr(c, "outboxd.headers").expect("headers attribute")).expect("JSON headers");
        let decoded: Vec<(String, String)> = headers
            .into_iter()
            .map(|(k, v)| {
                use base64::Engine as _;
                let v = base64::engine::general_purpose::STANDARD.decode(v).expect("base64");
                (k, String::from_utf8(v).expect("UTF-8"))
            })
            .collect();
        let header = |n: &str| decoded.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(header("outboxd.error").as_deref(), Some("invalid_header"), "{decoded:?}");
        let id = header("id").expect("id header");
        if id == twice {
            // Both `id` headers travel in the copy, in their order.
            let all: Vec<&str> = decoded.iter().filter(|(k, _)| k == "id").map(|(_, v)| v.as_str()).collect();
            assert_eq!(all, vec![twice.as_str(), "spoofed"], "{decoded:?}");
        }
        dead.insert(id);
    }
    assert_eq!(dead, HashSet::from([twice, keyed]), "{copies:?}");
    d.stop_cleanly();
}
