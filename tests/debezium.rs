//! `--debezium-config`: an existing connector configuration drives outboxd against the real
//! PostgreSQL and broker, routing as Debezium's EventRouter would; bad files fail at start with
//! messages that say what to change.

mod common;

use std::time::Duration;

use common::*;

/// The seed's connector JSON with its own slot and publication, `replacement`, and the broker.
fn connector_json(pg: &PgCluster, broker: &Broker, replacement: &str) -> String {
    let mut c = common::debezium::seed_connector(pg);
    let cfg = c["config"].as_object_mut().expect("config");
    for (k, v) in [
        ("slot.name", "outbox_dbz".to_owned()),
        ("publication.name", "outbox_pub".into()),
        ("transforms.outbox.route.topic.replacement", replacement.into()),
        ("producer.override.bootstrap.servers", broker.bootstrap()),
        ("producer.override.linger.ms", "2".into()),
    ] {
        cfg.insert(k.into(), v.into());
    }
    c.to_string()
}

fn write(dir: &tempfile::TempDir, name: &str, body: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, body).unwrap();
    p.display().to_string()
}

#[test]
fn seed_shaped_connector_json_routes_like_the_event_router() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "connector.json", &connector_json(&pg, &broker, "${routedByValue}.events"));
    let mut d = Outboxd::spawn_streaming(&args(&["run", "--debezium-config", &file, "--metrics-addr", "127.0.0.1:0"]));
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_at) VALUES \
         ('order', 'o-1', 'order.paid.v1', '{\"total\": 10.50}', '{\"traceId\": \"t-1\"}', '2026-01-01 00:00:01.5+00')",
    );
    let got = broker.consume_all("order.paid.v1.events", 1, 1, Duration::from_secs(30));
    assert_eq!(got.len(), 1, "{}", d.log());
    let r = &got[0];
    let id = pg.psql("SELECT event_id FROM outbox");
    assert_eq!(r.key_str().as_deref(), Some("o-1"));
    assert_eq!(r.payload.as_deref(), Some(&b"{\"total\": 10.50}"[..]));
    assert_eq!(r.header_str("id"), Some(id));
    assert_eq!(r.header_str("aggregate_type").as_deref(), Some("order"));
    assert_eq!(r.header_str("aggregate_id").as_deref(), Some("o-1"));
    assert_eq!(r.header_str("event_type").as_deref(), Some("order.paid.v1"));
    // Debezium places the whole jsonb column as one header; ours is its JSON text.
    assert_eq!(r.header_str("headers").as_deref(), Some("{\"traceId\": \"t-1\"}"));
    // A Debezium file does not turn on our headers expansion: no `traceId` header.
    assert_eq!(r.header_str("traceId"), None);
    assert_eq!(r.timestamp_ms, Some(1_767_225_601_500));
    // The file's slot and publication were used.
    assert_eq!(pg.psql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'outbox_dbz'"), "1");
    assert_eq!(pg.psql("SELECT count(*) FROM pg_publication WHERE pubname = 'outbox_pub'"), "1");
    let log = d.log();
    assert!(!log.contains(PASSWORD), "the password leaked into the log:\n{log}");
    assert!(log.contains("database.server.name does not apply"), "{log}");
    d.stop_cleanly();
}

#[test]
fn explicit_flags_override_the_file() {
    let pg = PgCluster::start();
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "c.json", &connector_json(&pg, &broker, "${routedByValue}.events"));
    let (code, out) = run_to_exit(
        &args(&["config", "--debezium-config", &file, "--slot", "flag_slot", "--route-by-field", "aggregate_type"]),
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("--slot flag_slot"), "{out}");
    assert!(out.contains("--route-by-field aggregate_type"), "{out}");
    assert!(out.contains("--publication outbox_pub"), "{out}");
    assert!(out.contains(":****@127.0.0.1"), "password must be masked: {out}");
    assert!(!out.contains(PASSWORD), "{out}");
}

#[test]
fn seed_replacement_group_error_lists_defined_groups() {
    let pg = PgCluster::start();
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    // The seed's connector uses `${r}` with the default regex, which defines only routedByValue.
    let file = write(&dir, "seed.json", &connector_json(&pg, &broker, "${r}.events"));
    let (code, out) = run_to_exit(&args(&["run", "--debezium-config", &file]), Duration::from_secs(10));
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("${r}") && out.contains("defined groups: ${routedByValue}"), "{out}");
}

#[test]
fn unknown_keys_warn_once_and_unsupported_values_fail() {
    let dir = tempfile::tempdir().unwrap();
    let props = "debezium.sink.type=kafka\n\
                 debezium.sink.kafka.producer.bootstrap.servers=127.0.0.1:1\n\
                 debezium.source.database.hostname=127.0.0.1\n\
                 debezium.source.database.user=u\n\
                 debezium.source.database.password=Hidden-Pw-77\n\
                 debezium.source.database.dbname=app\n\
                 debezium.source.custom.one=1\n\
                 debezium.source.custom.two=2\n";
    let file = write(&dir, "application.properties", props);
    let (code, out) = run_to_exit(&args(&["config", "--debezium-config", &file]), Duration::from_secs(10));
    assert_eq!(code, Some(0), "{out}");
    let warnings: Vec<&str> = out.lines().filter(|l| l.contains("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{out}");
    assert!(warnings[0].contains("custom.one") && warnings[0].contains("custom.two"), "{out}");
    assert!(!out.contains("Hidden-Pw-77"), "{out}");

    for (extra, want) in [
        ("debezium.source.plugin.name=decoderbufs\n", "plugin.name=pgoutput"),
        (
            "debezium.transforms=x\ndebezium.transforms.x.type=org.example.Other\n",
            "implements only io.debezium.transforms.outbox.EventRouter",
        ),
        ("debezium.source.snapshot.mode=exported\n", "use never"),
    ] {
        let file = write(&dir, "bad.properties", &format!("{props}{extra}"));
        let (code, out) = run_to_exit(&args(&["run", "--debezium-config", &file]), Duration::from_secs(10));
        assert_eq!(code, Some(2), "{extra}: {out}");
        assert!(out.contains(want), "{extra}: {out}");
        assert!(!out.contains("Hidden-Pw-77"), "{out}");
    }
}

#[test]
fn initial_snapshot_of_a_non_empty_outbox_is_refused() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', '1', 'x', '{}')");
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let mut v: serde_json::Value =
        serde_json::from_str(&connector_json(&pg, &broker, "${routedByValue}.events")).unwrap();
    v["config"]["snapshot.mode"] = "initial".into();
    let file = write(&dir, "c.json", &v.to_string());
    let (code, out) =
        run_to_exit(&args(&["run", "--debezium-config", &file, "--metrics-addr", "off"]), Duration::from_secs(20));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("snapshot.mode=never"), "{out}");
}
