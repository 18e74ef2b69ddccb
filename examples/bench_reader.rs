//! Benchmark helper for `bench/run`: run one slot reader and time it against a fixed end LSN.
//!
//! The helper connects to PostgreSQL first (so its own connection set-up is not timed), then
//! spawns the reader command and polls `pg_replication_slots` every `--poll-ms` over that one
//! connection. Two modes:
//!
//! * `--until confirmed` (outboxd): stop when the slot's `confirmed_flush_lsn >= --end`. Just
//!   before stopping the reader (SIGTERM) it reads the reader's `utime+stime` from
//!   `/proc/PID/stat` (all threads, live and exited) and `VmHWM` from `/proc/PID/status`.
//! * `--until exit` (pg_recvlogical with `--endpos`): wait for the reader to exit by itself. Its
//!   CPU and peak RSS come from the `/usr/bin/time` wrapper the caller puts in front of it.
//!
//! In both modes it samples the walsender serving the slot (`active_pid`) so the caller can see
//! how busy the server side was. Prints one line:
//! `seconds reader_cpu_seconds reader_hwm_kib walsender_cpu_seconds` (`-` where unknown).
//!
//! Usage: `bench_reader --pg CONNSTR --slot NAME --end LSN --until confirmed|exit -- CMD ARGS...`

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

struct Args {
    pg: String,
    slot: String,
    end: String,
    until_exit: bool,
    poll: Duration,
    timeout: Duration,
    log: Option<String>,
    cmd: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut pg, mut slot, mut end, mut until) = (None, None, None, None);
    let mut poll = Duration::from_millis(10);
    let mut timeout = Duration::from_secs(3600);
    let mut log = None;
    let mut cmd = Vec::new();
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--pg" => pg = Some(val()?),
            "--slot" => slot = Some(val()?),
            "--end" => end = Some(val()?),
            "--until" => until = Some(val()?),
            "--poll-ms" => poll = Duration::from_millis(val()?.parse().map_err(|e| format!("{e}"))?),
            "--timeout-secs" => timeout = Duration::from_secs(val()?.parse().map_err(|e| format!("{e}"))?),
            "--log" => log = Some(val()?),
            "--" => {
                cmd.extend(it.by_ref());
                break;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let until_exit = match until.as_deref() {
        Some("exit") => true,
        Some("confirmed") => false,
        _ => return Err("--until exit|confirmed is required".into()),
    };
    if cmd.is_empty() {
        return Err("no command after --".into());
    }
    Ok(Args {
        pg: pg.ok_or("--pg is required")?,
        slot: slot.ok_or("--slot is required")?,
        end: end.ok_or("--end is required")?,
        until_exit,
        poll,
        timeout,
        log,
        cmd,
    })
}

fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of a process (all its threads), in seconds.
fn cpu_seconds(pid: u32, tck: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / tck)
}

fn hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()
}

fn fmt_opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().map_err(|e| format!("bench_reader: {e}"))?;
    let tck = clk_tck();
    let (client, conn) = tokio_postgres::connect(&args.pg, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("bench_reader: connection: {e}");
        }
    });
    let poll_stmt = client
        .prepare(
            "SELECT coalesce(confirmed_flush_lsn >= $1::text::pg_lsn, false), active_pid \
             FROM pg_replication_slots WHERE slot_name = $2",
        )
        .await?;

    let (stdout, stderr) = match &args.log {
        Some(path) => {
            let f = std::fs::File::create(path)?;
            (Stdio::from(f.try_clone()?), Stdio::from(f))
        }
        None => (Stdio::null(), Stdio::inherit()),
    };
    let t0 = Instant::now();
    let mut child = Command::new(&args.cmd[0]).args(&args.cmd[1..]).stdout(stdout).stderr(stderr).spawn()?;
    let pid = child.id();

    let mut walsender: Option<(i32, f64)> = None;
    let sample_walsender = |active: Option<i32>, walsender: &mut Option<(i32, f64)>| {
        if let Some(p) = active {
            if let Some(c) = cpu_seconds(p as u32, tck) {
                *walsender = Some((p, c));
            }
        }
    };

    // On any error the reader must not outlive this helper (e.g. outboxd retrying a cluster the
    // driver has stopped).
    let measured = async {
        let v = loop {
            if args.until_exit {
                if let Some(status) = child.try_wait()? {
                    let secs = t0.elapsed().as_secs_f64();
                    if !status.success() {
                        return Err(format!("reader exited with {status}").into());
                    }
                    break (secs, None, None);
                }
            } else if let Some(status) = child.try_wait()? {
                return Err(format!("reader exited early with {status}").into());
            }
            let row = client.query_opt(&poll_stmt, &[&args.end, &args.slot]).await?;
            if let Some(row) = row {
                let reached: bool = row.get(0);
                let active: Option<i32> = row.get(1);
                sample_walsender(active, &mut walsender);
                if reached && !args.until_exit {
                    let secs = t0.elapsed().as_secs_f64();
                    let cpu = cpu_seconds(pid, tck);
                    let hwm = hwm_kib(pid);
                    break (secs, cpu, hwm);
                }
            }
            if t0.elapsed() > args.timeout {
                let _ = child.kill();
                return Err("timed out".into());
            }
            tokio::time::sleep(args.poll).await;
        };
        Ok::<_, Box<dyn std::error::Error>>(v)
    }
    .await;
    let (secs, cpu, hwm) = match measured {
        Ok(v) => v,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };

    if !args.until_exit {
        let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if child.try_wait()?.is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!(
        "{secs:.3} {} {} {}",
        fmt_opt(cpu.map(|c| format!("{c:.2}"))),
        fmt_opt(hwm),
        fmt_opt(walsender.map(|(_, c)| format!("{c:.2}")))
    );
    Ok(())
}
