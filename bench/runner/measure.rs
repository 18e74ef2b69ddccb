//! What a reader cost: CPU seconds and peak RSS read from `/proc`, `/usr/bin/time` files, and the
//! `key=value` lines the bench examples print.
//!
//! CPU is utime + stime in clock ticks (all threads of a process); "tree" CPU adds the reaped
//! children's time and the live direct children's own, as the far-side columns need (a process
//! that forks workers is counted with them; the Kafka broker is one JVM, all threads). Values
//! that cannot be read are `None`, never zero.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The fields of `/proc/PID/stat` after the command name (field 3, the state, is index 0).
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

fn parse_stat(stat: &str) -> Option<Vec<u64>> {
    // The command name is in parentheses and may itself contain spaces and parentheses.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    Some(rest.split_whitespace().skip(1).map(|f| f.parse().unwrap_or(0)).collect())
}

/// utime + stime of one process, all its threads, in seconds.
pub fn proc_cpu(pid: u32) -> Option<f64> {
    let f = stat_fields(pid)?;
    // After skipping the state: utime is field 14, i.e. index 10; stime index 11.
    Some((f.get(10)? + f.get(11)?) as f64 / clk_tck())
}

/// utime + stime + cutime + cstime of each process and of its live direct children, in seconds.
pub fn tree_cpu(pids: &[u32]) -> f64 {
    let mut ticks = 0u64;
    for &pid in pids {
        let mut family = vec![pid];
        family.extend(children(pid));
        for p in family {
            if let Some(f) = stat_fields(p) {
                ticks += f.get(10..14).map(|s| s.iter().sum()).unwrap_or(0);
            }
        }
    }
    ticks as f64 / clk_tck()
}

/// The live direct children of a process (from every thread's `children` list).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for t in tasks.flatten() {
        if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(s.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
    }
    out
}

/// VmHWM of a live process, in KiB.
pub fn hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// `/usr/bin/time -f "%U %S %M"`'s last line: (user + system seconds, maximum RSS in KiB).
pub fn time_file(path: &Path) -> Option<(f64, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    parse_time_line(text.lines().last()?)
}

fn parse_time_line(line: &str) -> Option<(f64, u64)> {
    let mut it = line.split_whitespace();
    let u: f64 = it.next()?.parse().ok()?;
    let s: f64 = it.next()?.parse().ok()?;
    let m: u64 = it.next()?.parse().ok()?;
    Some((u + s, m))
}

/// The value of `key` in a line of space-separated `key=value` pairs.
pub fn kv<'a>(key: &str, line: &'a str) -> Option<&'a str> {
    line.split_whitespace().find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
}

/// `kv` as text, "?" when missing (a table cell).
pub fn kv_cell(key: &str, line: &str) -> String {
    kv(key, line).unwrap_or("?").to_owned()
}

/// The 1-minute load average.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_skip_a_command_name_with_spaces() {
        let stat = "42 (tokio (rt) 1) S 1 2 3 4 5 6 7 8 9 10 150 50 7 3 20 0";
        let f = parse_stat(stat).unwrap();
        assert_eq!(f[0], 1); // ppid
        assert_eq!((f[10], f[11], f[12], f[13]), (150, 50, 7, 3));
    }

    #[test]
    fn own_cpu_is_readable() {
        let burn: u64 = (0..2_000_000u64).fold(0, |a, b| a.wrapping_add(b * b));
        assert!(burn > 0);
        assert!(proc_cpu(std::process::id()).is_some_and(|c| c >= 0.0));
        assert!(hwm_kib(std::process::id()).is_some_and(|k| k > 0));
    }

    #[test]
    fn time_lines_add_user_and_system() {
        assert_eq!(parse_time_line("0.50 0.25 12345"), Some((0.75, 12345)));
        assert_eq!(parse_time_line("Command exited with non-zero status 1"), None);
    }

    #[test]
    fn kv_finds_exact_keys_only() {
        let line = "count=100 p50_ms=1.5 p99_ms=3.0";
        assert_eq!(kv("p50_ms", line), Some("1.5"));
        assert_eq!(kv("p5", line), None);
        assert_eq!(kv("max_ms", line), None);
        assert_eq!(kv_cell("max_ms", line), "?");
    }
}
