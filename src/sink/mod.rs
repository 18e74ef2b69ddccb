//! Sinks: where routed records go.
//!
//! A sink takes a [`Record`] and its [`Delivery`] handle and must eventually resolve the handle:
//! `ack()` once the record is durably accepted, `reject()` when the destination refuses this record
//! for good, `fail()` when it can never be delivered. Dropping the handle counts as failure, so a
//! sink bug can stall the pipeline but never lose an event.
//!
//! `send` is a plain function, so it cannot wait on the destination (and the relay hands a record
//! over without building a future per record and per layer): a sink that cannot take a record yet (its topic is
//! being created, its client queue is full) keeps it, in order, and reports [`Sink::blocked`]. The
//! replication loop then reads no more WAL and polls [`Sink::unblock`] beside its acks, status timer
//! and shutdown, so a slow destination never silences the loop.
//!
//! A transactional sink (Kafka under `--delivery exactly-once`) acks records only when the
//! transaction holding them commits. The WAL session tells it where it is ([`Sink::boundary`]),
//! the relay calls [`Sink::commit`] when [`Sink::due`] says, and a session starts with
//! [`Sink::prepare`] (the committed position to skip to) and ends with [`Sink::abandon`].
//!
//! Each sink with settings of its own is a folder, `src/sink/<name>/`, holding everything it owns:
//! `mod.rs` (the [`Sink`] and its health: the `connected` gauge and `/readyz` through its
//! [`link::Link`]), `config.rs` (its validated settings, their defaults and masking), and, when
//! `outboxd dlq` can read its dead letters back, `dlq.rs` (the reader and the replay writer).
//! Besides its folder, a new sink is one line in the list of sinks, [`registry`], which makes
//! [`registry::SinkKind`], the enum the relay drives and its dispatch from it; what the shared
//! code needs of it (its builder, its `outboxd check` probe, whether `outboxd dlq` reads its dead
//! letters) its folder exports through [`registered::Registered`]. The config side still names
//! each sink's flag group: a field in [`crate::config::SinkArgs`], and its validation and
//! `outboxd config` lines in `config/sinks.rs`; a sink whose dead letters are read back also adds
//! its reader and replay client to `tools/dlq/sinks.rs` and `tools/dlq/tool.rs`.

pub mod acks;
mod any;
pub mod aws;
pub mod dead_letter;
pub mod delivery;
pub mod escape;
mod handoff;
pub(crate) mod http;
pub mod kafka;
pub(crate) mod kinesis;
pub mod link;
pub mod moved;
pub(crate) mod nats;
pub(crate) mod rabbitmq;
pub(crate) mod redis;
pub(crate) mod registered;
pub(crate) mod registry;
mod simple;
pub(crate) mod sns;
pub(crate) mod sqs;

pub use any::AnySink;
pub use http::HttpSink;
pub use kafka::KafkaSink;
pub use nats::NatsSink;
pub use rabbitmq::RabbitSink;
pub use redis::RedisSink;
pub use simple::{record_json, NullSink, StdoutSink};

use crate::debezium_offset::DebeziumOffset;
use crate::error::{Definite, Error};
use crate::lineage::Lineage;
use crate::lsn::Lsn;
use crate::router::Record;
use delivery::Delivery;
use escape::Limits;

/// Why `send` did not take a record.
#[derive(Debug)]
pub enum SinkError {
    /// The destination refused this record for good; the record and its unresolved handle come
    /// back for the bad-event policy.
    Rejected { code: &'static str, reason: String, record: Box<Record>, delivery: Delivery },
    /// The sink cannot go on.
    Fatal(Definite),
    /// The session cannot go on, and the next one may (an aborted Kafka transaction, fencing).
    Transient(crate::error::Transient),
}

/// Where the WAL session is in the stream, for a sink that commits in transactions
/// ([`Sink::boundary`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundary {
    /// A PostgreSQL transaction begins; its commit record is at `final_lsn`.
    Begin { final_lsn: Lsn, xid: u32 },
    /// A change of the open transaction at `at` (before its record, if any, is sent).
    Change { at: Lsn },
    /// The open PostgreSQL transaction committed.
    Commit,
    /// A logical message decoded outside any transaction, at `at`, was handled (its dead-letter
    /// copy, if any, sent): a position stored from now on covers it.
    Standalone { at: Lsn },
}

#[allow(async_fn_in_trait)]
pub trait Sink {
    /// Hand one record over without waiting (a sink that cannot take it yet holds it and reports
    /// [`Sink::blocked`]). Ordering: records sent to the same topic and key keep send order.
    #[allow(clippy::result_large_err)] // a rejection hands the record back; the rare path
    fn send(&mut self, record: Record, delivery: Delivery) -> Result<(), SinkError>;

    /// True while the sink holds records it could not hand over yet.
    fn blocked(&self) -> bool {
        false
    }

    /// True while a step runs in the background that the reading need not wait for, but whose end
    /// [`Sink::unblock`] must handle: an exactly-once commit, during which sent records are held.
    fn settling(&self) -> bool {
        false
    }

    /// Make progress on held records (or finish what [`Sink::settling`] says runs); returns after
    /// one step, to be called again while [`Sink::blocked`] or [`Sink::settling`]. Must be
    /// cancel-safe: dropping the future loses no record.
    async fn unblock(&mut self) -> Result<(), SinkError> {
        std::future::pending().await
    }

    /// The session ended: drop the records still held (their handles fail on drop). The next
    /// session reads them from WAL again, under its own transaction ids.
    fn discard_held(&mut self) {}

    /// The largest record the destination takes, if it has a limit.
    fn max_message_bytes(&self) -> Option<usize> {
        None
    }

    /// The largest dead-letter record it takes (copies over it are chunked): the same, unless
    /// dead letters go elsewhere (`--dlq-sink`).
    fn dead_letter_max_bytes(&self) -> Option<usize> {
        self.max_message_bytes()
    }

    /// What the destination carries in a dead-letter copy as it is; the rest is escaped
    /// ([`crate::sink::escape`]).
    fn copy_limits(&self) -> Limits {
        Limits::ANY
    }

    /// The limits dead-letter copies are made under: the same, unless dead letters go elsewhere
    /// (`--dlq-sink`).
    fn dead_letter_limits(&self) -> Limits {
        self.copy_limits()
    }

    /// Exactly-once: called at the start of every session, before the first record, with the
    /// server's WAL history now. Returns the part of the position committed with the records
    /// that holds on that history (a Debezium-shaped offset: the transactions and changes at or
    /// before it were delivered; [`crate::lineage`]), which the session skips.
    async fn prepare(&mut self, _lineage: &Lineage) -> Result<Option<DebeziumOffset>, Error> {
        Ok(None)
    }

    /// `--debezium-offsets`: for each record, whether one with its event id is already on its
    /// topic (Debezium's records of the changes sharing the offset's LSN). Only a sink that can
    /// read where Debezium wrote answers.
    async fn already_written(&mut self, records: &[&Record]) -> Result<Vec<bool>, Error> {
        Err(Definite::Setup(format!(
            "--debezium-offsets: {} changes share the LSN of Debezium's offset, and only reading Debezium's records \
             back from Kafka tells which of them it sent: take over with the Kafka sink",
            records.len()
        ))
        .into())
    }

    /// Exactly-once: where the WAL session is (see [`Boundary`]).
    fn boundary(&mut self, _b: Boundary) {}

    /// Exactly-once: when the sink wants [`Sink::commit`] called (its open transaction is due).
    fn due(&self) -> Option<tokio::time::Instant> {
        None
    }

    /// Exactly-once: commit the open transaction if it is due and at a point it may end; its
    /// records are acked once Kafka committed them.
    async fn commit(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Exactly-once: the session reads no more (shutdown). The open transaction may then commit
    /// at the last whole change, inside a PostgreSQL transaction, instead of waiting for that
    /// transaction's end, which will not be read.
    fn finishing(&mut self) {}

    /// The session ended: abort what is open (exactly-once), after [`Sink::discard_held`].
    async fn abandon(&mut self) {}

    /// Fires when a task the sink depends on ended (see [`crate::task`]): the loop driving the
    /// sink waits on it and stops with its error. `None`: no such task.
    fn failure(&self) -> Option<crate::task::Failure> {
        None
    }
}
