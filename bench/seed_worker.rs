//! The seed article's Go polling worker, rebuilt in Rust for `bench/poll.sh`, so outboxd poll can
//! be measured beside the loop it replaces. Written from the article's description, not copied:
//! the same loop and SQL, the same per-event synchronous publish, the same flush behaviour.
//!
//! * one READ COMMITTED transaction per batch of 100:
//!   `SELECT ... WHERE published_at IS NULL ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 100`;
//! * per event, one synchronous publish that waits for the broker's ack (`acks=all`); the Go
//!   writer (segmentio kafka-go) holds a message up to its `BatchTimeout` of 10 ms before it
//!   sends a batch that is not full, and a synchronous writer never fills one, so every publish
//!   waits out the timer: here `linger.ms=10` (`--linger-ms` changes it; 0 is the "without its
//!   flush timer" variant);
//! * per event, one UPDATE: on success `published_at = now(), attempts = attempts + 1, error =
//!   NULL`; on failure `attempts = attempts + 1, error = ...`; commit at the end of the batch;
//! * an empty batch sleeps 200 ms.
//!
//! Usage: seed_worker POSTGRES_URL BROKERS TOPIC [--linger-ms N] [--exit-when-empty]

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_postgres::NoTls;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: seed_worker POSTGRES_URL BROKERS TOPIC [--linger-ms N] [--exit-when-empty]");
        std::process::exit(2);
    }
    let (url, brokers, topic) = (&args[1], &args[2], &args[3]);
    let linger = args.iter().position(|a| a == "--linger-ms").and_then(|i| args.get(i + 1)).map_or("10", |s| s);
    let exit_when_empty = args.iter().any(|a| a == "--exit-when-empty");
    let (mut client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(conn);
    let producer: FutureProducer =
        ClientConfig::new().set("bootstrap.servers", brokers).set("acks", "all").set("linger.ms", linger).create()?;
    loop {
        let tx = client.transaction().await?;
        let rows = tx
            .query(
                "SELECT event_id::text, aggregate_type, aggregate_id, event_type, payload::text, headers::text \
                 FROM outbox WHERE published_at IS NULL ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT $1",
                &[&100i64],
            )
            .await?;
        let mut processed = 0;
        for r in &rows {
            let (id, agg, ty, payload): (String, String, String, String) = (r.get(0), r.get(2), r.get(3), r.get(4));
            let headers = OwnedHeaders::new()
                .insert(Header { key: "event_id", value: Some(id.as_str()) })
                .insert(Header { key: "event_type", value: Some(ty.as_str()) });
            let record = FutureRecord::to(topic).key(&agg).payload(&payload).headers(headers);
            match producer.send(record, Duration::from_secs(30)).await {
                Ok(_) => {
                    tx.execute(
                        "UPDATE outbox SET published_at = now(), attempts = attempts + 1, error = NULL WHERE event_id = ($1::text)::uuid",
                        &[&id],
                    )
                    .await?;
                    processed += 1;
                }
                Err((e, _)) => {
                    let mut s = e.to_string();
                    s.truncate(500);
                    tx.execute(
                        "UPDATE outbox SET attempts = attempts + 1, error = $2 WHERE event_id = ($1::text)::uuid",
                        &[&id, &s],
                    )
                    .await?;
                }
            }
        }
        tx.commit().await?;
        if processed == 0 {
            if exit_when_empty {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
