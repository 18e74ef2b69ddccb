//! The throwaway PostgreSQL cluster: started once per run with `scripts/lib.sh` (initdb as the
//! postgres user, wal_level=logical, fsync=off, database `app`), with TLS on for the tls scenario
//! and 64 slots and WAL senders, the outbox table and the `outboxd` publication.
//!
//! Between scenarios `reset` drops every slot and empties the outbox, so each scenario starts from
//! an empty table; each backlog is read through slots created before it was inserted. The driver
//! keeps one connection over the Unix socket for its own statements.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use crate::procs;
use crate::readers::Transport;

pub struct Cluster {
    /// The cluster's directory: `data/`, `log`, and the Unix socket.
    pub dir: PathBuf,
    pub port: u16,
    pub pg_bin: PathBuf,
    /// The throwaway CA (`ca.pem`) and server certificate.
    pub certs: PathBuf,
    pub version: String,
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl Cluster {
    pub fn start(work: &Path, pg_bin: &Path) -> Result<Cluster> {
        let dir = work.join("pg");
        let port = procs::free_port()?;
        let dir_s = dir.to_string_lossy().into_owned();
        procs::output(&mut procs::lib_sh("pg_start", &[&dir_s, &port.to_string()])).context("starting PostgreSQL")?;
        procs::track_cluster(pg_bin.join("pg_ctl"), dir.join("data"));
        let certs = work.join("certs");
        let certs_s = certs.to_string_lossy().into_owned();
        procs::output(&mut procs::lib_sh("make_certs", &[&certs_s]))?;
        procs::output(&mut procs::lib_sh("pg_enable_ssl", &[&dir_s, &certs_s]))?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = connect(&rt, &socket_conninfo(&dir, port))?;
        let mut cluster = Cluster { dir, port, pg_bin: pg_bin.to_owned(), certs, version: String::new(), rt, client };
        // Several readers times several repetitions need more slots than lib.sh's 10.
        cluster.exec("ALTER SYSTEM SET max_replication_slots = 64")?;
        cluster.exec("ALTER SYSTEM SET max_wal_senders = 64")?;
        cluster.restart()?;
        for file in ["sql/01_outbox.sql", "sql/04_publication.sql"] {
            let sql = std::fs::read_to_string(file).with_context(|| file.to_string())?;
            cluster.exec(&sql).with_context(|| file.to_string())?;
        }
        cluster.version = cluster.value("SHOW server_version")?;
        Ok(cluster)
    }

    pub fn restart(&mut self) -> Result<()> {
        procs::output(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(self.pg_bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.join("data"))
                .arg("-l")
                .arg(self.dir.join("log"))
                .args(["-w", "restart"])
                .stdout(Stdio::null()),
        )?;
        self.client = connect(&self.rt, &self.socket_conninfo())?;
        Ok(())
    }

    /// libpq key=value conninfo over the Unix socket (no TLS there).
    pub fn socket_conninfo(&self) -> String {
        socket_conninfo(&self.dir, self.port)
    }

    /// outboxd's `--postgres-url` over the Unix socket.
    pub fn outboxd_url(&self) -> String {
        format!("postgres://postgres@/app?host={}&port={}", self.dir.display(), self.port)
    }

    /// The conninfo a reader over `transport` uses (pg_recvlogical -d and outboxd --postgres-url).
    pub fn conninfo(&self, transport: Transport) -> String {
        let tcp = format!("host=127.0.0.1 port={} user=postgres dbname=app", self.port);
        match transport {
            Transport::Socket => self.socket_conninfo(),
            Transport::Tcp | Transport::Ktls => format!("{tcp} sslmode=disable"),
            Transport::Tls => {
                format!("{tcp} sslmode=verify-full sslrootcert={}", self.certs.join("ca.pem").display())
            }
        }
    }

    pub fn exec(&self, sql: &str) -> Result<()> {
        self.rt.block_on(self.client.batch_execute(sql)).with_context(|| format!("SQL: {}", first_line(sql)))
    }

    /// The first column of every row, as text (NULL as "").
    pub fn column(&self, sql: &str) -> Result<Vec<String>> {
        let msgs = self.rt.block_on(self.client.simple_query(sql)).with_context(|| format!("SQL: {sql}"))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
                _ => None,
            })
            .collect())
    }

    /// Every column of the first row, as text (NULL as ""); empty for no row.
    pub fn row(&self, sql: &str) -> Result<Vec<String>> {
        let msgs = self.rt.block_on(self.client.simple_query(sql)).with_context(|| format!("SQL: {sql}"))?;
        Ok(msgs
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some((0..r.len()).map(|i| r.get(i).unwrap_or("").to_owned()).collect()),
                _ => None,
            })
            .unwrap_or_default())
    }

    /// The first column of the first row.
    pub fn value(&self, sql: &str) -> Result<String> {
        self.column(sql)?.into_iter().next().with_context(|| format!("no row from: {sql}"))
    }

    /// Drops every slot (waiting up to 10 s for readers to let go of theirs), empties the outbox,
    /// checkpoints.
    pub fn reset(&self) -> Result<()> {
        for _ in 0..100 {
            let counts = self.row(
                "SELECT count(pg_drop_replication_slot(slot_name)) FILTER (WHERE NOT active), \
                 count(*) FILTER (WHERE active) FROM pg_replication_slots",
            )?;
            if counts.get(1).map(String::as_str) == Some("0") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.exec("TRUNCATE outbox")?;
        self.exec("CHECKPOINT")
    }

    pub fn create_slots(&self, names: &[String]) -> Result<()> {
        for s in names {
            self.value(&format!("SELECT pg_create_logical_replication_slot('{s}', 'pgoutput')"))?;
        }
        Ok(())
    }

    pub fn slot_active(&self, name: &str) -> Result<bool> {
        Ok(self.column(&format!("SELECT active FROM pg_replication_slots WHERE slot_name = '{name}'"))?
            == ["t".to_owned()])
    }

    pub fn insert_lsn(&self) -> Result<String> {
        self.value("SELECT pg_current_wal_insert_lsn()")
    }

    /// Average payload size (jsonb text) of the first 1,000 rows, in bytes.
    pub fn payload_bytes(&self) -> Result<String> {
        self.value("SELECT round(avg(octet_length(payload::text))) FROM (SELECT payload FROM outbox LIMIT 1000) p")
    }

    /// `rows` outbox rows, `per_txn` per transaction, event types prefixed with `type_prefix`:
    /// bench/fill.sql's `bench_fill`, the backlog every benchmark script inserts.
    pub fn insert_rows(&self, rows: u64, per_txn: u64, type_prefix: &str) -> Result<()> {
        self.exec(include_str!("../fill.sql"))?;
        self.exec(&format!("CALL bench_fill({rows}, {}, '{type_prefix}')", per_txn.max(1)))
    }
}

fn socket_conninfo(dir: &Path, port: u16) -> String {
    format!("host={} port={port} user=postgres dbname=app", dir.display())
}

fn first_line(sql: &str) -> &str {
    sql.lines().find(|l| !l.trim().is_empty()).unwrap_or("")
}

fn connect(rt: &tokio::runtime::Runtime, conninfo: &str) -> Result<Client> {
    let (client, conn) = rt.block_on(tokio_postgres::connect(conninfo, NoTls)).context("connecting to PostgreSQL")?;
    // The connection's own error (e.g. at the restart that replaces it) surfaces on the next
    // statement through the client, with that statement's context.
    rt.spawn(async move {
        let _ = conn.await;
    });
    if client.is_closed() {
        bail!("PostgreSQL connection closed at once");
    }
    Ok(client)
}
