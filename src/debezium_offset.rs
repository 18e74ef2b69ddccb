//! `--debezium-offsets FILE`: where a stopped Debezium PostgreSQL connector got to, so that
//! outboxd, started on Debezium's own slot, sends neither less nor more than Debezium had not
//! delivered.
//!
//! The file is what Kafka Connect's REST API answers to `GET /connectors/NAME/offsets`
//! (`{"offsets": [{"partition": {"server": …}, "offset": {…}}]}`), or the bare offset object. Of
//! the offset, these keys matter (Debezium 2.x/3.x, `PostgresOffsetContext`):
//! * `lsn_commit`: the LSN of the last transaction Debezium processed completely: the position
//!   of its COMMIT message, which is that transaction's end LSN. Every transaction committed at or
//!   before it was delivered, so one whose commit record starts before it (`final_lsn < lsn_commit`)
//!   is skipped whole. Missing: Debezium falls back to `lsn_proc`, so do we.
//! * `messageType`, `txId`, `lsn_proc`: when the offset was stored in the middle of a transaction
//!   (a data change or logical message, not `COMMIT` or `BEGIN`), that transaction (`txId`,
//!   PostgreSQL's 32-bit xid) was delivered up to a change at `lsn_proc`, and the rest of it was
//!   not. The transaction is recognised by its xid, not by being the first one after
//!   `lsn_commit`, so a restart after outboxd confirmed it cannot mistake the next one for it.
//!   Several changes can share `lsn_proc` (a COPY logs a page's rows as one record), and the
//!   offset does not say how many of them were sent: Debezium 3.6.1 stores no count (no class of
//!   its PostgreSQL connector writes a key such as `lsn_events_processed`, so none is read), and
//!   the session decides them from the records on the topics
//!   (`source::wal::shared_lsn`).
//!
//! Invariant: [`DebeziumOffset::delivered`] only ever says yes for events Debezium's offsets
//! cover; anything it cannot decide (offsets of a snapshot in progress, two source partitions,
//! missing keys) is a start-up error, never a guess.

use std::path::Path;

use serde_json::Value;

use crate::error::Definite;
use crate::lsn::Lsn;

/// A Debezium PostgreSQL connector's committed source offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebeziumOffset {
    /// Transactions whose commit record starts before this were delivered whole.
    pub lsn_commit: Lsn,
    /// The transaction Debezium was in the middle of, if any.
    pub partial: Option<Partial>,
}

/// A transaction delivered up to a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partial {
    pub xid: u32,
    /// Changes at an LSN below this were delivered; at it, the first `events_at_proc`.
    pub lsn_proc: Lsn,
    /// How many changes at `lsn_proc` were delivered; 0: the offset does not say (Debezium's
    /// never does), and the records on the topics decide. An exactly-once position always counts.
    pub events_at_proc: u64,
}

impl DebeziumOffset {
    /// Read and check the file; every error names the file and the fix.
    pub fn load(path: &Path) -> Result<DebeziumOffset, Definite> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Definite::Config(format!("--debezium-offsets {}: cannot read it: {e}", path.display())))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            Definite::Config(format!(
                "--debezium-offsets {}: not JSON ({e}); save what `curl http://CONNECT:8083/connectors/NAME/offsets` prints",
                path.display()
            ))
        })?;
        DebeziumOffset::from_json(&v)
            .map_err(|m| Definite::Config(format!("--debezium-offsets {}: {m}", path.display())))
    }

    pub fn from_json(v: &Value) -> Result<DebeziumOffset, String> {
        let offset = match v.get("offsets") {
            Some(Value::Array(list)) => match list.as_slice() {
                [] => {
                    return Err("lists no offsets: Debezium committed none yet. Without offsets outboxd cannot tell what \
                                Debezium delivered; drop the flag to resend everything since the slot's confirmed position"
                        .into())
                }
                [one] => one.get("offset").ok_or("its entry has no \"offset\" object")?,
                more => {
                    return Err(format!(
                        "lists {} source partitions; a PostgreSQL connector has one: give the file of one connector",
                        more.len()
                    ))
                }
            },
            Some(_) => return Err("\"offsets\" is not a list".into()),
            None => v,
        };
        let Some(o) = offset.as_object() else { return Err("the offset is not a JSON object".into()) };
        if o.get("snapshot").is_some_and(|s| !matches!(s, Value::Bool(false) | Value::Null) && s != "false")
            && o.get("snapshot_completed") != Some(&Value::Bool(true))
        {
            return Err("was stored while Debezium was taking a snapshot; let the snapshot finish (or start \
                        outboxd with `outboxd backfill` for the old rows) and stop Debezium again"
                .into());
        }
        let lsn_proc = lsn(o.get("lsn_proc"), "lsn_proc")?;
        let lsn_commit = lsn(o.get("lsn_commit"), "lsn_commit")?.or(lsn_proc);
        let Some(lsn_commit) = lsn_commit else {
            return Err("has neither lsn_commit nor lsn_proc: is it a Debezium PostgreSQL connector's offset?".into());
        };
        let kind = o.get("messageType").and_then(Value::as_str).unwrap_or("COMMIT");
        let partial = match (kind, lsn_proc) {
            ("COMMIT" | "BEGIN", _) | (_, None) => None,
            (_, Some(lsn_proc)) => {
                let xid = o.get("txId").and_then(Value::as_u64).ok_or(
                    "was stored inside a transaction (messageType is not COMMIT) but has no txId: cannot tell which transaction",
                )?;
                Some(Partial { xid: xid as u32, lsn_proc, events_at_proc: 0 })
            }
        };
        Ok(DebeziumOffset { lsn_commit, partial })
    }
}

/// An LSN in an offset: Debezium stores a number; a `X/Y` string is taken too.
fn lsn(v: Option<&Value>, key: &str) -> Result<Option<Lsn>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(|n| Some(Lsn(n))).ok_or_else(|| format!("{key} {n} is not an LSN")),
        Some(Value::String(s)) => s
            .parse::<u64>()
            .map(Lsn)
            .or_else(|_| s.parse::<Lsn>())
            .map(Some)
            .map_err(|_| format!("{key} {s:?} is not an LSN")),
        Some(other) => Err(format!("{key} {other} is not an LSN")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_connects_rest_answer_and_the_bare_offset() {
        let rest = json!({"offsets": [{"partition": {"server": "app-pg"}, "offset": {
            "lsn_proc": 2000, "messageType": "INSERT", "lsn_commit": 1500, "lsn": 2000, "txId": 4294967297u64,
            "ts_usec": 1
        }}]});
        let o = DebeziumOffset::from_json(&rest).unwrap();
        assert_eq!(o.lsn_commit, Lsn(1500));
        assert_eq!(o.partial, Some(Partial { xid: 1, lsn_proc: Lsn(2000), events_at_proc: 0 }));
        let bare = json!({"lsn_proc": "0/7D0", "lsn_commit": 2500, "messageType": "COMMIT", "txId": 7,
            "lsn_events_processed": 3});
        assert_eq!(DebeziumOffset::from_json(&bare).unwrap(), DebeziumOffset { lsn_commit: Lsn(2500), partial: None });
        // No lsn_commit: Debezium takes lsn_proc.
        let old = json!({"lsn_proc": 900, "messageType": "INSERT", "txId": 5, "lsn_events_processed": 2});
        let o = DebeziumOffset::from_json(&old).unwrap();
        assert_eq!(o.lsn_commit, Lsn(900));
        // A count of the changes at lsn_proc is not Debezium's (no 3.6.1 class writes one): not read.
        assert_eq!(o.partial, Some(Partial { xid: 5, lsn_proc: Lsn(900), events_at_proc: 0 }));
    }

    #[test]
    fn what_cannot_be_decided_is_refused() {
        for (v, says) in [
            (json!({"offsets": []}), "committed none"),
            (json!({"offsets": [{"offset": {"lsn_commit": 1}}, {"offset": {"lsn_commit": 2}}]}), "2 source partitions"),
            (json!({"lsn_proc": 5, "lsn_commit": 5, "snapshot": "INITIAL", "last_snapshot_record": false}), "snapshot"),
            (json!({"ts_usec": 5}), "neither lsn_commit nor lsn_proc"),
            (json!({"lsn_proc": 5, "lsn_commit": 4, "messageType": "INSERT"}), "no txId"),
            (json!({"lsn_commit": "x"}), "lsn_commit \"x\" is not an LSN"),
            (json!([1]), "not a JSON object"),
        ] {
            let e = DebeziumOffset::from_json(&v).unwrap_err();
            assert!(e.contains(says), "{v}: {e}");
        }
        // A finished snapshot's offset is fine.
        let done = json!({"lsn_proc": 5, "lsn_commit": 5, "snapshot": "INITIAL", "snapshot_completed": true});
        assert!(DebeziumOffset::from_json(&done).is_ok());
    }
}
