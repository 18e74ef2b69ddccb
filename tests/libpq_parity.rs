//! The PostgreSQL connections pick servers, passwords and channel-binding data as libpq does,
//! against a real cluster: each case first shows the machine's libpq (psql) connecting with the
//! same conninfo, then outboxd streaming an event with it.
//!
//! * `connect_timeout` bounds each host on its own, so a first host that drops packets (a
//!   listener whose accept queue is full: Linux drops further SYNs, no RST) costs one timeout;
//! * the password file is looked up for each host, and a Unix socket directory other than the
//!   default one matches its own path there, not `localhost`;
//! * an empty `hostaddr` entry leaves its host to be reached by name;
//! * `tls-server-end-point` hashes an RSA-PSS certificate with the digest its signature names.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// A 127.0.0.1 port that drops connection attempts: a listener that never accepts, whose one-slot
/// accept queue is full. Connecting to it hangs in SYN_SENT, as to a host that is gone.
struct Blackhole {
    port: u16,
    _listener: socket2::Socket,
    _queued: Vec<TcpStream>,
}

impl Blackhole {
    fn new() -> Blackhole {
        use socket2::{Domain, Socket, Type};
        let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        l.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
        l.listen(0).unwrap();
        let addr = l.local_addr().unwrap().as_socket().unwrap();
        let mut queued = Vec::new();
        while let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            queued.push(s);
            assert!(queued.len() < 8, "the accept queue does not fill; the kernel accepts more than its backlog");
        }
        // It really drops: a further connection neither completes nor is refused.
        let e = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        Blackhole { port: addr.port(), _listener: l, _queued: queued }
    }
}

/// The machine's libpq connects with `conninfo` (and `env`), within `within`.
fn libpq_connects(conninfo: &str, env: &[(&str, &str)], within: Duration) {
    let psql = pg_bindir().join("psql");
    let mut c = Command::new(if psql.exists() { psql } else { "psql".into() });
    c.args(["-X", "-At", "-c", "SELECT 1", conninfo]).env_remove("PGPASSWORD").env_remove("PGSERVICE");
    for (k, v) in env {
        c.env(k, v);
    }
    let t0 = Instant::now();
    let out = c.output().expect("psql runs");
    assert!(out.status.success(), "libpq did not connect with {conninfo}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(t0.elapsed() < within, "libpq took {:?} with {conninfo}", t0.elapsed());
}

/// outboxd streams with `conninfo` (and `env`) within `within`, and an event gets through.
fn outboxd_streams(pg: &PgCluster, conninfo: &str, env: &[(&str, &str)], within: Duration, tag: &str) {
    let mut a = args(&["run", "--sink", "stdout", "--status-interval", "200ms", "--metrics-addr", "127.0.0.1:0"]);
    a.extend(["--postgres-url".to_owned(), conninfo.to_owned()]);
    let mut env = env.to_vec();
    env.push(("PGPASSWORD", ""));
    let t0 = Instant::now();
    let mut d = Outboxd::spawn_with_env(&a, &env);
    assert!(d.wait_for_streaming(within), "did not stream within {within:?} with {conninfo}:\n{}", d.log());
    eprintln!("{tag}: streaming after {:?}", t0.elapsed());
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'k', '{tag}', '{{}}')"
    ));
    let topic = format!("\"topic\":\"{tag}.events\"");
    assert!(wait_until(Duration::from_secs(15), || d.log().contains(&topic)), "no event:\n{}", d.log());
    assert!(!d.log().contains(PASSWORD), "the password is in the log");
    d.stop_cleanly();
}

fn cluster() -> PgCluster {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg
}

/// A password file (mode 0600, as libpq wants) with `lines`, in `dir`.
fn passfile(dir: &Path, lines: &[String]) -> String {
    let f = dir.join("pgpass");
    std::fs::write(&f, lines.join("\n") + "\n").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    f.display().to_string()
}

#[test]
fn a_first_host_that_drops_packets_costs_one_connect_timeout() {
    let pg = cluster();
    let dead = Blackhole::new();
    let url = format!(
        "postgres://{USER}:{PASSWORD}@127.0.0.1:{},127.0.0.1:{}/{DB}?connect_timeout=2&sslmode=disable",
        dead.port,
        pg.port()
    );
    libpq_connects(&url, &[], Duration::from_secs(6));
    // The admin connection and the walsender each spend one timeout on the dead host.
    outboxd_streams(&pg, &url, &[], Duration::from_secs(15), "dropped.v1");
}

#[test]
fn the_password_file_is_read_for_each_host() {
    let pg = cluster();
    let closed = free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = passfile(
        dir.path(),
        &[format!("127.0.0.1:{closed}:*:*:the-old-primary-s"), format!("127.0.0.1:{}:*:*:{PASSWORD}", pg.port())],
    );
    let conninfo = format!(
        "host=127.0.0.1,127.0.0.1 port={closed},{} user={USER} dbname={DB} sslmode=disable connect_timeout=2",
        pg.port()
    );
    let env = [("PGPASSFILE", file.as_str())];
    libpq_connects(&conninfo, &env, Duration::from_secs(6));
    outboxd_streams(&pg, &conninfo, &env, Duration::from_secs(15), "perhost.v1");
}

#[test]
fn only_the_default_socket_directory_is_localhost_in_the_password_file() {
    let pg = cluster();
    // Passwords over the Unix socket too (the harness's own psql stays trusted as postgres).
    pg.set_hba(
        "local all postgres trust\nlocal all all scram-sha-256\nlocal replication all scram-sha-256\n\
         host all all 127.0.0.1/32 scram-sha-256\nhost replication all 127.0.0.1/32 scram-sha-256\n",
    );
    let sock = pg.socket_dir().display().to_string();
    let port = pg.port();
    let dir = tempfile::tempdir().unwrap();
    let file =
        passfile(dir.path(), &[format!("localhost:{port}:*:*:not-this-one"), format!("{sock}:{port}:*:*:{PASSWORD}")]);
    let conninfo = format!("host={sock} port={port} user={USER} dbname={DB}");
    let env = [("PGPASSFILE", file.as_str())];
    libpq_connects(&conninfo, &env, Duration::from_secs(6));
    outboxd_streams(&pg, &conninfo, &env, Duration::from_secs(15), "socket.v1");
}

#[test]
fn an_empty_hostaddr_entry_reaches_its_host_by_name() {
    let pg = cluster();
    let closed = free_port();
    let conninfo = format!(
        "host=localhost,localhost hostaddr=127.0.0.1, port={closed},{} user={USER} password={PASSWORD} dbname={DB} \
         sslmode=disable connect_timeout=2",
        pg.port()
    );
    libpq_connects(&conninfo, &[], Duration::from_secs(6));
    outboxd_streams(&pg, &conninfo, &[], Duration::from_secs(15), "hostaddr.v1");
}

#[test]
fn channel_binding_with_an_rsa_pss_certificate_uses_its_digest() {
    let pg = cluster();
    let dir = pg.socket_dir().join("pss");
    std::fs::create_dir_all(&dir).unwrap();
    let (crt, key) = (dir.join("server.crt"), dir.join("server.key"));
    // SHA-384 in the signature's parameters: hashing with SHA-256 (the rule for digest-less
    // OIDs) would not match what the server binds.
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa-pss", "-pkeyopt", "rsa_keygen_bits:2048"])
        .args(["-pkeyopt", "rsa_pss_keygen_md:sha384", "-pkeyopt", "rsa_pss_keygen_mgf1_md:sha384", "-sha384"])
        .args(["-nodes", "-days", "2", "-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .expect("openssl runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = Command::new("openssl").args(["x509", "-noout", "-text", "-in"]).arg(&crt).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("rsassaPss") && text.contains("Hash Algorithm: sha384"), "{text}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0 {
        assert!(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().unwrap().success());
    }
    for sql in [
        format!("ALTER SYSTEM SET ssl_cert_file = '{}'", crt.display()),
        format!("ALTER SYSTEM SET ssl_key_file = '{}'", key.display()),
        "ALTER SYSTEM SET ssl = on".to_owned(),
    ] {
        pg.psql(&sql);
    }
    pg.set_hba(
        "local all all trust\nlocal replication all trust\n\
         hostssl all all 127.0.0.1/32 scram-sha-256\nhostssl replication all 127.0.0.1/32 scram-sha-256\n",
    );
    let conninfo = pg.conninfo(USER, &format!("password={PASSWORD} sslmode=require channel_binding=require"));
    libpq_connects(&conninfo, &[], Duration::from_secs(6));
    outboxd_streams(&pg, &conninfo, &[], Duration::from_secs(15), "pss.v1");
}
