//! Kafka on production networks, against the real broker: TLS (through a TLS-terminating proxy in
//! front of tansu, which speaks plaintext only), SASL/SCRAM (tansu's `--authentication`), a
//! Debezium connector JSON whose credentials come from `${file:…}`, and every compression codec.
//! A bad CA or password must fail visibly and confirm nothing; secrets never reach the log or
//! `outboxd config`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::certs::TestCa;
use common::secure_kafka::{client_config, consume_with, create_scram_user, Tansu, TlsProxy};
use common::*;

const SCRAM_USER: &str = "relay";
const SCRAM_PASSWORD: &str = "scr4m-Pa55word-xyzzy";

fn insert(pg: &PgCluster, event_type: &str, n: usize) {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'sec', 'agg-' || (g % 3), '{event_type}', jsonb_build_object('n', g) FROM generate_series(1, {n}) g"
    ));
}

fn confirmed_at_most(pg: &PgCluster, lsn: &str) -> bool {
    pg.psql(&format!(
        "SELECT coalesce(confirmed_flush_lsn <= '{lsn}'::pg_lsn, true) FROM pg_replication_slots WHERE slot_name = 'outboxd'"
    )) == "t"
}

fn run_args(pg: &PgCluster, bootstrap: &str, extra: &[&str]) -> Vec<String> {
    let mut a = daemon_args_pg_only(pg, extra);
    a.extend(args(&["--kafka-brokers", bootstrap]));
    a
}

/// A CA, the proxy's certificate, and tansu behind the proxy, advertising the proxy.
struct TlsSetup {
    dir: tempfile::TempDir,
    ca: std::path::PathBuf,
    proxy: TlsProxy,
    _tansu: Tansu,
}

fn tls_setup() -> TlsSetup {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("outboxd test Kafka CA");
    let server = ca.server(dir.path(), "kafka", &["localhost"]);
    let ca_path = ca.write_ca(dir.path(), "ca.pem");
    let proxy = TlsProxy::start(&server.cert, &server.key);
    let data = dir.path().join("tansu");
    std::fs::create_dir_all(&data).unwrap();
    let tansu = Tansu::start(&data, Some(proxy.port), false);
    proxy.set_upstream(tansu.port);
    TlsSetup { dir, ca: ca_path, proxy, _tansu: tansu }
}

fn tls_client(s: &TlsSetup) -> rdkafka::config::ClientConfig {
    client_config(
        &s.proxy.bootstrap(),
        &[("security.protocol", "ssl"), ("ssl.ca.location", &s.ca.display().to_string())],
    )
}

#[test]
fn tls_with_the_right_ca_delivers_every_event() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let s = tls_setup();
    let ca = s.ca.display().to_string();
    let mut d = Outboxd::spawn_streaming(&run_args(
        &pg,
        &s.proxy.bootstrap(),
        &["--kafka-property", "security.protocol=ssl", "--kafka-property", &format!("ssl.ca.location={ca}")],
    ));
    insert(&pg, "tls.v1", 50);
    let end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    // outboxd created the topic through the admin client, over TLS too.
    let got = consume_with(&tls_client(&s), "tls.v1.events", 50, Duration::from_secs(60));
    assert_eq!(got.len(), 50, "{}", d.log());
    let mut ns: Vec<i64> = got.iter().map(|r| r.payload_json()["n"].as_i64().unwrap()).collect();
    ns.sort();
    assert_eq!(ns, (1..=50).collect::<Vec<_>>());
    assert!(s.proxy.handshakes_ok.load(std::sync::atomic::Ordering::SeqCst) >= 2, "producer and admin connected");
    let caught_up = wait_until(Duration::from_secs(20), || {
        pg.psql(&format!(
            "SELECT confirmed_flush_lsn >= '{end}'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        )) == "t"
    });
    assert!(caught_up, "slot never caught up to {end}:\n{}", d.log());
    d.stop_cleanly();
}

#[test]
fn tls_with_a_wrong_ca_fails_clearly_and_confirms_nothing() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let s = tls_setup();
    let wrong = TestCa::new("some other CA").write_ca(s.dir.path(), "wrong-ca.pem");
    let d = Outboxd::spawn_streaming(&run_args(
        &pg,
        &s.proxy.bootstrap(),
        &[
            "--kafka-property",
            "security.protocol=ssl",
            "--kafka-property",
            &format!("ssl.ca.location={}", wrong.display()),
            "--status-interval",
            "200ms",
        ],
    ));
    let before = pg.psql("SELECT pg_current_wal_insert_lsn()");
    insert(&pg, "tls.v1", 5);
    assert!(
        d.wait_for_log("certificate verify failed", Duration::from_secs(30)),
        "no log line names the certificate problem:\n{}",
        d.log()
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(s.proxy.handshakes_failed.load(std::sync::atomic::Ordering::SeqCst) > 0);
    assert!(confirmed_at_most(&pg, &before), "slot confirmed past undelivered events:\n{}", d.log());
    // Nothing reached the broker (read with the right CA).
    assert!(consume_with(&tls_client(&s), "tls.v1.events", 1, Duration::from_secs(5)).is_empty());
}

/// tansu with a SCRAM-SHA-256 user, restarted with `--authentication`.
fn scram_broker(dir: &Path) -> Tansu {
    let mut t = Tansu::start(dir, None, false);
    create_scram_user(t.port, "scram256", SCRAM_USER, SCRAM_PASSWORD);
    t.restart(None, true);
    t
}

fn sasl_client(t: &Tansu) -> rdkafka::config::ClientConfig {
    client_config(
        &format!("127.0.0.1:{}", t.port),
        &[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanisms", "SCRAM-SHA-256"),
            ("sasl.username", SCRAM_USER),
            ("sasl.password", SCRAM_PASSWORD),
        ],
    )
}

#[test]
fn scram_with_a_property_file_delivers_and_never_shows_the_password() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let dir = tempfile::tempdir().unwrap();
    let t = scram_broker(dir.path());
    let props = dir.path().join("kafka.properties");
    std::fs::write(
        &props,
        format!(
            "# outboxd's Kafka credentials\nsecurity.protocol = SASL_PLAINTEXT\nsasl.mechanism: SCRAM-SHA-256\n\
             sasl.username={SCRAM_USER}\nsasl.password={SCRAM_PASSWORD}\n"
        ),
    )
    .unwrap();
    let props = props.display().to_string();
    let bootstrap = format!("127.0.0.1:{}", t.port);
    let a = run_args(&pg, &bootstrap, &["--kafka-property-file", &props]);

    let mut shown = a.clone();
    shown[0] = "config".into();
    let (code, out) = run_to_exit(&shown, Duration::from_secs(20));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("--kafka-property-file {props}")) && !out.contains(SCRAM_PASSWORD), "{out}");
    let (code, out) = run_to_exit(
        &[shown.clone(), args(&["--kafka-property", &format!("sasl.password={SCRAM_PASSWORD}")])].concat(),
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("sasl.password=****") && !out.contains(SCRAM_PASSWORD), "{out}");

    let mut d = Outboxd::spawn_streaming(&a);
    insert(&pg, "scram.v1", 30);
    let got = consume_with(&sasl_client(&t), "scram.v1.events", 30, Duration::from_secs(60));
    assert_eq!(got.len(), 30, "{}\n{}", d.log(), t.log());
    d.stop_cleanly();
    assert!(!d.log().contains(SCRAM_PASSWORD), "the password is in the log:\n{}", d.log());
}

#[test]
fn scram_with_a_wrong_password_fails_clearly_and_confirms_nothing() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let dir = tempfile::tempdir().unwrap();
    let t = scram_broker(dir.path());
    let wrong = "not-the-Pa55word-plugh";
    let d = Outboxd::spawn_streaming(&run_args(
        &pg,
        &format!("127.0.0.1:{}", t.port),
        &[
            "--kafka-property",
            "security.protocol=sasl_plaintext",
            "--kafka-property",
            "sasl.mechanisms=SCRAM-SHA-256",
            "--kafka-property",
            &format!("sasl.username={SCRAM_USER}"),
            "--kafka-property",
            &format!("sasl.password={wrong}"),
            "--status-interval",
            "200ms",
        ],
    ));
    let before = pg.psql("SELECT pg_current_wal_insert_lsn()");
    insert(&pg, "scram.v1", 5);
    assert!(
        d.wait_for_log("Authentication failed", Duration::from_secs(30))
            || d.wait_for_log("SASL authentication error", Duration::from_secs(1)),
        "no log line names the authentication failure:\n{}",
        d.log()
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(confirmed_at_most(&pg, &before), "slot confirmed past undelivered events:\n{}", d.log());
    assert!(!d.log().contains(wrong), "the password is in the log:\n{}", d.log());
    assert!(consume_with(&sasl_client(&t), "scram.v1.events", 1, Duration::from_secs(5)).is_empty());
}

#[test]
fn debezium_json_with_scram_jaas_from_a_file_provider_works_end_to_end() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let dir = tempfile::tempdir().unwrap();
    let t = scram_broker(dir.path());
    let secrets = dir.path().join("secrets.properties");
    std::fs::write(
        &secrets,
        format!("kafka.user={SCRAM_USER}\nkafka.password={SCRAM_PASSWORD}\ndb.password={PASSWORD}\n"),
    )
    .unwrap();
    let s = secrets.display();
    let json = serde_json::json!({
        "name": "outbox-connector",
        "config": {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "config.providers": "file",
            "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
            "database.hostname": "127.0.0.1",
            "database.port": pg.port().to_string(),
            "database.user": USER,
            "database.password": format!("${{file:{s}:db.password}}"),
            "database.dbname": "app",
            "plugin.name": "pgoutput",
            "slot.name": "outboxd",
            "table.include.list": "public.outbox",
            "transforms": "outbox",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "transforms.outbox.route.by.field": "event_type",
            "transforms.outbox.route.topic.replacement": "${routedByValue}.events",
            "transforms.outbox.table.field.event.id": "event_id",
            "transforms.outbox.table.field.event.key": "aggregate_id",
            "producer.override.bootstrap.servers": format!("127.0.0.1:{}", t.port),
            "producer.override.security.protocol": "SASL_PLAINTEXT",
            "producer.override.sasl.mechanism": "SCRAM-SHA-256",
            "producer.override.sasl.jaas.config": format!(
                "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"${{file:{s}:kafka.user}}\" password=\"${{file:{s}:kafka.password}}\";"
            ),
        }
    });
    let file = dir.path().join("connector.json");
    std::fs::write(&file, json.to_string()).unwrap();
    let file = file.display().to_string();
    assert!(!std::fs::read_to_string(&file).unwrap().contains(SCRAM_PASSWORD));

    let (code, out) = run_to_exit(&args(&["config", "--debezium-config", &file]), Duration::from_secs(20));
    assert_eq!(code, Some(0), "{out}");
    for want in [
        "security.protocol=sasl_plaintext",
        "sasl.mechanisms=SCRAM-SHA-256",
        "sasl.username=relay",
        "sasl.password=****",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
    assert!(!out.contains(SCRAM_PASSWORD) && !out.contains(PASSWORD), "{out}");

    let mut d = Outboxd::spawn_streaming(&args(&["run", "--debezium-config", &file, "--metrics-addr", "127.0.0.1:0"]));
    insert(&pg, "dbz.v1", 10);
    let got = consume_with(&sasl_client(&t), "dbz.v1.events", 10, Duration::from_secs(60));
    assert_eq!(got.len(), 10, "{}", d.log());
    d.stop_cleanly();
    assert!(!d.log().contains(SCRAM_PASSWORD), "{}", d.log());
}

#[test]
fn every_compression_codec_delivers() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    for codec in ["zstd", "gzip", "snappy", "lz4"] {
        let slot = format!("c_{codec}");
        let mut d = Outboxd::spawn_streaming(&daemon_args(
            &pg,
            &broker,
            &["--slot", &slot, "--kafka-property", &format!("compression.type={codec}")],
        ));
        let ty = format!("codec.{codec}");
        insert(&pg, &ty, 40);
        let got = broker.consume_all(&format!("{ty}.events"), 1, 40, Duration::from_secs(60));
        assert_eq!(got.len(), 40, "compression.type={codec}:\n{}\n{}", d.log(), broker.log());
        d.stop_cleanly();
    }
}
