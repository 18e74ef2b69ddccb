//! [`Registered`]: what each sink exports to the shared code besides [`Sink`], implemented in its
//! folder, and [`Probe`], what `outboxd check` does for it. The list that uses them is
//! [`super::registry`]; this file imports no sink, so every sink may import it.
//!
//! Invariant: the trait is static (no `dyn`): the registry calls `<T as Registered>::build` per
//! kind, and the sink built is held in an enum.

use std::sync::Arc;

use super::Sink;
use crate::config::Config;
use crate::error::Definite;
use crate::health::Health;

/// What a sink exports to the shared code besides [`Sink`]; implemented in its folder.
#[allow(async_fn_in_trait)]
pub(crate) trait Registered: Sink + Sized {
    /// Whether `outboxd dlq` reads back the dead letters this sink wrote (and so whether it may be
    /// `--dlq-sink`).
    const READABLE_DEAD_LETTERS: bool = false;

    /// Build the sink from the validated settings; it reports its connection to `health`. A sink
    /// may connect here (NATS and RabbitMQ do: a server that is down is waited for in the
    /// background, a refused login or bad settings are errors) or in the background.
    async fn build(cfg: &Config, health: Arc<Health>) -> Result<Self, Definite>;

    /// What `outboxd check` does to see that the destination is there.
    fn probe(cfg: &Config) -> Probe;
}

/// What `outboxd check` probes for a sink (`crate::tools::check`).
pub(crate) enum Probe {
    /// Nothing to reach; the line `outboxd check` shows instead.
    Nothing(&'static str),
    /// The Kafka cluster: metadata, the routed topics and the broker defaults.
    Kafka,
    /// A server that must accept a TCP connection (the login is not tried): the check's `name`,
    /// the URL as shown (masked) and the port of a URL that gives none.
    Tcp { name: &'static str, shown: String, url: String, default_port: u16 },
    /// A probe of the sink's own (an AWS API call), run by `outboxd check`.
    Run(std::pin::Pin<Box<dyn std::future::Future<Output = Verdict> + Send>>),
}

/// What a [`Probe::Run`] found: the check's name and its line, or what is wrong and the fix.
pub(crate) enum Verdict {
    Ok { name: &'static str, detail: String },
    Fail { name: &'static str, detail: String, fix: String },
}
