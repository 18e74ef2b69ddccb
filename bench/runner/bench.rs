//! The run's shared state: the settings, the binaries under test, the work directory, the
//! cluster, what currently stands on the far side of the readers, and what has been measured.
//!
//! Scenarios borrow it mutably one at a time. The far side is replaced, never reused across
//! scenarios: `new_broker` stops the previous Apache Kafka broker before starting a fresh one.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::broker::{Kafka, Listeners, Service};
use crate::cluster::Cluster;
use crate::knobs::Knobs;
use crate::report::Report;
use crate::tables::RawRow;

/// The binaries under test: the release outboxd and the bench examples next to this driver.
pub struct Tools {
    pub outboxd: PathBuf,
    pub examples: PathBuf,
}

impl Tools {
    /// This driver runs from `target/release/examples/`; outboxd is in `target/release/`.
    pub fn beside_driver() -> Result<Tools> {
        let exe = std::env::current_exe()?;
        let examples = exe.parent().context("driver has no directory")?.to_owned();
        let outboxd = examples.parent().context("examples dir has no parent")?.join("outboxd");
        Ok(Tools { outboxd, examples })
    }

    /// The cargo profile they were built with: the name of `target/<profile>/`.
    pub fn profile(&self) -> String {
        let dir = self.outboxd.parent().and_then(|d| d.file_name());
        dir.map_or_else(|| "?".to_owned(), |d| d.to_string_lossy().into_owned())
    }
}

/// What the readers' records go to.
#[derive(Default)]
pub struct Far {
    /// The scenario's Apache Kafka broker (in the tls scenario with a TLS listener too).
    pub kafka: Option<Kafka>,
    /// bench_webhook for the http drain row.
    pub webhook: Option<Service>,
    /// The exchange and queue name when RabbitMQ is set up for the drain.
    pub rabbit: Option<String>,
    /// The avro scenario's schema registry.
    pub registry: Option<crate::registry::Registry>,
}

pub struct Bench {
    pub knobs: Knobs,
    pub tools: Tools,
    pub work: PathBuf,
    pub pg: Cluster,
    pub far: Far,
    /// Brokers started so far (names their directories).
    pub brokers: usize,
    /// Every reader run of every drain-like scenario.
    pub raw: Vec<RawRow>,
    pub report: Report,
}

impl Bench {
    /// A fresh one-broker Apache Kafka for the next scenario (in `work/kafka-N`), the previous
    /// one stopped first.
    pub fn new_broker(&mut self, listeners: Listeners) -> Result<()> {
        if let Some(old) = self.far.kafka.take() {
            old.stop();
        }
        self.brokers += 1;
        let dir = self.work.join(format!("kafka-{}", self.brokers));
        println!("   starting Apache Kafka ({listeners:?} listeners) in {}", dir.display());
        self.far.kafka = Some(Kafka::start(&dir, listeners)?);
        Ok(())
    }

    /// The broker's plaintext port.
    pub fn kafka_port(&self) -> u16 {
        self.far.kafka.as_ref().map_or(0, |k| k.port)
    }

    pub fn http_batch(&self) -> u64 {
        self.knobs.http_batch
    }
}
