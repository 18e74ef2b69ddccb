//! The PostgreSQL half of `outboxd check`: version, settings, the role's rights, the tables and
//! their columns, the publication, the slot's WAL and who holds it, failover readiness.
//!
//! Read-only catalog queries over one ordinary connection. When the server cannot be reached or
//! is too old, the rest is skipped (its catalogs may lack what the queries read). A failure that
//! may pass by itself (by SQLSTATE, [`crate::pg::sqlstate::for_tool`]) is a fail marked transient,
//! whose fix is to run `check` again, not to change a flag.

use tokio_postgres::Client;

use super::Checks;
use crate::config::{Config, PublicationAutocreate, TableName};
use crate::error::Error;
use crate::pg::admin::{self, ServerVersion};
use crate::pg::ident::{quote_ident, quote_table};
use crate::pg::sqlstate;

/// At most this many distinct routed values per table are turned into topics to check.
const ROUTED_SAMPLE: i64 = 20;

/// Run the PostgreSQL checks; returns the topics that the rows now in the outbox route to.
pub(super) async fn check(cfg: &Config, out: &mut Checks) -> Vec<String> {
    let client = match admin::connect(cfg).await {
        Ok(c) => {
            out.ok("connection", format!("connected to {}", cfg.postgres));
            c
        }
        Err(e) if e.is_transient() => {
            out.fail_transient("connection", sqlstate::for_tool(&cfg.postgres, e).to_string(), AGAIN);
            return Vec::new();
        }
        Err(e) => {
            out.fail(
                "connection",
                e.to_string(),
                "fix the connection flags (--postgres-url) or the server; the other PostgreSQL checks were skipped",
            );
            return Vec::new();
        }
    };
    match checks(cfg, &client, out).await {
        Ok(topics) => topics,
        Err(e) if e.is_transient() => {
            out.fail_transient("catalog query", sqlstate::for_tool(&cfg.postgres, e).to_string(), AGAIN);
            Vec::new()
        }
        Err(e) => {
            out.fail(
                "catalog query",
                e.to_string(),
                "the role must be able to read pg_catalog; the remaining checks were skipped",
            );
            Vec::new()
        }
    }
}

/// The fix of a transient failure: if the server is up, the address is wrong; else only wait.
const AGAIN: &str = "if the server is up, check host and port in --postgres-url; otherwise this may pass by \
     itself: run `outboxd check` again once the server is back (the other PostgreSQL checks were skipped)";

async fn checks(cfg: &Config, c: &Client, out: &mut Checks) -> Result<Vec<String>, Error> {
    let version = admin::server_version(c).await?;
    if let Err(e) = version.check_supported() {
        out.fail(
            "server version",
            e.to_string(),
            "upgrade PostgreSQL to 13 or newer; the other PostgreSQL checks were skipped",
        );
        return Ok(Vec::new());
    }
    out.ok("server version", format!("PostgreSQL {}", version.text));
    settings(c, cfg, out).await?;
    role(c, out).await?;
    let mut topics = Vec::new();
    for t in &cfg.tables {
        table(c, cfg, t, out, &mut topics).await?;
    }
    publication(c, cfg, out).await?;
    slot(c, cfg, &version, out).await?;
    Ok(topics)
}

async fn setting(c: &Client, name: &str) -> Result<String, Error> {
    let row = admin::timed("reading a setting", c.query_one("SELECT current_setting($1)", &[&name])).await?;
    Ok(row.get(0))
}

async fn count(c: &Client, what: &str, sql: &str, slot: &str) -> Result<i64, Error> {
    Ok(admin::timed(what, c.query_one(sql, &[&slot])).await?.get(0))
}

/// `wal_level`, and room for one more slot and walsender.
async fn settings(c: &Client, cfg: &Config, out: &mut Checks) -> Result<(), Error> {
    let level = setting(c, "wal_level").await?;
    if level == "logical" {
        out.ok("wal_level", "logical");
    } else {
        out.fail(
            "wal_level",
            format!("'{level}', but logical decoding needs 'logical'"),
            "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
        );
    }
    let has_slot = count(
        c,
        "reading pg_replication_slots",
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
        &cfg.slot,
    )
    .await?
        > 0;
    let max_slots: i64 = setting(c, "max_replication_slots").await?.parse().unwrap_or(0);
    let used = count(
        c,
        "reading pg_replication_slots",
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name <> $1",
        &cfg.slot,
    )
    .await?;
    let free = max_slots - used;
    if has_slot || free > 0 {
        out.ok(
            "max_replication_slots",
            format!("{max_slots}, {used} used by other slots{}", if has_slot { ", ours exists" } else { "" }),
        );
    } else {
        out.fail(
            "max_replication_slots",
            format!("{max_slots}, all used: no room for slot {:?}", cfg.slot),
            "raise max_replication_slots (restart needed) or drop a slot nobody uses",
        );
    }
    let max_senders: i64 = setting(c, "max_wal_senders").await?.parse().unwrap_or(0);
    let senders: i64 =
        admin::timed("reading pg_stat_replication", c.query_one("SELECT count(*) FROM pg_stat_replication", &[]))
            .await?
            .get(0);
    if senders < max_senders {
        out.ok("max_wal_senders", format!("{max_senders}, {senders} in use"));
    } else {
        out.fail(
            "max_wal_senders",
            format!("{max_senders}, all {senders} in use"),
            "raise max_wal_senders (restart needed)",
        );
    }
    Ok(())
}

/// REPLICATION (or superuser): needed to create and stream the slot.
async fn role(c: &Client, out: &mut Checks) -> Result<(), Error> {
    let row = admin::timed(
        "reading the role",
        c.query_one(
            "SELECT current_user::text, rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        ),
    )
    .await?;
    let (user, replication, superuser): (String, bool, bool) = (row.get(0), row.get(1), row.get(2));
    if replication || superuser {
        out.ok("role REPLICATION", format!("{user} has {}", if superuser { "SUPERUSER" } else { "REPLICATION" }));
    } else {
        out.fail(
            "role REPLICATION",
            format!("role {user:?} lacks REPLICATION: it cannot create or stream the slot"),
            format!("ALTER ROLE {} REPLICATION", quote_ident(&user)),
        );
    }
    Ok(())
}

/// The table exists, the role may read it, it has every column `run` needs with a type the
/// router can use; collects the topics its rows route to now.
async fn table(
    c: &Client,
    cfg: &Config,
    t: &TableName,
    out: &mut Checks,
    topics: &mut Vec<String>,
) -> Result<(), Error> {
    let name = format!("table {t}");
    let row = admin::timed(
        "reading the table",
        c.query_opt(
            "SELECT c.oid::int8, has_table_privilege(c.oid, 'SELECT'), pg_has_role(c.relowner, 'USAGE') \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
            &[&t.schema, &t.name],
        ),
    )
    .await?;
    let Some(row) = row else {
        out.fail(&name, "does not exist", "create it (see sql/01_outbox.sql) or point --table at the outbox table");
        return Ok(());
    };
    let (oid, select, owner): (i64, bool, bool) = (row.get(0), row.get(1), row.get(2));
    let superuser = setting(c, "is_superuser").await? == "on";
    if select {
        out.ok(format!("{name} SELECT"), "the role may read it");
    } else {
        out.fail(
            format!("{name} SELECT"),
            "the role may not read it",
            format!("GRANT SELECT ON {} TO <outboxd role>", quote_table(t)),
        );
    }
    let publication_missing = !admin::publication_exists(c, &cfg.publication).await?;
    if publication_missing && cfg.publication_autocreate != PublicationAutocreate::Disabled && !owner && !superuser {
        out.fail(
            format!("{name} owner"),
            format!("publication {:?} is missing and must be created, but only the table's owner can add it", cfg.publication),
            format!("create the publication as the owner (CREATE PUBLICATION {} FOR TABLE {}) or ALTER TABLE {} OWNER TO <outboxd role>", quote_ident(&cfg.publication), quote_table(t), quote_table(t)),
        );
    }
    let cols = admin::timed(
        "reading the table's columns",
        c.query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.typcategory::text \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = $1::int8::oid AND a.attnum > 0 AND NOT a.attisdropped",
            &[&oid],
        ),
    )
    .await?;
    let cols: Vec<(String, String, String)> = cols.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    let mut notes = Vec::new();
    for (col, flag) in admin::needed_columns(cfg) {
        let Some((_, ty, cat)) = cols.iter().find(|(n, _, _)| n == col) else {
            problems.push(format!("no column {col:?} ({flag})"));
            fixes.push(format!("add column {col:?} or change {flag}"));
            continue;
        };
        // Arrays, composites and pseudo-types do not render as one key, id, topic or payload.
        if matches!(cat.as_str(), "A" | "C" | "P") {
            problems.push(format!("column {col:?} ({flag}) is {ty}, which cannot be routed"));
            fixes.push(format!("use a scalar type for {col:?} (text, uuid, jsonb, bytea)"));
        } else if flag == "--route-by-field" && !matches!(cat.as_str(), "S" | "E") {
            notes.push(format!("topic names come from a {ty} column {col:?}"));
        } else if flag == "--table-field-event-payload"
            && !matches!(ty.as_str(), "jsonb" | "json" | "text" | "bytea")
            && cat != "S"
        {
            notes.push(format!("the payload column {col:?} is {ty}: sent as its text form"));
        }
    }
    if problems.is_empty() {
        let detail =
            if notes.is_empty() { "routed, key, id and payload columns present".to_owned() } else { notes.join("; ") };
        if notes.is_empty() {
            out.ok(format!("{name} columns"), detail);
        } else {
            out.warn(
                format!("{name} columns"),
                detail,
                "prefer text for the routed column and jsonb, text or bytea for the payload",
            );
        }
    } else {
        out.fail(format!("{name} columns"), problems.join("; "), fixes.join("; "));
        return Ok(());
    }
    if select {
        let route = quote_ident(&cfg.route.route_by_field);
        let rows = admin::timed(
            "reading the routed values",
            c.query(
                &format!(
                    "SELECT DISTINCT {route}::text FROM {} WHERE {route} IS NOT NULL LIMIT {ROUTED_SAMPLE}",
                    quote_table(t)
                ),
                &[],
            ),
        )
        .await?;
        for r in rows {
            let topic = cfg.route.topic.topic(&r.get::<_, String>(0));
            if !topics.contains(&topic) {
                topics.push(topic);
            }
        }
    }
    Ok(())
}

/// The publication publishes inserts of exactly the `--table`s.
async fn publication(c: &Client, cfg: &Config, out: &mut Checks) -> Result<(), Error> {
    let name = format!("publication {}", cfg.publication);
    let row = admin::timed(
        "reading pg_publication",
        c.query_opt("SELECT pubinsert, puballtables FROM pg_publication WHERE pubname = $1", &[&cfg.publication]),
    )
    .await?;
    let want: Vec<String> = cfg.tables.iter().map(|t| t.to_string()).collect();
    let create = format!(
        "CREATE PUBLICATION {} FOR TABLE {}",
        quote_ident(&cfg.publication),
        cfg.tables.iter().map(quote_table).collect::<Vec<_>>().join(", ")
    );
    let Some(row) = row else {
        if cfg.publication_autocreate == PublicationAutocreate::Disabled {
            out.fail(&name, "does not exist and --publication-autocreate is disabled", create);
        } else {
            out.info(&name, "does not exist yet; run creates it (--publication-autocreate)");
        }
        return Ok(());
    };
    let (pubinsert, all): (bool, bool) = (row.get(0), row.get(1));
    if !pubinsert {
        out.fail(
            &name,
            "does not publish inserts",
            format!("ALTER PUBLICATION {} SET (publish = 'insert')", quote_ident(&cfg.publication)),
        );
        return Ok(());
    }
    let rows = admin::timed(
        "reading pg_publication_tables",
        c.query("SELECT schemaname::text || '.' || tablename::text FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1", &[&cfg.publication]),
    )
    .await?;
    let have: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let missing: Vec<&String> = want.iter().filter(|t| !have.contains(t)).collect();
    let extra: Vec<&String> = have.iter().filter(|t| !want.contains(t)).collect();
    if !missing.is_empty() {
        let add: Vec<String> =
            cfg.tables.iter().filter(|t| missing.contains(&&t.to_string())).map(quote_table).collect();
        out.fail(
            &name,
            format!("does not publish {} (--table)", missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")),
            format!("ALTER PUBLICATION {} ADD TABLE {}", quote_ident(&cfg.publication), add.join(", ")),
        );
    } else if all || !extra.is_empty() {
        let what = if all {
            "FOR ALL TABLES".to_owned()
        } else {
            extra.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        };
        out.warn(
            &name,
            format!("also publishes {what}: outboxd ignores those changes but the server still decodes and sends them"),
            format!("publish only the outbox: DROP PUBLICATION {}; {create}", quote_ident(&cfg.publication)),
        );
    } else {
        out.ok(&name, format!("publishes inserts of {}", want.join(", ")));
    }
    Ok(())
}

/// The slot's kind, WAL retention, holder and (17+) failover readiness.
async fn slot(c: &Client, cfg: &Config, version: &ServerVersion, out: &mut Checks) -> Result<(), Error> {
    let name = format!("slot {}", cfg.slot);
    let failover = if version.major() >= 17 { "failover" } else { "NULL::bool" };
    let row = admin::timed(
        "reading pg_replication_slots",
        c.query_opt(
            &format!(
                "SELECT slot_type, plugin::text, database::text, wal_status, safe_wal_size::int8, active_pid, {failover} \
                 FROM pg_replication_slots WHERE slot_name = $1"
            ),
            &[&cfg.slot],
        ),
    )
    .await?;
    let keep = setting(c, "max_slot_wal_keep_size").await?;
    let unlimited = keep == "-1";
    let Some(row) = row else {
        if cfg.debezium_offsets.is_some() {
            out.fail(
                &name,
                "does not exist, and --debezium-offsets takes over Debezium's slot",
                "set --slot (or the file's slot.name) to the slot Debezium used; a new slot would start after events Debezium never sent",
            );
            return Ok(());
        }
        out.info(&name, "does not exist yet; run creates it");
        retention(out, &name, unlimited, &keep, None);
        failover_facts(c, cfg, version, None, out).await?;
        return Ok(());
    };
    let slot_type: String = row.get(0);
    let plugin: Option<String> = row.get(1);
    let database: Option<String> = row.get(2);
    let wal_status: Option<String> = row.get(3);
    let safe: Option<i64> = row.get(4);
    let pid: Option<i32> = row.get(5);
    let slot_failover: Option<bool> = row.get(6);
    if slot_type != "logical"
        || plugin.as_deref() != Some("pgoutput")
        || database.as_deref() != Some(cfg.postgres.dbname.as_str())
    {
        out.fail(
            &name,
            format!(
                "is {slot_type} with plugin {} in database {}",
                plugin.as_deref().unwrap_or("none"),
                database.as_deref().unwrap_or("none")
            ),
            format!("outboxd needs a logical pgoutput slot in {:?}: pick another --slot", cfg.postgres.dbname),
        );
        return Ok(());
    }
    match wal_status.as_deref() {
        Some("lost") => out.fail(
            format!("{name} wal_status"),
            "lost: the WAL it needs was removed, events may be missing",
            "reconcile the outbox by hand, then drop the slot and start again",
        ),
        Some("unreserved") => out.warn(
            format!("{name} wal_status"),
            "unreserved: past max_slot_wal_keep_size, WAL it needs will be removed at the next checkpoint",
            "start outboxd now or raise max_slot_wal_keep_size",
        ),
        Some(s) => out.ok(format!("{name} wal_status"), s.to_owned()),
        None => out.info(format!("{name} wal_status"), "unknown (no restart_lsn yet)"),
    }
    retention(out, &name, unlimited, &keep, safe);
    if let Some((path, o)) = &cfg.debezium_offsets {
        let confirmed: Option<String> = admin::timed(
            "reading pg_replication_slots",
            c.query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&cfg.slot],
            ),
        )
        .await?
        .get(0);
        let partial = match &o.partial {
            Some(p) => format!(", and transaction {} up to its change at {}", p.xid, p.lsn_proc),
            None => String::new(),
        };
        out.info(
            format!("{name} debezium offsets"),
            format!(
                "{}: the slot is at {}; transactions committed before {} are skipped as delivered by Debezium{partial}",
                path.display(),
                confirmed.as_deref().unwrap_or("no position"),
                o.lsn_commit
            ),
        );
    }
    match pid {
        None => out.ok(format!("{name} active"), "free"),
        Some(pid) => {
            let holder = admin::timed(
                "reading pg_stat_replication",
                c.query_opt(
                    "SELECT application_name, host(client_addr) FROM pg_stat_replication WHERE pid = $1",
                    &[&pid],
                ),
            )
            .await?;
            let who = match holder {
                Some(r) => format!(
                    "pid {pid}, application_name {:?}, client_addr {}",
                    r.get::<_, Option<String>>(0).unwrap_or_default(),
                    r.get::<_, Option<String>>(1).unwrap_or_else(|| "local socket".into())
                ),
                None => format!("pid {pid}"),
            };
            out.warn(
                format!("{name} active"),
                format!("held by {who}"),
                "run will wait as a standby until it is released; stop the other consumer if it should not hold it",
            );
        }
    }
    failover_facts(c, cfg, version, slot_failover, out).await
}

fn retention(out: &mut Checks, name: &str, unlimited: bool, keep: &str, safe: Option<i64>) {
    let check = format!("{name} WAL retention");
    if unlimited {
        out.warn(
            check,
            "max_slot_wal_keep_size = -1 (unlimited): a stopped outboxd makes the server keep WAL until the disk fills",
            "set max_slot_wal_keep_size to what the disk can hold (the slot is then lost rather than the server)",
        );
    } else {
        let safe = safe.map_or("n/a".to_owned(), |b| format!("{} MB", b / (1024 * 1024)));
        out.ok(check, format!("max_slot_wal_keep_size = {keep}, safe_wal_size {safe}"));
    }
}

/// On 17+, the facts that decide whether a promoted physical standby has this slot: info without
/// `--slot-failover`; with it, a server before 17 fails (run would refuse to start) and an empty
/// `synchronized_standby_slots` warns (the synchronized copy may lag what outboxd confirmed).
async fn failover_facts(
    c: &Client,
    cfg: &Config,
    version: &ServerVersion,
    slot_failover: Option<bool>,
    out: &mut Checks,
) -> Result<(), Error> {
    if version.major() < 17 && cfg.slot_failover {
        out.fail(
            "failover slots",
            format!("--slot-failover needs PostgreSQL 17 or later; this is {}", version.text),
            "remove --slot-failover (slot.failover in --debezium-config) or upgrade the server",
        );
        return Ok(());
    }
    if version.major() < 17 {
        out.info(
            "failover slots",
            format!("need PostgreSQL 17 (this is {}): the slot stays on this server", version.text),
        );
        return Ok(());
    }
    let standby_slots = setting(c, "synchronized_standby_slots").await?;
    let slot = match slot_failover {
        Some(true) => "the slot has failover = true",
        Some(false) => "the slot has failover = false (not synchronized to standbys)",
        None => "the slot does not exist yet",
    };
    let sync = if standby_slots.is_empty() {
        "synchronized_standby_slots is empty".to_owned()
    } else {
        format!("synchronized_standby_slots = {standby_slots}")
    };
    if cfg.slot_failover && standby_slots.is_empty() {
        out.warn(
            "failover slots",
            format!("{slot}; synchronized_standby_slots is empty"),
            "set synchronized_standby_slots on the primary to the standbys' physical slot names (docs/src/failover.md)",
        );
    } else if cfg.slot_failover && slot_failover == Some(false) {
        out.info("failover slots", format!("{slot} (outboxd run turns it on: --slot-failover); {sync}"));
    } else {
        out.info("failover slots", format!("{slot}; {sync}"));
    }
    Ok(())
}
