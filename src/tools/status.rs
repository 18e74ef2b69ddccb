//! `outboxd status`: the slot, the publication and the server settings, for humans or `--json`.
//!
//! Read-only: one ordinary connection, a few catalog queries, one report on stdout. The exit code
//! answers "can `outboxd run` resume without losing events?": 0 when the slot exists and still has
//! its WAL, 1 when it is missing or lost, and 1 when it cannot tell (an error line instead of the
//! report: a transient one, classed by [`crate::pg::sqlstate`], says the server is not reachable now
//! and to retry). Everything else worth knowing (wrong `wal_level`, missing publication, a slot held
//! by someone, WAL about to be removed) is reported as a warning.

use serde::Serialize;

use crate::config::{PgTarget, StatusArgs};
use crate::error::{Definite, Error};

/// Everything `status` prints; the `--json` output is this, serialized.
#[derive(Debug, Serialize)]
pub struct Report {
    /// True when the slot exists and is not lost (exit code 0).
    pub healthy: bool,
    /// Why `healthy` is false; each entry says what to do.
    pub problems: Vec<String>,
    /// Things that do not stop a resume but need attention.
    pub warnings: Vec<String>,
    pub slot: SlotReport,
    pub publication: PublicationReport,
    pub server: ServerReport,
}

#[derive(Debug, Default, Serialize)]
pub struct SlotReport {
    pub name: String,
    pub exists: bool,
    pub slot_type: Option<String>,
    pub plugin: Option<String>,
    pub database: Option<String>,
    pub active: Option<bool>,
    pub active_pid: Option<i32>,
    pub confirmed_flush_lsn: Option<String>,
    pub restart_lsn: Option<String>,
    pub wal_status: Option<String>,
    /// Bytes of WAL that may still be written before the slot is lost; NULL when unlimited.
    pub safe_wal_size: Option<i64>,
    /// Current WAL position minus `confirmed_flush_lsn`: what the slot pins.
    pub lag_bytes: Option<i64>,
}

#[derive(Debug, Default, Serialize)]
pub struct PublicationReport {
    pub name: String,
    pub exists: bool,
    pub pubinsert: Option<bool>,
    pub all_tables: Option<bool>,
    /// `schema.table`, sorted.
    pub tables: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct ServerReport {
    pub server_version: String,
    pub wal_level: String,
    pub max_slot_wal_keep_size: String,
    pub database: String,
}

/// Returns the process exit code: 0 when the slot is healthy, 1 when it is missing or lost.
pub async fn run(args: &StatusArgs) -> Result<u8, Error> {
    let fallbacks = crate::config::postgres::Fallbacks {
        password_file: args.postgres_password_file.as_deref(),
        ..crate::config::postgres::Fallbacks::process()
    };
    let target = PgTarget::parse_with(&args.postgres_url, &fallbacks)?;
    // A server restarting or a dropped link is said to be transient, naming the server (exit 1
    // all the same: the slot's state is unknown).
    let report =
        collect(&target, &args.slot, &args.publication).await.map_err(|e| crate::pg::sqlstate::for_tool(&target, e))?;
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Definite::Bug(format!("serializing the status report: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", render_text(&report));
    }
    Ok(if report.healthy { 0 } else { 1 })
}

async fn collect(target: &PgTarget, slot: &str, publication: &str) -> Result<Report, Error> {
    let client = crate::pg::admin::connect_target(target).await?;
    // By SQLSTATE: a server shutting down or a dropped link is transient, not a setup error.
    let q = |what: &'static str| move |e| crate::pg::sqlstate::query_error(&format!("{what} at {target}"), e);

    let row = client
        .query_one(
            "SELECT current_setting('server_version'), current_setting('wal_level'), \
             current_setting('max_slot_wal_keep_size'), current_database()::text",
            &[],
        )
        .await
        .map_err(q("reading server settings"))?;
    let server = ServerReport {
        server_version: row.get(0),
        wal_level: row.get(1),
        max_slot_wal_keep_size: row.get(2),
        database: row.get(3),
    };

    let mut s = SlotReport { name: slot.to_owned(), ..Default::default() };
    if let Some(r) = client
        .query_opt(
            "SELECT slot_type, plugin::text, database::text, active, active_pid, \
             confirmed_flush_lsn::text, restart_lsn::text, wal_status, safe_wal_size, \
             ((CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() \
               ELSE pg_current_wal_lsn() END) - confirmed_flush_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(q("reading pg_replication_slots"))?
    {
        s = SlotReport {
            name: slot.to_owned(),
            exists: true,
            slot_type: r.get(0),
            plugin: r.get(1),
            database: r.get(2),
            active: r.get(3),
            active_pid: r.get(4),
            confirmed_flush_lsn: r.get(5),
            restart_lsn: r.get(6),
            wal_status: r.get(7),
            safe_wal_size: r.get(8),
            lag_bytes: r.get(9),
        };
    }

    let mut p = PublicationReport { name: publication.to_owned(), ..Default::default() };
    if let Some(r) = client
        .query_opt("SELECT pubinsert, puballtables FROM pg_publication WHERE pubname = $1", &[&publication])
        .await
        .map_err(q("reading pg_publication"))?
    {
        p.exists = true;
        p.pubinsert = r.get(0);
        p.all_tables = r.get(1);
        p.tables = client
            .query(
                "SELECT schemaname::text || '.' || tablename::text FROM pg_publication_tables \
                 WHERE pubname = $1 ORDER BY 1",
                &[&publication],
            )
            .await
            .map_err(q("reading pg_publication_tables"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
    }
    Ok(judge(s, p, server))
}

/// Decide healthy/problems/warnings from the facts.
fn judge(slot: SlotReport, publication: PublicationReport, server: ServerReport) -> Report {
    let (mut problems, mut warnings) = (Vec::new(), Vec::new());
    let name = &slot.name;
    if !slot.exists {
        problems.push(format!(
            "slot {name:?} is missing (not in pg_replication_slots): `outboxd run` creates it on \
             first start; if an existing slot was dropped, rows committed until it is recreated are never \
             streamed and must be republished from the outbox table"
        ));
    } else if slot.wal_status.as_deref() == Some("lost") {
        problems.push(format!(
            "slot {name:?} is lost (wal_status = lost): PostgreSQL removed WAL it still needed, so \
             events after {} cannot be streamed; drop and recreate the slot, then republish the gap \
             from the outbox table",
            slot.confirmed_flush_lsn.as_deref().unwrap_or("its confirmed_flush_lsn")
        ));
    } else {
        if slot.wal_status.as_deref() == Some("unreserved") {
            warnings.push(format!(
                "slot {name:?} is past max_slot_wal_keep_size (wal_status = unreserved): the next \
                 checkpoint may remove WAL it needs; make sure outboxd is running and keeping up"
            ));
        }
        if slot.slot_type.as_deref() != Some("logical") || slot.plugin.as_deref() != Some("pgoutput") {
            warnings.push(format!(
                "slot {name:?} is not a logical pgoutput slot (type {}, plugin {}): outboxd cannot stream from it",
                slot.slot_type.as_deref().unwrap_or("?"),
                slot.plugin.as_deref().unwrap_or("none")
            ));
        }
        if let Some(db) = slot.database.as_deref().filter(|d| *d != server.database) {
            warnings.push(format!(
                "slot {name:?} belongs to database {db:?}, not {:?}: point --postgres-url at {db:?}",
                server.database
            ));
        }
    }
    if server.wal_level != "logical" {
        warnings.push(format!(
            "wal_level is '{}': outboxd needs 'logical' (ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL)",
            server.wal_level
        ));
    }
    let pubname = &publication.name;
    if !publication.exists {
        warnings.push(format!(
            "publication {pubname:?} does not exist: `outboxd run` creates it (--publication-autocreate filtered), or apply sql/04_publication.sql"
        ));
    } else if publication.pubinsert == Some(false) {
        warnings.push(format!(
            "publication {pubname:?} does not publish inserts: ALTER PUBLICATION {pubname} SET (publish = 'insert')"
        ));
    } else if publication.tables.is_empty() {
        warnings.push(format!("publication {pubname:?} contains no tables: add the outbox table to it"));
    }
    Report { healthy: problems.is_empty(), problems, warnings, slot, publication, server }
}

fn render_text(r: &Report) -> String {
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let yes_no = |b: Option<bool>| {
        (match b {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        })
        .to_owned()
    };
    let (s, p, v) = (&r.slot, &r.publication, &r.server);
    let mut rows = vec![("status", (if r.healthy { "ok" } else { "NOT OK" }).to_owned()), ("slot", s.name.clone())];
    if s.exists {
        let active = match (s.active, s.active_pid) {
            (Some(true), Some(pid)) => format!("yes (pid {pid})"),
            (a, _) => yes_no(a),
        };
        let safe = match (s.safe_wal_size, s.wal_status.as_deref()) {
            (Some(b), _) => bytes(b),
            (None, Some("lost")) => "-".into(),
            (None, _) => "unlimited".into(),
        };
        rows.extend([
            ("  active", active),
            ("  type / plugin", format!("{} / {}", dash(&s.slot_type), dash(&s.plugin))),
            ("  database", dash(&s.database)),
            ("  confirmed_flush_lsn", dash(&s.confirmed_flush_lsn)),
            ("  restart_lsn", dash(&s.restart_lsn)),
            ("  wal_status", dash(&s.wal_status)),
            ("  safe_wal_size", safe),
            ("  lag", s.lag_bytes.map(bytes).unwrap_or_else(|| "-".into())),
        ]);
    } else {
        rows.push(("  exists", "NO (missing)".into()));
    }
    rows.extend([("publication", p.name.clone()), ("  exists", yes_no(Some(p.exists)))]);
    if p.exists {
        let mut tables = if p.tables.is_empty() { "-".into() } else { p.tables.join(", ") };
        if p.all_tables == Some(true) {
            tables.push_str(" (FOR ALL TABLES)");
        }
        rows.extend([("  publishes inserts", yes_no(p.pubinsert)), ("  tables", tables)]);
    }
    rows.extend([
        ("server", format!("connected to database {}", v.database)),
        ("  server_version", v.server_version.clone()),
        ("  wal_level", v.wal_level.clone()),
        ("  max_slot_wal_keep_size", v.max_slot_wal_keep_size.clone()),
    ]);
    let mut out: String = rows.iter().map(|(k, v)| format!("{k:<26}{v}\n")).collect();
    for m in &r.problems {
        out.push_str(&format!("problem: {m}\n"));
    }
    for m in &r.warnings {
        out.push_str(&format!("warning: {m}\n"));
    }
    out
}

/// `1.5 MiB (1572864 bytes)`; plain bytes below 1 KiB.
fn bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n.unsigned_abs() as f64;
    if v < 1024.0 {
        return format!("{n} bytes");
    }
    let mut unit = "";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    let sign = if n < 0 { "-" } else { "" };
    format!("{sign}{v:.1} {unit} ({n} bytes)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_read_well() {
        assert_eq!(bytes(0), "0 bytes");
        assert_eq!(bytes(1536), "1.5 KiB (1536 bytes)");
        assert_eq!(bytes(1 << 30), "1.0 GiB (1073741824 bytes)");
        assert_eq!(bytes(-2048), "-2.0 KiB (-2048 bytes)");
    }
}
