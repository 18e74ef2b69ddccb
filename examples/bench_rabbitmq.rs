//! Benchmark helper for `bench/run`'s RabbitMQ drain row: the exchange and queue outboxd
//! publishes into, on the broker at `--url` (default `amqp://127.0.0.1:5672/%2f`).
//!
//! * `setup NAME`: a durable topic exchange NAME and a durable queue NAME bound to it with `#`,
//!   so every routed topic lands in the queue (durable queue + persistent messages: the confirms
//!   outboxd waits for include the disk write, as in production);
//! * `purge NAME`: empty the queue and print how many messages it held;
//! * `teardown NAME`: delete both;
//! * `flood NAME N`: the broker's own ceiling: publish N persistent ~300 B messages to exchange
//!   NAME with confirms (up to 4096 outstanding, as outboxd), print `seconds messages/s`.
//!
//! Usage: `bench_rabbitmq [--url URL] setup|purge|teardown|flood NAME [N]`

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut url = "amqp://127.0.0.1:5672/%2f".to_owned();
    if args.first().map(String::as_str) == Some("--url") && args.len() > 1 {
        url = args.remove(1);
        args.remove(0);
    }
    let (Some(cmd), Some(name)) = (args.first().cloned(), args.get(1).cloned()) else {
        eprintln!("usage: bench_rabbitmq [--url URL] setup|purge|teardown NAME");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    if let Err(e) = rt.block_on(run(&url, &cmd, &name, n)) {
        eprintln!("bench_rabbitmq {cmd} {name}: {e}");
        std::process::exit(1);
    }
}

async fn run(url: &str, cmd: &str, name: &str, n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let chan = conn.create_channel().await?;
    match cmd {
        "setup" => {
            let durable = ExchangeDeclareOptions { durable: true, ..Default::default() };
            chan.exchange_declare(name, ExchangeKind::Topic, durable, FieldTable::default()).await?;
            let durable = QueueDeclareOptions { durable: true, ..Default::default() };
            chan.queue_declare(name, durable, FieldTable::default()).await?;
            chan.queue_bind(name, name, "#", QueueBindOptions::default(), FieldTable::default()).await?;
        }
        "purge" => println!("{}", chan.queue_purge(name, QueuePurgeOptions::default()).await?),
        "teardown" => {
            chan.queue_delete(name, QueueDeleteOptions::default()).await?;
            chan.exchange_delete(name, ExchangeDeleteOptions::default()).await?;
        }
        "flood" => {
            use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
            chan.confirm_select(ConfirmSelectOptions::default()).await?;
            let body = vec![b'x'; 300];
            let props = lapin::BasicProperties::default().with_delivery_mode(2);
            let t0 = std::time::Instant::now();
            let mut pending = std::collections::VecDeque::new();
            for i in 0..n {
                let key = format!("order.{}", i % 5);
                let c = chan.basic_publish(name, &key, BasicPublishOptions::default(), &body, props.clone()).await?;
                pending.push_back(c);
                if pending.len() >= 4096 {
                    if let Some(c) = pending.pop_front() {
                        c.await?;
                    }
                }
            }
            for c in pending {
                c.await?;
            }
            let secs = t0.elapsed().as_secs_f64();
            println!("{secs:.2} {:.0}", n as f64 / secs);
        }
        other => return Err(format!("unknown command {other:?}").into()),
    }
    conn.close(200, "done").await?;
    Ok(())
}
