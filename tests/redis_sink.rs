//! `--sink redis` against the Redis on 127.0.0.1:6379 (it keeps nothing on disk): entries arrive
//! byte-exact and in order, a WRONGTYPE refusal goes through `--on-bad-event dlq`, and an outage
//! confirms nothing until Redis answers again; kill -9 under load loses nothing and replays only
//! transactions the slot had not confirmed.
//!
//! Each test writes only to streams under its own unique prefix and deletes them at the end.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

const REDIS_PORT: u16 = 6379;

fn redis() -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{REDIS_PORT}/0"))
        .and_then(|c| c.get_connection())
        .expect("Redis on 127.0.0.1:6379 (the CI service)")
}

type Entry = (String, Vec<Vec<u8>>);

fn xrange(con: &mut redis::Connection, stream: &str) -> Vec<Entry> {
    redis::cmd("XRANGE").arg(stream).arg("-").arg("+").query(con).expect("XRANGE")
}

/// Wait until `stream` holds at least `n` entries; return them all.
fn read_n(con: &mut redis::Connection, stream: &str, n: usize, timeout: Duration) -> Vec<Entry> {
    let mut got = Vec::new();
    wait_until(timeout, || {
        got = xrange(con, stream);
        got.len() >= n
    });
    got
}

/// Field name → value of one entry (names are UTF-8 here).
fn fields(e: &Entry) -> HashMap<String, Vec<u8>> {
    e.1.chunks(2).map(|p| (String::from_utf8(p[0].clone()).unwrap(), p[1].clone())).collect()
}

/// Deletes every key under the prefix when the test ends, pass or fail.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(mut con) =
            redis::Client::open(format!("redis://127.0.0.1:{REDIS_PORT}/0")).and_then(|c| c.get_connection())
        {
            let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{}*", self.0)).query(&mut con).unwrap_or_default();
            for k in keys {
                let _: Result<i64, _> = redis::cmd("DEL").arg(k).query(&mut con);
            }
        }
    }
}

fn insert(pg: &PgCluster, agg_type: &str, agg: &str, payload: &str, headers: &str) -> String {
    pg.insert_event(agg_type, agg, Some("e.v1"), payload, Some(headers))
}

fn slot_reaches_wal_end(pg: &PgCluster) -> bool {
    pg.wait_slot_reaches_wal_end(Duration::from_secs(30))
}

fn confirmed(pg: &PgCluster) -> String {
    pg.confirmed_lsn()
}

/// Streams named `<prefix>.<aggregate_type>`, DLQ `<prefix>.dlq`.
fn redis_args(pg: &PgCluster, prefix: &str, url: &str, extra: &[&str]) -> Vec<String> {
    let replacement = format!("{prefix}.${{routedByValue}}");
    let dlq = format!("{prefix}.dlq");
    let mut a: Vec<&str> = vec![
        "--sink",
        "redis",
        "--redis-url",
        url,
        "--route-by-field",
        "aggregate_type",
        "--route-topic-replacement",
        &replacement,
        "--dlq-topic",
        &dlq,
        "--status-interval",
        "200ms",
    ];
    a.extend_from_slice(extra);
    daemon_args_pg_only(pg, &a)
}

#[test]
fn events_arrive_byte_exact_in_order_and_the_slot_moves() {
    let prefix = unique_name("outboxd-redis-e2e");
    let _clean = Cleanup(prefix.clone());
    let mut con = redis();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    with_trace_context(&pg);
    let url = format!("redis://127.0.0.1:{REDIS_PORT}/0");
    let mut d = Outboxd::spawn_streaming(&redis_args(&pg, &prefix, &url, &["--redis-maxlen", "1000"]));
    let mut sent = Vec::new();
    for i in 0..20 {
        let agg = if i % 2 == 0 { "a-1" } else { "b-2" };
        let payload = format!("{{\"n\": {i}, \"s\": \"ü x\"}}");
        let id = insert(&pg, "order", agg, &payload, &format!("{{\"trace\": \"t-{i}\"}}"));
        let text = pg.psql(&format!("SELECT payload::text FROM outbox WHERE event_id = '{id}'"));
        sent.push((id, agg, text, format!("t-{i}")));
    }
    let stream = format!("{prefix}.order");
    let got = read_n(&mut con, &stream, sent.len(), Duration::from_secs(30));
    assert_eq!(got.len(), sent.len(), "{}", d.log());
    // One stream, so its order is commit order, and per key order with it.
    for (e, (id, agg, payload, trace)) in got.iter().zip(&sent) {
        let f = fields(e);
        assert_eq!(f["id"], id.as_bytes());
        assert_eq!(f["key"], agg.as_bytes());
        assert_eq!(f["payload"], payload.as_bytes(), "payload byte-exact");
        assert_eq!(f["trace"], trace.as_bytes(), "header as a field");
        assert_eq!(f["traceparent"], TRACEPARENT.as_bytes(), "W3C trace context from the column");
        assert_eq!(f["tracestate"], TRACESTATE.as_bytes());
        // key, payload, then the headers with id first.
        assert_eq!(e.1[0], b"key");
        assert_eq!(e.1[2], b"payload");
        assert_eq!(e.1[4], b"id");
    }
    assert!(slot_reaches_wal_end(&pg), "every XADD answered: the slot must move\n{}", d.log());
    d.stop_cleanly();
}

#[test]
fn a_wrongtype_refusal_is_dead_lettered_and_later_events_flow() {
    let prefix = unique_name("outboxd-redis-bad");
    let _clean = Cleanup(prefix.clone());
    let mut con = redis();
    // The routed stream's key exists as a plain string: XADD answers WRONGTYPE.
    let _: () = redis::cmd("SET").arg(format!("{prefix}.blocked")).arg("not a stream").query(&mut con).unwrap();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let url = format!("redis://127.0.0.1:{REDIS_PORT}/0");
    let mut d = Outboxd::spawn_streaming(&redis_args(&pg, &prefix, &url, &["--on-bad-event", "dlq"]));
    let before = insert(&pg, "fine", "k", "{\"n\": 1}", "{}");
    let bad = insert(&pg, "blocked", "k", "{\"n\": 2}", "{}");
    let after = insert(&pg, "fine", "k", "{\"n\": 3}", "{}");
    let ok = read_n(&mut con, &format!("{prefix}.fine"), 2, Duration::from_secs(30));
    let ids: Vec<Vec<u8>> = ok.iter().map(|e| fields(e)["id"].clone()).collect();
    assert_eq!(ids, vec![before.into_bytes(), after.into_bytes()], "{}", d.log());
    let dlq = read_n(&mut con, &format!("{prefix}.dlq"), 1, Duration::from_secs(30));
    assert_eq!(dlq.len(), 1, "{}", d.log());
    let f = fields(&dlq[0]);
    assert_eq!(f["id"], bad.as_bytes());
    assert_eq!(f["outboxd.error"], b"wrong_type");
    assert!(String::from_utf8_lossy(&f["outboxd.error.message"]).contains("WRONGTYPE"));
    assert_eq!(f["payload"], b"{\"n\": 2}");
    let kind: String = redis::cmd("TYPE").arg(format!("{prefix}.blocked")).query(&mut con).unwrap();
    assert_eq!(kind, "string", "the refused key is left alone");
    assert!(slot_reaches_wal_end(&pg), "the DLQ ack must let the slot move on\n{}", d.log());
    d.stop_cleanly();
}

#[test]
fn an_outage_confirms_nothing_and_everything_arrives_after_it() {
    use common::netfault::FreezeProxy;
    let prefix = unique_name("outboxd-redis-outage");
    let _clean = Cleanup(prefix.clone());
    let mut con = redis();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let proxy = FreezeProxy::start(REDIS_PORT);
    let url = format!("redis://127.0.0.1:{}/0", proxy.port);
    let mut d = Outboxd::spawn_streaming(&redis_args(&pg, &prefix, &url, &[]));
    let stream = format!("{prefix}.order");
    insert(&pg, "order", "a", "{\"n\": 0}", "{}");
    assert_eq!(read_n(&mut con, &stream, 1, Duration::from_secs(30)).len(), 1, "{}", d.log());
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    let before = confirmed(&pg);
    proxy.freeze();
    let mut ids = Vec::new();
    for i in 1..=10 {
        ids.push(insert(&pg, "order", "a", &format!("{{\"n\": {i}}}"), "{}"));
    }
    // Longer than the reply timeout: the writer gives up on the frozen link and keeps retrying.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(confirmed(&pg), before, "nothing may be confirmed while Redis is unreachable\n{}", d.log());
    assert_eq!(xrange(&mut con, &stream).len(), 1);
    assert!(
        wait_until(Duration::from_secs(30), || d.log().contains("Redis is unreachable")),
        "the writer must notice the dead link\n{}",
        d.log()
    );
    proxy.thaw();
    let got = read_n(&mut con, &stream, 11, Duration::from_secs(60));
    let mut seen: Vec<Vec<u8>> = Vec::new();
    for e in &got[1..] {
        let id = fields(e)["id"].clone();
        if !seen.contains(&id) {
            seen.push(id);
        }
    }
    let want: Vec<Vec<u8>> = ids.into_iter().map(String::into_bytes).collect();
    assert_eq!(seen, want, "all ten, first copies in order\n{}", d.log());
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    d.stop_cleanly();
}

/// kill -9 while entries stream into Redis, then restart: every event is in the stream (Redis has
/// no duplicate window, so the replayed ones appear twice), no transaction the slot had confirmed at
/// the kill is replayed, and the first copies keep each key's order.
#[test]
fn kill9_under_load_then_restart_loses_nothing_and_replays_only_unconfirmed_transactions() {
    let prefix = unique_name("outboxd-redis-kill");
    let _clean = Cleanup(prefix.clone());
    let mut con = redis();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let url = format!("redis://127.0.0.1:{REDIS_PORT}/0");
    let args = redis_args(&pg, &prefix, &url, &[]);
    let mut d = Outboxd::spawn_streaming(&args);
    const TXNS: u64 = 10;
    const ROWS: u64 = 3000;
    // The WAL position after each transaction's commit bounds its end LSN from above.
    let mut after = Vec::new();
    for t in 0..TXNS {
        pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', 'k' || (g % 5), 'load', jsonb_build_object('t', {t}, 'n', {t} * {ROWS} + g) \
             FROM generate_series(1, {ROWS}) g"
        ));
        after.push(pg.current_lsn());
    }
    let stream = format!("{prefix}.order");
    assert!(read_n(&mut con, &stream, ROWS as usize, Duration::from_secs(60)).len() >= ROWS as usize, "{}", d.log());
    d.kill9();
    let confirmed_at_kill = confirmed(&pg);
    let at_kill = xrange(&mut con, &stream).len();
    let confirmed_txns: Vec<bool> = after
        .iter()
        .map(|lsn| pg.psql(&format!("SELECT '{lsn}'::pg_lsn <= '{confirmed_at_kill}'::pg_lsn")) == "t")
        .collect();
    let mut d2 = Outboxd::spawn_streaming(&args);
    assert!(slot_reaches_wal_end(&pg), "{}", d2.log());
    let got = xrange(&mut con, &stream);
    let mut copies: HashMap<u64, u32> = HashMap::new();
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut replayed = 0;
    for e in &got {
        let f = fields(e);
        let v: serde_json::Value = serde_json::from_slice(&f["payload"]).expect("payload is JSON");
        let (t, n) = (v["t"].as_u64().unwrap(), v["n"].as_u64().unwrap());
        let c = copies.entry(n).or_default();
        *c += 1;
        if *c > 1 {
            replayed += 1;
            assert!(
                !confirmed_txns[t as usize],
                "event {n} of transaction {t} replayed though the slot had confirmed it"
            );
            continue;
        }
        let key = String::from_utf8(f["key"].clone()).unwrap();
        let prev = last.insert(key.clone(), n);
        assert!(prev.is_none_or(|p| p < n), "key {key}: {n} after {prev:?}");
    }
    assert_eq!(copies.len() as u64, TXNS * ROWS, "events lost\n{}", d2.log());
    let unconfirmed_rows = confirmed_txns.iter().filter(|c| !**c).count() as u64 * ROWS;
    assert!(replayed <= unconfirmed_rows, "{replayed} replayed, only {unconfirmed_rows} rows unconfirmed");
    eprintln!("killed with {at_kill} of {} stored; {replayed} replayed", TXNS * ROWS);
    d2.stop_cleanly();
}
