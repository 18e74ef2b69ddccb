//! `outboxd status` classes a failed catalog query by its SQLSTATE, as the daemon does: a query
//! the server cancels (57014, our own `statement_timeout`) is a transient PostgreSQL error that
//! names its code, not a set-up error. The exit code stays 1 either way (docs/src/flags.md).
//!
//! The cancel is real: another session holds an ACCESS EXCLUSIVE lock on `pg_publication`, so
//! status's read of it waits until its statement timeout fires.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn a_cancelled_catalog_query_is_transient_with_its_sqlstate() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.apply_sql_file(sql_dir().join("04_publication.sql"));

    let psql = {
        let b = pg_bindir().join("psql");
        if b.exists() {
            b
        } else {
            "psql".into()
        }
    };
    let mut holder = Command::new(psql)
        .arg("-X")
        .arg("-h")
        .arg(pg.socket_dir())
        .args(["-p", &pg.port().to_string(), "-U", "postgres", "-d", DB])
        .args([
            "-c",
            "BEGIN; LOCK TABLE pg_catalog.pg_publication IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(60); COMMIT;",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn psql");
    let deadline = Instant::now() + Duration::from_secs(20);
    while pg.psql(
        "SELECT count(*) FROM pg_locks WHERE relation = 'pg_catalog.pg_publication'::regclass \
         AND mode = 'AccessExclusiveLock' AND granted",
    ) != "1"
    {
        assert!(Instant::now() < deadline, "the lock on pg_publication was never taken");
        std::thread::sleep(Duration::from_millis(100));
    }

    let url = pg.url();
    let (code, out) = run_to_exit(&args(&["status", "--postgres-url", &url]), Duration::from_secs(50));
    let _ = holder.kill();
    let _ = holder.wait();

    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("reading pg_publication"), "{out}");
    assert!(out.contains("PostgreSQL reported 57014"), "a cancelled query is transient, with its SQLSTATE:\n{out}");
    assert!(!out.contains("db error"), "the server's own message, not the driver's wrapper:\n{out}");
    assert!(!out.contains(PASSWORD), "{out}");
}
