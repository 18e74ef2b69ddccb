//! A worker over the inbox table of `outboxd inbox` (sql/08_inbox.sql): claim rows in order per
//! key, apply each in the same transaction, mark them done, commit. Run as many as you like.
//! Usage: `inbox_worker POSTGRES_URL` (e.g. `host=localhost dbname=billing user=billing`).
//!
//! The effect here is a line on stdout and a row in `inbox_demo_effects`; put the business
//! change in its place. A crash or error before COMMIT rolls back both the effect and the mark,
//! and the rows are claimed again.

use std::time::Duration;

use tokio_postgres::NoTls;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).ok_or("usage: inbox_worker POSTGRES_URL")?;
    let (mut client, conn) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("connection ended: {e}");
        }
    });
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS inbox_demo_effects (seq bigint PRIMARY KEY, event_id text)")
        .await?;
    loop {
        let tx = client.transaction().await?;
        let rows = tx
            .query("SELECT seq, event_id, aggregate_key, event_type, payload_json FROM public.inbox_claim(10)", &[])
            .await?;
        if rows.is_empty() {
            tx.rollback().await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let mut done = Vec::with_capacity(rows.len());
        for r in &rows {
            let (seq, id): (i64, String) = (r.get(0), r.get(1));
            let key: Option<String> = r.get(2);
            println!("{seq} {id} key={key:?} type={:?}", r.get::<_, Option<String>>(3));
            tx.execute("INSERT INTO inbox_demo_effects (seq, event_id) VALUES ($1, $2)", &[&seq, &id]).await?;
            done.push(seq);
        }
        tx.execute("SELECT public.inbox_done($1)", &[&done]).await?;
        tx.commit().await?;
    }
}
