//! `outboxd schema check DIR`: the `--schema-dir` contracts, applied outside the pipeline, for a
//! producer's CI or before turning `--schema-missing reject` on.
//!
//! Events come from a JSON lines file (`--sample`) or from the rows still in the outbox tables
//! (`--from-table`, read with the same column flags `run` uses). Each one is judged exactly as the
//! router judges it ([`SchemaSet::check`]), so a row that passes here passes in `run` with the same
//! schemas. Violations stream to stdout as found, one line each plus one indented line per
//! validation error, then a summary. Exit codes: 0 when every event passes, 1 when one violates
//! (or the table cannot be read), 2 for a bad directory, schema, sample line or flag.

use std::io::{BufRead, Write};
use std::path::Path;

use futures_util::TryStreamExt;

use crate::config::{PgTarget, SchemaCheckArgs, SchemaCommand};
use crate::error::{Definite, Error};
use crate::router::contract::{SchemaMissing, SchemaSet, Verdict};
use crate::router::render;

/// Client-side bound on reading one table: the tool reads it whole, on purpose.
const TABLE_TIMEOUT_MS: u64 = 300_000;

pub async fn run(cmd: SchemaCommand) -> Result<u8, Error> {
    let SchemaCommand::Check(a) = cmd;
    let set = SchemaSet::load(&a.dir).map_err(Definite::Config)?;
    let stdout = std::io::stdout();
    let mut report = Report::new(&set, a.schema_missing, stdout.lock());
    match &a.sample {
        Some(file) => check_sample(file, &mut report)?,
        None => check_tables(&a, &mut report).await?,
    }
    report.finish()
}

/// Counts and the output, one event at a time.
pub struct Report<'a, W: Write> {
    set: &'a SchemaSet,
    missing: SchemaMissing,
    out: W,
    valid: usize,
    violating: usize,
    unchecked: usize,
}

impl<'a, W: Write> Report<'a, W> {
    pub fn new(set: &'a SchemaSet, missing: SchemaMissing, out: W) -> Self {
        Report { set, missing, out, valid: 0, violating: 0, unchecked: 0 }
    }

    /// Judge one event; `place` says where it came from (`FILE:LINE`, `schema.table`).
    pub fn event(
        &mut self,
        place: &str,
        id: Option<&str>,
        event_type: Option<&str>,
        payload: Option<&[u8]>,
    ) -> Result<(), Error> {
        let v = match self.set.check(self.missing, event_type, payload) {
            Verdict::Valid => {
                self.valid += 1;
                return Ok(());
            }
            Verdict::Unchecked => {
                self.unchecked += 1;
                return Ok(());
            }
            Verdict::Violation(v) => v,
        };
        self.violating += 1;
        let id = id.map_or(String::new(), |id| format!(" id={id}"));
        let mut text = format!("{place}{id}: {}\n", v.message);
        for e in &v.errors {
            text.push_str(&format!("    {}: {}\n", e.path, e.message));
        }
        self.out.write_all(text.as_bytes()).map_err(write_err)
    }

    /// Print the summary; the exit code.
    pub fn finish(mut self) -> Result<u8, Error> {
        let total = self.valid + self.violating + self.unchecked;
        let line = format!(
            "{total} events: {} valid, {} violating, {} unchecked (no schema or no payload)\n",
            self.valid, self.violating, self.unchecked
        );
        self.out.write_all(line.as_bytes()).and_then(|()| self.out.flush()).map_err(write_err)?;
        Ok(if self.violating == 0 { 0 } else { 1 })
    }
}

fn write_err(e: std::io::Error) -> Error {
    Definite::Config(format!("writing the report to stdout: {e}")).into()
}

/// One sample line: the payload is any JSON value. Unknown keys are refused, so a misspelt
/// `event_type` is an error, not an event without a type.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Sample {
    event_type: Option<String>,
    payload: serde_json::Value,
    id: Option<String>,
}

/// Every non-blank line of `file` is one event.
pub fn check_sample<W: Write>(file: &Path, report: &mut Report<'_, W>) -> Result<(), Error> {
    let f = std::fs::File::open(file)
        .map_err(|e| Definite::Config(format!("--sample {}: cannot open it ({e})", file.display())))?;
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let place = format!("{}:{}", file.display(), n + 1);
        let line = line.map_err(|e| Definite::Config(format!("--sample {place}: cannot read the line ({e})")))?;
        if line.trim().is_empty() {
            continue;
        }
        let s: Sample = serde_json::from_str(&line).map_err(|e| {
            Definite::Config(format!(
                "--sample {place}: expected one JSON object per line like {{\"event_type\": \"order.paid.v1\", \"payload\": {{...}}}} ({e})"
            ))
        })?;
        let payload = s.payload.to_string();
        report.event(&place, s.id.as_deref(), s.event_type.as_deref(), Some(payload.as_bytes()))?;
    }
    Ok(())
}

/// Every row of every `--table`, read as `run` would see its columns.
async fn check_tables<W: Write>(a: &SchemaCheckArgs, report: &mut Report<'_, W>) -> Result<(), Error> {
    let fallbacks = crate::config::postgres::Fallbacks {
        password_file: a.postgres_password_file.as_deref(),
        ..crate::config::postgres::Fallbacks::process()
    };
    let target = PgTarget::parse_with(&a.postgres_url, &fallbacks)?;
    let tables = a.tables.iter().map(|t| crate::config::parse_table(t)).collect::<Result<Vec<_>, _>>()?;
    let target = &target;
    let client =
        crate::pg::admin::connect_target(target).await.map_err(|e| crate::pg::sqlstate::for_tool(target, e))?;
    // The server's own message ("column \"kind\" does not exist"), not the driver's "db error";
    // transient (said so, see `for_tool`) or definite by SQLSTATE.
    let q = |what: String| {
        move |e| {
            crate::pg::sqlstate::for_tool(target, crate::pg::sqlstate::query_error(&format!("{what} at {target}"), e))
        }
    };
    client
        .batch_execute(&format!("SET statement_timeout = {TABLE_TIMEOUT_MS}"))
        .await
        .map_err(q("setting statement_timeout".into()))?;
    let col = crate::pg::ident::quote_ident;
    for t in &tables {
        let table = crate::pg::ident::quote_table(t);
        let (id, ty, payload) =
            (col(&a.table_field_event_id), col(&a.table_field_event_type), col(&a.table_field_event_payload));
        // The payload's type decides how its text becomes bytes (bytea is hex), as in the router.
        let probe = client
            .prepare(&format!("SELECT {payload} FROM {table} LIMIT 0"))
            .await
            .map_err(q(format!("reading column {payload} of {t} (--table-field-event-payload)")))?;
        let payload_oid = probe.columns()[0].type_().oid();
        let stmt = client
            .prepare(&format!("SELECT {id}::text, {ty}::text, {payload}::text FROM {table}"))
            .await
            .map_err(q(format!("reading {t} (check --table-field-event-id and --table-field-event-type)")))?;
        let rows = client.query_raw(&stmt, std::iter::empty::<String>()).await.map_err(q(format!("reading {t}")))?;
        futures_util::pin_mut!(rows);
        let place = t.to_string();
        while let Some(row) = rows.try_next().await.map_err(q(format!("reading {t}")))? {
            let id: Option<String> = row.get(0);
            let event_type: Option<String> = row.get(1);
            let text: Option<String> = row.get(2);
            let payload = match text {
                None => None,
                Some(s) => Some(render::as_bytes(payload_oid, &bytes::Bytes::from(s)).map_err(|e| {
                    Definite::Setup(format!(
                        "{t} event {}: the payload cannot be read: {e}",
                        id.as_deref().unwrap_or("?")
                    ))
                })?),
            };
            report.event(&place, id.as_deref(), event_type.as_deref(), payload.as_deref())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_lines_are_judged_like_the_router_judges_rows() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("order.paid.v1.json"),
            r#"{"required": ["amount"], "properties": {"amount": {"type": "integer"}}}"#,
        )
        .unwrap();
        let sample = dir.path().join("sample.jsonl");
        std::fs::write(
            &sample,
            concat!(
                r#"{"event_type": "order.paid.v1", "payload": {"amount": 5}}"#,
                "\n\n",
                r#"{"event_type": "order.paid.v1", "payload": {"amount": "5"}, "id": "e-2"}"#,
                "\n",
                r#"{"event_type": "order.created.v1", "payload": {}}"#,
                "\n",
            ),
        )
        .unwrap();
        let set = SchemaSet::load(dir.path()).unwrap();
        let mut out = Vec::new();
        let mut r = Report::new(&set, SchemaMissing::Allow, &mut out);
        check_sample(&sample, &mut r).unwrap();
        assert_eq!(r.finish().unwrap(), 1);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with(&format!(
                "{}:3 id=e-2: the payload violates the schema of event type \"order.paid.v1\"",
                sample.display()
            )),
            "{text}"
        );
        assert_eq!(lines[1], "    /amount: value is not of type \"integer\"");
        assert_eq!(lines[2], "3 events: 1 valid, 1 violating, 1 unchecked (no schema or no payload)");

        let mut out = Vec::new();
        let mut r = Report::new(&set, SchemaMissing::Reject, &mut out);
        check_sample(&sample, &mut r).unwrap();
        assert_eq!(r.finish().unwrap(), 1);
        assert!(String::from_utf8(out).unwrap().contains(":4: event type \"order.created.v1\" has no schema"));

        std::fs::write(&sample, r#"{"event_type": "order.paid.v1", "payload": {"amount": 5}}"#).unwrap();
        let mut out = Vec::new();
        let mut r = Report::new(&set, SchemaMissing::Reject, &mut out);
        check_sample(&sample, &mut r).unwrap();
        assert_eq!(r.finish().unwrap(), 0);

        for bad in ["{\"payload\": 1}\nnot json\n", "{\"payload\": 1}\n{\"eventType\": \"x\", \"payload\": 1}\n"] {
            std::fs::write(&sample, bad).unwrap();
            let mut r = Report::new(&set, SchemaMissing::Allow, Vec::new());
            let e = check_sample(&sample, &mut r).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("--sample {}:2: expected one JSON object per line", sample.display())),
                "{e}"
            );
        }
    }
}
