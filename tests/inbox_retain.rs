//! `outboxd inbox --retain` through the daemon, against real Apache Kafka and PostgreSQL: the
//! first pruning round (30 s after the start, then every minute) deletes exactly the rows that
//! were processed longer ago than `--retain` and arrived longer ago than `--dedupe-window`; a row
//! inside the window and an unprocessed row stay, however old. A copy of an event whose row is
//! still there is not inserted again; one whose row was pruned is (the window is what
//! deduplication covers, as the manual says).

mod common;

use std::time::Duration;

use common::inbox::{inbox_rows, produce_numbered};
use common::*;

const TOPIC: &str = "retain.events";

fn ids(pg: &PgCluster, filter: &str) -> String {
    pg.psql(&format!(
        "SELECT string_agg(event_id, ',' ORDER BY substr(event_id, 2)::int) FROM public.inbox WHERE {filter}"
    ))
    .trim()
    .to_string()
}

fn list(r: std::ops::Range<usize>) -> String {
    r.map(|i| format!("e{i}")).collect::<Vec<_>>().join(",")
}

#[test]
fn retain_prunes_only_processed_rows_past_the_dedupe_window() {
    let pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    let a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--topics",
        TOPIC,
        "--metrics-addr",
        "off",
        "--retain",
        "1h",
        "--dedupe-window",
        "2h",
    ]);
    let mut inbox = Outboxd::spawn(&a);
    produce_numbered(&broker, TOPIC, 0..30, |_| "k".into(), None);
    assert!(
        wait_until(Duration::from_secs(25), || inbox_rows(&pg) == 30),
        "{} of 30:\n{}",
        inbox_rows(&pg),
        inbox.log()
    );
    // e0-e9: processed 3 h ago, arrived 3 h ago: past both. e10-e19: processed 3 h ago but
    // arrived 1 h ago, inside the window. e20-e29: arrived 3 h ago, never processed.
    pg.psql(
        "UPDATE public.inbox SET processed_at = now() - interval '3 hours', received_at = now() - interval '3 hours' \
          WHERE substr(event_id, 2)::int < 10; \
         UPDATE public.inbox SET processed_at = now() - interval '3 hours', received_at = now() - interval '1 hour' \
          WHERE substr(event_id, 2)::int BETWEEN 10 AND 19; \
         UPDATE public.inbox SET received_at = now() - interval '3 hours' WHERE substr(event_id, 2)::int >= 20",
    );
    let pruned = wait_until(Duration::from_secs(60), || inbox.log().contains("pruned processed inbox rows"));
    assert!(pruned, "no pruning round within 60 s:\n{}", inbox.log());
    assert!(inbox.log().contains("rows=10"), "the round must say it pruned 10 rows:\n{}", inbox.log());
    assert_eq!(ids(&pg, "true"), list(10..30), "what the round left");

    // Copies of e0-e19: e10-e19 still deduplicate; e0-e9 were pruned, so they come in again.
    produce_numbered(&broker, TOPIC, 0..20, |_| "k".into(), None);
    assert!(
        wait_until(Duration::from_secs(30), || inbox_rows(&pg) >= 30),
        "{} of 30:\n{}",
        inbox_rows(&pg),
        inbox.log()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(inbox_rows(&pg), 30, "a copy inside the window was inserted again:\n{}", inbox.log());
    assert_eq!(ids(&pg, "processed_at IS NULL AND received_at > now() - interval '1 minute'"), list(0..10));
    assert_eq!(ids(&pg, "processed_at IS NOT NULL"), list(10..20), "an inside-the-window row was replaced");
    inbox.stop_cleanly();
}
