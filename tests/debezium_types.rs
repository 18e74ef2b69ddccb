//! Placed columns of every type beside the real Debezium 3.6.1.Final (PostgreSQL connector,
//! Outbox EventRouter, Connect 4.4.0's default `SimpleHeaderConverter`): one outbox table with a
//! column of each type Debezium's PostgreSQL connector maps, every column placed as a header
//! (`table.fields.additional.placement`), an `int` column as the partition, and under
//! JsonConverter (`schemas.enable=false`) every column in the envelope too. Debezium and outboxd
//! read the same connector JSON (`--debezium-config`), each with its own slot, publication and
//! topic; every header, the value and the partition of every row must be the same bytes.
//!
//! One Connect start-up per connector option set (`time.precision.mode`,
//! `decimal.handling.mode`, `binary.handling.mode`, `interval.handling.mode`), all rows in each.
//! The differences listed in docs/src/debezium.md are the only ones allowed: Debezium's four
//! `__debezium.context.*` headers, and the refusals (an option set outboxd does not write is
//! refused at start, naming the option: checked here with `outboxd config`).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::debezium::{pg_source, Debezium};
use common::*;
use serde_json::{json, Value};

/// Each typed column: name, SQL type, and its values (SQL literals), one per row (cycled).
const COLUMNS: &[(&str, &str, &[&str])] = &[
    ("c_int2", "smallint", &["0", "-32768", "32767"]),
    ("c_int4", "integer", &["0", "-2147483648", "42"]),
    ("c_int8", "bigint", &["0", "-9223372036854775808", "9223372036854775807"]),
    ("c_real", "real", &["1", "1e20", "'-0'", "3.14", "1e-5", "'NaN'", "'Infinity'", "123456.7"]),
    (
        "c_float8",
        "double precision",
        &["1", "1e20", "'-0'", "0.1", "123456789.125", "1e-7", "'-Infinity'", "'NaN'", "10000000", "0.001"],
    ),
    (
        "c_num",
        "numeric",
        &["10.50", "0", "-1.000", "123456789012345678901234567890.5", "1e-20", "100", "'NaN'", "'-Infinity'"],
    ),
    ("c_num_s", "numeric(20,8)", &["0", "0.00000001", "12.5", "-3", "123456789012.00000001"]),
    ("c_num_0", "numeric(10,0)", &["0", "1234567890", "-7"]),
    ("c_money", "money", &["12.34", "-1000", "0", "1234567.5"]),
    ("c_bool", "boolean", &["true", "false"]),
    ("c_text", "text", &["'plain'", r#"'ü "q" \ x'"#, "''", "'[1, 2]'"]),
    ("c_varchar", "varchar(20)", &["'v'", "'with space'"]),
    ("c_char", "char(5)", &["'ab'", "'abcde'"]),
    ("c_uuid", "uuid", &["'0b6b3c1e-0000-4000-8000-000000000001'"]),
    ("c_json", "json", &[r#"'{"a" : 1, "b": [true]}'"#, "'[]'", r#"'"s"'"#]),
    ("c_jsonb", "jsonb", &[r#"'{"a" : 1, "b": [true]}'"#, "'null'", "'12.50'"]),
    ("c_bytea", "bytea", &[r"'\x5b'", r"'\x'", r"'\x00ff10'"]),
    ("c_date", "date", &["'2026-01-01'", "'1970-01-01'", "'1969-12-31'", "'0001-01-01'"]),
    ("c_time", "time", &["'08:00:00'", "'23:59:59.999999'", "'00:00:00.5'"]),
    ("c_time3", "time(3)", &["'12:34:56.789'", "'00:00:00'"]),
    ("c_timetz", "timetz", &["'08:00:00+02'", "'23:59:59.123456-05:30'", "'00:00:00+00'", "'12:00:00.5+00'"]),
    ("c_ts", "timestamp", &["'2026-12-05 09:34:36'", "'1969-12-31 23:59:59.5'", "'2026-01-01 00:00:00.000001'"]),
    ("c_ts3", "timestamp(3)", &["'2026-12-05 09:34:36.123'", "'1970-01-01 00:00:00'"]),
    (
        "c_tstz",
        "timestamptz",
        &["'2026-12-05 08:00:00+00'", "'2026-12-05 08:00:00.5+02'", "'1969-07-20 20:17:40.123456+00'"],
    ),
    ("c_tstz3", "timestamptz(3)", &["'2026-12-05 08:00:00.1+00'", "'2026-12-05 08:00:00+00'"]),
    ("c_tstz0", "timestamptz(0)", &["'2026-12-05 08:00:00+00'"]),
    ("c_ts6", "timestamp(6)", &["'2026-12-05 09:34:36.5'"]),
    ("c_time6", "time(6)", &["'08:00:00.25'"]),
    ("c_interval", "interval", &["'1 year 2 months 3 days 04:05:06.789'", "'-1 day'", "'0'", "'1 month'"]),
    ("c_int_arr", "integer[]", &["'{1,2,3}'", "'{}'", "'{NULL,1}'"]),
    ("c_text_arr", "text[]", &[r#"'{a,"b c","d\"e",NULL}'"#, "'{}'"]),
    ("c_int8_arr", "bigint[]", &["'{-1,9223372036854775807}'"]),
    ("c_bool_arr", "boolean[]", &["'{t,f}'"]),
    ("c_float_arr", "double precision[]", &["'{1,1e20,0.5}'"]),
    ("c_uuid_arr", "uuid[]", &["'{0b6b3c1e-0000-4000-8000-000000000001}'"]),
    ("c_date_arr", "date[]", &["'{2026-01-01,1969-12-31}'"]),
    ("c_tstz_arr", "timestamptz[]", &[r#"'{"2026-12-05 08:00:00+00"}'"#]),
    ("c_jsonb_arr", "jsonb[]", &[r#"'{"{\"a\": 1}"}'"#]),
    ("c_bytea_arr", "bytea[]", &[r#"'{"\\x5b"}'"#]),
    ("c_enum", "mood", &["'happy'", "'sad'"]),
    ("c_inet", "inet", &["'192.168.0.1/24'", "'::1'"]),
    ("c_cidr", "cidr", &["'10.0.0.0/8'"]),
    ("c_macaddr", "macaddr", &["'08:00:2b:01:02:03'"]),
];

const ROWS: usize = 10;
const PARTITIONS: i32 = 3;

fn create_table(pg: &PgCluster) {
    let cols: Vec<String> = COLUMNS.iter().map(|(n, t, _)| format!("{n} {t}")).collect();
    pg.psql("CREATE TYPE mood AS ENUM ('happy', 'sad')");
    pg.psql(&format!(
        "CREATE TABLE public.outbox_types (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), kind text NOT NULL, \
         agg text, body jsonb, at timestamp NOT NULL, part integer NOT NULL, {})",
        cols.join(", ")
    ));
}

/// Inserts [`ROWS`] rows (each column's values cycled) and returns their event ids in order.
fn insert_rows(pg: &PgCluster) -> Vec<String> {
    let names: Vec<&str> = COLUMNS.iter().map(|(n, _, _)| *n).collect();
    let mut ids = Vec::new();
    for i in 0..ROWS {
        let values: Vec<String> = COLUMNS.iter().map(|(_, t, vs)| format!("({})::{t}", vs[i % vs.len()])).collect();
        let out = pg.psql(&format!(
            "INSERT INTO outbox_types (kind, agg, body, at, part, {}) VALUES ('types', 'key-{i}', '{{\"i\": {i}}}', \
             timestamp '2026-02-03 04:05:06', {}, {}) RETURNING event_id",
            names.join(", "),
            i % PARTITIONS as usize,
            values.join(", ")
        ));
        ids.push(out.lines().next().unwrap_or_default().to_owned());
    }
    ids
}

/// The connector of one run: every typed column as a header (under its own name), `part` as the
/// partition, and with `envelope` every typed column in the envelope too (as `e_<name>`); `extra`
/// adds the option set.
fn connector(pg: &PgCluster, prefix: &str, envelope: bool, extra: &Value) -> Value {
    let mut placement: Vec<String> = COLUMNS.iter().map(|(n, _, _)| format!("{n}:header")).collect();
    placement.push("part:partition".into());
    if envelope {
        placement.extend(COLUMNS.iter().map(|(n, _, _)| format!("{n}:envelope:e_{n}")));
    }
    let mut config = pg_source(pg);
    let common = json!({
        "topic.prefix": "app-pg",
        // Each run reads only the rows it inserts (the table keeps the earlier runs' rows).
        "snapshot.mode": "no_data",
        "plugin.name": "pgoutput",
        "publication.autocreate.mode": "filtered",
        "table.include.list": "public.outbox_types",
        "slot.name": format!("{prefix}_slot"),
        "publication.name": format!("{prefix}_pub"),
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.route.by.field": "kind",
        "transforms.outbox.route.topic.replacement": format!("{prefix}.${{routedByValue}}"),
        "transforms.outbox.table.field.event.id": "event_id",
        "transforms.outbox.table.field.event.key": "agg",
        "transforms.outbox.table.field.event.payload": "body",
        "transforms.outbox.table.field.event.timestamp": "at",
        "transforms.outbox.table.fields.additional.placement": placement.join(","),
    });
    config.extend(common.as_object().cloned().unwrap_or_default());
    config.extend(extra.as_object().cloned().unwrap_or_default());
    if envelope {
        for side in ["key", "value"] {
            config.insert(format!("{side}.converter"), "org.apache.kafka.connect.json.JsonConverter".into());
            config.insert(format!("{side}.converter.schemas.enable"), "false".into());
        }
    }
    json!({ "name": format!("{prefix}-types"), "config": config })
}

/// Every record of `topic`, by its `id` header; `n` of them, each once.
fn consume(broker: &Broker, topic: &str, n: usize) -> HashMap<String, Consumed> {
    let mut by_id = HashMap::new();
    for r in broker.consume_all(topic, PARTITIONS, n, Duration::from_secs(90)) {
        let id = r.header_str("id").unwrap_or_else(|| panic!("{topic}: a record without an id header"));
        assert!(by_id.insert(id.clone(), r).is_none(), "{topic}: event {id} twice");
    }
    assert_eq!(by_id.len(), n, "{topic}: records");
    by_id
}

fn show(b: Option<&[u8]>) -> String {
    match b {
        None => "(none)".into(),
        Some(b) => format!("{:?}", String::from_utf8_lossy(b)),
    }
}

/// The row's value of the column a header or envelope field names (for the report).
fn row_value(name: &str, row: usize) -> &'static str {
    let name = name.strip_prefix("e_").unwrap_or(name);
    COLUMNS.iter().find(|(n, _, _)| *n == name).map(|(_, _, vs)| vs[row % vs.len()]).unwrap_or("")
}

/// One line per difference: run, column, the row's SQL value, Debezium's bytes, outboxd's.
fn compare(
    run: &str,
    ids: &[String],
    theirs: &HashMap<String, Consumed>,
    mine: &HashMap<String, Consumed>,
) -> Vec<String> {
    let mut diffs = Vec::new();
    for (row, id) in ids.iter().enumerate() {
        let (t, m) = (&theirs[id], &mine[id]);
        let t_headers: Vec<&(String, Vec<u8>)> =
            t.headers.iter().filter(|(k, _)| !k.starts_with("__debezium.context.")).collect();
        let mut names: Vec<&str> = t_headers.iter().map(|(k, _)| k.as_str()).collect();
        for (k, _) in &m.headers {
            if !names.contains(&k.as_str()) {
                names.push(k);
            }
        }
        let mut allowed = Vec::new();
        for name in names {
            let (a, b) = (t.header(name), m.header(name));
            // The documented difference (docs/src/debezium.md): a value Debezium carries as null
            // (a numeric NaN or infinity under decimal.handling.mode=precise) is a null-valued
            // header there and no header in outboxd.
            let special = ["NaN", "Infinity"].iter().any(|s| row_value(name, row).contains(s));
            if a == Some(&[][..]) && b.is_none() && special && !run.starts_with("options") {
                allowed.push(name);
                continue;
            }
            if a != b {
                diffs.push(format!("{run} | header {name} | {} | {} | {}", row_value(name, row), show(a), show(b)));
            }
        }
        let order: Vec<&str> = m.headers.iter().map(|(k, _)| k.as_str()).collect();
        let t_order: Vec<&str> = t_headers.iter().map(|(k, _)| k.as_str()).filter(|k| !allowed.contains(k)).collect();
        if order != t_order {
            diffs.push(format!("{run} | header order | row {row} | {t_order:?} | {order:?}"));
        }
        if t.partition != m.partition {
            diffs.push(format!("{run} | partition | row {row} | {} | {}", t.partition, m.partition));
        }
        if t.key != m.key {
            diffs.push(format!("{run} | key | row {row} | {} | {}", show(t.key.as_deref()), show(m.key.as_deref())));
        }
        if t.payload != m.payload {
            // Field by field where both are JSON objects, so the report names the column.
            let parse = |p: &Option<Vec<u8>>| -> Option<serde_json::Map<String, Value>> {
                serde_json::from_slice(p.as_deref()?).ok()
            };
            match (parse(&t.payload), parse(&m.payload)) {
                (Some(a), Some(b)) => {
                    for (k, v) in &a {
                        if b.get(k) != Some(v) {
                            let mv = b.get(k).map(|v| v.to_string()).unwrap_or_else(|| "(none)".into());
                            diffs.push(format!("{run} | envelope {k} | {} | {v} | {mv}", row_value(k, row)));
                        }
                    }
                    if a == b {
                        // Same JSON, other bytes (field order, number spelling).
                        diffs.push(format!(
                            "{run} | value bytes | row {row} | {} | {}",
                            show(t.payload.as_deref()),
                            show(m.payload.as_deref())
                        ));
                    }
                }
                _ => diffs.push(format!(
                    "{run} | value | row {row} | {} | {}",
                    show(t.payload.as_deref()),
                    show(m.payload.as_deref())
                )),
            }
        }
    }
    diffs
}

/// One option set: Debezium and outboxd on `connector`, the rows inserted, both topics compared.
fn run(pg: &PgCluster, broker: &Broker, name: &str, envelope: bool, extra: Value) -> Vec<String> {
    let (dbz_prefix, obx_prefix) = (format!("dbz_{name}"), format!("obx_{name}"));
    for p in [&dbz_prefix, &obx_prefix] {
        broker.create_topic(&format!("{p}.types"), PARTITIONS);
    }
    let dbz = Debezium::start(&connector(pg, &dbz_prefix, envelope, &extra), &broker.bootstrap());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("connector.json");
    std::fs::write(&file, connector(pg, &obx_prefix, envelope, &extra).to_string()).unwrap();
    let mut d = Outboxd::spawn_streaming(&args(&[
        "run",
        "--debezium-config",
        &file.display().to_string(),
        "--kafka-brokers",
        &broker.bootstrap(),
        "--metrics-addr",
        "127.0.0.1:0",
    ]));
    let ids = insert_rows(pg);
    let theirs = consume(broker, &format!("{dbz_prefix}.types"), ids.len());
    assert_eq!(dbz.task_states(), ["RUNNING"], "{}", dbz.task_trace());
    let mine = consume(broker, &format!("{obx_prefix}.types"), ids.len());
    d.stop_cleanly();
    drop(dbz);
    // The rows of this run are consumed; later runs insert their own (the slots start at creation).
    if std::env::var_os("OUTBOXD_TYPES_SHOW").is_some() {
        for (row, id) in ids.iter().enumerate() {
            let t = &theirs[id];
            for (k, v) in t.headers.iter().filter(|(k, _)| k.starts_with("c_")) {
                eprintln!("[types] {name} | {k} | {} | {}", row_value(k, row), show(Some(v)));
            }
            eprintln!("[types] {name} | value | row {row} | {}", show(t.payload.as_deref()));
        }
    }
    let diffs = compare(name, &ids, &theirs, &mine);
    for d in &diffs {
        eprintln!("[diff] {d}");
    }
    diffs
}

/// `outboxd run` on connector `c` refuses the table when its first row arrives: exit 1, one
/// error line naming the column and the option.
fn refused_at_first_row(pg: &PgCluster, broker: &Broker, c: &Value, says: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("refused.json");
    std::fs::write(&file, c.to_string()).unwrap();
    let mut d = Outboxd::spawn_streaming(&args(&[
        "run",
        "--debezium-config",
        &file.display().to_string(),
        "--kafka-brokers",
        &broker.bootstrap(),
        "--metrics-addr",
        "127.0.0.1:0",
    ]));
    insert_rows(pg);
    let status = d.wait_exit(Duration::from_secs(60));
    let log = d.log();
    // A definite set-up error (exit 1), as every refusal of a table's columns is.
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{log}");
    assert!(says.iter().all(|s| log.contains(s)), "{says:?}: {log}");
}

/// Every column type in every placement (header, envelope under JsonConverter, partition) under
/// Debezium's default mapping and under each option set outboxd writes: the same bytes. The
/// option values outboxd does not write are refused when the table is first seen.
#[test]
fn every_type_placed_as_debezium_places_it() {
    let pg = PgCluster::start();
    create_table(&pg);
    let broker = Broker::start();
    let mut diffs = run(&pg, &broker, "default", false, json!({}));
    diffs.extend(run(&pg, &broker, "json", true, json!({})));
    let options = json!({
        "time.precision.mode": "adaptive_time_microseconds",
        "decimal.handling.mode": "string",
        "binary.handling.mode": "hex",
    });
    diffs.extend(run(&pg, &broker, "options", false, options));
    let options = json!({ "decimal.handling.mode": "double", "binary.handling.mode": "base64-url-safe" });
    diffs.extend(run(&pg, &broker, "options_json", true, options));
    for (extra, says) in [
        (json!({ "time.precision.mode": "connect" }), ["\"c_date\"", "time.precision.mode"]),
        (json!({ "interval.handling.mode": "string" }), ["\"c_interval\"", "interval.handling.mode"]),
    ] {
        refused_at_first_row(&pg, &broker, &connector(&pg, "obx_refused", false, &extra), &says);
    }
    assert!(
        diffs.is_empty(),
        "{} differences (run | where | row value | debezium | outboxd):\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}
