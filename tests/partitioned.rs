//! The daily-partitioned outbox of `sql/07_partitioned.sql`: inserts into any partition stream
//! under the table's own name (publish_via_partition_root), a publication that would name the
//! partitions is refused with the fix, and the retention function drops only old days. Without
//! partitions, inserting and deleting a row in one transaction still relays it.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

fn insert_at(pg: &PgCluster, created_at: &str, n: usize) {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
         SELECT 'p', 'k', 'part.v1', jsonb_build_object('g', g), {created_at} \
         FROM generate_series(1, {n}) g"
    ));
}

fn partition_of(pg: &PgCluster, created_at: &str) -> String {
    pg.psql(&format!("SELECT tableoid::regclass::text FROM outbox WHERE created_at = {created_at} LIMIT 1"))
}

#[test]
fn partitioned_outbox_streams_from_every_partition() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("07_partitioned.sql"));
    assert_eq!(pg.psql("SELECT relkind FROM pg_class WHERE oid = 'public.outbox'::regclass"), "p");
    // Rows dated tomorrow carry tomorrow's create time; Apache Kafka 4 refuses create times more
    // than an hour ahead by default (message.timestamp.after.max.ms), so this broker takes a week.
    let broker = Broker::options().prop("log.message.timestamp.after.max.ms=604800000").start();

    // A publication made by hand without publish_via_partition_root would name the partitions:
    // refused at start, naming the fix.
    pg.psql("CREATE PUBLICATION outboxd FOR TABLE public.outbox");
    let (code, log) = run_to_exit(&daemon_args(&pg, &broker, &[]), T);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("publish_via_partition_root = true"), "{log}");
    pg.psql("DROP PUBLICATION outboxd");

    // outboxd creates it itself, via the root.
    let d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &["--status-interval", "500ms"]));
    assert_eq!(pg.psql("SELECT pubviaroot::text FROM pg_publication WHERE pubname = 'outboxd'"), "true");
    // Fixed instants of today and tomorrow (UTC), so a later query finds the same rows.
    let today = "(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 minute')";
    let tomorrow = "(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 day 1 hour')";
    // A day with no partition of its own lands in the default partition.
    let long_ago = "'2001-02-03 04:05:06+00'::timestamptz";
    insert_at(&pg, today, 100);
    insert_at(&pg, tomorrow, 50);
    insert_at(&pg, long_ago, 5);
    assert!(partition_of(&pg, today).starts_with("outbox_p"), "{}", partition_of(&pg, today));
    assert_ne!(partition_of(&pg, today), partition_of(&pg, tomorrow));
    assert_eq!(partition_of(&pg, long_ago), "outbox_default");

    let got = broker.consume_all("part.v1.events", 1, 155, T);
    assert_eq!(got.len(), 155, "{}", d.log());
    let mut ids: Vec<String> = got.iter().filter_map(|c| c.header_str("id")).collect();
    ids.sort();
    let mut want: Vec<String> =
        pg.psql("SELECT event_id FROM outbox ORDER BY event_id").lines().map(String::from).collect();
    want.sort();
    assert_eq!(ids, want, "every row of every partition, once");
    assert!(pg.wait_slot_reaches_wal_end(T), "{}", d.log());
}

#[test]
fn retention_drops_old_days_only() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("07_partitioned.sql"));
    pg.apply_sql_file(sql_dir().join("04_publication.sql"));
    let broker = Broker::start();
    let d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--publication-autocreate", "disabled", "--status-interval", "500ms"],
    ));
    // Partitions for 10 days ago and 2 days ago, named as outbox_create_partitions names them.
    let day = |back: i32| pg.psql(&format!("SELECT to_char((now() AT TIME ZONE 'UTC')::date - {back}, 'YYYYMMDD')"));
    for back in [10, 2] {
        pg.psql(&format!(
            "CREATE TABLE outbox_p{} PARTITION OF outbox FOR VALUES FROM ('{}'::timestamp AT TIME ZONE 'UTC') TO ('{}'::timestamp AT TIME ZONE 'UTC')",
            day(back),
            day(back),
            day(back - 1)
        ));
        insert_at(&pg, &format!("('{}'::timestamp AT TIME ZONE 'UTC' + interval '1 hour')", day(back)), 10);
    }
    assert_eq!(broker.consume_all("part.v1.events", 1, 20, T).len(), 20, "{}", d.log());
    let old = format!("outbox_p{}", day(10));
    let recent = format!("outbox_p{}", day(2));

    // A poller's view: the old day still has unpublished rows, so only_published keeps it.
    assert_eq!(pg.psql("SELECT count(*) FROM outbox_drop_partitions(3, only_published => true)"), "0");
    assert!(pg.psql(&format!("SELECT to_regclass('{old}') IS NOT NULL")) == "t");
    pg.psql(&format!("UPDATE {old} SET published_at = now()"));
    assert_eq!(pg.psql("SELECT string_agg(p, ',') FROM outbox_drop_partitions(3, only_published => true) p"), old);
    assert_eq!(pg.psql(&format!("SELECT to_regclass('{old}') IS NULL")), "t", "the old day is dropped");
    assert_eq!(pg.psql(&format!("SELECT count(*) FROM {recent}")), "10", "the recent day is kept");
    // Today's and the days ahead are never candidates.
    assert_eq!(pg.psql("SELECT count(*) FROM outbox_drop_partitions(0)"), "1", "only the day 2 days ago");
    assert!(
        pg.psql("SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass").parse::<i32>().unwrap() >= 8
    );

    // The relay goes on across the drops.
    insert_at(&pg, "now()", 3);
    assert_eq!(broker.consume_all("part.v1.events", 1, 23, T).len(), 23, "{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(T), "{}", d.log());

    // What is left (today's 3 rows) can still be backfilled, across partitions.
    let left = pg.psql("SELECT count(*) FROM outbox");
    let mut a = args(&["backfill", "--postgres-url", &pg.url(), "--since", "30d", "--sink", "null"]);
    a.extend(args(&["--batch-size", "2"]));
    let (code, log) = run_to_exit(&a, T);
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains(&format!("{left} rows read, {left} delivered")), "{left}: {log}");
}

/// The cleanup that needs no partitions: insert and delete in one transaction. The insert is in
/// WAL and is relayed; the table stays empty.
#[test]
fn insert_then_delete_in_one_transaction_is_relayed() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &["--status-interval", "500ms"]));
    for i in 0..5 {
        pg.psql(&format!(
            "BEGIN; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, event_id) \
             VALUES ('d', 'k', 'gone.v1', '{{\"i\": {}}}', '00000000-0000-4000-8000-00000000000{i}'); \
             DELETE FROM outbox WHERE event_id = '00000000-0000-4000-8000-00000000000{i}'; COMMIT;",
            i + 100
        ));
    }
    assert_eq!(pg.psql("SELECT count(*) FROM outbox"), "0");
    let got = broker.consume_all("gone.v1.events", 1, 5, T);
    let is: Vec<i64> = got.iter().map(|c| c.payload_json()["i"].as_i64().unwrap_or(-1)).collect();
    assert_eq!(is, vec![100, 101, 102, 103, 104], "{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(T), "{}", d.log());
}
