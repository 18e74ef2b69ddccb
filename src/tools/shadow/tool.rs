//! `outboxd shadow compare`: reads `--legacy-topic` and `--shadow-topic` side by side, feeds the
//! records to the [`Pairer`] and prints the report.
//!
//! One-shot (the default) reads both topics to the end they had when reading began (the DLQ
//! tools' reader: it waits out broker hiccups and fails after `--read-timeout` of silence rather
//! than report on a shortened topic), then counts every event still waiting as having no pair.
//! Exit 0 when everything paired and matched, 1 otherwise (and on a read failure), 2 on bad flags.
//!
//! `--since D` starts each partition at the broker's `offsets_for_times(now - D - --max-lag)` and
//! also filters by record timestamp, since a broker's time index may start early. Events in the
//! `--max-lag` before the window only serve as pairs ([`super::pair`]).
//!
//! `--follow` reads on past the end: once a second, an event whose pair has not come within
//! `--max-lag` of the other topic's progress (its newest record timestamp, or the clock when it
//! has been quiet for `IDLE`) counts as unpaired; the counts go to gauges on `--metrics-addr`
//! and a report is printed every `--report-interval` and at SIGINT/SIGTERM, after which the exit
//! code is as for one-shot, over what was decided by then.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::diff::{Ignore, Payload};
use super::pair::{Event, Pairer, Side, Tally, TooManyPending};
use super::MatchBy;
use crate::config::{parse_duration, KafkaConfig, ShadowCommand, ShadowCompareArgs};
use crate::error::{Definite, Error};
use crate::metrics::{ShadowFigures, ShadowMetrics};
use crate::sink::kafka::client as kafka_client;
use crate::sink::kafka::dlq::{DlqReader, DlqRecord};
use crate::sink::kafka::reader::{ReaderContext, StreamReader};

/// With `--follow`: a topic without a record for this long is caught up, so the clock stands in
/// for its progress.
const IDLE: Duration = Duration::from_secs(2);
/// With `--follow`: paired ids are forgotten this long after the pair (plus `--max-lag`); a copy
/// arriving later counts as unpaired.
const REMEMBER_PAIRED: Duration = Duration::from_secs(3600);

/// Returns the process exit code.
pub async fn run(cmd: ShadowCommand) -> Result<u8, Error> {
    match cmd {
        ShadowCommand::Compare(a) => compare(&a).await,
    }
}

/// Validated flags.
struct Settings {
    kafka: KafkaConfig,
    /// Legacy, shadow.
    topics: [String; 2],
    match_by: MatchBy,
    ignore: Ignore,
    since: Option<Duration>,
    max_lag: Duration,
    follow: Option<Follow>,
    json: bool,
    limit: usize,
    max_pending: usize,
    read_timeout: Duration,
}

struct Follow {
    metrics_addr: Option<SocketAddr>,
    report_interval: Duration,
}

impl Settings {
    fn from_args(a: &ShadowCompareArgs) -> Result<Settings, Definite> {
        let kafka = KafkaConfig::for_tool(&a.kafka)?;
        for (flag, t) in [("--legacy-topic", &a.legacy_topic), ("--shadow-topic", &a.shadow_topic)] {
            if t.trim().is_empty() {
                return Err(Definite::Config(format!("{flag} must not be empty")));
            }
        }
        if a.legacy_topic == a.shadow_topic {
            return Err(Definite::Config(format!(
                "--legacy-topic and --shadow-topic are both {:?}; the shadow topic is where the outbox writes the copies, e.g. {}.shadow.events",
                a.legacy_topic,
                a.legacy_topic.trim_end_matches(".events")
            )));
        }
        let match_by = MatchBy::parse(&a.match_by).map_err(Definite::Config)?;
        let ignore = Ignore::parse(&a.ignore).map_err(Definite::Config)?;
        let since = a.since.as_deref().map(|s| parse_duration("--since", s)).transpose()?;
        if since.is_some_and(|d| d.is_zero()) {
            return Err(Definite::Config(
                "--since must be more than 0, e.g. 1h; leave it out for the whole topics".into(),
            ));
        }
        let max_lag = parse_duration("--max-lag", &a.max_lag)?;
        let read_timeout = parse_duration("--read-timeout", &a.read_timeout)?;
        if read_timeout.is_zero() {
            return Err(Definite::Config("--read-timeout must be more than 0, e.g. 60s".into()));
        }
        if a.max_pending == 0 {
            return Err(Definite::Config("--max-pending must be at least 1".into()));
        }
        let follow = if a.follow {
            let metrics_addr = match a.metrics_addr.as_str() {
                "off" => None,
                s => Some(s.parse().map_err(|_| {
                    Definite::Config(format!("--metrics-addr {s:?}: expected host:port like 127.0.0.1:9465, or off"))
                })?),
            };
            let report_interval = parse_duration("--report-interval", &a.report_interval)?;
            if report_interval.is_zero() {
                return Err(Definite::Config("--report-interval must be more than 0, e.g. 60s".into()));
            }
            Some(Follow { metrics_addr, report_interval })
        } else {
            None
        };
        Ok(Settings {
            kafka,
            topics: [a.legacy_topic.clone(), a.shadow_topic.clone()],
            match_by,
            ignore,
            since,
            max_lag,
            follow,
            json: a.json,
            limit: a.limit,
            max_pending: a.max_pending,
            read_timeout,
        })
    }

    fn reader(&self, side: Side, from_ms: Option<i64>) -> Result<DlqReader, Definite> {
        let defaults = [
            ("group.id", "outboxd-shadow-compare".to_owned()),
            ("enable.auto.commit", "false".into()),
            ("enable.auto.offset.store", "false".into()),
            ("auto.offset.reset", "earliest".into()),
            ("allow.auto.create.topics", "false".into()),
            // The old path may publish transactionally; aborted records were never seen by its
            // consumers, so they must not count here.
            ("isolation.level", "read_committed".into()),
            ("fetch.wait.max.ms", "100".into()),
            ("enable.partition.eof", "true".into()),
        ];
        let c = kafka_client::consumer_config(&self.kafka, "outboxd-shadow-compare", &defaults);
        let consumer: StreamReader =
            kafka_client::create(&c, ReaderContext::new(&self.kafka), "consumer", &self.kafka)?;
        let topic = &self.topics[side as usize];
        DlqReader::open_from(consumer, topic, &self.kafka.brokers, self.read_timeout, from_ms)?.ok_or_else(|| {
            Definite::Setup(format!(
                "--{}-topic {topic:?} does not exist on {}; check the name (outboxd routes event type T.shadow to T.shadow.events by default)",
                side.name(),
                self.kafka.brokers
            ))
        })
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, ms)
}

/// A flag's duration in ms; absurd values (`--max-lag 99999999999h`) saturate instead of wrapping.
fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Where `--since` cuts: events from `from` on are read, those from `start` on are in the window.
#[derive(Clone, Copy)]
struct Window {
    from: i64,
    start: i64,
}

/// Identifies a record and feeds it to the pairer.
fn feed(s: &Settings, p: &mut Pairer, side: Side, r: DlqRecord, w: Option<Window>) -> Result<(), Definite> {
    let in_window = match (w, r.time_ms) {
        (Some(w), Some(t)) if t < w.from => return Ok(()),
        (Some(w), Some(t)) => t >= w.start,
        _ => true,
    };
    let payload = Payload::from_bytes(r.payload.as_deref());
    let Some(id) = s.match_by.identify(r.key.as_deref(), &r.headers, &payload) else {
        if in_window {
            if p.tally.unidentified[side as usize] < 10 {
                tracing::warn!(
                    "{} record at {} has no id by --match-by {}; it cannot be compared",
                    side.name(),
                    r.position(),
                    match_by_text(&s.match_by)
                );
            }
            p.tally.unidentified(side);
        }
        return Ok(());
    };
    let ev = Event { id, timestamp_ms: r.time_ms, payload, in_window };
    p.feed(side, ev).map(|_| ()).map_err(|TooManyPending(n)| {
        Definite::Setup(format!(
            "more than {n} events wait for their pair (--max-pending), each held in memory; narrow the comparison with --since, or raise --max-pending"
        ))
    })
}

fn match_by_text(m: &MatchBy) -> String {
    match m {
        MatchBy::Header(h) => format!("header:{h}"),
        MatchBy::Key => "key".into(),
        MatchBy::Field(f) => format!("field:{f}"),
    }
}

async fn compare(a: &ShadowCompareArgs) -> Result<u8, Error> {
    let s = Settings::from_args(a)?;
    let w = s.since.map(|d| {
        let start = now_ms().saturating_sub(ms(d));
        Window { start, from: start.saturating_sub(ms(s.max_lag)) }
    });
    let from = w.map(|w| w.from);
    // With --follow the endpoint is up while the history is read; /readyz answers 200 once it is.
    let mut exported = None;
    if let Some(f) = &s.follow {
        let health = crate::health::Health::new(Duration::ZERO);
        if let Some(addr) = f.metrics_addr {
            let bound = crate::serve::serve(addr, health.clone(), None).await?;
            tracing::info!(%bound, "serving /metrics and /readyz");
        }
        // After the recorder is installed: handles made before it would record nowhere.
        exported = Some((health, ShadowMetrics::new(Side::BOTH.map(Side::name))));
    }
    let mut legacy = s.reader(Side::Legacy, from)?;
    let mut shadow = s.reader(Side::Shadow, from)?;
    let mut p = Pairer::new(s.ignore.clone(), s.limit, s.max_pending);
    let mut done = [false, false];
    // Side by side, so an event waits only as long as the two topics are apart.
    while done != [true, true] {
        let (side, r) = tokio::select! {
            r = legacy.next(), if !done[0] => (Side::Legacy, r?),
            r = shadow.next(), if !done[1] => (Side::Shadow, r?),
        };
        match r {
            Some(r) => feed(&s, &mut p, side, r, w)?,
            None => done[side as usize] = true,
        }
    }
    if let (Some(f), Some((health, gauges))) = (&s.follow, exported) {
        health.set_streaming(true);
        return follow(&s, f, [legacy, shadow], p, w, gauges).await;
    }
    p.finish();
    print_report(&s, &p);
    Ok(if p.tally.ok() { 0 } else { 1 })
}

fn print_report(s: &Settings, p: &Pairer) {
    let t = &p.tally;
    let pending = [p.pending(Side::Legacy), p.pending(Side::Shadow)];
    if s.json {
        println!("{}", report_json(s, t, pending));
    } else {
        print!("{}", report_text(s, t, pending));
    }
}

fn report_json(s: &Settings, t: &Tally, pending: [usize; 2]) -> serde_json::Value {
    let different: Vec<serde_json::Value> =
        sorted(&t.different).iter().map(|(id, paths)| json!({"id": id, "paths": paths})).collect();
    let pair = |v: [u64; 2]| json!({"legacy": v[0], "shadow": v[1]});
    json!({
        "ok": t.ok(),
        "legacy_topic": s.topics[0],
        "shadow_topic": s.topics[1],
        "matched": t.matched,
        "only_legacy": t.only[0],
        "only_shadow": t.only[1],
        "different": different,
        "only_legacy_count": t.only_count[0],
        "only_shadow_count": t.only_count[1],
        "different_count": t.different_count,
        "records": pair(t.records),
        "duplicates": pair(t.duplicates),
        "unidentified": pair(t.unidentified),
        "pending": pair([pending[0] as u64, pending[1] as u64]),
        "lag_ms": {"pairs": t.lags.count, "p50": t.lags.p50(), "min": t.lags.min, "max": t.lags.max},
    })
}

fn report_text(s: &Settings, t: &Tally, pending: [usize; 2]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "legacy {} ({} records), shadow {} ({} records)",
        s.topics[0], t.records[0], s.topics[1], t.records[1]
    );
    let _ = writeln!(
        o,
        "matched {}, different {}, only in legacy {}, only in shadow {}",
        t.matched, t.different_count, t.only_count[0], t.only_count[1]
    );
    for (what, v) in [("duplicates", t.duplicates), ("without an id", t.unidentified)] {
        if v != [0, 0] {
            let _ = writeln!(o, "{what}: legacy {}, shadow {}", v[0], v[1]);
        }
    }
    if pending != [0, 0] {
        let _ = writeln!(o, "waiting for their pair: legacy {}, shadow {}", pending[0], pending[1]);
    }
    if let (Some(p50), Some(min), Some(max)) = (t.lags.p50(), t.lags.min, t.lags.max) {
        let _ = writeln!(
            o,
            "lag (shadow minus legacy timestamp): p50 {p50}ms, min {min}ms, max {max}ms over {} pairs",
            t.lags.count
        );
    }
    let list = |o: &mut String, title: &str, count: u64, lines: Vec<String>| {
        if count == 0 {
            return;
        }
        let _ = writeln!(o, "{title} ({count}):");
        for l in &lines {
            let _ = writeln!(o, "  {l}");
        }
        if count > lines.len() as u64 {
            let _ = writeln!(o, "  ... and {} more", count - lines.len() as u64);
        }
    };
    list(&mut o, "only in legacy", t.only_count[0], t.only[0].clone());
    list(&mut o, "only in shadow", t.only_count[1], t.only[1].clone());
    let diffs = sorted(&t.different).iter().map(|(id, paths)| format!("{id}: {}", shown_paths(paths))).collect();
    list(&mut o, "different", t.different_count, diffs);
    let _ = writeln!(o, "{}", if t.ok() { "OK: every event paired and matched" } else { "MISMATCH" });
    o
}

/// By id: the order pairs complete in is not stable across partitions.
fn sorted(different: &[(String, Vec<String>)]) -> Vec<&(String, Vec<String>)> {
    let mut v: Vec<_> = different.iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// `""` is the whole payload; say so rather than print nothing.
fn shown_paths(paths: &[String]) -> String {
    let shown: Vec<&str> = paths.iter().map(|p| if p.is_empty() { "(whole payload)" } else { p.as_str() }).collect();
    shown.join(", ")
}

/// The `--follow` gauges' figures, from the pairer's tally.
fn figures(p: &Pairer) -> ShadowFigures {
    let t = &p.tally;
    ShadowFigures {
        matched: t.matched,
        different: t.different_count,
        only: t.only_count,
        pending: Side::BOTH.map(|side| p.pending(side)),
        duplicates: t.duplicates,
        unidentified: t.unidentified,
        lag_ms: t.lags.p50().zip(t.lags.max),
    }
}

async fn follow(
    s: &Settings,
    f: &Follow,
    readers: [DlqReader; 2],
    mut p: Pairer,
    w: Option<Window>,
    gauges: ShadowMetrics,
) -> Result<u8, Error> {
    use tokio::signal::unix::{signal, SignalKind};
    let [mut legacy, mut shadow] = readers;
    let setup = |e: std::io::Error| Definite::Setup(format!("installing a signal handler: {e}"));
    let mut term = signal(SignalKind::terminate()).map_err(setup)?;
    let mut int = signal(SignalKind::interrupt()).map_err(setup)?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut report = tokio::time::interval(f.report_interval);
    report.reset();
    let mut last_record = [Instant::now(); 2];
    let mut newest = [None::<i64>; 2];
    let mut ticks = 0u64;
    let max_lag = ms(s.max_lag);
    gauges.set(&figures(&p));
    print_report(s, &p);
    loop {
        let (side, r) = tokio::select! {
            biased;
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = tick.tick() => {
                ticks += 1;
                let now = now_ms();
                for side in Side::BOTH {
                    // The progress of the topic the pair would come from.
                    let o = 1 - side as usize;
                    let progress = if last_record[o].elapsed() >= IDLE { Some(now) } else { newest[o] };
                    if let Some(t) = progress {
                        p.expire(side, t.saturating_sub(max_lag));
                    }
                }
                if ticks % 60 == 0 {
                    p.forget_paired_before(now.saturating_sub(ms(REMEMBER_PAIRED)).saturating_sub(max_lag));
                }
                gauges.set(&figures(&p));
                continue;
            }
            _ = report.tick() => {
                print_report(s, &p);
                continue;
            }
            r = legacy.next_live() => (Side::Legacy, r),
            r = shadow.next_live() => (Side::Shadow, r),
        };
        last_record[side as usize] = Instant::now();
        if let Some(t) = r.time_ms {
            newest[side as usize] = Some(newest[side as usize].map_or(t, |n| n.max(t)));
        }
        feed(s, &mut p, side, r, w)?;
    }
    gauges.set(&figures(&p));
    print_report(s, &p);
    Ok(if p.tally.ok() { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Result<Settings, String> {
        args_to("a.shadow.events", extra)
    }

    fn args_to(shadow_topic: &str, extra: &[&str]) -> Result<Settings, String> {
        use clap::Parser;
        let mut v = vec!["outboxd", "shadow", "compare", "--legacy-topic", "a.events", "--shadow-topic", shadow_topic];
        v.extend_from_slice(extra);
        let cli = crate::config::Cli::try_parse_from(v).map_err(|e| e.to_string())?;
        let crate::config::Command::Shadow(ShadowCommand::Compare(a)) = cli.command else { unreachable!() };
        Settings::from_args(&a).map_err(|e| e.to_string())
    }

    #[test]
    fn bad_flags_are_one_line_config_errors_naming_the_flag() {
        let s = args(&["--match-by", "header:id", "--ignore", "/sentAt", "--since", "2h"]).unwrap();
        assert_eq!(
            (s.since, s.max_lag, s.follow.is_none()),
            (Some(Duration::from_secs(7200)), Duration::from_secs(60), true)
        );
        for (extra, flag) in [
            (&["--match-by", "id"][..], "--match-by"),
            (&["--match-by", "key", "--ignore", "sentAt"], "--ignore"),
            (&["--match-by", "key", "--since", "yesterday"], "--since"),
            (&["--match-by", "key", "--since", "0s"], "--since"),
            (&["--match-by", "key", "--max-lag", "1y"], "--max-lag"),
            (&["--match-by", "key", "--follow", "--metrics-addr", "nowhere"], "--metrics-addr"),
            (&["--match-by", "key", "--kafka-property", "bootstrap.servers=x:1"], "--kafka-brokers"),
        ] {
            let e = args(extra).err().unwrap_or_else(|| panic!("{extra:?} accepted"));
            assert!(e.contains(flag) && !e.trim_end().contains('\n'), "{extra:?}: {e}");
        }
        let e = args_to("a.events", &["--match-by", "key"]).err().unwrap();
        assert!(e.contains("--shadow-topic") && e.contains("a.shadow.events"), "{e}");
    }

    #[test]
    fn the_json_report_has_the_issue_shape() {
        let s = args(&["--match-by", "header:id"]).unwrap();
        let mut p = Pairer::new(Ignore::default(), 10, 10);
        let ev = |id: &str, ts: i64, v: &str| Event {
            id: id.into(),
            timestamp_ms: Some(ts),
            payload: Payload::from_bytes(Some(v.as_bytes())),
            in_window: true,
        };
        p.feed(Side::Legacy, ev("a", 10, r#"{"total":1}"#)).unwrap();
        p.feed(Side::Shadow, ev("a", 30, r#"{"total":2}"#)).unwrap();
        p.feed(Side::Legacy, ev("b", 10, "{}")).unwrap();
        p.finish();
        let j = report_json(&s, &p.tally, [0, 0]);
        assert_eq!(j["matched"], 0);
        assert_eq!(j["only_legacy"], json!(["b"]));
        assert_eq!(j["only_shadow"], json!([]));
        assert_eq!(j["different"], json!([{"id": "a", "paths": ["/total"]}]));
        assert_eq!(j["lag_ms"], json!({"pairs": 1, "p50": 20, "min": 20, "max": 20}));
        assert_eq!(j["ok"], false);
        let text = report_text(&s, &p.tally, [0, 0]);
        assert!(
            text.contains("only in legacy (1):\n  b\n") && text.contains("a: /total") && text.ends_with("MISMATCH\n"),
            "{text}"
        );
    }
}
