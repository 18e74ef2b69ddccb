//! The dead-letter record model, shared by everything that writes or reads a copy: the
//! `outboxd.*` header names, the size a record counts for, the copy itself ([`copy`]), its chunks
//! ([`chunk`]), a record as read back ([`record`]) and the event a reader makes of its records
//! ([`entry`]).
//!
//! It stands below the sinks' folders and above nothing of theirs but [`crate::sink::delivery`],
//! [`crate::sink::escape`] and [`crate::sink::moved`]: the relay's `--on-bad-event` policy, each
//! sink's dead-letter reader and writer (e.g. [`crate::sink::nats::dlq`]) and the `outboxd dlq`
//! tool all import it, and it imports none of them. Invariant: a header name is defined here
//! once; a reader strips every header with [`PREFIX`] on replay.

use bytes::Bytes;

use crate::error::Definite;

pub mod chunk;
pub mod copy;
pub mod entry;
pub mod held;
pub mod record;

pub use copy::{copy_part, DeadLetter};
pub use record::DlqRecord;

/// Header names of dead-letter records (and [`chunk`]'s). Replay strips every header with the
/// `outboxd.` prefix. `H_SIZE` only appears on copies written before chunking existed.
pub const H_ERROR: &str = "outboxd.error";
pub const H_MESSAGE: &str = "outboxd.error.message";
pub const H_TOPIC: &str = "outboxd.original.topic";
pub const H_LSN: &str = "outboxd.source.lsn";
/// In place of [`H_LSN`] on copies `outboxd poll` writes: the row's `--poll-field-seq` value.
pub const H_SEQ: &str = "outboxd.source.seq";
pub const H_TABLE: &str = "outboxd.source.table";
pub const H_SIZE: &str = "outboxd.payload.size";
/// On a copy whose payload was left out because the `--mask`/`--encrypt` rules could not be
/// applied to it (it would have leaked unmasked): why. Such a copy is not replayable.
pub const H_PAYLOAD_DROPPED: &str = "outboxd.payload.dropped";
/// Every header outboxd adds starts with it (defined beside the records, in the router).
pub use crate::router::HEADER_PREFIX as PREFIX;

/// Bytes a record occupies on the wire, near enough for the `message.max.bytes` check.
pub fn record_size(key: Option<&Bytes>, payload: Option<&Bytes>, headers: &[crate::router::Header]) -> usize {
    let h: usize = headers.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
    key.map_or(0, |k| k.len()) + payload.map_or(0, |p| p.len()) + h + 64
}

/// A dead-letter copy is never dead-lettered again: its refusal stops the relay with this error.
pub fn copy_refused(event_id: impl Into<String>, topic: impl Into<String>, reason: &str) -> Definite {
    Definite::Delivery {
        event_id: event_id.into(),
        topic: topic.into(),
        reason: format!("the dead-letter copy was refused: {reason}"),
    }
}
