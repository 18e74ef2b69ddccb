//! Every Kafka client outboxd makes, built from one [`KafkaConfig`].
//!
//! This module owns:
//! * keeping secret values (which keys are secrets is [`is_secret`], in `config/kafka.rs` with the
//!   reading of the properties) out of every message we make from a librdkafka error ([`create`],
//!   [`scrub`]);
//! * the three client configs: [`producer_config`] (our defaults, then every property),
//!   [`admin_config`] and [`consumer_config`] (the same connection and security settings, with
//!   producer-only properties left out, since librdkafka warns about and ignores them, and an
//!   admin client must never start an idempotent or transactional producer session);
//! * the one [`ensure_topic`]: create a topic through the admin API, since many clusters disable
//!   auto-creation, retrying while the broker is unreachable.

use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;

use super::config::KafkaConfig;
pub use super::config::{is_secret, parse_property_flags, read_property_file, shown};
use crate::error::Definite;
pub use crate::secret::MASK;

/// `message` with the value of every secret property replaced by [`MASK`]. Values shorter than
/// four characters are left alone: replacing them would garble the message and hardly reveals more.
pub fn scrub(message: &str, props: &[(String, String)]) -> String {
    let mut out = message.to_owned();
    for (k, v) in props {
        if is_secret(k) && v.len() >= 4 {
            out = out.replace(v.as_str(), MASK);
        }
    }
    out
}

/// The file's properties, then the flags'.
pub fn load_properties(file: Option<&Path>, flags: &[String]) -> Result<Vec<(String, String)>, Definite> {
    let mut out = match file {
        Some(p) => read_property_file(p)?,
        None => Vec::new(),
    };
    out.extend(parse_property_flags(flags)?);
    Ok(out)
}

/// Properties that configure only librdkafka's producer; an admin client or consumer gets none.
const PRODUCER_ONLY: &[&str] = &[
    "transactional.id",
    "transaction.timeout.ms",
    "enable.idempotence",
    "enable.gapless.guarantee",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.ms",
    "linger.ms",
    "message.send.max.retries",
    "retries",
    "queue.buffering.backpressure.threshold",
    "compression.codec",
    "compression.type",
    "compression.level",
    "batch.num.messages",
    "batch.size",
    "delivery.report.only.error",
    "sticky.partitioning.linger.ms",
    "request.required.acks",
    "acks",
    "request.timeout.ms",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "queuing.strategy",
    "produce.offset.report",
    "partitioner",
    "message.max.bytes.producer",
];

/// The partitioner of every outboxd producer: librdkafka's Java-compatible one (murmur2 of the
/// key bytes, as Kafka's Java producer, Kafka Connect and so Debezium place records), so a key
/// lands in the same partition whichever of them wrote it: a switch from Debezium keeps each
/// key's order, and `dlq replay` puts an event back in its key's partition. librdkafka's own
/// default, `consistent_random` (CRC32), places keys elsewhere.
const PARTITIONER: &str = "murmur2_random";

fn is_producer_only(k: &str) -> bool {
    PRODUCER_ONLY.contains(&k)
}

fn base(cfg: &KafkaConfig, client_id: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.brokers).set("client.id", client_id);
    c
}

/// A producer: the [`PARTITIONER`], `defaults` (ours), then every user property.
pub fn producer_config(cfg: &KafkaConfig, client_id: &str, defaults: &[(&str, String)]) -> ClientConfig {
    let mut c = base(cfg, client_id);
    c.set("partitioner", PARTITIONER);
    for (k, v) in defaults {
        c.set(*k, v);
    }
    for (k, v) in &cfg.properties {
        c.set(k, v);
    }
    c
}

/// An admin client: connection and security settings, no producer-only properties.
pub fn admin_config(cfg: &KafkaConfig, client_id: &str) -> ClientConfig {
    consumer_config(cfg, client_id, &[])
}

/// A consumer (or, without defaults, an admin client): `defaults` (ours), then the user's
/// properties minus producer-only ones.
pub fn consumer_config(cfg: &KafkaConfig, client_id: &str, defaults: &[(&str, String)]) -> ClientConfig {
    let mut c = base(cfg, client_id);
    for (k, v) in defaults {
        c.set(*k, v);
    }
    for (k, v) in cfg.properties.iter().filter(|(k, _)| !is_producer_only(k)) {
        c.set(k, v);
    }
    c
}

/// Turn a client creation error into a one-line config error without secret values. librdkafka
/// echoes the offending value (`Invalid value "…" for configuration property "…"`), so a refused
/// secret is named by key only.
pub fn config_error(e: &KafkaError, what: &str, cfg: &KafkaConfig) -> Definite {
    let detail = match e {
        KafkaError::ClientConfig(_, _, key, _) if is_secret(key) => {
            format!("librdkafka refused the value of {key} (not shown)")
        }
        KafkaError::ClientConfig(_, desc, _, _) => desc.clone(),
        other => other.to_string(),
    };
    let detail = scrub(&detail, &cfg.properties);
    Definite::Config(format!(
        "Kafka {what} config rejected: {detail}; check --kafka-property / --kafka-property-file values"
    ))
}

/// Create a client of any kind from `c`, with [`config_error`] on failure.
pub fn create<T, C>(c: &ClientConfig, context: C, what: &str, cfg: &KafkaConfig) -> Result<T, Definite>
where
    C: ClientContext,
    T: rdkafka::config::FromClientConfigAndContext<C>,
{
    c.create_with_context(context).map_err(|e| config_error(&e, what, cfg))
}

/// How long [`ensure_topic`] keeps retrying while the broker does not answer.
#[derive(Debug, Clone, Copy)]
pub enum Retry {
    /// The pipeline: a broker outage stalls it, it does not fail it.
    Forever,
    /// A one-shot tool: give up after this long.
    For(Duration),
}

/// Why a topic could not be made ready.
#[derive(Debug)]
pub struct TopicError {
    /// Set when the broker refused this one topic for good (invalid name, authorization, policy):
    /// the records meant for it are bad events, not a reason to stop. `None`: the cluster itself
    /// is the problem (sizes it cannot take, cluster authorization, gave up retrying).
    pub refused: Option<&'static str>,
    pub error: Definite,
}

impl std::fmt::Display for TopicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

/// Create `topic` with `partitions` and `replication` (`-1` each: the broker's defaults, falling
/// back to 1 and 1 when the broker does not take defaults). An existing topic is success. Errors
/// that retrying cannot cure (invalid name or sizes, authorization) fail at once; others are
/// retried per `retry`. Returns whether this call created the topic.
pub async fn ensure_topic<C: ClientContext + 'static>(
    admin: &AdminClient<C>,
    topic: &str,
    partitions: i32,
    replication: i32,
    retry: Retry,
    props: &[(String, String)],
) -> Result<bool, TopicError> {
    ensure_topic_with(admin, topic, partitions, replication, &[], retry, props).await
}

/// [`ensure_topic`] with topic `configs` for a topic it creates (an existing topic keeps its own).
pub async fn ensure_topic_with<C: ClientContext + 'static>(
    admin: &AdminClient<C>,
    topic: &str,
    partitions: i32,
    replication: i32,
    configs: &[(&str, &str)],
    retry: Retry,
    props: &[(String, String)],
) -> Result<bool, TopicError> {
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(15)));
    let give_up = match retry {
        Retry::Forever => None,
        Retry::For(d) => Some(Instant::now() + d),
    };
    let fail = |why: String, refused: Option<&'static str>| {
        TopicError {
        refused,
        error: Definite::Sink(format!(
            "cannot create topic {topic:?}: {why}; create it yourself or fix --topic-partitions/--topic-replication-factor"
        )),
    }
    };
    let mut sizes = (partitions, replication);
    let mut backoff = Duration::from_millis(200);
    loop {
        let new = configs
            .iter()
            .fold(NewTopic::new(topic, sizes.0, TopicReplication::Fixed(sizes.1)), |t, (k, v)| t.set(k, v));
        let last_error = match admin.create_topics([&new], &opts).await {
            Ok(results) => match results.into_iter().next() {
                Some(Ok(_)) => {
                    tracing::info!(topic, partitions = sizes.0, "created topic");
                    return Ok(true);
                }
                Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => return Ok(false),
                None => return Err(fail("the broker gave no answer".into(), None)),
                Some(Err((
                    _,
                    RDKafkaErrorCode::InvalidPartitions
                    | RDKafkaErrorCode::InvalidReplicationFactor
                    | RDKafkaErrorCode::InvalidRequest
                    | RDKafkaErrorCode::UnsupportedVersion,
                ))) if sizes == (-1, -1) => {
                    sizes = (1, 1);
                    continue;
                }
                Some(Err((_, code @ RDKafkaErrorCode::InvalidTopic))) => {
                    return Err(fail(code.to_string(), Some("invalid_topic")))
                }
                Some(Err((_, code @ RDKafkaErrorCode::TopicAuthorizationFailed))) => {
                    return Err(fail(code.to_string(), Some("topic_authorization_failed")))
                }
                Some(Err((_, code @ RDKafkaErrorCode::PolicyViolation))) => {
                    return Err(fail(code.to_string(), Some("policy_violation")))
                }
                Some(Err((
                    _,
                    code @ (RDKafkaErrorCode::InvalidPartitions
                    | RDKafkaErrorCode::InvalidReplicationFactor
                    | RDKafkaErrorCode::ClusterAuthorizationFailed),
                ))) => return Err(fail(code.to_string(), None)),
                Some(Err((_, code))) => {
                    tracing::warn!(topic, %code, "topic creation failed; retrying");
                    code.to_string()
                }
            },
            Err(e) => {
                let e = scrub(&e.to_string(), props);
                tracing::warn!(topic, error = %e, "Kafka admin request failed; retrying (broker unreachable?)");
                e
            }
        };
        if give_up.is_some_and(|t| Instant::now() + backoff > t) {
            return Err(fail(format!("{last_error} (gave up retrying; is --kafka-brokers reachable?)"), None));
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(props: &[(&str, &str)]) -> KafkaConfig {
        KafkaConfig {
            brokers: "h:1".into(),
            properties: props.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            property_file: None,
            topic_partitions: 1,
            topic_replication_factor: 1,
            transactions: None,
        }
    }

    #[test]
    fn secret_keys() {
        for k in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "ssl_key",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "sasl.jaas.config",
            "SASL.PASSWORD",
            "my.custom.token",
            "ssl.truststore.password",
        ] {
            assert!(is_secret(k), "{k}");
        }
        for k in [
            "sasl.username",
            "security.protocol",
            "ssl.ca.location",
            "ssl.key.location",
            "sasl.oauthbearer.token.endpoint.url",
            "sasl.oauthbearer.client.id",
            "linger.ms",
        ] {
            assert!(!is_secret(k), "{k}");
        }
        assert_eq!(shown("sasl.password", "hunter22"), MASK);
        assert_eq!(shown("sasl.username", "alice"), "alice");
    }

    #[test]
    fn scrub_removes_secret_values_only() {
        let props = vec![("sasl.password".to_owned(), "hunter22".to_owned()), ("sasl.username".into(), "alice".into())];
        assert_eq!(scrub("alice failed with hunter22", &props), "alice failed with ****");
    }

    #[test]
    fn librdkafka_config_errors_never_echo_secrets() {
        let c = cfg(&[("sasl.password", "hunter22"), ("security.protocol", "BOGUS")]);
        let e = create::<rdkafka::producer::BaseProducer, _>(
            &producer_config(&c, "t", &[]),
            rdkafka::producer::DefaultProducerContext,
            "producer",
            &c,
        )
        .err()
        .expect("BOGUS protocol is refused")
        .to_string();
        assert!(!e.contains("hunter22") && e.contains("security.protocol") && !e.contains('\n'), "{e}");
        // A refused secret itself: librdkafka would echo it.
        let c = cfg(&[("ssl.key.password", "hunter22"), ("ssl.key.password.bogus", "x")]);
        let e = create::<rdkafka::producer::BaseProducer, _>(
            &producer_config(&c, "t", &[]),
            rdkafka::producer::DefaultProducerContext,
            "producer",
            &c,
        )
        .err()
        .expect("unknown property is refused")
        .to_string();
        assert!(!e.contains("hunter22"), "{e}");
        let err = config_error(
            &KafkaError::ClientConfig(
                rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
                "Invalid value \"hunter22\" for configuration property \"sasl.password\"".into(),
                "sasl.password".into(),
                "hunter22".into(),
            ),
            "producer",
            &c,
        )
        .to_string();
        assert!(!err.contains("hunter22") && err.contains("sasl.password"), "{err}");
    }

    #[test]
    fn admin_and_consumer_get_no_producer_only_properties() {
        let c = cfg(&[("security.protocol", "ssl"), ("linger.ms", "9"), ("compression.type", "zstd"), ("acks", "1")]);
        let p = producer_config(&c, "p", &[("acks", "all".into())]);
        assert_eq!(p.get("acks"), Some("1"), "user properties win over defaults");
        assert_eq!(p.get("partitioner"), Some("murmur2_random"), "Java-compatible placement");
        assert_eq!(p.get("compression.type"), Some("zstd"));
        for a in [admin_config(&c, "a"), consumer_config(&c, "c", &[("group.id", "g".into())])] {
            assert_eq!(a.get("security.protocol"), Some("ssl"));
            assert_eq!(a.get("bootstrap.servers"), Some("h:1"));
            assert!(a.get("linger.ms").is_none() && a.get("compression.type").is_none() && a.get("acks").is_none());
        }
    }

    #[test]
    fn property_flags_and_file() {
        assert_eq!(
            parse_property_flags(&["linger.ms=5".into(), " a =b=c".into()]).unwrap(),
            vec![("linger.ms".into(), "5".into()), ("a".into(), "b=c".into())]
        );
        for bad in ["nope", "=hunter22", "bootstrap.servers=h:1"] {
            let e = parse_property_flags(&[bad.into()]).unwrap_err().to_string();
            assert!(e.contains("--kafka-property") && !e.contains('\n') && !e.contains("hunter22"), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("client.properties");
        std::fs::write(&f, "# creds\nsecurity.protocol = SASL_SSL\nsasl.password: hunter22\nlinger.ms=1\n").unwrap();
        let props = load_properties(Some(&f), &["linger.ms=7".into()]).unwrap();
        assert_eq!(props.first().unwrap(), &("security.protocol".to_owned(), "SASL_SSL".to_owned()));
        assert_eq!(props.last().unwrap(), &("linger.ms".to_owned(), "7".to_owned()), "flags come after the file");
        std::fs::write(&f, "a=1\nbootstrap.servers=h:1\n").unwrap();
        let e = read_property_file(&f).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("--kafka-brokers") && e.contains("client.properties"), "{e}");
        std::fs::write(&f, "a=1\nsasl.password\n").unwrap();
        let e = read_property_file(&f).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("sasl.password=VALUE"), "{e}");
        let e = read_property_file(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(e.contains("missing") && e.contains("cannot read"), "{e}");
    }
}
