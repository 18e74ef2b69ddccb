//! Reading the figures the page shows out of the `/metrics` text, and the bounded history the
//! charts draw.
//!
//! The page reads what Prometheus scrapes rather than keeping counters of its own: the event path
//! pays nothing for the page, and the page can never disagree with the metrics. A sampler task
//! renders the exporter every [`SAMPLE_EVERY`] and keeps [`HISTORY_POINTS`] points (15 minutes);
//! a page request renders it once more for the current figures.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;

/// How often the sampler adds a chart point.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Chart points kept: 15 minutes at [`SAMPLE_EVERY`].
pub const HISTORY_POINTS: usize = 180;

/// One series: its labels (name → value) and value.
type Series = (Labels, f64);
/// A series's labels, name → value.
type Labels = Vec<(String, String)>;

/// The parsed `/metrics` text: metric name → its series. Histogram bucket lines are skipped.
#[derive(Debug, Default)]
pub struct Scrape {
    by_name: BTreeMap<String, Vec<Series>>,
}

impl Scrape {
    /// Parse Prometheus text exposition; lines it cannot read are skipped (the exporter writes
    /// none, and a status page must not fail on one).
    pub fn parse(text: &str) -> Scrape {
        let mut by_name: BTreeMap<String, Vec<Series>> = BTreeMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let Some((name, labels, value)) = parse_line(line) else { continue };
            if name.ends_with("_bucket") {
                continue;
            }
            by_name.entry(name.to_owned()).or_default().push((labels, value));
        }
        Scrape { by_name }
    }

    /// The value of an unlabelled series (or the first series of the metric).
    pub fn value(&self, name: &str) -> Option<f64> {
        self.by_name.get(name).and_then(|s| s.first()).map(|(_, v)| *v)
    }

    /// The sum over every series of the metric (0 when it has none).
    pub fn sum(&self, name: &str) -> f64 {
        self.by_name.get(name).map_or(0.0, |s| s.iter().map(|(_, v)| v).sum())
    }

    /// label value → series value, for one label of the metric.
    pub fn by_label(&self, name: &str, label: &str) -> Vec<(String, f64)> {
        let Some(series) = self.by_name.get(name) else { return Vec::new() };
        series
            .iter()
            .filter_map(|(labels, v)| labels.iter().find(|(k, _)| k == label).map(|(_, l)| (l.clone(), *v)))
            .collect()
    }
}

/// `name{a="x",b="y"} 1.5` → (name, labels, 1.5).
fn parse_line(line: &str) -> Option<(&str, Labels, f64)> {
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let Some(open) = head.find('{') else { return Some((head, Vec::new(), value)) };
    let name = &head[..open];
    let body = head[open + 1..].strip_suffix('}')?;
    let mut labels = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let eq = rest.find("=\"")?;
        let key = rest[..eq].trim_start_matches(',').to_owned();
        let mut val = String::new();
        let mut chars = rest[eq + 2..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => val.push('\n'),
                    Some((_, other)) => val.push(other),
                    None => return None,
                },
                '"' => {
                    end = Some(eq + 2 + i + 1);
                    break;
                }
                c => val.push(c),
            }
        }
        labels.push((key, val));
        rest = &rest[end?..];
    }
    Some((name, labels, value))
}

/// One chart point.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Point {
    /// Unix time in milliseconds.
    pub t: i64,
    /// `outboxd_replication_lag_bytes`, when the lag monitor has polled.
    pub lag_bytes: Option<f64>,
    /// `outboxd_lag_seconds` (`run`) or `outboxd_poll_oldest_unpublished_age_seconds` (`poll`).
    pub lag_seconds: Option<f64>,
    /// Events acked per second since the previous point.
    pub events_per_second: f64,
}

/// The chart history: at most [`HISTORY_POINTS`] points, oldest first.
#[derive(Debug, Default)]
pub struct History {
    points: VecDeque<Point>,
    /// The acked-events total and the monotonic time of the previous sample, for the rate (a
    /// wall-clock step must not make one).
    last_total: Option<(Instant, f64)>,
}

impl History {
    /// Add the point for a scrape taken at wall-clock `t_ms` and monotonic `at`; `poll` says which
    /// loop's figures apply (see [`Figures`]).
    pub fn add(&mut self, t_ms: i64, at: Instant, s: &Scrape, poll: bool) {
        let total = events_total(s);
        let rate = match self.last_total {
            Some((t0, n0)) if at > t0 => ((total - n0) / at.duration_since(t0).as_secs_f64()).max(0.0),
            _ => 0.0,
        };
        self.last_total = Some((at, total));
        if self.points.len() == HISTORY_POINTS {
            self.points.pop_front();
        }
        let f = Figures::of(s, poll);
        self.points.push_back(Point {
            t: t_ms,
            lag_bytes: f.lag_bytes,
            lag_seconds: f.lag_seconds,
            events_per_second: rate,
        });
    }

    pub fn points(&self) -> Vec<Point> {
        self.points.iter().copied().collect()
    }

    /// The rate of the latest point (0 before two samples).
    pub fn rate(&self) -> f64 {
        self.points.back().map_or(0.0, |p| p.events_per_second)
    }
}

/// Events acked so far, over every topic.
pub fn events_total(s: &Scrape) -> f64 {
    s.sum("outboxd_events_total")
}

/// The figures that depend on which loop runs. Every gauge is registered (at 0) when the process
/// starts, whichever loop it runs, so `run`'s gauges read 0 under `poll`: they are not taken there.
/// `outboxd_events_in_flight` is both loops' (the relay's budget counts it for each).
#[derive(Debug, Default, PartialEq)]
pub struct Figures {
    pub lag_bytes: Option<f64>,
    /// `outboxd_lag_seconds` (`run`) or the oldest unpublished row's age (`poll`).
    pub lag_seconds: Option<f64>,
    pub in_flight: Option<f64>,
    pub oldest_unacked: Option<f64>,
}

impl Figures {
    pub fn of(s: &Scrape, poll: bool) -> Figures {
        if poll {
            Figures {
                lag_seconds: s.value("outboxd_poll_oldest_unpublished_age_seconds"),
                in_flight: s.value("outboxd_events_in_flight"),
                ..Figures::default()
            }
        } else {
            Figures {
                lag_bytes: s.value("outboxd_replication_lag_bytes"),
                lag_seconds: s.value("outboxd_lag_seconds"),
                in_flight: s.value("outboxd_events_in_flight"),
                oldest_unacked: s.value("outboxd_lag_seconds"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP outboxd_events_total Events acked.\n\
        # TYPE outboxd_events_total counter\n\
        outboxd_events_total{topic=\"order.events\"} 7\n\
        outboxd_events_total{topic=\"(other)\"} 3\n\
        outboxd_connected{component=\"kafka\"} 1\n\
        outboxd_connected{component=\"postgres\"} 0\n\
        outboxd_replication_lag_bytes 1234\n\
        outboxd_commit_to_ack_seconds_bucket{le=\"0.001\"} 5\n\
        outboxd_commit_to_ack_seconds_sum 0.5\n\
        odd{a=\"x\\\"y\",b=\"z\"} 2\n\
        broken{a=\"x} 2\n";

    #[test]
    fn reads_values_sums_and_labels() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.sum("outboxd_events_total"), 10.0);
        assert_eq!(s.value("outboxd_replication_lag_bytes"), Some(1234.0));
        assert_eq!(
            s.by_label("outboxd_connected", "component"),
            vec![("kafka".to_owned(), 1.0), ("postgres".to_owned(), 0.0)]
        );
        assert_eq!(s.by_label("odd", "a"), vec![("x\"y".to_owned(), 2.0)]);
        assert_eq!(s.by_label("odd", "b"), vec![("z".to_owned(), 2.0)]);
        assert_eq!(s.value("outboxd_commit_to_ack_seconds_bucket"), None);
        assert_eq!(s.value("broken"), None);
        assert_eq!(s.value("missing"), None);
    }

    #[test]
    fn history_is_bounded_and_rates_come_from_the_counter() {
        let mut h = History::default();
        let t0 = Instant::now();
        for i in 0..(HISTORY_POINTS as u64 + 20) {
            let text = format!("outboxd_events_total{{topic=\"a\"}} {}\noutboxd_lag_seconds 0.5\n", i * 50);
            // The wall clock steps back; the rate follows the monotonic clock.
            h.add(1_000_000 - i as i64, t0 + Duration::from_secs(5 * i), &Scrape::parse(&text), false);
        }
        let p = h.points();
        assert_eq!(p.len(), HISTORY_POINTS);
        assert_eq!(p[0].t, 1_000_000 - 20);
        assert_eq!(h.rate(), 10.0);
        assert_eq!(p.last().unwrap().lag_seconds, Some(0.5));
        assert_eq!(p.last().unwrap().lag_bytes, None);
    }

    #[test]
    fn poll_takes_its_own_lag_and_in_flight_and_none_of_runs_wal_gauges() {
        // Every gauge is registered at 0 at start, whichever loop runs.
        let s = Scrape::parse(
            "outboxd_lag_seconds 0\noutboxd_replication_lag_bytes 0\noutboxd_events_in_flight 7\n\
             outboxd_poll_oldest_unpublished_age_seconds 42\n",
        );
        assert_eq!(
            Figures::of(&s, true),
            Figures { lag_seconds: Some(42.0), in_flight: Some(7.0), ..Figures::default() }
        );
        let run = Figures::of(&s, false);
        assert_eq!((run.lag_seconds, run.lag_bytes, run.in_flight), (Some(0.0), Some(0.0), Some(7.0)));
    }
}
