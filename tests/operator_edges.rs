//! Edges operators hit (issue 35, items 8, 10 and 12), against real components:
//!
//! * the status page answers only `localhost`, IP addresses and the names in
//!   `--status-page-allowed-hosts` (DNS rebinding), while `/metrics` and the probes answer any
//!   `Host`; its "last error" reads as people write, not as Rust's `Debug` (a real PostgreSQL, a
//!   dead-lettered event);
//! * `outboxd config` masks a key in the registry URL's query and a webhook's secret path, and
//!   warns of registry credentials sent over `http://`;
//! * `outboxd dlq replay` against a real Kafka broker ends without an ERROR line: reaching the end
//!   of the dead-letter topic is how a replay finishes;
//! * a payload that does not fit its registry schema (a real Apicurio Registry) is dead-lettered
//!   with a reason that names the field and says what the schema expects, in words.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::registry::Registry;
use common::*;

/// `GET path` on 127.0.0.1:port with this `Host` header; (status, body).
fn get_as(port: u16, host: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("the endpoint listens");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

#[test]
fn the_status_page_answers_known_hosts_only_and_its_last_error_reads_for_people() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("ALTER TABLE outbox ALTER COLUMN event_type DROP NOT NULL");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let daemon = |extra: &[&str]| {
        let mut a = vec!["--sink", "stdout", "--metrics-addr", &addr];
        a.extend_from_slice(extra);
        Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &a))
    };
    let mut d = daemon(&[]);
    // No route: dead-lettered, with the WARN line the page shows as its last error.
    let bad = pg.insert_event("t", "b", None, "{\"n\": 2}", None);
    let mut s = serde_json::Value::Null;
    let shown = wait_until(Duration::from_secs(30), || {
        let (code, body) = get_as(port, &addr, "/status.json");
        s = serde_json::from_str(&body).unwrap_or_default();
        code == 200 && s["last_error"]["message"].as_str().is_some_and(|m| m.contains(bad.as_str()))
    });
    assert!(shown, "{s:#}\n{}", d.log());

    // A name pointed at 127.0.0.1 by someone else's DNS: refused, with the fix in one line.
    for path in ["/", "/status.json"] {
        let (code, body) = get_as(port, "rebind.attacker.example:80", path);
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("--status-page-allowed-hosts") && body.trim_end().lines().count() == 1, "{body}");
        assert!(!body.contains(bad.as_str()), "{body}");
    }
    // Loopback by name or address, and any IP address (a pod's): answered.
    for host in
        ["localhost".to_owned(), format!("localhost:{port}"), format!("[::1]:{port}"), "10.1.2.3:9464".to_owned()]
    {
        assert_eq!(get_as(port, &host, "/status.json").0, 200, "{host}");
    }
    // Probes and scrapes answer whatever Host they come with.
    for path in ["/metrics", "/healthz"] {
        assert_eq!(get_as(port, "rebind.attacker.example", path).0, 200, "{path}");
    }
    assert_eq!(get_as(port, "status.example.com", "/status.json").0, 403);
    // A request head cut at the 8 KiB the endpoint reads (a long query pushes Host out of it) is
    // not answered as if it had no Host; nor is an HTTP/1.1 request without one.
    let (code, body) = get_as(port, "rebind.attacker.example", &format!("/status.json?{}", "a".repeat(9000)));
    assert_eq!(code, 431, "{body}");
    assert!(!body.contains(bad.as_str()), "{body}");
    let raw = |head: &str| {
        let mut c = TcpStream::connect(("127.0.0.1", port)).expect("the endpoint listens");
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(head.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    };
    let out = raw("GET /status.json HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(raw("GET /status.json HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 200"), "HTTP/1.0 needs no Host");
    // The last error as people write it.
    let message = s["last_error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("event_id={bad} ")), "{message}");
    assert!(!message.contains("Some(") && !message.contains('"'), "Rust's Debug on the page: {message}");
    d.stop_cleanly();

    // The operator's names: answered once listed, and only they.
    let _d = daemon(&["--status-page-allowed-hosts", "status.example.com,.ops.example"]);
    for (host, code) in [
        ("status.example.com".to_owned(), 200),
        (format!("a.ops.example:{port}"), 200),
        ("localhost".to_owned(), 200),
        ("rebind.attacker.example".to_owned(), 403),
    ] {
        assert_eq!(get_as(port, &host, "/status.json").0, code, "{host}");
    }
}

#[test]
fn outboxd_config_masks_registry_keys_and_webhook_paths_and_warns_of_cleartext_credentials() {
    assert_config_masks(
        &["--value-format", "avro", "--schema-registry-url", "https://registry.example/api?apikey=hunter2&v=1"],
        &["--schema-registry-url 'https://registry.example/api?apikey=****&v=1'"],
        "hunter2",
    );
    assert_config_masks(
        &["--sink", "http", "--http-url", "https://hooks.slack.com/services/T0AB12/B0CD34/hunter2xyz"],
        &["--http-url 'https://hooks.slack.com/services/****/****/****'"],
        "hunter2",
    );
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("registry.pw");
    std::fs::write(&pw, "hunter2\n").unwrap();
    let base = ["config", "--postgres-url", "postgres://u@127.0.0.1/db", "--value-format", "avro"];
    let auth = ["--schema-registry-user", "outboxd", "--schema-registry-password-file", pw.to_str().unwrap()];
    let mut a = args(&base);
    a.extend(args(&["--schema-registry-url", "http://registry.example:8081"]));
    a.extend(args(&auth));
    let (code, out) = run_to_exit(&a, Duration::from_secs(20));
    assert_eq!(code, Some(0), "{out}");
    let warning = out.lines().find(|l| l.contains("clear text")).unwrap_or_else(|| panic!("no warning:\n{out}"));
    assert!(
        warning.starts_with("outboxd: warning: --schema-registry-url") && warning.contains("https://"),
        "{warning}"
    );
    let mut a = args(&base);
    a.extend(args(&["--schema-registry-url", "https://registry.example:8081"]));
    a.extend(args(&auth));
    let (code, out) = run_to_exit(&a, Duration::from_secs(20));
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("clear text"), "{out}");
}

#[test]
fn dlq_replay_reaches_the_end_without_an_error_line() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let broker = Broker::start();
    let dlq_topic = unique_name("outboxd.dlq");
    let dest = unique_name("replayed");
    broker.create_topic(&dlq_topic, 2);
    broker.create_topic(&dest, 1);
    let producer: FutureProducer = broker.client_config().create().unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        for (i, partition) in [0, 1, 0].into_iter().enumerate() {
            let id = format!("e{i}");
            let headers = OwnedHeaders::new()
                .insert(Header { key: "id", value: Some(id.as_str()) })
                .insert(Header { key: "outboxd.error", value: Some("invalid_json") })
                .insert(Header { key: "outboxd.error.message", value: Some("not JSON") })
                .insert(Header { key: "outboxd.original.topic", value: Some(dest.as_str()) })
                .insert(Header { key: "outboxd.source.lsn", value: Some("0/16B3748") })
                .insert(Header { key: "outboxd.source.table", value: Some("public.outbox") });
            let rec = FutureRecord::to(&dlq_topic).partition(partition).key("k").payload("{}").headers(headers);
            producer.send(rec, Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
        }
    });
    let state = tempfile::tempdir().unwrap();
    let bootstrap = broker.bootstrap();
    let (code, out) = run_to_exit(
        &args(&[
            "dlq",
            "replay",
            "--kafka-brokers",
            &bootstrap,
            "--dlq-topic",
            &dlq_topic,
            "--state-dir",
            state.path().to_str().unwrap(),
        ]),
        Duration::from_secs(120),
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("replayed 3,"), "{out}");
    assert!(!out.contains("PartitionEOF") && !out.contains("ERROR"), "the normal end logged as an error:\n{out}");
}

const PRICE: &str = r#"{"type":"record","name":"PriceSet","namespace":"shop.v1","fields":[
  {"name":"sku","type":"string"},
  {"name":"amount","type":"int"},
  {"name":"price","type":"double"},
  {"name":"currency","type":{"type":"enum","name":"Currency","symbols":["EUR","USD"]}},
  {"name":"lines","type":{"type":"array","items":{"type":"record","name":"Line","fields":[
    {"name":"qty","type":"int"}]}},"default":[]}]}"#;

#[test]
fn a_misfit_payload_is_dead_lettered_naming_the_field_and_the_expectation() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let reg = Registry::start();
    reg.register("price.set.v1.events-value", "AVRO", PRICE);
    let d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--status-interval", "500ms", "--value-format", "avro", "--schema-registry-url", &reg.url],
    ));
    let ok = r#"{"sku": "a", "amount": 1, "price": 1.5, "currency": "EUR"}"#;
    let cases = [
        (
            r#"{"sku": "a", "amount": 1099511627776, "price": 1.5, "currency": "EUR"}"#,
            r#"field "amount": expected an int (32-bit), got 1099511627776"#,
        ),
        (
            r#"{"sku": "a", "amount": 1, "price": "twelve", "currency": "EUR"}"#,
            r#"field "price": expected a double, got a string "twelve""#,
        ),
        (
            r#"{"sku": "a", "amount": 1, "price": 1.5, "currency": "JPY"}"#,
            r#"field "currency": "JPY" is not one of the enum's symbols [EUR, USD]"#,
        ),
        (
            r#"{"sku": "a", "amount": 1, "price": 1.5, "currency": "EUR", "lines": [{"qty": 1}, {"qty": "x"}]}"#,
            r#"field "lines[1].qty": expected an int (32-bit), got a string "x""#,
        ),
    ];
    let ids: Vec<String> =
        cases.iter().map(|(payload, _)| pg.insert_event("shop", "p", Some("price.set.v1"), payload, None)).collect();
    pg.insert_event("shop", "p", Some("price.set.v1"), ok, None);
    assert_eq!(broker.consume_all("price.set.v1.events", 1, 1, Duration::from_secs(60)).len(), 1, "{}", d.log());
    let dead = broker.consume_all("outboxd.dlq", 1, cases.len(), Duration::from_secs(30));
    for ((_, want), id) in cases.iter().zip(&ids) {
        let copy = dead
            .iter()
            .find(|c| c.header_str("id").as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no dead letter for {id}: {dead:?}\n{}", d.log()));
        assert_eq!(copy.header_str("outboxd.error").as_deref(), Some("schema_mismatch"));
        let message = copy.header_str("outboxd.error.message").unwrap_or_default();
        assert!(message.ends_with(want), "{id}: {message}");
    }
}
