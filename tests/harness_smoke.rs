//! Smoke tests for the integration-test harness (`tests/common`) and the
//! repository's SQL (`sql/`): a private PostgreSQL cluster, the outbox schema
//! and example trigger, and an Apache Kafka round trip via rdkafka.

mod common;

use std::time::Duration;

use common::{Broker, PgCluster};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// The SQL files apply cleanly (twice: they are idempotent), and paying an
/// order produces exactly one `order.paid.v1` outbox row.
#[tokio::test]
async fn sql_files_apply_and_paid_order_emits_outbox_event() {
    let pg = PgCluster::start();
    let files = common::sql_files();
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(
        names,
        [
            "01_outbox.sql",
            "02_orders_example.sql",
            "03_role.sql",
            "04_publication.sql",
            "05_poll.sql",
            "06_emit.sql",
            "07_partitioned.sql",
            "08_inbox.sql"
        ]
    );
    // Round 1 without the optional psql variable, round 2 with it.
    for f in &files {
        pg.apply_sql_file(f);
    }
    assert_eq!(pg.psql("SELECT rolpassword IS NULL FROM pg_authid WHERE rolname = 'outboxd_relay'"), "t");
    for f in &files {
        pg.apply_sql_file_with(f, &[("relay_password", "relay-pw")]);
    }
    assert_eq!(pg.psql("SHOW wal_level"), "logical");

    let order_id = pg.psql("INSERT INTO orders (user_id, total_amount) VALUES (42, 99.95) RETURNING id");
    assert_eq!(pg.psql("SELECT count(*) FROM outbox"), "0", "created order emits nothing");

    pg.psql(&format!("UPDATE orders SET status = 'paid' WHERE id = {order_id}"));
    // Re-saving an already paid order and moving it on must not emit again.
    pg.psql(&format!("UPDATE orders SET status = 'paid' WHERE id = {order_id}"));
    pg.psql(&format!("UPDATE orders SET status = 'shipped' WHERE id = {order_id}"));

    let rows = pg.psql(
        "SELECT aggregate_type, aggregate_id, event_type, \
                payload->>'order_id', payload->>'user_id', payload->>'total_amount', \
                (payload ? 'paid_at')::text, headers->>'source', \
                length(headers->>'trace_id') > 0, published_at IS NULL, attempts \
         FROM outbox",
    );
    let lines: Vec<&str> = rows.lines().collect();
    assert_eq!(lines.len(), 1, "expected exactly one outbox row, got:\n{rows}");
    let cols: Vec<&str> = lines[0].split('|').collect();
    assert_eq!(
        cols,
        [
            "order",
            order_id.as_str(),
            "order.paid.v1",
            order_id.as_str(),
            "42",
            "99.95",
            "true",
            "db-trigger:orders",
            "t",
            "t",
            "0"
        ]
    );

    // The same row through a tokio-postgres client (unix socket).
    let client = pg.client().await;
    let row = client.query_one("SELECT event_type, event_id::text FROM outbox", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "order.paid.v1");
    assert_eq!(row.get::<_, String>(1).len(), 36, "event_id is a uuid");

    // Publication: insert-only, on public.outbox.
    assert_eq!(
        pg.psql(
            "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication \
             WHERE pubname = 'outboxd'"
        ),
        "t|f|f|f"
    );
    assert_eq!(
        pg.psql("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'outboxd'"),
        "public.outbox"
    );

    // Least-privilege relay role.
    assert_eq!(
        pg.psql(
            "SELECT rolcanlogin, rolreplication, rolsuper, rolpassword IS NOT NULL \
             FROM pg_authid WHERE rolname = 'outboxd_relay'"
        ),
        "t|t|f|t"
    );
    assert_eq!(
        pg.psql(
            "SELECT has_table_privilege('outboxd_relay', 'public.outbox', 'SELECT'), \
                    has_table_privilege('outboxd_relay', 'public.outbox', 'INSERT')"
        ),
        "t|f"
    );
}

/// TCP logins work with SCRAM (`outboxd`) and MD5 (`md5user`) passwords, and
/// a wrong password is rejected.
#[tokio::test]
async fn password_logins_over_tcp() {
    let pg = PgCluster::start();
    assert!(pg.url().starts_with("postgres://outboxd:secret-pw@127.0.0.1:"));
    assert_eq!(
        pg.psql(
            "SELECT rolname, split_part(rolpassword, '$', 1) ~ '^(md5[0-9a-f]{32}|SCRAM-SHA-256)$' \
             FROM pg_authid WHERE rolname IN ('outboxd', 'md5user') ORDER BY 1"
        ),
        "md5user|t\noutboxd|t"
    );
    assert!(pg.psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'md5user'").starts_with("md5"));
    assert!(pg.psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'outboxd'").starts_with("SCRAM-SHA-256$"));

    for url in [pg.url(), pg.url_for(common::MD5_USER, common::MD5_PASSWORD)] {
        let (client, conn) =
            tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap_or_else(|e| panic!("connect {url}: {e}"));
        tokio::spawn(conn);
        let who: String = client.query_one("SELECT current_user::text", &[]).await.unwrap().get(0);
        assert!(url.contains(&format!("//{who}:")), "{who} vs {url}");
        let wal_level: String = client.query_one("SELECT current_setting('wal_level')", &[]).await.unwrap().get(0);
        assert_eq!(wal_level, "logical");
    }

    let bad = pg.url_for(common::USER, "wrong");
    let err =
        tokio_postgres::connect(&bad, tokio_postgres::NoTls).await.err().expect("wrong password must be rejected");
    assert_eq!(err.code(), Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD), "unexpected error: {err:?}");
}

/// Extra configuration lines override the harness defaults; the cluster can
/// be restarted on the same port.
#[test]
fn extra_conf_overrides_defaults_and_restart_keeps_port() {
    let mut pg = PgCluster::start_with(&["wal_level = replica"]);
    assert_eq!(pg.psql("SHOW wal_level"), "replica");
    let port = pg.port();
    pg.restart();
    assert_eq!(pg.port(), port);
    assert_eq!(pg.psql("SHOW port"), port.to_string());
    assert_eq!(pg.psql("SHOW wal_level"), "replica");
}

/// A record produced with rdkafka comes back byte-for-byte through
/// `Broker::consume_all`, on the partition it was sent to.
#[tokio::test]
async fn broker_roundtrip_preserves_key_payload_and_headers() {
    let broker = Broker::start();
    let topic = common::unique_name("smoke");
    broker.create_topic(&topic, 3);
    assert_eq!(broker.partition_count(&topic), Some(3));

    let producer: FutureProducer =
        broker.client_config().set("message.timeout.ms", "20000").create().expect("producer");
    let key = b"order-17".to_vec();
    let payload = br#"{"order_id":17,"note":"caf\u00e9 \u2713"}"#.to_vec();
    let header_val = vec![0u8, 1, 2, 0xff, b'x'];
    let delivery = producer
        .send(
            FutureRecord::to(&topic)
                .partition(1)
                .key(&key)
                .payload(&payload)
                .headers(OwnedHeaders::new().insert(Header { key: "trace_id", value: Some(&header_val) })),
            Duration::from_secs(20),
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("produce failed: {e}\nbroker log:\n{}", broker.log()));
    assert_eq!(delivery.partition, 1);

    // Blocking is fine here: nothing else on this runtime needs to progress.
    let got = broker.consume_all(&topic, 3, 1, Duration::from_secs(30));
    assert_eq!(got.len(), 1, "records: {got:?}\nbroker log:\n{}", broker.log());
    let rec = &got[0];
    assert_eq!(rec.topic, topic);
    assert_eq!(rec.partition, 1);
    assert_eq!(rec.offset, delivery.offset);
    assert_eq!(rec.key.as_deref(), Some(&key[..]));
    assert_eq!(rec.payload.as_deref(), Some(&payload[..]));
    assert_eq!(rec.headers, vec![("trace_id".to_string(), header_val.clone())]);
    assert_eq!(rec.header("trace_id"), Some(&header_val[..]));
    assert_eq!(rec.payload_json()["order_id"], 17);
    assert!(rec.timestamp_ms.is_some_and(|t| t > 0));
}

/// Apache Kafka accepts an idempotent producer (`enable.idempotence=true`,
/// `acks=all`), which is what outboxd uses for at-least-once delivery
/// without broker-side duplicates on retries.
#[tokio::test]
async fn broker_accepts_idempotent_producer() {
    let broker = Broker::start();
    let topic = common::unique_name("idem");
    broker.create_topic(&topic, 1);

    let producer: FutureProducer = broker
        .client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "20000")
        .create()
        .expect("idempotent producer");
    for i in 0..5u32 {
        let payload = format!("idem-{i}");
        producer
            .send(FutureRecord::to(&topic).key("k").payload(&payload), Duration::from_secs(20))
            .await
            .unwrap_or_else(|(e, _)| panic!("idempotent produce #{i} failed: {e}\nbroker log:\n{}", broker.log()));
    }

    let got = broker.consume_all(&topic, 1, 5, Duration::from_secs(30));
    let payloads: Vec<String> = got.iter().map(|c| String::from_utf8(c.payload.clone().unwrap()).unwrap()).collect();
    assert_eq!(payloads, ["idem-0", "idem-1", "idem-2", "idem-3", "idem-4"]);
}

/// A sqlite-backed broker keeps topics and records across a restart on the
/// same port; a paused (SIGSTOPped) broker stops answering until resumed.
#[tokio::test]
async fn persistent_broker_survives_restart_and_pause() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start_persistent(dir.path());
    let topic = "persisted";
    broker.create_topic(topic, 2);

    let producer: FutureProducer =
        broker.client_config().set("message.timeout.ms", "20000").create().expect("producer");
    for i in 0..4 {
        producer
            .send(FutureRecord::to(topic).partition(i % 2).key("k").payload(&format!("p{i}")), Duration::from_secs(20))
            .await
            .unwrap_or_else(|(e, _)| panic!("produce failed: {e}"));
    }
    drop(producer);

    let port = broker.port();
    broker.restart();
    assert_eq!(broker.port(), port);
    broker.ensure_topic(topic, 2); // already there: no error
    let got = broker.consume_all(topic, 2, 4, Duration::from_secs(30));
    let mut payloads: Vec<String> =
        got.iter().map(|c| String::from_utf8(c.payload.clone().unwrap()).unwrap()).collect();
    payloads.sort();
    assert_eq!(payloads, ["p0", "p1", "p2", "p3"], "broker log:\n{}", broker.log());

    broker.pause();
    assert_eq!(broker.partition_count(topic), None, "paused broker must not answer");
    broker.resume();
    assert_eq!(broker.partition_count(topic), Some(2));
}

/// The daemon wrapper captures output and exit codes (uses only clap's
/// built-in behaviour, so it does not depend on the daemon's features).
#[test]
fn daemon_wrapper_captures_output_and_exit_codes() {
    let (code, out) = common::run_to_exit(&common::args(&["--help"]), Duration::from_secs(30));
    assert_eq!(code, Some(0), "output:\n{out}");
    assert!(out.contains("Usage") && out.contains("run"), "output:\n{out}");

    let (code, out) = common::run_to_exit(&common::args(&["--no-such-flag"]), Duration::from_secs(30));
    assert_eq!(code, Some(2), "clap usage errors exit 2; output:\n{out}");
    assert!(out.contains("--no-such-flag"), "output:\n{out}");

    let mut d = common::Outboxd::spawn(&common::args(&["run", "--help"]));
    assert!(d.wait_for_log("--postgres-url", Duration::from_secs(30)), "log:\n{}", d.log());
    let status = d.wait_exit(Duration::from_secs(30)).expect("exits");
    assert!(status.success());
    assert!(!d.is_running());
}

/// `streaming_started` matches the session-start line in both log formats, and not the error
/// lines that merely contain the word.
#[test]
fn streaming_line_is_matched_exactly() {
    let text =
        "2026-12-03T07:58:51.495778Z  INFO outboxd::app: streaming slot=outboxd publication=outboxd start=0/1958AC8";
    let json =
        r#"{"timestamp":"2026-12-03T07:58:51Z","level":"INFO","fields":{"message":"streaming","slot":"outboxd"}}"#;
    assert!(common::streaming_started(text));
    assert!(common::streaming_started(json));
    for other in [
        "2026-12-03T07:58:51Z ERROR outboxd: the server stopped streaming: publication \"outboxd\" does not exist",
        r#"{"fields":{"message":"the server stopped streaming: x"}}"#,
    ] {
        assert!(!common::streaming_started(other), "{other}");
    }
}

/// `scripts/kafka start`: a port another process takes between its choice and the broker's bind
/// (here held by this test from the start) makes the launcher start over on fresh ports instead
/// of failing, and the launcher writes nothing into the directory it is started from (log4j's
/// `${sys:kafka.logs.dir}` folder once appeared there).
#[test]
fn kafka_launcher_starts_over_when_a_port_is_taken_and_writes_only_into_its_dir() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_port = taken.local_addr().unwrap().port();
    let (ctrl, client) = (common::free_port(), common::free_port());
    let cwd = tempfile::tempdir().expect("tempdir");
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = dir.path().join("c");
    let out = std::process::Command::new(common::kafka::kafka_script())
        .current_dir(cwd.path())
        .env("KAFKA_QUICK_JVM", "1")
        // The internal listener's port is the taken one.
        .env("KAFKA_FIRST_PORTS", format!("{ctrl} {taken_port} {client}"))
        .arg("start")
        .arg(&cluster)
        .args(["--parent", &std::process::id().to_string()])
        .output()
        .expect("run scripts/kafka");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stop = || {
        let _ =
            std::process::Command::new(common::kafka::kafka_script()).arg("stop").arg(&cluster).arg("--now").output();
    };
    if !out.status.success() {
        stop();
        panic!("scripts/kafka start failed with a taken port:\n{stderr}");
    }
    let bootstrap = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let internal = std::fs::read_to_string(cluster.join("node-1/internal.port")).unwrap_or_default();
    let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    stop();
    assert!(stderr.contains("starting over on fresh ports"), "no retry was said:\n{stderr}");
    assert_ne!(internal.trim(), taken_port.to_string(), "the retry kept the taken port");
    assert!(!bootstrap.is_empty() && !bootstrap.ends_with(&format!(":{taken_port}")), "bootstrap {bootstrap:?}");
    assert!(left.is_empty(), "scripts/kafka wrote into the directory it was started from: {left:?}");
    drop(taken);
}
