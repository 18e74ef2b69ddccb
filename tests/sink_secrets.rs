//! Sink credentials never show (issue 23 item 4): a NATS token, a Redis `?pass=`, a webhook URL's
//! secret path or query are masked in `outboxd config`; every sink URL can come from a file
//! (`--nats-url-file`, `--redis-url-file`, `--rabbitmq-url-file`, `--http-url-file`) so it is not
//! in argv or the environment, and `outboxd config` then shows the path only; a webhook that keeps
//! failing is logged on every retry without the secret in its URL, and the file's URL is the one
//! used (a real receiver gets the request at that path).

mod common;

use std::time::Duration;

use common::webhook::Webhook;
use common::*;

#[test]
fn tokens_and_secret_query_values_are_masked_in_config() {
    assert_config_masks(
        &["--sink", "nats", "--nats-url", "nats://s3cr3t-token@127.0.0.1:4222,nats://h2:4222"],
        &["--nats-url 'nats://****@127.0.0.1:4222,nats://h2:4222'"],
        "s3cr3t-token",
    );
    assert_config_masks(
        &["--sink", "redis", "--redis-url", "redis+unix:///run/redis.sock?db=0&pass=hunter2"],
        &["--redis-url 'redis+unix:///run/redis.sock?db=0&pass=****'"],
        "hunter2",
    );
    assert_config_masks(
        &["--sink", "http", "--http-url", "https://hooks.example.com/in/${topic}?token=hunter2&v=1"],
        &["?token=****&v=1"],
        "hunter2",
    );
}

#[test]
fn url_files_are_shown_by_path_and_conflict_with_the_url_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, url: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("{url}\n")).unwrap();
        p.display().to_string()
    };
    let nats = file("nats", "nats://app:hunter2@127.0.0.1:4222");
    let redis = file("redis", "redis://:hunter2@127.0.0.1:6379/0");
    let rabbit = file("rabbit", "amqp://app:hunter2@127.0.0.1:5672/%2f");
    let http = file("http", "https://hooks.example.com/services/hunter2/${topic}");
    for (sink, flag, path) in [
        ("nats", "--nats-url-file", &nats),
        ("redis", "--redis-url-file", &redis),
        ("rabbitmq", "--rabbitmq-url-file", &rabbit),
        ("http", "--http-url-file", &http),
    ] {
        // The path is shell-quoted only when it needs it (a tempdir name may or may not).
        let shown = if path.chars().all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c)) {
            format!("{flag} {path}")
        } else {
            format!("{flag} '{path}'")
        };
        assert_config_masks(&["--sink", sink, flag, path], &[&shown], "hunter2");
        // Given with the URL flag too: a usage error, exit 2.
        let url_flag = flag.trim_end_matches("-file");
        let (code, out) = run_to_exit(
            &args(&["config", "--postgres-url", "postgres://u@h/db", "--sink", sink, flag, path, url_flag, "x://h"]),
            Duration::from_secs(20),
        );
        assert_eq!(code, Some(2), "{flag}: {out}");
        assert!(out.contains(flag) && !out.contains("hunter2"), "{out}");
    }
    let (code, out) = run_to_exit(
        &args(&["config", "--postgres-url", "postgres://u@h/db", "--redis-url-file", "/nonexistent/url"]),
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--redis-url-file /nonexistent/url: cannot read it"), "{out}");
}

#[test]
fn a_webhook_url_from_a_file_is_used_and_its_secret_never_logged() {
    let hook = Webhook::start(None);
    hook.respond_with(|_| 503);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let dir = tempfile::tempdir().unwrap();
    let url_file = dir.path().join("webhook-url");
    std::fs::write(&url_file, hook.url("/services/hunter2/${topic}?token=hunter3\n")).unwrap();
    let url_file = url_file.display().to_string();
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(
        &pg,
        &["--sink", "http", "--http-url-file", &url_file, "--status-interval", "200ms"],
    ));
    let id = pg.insert_event("order", "a", Some("e.v1"), "{\"n\": 1}", None);
    assert!(
        wait_until(Duration::from_secs(20), || hook.requests().len() >= 3),
        "the sink must keep retrying\n{}",
        d.log()
    );
    hook.respond_with(|_| 200);
    assert!(hook.wait_delivered(1, Duration::from_secs(60)), "{}", d.log());
    let r = &hook.delivered()[0];
    assert_eq!(r.path, "/services/hunter2/e.v1.events?token=hunter3", "the file's URL is the one used");
    assert_eq!(hook.delivered_ids(), vec![id]);
    let cmdline = d.pid().map(|p| std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default()).unwrap_or_default();
    assert!(!String::from_utf8_lossy(&cmdline).contains("hunter"), "the URL is in argv");
    d.stop_cleanly();
    let log = d.log();
    assert!(log.contains("webhook delivery not acknowledged"), "{log}");
    assert!(!log.contains("hunter2") && !log.contains("hunter3"), "a secret of the URL was logged:\n{log}");
}
