//! Apache Kafka for the integration tests: a private KRaft cluster per [`Broker`], started by the
//! same launcher users and benchmarks run (`scripts/kafka start DIR ...`), in a tempdir, on free
//! ports, torn down on drop (and by the launcher's watcher if this process dies first).
//!
//! Invariants the tests rely on:
//! * The harness talks to the cluster on each broker's internal PLAINTEXT listener, whose
//!   principal (`User:ANONYMOUS`) is a super user, so creating topics and reading records back work
//!   whatever the client listeners demand (SASL, TLS, ACLs). [`Broker::bootstrap`] is what outboxd
//!   gets: the first client listener, or the address advertised for a proxy.
//! * Data lives on disk in the cluster's directory, so [`Broker::restart`] and a node's restart keep
//!   topics and records, as a real broker does.
//! * [`Broker::consume_all`] reads as a member of a fresh consumer group (subscribe, not assign)
//!   with `isolation.level=read_committed`, the way users read.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use tempfile::TempDir;

use super::{dispose_tempdir, make_tempdir, read_lossy, send_signal, unique_name, wait_until};

/// The launcher every Kafka in the tests comes from.
pub fn kafka_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka")
}

/// `scripts/kafka` with the quick JVM settings (client compiler, serial GC): tests start many
/// short-lived brokers on two cores, where start-up CPU matters more than peak throughput.
fn script() -> Command {
    let mut c = Command::new(kafka_script());
    c.env("KAFKA_QUICK_JVM", "1");
    c
}

/// One record read back by [`Broker::consume_all`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// Header values; a null header value is returned as an empty vec.
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp_ms: Option<i64>,
}

impl Consumed {
    /// Copy what the tests look at out of a consumed message.
    pub fn from_message(m: &rdkafka::message::BorrowedMessage<'_>) -> Consumed {
        use rdkafka::message::{Headers as _, Message as _};
        let headers = m
            .headers()
            .map(|hs| hs.iter().map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec())).collect())
            .unwrap_or_default();
        Consumed {
            topic: m.topic().to_string(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            headers,
            timestamp_ms: m.timestamp().to_millis(),
        }
    }

    /// First header with this name.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_slice())
    }

    /// First header with this name as UTF-8 (lossy).
    pub fn header_str(&self, name: &str) -> Option<String> {
        self.header(name).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Key as UTF-8 (lossy).
    pub fn key_str(&self) -> Option<String> {
        self.key.as_deref().map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Payload parsed as JSON (panics if absent or not JSON).
    pub fn payload_json(&self) -> serde_json::Value {
        let p = self.payload.as_deref().expect("record has no payload");
        serde_json::from_slice(p)
            .unwrap_or_else(|e| panic!("payload is not JSON ({e}): {}", String::from_utf8_lossy(p)))
    }
}

/// How to start a [`Broker`]: the options of `scripts/kafka start`.
#[derive(Debug, Clone, Default)]
pub struct BrokerOptions {
    brokers: usize,
    listeners: Vec<String>,
    users: Vec<String>,
    mtls: bool,
    acl: bool,
    advertise: Option<u16>,
    props: Vec<String>,
    dir: Option<PathBuf>,
}

impl BrokerOptions {
    pub fn new() -> BrokerOptions {
        BrokerOptions { brokers: 1, ..Default::default() }
    }
    /// Number of brokers (more than one run beside a dedicated controller).
    pub fn brokers(mut self, n: usize) -> Self {
        self.brokers = n;
        self
    }
    /// A client listener: plaintext, sasl_plaintext, ssl or sasl_ssl (the first is `bootstrap()`).
    pub fn listener(mut self, kind: &str) -> Self {
        self.listeners.push(kind.to_string());
        self
    }
    /// A SASL user `NAME:PASS` (PLAIN and SCRAM); replaces the launcher's default users.
    pub fn user(mut self, user_pass: &str) -> Self {
        self.users.push(user_pass.to_string());
        self
    }
    /// TLS listeners require client certificates.
    pub fn mtls(mut self) -> Self {
        self.mtls = true;
        self
    }
    /// The StandardAuthorizer: only super users (admin, the internal listener) pass without ACLs.
    pub fn acl(mut self) -> Self {
        self.acl = true;
        self
    }
    /// Advertise the first client listener on this port of 127.0.0.1 (a proxy in front).
    pub fn advertise(mut self, port: u16) -> Self {
        self.advertise = Some(port);
        self
    }
    /// Any broker property, `KEY=VALUE`.
    pub fn prop(mut self, kv: &str) -> Self {
        self.props.push(kv.to_string());
        self
    }
    /// Keep the cluster in this directory instead of a tempdir.
    pub fn dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.dir = Some(dir.as_ref().to_path_buf());
        self
    }

    pub fn start(self) -> Broker {
        Broker::launch(self)
    }
}

/// A private Apache Kafka cluster (killed on drop).
pub struct Broker {
    tmp: Option<TempDir>,
    root: PathBuf,
    opts: BrokerOptions,
    bootstrap: String,
}

impl Broker {
    /// One broker, plaintext, in a tempdir.
    pub fn start() -> Broker {
        BrokerOptions::new().start()
    }

    /// One broker whose data lives under `dir`, so it survives [`restart`](Self::restart).
    pub fn start_persistent(dir: impl AsRef<Path>) -> Broker {
        BrokerOptions::new().dir(dir.as_ref().join("kafka")).start()
    }

    pub fn options() -> BrokerOptions {
        BrokerOptions::new()
    }

    fn launch(opts: BrokerOptions) -> Broker {
        let (tmp, root) = match &opts.dir {
            Some(d) => {
                fs::create_dir_all(d).expect("create kafka dir");
                (None, d.clone())
            }
            None => {
                let t = make_tempdir("outboxd-kafka-");
                let p = t.path().join("cluster");
                (Some(t), p)
            }
        };
        let mut cmd = script();
        cmd.arg("start").arg(&root).args(["--brokers", &opts.brokers.to_string()]);
        for l in &opts.listeners {
            cmd.args(["--listener", l]);
        }
        for u in &opts.users {
            cmd.args(["--user", u]);
        }
        if opts.mtls {
            cmd.arg("--mtls");
        }
        if opts.acl {
            cmd.arg("--acl");
        }
        if let Some(p) = opts.advertise {
            cmd.args(["--advertise", &p.to_string()]);
        }
        for p in &opts.props {
            cmd.args(["--prop", p]);
        }
        cmd.args(["--parent", &std::process::id().to_string()]);
        let t0 = Instant::now();
        let mut out = cmd.output().expect("run scripts/kafka");
        // The launcher picks free ports and then starts the JVM; another test can take a port in
        // between, and a controller that lost that race leaves its brokers waiting. Start again
        // on new ports (a fresh directory) when the start failed, showing why.
        for _ in 0..2 {
            if out.status.success() {
                break;
            }
            eprintln!(
                "[harness] scripts/kafka start failed ({}); starting again on new ports. It said:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            let _ = script().arg("stop").arg(&root).arg("--now").output();
            let _ = fs::remove_dir_all(&root);
            out = cmd.output().expect("run scripts/kafka");
        }
        assert!(
            out.status.success(),
            "scripts/kafka start failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let bootstrap = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().trim().to_string();
        eprintln!("[harness] Apache Kafka ({} broker(s)) at {bootstrap} in {:?}", opts.brokers, t0.elapsed());
        Broker { tmp, root, opts, bootstrap }
    }

    /// The cluster's directory (`DIR` of `scripts/kafka`).
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// The bootstrap servers outboxd is given: the first client listener of every broker.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// The bootstrap servers of another client listener kind (plaintext, sasl_ssl, ...).
    pub fn bootstrap_for(&self, kind: &str) -> String {
        fs::read_to_string(self.root.join(format!("bootstrap.{kind}")))
            .unwrap_or_else(|e| panic!("no {kind} listener in this cluster: {e}"))
            .trim()
            .to_string()
    }

    /// The internal (PLAINTEXT, super-user) listeners, for the harness's own clients.
    pub fn admin_bootstrap(&self) -> String {
        self.broker_ids()
            .iter()
            .map(|id| format!("127.0.0.1:{}", self.node_file(*id, "internal.port")))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A CA certificate clients of the TLS listeners trust, and the client certificate and key.
    pub fn tls_file(&self, name: &str) -> PathBuf {
        self.root.join("tls").join(name)
    }

    /// Broker node ids, 1..=N.
    pub fn broker_ids(&self) -> Vec<u32> {
        (1..=self.opts.brokers as u32).collect()
    }

    fn node_file(&self, id: u32, name: &str) -> String {
        read_lossy(&self.root.join(format!("node-{id}")).join(name)).trim().to_string()
    }

    /// Port of broker 1's first client listener.
    pub fn port(&self) -> u16 {
        let first = self.opts.listeners.first().map(String::as_str).unwrap_or("plaintext");
        self.node_file(1, &format!("{first}.port")).parse().expect("port file")
    }

    /// Process id of broker node `id`, if it runs.
    pub fn node_pid(&self, id: u32) -> Option<u32> {
        let pid: u32 = self.node_file(id, "pid").parse().ok()?;
        send_signal(pid, "0").then_some(pid)
    }

    /// Process id of broker 1.
    pub fn pid(&self) -> Option<u32> {
        self.node_pid(1)
    }

    pub fn log_path(&self) -> PathBuf {
        self.root.join("node-1/server.log")
    }

    /// The last lines of every node's log (server log and stdout).
    pub fn log(&self) -> String {
        let mut out = String::new();
        let mut ids: Vec<String> = Vec::new();
        if let Ok(rd) = fs::read_dir(&self.root) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                if let Some(id) = n.strip_prefix("node-") {
                    ids.push(id.to_string());
                }
            }
        }
        ids.sort();
        for id in ids {
            for f in ["server.log", "stdout.log"] {
                let text = read_lossy(&self.root.join(format!("node-{id}")).join(f));
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(60)..];
                out.push_str(&format!("--- node {id} {f} (last {} lines)\n{}\n", tail.len(), tail.join("\n")));
            }
        }
        out
    }

    /// A `ClientConfig` for the harness: the internal listeners, IPv4.
    pub fn client_config(&self) -> ClientConfig {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", self.admin_bootstrap()).set("broker.address.family", "v4").set("log_level", "3");
        cfg
    }

    /// The group's committed offsets in Kafka for `topic`'s partitions `0..partitions` (`None`:
    /// none committed). A coordinator that is moving or loading (`NotCoordinator`,
    /// `CoordinatorLoadInProgress`, a timeout, seen while a rebalance or a commit is under way) is
    /// asked again for up to 30 s; any other error fails the test.
    pub fn committed_offsets(&self, group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
        use rdkafka::error::KafkaError;
        use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
        let mut cfg = self.client_config();
        cfg.set("group.id", group);
        let c: BaseConsumer = cfg.create().expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let got = loop {
            match c.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
                Ok(got) => break got,
                Err(KafkaError::MetadataFetch(
                    code @ (RDKafkaErrorCode::NotCoordinator
                    | RDKafkaErrorCode::CoordinatorLoadInProgress
                    | RDKafkaErrorCode::CoordinatorNotAvailable
                    | RDKafkaErrorCode::OperationTimedOut
                    | RDKafkaErrorCode::RequestTimedOut),
                )) if Instant::now() < deadline => {
                    eprintln!("committed offsets of {group}: {code:?}, asking again");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("committed offsets of {group}: {e}"),
            }
        };
        (0..partitions)
            .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(n)) => Some(n),
                _ => None,
            })
            .collect()
    }

    /// Creates `name` with `partitions` partitions and the cluster's default replication factor,
    /// and waits until the metadata shows them. Panics if it exists (see [`ensure_topic`](Self::ensure_topic)).
    pub fn create_topic(&self, name: &str, partitions: i32) {
        self.create_topic_with(name, partitions, &[], false)
    }

    /// Like [`create_topic`](Self::create_topic) but an existing topic is fine.
    pub fn ensure_topic(&self, name: &str, partitions: i32) {
        self.create_topic_with(name, partitions, &[], true)
    }

    /// Creates a topic with topic-level configs (e.g. `("max.message.bytes", "2000")`).
    pub fn create_topic_with(&self, name: &str, partitions: i32, configs: &[(&str, &str)], exists_ok: bool) {
        let cfg = self.client_config();
        let topic = name.to_string();
        let configs: Vec<(String, String)> = configs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let result = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("build runtime");
            rt.block_on(async move {
                let admin: AdminClient<DefaultClientContext> = cfg.create().map_err(|e| e.to_string())?;
                let mut new = NewTopic::new(&topic, partitions, TopicReplication::Fixed(-1));
                for (k, v) in &configs {
                    new = new.set(k, v);
                }
                let opts = AdminOptions::new()
                    .request_timeout(Some(Duration::from_secs(30)))
                    .operation_timeout(Some(Duration::from_secs(30)));
                let res = admin.create_topics([&new], &opts).await.map_err(|e| e.to_string())?;
                for r in res {
                    match r {
                        Ok(_) => {}
                        Err((_, RDKafkaErrorCode::TopicAlreadyExists)) if exists_ok => {}
                        Err((t, code)) => return Err(format!("create topic {t}: {code:?} ({code})")),
                    }
                }
                Ok::<(), String>(())
            })
        })
        .join()
        .expect("create_topic thread panicked");
        if let Err(e) = result {
            panic!("create_topic({name}, {partitions}) failed: {e}\nbroker log:\n{}", self.log());
        }
        let ok = wait_until(Duration::from_secs(30), || self.partition_count(name) == Some(partitions as usize));
        assert!(ok, "topic {name} did not show {partitions} partitions in metadata");
    }

    /// Number of partitions of `topic` per the broker's metadata (None if unknown).
    pub fn partition_count(&self, topic: &str) -> Option<usize> {
        let consumer: BaseConsumer = self
            .client_config()
            .set("group.id", "outboxd-harness-probe")
            .set("allow.auto.create.topics", "false")
            .create()
            .ok()?;
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)).ok()?;
        let t = md.topics().iter().find(|t| t.name() == topic)?;
        if t.error().is_some() || t.partitions().is_empty() {
            return None;
        }
        Some(t.partitions().len())
    }

    /// (partition, leader, replicas) of every partition of `topic`, per the metadata.
    pub fn replicas(&self, topic: &str) -> Vec<(i32, i32, Vec<i32>)> {
        let consumer: BaseConsumer = self.client_config().create().expect("create consumer");
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)).expect("metadata");
        let mut out: Vec<(i32, i32, Vec<i32>)> = md
            .topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions().iter().map(|p| (p.id(), p.leader(), p.replicas().to_vec())))
            .collect();
        out.sort();
        out
    }

    /// Names of all topics the cluster knows (internal ones excluded).
    pub fn topics(&self) -> Vec<String> {
        let consumer: BaseConsumer = self.client_config().create().expect("create consumer");
        let md = consumer.fetch_metadata(None, Duration::from_secs(5)).expect("metadata");
        md.topics().iter().map(|t| t.name().to_owned()).filter(|n| !n.starts_with("__")).collect()
    }

    /// Records the broker holds in `topic` (the sum of its partitions' high watermarks: what the
    /// broker acked, for a topic no transaction wrote); 0 when the topic does not exist.
    pub fn end_offsets(&self, topic: &str) -> i64 {
        let Some(n) = self.partition_count(topic) else { return 0 };
        let consumer: BaseConsumer = self.client_config().create().expect("create consumer");
        (0..n as i32)
            .map(|p| consumer.fetch_watermarks(topic, p, Duration::from_secs(5)).map_or(0, |(_, high)| high))
            .sum()
    }

    /// Reads `topic` from the beginning as a fresh consumer group (read_committed) until at least
    /// `min_count` records arrived and then ~1 s passed without new ones, or until `timeout`.
    /// Returns what it got, ordered by (partition, offset). `_partitions` is kept for callers
    /// written against the old assign()-based reader: the group is assigned every partition.
    pub fn consume_all(&self, topic: &str, _partitions: i32, min_count: usize, timeout: Duration) -> Vec<Consumed> {
        let got = consume_group(self.client_config(), topic, min_count, timeout);
        if got.len() >= min_count {
            return got;
        }
        // Short: read every partition again by assign() from the beginning, so a group that was
        // not given every partition in time cannot pass for a lost record.
        let n = self.partition_count(topic).unwrap_or(0) as i32;
        let again = consume_assigned(self.client_config(), topic, n, min_count, Duration::from_secs(30));
        eprintln!("[harness] the group read {} of {min_count} on {topic}; assign() read {}", got.len(), again.len());
        if again.len() > got.len() {
            again
        } else {
            got
        }
    }

    /// SIGSTOP every broker (they keep their sockets but stop answering).
    pub fn pause(&self) {
        for id in self.broker_ids() {
            self.pause_node(id);
        }
    }

    /// SIGCONT every broker.
    pub fn resume(&self) {
        for id in self.broker_ids() {
            self.resume_node(id);
        }
    }

    pub fn pause_node(&self, id: u32) {
        if let Some(pid) = self.node_pid(id) {
            assert!(send_signal(pid, "STOP"), "kill -STOP {pid} failed");
        }
    }

    pub fn resume_node(&self, id: u32) {
        if let Some(pid) = self.node_pid(id) {
            assert!(send_signal(pid, "CONT"), "kill -CONT {pid} failed");
        }
    }

    /// kill -9 of one node.
    pub fn kill_node(&self, id: u32) {
        self.node_op(id, "kill");
        let gone = wait_until(Duration::from_secs(10), || self.node_pid(id).is_none());
        assert!(gone, "node {id} did not die");
    }

    /// Controlled shutdown (SIGTERM) of one node.
    pub fn stop_node(&self, id: u32) {
        self.node_op(id, "stop");
    }

    /// Starts a stopped node again on its ports and data (returns once it is launched; see
    /// [`wait_ready`](Self::wait_ready)).
    pub fn start_node(&self, id: u32) {
        self.node_op(id, "launch");
    }

    /// Waits until every broker lists every broker.
    pub fn wait_ready(&self) {
        let out = script().arg("wait").arg(&self.root).output().expect("scripts/kafka wait");
        assert!(out.status.success(), "cluster not ready:\n{}\n{}", String::from_utf8_lossy(&out.stderr), self.log());
    }

    fn node_op(&self, id: u32, op: &str) {
        let out =
            script().args(["node"]).arg(&self.root).args([&id.to_string(), op]).output().expect("scripts/kafka node");
        assert!(out.status.success(), "scripts/kafka node {id} {op}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// kill -9 of every node. Data stays on disk.
    pub fn kill(&mut self) {
        let _ = script().arg("stop").arg(&self.root).arg("--kill").output();
    }

    /// Kills every node and starts them again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        let out = script().arg("restart").arg(&self.root).output().expect("scripts/kafka restart");
        assert!(out.status.success(), "restart failed: {}\n{}", String::from_utf8_lossy(&out.stderr), self.log());
    }

    /// Whether broker 1 runs.
    pub fn is_running(&mut self) -> bool {
        self.pid().is_some()
    }

    /// Runs a Kafka command-line tool class (e.g. `AclCommand`) against the internal listeners;
    /// returns (success, stdout+stderr).
    pub fn tool(&self, class: &str, args: &[&str]) -> (bool, String) {
        let out = script().arg("tool").arg(class).args(args).output().expect("scripts/kafka tool");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = script().arg("stop").arg(&self.root).arg("--now").output();
        dispose_tempdir(self.tmp.take(), "kafka");
    }
}

/// Reads `topic` from the beginning with `config` (any security settings) as a fresh consumer
/// group until at least `min_count` records arrived and ~1 s passed without new ones, or until
/// `timeout`. Ordered by (partition, offset).
pub fn consume_group(mut config: ClientConfig, topic: &str, min_count: usize, timeout: Duration) -> Vec<Consumed> {
    const QUIET: Duration = Duration::from_secs(1);
    let consumer: BaseConsumer = config
        .set("group.id", unique_name("outboxd-harness"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "100")
        .set("topic.metadata.refresh.interval.ms", "1000")
        .set("allow.auto.create.topics", "false")
        .set("enable.partition.eof", "true")
        .create()
        .expect("create consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let start = Instant::now();
    let deadline = start + timeout;
    let mut last_new = start;
    let mut out: Vec<Consumed> = Vec::new();
    // Partitions read to their end since their last record. A quiet second alone is not the end:
    // on a loaded box a new group can take longer than that to be given its partitions at all.
    let mut at_end = std::collections::HashSet::new();
    while Instant::now() < deadline {
        if out.len() >= min_count && last_new.elapsed() >= QUIET && read_to_the_end(&consumer, topic, &at_end) {
            break;
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                at_end.remove(&rdkafka::Message::partition(&m));
                out.push(Consumed::from_message(&m));
                last_new = Instant::now();
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => eprintln!("[harness] consume {topic}: {e}"),
            None => {}
        }
    }
    out.sort_by_key(|c| (c.partition, c.offset));
    out
}

/// Every partition assigned to `consumer` read to its end, or `topic` absent (nothing to read).
fn read_to_the_end(consumer: &BaseConsumer, topic: &str, at_end: &std::collections::HashSet<i32>) -> bool {
    match consumer.assignment() {
        Ok(a) if a.count() > 0 => a.elements().iter().all(|e| at_end.contains(&e.partition())),
        _ => consumer
            .fetch_metadata(Some(topic), Duration::from_secs(2))
            .map(|m| m.topics().iter().all(|t| t.error().is_some() || t.partitions().is_empty()))
            .unwrap_or(false),
    }
}

/// Reads partitions `0..partitions` of `topic` from the beginning with assign() (no group).
pub fn consume_assigned(
    mut config: ClientConfig,
    topic: &str,
    partitions: i32,
    min_count: usize,
    timeout: Duration,
) -> Vec<Consumed> {
    use rdkafka::{Offset, TopicPartitionList};
    let consumer: BaseConsumer = config
        .set("group.id", unique_name("outboxd-harness"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("create consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).expect("add partition");
    }
    consumer.assign(&tpl).expect("assign");
    let start = Instant::now();
    let mut last_new = start;
    let mut out = Vec::new();
    while start.elapsed() < timeout {
        if out.len() >= min_count && last_new.elapsed() >= Duration::from_secs(1) {
            break;
        }
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            out.push(Consumed::from_message(&m));
            last_new = Instant::now();
        }
    }
    out.sort_by_key(|c| (c.partition, c.offset));
    out
}
