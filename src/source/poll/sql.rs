//! Every statement `outboxd poll` runs, built once from the configured table and column names
//! (quoted, so any name works), and the start-up check that the table has those columns.
//!
//! Rows are read with each column cast to `text`: the same text form the pgoutput decoder hands
//! the router in `run`, so one [`Route`] serves both modes; the table is described to it as a
//! [`Table`], read from the catalog once. The session pins the settings that
//! text depends on (`DateStyle`, `TimeZone`, `bytea_output`, `extra_float_digits`).

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use crate::config::{Config, TableName};
use crate::error::{Definite, Error};
use crate::pg::admin::timed;
use crate::pg::sqlstate::query_error as db;
use crate::router::{Column, Route, Row, Table, Value};

/// Rows `--retention` deletes per statement: short transactions, little lock time.
pub const RETENTION_CHUNK: i64 = 1000;

pub use crate::pg::ident::{quote_ident, quote_table};

/// The prepared statements of one poller connection.
pub struct Queries {
    /// $1 int8 limit → aggregate keys (text, NULL for rows without a key) now locked by us.
    pub lock: Statement,
    /// $1 text[] keys, $2 bool (the NULL key too), $3 int8 limit → rows: seq, attempts, columns.
    pub claim: Statement,
    /// $1 int8[] seqs: acked rows.
    pub published: Statement,
    /// $1 int8[] seqs, $2 text[] errors, $3 int8[] backoff ms: a failed try each.
    pub failed: Statement,
    /// $1 int8[] seqs, $2 text[] errors, $3 int4[] failed tries to add: rows done with an error
    /// (dead-lettered or skipped).
    pub finished: Statement,
    /// → (void, the backend pid): every lock of this session released, and which session it was.
    pub unlock: Statement,
    /// → unpublished rows, age in seconds of the oldest (NULL without a timestamp column).
    pub stats: Statement,
    /// $1 int8 ms → rows deleted (at most [`RETENTION_CHUNK`]).
    pub retention: Statement,
    /// The table as the router reads it, for [`Route::compile`].
    pub relation: Table,
    pub route: Route,
}

impl Queries {
    /// Check the table and prepare every statement on `client`.
    pub async fn prepare(client: &Client, cfg: &Config, table: &TableName) -> Result<Queries, Error> {
        timed(
            "pinning the session's text formats",
            client.batch_execute(
                "SET DateStyle = ISO; SET TimeZone = 'UTC'; SET bytea_output = hex; SET extra_float_digits = 3; \
                 SET statement_timeout = 0",
            ),
        )
        .await?;
        let t = quote_table(table);
        let rows = timed(
            "reading the outbox table's columns",
            client.query(
                "SELECT c.oid, a.attname::text, a.atttypid, a.atttypmod FROM pg_catalog.pg_class c \
                 LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                 WHERE c.oid = to_regclass($1) ORDER BY a.attnum",
                &[&t],
            ),
        )
        .await?;
        let Some(first) = rows.first() else {
            return Err(Definite::Setup(format!(
                "table {table} does not exist (or this role cannot see it); create it with sql/01_outbox.sql or fix --table"
            ))
            .into());
        };
        let oid: u32 = first.get(0);
        let columns: Vec<Column> = rows
            .iter()
            .filter_map(|r| {
                let name: Option<String> = r.get(1);
                Some(Column {
                    name: name?,
                    type_oid: r.get(2),
                    type_modifier: r.get::<_, Option<i32>>(3).unwrap_or(-1),
                })
            })
            .collect();
        let relation = Table { schema: table.schema.clone(), name: table.name.clone(), columns };
        let route = Route::compile(&cfg.route, &relation)?;
        let c = &cfg.poll.columns;
        for (col, flag) in [
            (&c.seq, "--poll-field-seq"),
            (&c.published_at, "--poll-field-published-at"),
            (&c.attempts, "--poll-field-attempts"),
            (&c.error, "--poll-field-error"),
            (&c.next_attempt_at, "--poll-field-next-attempt-at"),
        ] {
            if !relation.columns.iter().any(|x| &x.name == col) {
                return Err(Definite::Setup(format!(
                    "table {table} has no column {col:?} (set by {flag}) that outboxd poll needs; apply sql/05_poll.sql (it adds seq and next_attempt_at) or point the flag at the column"
                ))
                .into());
            }
        }
        let ts = cfg.route.timestamp_field.as_deref().filter(|f| relation.columns.iter().any(|x| &x.name == f));
        let text = Texts::new(cfg, &t, oid, &relation, ts);
        let prep = |sql: String, what: &'static str| async move {
            client.prepare(&sql).await.map_err(|e| db(&format!("preparing the {what} statement ({sql})"), e))
        };
        Ok(Queries {
            lock: prep(text.lock, "lock").await?,
            claim: prep(text.claim, "claim").await?,
            published: prep(text.published, "mark-published").await?,
            failed: prep(text.failed, "failed-try").await?,
            finished: prep(text.finished, "finished").await?,
            unlock: prep("SELECT pg_advisory_unlock_all(), pg_backend_pid()".into(), "unlock").await?,
            stats: prep(text.stats, "backlog").await?,
            retention: prep(text.retention, "retention").await?,
            relation,
            route,
        })
    }
}

/// The statements' text (separate from preparing them, so they can be read and tested).
struct Texts {
    lock: String,
    claim: String,
    published: String,
    failed: String,
    finished: String,
    stats: String,
    retention: String,
}

impl Texts {
    fn new(cfg: &Config, t: &str, oid: u32, rel: &Table, ts: Option<&str>) -> Texts {
        let c = &cfg.poll.columns;
        let q = quote_ident;
        let (seq, publ, tries, err, next) =
            (q(&c.seq), q(&c.published_at), q(&c.attempts), q(&c.error), q(&c.next_attempt_at));
        let key = q(&cfg.route.key_field);
        // Lock space: the table's oid, so pollers of different tables never contend.
        let space = oid as i32;
        let lock_key = format!("hashtext(coalesce(o.{key}::text, ''))");
        let blocked = |o: &str, extra: &str| {
            format!(
                "EXISTS (SELECT 1 FROM {t} h WHERE (h.{key} = {o}.{key} OR (h.{key} IS NULL AND {o}.{key} IS NULL)) \
                 AND h.{publ} IS NULL AND h.{next} > now(){extra})"
            )
        };
        let lock = format!(
            "SELECT DISTINCT k FROM (SELECT o.{key}::text AS k FROM {t} o \
             WHERE o.{publ} IS NULL AND NOT {} AND pg_try_advisory_lock({space}, {lock_key}) \
             ORDER BY o.{seq} LIMIT $1) s",
            blocked("o", "")
        );
        let cols: Vec<String> = rel.columns.iter().map(|col| format!("o.{}::text", q(&col.name))).collect();
        let claim = format!(
            "SELECT o.{seq}::int8, o.{tries}::int4, {} FROM {t} o \
             WHERE o.{publ} IS NULL AND (o.{key}::text = ANY($1::text[]) OR ($2::bool AND o.{key} IS NULL)) \
             AND NOT {} ORDER BY o.{seq} LIMIT $3",
            cols.join(", "),
            blocked("o", &format!(" AND h.{seq} <= o.{seq}"))
        );
        let (published, finished) = if cfg.poll.delete {
            (
                format!("DELETE FROM {t} WHERE {seq} = ANY($1::int8[])"),
                format!(
                    "DELETE FROM {t} WHERE {seq} IN (SELECT s FROM unnest($1::int8[], $2::text[], $3::int4[]) AS f(s, e, n))"
                ),
            )
        } else {
            (
                format!("UPDATE {t} SET {publ} = now(), {next} = NULL WHERE {seq} = ANY($1::int8[])"),
                format!(
                    "UPDATE {t} o SET {publ} = now(), {next} = NULL, {tries} = o.{tries} + f.n, {err} = f.e \
                     FROM unnest($1::int8[], $2::text[], $3::int4[]) AS f(s, e, n) WHERE o.{seq} = f.s"
                ),
            )
        };
        let failed = format!(
            "UPDATE {t} o SET {tries} = o.{tries} + 1, {err} = f.e, {next} = now() + f.ms * interval '1 millisecond' \
             FROM unnest($1::int8[], $2::text[], $3::int8[]) AS f(s, e, ms) WHERE o.{seq} = f.s"
        );
        let age = match ts {
            Some(ts) => format!("extract(epoch FROM now() - min({}))::float8", q(ts)),
            None => "NULL::float8".into(),
        };
        let stats = format!("SELECT count(*)::int8, {age} FROM {t} WHERE {publ} IS NULL");
        let retention = format!(
            "DELETE FROM {t} WHERE {seq} IN (SELECT {seq} FROM {t} WHERE {publ} IS NOT NULL \
             AND {publ} < now() - $1::int8 * interval '1 millisecond' ORDER BY {publ} LIMIT {RETENTION_CHUNK})"
        );
        Texts { lock, claim, published, failed, finished, stats, retention }
    }
}

/// One claimed row.
pub struct Claimed {
    pub seq: i64,
    /// Failed tries before this one.
    pub attempts: i32,
    pub tuple: Row,
}

impl Claimed {
    /// A row of the claim statement: seq, attempts, then every column as text.
    pub fn from_row(row: &tokio_postgres::Row) -> Result<Claimed, Error> {
        let bad = |e: tokio_postgres::Error| Definite::Setup(format!("reading a claimed outbox row: {e}"));
        let seq: i64 = row.try_get(0).map_err(bad)?;
        let attempts: i32 = row.try_get(1).map_err(bad)?;
        let mut values = Vec::with_capacity(row.len().saturating_sub(2));
        for i in 2..row.len() {
            let v: Option<&str> = row.try_get(i).map_err(bad)?;
            values.push(match v {
                Some(s) => Value::Text(bytes::Bytes::copy_from_slice(s.as_bytes())),
                None => Value::Null,
            });
        }
        Ok(Claimed { seq, attempts, tuple: Row::from(values) })
    }
}

/// Run `stmt` with `params`, as one bounded step named `what`.
pub async fn execute(
    client: &Client,
    what: &str,
    stmt: &Statement,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, Error> {
    timed(what, client.execute(stmt, params)).await
}
