//! The one-shot PostgreSQL tools (`status`, `check`, `schema check --from-table`) class a failure
//! as the daemon does, by SQLSTATE and by type: a server that is down for now (stopped for a
//! restart: the connection is refused) is a transient failure that names the server and says a
//! retry may pass, not a set-up error telling the operator to fix the flags. `check` marks that
//! row `transient` in `--json`. Exit codes stay as documented (1: the tool could not tell).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// The error line of a tool that exited 1: it says the server is not reachable *now*, names it
/// and asks for a retry, without the password.
fn assert_transient_line(out: &str, port: u16) {
    let line =
        out.lines().find(|l| l.starts_with("outboxd: error:")).unwrap_or_else(|| panic!("no error line:\n{out}"));
    assert!(line.contains("is not reachable now"), "not said to be transient:\n{line}");
    assert!(line.contains("retry"), "{line}");
    assert!(line.contains(&format!("127.0.0.1:{port}")), "the server is not named:\n{line}");
    assert!(!line.contains(PASSWORD), "{line}");
}

#[test]
fn a_stopped_server_is_a_transient_failure_for_every_tool() {
    let mut pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let url = pg.url();
    let port = pg.port();
    // Up, status answers (exit 1: no slot yet); the same command against the stopped server is
    // what changes.
    let (code, out) = run_to_exit(&args(&["status", "--postgres-url", &url]), Duration::from_secs(30));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("is missing"), "{out}");
    pg.stop("fast");

    let (code, out) = run_to_exit(&args(&["status", "--postgres-url", &url]), Duration::from_secs(30));
    assert_eq!(code, Some(1), "{out}");
    assert_transient_line(&out, port);

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("order.paid.v1.json"), r#"{"type": "object"}"#).unwrap();
    let schema_dir = dir.path().display().to_string();
    let (code, out) = run_to_exit(
        &args(&["schema", "check", &schema_dir, "--from-table", "--postgres-url", &url]),
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(1), "{out}");
    assert_transient_line(&out, port);

    let out = Command::new(outboxd_bin())
        .args(args(&["check", "--postgres-url", &url, "--sink", "null", "--json"]))
        .env("RUST_LOG", "warn")
        .output()
        .expect("run outboxd check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("({e}):\n{stdout}"));
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let connection = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "connection")
        .unwrap_or_else(|| panic!("no connection check: {report:#}"))
        .clone();
    assert_eq!(connection["status"], "fail", "{connection:#}");
    assert_eq!(connection["transient"], true, "not marked transient: {connection:#}");
    let detail = connection["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("is not reachable now") && detail.contains(&format!("127.0.0.1:{port}")), "{detail}");
    let fix = connection["fix"].as_str().unwrap_or_default();
    assert!(
        fix.contains("again") && !fix.contains("fix the connection flags"),
        "a setup fix for a transient failure: {fix}"
    );
    assert!(!stdout.contains(PASSWORD), "{stdout}");

    // The text table says it too.
    let out = Command::new(outboxd_bin())
        .args(args(&["check", "--postgres-url", &url, "--sink", "null"]))
        .env("RUST_LOG", "warn")
        .output()
        .expect("run outboxd check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("is not reachable now") && text.contains("run `outboxd check` again"), "{text}");

    // Back up, the same commands work: nothing was left behind.
    pg.start_again();
    let (code, out) = run_to_exit(&args(&["status", "--postgres-url", &url]), Duration::from_secs(30));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("is missing") && !out.contains("outboxd: error:"), "{out}");
}

/// The ordinary connection's refusals, decided by type and by what was asked (not by the error's
/// text): each keeps its one line and its class. (`channel_binding=require` against a server that
/// does not bind is tests/pg_tls.rs, `every_sslmode_behaves_as_libpq_says`.)
#[test]
fn ordinary_connection_refusals_keep_their_line_and_class() {
    let mut pg = PgCluster::start();
    let port = pg.port();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let connect = |conninfo: String| {
        let t = outboxd::config::PgTarget::parse(&conninfo).expect("conninfo");
        rt.block_on(outboxd::pg::admin::connect_target(&t)).map(|_| ())
    };
    let base = format!("host=127.0.0.1 port={port} dbname={DB} user={USER}");
    connect(format!("{base} password={PASSWORD} sslmode=disable")).expect("the plain login works");
    for (extra, want) in [
        // The server has no TLS: no handshake began.
        (format!("password={PASSWORD} sslmode=require"), "does not accept TLS (sslmode=require)"),
        // SCRAM asks for a password and none was given (nor PGPASSWORD, nor a password file).
        ("sslmode=disable passfile=/nonexistent".to_owned(), "asks for a password, but none was given"),
    ] {
        let e = connect(format!("{base} {extra}")).expect_err(&extra);
        assert!(!e.is_transient(), "{extra}: {e}");
        assert!(e.to_string().contains(want), "{extra}: {e}");
        assert!(!e.to_string().contains(PASSWORD), "{e}");
    }
    pg.stop("fast");
    let e = connect(format!("{base} password={PASSWORD} sslmode=disable")).expect_err("stopped");
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("cannot reach PostgreSQL at"), "{e}");
}
