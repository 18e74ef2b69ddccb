//! `outboxd inbox`: the other half of the outbox pattern. Records of Kafka topics go into an
//! inbox table of the consumer's PostgreSQL (sql/08_inbox.sql), each event once, and the
//! consumer's workers take them from there in order per key (`inbox_claim`).
//!
//! ```text
//!  Kafka ──► consumer thread ──(bounded channel)──► writer ──► PostgreSQL
//!            rebalance: asks the      ▲               one statement per batch:
//!            writer where each        └── offsets ──  rows ON CONFLICT DO NOTHING
//!            partition starts                         + each partition's next offset
//! ```
//!
//! The guarantee, and why it holds:
//! * **Nothing lost.** A partition starts at the next offset stored in PostgreSQL, which moves
//!   only in the transaction that stores the records before it. So whatever ends the process
//!   (kill -9, a PostgreSQL restart, a broker failure, a rebalance), the records after the last
//!   commit are read again. Kafka's own group offsets are never read, but for a partition
//!   PostgreSQL has no offset of under `--start-from committed` (a migration), and that start is
//!   stored before anything is fetched.
//! * **Nothing twice.** `event_id` is unique and rows go in with `ON CONFLICT DO NOTHING`, so a
//!   record read again, or sent twice by an at-least-once producer, is one row.
//! * **Order per key.** A key lives in one partition, read in order by one consumer of the
//!   group, and its rows are numbered (`seq`) in that order.
//! * **Read committed.** `isolation.level=read_committed`: a transactional producer's aborted
//!   records (outboxd run --delivery exactly-once) never reach the table.
//!
//! * `consumer.rs`: the Kafka consumer's thread and its rebalance callback;
//! * `writer.rs`: batches, the retry while PostgreSQL is away, the answers to rebalances
//!   (`batch.rs`: the batch in hand and its bounds; `chores.rs`: the backlog gauges and `--retain`,
//!   on a connection of their own);
//! * `store.rs`: the SQL (schema, offsets, the batch statement);
//! * `record.rs`: a record into a row (the event id, the jsonb payload, the headers);
//! * `dead.rs`: bad records' copies on the dead-letter topic, which `outboxd dlq` reads;
//! * `beat.rs`: the consumer thread's heartbeat, which `/healthz` needs beside the writer's;
//! * `decode.rs`: `--value-format avro|protobuf|json-schema`, values decoded to JSON by the
//!   registry's schemas (`avro_walk.rs`: an Avro datum checked whole and of bounded depth first);
//! * `lag.rs`: the lag gauges per partition (Kafka's end against the offsets stored), on a thread
//!   of their own that asks Kafka for the ends, so they move while the writer waits;
//! * `commit.rs`: `--commit-kafka-offsets`, the stored offsets copied to the group in Kafka for
//!   lag tools (never read back);
//! * the status page is [`crate::status::inbox`]'s: the writer and the consumer write its board.

mod avro_walk;
mod batch;

/// A partition: topic and number (the consumer, the writer, the batch and the Kafka commits all
/// name partitions so; defined here so none of them imports another for it).
pub type Part = (String, i32);

mod beat;
mod chores;
mod commit;
mod consumer;
mod dead;
mod decode;
mod lag;
pub mod record;
pub mod store;
mod writer;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::inbox::InboxConfig;
use crate::error::{Definite, Error};
use crate::health::Health;

/// Run until `shutdown`: serve the probes, prepare the schema, consume and write. Returns the exit
/// code (0 after a clean shutdown).
pub async fn run(cfg: InboxConfig, shutdown: CancellationToken) -> Result<u8, Error> {
    // /healthz: the writer ticks every second while the consumer thread turns too (`beat`).
    let health = Health::new(cfg.health_stall_timeout);
    let beat = std::sync::Arc::new(beat::Beat::new());
    if let Some(addr) = cfg.metrics_addr {
        let bound = crate::serve::serve_inbox(addr, health.clone(), facts(&cfg), access(&cfg)).await?;
        tracing::info!(%bound, "serving /metrics, /healthz, /readyz and the status page (/ and /status.json)");
    }
    let mut writer = writer::Writer::new(cfg.clone(), health.clone(), beat.clone())?;
    // The schema must be there before the first assignment asks for offsets; a transient failure
    // waits for PostgreSQL like any later one.
    let mut attempt = 0;
    loop {
        match writer.prepare().await {
            Ok(()) => break,
            Err(Error::Transient(e)) => {
                tracing::warn!("PostgreSQL not reachable yet: {e}; retrying");
                let wait = crate::retry::backoff(attempt, cfg.reconnect_max_backoff);
                attempt += 1;
                // Waiting for PostgreSQL is readiness, not a wedge: /healthz stays 200 meanwhile.
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(0),
                    _ = health.ticking(tokio::time::sleep(wait)) => {}
                }
            }
            Err(e) => return Err(e),
        }
    }
    // About four batches of records in chunks (at most `CHUNK` records each) between the threads.
    let (tx, mut rx) = mpsc::channel(cfg.batch_size.saturating_mul(4).div_ceil(consumer::CHUNK).max(4));
    let running = consumer::start(&cfg, tx, beat, writer.commits(), health.clone(), writer.lag())?;
    tracing::info!(group = %cfg.group, table = %format!("{}.{}", cfg.schema, cfg.table), "inbox consuming");
    if cfg.event_id_header != "id" {
        tracing::info!(
            "event ids: the `id` header first, then `{}`, then TOPIC/PARTITION/OFFSET; a record carrying both \
             headers is stored under its `id` (--event-id-header)",
            cfg.event_id_header
        );
    }
    let outcome = writer.run(&mut rx, &shutdown).await;
    // Let the consumer go: it leaves the group, and its revocation is answered until it is gone.
    running.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    while let Some(input) = rx.recv().await {
        if let consumer::Input::Revoke(_, reply) = input {
            let _ = reply.send(());
        }
    }
    let joined = tokio::task::spawn_blocking(move || running.thread.join()).await;
    if !matches!(joined, Ok(Ok(()))) {
        return Err(Definite::TaskEnded { task: "the Kafka consumer thread".into(), how: "it panicked".into() }.into());
    }
    outcome.map(|()| 0)
}

/// Who may read the status page: `--status-page-token-file`, `--status-page-allowed-hosts`.
fn access(cfg: &InboxConfig) -> crate::status::inbox::Access {
    crate::status::inbox::Access {
        token: cfg.status_page_token.clone(),
        allowed_hosts: cfg.status_page_allowed_hosts.clone(),
    }
}

/// What the status page shows of this inbox's configuration (the server in its masked form).
fn facts(cfg: &InboxConfig) -> crate::status::inbox::InboxFacts {
    use crate::config::inbox::Subscription;
    crate::status::inbox::InboxFacts {
        group: cfg.group.clone(),
        table: format!("{}.{}", cfg.schema, cfg.table),
        topics: match &cfg.subscription {
            Subscription::Topics(t) => t.join(", "),
            Subscription::Pattern(p) => format!("pattern {p}"),
        },
        server: cfg.postgres.to_string(),
        dead_letter_topic: cfg.dlq_topic.clone(),
        batch_size: cfg.batch_size as u64,
    }
}
