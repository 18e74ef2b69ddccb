//! The inbox's statements on the consumer's PostgreSQL: the schema (sql/08_inbox.sql, named after
//! `--inbox-table`), the offsets a partition starts from, and a batch written as **one statement**:
//! the rows (`ON CONFLICT (event_id) DO NOTHING`) and each partition's next offset, in data-modifying
//! CTEs of one autocommit statement, so they commit together in one transaction and one round trip.
//!
//! Invariant: a partition's stored offset only grows (`GREATEST`), so a writer that lost its
//! partition in a rebalance and commits late cannot move the new owner back; and a record is
//! never in the table twice, whoever writes it, because `event_id` is unique.

use std::collections::HashMap;

use tokio_postgres::{Client, Statement};

use super::record::Row;
use crate::error::Error;
use crate::pg::sqlstate::{is_row_fault, query_error};

/// The schema file, applied with its names replaced by the configured table's ([`schema_sql`]).
const SCHEMA_SQL: &str = include_str!("../../../sql/08_inbox.sql");

/// Names derived from `--inbox-table` (plain identifiers: validated by the config).
#[derive(Debug, Clone)]
pub struct Names {
    pub schema: String,
    pub table: String,
}

impl Names {
    /// `schema.table`.
    pub fn inbox(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }

    /// `schema.table_offsets`.
    pub fn offsets(&self) -> String {
        format!("{}.{}_offsets", self.schema, self.table)
    }
}

/// sql/08_inbox.sql for `names`: `public.inbox` becomes `schema.table`, and each `inbox_` name
/// (indexes, the offsets table, the functions) `table_`. One pass, so a replaced name is never
/// replaced again.
pub fn schema_sql(names: &Names) -> String {
    let re = regex::Regex::new(r"public\.inbox|\binbox_").expect("a fixed regex");
    re.replace_all(
        SCHEMA_SQL,
        |c: &regex::Captures<'_>| {
            if &c[0] == "inbox_" {
                format!("{}_", names.table)
            } else {
                names.inbox()
            }
        },
    )
    .into_owned()
}

/// Apply the schema unless the tables and the claim function are there already (so a role that
/// may write the table but not replace its functions starts too). Two processes starting at once
/// take turns on an advisory lock.
pub async fn ensure_schema(client: &Client, names: &Names) -> Result<(), Error> {
    let what = |w: &str| format!("{w} for --inbox-table {}", names.inbox());
    let row = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
                    AND to_regprocedure($3) IS NOT NULL AND to_regprocedure($4) IS NOT NULL",
            &[
                &names.inbox(),
                &names.offsets(),
                &format!("{}_claim(integer)", names.inbox()),
                &format!("{}_prune(interval,interval,integer)", names.inbox()),
            ],
        )
        .await
        .map_err(|e| query_error(&what("looking up the inbox table"), e))?;
    if row.get::<_, bool>(0) {
        return Ok(());
    }
    let sql =
        format!("BEGIN; SELECT pg_advisory_xact_lock(hashtext('outboxd.inbox.schema')); {} COMMIT;", schema_sql(names));
    client
        .batch_execute(&sql)
        .await
        .map_err(|e| query_error(&what("creating the inbox schema (sql/08_inbox.sql)"), e))?;
    tracing::info!(table = %names.inbox(), "created the inbox table, its offsets table and claim functions (sql/08_inbox.sql)");
    Ok(())
}

/// The stored next offsets of `group` for these partitions; a partition without a row is absent.
pub async fn load_offsets(
    client: &Client,
    names: &Names,
    group: &str,
    partitions: &[(String, i32)],
) -> Result<Stored, Error> {
    let topics: Vec<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
    let parts: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
    // The last row, with no topic, says whether the group has stored any partition at all.
    let sql = format!(
        "SELECT o.topic, o.kafka_partition, o.next_offset FROM {o} o \
           JOIN unnest($2::text[], $3::int4[]) AS a(topic, kafka_partition) USING (topic, kafka_partition) \
          WHERE o.group_id = $1 \
         UNION ALL SELECT NULL, NULL, NULL WHERE EXISTS (SELECT 1 FROM {o} WHERE group_id = $1)",
        o = names.offsets()
    );
    let rows = client
        .query(&sql, &[&group, &topics, &parts])
        .await
        .map_err(|e| query_error(&format!("reading the stored offsets in {}", names.offsets()), e))?;
    let mut out = Stored::default();
    for r in rows {
        match (r.get::<_, Option<String>>(0), r.get::<_, Option<i32>>(1), r.get::<_, Option<i64>>(2)) {
            (Some(topic), Some(p), Some(n)) => {
                out.offsets.insert((topic, p), n);
            }
            _ => out.group_known = true,
        }
    }
    Ok(out)
}

/// What [`load_offsets`] read.
#[derive(Debug, Default)]
pub struct Stored {
    /// The next offset stored per partition asked for.
    pub offsets: HashMap<(String, i32), i64>,
    /// Whether the group has stored an offset for any partition at all: once it has, the inbox
    /// has taken over from whatever consumer used the group before, and the group's offsets in
    /// Kafka (its own copy, by then) are never a partition's start again.
    pub group_known: bool,
}

/// Rows `inbox_prune` deletes in one round.
pub const PRUNE_ROUND: i32 = 10_000;

/// One round of retention (sql/08_inbox.sql's `inbox_prune`): how many rows went.
pub async fn prune(
    client: &Client,
    names: &Names,
    retain: std::time::Duration,
    dedupe_window: std::time::Duration,
) -> Result<i32, Error> {
    let sql = format!("SELECT {}_prune(make_interval(secs => $1), make_interval(secs => $2), $3)", names.inbox());
    let row = client
        .query_one(&sql, &[&retain.as_secs_f64(), &dedupe_window.as_secs_f64(), &PRUNE_ROUND])
        .await
        .map_err(|e| query_error(&format!("pruning processed rows of {} (--retain)", names.inbox()), e))?;
    Ok(row.get(0))
}

/// What one batch statement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Rows inserted; the others were in the table already (duplicates).
    pub inserted: i64,
}

/// The batch statement's text for `names` (prepared once per connection: [`prepare_batch`]).
pub fn batch_sql(names: &Names) -> String {
    format!(
        "WITH input AS ( \
           SELECT * FROM unnest($2::text[], $3::text[], $4::int4[], $5::int8[], $6::text[], $7::bytea[], \
                                $8::text[], $9::bytea[], $10::text[], $11::text[], $12::int8[]) WITH ORDINALITY \
             AS t(event_id, topic, kafka_partition, kafka_offset, aggregate_key, key, event_type, payload, \
                  payload_json, headers, ts_ms, ord) \
         ), stored AS ( \
           INSERT INTO {inbox} (event_id, topic, kafka_partition, kafka_offset, aggregate_key, key, event_type, \
                                payload, payload_json, headers, kafka_timestamp) \
           SELECT event_id, topic, kafka_partition, kafka_offset, aggregate_key, key, event_type, payload, \
                  payload_json::jsonb, headers::jsonb, to_timestamp(ts_ms / 1000.0) \
             FROM input ORDER BY ord \
           ON CONFLICT (event_id) DO NOTHING \
           RETURNING 1 \
         ), moved AS ( \
           INSERT INTO {offsets} AS o (group_id, topic, kafka_partition, next_offset) \
           SELECT $1, * FROM unnest($13::text[], $14::int4[], $15::int8[]) \
           ON CONFLICT (group_id, topic, kafka_partition) DO UPDATE \
             SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset), updated_at = now() \
           RETURNING 1 \
         ) \
         SELECT (SELECT count(*) FROM stored), (SELECT count(*) FROM moved)",
        inbox = names.inbox(),
        offsets = names.offsets()
    )
}

/// Why a batch statement failed.
#[derive(Debug)]
pub enum WriteError {
    /// PostgreSQL refused the data itself: SQLSTATE class 22 (data exception) or 23 (integrity
    /// constraint violation, e.g. a CHECK the consumer added). Some row of the batch is bad;
    /// written alone, such a row is dead-lettered.
    Row(String),
    /// Anything else: transient (retried while PostgreSQL is away) or a setup fault that no row
    /// causes (42501 no privilege, 42P01 no table, 42703 no column, P0001 a trigger's exception,
    /// ...), which stops the inbox with nothing dead-lettered and no offset moved.
    Other(Error),
}

impl WriteError {
    pub fn into_error(self) -> Error {
        match self {
            WriteError::Row(m) => crate::error::Definite::Setup(m).into(),
            WriteError::Other(e) => e,
        }
    }
}

/// Whether a failed batch is a bad row ([`is_row_fault`], by SQLSTATE) or stops the inbox.
fn write_error(grants: &str, e: tokio_postgres::Error) -> WriteError {
    let code = e.code().map(|c| c.code().to_owned());
    match code.as_deref() {
        Some(c) if is_row_fault(c) => {
            let msg = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_else(|| e.to_string());
            WriteError::Row(format!("{msg} (SQLSTATE {c})"))
        }
        _ => match query_error("writing a batch into the inbox", e) {
            Error::Definite(d) => WriteError::Other(
                crate::error::Definite::Setup(format!(
                    "{d} (SQLSTATE {}); no record was dead-lettered and no offset moved: fix the inbox table or \
                     the role's grants ({grants}; docs/src/inbox.md lists them) and start again",
                    code.as_deref().unwrap_or("none")
                ))
                .into(),
            ),
            other => WriteError::Other(other),
        },
    }
}

/// The batch statement ([`batch_sql`]) prepared on `client`, once per connection. A table that
/// lacks a column fails here, as the batch would, with the same message.
pub async fn prepare_batch(client: &Client, sql: &str) -> Result<Statement, WriteError> {
    client.prepare(sql).await.map_err(|e| {
        write_error("the role needs SELECT, INSERT on the table and SELECT, INSERT, UPDATE on TABLE_offsets", e)
    })
}

/// Write `rows` and move each partition of `next` to its offset, in one statement (one
/// transaction, one round trip: `statement` is [`prepare_batch`]'s). `next` must hold each
/// partition once.
pub async fn write_batch(
    client: &Client,
    statement: &Statement,
    group: &str,
    rows: &[Row],
    next: &HashMap<(String, i32), i64>,
) -> Result<Written, WriteError> {
    let col = |f: fn(&Row) -> Option<&str>| rows.iter().map(f).collect::<Vec<_>>();
    let ids = col(|r| Some(&r.event_id));
    let topics = col(|r| Some(&r.topic));
    let parts: Vec<i32> = rows.iter().map(|r| r.partition).collect();
    let offs: Vec<i64> = rows.iter().map(|r| r.offset).collect();
    let agg = col(|r| r.aggregate_key.as_deref());
    let keys: Vec<Option<&[u8]>> = rows.iter().map(|r| r.key.as_deref()).collect();
    let types = col(|r| r.event_type.as_deref());
    let payloads: Vec<Option<&[u8]>> = rows.iter().map(|r| r.payload.as_deref()).collect();
    let json = col(|r| r.payload_json.as_deref());
    let headers = col(|r| Some(&r.headers));
    let ts: Vec<Option<i64>> = rows.iter().map(|r| r.timestamp_ms).collect();
    let n_topics: Vec<&str> = next.keys().map(|(t, _)| t.as_str()).collect();
    let n_parts: Vec<i32> = next.keys().map(|(_, p)| *p).collect();
    let n_offs: Vec<i64> = next.values().copied().collect();
    let row = client
        .query_one(
            statement,
            &[
                &group, &ids, &topics, &parts, &offs, &agg, &keys, &types, &payloads, &json, &headers, &ts, &n_topics,
                &n_parts, &n_offs,
            ],
        )
        .await
        .map_err(|e| {
            write_error("the role needs SELECT, INSERT on the table and SELECT, INSERT, UPDATE on TABLE_offsets", e)
        })?;
    Ok(Written { inserted: row.get(0) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_file_is_renamed_whole() {
        let sql = schema_sql(&Names { schema: "billing".into(), table: "in2".into() });
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS billing.in2 ("), "{sql}");
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS billing.in2_offsets ("), "{sql}");
        assert!(sql.contains("FUNCTION billing.in2_claim("), "{sql}");
        assert!(sql.contains("INDEX IF NOT EXISTS in2_unprocessed_idx"), "{sql}");
        assert!(!sql.contains("public.inbox") && !sql.contains("inbox_"), "{sql}");
        let same = schema_sql(&Names { schema: "public".into(), table: "inbox".into() });
        assert_eq!(same, SCHEMA_SQL);
    }
}
