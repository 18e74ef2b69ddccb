//! TLS for a test [`PgCluster`]: `ssl = on` with a certificate from a [`TestCa`], and pg_hba
//! rules that allow only `hostssl` logins (password or client certificate).

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use super::certs::TestCa;
use super::{is_root, PgCluster, DB};

/// The role that logs in with a client certificate (its CN).
pub const CERT_USER: &str = "certuser";

/// What a test needs to point outboxd at a TLS-only cluster.
pub struct TlsCluster {
    pub ca: TestCa,
    /// The CA that signed the server's certificate, as a file.
    pub ca_file: PathBuf,
    /// A CA that did not.
    pub wrong_ca_file: PathBuf,
    /// A client certificate (CN = the test user) and its key, for `cert` logins.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub dir: PathBuf,
}

impl PgCluster {
    /// Turn TLS on with a server certificate for `localhost` and 127.0.0.1, and replace pg_hba
    /// with `hba` lines (use [`PgCluster::hostssl_only_hba`] for the usual). Reloads the server.
    pub fn enable_tls(&self, hba: &str) -> TlsCluster {
        let dir = self.root().join("tls");
        fs::create_dir_all(&dir).unwrap();
        let ca = TestCa::new("outboxd test CA");
        let ca_file = ca.write_ca(&dir, "ca.pem");
        let wrong_ca_file = TestCa::new("some other CA").write_ca(&dir, "wrong-ca.pem");
        // Named for `localhost` only (no IP): 127.0.0.1 under verify-full is a host-name mismatch.
        let server = ca.server_named_only(&dir, "server", "localhost");
        let client = ca.client(&dir, "client", CERT_USER);
        if is_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().unwrap();
            assert!(st.success());
        }
        // One statement per call: ALTER SYSTEM refuses to run inside a multi-statement query.
        for sql in [
            format!("ALTER SYSTEM SET ssl_cert_file = '{}'", server.cert.display()),
            format!("ALTER SYSTEM SET ssl_key_file = '{}'", server.key.display()),
            format!("ALTER SYSTEM SET ssl_ca_file = '{}'", ca_file.display()),
            "ALTER SYSTEM SET ssl = on".to_string(),
            format!("CREATE ROLE {CERT_USER} LOGIN REPLICATION SUPERUSER"),
        ] {
            self.psql(&sql);
        }
        self.set_hba(hba);
        TlsCluster { ca, ca_file, wrong_ca_file, client_cert: client.cert, client_key: client.key, dir }
    }

    /// pg_hba: local trust (for the harness), and over TCP only TLS: SCRAM for everyone, and
    /// `cert` for the user `certuser`.
    pub fn hostssl_only_hba() -> String {
        "local all all trust\nlocal replication all trust\n\
         hostssl all certuser 127.0.0.1/32 cert\nhostssl replication certuser 127.0.0.1/32 cert\n\
         hostssl all all 127.0.0.1/32 scram-sha-256\nhostssl replication all 127.0.0.1/32 scram-sha-256\n"
            .to_string()
    }

    /// Replace pg_hba.conf and reload.
    pub fn set_hba(&self, hba: &str) {
        fs::write(self.data_dir.join("pg_hba.conf"), hba).expect("write pg_hba.conf");
        let r = self.psql("SELECT pg_reload_conf()");
        assert_eq!(r.trim(), "t");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }

    /// A conninfo as key/value pairs with the given extra keywords.
    pub fn conninfo(&self, user: &str, extra: &str) -> String {
        format!("host=127.0.0.1 port={} dbname={DB} user={user} {extra}", self.port())
    }
}
