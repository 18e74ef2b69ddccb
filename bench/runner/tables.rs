//! The drain tables, computed from the raw reader runs. Pure: rows in, markdown out.
//!
//! Ratios are taken per repetition, against the pg_recvlogical over the same transport in the
//! same repetition (`Reader::baseline`), and only then summarised: median with (min–max). The
//! table shapes are the ones `bench/RESULTS.md` has always had, so runs stay comparable, with
//! two columns added at the end for issue 40: the far side's (the Kafka broker's) CPU per record,
//! and its ratio to the reader's own CPU in the same repetition, so a reader of the table sees
//! whose cycles bound a drain.

use crate::readers::{Kind, Reader, Sample};
use crate::stats::{commas, median, ratio, Spread};

/// One reader run: which backlog (`key`), which repetition (from 1), what it cost, and the CPU
/// the far side (the Kafka broker, or the webhook receiver) spent during it.
#[derive(Clone, Debug)]
pub struct RawRow {
    pub key: String,
    pub rep: usize,
    pub reader: Reader,
    pub sample: Sample,
    pub far_cpu: f64,
}

pub const DRAIN_HEADER: &str =
    "| backlog | reader | seconds | events/s | ratio to pg_recvlogical | CPU s | CPU µs/event | \
CPU ratio to pg_recvlogical | peak RSS | walsender CPU s | broker CPU s | broker CPU µs/record | \
broker CPU ÷ reader CPU |
|---|---|---|---|---|---|---|---|---|---|---|---|---|";

/// A reader's summary, for the targets.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub reader: Reader,
    /// Median of per-repetition (baseline seconds / reader seconds).
    pub ratio: Option<f64>,
    /// Median of per-repetition (reader CPU / baseline CPU).
    pub cpu_ratio: Option<f64>,
    pub peak_mib: f64,
}

fn get<'a>(raw: &'a [RawRow], key: &str, reader: Reader, rep: usize) -> Option<&'a RawRow> {
    raw.iter().find(|r| r.key == key && r.reader == reader && r.rep == rep)
}

/// The repetitions of a backlog, in the order they were first run.
fn reps(raw: &[RawRow], key: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for r in raw.iter().filter(|r| r.key == key) {
        if !out.contains(&r.rep) {
            out.push(r.rep);
        }
    }
    out
}

fn opt2(v: Option<f64>, none: &str) -> String {
    v.map_or_else(|| none.to_owned(), |v| format!("{v:.2}"))
}

/// One markdown row per reader (in the given order; readers without runs are left out).
pub fn drain_rows(
    raw: &[RawRow],
    key: &str,
    rows: u64,
    title: &str,
    readers: &[Reader],
    http_batch: u64,
) -> (String, Vec<Summary>) {
    let mut md = String::new();
    let mut sums = Vec::new();
    for &rd in readers {
        let base = rd.baseline();
        let (mut secs, mut cpu, mut far, mut ws, mut rt, mut cr) = (vec![], vec![], vec![], vec![], vec![], vec![]);
        // Per repetition: the far side's CPU over the reader's own, both from the same run.
        let mut far_share = vec![];
        let mut peak = 0u64;
        for rep in reps(raw, key) {
            let Some(run) = get(raw, key, rd, rep) else { continue };
            let s = &run.sample;
            secs.push(s.secs);
            cpu.extend(s.cpu);
            far.push(run.far_cpu);
            far_share.extend(ratio(Some(run.far_cpu), s.cpu));
            ws.extend(s.walsender);
            peak = peak.max(s.hwm_kib.unwrap_or(0));
            if let Some(b) = get(raw, key, base, rep) {
                rt.extend(ratio(Some(b.sample.secs), Some(s.secs)));
                cr.extend(ratio(s.cpu, b.sample.cpu));
            }
        }
        let Some(sec) = Spread::of(&secs) else { continue };
        let mc = median(&cpu);
        let rts = Spread::of(&rt);
        let mcr = median(&cr);
        let peak_mib = peak as f64 / 1024.0;
        let far_side = rd.shows_far_side();
        let mf = median(&far);
        md.push_str(&format!(
            "| {title} | {} | {} | {} | {} | {} | {} | {} | {peak_mib:.1} MiB | {} | {} | {} | {} |\n",
            rd.table_label(http_batch),
            sec.cell(),
            commas(rows as f64 / sec.median),
            rts.map_or_else(|| "–".to_owned(), |s| s.cell()),
            opt2(mc, "–"),
            mc.map_or_else(|| "–".to_owned(), |c| format!("{:.1}", c / rows as f64 * 1e6)),
            opt2(mcr, "–"),
            opt2(median(&ws), "-"),
            if far_side { opt2(mf, "–") } else { "–".to_owned() },
            match mf {
                Some(f) if far_side => format!("{:.1}", f / rows as f64 * 1e6),
                _ => "–".to_owned(),
            },
            if far_side { opt2(median(&far_share), "–") } else { "–".to_owned() },
        ));
        sums.push(Summary { reader: rd, ratio: rts.map(|s| s.median), cpu_ratio: mcr, peak_mib });
    }
    (md, sums)
}

/// A TLS reader's rate as a share of its plaintext twin's.
#[derive(Clone, Debug, PartialEq)]
pub struct Twin {
    pub reader: Reader,
    pub spread: Spread,
}

pub const TWIN_HEADER: &str =
    "| reader | compared with | its seconds | reader's seconds | rate ratio, median | min | max | repetitions |
|---|---|---|---|---|---|---|---|";

/// One markdown row per (reader, twin) pair: per repetition twin seconds / reader seconds.
pub fn twin_rows(raw: &[RawRow], key: &str, pairs: &[(Reader, Reader)], http_batch: u64) -> (String, Vec<Twin>) {
    let mut md = String::new();
    let mut twins = Vec::new();
    for &(a, b) in pairs {
        let (mut q, mut sa, mut sb) = (vec![], vec![], vec![]);
        for rep in reps(raw, key) {
            let (Some(ra), Some(rb)) = (get(raw, key, a, rep), get(raw, key, b, rep)) else { continue };
            if ra.sample.secs <= 0.0 {
                continue;
            }
            q.push(rb.sample.secs / ra.sample.secs);
            sa.push(ra.sample.secs);
            sb.push(rb.sample.secs);
        }
        let (Some(qs), Some(ma), Some(mb)) = (Spread::of(&q), median(&sa), median(&sb)) else { continue };
        md.push_str(&format!(
            "| {} | {} | {mb:.2} | {ma:.2} | **{:.2}×** | {:.2} | {:.2} | {} |\n",
            a.label(http_batch),
            b.label(http_batch),
            qs.median,
            qs.min,
            qs.max,
            qs.count
        ));
        twins.push(Twin { reader: a, spread: qs });
    }
    (md, twins)
}

/// The summary of one reader, when it ran.
pub fn find(sums: &[Summary], kind: Kind) -> Option<&Summary> {
    sums.iter().find(|s| s.reader.kind == kind && s.reader.transport == crate::readers::Transport::Socket)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readers::{local, over, Transport};

    fn row(key: &str, rep: usize, reader: Reader, secs: f64, cpu: f64) -> RawRow {
        RawRow {
            key: key.into(),
            rep,
            reader,
            sample: Sample {
                secs,
                cpu: Some(cpu),
                hwm_kib: Some(2048 * rep as u64),
                walsender: None,
                first_secs: None,
            },
            far_cpu: 0.5,
        }
    }

    #[test]
    fn ratios_are_per_repetition_then_median() {
        let (recv, kafka) = (local(Kind::Recv), local(Kind::Kafka));
        let raw = vec![
            row("d", 1, recv, 1.0, 0.5),
            row("d", 1, kafka, 2.0, 2.0),
            row("d", 2, kafka, 4.0, 2.0),
            row("d", 2, recv, 1.0, 1.0),
            row("d", 3, recv, 3.0, 1.0),
            row("d", 3, kafka, 4.0, 1.0),
            row("other", 1, kafka, 100.0, 1.0),
        ];
        let (md, sums) = drain_rows(&raw, "d", 1000, "T", &[recv, kafka], 100);
        let k = find(&sums, Kind::Kafka).unwrap();
        // Per repetition: 1/2, 1/4, 3/4 → median 0.5, not (median recv / median kafka) = 1/4.
        assert_eq!(k.ratio, Some(0.5));
        assert_eq!(k.cpu_ratio, Some(2.0)); // 4, 2, 1
        assert_eq!(k.peak_mib, 6.0);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[1],
            "| T | outboxd --sink kafka | 4.00 (2.00–4.00) | 250 | 0.50 (0.25–0.75) | 2.00 | 2000.0 | 2.00 | 6.0 MiB | - | 0.50 | 500.0 | 0.25 |"
        );
        assert!(lines[0].starts_with("| T | pg_recvlogical | 1.00 (1.00–3.00) | 1,000 | 1.00 (1.00–1.00) |"));
        assert!(lines[0].ends_with("| - | – | – | – |"), "{}", lines[0]);
    }

    #[test]
    fn readers_without_runs_are_left_out() {
        let raw = vec![row("d", 1, local(Kind::Null), 1.0, 1.0)];
        let (md, sums) = drain_rows(&raw, "d", 10, "T", &[local(Kind::Recv), local(Kind::Null)], 1);
        assert_eq!(md.lines().count(), 1);
        assert_eq!(sums[0].ratio, None);
        assert!(md.contains("| 1.00 | 10 | – | 1.00 |"), "{md}");
    }

    #[test]
    fn twins_compare_seconds_per_repetition() {
        let (tls, tcp) = (over(Kind::Kafka, Transport::Tls), over(Kind::Kafka, Transport::Tcp));
        let raw = vec![row("t", 1, tls, 2.0, 1.0), row("t", 1, tcp, 1.0, 1.0), row("t", 2, tls, 4.0, 1.0)];
        let (md, twins) = twin_rows(&raw, "t", &[(tls, tcp)], 1);
        assert_eq!(twins[0].spread.count, 1);
        assert_eq!(twins[0].spread.median, 0.5);
        assert!(md.contains("| 1.00 | 2.00 | **0.50×** | 0.50 | 0.50 | 1 |"), "{md}");
    }
}
