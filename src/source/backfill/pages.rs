//! Reading an outbox table in pages for `outboxd backfill`.
//!
//! Keyset pagination: each page is one short statement that picks `WHERE <range> AND (key) > (last
//! key) ORDER BY key LIMIT n` on the key columns and then reads those rows by tuple id, so memory
//! holds one page, no transaction or snapshot stays open between
//! pages (no xmin pinned, no bloat), and rows inserted meanwhile do not shift the pages. The key
//! follows insertion order, so a transaction's rows (which share `created_at`) go out in the order
//! they were written: `(created_at, seq, event_id)` where the table has the `--poll-field-seq`
//! column (`sql/05_poll.sql`), else `(created_at, tableoid, ctid, event_id)`, the physical order
//! (insertion order within a page; a table reusing freed space may differ across pages, so give
//! it the `seq` column); without a time range the key starts after `created_at`; the last key goes back to the
//! server as its own text, cast to the column's type, so the comparison is the server's. An index
//! on the key columns (`(created_at, seq, event_id)`) turns each page's choice into an index range
//! scan; without one, each page sorts the range's keys (not its payloads).
//!
//! Every column is read as text, as pgoutput sends it (the session is pinned to the walsender's
//! `DateStyle=ISO, TimeZone=UTC`), and described to the router as a [`Table`], so the rows go
//! through it exactly as streamed rows do.

use bytes::Bytes;
use tokio_postgres::Client;

use super::range::Range;
use crate::config::{Config, TableName};
use crate::error::{Definite, Error};
use crate::pg::ident::quote_ident;
use crate::pg::sqlstate::query_error as db;
use crate::router::render::{INT4, INT8, TIMESTAMP, TIMESTAMPTZ};
use crate::router::{Column, Row, Table, Value};

/// One outbox table, described once, with its page query.
pub struct Pages {
    pub relation: Table,
    /// The first page's query, and the next pages' (after the last key read).
    first_sql: String,
    next_sql: String,
    page_size: usize,
    /// Positions of the key values in a fetched row (past the relation's columns for `tableoid`
    /// and `ctid`); see the module doc for the key.
    keys: Vec<usize>,
    /// The relation's column count: a fetched row's extra key values are cut off at it.
    width: usize,
    /// Values of the fixed range parameters ($1..), as text.
    params: Vec<String>,
    /// The last key read, as text; `None` before the first page.
    last: Option<Vec<String>>,
    done: bool,
}

/// Pin the session to the text forms pgoutput uses.
pub async fn prepare_session(client: &Client) -> Result<(), Error> {
    client
        .batch_execute(
            "SET DateStyle = ISO; SET TimeZone = 'UTC'; SET IntervalStyle = postgres; SET bytea_output = hex",
        )
        .await
        .map_err(|e| db("setting the session's DateStyle and TimeZone", e))
}

impl Pages {
    pub async fn describe(client: &Client, cfg: &Config, table: &TableName, range: &Range) -> Result<Pages, Error> {
        let rows = client
            .query(
                "SELECT a.attname::text, a.atttypid::oid::int8, a.atttypmod, format_type(a.atttypid, NULL) \
                 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                &[&table.schema, &table.name],
            )
            .await
            .map_err(|e| db(&format!("reading the columns of {table}"), e))?;
        if rows.is_empty() {
            return Err(
                Definite::Setup(format!("table {table} does not exist (or has no columns): check --table")).into()
            );
        }
        let mut columns = Vec::with_capacity(rows.len());
        let mut type_names = Vec::with_capacity(rows.len());
        for r in &rows {
            let oid: i64 = r.get(1);
            columns.push(Column { name: r.get(0), type_oid: u32::try_from(oid).unwrap_or(0), type_modifier: r.get(2) });
            type_names.push(r.get::<_, String>(3));
        }
        let find = |col: &str, flag: &str| {
            columns.iter().position(|c| c.name == col).ok_or_else(|| {
                Error::from(Definite::Setup(format!("table {table} has no column {col:?} (set by {flag})")))
            })
        };
        let id = find(&cfg.route.id_field, "--table-field-event-id")?;
        let ts = match (&cfg.route.timestamp_field, range.by_time()) {
            (Some(c), true) => Some(find(c, "--table-field-event-timestamp")?),
            (None, true) => {
                return Err(Definite::Config(
                    "--since/--until read the created_at column, but --table-field-event-timestamp is empty; name the column or use --from-event-id/--to-event-id".into(),
                )
                .into())
            }
            (_, false) => None,
        };
        let col = |i: usize| quote_ident(&columns[i].name);
        let cast = |i: usize, n: usize| format!("${n}::text::{}", type_names[i]);
        let mut conds: Vec<String> = Vec::new();
        let mut params: Vec<String> = Vec::new();
        if let Some(t) = ts {
            let ty = columns[t].type_oid;
            // The bound as the column's type: an instant for timestamptz, UTC wall time for
            // timestamp, epoch milliseconds for an integer column.
            let bound = |v: jiff::Timestamp| {
                match ty {
                INT8 | INT4 => Ok(v.as_millisecond().to_string()),
                TIMESTAMPTZ => Ok(v.to_string()),
                TIMESTAMP => Ok(jiff::tz::Offset::UTC.to_datetime(v).to_string()),
                _ => Err(Definite::Config(format!(
                    "--since/--until: column {:?} of {table} is {}, not a timestamp or epoch milliseconds; use --from-event-id/--to-event-id",
                    columns[t].name, type_names[t]
                ))),
            }
            };
            if let Some(s) = range.since {
                params.push(bound(s)?);
                conds.push(format!("{} >= {}", col(t), cast(t, params.len())));
            }
            if let Some(u) = range.until {
                params.push(bound(u)?);
                conds.push(format!("{} < {}", col(t), cast(t, params.len())));
            }
        }
        if let Some(f) = &range.from_id {
            params.push(f.clone());
            conds.push(format!("{} >= {}", col(id), cast(id, params.len())));
        }
        if let Some(t) = &range.to_id {
            params.push(t.clone());
            conds.push(format!("{} <= {}", col(id), cast(id, params.len())));
        }
        // The key orders rows as they were inserted: the time, then the insertion sequence (the
        // `--poll-field-seq` column, where the table has it) or else the row's physical place
        // (`tableoid`, `ctid`), then the id. Ties on created_at are the rule within a transaction
        // (now() is its start), and a random event id would put a create after its payment.
        let seq = columns.iter().position(|c| c.name == cfg.poll.columns.seq);
        // (SQL expression, its type, its position in a fetched row)
        let mut key_exprs: Vec<(String, String, usize)> = Vec::new();
        key_exprs.extend(ts.map(|t| (col(t), type_names[t].clone(), t)));
        match seq {
            Some(s) => key_exprs.push((col(s), type_names[s].clone(), s)),
            None => {
                key_exprs.push(("tableoid".into(), "oid".into(), columns.len()));
                key_exprs.push(("ctid".into(), "tid".into(), columns.len() + 1));
            }
        }
        key_exprs.push((col(id), type_names[id].clone(), id));
        let keys: Vec<usize> = key_exprs.iter().map(|k| k.2).collect();
        // A row without a key cannot be paged past (and a NULL id is a bad event anyway).
        conds.extend(key_exprs.iter().map(|k| format!("{} IS NOT NULL", k.0)));
        let mut select: Vec<String> = (0..columns.len()).map(|i| format!("{}::text", col(i))).collect();
        if seq.is_none() {
            select.extend(["tableoid::text".to_owned(), "ctid::text".to_owned()]);
        }
        let key_cols: Vec<String> = key_exprs.iter().map(|k| k.0.clone()).collect();
        let n = params.len();
        let key_params: Vec<String> =
            key_exprs.iter().enumerate().map(|(j, k)| format!("${}::text::{}", n + 1 + j, k.1)).collect();
        let query = |extra: Option<String>| {
            let mut all = conds.clone();
            all.extend(extra);
            let from = format!("{}.{}", quote_ident(&table.schema), quote_ident(&table.name));
            let order = key_cols.join(", ");
            // Qualified: unqualified, ORDER BY would take the select list's `x::text AS x` and
            // sort text ("(0,10)" before "(0,9)", "10" before "9").
            let outer_order = key_cols.iter().map(|k| format!("o.{k}")).collect::<Vec<_>>().join(", ");
            // The page is chosen on the key columns alone, then its rows are fetched by tuple id:
            // sorting rows with every column cast to text would read (and detoast) the whole
            // range for every page.
            format!(
                "WITH page AS MATERIALIZED (SELECT tableoid AS outboxd_rel, ctid AS outboxd_row FROM {from} \
                 WHERE {} ORDER BY {order} LIMIT {}) \
                 SELECT {} FROM {from} o WHERE o.ctid = ANY (ARRAY(SELECT outboxd_row FROM page)) \
                 AND (o.tableoid, o.ctid) IN (SELECT outboxd_rel, outboxd_row FROM page) ORDER BY {outer_order}",
                all.join(" AND "),
                range.batch_size,
                select.join(", "),
            )
        };
        let first_sql = query(None);
        let next_sql = query(Some(format!("({}) > ({})", key_cols.join(", "), key_params.join(", "))));
        let relation = Table { schema: table.schema.clone(), name: table.name.clone(), columns };
        let width = relation.columns.len();
        Ok(Pages {
            relation,
            first_sql,
            next_sql,
            keys,
            width,
            params,
            last: None,
            done: false,
            page_size: range.batch_size,
        })
    }

    /// The next page of rows (empty when the range is exhausted).
    pub async fn next(&mut self, client: &Client) -> Result<Vec<Row>, Error> {
        if self.done {
            return Ok(Vec::new());
        }
        let mut values: Vec<&str> = self.params.iter().map(String::as_str).collect();
        let sql = match &self.last {
            Some(last) => {
                values.extend(last.iter().map(String::as_str));
                &self.next_sql
            }
            None => &self.first_sql,
        };
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            values.iter().map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
        let rows = client.query(sql, &refs).await.map_err(|e| db("reading a page of the outbox", e))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let tuple: Vec<Value> = (0..r.len())
                .map(|i| match r.get::<_, Option<&str>>(i) {
                    Some(s) => Value::Text(Bytes::copy_from_slice(s.as_bytes())),
                    None => Value::Null,
                })
                .collect();
            out.push(tuple);
        }
        match out.last() {
            Some(last) => {
                let key = self
                    .keys
                    .iter()
                    .map(|&k| match last.get(k) {
                        Some(Value::Text(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
                        _ => Err(Definite::Setup(format!(
                            "a row of {}.{} has a NULL key column {:?}; backfill pages by it",
                            self.relation.schema,
                            self.relation.name,
                            self.relation.columns.get(k).map_or("ctid", |c| c.name.as_str())
                        ))),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.last = Some(key);
            }
            None => self.done = true,
        }
        // The rows go on as the relation describes them: without the extra key values.
        for row in &mut out {
            row.truncate(self.width);
        }
        let out: Vec<Row> = out.into_iter().map(Row::from).collect();
        if out.len() < self.page_size {
            self.done = true;
        }
        Ok(out)
    }
}
