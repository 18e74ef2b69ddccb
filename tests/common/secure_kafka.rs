//! Client-side helpers for tests that reach Kafka with their own client settings (a listener with
//! TLS or SASL, a proxy in front of the broker): a client configuration from a bootstrap list and
//! properties, and a group consumer over it. The clusters themselves come from [`super::kafka`].

use std::time::Duration;

use rdkafka::config::ClientConfig;

use super::kafka::{consume_group, Consumed};

/// A client config for `bootstrap` plus `props` (IPv4, quiet librdkafka).
pub fn client_config(bootstrap: &str, props: &[(&str, &str)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap).set("broker.address.family", "v4").set("log_level", "3");
    for (k, v) in props {
        c.set(*k, *v);
    }
    c
}

/// Like `Broker::consume_all`, for any client configuration: read `topic` from the beginning as
/// a fresh consumer group until `min_count` records and a quiet second, or `timeout`.
pub fn consume_with(config: &ClientConfig, topic: &str, min_count: usize, timeout: Duration) -> Vec<Consumed> {
    consume_group(config.clone(), topic, min_count, timeout)
}
