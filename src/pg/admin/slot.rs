//! The publication and the slot: found, or created when the flags allow it, never dropped,
//! recreated or taken over. A slot held by another process is [`Transient::SlotBusy`], so the
//! caller waits for it (how a standby outboxd takes over); the only walsender we end is our own
//! earlier one, pinned by PID, start time and application name ([`Walsender`]).

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::{timed, ServerVersion};
use crate::config::{Config, PublicationAutocreate};
use crate::error::{Definite, Error, Transient};
use crate::lsn::Lsn;
use crate::pg::ident::{quote_ident, quote_table};
use crate::pg::sqlstate::query_error as db;

/// Who our walsender was. A PID alone does not say it: PIDs are reused, and after a server restart
/// another instance's walsender can have the PID ours had. Its start time and application name
/// (as `pg_stat_activity` shows them) pin it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walsender {
    pub pid: i32,
    pub backend_start: String,
    pub application_name: String,
}

/// The identity of backend `pid` as the server reached by `client` sees it; `None` when it is not
/// there (another server) or its start time is hidden.
pub async fn walsender(client: &Client, pid: i32) -> Result<Option<Walsender>, Error> {
    let rows = timed(
        "reading our walsender's start time",
        client.query("SELECT backend_start::text, application_name FROM pg_stat_activity WHERE pid = $1", &[&pid]),
    )
    .await?;
    Ok(rows.first().and_then(|r| {
        let backend_start: Option<String> = r.get(0);
        let application_name: Option<String> = r.get(1);
        Some(Walsender { pid, backend_start: backend_start?, application_name: application_name.unwrap_or_default() })
    }))
}

/// Terminate `own` if it still holds our slot; true when it did. The caller passes only the
/// walsender its own earlier replication connection had, and it must match on PID, start time and
/// application name, so a slot held by another instance (a standby waiting its turn, or a
/// walsender that got our old PID after a restart) is never taken.
pub async fn terminate_own_walsender(client: &Client, slot: &str, own: &Walsender) -> Result<bool, Error> {
    let rows = timed(
        "ending our previous walsender",
        client.query(
            "SELECT pg_terminate_backend(s.active_pid) FROM pg_replication_slots s \
             JOIN pg_stat_activity a ON a.pid = s.active_pid \
             WHERE s.slot_name = $1 AND s.active_pid = $2 \
               AND a.backend_start::text = $3 AND a.application_name = $4",
            &[&slot, &own.pid, &own.backend_start, &own.application_name],
        ),
    )
    .await?;
    Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
}

/// The publication exists (created per `--publication-autocreate`) and publishes every table's inserts.
pub async fn ensure_publication(client: &Client, cfg: &Config) -> Result<(), Error> {
    let all: Vec<String> = cfg.tables.iter().map(quote_table).collect();
    let all = all.join(", ");
    let exists = client
        .query_opt("SELECT pubinsert FROM pg_publication WHERE pubname = $1", &[&cfg.publication])
        .await
        .map_err(|e| db("reading pg_publication", e))?;
    let Some(row) = exists else {
        if cfg.publication_autocreate == PublicationAutocreate::Disabled {
            return Err(Definite::Setup(format!(
                "publication {:?} does not exist and --publication-autocreate is disabled: run CREATE PUBLICATION {} FOR TABLE {all}",
                cfg.publication,
                quote_ident(&cfg.publication),
            ))
            .into());
        }
        // No table (logical messages only): a publication of nothing still names the stream.
        let what = if all.is_empty() { String::new() } else { format!(" FOR TABLE {all}") };
        // A partitioned outbox publishes its inserts under its own name, not each partition's,
        // so the router recognises it whatever partition a row lands in.
        let with = if any_partitioned(client, cfg).await? { " WITH (publish_via_partition_root = true)" } else { "" };
        let sql = format!("CREATE PUBLICATION {}{what}{with}", quote_ident(&cfg.publication));
        match client.batch_execute(&sql).await {
            Ok(()) => tracing::info!(publication = %cfg.publication, tables = %all, "created publication"),
            // Another instance won the race; fall through to the membership check.
            Err(e) if e.code() == Some(&SqlState::DUPLICATE_OBJECT) => {}
            Err(e) => {
                return Err(db(&format!("creating publication {:?} (the role must own {all})", cfg.publication), e))
            }
        }
        return Ok(());
    };
    let pubinsert: bool = row.get(0);
    if any_partitioned(client, cfg).await? {
        let via_root = client
            .query_one("SELECT pubviaroot FROM pg_publication WHERE pubname = $1", &[&cfg.publication])
            .await
            .map_err(|e| db("reading pg_publication.pubviaroot", e))?;
        if !via_root.get::<_, bool>(0) {
            return Err(Definite::Setup(format!(
                "publication {:?} publishes a partitioned outbox table under its partitions' names, which outboxd would ignore: ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
                cfg.publication,
                quote_ident(&cfg.publication)
            ))
            .into());
        }
    }
    if !pubinsert {
        return Err(Definite::Setup(format!(
            "publication {:?} does not publish inserts: ALTER PUBLICATION {} SET (publish = 'insert')",
            cfg.publication,
            quote_ident(&cfg.publication)
        ))
        .into());
    }
    for table in &cfg.tables {
        let member = client
            .query_opt(
                "SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
                &[&cfg.publication, &table.schema, &table.name],
            )
            .await
            .map_err(|e| db("reading pg_publication_tables", e))?;
        if member.is_none() {
            return Err(Definite::Setup(format!(
                "publication {:?} does not include {table}: ALTER PUBLICATION {} ADD TABLE {}",
                cfg.publication,
                quote_ident(&cfg.publication),
                quote_table(table)
            ))
            .into());
        }
    }
    Ok(())
}

/// Whether any outbox table is partitioned (`PARTITION BY`, e.g. `sql/07_partitioned.sql`).
async fn any_partitioned(client: &Client, cfg: &Config) -> Result<bool, Error> {
    for t in &cfg.tables {
        let row = client
            .query_opt(
                "SELECT c.relkind = 'p' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&t.schema, &t.name],
            )
            .await
            .map_err(|e| db("reading pg_class", e))?;
        if row.is_some_and(|r| r.get::<_, bool>(0)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// What we know about our slot once it is usable.
#[derive(Debug, Clone, Copy)]
pub struct SlotState {
    pub confirmed_flush: Lsn,
    /// This call created the slot: nothing remembered from before can apply to it.
    pub created: bool,
    /// `--slot-failover` is set but the existing slot is not a failover slot yet: the caller turns
    /// it on over the replication connection (`ALTER_REPLICATION_SLOT`).
    pub enable_failover: bool,
}

/// May [`ensure_slot`] create a missing slot?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingSlot {
    /// First start (nothing was streamed from it yet), or `--slot-recreate-after-loss`.
    Create,
    /// This process streamed from the slot before: it was lost (a failover to a server that did
    /// not have it), and a new one would silently skip events. A definite error.
    Lost,
    /// `--debezium-offsets` on the first start: the slot is Debezium's and must be there; a new
    /// one would start after events Debezium never delivered.
    Adopt,
}

/// `--slot-failover` checks, at start-up and on every reconnect: PostgreSQL 17+ (a definite error
/// before), and a warning when the primary's `synchronized_standby_slots` is empty: then a
/// synchronized copy of the slot may lag what we confirmed, and a standby promoted at that moment
/// has a slot behind our position (events sent again: duplicates), or not yet the slot at all.
pub async fn check_failover(client: &Client, cfg: &Config, version: &ServerVersion) -> Result<(), Error> {
    if !cfg.slot_failover {
        return Ok(());
    }
    if version.major() < 17 {
        return Err(Definite::Setup(format!(
            "--slot-failover needs PostgreSQL 17 or later (failover slots), but {} runs {}: remove --slot-failover \
             (slot.failover in --debezium-config) or upgrade the server",
            cfg.postgres, version.text
        ))
        .into());
    }
    let row = timed(
        "reading synchronized_standby_slots",
        client.query_one("SELECT coalesce(current_setting('synchronized_standby_slots', true), '')", &[]),
    )
    .await?;
    let slots: String = row.get(0);
    if slots.trim().is_empty() {
        tracing::warn!(
            slot = %cfg.slot,
            "--slot-failover: the primary's synchronized_standby_slots is empty, so the walsender may send us \
             changes before a standby's synchronized copy of the slot may move past them; after a failover \
             the promoted standby's slot can be behind what outboxd confirmed (events are sent again) or missing. \
             Set synchronized_standby_slots to the standbys' physical slot names (see docs/src/failover.md)"
        );
    }
    Ok(())
}

/// Find or create the pgoutput slot. Busy → [`Transient::SlotBusy`]; lost or foreign → definite.
pub async fn ensure_slot(client: &Client, cfg: &Config, missing: MissingSlot) -> Result<SlotState, Error> {
    let q = "SELECT plugin::text, slot_type, database::text, active_pid, wal_status, confirmed_flush_lsn::text \
             FROM pg_replication_slots WHERE slot_name = $1";
    let mut row = client.query_opt(q, &[&cfg.slot]).await.map_err(|e| db("reading pg_replication_slots", e))?;
    let mut created = false;
    if row.is_none() && missing == MissingSlot::Lost {
        return Err(Definite::Setup(format!(
            "replication slot {:?} is gone from {}, though this process streamed from it: it was lost, most likely in a \
             failover to a standby that did not have it synchronized yet. Events committed after the last confirmed \
             position may never have been sent, so outboxd stops instead of creating a new slot. Recover: republish \
             the outbox rows since the last event your consumers saw with `outboxd backfill`, then start outboxd with \
             --slot-recreate-after-loss (or create the slot yourself). To keep the slot across failovers use \
             --slot-failover on PostgreSQL 17+ (docs/src/failover.md)",
            cfg.slot, cfg.postgres
        ))
        .into());
    }
    if row.is_none() && missing == MissingSlot::Adopt {
        return Err(Definite::Setup(format!(
            "--debezium-offsets: replication slot {:?} does not exist on {}; outboxd takes over Debezium's own slot so \
             that nothing committed after Debezium's position is missed: set --slot (or the file's slot.name) to the slot \
             Debezium used, and keep slot.drop.on.stop=false when stopping Debezium",
            cfg.slot, cfg.postgres
        ))
        .into());
    }
    if row.is_none() {
        let create = if cfg.slot_failover {
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
        } else {
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"
        };
        match client.execute(create, &[&cfg.slot]).await {
            Ok(_) => {
                created = true;
                tracing::info!(slot = %cfg.slot, failover = cfg.slot_failover, "created logical replication slot (pgoutput)")
            }
            Err(e) if e.code() == Some(&SqlState::DUPLICATE_OBJECT) => {}
            Err(e) => {
                return Err(db(&format!("creating replication slot {:?} (the role needs REPLICATION)", cfg.slot), e))
            }
        }
        row = client.query_opt(q, &[&cfg.slot]).await.map_err(|e| db("reading pg_replication_slots", e))?;
    }
    let row =
        row.ok_or_else(|| Definite::Setup(format!("replication slot {:?} vanished right after creation", cfg.slot)))?;
    let plugin: Option<String> = row.get(0);
    let slot_type: String = row.get(1);
    let database: Option<String> = row.get(2);
    let active_pid: Option<i32> = row.get(3);
    let wal_status: Option<String> = row.get(4);
    let confirmed: Option<String> = row.get(5);
    if slot_type != "logical" || plugin.as_deref() != Some("pgoutput") {
        return Err(Definite::Setup(format!(
            "slot {:?} exists but is {slot_type} with plugin {}; outboxd needs a logical pgoutput slot: pick another --slot",
            cfg.slot,
            plugin.as_deref().unwrap_or("none")
        ))
        .into());
    }
    if database.as_deref() != Some(cfg.postgres.dbname.as_str()) {
        return Err(Definite::Setup(format!(
            "slot {:?} belongs to database {:?}, not {:?}: pick another --slot or connect to that database",
            cfg.slot,
            database.unwrap_or_default(),
            cfg.postgres.dbname
        ))
        .into());
    }
    if wal_status.as_deref() == Some("lost") {
        return Err(Definite::Setup(format!(
            "slot {:?} has wal_status 'lost': the WAL it needs was removed (max_slot_wal_keep_size), so events may be missing. \
             Reconcile the outbox by hand, then drop the slot and start again",
            cfg.slot
        ))
        .into());
    }
    if let Some(pid) = active_pid {
        return Err(Transient::SlotBusy { slot: cfg.slot.clone(), pid }.into());
    }
    let confirmed_flush = match confirmed {
        Some(s) => s.parse().map_err(|e| Definite::Setup(format!("slot {:?}: {e}", cfg.slot)))?,
        None => Lsn::ZERO,
    };
    let enable_failover = cfg.slot_failover && !created && {
        let row = timed(
            "reading the slot's failover flag",
            client.query_opt("SELECT failover FROM pg_replication_slots WHERE slot_name = $1", &[&cfg.slot]),
        )
        .await?;
        !row.is_some_and(|r| r.get::<_, bool>(0))
    };
    Ok(SlotState { confirmed_flush, created, enable_failover })
}

/// Whether the publication exists.
pub async fn publication_exists(client: &Client, name: &str) -> Result<bool, Error> {
    let row = client
        .query_opt("SELECT 1 FROM pg_publication WHERE pubname = $1", &[&name])
        .await
        .map_err(|e| db("reading pg_publication", e))?;
    Ok(row.is_some())
}

/// The slot's lag as the server sees it.
#[derive(Debug, Clone, Copy)]
pub struct SlotLag {
    /// `pg_current_wal_lsn() - confirmed_flush_lsn`.
    pub lag_bytes: i64,
    /// `safe_wal_size`, when `max_slot_wal_keep_size` limits the slot.
    pub safe_wal_size: Option<i64>,
}

pub async fn slot_lag(client: &Client, slot: &str) -> Result<Option<SlotLag>, Error> {
    let row = client
        .query_opt(
            "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::int8, safe_wal_size::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| db("reading the slot's lag", e))?;
    Ok(row.map(|r| SlotLag { lag_bytes: r.get::<_, Option<i64>>(0).unwrap_or(0), safe_wal_size: r.get(1) }))
}
