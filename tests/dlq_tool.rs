//! `outboxd dlq list` and `outboxd dlq replay` against a real Apache Kafka broker: counts by reason,
//! dry runs publish nothing, filtered replays republish exactly the matching records with their
//! original key, payload, timestamp and headers (no `outboxd.*`), and the state file makes a second
//! run republish nothing.

mod common;

use std::path::Path;
use std::time::Duration;

use common::secure_kafka;
use common::*;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

const RUN_TIMEOUT: Duration = Duration::from_secs(90);

struct Fake {
    partition: i32,
    key: &'static str,
    payload: Option<String>,
    timestamp_ms: i64,
    headers: Vec<(&'static str, String)>,
}

/// Headers as the pipeline writes them: the event's own, then the `outboxd.*` ones.
fn dlq_headers(
    id: &str,
    user: &[(&'static str, &str)],
    reason: &str,
    original_topic: Option<&str>,
    extra: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    let mut h = vec![("id", id.to_owned())];
    h.extend(user.iter().map(|(k, v)| (*k, v.to_string())));
    h.push(("outboxd.error", reason.into()));
    h.push(("outboxd.error.message", format!("{reason} for event {id}")));
    if let Some(t) = original_topic {
        h.push(("outboxd.original.topic", t.into()));
    }
    h.push(("outboxd.source.lsn", "0/16B3748".into()));
    h.push(("outboxd.source.table", "public.outbox".into()));
    h.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    h
}

fn produce(broker: &Broker, topic: &str, records: &[Fake]) {
    produce_with(broker.client_config(), topic, records)
}

/// Sends `records` one at a time (each in its own batch).
fn produce_with(mut config: ClientConfig, topic: &str, records: &[Fake]) {
    let producer: FutureProducer =
        config.set("enable.idempotence", "true").set("acks", "all").create().expect("producer");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        for f in records {
            let mut headers = OwnedHeaders::new();
            for (k, v) in &f.headers {
                headers = headers.insert(Header { key: k, value: Some(v.as_str()) });
            }
            let mut rec: FutureRecord<'_, str, str> =
                FutureRecord::to(topic).partition(f.partition).key(f.key).timestamp(f.timestamp_ms).headers(headers);
            if let Some(p) = &f.payload {
                rec = rec.payload(p.as_str());
            }
            producer.send(rec, Duration::from_secs(30)).await.map_err(|(e, _)| e).expect("produce fake DLQ record");
        }
    });
}

fn dlq(broker: &Broker, dlq_topic: &str, sub: &str, extra: &[&str]) -> (Option<i32>, String) {
    let bootstrap = broker.bootstrap();
    let mut a = vec!["dlq", sub, "--kafka-brokers", bootstrap.as_str(), "--dlq-topic", dlq_topic];
    a.extend_from_slice(extra);
    run_to_exit(&args(&a), RUN_TIMEOUT)
}

/// The `replayed N, ...` summary line of a replay run.
fn summary(out: &str) -> String {
    out.lines()
        .rfind(|l| l.starts_with("replayed ") && l.contains("already done"))
        .unwrap_or_else(|| panic!("no summary line in:\n{out}"))
        .to_owned()
}

fn json_line(out: &str) -> serde_json::Value {
    out.lines()
        .filter(|l| l.starts_with('{'))
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line in:\n{out}"))
}

/// Everything on `topic` (nothing when it does not exist).
fn read_topic(broker: &Broker, topic: &str) -> Vec<Consumed> {
    match broker.partition_count(topic) {
        None => Vec::new(),
        Some(n) => broker.consume_all(topic, n as i32, 0, Duration::from_secs(15)),
    }
}

fn ids(records: &[Consumed]) -> Vec<String> {
    let mut v: Vec<String> = records.iter().map(|r| r.header_str("id").unwrap_or_default()).collect();
    v.sort();
    v
}

fn assert_republished(r: &Consumed, key: &str, payload: &str, ts: i64, user: &[(&str, &str)]) {
    let id = r.header_str("id").expect("id header");
    assert_eq!(r.key_str().as_deref(), Some(key), "{id}: key");
    assert_eq!(r.payload.as_deref(), Some(payload.as_bytes()), "{id}: payload");
    assert_eq!(r.timestamp_ms, Some(ts), "{id}: timestamp");
    let mut want = vec![("id".to_owned(), id.clone().into_bytes())];
    want.extend(user.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())));
    assert_eq!(r.headers, want, "{id}: headers (no outboxd.* ones)");
}

fn state_file(dir: &Path, dlq_topic: &str) -> std::path::PathBuf {
    dir.join(format!("{dlq_topic}.offsets.json"))
}

#[test]
fn list_counts_and_replay_republishes_each_record_once() {
    let broker = Broker::start();
    let dlq_topic = unique_name("outboxd.dlq");
    let orders = unique_name("order.paid.v1.events");
    let users = unique_name("user.registered.v1.events"); // absent: replay creates it
    let elsewhere = unique_name("manual.replay");
    broker.create_topic(&dlq_topic, 2);
    broker.create_topic(&orders, 1);

    let records = [
        Fake {
            partition: 0,
            key: "order-1",
            payload: Some(r#"{"order":1,"amount":"12.50"}"#.into()),
            timestamp_ms: 1_700_000_000_001,
            headers: dlq_headers("e1", &[("trace", "t-1")], "invalid_json", Some(&orders), &[]),
        },
        Fake {
            partition: 1,
            key: "user-2",
            payload: Some(r#"{"user":2}"#.into()),
            timestamp_ms: 1_700_000_000_002,
            headers: dlq_headers("e2", &[], "invalid_json", Some(&users), &[]),
        },
        Fake {
            partition: 0,
            key: "order-3",
            payload: Some(r#"{"order":3}"#.into()),
            timestamp_ms: 1_700_000_000_003,
            headers: dlq_headers("e3", &[], "null_route", None, &[]),
        },
        Fake {
            partition: 1,
            key: "order-4",
            payload: None,
            timestamp_ms: 1_700_000_000_004,
            headers: dlq_headers("e4", &[], "too_large", Some(&orders), &[("outboxd.payload.size", "2000000")]),
        },
        Fake {
            partition: 0,
            key: "order-5",
            payload: Some(r#"{"order":5}"#.into()),
            timestamp_ms: 1_700_000_000_005,
            headers: dlq_headers("e5", &[("tenant", "acme")], "rejected", Some(&orders), &[]),
        },
    ];
    produce(&broker, &dlq_topic, &records);
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    let sd = state_dir.to_str().unwrap();

    // list --json: counts by reason, records in (partition, offset) order.
    let (code, out) = dlq(&broker, &dlq_topic, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let j = json_line(&out);
    assert_eq!(j["total"], 5, "{j}");
    assert_eq!(j["partitions"], 2, "{j}");
    assert_eq!(
        j["by_reason"],
        serde_json::json!({"invalid_json": 2, "null_route": 1, "too_large": 1, "rejected": 1}),
        "{j}"
    );
    let listed = j["records"].as_array().unwrap();
    assert_eq!(listed.len(), 5);
    assert_eq!(
        (&listed[0]["partition"], &listed[0]["offset"], &listed[0]["event_id"]),
        (&serde_json::json!(0), &serde_json::json!(0), &serde_json::json!("e1"))
    );
    assert_eq!(listed[0]["original_topic"], orders.as_str());
    assert_eq!(listed[0]["message"], "invalid_json for event e1");
    assert_eq!(listed[1]["event_id"], "e3");
    assert!(listed[1]["original_topic"].is_null(), "{j}");
    let e4 = listed.iter().find(|r| r["event_id"] == "e4").unwrap();
    assert_eq!(e4["original_payload_size"], 2_000_000);
    assert!(e4["payload_bytes"].is_null(), "{e4}");

    // --limit and the text output.
    let (code, out) = dlq(&broker, &dlq_topic, "list", &["--limit", "2"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("5 records in 2 partitions"), "{out}");
    assert!(out.contains("first 2 of 5"), "{out}");
    assert!(out.contains("0/0\te1\tinvalid_json"), "{out}");
    assert!(!out.contains("\te5\t"), "{out}");

    // Dry run: says what it would do, publishes and records nothing.
    let (code, out) = dlq(&broker, &dlq_topic, "replay", &["--dry-run", "--state-dir", sd]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("would replay 3, skipped 1 (no destination), already done 0"), "{out}");
    assert!(out.contains("skipped 1 (payload not kept)"), "{out}");
    assert!(read_topic(&broker, &orders).is_empty());
    assert!(read_topic(&broker, &users).is_empty());
    assert!(!state_dir.exists(), "dry run wrote state");

    // Filtered replay: exactly the invalid_json records, to their original topics.
    let (code, out) = dlq(&broker, &dlq_topic, "replay", &["--filter-reason", "invalid_json", "--state-dir", sd]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(summary(&out), "replayed 2, skipped 0 (no destination), already done 0", "{out}");
    assert!(state_file(&state_dir, &dlq_topic).exists());
    let got = read_topic(&broker, &orders);
    assert_eq!(ids(&got), ["e1"], "{got:?}");
    assert_republished(&got[0], "order-1", r#"{"order":1,"amount":"12.50"}"#, 1_700_000_000_001, &[("trace", "t-1")]);
    let got = read_topic(&broker, &users);
    assert_eq!(ids(&got), ["e2"], "{got:?}");
    assert_republished(&got[0], "user-2", r#"{"user":2}"#, 1_700_000_000_002, &[]);

    // The same replay again: nothing more.
    let (code, out) = dlq(&broker, &dlq_topic, "replay", &["--filter-reason", "invalid_json", "--state-dir", sd]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(summary(&out), "replayed 0, skipped 0 (no destination), already done 2", "{out}");

    // Unfiltered: the rest once. e3 has no destination, e4 no payload; both are reported.
    let (code, out) = dlq(&broker, &dlq_topic, "replay", &["--state-dir", sd]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        summary(&out),
        "replayed 1, skipped 1 (no destination), already done 2, skipped 1 (payload not kept)",
        "{out}"
    );
    assert!(out.contains("0/1 id=e3 reason=null_route"), "{out}");
    let got = read_topic(&broker, &orders);
    assert_eq!(ids(&got), ["e1", "e5"], "{got:?}");
    let e5 = got.iter().find(|r| r.header_str("id").as_deref() == Some("e5")).unwrap();
    assert_republished(e5, "order-5", r#"{"order":5}"#, 1_700_000_000_005, &[("tenant", "acme")]);
    assert_eq!(ids(&read_topic(&broker, &users)), ["e2"]);

    // The skipped one can still go elsewhere with --to-topic (a new topic), and only once.
    for round in 0..2 {
        let (code, out) =
            dlq(&broker, &dlq_topic, "replay", &["--event-id", "e3", "--to-topic", &elsewhere, "--state-dir", sd]);
        assert_eq!(code, Some(0), "{out}");
        let want = if round == 0 {
            "replayed 1, skipped 0 (no destination), already done 0"
        } else {
            "replayed 0, skipped 0 (no destination), already done 1"
        };
        assert_eq!(summary(&out), want, "{out}");
    }
    let got = read_topic(&broker, &elsewhere);
    assert_eq!(ids(&got), ["e3"], "{got:?}");
    assert_republished(&got[0], "order-3", r#"{"order":3}"#, 1_700_000_000_003, &[]);

    // Finally everything but the payload-less record is done.
    let (code, out) = dlq(&broker, &dlq_topic, "replay", &["--state-dir", sd]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        summary(&out),
        "replayed 0, skipped 0 (no destination), already done 4, skipped 1 (payload not kept)",
        "{out}"
    );
    assert_eq!(ids(&read_topic(&broker, &orders)), ["e1", "e5"]);
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state_file(&state_dir, &dlq_topic)).unwrap()).unwrap();
    assert_eq!(
        state,
        serde_json::json!({"version": 1, "dlq_topic": dlq_topic, "replayed": {"0": [[0, 2]], "1": [[0, 0]]}})
    );
}

#[test]
fn missing_dlq_topic_is_empty_not_an_error() {
    let broker = Broker::start();
    let topic = unique_name("no.such.dlq");
    let (code, out) = dlq(&broker, &topic, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let j = json_line(&out);
    assert_eq!((j["exists"].as_bool(), j["total"].as_u64()), (Some(false), Some(0)));
    let state = tempfile::tempdir().unwrap();
    let (code, out) = dlq(&broker, &topic, "replay", &["--state-dir", state.path().to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(summary(&out), "replayed 0, skipped 0 (no destination), already done 0");
}

#[test]
fn bad_kafka_property_is_a_one_line_config_error() {
    for bad in ["linger.ms", "bootstrap.servers=x:1"] {
        let (code, out) = run_to_exit(
            &args(&["dlq", "replay", "--kafka-brokers", "127.0.0.1:1", "--kafka-property", bad]),
            RUN_TIMEOUT,
        );
        assert_eq!(code, Some(2), "{out}");
        let line = out.lines().find(|l| l.starts_with("outboxd: error:")).unwrap_or_else(|| panic!("{out}"));
        assert!(line.contains("--kafka-property"), "{out}");
    }
}

#[test]
fn failed_delivery_exits_1_and_records_only_the_successes() {
    let broker = Broker::start();
    let dlq_topic = unique_name("outboxd.dlq");
    let dest = unique_name("dest");
    broker.create_topic(&dlq_topic, 1);
    let big = format!("\"{}\"", "x".repeat(5000));
    let fake = |id: &str, payload: &str| Fake {
        partition: 0,
        key: "k",
        payload: Some(payload.into()),
        timestamp_ms: 1_700_000_000_000,
        headers: dlq_headers(id, &[], "rejected", None, &[]),
    };
    produce(&broker, &dlq_topic, &[fake("small", "{}"), fake("big", &big)]);
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap();
    // The producer refuses records over message.max.bytes: the big one fails, the small one goes.
    let (code, out) = dlq(
        &broker,
        &dlq_topic,
        "replay",
        &["--to-topic", &dest, "--state-dir", sd, "--kafka-property", "message.max.bytes=2000"],
    );
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(summary(&out), "replayed 1, skipped 0 (no destination), already done 0, failed 1", "{out}");
    assert!(out.contains("0/1 id=big -> "), "{out}");
    assert!(out.lines().any(|l| l.starts_with("outboxd: error:") && l.contains("big")), "{out}");
    let saved = std::fs::read_to_string(state_file(state.path(), &dlq_topic)).unwrap();
    assert!(saved.contains(r#""replayed":{"0":[[0,0]]}"#), "{saved}");
    // Without the limit the big one goes too, and the small one is not sent again.
    let (code, out) = dlq(&broker, &dlq_topic, "replay", &["--to-topic", &dest, "--state-dir", sd]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(summary(&out), "replayed 1, skipped 0 (no destination), already done 1", "{out}");
    assert_eq!(ids(&read_topic(&broker, &dest)), ["big", "small"]);
}

fn sha256_hex(data: &[u8]) -> String {
    openssl::sha::sha256(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// Chunk `index` of a copy of `whole` cut into `len`-byte slices, as the pipeline writes it.
fn chunk(id: &str, set: &str, whole: &str, len: usize, index: usize, digest: Option<&str>) -> Fake {
    let count = whole.len().div_ceil(len);
    let slice = &whole[index * len..((index + 1) * len).min(whole.len())];
    let sha = digest.map_or_else(|| sha256_hex(whole.as_bytes()), str::to_owned);
    let extra = [
        ("outboxd.chunk.id", set.to_owned()),
        ("outboxd.chunk.index", index.to_string()),
        ("outboxd.chunk.count", count.to_string()),
        ("outboxd.chunk.size", whole.len().to_string()),
        ("outboxd.chunk.sha256", sha),
    ];
    let mut headers = dlq_headers(id, &[("trace", "t-9")], "too_large", None, &[]);
    headers.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
    Fake { partition: 0, key: "order-9", payload: Some(slice.to_owned()), timestamp_ms: 1_700_000_000_009, headers }
}

#[test]
fn chunked_copies_list_once_and_replay_joined_never_in_part() {
    let broker = Broker::start();
    let dlq_topic = unique_name("outboxd.dlq");
    let dest = unique_name("order.paid.v1.events");
    broker.create_topic(&dlq_topic, 1);
    let whole: String = (0..2500).map(|i| char::from(b'a' + (i * 7 % 26) as u8)).collect();
    let (set, len) = ("00aa", 1000);
    // A crashed first write left chunk 0; the retry wrote all three, read here out of order.
    let records = [
        chunk("e9", set, &whole, len, 0, None),
        chunk("e9", set, &whole, len, 2, None),
        chunk("e9", set, &whole, len, 0, None),
        chunk("e9", set, &whole, len, 1, None),
        // Another event whose chunk 1 never made it.
        chunk("e10", "00bb", &whole, len, 0, None),
        chunk("e10", "00bb", &whole, len, 2, None),
        // And one whose chunks do not add up to their digest.
        chunk("e11", "00cc", &whole, 2000, 0, Some(&"0".repeat(64))),
        chunk("e11", "00cc", &whole, 2000, 1, Some(&"0".repeat(64))),
    ];
    produce(&broker, &dlq_topic, &records);
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap();

    let (code, out) = dlq(&broker, &dlq_topic, "list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let j = json_line(&out);
    assert_eq!(j["total"], 1, "one event for e9's chunks: {j}");
    assert_eq!(j["records"][0]["event_id"], "e9");
    assert_eq!(j["records"][0]["chunks"], 3);
    assert_eq!(j["records"][0]["payload_bytes"], 2500);
    assert_eq!(j["incomplete"].as_array().unwrap().len(), 1, "{j}");
    assert_eq!(j["incomplete"][0]["event_id"], "e10");
    assert_eq!(j["incomplete"][0]["state"], "have 0,2 of 3 chunks (missing 1)");
    let unreadable = j["unreadable"].as_array().unwrap();
    assert_eq!(unreadable.len(), 1, "{j}");
    assert!(unreadable[0].as_str().unwrap().contains("id=e11") && unreadable[0].as_str().unwrap().contains("SHA-256"));
    let (code, out) = dlq(&broker, &dlq_topic, "list", &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("1 record in 1 partition"), "{out}");
    assert!(out.contains("[2500 bytes in 3 chunks]"), "{out}");
    assert!(out.contains("1 incomplete chunk sets") && out.contains("missing 1"), "{out}");
    assert!(out.contains("1 unreadable") && out.contains("0/6 id=e11"), "{out}");

    let (code, out) = dlq(&broker, &dlq_topic, "replay", &["--to-topic", &dest, "--state-dir", sd]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        summary(&out),
        "replayed 1, skipped 0 (no destination), already done 0, skipped 2 (incomplete or unreadable)",
        "{out}"
    );
    assert!(out.contains("0/4 id=e10") && out.contains("missing 1"), "{out}");
    assert!(out.contains("0/6 id=e11") && out.contains("SHA-256"), "{out}");
    let got = read_topic(&broker, &dest);
    assert_eq!(ids(&got), ["e9"], "{got:?}");
    assert_republished(&got[0], "order-9", &whole, 1_700_000_000_009, &[("trace", "t-9")]);
    let saved = std::fs::read_to_string(state_file(state.path(), &dlq_topic)).unwrap();
    assert!(saved.contains(r#""replayed":{"0":[[0,3]]}"#), "every chunk of e9, duplicate included: {saved}");

    let (code, out) = dlq(&broker, &dlq_topic, "replay", &["--to-topic", &dest, "--state-dir", sd]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 0, skipped 0 (no destination), already done 1,"), "{out}");
    assert_eq!(read_topic(&broker, &dest).len(), 1);
}

/// Creates `topic` through `bootstrap` (for a broker behind a proxy, which `Broker` is not).
fn create_topic_at(bootstrap: &str, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> =
        secure_kafka::client_config(bootstrap, &[]).create().expect("admin client");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let res = rt.block_on(admin.create_topics(
        [&NewTopic::new(topic, partitions, TopicReplication::Fixed(-1))],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
    ));
    for r in res.expect("create topics") {
        r.expect("create topic");
    }
}

#[test]
fn list_waits_out_a_broker_hiccup_and_fails_clearly_on_a_dead_one() {
    use common::netfault::{Dir, FreezeProxy};
    let proxy = FreezeProxy::start(1);
    let broker = Broker::options().advertise(proxy.port).start();
    proxy.set_target(broker.port());
    let bootstrap = format!("127.0.0.1:{}", proxy.port);
    let topic = unique_name("outboxd.dlq");
    create_topic_at(&bootstrap, &topic, 1);
    let n = 60;
    let records: Vec<Fake> = (0..n)
        .map(|i| Fake {
            partition: 0,
            key: "k",
            payload: Some(format!("{i:04}{}", "x".repeat(4000))),
            timestamp_ms: 1_700_000_000_000 + i,
            headers: dlq_headers(&format!("e{i}"), &[], "rejected", Some("t"), &[]),
        })
        .collect();
    produce_with(secure_kafka::client_config(&bootstrap, &[]), &topic, &records);
    // Small fetches, so reading takes many round trips and the hiccup lands in the middle.
    let list = |extra: &[&str]| {
        let mut a = vec!["dlq", "list", "--json", "--kafka-brokers", &bootstrap, "--dlq-topic", &topic];
        for p in ["message.max.bytes=8000", "fetch.max.bytes=8000", "max.partition.fetch.bytes=8000"] {
            a.extend(["--kafka-property", p]);
        }
        a.extend_from_slice(extra);
        run_to_exit(&args(&a), RUN_TIMEOUT)
    };

    // The broker goes silent for 7 s once ~40 KB (about a sixth of the DLQ) reached the tool:
    // longer than both the old 1.5 s quiet spell and its 5 s wait for a first record.
    proxy.hold_after(Dir::Down, 40_000);
    let ((code, out), held) = std::thread::scope(|s| {
        let hiccup = s.spawn(|| {
            let held = wait_until(RUN_TIMEOUT, || proxy.held(Dir::Down));
            std::thread::sleep(Duration::from_secs(7));
            proxy.release(Dir::Down);
            held
        });
        (list(&[]), hiccup.join().unwrap())
    });
    assert!(held, "the hiccup never happened: {out}");
    assert_eq!(code, Some(0), "{out}");
    let j = json_line(&out);
    assert_eq!(j["total"], n, "records lost to the hiccup: {j}");

    // A broker that stays silent: a clear failure after --read-timeout, not a short list.
    proxy.hold_after(Dir::Down, 40_000);
    let started = std::time::Instant::now();
    let (code, out) = list(&["--read-timeout", "4s"]);
    assert!(proxy.held(Dir::Down), "{out}");
    proxy.release(Dir::Down);
    assert_eq!(code, Some(1), "{out}");
    let err = out.lines().find(|l| l.starts_with("outboxd: error:")).unwrap_or_else(|| panic!("{out}"));
    assert!(
        err.contains("stalled") && err.contains("--read-timeout") && err.contains("partition 0 at offset"),
        "{err}"
    );
    assert!(!out.lines().any(|l| l.starts_with('{')), "no partial listing: {out}");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
}
