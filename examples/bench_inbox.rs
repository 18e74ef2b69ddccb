//! Benchmark helper for `bench/run inbox`: the records `outboxd inbox` is timed on, and the loop a
//! team would write by hand to compare it with.
//!
//! `bench_inbox produce --brokers B --topic T --count N [--partitions P] [--rate R] [--id-prefix X]
//! [--warm W]` creates the topic if missing (P partitions, default 4,
//! `message.timestamp.type=LogAppendTime`, so a record's timestamp is when the broker appended it)
//! and produces N records like outboxd's (~300 B JSON payload, key one of 1,000 aggregates, headers
//! `id` = X-i and `eventType`), as fast as the broker acks them, or R a second on a schedule; with
//! `--warm W`, W more records first on the same schedule, with ids w-0 … w-(W−1), so a latency
//! run's measured records follow its warm-up without a gap or a burst. The schedule starts once
//! the producer has the topic's metadata (its connection is up): records queued while it connects
//! would otherwise leave as one burst. Prints `produced=N secs=S rate=R` (warm-up included).
//!
//! `bench_inbox hand --brokers B --topic T --group G --pg CONNINFO --table SCHEMA.TABLE
//! [--batch 500] [--batch-timeout-ms 20] [--expect N]` is the hand-written consumer loop:
//! poll up to a batch of records (or until the timeout), insert them in one statement with
//! `ON CONFLICT (event_id) DO NOTHING` into a table shaped like the inbox (sql/08_inbox.sql's
//! columns), and after that commit, commit the next offsets to Kafka (the group's offsets, read
//! back at start). It is the usual at-least-once loop: a crash between the two commits makes the
//! batch come again, and only the unique event id keeps it out. It exits after `--expect` records
//! were committed and prints `done records=N inserted=I duplicates=D secs=S`; after each batch
//! `batch records=R inserted=I` (R − I were in the table already: read again).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const TYPES: [&str; 5] =
    ["order.created.v1", "order.paid.v1", "order.shipped.v1", "order.delivered.v1", "order.cancelled.v1"];

fn main() -> Res<()> {
    let mut it = std::env::args().skip(1);
    let mode = it.next().ok_or("usage: bench_inbox produce|hand --flag value ...")?;
    let mut opts = HashMap::new();
    while let Some(a) = it.next() {
        let v = it.next().ok_or(format!("{a} needs a value"))?;
        opts.insert(a.trim_start_matches("--").to_owned(), v);
    }
    let get = |k: &str| opts.get(k).cloned().ok_or(format!("--{k} is required"));
    let num = |k: &str, d: u64| -> Res<u64> { Ok(opts.get(k).map(|v| v.parse()).transpose()?.unwrap_or(d)) };
    match mode.as_str() {
        "produce" => produce(
            &get("brokers")?,
            &get("topic")?,
            num("count", 0)?,
            num("partitions", 4)? as i32,
            num("rate", 0)?,
            opts.get("id-prefix").map_or("e", String::as_str),
            num("warm", 0)?,
        ),
        "hand" => hand(Hand {
            brokers: get("brokers")?,
            topic: get("topic")?,
            group: get("group")?,
            pg: get("pg")?,
            table: get("table")?,
            batch: num("batch", 500)? as usize,
            timeout: Duration::from_millis(num("batch-timeout-ms", 20)?),
            expect: num("expect", u64::MAX)?,
        }),
        other => Err(format!("unknown mode {other}: produce or hand").into()),
    }
}

fn produce(brokers: &str, topic: &str, count: u64, partitions: i32, rate: u64, prefix: &str, warm: u64) -> Res<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1)).set("message.timestamp.type", "LogAppendTime");
    // An existing topic is fine (TopicAlreadyExists); other failures show when producing.
    let _ = rt.block_on(admin.create_topics([&t], &AdminOptions::new()));
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    // Connected, with the topic's partitions and leaders, before the schedule's first tick.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let md = producer.client().fetch_metadata(Some(topic), Duration::from_secs(5));
        let ready =
            md.as_ref().is_ok_and(|m| m.topics().iter().any(|t| t.error().is_none() && !t.partitions().is_empty()));
        if ready {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("no metadata for topic {topic} within 30 s: {md:?}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let filler = "x".repeat(180);
    let total = warm + count;
    let t0 = Instant::now();
    for i in 0..total {
        if rate > 0 {
            let due = t0 + Duration::from_secs_f64(i as f64 / rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let id = if i < warm { format!("w-{i}") } else { format!("{prefix}-{}", i - warm) };
        let key = format!("agg-{}", i % 1000);
        let ty = TYPES[(i % 5) as usize];
        let payload =
            format!(r#"{{"orderId":"{key}","seq":{i},"type":"{ty}","amount":{}.25,"note":"{filler}"}}"#, i % 997);
        let headers = OwnedHeaders::new()
            .insert(Header { key: "id", value: Some(id.as_bytes()) })
            .insert(Header { key: "eventType", value: Some(ty.as_bytes()) });
        let mut rec = BaseRecord::to(topic).key(&key).payload(&payload).headers(headers);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, back)) => {
                    rec = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(120))?;
    let secs = t0.elapsed().as_secs_f64();
    println!("produced={total} secs={secs:.3} rate={:.0}", total as f64 / secs);
    Ok(())
}

struct Hand {
    brokers: String,
    topic: String,
    group: String,
    pg: String,
    table: String,
    batch: usize,
    timeout: Duration,
    expect: u64,
}

/// One record's columns, as the hand loop binds them.
#[derive(Default)]
struct Cols {
    ids: Vec<String>,
    topics: Vec<String>,
    parts: Vec<i32>,
    offs: Vec<i64>,
    agg: Vec<Option<String>>,
    keys: Vec<Option<Vec<u8>>>,
    types: Vec<Option<String>>,
    payloads: Vec<Option<Vec<u8>>>,
    json: Vec<Option<String>>,
    headers: Vec<String>,
    ts: Vec<Option<i64>>,
}

fn hand(h: Hand) -> Res<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (client, conn) = rt.block_on(tokio_postgres::connect(&h.pg, tokio_postgres::NoTls))?;
    rt.spawn(conn);
    let sql = format!(
        "INSERT INTO {} (event_id, topic, kafka_partition, kafka_offset, aggregate_key, key, event_type, payload, \
                         payload_json, headers, kafka_timestamp) \
         SELECT event_id, topic, p, o, agg, k, ty, pl, js::jsonb, hd::jsonb, to_timestamp(ts / 1000.0) \
           FROM unnest($1::text[], $2::text[], $3::int4[], $4::int8[], $5::text[], $6::bytea[], $7::text[], \
                       $8::bytea[], $9::text[], $10::text[], $11::int8[]) \
             AS t(event_id, topic, p, o, agg, k, ty, pl, js, hd, ts) \
         ON CONFLICT (event_id) DO NOTHING",
        h.table
    );
    let stmt = rt.block_on(client.prepare(&sql))?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &h.brokers)
        .set("group.id", &h.group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()?;
    consumer.subscribe(&[&h.topic])?;
    let (mut records, mut inserted) = (0u64, 0u64);
    let t0 = Instant::now();
    while records < h.expect {
        let mut c = Cols::default();
        let mut next: HashMap<(String, i32), i64> = HashMap::new();
        let since = Instant::now();
        while c.ids.len() < h.batch {
            let left = h.timeout.saturating_sub(since.elapsed());
            if left.is_zero() && !c.ids.is_empty() {
                break;
            }
            let Some(m) = consumer.poll(left.max(Duration::from_millis(1))) else { continue };
            let m = m?;
            let mut hd = serde_json::Map::new();
            let mut id = None;
            let mut ty = None;
            if let Some(hs) = m.headers() {
                for x in hs.iter() {
                    let v = x.value.map(|v| String::from_utf8_lossy(v).into_owned());
                    match x.key {
                        "id" => id = v.clone(),
                        "eventType" => ty = v.clone(),
                        _ => {}
                    }
                    hd.insert(x.key.to_owned(), v.map_or(serde_json::Value::Null, serde_json::Value::String));
                }
            }
            let payload = m.payload().map(<[u8]>::to_vec);
            let json = payload
                .as_deref()
                .filter(|p| serde_json::from_slice::<serde::de::IgnoredAny>(p).is_ok())
                .map(|p| String::from_utf8_lossy(p).into_owned());
            c.ids.push(id.unwrap_or_else(|| format!("{}/{}/{}", m.topic(), m.partition(), m.offset())));
            c.topics.push(m.topic().to_owned());
            c.parts.push(m.partition());
            c.offs.push(m.offset());
            c.agg.push(m.key().map(|k| String::from_utf8_lossy(k).into_owned()));
            c.keys.push(m.key().map(<[u8]>::to_vec));
            c.types.push(ty);
            c.payloads.push(payload);
            c.json.push(json);
            c.headers.push(serde_json::Value::Object(hd).to_string());
            c.ts.push(m.timestamp().to_millis());
            next.insert((m.topic().to_owned(), m.partition()), m.offset() + 1);
        }
        let n = rt.block_on(client.execute(
            &stmt,
            &[&c.ids, &c.topics, &c.parts, &c.offs, &c.agg, &c.keys, &c.types, &c.payloads, &c.json, &c.headers, &c.ts],
        ))?;
        // After the database commit: a crash before this line reads the batch again.
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in &next {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))?;
        }
        commit(&consumer, &tpl)?;
        records += c.ids.len() as u64;
        inserted += n;
        // A line per batch (stdout is line-buffered): what a kill -9 leaves is still counted.
        println!("batch records={} inserted={n}", c.ids.len());
    }
    println!(
        "done records={records} inserted={inserted} duplicates={} secs={:.3}",
        records - inserted,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A synchronous offset commit, asked again (up to ~10 s) while the group coordinator is loading or
/// moving, as any loop that commits by hand must (librdkafka answers those at once, without a
/// retry of its own): without it one slow coordinator start ended the benchmark's hand loop.
fn commit<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: &TopicPartitionList,
) -> rdkafka::error::KafkaResult<()> {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};
    let mut tries = 0;
    loop {
        match consumer.commit(tpl, CommitMode::Sync) {
            Err(KafkaError::ConsumerCommit(
                C::CoordinatorLoadInProgress | C::NotCoordinator | C::CoordinatorNotAvailable | C::RequestTimedOut,
            )) if tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}
