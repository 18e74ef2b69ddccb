//! `outboxd check` against real servers: a healthy setup passes (exit 0, `--json` parses), and
//! each failure class we can provoke cheaply fails (exit 1) with exactly that check failed and
//! its fix named: wal_level=replica, a role without REPLICATION, a role that must create the
//! publication but does not own the table, a missing column, a publication that does not publish
//! --table, an unreachable broker, a PostgreSQL 12 server. On 17, a held slot names its holder.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

/// Run `outboxd check ARGS --json`; returns the exit code and the parsed report.
fn check_json(args: &[String]) -> (i32, Value) {
    let out = Command::new(outboxd_bin())
        .args(args)
        .arg("--json")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run outboxd check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("--json output does not parse ({e}):\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().expect("exit code"), report)
}

fn check_args(url: &str, brokers: &str, extra: &[&str]) -> Vec<String> {
    let mut a = args(&["check", "--postgres-url", url, "--kafka-brokers", brokers]);
    a.extend(args(extra));
    a
}

/// The checks of `report` with `status`, as (name, detail, fix).
fn with_status(report: &Value, status: &str) -> Vec<(String, String, String)> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["status"] == status)
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (s("name"), s("detail"), s("fix"))
        })
        .collect()
}

/// Exit 1 with exactly one failed check, named `name`, whose detail or fix contains `needle`.
fn assert_only_failure(code: i32, report: &Value, name: &str, needle: &str) {
    let fails = with_status(report, "fail");
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["ok"], false);
    assert_eq!(fails.len(), 1, "expected only {name} to fail: {fails:#?}");
    let (n, detail, fix) = &fails[0];
    assert!(n.starts_with(name), "failed check {n:?}, expected {name:?}");
    assert!(detail.contains(needle) || fix.contains(needle), "{needle:?} not in {detail:?} / {fix:?}");
}

#[test]
fn healthy_setup_passes_and_each_broken_piece_fails_with_its_fix() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.insert_event("order", "o-1", Some("order.paid.v1"), "{}", None);
    pg.psql(
        "CREATE TABLE public.thin (event_id uuid, aggregate_type text, event_type text);\n\
         CREATE PUBLICATION other_pub FOR TABLE public.thin;\n\
         CREATE PUBLICATION outboxd FOR TABLE public.outbox;\n\
         CREATE ROLE plain LOGIN PASSWORD 'plain-pw';\n\
         GRANT SELECT ON public.outbox TO plain;\n\
         CREATE ROLE relay LOGIN REPLICATION PASSWORD 'relay-pw';\n\
         GRANT SELECT ON public.outbox TO relay;",
    );
    let broker = Broker::start();
    let url = pg.url();
    let bootstrap = broker.bootstrap();

    // Healthy: exit 0; the human table ends with the verdict; unlimited WAL retention warns only.
    let out = Command::new(outboxd_bin()).args(check_args(&url, &bootstrap, &[])).output().expect("run check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("check passed"), "{text}");
    assert!(!text.contains(&PASSWORD.to_string()), "the password leaked:\n{text}");
    let (code, report) = check_json(&check_args(&url, &bootstrap, &[]));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["ok"], true);
    assert_eq!(report["failures"], 0);
    let ok: Vec<String> = with_status(&report, "ok").into_iter().map(|c| c.0).collect();
    for name in ["server version", "wal_level", "max_replication_slots", "max_wal_senders", "role REPLICATION", "kafka"]
    {
        assert!(ok.iter().any(|n| n == name), "{name} not ok: {report:#}");
    }
    // The routed topic of the row in the outbox does not exist yet; the broker would create it.
    assert!(ok.iter().any(|n| n == "topic order.paid.v1.events"), "{report:#}");
    // Asked with validate_only: Apache Kafka answers without creating the topic.
    assert!(
        !broker.topics().iter().any(|t| t == "order.paid.v1.events"),
        "check created a topic: {:?}",
        broker.topics()
    );
    eprintln!("{text}");
    let warns = with_status(&report, "warn");
    assert!(warns.iter().any(|w| w.1.contains("unlimited") && w.2.contains("max_slot_wal_keep_size")), "{warns:#?}");
    // The broker's auto-create setting and topic defaults (the test broker: auto-create on, one
    // broker, so one replica: warned).
    let infos = with_status(&report, "info");
    assert!(
        infos.iter().any(|i| i.0 == "kafka broker defaults"
            && i.1.contains("auto.create.topics.enable=true")
            && i.1.contains("get partitions=1, replicas=1")),
        "{infos:#?}"
    );
    assert!(warns.iter().any(|w| w.0 == "kafka topic replicas" && w.1.contains("one replica")), "{warns:#?}");

    // A role without REPLICATION.
    let (code, report) = check_json(&check_args(&pg.url_for("plain", "plain-pw"), &bootstrap, &[]));
    assert_only_failure(code, &report, "role REPLICATION", "ALTER ROLE \"plain\" REPLICATION");

    // A publication that run must create, and a role that does not own the table.
    let (code, report) =
        check_json(&check_args(&pg.url_for("relay", "relay-pw"), &bootstrap, &["--publication", "not_yet"]));
    assert_only_failure(code, &report, "table public.outbox owner", "CREATE PUBLICATION \"not_yet\" FOR TABLE");

    // A table without the key and payload columns (its publication is fine).
    let (code, report) =
        check_json(&check_args(&url, &bootstrap, &["--table", "public.thin", "--publication", "other_pub"]));
    assert_only_failure(code, &report, "table public.thin columns", "no column \"payload\"");

    // A publication that does not publish --table.
    let (code, report) = check_json(&check_args(&url, &bootstrap, &["--publication", "other_pub"]));
    assert_only_failure(
        code,
        &report,
        "publication other_pub",
        "ALTER PUBLICATION \"other_pub\" ADD TABLE \"public\".\"outbox\"",
    );

    // Nothing listens on the broker port.
    let nowhere = format!("127.0.0.1:{}", free_port());
    let (code, report) = check_json(&check_args(&url, &nowhere, &[]));
    assert_only_failure(code, &report, "kafka", "--kafka-brokers");
}

#[test]
fn wal_level_replica_fails_with_the_fix() {
    let pg = PgCluster::start_with(&["wal_level = replica"]);
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let (code, report) = check_json(&check_args(&pg.url(), "127.0.0.1:9", &["--sink", "null"]));
    assert_only_failure(code, &report, "wal_level", "ALTER SYSTEM SET wal_level = logical");
}

#[test]
fn postgres_12_is_an_unsupported_version() {
    let pg = PgCluster::start_version(12);
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let (code, report) = check_json(&check_args(&pg.url(), "127.0.0.1:9", &["--sink", "null"]));
    assert_only_failure(code, &report, "server version", "unsupported version");
}

#[test]
fn on_postgres_17_a_held_slot_names_its_holder_and_failover_facts_are_reported() {
    let pg = PgCluster::start_version(17);
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &["--sink", "null"]));
    let pid = pg.psql("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'outboxd'");
    let app = pg.psql(&format!("SELECT application_name FROM pg_stat_replication WHERE pid = {pid}"));
    let (code, report) = check_json(&check_args(&pg.url(), "127.0.0.1:9", &["--sink", "null"]));
    // A held slot is a warning: run would wait as a standby.
    assert_eq!(code, 0, "{report:#}");
    let warns = with_status(&report, "warn");
    let held = warns.iter().find(|w| w.0 == "slot outboxd active").unwrap_or_else(|| panic!("{report:#}"));
    assert!(
        held.1.contains(&format!("pid {pid}")) && held.1.contains(&format!("application_name {app:?}")),
        "{held:?}"
    );
    let infos = with_status(&report, "info");
    let failover = infos.iter().find(|i| i.0 == "failover slots").unwrap_or_else(|| panic!("{report:#}"));
    assert!(
        failover.1.contains("failover = false") && failover.1.contains("synchronized_standby_slots is empty"),
        "{failover:?}"
    );
    // Asking for a failover slot makes the empty synchronized_standby_slots a warning with its fix.
    let (code, report) = check_json(&check_args(&pg.url(), "127.0.0.1:9", &["--sink", "null", "--slot-failover"]));
    assert_eq!(code, 0, "{report:#}");
    let warns = with_status(&report, "warn");
    let w = warns.iter().find(|w| w.0 == "failover slots").unwrap_or_else(|| panic!("{report:#}"));
    assert!(w.2.contains("synchronized_standby_slots"), "{w:?}");
    d.stop_cleanly();
}

#[test]
fn slot_failover_before_postgres_17_fails_with_the_fix() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let (code, report) = check_json(&check_args(&pg.url(), "127.0.0.1:9", &["--sink", "null", "--slot-failover"]));
    assert_only_failure(code, &report, "failover slots", "remove --slot-failover");
}
