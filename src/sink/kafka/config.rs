//! Kafka's flags and settings: the clap groups ([`KafkaClientArgs`], shared with the `dlq` and
//! `shadow` tools; [`KafkaArgs`] for the sink; [`DeliveryArgs`], `outboxd run`'s exactly-once)
//! and how outboxd reaches Kafka: brokers plus librdkafka properties merged from `--debezium-config`,
//! `--kafka-property-file` and `--kafka-property`, in that order (a later key wins).
//!
//! Also owns reading the user's librdkafka properties (`--kafka-property-file` first, then each
//! `--kafka-property KEY=VALUE`, later wins as librdkafka applies them in order, with
//! `bootstrap.servers` refused in both: [`parse_property_flags`], [`read_property_file`]) and which
//! keys are secrets ([`is_secret`]). Secrets live in the properties; `Debug` and `outboxd config`
//! show them masked ([`shown`]).

use std::path::{Path, PathBuf};

use crate::error::Definite;
use crate::properties;

use crate::secret::MASK;

/// What a consumer sees of each committed outbox event (`--delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeliveryMode {
    /// Every event at least once; a crash or reconnect may repeat the events after the last
    /// confirmed transaction.
    AtLeastOnce,
    /// Every event exactly once to consumers that read with `isolation.level=read_committed`:
    /// records are written in Kafka transactions with outboxd's position (Kafka sink only).
    ExactlyOnce,
}

/// Whether a librdkafka (or Java client) property holds a secret: its value is never printed.
pub fn is_secret(key: &str) -> bool {
    let k = key.trim().to_ascii_lowercase();
    // A token endpoint is a public URL; everything else naming a token is a credential.
    if k.ends_with("token.endpoint.url") {
        return false;
    }
    const EXACT: &[&str] = &[
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.truststore.password",
        "ssl.key.pem",
        "ssl_key",
        "ssl.keystore.key",
        "sasl.oauthbearer.config",
        "sasl.jaas.config",
        "sasl.oauthbearer.assertion.private.key.pem",
    ];
    EXACT.contains(&k.as_str())
        || ["password", "secret", "token", "passphrase", "credential", "jaas", "private.key"]
            .iter()
            .any(|w| k.contains(w))
}

/// `value`, or [`MASK`] when `key` is secret.
pub fn shown<'a>(key: &str, value: &'a str) -> &'a str {
    if is_secret(key) {
        MASK
    } else {
        value
    }
}

/// `--kafka-property KEY=VALUE` flags as pairs; keys trimmed, values kept as given.
pub fn parse_property_flags(raw: &[String]) -> Result<Vec<(String, String)>, Definite> {
    raw.iter()
        .map(|p| {
            let Some((k, v)) = p.split_once('=').filter(|(k, _)| !k.trim().is_empty()) else {
                // Show the text only when it cannot hold a value.
                let what = if p.contains('=') { "a flag with an empty key".to_owned() } else { format!("{p:?}") };
                return Err(Definite::Config(format!(
                    "--kafka-property {what}: expected KEY=VALUE, e.g. security.protocol=ssl"
                )));
            };
            let k = k.trim();
            check_key(k, "--kafka-property")?;
            Ok((k.to_owned(), v.to_owned()))
        })
        .collect()
}

fn check_key(k: &str, origin: &str) -> Result<(), Definite> {
    if k == "bootstrap.servers" || k == "metadata.broker.list" {
        return Err(Definite::Config(format!("{origin}: {k} conflicts with --kafka-brokers; use --kafka-brokers")));
    }
    Ok(())
}

/// A `--kafka-property-file` as pairs, in file order.
pub fn read_property_file(path: &Path) -> Result<Vec<(String, String)>, Definite> {
    let flag = format!("--kafka-property-file {}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| {
        Definite::Config(format!(
            "{flag}: cannot read it ({e}); give a readable Java .properties file of key=value lines"
        ))
    })?;
    let entries =
        properties::parse(&text).map_err(|e| Definite::Config(format!("{flag} line {}: {}", e.line, e.why)))?;
    entries
        .into_iter()
        .map(|e| {
            check_key(e.key.trim(), &format!("{flag} line {}", e.line))?;
            Ok((e.key, e.value))
        })
        .collect()
}

/// How to reach Kafka; every client is built from it (by `sink/kafka/client.rs`).
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    pub brokers: String,
    /// Passed to librdkafka as given, after our defaults: those from `--debezium-config`, then
    /// `--kafka-property-file`, then `--kafka-property` (a later key wins).
    pub properties: Vec<(String, String)>,
    /// Which of `properties` came from `--kafka-property-file`, so `outboxd config` names the file.
    pub property_file: Option<PropertyFile>,
    /// Partitions of topics outboxd creates; `-1`: the broker's default (`dlq` tools).
    pub topic_partitions: i32,
    /// Replication factor of topics outboxd creates; `-1`: the broker's default.
    pub topic_replication_factor: i32,
    /// `--delivery exactly-once`: the producer is transactional.
    pub transactions: Option<TxnConfig>,
}

/// The exactly-once settings of the Kafka sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnConfig {
    /// The database's system identifier: known only once PostgreSQL answered, so `run` fills it
    /// in ([`TxnConfig::identify`]) before the sink is built.
    pub system_id: String,
    pub slot: String,
    pub position_topic: String,
    /// `--transaction-interval`.
    pub interval: std::time::Duration,
}

impl TxnConfig {
    /// Name the producer after the database (its system identifier) and the slot.
    pub fn identify(&mut self, system_id: &str) {
        self.system_id = system_id.to_owned();
    }

    /// `transactional.id`: `outboxd-<system identifier>-<slot>`, so a second instance on the same
    /// slot fences the first.
    pub fn id(&self) -> String {
        format!("outboxd-{}-{}", self.system_id, self.slot)
    }

    /// The position record's key: `<system identifier>/<slot>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.system_id, self.slot)
    }
}

/// The `--kafka-property-file` and the index range of its entries in [`KafkaConfig::properties`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PropertyFile {
    pub path: PathBuf,
    pub range: std::ops::Range<usize>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let props: Vec<String> = self.properties.iter().map(|(k, v)| format!("{k}={}", shown(k, v))).collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("properties", &props)
            .field("property_file", &self.property_file)
            .field("topic_partitions", &self.topic_partitions)
            .field("topic_replication_factor", &self.topic_replication_factor)
            .finish()
    }
}

/// Merged librdkafka properties and where the file's are among them.
pub type LoadedProperties = (Vec<(String, String)>, Option<PropertyFile>);

impl KafkaConfig {
    /// The config of a tool (`dlq`, `shadow`): its Kafka flags, no Debezium file; the topics a
    /// tool creates take the broker's defaults.
    pub fn for_tool(a: &KafkaClientArgs) -> Result<KafkaConfig, Definite> {
        if a.kafka_brokers.trim().is_empty() {
            return Err(Definite::Config("--kafka-brokers is empty; give host:port[,host:port]".into()));
        }
        let (properties, property_file) =
            KafkaConfig::load_properties(&[], a.kafka_property_file.as_deref(), &a.kafka_properties)?;
        Ok(KafkaConfig {
            brokers: a.kafka_brokers.clone(),
            properties,
            property_file,
            topic_partitions: -1,
            topic_replication_factor: -1,
            transactions: None,
        })
    }

    /// Properties from Debezium, the file, then the flags, each checked.
    pub fn load_properties(
        debezium: &[String],
        file: Option<&std::path::Path>,
        flags: &[String],
    ) -> Result<LoadedProperties, Definite> {
        let mut props =
            parse_property_flags(debezium).map_err(|e| Definite::Config(format!("--debezium-config: {e}")))?;
        let file = match file {
            Some(path) => {
                let start = props.len();
                props.extend(read_property_file(path)?);
                Some(PropertyFile { path: path.to_owned(), range: start..props.len() })
            }
            None => None,
        };
        props.extend(parse_property_flags(flags)?);
        Ok((props, file))
    }
}

/// How `run` (and the commands sharing its flags) and the tools (`dlq`, `shadow`) reach Kafka.
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaClientArgs {
    /// Kafka bootstrap servers, comma-separated.
    #[arg(long, env = "OUTBOXD_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Extra librdkafka property KEY=VALUE; repeatable; wins over --kafka-property-file.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_properties: Vec<String>,
    /// Java .properties file of librdkafka properties (key=value lines), e.g. SASL/TLS credentials.
    #[arg(long, env = "OUTBOXD_KAFKA_PROPERTY_FILE", value_name = "FILE")]
    pub kafka_property_file: Option<PathBuf>,
}

/// Kafka as the sink of `run`, `poll` and `backfill`: the client, and the topics outboxd creates.
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaArgs {
    #[command(flatten)]
    pub client: KafkaClientArgs,
    /// Partitions for topics outboxd creates; -1: the broker's num.partitions (Debezium
    /// topic.creation.default.partitions).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub topic_partitions: i32,
    /// Replication factor for topics outboxd creates; -1: the broker's default.replication.factor,
    /// so a topic is as durable as the cluster (Debezium topic.creation.default.replication.factor).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub topic_replication_factor: i32,
}

/// `--delivery` and the Kafka transactions of exactly-once: `outboxd run` only (poll and
/// backfill deliver at least once, so they cannot be given exactly-once).
#[derive(Debug, Clone, clap::Args)]
pub struct DeliveryArgs {
    /// at-least-once, or exactly-once (Kafka only): each event visible once to read_committed
    /// consumers, written in Kafka transactions together with outboxd's position (Debezium
    /// exactly.once.support=required).
    #[arg(long, env = "OUTBOXD_DELIVERY", value_enum, default_value_t = DeliveryMode::AtLeastOnce)]
    pub delivery: DeliveryMode,
    /// Exactly-once: how long a Kafka transaction stays open before it commits at the next
    /// PostgreSQL commit (acks, and so slot confirmation, wait for it).
    #[arg(long, env = "OUTBOXD_TRANSACTION_INTERVAL", default_value = "25ms", value_name = "DURATION")]
    pub transaction_interval: String,
    /// Exactly-once: the compacted topic holding outboxd's position, written in each Kafka
    /// transaction (keyed by system identifier and slot).
    #[arg(long, env = "OUTBOXD_POSITION_TOPIC", default_value = "outboxd.positions", value_name = "TOPIC")]
    pub position_topic: String,
}

impl KafkaArgs {
    /// The Kafka settings: the properties merged (`debezium`'s, from `--debezium-config`, first),
    /// the brokers required when Kafka is the sink (`used`), the topic numbers checked; with
    /// exactly-once (`delivery`), the transactions, whose position is keyed by `slot`.
    pub fn validate(
        &self,
        debezium: &[String],
        used: bool,
        delivery: Option<&DeliveryArgs>,
        slot: &str,
    ) -> Result<KafkaConfig, Definite> {
        let c = &self.client;
        let (properties, property_file) =
            KafkaConfig::load_properties(debezium, c.kafka_property_file.as_deref(), &c.kafka_properties)?;
        if used && c.kafka_brokers.trim().is_empty() {
            return Err(Definite::Config("--kafka-brokers is empty; give host:port[,host:port]".into()));
        }
        for (flag, n, default) in [
            ("--topic-partitions", self.topic_partitions, "num.partitions"),
            ("--topic-replication-factor", self.topic_replication_factor, "default.replication.factor"),
        ] {
            if n < 1 && n != -1 {
                return Err(Definite::Config(format!(
                    "{flag} {n} must be at least 1, or -1 for the broker's {default}"
                )));
            }
        }
        Ok(KafkaConfig {
            brokers: c.kafka_brokers.clone(),
            properties,
            property_file,
            topic_partitions: self.topic_partitions,
            topic_replication_factor: self.topic_replication_factor,
            transactions: match delivery {
                Some(d) if d.delivery == DeliveryMode::ExactlyOnce => Some(d.transactions(slot)?),
                _ => None,
            },
        })
    }
}

impl DeliveryArgs {
    /// Exactly-once's transactions, their position keyed by `slot` (the system id comes later,
    /// from the server).
    fn transactions(&self, slot: &str) -> Result<TxnConfig, Definite> {
        if self.position_topic.trim().is_empty() {
            return Err(Definite::Config("--position-topic is empty; name a topic (default outboxd.positions)".into()));
        }
        Ok(TxnConfig {
            system_id: String::new(),
            slot: slot.to_owned(),
            position_topic: self.position_topic.clone(),
            interval: crate::units::parse_duration("--transaction-interval", &self.transaction_interval)?,
        })
    }
}

impl KafkaConfig {
    /// The flags that rebuild this, for `outboxd config` (secret properties masked, a property
    /// file as its path); the transactions' flags go with `--delivery`.
    pub fn show(&self, push: &mut dyn FnMut(&'static str, String)) {
        push("kafka-brokers", self.brokers.clone());
        let props = &self.properties;
        let file = self.property_file.as_ref();
        if let Some(f) = file {
            push("kafka-property-file", f.path.display().to_string());
        }
        for (i, (k, v)) in props.iter().enumerate() {
            if file.is_some_and(|f| f.range.contains(&i)) {
                continue;
            }
            // Flags always apply after the file. A property listed before it (one from
            // --debezium-config) is shown only when nothing later sets its key: otherwise it
            // never took effect, and shown as a flag it would wrongly override the file.
            if file.is_some_and(|f| i < f.range.start) && props[i + 1..].iter().any(|(later, _)| later == k) {
                continue;
            }
            push("kafka-property", format!("{k}={}", shown(k, v)));
        }
        push("topic-partitions", self.topic_partitions.to_string());
        push("topic-replication-factor", self.topic_replication_factor.to_string());
    }
}
