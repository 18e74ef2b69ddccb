//! Hostile input, end to end: a real PostgreSQL cluster, a real Apache Kafka broker, the real binary.
//!
//! Rows with content that tends to break relays — a 4 MiB payload, characters from all 17 Unicode
//! planes, JSON escapes, newlines and control characters in keys and header values, 10 kB keys, a
//! 1000-column table in the same publication — must arrive in Kafka byte for byte as PostgreSQL
//! prints them. What "as PostgreSQL prints them" means is read back through tokio-postgres (psql's
//! aligned or unaligned output is not byte-exact: it drops U+10FFFF, for one).
//!
//! The replication connection must also survive the server ending it mid-stream with an
//! ErrorResponse (`pg_terminate_backend` on the walsender sends FATAL 57P01 and closes): the
//! daemon reconnects and every event arrives at least once.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use common::*;
use tokio_postgres::types::ToSql;

const EVENT_TYPE: &str = "hostile.v1";
const TOPIC: &str = "hostile.v1.events";
/// The daemon's default `--dlq-topic` (`--on-bad-event dlq` is the default policy).
const DLQ: &str = "outboxd.dlq";

// ---------------------------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------------------------

/// A blocking tokio-postgres client over the cluster's unix socket (as `postgres`, db `app`): the
/// text protocol hands back exactly the bytes the server prints.
struct Db {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Db {
    fn connect(pg: &PgCluster) -> Db {
        let rt =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("tokio runtime");
        let client = rt.block_on(pg.client());
        Db { rt, client }
    }

    fn batch(&self, sql: &str) {
        self.rt.block_on(self.client.batch_execute(sql)).unwrap_or_else(|e| panic!("{}: {e:?}", short(sql)));
    }

    fn try_execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, tokio_postgres::Error> {
        self.rt.block_on(self.client.execute(sql, params))
    }

    fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<tokio_postgres::Row> {
        self.rt.block_on(self.client.query(sql, params)).unwrap_or_else(|e| panic!("{}: {e:?}", short(sql)))
    }

    /// Insert one event into `table` (payload and headers given as JSON text); its event id.
    fn insert(&self, table: &str, aggregate_id: &str, payload: &str, headers: &str) -> String {
        let sql = format!(
            "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ('hostile', $1, $2, $3::text::{ptype}, $4::text::jsonb) RETURNING event_id::text",
            ptype = if table.ends_with("_json") { "json" } else { "jsonb" }
        );
        let rows = self.query(&sql, &[&aggregate_id, &EVENT_TYPE, &payload, &headers]);
        rows[0].get(0)
    }
}

fn short(s: &str) -> String {
    s.chars().take(200).collect()
}

/// An outbox row as PostgreSQL prints it.
#[derive(Debug)]
struct Row {
    aggregate_id: String,
    payload: String,
    /// `jsonb_each_text(headers)`: what each top-level key of the headers column must become.
    headers: Vec<(String, String)>,
}

/// `SELECT event_id, aggregate_id, payload::text FROM <table>`, plus the expanded headers.
fn outbox_rows(db: &Db, table: &str) -> BTreeMap<String, Row> {
    let mut rows: BTreeMap<String, Row> = db
        .query(&format!("SELECT event_id::text, aggregate_id, payload::text FROM {table}"), &[])
        .into_iter()
        .map(|r| (r.get(0), Row { aggregate_id: r.get(1), payload: r.get(2), headers: Vec::new() }))
        .collect();
    for r in db.query(&format!("SELECT event_id::text, h.key, h.value FROM {table}, jsonb_each_text(headers) h"), &[]) {
        let id: String = r.get(0);
        rows.get_mut(&id).expect("row").headers.push((r.get(1), r.get(2)));
    }
    rows
}

/// `None` when equal; otherwise where and how the bytes differ (without printing megabytes).
fn byte_diff(got: Option<&[u8]>, want: &[u8]) -> Option<String> {
    let got = match got {
        None => return Some(format!("missing (want {} bytes)", want.len())),
        Some(g) if g == want => return None,
        Some(g) => g,
    };
    let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
    let around = |b: &[u8]| {
        let from = at.saturating_sub(16);
        format!("{:02x?}", &b[from..(at + 16).min(b.len())])
    };
    Some(format!(
        "{} bytes, want {}; first difference at byte {at}: got {} want {}",
        got.len(),
        want.len(),
        around(got),
        around(want)
    ))
}

/// How often each row must appear.
#[derive(Clone, Copy, PartialEq)]
enum Times {
    /// No reconnect happened: exactly once.
    Once,
    /// The at-least-once window: duplicates are allowed, losses are not.
    AtLeastOnce,
}

/// Read `topic` and check it against `rows`: every record is an outbox row with key, value and
/// headers (`id` plus the expanded headers column) byte for byte, every row is there, and nothing
/// was dead-lettered. Returns the records.
fn assert_delivered(
    broker: &Broker,
    topic: &str,
    rows: &BTreeMap<String, Row>,
    times: Times,
    timeout: Duration,
    d: &Outboxd,
) -> Vec<Consumed> {
    check_delivered(broker, topic, rows, times, timeout, d, true)
}

fn check_delivered(
    broker: &Broker,
    topic: &str,
    rows: &BTreeMap<String, Row>,
    times: Times,
    timeout: Duration,
    d: &Outboxd,
    check_dlq: bool,
) -> Vec<Consumed> {
    let got = broker.consume_all(topic, 1, rows.len(), timeout);
    let mut problems = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in &got {
        let Some(id) = r.header_str("id") else {
            problems.push(format!("offset {}: no id header", r.offset));
            continue;
        };
        *seen.entry(id.clone()).or_default() += 1;
        let Some(row) = rows.get(&id) else {
            problems.push(format!("offset {}: id {id} is no outbox row", r.offset));
            continue;
        };
        if let Some(e) = byte_diff(r.key.as_deref(), row.aggregate_id.as_bytes()) {
            problems.push(format!("{id}: key {e}"));
        }
        if let Some(e) = byte_diff(r.payload.as_deref(), row.payload.as_bytes()) {
            problems.push(format!("{id}: value {e}"));
        }
        let mut want: Vec<(String, Vec<u8>)> = vec![("id".into(), id.clone().into_bytes())];
        want.extend(row.headers.iter().map(|(k, v)| (k.clone(), v.clone().into_bytes())));
        want.sort();
        let mut have = r.headers.clone();
        have.sort();
        if have != want {
            problems.push(format!("{id}: headers {have:?}, want {want:?}"));
        }
    }
    for id in rows.keys() {
        match (seen.get(id).copied().unwrap_or(0), times) {
            (0, _) => problems.push(format!("{id}: never arrived")),
            (1, _) | (_, Times::AtLeastOnce) => {}
            (n, Times::Once) => problems.push(format!("{id}: arrived {n} times without a reconnect")),
        }
    }
    if check_dlq && broker.partition_count(DLQ).is_some() {
        let dead = broker.consume_all(DLQ, 1, 1, Duration::from_secs(10));
        problems.push(format!(
            "{} record(s) were dead-lettered, first headers: {:?}",
            dead.len(),
            dead.first().map(|c| &c.headers)
        ));
    }
    if !problems.is_empty() {
        let n = problems.len();
        problems.truncate(20);
        panic!(
            "{n} problem(s) with {} record(s) on {topic} against {} row(s):\n{}\n--- outboxd log (tail) ---\n{}",
            got.len(),
            rows.len(),
            problems.join("\n"),
            tail(&d.log(), 60)
        );
    }
    got
}

fn tail(log: &str, lines: usize) -> String {
    let v: Vec<&str> = log.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// A cluster with `sql/01_outbox.sql`, a broker, and a streaming daemon started with
/// `--status-interval 200ms` plus `extra`.
fn start(extra: &[&str]) -> (PgCluster, Broker, Outboxd) {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    start_daemon(pg, extra)
}

fn start_daemon(pg: PgCluster, extra: &[&str]) -> (PgCluster, Broker, Outboxd) {
    start_daemon_on(pg, Broker::start(), extra)
}

fn start_daemon_on(pg: PgCluster, broker: Broker, extra: &[&str]) -> (PgCluster, Broker, Outboxd) {
    let mut flags = vec!["--status-interval", "200ms"];
    flags.extend_from_slice(extra);
    let d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &flags));
    (pg, broker, d)
}

fn assert_running(d: &mut Outboxd) {
    assert!(d.is_running(), "outboxd exited:\n{}", tail(&d.log(), 60));
}

/// JSON text of exactly `bytes` bytes, which jsonb prints back unchanged: `{"blob": "…"}` with a
/// string of ASCII and 2-, 3- and 4-byte UTF-8 characters that need no escaping.
fn big_json(bytes: usize) -> String {
    const HEAD: &str = "{\"blob\": \"";
    const TAIL: &str = "\"}";
    let body_len = bytes - HEAD.len() - TAIL.len();
    let pattern: Vec<char> =
        "outboxd relays é ü ß € 中文 🦀 😀 𝄞 0123456789 ~!@#$%^&*()_+-=[]{}|;:',.<>?/ ".chars().collect();
    let mut body = String::with_capacity(body_len);
    for c in pattern.iter().cycle() {
        if body.len() + c.len_utf8() > body_len {
            break;
        }
        body.push(*c);
    }
    while body.len() < body_len {
        body.push('x');
    }
    let s = format!("{HEAD}{body}{TAIL}");
    assert_eq!(s.len(), bytes);
    s
}

/// One code point from each of the 17 Unicode planes, including unassigned (planes 4–13), private
/// use (15, 16) and the highest scalar value.
const PLANES: [char; 17] = [
    '\u{00e9}',   // 0 BMP
    '\u{1f980}',  // 1 SMP: crab
    '\u{20000}',  // 2 SIP: CJK ext. B
    '\u{30000}',  // 3 TIP: CJK ext. G
    '\u{40000}',  // 4–13: unassigned, still valid scalar values
    '\u{50001}',  //
    '\u{6abcd}',  //
    '\u{70000}',  //
    '\u{8ffff}',  //
    '\u{90000}',  //
    '\u{a1234}',  //
    '\u{b0000}',  //
    '\u{c0000}',  //
    '\u{d0000}',  //
    '\u{e0001}',  // 14 SSP: language tag
    '\u{f0000}',  // 15 private use A
    '\u{10ffff}', // 16 private use B, the last scalar value
];

// ---------------------------------------------------------------------------------------------
// the tests
// ---------------------------------------------------------------------------------------------

/// A 4 MiB jsonb payload (librdkafka's default `message.max.bytes` is 1 MB, so it is raised), in a
/// transaction with a small event, between small events: all arrive whole and the daemon goes on.
///
/// `HOSTILE_BIG_PAYLOAD_BYTES=N` probes other sizes (`message.max.bytes` is raised to fit).
#[test]
fn four_mib_payload_arrives_whole_and_later_events_follow() {
    let size: usize =
        std::env::var("HOSTILE_BIG_PAYLOAD_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(4 * 1024 * 1024);
    let max_bytes = format!("message.max.bytes={}", (size + 1_000_000).max(10_000_000));
    // A broker whose topics take records that large (Apache Kafka's default is 1 MB): the
    // producer's limit and the topic's must both be raised to carry such an event.
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::options().prop(&max_bytes).start();
    let (pg, broker, mut d) = start_daemon_on(pg, broker, &["--kafka-property", &max_bytes]);
    let db = Db::connect(&pg);
    db.insert("outbox", "before", r#"{"n": 0}"#, "{}");
    db.batch("BEGIN");
    let big_id = db.insert("outbox", "big", &big_json(size), "{}");
    db.insert("outbox", "same-txn", r#"{"n": 1}"#, "{}");
    db.batch("COMMIT");
    for i in 2..7 {
        db.insert("outbox", &format!("after-{i}"), &format!(r#"{{"n": {i}}}"#), "{}");
    }
    let rows = outbox_rows(&db, "outbox");
    assert_eq!(rows.len(), 8);
    assert_eq!(rows[&big_id].payload.len(), size, "jsonb printed the big payload differently");

    let got = assert_delivered(&broker, TOPIC, &rows, Times::Once, Duration::from_secs(120), &d);
    let big = got.iter().find(|c| c.header_str("id").as_deref() == Some(big_id.as_str())).expect("big record");
    assert_eq!(big.payload.as_ref().map(Vec::len), Some(size));
    // Commit order within the partition: the big one is not overtaken.
    let keys: Vec<String> = got.iter().map(|c| c.key_str().unwrap()).collect();
    assert_eq!(keys, ["before", "big", "same-txn", "after-2", "after-3", "after-4", "after-5", "after-6"]);
    assert_running(&mut d);
}

/// The same 4 MiB payload without raising librdkafka's 1 MB `message.max.bytes`: the daemon must
/// neither crash nor stall. Under the default `--on-bad-event dlq` the event becomes dead-letter
/// chunk records under the limit that join back into the row's payload, and the events after it,
/// in the same transaction and later ones, arrive as usual.
#[test]
fn oversized_payload_is_dead_lettered_and_later_events_follow() {
    const SIZE: usize = 4 * 1024 * 1024;
    let (pg, broker, mut d) = start(&[]);
    let db = Db::connect(&pg);
    db.insert("outbox", "before", r#"{"n": 0}"#, "{}");
    db.batch("BEGIN");
    let big_id = db.insert("outbox", "big", &big_json(SIZE), r#"{"h": "v"}"#);
    db.insert("outbox", "same-txn", r#"{"n": 1}"#, "{}");
    db.batch("COMMIT");
    for i in 2..7 {
        db.insert("outbox", &format!("after-{i}"), &format!(r#"{{"n": {i}}}"#), "{}");
    }
    let mut rows = outbox_rows(&db, "outbox");
    assert_eq!(rows.len(), 8);
    let big_row = rows.remove(&big_id).expect("big row");
    check_delivered(&broker, TOPIC, &rows, Times::Once, Duration::from_secs(60), &d, false);

    let dead = broker.consume_all(DLQ, 1, 5, Duration::from_secs(30));
    assert_eq!(dead.len(), 5, "4 MiB in chunks under 1 MB:\n{}", tail(&d.log(), 40));
    for (i, c) in dead.iter().enumerate() {
        assert_eq!(c.header_str("id").as_deref(), Some(big_id.as_str()));
        assert_eq!(c.header_str("outboxd.error").as_deref(), Some("too_large"));
        assert_eq!(c.header_str("outboxd.original.topic").as_deref(), Some(TOPIC));
        assert_eq!(c.header_str("outboxd.chunk.index"), Some(i.to_string()));
        assert_eq!(c.header_str("outboxd.chunk.size"), Some(SIZE.to_string()));
        assert_eq!(c.header_str("h").as_deref(), Some("v"));
        assert_eq!(c.key.as_deref(), Some(&b"big"[..]));
        assert!(c.payload.as_ref().is_some_and(|p| p.len() < 1_000_000), "chunk {i}");
    }
    let joined: Vec<u8> = dead.iter().flat_map(|c| c.payload.clone().unwrap_or_default()).collect();
    assert!(joined == big_row.payload.as_bytes(), "the chunks do not join into the row's payload");
    assert_running(&mut d);
}

/// Characters from every Unicode plane in keys, values and JSON object keys; JSON escapes that
/// jsonb decodes or normalises; the escapes jsonb refuses (`\u0000`, a lone surrogate) are refused
/// by PostgreSQL and so never become events.
#[test]
fn every_unicode_plane_and_json_escapes_arrive_byte_exact() {
    let (pg, broker, mut d) = start(&[]);
    let db = Db::connect(&pg);
    let all: String = PLANES.iter().collect();
    for (plane, c) in PLANES.iter().enumerate() {
        let payload = serde_json::json!({ "plane": plane, "char": c.to_string(), (c.to_string()): "as key" });
        db.insert("outbox", &format!("plane-{plane}-{c}"), &payload.to_string(), "{}");
    }
    db.insert(
        "outbox",
        &all,
        &serde_json::json!({ "all": all, "mixed": format!("a{all}z") }).to_string(),
        &serde_json::json!({ "planes": all }).to_string(),
    );
    // Escapes, as the application might send them: jsonb stores the decoded characters and prints
    // its own canonical escapes. The expectation is whatever `payload::text` prints.
    for (i, text) in [
        r#"{"emoji": "\ud83e\udd80", "e-acute": "\u00e9", "max": "\udbff\udfff"}"#,
        r#"{"ctl": "\u0001\u001f\u007f\u0080", "ws": "\n\t\r\b\f", "quote": "\"", "bs": "\\", "slash": "\/"}"#,
        // A literal backslash-u-0000 (escaped backslash): legal, and not a NUL.
        r#"{"not-nul": "\\u0000", "key\\u0000": 1}"#,
        r#"{"nested": {"deep": [[[["\u2028\u2029\ufeff\u202e"]]]]}, "num": 1.50e3, "neg0": -0.0}"#,
        r#"["top-level array", null, true, 12345678901234567890123]"#,
        r#""a top-level string with \\u0000 and a real \n newline""#,
    ]
    .iter()
    .enumerate()
    {
        db.insert("outbox", &format!("escapes-{i}"), text, "{}");
    }
    // What jsonb refuses: PostgreSQL 15 raises, so there is nothing to relay.
    let nul = db
        .try_execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('hostile', 'nul', $1, $2::text::jsonb)",
            &[&EVENT_TYPE, &r#"{"a": "\u0000"}"#],
        )
        .expect_err("jsonb must refuse \\u0000");
    assert_eq!(nul.code(), Some(&tokio_postgres::error::SqlState::UNTRANSLATABLE_CHARACTER), "{nul:?}");
    let surrogate = db
        .try_execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('hostile', 'surrogate', $1, $2::text::jsonb)",
            &[&EVENT_TYPE, &r#"{"a": "\ud800"}"#],
        )
        .expect_err("jsonb must refuse a lone surrogate");
    assert_eq!(surrogate.code(), Some(&tokio_postgres::error::SqlState::INVALID_TEXT_REPRESENTATION), "{surrogate:?}");

    let rows = outbox_rows(&db, "outbox");
    assert_eq!(rows.len(), 17 + 1 + 6);
    // PostgreSQL really holds the characters (not replacement characters or escapes).
    let all_row = rows.values().find(|r| r.aggregate_id == all).expect("all-planes row");
    assert!(all_row.payload.contains(&all), "{}", all_row.payload);
    assert_delivered(&broker, TOPIC, &rows, Times::Once, Duration::from_secs(60), &d);
    assert_running(&mut d);
}

/// Newlines and other control characters in the key (aggregate_id) and in header values and
/// names (the headers column), and keys of 10 kB.
#[test]
fn newlines_in_keys_and_headers_and_10_kb_keys_arrive_byte_exact() {
    let (pg, broker, mut d) = start(&[]);
    let db = Db::connect(&pg);
    let keys = [
        "\n",
        "a\nb",
        "a\r\nb",
        "trailing\n",
        "\nleading",
        "many\n\n\n\n",
        "\r",
        "tab\tvt\u{b}ff\u{c}bs\u{8}esc\u{1b}del\u{7f}",
        "\u{1}\u{2}\u{1f}",
        "nel\u{85}ls\u{2028}ps\u{2029}",
        " ",
        "k\\n (a backslash and n, not a newline)",
    ];
    for (i, k) in keys.iter().enumerate() {
        let headers = serde_json::json!({
            "trace": format!("line1\nline2\r\n{k}"),
            "only-newline": "\n",
            "empty": "",
            "multi\nline name": "v",
        });
        db.insert("outbox", k, &format!(r#"{{"i": {i}}}"#), &headers.to_string());
    }
    // Keys of 10 kB: ASCII, 4-byte characters, and text with newlines, each exactly 10 240 bytes.
    let ten_k = 10 * 1024;
    let ascii: String = (0..ten_k).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    let crabs: String = "🦀".repeat(ten_k / 4);
    let mut lines: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    lines.truncate(ten_k);
    let mut incompressible = String::with_capacity(ten_k);
    let mut x: u32 = 0x2545_f491;
    while incompressible.len() < ten_k {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        incompressible.push(char::from(b'!' + (x % 94) as u8));
    }
    for (i, k) in [&ascii, &crabs, &lines, &incompressible].into_iter().enumerate() {
        assert_eq!(k.len(), ten_k);
        db.insert("outbox", k, &format!(r#"{{"big-key": {i}}}"#), &serde_json::json!({ "echo": k }).to_string());
    }
    let rows = outbox_rows(&db, "outbox");
    assert_eq!(rows.len(), keys.len() + 4);
    assert!(rows.values().any(|r| r.aggregate_id == "a\r\nb"));
    assert_delivered(&broker, TOPIC, &rows, Times::Once, Duration::from_secs(60), &d);
    assert_running(&mut d);
}

/// A 1000-column table joins the publication while the daemon streams; its inserts, updates and
/// deletes interleave with outbox inserts, also inside the same transactions. Only outbox rows
/// become events, and the slot moves past everything.
#[test]
fn thousand_column_table_in_the_publication_yields_only_outbox_events() {
    let (pg, broker, mut d) = start(&[]);
    let db = Db::connect(&pg);
    let cols: Vec<String> = (1..1000).map(|i| format!("c{i} text")).collect();
    db.batch(&format!("CREATE TABLE wide (id int PRIMARY KEY, {})", cols.join(", ")));
    db.batch("ALTER PUBLICATION outboxd ADD TABLE wide");
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_publication_tables WHERE pubname = 'outboxd' AND tablename = 'wide'"),
        "1"
    );
    let full_row = |id: i32| {
        let vals: Vec<String> = (1..1000).map(|c| format!("'r{id}c{c}'")).collect();
        format!("INSERT INTO wide VALUES ({id}, {})", vals.join(", "))
    };
    let sparse_row = |id: i32| format!("INSERT INTO wide (id, c1, c500, c999) VALUES ({id}, 'a', NULL, E'z\\nz')");
    let outbox = |i: i32| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('hostile', 'agg-{i}', '{EVENT_TYPE}', '{{\"i\": {i}}}')"
        )
    };
    let mut next_wide = 0;
    let mut wide_id = || {
        next_wide += 1;
        next_wide
    };
    for i in 0..30 {
        match i % 4 {
            // wide, outbox, wide, outbox in one transaction
            0 => db.batch(&format!(
                "BEGIN; {}; {}; {}; {}; COMMIT",
                full_row(wide_id()),
                outbox(i),
                sparse_row(wide_id()),
                outbox(i + 1000)
            )),
            // a wide-only transaction between outbox ones
            1 => {
                db.batch(&full_row(wide_id()));
                db.batch(&outbox(i));
            }
            // outbox, then updates and deletes on wide
            2 => db.batch(&format!(
                "BEGIN; {}; UPDATE wide SET c500 = 'upd', c999 = NULL WHERE id % 3 = 0; \
                 DELETE FROM wide WHERE id % 5 = 0; COMMIT",
                outbox(i)
            )),
            // a transaction of several wide rows only
            _ => db.batch(&format!(
                "BEGIN; {}; {}; {}; COMMIT",
                full_row(wide_id()),
                sparse_row(wide_id()),
                full_row(wide_id())
            )),
        }
    }
    let rows = outbox_rows(&db, "outbox");
    assert_eq!(rows.len(), 8 * 2 + 7 + 8);
    assert!(pg.psql("SELECT count(*) FROM wide").parse::<i32>().unwrap() > 30);
    assert_delivered(&broker, TOPIC, &rows, Times::Once, Duration::from_secs(60), &d);

    // The daemon decoded its way past every wide change: the slot confirms the end of the WAL.
    let end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    let caught_up = wait_until(Duration::from_secs(30), || {
        pg.psql(&format!(
            "SELECT confirmed_flush_lsn >= '{end}'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        )) == "t"
    });
    assert!(caught_up, "confirmed_flush_lsn never reached {end}:\n{}", tail(&d.log(), 60));
    assert_running(&mut d);
}

/// jsonb refuses `\u0000`, but a `json` payload column keeps the text exactly as written, escape,
/// whitespace, duplicate keys and all; the daemon must pass those bytes through untouched.
#[test]
fn json_column_keeps_nul_escape_and_formatting_verbatim() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql(
        "CREATE TABLE public.outbox_json (LIKE public.outbox INCLUDING ALL); \
         ALTER TABLE public.outbox_json ALTER COLUMN payload TYPE json",
    );
    let (pg, broker, mut d) = start_daemon(pg, &["--table", "public.outbox_json"]);
    let db = Db::connect(&pg);
    let texts = [
        r#"{"a":"\u0000"}"#,
        "{ \"spaced\" :  \"\\u0000\\u0000\" ,\n  \"dup\": 1, \"dup\": 2 }\n",
        r#""\u0000""#,
        "\t[\"\\ud83e\\udd80\", \"🦀\",\r\n 1.500]  ",
    ];
    for (i, t) in texts.iter().enumerate() {
        db.insert("outbox_json", &format!("json-{i}"), t, "{}");
    }
    let rows = outbox_rows(&db, "outbox_json");
    assert_eq!(rows.len(), texts.len());
    for t in texts {
        assert!(rows.values().any(|r| r.payload == t), "json did not keep {t:?}");
    }
    assert_delivered(&broker, TOPIC, &rows, Times::Once, Duration::from_secs(60), &d);
    assert_running(&mut d);
}

/// Row data never stops the daemon: timestamps PostgreSQL stores but a record cannot carry (a
/// `timestamptz` in 200000 AD; a text `created_at` of `99999999999999999-01-01`, which overflowed
/// 64-bit day arithmetic and panicked before) are dead-lettered as `bad_value` under the default
/// `--on-bad-event dlq`, and the events around them arrive with their timestamps.
#[test]
fn out_of_range_timestamps_are_dead_lettered_and_later_events_follow() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql(
        "CREATE TABLE public.outbox_text_ts (LIKE public.outbox INCLUDING ALL); \
         ALTER TABLE public.outbox_text_ts ALTER COLUMN created_at TYPE text",
    );
    let (pg, broker, mut d) = start_daemon(pg, &["--table", "public.outbox", "--table", "public.outbox_text_ts"]);
    let db = Db::connect(&pg);
    let with_created_at = |table: &str, ty: &str, created_at: &str| -> String {
        let sql = format!(
            "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload, created_at) \
             VALUES ('hostile', 'bad', $1, '{{}}', $2::text::{ty}) RETURNING event_id::text"
        );
        db.query(&sql, &[&EVENT_TYPE, &created_at])[0].get(0)
    };
    db.insert("outbox", "before", r#"{"n": 0}"#, "{}");
    let bad_tz = with_created_at("outbox", "timestamptz", "200000-01-01 00:00:00+00");
    db.insert("outbox_text_ts", "text-before", r#"{"n": 1}"#, "{}");
    let bad_text = with_created_at("outbox_text_ts", "text", "99999999999999999-01-01 00:00:00+00");
    db.insert("outbox", "after", r#"{"n": 2}"#, "{}");
    db.insert("outbox_text_ts", "text-after", r#"{"n": 3}"#, "{}");

    let mut rows = outbox_rows(&db, "outbox");
    rows.extend(outbox_rows(&db, "outbox_text_ts"));
    assert!(rows.remove(&bad_tz).is_some() && rows.remove(&bad_text).is_some());
    let got = check_delivered(&broker, TOPIC, &rows, Times::Once, Duration::from_secs(60), &d, false);
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    for c in &got {
        let ts = c.timestamp_ms.expect("record timestamp");
        assert!((now_ms - ts).abs() < 600_000, "created_at became the record timestamp, got {ts}");
    }

    let dead = broker.consume_all(DLQ, 1, 2, Duration::from_secs(30));
    assert_eq!(dead.len(), 2, "two dead letters expected:\n{}", tail(&d.log(), 40));
    let mut ids: Vec<String> = dead.iter().filter_map(|c| c.header_str("id")).collect();
    ids.sort();
    let mut want = vec![bad_tz, bad_text];
    want.sort();
    assert_eq!(ids, want);
    for c in &dead {
        assert_eq!(c.header_str("outboxd.error").as_deref(), Some("bad_value"));
        let msg = c.header_str("outboxd.error.message").unwrap_or_default();
        assert!(msg.contains("cannot read timestamp"), "{msg}");
        assert_eq!(c.key.as_deref(), Some(&b"bad"[..]));
        assert_eq!(c.payload.as_deref(), Some(&b"{}"[..]), "payload salvaged");
    }
    assert_running(&mut d);
}

/// The walsender is terminated twice while a writer commits 5000 events in 1000 small
/// transactions. The server sends ErrorResponse (FATAL 57P01) on the replication connection and
/// closes it; the daemon must log the reconnect, resume from the confirmed LSN, and deliver every
/// event at least once.
#[test]
fn walsender_terminated_mid_stream_reconnects_and_loses_nothing() {
    const TXNS: usize = 1000;
    const PER_TXN: usize = 5;
    let (pg, broker, mut d) = start(&[]);
    let walsenders = || -> Vec<String> {
        let out = pg.psql("SELECT pid FROM pg_stat_replication");
        out.lines().map(str::to_owned).collect()
    };
    let outbox_count = || pg.psql("SELECT count(*) FROM outbox").parse::<usize>().unwrap();

    let mut killed: Vec<String> = Vec::new();
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            pg.psql(&format!(
                "DO $$ BEGIN FOR t IN 0..{last} LOOP \
                   INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                   SELECT 'flow', 'agg-' || (t % 7), '{EVENT_TYPE}', jsonb_build_object('t', t, 'i', i) \
                   FROM generate_series(1, {PER_TXN}) i; \
                   COMMIT; PERFORM pg_sleep(0.01); \
                 END LOOP; END $$",
                last = TXNS - 1
            ))
        });
        for at in [TXNS * PER_TXN / 5, TXNS * PER_TXN * 3 / 5] {
            assert!(wait_until(Duration::from_secs(60), || outbox_count() >= at), "writer stalled below {at} rows");
            // The walsender of the current session (not one already killed).
            let mut pid = None;
            let found = wait_until(Duration::from_secs(30), || {
                pid = walsenders().into_iter().find(|p| !killed.contains(p));
                pid.is_some()
            });
            assert!(found, "no new walsender after {killed:?}:\n{}", tail(&d.log(), 40));
            let pid = pid.unwrap();
            assert_eq!(pg.psql(&format!("SELECT pg_terminate_backend({pid})")), "t");
            killed.push(pid);
        }
        writer.join().expect("writer thread");
    });
    assert_eq!(outbox_count(), TXNS * PER_TXN);
    assert_running(&mut d);

    let rows = outbox_rows(&Db::connect(&pg), "outbox");
    let got = assert_delivered(&broker, TOPIC, &rows, Times::AtLeastOnce, Duration::from_secs(120), &d);
    assert_running(&mut d);
    let log = d.log();
    let reconnects: Vec<&str> = log.lines().filter(|l| l.contains("reconnecting from the confirmed LSN")).collect();
    assert!(reconnects.len() >= 2, "expected a reconnect per kill:\n{}", tail(&log, 60));
    assert!(
        reconnects.iter().any(|l| l.contains("57P01")),
        "the server's ErrorResponse (57P01) should be what ended a session:\n{}",
        reconnects.join("\n")
    );
    let sessions = log.lines().filter(|l| l.contains(" streaming ")).count();
    assert!(sessions >= 3, "expected 3 streaming sessions, saw {sessions}:\n{}", tail(&log, 60));
    eprintln!(
        "walsender test: killed {killed:?}; {} records for {} rows ({} duplicates); {} reconnect line(s)",
        got.len(),
        rows.len(),
        got.len() - rows.len(),
        reconnects.len()
    );
}
