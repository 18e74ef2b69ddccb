//! outboxd's `outboxd_commit_to_ack_seconds` between two Prometheus scrapes: the histogram's
//! bucket deltas, quantiles interpolated linearly inside a bucket (as PromQL's
//! `histogram_quantile`), and the exact share at a bucket bound. Builds that export a summary
//! instead give their quantiles from the second scrape. Pure: text in, numbers out.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const METRIC: &str = "outboxd_commit_to_ack_seconds";

/// GET /metrics from 127.0.0.1:`port`; empty when nothing answers (the metric is then absent).
pub fn scrape(port: u16) -> String {
    let get = || -> std::io::Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default())
    };
    get().unwrap_or_default()
}

fn value(line: &str) -> f64 {
    line.split_whitespace().last().and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

/// Bucket counts observed between the scrapes, by upper bound (+Inf as infinity), ascending.
/// `None` when the second scrape has no buckets.
pub fn bucket_deltas(before: &str, after: &str) -> Option<Vec<(f64, f64)>> {
    let prefix = format!("{METRIC}_bucket");
    let mut cum: Vec<(f64, f64)> = Vec::new();
    let mut seen = false;
    for (text, sign) in [(before, -1.0), (after, 1.0)] {
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else { continue };
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                continue;
            }
            let Some(le) = label(line, "le") else { continue };
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
            seen |= sign > 0.0;
            match cum.iter_mut().find(|(b, _)| *b == le) {
                Some((_, c)) => *c += sign * value(line),
                None => cum.push((le, sign * value(line))),
            }
        }
    }
    cum.sort_by(|a, b| a.0.total_cmp(&b.0));
    seen.then_some(cum)
}

/// The `q`-quantile in ms from bucket deltas; `None` with no observations.
pub fn quantile_ms(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.iter().find(|(le, _)| le.is_infinite())?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut prev_le, mut prev_c) = (0.0, 0.0);
    for &(le, c) in buckets {
        if c >= rank {
            if le.is_infinite() {
                return Some(prev_le * 1000.0);
            }
            let v = if c > prev_c { prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c) } else { le };
            return Some(v * 1000.0);
        }
        (prev_le, prev_c) = (le, c);
    }
    None
}

/// Percentage of observations in buckets ≤ `le` (a bucket bound: exact).
pub fn share_le(buckets: &[(f64, f64)], le: f64) -> Option<f64> {
    let total = buckets.iter().find(|(b, _)| b.is_infinite())?.1;
    let hit = buckets.iter().find(|(b, _)| *b == le)?.1;
    (total > 0.0).then(|| hit / total * 100.0)
}

/// Observations between the scrapes.
pub fn count(before: &str, after: &str) -> f64 {
    let prefix = format!("{METRIC}_count");
    let sum = |t: &str| t.lines().filter(|l| l.starts_with(&prefix)).map(value).sum::<f64>();
    sum(after) - sum(before)
}

/// A summary's `q` quantile in ms from the second scrape (builds without the histogram).
pub fn summary_quantile_ms(after: &str, q: f64) -> Option<f64> {
    let prefix = format!("{METRIC}{{");
    after
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter(|l| label(l, "quantile").and_then(|v| v.parse::<f64>().ok()) == Some(q))
        .map(value)
        .max_by(f64::total_cmp)
        .map(|v| v * 1000.0)
}

/// The `q` quantile in ms: from the histogram when exported, else from a summary.
pub fn commit_to_ack_ms(before: &str, after: &str, q: f64) -> Option<f64> {
    match bucket_deltas(before, after) {
        Some(b) => quantile_ms(&b, q),
        None => summary_quantile_ms(after, q),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape_text(counts: [u64; 4]) -> String {
        let les = ["0.01", "0.02", "0.05", "+Inf"];
        let mut s = String::from("# TYPE outboxd_commit_to_ack_seconds histogram\n");
        for (le, c) in les.iter().zip(counts) {
            s.push_str(&format!("outboxd_commit_to_ack_seconds_bucket{{le=\"{le}\"}} {c}\n"));
        }
        s.push_str(&format!("outboxd_commit_to_ack_seconds_count {}\n", counts[3]));
        s
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket_of_the_deltas() {
        // Before: 10 fast ones. After: 10 + 50 ≤ 10 ms, 40 in (10, 20] ms, 10 in (20, 50] ms.
        let before = scrape_text([10, 10, 10, 10]);
        let after = scrape_text([60, 100, 110, 110]);
        let b = bucket_deltas(&before, &after).unwrap();
        assert_eq!(b, vec![(0.01, 50.0), (0.02, 90.0), (0.05, 100.0), (f64::INFINITY, 100.0)]);
        // p50: rank 50, exactly the top of the first bucket.
        assert!((quantile_ms(&b, 0.5).unwrap() - 10.0).abs() < 1e-9);
        // p70: rank 70, halfway through (10, 20] ms.
        assert!((quantile_ms(&b, 0.7).unwrap() - 15.0).abs() < 1e-9);
        assert_eq!(share_le(&b, 0.02), Some(90.0));
        assert_eq!(count(&before, &after), 100.0);
        assert!((commit_to_ack_ms(&before, &after, 0.99).unwrap() - 47.0).abs() < 1e-9);
    }

    #[test]
    fn no_observations_give_no_quantile() {
        let t = scrape_text([5, 5, 5, 5]);
        let b = bucket_deltas(&t, &t).unwrap();
        assert_eq!(quantile_ms(&b, 0.99), None);
        assert_eq!(share_le(&b, 0.02), None);
    }

    #[test]
    fn a_missing_metric_is_none_and_a_summary_is_read() {
        assert_eq!(commit_to_ack_ms("", "", 0.99), None);
        let summary = "outboxd_commit_to_ack_seconds{quantile=\"0.99\"} 0.012\noutboxd_commit_to_ack_seconds{quantile=\"0.5\"} 0.004\n";
        assert_eq!(commit_to_ack_ms("", summary, 0.99), Some(12.0));
        assert_eq!(commit_to_ack_ms("", summary, 0.5), Some(4.0));
    }
}
