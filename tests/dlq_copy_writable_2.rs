//! Dead-letter copies, issue 35 review items 3, 5, 6 and 9, against the real services: NATS
//! JetStream (127.0.0.1:4222) and RabbitMQ (127.0.0.1:5672, the DLQ a stream queue), with
//! `outboxd run` on a private PostgreSQL.
//!
//! * Two bad rows sharing an event id (empty, or the same text) and a payload each keep their
//!   copy in JetStream: a whole copy's `Nats-Msg-Id` is hashed from the row's position too, so the
//!   duplicate window no longer drops the second (before: one copy per pair).
//! * A row's own header named like an escaped one (`outboxd.escaped-header.7`,
//!   `outboxd.escaped-key`) reads back as itself: `dlq list` lists the copy with that header
//!   instead of reporting it unreadable.
//! * A `CC` or `BCC` header, which RabbitMQ takes only as an array (any other type closes the
//!   channel, so the publisher retried for good), is refused as a bad event and escaped in the copy:
//!   the rows after it are delivered, outboxd stays up, `dlq list` shows the original header.
//! * A header of several hundred KB with a line break, escaped past NATS's `max_payload`, moves into
//!   the copy's body: the copy fits, the rows after it are delivered, outboxd stays up, and `dlq
//!   list` shows the original header byte for byte.
//!
//! Every test uses names of its own.

mod common;

use std::time::Duration;

use common::dlq_copies::*;
use common::*;
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties};

const WAIT: Duration = Duration::from_secs(30);
const RABBIT_URL: &str = "amqp://127.0.0.1:5672/%2f";

/// The event id column as text without its primary key, so rows can share an id.
fn shared_text_ids(pg: &PgCluster) {
    pg.psql(
        "ALTER TABLE outbox DROP CONSTRAINT outbox_pkey, ALTER COLUMN event_id DROP DEFAULT, \
         ALTER COLUMN event_id TYPE text USING event_id::text, \
         ALTER COLUMN event_id SET DEFAULT gen_random_uuid()::text",
    );
}

/// `list --json`'s records.
fn listed(out: &str) -> Vec<serde_json::Value> {
    json_line(out)["records"].as_array().unwrap_or_else(|| panic!("no records in:\n{out}")).clone()
}

/// A listed record's header, as `list --json` shows it.
fn listed_header<'a>(r: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    r["headers"].as_array()?.iter().find(|h| h[0] == name).and_then(|h| h[1].as_str())
}

/// The headers of the messages stored on `subject`, as text.
async fn headers_on(s: &NatsStream, subject: &str) -> Vec<Vec<(String, String)>> {
    let as_text = |(n, v): (String, Vec<u8>)| (n, String::from_utf8_lossy(&v).into_owned());
    s.on(subject).await.into_iter().map(|m| m.headers.into_iter().map(as_text).collect()).collect()
}

/// Item 5: two pairs of bad rows (a topic that is no subject), each pair sharing its event id
/// (empty; the same text) and its payload: four copies are stored, each with its own
/// `Nats-Msg-Id`, and `dlq list` lists four. Before, JetStream took the second of each pair as a
/// duplicate of the first, and only two were kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_copies_of_rows_sharing_an_id_and_a_payload_are_all_kept() {
    let s = NatsStream::create().await;
    let p = s.prefix.clone();
    let dlq = format!("{p}.dlq");
    let pg = PgCluster::start();
    pg.apply_all_sql();
    shared_text_ids(&pg);
    let mut d = Outboxd::spawn_streaming(&s.run_args(&pg));
    let shared = format!("{p}-shared");
    for id in ["", "", &shared, &shared] {
        pg.psql(&format!(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('{id}', 'bad topic', 'k', 'e.v1', '{{\"n\": 1}}')"
        ));
    }
    let after = pg.insert_event("notes", "k2", Some("e.v1"), "{\"n\": 2}", None);
    assert!(s.wait_on(&format!("{p}.notes"), 1).await, "the row after them is delivered\n{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(WAIT), "{}", d.log());
    assert!(d.is_running(), "outboxd stays up\n{}", d.log());
    d.stop_cleanly();
    let log = d.log();
    let copies = headers_on(&s, &dlq).await;
    let ids: std::collections::HashSet<&str> =
        copies.iter().flat_map(|h| h.iter().filter(|(n, _)| n == "Nats-Msg-Id").map(|(_, v)| v.as_str())).collect();
    assert_eq!((copies.len(), ids.len()), (4, 4), "a copy each, each with its own Nats-Msg-Id: {copies:?}\n{log}");
    assert!(!log.contains("as a duplicate"), "no copy was taken for a duplicate\n{log}");
    let _ = after;

    let sink = ["--sink", "nats", "--nats-url", NATS_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let rows = listed(&out);
    assert_eq!(rows.len(), 4, "{out}");
    assert_eq!(rows.iter().filter(|r| r["event_id"] == shared.as_str()).count(), 2, "{out}");
    s.delete().await;
}

/// Item 6: a row's own headers named `outboxd.escaped-header.7` and `outboxd.escaped-key`, beside
/// one with a line break, on a row NATS refuses: the copy is written with the lookalikes escaped,
/// and `dlq list` shows the original headers, and nothing unreadable. Before, the tool found the
/// restored lookalike, took it for an escape left undecoded and reported the copy unreadable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_row_header_named_like_an_escaped_one_reads_back_as_itself() {
    let s = NatsStream::create().await;
    let p = s.prefix.clone();
    let dlq = format!("{p}.dlq");
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = Outboxd::spawn_streaming(&s.run_args(&pg));
    let headers = r#"{"outboxd.escaped-header.7": "x", "outboxd.escaped-key": "k%0A", "note": "a\nb"}"#;
    let bad = pg.insert_event("notes", "k1", Some("e.v1"), "{\"n\": 1}", Some(headers));
    pg.insert_event("notes", "k2", Some("e.v1"), "{\"n\": 2}", None);
    assert!(s.wait_on(&format!("{p}.notes"), 1).await, "{}", d.log());
    assert!(s.wait_on(&dlq, 1).await, "{}", d.log());
    assert!(d.is_running(), "{}", d.log());
    d.stop_cleanly();

    let sink = ["--sink", "nats", "--nats-url", NATS_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(json_line(&out)["unreadable"].as_array().map(Vec::len), Some(0), "{out}");
    let rows = listed(&out);
    assert_eq!(rows.len(), 1, "{out}");
    let r = &rows[0];
    assert_eq!(r["event_id"], bad.as_str(), "{out}");
    assert_eq!(r["key"], "k1", "the real key, not the lookalike's value: {out}");
    assert_eq!(listed_header(r, "outboxd.escaped-header.7"), Some("x"), "{out}");
    assert_eq!(listed_header(r, "outboxd.escaped-key"), Some("k%0A"), "{out}");
    assert_eq!(listed_header(r, "note"), Some("a\nb"), "{out}");
    s.delete().await;
}

async fn rabbit_count(chan: &Channel, queue: &str) -> u32 {
    let opts = QueueDeclareOptions { passive: true, ..Default::default() };
    chan.queue_declare(queue, opts, FieldTable::default()).await.map(|q| q.message_count()).unwrap_or(0)
}

/// Item 9: rows with a `CC` and a `BCC` header (RabbitMQ's sender-selected distribution, an array
/// or the channel is closed) are dead-lettered, their copies carrying the header escaped; the rows
/// around them and one with a lower-case `cc` (an ordinary header to RabbitMQ) are delivered,
/// outboxd stays up and the slot moves on. `dlq list` shows the original headers. Before, the
/// broker closed the channel on every publish of the row, and outboxd retried it for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_cc_and_bcc_headers_are_dead_lettered_and_escaped_in_the_copy() {
    let conn = Connection::connect(RABBIT_URL, ConnectionProperties::default()).await.expect("RabbitMQ on 5672");
    let chan = conn.create_channel().await.unwrap();
    let p = unique_name("obxcopy2");
    let dlq = format!("{p}.dlq");
    let notes = format!("{p}.notes");
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    let mut stream_args = FieldTable::default();
    stream_args.insert("x-queue-type".into(), AMQPValue::LongString(LongString::from("stream")));
    chan.queue_declare(&dlq, durable, stream_args).await.expect("stream queue");
    chan.queue_declare(&notes, durable, FieldTable::default()).await.expect("queue");

    let pg = PgCluster::start();
    pg.apply_all_sql();
    let replacement = format!("{p}.${{routedByValue}}");
    let run = [
        "--sink",
        "rabbitmq",
        "--rabbitmq-url",
        RABBIT_URL,
        "--route-by-field",
        "aggregate_type",
        "--route-topic-replacement",
        &replacement,
        "--dlq-topic",
        &dlq,
    ];
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &run));
    let first = pg.insert_event("notes", "k1", Some("e.v1"), "{\"n\": 1}", None);
    let cc = pg.insert_event("notes", "k2", Some("e.v1"), "{\"n\": 2}", Some(r#"{"CC": "x"}"#));
    let bcc = pg.insert_event("notes", "k3", Some("e.v1"), "{\"n\": 3}", Some(r#"{"BCC": "y", "t": "1"}"#));
    let lower = pg.insert_event("notes", "k4", Some("e.v1"), "{\"n\": 4}", Some(r#"{"cc": "z"}"#));
    let around = wait_until_async(WAIT, || async { rabbit_count(&chan, &notes).await >= 2 }).await;
    assert!(around, "the rows around them are delivered\n{}", d.log());
    let both = wait_until_async(WAIT, || async { rabbit_count(&chan, &dlq).await >= 2 }).await;
    assert!(both, "two dead-letter copies\n{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(WAIT), "the slot moves past them\n{}", d.log());
    assert!(d.is_running(), "outboxd stays up\n{}", d.log());
    d.stop_cleanly();
    for want in [&first, &lower] {
        let m = chan.basic_get(&notes, BasicGetOptions { no_ack: true }).await.unwrap().expect("a message");
        assert_eq!(m.properties.message_id().as_ref().map(|s| s.as_str()), Some(want.as_str()));
    }

    let sink = ["--sink", "rabbitmq", "--rabbitmq-url", RABBIT_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let rows = listed(&out);
    assert_eq!(rows.len(), 2, "{out}");
    let row = |id: &str| rows.iter().find(|r| r["event_id"] == id).unwrap_or_else(|| panic!("no {id} in {out}"));
    assert_eq!(row(&cc)["reason"], "invalid_header", "{out}");
    assert_eq!(listed_header(row(&cc), "CC"), Some("x"), "{out}");
    assert_eq!(listed_header(row(&bcc), "BCC"), Some("y"), "{out}");
    assert_eq!(listed_header(row(&bcc), "t"), Some("1"), "{out}");
    for q in [&dlq, &notes] {
        let _ = chan.queue_delete(q, QueueDeleteOptions::default()).await;
    }
}

/// Item 3: a header of 400 KB of punctuation with a line break (refused by NATS as
/// `invalid_header`; escaped, 1.2 MB, more than the server's 1 MiB `max_payload`): the copy is
/// written with the header moved into its body (`outboxd.moved`), every record under
/// `max_payload`; the row after it is delivered, outboxd stays up and the slot moves on. `dlq
/// list` shows the original header byte for byte and the payload's own size. Before, the copy was
/// refused as `too_large` and outboxd stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_header_too_large_once_escaped_moves_into_the_copys_body() {
    let s = NatsStream::create().await;
    let p = s.prefix.clone();
    let dlq = format!("{p}.dlq");
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = Outboxd::spawn_streaming(&s.run_args(&pg));
    let n = 400_000;
    let bad = pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('notes', 'k1', 'e.v1', '{{\"n\": 1}}', jsonb_build_object('note', repeat('-', {n}) || E'\\n', 'trace', 't-1')) \
         RETURNING event_id"
    ));
    let after = pg.insert_event("notes", "k2", Some("e.v1"), "{\"n\": 2}", None);
    assert!(s.wait_on(&format!("{p}.notes"), 1).await, "the row after it is delivered\n{}", d.log());
    assert!(s.wait_on(&dlq, 1).await, "the copy is written\n{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(WAIT), "the slot moves past it\n{}", d.log());
    assert!(d.is_running(), "outboxd stays up\n{}", d.log());
    d.stop_cleanly();
    let delivered = headers_on(&s, &format!("{p}.notes")).await;
    assert!(delivered[0].iter().any(|(n, v)| n == "id" && *v == after), "{delivered:?}");
    let copies = headers_on(&s, &dlq).await;
    assert!(!copies.is_empty());
    for c in &copies {
        assert!(
            c.iter().any(|(n, _)| n == "outboxd.moved"),
            "the header moved: {:?}",
            c.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
        assert!(c.iter().all(|(_, v)| v.len() < 4096), "no large header left");
    }

    let sink = ["--sink", "nats", "--nats-url", NATS_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{}", &out[..out.len().min(4000)]);
    let j = json_line(&out);
    assert_eq!(j["unreadable"].as_array().map(Vec::len), Some(0), "{}", &out[..out.len().min(4000)]);
    assert_eq!(j["incomplete"].as_array().map(Vec::len), Some(0), "{}", &out[..out.len().min(4000)]);
    let rows = listed(&out);
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r["event_id"], bad.as_str());
    assert_eq!(r["reason"], "invalid_header");
    assert_eq!(r["key"], "k1");
    assert_eq!(r["payload_bytes"], "{\"n\": 1}".len(), "the payload alone");
    let note = listed_header(r, "note").expect("the original header");
    assert!(note.len() == n + 1 && note.ends_with('\n') && note.bytes().take(n).all(|b| b == b'-'), "byte for byte");
    assert_eq!(listed_header(r, "trace"), Some("t-1"));
    assert!(listed_header(r, "outboxd.moved").is_none());
    s.delete().await;
}
