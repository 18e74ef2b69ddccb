//! Taking a consumer over, against real Apache Kafka and PostgreSQL: `outboxd inbox --group G
//! --start-from committed` starts each partition PostgreSQL has no offset of at the offset the
//! old consumer committed to group G (else at the earliest), and from then on PostgreSQL's stored
//! offsets win over anything in Kafka; the manual's import and rollback SQL; the event id chain
//! (`id`, then `--event-id-header`, then the position); and `--topic-pattern`, whose subscription
//! picks up a matching topic created after the start and never a topic that does not match.
//!
//! Each record's `id` header names its topic, partition and offset (`TOPIC:p{P}-{offset}`), so
//! the inbox's event ids are exactly the records it read: a record before the committed offset,
//! one read twice past a stored offset, or a missing one each change the set the tests compare.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const TOPIC: &str = "orders.events";
const GROUP: &str = "legacy-billing";

/// Sends `n` records to each of `topic`'s `partitions`, the id of each `TOPIC:p{P}-{offset}`
/// (the offsets follow `first`, the partitions' end before), and waits for the acks.
fn produce(broker: &Broker, topic: &str, partitions: i32, first: &[i64], n: i64) {
    let producer: BaseProducer = broker.client_config().create().unwrap();
    for p in 0..partitions {
        for o in first[p as usize]..first[p as usize] + n {
            let id = format!("{topic}:p{p}-{o}");
            let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
            let payload = format!("{{\"o\":{o}}}");
            let rec = BaseRecord::to(topic).partition(p).key("k").payload(&payload).headers(headers);
            producer.send(rec).unwrap();
        }
    }
    producer.flush(Duration::from_secs(20)).unwrap();
}

/// What the legacy consumer does when it has processed records: commits the next offsets to
/// `GROUP` (a plain rdkafka consumer of that group; `None` leaves a partition uncommitted).
fn legacy_commit(broker: &Broker, offsets: &[Option<i64>]) {
    let mut cfg = broker.client_config();
    cfg.set("group.id", GROUP).set("enable.auto.commit", "false");
    let c: BaseConsumer = cfg.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets.iter().enumerate() {
        if let Some(o) = o {
            tpl.add_partition_offset(TOPIC, p as i32, Offset::Offset(*o)).unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = c.commit(&tpl, CommitMode::Sync) {
        assert!(Instant::now() < deadline, "the legacy consumer cannot commit: {e}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn inbox_args(pg: &PgCluster, broker: &Broker, subscription: &[&str], extra: &[&str]) -> Vec<String> {
    let mut a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--metrics-addr",
        "off",
        "--kafka-property",
        "session.timeout.ms=6000",
    ]);
    a.extend(subscription.iter().chain(extra).map(|s| s.to_string()));
    a
}

fn ids(pg: &PgCluster) -> BTreeSet<String> {
    if pg.psql("SELECT to_regclass('public.inbox') IS NULL").trim() == "t" {
        return BTreeSet::new();
    }
    pg.psql("SELECT event_id FROM public.inbox")
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The ids `TOPIC:p{P}-{o}` for `o` in `from..to`.
fn span(p: i32, from: i64, to: i64) -> BTreeSet<String> {
    (from..to).map(|o| format!("{TOPIC}:p{p}-{o}")).collect()
}

/// Waits until the inbox holds `want`'s count of rows, then asserts it holds exactly `want`
/// (and, a second later, nothing more).
fn assert_ids(pg: &PgCluster, want: &BTreeSet<String>, inbox: &Outboxd) {
    let ok = wait_until(Duration::from_secs(60), || ids(pg).len() >= want.len());
    assert!(ok, "the inbox holds {} of {} rows\n{}", ids(pg).len(), want.len(), inbox.log());
    std::thread::sleep(Duration::from_secs(1));
    let got = ids(pg);
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(want).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing {missing:?}, extra {extra:?}\n{}", inbox.log());
}

fn stored(pg: &PgCluster) -> Vec<i64> {
    let q = format!(
        "SELECT next_offset FROM public.inbox_offsets WHERE group_id = '{GROUP}' AND topic = '{TOPIC}' \
         ORDER BY kafka_partition"
    );
    pg.psql(&q).lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[test]
fn start_from_committed_takes_over_the_groups_offsets_and_then_postgresql_wins() {
    let pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, 3);
    produce(&broker, TOPIC, 3, &[0, 0, 0], 10);
    // The legacy consumer processed p0 up to offset 4 and all of p1; it never committed p2.
    legacy_commit(&broker, &[Some(4), Some(10), None]);
    assert_eq!(broker.committed_offsets(GROUP, TOPIC, 3), vec![Some(4), Some(10), None]);

    let topics = ["--topics", TOPIC];
    let extra = ["--group", GROUP, "--start-from", "committed"];
    let mut inbox = Outboxd::spawn(&inbox_args(&pg, &broker, &topics, &extra));
    let mut want = span(0, 4, 10);
    want.extend(span(2, 0, 10));
    assert_ids(&pg, &want, &inbox);

    // The manual's import of the ids the legacy consumer processed: it had done p0 up to offset
    // 6 but committed only 4 (it died in between), all of p1, and one event of a retired topic.
    pg.psql("CREATE TABLE processed_events (event_id text PRIMARY KEY, processed_at timestamptz)");
    let mut old = span(0, 0, 6);
    old.extend(span(1, 0, 10));
    old.insert("retired.topic:p0-0".into());
    let values: Vec<String> = old.iter().map(|id| format!("('{id}', now() - interval '1 day')")).collect();
    pg.psql(&format!("INSERT INTO processed_events VALUES {}", values.join(",")));
    pg.psql(&doc_sql("FROM processed_events"));
    want.extend(old.iter().cloned());
    assert_ids(&pg, &want, &inbox);
    // Left for the workers: exactly what the legacy consumer had not processed.
    let todo: BTreeSet<String> =
        pg.psql("SELECT event_id FROM public.inbox WHERE processed_at IS NULL").lines().map(str::to_owned).collect();
    let mut left = span(0, 6, 10);
    left.extend(span(2, 0, 10));
    assert_eq!(todo, left, "the rows left unprocessed after the import");
    let claimed = pg.psql("SELECT count(*) FROM public.inbox_claim(100) WHERE topic = 'imported'");
    assert_eq!(claimed.trim(), "0", "an imported row was handed to a worker");
    // p1's start (everything processed) is stored too, though no record of it came yet.
    assert!(wait_until(Duration::from_secs(10), || stored(&pg) == vec![10, 10, 10]), "stored {:?}", stored(&pg));

    // New records after the takeover: all of them, once.
    produce(&broker, TOPIC, 3, &[10, 10, 10], 5);
    for p in 0..3 {
        want.extend(span(p, 10, 15));
    }
    assert_ids(&pg, &want, &inbox);
    // --commit-kafka-offsets copies PostgreSQL's offsets to the same group: the two agree.
    let copied = wait_until(Duration::from_secs(20), || {
        broker.committed_offsets(GROUP, TOPIC, 3) == vec![Some(15), Some(15), Some(15)]
    });
    assert!(copied, "Kafka's copy {:?}", broker.committed_offsets(GROUP, TOPIC, 3));
    inbox.stop_cleanly();

    // Someone moves the group back in Kafka (the old consumer started again by mistake, a
    // reset): PostgreSQL's stored offsets still decide, so p0's 0..4 never come in and nothing
    // already stored is read into the inbox again.
    legacy_commit(&broker, &[Some(0), Some(0), Some(0)]);
    produce(&broker, TOPIC, 3, &[15, 15, 15], 2);
    for p in 0..3 {
        want.extend(span(p, 15, 17));
    }
    // The ids read again would be absorbed by ON CONFLICT (the import holds them all), so the
    // counters say whether any record was read again: only the 6 new ones may be.
    let port = free_port();
    let mut a = inbox_args(&pg, &broker, &topics, &extra);
    let at = a.iter().position(|s| s == "off").unwrap();
    a[at] = format!("127.0.0.1:{port}");
    let mut inbox = Outboxd::spawn(&a);
    assert_ids(&pg, &want, &inbox);
    assert!(wait_until(Duration::from_secs(10), || stored(&pg) == vec![17, 17, 17]), "stored {:?}", stored(&pg));
    let body = http_get(port, "/metrics").map(|(_, b)| b).unwrap_or_default();
    assert_eq!(metric(&body, "outboxd_inbox_rows_total"), Some(6.0), "{body}");
    assert_eq!(metric(&body, "outboxd_inbox_duplicates_total").unwrap_or(0.0), 0.0, "records read again\n{body}");
    inbox.stop_cleanly();

    // The manual's rollback: once the workers are done, the old consumer's table gets the ids
    // processed since the cutover (and no import marker).
    pg.psql("SELECT public.inbox_done(array_agg(seq)) FROM public.inbox WHERE processed_at IS NULL");
    pg.psql(&doc_sql("INSERT INTO processed_events"));
    let back: BTreeSet<String> = pg.psql("SELECT event_id FROM processed_events").lines().map(str::to_owned).collect();
    assert_eq!(back, want, "the ids handed back to the old consumer: its own and the inbox's");

    // Without --commit-kafka-offsets, the manual sets the group's offsets from the offsets table:
    // the \copy's CSV, read by kafka-consumer-groups --reset-offsets --from-file.
    legacy_commit(&broker, &[Some(0), Some(0), Some(0)]);
    let csv = pg.psql(&format!(
        "COPY (SELECT topic, kafka_partition, next_offset FROM public.inbox_offsets WHERE group_id = '{GROUP}') \
         TO STDOUT CSV"
    ));
    let file = std::env::temp_dir().join(format!("inbox-migrate-{}.csv", std::process::id()));
    std::fs::write(&file, csv).unwrap();
    let (ok, out) = broker.tool(
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        &[
            "--bootstrap-server",
            &broker.admin_bootstrap(),
            "--group",
            GROUP,
            "--reset-offsets",
            "--from-file",
            file.to_str().unwrap(),
            "--execute",
        ],
    );
    let _ = std::fs::remove_file(&file);
    assert!(ok, "kafka-consumer-groups --reset-offsets --from-file:\n{out}");
    assert_eq!(broker.committed_offsets(GROUP, TOPIC, 3), vec![Some(17), Some(17), Some(17)], "{out}");
}

/// The ```sql block of docs/src/inbox.md that contains `needle`, unindented: the tests run the
/// manual's own statements.
fn doc_sql(needle: &str) -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/src/inbox.md")).unwrap();
    let mut blocks = Vec::new();
    let mut block: Option<Vec<&str>> = None;
    for line in doc.lines() {
        match (line.trim(), block.as_mut()) {
            ("```sql", None) => block = Some(Vec::new()),
            ("```", Some(_)) => blocks.push(block.take().unwrap().join("\n")),
            (_, Some(b)) => b.push(line.trim_start()),
            _ => {}
        }
    }
    let found: Vec<&String> = blocks.iter().filter(|b| b.contains(needle)).collect();
    assert_eq!(found.len(), 1, "one sql block of docs/src/inbox.md holds {needle:?}");
    found[0].clone()
}

#[test]
fn a_topic_pattern_picks_up_a_new_matching_topic_and_never_another() {
    let pg = PgCluster::start();
    let broker = Broker::start();
    for t in ["orders.a", "orders.b", "payments.a", "ordersXa"] {
        broker.create_topic(t, 1);
    }
    for t in ["orders.a", "orders.b", "payments.a", "ordersXa"] {
        produce(&broker, t, 1, &[0], 3);
    }
    let mut inbox = Outboxd::spawn(&inbox_args(&pg, &broker, &["--topic-pattern", r"orders\..*"], &[]));
    let topics =
        |pg: &PgCluster| pg.psql("SELECT topic || ':' || count(*) FROM public.inbox GROUP BY topic ORDER BY 1");
    assert!(
        wait_until(Duration::from_secs(60), || ids(&pg).len() >= 6),
        "the matching topics did not arrive: {}\n{}",
        topics(&pg),
        inbox.log()
    );
    // A matching topic created while the inbox runs: found at librdkafka's next metadata
    // refresh of the subscription (topic.metadata.refresh.interval.ms, 30 s with a pattern:
    // librdkafka's 5 min default took 301 s here), and read from its start.
    let t0 = Instant::now();
    broker.create_topic("orders.c", 2);
    produce(&broker, "orders.c", 2, &[0, 0], 3);
    let found = wait_until(Duration::from_secs(60), || ids(&pg).len() >= 12);
    eprintln!("orders.c reached the inbox {:?} after it was created", t0.elapsed());
    assert!(found, "orders.c never reached the inbox: {}\n{}", topics(&pg), inbox.log());
    // Nothing else arrives: the other topics' records, and more of them now, never come.
    produce(&broker, "payments.a", 1, &[3], 3);
    produce(&broker, "orders.b", 1, &[3], 1);
    assert!(wait_until(Duration::from_secs(30), || ids(&pg).len() >= 13), "{}", topics(&pg));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(topics(&pg).split_whitespace().collect::<Vec<_>>(), ["orders.a:3", "orders.b:4", "orders.c:6"]);
    inbox.stop_cleanly();
}

#[test]
fn a_committed_offset_outside_the_log_stops_the_inbox_and_stores_nothing() {
    let pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2);
    produce(&broker, TOPIC, 2, &[0, 0], 3);
    // Beyond p1's end (3): the topic was created again after the old consumer committed.
    legacy_commit(&broker, &[Some(2), Some(40)]);
    let extra = ["--group", GROUP, "--start-from", "committed"];
    let mut inbox = Outboxd::spawn(&inbox_args(&pg, &broker, &["--topics", TOPIC], &extra));
    let status = inbox.wait_exit(Duration::from_secs(45));
    let log = inbox.log();
    assert!(status.is_some_and(|s| !s.success()), "the inbox did not stop with an error ({status:?}):\n{log}");
    assert!(log.contains(&format!("partition {TOPIC}/1")) && log.contains("committed offset 40"), "{log}");
    assert!(stored(&pg).is_empty(), "offsets stored: {:?}", stored(&pg));
    assert!(ids(&pg).is_empty(), "rows stored: {:?}", ids(&pg));
}

#[test]
fn the_event_id_is_the_id_header_else_the_named_one_else_the_position() {
    let pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    let producer: BaseProducer = broker.client_config().create().unwrap();
    let sends: [&[(&str, &str)]; 4] = [
        &[("id", "router-1"), ("eventId", "named-1")],
        &[("eventId", "named-2")],
        &[("other", "x")],
        &[("id", "router-4")],
    ];
    for hs in sends {
        let mut headers = OwnedHeaders::new();
        for (k, v) in hs {
            headers = headers.insert(Header { key: k, value: Some(*v) });
        }
        producer.send(BaseRecord::to(TOPIC).partition(0).key("k").payload("{}").headers(headers)).unwrap();
    }
    producer.flush(Duration::from_secs(20)).unwrap();
    let extra = ["--event-id-header", "eventId"];
    let inbox = Outboxd::spawn(&inbox_args(&pg, &broker, &["--topics", TOPIC], &extra));
    let want: BTreeSet<String> =
        ["router-1", "named-2", &format!("{TOPIC}/0/2"), "router-4"].iter().map(|s| s.to_string()).collect();
    assert_ids(&pg, &want, &inbox);
}

/// After the cut-over, `--start-from committed` left in the deployment must not trust the
/// group's Kafka offsets (by then the inbox's own copy): PostgreSQL restored to an earlier point
/// loses a partition's offset row and its later rows, while Kafka's copy is ahead. That partition
/// starts at the earliest (the rows still there come again as duplicates), never at the copy,
/// which would skip the rows the restore lost.
#[test]
fn after_the_cut_over_a_partition_missing_from_postgresql_starts_at_the_earliest_not_the_copy() {
    let pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, 3);
    produce(&broker, TOPIC, 3, &[0, 0, 0], 10);
    let topics = ["--topics", TOPIC];
    let extra = ["--group", GROUP, "--start-from", "committed"];
    let mut inbox = Outboxd::spawn(&inbox_args(&pg, &broker, &topics, &extra));
    let mut want = BTreeSet::new();
    for p in 0..3 {
        want.extend(span(p, 0, 10));
    }
    assert_ids(&pg, &want, &inbox);
    let copied = wait_until(Duration::from_secs(20), || broker.committed_offsets(GROUP, TOPIC, 3) == vec![Some(10); 3]);
    assert!(copied, "Kafka's copy {:?}", broker.committed_offsets(GROUP, TOPIC, 3));
    inbox.stop_cleanly();

    // The restore: p1's offset row and its rows from offset 4 on are gone; Kafka's copy says 10.
    pg.psql(&format!(
        "DELETE FROM public.inbox_offsets WHERE group_id = '{GROUP}' AND kafka_partition = 1; \
         DELETE FROM public.inbox WHERE kafka_partition = 1 AND kafka_offset >= 4"
    ));
    let mut inbox = Outboxd::spawn(&inbox_args(&pg, &broker, &topics, &extra));
    assert_ids(&pg, &want, &inbox);
    assert!(wait_until(Duration::from_secs(10), || stored(&pg) == vec![10, 10, 10]), "stored {:?}", stored(&pg));
    assert!(inbox.log().contains("start at the earliest"), "no warning about the ignored offsets:\n{}", inbox.log());
    inbox.stop_cleanly();
}
