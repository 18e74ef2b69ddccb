//! The run's report: the sections the scenarios write, the targets they check, the scenario run
//! times, the document that puts them together, and its place on top of `bench/RESULTS.md`.
//!
//! RESULTS.md keeps every run: the newest on top, everything before it under "Earlier runs" one
//! heading level down, so the history is never rewritten, only pushed down. The one exception is
//! the placeholder section for the first Apache Kafka figures (`KAFKA_PLACEHOLDER`), which the
//! first run written after it replaces.

use std::fmt::Write as _;
use std::process::Command;

use crate::stats::human_secs;

/// One issue-14 target and its verdict (`None`: could not be decided).
pub struct Target {
    pub name: String,
    pub measured: String,
    pub pass: Option<bool>,
}

#[derive(Default)]
pub struct Report {
    /// The scenarios' sections, in run order.
    pub body: String,
    pub targets: Vec<Target>,
    /// (scenario, wall time, load average start → end)
    pub times: Vec<(String, String, String)>,
    /// Average payload size of the last backlog, in bytes.
    pub payload_bytes: Option<String>,
}

impl Report {
    pub fn section(&mut self, text: &str) {
        self.body.push_str(text);
    }

    pub fn target(&mut self, name: impl Into<String>, measured: impl Into<String>, pass: Option<bool>) {
        self.targets.push(Target { name: name.into(), measured: measured.into(), pass });
    }
}

/// `value >= bound` when the value is known.
pub fn at_least(v: Option<f64>, bound: f64) -> Option<bool> {
    v.map(|v| v >= bound)
}

/// `value <= bound` when the value is known.
pub fn at_most(v: Option<f64>, bound: f64) -> Option<bool> {
    v.map(|v| v <= bound)
}

/// "0.85×", or "n/a" for an unknown ratio.
pub fn times_cell(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2}×"))
}

/// What the document's header says about the run.
pub struct RunInfo {
    pub args: String,
    pub pg_version: String,
    pub settings: String,
    pub total_secs: u64,
    /// The cargo profile of the binaries under test ("release" from bench/run).
    pub profile: String,
}

const HOW_TO_READ: &str = "How to read the drain tables: pg_recvlogical (proto 1, same publication, to /dev/null, `--endpos`) is the ceiling: PostgreSQL's walsender decoding and sending the same WAL. outboxd runs until the slot's confirmed_flush_lsn reaches the backlog's end LSN (`--status-interval 100ms`, polled every 10 ms over one connection), so its time includes start-up, set-up checks and the final confirmation. CPU = the reader's own user+system time (outboxd: /proc/PID/stat just before SIGTERM, all threads; pg_recvlogical: /usr/bin/time). Peak RSS = VmHWM (outboxd) or /usr/bin/time's maximum RSS (pg_recvlogical). walsender CPU = the server process serving the slot; broker CPU = the Apache Kafka broker's JVM (all threads) during the Kafka reader's run (all on the same 2 cores; /proc/PID/stat utime+stime before and after each run), shown per record and as a share of the reader's own CPU in the same repetition (broker CPU ÷ reader CPU: above 1, the broker spent more cycles on the drain than the reader did); on the `--sink http` row it is bench_webhook's CPU instead (an axum receiver answering 200 after reading each body; outboxd posts CloudEvents JSON batches of --http-batch events over --http-concurrency keep-alive lanes). The two \"alone\" rows are the broker's own ceiling on this box, with no PostgreSQL involved (their ratios are still against pg_recvlogical): \"librdkafka producer alone\" is bench_latency --produce pushing the same number of ~300 B records (5 topics, id header, outboxd's producer settings and its default 10,000 in flight) into the same broker, its time starting after producer start-up; \"ProducerPerformance alone\" is Apache Kafka's own Java producer (`org.apache.kafka.tools.ProducerPerformance` on the jars `scripts/kafka` fetched, in a JVM with the default JIT and G1) sending the same number of records of the backlog's average payload size (keys round-robin over 1,000, one topic with one partition created by a warm-up, `--throughput -1`) with outboxd's acks=all, linger.ms=5 and idempotence and the Java client's other defaults (batch.size 16 KiB, no compression); its seconds are records / its own records/sec (its clock runs from just before the first send to the producer's close, so the first metadata request and the final flush count, JVM and producer start-up do not), and its CPU is not shown (a fresh JVM's is mostly start-up and JIT compilation); its peak RSS is the JVM's.";

/// The whole report of one run, as printed and as put on top of RESULTS.md.
pub fn document(r: &Report, info: &RunInfo) -> String {
    let mut d = String::new();
    let args = if info.args.is_empty() { String::new() } else { format!(" {}", info.args) };
    let _ = writeln!(d, "## {} — `bench/run{args}`\n", sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]));
    let _ = writeln!(
        d,
        "Machine: {} CPUs ({}), {} GiB RAM, {}; PostgreSQL {} (fsync=off); {} (one broker, KRaft combined mode, from `scripts/kafka`; no fsync per message) on the same host; \
         outboxd {}{}, {} build. The box is shared and noisy: read the ratios (each against pg_recvlogical in the \
         same repetition), not the absolute rates.\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model(),
        mem_gib(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        info.pg_version,
        kafka_version(),
        sh("git", &["rev-parse", "--short", "HEAD"]),
        if sh("git", &["status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"]).is_empty() {
            ""
        } else {
            " + uncommitted changes in src/"
        },
        info.profile,
    );
    let _ = writeln!(
        d,
        "Payload: ~{} B of jsonb text per event (1,000 aggregates, 5 event types). {}\n",
        r.payload_bytes.as_deref().unwrap_or("?"),
        info.settings
    );
    if !r.targets.is_empty() {
        d.push_str("### Targets\n\n| target | measured | verdict |\n|---|---|---|\n");
        for t in &r.targets {
            let v = match t.pass {
                Some(true) => "**PASS**",
                Some(false) => "**FAIL**",
                None => "n/a",
            };
            let _ = writeln!(d, "| {} | {} | {v} |", t.name, t.measured);
        }
        d.push('\n');
    }
    d.push_str(&r.body);
    let _ = writeln!(d, "{HOW_TO_READ}\n");
    d.push_str("### Scenario run times\n\n");
    d.push_str("| scenario | wall time (incl. inserts) | 1-min load average, start → end (2 CPUs; other engineers' tests included) |\n|---|---|---|\n");
    for (s, wall, load) in &r.times {
        let _ = writeln!(d, "| {s} | {wall} | {load} |");
    }
    let _ = writeln!(d, "| total (after build and cluster start) | {} | |\n", human_secs(info.total_secs));
    d
}

const RESULTS_INTRO: &str = "# Benchmark results

Produced by `bench/run` (see its header for scenarios and knobs). Every outboxd number is
compared with pg_recvlogical measured in the same run on the same backlog; the machines here
are shared and noisy, so compare ratios, not absolute rates across runs.
";

/// The placeholder section at the top of RESULTS.md for the first figures measured against Apache
/// Kafka; the first run written after it replaces it.
const KAFKA_PLACEHOLDER: &str = "## Apache Kafka 4.4.0\n\nto be filled by the next full run\n\n";

/// The new RESULTS.md: title and intro, this run, then "Earlier runs": the old file minus its
/// title (and its intro, when bench/run wrote it, and the Apache Kafka placeholder), the headings
/// of its newest run demoted one level.
pub fn results_file(old: &str, run: &str) -> String {
    let old = old.replacen(KAFKA_PLACEHOLDER, "", 1);
    let mut out = format!("{RESULTS_INTRO}\n{run}## Earlier runs\n\n");
    let ours = old.contains("Produced by `bench/run`");
    let (mut started, mut earlier) = (false, false);
    for line in old.lines() {
        if line == "## Earlier runs" {
            earlier = true;
            continue;
        }
        if line == "# Benchmark results" {
            continue;
        }
        if ours && !started && !line.starts_with('#') {
            continue;
        }
        started = true;
        if !earlier && line.starts_with('#') {
            out.push('#');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// "Apache Kafka 4.4.0" (`scripts/kafka version`).
fn kafka_version() -> String {
    let v = sh("bash", &["scripts/kafka", "version"]);
    if v.is_empty() {
        "Apache Kafka ?".to_owned()
    } else {
        v
    }
}

fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(": "))
        .map_or_else(|| "?".to_owned(), |(_, m)| m.to_owned())
}

fn mem_gib() -> String {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib: f64 = info
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    format!("{:.0}", kib / 1_048_576.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_runs_move_down_one_heading_level() {
        let old = format!(
            "{RESULTS_INTRO}\n## run 2\n\n### Targets\ntext\n## Earlier runs\n\n### run 1\n#### Drain\nold text\n"
        );
        let new = results_file(&old, "## run 3\n\nnew\n");
        let expected = format!(
            "{RESULTS_INTRO}\n## run 3\n\nnew\n## Earlier runs\n\n### run 2\n\n#### Targets\ntext\n\n### run 1\n#### Drain\nold text\n"
        );
        assert_eq!(new, expected);
    }

    #[test]
    fn the_first_run_replaces_the_kafka_placeholder() {
        let old = format!("{RESULTS_INTRO}\n{KAFKA_PLACEHOLDER}## run 1\n\nNote: older broker.\n");
        let new = results_file(&old, "## run 2\n\nnew\n");
        assert_eq!(
            new,
            format!("{RESULTS_INTRO}\n## run 2\n\nnew\n## Earlier runs\n\n### run 1\n\nNote: older broker.\n")
        );
    }

    #[test]
    fn the_results_file_has_its_intro_and_placeholder() {
        let file = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/RESULTS.md")).unwrap();
        assert!(file.starts_with(&format!("{RESULTS_INTRO}\n")));
        assert!(file.contains(KAFKA_PLACEHOLDER) || !file.contains("to be filled by the next full run"));
    }

    #[test]
    fn a_hand_written_file_keeps_its_text() {
        let new = results_file("# Benchmark results\n\nnotes by hand\n## a run\n", "## run\n");
        assert!(new.ends_with("## Earlier runs\n\n\nnotes by hand\n### a run\n"), "{new}");
    }

    #[test]
    fn verdicts_need_a_value() {
        assert_eq!(at_least(Some(0.9), 0.9), Some(true));
        assert_eq!(at_least(Some(0.89), 0.9), Some(false));
        assert_eq!(at_most(Some(64.1), 64.0), Some(false));
        assert_eq!(at_most(None, 64.0), None);
        assert_eq!(times_cell(Some(0.456)), "0.46×");
        assert_eq!(times_cell(None), "n/a");
    }
}
