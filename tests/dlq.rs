//! Bad events never block the outbox: each `--on-bad-event` policy against the real database and
//! broker, with the slot moving past the bad row only when the policy says so.

mod common;

use std::time::Duration;

use common::*;

/// An outbox that accepts the rows the default schema forbids.
fn lax_outbox(pg: &PgCluster) {
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("ALTER TABLE outbox ALTER COLUMN event_type DROP NOT NULL");
}

fn insert(pg: &PgCluster, agg: &str, event_type: Option<&str>, payload: &str) -> String {
    pg.insert_event("t", agg, event_type, payload, None)
}

fn slot_reaches_wal_end(pg: &PgCluster) -> bool {
    pg.wait_slot_reaches_wal_end(Duration::from_secs(20))
}

#[test]
fn default_policy_dead_letters_and_keeps_going() {
    let pg = PgCluster::start();
    lax_outbox(&pg);
    let broker = Broker::start();
    let mut d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &["--status-interval", "200ms"]));
    let good1 = insert(&pg, "a", Some("ok.v1"), "{\"n\": 1}");
    let bad = insert(&pg, "b", None, "{\"n\": 2}");
    let good2 = insert(&pg, "c", Some("ok.v1"), "{\"n\": 3}");
    let ok = broker.consume_all("ok.v1.events", 1, 2, Duration::from_secs(30));
    let ids: Vec<String> = ok.iter().filter_map(|r| r.header_str("id")).collect();
    assert_eq!(ids, vec![good1, good2], "{}", d.log());
    let dlq = broker.consume_all("outboxd.dlq", 1, 1, Duration::from_secs(30));
    assert_eq!(dlq.len(), 1, "{}", d.log());
    let r = &dlq[0];
    assert_eq!(r.header_str("id"), Some(bad));
    assert_eq!(r.header_str("outboxd.error").as_deref(), Some("null_route"));
    assert!(r.header_str("outboxd.error.message").unwrap().contains("NULL"));
    assert_eq!(r.header_str("outboxd.source.table").as_deref(), Some("public.outbox"));
    assert!(r.header_str("outboxd.source.lsn").unwrap().contains('/'));
    assert_eq!(r.key_str().as_deref(), Some("b"));
    assert_eq!(r.payload.as_deref(), Some(&b"{\"n\": 2}"[..]));
    assert!(slot_reaches_wal_end(&pg), "the DLQ ack must let the slot move on\n{}", d.log());
    d.stop_cleanly();
}

/// The default policy keeps a payload larger than the broker takes: its dead-letter copy goes in
/// chunks, the slot passes the event only once every chunk is acked (the row is deleted in its own
/// transaction, so the DLQ holds the only copy), and `outboxd dlq replay` puts it back together
/// on the original topic byte for byte.
#[test]
fn oversize_event_is_kept_in_chunks_confirmed_after_the_last_and_replayed_byte_exact() {
    use common::netfault::{Dir, FreezeProxy};
    use common::secure_kafka::{client_config, consume_with};
    let pg = PgCluster::start();
    lax_outbox(&pg);
    // outboxd reaches the broker through a proxy that can hold its produce requests.
    let proxy = FreezeProxy::start(1);
    let broker = Broker::options().advertise(proxy.port).start();
    proxy.set_target(broker.port());
    let bootstrap = format!("127.0.0.1:{}", proxy.port);
    // The destination takes 5 MB records (a topic's default is 1 MB), so the replay below can put
    // the 3 MiB event back whole; outboxd's own producer limit (1 MB) is what sends it to the DLQ.
    broker.create_topic_with("size.v1.events", 1, &[("max.message.bytes", "5000000")], false);
    let metrics_port = free_port();
    let mut a = daemon_args_pg_only(
        &pg,
        &[
            "--status-interval",
            "200ms",
            "--heartbeat-interval",
            "0",
            "--metrics-addr",
            &format!("127.0.0.1:{metrics_port}"),
        ],
    );
    a.extend(args(&["--kafka-brokers", &bootstrap, "--kafka-property", "message.max.bytes=1000000"]));
    let mut d = Outboxd::spawn_streaming(&a);
    insert(&pg, "warm", Some("size.v1"), "{}");
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());

    // 3 MiB of varied JSON (md5 hex strings), so a misplaced chunk cannot go unnoticed.
    let blob = "jsonb_build_object('blob', (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 98304) g))";
    let expected = pg.psql(&format!("SELECT {blob}::text"));
    assert!(expected.len() > 3 << 20, "{}", expected.len());
    let before = pg.psql("SELECT pg_current_wal_insert_lsn()");
    // Let the first chunk through and hold the rest of the produce traffic.
    proxy.hold_after(Dir::Up, 1_300_000);
    pg.psql(&format!(
        "BEGIN; INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('6d1f9d2e-0000-4000-8000-000000000001', 't', 'big', 'size.v1', {blob}); \
         DELETE FROM outbox WHERE aggregate_id = 'big'; COMMIT"
    ));
    let commit_end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    assert!(wait_until(Duration::from_secs(30), || proxy.held(Dir::Up)), "no produce traffic:\n{}", d.log());
    // Chunks the broker acked (it is reached directly, not through the proxy).
    let dlq_acks = || broker.end_offsets("outboxd.dlq") as f64;
    assert!(wait_until(Duration::from_secs(15), || dlq_acks() >= 1.0), "first chunk never acked:\n{}", d.log());
    // One chunk acked, the others held: the slot must not pass the transaction.
    let end = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < end {
        let past = pg.psql(&format!(
            "SELECT confirmed_flush_lsn >= '{commit_end}' FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        ));
        assert_eq!(past, "f", "slot confirmed an event with {} of its chunks acked:\n{}", dlq_acks(), d.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(dlq_acks() < 4.0, "{}", dlq_acks());
    proxy.release(Dir::Up);
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    assert_eq!(dlq_acks(), 4.0, "3 MiB in chunks under 1 MB");
    // Dead-letter copies and chunks count in outboxd_dlq_events_total, never as events delivered
    // to a topic (issue 23 item 16: run counted them, poll did not).
    let (_, body) = http_get(metrics_port, "/metrics").unwrap_or_default();
    assert_eq!(metric(&body, "outboxd_events_total{topic=\"outboxd.dlq\"}"), None, "{body}");
    assert_eq!(metric(&body, "outboxd_dlq_events_total{reason=\"too_large\"}"), Some(1.0), "{body}");
    assert!(pg.psql(&format!("SELECT '{before}'::pg_lsn < '{commit_end}'::pg_lsn")) == "t");

    let chunks = consume_with(&client_config(&bootstrap, &[]), "outboxd.dlq", 4, Duration::from_secs(30));
    assert_eq!(chunks.len(), 4, "{}", d.log());
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c.header_str("outboxd.chunk.index"), Some(i.to_string()));
        assert_eq!(c.header_str("outboxd.chunk.count").as_deref(), Some("4"));
        assert_eq!(c.header_str("outboxd.error").as_deref(), Some("too_large"));
        assert_eq!(c.key_str().as_deref(), Some("big"));
        assert!(c.payload.as_ref().is_some_and(|p| p.len() < 1_000_000), "chunk {i}");
    }
    d.stop_cleanly();

    let state = tempfile::tempdir().unwrap();
    let tool = |sub: &str, extra: &[&str]| {
        let mut a = vec!["dlq", sub, "--kafka-brokers", &bootstrap];
        a.extend_from_slice(extra);
        run_to_exit(&args(&a), Duration::from_secs(90))
    };
    let (code, out) = tool("list", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let j: serde_json::Value = serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!((j["total"].as_u64(), j["records"][0]["chunks"].as_u64()), (Some(1), Some(4)), "{j}");
    assert_eq!(j["records"][0]["payload_bytes"].as_u64(), Some(expected.len() as u64));
    let (code, out) = tool(
        "replay",
        &["--state-dir", state.path().to_str().unwrap(), "--kafka-property", "message.max.bytes=5000000"],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("replayed 1,"), "{out}");
    let got = consume_with(&client_config(&bootstrap, &[]), "size.v1.events", 2, Duration::from_secs(30));
    let big: Vec<_> = got.iter().filter(|r| r.key_str().as_deref() == Some("big")).collect();
    assert_eq!(big.len(), 1, "{got:?}");
    assert!(big[0].payload.as_deref() == Some(expected.as_bytes()), "replayed payload differs from the row's");
    assert_eq!(big[0].header_str("id").as_deref(), Some("6d1f9d2e-0000-4000-8000-000000000001"));
    assert!(big[0].headers.iter().all(|(k, _)| !k.starts_with("outboxd.")), "{:?}", big[0].headers);
}

#[test]
fn skip_policy_counts_and_moves_on() {
    let pg = PgCluster::start();
    lax_outbox(&pg);
    let broker = Broker::start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--status-interval", "200ms", "--on-bad-event", "skip", "--metrics-addr", &addr],
    ));
    let bad = insert(&pg, "b", None, "{}");
    let good = insert(&pg, "g", Some("skip.v1"), "{}");
    let ok = broker.consume_all("skip.v1.events", 1, 1, Duration::from_secs(30));
    assert_eq!(ok.len(), 1, "{}", d.log());
    assert_eq!(ok[0].header_str("id"), Some(good));
    assert!(d.log().contains(&bad) && d.log().contains("skipping bad event"), "{}", d.log());
    let (_, body) = http_get(port, "/metrics").unwrap();
    assert_eq!(metric(&body, "outboxd_events_failed_total{reason=\"null_route\"}"), Some(1.0), "{body}");
    assert_eq!(metric(&body, "outboxd_dlq_events_total{reason=\"null_route\"}"), Some(0.0), "{body}");
    assert!(!broker.topics().contains(&"outboxd.dlq".to_owned()));
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    d.stop_cleanly();
}

#[test]
fn fail_policy_stops_at_the_bad_row_without_confirming_it() {
    let pg = PgCluster::start();
    lax_outbox(&pg);
    let broker = Broker::start();
    let mut d =
        Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &["--status-interval", "200ms", "--on-bad-event", "fail"]));
    let before = pg.psql("SELECT pg_current_wal_insert_lsn()");
    let bad = insert(&pg, "b", None, "{}");
    let status = d.wait_exit(Duration::from_secs(20)).expect("outboxd stops on a bad row with --on-bad-event fail");
    assert_eq!(status.code(), Some(1), "{}", d.log());
    let err = d.log().lines().find(|l| l.starts_with("outboxd: error:")).unwrap_or_default().to_owned();
    assert!(err.contains(&bad) && err.contains("NULL"), "{err}");
    let confirmed = pg.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'");
    assert_eq!(
        pg.psql(&format!("SELECT '{confirmed}'::pg_lsn <= '{before}'::pg_lsn")),
        "t",
        "slot confirmed {confirmed}, past the bad row's transaction (which began after {before})"
    );
}
