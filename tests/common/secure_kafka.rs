//! Harness for Kafka security tests: a TLS-terminating proxy in front of tansu (which serves
//! plaintext only), a tansu launcher with the flags those tests need (advertised listener,
//! `--authentication`, sqlite storage), SCRAM user creation, and a consumer that reads with any
//! client configuration (TLS or SASL).
//!
//! [`TlsProxy`] runs its own tokio runtime on its own thread: it accepts TCP on a port fixed at
//! construction, completes a TLS handshake with OpenSSL's acceptor (server certificate from
//! [`super::certs`]), then copies bytes both ways to the upstream port, which is set afterwards
//! ([`TlsProxy::set_upstream`]) because tansu must be told the proxy's port when it starts. Handshakes that succeed
//! and fail are counted, so a test can tell "refused at TLS" from "never connected".

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::ssl::{Ssl, SslAcceptor, SslFiletype, SslMethod};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::oneshot;

use super::{free_port, port_open, tansu_bin, unique_name, Consumed};

/// A TLS-terminating TCP proxy to `127.0.0.1:<upstream>`; stops on drop.
pub struct TlsProxy {
    pub port: u16,
    upstream: Arc<AtomicU16>,
    pub handshakes_ok: Arc<AtomicUsize>,
    pub handshakes_failed: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsProxy {
    /// Listen on a free port now; connect to the upstream port (see [`Self::set_upstream`]) per
    /// accepted connection.
    pub fn start(cert: &Path, key: &Path) -> TlsProxy {
        let upstream = Arc::new(AtomicU16::new(0));
        let upstream2 = upstream.clone();
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).expect("acceptor");
        b.set_certificate_chain_file(cert).expect("proxy certificate");
        b.set_private_key_file(key, SslFiletype::PEM).expect("proxy key");
        let acceptor = Arc::new(b.build());
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (tx, mut rx) = oneshot::channel();
        let (ok2, failed2) = (ok.clone(), failed.clone());
        let thread = std::thread::Builder::new()
            .name("tls-proxy".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    loop {
                        tokio::select! {
                            _ = &mut rx => break,
                            accepted = listener.accept() => {
                                let Ok((tcp, _)) = accepted else { continue };
                                let (acceptor, ok, failed) = (acceptor.clone(), ok2.clone(), failed2.clone());
                                let upstream = upstream2.load(Ordering::SeqCst);
                                tokio::spawn(async move {
                                    let Ok(ssl) = Ssl::new(acceptor.context()) else { return };
                                    let Ok(mut tls) = tokio_openssl::SslStream::new(ssl, tcp) else { return };
                                    if std::pin::Pin::new(&mut tls).accept().await.is_err() {
                                        failed.fetch_add(1, Ordering::SeqCst);
                                        return;
                                    }
                                    ok.fetch_add(1, Ordering::SeqCst);
                                    let Ok(mut up) =
                                        tokio::net::TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], upstream))).await
                                    else {
                                        return;
                                    };
                                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                                });
                            }
                        }
                    }
                });
                rt.shutdown_background();
            })
            .expect("spawn proxy thread");
        TlsProxy { port, upstream, handshakes_ok: ok, handshakes_failed: failed, stop: Some(tx), thread: Some(thread) }
    }

    /// Where accepted connections go from now on.
    pub fn set_upstream(&self, port: u16) {
        self.upstream.store(port, Ordering::SeqCst);
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A tansu process with explicit flags; killed on drop. Its data is `<workdir>/tansu.db`.
pub struct Tansu {
    pub port: u16,
    pub workdir: PathBuf,
    child: Option<Child>,
}

impl Tansu {
    /// Start tansu on a free port, advertising `advertised` (`None`: its own port), with
    /// `--authentication` when `auth`. Waits until the port accepts connections.
    pub fn start(workdir: &Path, advertised: Option<u16>, auth: bool) -> Tansu {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut t = Tansu { port, workdir: workdir.to_owned(), child: None };
            match t.spawn(advertised.unwrap_or(port), auth) {
                Ok(()) => return t,
                Err(e) => last = e,
            }
        }
        panic!("tansu did not start: {last}");
    }

    /// Stop and start again on the same port and data, with or without `--authentication`.
    pub fn restart(&mut self, advertised: Option<u16>, auth: bool) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.spawn(advertised.unwrap_or(self.port), auth) {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("tansu did not restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(300)),
            }
        }
    }

    fn log_path(&self) -> PathBuf {
        self.workdir.join("tansu.log")
    }

    pub fn log(&self) -> String {
        std::fs::read(self.log_path()).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    fn spawn(&mut self, advertised: u16, auth: bool) -> Result<(), String> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).expect("tansu log");
        let log2 = log.try_clone().expect("clone");
        let mut cmd = Command::new(tansu_bin());
        cmd.arg("broker")
            .args(["--listener-url", &format!("tcp://127.0.0.1:{}", self.port)])
            .args(["--advertised-listener-url", &format!("tcp://127.0.0.1:{advertised}")])
            .args(["--storage-engine", "sqlite://tansu.db"]);
        if auth {
            cmd.arg("--authentication");
        }
        let child = cmd
            .current_dir(&self.workdir)
            .env("RUST_LOG", std::env::var("TANSU_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("spawn tansu: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(st) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("tansu exited with {st}:\n{}", self.log()));
            }
            if port_open(self.port) {
                std::thread::sleep(Duration::from_millis(300));
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill();
        Err(format!("tansu not listening after 60s:\n{}", self.log()))
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `tansu user create` a SCRAM user (`mechanism`: `scram256` or `scram512`) through the broker on
/// `port`, which must run without `--authentication`; the credential lands in its storage.
pub fn create_scram_user(port: u16, mechanism: &str, user: &str, password: &str) {
    let broker = format!("tcp://127.0.0.1:{port}");
    let out = Command::new(tansu_bin())
        .args(["user", "create", "--broker", &broker, "--mechanism", mechanism, user, password])
        .output()
        .expect("run tansu user create");
    assert!(
        out.status.success(),
        "tansu user create failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A client config for `bootstrap` plus `props` (IPv4, quiet librdkafka).
pub fn client_config(bootstrap: &str, props: &[(&str, &str)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap).set("broker.address.family", "v4").set("log_level", "3");
    for (k, v) in props {
        c.set(*k, *v);
    }
    c
}

/// Like `Broker::consume_all`, for any client configuration: read `topic` from the beginning
/// until `min_count` records and a quiet second, or `timeout`.
pub fn consume_with(config: &ClientConfig, topic: &str, min_count: usize, timeout: Duration) -> Vec<Consumed> {
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", unique_name("outboxd-secure"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_uncommitted")
        .set("fetch.wait.max.ms", "100")
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("create consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning).expect("add partition");
    consumer.assign(&tpl).expect("assign");
    let start = Instant::now();
    let mut last_new = start;
    let mut out = Vec::new();
    while start.elapsed() < timeout {
        if out.len() >= min_count && last_new.elapsed() >= Duration::from_secs(1) {
            break;
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                out.push(Consumed::from_message(&m));
                last_new = Instant::now();
            }
            Some(Err(e)) => eprintln!("[harness] consume {topic}: {e}"),
            None => {}
        }
    }
    out
}
