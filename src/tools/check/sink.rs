//! The broker half of `outboxd check`. Kafka: the cluster answers a metadata request, and every
//! topic the outbox rows now route to (and the dead-letter topic with `--on-bad-event dlq`)
//! exists or would be accepted by CreateTopics (asked with `validate_only`, so Kafka makes nothing;
//! a broker that ignores the flag, such as tansu 0.6, creates it as `run` would have).
//! It also reports the broker defaults that shape those topics (`auto.create.topics.enable`,
//! `num.partitions`, `default.replication.factor`, `min.insync.replicas`, `message.max.bytes`)
//! and warns when the topics it would create get one replica, or no more than
//! `min.insync.replicas`. The other sinks with a server (NATS, Redis, RabbitMQ, HTTP): it accepts
//! a TCP connection (the login is not tried). Each sink says which probe is its own
//! ([`crate::sink::registered::Registered::probe`]), so nothing here lists the sinks.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;

use super::Checks;
use crate::config::{BadEventPolicy, Config};
use crate::sink::kafka::client as kafka_client;
use crate::sink::registered::{Probe, Verdict};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Probe what `--sink` names, as its folder says ([`Probe`]).
pub(super) async fn check(cfg: &Config, routed: &[String], out: &mut Checks) {
    match cfg.sink.probe(cfg) {
        Probe::Kafka => kafka(cfg, routed, out).await,
        Probe::Tcp { name, shown, url, default_port } => {
            tcp(out, name, &shown, first_host_port(&url, default_port)).await
        }
        Probe::Nothing(line) => out.info("sink", line),
        Probe::Run(probe) => match probe.await {
            Verdict::Ok { name, detail } => out.ok(name, detail),
            Verdict::Fail { name, detail, fix } => out.fail(name, detail, fix),
        },
    }
}

async fn kafka(cfg: &Config, routed: &[String], out: &mut Checks) {
    let k = &cfg.kafka;
    let admin: AdminClient<DefaultClientContext> = match kafka_client::create(
        &kafka_client::admin_config(k, "outboxd-check"),
        DefaultClientContext,
        "admin client",
        k,
    ) {
        Ok(a) => a,
        Err(e) => {
            out.fail("kafka", e.to_string(), "fix --kafka-property / --kafka-property-file");
            return;
        }
    };
    let admin = std::sync::Arc::new(admin);
    let meta = {
        let admin = admin.clone();
        tokio::task::spawn_blocking(move || {
            admin.inner().fetch_metadata(None, TIMEOUT).map(|m| {
                let topics: Vec<String> = m
                    .topics()
                    .iter()
                    .filter(|t| t.error().is_none() && !t.partitions().is_empty())
                    .map(|t| t.name().to_owned())
                    .collect();
                (m.brokers().len(), m.brokers().first().map(|b| b.id()), topics)
            })
        })
        .await
    };
    let (brokers, broker_id, existing) = match meta {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => {
            let e = kafka_client::scrub(&e.to_string(), &k.properties);
            out.fail(
                "kafka",
                format!("no answer from {} within {}s: {e}", k.brokers, TIMEOUT.as_secs()),
                "check --kafka-brokers, that the broker runs and is reachable from here, and the security properties",
            );
            return;
        }
        Err(e) => {
            out.fail("kafka", format!("the metadata request failed: {e}"), "retry; check --kafka-brokers");
            return;
        }
    };
    out.ok("kafka", format!("{} answered ({brokers} brokers)", k.brokers));
    if let Some(id) = broker_id {
        broker_defaults(&admin, id, k, out).await;
    }
    let mut topics: Vec<String> = routed.to_vec();
    if cfg.on_bad_event == BadEventPolicy::Dlq && !topics.contains(&cfg.dlq_topic) {
        topics.push(cfg.dlq_topic.clone());
    }
    if topics.is_empty() {
        out.info(
            "kafka topics",
            "the outbox is empty, so no topic name is known yet; run creates topics as events route to them",
        );
        return;
    }
    let opts = AdminOptions::new().validate_only(true).request_timeout(Some(TIMEOUT)).operation_timeout(Some(TIMEOUT));
    for topic in topics {
        let name = format!("topic {topic}");
        if existing.contains(&topic) {
            out.ok(name, "exists");
            continue;
        }
        // -1 asks for the broker's own defaults, as the relay does.
        let new = NewTopic::new(&topic, k.topic_partitions, TopicReplication::Fixed(k.topic_replication_factor));
        match admin.create_topics([&new], &opts).await {
            Ok(r) => match r.into_iter().next() {
                Some(Ok(_)) | Some(Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists))) => {
                    out.ok(name, "missing; the broker accepts its creation")
                }
                Some(Err((_, code))) => out.fail(
                    name,
                    format!("missing, and the broker refuses to create it: {code}"),
                    "create the topic yourself, or grant the CREATE ACL / fix --topic-partitions and --topic-replication-factor",
                ),
                None => out.fail(name, "missing; the broker gave no answer about creating it", "create the topic yourself"),
            },
            Err(e) => out.fail(
                name,
                format!("missing; asking to create it failed: {}", kafka_client::scrub(&e.to_string(), &k.properties)),
                "create the topic yourself or check the broker",
            ),
        }
    }
}

/// The broker settings that decide what the topics outboxd creates get, and whether a producer
/// may create them by writing (`auto.create.topics.enable`). Read with DescribeConfigs from one
/// broker; a broker that refuses it (no DESCRIBE_CONFIGS on the cluster) only loses this line.
async fn broker_defaults(
    admin: &AdminClient<DefaultClientContext>,
    id: i32,
    k: &crate::config::KafkaConfig,
    out: &mut Checks,
) {
    let opts = AdminOptions::new().request_timeout(Some(TIMEOUT));
    let described = admin.describe_configs([&ResourceSpecifier::Broker(id)], &opts).await;
    let resource = match described.map(|r| r.into_iter().next()) {
        Ok(Some(Ok(r))) => r,
        Ok(Some(Err(code))) => {
            return out
                .info("kafka broker defaults", format!("broker {id} would not describe its configuration: {code}"))
        }
        Ok(None) => return out.info("kafka broker defaults", format!("broker {id} described nothing")),
        Err(e) => {
            let e = kafka_client::scrub(&e.to_string(), &k.properties);
            return out.info("kafka broker defaults", format!("asking broker {id} for its configuration failed: {e}"));
        }
    };
    let get = |name: &str| resource.get(name).and_then(|e| e.value.clone()).unwrap_or_else(|| "?".into());
    let num = |name: &str| get(name).parse::<i64>().ok();
    let partitions = if k.topic_partitions == -1 { num("num.partitions") } else { Some(i64::from(k.topic_partitions)) };
    let replicas = if k.topic_replication_factor == -1 {
        num("default.replication.factor")
    } else {
        Some(i64::from(k.topic_replication_factor))
    };
    let shown = |v: Option<i64>| v.map_or("?".into(), |v| v.to_string());
    out.info(
        "kafka broker defaults",
        format!(
            "auto.create.topics.enable={}, num.partitions={}, default.replication.factor={}, min.insync.replicas={}, \
             message.max.bytes={}; topics outboxd creates get partitions={}, replicas={}",
            get("auto.create.topics.enable"),
            get("num.partitions"),
            get("default.replication.factor"),
            get("min.insync.replicas"),
            get("message.max.bytes"),
            shown(partitions),
            shown(replicas),
        ),
    );
    let min_isr = num("min.insync.replicas").unwrap_or(1);
    match replicas {
        Some(1) => out.warn(
            "kafka topic replicas",
            "topics outboxd creates get one replica: losing that broker's disk loses acked events",
            "on a cluster of 3 or more brokers give --topic-replication-factor 3 (or set default.replication.factor)",
        ),
        Some(r) if r <= min_isr => out.warn(
            "kafka topic replicas",
            format!("topics outboxd creates get {r} replicas, not more than min.insync.replicas={min_isr}: one broker down stops every write"),
            "give --topic-replication-factor above min.insync.replicas (3 with min.insync.replicas=2)",
        ),
        _ => {}
    }
}

/// `host:port` of the first server in a `scheme://[user[:pass]@]host[:port][,...]` URL.
fn first_host_port(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split([',', '/', '?']).next().unwrap_or_default();
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let has_port = host.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) && !host.ends_with(']');
    if has_port {
        host.to_owned()
    } else {
        format!("{host}:{default_port}")
    }
}

async fn tcp(out: &mut Checks, name: &str, shown: &str, addr: String) {
    match tokio::time::timeout(TIMEOUT, tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(_)) => out.ok(name, format!("{shown} accepts connections (login not tried)")),
        Ok(Err(e)) => out.fail(
            name,
            format!("cannot connect to {addr}: {e}"),
            format!("check the {name} URL and that the server runs"),
        ),
        Err(_) => out.fail(
            name,
            format!("no answer from {addr} within {}s", TIMEOUT.as_secs()),
            format!("check the {name} URL and the network"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::first_host_port;

    #[test]
    fn first_server_of_a_url() {
        assert_eq!(first_host_port("nats://127.0.0.1:4222", 4222), "127.0.0.1:4222");
        assert_eq!(first_host_port("nats://u:p@a:1,nats://b:2", 4222), "a:1");
        assert_eq!(first_host_port("redis://:secret@cache/0", 6379), "cache:6379");
        assert_eq!(first_host_port("rediss://h:6380?x=1", 6379), "h:6380");
    }
}
