//! Personal data end to end: real PostgreSQL, the real binary with `--sink stdout` (dead-letter
//! copies go to the same sink, on `outboxd.dlq`). Masked payload fields and headers, a field
//! sealed with one keyring and opened by `outboxd decrypt` after a key rotation, event types the
//! rules are not for passing byte for byte, and dead-letter copies that carry nothing unmasked;
//! then the same through a real Apache Kafka broker, oversize copies (chunks) included.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use common::*;
use serde_json::{json, Value};

const CARD: &str = "4111111111111111";
const SSN: &str = "078-05-1120";

fn write_ring(dir: &Path, name: &str, keys: &[(&str, u8)]) -> PathBuf {
    let keys: Vec<Value> = keys
        .iter()
        .map(|(kid, b)| json!({"kid": kid, "key": base64::engine::general_purpose::STANDARD.encode([*b; 32])}))
        .collect();
    let p = dir.join(name);
    std::fs::write(&p, json!({ "keys": keys }).to_string()).unwrap();
    p
}

/// The record lines the stdout sink printed, in order.
fn records(log: &str) -> Vec<Value> {
    log.lines().filter(|l| l.starts_with("{\"topic\"")).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `outboxd decrypt --encrypt-key-file RING` with `input` on stdin: (exit code, stdout, stderr).
fn decrypt(ring: &Path, input: &str) -> (i32, String, String) {
    let mut child = Command::new(outboxd_bin())
        .args(["decrypt", "--encrypt-key-file"])
        .arg(ring)
        .env_remove("OUTBOXD_ENCRYPT_KEY_FILE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn insert(pg: &PgCluster, id: &str, event_type: &str, payload: &str, headers: &str) {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('order', '{id}', '{event_type}', '{payload}', '{headers}')"
    ));
}

#[test]
fn masks_encrypts_and_keeps_dead_letter_copies_clean() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let keys = tempfile::tempdir().unwrap();
    let hash_key = keys.path().join("hash.key");
    std::fs::write(&hash_key, "0123456789abcdef0123456789abcdef\n").unwrap();
    let ring1 = write_ring(keys.path(), "ring1.json", &[("k1", 1)]);
    let ring2 = write_ring(keys.path(), "ring2.json", &[("k1", 1), ("k2", 2)]);
    let flags = |ring: &Path| -> Vec<String> {
        let mut f = args(&[
            "--sink",
            "stdout",
            "--status-interval",
            "200ms",
            "--mask",
            "/card/number=last4",
            "--mask",
            "/customer/email=hash",
            "--mask",
            "/items/*/cvv=drop",
            "--mask",
            "headers/email=drop",
            "--mask",
            "headers/user/email=redact",
            "--mask",
            "headers/phone=hash",
            "--encrypt",
            "/customer/ssn",
            "--mask-event-type",
            r"order\..*",
            "--mask-key-file",
        ]);
        f.push(hash_key.display().to_string());
        f.push("--encrypt-key-file".into());
        f.push(ring.display().to_string());
        daemon_args_pg_only(&pg, &f.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let payload = format!(
        r#"{{"card": {{"number": "{CARD}", "exp": "12/30"}}, "customer": {{"email": "alice@example.com", "ssn": "{SSN}"}}, "items": [{{"sku": "a", "cvv": "123"}}, {{"sku": "b"}}], "total": 10.50}}"#
    );
    let headers = r#"{"email": "alice@example.com", "user": {"email": "alice@example.com", "id": 7}, "phone": "+15550100", "trace": "t-1"}"#;

    // Session 1, keyring with k1 only.
    let mut d = Outboxd::spawn_streaming(&flags(&ring1));
    insert(&pg, "1", "order.paid.v1", &payload, headers);
    // Not an order event: the rules are not for it.
    insert(
        &pg,
        "2",
        "user.created.v1",
        &format!(r#"{{"card": {{"number": "{CARD}"}}}}"#),
        r#"{"email": "bob@example.com"}"#,
    );
    // An order event whose topic is illegal: its dead-letter copy must be masked like the stream.
    insert(&pg, "3", "order.bad v1", &payload, "{}");
    // An order event whose payload has no fields to mask: unmaskable, its copy has no payload.
    insert(&pg, "4", "order.note.v1", &format!(r#""card {CARD}""#), "{}");
    assert!(wait_until(Duration::from_secs(20), || records(&d.log()).len() >= 4), "{}", d.log());
    d.stop_cleanly();
    let log = d.log();
    assert_eq!(log.matches(CARD).count(), 1, "the card number shows only in the unscoped event:\n{log}");
    let recs = records(&log);
    assert_eq!(recs.len(), 4, "{log}");
    let by_key = |k: &str| recs.iter().find(|r| r["key"] == k).unwrap_or_else(|| panic!("no key {k}:\n{log}"));

    // 1: masked payload and headers, ssn sealed with k1, other fields as they were.
    let r1 = by_key("1");
    assert_eq!(r1["topic"], "order.paid.v1.events");
    let p = &r1["payload"];
    assert_eq!(p["card"], json!({"number": "************1111", "exp": "12/30"}));
    let email_hash = p["customer"]["email"].as_str().unwrap();
    assert!(email_hash.len() == 64 && email_hash.bytes().all(|b| b.is_ascii_hexdigit()), "{p}");
    assert_eq!(p["customer"]["ssn"]["kid"], "k1");
    assert_eq!(p["customer"]["ssn"]["alg"], "XC20P");
    assert_eq!(p["items"], json!([{"sku": "a"}, {"sku": "b"}]));
    let line1 = log.lines().find(|l| l.starts_with(r#"{"topic":"order.paid.v1.events""#)).unwrap();
    assert!(line1.contains(r#""total":10.50"#), "numbers keep their spelling: {line1}");
    let h = &r1["headers"];
    assert!(h.get("email").is_none(), "{h}");
    assert_eq!(h["user"], r#"{"email":"***","id":7}"#);
    assert_eq!(h["trace"], "t-1");
    let phone = h["phone"].as_str().unwrap();
    assert!(phone.len() == 64 && phone != "+15550100", "{h}");
    assert!(!r1.to_string().contains("alice@") && !r1.to_string().contains(SSN), "{r1}");

    // 2: not an order event: exactly what PostgreSQL sent.
    let r2 = by_key("2");
    assert_eq!(r2["payload"]["card"]["number"], CARD);
    assert_eq!(r2["headers"]["email"], "bob@example.com");

    // 3: the dead-letter copy of a refused row is masked like the stream would be.
    let r3 = by_key("3");
    assert_eq!(r3["topic"], "outboxd.dlq");
    assert_eq!(r3["headers"]["outboxd.error"], "invalid_topic");
    assert_eq!(r3["payload"]["card"]["number"], "************1111");
    assert_eq!(r3["payload"]["customer"]["email"], email_hash, "the same pseudonym as on the stream");
    assert_eq!(r3["payload"]["customer"]["ssn"]["kid"], "k1");

    // 4: a payload the rules cannot look into is a bad event whose copy drops it.
    let r4 = by_key("4");
    assert_eq!(r4["topic"], "outboxd.dlq");
    assert_eq!(r4["headers"]["outboxd.error"], "unmaskable");
    assert!(r4["headers"]["outboxd.payload.dropped"].as_str().unwrap().contains("not an object"), "{r4}");
    assert_eq!(r4["payload"], Value::Null);
    assert!(!log.contains(&format!("card {CARD}")), "{log}");

    // Session 2 after a rotation: the keyring gained k2, which seals new events.
    let mut d = Outboxd::spawn_streaming(&flags(&ring2));
    insert(&pg, "5", "order.paid.v1", &payload, "{}");
    assert!(wait_until(Duration::from_secs(20), || !records(&d.log()).is_empty()), "{}", d.log());
    d.stop_cleanly();
    let r5 = records(&d.log()).remove(0);
    assert_eq!(r5["payload"]["customer"]["ssn"]["kid"], "k2", "new events use the newest key");

    // `outboxd decrypt` with the rotated keyring opens both, old key and new.
    let input = format!("{}\n{}\n", r1, r5);
    let (code, out, err) = decrypt(&ring2, &input);
    assert_eq!(code, 0, "{err}");
    let opened: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(opened.len(), 2, "{out}");
    for o in &opened {
        assert_eq!(o["payload"]["customer"]["ssn"], SSN, "{o}");
        assert_eq!(o["payload"]["card"]["number"], "************1111", "masking is one-way");
    }
    // A sealed value is bound to its event and field: event 1's ssn pasted into event 5 does not
    // open, nor does a bare payload without `--event-id`.
    let mut moved = r5.clone();
    moved["payload"]["customer"]["ssn"] = r1["payload"]["customer"]["ssn"].clone();
    let (code, _, err) = decrypt(&ring2, &format!("{moved}\n"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 1") && err.contains("moved there from another event or field"), "{err}");
    let (code, _, err) = decrypt(&ring2, &format!("{}\n", r5["payload"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--event-id"), "{err}");
    // The old keyring cannot open k2's values, and says which key is missing.
    let (code, _, err) = decrypt(&ring1, &input);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 2") && err.contains("\"k2\"") && err.lines().count() == 1, "{err}");
}

/// Through a real Apache Kafka broker: the event on its topic is masked, and so are the dead-letter
/// copies of a row the router refuses (NULL route) and of a record over `message.max.bytes`
/// (sent as chunks): no record on any topic carries the card number.
#[test]
fn kafka_topic_and_dead_letter_copies_are_masked() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("ALTER TABLE outbox ALTER COLUMN event_type DROP NOT NULL");
    let broker = Broker::start();
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--status-interval", "200ms", "--mask", "/card=last4", "--kafka-property", "message.max.bytes=10000"],
    ));
    let row = |agg: &str, ty: &str, payload: &str| {
        pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', '{agg}', {ty}, '{payload}')"
        ));
    };
    row("good", "'ok.v1'", &format!(r#"{{"card": "{CARD}"}}"#));
    row("null-route", "NULL", &format!(r#"{{"card": "{CARD}", "n": 2}}"#));
    row("big", "'ok.v1'", &format!(r#"{{"card": "{CARD}", "blob": "{}"}}"#, "x".repeat(25_000)));
    let ok = broker.consume_all("ok.v1.events", 1, 1, Duration::from_secs(30));
    assert_eq!(ok.len(), 1, "{}", d.log());
    assert_eq!(ok[0].payload_json()["card"], "************1111");
    let dlq = broker.consume_all("outboxd.dlq", 1, 3, Duration::from_secs(30));
    let reason = |key: &str| {
        dlq.iter()
            .filter(|r| r.key_str().as_deref() == Some(key))
            .map(|r| r.header_str("outboxd.error"))
            .collect::<Vec<_>>()
    };
    assert_eq!(reason("null-route"), [Some("null_route".to_owned())], "{}", d.log());
    let null_route = dlq.iter().find(|r| r.key_str().as_deref() == Some("null-route")).unwrap();
    assert_eq!(null_route.payload_json(), json!({"card": "************1111", "n": 2}));
    let big = reason("big");
    assert!(big.len() > 1 && big.iter().all(|r| r.as_deref() == Some("too_large")), "{big:?}\n{}", d.log());
    for r in ok.iter().chain(&dlq) {
        let p = r.payload.as_deref().unwrap_or_default();
        assert!(!p.windows(CARD.len()).any(|w| w == CARD.as_bytes()), "{} carries the card number", r.topic);
    }
    d.stop_cleanly();
}
