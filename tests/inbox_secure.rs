//! `outboxd inbox` over secured links, against real Apache Kafka and PostgreSQL: Kafka through a
//! SASL_SSL listener (SCRAM-SHA-512, the broker's certificate checked against its CA) with the
//! credentials in `--kafka-property-file`, and PostgreSQL through a TLS-only cluster (pg_hba:
//! `hostssl` only, SCRAM) with `sslmode=verify-full` and the password in
//! `--postgres-password-file`. Every record arrives once; neither secret shows in the log, the
//! metrics, the status page or the process's arguments and environment (what `ps` shows); wrong
//! Kafka credentials leave the inbox unready, retrying, with a clear line and no secret.

mod common;

use std::time::Duration;

use common::inbox::{inbox_rows, produce_numbered};
use common::*;

const TOPIC: &str = "secure.events";
const SCRAM_USER: &str = "inbox-reader";
const SCRAM_PASSWORD: &str = "Inb0x-scram-Secret-plugh";
const N: usize = 60;

/// A property file with the SASL_SSL settings and `password`.
fn kafka_props(dir: &std::path::Path, broker: &Broker, password: &str) -> String {
    let file = dir.join(format!("kafka-{}.properties", password.len()));
    std::fs::write(
        &file,
        format!(
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username={SCRAM_USER}\n\
             sasl.password={password}\nssl.ca.location={}\n",
            broker.tls_file("ca.pem").display()
        ),
    )
    .unwrap();
    file.display().to_string()
}

/// What `ps` can show of a process: its arguments and its environment.
fn proc_view(pid: u32) -> String {
    let read = |what: &str| {
        std::fs::read(format!("/proc/{pid}/{what}")).map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
    };
    format!("{} {}", read("cmdline").unwrap_or_default(), read("environ").unwrap_or_default())
}

#[test]
fn sasl_ssl_and_postgresql_tls_with_secrets_in_files_deliver_and_never_show_them() {
    let pg = PgCluster::start();
    let tls = pg.enable_tls(&PgCluster::hostssl_only_hba());
    let broker = Broker::options().listener("sasl_ssl").user(&format!("{SCRAM_USER}:{SCRAM_PASSWORD}")).start();
    broker.create_topic(TOPIC, 3);
    let dir = tempfile::tempdir().unwrap();
    let pw_file = dir.path().join("pg-password");
    std::fs::write(&pw_file, format!("{PASSWORD}\n")).unwrap();
    // No password in the URL: it comes from the file. verify-full: the server's name is checked.
    let url = format!(
        "postgres://{USER}@localhost:{}/app?sslmode=verify-full&sslrootcert={}",
        pg.port(),
        tls.ca_file.display()
    );
    let port = free_port();
    let a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--kafka-property-file",
        &kafka_props(dir.path(), &broker, SCRAM_PASSWORD),
        "--postgres-url",
        &url,
        "--postgres-password-file",
        &pw_file.display().to_string(),
        "--topics",
        TOPIC,
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
    ]);
    let mut inbox = Outboxd::spawn(&a);
    let ready = wait_until(Duration::from_secs(60), || http_get(port, "/readyz").map(|(c, _)| c) == Some(200));
    assert!(ready, "never ready:\n{}", inbox.log());
    produce_numbered(&broker, TOPIC, 0..N, |i| format!("k{}", i % 5), None);
    assert!(
        wait_until(Duration::from_secs(60), || inbox_rows(&pg) >= N),
        "{} of {N} rows:\n{}",
        inbox_rows(&pg),
        inbox.log()
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(inbox_rows(&pg), N, "rows beyond the records produced:\n{}", inbox.log());
    let distinct = pg.psql("SELECT count(DISTINCT event_id) FROM public.inbox WHERE event_id ~ '^e[0-9]+$'");
    assert_eq!(distinct.trim(), N.to_string());
    // The inbox's own session to PostgreSQL is encrypted.
    let plain = pg.psql(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
          WHERE a.usename = 'outboxd' AND a.backend_type = 'client backend' AND NOT s.ssl",
    );
    assert_eq!(plain.trim(), "0", "a session of the inbox without TLS");
    let tls_sessions = pg.psql(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.usename = 'outboxd' AND s.ssl",
    );
    assert_ne!(tls_sessions.trim(), "0", "no TLS session of the inbox's user");

    let metrics = http_get(port, "/metrics").map(|(_, b)| b).unwrap_or_default();
    let status = http_get(port, "/status.json").map(|(_, b)| b).unwrap_or_default();
    assert!(metrics.contains("outboxd_inbox"), "no inbox metrics: {metrics}");
    let seen = format!("{}\n{metrics}\n{status}\n{}", inbox.log(), proc_view(inbox.pid().unwrap()));
    for secret in [SCRAM_PASSWORD, PASSWORD] {
        assert!(!seen.contains(secret), "a secret ({} chars) shows:\n{seen}", secret.len());
    }
    inbox.stop_cleanly();
}

#[test]
fn wrong_kafka_credentials_keep_the_inbox_unready_with_a_clear_line_and_no_secret() {
    let pg = PgCluster::start();
    let broker = Broker::options().listener("sasl_ssl").user(&format!("{SCRAM_USER}:{SCRAM_PASSWORD}")).start();
    broker.create_topic(TOPIC, 1);
    let dir = tempfile::tempdir().unwrap();
    let wrong = "Wr0ng-scram-Secret-xyzzy";
    let port = free_port();
    let a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--kafka-property-file",
        &kafka_props(dir.path(), &broker, wrong),
        "--postgres-url",
        &pg.url(),
        "--topics",
        TOPIC,
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
    ]);
    let mut inbox = Outboxd::spawn(&a);
    produce_numbered(&broker, TOPIC, 0..N, |i| format!("k{}", i % 5), None);
    let said = wait_until(Duration::from_secs(60), || {
        let log = inbox.log();
        log.contains("SASL authentication error") || log.contains("Authentication failed")
    });
    assert!(said, "no line names the failed authentication:\n{}", inbox.log());
    std::thread::sleep(Duration::from_secs(2));
    let ready = http_get(port, "/readyz").map(|(c, _)| c);
    assert!(ready.is_some_and(|c| c != 200), "/readyz must not be 200 while Kafka refuses the inbox: {ready:?}");
    assert!(inbox.is_running(), "the inbox must keep retrying, not exit:\n{}", inbox.log());
    assert_eq!(inbox_rows(&pg), 0, "rows arrived through a refused login");
    let seen = format!("{}\n{}", inbox.log(), proc_view(inbox.pid().unwrap()));
    assert!(!seen.contains(wrong) && !seen.contains(SCRAM_PASSWORD), "a secret shows:\n{seen}");
    inbox.stop_cleanly();
}
