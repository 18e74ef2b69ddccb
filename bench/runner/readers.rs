//! The readers a drain compares, and how one of them is run and timed against a backlog.
//!
//! A reader is a kind (pg_recvlogical, outboxd with a sink, or a producer alone: librdkafka via
//! `bench_latency --produce`, or Apache Kafka's own `ProducerPerformance`) and a transport:
//! `Socket` = PostgreSQL over the Unix socket, Kafka on the broker's plaintext listener; `Tcp` =
//! PostgreSQL over TCP with sslmode=disable, Kafka plaintext; `Ktls` = as `Tcp`, Kafka on the
//! broker's TLS listener; `Tls` = PostgreSQL verify-full, Kafka on the TLS listener. Its name
//! (`kafka_tls`) names its slots and the raw rows.
//!
//! Every slot reader is run by `bench_reader`, which connects first, starts the reader, polls the
//! slot every 10 ms and stops outboxd once the slot is confirmed past the backlog's end (so its
//! time includes start-up, set-up checks and the final confirmation); pg_recvlogical stops itself
//! at `--endpos` and is measured by `/usr/bin/time`. Each reader is compared with the
//! pg_recvlogical over the same PostgreSQL transport: its `baseline`. The producers alone read no
//! slot; `ProducerPerformance`'s time is its own (records / its records/sec), without JVM start-up.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::bench::Bench;
use crate::measure;
use crate::procs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Recv,
    Null,
    Kafka,
    /// `--sink kafka --delivery exactly-once` (Kafka transactions).
    KafkaEos,
    /// `--sink kafka --value-converter avro` through the scenario's Apicurio Registry.
    KafkaAvro,
    /// librdkafka alone (`bench_latency --produce`), no PostgreSQL.
    Broker,
    /// Apache Kafka's `ProducerPerformance` (the Java producer) alone, no PostgreSQL.
    Perf,
    Http,
    Rabbitmq,
    /// Debezium on a Kafka Connect standalone worker (`bench/runner/debezium.rs`).
    Debezium,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Socket,
    Tcp,
    Ktls,
    Tls,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reader {
    pub kind: Kind,
    pub transport: Transport,
}

/// A reader over the Unix socket (Kafka on the plaintext listener).
pub const fn local(kind: Kind) -> Reader {
    Reader { kind, transport: Transport::Socket }
}

pub const fn over(kind: Kind, transport: Transport) -> Reader {
    Reader { kind, transport }
}

/// What one run of a reader cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub secs: f64,
    /// The reader's own user + system CPU seconds (all threads).
    pub cpu: Option<f64>,
    pub hwm_kib: Option<u64>,
    /// CPU seconds of the walsender serving the slot.
    pub walsender: Option<f64>,
    /// Seconds from launch to the first record on the brokers (Debezium only).
    pub first_secs: Option<f64>,
}

impl Reader {
    pub fn name(self) -> String {
        let kind = match self.kind {
            Kind::Recv => "recv",
            Kind::Null => "null",
            Kind::Kafka => "kafka",
            Kind::KafkaEos => "kafka_eos",
            Kind::KafkaAvro => "kafka_avro",
            Kind::Broker => "broker",
            Kind::Perf => "perf",
            Kind::Http => "http",
            Kind::Rabbitmq => "rabbitmq",
            Kind::Debezium => "debezium",
        };
        match self.transport {
            Transport::Socket => kind.to_owned(),
            Transport::Tcp => format!("{kind}_tcp"),
            Transport::Ktls => format!("{kind}_ktls"),
            Transport::Tls => format!("{kind}_tls"),
        }
    }

    /// The label of progress lines and table rows.
    pub fn label(self, http_batch: u64) -> String {
        let base = match self.kind {
            Kind::Recv => "pg_recvlogical".to_owned(),
            Kind::Null => "outboxd --sink null".to_owned(),
            Kind::Kafka => "outboxd --sink kafka".to_owned(),
            Kind::KafkaEos => "outboxd --sink kafka --delivery exactly-once".to_owned(),
            Kind::KafkaAvro => "outboxd --sink kafka --value-converter avro".to_owned(),
            Kind::Broker => "librdkafka producer alone".to_owned(),
            Kind::Perf => "Kafka ProducerPerformance alone".to_owned(),
            Kind::Http => format!("outboxd --sink http --http-batch {http_batch}"),
            Kind::Rabbitmq => "outboxd --sink rabbitmq (durable queue, confirms)".to_owned(),
            Kind::Debezium => "Debezium 3.6.1.Final on Kafka Connect 4.4.0 (standalone)".to_owned(),
        };
        let suffix = match (self.kind, self.transport) {
            (Kind::Recv | Kind::Null, Transport::Tcp) => ", TCP, sslmode=disable",
            (Kind::Recv | Kind::Null, Transport::Tls) => ", TLS (verify-full)",
            (Kind::Kafka, Transport::Tcp) => ", plaintext: PostgreSQL over TCP, Kafka plaintext listener",
            (Kind::Kafka, Transport::Ktls) => ", PostgreSQL over TCP plaintext, Kafka TLS listener",
            (Kind::Kafka, Transport::Tls) => ", TLS: PostgreSQL verify-full, Kafka TLS listener",
            _ => "",
        };
        format!("{base}{suffix}")
    }

    /// The label of its drain-table row (the producers alone say what they are).
    pub fn table_label(self, http_batch: u64) -> String {
        match self.kind {
            Kind::Broker => "librdkafka producer alone → Apache Kafka (no PostgreSQL)".to_owned(),
            Kind::Perf => {
                format!("Apache Kafka's ProducerPerformance alone ({}; no PostgreSQL)", PERF_PROPS.join(", "))
            }
            _ => self.label(http_batch),
        }
    }

    /// The pg_recvlogical its ratios are taken against: the one over the same PostgreSQL transport.
    pub fn baseline(self) -> Reader {
        let transport = match self.transport {
            Transport::Socket => Transport::Socket,
            Transport::Tcp | Transport::Ktls => Transport::Tcp,
            Transport::Tls => Transport::Tls,
        };
        over(Kind::Recv, transport)
    }

    /// Whether the table shows the far side's CPU (the broker's, or the webhook receiver's).
    pub fn shows_far_side(self) -> bool {
        matches!(
            self.kind,
            Kind::Kafka | Kind::KafkaEos | Kind::KafkaAvro | Kind::Broker | Kind::Perf | Kind::Http | Kind::Debezium
        )
    }

    /// The producers alone read no slot.
    pub fn reads_slot(self) -> bool {
        !matches!(self.kind, Kind::Broker | Kind::Perf)
    }
}

/// ProducerPerformance's producer settings: outboxd's defaults that matter for throughput
/// (`src/sink/kafka.rs`: idempotence, acks=all, linger.ms=5); the rest are the Java client's.
pub const PERF_PROPS: [&str; 3] = ["acks=all", "linger.ms=5", "enable.idempotence=true"];

/// The one topic every ProducerPerformance run writes to, created by the warm-up (`drain`).
pub const PERF_TOPIC: &str = "bench.producer-perf";

/// outboxd's Kafka flags for a transport: the plaintext listener, or the TLS listener with the
/// broker's CA (`Tls`, `Ktls`; the tls scenario's broker has both).
pub fn kafka_flags(b: &Bench, t: Transport) -> Vec<String> {
    let brokers = |port: u16| vec!["--kafka-brokers".to_owned(), format!("127.0.0.1:{port}")];
    match t {
        Transport::Tls | Transport::Ktls => {
            let kafka = b.far.kafka.as_ref();
            let mut f = brokers(kafka.and_then(|k| k.tls_port).unwrap_or(0));
            f.extend([
                "--kafka-property".to_owned(),
                "security.protocol=ssl".to_owned(),
                "--kafka-property".to_owned(),
                format!("ssl.ca.location={}", kafka.map(|k| k.ca()).unwrap_or_default().display()),
            ]);
            f
        }
        Transport::Socket | Transport::Tcp => brokers(b.kafka_port()),
    }
}

/// The processes on the far side of a reader, whose CPU its row shows: the webhook receiver for
/// the http sink, else the broker's JVM (one broker serves both of its listeners).
pub fn far_pids(b: &Bench, r: Reader) -> Vec<u32> {
    if r.kind == Kind::Http {
        return b.far.webhook.iter().map(|w| w.pid).collect();
    }
    b.far.kafka.iter().map(|k| k.pid).collect()
}

/// The command line (program first) of Kafka's `ProducerPerformance` sending `records` records of
/// `size` bytes (keys round-robin over 1,000, like the backlog's 1,000 aggregates) to `topic` on
/// the plaintext listener as fast as the broker takes them, with `PERF_PROPS`. It runs on the jars
/// `scripts/kafka fetch` names, in a JVM with the default JIT and G1 like any client's:
/// `scripts/kafka tool` starts tools with the client compiler only, fine for admin commands but
/// not for a throughput ceiling. Warnings and errors go to stderr.
pub fn producer_perf_cmd(b: &Bench, topic: &str, records: u64, size: u64) -> Result<Vec<String>> {
    let libs = procs::output(Command::new("bash").args(["scripts/kafka", "fetch"]))?;
    let libs = libs.lines().last().context("scripts/kafka fetch named no directory")?.trim().to_owned();
    let log4j = b.work.join("producer-perf-log4j2.properties");
    std::fs::write(
        &log4j,
        "rootLogger.level=WARN\nrootLogger.appenderRef.e.ref=E\nappender.e.type=Console\nappender.e.name=E\n\
         appender.e.target=SYSTEM_ERR\nappender.e.layout.type=PatternLayout\nappender.e.layout.pattern=%p %m (%c)%n\n",
    )?;
    let mut a: Vec<String> =
        ["java", "-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-Djava.net.preferIPv4Stack=true"].map(String::from).into();
    a.push(format!("-Dlog4j2.configurationFile={}", log4j.display()));
    a.extend(["-cp".to_owned(), format!("{libs}/*"), "org.apache.kafka.tools.ProducerPerformance".to_owned()]);
    a.extend(["--bootstrap-server".to_owned(), format!("127.0.0.1:{}", b.kafka_port())]);
    a.extend(["--topic".into(), topic.into(), "--num-records".into(), records.to_string()]);
    a.extend(["--record-size".into(), size.to_string(), "--throughput".into(), "-1".into()]);
    a.extend(["--key-distribution", "range", "--record-key-range", "1000", "--command-property"].map(String::from));
    a.extend(PERF_PROPS.map(String::from));
    Ok(a)
}

/// ProducerPerformance's summary, its last `N records sent, X records/sec (...)` line: (N, X).
pub fn parse_perf_summary(stdout: &str) -> Option<(u64, f64)> {
    let line = stdout.lines().rev().find(|l| l.contains(" records sent, "))?;
    let (sent, rest) = line.split_once(" records sent, ")?;
    let rate = rest.split_once(" records/sec")?.0;
    Some((sent.trim().parse().ok()?, rate.trim().parse().ok()?))
}

/// Runs `r` on `slot` until the backlog ending at `end` (of `rows` events) is through.
pub fn run(b: &Bench, r: Reader, slot: &str, end: &str, rows: u64) -> Result<Sample> {
    let log = b.work.join(format!("{slot}.log"));
    let time = b.work.join(format!("{slot}.time"));
    let ex = &b.tools.examples;
    let sample = match r.kind {
        Kind::Recv => {
            let mut cmd = bench_reader(b, slot, end, "exit", &log);
            cmd.args(["/usr/bin/time", "-f", "%U %S %M", "-o"]).arg(&time);
            cmd.arg(b.pg.pg_bin.join("pg_recvlogical")).args(["-d", &b.pg.conninfo(r.transport)]);
            cmd.args(["--slot", slot, "--start", "-o", "proto_version=1", "-o", "publication_names=outboxd"]);
            cmd.args(["--endpos", end, "-f", "/dev/null"]);
            let line = checked(cmd, &log, &format!("pg_recvlogical on {slot}"))?;
            let s = parse_reader_line(&line)?;
            let (cpu, hwm) = measure::time_file(&time).context("no /usr/bin/time figures")?;
            Sample { cpu: Some(cpu), hwm_kib: Some(hwm), ..s }
        }
        Kind::Broker => {
            // No PostgreSQL: librdkafka alone pushing the same number of ~300 B records into the broker.
            let topics: Vec<String> = (1..=5).map(|i| format!("{slot}.t{i}")).collect();
            let mut cmd = Command::new("/usr/bin/time");
            cmd.args(["-f", "%U %S %M", "-o"]).arg(&time).arg(ex.join("bench_latency"));
            cmd.args(["--brokers", &format!("127.0.0.1:{}", b.kafka_port()), "--topics", &topics.join(",")]);
            cmd.args(["--produce", &rows.to_string()]);
            let line = checked(cmd, &log, &format!("producer-alone run {slot}"))?;
            let secs =
                measure::kv("secs", &line).and_then(|s| s.parse().ok()).context("no secs= from bench_latency")?;
            let (cpu, hwm) = measure::time_file(&time).context("no /usr/bin/time figures")?;
            Sample { secs, cpu: Some(cpu), hwm_kib: Some(hwm), walsender: None, first_secs: None }
        }
        Kind::Perf => {
            // No PostgreSQL: Kafka's own Java producer sending as many records of the backlog's
            // average payload size. Its seconds are its own (N / its records/sec); its CPU is not
            // shown, as a fresh JVM's would be mostly start-up and JIT compilation.
            let size = b.report.payload_bytes.as_deref().and_then(|p| p.parse().ok()).unwrap_or(300);
            let mut cmd = Command::new("/usr/bin/time");
            cmd.args(["-f", "%U %S %M", "-o"]).arg(&time).args(producer_perf_cmd(b, PERF_TOPIC, rows, size)?);
            let what = format!("ProducerPerformance run {slot}");
            let out = cmd.stdin(Stdio::null()).stderr(std::fs::File::create(&log)?).output()?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            std::fs::write(b.work.join(format!("{slot}.out")), stdout.as_bytes())?;
            let errors = std::fs::read_to_string(&log).unwrap_or_default();
            if !out.status.success() || errors.contains("org.apache.kafka.common.errors.") {
                bail!("{what} failed ({}):\n{}\n{}", out.status, stdout.trim(), procs::tail(&log, 30));
            }
            let (sent, rate) =
                parse_perf_summary(&stdout).with_context(|| format!("{what}: no summary in '{stdout}'"))?;
            if sent != rows || rate <= 0.0 {
                bail!("{what}: {sent} records sent at {rate} records/sec, expected {rows}");
            }
            let hwm = measure::time_file(&time).map(|(_, h)| h);
            Sample { secs: rows as f64 / rate, cpu: None, hwm_kib: hwm, walsender: None, first_secs: None }
        }
        Kind::Debezium => crate::debezium::run(b, slot, rows)?,
        Kind::Null | Kind::Kafka | Kind::KafkaEos | Kind::KafkaAvro | Kind::Http | Kind::Rabbitmq => {
            if r.kind == Kind::Rabbitmq {
                rabbit(b, "purge")?;
            }
            let mut cmd = bench_reader(b, slot, end, "confirmed", &log);
            cmd.arg(&b.tools.outboxd).arg("run").args(outboxd_source(b, r, slot)).args(sink_flags(b, r));
            cmd.args(["--status-interval", "100ms"]).args(b.knobs.outboxd_extra_args());
            let line = checked(cmd, &log, &format!("outboxd --sink {} on {slot}", r.name()))?;
            if r.kind == Kind::Rabbitmq {
                let queued: u64 = rabbit(b, "purge")?.trim().parse().context("bench_rabbitmq purge")?;
                if queued < rows {
                    bail!("outboxd --sink rabbitmq on {slot}: the queue held {queued} of {rows} events");
                }
            }
            parse_reader_line(&line)?
        }
    };
    Ok(sample)
}

fn outboxd_source(b: &Bench, r: Reader, slot: &str) -> Vec<String> {
    let url = match r.transport {
        Transport::Socket => b.pg.outboxd_url(),
        t => b.pg.conninfo(t),
    };
    vec!["--postgres-url".into(), url, "--slot".into(), slot.into()]
}

fn sink_flags(b: &Bench, r: Reader) -> Vec<String> {
    let k = &b.knobs;
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match r.kind {
        Kind::Http => {
            let port = b.far.webhook.as_ref().map_or(0, |w| w.port);
            // ${topic} stays literal for outboxd to fill in.
            let url = format!("http://127.0.0.1:{port}/in/${{topic}}");
            s(&["--sink", "http", "--http-url", &url, "--http-batch", &k.http_batch.to_string()])
                .into_iter()
                .chain(s(&["--http-concurrency", &k.http_concurrency.to_string()]))
                .collect()
        }
        Kind::Rabbitmq => s(&[
            "--sink",
            "rabbitmq",
            "--rabbitmq-url",
            &k.rabbit_url,
            "--rabbitmq-exchange",
            b.far.rabbit.as_deref().unwrap_or(""),
        ]),
        Kind::Null | Kind::Kafka => {
            let sink = if r.kind == Kind::Null { "null" } else { "kafka" };
            s(&["--sink", sink]).into_iter().chain(kafka_flags(b, r.transport)).collect()
        }
        Kind::KafkaEos => {
            s(&["--sink", "kafka", "--delivery", "exactly-once", "--transaction-interval", &k.eos_interval])
                .into_iter()
                .chain(kafka_flags(b, r.transport))
                .collect()
        }
        Kind::KafkaAvro => {
            let url = b.far.registry.as_ref().map_or_else(String::new, |r| r.url.clone());
            s(&["--sink", "kafka", "--value-converter", "avro", "--schema-registry-url", &url])
                .into_iter()
                .chain(kafka_flags(b, r.transport))
                .collect()
        }
        Kind::Recv | Kind::Broker | Kind::Perf | Kind::Debezium => Vec::new(),
    }
}

/// `bench_reader` polling `slot` over the Unix socket until `until` (exit | confirmed), with
/// the reader's output in `log`; the reader's command follows.
fn bench_reader(b: &Bench, slot: &str, end: &str, until: &str, log: &Path) -> Command {
    let mut cmd = Command::new(b.tools.examples.join("bench_reader"));
    cmd.args(["--pg", &b.pg.socket_conninfo(), "--slot", slot, "--end", end, "--until", until, "--log"]);
    cmd.arg(log).arg("--");
    cmd
}

/// Runs a timing command; its stdout's last line, or an error with the log's tail.
fn checked(mut cmd: Command, log: &Path, what: &str) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::piped()).output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("{what} failed: {}\n{}", err.trim(), procs::tail(log, 30));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("").to_owned())
}

/// bench_reader's line: `seconds reader_cpu_seconds reader_hwm_kib walsender_cpu_seconds`.
fn parse_reader_line(line: &str) -> Result<Sample> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 4 {
        bail!("unexpected bench_reader output '{line}'");
    }
    Ok(Sample {
        secs: f[0].parse().with_context(|| format!("bench_reader seconds '{}'", f[0]))?,
        cpu: f[1].parse().ok(),
        hwm_kib: f[2].parse().ok(),
        walsender: f[3].parse().ok(),
        first_secs: None,
    })
}

/// `bench_rabbitmq ACTION NAME` on the run's exchange and queue; its output.
pub fn rabbit(b: &Bench, action: &str) -> Result<String> {
    let name = b.far.rabbit.as_deref().context("RabbitMQ not set up")?;
    procs::output(Command::new(b.tools.examples.join("bench_rabbitmq")).args([
        "--url",
        &b.knobs.rabbit_url,
        action,
        name,
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_baselines_follow_the_transport() {
        assert_eq!(local(Kind::Kafka).name(), "kafka");
        assert_eq!(over(Kind::Kafka, Transport::Ktls).name(), "kafka_ktls");
        assert_eq!(local(Kind::Null).baseline(), local(Kind::Recv));
        assert_eq!(over(Kind::Kafka, Transport::Ktls).baseline(), over(Kind::Recv, Transport::Tcp));
        assert_eq!(over(Kind::Null, Transport::Tls).baseline(), over(Kind::Recv, Transport::Tls));
    }

    #[test]
    fn labels_say_what_runs() {
        assert_eq!(local(Kind::Http).label(100), "outboxd --sink http --http-batch 100");
        assert_eq!(over(Kind::Recv, Transport::Tls).label(1), "pg_recvlogical, TLS (verify-full)");
        assert_eq!(local(Kind::Broker).label(1), "librdkafka producer alone");
        assert!(local(Kind::Broker).table_label(1).contains("no PostgreSQL"));
        assert!(local(Kind::Perf).table_label(1).contains("acks=all, linger.ms=5"));
        assert!(!local(Kind::Perf).reads_slot() && local(Kind::Perf).shows_far_side());
        assert_eq!(
            over(Kind::Kafka, Transport::Tls).label(1),
            "outboxd --sink kafka, TLS: PostgreSQL verify-full, Kafka TLS listener"
        );
    }

    #[test]
    fn producer_perf_summaries_parse() {
        let out = "1000 records sent, 200.0 records/sec (0.06 MB/sec), 5.0 ms avg latency, 9.0 ms max latency.\n\
                   2000 records sent, 1167.542323 records/sec (0.33 MB/sec), 354.50 ms avg latency, 1266.00 ms max \
                   latency, 369 ms 50th, 391 ms 95th, 407 ms 99th, 407 ms 99.9th.\n";
        assert_eq!(parse_perf_summary(out), Some((2000, 1167.542323)));
        assert_eq!(parse_perf_summary("no summary\n"), None);
    }

    #[test]
    fn reader_lines_parse_with_unknowns() {
        let s = parse_reader_line("1.250 0.80 30000 -").unwrap();
        assert_eq!(s, Sample { secs: 1.25, cpu: Some(0.8), hwm_kib: Some(30000), walsender: None, first_secs: None });
        assert!(parse_reader_line("1.0 2.0").is_err());
    }
}
