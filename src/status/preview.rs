//! The routing preview: which topics the newest rows of each outbox table route to, through the
//! same topic rule `run` applies (`outboxd check` shows the same), so a wrong `--route-by-field`
//! or topic template shows on the page before an event is sent.
//!
//! Invariants: read-only; at most one query per table, each bounded by the admin timeout and
//! reading at most [`SAMPLE_ROWS`] rows; run only when a page asks and the last preview is older
//! than [`PREVIEW_TTL`], in a task of its own (never inside a request, never in the event path).
//! The newest rows are those with the latest `--table-field-event-timestamp` value when an index
//! leads with that column; otherwise any [`SAMPLE_ROWS`] rows (an outbox whose rows are deleted
//! after insert is usually near empty anyway). Values are read cut to [`MAX_VALUE`] bytes.

use std::time::Duration;

use serde::Serialize;

use tokio_postgres::Client;

use crate::config::{Config, TableName};
use crate::error::Error;
use crate::pg::admin;
use crate::pg::ident::{quote_ident, quote_table};

/// Rows read per table.
pub const SAMPLE_ROWS: i64 = 200;
/// Distinct routed values shown per table.
pub const SHOWN_ROUTES: i64 = 20;
/// Longest routed value read (bytes); longer ones are shown cut and not routed here.
pub const MAX_VALUE: usize = 1000;
/// A preview is refreshed when a page asks and it is older than this.
pub const PREVIEW_TTL: Duration = Duration::from_secs(30);

/// The preview of every `--table`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Preview {
    /// RFC 3339, UTC: when the rows were read.
    pub checked_at: String,
    pub tables: Vec<TablePreview>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TablePreview {
    pub table: String,
    pub routes: Vec<RoutePreview>,
    /// Why the table could not be read, if it could not.
    pub error: Option<String>,
}

/// One routed value among the sampled rows.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RoutePreview {
    /// The `--route-by-field` value; `null` for rows without one.
    pub value: Option<String>,
    /// The topic the value routes to (`null` for a null value: such rows are bad events).
    pub topic: Option<String>,
    /// Sampled rows with this value.
    pub rows: i64,
    /// Why rows with this value would be bad events (`null_route`, `invalid_topic`), if so.
    pub problem: Option<String>,
}

/// Read the preview (one connection, closed at the end).
pub async fn read(cfg: &Config) -> Preview {
    let checked_at = super::board::now_text();
    let client = match admin::connect(cfg).await {
        Ok(c) => c,
        Err(e) => {
            let tables = cfg
                .tables
                .iter()
                .map(|t| TablePreview { table: t.to_string(), routes: Vec::new(), error: Some(e.to_string()) })
                .collect();
            return Preview { checked_at, tables };
        }
    };
    let mut tables = Vec::new();
    for t in &cfg.tables {
        let preview = match routes(&client, cfg, t).await {
            Ok(routes) => TablePreview { table: t.to_string(), routes, error: None },
            Err(e) => TablePreview { table: t.to_string(), routes: Vec::new(), error: Some(e.to_string()) },
        };
        tables.push(preview);
    }
    Preview { checked_at, tables }
}

/// The routed values of `t`'s newest [`SAMPLE_ROWS`] rows, most frequent first, with their topics.
/// "Newest" only when an index leads with `--table-field-event-timestamp` (a partial one does not
/// count): ordering a large table without one would read it all on every refresh; without it,
/// any [`SAMPLE_ROWS`] rows are read (the scan stops there).
pub async fn routes(client: &Client, cfg: &Config, t: &TableName) -> Result<Vec<RoutePreview>, Error> {
    let route = quote_ident(&cfg.route.route_by_field);
    let mut order = String::new();
    if let Some(ts) = &cfg.route.timestamp_field {
        let indexed = admin::timed(
            "looking for an index on the timestamp column",
            client.query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a \
                 ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
                 WHERE i.indrelid = $1::text::regclass AND a.attname = $2 AND i.indpred IS NULL)",
                &[&quote_table(t), ts],
            ),
        )
        .await?;
        if indexed.get::<_, bool>(0) {
            order = format!(" ORDER BY {} DESC", quote_ident(ts));
        }
    }
    // Values are cut to MAX_VALUE in the query, so a huge one never reaches this process whole.
    let sql = format!(
        "SELECT left(v, {MAX_VALUE}), count(*)::int8, bool_or(length(v) > {MAX_VALUE}) \
         FROM (SELECT {route}::text AS v FROM {}{order} LIMIT {SAMPLE_ROWS}) s \
         GROUP BY v ORDER BY count(*) DESC, v NULLS FIRST LIMIT {SHOWN_ROUTES}",
        quote_table(t)
    );
    let rows = admin::timed("reading the routed values", client.query(&sql, &[])).await?;
    Ok(rows.iter().map(|r| route_of(cfg, r.get(0), r.get(1), r.get::<_, Option<bool>>(2).unwrap_or(false))).collect())
}

fn route_of(cfg: &Config, value: Option<String>, rows: i64, too_long: bool) -> RoutePreview {
    let Some(value) = value else {
        return RoutePreview { value: None, topic: None, rows, problem: Some("null_route".into()) };
    };
    if too_long {
        let value = Some(super::board::cut(&value, super::board::MAX_TEXT));
        return RoutePreview { value, topic: None, rows, problem: Some("too_long_to_preview".into()) };
    }
    let topic = cfg.route.topic.topic(&value);
    let problem = crate::router::check_topic(&topic).err().map(|_| "invalid_topic".to_owned());
    let cut = |s: &str| super::board::cut(s, super::board::MAX_TEXT);
    RoutePreview { value: Some(cut(&value)), topic: Some(cut(&topic)), rows, problem }
}
