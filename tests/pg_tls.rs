//! PostgreSQL over TLS against a real TLS-only cluster (pg_hba: `hostssl` only), with
//! certificates made in the test: every sslmode, client certificates, channel binding, and the
//! one-line exit-2 errors; plus the conninfo forms, libpq's environment, `.pgpass` and
//! `--postgres-password-file`, none of which may leak the password.

mod common;

use std::time::{Duration, Instant};

use common::pg_tls::CERT_USER;
use common::*;

fn stdout_args(conninfo: &str) -> Vec<String> {
    let mut a = args(&["run", "--sink", "stdout", "--status-interval", "200ms", "--metrics-addr", "127.0.0.1:0"]);
    a.push("--postgres-url".into());
    a.push(conninfo.into());
    a
}

/// Stream one event through a daemon with this conninfo, then stop it cleanly.
fn streams(pg: &PgCluster, conninfo: &str, env: &[(&str, &str)], tag: &str) -> String {
    let mut d = Outboxd::spawn_with_env(&stdout_args(conninfo), env);
    assert!(d.wait_for_streaming(Duration::from_secs(30)), "{conninfo}: did not stream:\n{}", d.log());
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'k', '{tag}', '{{}}')"
    ));
    let topic = format!("\"topic\":\"{tag}.events\"");
    assert!(wait_until(Duration::from_secs(15), || d.log().contains(&topic)), "{conninfo}: no event:\n{}", d.log());
    d.stop_cleanly();
    d.log()
}

/// The daemon exits 2 within 10 s with one error line containing every `want`.
fn exits_2(conninfo: &str, want: &[&str]) -> String {
    let t0 = Instant::now();
    let (code, out) = run_to_exit(&stdout_args(conninfo), Duration::from_secs(20));
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}:\n{out}", t0.elapsed());
    assert_eq!(code, Some(2), "{conninfo}: expected exit 2:\n{out}");
    let line =
        out.lines().find(|l| l.starts_with("outboxd: error:")).unwrap_or_else(|| panic!("no error line:\n{out}"));
    for w in want {
        assert!(line.contains(w), "error line lacks {w:?}: {line}");
    }
    assert!(!line.contains(PASSWORD), "password in the error: {line}");
    out
}

#[test]
fn every_sslmode_behaves_as_libpq_says() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let tls = pg.enable_tls(&PgCluster::hostssl_only_hba());
    let ca = tls.ca_file.display().to_string();
    let wrong = tls.wrong_ca_file.display().to_string();
    let port = pg.port();
    let kv =
        |host: &str, extra: &str| format!("host={host} port={port} dbname=app user={USER} password={PASSWORD} {extra}");

    // verify-full with the right CA and the certificate's name streams (both connections).
    streams(&pg, &kv("localhost", &format!("sslmode=verify-full sslrootcert={ca}")), &[], "full.v1");
    // The wrong CA, and a host name the certificate does not list: exit 2, named and explained.
    exits_2(
        &kv("localhost", &format!("sslmode=verify-full sslrootcert={wrong}")),
        &[&format!("localhost:{port}"), "sslmode=verify-full", "sslrootcert="],
    );
    exits_2(
        &kv("127.0.0.1", &format!("sslmode=verify-full sslrootcert={ca}")),
        &[&format!("127.0.0.1:{port}"), "sslmode=verify-full", "verify-ca"],
    );
    // verify-ca checks the chain only, so the mismatch is fine; require without a CA works.
    streams(&pg, &kv("127.0.0.1", &format!("sslmode=verify-ca sslrootcert={ca}")), &[], "ca.v1");
    streams(&pg, &kv("127.0.0.1", "sslmode=require"), &[("HOME", "/nonexistent")], "req.v1");
    // require with a root certificate behaves as verify-ca: the wrong CA fails.
    exits_2(&kv("127.0.0.1", &format!("sslmode=require sslrootcert={wrong}")), &["sslmode=require", "sslrootcert="]);
    // prefer (the default) really uses TLS: this server takes hostssl logins only.
    streams(&pg, &kv("127.0.0.1", ""), &[("HOME", "/nonexistent")], "prefer.v1");
    // disable: pg_hba refuses the plaintext login, and the message says what to change.
    exits_2(&kv("127.0.0.1", "sslmode=disable"), &["only over TLS", "sslmode=require"]);
    // sslrootcert=FILE trusts that file only, as libpq does: a CA the system store trusts (here
    // through SSL_CERT_FILE, which OpenSSL's default paths read) does not vouch for the server.
    let mut d = Outboxd::spawn_with_env(
        &stdout_args(&kv("localhost", &format!("sslmode=verify-full sslrootcert={wrong}"))),
        &[("SSL_CERT_FILE", ca.as_str())],
    );
    let code = d.wait_exit(Duration::from_secs(20)).and_then(|s| s.code());
    assert_eq!(code, Some(2), "the system store's CA was trusted beside sslrootcert:\n{}", d.log());
    assert!(d.log().contains("sslrootcert="), "{}", d.log());
}

#[test]
fn client_certificates_and_channel_binding() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let tls = pg.enable_tls(&PgCluster::hostssl_only_hba());
    let ca = tls.ca_file.display().to_string();
    let port = pg.port();
    // pg_hba `cert`: no password at all, the certificate's CN is the role.
    let cert = format!(
        "host=localhost port={port} dbname=app user={CERT_USER} sslmode=verify-full sslrootcert={ca} sslcert={} sslkey={}",
        tls.client_cert.display(),
        tls.client_key.display()
    );
    streams(&pg, &cert, &[], "cert.v1");
    // Without the client certificate, the same login is refused.
    let (code, out) = run_to_exit(
        &stdout_args(&format!(
            "host=localhost port={port} dbname=app user={CERT_USER} sslmode=verify-full sslrootcert={ca}"
        )),
        Duration::from_secs(20),
    );
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("certificate"), "{out}");

    // SCRAM-SHA-256-PLUS: channel_binding=require works over TLS...
    let scram = format!(
        "host=localhost port={port} dbname=app user={USER} password={PASSWORD} sslmode=verify-full sslrootcert={ca} channel_binding=require"
    );
    streams(&pg, &scram, &[], "plus.v1");
    // ...and is enforced: an md5 login cannot satisfy it (md5 user over TLS via a relaxed hba).
    pg.set_hba(&format!(
        "local all all trust\nlocal replication all trust\nhostssl all {MD5_USER} 127.0.0.1/32 md5\n\
         hostssl replication {MD5_USER} 127.0.0.1/32 md5\n"
    ));
    exits_2(
        &format!(
            "host=localhost port={port} dbname=app user={MD5_USER} password={MD5_PASSWORD} sslmode=verify-full sslrootcert={ca} channel_binding=require"
        ),
        &["channel_binding=require"],
    );
}

/// The replication connection negotiates TLS itself (not through tokio-postgres): check its
/// failures directly, the way a session's reconnect meets them.
#[test]
fn replication_connection_tls_failures_are_definite() {
    let pg = PgCluster::start();
    let tls = pg.enable_tls(&PgCluster::hostssl_only_hba());
    let port = pg.port();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let connect = |conninfo: String| {
        let t = outboxd::config::PgTarget::parse(&conninfo).expect("conninfo");
        rt.block_on(outboxd::pg::replication::ReplicationConn::connect(&t)).map(|c| c.backend_pid())
    };
    let base = format!("host=localhost port={port} dbname=app user={USER} password={PASSWORD}");
    let ok =
        connect(format!("{base} sslmode=verify-full sslrootcert={} channel_binding=require", tls.ca_file.display()));
    assert!(ok.as_ref().is_ok_and(|pid| pid.is_some()), "{:?}", ok.err());
    for (extra, want) in [
        (format!("sslmode=verify-full sslrootcert={}", tls.wrong_ca_file.display()), "sslrootcert="),
        ("sslmode=disable".to_string(), "only over TLS"),
    ] {
        let e = connect(format!("{base} {extra}")).expect_err(&extra);
        assert!(!e.is_transient(), "{extra}: {e}");
        assert!(e.to_string().contains(want), "{extra}: {e}");
    }
    let e = connect(format!(
        "host=127.0.0.1 port={port} dbname=app user={USER} password={PASSWORD} sslmode=verify-full sslrootcert={}",
        tls.ca_file.display()
    ))
    .expect_err("mismatch");
    assert!(e.to_string().contains("sslmode=verify-full") && e.to_string().contains("verify-ca"), "{e}");
}

#[test]
fn conninfo_forms_environment_pgpass_and_password_file() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let port = pg.port().to_string();
    let dir = tempfile::tempdir().unwrap();

    // key/value conninfo, password in it.
    let log = streams(&pg, &pg.conninfo(USER, &format!("password={PASSWORD} sslmode=disable")), &[], "kv.v1");
    assert!(!log.contains(PASSWORD), "password leaked:\n{log}");

    // Nothing but libpq's environment.
    let env = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", port.as_str()),
        ("PGUSER", USER),
        ("PGDATABASE", "app"),
        ("PGPASSWORD", PASSWORD),
        ("PGSSLMODE", "disable"),
        ("PGAPPNAME", "outboxd-env"),
    ];
    let mut a = stdout_args("");
    a.truncate(a.len() - 2);
    let mut d = Outboxd::spawn_with_env(&a, &env);
    assert!(d.wait_for_streaming(Duration::from_secs(30)), "{}", d.log());
    let app = pg.psql("SELECT count(*) FROM pg_stat_replication WHERE application_name = 'outboxd-env'");
    assert_eq!(app, "1", "PGAPPNAME not used");
    d.stop_cleanly();
    assert!(!d.log().contains(PASSWORD), "password leaked:\n{}", d.log());

    // A .pgpass (via PGPASSFILE), mode 0600.
    let pass = dir.path().join("pgpass");
    std::fs::write(&pass, format!("127.0.0.1:{port}:app:{USER}:{PASSWORD}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(0o600)).unwrap();
    let p = pass.display().to_string();
    let log = streams(&pg, &pg.conninfo(USER, "sslmode=disable"), &[("PGPASSFILE", &p)], "pgpass.v1");
    assert!(!log.contains(PASSWORD), "password leaked:\n{log}");

    // --postgres-password-file, with the trailing newline `echo` leaves; `outboxd config` shows
    // the file, never the password.
    let pwf = dir.path().join("pw");
    std::fs::write(&pwf, format!("{PASSWORD}\n")).unwrap();
    let url = format!("postgres://{USER}@127.0.0.1:{port}/app?sslmode=disable");
    let mut a = stdout_args(&url);
    a.extend(args(&["--postgres-password-file", &pwf.display().to_string()]));
    let mut d = Outboxd::spawn(&a);
    assert!(d.wait_for_streaming(Duration::from_secs(30)), "{}", d.log());
    d.stop_cleanly();
    a[0] = "config".into();
    let (code, out) = run_to_exit(&a, Duration::from_secs(10));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("--postgres-password-file") && !out.contains(PASSWORD), "{out}");
    // Without any password source the login fails with a message naming all of them.
    let (code, out) = run_to_exit(&stdout_args(&url), Duration::from_secs(20));
    assert_ne!(code, Some(0));
    assert!(out.contains("--postgres-password-file") && out.contains("~/.pgpass"), "{out}");
}
