//! Kafka on production networks, against Apache Kafka's own listeners: TLS with server
//! authentication and with client certificates (mutual TLS), SASL/PLAIN, SCRAM-SHA-256 and -512,
//! OAUTHBEARER (Kafka's unsecured JWS, for tests) over plaintext and over TLS, a Debezium
//! connector JSON whose credentials come from `${file:…}`, and every compression codec read back
//! by a consumer. A bad CA, a missing client certificate or a wrong password must fail visibly
//! with one log line and confirm nothing; secrets never reach the log or `outboxd config`.

mod common;

use std::time::Duration;

use common::certs::TestCa;
use common::secure_kafka::{client_config, consume_with};
use common::*;

const SCRAM_USER: &str = "relay";
const SCRAM_PASSWORD: &str = "scr4m-Pa55word-xyzzy";

fn insert(pg: &PgCluster, event_type: &str, n: usize) {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'sec', 'agg-' || (g % 3), '{event_type}', jsonb_build_object('n', g) FROM generate_series(1, {n}) g"
    ));
}

fn confirmed_below(pg: &PgCluster, lsn: &str) -> bool {
    pg.psql(&format!(
        "SELECT coalesce(confirmed_flush_lsn < '{lsn}'::pg_lsn, true) FROM pg_replication_slots WHERE slot_name = 'outboxd'"
    )) == "t"
}

fn slot_reaches(pg: &PgCluster, lsn: &str) -> bool {
    wait_until(Duration::from_secs(30), || {
        pg.psql(&format!(
            "SELECT confirmed_flush_lsn >= '{lsn}'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        )) == "t"
    })
}

fn run_args(pg: &PgCluster, bootstrap: &str, extra: &[&str]) -> Vec<String> {
    let mut a = daemon_args_pg_only(pg, extra);
    a.extend(args(&["--kafka-brokers", bootstrap]));
    a
}

fn props(list: &[(&str, String)]) -> Vec<String> {
    list.iter().flat_map(|(k, v)| ["--kafka-property".to_string(), format!("{k}={v}")]).collect()
}

fn outbox_pg() -> PgCluster {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg
}

/// Runs outboxd on `bootstrap` with `client` properties, inserts 30 events of `ty`, and checks
/// that all 30 arrive (read back on the harness's own listener) and the slot passes them.
fn delivers(pg: &PgCluster, broker: &Broker, bootstrap: &str, client: &[(&str, String)], ty: &str) -> Outboxd {
    let a = [run_args(pg, bootstrap, &[]), props(client)].concat();
    let d = Outboxd::spawn_streaming(&a);
    insert(pg, ty, 30);
    let end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    let got = broker.consume_all(&format!("{ty}.events"), 1, 30, Duration::from_secs(60));
    assert_eq!(got.len(), 30, "{}\n{}", d.log(), broker.log());
    let mut ns: Vec<i64> = got.iter().map(|r| r.payload_json()["n"].as_i64().unwrap()).collect();
    ns.sort();
    assert_eq!(ns, (1..=30).collect::<Vec<_>>());
    assert!(slot_reaches(pg, &end), "slot never caught up to {end}:\n{}", d.log());
    d
}

/// Runs outboxd with `client` properties that the broker must refuse: a log line containing one
/// of `needles` within 30 s, nothing confirmed past the events, nothing on the topic, no secret
/// in the log.
fn refused(
    pg: &PgCluster,
    broker: &Broker,
    bootstrap: &str,
    client: &[(&str, String)],
    needles: &[&str],
    secret: &str,
) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let a = [run_args(pg, bootstrap, &["--status-interval", "200ms", "--metrics-addr", &addr]), props(client)].concat();
    let mut d = Outboxd::spawn_streaming(&a);
    insert(pg, "refused.v1", 5);
    // The commit record of the refused events ends at or before this position. The slot may move
    // inside the transaction (a walsender keepalive carries the WAL end it decoded so far, before
    // the commit is decoded and sent), which is safe: PostgreSQL replays a transaction whose commit
    // lies past confirmed_flush_lsn. It must never reach the end of the transaction.
    let commit_end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    let seen = wait_until(Duration::from_secs(30), || needles.iter().any(|n| d.log().contains(n)));
    assert!(seen, "no log line names the failure ({needles:?}):\n{}", d.log());
    std::thread::sleep(Duration::from_secs(3));
    let confirmed = pg.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'");
    assert!(
        confirmed_below(pg, &commit_end),
        "slot confirmed {confirmed}, past refused events ending at {commit_end}:\n{}",
        d.log()
    );
    let ready = http_get(port, "/readyz").map(|(code, _)| code);
    assert!(ready.is_some_and(|c| c != 200), "/readyz must not be ready while Kafka refuses us: {ready:?}");
    assert!(d.is_running(), "outboxd must keep retrying, not exit:\n{}", d.log());
    assert!(
        broker.partition_count("refused.v1.events").is_none()
            || broker.consume_all("refused.v1.events", 1, 1, Duration::from_secs(5)).is_empty()
    );
    assert!(secret.is_empty() || !d.log().contains(secret), "the secret is in the log:\n{}", d.log());
}

fn tls_props(broker: &Broker) -> Vec<(&'static str, String)> {
    vec![("security.protocol", "ssl".into()), ("ssl.ca.location", broker.tls_file("ca.pem").display().to_string())]
}

#[test]
fn tls_with_the_right_ca_delivers_every_event() {
    let pg = outbox_pg();
    let broker = Broker::options().listener("ssl").start();
    let mut d = delivers(&pg, &broker, &broker.bootstrap(), &tls_props(&broker), "tls.v1");
    d.stop_cleanly();
}

#[test]
fn tls_with_a_wrong_ca_fails_clearly_and_confirms_nothing() {
    let pg = outbox_pg();
    let broker = Broker::options().listener("ssl").start();
    let dir = tempfile::tempdir().unwrap();
    let wrong = TestCa::new("some other CA").write_ca(dir.path(), "wrong-ca.pem");
    let client = [("security.protocol", "ssl".to_string()), ("ssl.ca.location", wrong.display().to_string())];
    refused(&pg, &broker, &broker.bootstrap(), &client, &["certificate verify failed"], "");
}

#[test]
fn mutual_tls_with_a_client_certificate_delivers_and_without_one_is_refused() {
    let pg = outbox_pg();
    let broker = Broker::options().listener("ssl").mtls().start();
    let mut with_cert = tls_props(&broker);
    with_cert.push(("ssl.certificate.location", broker.tls_file("client.pem").display().to_string()));
    with_cert.push(("ssl.key.location", broker.tls_file("client.key").display().to_string()));
    let mut d = delivers(&pg, &broker, &broker.bootstrap(), &with_cert, "mtls.v1");
    d.stop_cleanly();
    pg.psql("SELECT pg_drop_replication_slot('outboxd')");
    // No client certificate: the broker ends the handshake.
    refused(
        &pg,
        &broker,
        &broker.bootstrap(),
        &tls_props(&broker),
        &["alert bad certificate", "certificate required", "SSL handshake failed"],
        "",
    );
}

fn sasl(mechanism: &str, user: &str, pass: &str, tls: Option<&Broker>) -> Vec<(&'static str, String)> {
    let mut p = vec![
        ("security.protocol", if tls.is_some() { "sasl_ssl" } else { "sasl_plaintext" }.to_string()),
        ("sasl.mechanisms", mechanism.to_string()),
    ];
    if mechanism == "OAUTHBEARER" {
        // librdkafka's unsecured JWS, which the broker's unsecured validator accepts (tests only).
        p.push(("sasl.oauthbearer.config", format!("principal={user}")));
        p.push(("enable.sasl.oauthbearer.unsecure.jwt", "true".into()));
    } else {
        p.push(("sasl.username", user.to_string()));
        p.push(("sasl.password", pass.to_string()));
    }
    if let Some(b) = tls {
        p.push(("ssl.ca.location", b.tls_file("ca.pem").display().to_string()));
    }
    p
}

fn sasl_broker() -> Broker {
    Broker::options()
        .listener("sasl_plaintext")
        .listener("sasl_ssl")
        .user(&format!("{SCRAM_USER}:{SCRAM_PASSWORD}"))
        .start()
}

#[test]
fn every_sasl_mechanism_delivers_over_plaintext_and_tls() {
    let pg = outbox_pg();
    let broker = sasl_broker();
    for (i, mech) in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"].into_iter().enumerate() {
        for tls in [false, true] {
            let (boot, b) = if tls {
                (broker.bootstrap_for("sasl_ssl"), Some(&broker))
            } else {
                (broker.bootstrap_for("sasl_plaintext"), None)
            };
            let slot = format!("s{i}_{tls}");
            let ty = format!("m{i}{}.v1", if tls { "t" } else { "p" });
            let a =
                [run_args(&pg, &boot, &["--slot", &slot]), props(&sasl(mech, SCRAM_USER, SCRAM_PASSWORD, b))].concat();
            let mut d = Outboxd::spawn_streaming(&a);
            insert(&pg, &ty, 20);
            let got = broker.consume_all(&format!("{ty}.events"), 1, 20, Duration::from_secs(60));
            assert_eq!(got.len(), 20, "{mech} tls={tls}:\n{}", d.log());
            d.stop_cleanly();
            assert!(!d.log().contains(SCRAM_PASSWORD), "{mech}: the password is in the log:\n{}", d.log());
        }
    }
}

#[test]
fn scram_with_a_property_file_delivers_and_never_shows_the_password() {
    let pg = outbox_pg();
    let broker = sasl_broker();
    let dir = tempfile::tempdir().unwrap();
    let props_file = dir.path().join("kafka.properties");
    std::fs::write(
        &props_file,
        format!(
            "# outboxd's Kafka credentials\nsecurity.protocol = SASL_PLAINTEXT\nsasl.mechanism: SCRAM-SHA-256\n\
             sasl.username={SCRAM_USER}\nsasl.password={SCRAM_PASSWORD}\n"
        ),
    )
    .unwrap();
    let props_file = props_file.display().to_string();
    let a = run_args(&pg, &broker.bootstrap(), &["--kafka-property-file", &props_file]);

    let mut shown = a.clone();
    shown[0] = "config".into();
    let (code, out) = run_to_exit(&shown, Duration::from_secs(20));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("--kafka-property-file {props_file}")) && !out.contains(SCRAM_PASSWORD), "{out}");
    let (code, out) = run_to_exit(
        &[shown.clone(), args(&["--kafka-property", &format!("sasl.password={SCRAM_PASSWORD}")])].concat(),
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("sasl.password=****") && !out.contains(SCRAM_PASSWORD), "{out}");

    let mut d = Outboxd::spawn_streaming(&a);
    insert(&pg, "scram.v1", 30);
    let creds = sasl("SCRAM-SHA-256", SCRAM_USER, SCRAM_PASSWORD, None);
    let creds: Vec<(&str, &str)> = creds.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let reader = client_config(&broker.bootstrap(), &creds);
    let got = consume_with(&reader, "scram.v1.events", 30, Duration::from_secs(60));
    assert_eq!(got.len(), 30, "{}\n{}", d.log(), broker.log());
    d.stop_cleanly();
    assert!(!d.log().contains(SCRAM_PASSWORD), "the password is in the log:\n{}", d.log());
}

#[test]
fn wrong_credentials_fail_clearly_and_confirm_nothing() {
    let pg = outbox_pg();
    let broker = sasl_broker();
    let wrong = "not-the-Pa55word-plugh";
    for mech in ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] {
        refused(
            &pg,
            &broker,
            &broker.bootstrap(),
            &sasl(mech, SCRAM_USER, wrong, None),
            &["Authentication failed", "SASL authentication error"],
            wrong,
        );
        pg.psql("SELECT pg_drop_replication_slot('outboxd')");
    }
}

#[test]
fn debezium_json_with_scram_jaas_from_a_file_provider_works_end_to_end() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let dir = tempfile::tempdir().unwrap();
    let broker = sasl_broker();
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
            "producer.override.bootstrap.servers": broker.bootstrap(),
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
    let got = broker.consume_all("dbz.v1.events", 1, 10, Duration::from_secs(60));
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
        let mut ns: Vec<i64> = got.iter().map(|r| r.payload_json()["n"].as_i64().unwrap()).collect();
        ns.sort();
        assert_eq!(ns, (1..=40).collect::<Vec<_>>(), "compression.type={codec}: payloads read back");
        let log = broker.log();
        assert!(!log.contains("CorruptRecordException"), "{codec}: {log}");
        d.stop_cleanly();
    }
}
