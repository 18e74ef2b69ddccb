//! `outboxd status` against real PostgreSQL clusters: a missing slot, a healthy set-up (text and
//! `--json`), a slot that lost its WAL, and that the URL's password never reaches the output.

mod common;

use std::time::Duration;

use common::*;

const TIMEOUT: Duration = Duration::from_secs(30);

fn status(pg: &PgCluster, extra: &[&str]) -> (Option<i32>, String) {
    let url = pg.url();
    let mut a = args(&["status", "--postgres-url", &url]);
    a.extend(extra.iter().map(|s| s.to_string()));
    run_to_exit(&a, TIMEOUT)
}

/// The JSON object in `status --json` output (the harness merges stderr, so skip log lines).
fn json_of(out: &str) -> serde_json::Value {
    let start = out.find("{\n").unwrap_or_else(|| panic!("no JSON object:\n{out}"));
    let end = out.rfind("\n}").expect("end of JSON object") + 2;
    serde_json::from_str(&out[start..end]).unwrap_or_else(|e| panic!("bad JSON ({e}):\n{out}"))
}

/// Whether the text report has the row `key   value` (columns aligned with any spacing).
fn has_row(out: &str, key: &str, value: &str) -> bool {
    out.lines().any(|l| l.trim().split_once(char::is_whitespace).is_some_and(|(k, v)| k == key && v.trim() == value))
}

fn set_up_slot_and_publication(pg: &PgCluster) {
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.apply_sql_file(sql_dir().join("04_publication.sql"));
    pg.psql("SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput')");
}

#[test]
fn missing_slot_exits_1_and_says_so() {
    let pg = PgCluster::start();
    let (code, out) = status(&pg, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("slot \"outboxd\" is missing"), "{out}");
    assert!(out.contains("NOT OK"), "{out}");

    let (code, out) = status(&pg, &["--json"]);
    assert_eq!(code, Some(1), "{out}");
    let j = json_of(&out);
    assert_eq!(j["healthy"], false, "{out}");
    assert_eq!(j["slot"]["exists"], false, "{out}");
    assert!(j["problems"][0].as_str().unwrap().contains("missing"), "{out}");
}

#[test]
fn healthy_slot_exits_0_with_full_report() {
    let pg = PgCluster::start();
    set_up_slot_and_publication(&pg);

    let (code, out) = status(&pg, &[]);
    assert_eq!(code, Some(0), "{out}");
    for (key, value) in
        [("status", "ok"), ("wal_level", "logical"), ("tables", "public.outbox"), ("wal_status", "reserved")]
    {
        assert!(has_row(&out, key, value), "text output lacks {key} = {value}:\n{out}");
    }
    assert!(out.contains("confirmed_flush_lsn") && out.contains("pgoutput"), "{out}");
    assert!(!out.contains("problem:"), "{out}");

    let (code, out) = status(&pg, &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let j = json_of(&out);
    assert_eq!(j["healthy"], true, "{out}");
    assert_eq!(j["slot"]["exists"], true, "{out}");
    assert_eq!(j["slot"]["active"], false, "{out}");
    assert_eq!(j["slot"]["plugin"], "pgoutput", "{out}");
    let lsn = j["slot"]["confirmed_flush_lsn"].as_str().expect("an LSN");
    assert!(lsn.contains('/'), "{lsn}");
    assert!(j["slot"]["lag_bytes"].as_i64().unwrap() >= 0, "{out}");
    assert_eq!(j["server"]["wal_level"], "logical", "{out}");
    assert_eq!(j["publication"]["exists"], true, "{out}");
    assert_eq!(j["publication"]["pubinsert"], true, "{out}");
    let tables = j["publication"]["tables"].as_array().unwrap();
    assert!(tables.iter().any(|t| t == "public.outbox"), "{out}");
}

#[test]
fn password_never_appears_in_output() {
    let pg = PgCluster::start();
    for extra in [&[][..], &["--json"][..]] {
        let (_, out) = status(&pg, extra);
        assert!(!out.contains(PASSWORD), "password leaked:\n{out}");
    }
    // A failed login: the error names the target but not the password.
    let wrong = "Wrong-Status-Pw-4411";
    let url = pg.url_for(USER, wrong);
    let (code, out) = run_to_exit(&args(&["status", "--postgres-url", &url]), TIMEOUT);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("outboxd: error:"), "{out}");
    assert!(!out.contains(wrong), "password leaked:\n{out}");
    // Nothing listening: the same.
    let url = format!("postgres://{USER}:{wrong}@127.0.0.1:{}/app", free_port());
    let (code, out) = run_to_exit(&args(&["status", "--postgres-url", &url]), TIMEOUT);
    assert_eq!(code, Some(1), "{out}");
    assert!(!out.contains(wrong), "password leaked:\n{out}");
}

#[test]
fn lost_slot_exits_1_and_says_why() {
    let pg = PgCluster::start_with(&["max_slot_wal_keep_size = 1MB", "wal_keep_size = 0"]);
    set_up_slot_and_publication(&pg);
    pg.psql("CREATE TABLE filler (x int)");
    // Move the WAL well past the slot's reservation, then let a checkpoint remove it.
    let lost = wait_until(Duration::from_secs(60), || {
        for _ in 0..3 {
            pg.psql("INSERT INTO filler SELECT generate_series(1, 1000)");
            pg.psql("SELECT pg_switch_wal()");
        }
        pg.psql("CHECKPOINT");
        pg.psql("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'outboxd'") == "lost"
    });
    assert!(lost, "could not make the slot lose its WAL");

    let (code, out) = status(&pg, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("wal_status = lost"), "{out}");
    let (code, out) = status(&pg, &["--json"]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(json_of(&out)["slot"]["wal_status"], "lost", "{out}");
}
