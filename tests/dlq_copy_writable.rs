//! A dead-letter copy is always writable (issue 35, items 2 and 6), against the real services:
//! NATS JetStream (127.0.0.1:4222), RabbitMQ (127.0.0.1:5672, the DLQ a stream queue) and an HTTP
//! receiver (`common::webhook`), with `outboxd run` on a private PostgreSQL.
//!
//! Per sink, a row whose id, key, headers or topic the sink refuses is dead-lettered: the copy
//! carries what the sink cannot take escaped (`outboxd.escaped-header.<n>`, `outboxd.escaped-key`,
//! a copy id in the sink's own id field), the rows after it are delivered, the process stays up
//! and the slot moves on. Before the fix the copy was refused for the same bytes and outboxd
//! stopped. `outboxd dlq list|replay` read the original back: the event id, key, headers and
//! payload byte for byte (a replay that the sink can take succeeds; one it cannot, fails naming
//! why). And a chunked NATS copy whose chunks are identical keeps every chunk (each has its own
//! `Nats-Msg-Id`). Every test uses names of its own.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::dlq_copies::*;
use common::*;
use lapin::options::{BasicGetOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties};
use outboxd::sink::escape::{is_escaped, unescape_header, unescape_key, H_ESCAPED_KEY};

const WAIT: Duration = Duration::from_secs(30);

/// The original headers behind a copy's escaped ones, by name.
fn unescaped(headers: &[(String, Vec<u8>)]) -> HashMap<String, Vec<u8>> {
    let mut out = HashMap::new();
    for (name, value) in headers {
        if name == H_ESCAPED_KEY {
            out.insert("(key)".to_owned(), unescape_key(value));
        } else if is_escaped(name) {
            let (n, v) = unescape_header(value).unwrap_or_else(|| panic!("{name}: {value:?} does not decode"));
            out.insert(n, v);
        }
    }
    out
}

/// The event id column as text, so a test can give ids a uuid cannot hold.
fn text_ids(pg: &PgCluster) {
    pg.psql(
        "ALTER TABLE outbox ALTER COLUMN event_id DROP DEFAULT, \
         ALTER COLUMN event_id TYPE text USING event_id::text, \
         ALTER COLUMN event_id SET DEFAULT gen_random_uuid()::text",
    );
}

fn records_by_id(out: &str) -> HashMap<String, serde_json::Value> {
    let j = json_line(out);
    j["records"]
        .as_array()
        .unwrap_or_else(|| panic!("no records in:\n{out}"))
        .iter()
        .map(|r| (r["event_id"].as_str().unwrap_or_default().to_owned(), r.clone()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// NATS
// ---------------------------------------------------------------------------------------------

/// A header value with a line break (refused by NATS) and a topic with one (not a subject, and
/// carried in the copy's `outboxd.original.topic`): both rows are dead-lettered, the rows around
/// them are delivered, outboxd stays up. `dlq list` shows the original ids and topic; replaying
/// the second to a valid subject sends its original key, headers and payload; replaying the first
/// fails, naming the header NATS cannot carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_copies_escape_what_nats_refuses_and_replay_gets_the_original_back() {
    let s = NatsStream::create().await;
    let p = s.prefix.clone();
    let dlq = format!("{p}.dlq");
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = Outboxd::spawn_streaming(&s.run_args(&pg));
    let first = pg.insert_event("notes", "k1", Some("e.v1"), "{\"n\": 1}", None);
    let newline =
        pg.insert_event("notes", "k2", Some("e.v1"), "{\"n\": 2}", Some(r#"{"note": "line1\nline2", "trace": "t-2"}"#));
    let topic_row = pg.insert_event("bad\ntopic", "k3", Some("e.v1"), "{\"n\": 3}", None);
    let last = pg.insert_event("notes", "k4", Some("e.v1"), "{\"n\": 4}", None);

    assert!(s.wait_on(&dlq, 2).await, "two dead-letter copies\n{}", d.log());
    assert!(s.wait_on(&format!("{p}.notes"), 2).await, "the rows around them are delivered\n{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(WAIT), "the slot moves past the bad rows\n{}", d.log());
    assert!(d.is_running(), "outboxd stays up\n{}", d.log());
    d.stop_cleanly();

    let delivered: Vec<Vec<u8>> =
        s.on(&format!("{p}.notes")).await.iter().map(|m| m.header("id").unwrap().to_vec()).collect();
    assert_eq!(delivered, [first.as_bytes(), last.as_bytes()]);
    let copies = s.on(&dlq).await;
    let copy = |id: &str| {
        copies
            .iter()
            .find(|m| m.header("id") == Some(id.as_bytes()))
            .unwrap_or_else(|| panic!("no copy of {id} with its id in the `id` header"))
    };
    let c = copy(&newline);
    assert_eq!(unescaped(&c.headers)["note"], b"line1\nline2", "the header, escaped");
    assert_eq!(c.header("trace"), Some(&b"t-2"[..]), "what NATS takes stays as it is");
    assert_eq!(c.header("outboxd.error"), Some(&b"invalid_header"[..]));
    assert_eq!(c.payload, b"{\"n\": 2}");
    let c = copy(&topic_row);
    // The route value's line break leaves the topic as it is, which the router refuses.
    assert_eq!(unescaped(&c.headers)["outboxd.original.topic"], b"bad\ntopic");
    assert_eq!(c.header("outboxd.error"), Some(&b"invalid_topic"[..]));

    let sink = ["--sink", "nats", "--nats-url", NATS_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let rows = records_by_id(&out);
    assert_eq!(rows.len(), 2, "{out}");
    assert_eq!(rows[&newline]["reason"], "invalid_header", "{out}");
    assert_eq!(rows[&topic_row]["original_topic"], "bad\ntopic", "{out}");
    assert_eq!(rows[&topic_row]["key"], "k3", "{out}");

    let state = tempfile::tempdir().unwrap();
    let st = state.path().to_str().unwrap();
    let fixed = format!("{p}.fixed");
    let (code, out) =
        dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st, "--event-id", &topic_row, "--to-topic", &fixed]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 1,"), "{out}");
    let sent = s.on(&fixed).await;
    assert_eq!(sent.len(), 1, "exactly once");
    let mut names: Vec<&str> = sent[0].headers.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    assert_eq!(names, ["Nats-Msg-Id", "id", "key"], "the original headers, nothing of the copy's");
    assert_eq!(sent[0].header("id"), Some(topic_row.as_bytes()));
    assert_eq!(sent[0].header("key"), Some(&b"k3"[..]));
    assert_eq!(sent[0].payload, b"{\"n\": 3}");

    // The other event's original header still cannot be a NATS header: the replay says so and
    // records nothing.
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", st, "--event-id", &newline]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("failed 1") && out.contains("header note") && out.contains("CR/LF"), "{out}");
    assert_eq!(s.on(&format!("{p}.notes")).await.len(), 2, "nothing sent in its place");
    s.delete().await;
}

/// Item 6: a copy chunked into identical chunks (one byte repeated) keeps every chunk in
/// JetStream (before, identical chunks shared their `Nats-Msg-Id` and JetStream dropped all but
/// one as duplicates): `dlq list` shows it complete, and its chunks join into the original payload
/// byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_chunks_of_identical_bytes_all_reach_the_dlq() {
    let s = NatsStream::create().await;
    let p = s.prefix.clone();
    let dlq = format!("{p}.dlq");
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = Outboxd::spawn_streaming(&s.run_args(&pg));
    // Over three times the server's max_payload: at least two middle chunks of 'a' alone.
    let n = s.max_payload * 7 / 2;
    let big = pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('big', 'kb', 'e.v1', jsonb_build_object('blob', repeat('a', {n}))) RETURNING event_id"
    ));
    let after = pg.insert_event("small", "ks", Some("e.v1"), "{\"n\": 1}", None);
    assert!(s.wait_on(&format!("{p}.small"), 1).await, "the row after is delivered\n{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(WAIT), "{}", d.log());
    assert!(d.is_running(), "{}", d.log());
    d.stop_cleanly();
    assert_eq!(s.on(&format!("{p}.small")).await[0].header("id"), Some(after.as_bytes()));

    let want = format!("{{\"blob\": \"{}\"}}", "a".repeat(n)).into_bytes();
    let mut chunks = s.on(&dlq).await;
    let index = |m: &NatsMsg| -> u32 {
        std::str::from_utf8(m.header("outboxd.chunk.index").unwrap()).unwrap().parse().unwrap()
    };
    chunks.sort_by_key(index);
    let count: usize = std::str::from_utf8(chunks[0].header("outboxd.chunk.count").unwrap()).unwrap().parse().unwrap();
    assert!(count >= 4, "{count} chunks");
    assert_eq!(
        chunks.iter().map(index).collect::<Vec<_>>(),
        (0..count as u32).collect::<Vec<_>>(),
        "every chunk stored"
    );
    assert_eq!(chunks[1].payload, chunks[2].payload, "identical chunks, stored apart");
    let joined: Vec<u8> = chunks.iter().flat_map(|m| m.payload.iter().copied()).collect();
    assert!(joined == want, "the chunks join into the payload byte for byte");
    let ids: std::collections::HashSet<&[u8]> = chunks.iter().map(|m| m.header("Nats-Msg-Id").unwrap()).collect();
    assert_eq!(ids.len(), count, "a Nats-Msg-Id per chunk");

    let sink = ["--sink", "nats", "--nats-url", NATS_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let j = json_line(&out);
    assert_eq!(j["incomplete"].as_array().map(Vec::len), Some(0), "{out}");
    let rows = records_by_id(&out);
    assert_eq!(rows[&big]["payload_bytes"], want.len(), "{out}");
    assert_eq!(rows[&big]["chunks"], count, "{out}");
    let state = tempfile::tempdir().unwrap();
    let fixed = format!("{p}.fixed");
    let dry = ["--state-dir", state.path().to_str().unwrap(), "--to-topic", &fixed, "--dry-run"];
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &dry);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("would replay 1,") && !out.contains("incomplete"), "joined and replayable:\n{out}");
    s.delete().await;
}

// ---------------------------------------------------------------------------------------------
// RabbitMQ
// ---------------------------------------------------------------------------------------------

const RABBIT_URL: &str = "amqp://127.0.0.1:5672/%2f";

async fn rabbit_count(chan: &Channel, queue: &str) -> u32 {
    let opts = QueueDeclareOptions { passive: true, ..Default::default() };
    chan.queue_declare(queue, opts, FieldTable::default()).await.map(|q| q.message_count()).unwrap_or(0)
}

/// A header name and an event id over AMQP's 255 bytes: both rows are dead-lettered (the name
/// escaped, the id whole in the `id` header and a short copy id as message-id), the rows around
/// them delivered, outboxd up. `dlq list` shows the original ids; replay fails for both, saying
/// what AMQP cannot carry, and sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_copies_escape_what_amqp_refuses_and_list_reads_the_original() {
    let conn = Connection::connect(RABBIT_URL, ConnectionProperties::default()).await.expect("RabbitMQ on 5672");
    let chan = conn.create_channel().await.unwrap();
    chan.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let p = unique_name("obxcopy");
    let dlq = format!("{p}.dlq");
    let notes = format!("{p}.notes");
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    let mut stream_args = FieldTable::default();
    stream_args.insert("x-queue-type".into(), AMQPValue::LongString(LongString::from("stream")));
    chan.queue_declare(&dlq, durable, stream_args).await.expect("stream queue");
    chan.queue_declare(&notes, durable, FieldTable::default()).await.expect("queue");

    let pg = PgCluster::start();
    pg.apply_all_sql();
    text_ids(&pg);
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
    let long_name = "h".repeat(300);
    let named = pg.insert_event("notes", "k2", Some("e.v1"), "{\"n\": 2}", Some(&format!(r#"{{"{long_name}": "v"}}"#)));
    let long_id = format!("{p}-{}", "i".repeat(300));
    pg.psql(&format!(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('{long_id}', 'notes', 'k3', 'e.v1', '{{\"n\": 3}}')"
    ));
    let last = pg.insert_event("notes", "k4", Some("e.v1"), "{\"n\": 4}", None);

    let both = wait_until_async(WAIT, || async { rabbit_count(&chan, &dlq).await >= 2 }).await;
    assert!(both, "two dead-letter copies\n{}", d.log());
    let around = wait_until_async(WAIT, || async { rabbit_count(&chan, &notes).await >= 2 }).await;
    assert!(around, "the rows around them are delivered\n{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(WAIT), "{}", d.log());
    assert!(d.is_running(), "outboxd stays up\n{}", d.log());
    d.stop_cleanly();
    for want in [&first, &last] {
        let m = chan.basic_get(&notes, BasicGetOptions { no_ack: true }).await.unwrap().expect("a message");
        assert_eq!(m.properties.message_id().as_ref().map(|s| s.as_str()), Some(want.as_str()));
    }

    let sink = ["--sink", "rabbitmq", "--rabbitmq-url", RABBIT_URL];
    let (code, out) = dlq_cmd(&sink, &dlq, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let rows = records_by_id(&out);
    assert_eq!(rows.len(), 2, "{out}");
    assert_eq!(rows[&named]["reason"], "invalid_header", "{out}");
    assert_eq!(rows[&long_id]["reason"], "invalid_id", "{out}");
    assert_eq!(rows[&long_id]["key"], "k3", "{out}");

    let state = tempfile::tempdir().unwrap();
    let (code, out) = dlq_cmd(&sink, &dlq, "replay", &["--state-dir", state.path().to_str().unwrap()]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("failed 2") && out.contains("header name of 300 bytes"), "{out}");
    assert!(out.contains("event id over AMQP's 255 bytes"), "{out}");
    assert_eq!(rabbit_count(&chan, &notes).await, 0, "nothing sent");
    for q in [&dlq, &notes] {
        let _ = chan.queue_delete(q, QueueDeleteOptions::default()).await;
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------

/// An event id with a control character, a key with a line break and header values HTTP cannot
/// carry as they are (a line break, leading whitespace): the copy reaches the receiver's
/// `--dlq-topic` path with all of them escaped, and they decode to the original bytes; `ce-id` is
/// the copy id; the rows around it are delivered and outboxd stays up.
#[test]
fn http_copies_escape_what_http_refuses_and_the_receiver_decodes_the_original() {
    let hook = webhook::Webhook::start(None);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    text_ids(&pg);
    let p = unique_name("obxcopy");
    let dlq = format!("{p}.dlq");
    let url = hook.url("/in/${topic}");
    let replacement = format!("{p}.${{routedByValue}}");
    let run = [
        "--sink",
        "http",
        "--http-url",
        &url,
        "--route-by-field",
        "aggregate_type",
        "--route-topic-replacement",
        &replacement,
        "--dlq-topic",
        &dlq,
    ];
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &run));
    let first = pg.insert_event("notes", "k1", Some("e.v1"), "{\"n\": 1}", None);
    let bad_id = format!("{p}\u{1}ctl");
    pg.psql(&format!(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('{bad_id}', 'notes', E'k\\n2', 'e.v1', '{{\"n\": 2}}', '{{\"x\": \"line1\\nline2\", \"y\": \" pad\", \"trace\": \"t-2\"}}')"
    ));
    let last = pg.insert_event("notes", "k3", Some("e.v1"), "{\"n\": 3}", None);

    assert!(hook.wait_delivered(3, WAIT), "two events and the copy\n{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(WAIT), "{}", d.log());
    assert!(d.is_running(), "outboxd stays up\n{}", d.log());
    d.stop_cleanly();

    let delivered = hook.delivered();
    let mut ids: Vec<String> =
        delivered.iter().filter(|r| r.path.ends_with(".notes")).flat_map(|r| r.event_ids()).collect();
    ids.sort();
    let mut want = vec![first.clone(), last.clone()];
    want.sort();
    assert_eq!(ids, want, "the rows around the bad one");
    let copies: Vec<_> = delivered.iter().filter(|r| r.path.ends_with(&dlq)).collect();
    assert_eq!(copies.len(), 1, "one copy");
    let c = copies[0];
    let orig = unescaped(&c.headers);
    assert_eq!(orig["id"], bad_id.as_bytes());
    assert_eq!(orig["(key)"], b"k\n2");
    assert_eq!(orig["x"], b"line1\nline2");
    assert_eq!(orig["y"], b" pad");
    assert_eq!(c.header("trace"), Some(&b"t-2"[..]), "what HTTP takes stays as it is");
    assert_eq!(c.header("key"), None, "the key moved to outboxd.escaped-key");
    let ce_id = c.header_str("ce-id").unwrap();
    assert!(ce_id.starts_with("sha256.") && ce_id.contains("/dlq/"), "{ce_id}");
    assert_eq!(c.header_str("idempotency-key"), Some(ce_id));
    assert_eq!(c.body, b"{\"n\": 2}");
}
