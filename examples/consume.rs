//! Print every record of a topic from the beginning (assign + explicit offsets, no group join).
//! Used by `scripts/demo`. Usage: `consume BROKERS TOPIC [SECONDS]`.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (brokers, topic) = match (args.get(1), args.get(2)) {
        (Some(b), Some(t)) => (b, t),
        _ => return Err("usage: consume BROKERS TOPIC [SECONDS]".into()),
    };
    let secs: u64 = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(5);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "outboxd-demo")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let id = m
                    .headers()
                    .and_then(|h| {
                        h.iter()
                            .find(|h| h.key == "id")
                            .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
                    })
                    .unwrap_or_default();
                println!(
                    "{} offset={} key={} id={} value={}",
                    m.topic(),
                    m.offset(),
                    String::from_utf8_lossy(m.key().unwrap_or_default()),
                    id,
                    String::from_utf8_lossy(m.payload().unwrap_or_default())
                );
            }
            Some(Err(e)) => eprintln!("consume error: {e}"),
            None => {}
        }
    }
    Ok(())
}
