//! Debezium 3.6.1.Final (PostgreSQL connector + Outbox EventRouter on a Kafka Connect 4.4.0
//! standalone worker, `scripts/debezium`) and outboxd on the same database and the same Apache
//! Kafka cluster, each with its own slot and publication and its own topic prefix
//! (`route.topic.replacement`). outboxd reads the very connector JSON Debezium runs
//! (`--debezium-config`), only the slot, publication and prefix changed.
//!
//! Record by record: topic (minus the prefix), partition, key bytes, value bytes, header names,
//! order and bytes, timestamp, and each key's order. The one expected difference: Debezium 3.x
//! adds four `__debezium.context.*` headers describing the connector (`extended.headers.enabled`,
//! default true), which outboxd does not write; the test checks they are exactly those four.
//!
//! And the seed article's connector JSON as written: Debezium refuses to start without
//! `topic.prefix` (the only key added), and with it fails its task on the first event; outboxd
//! refuses the same file at start, naming the problem.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::debezium::{pg_source, seed_connector, Debezium};
use common::*;
use serde_json::{json, Value};

/// The seed's connector made to run in Debezium: `topic.prefix` added, the replacement's group
/// named, the timestamp taken from a `timestamp` column (Debezium 3.6's EventRouter takes only
/// INT64 fields with a time logical type: not `timestamptz`, not a plain `bigint`); `prefix` on
/// every topic, its own slot and publication.
fn working_connector(pg: &PgCluster, prefix: &str) -> Value {
    let mut c = seed_connector(pg);
    let cfg = c["config"].as_object_mut().unwrap();
    cfg.insert("topic.prefix".into(), "app-pg".into());
    cfg.insert(
        "transforms.outbox.route.topic.replacement".into(),
        format!("{prefix}.${{routedByValue}}.events").into(),
    );
    cfg.insert("transforms.outbox.table.field.event.timestamp".into(), "created_ts".into());
    cfg.insert("slot.name".into(), format!("{prefix}_slot").into());
    cfg.insert("publication.name".into(), format!("{prefix}_pub").into());
    c
}

/// A private PostgreSQL with the seed's outbox (plus the `timestamp` column Debezium needs) and a
/// broker with both tools' topics of [`TYPES`], [`PARTITIONS`] each.
fn seed_outbox() -> (PgCluster, Broker) {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN created_ts timestamp");
    let broker = Broker::start();
    for prefix in ["dbz", "obx"] {
        for ty in TYPES {
            broker.create_topic(&format!("{prefix}.{ty}.events"), PARTITIONS);
        }
    }
    (pg, broker)
}

/// JsonConverter with `schemas.enable=false` for key and value.
fn with_json_converters(mut c: Value) -> Value {
    for side in ["key", "value"] {
        c["config"][format!("{side}.converter")] = "org.apache.kafka.connect.json.JsonConverter".into();
        c["config"][format!("{side}.converter.schemas.enable")] = "false".into();
    }
    c
}

/// `outboxd config` refuses connector `c` at start: exit 2, one error line that contains `says`.
fn refused_at_start(c: &Value, says: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("refused.json");
    std::fs::write(&file, c.to_string()).unwrap();
    let (code, out) =
        run_to_exit(&args(&["config", "--debezium-config", &file.display().to_string()]), Duration::from_secs(30));
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains(says) && out.lines().filter(|l| l.contains("error")).count() == 1, "{out}");
}

/// A connector for one of the tests' own tables: routed by `kind` to `replacement`, keyed by
/// `agg`, `body` as the payload and `at` as the timestamp, on slot `slot` and publication
/// `{slot}_pub`; `extra` adds or overrides keys.
fn table_connector(pg: &PgCluster, name: &str, table: &str, slot: &str, replacement: String, extra: Value) -> Value {
    let mut config = pg_source(pg);
    let common = json!({
        "topic.prefix": "app-pg",
        "plugin.name": "pgoutput",
        "publication.autocreate.mode": "filtered",
        "table.include.list": format!("public.{table}"),
        "slot.name": slot,
        "publication.name": format!("{slot}_pub"),
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.route.by.field": "kind",
        "transforms.outbox.route.topic.replacement": replacement,
        "transforms.outbox.table.field.event.id": "event_id",
        "transforms.outbox.table.field.event.key": "agg",
        "transforms.outbox.table.field.event.payload": "body",
        "transforms.outbox.table.field.event.timestamp": "at"
    });
    config.extend(common.as_object().cloned().unwrap_or_default());
    config.extend(extra.as_object().cloned().unwrap_or_default());
    json!({ "name": name, "config": config })
}

const TYPES: [&str; 2] = ["order.paid.v1", "order.created.v1"];
const PARTITIONS: i32 = 3;
const KEYS: usize = 12;

/// The corpus: one row per tuple of (aggregate id, event type, payload, headers), in this order,
/// in transactions of up to five rows. Payloads cover objects, arrays, scalars, unicode,
/// escapes, big and fractional numbers and nesting; headers nesting and numbers.
fn corpus() -> Vec<(String, &'static str, String, String)> {
    let payloads = [
        r#"{"a": 1}"#,
        r#"{"u": "ü € 😀 日本", "esc": "line\nbreak \"q\" \\ / \t"}"#,
        r#"{"big": 12345678901234567890, "f": 1.50, "e": 1e3, "neg": -0.0}"#,
        r#"[1, 2, {"x": null, "y": [true, false]}]"#,
        r#""just a string""#,
        r#"42"#,
        r#"{"deep": {"a": {"b": {"c": [1, {"d": "e"}]}}}, "empty": {}, "list": []}"#,
        r#"{"html": "<b>&amp;</b>", "ctrl": "\u0001\u001f"}"#,
    ];
    let headers = [
        "{}",
        r#"{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}"#,
        r#"{"n": 5, "o": {"x": [1, 2]}, "s": "ü"}"#,
    ];
    let mut rows = Vec::new();
    for i in 0..60 {
        rows.push((
            format!("key-{}", i % KEYS),
            TYPES[i % 2],
            payloads[i % payloads.len()].to_owned(),
            headers[i % headers.len()].to_owned(),
        ));
    }
    rows
}

fn sql_text(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn insert_corpus(pg: &PgCluster) -> Vec<String> {
    let rows = corpus();
    let mut ids = Vec::new();
    for (n, chunk) in rows.chunks(5).enumerate() {
        let values: Vec<String> = chunk
            .iter()
            .enumerate()
            .map(|(j, (key, ty, payload, headers))| {
                // Microseconds that do not fall on a millisecond: both must cut them alike.
                let us = (n * 5 + j) * 1501;
                format!(
                    "('agg', {}, {}, {}::jsonb, {}::jsonb, timestamp '2026-01-02 03:04:05' + interval '1 microsecond' * {us})",
                    sql_text(key),
                    sql_text(ty),
                    sql_text(payload),
                    sql_text(headers)
                )
            })
            .collect();
        let out = pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_ts) VALUES {} RETURNING event_id",
            values.join(", ")
        ));
        ids.extend(out.lines().map(str::to_owned).filter(|l| !l.is_empty()));
    }
    ids
}

/// Every record of `{prefix}.{suffix}` for each suffix, by event id (each must come once); `n` in all.
fn consume_topics(broker: &Broker, prefix: &str, suffixes: &[&str], n: usize) -> HashMap<String, Consumed> {
    let mut by_id = HashMap::new();
    let mut total = 0;
    for suffix in suffixes {
        let topic = format!("{prefix}.{suffix}");
        let got = broker.consume_all(&topic, PARTITIONS, n / suffixes.len(), Duration::from_secs(90));
        total += got.len();
        for r in got {
            let id = r.header_str("id").unwrap_or_else(|| panic!("{prefix}: a record without an id header"));
            assert!(by_id.insert(id.clone(), r).is_none(), "{prefix}: event {id} twice");
        }
    }
    assert_eq!(total, n, "{prefix}: records");
    by_id
}

fn consume(broker: &Broker, prefix: &str, n: usize) -> HashMap<String, Consumed> {
    let suffixes: Vec<String> = TYPES.iter().map(|t| format!("{t}.events")).collect();
    consume_topics(broker, prefix, &suffixes.iter().map(String::as_str).collect::<Vec<_>>(), n)
}

const CONTEXT_HEADERS: [&str; 4] = [
    "__debezium.context.connectorLogicalName",
    "__debezium.context.taskId",
    "__debezium.context.connectorName",
    "__debezium.context.runId",
];

/// Every difference between Debezium's and outboxd's record of each event (Debezium's context
/// headers aside, which must be exactly [`CONTEXT_HEADERS`], or none on a logical message's). Events without a key are placed by
/// each producer's sticky partitioner, so their partitions are not compared.
fn compare(ids: &[String], theirs: &HashMap<String, Consumed>, mine: &HashMap<String, Consumed>) -> Vec<String> {
    let mut diffs = Vec::new();
    for id in ids {
        let (t, m) = (&theirs[id], &mine[id]);
        let (t_headers, t_context): (Vec<_>, Vec<_>) =
            t.headers.iter().cloned().partition(|(k, _)| !k.starts_with("__debezium.context."));
        let names: Vec<&str> = t_context.iter().map(|(k, _)| k.as_str()).collect();
        // Records of logical messages carry none.
        assert!(names.is_empty() || names == CONTEXT_HEADERS, "Debezium's context headers changed: {names:?}");
        let mut diff = |what: &str, a: String, b: String| {
            if a != b {
                diffs.push(format!("event {id}: {what}\n  debezium {a}\n  outboxd  {b}"));
            }
        };
        let strip = |topic: &str| topic.split_once('.').map(|(_, rest)| rest.to_owned()).unwrap_or_default();
        diff("topic", strip(&t.topic), strip(&m.topic));
        if t.key.is_some() {
            diff("partition", t.partition.to_string(), m.partition.to_string());
        }
        diff("key", format!("{:?}", t.key), format!("{:?}", m.key));
        diff(
            "value",
            format!("{:?}", t.payload.as_deref().map(String::from_utf8_lossy)),
            format!("{:?}", m.payload.as_deref().map(String::from_utf8_lossy)),
        );
        diff("headers", format!("{t_headers:?}"), format!("{:?}", m.headers));
        diff("timestamp", format!("{:?}", t.timestamp_ms), format!("{:?}", m.timestamp_ms));
    }
    diffs
}

/// Per key, its events' ids in offset order (a key has one partition).
fn key_order(by_id: &HashMap<String, Consumed>) -> HashMap<Vec<u8>, Vec<String>> {
    let mut per_key: HashMap<Vec<u8>, Vec<(i64, String)>> = HashMap::new();
    for (id, r) in by_id {
        if let Some(k) = &r.key {
            per_key.entry(k.clone()).or_default().push((r.offset, id.clone()));
        }
    }
    per_key
        .into_iter()
        .map(|(k, mut v)| {
            v.sort();
            (k, v.into_iter().map(|(_, id)| id).collect())
        })
        .collect()
}

/// Debezium with `connector(prefix "dbz")` and outboxd with `connector(prefix "obx")` read as
/// `--debezium-config`, both streaming.
fn run_both(broker: &Broker, connector: impl Fn(&str) -> Value) -> (Debezium, Outboxd, tempfile::TempDir) {
    let dbz = Debezium::start(&connector("dbz"), &broker.bootstrap());
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("connector.json");
    std::fs::write(&ours, connector("obx").to_string()).unwrap();
    let ours = ours.display().to_string();
    let d = Outboxd::spawn_streaming(&args(&[
        "run",
        "--debezium-config",
        &ours,
        "--kafka-brokers",
        &broker.bootstrap(),
        "--metrics-addr",
        "127.0.0.1:0",
    ]));
    (dbz, d, dir)
}

#[test]
fn same_rows_same_records_byte_for_byte() {
    let (pg, broker) = seed_outbox();
    let (dbz, mut d, _dir) = run_both(&broker, |prefix| working_connector(&pg, prefix));

    let ids = insert_corpus(&pg);
    assert_eq!(ids.len(), corpus().len());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(dbz.task_states(), ["RUNNING"], "{}\n{}", dbz.task_trace(), dbz.log());
    let theirs = consume(&broker, "dbz", ids.len());
    let mine = consume(&broker, "obx", ids.len());
    assert_eq!(dbz.task_states(), ["RUNNING"], "{}", dbz.task_trace());

    let mut diffs = compare(&ids, &theirs, &mine);
    let (to, mo) = (key_order(&theirs), key_order(&mine));
    assert_eq!(to.len(), KEYS);
    for (key, ids) in &to {
        if mo.get(key) != Some(ids) {
            diffs.push(format!("key {:?}: order differs", String::from_utf8_lossy(key)));
        }
    }
    // The corpus reaches every partition of both topics, so the partition comparison means something.
    let used: std::collections::HashSet<(String, i32)> =
        mine.values().map(|r| (r.topic.clone(), r.partition)).collect();
    assert_eq!(used.len(), TYPES.len() * PARTITIONS as usize, "{used:?}");
    d.stop_cleanly();
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

#[test]
fn the_seed_connector_as_written_fails_in_debezium_and_outboxd_says_why_at_start() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();

    // 1. As written: Connect does not start the connector (Debezium 2+ requires topic.prefix;
    //    Connect 4.4's validation then fails on its own, so the log does not say which key).
    let seed = seed_connector(&pg);
    let e = Debezium::try_start(&seed, &broker.bootstrap()).err().expect("Debezium started without topic.prefix");
    assert!(e.contains("Failed to create connector"), "{e}");

    // 2. With topic.prefix (the only key added), the task fails at the first event: the
    //    timestamptz created_at is no INT64 to Debezium's EventRouter.
    let mut with_prefix = seed.clone();
    with_prefix["config"]["topic.prefix"] = "app-pg".into();
    with_prefix["config"]["slot.name"] = "seed_slot".into();
    let dbz = Debezium::start(&with_prefix, &broker.bootstrap());
    pg.insert_event("agg", "key-1", Some("order.paid.v1"), r#"{"a": 1}"#, None);
    assert!(wait_until(Duration::from_secs(60), || dbz.task_states() == ["FAILED"]), "states {:?}", dbz.task_states());
    let trace = dbz.task_trace();
    assert!(trace.contains("Field 'created_at' is not of type INT64"), "{trace}");
    drop(dbz);

    // 3. outboxd refuses that file at start, exit 2, naming the replacement's unknown group (the
    //    next thing Debezium fails on: "No group with name {r}").
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("seed.json");
    std::fs::write(&file, with_prefix.to_string()).unwrap();
    let (code, out) = run_to_exit(
        &args(&["run", "--debezium-config", &file.display().to_string(), "--kafka-brokers", &broker.bootstrap()]),
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("${r}") && out.contains("routedByValue"), "{out}");
    assert!(!out.contains(PASSWORD), "{out}");
}

/// A second table and connector: the key a `uuid` column (NULL in some rows: no key), the payload
/// a `json` column (kept as written: spacing, escapes, key order; NULL in one row), routing by
/// another column with the topic as the bare routed value, a header placement with an alias (NULL
/// in some rows: the one documented difference, Debezium's header with a null value where outboxd
/// writes none), and the timestamp from a `timestamp` column.
#[test]
fn key_payload_and_placement_columns_of_other_types() {
    let pg = PgCluster::start();
    pg.psql(
        "CREATE TABLE public.outbox_typed (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), kind text NOT NULL, \
         agg uuid, body json, tenant text, at timestamp NOT NULL)",
    );
    let broker = Broker::start();
    const KINDS: [&str; 2] = ["typed.a", "typed.b"];
    for prefix in ["dbz", "obx"] {
        for k in KINDS {
            broker.create_topic(&format!("{prefix}.{k}"), PARTITIONS);
        }
    }
    let connector = |prefix: &str| {
        let placement =
            json!({ "transforms.outbox.table.fields.additional.placement": "tenant:header:X-Tenant,kind:header" });
        let (slot, to) = (format!("{prefix}_typed"), format!("{prefix}.${{routedByValue}}"));
        table_connector(&pg, "typed-outbox", "outbox_typed", &slot, to, placement)
    };
    let (dbz, mut d, _dir) = run_both(&broker, connector);
    let bodies = [r#"{"a" :1,  "b":[1 ,2]}"#, r#"{"u": "\u00fc\n", "z": 1, "a": 2}"#, r#"[ ]"#, r#""text""#];
    let mut ids = Vec::new();
    let mut null_tenant = std::collections::HashSet::new();
    for i in 0..24 {
        let agg = if i % 6 == 5 { "NULL".to_owned() } else { format!("'00000000-0000-4000-8000-{:012}'", i % 8) };
        let body = if i == 7 { "NULL".to_owned() } else { sql_text(bodies[i % bodies.len()]) };
        let tenant = if i % 4 == 3 { "NULL".to_owned() } else { sql_text(&format!("tenant-{}", i % 3)) };
        let out = pg.psql(&format!(
            "INSERT INTO outbox_typed (kind, agg, body, tenant, at) VALUES ({}, {agg}, {body}, {tenant}, \
             timestamp '2026-02-03 04:05:06.789' + interval '1 microsecond' * {}) RETURNING event_id",
            sql_text(KINDS[i % 2]),
            i * 777
        ));
        ids.push(out.lines().next().unwrap().to_owned());
        if tenant == "NULL" {
            null_tenant.insert(ids.last().unwrap().clone());
        }
    }
    let suffixes = KINDS;
    let mut theirs = consume_topics(&broker, "dbz", &suffixes, ids.len());
    // The one documented difference (docs/src/debezium.md, `--table-fields-additional-placement`): a NULL column
    // placed as a header is a header with a null value in Debezium and no header in outboxd.
    let mut with_null_header = std::collections::HashSet::new();
    for (id, r) in theirs.iter_mut() {
        let before = r.headers.len();
        r.headers.retain(|(k, v)| !(k == "X-Tenant" && v.is_empty()));
        if r.headers.len() != before {
            with_null_header.insert(id.clone());
        }
    }
    assert_eq!(with_null_header, null_tenant, "Debezium's null headers are where the column was NULL");
    let mine = consume_topics(&broker, "obx", &suffixes, ids.len());
    assert_eq!(dbz.task_states(), ["RUNNING"], "{}", dbz.task_trace());
    let mut diffs = compare(&ids, &theirs, &mine);
    let (to, mo) = (key_order(&theirs), key_order(&mine));
    for (key, ids) in &to {
        if mo.get(key) != Some(ids) {
            diffs.push(format!("key {:?}: order differs", String::from_utf8_lossy(key)));
        }
    }
    d.stop_cleanly();
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

/// The converters Debezium users set in the connector JSON. `JsonConverter` with
/// `schemas.enable=false` for key and value: outboxd reads them (`--key-converter json`,
/// `--value-converter json`) and writes the same bytes (the jsonb payload as a JSON string, the
/// key quoted). With `schemas.enable=true` (JsonConverter's default), or another converter class,
/// outboxd refuses the file at start, naming the setting.
#[test]
fn json_converter_without_schemas_gives_the_same_bytes_and_with_schemas_is_refused() {
    let (pg, broker) = seed_outbox();
    let json_connector = |prefix: &str| with_json_converters(working_connector(&pg, prefix));

    // Refused: the schema envelope, and a converter outboxd does not write.
    for (key, value, says) in [
        ("value.converter.schemas.enable", "true", "value.converter.schemas.enable=true"),
        (
            "key.converter",
            "io.confluent.connect.avro.AvroConverter",
            "key.converter=io.confluent.connect.avro.AvroConverter",
        ),
    ] {
        let mut c = json_connector("obx");
        c["config"][key] = value.into();
        refused_at_start(&c, says);
    }

    let (dbz, mut d, _dir) = run_both(&broker, json_connector);
    let ids = insert_corpus(&pg);
    let theirs = consume(&broker, "dbz", ids.len());
    let mine = consume(&broker, "obx", ids.len());
    assert_eq!(dbz.task_states(), ["RUNNING"], "{}", dbz.task_trace());
    // The value really is a JSON string (not the raw payload), so the comparison means something.
    let sample = theirs.values().next().and_then(|r| r.payload.clone()).unwrap_or_default();
    assert!(sample.starts_with(b"\"") && serde_json::from_slice::<String>(&sample).is_ok(), "{sample:?}");
    let diffs = compare(&ids, &theirs, &mine);
    d.stop_cleanly();
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

/// Edges of the corpus, one connector: topics of 1, 3 and 12 partitions (routed by a named regex
/// group), a `bigint` key (NULL in some rows: no key, so the partition is the producers' sticky
/// choice and not compared), a `text` payload with NULL, empty and whitespace-only values
/// (tombstones, `route.tombstone.on.empty.payload=true`), a 1 MB payload
/// (`producer.override.max.request.size`), a 10,000-row transaction, UPDATE and DELETE of outbox
/// rows (no event in either), and rows of a table outside the publication (none either).
#[test]
fn partitions_tombstones_a_big_payload_and_a_big_transaction() {
    let pg = PgCluster::start();
    pg.psql(
        "CREATE TABLE public.outbox_edge (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), kind text NOT NULL, \
         agg bigint, body text, at timestamp NOT NULL DEFAULT timestamp '2026-03-04 05:06:07.891'); \
         CREATE TABLE public.not_outbox (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), kind text, agg bigint, body text)",
    );
    let broker = Broker::start();
    const KINDS: [(&str, i32); 3] = [("p1", 1), ("p3", 3), ("p12", 12)];
    for prefix in ["dbz", "obx"] {
        for (k, n) in KINDS {
            broker.create_topic_with(&format!("{prefix}.edge.{k}"), n, &[("max.message.bytes", "4194304")], false);
        }
    }
    let connector = |prefix: &str| {
        let edge = json!({
            "producer.override.max.request.size": "4194304",
            "transforms.outbox.route.topic.regex": "(?<size>p[0-9]+)",
            "transforms.outbox.route.tombstone.on.empty.payload": "true"
        });
        let (slot, to) = (format!("{prefix}_edge"), format!("{prefix}.edge.${{size}}"));
        table_connector(&pg, "edge-outbox", "outbox_edge", &slot, to, edge)
    };
    let (dbz, mut d, _dir) = run_both(&broker, connector);

    let mut per_kind: HashMap<&str, usize> = HashMap::new();
    let mut ids = Vec::new();
    let mut insert = |pg: &PgCluster, sql: String, kind: &'static str| {
        let out = pg.psql(&sql);
        let got: Vec<String> = out.lines().filter(|l| !l.is_empty()).map(str::to_owned).collect();
        *per_kind.entry(kind).or_default() += got.len();
        ids.extend(got);
    };
    let bodies = ["NULL", "''", "'   '", r#"'{"a": 1}'"#, "'plain text ü'"];
    for (i, (kind, _)) in KINDS.iter().cycle().take(60).enumerate() {
        let agg = if i % 7 == 6 { "NULL".to_owned() } else { (i as i64 * 7919 - 100).to_string() };
        insert(
            &pg,
            format!(
                "INSERT INTO outbox_edge (kind, agg, body) VALUES ('{kind}', {agg}, {}) RETURNING event_id",
                bodies[i % bodies.len()]
            ),
            kind,
        );
    }
    insert(
        &pg,
        "INSERT INTO outbox_edge (kind, agg, body) VALUES ('p3', 42, repeat('x', 1048576)) RETURNING event_id".into(),
        "p3",
    );
    // One transaction of 10,000 rows over 40 keys: each key's order inside it must hold.
    insert(
        &pg,
        "INSERT INTO outbox_edge (kind, agg, body) SELECT 'p12', g % 40, '{\"n\": ' || g || '}' \
         FROM generate_series(1, 10000) g ORDER BY g RETURNING event_id"
            .into(),
        "p12",
    );
    // No events: UPDATE and DELETE of outbox rows, rows of a table outside the publication.
    pg.psql("UPDATE outbox_edge SET body = 'changed' WHERE kind = 'p1'; DELETE FROM outbox_edge WHERE kind = 'p3' AND body IS NULL");
    pg.psql("INSERT INTO not_outbox (kind, agg, body) SELECT 'p1', g, 'x' FROM generate_series(1, 10) g");
    insert(&pg, "INSERT INTO outbox_edge (kind, agg, body) VALUES ('p1', 1, 'last') RETURNING event_id".into(), "p1");

    let read = |prefix: &str| {
        let mut by_id = HashMap::new();
        for (kind, partitions) in KINDS {
            let topic = format!("{prefix}.edge.{kind}");
            let got = broker.consume_all(&topic, partitions, per_kind[kind], Duration::from_secs(120));
            assert_eq!(got.len(), per_kind[kind], "{topic}: records (no event for UPDATE, DELETE, other tables)");
            for r in got {
                let id = r.header_str("id").expect("id header");
                assert!(by_id.insert(id.clone(), r).is_none(), "{prefix}: {id} twice");
            }
        }
        by_id
    };
    let theirs = read("dbz");
    let mine = read("obx");
    assert_eq!(dbz.task_states(), ["RUNNING"], "{}", dbz.task_trace());
    let tombstones = mine.values().filter(|r| r.payload.is_none()).count();
    assert_eq!(tombstones, 36, "NULL, empty and blank bodies are tombstones");
    let mut diffs = compare(&ids, &theirs, &mine);
    let (to, mo) = (key_order(&theirs), key_order(&mine));
    for (key, ids) in &to {
        if mo.get(key) != Some(ids) {
            diffs.push(format!("key {:?}: order differs", String::from_utf8_lossy(key)));
        }
    }
    let used: std::collections::HashSet<(String, i32)> =
        mine.values().filter(|r| r.key.is_some()).map(|r| (r.topic.clone(), r.partition)).collect();
    assert_eq!(used.len(), 1 + 3 + 12, "every partition of every topic holds a keyed event: {used:?}");
    d.stop_cleanly();
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

/// A `bytea` payload (Avro or Protobuf bytes in practice) under `ByteArrayConverter`, the
/// converter Debezium users set for it: outboxd (`--value-converter bytes`, read from the file)
/// writes the same bytes, zero bytes and invalid UTF-8 included.
#[test]
fn bytea_payload_under_byte_array_converter() {
    let pg = PgCluster::start();
    pg.psql(
        "CREATE TABLE public.outbox_bin (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), kind text NOT NULL, \
         agg text, body bytea, at timestamp NOT NULL DEFAULT timestamp '2026-05-06 07:08:09.123')",
    );
    let broker = Broker::start();
    for prefix in ["dbz", "obx"] {
        broker.create_topic(&format!("{prefix}.bin"), PARTITIONS);
    }
    let connector = |prefix: &str| {
        let bin = json!({ "value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter" });
        let (slot, to) = (format!("{prefix}_bin"), format!("{prefix}.${{routedByValue}}"));
        table_connector(&pg, "bin-outbox", "outbox_bin", &slot, to, bin)
    };
    let (dbz, mut d, _dir) = run_both(&broker, connector);
    let mut ids = Vec::new();
    for i in 0..24 {
        let body = match i % 4 {
            0 => "'\\x000102ff80fe'::bytea".to_owned(),
            1 => "NULL".to_owned(),
            2 => "''::bytea".to_owned(),
            _ => format!("decode(md5('{i}'), 'hex') || '\\xc328'::bytea"),
        };
        let out = pg.psql(&format!(
            "INSERT INTO outbox_bin (kind, agg, body) VALUES ('bin', 'k{}', {body}) RETURNING event_id",
            i % 5
        ));
        ids.push(out.lines().next().unwrap().to_owned());
    }
    let theirs = consume_topics(&broker, "dbz", &["bin"], ids.len());
    let mine = consume_topics(&broker, "obx", &["bin"], ids.len());
    assert_eq!(dbz.task_states(), ["RUNNING"], "{}", dbz.task_trace());
    let raw = mine.values().filter_map(|r| r.payload.as_deref()).find(|p| p.starts_with(&[0, 1, 2, 0xff]));
    assert_eq!(raw, Some(&[0u8, 1, 2, 0xff, 0x80, 0xfe][..]), "the bytes themselves");
    let diffs = compare(&ids, &theirs, &mine);
    d.stop_cleanly();
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

/// The configuration Debezium's outbox documentation recommends: `table.expand.json.payload=true`
/// with JsonConverter (`schemas.enable=false`), so consumers read the payload as a JSON object.
/// Debezium infers a Connect schema from each payload and writes the struct; outboxd reproduces
/// that, including where Debezium gives up and keeps the string (top-level arrays and scalars,
/// arrays mixing types or number types) and what it leaves out (null fields, empty arrays).
/// Once with a `jsonb` payload column (PostgreSQL normalises the text), once with `text` (the
/// text as written: exponents, `-0.0`, duplicate keys, spacing).
#[test]
fn expanded_json_payload_under_json_converter() {
    let pg = PgCluster::start();
    pg.psql(
        "CREATE TABLE public.outbox_x (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), kind text NOT NULL, \
         agg text, body jsonb, tbody text, at timestamp NOT NULL DEFAULT timestamp '2026-07-08 09:10:11.121')",
    );
    let payloads = [
        r#"{"a": 1}"#,
        r#"{"u": "ü € 😀 日本", "esc": "line\nbreak \"q\" \\ / \t", "ctrl": "\u0001\u001f"}"#,
        r#"{"f": 1.50, "e": 1e3, "neg": -0.0, "i": 2147483648, "s": 5, "tiny": 1e-7, "huge": 123456789.5, "m": -2147483649}"#,
        r#"[1, 2, {"x": null}]"#,
        r#""just a string""#,
        r#"42"#,
        r#"null"#,
        r#"{"n": null, "l": [], "o": {}, "b": true, "f": false}"#,
        r#"{"deep": {"a": {"b": {"c": [1, 2, null]}}}, "objs": [{"x": 1, "y": "a"}, {"x": 2, "y": "b"}]}"#,
        r#"{"mixed": [1, "a"]}"#,
        r#"{"nums": [1, 2.5]}"#,
        r#"{"longs": [1, 9999999999]}"#,
        r#"{"nested": [[1, 2], [3]], "strs": ["a", null, "b"]}"#,
        r#"{"dup": 1, "dup": 2, "z": 0.1}"#,
        r#"{}"#,
        r#"not json at all"#,
    ];
    let broker = Broker::start();
    for prefix in ["dbz", "obx"] {
        for column in ["body", "tbody"] {
            broker.create_topic(&format!("{prefix}.x.{column}"), PARTITIONS);
        }
    }
    let connector = |prefix: &str, column: &str| {
        let x = json!({
            "transforms.outbox.table.field.event.payload": column,
            "transforms.outbox.table.expand.json.payload": "true"
        });
        let (slot, to) = (format!("{prefix}_x_{column}"), format!("{prefix}.x.{column}"));
        with_json_converters(table_connector(&pg, &format!("x-{column}"), "outbox_x", &slot, to, x))
    };
    let both = [run_both(&broker, |p| connector(p, "body")), run_both(&broker, |p| connector(p, "tbody"))];
    let mut ids = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        let q = p.replace('\'', "''");
        // A payload that is not JSON has no jsonb form: NULL there.
        let jsonb = if serde_json::from_str::<Value>(p).is_ok() { format!("'{q}'::jsonb") } else { "NULL".into() };
        // One NULL key: JsonConverter writes it as the JSON `null`, a key like any other.
        let agg = if i == 6 { "NULL".to_owned() } else { format!("'k{i}'") };
        let out = pg.psql(&format!(
            "INSERT INTO outbox_x (kind, agg, body, tbody) VALUES ('x', {agg}, {jsonb}, '{q}') RETURNING event_id"
        ));
        ids.push(out.lines().next().unwrap().to_owned());
    }
    let mut diffs = Vec::new();
    let (mut expanded, mut nulls) = (0, 0);
    for column in ["body", "tbody"] {
        let suffix = format!("x.{column}");
        let theirs = consume_topics(&broker, "dbz", &[suffix.as_str()], ids.len());
        let mine = consume_topics(&broker, "obx", &[suffix.as_str()], ids.len());
        expanded += mine.values().filter(|r| r.payload.as_deref().is_some_and(|p| p.starts_with(b"{"))).count();
        nulls += mine.values().filter(|r| r.key.as_deref() == Some(b"null")).count();
        diffs.extend(compare(&ids, &theirs, &mine).into_iter().map(|d| format!("{column}: {d}")));
    }
    for (dbz, mut d, _dir) in both {
        assert_eq!(dbz.task_states(), ["RUNNING"], "{}", dbz.task_trace());
        d.stop_cleanly();
    }
    assert!(expanded >= 16, "expanded payloads: {expanded}");
    assert_eq!(nulls, 2, "the NULL key is the bytes `null` in both topics");
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

/// Events emitted as transactional logical messages (`pg_logical_emit_message(true, 'outbox',
/// content)`): Debezium with `message.prefix.include.list` and its
/// DecodeLogicalDecodingMessageContent transform before the EventRouter, outboxd with
/// `--messages-prefix` (read from the same file), under JsonConverter (under StringConverter
/// Debezium writes an object payload as the Connect struct's `toString()`). Payloads of every JSON
/// type. Timestamps are not compared: Debezium's EventRouter takes no message field as the
/// timestamp (an epoch-millisecond number is a plain INT64 to it), so it uses processing time.
#[test]
fn logical_messages_through_debeziums_decoder() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    for prefix in ["dbz", "obx"] {
        for t in ["msg.a", "msg.b"] {
            broker.create_topic(&format!("{prefix}.{t}"), PARTITIONS);
        }
    }
    let connector = |prefix: &str| {
        let mut config = pg_source(&pg);
        let m = json!({
            "topic.prefix": "app-pg",
            "plugin.name": "pgoutput",
            "publication.autocreate.mode": "filtered",
            "table.include.list": "public.outbox",
            "slot.name": format!("{prefix}_msg"),
            "publication.name": format!("{prefix}_msg_pub"),
            "message.prefix.include.list": "outbox",
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "false",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false",
            "transforms": "decode,outbox",
            "transforms.decode.type": "io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "transforms.outbox.route.by.field": "event_type",
            "transforms.outbox.route.topic.replacement": format!("{prefix}.${{routedByValue}}"),
            "transforms.outbox.table.field.event.id": "event_id",
            "transforms.outbox.table.field.event.key": "aggregate_id",
            "transforms.outbox.table.field.event.payload": "payload"
        });
        config.extend(m.as_object().cloned().unwrap_or_default());
        json!({ "name": "msg-outbox", "config": config })
    };
    let (dbz, mut d, _dir) = run_both(&broker, connector);
    let payloads = [
        r#"{"orderId": 42, "total": 10.5, "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}]}"#,
        r#""a string payload ü 😀""#,
        r#"12"#,
        r#"[1, 2, 3]"#,
        r#"{"n": null, "l": [], "nested": {"big": 9999999999, "t": true}}"#,
        r#"true"#,
    ];
    let mut ids = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        let id = format!("00000000-0000-4000-8000-{i:012}");
        let content = format!(
            r#"{{"event_id": "{id}", "aggregate_id": "agg-{}", "event_type": "{}", "payload": {p}}}"#,
            i % 4,
            ["msg.a", "msg.b"][i % 2]
        );
        pg.psql(&format!("BEGIN; SELECT pg_logical_emit_message(true, 'outbox', {}); COMMIT", sql_text(&content)));
        ids.push(id);
    }
    let mut theirs = consume_topics(&broker, "dbz", &["msg.a", "msg.b"], ids.len());
    let mut mine = consume_topics(&broker, "obx", &["msg.a", "msg.b"], ids.len());
    assert_eq!(dbz.task_states(), ["RUNNING"], "{}", dbz.task_trace());
    for r in theirs.values_mut().chain(mine.values_mut()) {
        r.timestamp_ms = None;
    }
    let diffs = compare(&ids, &theirs, &mine);
    d.stop_cleanly();
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

/// Envelope placement (`col:envelope[:alias]`, here the seed table's `event_type` as `type` and
/// `aggregate_type` under its own name) under StringConverter: Debezium writes the Connect
/// struct's `toString()` (`Struct{payload=…,type=…,…}`), outboxd a JSON object with the same
/// fields. That value is the one documented difference (docs/src/debezium.md); every other part
/// of every record is identical. (Under JsonConverter the bytes are the same: the next test.)
#[test]
fn envelope_placement_under_string_converter_differs_only_in_the_value() {
    let (pg, broker) = seed_outbox();
    let connector = |prefix: &str| {
        let mut c = working_connector(&pg, prefix);
        c["config"]["transforms.outbox.table.fields.additional.placement"] =
            "headers:header,event_type:envelope:type,aggregate_type:envelope".into();
        c
    };

    let (dbz, mut d, _dir) = run_both(&broker, connector);
    let ids = insert_corpus(&pg);
    let mut theirs = consume(&broker, "dbz", ids.len());
    let mut mine = consume(&broker, "obx", ids.len());
    assert_eq!(dbz.task_states(), ["RUNNING"], "{}", dbz.task_trace());
    for id in &ids {
        let (t, m) = (theirs.get_mut(id).unwrap(), mine.get_mut(id).unwrap());
        let theirs_value = String::from_utf8_lossy(t.payload.as_deref().unwrap_or_default()).into_owned();
        let mine_value: Value = serde_json::from_slice(m.payload.as_deref().unwrap_or_default())
            .unwrap_or_else(|e| panic!("event {id}: outboxd's envelope is not JSON ({e})"));
        let (ty, agg) = (mine_value["type"].as_str().unwrap_or_default(), mine_value["aggregate_type"].as_str());
        assert!(TYPES.contains(&ty) && agg.is_some() && mine_value.get("payload").is_some(), "{id}: {mine_value}");
        assert!(
            theirs_value.starts_with("Struct{")
                && theirs_value.contains(&format!("type={ty}"))
                && theirs_value.contains(&format!("aggregate_type={}", agg.unwrap_or_default())),
            "event {id}: Debezium's envelope is no longer the struct's toString(): {theirs_value}"
        );
        // The documented difference set aside, the rest of the record must be the same.
        t.payload = None;
        m.payload = None;
    }
    let diffs = compare(&ids, &theirs, &mine);
    d.stop_cleanly();
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

/// Envelope placement under JsonConverter (`schemas.enable=false`, key and value): outboxd writes
/// Debezium's envelope struct as JsonConverter does, byte for byte: the payload (a JSON string,
/// as Debezium carries jsonb) first, then each envelope column in placement order, typed as
/// Debezium types its column: text (`event_type` as `type`), an integer (`attempts`) and a
/// column that is NULL in every row (`error`). With `table.expand.json.payload` as well, outboxd
/// refuses at start.
#[test]
fn envelope_placement_under_json_converter_gives_the_same_bytes() {
    let (pg, broker) = seed_outbox();
    let connector = |prefix: &str| {
        let mut c = working_connector(&pg, prefix);
        c["config"]["transforms.outbox.table.fields.additional.placement"] =
            "headers:header,event_type:envelope:type,attempts:envelope,error:envelope:err".into();
        with_json_converters(c)
    };
    let mut expand = connector("obx");
    expand["config"]["transforms.outbox.table.expand.json.payload"] = "true".into();
    refused_at_start(&expand, "--table-expand-json-payload");

    let (dbz, mut d, _dir) = run_both(&broker, connector);
    let ids = insert_corpus(&pg);
    let theirs = consume(&broker, "dbz", ids.len());
    let mine = consume(&broker, "obx", ids.len());
    assert_eq!(dbz.task_states(), ["RUNNING"], "{}", dbz.task_trace());
    // The value really is Debezium's envelope as JSON, so the comparison means something.
    let sample = theirs.values().next().and_then(|r| r.payload.clone()).unwrap_or_default();
    let v: Value = serde_json::from_slice(&sample).unwrap_or_else(|e| panic!("{e}: {sample:?}"));
    assert!(v["payload"].is_string() && v["attempts"] == 0 && v["err"].is_null(), "{v}");
    let diffs = compare(&ids, &theirs, &mine);
    d.stop_cleanly();
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}
