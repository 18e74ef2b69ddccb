//! The consumer's side of sql/08_inbox.sql against a real PostgreSQL: four workers claim inbox
//! rows with `inbox_claim` (FOR UPDATE SKIP LOCKED, the head of each key only), apply an effect and
//! mark the rows with `inbox_done` in the same transaction, while their connections are killed at
//! random instants (`pg_terminate_backend`: to the server, the same as the worker process dying).
//! No key's rows may take effect out of order, and no row twice. No Kafka: the rows are inserted
//! as `outboxd inbox` would.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const KEYS: usize = 25;
const PER_KEY: usize = 80;

/// One worker: claim, apply (a row in `effects`), mark done, commit; reconnect when killed.
async fn worker(pg_url: String, id: i32, stop: Arc<AtomicBool>, commits: Arc<AtomicUsize>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok((mut client, conn)) = tokio_postgres::connect(&pg_url, tokio_postgres::NoTls).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        tokio::spawn(conn);
        let _ = client.execute("SELECT set_config('application_name', $1, false)", &[&format!("worker{id}")]).await;
        // Until this connection is killed.
        while !stop.load(Ordering::Relaxed) {
            let Ok(tx) = client.transaction().await else { break };
            let Ok(rows) =
                tx.query("SELECT seq, aggregate_key, (payload_json->>'n')::int FROM public.inbox_claim(4)", &[]).await
            else {
                break;
            };
            if rows.is_empty() {
                let _ = tx.rollback().await;
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            let mut seqs = Vec::new();
            let mut failed = false;
            for r in &rows {
                let (seq, key, n): (i64, String, i32) = (r.get(0), r.get(1), r.get(2));
                seqs.push(seq);
                let applied = tx
                    .execute(
                        "INSERT INTO effects (worker, seq, key, n) VALUES ($1, $2, $3, $4)",
                        &[&id, &seq, &key, &n],
                    )
                    .await;
                failed |= applied.is_err();
                // Some work, so that kills land inside transactions.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if failed
                || tx.execute("SELECT public.inbox_done($1)", &[&seqs]).await.is_err()
                || tx.commit().await.is_err()
            {
                break;
            }
            commits.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[test]
fn four_workers_with_random_kills_keep_each_key_in_order_and_process_each_row_once() {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    pg.psql(
        "CREATE TABLE effects (id bigserial PRIMARY KEY, worker int, seq bigint, key text, n int); \
         INSERT INTO public.inbox (event_id, topic, kafka_partition, kafka_offset, aggregate_key, payload, payload_json) \
         SELECT 'e' || i, 't', 0, i, 'k' || (i % 25), convert_to(j::text, 'UTF8'), j \
           FROM generate_series(0, 1999) i, LATERAL (SELECT jsonb_build_object('n', i / 25) AS j) x \
          ORDER BY i;",
    );
    assert_eq!(KEYS * PER_KEY, 2000);
    let url = pg.url();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicUsize::new(0));
    let mut kills = 0;
    rt.block_on(async {
        let workers: Vec<_> =
            (0..4).map(|i| tokio::spawn(worker(url.clone(), i, stop.clone(), commits.clone()))).collect();
        let admin = pg.client().await;
        let t0 = Instant::now();
        let mut pause = 37u64;
        loop {
            let left: i64 = admin
                .query_one("SELECT count(*) FROM public.inbox WHERE processed_at IS NULL", &[])
                .await
                .unwrap()
                .get(0);
            if left == 0 {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(90), "{left} rows still unprocessed after 90 s");
            tokio::time::sleep(Duration::from_millis(pause)).await;
            pause = 20 + (pause * 7919 + 13) % 120;
            let victim = format!("worker{}", pause % 4);
            let n = admin
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                    &[&victim],
                )
                .await
                .unwrap();
            kills += n;
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            let _ = w.await;
        }
    });
    eprintln!("{kills} worker connections killed; {} transactions committed", commits.load(Ordering::Relaxed));
    assert!(kills >= 20, "only {kills} kills");
    let twice = pg.psql("SELECT seq, count(*) FROM effects GROUP BY seq HAVING count(*) > 1 LIMIT 5");
    assert!(twice.trim().is_empty(), "rows processed twice: {twice}");
    assert_eq!(pg.psql("SELECT count(*) FROM effects").trim(), "2000", "every row took effect once");
    // In the order the effects committed (id), each key's n runs 0, 1, 2, ...
    let disorder = pg.psql(
        "SELECT key, n, rn FROM (SELECT key, n, row_number() OVER (PARTITION BY key ORDER BY id) - 1 AS rn \
           FROM effects) x WHERE n <> rn LIMIT 5",
    );
    assert!(disorder.trim().is_empty(), "keys out of order: {disorder}");
    let workers_used = pg.psql("SELECT count(DISTINCT worker) FROM effects");
    assert_eq!(workers_used.trim(), "4", "all four workers took rows");
}

/// `inbox_prune` (what `outboxd inbox --retain` runs every minute) deletes processed rows past
/// both `retain` and the dedupe window, never an unprocessed one, and a row kept for the window
/// still turns a late duplicate away.
#[test]
fn prune_keeps_unprocessed_rows_and_the_ids_the_dedupe_window_needs() {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    // e0-e9: processed 3 h ago, received 4 h ago; e10-e19: processed 3 h ago, received 90 min
    // ago (inside a 2 h window); e20-e29: received 4 h ago, never processed.
    pg.psql(
        "INSERT INTO public.inbox (event_id, topic, kafka_partition, kafka_offset, received_at, processed_at) \
         SELECT 'e' || i, 't', 0, i, now() - CASE WHEN i BETWEEN 10 AND 19 THEN interval '90 min' ELSE interval '4 h' END, \
                CASE WHEN i < 20 THEN now() - interval '3 h' END \
           FROM generate_series(0, 29) i",
    );
    let prune = |retain: &str, window: &str| {
        pg.psql(&format!("SELECT public.inbox_prune(interval '{retain}', interval '{window}')")).trim().to_owned()
    };
    assert_eq!(prune("1 h", "5 h"), "0", "inside the dedupe window: nothing goes");
    assert_eq!(prune("4 h", "1 h"), "0", "processed less than --retain ago: nothing goes");
    assert_eq!(prune("1 h", "2 h"), "10", "processed past retain and received past the window");
    let left = pg.psql("SELECT string_agg(event_id, ',' ORDER BY seq) FROM public.inbox");
    assert_eq!(left.trim(), (10..30).map(|i| format!("e{i}")).collect::<Vec<_>>().join(","));
    // A late copy of a kept event is still turned away.
    let again = pg.psql(
        "WITH x AS (INSERT INTO public.inbox (event_id, topic, kafka_partition, kafka_offset) \
         VALUES ('e15', 't', 0, 99) ON CONFLICT (event_id) DO NOTHING RETURNING 1) SELECT count(*) FROM x",
    );
    assert_eq!(again.trim(), "0");
    assert_eq!(prune("1 min", "1 min"), "10", "the unprocessed rows stay whatever the settings");
    assert_eq!(pg.psql("SELECT count(*) FROM public.inbox WHERE processed_at IS NULL").trim(), "10");
}
