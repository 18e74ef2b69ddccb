//! The profile scenario: where outboxd spends its time on N_PROFILE single-row transactions.
//!
//! First `perf stat` (system calls, reads, writes, waits, futex calls and context switches per
//! event; whole process, all threads) for pg_recvlogical and outboxd null/kafka, over the Unix
//! socket and (PROFILE_TLS=1) over TCP plaintext and TLS; then `perf record` with DWARF call
//! graphs of outboxd --sink null and --sink kafka: top functions by self and inclusive time, by
//! thread and by binary. All readers read one backlog from slots created before it.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;
use regex::Regex;

use crate::bench::Bench;
use crate::broker::Listeners;
use crate::procs;
use crate::readers::{local, over, Kind, Reader, Transport};

const EVENTS: &str = "task-clock,context-switches,raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_write,syscalls:sys_enter_sendto,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_poll,syscalls:sys_enter_ppoll,syscalls:sys_enter_select,syscalls:sys_enter_pselect6,syscalls:sys_enter_futex,syscalls:sys_enter_clock_nanosleep";

/// Runs outboxd (`r`: null or kafka, over its transport; Kafka on the plaintext listener) under
/// `perf ARGS --` until the slot is confirmed past `end`, then SIGTERMs outboxd (perf's child) and
/// waits for perf.
fn perf_outboxd(b: &Bench, slot: &str, r: Reader, end: &str, perf_args: &[&str]) -> Result<()> {
    let url = if r.transport == Transport::Socket { b.pg.outboxd_url() } else { b.pg.conninfo(r.transport) };
    let sink = if r.kind == Kind::Null { "null" } else { "kafka" };
    let log = std::fs::File::create(b.work.join(format!("{slot}.log")))?;
    let mut perf = Command::new("perf")
        .args(perf_args)
        .arg("--")
        .arg(&b.tools.outboxd)
        .args(["run", "--postgres-url", &url, "--slot", slot, "--sink", sink])
        .args(["--kafka-brokers", &format!("127.0.0.1:{}", b.kafka_port()), "--status-interval", "100ms"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    procs::track(perf.id());
    let t0 = Instant::now();
    let mut outboxd = None;
    while outboxd.is_none() && t0.elapsed() < Duration::from_secs(10) {
        let kids = std::fs::read_to_string(format!("/proc/{}/task/{}/children", perf.id(), perf.id()));
        outboxd = kids.ok().and_then(|k| k.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()));
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(pid) = outboxd {
        procs::track(pid);
        let done =
            format!("SELECT confirmed_flush_lsn >= '{end}' FROM pg_replication_slots WHERE slot_name = '{slot}'");
        while std::path::Path::new(&format!("/proc/{pid}")).exists() && b.pg.value(&done)? != "t" {
            std::thread::sleep(Duration::from_millis(50));
        }
        procs::terminate(pid);
        procs::untrack(pid);
    }
    let _ = perf.wait();
    procs::untrack(perf.id());
    Ok(())
}

/// `perf stat -x,` output as event name → count.
fn stat_counts(csv: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in csv.lines() {
        let f: Vec<&str> = line.split(',').collect();
        let (Some(v), Some(name)) = (f.first().and_then(|v| v.parse::<f64>().ok()), f.get(2)) else { continue };
        let name = name.rsplit(':').next().unwrap_or(name);
        out.insert(name.to_owned(), v);
    }
    out
}

fn stat_row(label: &str, c: &HashMap<String, f64>, n: f64) -> String {
    let g = |k: &str| c.get(k).copied().unwrap_or(0.0);
    let cpu = g("task-clock") * 1000.0 / n;
    let cs = g("context-switches") / n;
    if !c.contains_key("sys_enter") {
        return format!("| {label} | {cpu:.1} | n/a | n/a | n/a | n/a | n/a | {cs:.2} |\n");
    }
    let reads = g("sys_enter_read") + g("sys_enter_recvfrom");
    let writes = g("sys_enter_write") + g("sys_enter_sendto");
    let waits =
        ["epoll_wait", "poll", "ppoll", "select", "pselect6"].iter().map(|w| g(&format!("sys_enter_{w}"))).sum::<f64>();
    format!(
        "| {label} | {cpu:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {cs:.2} |\n",
        g("sys_enter") / n,
        reads / n,
        writes / n,
        waits / n,
        g("sys_enter_futex") / n
    )
}

/// The entry lines of a `perf report --stdio`, tidied, at most `max`.
fn entries(report: &str, max: usize) -> Vec<String> {
    let entry = Regex::new(r"^ +[0-9.]+%").expect("valid regex");
    let tail = Regex::new(r"(\s+-\s+-\s*|\s+)$").expect("valid regex");
    report.lines().filter(|l| entry.is_match(l)).map(|l| tail.replace(l, "").into_owned()).take(max).collect()
}

fn perf_report(data: &std::path::Path, args: &[&str]) -> String {
    Command::new("perf")
        .arg("report")
        .arg("-i")
        .arg(data)
        .args(args)
        .args(["--stdio", "-g", "none"])
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

pub fn profile(b: &mut Bench) -> Result<()> {
    b.new_broker(Listeners::Plaintext)?;
    b.pg.reset()?;
    let k = b.knobs.clone();
    let mut stat_readers = vec![local(Kind::Recv), local(Kind::Null), local(Kind::Kafka)];
    if k.profile_tls {
        for t in [Transport::Tcp, Transport::Tls] {
            stat_readers.extend([over(Kind::Recv, t), over(Kind::Null, t)]);
        }
    }
    let mut slots: Vec<String> = stat_readers.iter().map(|r| format!("stat_{}", r.name())).collect();
    slots.extend(["prof_null".to_owned(), "prof_kafka".to_owned()]);
    b.pg.create_slots(&slots)?;
    println!("   inserting {} single-row transactions...", k.n_profile);
    b.pg.insert_rows(k.n_profile, 1, "")?;
    let end = b.pg.insert_lsn()?;
    b.pg.exec("CHECKPOINT")?;

    let n = k.n_profile as f64;
    let mut md = format!(
        "### Profile: where outboxd spends its time ({} single-row transactions)\n\n\
         System calls and context switches per event (`perf stat`, whole process incl. all threads; reads = read + recvfrom, writes = write + sendto, waits = epoll_wait + poll + ppoll + select + pselect6). Rows without a transport use the Unix socket; TCP and TLS rows connect to 127.0.0.1 as in the TLS section:\n\n\
         | reader | CPU µs/event (task-clock) | syscalls/event | reads/event | writes/event | waits/event | futex/event | context switches/event |\n\
         |---|---|---|---|---|---|---|---|\n",
        k.n_profile
    );
    for &r in &stat_readers {
        let slot = format!("stat_{}", r.name());
        let st = b.work.join(format!("{slot}.csv"));
        let st_s = st.to_string_lossy().into_owned();
        if r.kind == Kind::Recv {
            let _ = Command::new("perf")
                .args(["stat", "-x,", "-o", &st_s, "-e", EVENTS, "--"])
                .arg(b.pg.pg_bin.join("pg_recvlogical"))
                .args(["-d", &b.pg.conninfo(r.transport), "--slot", &slot, "--start", "-o", "proto_version=1"])
                .args(["-o", "publication_names=outboxd", "--endpos", &end, "-f", "/dev/null"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        } else {
            perf_outboxd(b, &slot, r, &end, &["stat", "-x,", "-o", &st_s, "-e", EVENTS])?;
        }
        let counts = stat_counts(&std::fs::read_to_string(&st).unwrap_or_default());
        println!("   perf stat {}: {counts:?}", r.label(k.http_batch));
        md.push_str(&stat_row(&r.label(k.http_batch), &counts, n));
    }
    md.push('\n');

    let inclusive = Regex::new(
        r"\] (outboxd::|rdkafka::|rd_kafka|__libc_(recv|send|write|read)|epoll_wait|malloc|free|cfree|_int_free|__memmove|tracing|metrics|tokio_postgres|postgres_protocol|serde_json)",
    )?;
    let wiring = Regex::new(r"\] outboxd::(main|run|app::)")?;
    for sink in ["null", "kafka"] {
        let r = local(if sink == "null" { Kind::Null } else { Kind::Kafka });
        let data = b.work.join(format!("perf_{sink}.data"));
        let data_s = data.to_string_lossy().into_owned();
        let slot = format!("prof_{sink}");
        perf_outboxd(b, &slot, r, &end, &["record", "-F", "1999", "--call-graph", "dwarf,32768", "-o", &data_s])?;
        let self_full = perf_report(&data, &["--no-children", "--sort", "symbol", "--percent-limit", "0.5"]);
        let selfs = entries(&self_full, 40);
        if selfs.is_empty() {
            eprintln!("   perf record produced no samples for --sink {sink}; see {}/{slot}.log", b.work.display());
            continue;
        }
        let samples = self_full.lines().find_map(|l| l.strip_prefix("# Samples")).unwrap_or("");
        let how = format!("`perf record -F 1999 --call-graph dwarf` of outboxd --sink {sink} (Samples{samples})");
        let incl: Vec<String> =
            entries(&perf_report(&data, &["--children", "--sort", "symbol", "--percent-limit", "1.5"]), usize::MAX)
                .into_iter()
                .filter(|l| inclusive.is_match(l) && !wiring.is_match(l))
                .take(30)
                .collect();
        let dso = entries(&perf_report(&data, &["--no-children", "--sort", "dso"]), 8);
        let comm = entries(&perf_report(&data, &["--no-children", "--sort", "comm"]), 8);
        let file = format!(
            "# {how}\n# self time by symbol\n{}\n# by thread\n{}\n# by binary\n{}\n# inclusive (outboxd functions and boundaries)\n{}\n",
            selfs.join("\n"),
            comm.join("\n"),
            dso.join("\n"),
            incl.join("\n")
        );
        std::fs::write(b.work.join(format!("profile-{sink}.txt")), &file)?;
        if k.profile_files {
            std::fs::write(format!("bench/profile-{sink}.txt"), &file)?;
        }
        md.push_str(&format!(
            "{how}, self time, top entries (the full list: `bench/profile-{sink}.txt`):\n\n```\n{}\n```\n\n\
             By thread and by binary (self):\n\n```\n{}\n\n{}\n```\n\n\
             Inclusive (callees included), outboxd's own functions and the boundaries it calls:\n\n```\n{}\n```\n\n",
            selfs[..selfs.len().min(15)].join("\n"),
            comm.join("\n"),
            dso.join("\n"),
            incl[..incl.len().min(18)].join("\n")
        ));
    }
    b.report.section(&md);
    b.pg.reset()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_stat_csv_gives_counts_by_short_name() {
        let csv = "# started on x\n\n1234.5,msec,task-clock,1,100.00,,\n200,,context-switches,1,100\n\
                   <not supported>,,raw_syscalls:sys_enter,0,100\n50,,syscalls:sys_enter_futex,1,100\n";
        let c = stat_counts(csv);
        assert_eq!(c.get("task-clock"), Some(&1234.5));
        assert_eq!(c.get("sys_enter_futex"), Some(&50.0));
        assert!(!c.contains_key("sys_enter"));
        // Without the tracepoints only CPU and context switches are shown.
        assert_eq!(stat_row("r", &c, 100.0), "| r | 12345.0 | n/a | n/a | n/a | n/a | n/a | 2.00 |\n");
    }

    #[test]
    fn report_entries_are_tidied() {
        let rep = "# Samples: 10K of event 'cycles'\n#\n    12.50%  [.] outboxd::router::route   -   -  \n     0.40%  x\nfoo\n";
        assert_eq!(entries(rep, 10), vec!["    12.50%  [.] outboxd::router::route", "     0.40%  x"]);
    }
}
