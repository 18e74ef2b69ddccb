//! Where records come from. Each source reads its own way and hands routed records to the
//! [`crate::relay`], counting them in a ledger of its own:
//! * [`wal`]: `outboxd run`, a pgoutput replication session; its ledger is the LSN tracker, and
//!   the slot is confirmed only up to what the sink acked;
//! * [`poll`]: `outboxd poll`, batches claimed from the outbox table; its ledger is the batch's row
//!   fates, written back to the rows;
//! * [`backfill`]: `outboxd backfill`, pages of rows re-published; its ledger is a summary, and
//!   nothing is confirmed.
//!
//! No source reaches into another: what they share (routing and masking, the size check, the
//! bad-event policy, acks and budgets) is the relay's.

pub mod backfill;
pub mod poll;
pub mod wal;
