//! The status page (`/`, `/status.json`) against a running outboxd with real PostgreSQL and
//! Apache Kafka, looked at in headless Chromium (Debian's, driven by playwright-core through
//! `tools/browser/status_page.mjs`): the page loads, the dead-letter list shows a dead-lettered
//! event, the lag chart climbs by itself while the broker is stopped, no request leaves loopback,
//! and no secret is on the page. Screenshots are kept in `target/status-page/`.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;

fn artifacts() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/status-page");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Run the browser script; returns (exit ok, its JSON report).
fn browser(args: &[&str]) -> (bool, serde_json::Value) {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("node")
        .arg(format!("{root}/tools/browser/status_page.mjs"))
        .args(args)
        .current_dir(root)
        .output()
        .expect("node runs (scripts/lib.sh ensure_tools installs tools/browser's playwright-core)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let report = serde_json::from_str(line).unwrap_or_else(|e| {
        panic!("the browser script printed no report ({e}):\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr))
    });
    (out.status.success(), report)
}

fn status_json(port: u16, query: &str) -> serde_json::Value {
    let (code, body) = http_get(port, &format!("/status.json{query}")).expect("the endpoint answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status.json is not JSON ({e}): {body}"))
}

fn lax_outbox(pg: &PgCluster) {
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("ALTER TABLE outbox ALTER COLUMN event_type DROP NOT NULL");
}

#[test]
fn the_page_shows_a_dead_letter_and_a_climbing_lag_in_a_browser_and_loads_nothing_from_elsewhere() {
    let pg = PgCluster::start();
    lax_outbox(&pg);
    let broker = Broker::start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--metrics-addr", &addr, "--status-interval", "200ms", "--lag-poll-interval", "500ms"],
    ));
    let good = pg.insert_event("t", "a", Some("ok.v1"), "{\"n\": 1}", None);
    let bad = pg.insert_event("t", "b", None, "{\"n\": 2}", None);
    assert_eq!(broker.consume_all("ok.v1.events", 1, 1, Duration::from_secs(30)).len(), 1, "{}", d.log());

    // The JSON: the facts, the dead letter, the connections, the routing preview (read when a
    // page asks, so asked until it is there).
    let mut s = serde_json::Value::Null;
    let shown = wait_until(Duration::from_secs(40), || {
        s = status_json(port, "");
        s["dead_letters"]["newest"].as_array().is_some_and(|a| a.iter().any(|e| e["event_id"] == bad.as_str()))
            && s["routing_preview"].is_object()
            && s["events_total"].as_u64() == Some(1)
    });
    assert!(shown, "{s:#}\n{}", d.log());
    assert_eq!(s["role"], "active", "{s:#}");
    assert_eq!(s["ready"], true, "{s:#}");
    assert_eq!(s["facts"]["slot"], "outboxd", "{s:#}");
    assert_eq!(s["facts"]["command"], "run");
    assert_eq!(s["dead_letters"]["by_reason"][0]["reason"], "null_route", "{s:#}");
    assert_eq!(s["dead_letters"]["total"], 1, "{s:#}");
    assert_eq!(s["dead_letters"]["newest"][0]["reason"], "null_route");
    assert_eq!(s["topics"]["top"][0]["topic"], "ok.v1.events", "{s:#}");
    assert_eq!(s["topics"]["top"][0]["events"], 1);
    let connected =
        |c: &str| s["connections"].as_array().unwrap().iter().any(|x| x["component"] == c && x["connected"] == true);
    assert!(connected("kafka") && connected("postgres"), "{s:#}");
    let routes = &s["routing_preview"]["tables"][0]["routes"];
    let route = |topic: Option<&str>| {
        routes.as_array().unwrap().iter().find(|r| r["topic"].as_str() == topic).cloned().unwrap_or_default()
    };
    assert_eq!(route(Some("ok.v1.events"))["rows"], 1, "{routes:#}");
    assert_eq!(route(None)["problem"], "null_route", "{routes:#}");
    assert!(s["poll"].is_null());
    let _ = good;

    // In the browser: rendered by the script, the dead-lettered event listed.
    let dir = artifacts();
    let first = dir.join("loaded.png");
    let (ok, r) =
        browser(&["--url", &format!("http://{addr}/"), "--screenshot", first.to_str().unwrap(), "--expect-dlq", &bad]);
    assert!(ok, "{r:#}\n{}", d.log());
    assert_eq!(r["external"], serde_json::json!([]), "{r:#}");
    assert_eq!(r["console_errors"], serde_json::json!([]), "{r:#}");
    assert_eq!(r["seen"]["role"], "active", "{r:#}");
    assert!(r["seen"]["preview_topics"].as_array().unwrap().iter().any(|t| t == "ok.v1.events"), "{r:#}");
    assert!(r["requests"].as_array().unwrap().iter().any(|u| u.as_str().unwrap().ends_with("/status.json")), "{r:#}");
    assert!(std::fs::metadata(&first).map(|m| m.len() > 10_000).unwrap_or(false), "no screenshot at {first:?}");

    // Without JavaScript the basic figures are there.
    let (ok, r) = browser(&["--url", &format!("http://{addr}/"), "--no-js", "--expect-dlq", &bad]);
    assert!(ok, "{r:#}");
    assert_eq!(r["seen"]["dlq_total"], "1", "{r:#}");

    // The broker stops; rows keep coming: the slot falls behind, and the chart climbs on an open
    // page (no reload).
    broker.pause();
    let writing = AtomicBool::new(true);
    let behind = dir.join("broker-stopped.png");
    let ((ok, r), written) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut n = 0u64;
            while writing.load(Ordering::Relaxed) {
                pg.psql(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                     SELECT 't', 'k' || g, 'ok.v1', json_build_object('pad', repeat('x', 500)) FROM generate_series(1, 50) g",
                );
                n += 50;
                std::thread::sleep(Duration::from_millis(300));
            }
            n
        });
        let seen = browser(&[
            "--url",
            &format!("http://{addr}/"),
            "--screenshot",
            behind.to_str().unwrap(),
            "--expect-dlq",
            &bad,
            "--wait-lag-rise",
            "--timeout",
            "60",
        ]);
        writing.store(false, Ordering::Relaxed);
        (seen, writer.join().unwrap())
    });
    broker.resume();
    assert!(ok, "{r:#}\n{}", d.log());
    assert!(r["seen"]["chart_last"].as_f64().unwrap() > r["lag_first"].as_f64().unwrap(), "{r:#}");
    assert_eq!(r["external"], serde_json::json!([]), "{r:#}");
    // Nothing was lost meanwhile.
    let all = broker.consume_all("ok.v1.events", 1, 1 + written as usize, Duration::from_secs(60));
    let ids: std::collections::HashSet<_> = all.iter().filter_map(|c| c.header_str("id")).collect();
    assert_eq!(ids.len() as u64, 1 + written, "{}", d.log());
}

#[test]
fn the_token_guards_the_page_and_nothing_secret_is_shown() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "pAge-t0ken\n").unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let d = Outboxd::spawn_streaming(&daemon_args_pg_only(
        &pg,
        &[
            "--sink",
            "null",
            "--metrics-addr",
            &addr,
            "--status-page-token-file",
            token_file.to_str().unwrap(),
            "--kafka-property",
            "sasl.password=k4fka-s3cret",
        ],
    ));
    for path in ["/", "/status.json", "/?token=wrong", "/status.json?token=pAge-t0ke"] {
        let (code, body) = http_get(port, path).unwrap();
        assert_eq!(code, 401, "{path}: {body}");
        assert!(body.contains("--status-page-token-file"), "{body}");
    }
    for path in ["/metrics", "/healthz", "/status.js", "/status.css"] {
        assert_eq!(http_get(port, path).unwrap().0, 200, "{path}");
    }
    // A connection that sends nothing (a TCP probe) gets nothing back: no page is rendered for it.
    {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
    }
    // A bearer token works as well as the query.
    let bearer = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /status.json HTTP/1.0\r\nAuthorization: Bearer pAge-t0ken\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(bearer.starts_with("HTTP/1.1 200"), "{bearer}");
    let json = status_json(port, "?token=pAge-t0ken");
    let (code, html) = http_get(port, "/?token=pAge-t0ken").unwrap();
    assert_eq!(code, 200);
    // The page passes the token on to its own requests, and shows nothing secret.
    assert!(html.contains("data-json=\"/status.json?token=pAge-t0ken\""), "{html}");
    let pg_password = pg.url().split(':').nth(2).unwrap().split('@').next().unwrap().to_owned();
    assert!(pg_password.len() >= 4, "{}", pg.url());
    let json_text = json.to_string();
    for secret in [pg_password.as_str(), "k4fka-s3cret"] {
        assert!(!json_text.contains(secret), "{secret} in {json_text}");
        assert!(!html.contains(secret), "{secret} in the page");
        assert!(!d.log().contains(secret), "{secret} in the log");
    }
    assert!(!json_text.contains("pAge-t0ken") && !d.log().contains("pAge-t0ken"));
    assert_eq!(json["facts"]["sink"], "null");
    let (_, headers) = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /?token=pAge-t0ken HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        ((), out.split("\r\n\r\n").next().unwrap().to_owned())
    };
    assert!(headers.contains("Content-Security-Policy: default-src 'none'"), "{headers}");
    assert!(headers.contains("Referrer-Policy: no-referrer"), "{headers}");
}

#[test]
fn poll_mode_shows_the_outbox_signals() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.apply_sql_file(sql_dir().join("05_poll.sql"));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    pg.insert_event("t", "a", Some("ok.v1"), "{\"n\": 1}", None);
    let mut a = args(&["poll", "--postgres-url"]);
    a.push(pg.url());
    a.extend(args(&["--sink", "null", "--metrics-addr", &addr]));
    let d = Outboxd::spawn(&a);
    let mut s = serde_json::Value::Null;
    let shown = wait_until(Duration::from_secs(30), || {
        http_get(port, "/status.json").is_some_and(|(c, b)| {
            s = serde_json::from_str(&b).unwrap_or_default();
            c == 200 && s["events_total"] == 1 && s["poll"]["unpublished_rows"] == 0
        })
    });
    assert!(shown, "{s:#}\n{}", d.log());
    assert_eq!(s["facts"]["command"], "poll");
    assert_eq!(s["role"], "polling", "{s:#}");
    assert_eq!(s["poll"]["publish_error_ratio"], 0.0, "{s:#}");
    // poll's own lag, none of run's WAL figures (their gauges exist, at 0, in every process); the
    // relay's in-flight figures are poll's too (nothing in flight once the row is published).
    assert!(s["lag"]["seconds"].is_number(), "{s:#}");
    assert!(s["lag"]["bytes"].is_null(), "{s:#}");
    assert_eq!(s["in_flight"]["records"], 0.0, "{s:#}");
    let (_, html) = http_get(port, "/").unwrap();
    assert!(html.contains("id=\"poll-unpublished\""), "{html}");
}
