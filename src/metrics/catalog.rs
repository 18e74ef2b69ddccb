//! Every metric outboxd exports, described once: name, type, labels and help text.
//!
//! The recorder gets each description at install ([`describe_all`]), so every series on `/metrics`
//! carries `# HELP`; the manual's metric table (`docs/src/production.md`) is generated from the same
//! entries ([`markdown`]),
//! and tests hold the three together: a name used in the code but missing here, an entry no code
//! uses, or a documented table that differs from [`markdown`] fails the build's tests.

/// The Prometheus type of a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One exported metric.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    /// Label names, in the order the manual shows them.
    pub labels: &'static [&'static str],
    /// The `# HELP` line: one sentence, plain text.
    pub help: &'static str,
    /// Which command exports it: `run`, `poll`, `both` of them, `shadow` (`--follow`) or `inbox`.
    pub by: &'static str,
}

const fn m(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    by: &'static str,
    help: &'static str,
) -> Metric {
    Metric { name, kind, labels, help, by }
}

use Kind::{Counter, Gauge, Histogram};

/// The catalogue, in the manual's order.
pub const ALL: &[Metric] = &[
    m("outboxd_events_total", Counter, &["topic"], "both", "Events acked by the sink, per topic (the first 1000 topics; later ones count under topic=\"(other)\")."),
    m("outboxd_events_failed_total", Counter, &["reason"], "both", "Bad events and delivery failures, per reason."),
    m("outboxd_dlq_events_total", Counter, &["reason"], "both", "Events sent to the dead-letter destination, per reason."),
    m("outboxd_events_in_flight", Gauge, &[], "both", "Events handed to the sink and not yet acked."),
    m("outboxd_transactions_total", Counter, &[], "run", "Source transactions whose events were all acked."),
    m("outboxd_received_lsn", Gauge, &[], "run", "The last WAL position received from the server (bytes of WAL)."),
    m("outboxd_confirmed_flush_lsn", Gauge, &[], "run", "The last flush LSN confirmed to the server (bytes of WAL)."),
    m("outboxd_replication_lag_bytes", Gauge, &[], "run", "pg_current_wal_lsn() minus the slot's confirmed_flush_lsn, polled every --lag-poll-interval."),
    m("outboxd_lag_seconds", Gauge, &[], "run", "Now minus the commit time of the oldest unacked transaction; 0 when caught up."),
    m("outboxd_commit_to_ack_seconds", Histogram, &[], "run", "Per transaction, from its commit time to the sink's ack of its last event."),
    m("outboxd_kafka_transactions_total", Counter, &["outcome"], "run", "Exactly-once: Kafka transactions, by outcome (committed, aborted)."),
    m("outboxd_kafka_transaction_records", Histogram, &[], "run", "Exactly-once: records per committed Kafka transaction (the position record not counted)."),
    m("outboxd_kafka_transaction_commit_seconds", Histogram, &[], "run", "Exactly-once: how long a Kafka commit took (flush and EndTxn)."),
    m("outboxd_connected", Gauge, &["component"], "both", "1 while connected, else 0: postgres and the sink (kafka, nats, redis, rabbitmq or http)."),
    m("outboxd_slot_safe_wal_size_bytes", Gauge, &[], "run", "The slot's safe_wal_size from pg_replication_slots, exported only while the server limits it."),
    m("outboxd_reconnects_total", Counter, &["component"], "both", "Reconnects to postgres and to the sink (kafka, nats, rabbitmq)."),
    m("outboxd_role", Gauge, &["role"], "run", "role=active is 1 while this process streams the slot, role=standby is 1 while another process holds it; both 0 while connecting."),
    m("outboxd_poll_unpublished_rows", Gauge, &[], "poll", "Outbox rows not yet published, as of the last backlog query."),
    m("outboxd_poll_oldest_unpublished_age_seconds", Gauge, &[], "poll", "Age of the oldest unpublished outbox row (the outbox lag)."),
    m("outboxd_poll_publish_tries_total", Counter, &[], "poll", "Records handed to the sink for an outbox row, one per try."),
    m("outboxd_poll_publish_errors_total", Counter, &[], "poll", "Tries the sink refused for good; divided by the tries, the publish error ratio."),
    m("outboxd_shadow_matched", Gauge, &[], "shadow", "Events found on both topics with equal payloads."),
    m("outboxd_shadow_different", Gauge, &[], "shadow", "Events found on both topics whose payloads differ."),
    m("outboxd_shadow_only_legacy", Gauge, &[], "shadow", "Events only the legacy topic has, past --max-lag."),
    m("outboxd_shadow_only_shadow", Gauge, &[], "shadow", "Events only the shadow topic has, past --max-lag."),
    m("outboxd_shadow_pending", Gauge, &["side"], "shadow", "Events waiting for their pair, per side."),
    m("outboxd_shadow_duplicates", Gauge, &["side"], "shadow", "Repeated copies of an event, per side (at-least-once delivery makes them)."),
    m("outboxd_shadow_unidentified", Gauge, &["side"], "shadow", "Records without the --match-by id, per side."),
    m("outboxd_shadow_lag_p50_seconds", Gauge, &[], "shadow", "Median of shadow minus legacy record timestamp over paired events."),
    m("outboxd_shadow_lag_max_seconds", Gauge, &[], "shadow", "Largest shadow minus legacy record timestamp over paired events."),
    m("outboxd_inbox_rows_total", Counter, &[], "inbox", "Records written into the inbox table as new rows."),
    m("outboxd_inbox_duplicates_total", Counter, &[], "inbox", "Records whose event id the inbox table held already (not written again)."),
    m("outboxd_inbox_dlq_total", Counter, &["reason"], "inbox", "Bad records copied to the dead-letter topic, per reason."),
    m("outboxd_inbox_unprocessed_rows", Gauge, &[], "inbox", "Inbox rows no worker has marked processed yet."),
    m("outboxd_inbox_oldest_unprocessed_seconds", Gauge, &[], "inbox", "Age of the oldest unprocessed inbox row (0 when there is none)."),
    m("outboxd_inbox_lag_records", Gauge, &["topic", "partition"], "inbox", "Records of an assigned partition not stored yet (its last stable offset minus the next offset stored in PostgreSQL); grows through a PostgreSQL outage."),
    m("outboxd_inbox_lag_seconds", Gauge, &["topic", "partition"], "inbox", "Age of the oldest record read from a partition and not stored yet; 0 when none is. Grows with the clock through a PostgreSQL outage."),
];

/// Gives the current recorder every description (call right after installing it).
pub fn describe_all() {
    for d in ALL {
        match d.kind {
            Kind::Counter => metrics::describe_counter!(d.name, d.help),
            Kind::Gauge => metrics::describe_gauge!(d.name, d.help),
            Kind::Histogram => metrics::describe_histogram!(d.name, d.help),
        }
    }
}

/// The manual's metric table, generated: one row per metric.
pub fn markdown() -> String {
    let mut out = String::from("| metric | type | exported by | meaning |\n|---|---|---|---|\n");
    for d in ALL {
        let labels = if d.labels.is_empty() { String::new() } else { format!("{{{}}}", d.labels.join(",")) };
        let by = match d.by {
            "run" => "`run`",
            "both" => "`run`, `poll`",
            "poll" => "`poll`",
            "inbox" => "`inbox`",
            _ => "`shadow --follow`",
        };
        out.push_str(&format!("| `{}{labels}` | {} | {by} | {} |\n", d.name, d.kind.name(), d.help));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every `counter!("…")`, `gauge!("…")` and `histogram!("…")` name in `src/`, with its kind,
    /// plus the names passed to the per-side helper of the shadow gauges ([`super::super::shadow`]).
    fn names_in_code() -> Vec<(String, Kind, String)> {
        let mut out = Vec::new();
        let mut stack = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                if p.extension().and_then(|x| x.to_str()) != Some("rs") || p.ends_with("metrics/catalog.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                for (mac, kind) in [
                    ("counter!(\"", Kind::Counter),
                    ("gauge!(\"", Kind::Gauge),
                    ("histogram!(\"", Kind::Histogram),
                    ("per_side(\"", Kind::Gauge),
                ] {
                    for (i, _) in text.match_indices(mac) {
                        let rest = &text[i + mac.len()..];
                        let name = &rest[..rest.find('"').unwrap()];
                        out.push((name.to_owned(), kind, p.display().to_string()));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn every_metric_in_the_code_is_described_with_its_kind_and_every_entry_is_used() {
        let used = names_in_code();
        assert!(used.len() >= 20, "the source scan found too few metrics: {used:?}");
        for (name, kind, file) in &used {
            let d = ALL.iter().find(|d| d.name == name).unwrap_or_else(|| {
                panic!("{file}: metric {name} is not in src/metrics/catalog.rs; add it there with its help text")
            });
            assert_eq!(d.kind, *kind, "{file}: {name} is a {:?} in the code, a {:?} in the catalogue", kind, d.kind);
        }
        for d in ALL {
            assert!(used.iter().any(|(n, _, _)| n == d.name), "catalogue entry {} is used nowhere in src/", d.name);
            assert!(!d.help.is_empty() && !d.help.contains('\n'), "{}: help must be one line", d.name);
        }
        let mut names: Vec<_> = ALL.iter().map(|d| d.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "a metric is described twice");
    }

    #[test]
    fn every_series_on_the_endpoint_carries_help() {
        let recorder = super::super::builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe_all();
            for d in ALL {
                let labels: Vec<(&str, &str)> = d.labels.iter().map(|l| (*l, "x")).collect();
                match d.kind {
                    Kind::Counter => metrics::counter!(d.name, &labels).increment(1),
                    Kind::Gauge => metrics::gauge!(d.name, &labels).set(1.0),
                    Kind::Histogram => metrics::histogram!(d.name, &labels).record(0.01),
                }
            }
        });
        let body = handle.render();
        let typed: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
        assert_eq!(typed.len(), ALL.len(), "{body}");
        for t in typed {
            let name = t.split(' ').next().unwrap();
            assert!(body.contains(&format!("# HELP {name} ")), "{name} has no HELP line:\n{body}");
        }
    }

    #[test]
    fn the_documented_table_is_the_generated_one() {
        let file = "docs/src/production.md";
        let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        let (begin, end) = ("<!-- metrics: generated from src/metrics/catalog.rs -->\n", "<!-- metrics: end -->");
        let start = doc.find(begin).unwrap_or_else(|| panic!("{file} lacks the metrics begin marker")) + begin.len();
        let stop = start + doc[start..].find(end).unwrap_or_else(|| panic!("{file} lacks the metrics end marker"));
        assert_eq!(
            &doc[start..stop],
            markdown(),
            "{file}'s metric table differs from the catalogue; replace it with the text on the right"
        );
    }
}
