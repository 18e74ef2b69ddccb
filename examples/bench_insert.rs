//! Benchmark helper for `bench/run latency`: insert outbox rows at a steady rate, one row per
//! transaction (autocommit), for a fixed time.
//!
//! The load is spread over `--connections` connections; connection `w` inserts its `j`-th row at
//! `t0 + (j * K + w) / rate`. A worker that falls behind its schedule inserts at once until it has
//! caught up (no row is dropped), so the total is exactly `rate * secs` and the report says how
//! far behind the schedule the slowest row was. Rows look like the ones `bench/run` pre-inserts:
//! ~300 B of JSON, 1,000 aggregates, 5 event types; `created_at` is the column default `now()`.
//!
//! Usage: `bench_insert --pg CONNSTR --rate 5000 --secs 30 [--connections K] [--type-prefix P]`
//! Prints `inserted=N secs=S rate=R behind_max_ms=B commit_p50_ms=X commit_p99_ms=Y`.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::NoTls;

pub const EVENT_TYPES: [&str; 5] =
    ["order.created.v1", "order.paid.v1", "order.shipped.v1", "order.delivered.v1", "order.cancelled.v1"];

/// The payload of event `i`: about 300 bytes once stored as jsonb and printed back as text.
fn payload(i: u64) -> String {
    format!(
        concat!(
            r#"{{"orderId":{i},"customerId":"cust-{c:05}","status":"PAID","currency":"EUR","#,
            r#""total":{t}.{tc:02},"items":[{{"sku":"SKU-{s1:04}","qty":{q},"price":12.5}},"#,
            r#"{{"sku":"SKU-{s2:04}","qty":1,"price":7.25}}],"#,
            r#""shipTo":{{"street":"{n} Benchmark Street","city":"Amsterdam","country":"NL"}}}}"#
        ),
        i = i,
        c = i % 5000,
        t = 10 + i % 490,
        tc = i % 100,
        s1 = i % 317,
        q = 1 + i % 3,
        s2 = i % 211,
        n = 1 + i % 999,
    )
}

struct Args {
    pg: String,
    rate: u64,
    secs: u64,
    connections: u64,
    type_prefix: String,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut pg, mut rate, mut secs, mut connections) = (None, 1000u64, 30u64, None);
    let mut type_prefix = String::new();
    while let Some(a) = it.next() {
        let v = it.next().ok_or(format!("{a} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{a}: {e}"));
        match a.as_str() {
            "--pg" => pg = Some(v),
            "--rate" => rate = num(&v)?,
            "--secs" => secs = num(&v)?,
            "--connections" => connections = Some(num(&v)?),
            "--type-prefix" => type_prefix = v,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if rate == 0 {
        return Err("--rate must be > 0".into());
    }
    Ok(Args {
        pg: pg.ok_or("--pg is required")?,
        rate,
        secs,
        // One connection per 500 rows/s keeps each connection's period at >= 2 ms.
        connections: connections.unwrap_or(rate.div_ceil(500)).max(1),
        type_prefix,
    })
}

struct WorkerReport {
    inserted: u64,
    behind_max: Duration,
    commit_times: Vec<Duration>,
}

async fn worker(
    args: &Args,
    w: u64,
    t0: Instant,
    total: u64,
) -> Result<WorkerReport, Box<dyn std::error::Error + Send + Sync>> {
    let (client, conn) = tokio_postgres::connect(&args.pg, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("bench_insert: connection: {e}");
        }
    });
    let stmt = client
        .prepare(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', $1, $2, $3::text::jsonb)",
        )
        .await?;
    let types: Vec<String> = EVENT_TYPES.iter().map(|t| format!("{}{t}", args.type_prefix)).collect();
    let k = args.connections;
    let mut report = WorkerReport { inserted: 0, behind_max: Duration::ZERO, commit_times: Vec::new() };
    let mut j = 0u64;
    loop {
        let i = j * k + w;
        if i >= total {
            break;
        }
        let due = t0 + Duration::from_secs_f64(i as f64 / args.rate as f64);
        let now = Instant::now();
        if now < due {
            tokio::time::sleep_until(due).await;
        } else {
            report.behind_max = report.behind_max.max(now - due);
        }
        let aggregate = (i % 1000).to_string();
        let etype = &types[(i % types.len() as u64) as usize];
        let body = payload(i);
        let started = Instant::now();
        client.execute(&stmt, &[&aggregate, etype, &body]).await?;
        report.commit_times.push(started.elapsed());
        report.inserted += 1;
        j += 1;
    }
    Ok(report)
}

fn pct(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[idx].as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = parse_args().map_err(|e| format!("bench_insert: {e}"))?;
    let total = args.rate * args.secs;
    // Start the schedule a little in the future so that every worker has connected.
    let t0 = Instant::now() + Duration::from_millis(300);
    let args_ref = &args;
    let workers = (0..args.connections).map(|w| worker(args_ref, w, t0, total));
    let reports = futures_util::future::try_join_all(workers).await?;
    let secs = Instant::now().saturating_duration_since(t0).as_secs_f64();
    let inserted: u64 = reports.iter().map(|r| r.inserted).sum();
    let behind = reports.iter().map(|r| r.behind_max).max().unwrap_or_default();
    let mut commits: Vec<Duration> = reports.into_iter().flat_map(|r| r.commit_times).collect();
    commits.sort();
    println!(
        "inserted={inserted} secs={secs:.2} rate={:.0} connections={} behind_max_ms={:.1} commit_p50_ms={:.2} commit_p99_ms={:.2}",
        inserted as f64 / secs,
        args.connections,
        behind.as_secs_f64() * 1000.0,
        pct(&commits, 0.50),
        pct(&commits, 0.99),
    );
    Ok(())
}
