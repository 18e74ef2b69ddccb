//! Where a row's time goes in the inbox latency run, in parts that hold whatever the box's load:
//! from PostgreSQL (both consumers' tables): each row's wait before its batch's statement started
//! (`received_at`, the transaction's start, − the Kafka append time: the broker, the fetch, the
//! gathering of the batch, the queue behind the write before it) and the statement's own time to
//! its commit; the batches' count and size. From outboxd's per-batch debug lines (`batch written`):
//! the first record's age when the writer took it, the gathering until the write started, the write
//! with its commit; and the backlog gauge's query (`backlog read`), which runs on the chores'
//! connection of its own beside the writes, and only with `--metrics-addr` (none in the bench's
//! runs, so none counted). Read only with INBOX_BREAKDOWN=1, which turns those debug lines on.

use std::path::Path;

use anyhow::Result;

use crate::bench::Bench;

/// The header of the table [`from_table`] adds rows to.
pub const DB_HEAD: &str = "| consumer | batches | rows/batch | wait before the statement p50 / p99 / max ms | statement to commit p50 / p99 / max ms |\n|---|---|---|---|---|\n";

/// A row of the PostgreSQL breakdown for the measured records (`l-` ids) of `table`.
pub fn from_table(b: &Bench, who: &str, table: &str) -> Result<String> {
    let r = b.pg.row(&format!(
        "WITH r AS (SELECT xmin::text AS x, \
                           extract(epoch FROM received_at - kafka_timestamp) * 1000 AS wait, \
                           extract(epoch FROM pg_xact_commit_timestamp(xmin) - received_at) * 1000 AS run \
                      FROM {table} WHERE event_id LIKE 'l-%') \
         SELECT count(DISTINCT x), round(count(*)::numeric / greatest(count(DISTINCT x), 1), 1), \
                round(percentile_cont(0.5) WITHIN GROUP (ORDER BY wait)::numeric, 1), \
                round(percentile_cont(0.99) WITHIN GROUP (ORDER BY wait)::numeric, 1), round(max(wait)::numeric, 1), \
                round(percentile_cont(0.5) WITHIN GROUP (ORDER BY run)::numeric, 1), \
                round(percentile_cont(0.99) WITHIN GROUP (ORDER BY run)::numeric, 1), round(max(run)::numeric, 1) \
           FROM r"
    ))?;
    let c = |i: usize| r.get(i).cloned().unwrap_or_else(|| "?".into());
    Ok(format!("| {who} | {} | {} | {} / {} / {} | {} / {} / {} |\n", c(0), c(1), c(2), c(3), c(4), c(5), c(6), c(7)))
}

/// `key=value` of a tracing line, as a number.
fn field(line: &str, key: &str) -> Option<f64> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split_whitespace().next()?.trim_end_matches(',').parse().ok()
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn spread(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!("{:.1} / {:.1} / {:.1}", pct(&v, 0.5), pct(&v, 0.99), v.last().copied().unwrap_or(f64::NAN))
}

/// outboxd's per-batch lines in `log` (all batches of the run, warm-up included), as markdown.
pub fn from_log(log: &Path) -> Result<String> {
    let text = std::fs::read_to_string(log)?;
    let (mut age, mut gather, mut write, mut rows, mut backlog) = (vec![], vec![], vec![], vec![], vec![]);
    for line in text.lines() {
        if line.contains("batch written") {
            let (Some(a), Some(g), Some(w), Some(n)) = (
                field(line, "first_age_ms"),
                field(line, "gather_ms"),
                field(line, "write_ms"),
                field(line, "records"),
            ) else {
                continue;
            };
            age.push(a);
            gather.push(g);
            write.push(w);
            rows.push(n);
        } else if line.contains("backlog read") {
            backlog.extend(field(line, "ms"));
        }
    }
    let batches = rows.len();
    let mean = rows.iter().sum::<f64>() / batches.max(1) as f64;
    Ok(format!(
        "outboxd inbox's own per-batch lines ({batches} batches, {mean:.1} records each on average, warm-up included), \
         p50 / p99 / max ms: the first record's age when the writer took it {}; gathering the batch until its write \
         started {}; the write and its commit {}.{}\n",
        spread(age),
        spread(gather),
        spread(write),
        if backlog.is_empty() {
            String::new()
        } else {
            format!(" The backlog gauge's query (every 5 s): {} runs, {} ms.", backlog.len(), spread(backlog))
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_a_tracing_line() {
        let l = "2026-12-06T04:30:00Z DEBUG outboxd::tools::inbox::writer: batch written records=25 inserted=25 \
                 first_age_ms=7 gather_ms=0.52 write_ms=3.10";
        assert_eq!(field(l, "records"), Some(25.0));
        assert_eq!(field(l, "gather_ms"), Some(0.52));
        assert_eq!(field(l, "write_ms"), Some(3.1));
        assert_eq!(field(l, "ms"), None);
    }
}
