//! `outboxd inbox`'s status page behind `run`'s access flags, against real Apache Kafka and
//! PostgreSQL: with `--status-page-token-file`, `/` and `/status.json` answer only a request that
//! carries the token (`Authorization: Bearer` or `?token=`; 401 without); with
//! `--status-page-allowed-hosts`, only the listed `Host` names besides localhost and IP addresses
//! (403 for others, DNS rebinding); `/metrics` and the probes answer anyone. The token shows
//! nowhere: not in the log, the page, `/status.json` or the process's command line. A bad value
//! of either flag is refused before anything starts, naming the flag.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOKEN: &str = "inb0x-PAGE-t0ken";
const TOPIC: &str = "billing.events";

/// One request with `host` and optionally a bearer token: (status code, body).
fn get(port: u16, host: &str, bearer: Option<&str>, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the endpoint listens");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let auth = bearer.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

fn produce(broker: &Broker, n: usize) {
    let producer: BaseProducer = broker.client_config().create().expect("producer");
    for i in 0..n {
        let id = format!("e-{i}");
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
        let payload = format!("{{\"i\": {i}}}");
        let mut rec = BaseRecord::to(TOPIC).key("k").payload(&payload).headers(headers);
        while let Err((_, r)) = producer.send(rec) {
            producer.poll(Duration::from_millis(10));
            rec = r;
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

#[test]
fn the_inbox_page_needs_its_token_and_a_known_host_while_metrics_and_probes_stay_open() {
    let pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    produce(&broker, 3);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let port = free_port();
    let d = Outboxd::spawn(&args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--topics",
        TOPIC,
        "--group",
        "billing",
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--status-page-token-file",
        token_file.to_str().unwrap(),
        "--status-page-allowed-hosts",
        "status.example.com,.ops.example",
    ]));
    let listening = wait_until(Duration::from_secs(30), || http_get(port, "/healthz").is_some());
    assert!(listening, "{}", d.log());
    // With the token the page answers, and shows the rows the inbox wrote.
    let mut json = serde_json::Value::Null;
    let written = wait_until(Duration::from_secs(60), || {
        let (code, body) = get(port, "localhost", Some(TOKEN), "/status.json");
        json = serde_json::from_str(&body).unwrap_or_default();
        code == 200 && json["rows_total"] == 3
    });
    assert!(written, "{json:#}\n{}", d.log());
    assert_eq!(json["command"], "inbox", "{json:#}");
    assert_eq!(pg.psql("SELECT count(*) FROM public.inbox").trim(), "3");

    // Without the token, or with a wrong one: 401, saying how to send it.
    for (bearer, path) in [
        (None, "/"),
        (None, "/status.json"),
        (Some("wrong"), "/status.json"),
        (None, "/?token=wrong"),
        (None, &format!("/status.json?token={}", &TOKEN[..TOKEN.len() - 1]) as &str),
    ] {
        let (code, body) = get(port, "localhost", bearer, path);
        assert_eq!(code, 401, "{path} with {bearer:?}: {body}");
        assert!(body.contains("--status-page-token-file") && !body.contains(TOKEN), "{body}");
    }
    // With it: as a bearer token or in the query (which the page passes on to its script).
    for (bearer, path) in [(Some(TOKEN), "/"), (None, &format!("/status.json?token={TOKEN}") as &str)] {
        assert_eq!(get(port, "localhost", bearer, path).0, 200, "{path} with {bearer:?}");
    }
    let (code, html) = get(port, "127.0.0.1", None, &format!("/?token={TOKEN}"));
    assert_eq!(code, 200, "{html}");
    assert!(html.contains(&format!("data-json=\"/status.json?token={TOKEN}\"")), "{html}");

    // Hosts: the listed names and localhost answer; any other name gets 403, token or not.
    for (host, code) in [
        ("status.example.com".to_owned(), 200),
        (format!("a.ops.example:{port}"), 200),
        (format!("127.0.0.1:{port}"), 200),
        ("rebind.attacker.example".to_owned(), 403),
        ("status.example.com.attacker.example".to_owned(), 403),
    ] {
        for path in ["/", "/status.json"] {
            let (got, body) = get(port, &host, Some(TOKEN), path);
            assert_eq!(got, code, "{host} {path}: {body}");
        }
    }
    assert_eq!(get(port, "rebind.attacker.example", None, "/status.json").0, 403);

    // /metrics and the probes are not the page's: no token, any host.
    for host in ["localhost", "rebind.attacker.example"] {
        for path in ["/metrics", "/healthz"] {
            let (code, body) = get(port, host, None, path);
            assert_eq!(code, 200, "{host} {path}: {body}");
        }
        let (code, metrics) = get(port, host, None, "/metrics");
        assert!(code == 200 && metrics.contains("outboxd_inbox_rows_total"), "{metrics}");
        assert!(!metrics.contains(TOKEN));
    }

    // The token is nowhere to be read: not in the log (at debug), the answers, or argv.
    let json_text = get(port, "localhost", Some(TOKEN), "/status.json").1;
    assert!(!json_text.contains(TOKEN), "{json_text}");
    let html = get(port, "localhost", Some(TOKEN), "/").1;
    assert!(!html.contains(TOKEN), "the page shows the token it was not asked with: {html}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", d.pid().unwrap())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(TOKEN));
    let log = d.log();
    assert!(log.contains("inbox consuming"), "{log}");
    assert!(!log.contains(TOKEN), "the token is in the inbox's log:\n{log}");
}

#[test]
fn bad_access_flags_are_refused_before_the_inbox_starts() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    let missing = dir.path().join("missing");
    let base = ["inbox", "--postgres-url", "postgres://u@127.0.0.1:1/db", "--topics", "t", "--metrics-addr", "off"];
    for (extra, want) in [
        (vec!["--status-page-token-file", empty.to_str().unwrap()], "--status-page-token-file"),
        (vec!["--status-page-token-file", missing.to_str().unwrap()], "--status-page-token-file"),
        (vec!["--status-page-allowed-hosts", "http://status.example.com"], "--status-page-allowed-hosts"),
        (vec!["--status-page-allowed-hosts", "status.example.com:8080"], "--status-page-allowed-hosts"),
    ] {
        let mut a = args(&base);
        a.extend(args(&extra));
        let (code, out) = run_to_exit(&a, Duration::from_secs(30));
        assert_eq!(code, Some(2), "{extra:?}: {out}");
        assert!(out.contains(want) && out.trim_end().lines().count() == 1, "{extra:?}: {out}");
    }
}
