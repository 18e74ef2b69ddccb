//! Benchmark helper for `bench/run latency`: end-to-end latency seen by a Kafka consumer.
//!
//! Creates the topics if they are missing (1 partition, as outboxd creates them), reads each
//! partition's high watermark, `assign()`s from there, writes `ready` to stdout, and then reads
//! records until `--expect` of them arrived or `--timeout-secs` passed. For each record:
//! latency = wall-clock time when the consumer got it − the record timestamp. outboxd stamps the
//! record with the row's `created_at` (= `now()` at insert, i.e. the inserting transaction's
//! start), so this is insert → consumer, an upper bound on commit → ack.
//!
//! Usage: `bench_latency --brokers B --topics t1,t2,.. --expect N [--timeout-secs S]`
//! Prints `count=N p50_ms=.. p99_ms=.. max_ms=.. mean_ms=.. le20_pct=..` (the share of records
//! at most 20 ms late) after `ready`.
//!
//! Calibration: `bench_latency --brokers B --topics T1,.. --calibrate-rate R --secs S` measures the
//! broker alone at the same rate: it produces ~300 B records round-robin to the topics (as the 5
//! event types spread over 5 topics) with outboxd's producer
//! settings (idempotence, acks=all, linger.ms=5) and consumes them at the same time. Prints
//! `count=N ack_p50_ms ack_p99_ms ack_max_ms` (send → delivery report, what commit → ack adds on
//! top of outboxd's own work) and `p50_ms p99_ms max_ms` (send → consumed).
//!
//! Broker ceiling: `bench_latency --brokers B --topics T1,.. --produce N [--max-in-flight 10000]`
//! produces N such records as fast as the broker acks them (at most that many unacked, like
//! outboxd's `--max-in-flight`) and prints `produced=N secs=S rate=R`.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

struct AckTimes(Mutex<Vec<f64>>, AtomicU64);
impl ClientContext for AckTimes {}
impl ProducerContext for AckTimes {
    type DeliveryOpaque = Box<Instant>;
    fn delivery(&self, result: &DeliveryResult<'_>, sent: Box<Instant>) {
        if result.is_ok() {
            let ms = sent.elapsed().as_secs_f64() * 1000.0;
            self.0.lock().unwrap().push(ms);
        }
        self.1.fetch_add(1, Ordering::Relaxed);
    }
}

fn stats(v: &[f64]) -> (f64, f64, f64, f64) {
    let mut sorted = v.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let mean = if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    (pct(&sorted, 0.50), pct(&sorted, 0.99), sorted.last().copied().unwrap_or(f64::NAN), mean)
}

fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut it = std::env::args().skip(1);
    let (mut brokers, mut topics, mut expect, mut timeout) = (None, Vec::<String>::new(), 0usize, 120u64);
    let (mut calibrate, mut secs, mut fetch_wait) = (None::<u64>, 10u64, "10".to_string());
    let (mut produce, mut max_in_flight) = (None::<u64>, 10_000u64);
    while let Some(a) = it.next() {
        let v = it.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--brokers" => brokers = Some(v),
            "--topics" => topics = v.split(',').map(str::to_owned).collect(),
            "--expect" => expect = v.parse()?,
            "--timeout-secs" => timeout = v.parse()?,
            "--calibrate-rate" => calibrate = Some(v.parse()?),
            "--secs" => secs = v.parse()?,
            "--fetch-wait-ms" => fetch_wait = v,
            "--produce" => produce = Some(v.parse()?),
            "--max-in-flight" => max_in_flight = v.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let brokers = brokers.ok_or("--brokers is required")?;
    if topics.is_empty() {
        return Err("--topics is required".into());
    }

    // Create the topics (an existing topic is fine) so that we can assign before the first record.
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", &brokers).create()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let new: Vec<NewTopic> = topics.iter().map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1))).collect();
    let results = rt.block_on(admin.create_topics(new.iter(), &AdminOptions::new()))?;
    for r in results {
        if let Err((t, code)) = r {
            if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                eprintln!("bench_latency: creating {t}: {code}");
            }
        }
    }

    if let Some(n) = produce {
        return produce_run(&brokers, &topics, n, max_in_flight);
    }

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", "outboxd-bench-latency")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", &fetch_wait)
        .set("fetch.error.backoff.ms", "10")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for t in &topics {
        let mut high = None;
        for _ in 0..100 {
            match consumer.fetch_watermarks(t, 0, Duration::from_secs(5)) {
                Ok((_, h)) => {
                    high = Some(h);
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        let high = high.ok_or(format!("no watermarks for {t}"))?;
        tpl.add_partition_offset(t, 0, Offset::Offset(high))?;
    }
    consumer.assign(&tpl)?;
    // Let the fetchers start before the load does.
    let warm = Instant::now() + Duration::from_millis(500);
    while Instant::now() < warm {
        if let Some(Ok(_)) = consumer.poll(Duration::from_millis(50)) {
            eprintln!("bench_latency: unexpected record before start");
        }
    }
    println!("ready");
    std::io::stdout().flush()?;
    if let Some(rate) = calibrate {
        return calibrate_run(&brokers, &topics, &consumer, rate, secs);
    }

    let deadline = Instant::now() + Duration::from_secs(timeout);
    let mut lat = Vec::with_capacity(expect);
    while lat.len() < expect && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let got = now_ms();
                if let Some(ts) = m.timestamp().to_millis() {
                    lat.push(got - ts as f64);
                }
            }
            Some(Err(e)) => eprintln!("bench_latency: {e}"),
            None => {}
        }
    }
    let (p50, p99, max, mean) = stats(&lat);
    let le20 = lat.iter().filter(|&&ms| ms <= 20.0).count() as f64 * 100.0 / lat.len().max(1) as f64;
    println!(
        "count={} p50_ms={p50:.1} p99_ms={p99:.1} max_ms={max:.1} mean_ms={mean:.1} le20_pct={le20:.1}",
        lat.len()
    );
    Ok(())
}

fn calibrate_run(
    brokers: &str,
    topics: &[String],
    consumer: &BaseConsumer,
    rate: u64,
    secs: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let producer: ThreadedProducer<AckTimes> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create_with_context(AckTimes(Mutex::new(Vec::new()), AtomicU64::new(0)))?;
    let total = rate * secs;
    let value = format!("{{\"calibration\": true, \"pad\": \"{}\"}}", "x".repeat(260));
    // Warm up (producer id, metadata, first batch) outside the measurement; the consumer skips these.
    for topic in topics.iter().cycle().take(10 * topics.len()) {
        let record = BaseRecord::with_opaque_to(topic, Box::new(Instant::now())).key("warmup").payload(&value);
        producer.send(record).map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;
    producer.context().0.lock().unwrap().clear();
    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut lat = Vec::with_capacity(total as usize);
    let deadline = t0 + Duration::from_secs(secs + 60);
    while (lat.len() as u64) < total && Instant::now() < deadline {
        let due = ((t0.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
        while sent < due {
            let key = (sent % 1000).to_string();
            let topic = &topics[(sent % topics.len() as u64) as usize];
            let record = BaseRecord::with_opaque_to(topic, Box::new(Instant::now()))
                .key(&key)
                .payload(&value)
                .timestamp(now_ms() as i64);
            match producer.send(record) {
                Ok(()) => sent += 1,
                Err((e, _)) => {
                    eprintln!("bench_latency: send: {e}");
                    break;
                }
            }
        }
        let mut next = consumer.poll(Duration::from_millis(1));
        while let Some(Ok(m)) = next {
            let got = now_ms();
            if m.key() == Some(b"warmup".as_slice()) {
                next = consumer.poll(Duration::ZERO);
                continue;
            }
            if let Some(ts) = m.timestamp().to_millis() {
                lat.push(got - ts as f64);
            }
            next = consumer.poll(Duration::ZERO);
        }
    }
    producer.flush(Duration::from_secs(30))?;
    let acks = producer.context().0.lock().unwrap().clone();
    let (a50, a99, amax, _) = stats(&acks);
    let (p50, p99, max, mean) = stats(&lat);
    println!(
        "count={} ack_p50_ms={a50:.1} ack_p99_ms={a99:.1} ack_max_ms={amax:.1} p50_ms={p50:.1} p99_ms={p99:.1} max_ms={max:.1} mean_ms={mean:.1}",
        lat.len()
    );
    Ok(())
}

/// Drain-style ceiling of the broker: produce `n` ~300 B records (round-robin over the topics, key
/// i % 1000, an `id` header like outboxd's) as fast as possible with outboxd's producer settings
/// and at most `max_in_flight` unacknowledged, and wait for every ack.
fn produce_run(brokers: &str, topics: &[String], n: u64, max_in_flight: u64) -> Result<(), Box<dyn std::error::Error>> {
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: ThreadedProducer<AckTimes> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "0")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", (max_in_flight * 2).max(100_000).to_string())
        .create_with_context(AckTimes(Mutex::new(Vec::new()), AtomicU64::new(0)))?;
    let value = format!("{{\"orderId\": 1, \"pad\": \"{}\"}}", "x".repeat(280));
    // Warm-up: producer id and metadata for every topic.
    for topic in topics {
        let record = BaseRecord::with_opaque_to(topic, Box::new(Instant::now())).key("warmup").payload(&value);
        producer.send(record).map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;
    let base = producer.context().1.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let mut sent = 0u64;
    while sent < n {
        let acked = producer.context().1.load(Ordering::Relaxed) - base;
        if sent - acked >= max_in_flight {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let key = (sent % 1000).to_string();
        let id = format!("00000000-0000-4000-8000-{sent:012}");
        let topic = &topics[(sent % topics.len() as u64) as usize];
        let record = BaseRecord::with_opaque_to(topic, Box::new(Instant::now()))
            .key(&key)
            .payload(&value)
            .headers(OwnedHeaders::new().insert(Header { key: "id", value: Some(&id) }));
        match producer.send(record) {
            Ok(()) => sent += 1,
            Err((e, _)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                std::thread::sleep(Duration::from_micros(200))
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
    while producer.context().1.load(Ordering::Relaxed) - base < n {
        std::thread::sleep(Duration::from_micros(200));
    }
    let secs = t0.elapsed().as_secs_f64();
    let ok = producer.context().0.lock().unwrap().len() as u64 - topics.len() as u64;
    if ok != n {
        return Err(format!("{} of {n} records failed", n - ok).into());
    }
    println!("produced={n} secs={secs:.3} rate={:.0}", n as f64 / secs);
    Ok(())
}
