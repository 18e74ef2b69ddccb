//! Set-up checks against real servers: each bad set-up ends with its own one-line message, good
//! logins work over every supported auth method, and a busy slot is waited for, not stolen.

mod common;

use std::time::Duration;

use common::*;

const WRONG_PASSWORD: &str = "Not-The-Password-9731";

fn fails_with(args: &[String], want: &str) -> String {
    let (code, out) = run_to_exit(args, Duration::from_secs(30));
    assert_eq!(code, Some(1), "expected exit 1 for {want:?}, got {code:?}:\n{out}");
    let line =
        out.lines().find(|l| l.starts_with("outboxd: error:")).unwrap_or_else(|| panic!("no error line:\n{out}"));
    assert!(line.contains(want), "error line lacks {want:?}: {line}");
    out
}

#[test]
fn wrong_password_is_named_and_never_echoed() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let mut a = daemon_args_pg_only(&pg, &["--sink", "null"]);
    let i = a.iter().position(|x| x == "--postgres-url").unwrap();
    a[i + 1] = format!("postgres://{USER}:{WRONG_PASSWORD}@127.0.0.1:{}/app?sslmode=disable", pg.port());
    let out = fails_with(&a, "password authentication failed");
    assert!(!out.contains(WRONG_PASSWORD), "the password leaked into the output:\n{out}");
}

#[test]
fn wal_level_replica_says_how_to_fix() {
    let pg = PgCluster::start_with(&["wal_level = replica"]);
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let out = fails_with(&daemon_args_pg_only(&pg, &["--sink", "null"]), "wal_level is 'replica'");
    assert!(out.contains("ALTER SYSTEM SET wal_level = logical"), "{out}");
}

#[test]
fn missing_table_and_missing_column() {
    let pg = PgCluster::start();
    fails_with(&daemon_args_pg_only(&pg, &["--sink", "null"]), "table public.outbox does not exist");
    pg.psql(
        "CREATE TABLE outbox (event_id uuid PRIMARY KEY, aggregate_id text, payload jsonb, created_at timestamptz)",
    );
    fails_with(&daemon_args_pg_only(&pg, &["--sink", "null"]), "has no column \"event_type\"");
}

#[test]
fn disabled_autocreate_requires_the_publication() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    fails_with(
        &daemon_args_pg_only(
            &pg,
            &["--sink", "null", "--publication", "absent", "--publication-autocreate", "disabled"],
        ),
        "publication \"absent\" does not exist",
    );
}

#[test]
fn bad_flags_exit_2_with_the_flag_named() {
    let (code, out) = run_to_exit(
        &args(&["run", "--postgres-url", "postgres://u:pw@h/db?sslmode=verify-full"]),
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("sslmode=verify-full needs") && out.contains("sslrootcert=") && !out.contains("u:pw"),
        "{out}"
    );
    let (code, out) = run_to_exit(
        &args(&["run", "--postgres-url", "postgres://h/db", "--status-interval", "soon"]),
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--status-interval"), "{out}");
    // Errors found while building the sink or the endpoint are configuration errors too (issue 23
    // item 15): they exited 1.
    let run_with = |extra: &[&str]| {
        let mut a = args(&["run", "--postgres-url", "postgres://127.0.0.1:1/db", "--kafka-brokers", "127.0.0.1:1"]);
        a.extend(args(extra));
        run_to_exit(&a, Duration::from_secs(10))
    };
    let (code, out) = run_with(&["--metrics-addr", "off", "--kafka-property", "message.max.bytes=lots"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("message.max.bytes must be a number"), "{out}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, out) = run_with(&["--metrics-addr", &addr]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains(&format!("--metrics-addr {addr}: cannot listen")), "{out}");
}

/// md5 and unix-socket logins stream too (SCRAM is what every other test uses).
#[test]
fn md5_and_unix_socket_logins_work() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    for url in [
        format!("postgres://{MD5_USER}:{MD5_PASSWORD}@127.0.0.1:{}/app?sslmode=disable", pg.port()),
        format!("postgres://postgres@/app?host={}&port={}", pg.socket_dir().display(), pg.port()),
    ] {
        let mut a = daemon_args_pg_only(&pg, &["--sink", "stdout", "--status-interval", "200ms"]);
        let i = a.iter().position(|x| x == "--postgres-url").unwrap();
        a[i + 1] = url.clone();
        let mut d = Outboxd::spawn_streaming(&a);
        pg.psql(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'k', 'auth.v1', '{}')",
        );
        assert!(
            wait_until(Duration::from_secs(15), || d.log().contains("\"topic\":\"auth.v1.events\"")),
            "{url}:\n{}",
            d.log()
        );
        d.stop_cleanly();
        assert!(!d.log().contains(MD5_PASSWORD), "password leaked");
        pg.psql("DELETE FROM outbox");
    }
}

#[test]
fn busy_slot_is_waited_for_then_taken_over() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let a = daemon_args_pg_only(&pg, &["--sink", "stdout", "--status-interval", "200ms"]);
    let mut first = Outboxd::spawn_streaming(&a);
    let mut standby = Outboxd::spawn(&a);
    assert!(
        standby.wait_for_log("held by another process", Duration::from_secs(30)),
        "standby did not report the busy slot:\n{}",
        standby.log()
    );
    assert!(standby.is_running(), "standby must keep waiting, not exit:\n{}", standby.log());
    assert!(!streaming_started(&standby.log()), "{}", standby.log());
    // The active instance is never terminated by the standby.
    assert!(first.is_running());
    first.stop_cleanly();
    assert!(standby.wait_for_streaming(Duration::from_secs(30)), "standby never took over:\n{}", standby.log());
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'k', 'takeover.v1', '{}')",
    );
    assert!(wait_until(Duration::from_secs(15), || standby.log().contains("takeover.v1.events")), "{}", standby.log());
}

#[test]
fn lost_slot_is_fatal() {
    let pg = PgCluster::start_with(&["max_slot_wal_keep_size = 1MB"]);
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput')");
    // Write and switch enough WAL that the slot's segments are removed at checkpoint.
    pg.psql("CREATE TABLE filler (x text)");
    for _ in 0..4 {
        pg.psql("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000); SELECT pg_switch_wal(); CHECKPOINT;");
    }
    let status = pg.psql("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'outboxd'");
    assert_eq!(status, "lost", "could not provoke a lost slot");
    fails_with(&daemon_args_pg_only(&pg, &["--sink", "null"]), "wal_status 'lost'");
}
