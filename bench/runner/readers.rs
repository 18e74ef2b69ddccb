//! The readers a drain compares, and how one of them is run and timed against a backlog.
//!
//! A reader is a kind (pg_recvlogical, outboxd with a sink, or librdkafka alone) and a transport:
//! `Socket` = PostgreSQL over the Unix socket, Kafka straight to tansu; `Tcp` = PostgreSQL over
//! TCP with sslmode=disable, Kafka straight to tansu; `Hop` = as `Tcp`, Kafka through a plain
//! socat hop; `Ktls` = as `Tcp`, Kafka over TLS through stunnel; `Tls` = PostgreSQL verify-full,
//! Kafka over TLS through stunnel. Its name (`kafka_tls`) names its slots and the raw rows.
//!
//! Every slot reader is run by `bench_reader`, which connects first, starts the reader, polls the
//! slot every 10 ms and stops outboxd once the slot is confirmed past the backlog's end (so its
//! time includes start-up, set-up checks and the final confirmation); pg_recvlogical stops itself
//! at `--endpos` and is measured by `/usr/bin/time`. Each reader is compared with the
//! pg_recvlogical over the same PostgreSQL transport: its `baseline`.

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
    Broker,
    Http,
    Rabbitmq,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Socket,
    Tcp,
    Hop,
    Ktls,
    Tls,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reader {
    pub kind: Kind,
    pub transport: Transport,
}

/// A reader over the Unix socket (Kafka direct).
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
}

impl Reader {
    pub fn name(self) -> String {
        let kind = match self.kind {
            Kind::Recv => "recv",
            Kind::Null => "null",
            Kind::Kafka => "kafka",
            Kind::Broker => "broker",
            Kind::Http => "http",
            Kind::Rabbitmq => "rabbitmq",
        };
        match self.transport {
            Transport::Socket => kind.to_owned(),
            Transport::Tcp => format!("{kind}_tcp"),
            Transport::Hop => format!("{kind}_hop"),
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
            Kind::Broker => "producer alone".to_owned(),
            Kind::Http => format!("outboxd --sink http --http-batch {http_batch}"),
            Kind::Rabbitmq => "outboxd --sink rabbitmq (durable queue, confirms)".to_owned(),
        };
        let suffix = match (self.kind, self.transport) {
            (Kind::Recv | Kind::Null, Transport::Tcp) => ", TCP, sslmode=disable",
            (Kind::Recv | Kind::Null, Transport::Tls) => ", TLS (verify-full)",
            (Kind::Kafka, Transport::Tcp) => ", plaintext: PostgreSQL over TCP, Kafka direct",
            (Kind::Kafka, Transport::Hop) => ", plaintext: PostgreSQL over TCP, Kafka through a socat TCP hop",
            (Kind::Kafka, Transport::Ktls) => ", PostgreSQL over TCP plaintext, Kafka TLS through stunnel",
            (Kind::Kafka, Transport::Tls) => ", TLS: PostgreSQL verify-full, Kafka through stunnel",
            _ => "",
        };
        format!("{base}{suffix}")
    }

    /// The label of its drain-table row (the producer alone says what it is).
    pub fn table_label(self, http_batch: u64) -> String {
        if self.kind == Kind::Broker {
            "librdkafka producer alone → tansu (no PostgreSQL)".to_owned()
        } else {
            self.label(http_batch)
        }
    }

    /// The pg_recvlogical its ratios are taken against: the one over the same PostgreSQL transport.
    pub fn baseline(self) -> Reader {
        let transport = match self.transport {
            Transport::Socket => Transport::Socket,
            Transport::Tcp | Transport::Hop | Transport::Ktls => Transport::Tcp,
            Transport::Tls => Transport::Tls,
        };
        over(Kind::Recv, transport)
    }

    /// Whether the table shows the far side's CPU (the broker's, or the webhook receiver's).
    pub fn shows_far_side(self) -> bool {
        matches!(self.kind, Kind::Kafka | Kind::Broker | Kind::Http)
    }

    /// The producer alone reads no slot.
    pub fn reads_slot(self) -> bool {
        self.kind != Kind::Broker
    }
}

/// outboxd's Kafka flags for a transport.
pub fn kafka_flags(b: &Bench, t: Transport) -> Vec<String> {
    let brokers = |port: u16| vec!["--kafka-brokers".to_owned(), format!("127.0.0.1:{port}")];
    match t {
        Transport::Hop => brokers(b.far.hop.as_ref().map_or(0, |p| p.port())),
        Transport::Tls | Transport::Ktls => {
            let mut f = brokers(b.far.tls.as_ref().map_or(0, |p| p.port()));
            f.extend([
                "--kafka-property".to_owned(),
                "security.protocol=ssl".to_owned(),
                "--kafka-property".to_owned(),
                format!("ssl.ca.location={}", b.pg.certs.join("ca.pem").display()),
            ]);
            f
        }
        Transport::Socket | Transport::Tcp => brokers(b.kafka_port()),
    }
}

/// The processes on the far side of a reader, whose CPU its row shows.
pub fn far_pids(b: &Bench, r: Reader) -> Vec<u32> {
    if r.kind == Kind::Http {
        return b.far.webhook.iter().map(|w| w.pid).collect();
    }
    match r.transport {
        Transport::Hop => b.far.hop.as_ref().map(|p| p.pids()).unwrap_or_default(),
        Transport::Tls | Transport::Ktls => b.far.tls.as_ref().map(|p| p.pids()).unwrap_or_default(),
        Transport::Socket | Transport::Tcp => b.far.tansu.iter().map(|t| t.pid).collect(),
    }
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
            // No PostgreSQL: librdkafka alone pushing the same number of ~300 B records into tansu.
            let topics: Vec<String> = (1..=5).map(|i| format!("{slot}.t{i}")).collect();
            let mut cmd = Command::new("/usr/bin/time");
            cmd.args(["-f", "%U %S %M", "-o"]).arg(&time).arg(ex.join("bench_latency"));
            cmd.args(["--brokers", &format!("127.0.0.1:{}", b.kafka_port()), "--topics", &topics.join(",")]);
            cmd.args(["--produce", &rows.to_string()]);
            let line = checked(cmd, &log, &format!("producer-alone run {slot}"))?;
            let secs =
                measure::kv("secs", &line).and_then(|s| s.parse().ok()).context("no secs= from bench_latency")?;
            let (cpu, hwm) = measure::time_file(&time).context("no /usr/bin/time figures")?;
            Sample { secs, cpu: Some(cpu), hwm_kib: Some(hwm), walsender: None }
        }
        Kind::Null | Kind::Kafka | Kind::Http | Kind::Rabbitmq => {
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
        Kind::Recv | Kind::Broker => Vec::new(),
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
        assert_eq!(over(Kind::Kafka, Transport::Hop).baseline(), over(Kind::Recv, Transport::Tcp));
        assert_eq!(over(Kind::Kafka, Transport::Ktls).baseline(), over(Kind::Recv, Transport::Tcp));
        assert_eq!(over(Kind::Null, Transport::Tls).baseline(), over(Kind::Recv, Transport::Tls));
    }

    #[test]
    fn labels_say_what_runs() {
        assert_eq!(local(Kind::Http).label(100), "outboxd --sink http --http-batch 100");
        assert_eq!(over(Kind::Recv, Transport::Tls).label(1), "pg_recvlogical, TLS (verify-full)");
        assert_eq!(local(Kind::Broker).label(1), "producer alone");
        assert!(local(Kind::Broker).table_label(1).contains("no PostgreSQL"));
    }

    #[test]
    fn reader_lines_parse_with_unknowns() {
        let s = parse_reader_line("1.250 0.80 30000 -").unwrap();
        assert_eq!(s, Sample { secs: 1.25, cpu: Some(0.8), hwm_kib: Some(30000), walsender: None });
        assert!(parse_reader_line("1.0 2.0").is_err());
    }
}
