//! `/status.json`'s shape against [`FIELDS`], the generated manual table, the page's escaping
//! and the token check.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::*;

/// A status with every optional part present, so every documented field appears.
fn full() -> Status {
    Status {
        version: "outboxd 0.0.0",
        role: "active",
        ready: true,
        live: true,
        started_at: "2026-12-05T06:00:00Z".into(),
        uptime_seconds: 5,
        facts: Facts {
            command: "run".into(),
            tables: vec!["public.outbox".into()],
            dead_letter_sink: Some("nats".into()),
            ..Facts::default()
        },
        lag: Lag { bytes: Some(1), seconds: Some(0.5) },
        events_total: 3,
        events_per_second: 1.5,
        in_flight: InFlight {
            records: Some(1),
            records_max: 10,
            bytes: Some(100),
            bytes_max: 1000,
            oldest_unacked_age_seconds: Some(0.1),
        },
        connections: vec![Connection { component: "kafka".into(), connected: true }],
        last_error: Some(board::Problem { level: "WARN".into(), message: "m".into(), at: "t".into() }),
        dead_letters: DeadLetters {
            destination: "outboxd.dlq".into(),
            on_bad_event: "dlq".into(),
            total: 1,
            by_reason: vec![ReasonCount { reason: "null_route".into(), events: 1 }],
            newest: vec![board::DeadLettered {
                event_id: Some("e1".into()),
                topic: Some("t".into()),
                reason: "null_route".into(),
                message: "m".into(),
                at: "t".into(),
            }],
            list_command: "l".into(),
            replay_command: "r".into(),
        },
        topics: Topics { count: 1, top: vec![TopicCount { topic: "order.events".into(), events: 3 }] },
        routing_preview: Some(preview::Preview {
            checked_at: "t".into(),
            tables: vec![preview::TablePreview {
                table: "public.outbox".into(),
                routes: vec![preview::RoutePreview {
                    value: Some("order".into()),
                    topic: Some("order.events".into()),
                    rows: 2,
                    problem: None,
                }],
                error: None,
            }],
        }),
        poll: Some(Poll {
            unpublished_rows: Some(1),
            oldest_unpublished_age_seconds: Some(2.0),
            publish_error_ratio: 0.0,
        }),
        history: History {
            interval_seconds: 5,
            points: vec![sample::Point { t: 1, lag_bytes: Some(1.0), lag_seconds: Some(1.0), events_per_second: 1.0 }],
        },
    }
}

/// Every field path in `v`, arrays written `name[]`, with whether it holds an object.
fn with_brackets(v: &serde_json::Value, prefix: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, bool)>) {
        if let serde_json::Value::Object(m) = v {
            for (k, v) in m {
                let base = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                match v {
                    serde_json::Value::Array(a) => {
                        let p = format!("{base}[]");
                        match a.first() {
                            Some(first) if first.is_object() => walk(&p, first, out),
                            _ => out.push((p, false)),
                        }
                    }
                    serde_json::Value::Object(_) => {
                        out.push((base.clone(), true));
                        walk(&base, v, out);
                    }
                    _ => out.push((base, false)),
                }
            }
        }
    }
    walk(prefix, v, &mut out);
    out
}

#[test]
fn every_json_field_is_documented_and_every_documented_field_exists() {
    let json = serde_json::to_value(full()).unwrap();
    let found = with_brackets(&json, "");
    for (path, is_object) in &found {
        if *is_object {
            continue;
        }
        assert!(
            FIELDS.iter().any(|(f, _)| f == path),
            "/status.json field {path} is not in status::FIELDS; document it there"
        );
    }
    for (f, meaning) in FIELDS {
        assert!(found.iter().any(|(p, _)| p == f), "status::FIELDS lists {f}, which /status.json does not have");
        assert!(!meaning.is_empty() && !meaning.contains('\n'), "{f}: one line of meaning");
    }
}

#[test]
fn the_documented_table_is_the_generated_one() {
    let file = "docs/src/status-page.md";
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let (begin, end) = ("<!-- status.json: generated from src/status/mod.rs -->\n", "<!-- status.json: end -->");
    let start = doc.find(begin).unwrap_or_else(|| panic!("{file} lacks the begin marker")) + begin.len();
    let stop = start + doc[start..].find(end).unwrap_or_else(|| panic!("{file} lacks the end marker"));
    if std::env::var_os("OUTBOXD_BLESS").is_some() {
        let blessed = format!("{}{}{}", &doc[..start], fields_markdown(), &doc[stop..]);
        std::fs::write(Path::new(env!("CARGO_MANIFEST_DIR")).join(file), blessed).unwrap();
        return;
    }
    assert_eq!(
        &doc[start..stop],
        fields_markdown(),
        "{file}'s field table differs from status::FIELDS; OUTBOXD_BLESS=1 cargo test --lib status rewrites it"
    );
}

#[test]
fn row_text_is_escaped_in_the_page() {
    let mut s = full();
    s.dead_letters.newest[0].event_id = Some("<script>alert(1)</script>".into());
    s.topics.top[0].topic = "\"><img src=x onerror=alert(1)>".into();
    s.last_error.as_mut().unwrap().message = "a & b <b>".into();
    let html = page::render(&s, Some("token=a\"b"));
    assert!(!html.contains("<script>alert"), "{html}");
    assert!(!html.contains("<img src=x"), "{html}");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("a &amp; b &lt;b&gt;"));
    assert!(html.contains("data-json=\"/status.json?token=a&quot;b\""));
    // Only our own script and stylesheet; nothing from elsewhere.
    assert!(!html.contains("http://") && !html.contains("https://"), "{html}");
    assert_eq!(html.matches("<script").count(), 1);
    assert!(html.contains("<script src=\"/status.js\">"));
    for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("] {
        assert!(!page::JS.contains(sink), "the script must set text with textContent only, not {sink}");
    }
    // The SVG namespace is a name, not a request; nothing else may point elsewhere.
    assert!(!page::JS.replace("http://www.w3.org/2000/svg", "").contains("http"), "the script names another origin");
    assert!(!page::CSS.contains("http") && !page::CSS.contains("url("), "the stylesheet loads something");
}

#[test]
fn the_facts_and_the_token_check_show_no_secret() {
    use clap::Parser;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken-s3cret\n").unwrap();
    let argv = [
        "outboxd",
        "run",
        "--postgres-url",
        "postgres://u:pg-s3cret@127.0.0.1/db",
        "--kafka-property",
        "sasl.password=k4fka-s3cret",
        "--status-page-token-file",
        token.to_str().unwrap(),
    ];
    let cli = crate::config::Cli::try_parse_from(argv).unwrap();
    let crate::config::Command::Run(a) = cli.command else { unreachable!() };
    let cfg = Config::from_args(&a).unwrap();
    let f = facts(&cfg, "run");
    let text = format!("{}{:?}{}", serde_json::to_string(&f).unwrap(), cfg.status_page_token, cfg.to_text());
    for secret in ["pg-s3cret", "k4fka-s3cret", "t0ken-s3cret"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    assert!(text.contains(&format!("--status-page-token-file {}", token.display())), "{text}");
    assert!(f.dlq_list_command.starts_with("outboxd dlq list --sink kafka --dlq-topic "));
    assert_eq!(f.server, "postgres://u@127.0.0.1:5432/db");
}

#[test]
fn the_token_is_asked_for_only_when_configured() {
    let head = "GET / HTTP/1.1\r\nHost: x\r\nauthorization: Bearer abc\r\n\r\n";
    assert!(authorized(None, "GET / HTTP/1.1\r\n\r\n", ""));
    assert!(authorized(Some("abc"), head, ""));
    assert!(authorized(Some("abc"), "GET / HTTP/1.1\r\nAUTHORIZATION: bearer  abc \r\n\r\n", ""));
    assert!(authorized(Some("abc"), "GET / HTTP/1.1\r\n\r\n", "x=1&token=abc"));
    assert!(authorized(Some("a+b/c="), "GET / HTTP/1.1\r\n\r\n", "token=a%2Bb%2Fc%3D"));
    assert!(!authorized(Some("abc"), "GET / HTTP/1.1\r\n\r\n", ""));
    assert!(!authorized(Some("abc"), "GET / HTTP/1.1\r\nAuthorization: Bearer abd\r\n\r\n", "token=ab"));
    assert!(!authorized(Some("abc"), "GET / HTTP/1.1\r\nAuthorization: Basic abc\r\n\r\n", ""));
}

fn config(extra: &[&str]) -> Config {
    use clap::Parser;
    let mut argv = vec!["outboxd", "run", "--postgres-url", "postgres://u@127.0.0.1:1/db"];
    argv.extend_from_slice(extra);
    let cli = crate::config::Cli::try_parse_from(argv).unwrap();
    let crate::config::Command::Run(a) = cli.command else { unreachable!() };
    Config::from_args(&a).unwrap()
}

/// 10,000 topics in the exporter and a million dead letters give a page and a JSON document of
/// the same bounded size, rendered in well under a second.
#[tokio::test]
async fn ten_thousand_topics_and_a_million_dead_letters_keep_the_page_bounded() {
    let recorder = crate::metrics::builder().unwrap().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        for i in 0..10_000u64 {
            metrics::counter!("outboxd_events_total", "topic" => format!("topic.{i:05}")).increment(i + 1);
        }
        metrics::counter!("outboxd_dlq_events_total", "reason" => "null_route").increment(1_000_000);
    });
    for i in 0..1_000_000u32 {
        board().dead_lettered(Some(&format!("e{i}")), Some("t"), "null_route", "the route-by column is NULL");
    }
    let page = Arc::new(StatusPage {
        handle,
        health: Health::new(std::time::Duration::ZERO),
        // A server that is not there: the preview reads nothing, and says why.
        cfg: config(&[]),
        started: Instant::now(),
        started_at: board::now_text(),
        history: Mutex::default(),
        preview: Mutex::new(None),
        previewing: AtomicBool::new(false),
    });
    let t0 = Instant::now();
    let s = page.status();
    let json = serde_json::to_string(&s).unwrap();
    let html = page.html(None);
    let took = t0.elapsed();
    assert_eq!(s.topics.count, 10_000);
    assert_eq!(s.topics.top.len(), TOP_TOPICS);
    assert_eq!(s.topics.top[0].topic, "topic.09999");
    assert_eq!(s.dead_letters.total, 1_000_000);
    // The board is the process's, and other tests dead-letter too: most of the newest are ours.
    assert_eq!(s.dead_letters.newest.len(), board::NEWEST_DEAD_LETTERS);
    let ours =
        s.dead_letters.newest.iter().filter(|e| e.event_id.as_deref().is_some_and(|i| i.starts_with("e9999"))).count();
    assert!(ours >= board::NEWEST_DEAD_LETTERS - 10, "{:?}", s.dead_letters.newest);
    assert!(json.len() < 64 * 1024, "{} bytes of JSON", json.len());
    assert!(html.len() < 64 * 1024, "{} bytes of HTML", html.len());
    // A bound against a rendering that grows with the dead letters or topics (quadratic work
    // takes minutes here), not a timing: a debug build on a loaded 2-core CI machine took 2.1 s.
    assert!(took < std::time::Duration::from_secs(30), "rendering took {took:?}");
}
