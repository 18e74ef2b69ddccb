//! How outboxd reaches Kafka: brokers plus librdkafka properties merged from `--debezium-config`,
//! `--kafka-property-file` and `--kafka-property`, in that order (a later key wins).
//!
//! Secrets live in the properties; `Debug` and `outboxd config` show them masked
//! ([`crate::sink::kafka_client::shown`]).

use std::path::PathBuf;

use crate::error::Definite;

/// How to reach Kafka; every client is built from it by [`crate::sink::kafka_client`].
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
}

/// The `--kafka-property-file` and the index range of its entries in [`KafkaConfig::properties`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PropertyFile {
    pub path: PathBuf,
    pub range: std::ops::Range<usize>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::sink::kafka_client::shown;
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
    pub fn for_tool(a: &super::KafkaClientArgs) -> Result<KafkaConfig, Definite> {
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
        })
    }

    /// Properties from Debezium, the file, then the flags, each checked.
    pub fn load_properties(
        debezium: &[String],
        file: Option<&std::path::Path>,
        flags: &[String],
    ) -> Result<LoadedProperties, Definite> {
        use crate::sink::kafka_client;
        let mut props = kafka_client::parse_property_flags(debezium)
            .map_err(|e| Definite::Config(format!("--debezium-config: {e}")))?;
        let file = match file {
            Some(path) => {
                let start = props.len();
                props.extend(kafka_client::read_property_file(path)?);
                Some(PropertyFile { path: path.to_owned(), range: start..props.len() })
            }
            None => None,
        };
        props.extend(kafka_client::parse_property_flags(flags)?);
        Ok((props, file))
    }
}
