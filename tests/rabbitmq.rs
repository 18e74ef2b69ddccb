//! `--sink rabbitmq` against the real RabbitMQ on 127.0.0.1:5672 (guest/guest; a service on this
//! machine and in CI). Each test declares its own durable exchange and queues under a unique
//! prefix and deletes them at the end. Messages are read back with lapin's `basic.get`, so their
//! order is the queue's.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::netfault::{Dir, FreezeProxy};
use common::*;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

const RABBIT_PORT: u16 = 5672;

/// One message as a consumer sees it.
#[derive(Debug)]
struct Msg {
    routing_key: String,
    message_id: Option<String>,
    delivery_mode: Option<u8>,
    headers: HashMap<String, Vec<u8>>,
    payload: Vec<u8>,
}

impl Msg {
    fn header(&self, name: &str) -> String {
        String::from_utf8_lossy(self.headers.get(name).map(Vec::as_slice).unwrap_or(b"<missing>")).into_owned()
    }
}

/// A test's own exchange and queues on the shared broker, deleted by [`Rabbit::delete`].
struct Rabbit {
    _conn: Connection,
    chan: Channel,
    prefix: String,
    exchange: Option<String>,
    queues: Vec<String>,
}

impl Rabbit {
    async fn connect() -> Rabbit {
        let url = format!("amqp://127.0.0.1:{RABBIT_PORT}/%2f");
        let conn = Connection::connect(&url, ConnectionProperties::default()).await.expect("RabbitMQ on 5672");
        let chan = conn.create_channel().await.expect("channel");
        Rabbit { _conn: conn, chan, prefix: unique_name("obx"), exchange: None, queues: Vec::new() }
    }

    /// A durable topic exchange named after the prefix.
    async fn with_exchange(mut self) -> Rabbit {
        let name = format!("{}-x", self.prefix);
        let opts = ExchangeDeclareOptions { durable: true, ..Default::default() };
        self.chan.exchange_declare(&name, ExchangeKind::Topic, opts, FieldTable::default()).await.expect("exchange");
        self.exchange = Some(name);
        self
    }

    /// A durable queue `<prefix>.<suffix>`, bound to the exchange (if any) with `pattern`.
    async fn queue(&mut self, suffix: &str, pattern: Option<&str>) -> String {
        let name = format!("{}.{suffix}", self.prefix);
        let opts = QueueDeclareOptions { durable: true, ..Default::default() };
        self.chan.queue_declare(&name, opts, FieldTable::default()).await.expect("queue");
        if let (Some(x), Some(p)) = (&self.exchange, pattern) {
            self.chan.queue_bind(&name, x, p, QueueBindOptions::default(), FieldTable::default()).await.expect("bind");
        }
        self.queues.push(name.clone());
        name
    }

    async fn count(&self, queue: &str) -> u32 {
        let opts = QueueDeclareOptions { passive: true, ..Default::default() };
        self.chan.queue_declare(queue, opts, FieldTable::default()).await.map(|q| q.message_count()).unwrap_or(0)
    }

    async fn wait_count(&self, queue: &str, n: u32, timeout: Duration) -> bool {
        wait_until_async(timeout, || async { self.count(queue).await >= n }).await
    }

    /// Take every message now in `queue`, in queue order.
    async fn drain(&self, queue: &str) -> Vec<Msg> {
        let mut out = Vec::new();
        while let Some(m) = self.chan.basic_get(queue, BasicGetOptions { no_ack: true }).await.expect("basic.get") {
            let d = m.delivery;
            let headers = d
                .properties
                .headers()
                .as_ref()
                .map(|t| {
                    t.inner()
                        .iter()
                        .map(|(k, v)| {
                            let bytes = match v {
                                AMQPValue::LongString(s) => s.as_bytes().to_vec(),
                                other => format!("<not a long string: {other:?}>").into_bytes(),
                            };
                            (k.to_string(), bytes)
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Msg {
                routing_key: d.routing_key.to_string(),
                message_id: d.properties.message_id().as_ref().map(|s| s.to_string()),
                delivery_mode: *d.properties.delivery_mode(),
                headers,
                payload: d.data,
            });
        }
        out
    }

    async fn delete(self) {
        for q in &self.queues {
            let _ = self.chan.queue_delete(q, QueueDeleteOptions::default()).await;
        }
        if let Some(x) = &self.exchange {
            let _ = self.chan.exchange_delete(x, ExchangeDeleteOptions::default()).await;
        }
    }
}

fn rabbit_args(pg: &PgCluster, url: &str, r: &Rabbit, extra: &[&str]) -> Vec<String> {
    let replacement = format!("{}.${{routedByValue}}", r.prefix);
    let dlq = format!("{}.dlq", r.prefix);
    let exchange = r.exchange.clone().unwrap_or_default();
    let mut a = vec!["--sink", "rabbitmq", "--rabbitmq-url", url, "--rabbitmq-exchange", &exchange];
    a.extend(["--route-topic-replacement", &replacement, "--dlq-topic", &dlq, "--status-interval", "200ms"]);
    a.extend(extra);
    daemon_args_pg_only(pg, &a)
}

fn local_url(port: u16) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

/// On the default exchange: queues `ok` and `dlq`, a cluster with the outbox, and outboxd
/// streaming with `--on-bad-event dlq`. Returns (broker handle, ok queue, dlq queue, cluster,
/// daemon); bind them in this order so the daemon is dropped first.
async fn default_exchange_with_dlq() -> (Rabbit, String, String, PgCluster, Outboxd) {
    let mut r = Rabbit::connect().await;
    let ok = r.queue("ok", None).await;
    let dlq = r.queue("dlq", None).await;
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let d = Outboxd::spawn_streaming(&rabbit_args(&pg, &local_url(RABBIT_PORT), &r, &["--on-bad-event", "dlq"]));
    (r, ok, dlq, pg, d)
}

async fn slot_reaches(pg: &PgCluster, lsn: &str) -> bool {
    wait_until_async(Duration::from_secs(30), || async { pg.slot_confirmed_at_least(lsn) }).await
}

/// Payload, key, id, message_id, persistence and expanded headers arrive byte-exact through a
/// topic exchange with the routed topic as routing key; per-key order holds; the slot moves past
/// the events once the broker confirmed them; the connection gauge shows the link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_rabbitmq_with_headers_in_order_and_slot_confirmed() {
    let mut r = Rabbit::connect().await.with_exchange().await;
    let q = r.queue("all", Some("#")).await;
    let pg = PgCluster::start();
    pg.apply_all_sql();
    with_trace_context(&pg);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = Outboxd::spawn_streaming(&rabbit_args(&pg, &local_url(RABBIT_PORT), &r, &["--metrics-addr", &addr]));
    let mut expected = Vec::new();
    for i in 0..60 {
        let agg = format!("agg-{}", i % 3);
        let ty = ["order.created", "order.paid"][i % 2];
        let payload = format!("{{\"n\": {i}, \"name\": \"\u{e9}\u{20ac}\", \"price\": 10.50}}");
        let id = pg.insert_event("t", &agg, Some(ty), &payload, Some(&format!("{{\"traceId\": \"t-{i}\"}}")));
        expected.push((id, agg, ty, i));
    }
    let end = pg.current_lsn();
    assert!(r.wait_count(&q, 60, Duration::from_secs(30)).await, "{} of 60 queued\n{}", r.count(&q).await, d.log());
    assert!(slot_reaches(&pg, &end).await, "slot never confirmed the confirmed events\n{}", d.log());
    let msgs = r.drain(&q).await;
    assert_eq!(msgs.len(), 60, "{}", d.log());
    let texts: HashMap<String, String> = pg
        .psql("SELECT event_id, payload::text FROM outbox")
        .lines()
        .map(|l| l.split_once('|').map(|(a, b)| (a.to_owned(), b.to_owned())).unwrap())
        .collect();
    let mut last_n: HashMap<String, usize> = HashMap::new();
    for m in &msgs {
        let id = m.header("id");
        let (_, agg, ty, i) = expected.iter().find(|e| e.0 == id).expect("an id we inserted");
        assert_eq!(m.routing_key, format!("{}.{ty}", r.prefix));
        assert_eq!(m.payload, texts[&id].as_bytes(), "payload of {id}");
        assert_eq!(&m.header("key"), agg);
        assert_eq!(m.message_id.as_deref(), Some(id.as_str()));
        assert_eq!(m.delivery_mode, Some(2), "not persistent");
        assert_eq!(m.header("traceId"), format!("t-{i}"));
        assert_eq!(m.header("traceparent"), TRACEPARENT, "W3C trace context from the column");
        assert_eq!(m.header("tracestate"), TRACESTATE);
        let prev = last_n.insert(agg.clone(), *i);
        assert!(prev.is_none_or(|p| p < *i), "{agg}: event {i} after {prev:?}");
    }
    let (_, body) = http_get(port, "/metrics").unwrap();
    assert_eq!(metric(&body, "outboxd_connected{component=\"rabbitmq\"}"), Some(1.0), "{body}");
    assert_eq!(http_get(port, "/readyz").map(|(s, _)| s), Some(200));
    d.stop_cleanly();
    r.delete().await;
}

/// On the default exchange the routing key names the queue. A topic with no queue comes back as
/// basic.return: a definite refusal of that one event, so `--on-bad-event dlq` puts it on the
/// dead-letter queue, later events still flow, and the slot moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_event_goes_to_the_dead_letter_queue_and_later_events_flow() {
    let (r, ok, dlq, pg, mut d) = default_exchange_with_dlq().await;
    let good1 = pg.insert_event("t", "a", Some("ok"), "{\"n\": 1}", None);
    let bad = pg.insert_event("t", "b", Some("stray"), "{\"n\": 2}", None);
    let good2 = pg.insert_event("t", "c", Some("ok"), "{\"n\": 3}", None);
    let end = pg.current_lsn();
    assert!(slot_reaches(&pg, &end).await, "the dead-letter confirm must let the slot move on\n{}", d.log());
    let oks: Vec<String> = r.drain(&ok).await.iter().map(|m| m.header("id")).collect();
    assert_eq!(oks, [good1, good2], "{}", d.log());
    let dead = r.drain(&dlq).await;
    assert_eq!(dead.len(), 1, "{}", d.log());
    assert_eq!(dead[0].header("id"), bad);
    assert_eq!(dead[0].header("outboxd.error"), "unroutable");
    assert_eq!(dead[0].header("key"), "b");
    assert_eq!(dead[0].payload, b"{\"n\": 2}");
    assert!(d.log().contains("unroutable"), "{}", d.log());
    d.stop_cleanly();
    r.delete().await;
}

/// Unroutable events mixed with routable ones at full speed, so the broker confirms many publishes
/// with one `multiple` ack: exactly the unroutable ones are dead-lettered and every routable one
/// reaches its queue (a returned message is matched to its own event, not to whichever confirm
/// lapin delivered it with).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_unroutable_events_are_told_apart_under_batched_confirms() {
    let (r, ok, dlq, pg, mut d) = default_exchange_with_dlq().await;
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 't', 'k' || (g % 7), CASE WHEN g % 3 = 0 THEN 'stray' ELSE 'ok' END, jsonb_build_object('n', g) \
         FROM generate_series(1, 3000) g",
    );
    let end = pg.current_lsn();
    assert!(slot_reaches(&pg, &end).await, "{}", d.log());
    let n_of = |m: &Msg| serde_json::from_slice::<serde_json::Value>(&m.payload).unwrap()["n"].as_u64().unwrap();
    let oks: Vec<u64> = r.drain(&ok).await.iter().map(n_of).collect();
    let dead = r.drain(&dlq).await;
    assert!(dead.iter().all(|m| m.header("outboxd.error") == "unroutable"), "{}", d.log());
    let mut dead: Vec<u64> = dead.iter().map(n_of).collect();
    dead.sort_unstable();
    let want_dead: Vec<u64> = (1..=3000).filter(|g| g % 3 == 0).collect();
    assert_eq!(dead, want_dead, "dead-lettered events are not exactly the unroutable ones");
    let mut seen = std::collections::HashSet::new();
    let firsts: Vec<u64> = oks.iter().copied().filter(|n| seen.insert(*n)).collect();
    assert_eq!(firsts, (1..=3000).filter(|g| g % 3 != 0).collect::<Vec<_>>(), "routable events lost or reordered");
    d.stop_cleanly();
    r.delete().await;
}

/// Two outages through a TCP proxy. A held link (bytes wait, nothing is lost): nothing is
/// confirmed during it, everything arrives in order after it. A frozen, half-open link: the
/// heartbeat notices, /readyz and the gauge go down, nothing is confirmed; after the thaw
/// outboxd reconnects, publishes the unconfirmed events again in order, and the slot moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_confirm_nothing_then_everything_arrives_in_order() {
    let mut r = Rabbit::connect().await.with_exchange().await;
    let q = r.queue("all", Some("#")).await;
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let proxy = FreezeProxy::start(RABBIT_PORT);
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f?heartbeat=2", proxy.port);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = Outboxd::spawn_streaming(&rabbit_args(&pg, &url, &r, &["--metrics-addr", &addr]));
    let connected = || {
        let (_, body) = http_get(port, "/metrics").unwrap_or_default();
        metric(&body, "outboxd_connected{component=\"rabbitmq\"}")
    };
    let mut n = 0;
    let mut insert = |count: usize| {
        for _ in 0..count {
            pg.insert_event("t", &format!("k{}", n % 3), Some("ev"), &format!("{{\"n\": {n}}}"), None);
            n += 1;
        }
        pg.current_lsn()
    };
    let before = insert(1);
    assert!(slot_reaches(&pg, &before).await, "{}", d.log());

    // 1. Held: outboxd's bytes stop at the proxy.
    proxy.hold_after(Dir::Up, 0);
    let end1 = insert(20);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!pg.slot_confirmed_at_least(&end1), "the slot moved during the hold\n{}", d.log());
    assert!(r.count(&q).await < 21, "everything queued through a held link\n{}", d.log());
    proxy.release(Dir::Up);
    assert!(slot_reaches(&pg, &end1).await, "{}", d.log());

    // 2. Frozen: the link is silent both ways and never closed.
    proxy.freeze();
    let end2 = insert(20);
    assert!(wait_until(Duration::from_secs(20), || connected() == Some(0.0)), "gauge never fell\n{}", d.log());
    assert_eq!(http_get(port, "/readyz").map(|(s, _)| s), Some(503));
    assert!(!pg.slot_confirmed_at_least(&end2), "the slot moved while the link was frozen\n{}", d.log());
    proxy.thaw();
    assert!(slot_reaches(&pg, &end2).await, "{}", d.log());
    assert!(wait_until(Duration::from_secs(5), || connected() == Some(1.0)), "gauge never rose\n{}", d.log());

    let msgs = r.drain(&q).await;
    let ns: Vec<u64> = msgs
        .iter()
        .map(|m| serde_json::from_slice::<serde_json::Value>(&m.payload).unwrap()["n"].as_u64().unwrap())
        .collect();
    // Every event at least once; copies (a publish stored whose confirm was lost in the freeze)
    // only as a resent suffix, so each key's first copies are in order.
    for want in 0..41 {
        assert!(ns.contains(&want), "event {want} lost: {ns:?}\n{}", d.log());
    }
    let mut seen = std::collections::HashSet::new();
    let firsts: Vec<u64> = ns.iter().copied().filter(|n| seen.insert(*n)).collect();
    assert_eq!(firsts, (0..41).collect::<Vec<_>>(), "first copies out of order: {ns:?}");
    eprintln!("{} messages for 41 events", ns.len());
    assert!(d.log().contains("reconnecting"), "no reconnect logged\n{}", d.log());
    d.stop_cleanly();
    r.delete().await;
}

/// `outboxd config` shows the RabbitMQ URL with its password masked.
#[test]
fn config_masks_the_rabbitmq_password() {
    assert_config_masks(
        &[
            "--sink",
            "rabbitmq",
            "--rabbitmq-url",
            "amqps://app:hunter2@mq.example:5671/prod",
            "--rabbitmq-exchange",
            "outbox",
        ],
        &["--rabbitmq-url 'amqps://app:****@mq.example:5671/prod'", "--rabbitmq-exchange outbox"],
        "hunter2",
    );
}

/// A wrong password and a missing exchange end start-up with a one-line error naming the flags,
/// the password never shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_login_and_missing_exchange_are_setup_errors() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let r = Rabbit::connect().await;
    let bad_login = format!("amqp://guest:wr0ng-pw@127.0.0.1:{RABBIT_PORT}/%2f");
    let (code, out) = run_to_exit(&rabbit_args(&pg, &bad_login, &r, &[]), Duration::from_secs(30));
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("--rabbitmq-url") && !out.contains("wr0ng-pw"), "{out}");
    let missing = Rabbit { exchange: Some(format!("{}-none", r.prefix)), ..r };
    let (code, out) = run_to_exit(&rabbit_args(&pg, &local_url(RABBIT_PORT), &missing, &[]), Duration::from_secs(30));
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("--rabbitmq-exchange") && out.contains("-none"), "{out}");
}

/// kill -9 while events stream to RabbitMQ, then restart: every event is in the queue (counted by
/// event id); replays are bounded by what was unconfirmed at the kill, and each key's first
/// copies are in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_under_load_then_restart_loses_nothing() {
    let mut r = Rabbit::connect().await.with_exchange().await;
    let q = r.queue("all", Some("#")).await;
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let a = rabbit_args(&pg, &local_url(RABBIT_PORT), &r, &[]);
    let mut d = Outboxd::spawn_streaming(&a);
    const TXNS: u64 = 10;
    const ROWS: u64 = 3000;
    pg.insert_load("t", 5, TXNS, ROWS);
    assert!(r.wait_count(&q, ROWS as u32, Duration::from_secs(60)).await, "{}", d.log());
    d.kill9();
    let at_kill = r.count(&q).await;
    let mut d2 = Outboxd::spawn_streaming(&a);
    let end = pg.current_lsn();
    assert!(slot_reaches(&pg, &end).await, "{}", d2.log());
    d2.stop_cleanly();
    let msgs = r.drain(&q).await;
    let ids: Vec<String> = pg.psql("SELECT event_id FROM outbox").lines().map(str::to_owned).collect();
    assert_eq!(ids.len() as u64, TXNS * ROWS);
    let mut copies: HashMap<String, usize> = HashMap::new();
    for m in &msgs {
        *copies.entry(m.header("id")).or_default() += 1;
    }
    let lost: Vec<&String> = ids.iter().filter(|id| !copies.contains_key(*id)).collect();
    assert!(lost.is_empty(), "{} events lost (killed at {at_kill} queued), e.g. {:?}", lost.len(), lost.first());
    assert_eq!(copies.len(), ids.len(), "ids in the queue that were never inserted");
    let duplicates = msgs.len() - ids.len();
    // A replay starts at the slot's confirmed position: at most what was in flight at the kill,
    // which --max-in-flight (10000 by default) bounds, plus the rest of a transaction.
    assert!(duplicates as u64 <= 10_000 + ROWS, "{duplicates} duplicates");
    let mut seen = std::collections::HashSet::new();
    let mut last: HashMap<String, u64> = HashMap::new();
    for m in msgs.iter().filter(|m| seen.insert(m.header("id"))) {
        let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        let n = v["n"].as_u64().unwrap();
        let prev = last.insert(m.header("key"), n);
        assert!(prev.is_none_or(|p| p < n), "key {}: {n} after {prev:?}", m.header("key"));
    }
    eprintln!("killed with {at_kill} of {} queued; {duplicates} duplicates after the restart", TXNS * ROWS);
    r.delete().await;
}

/// Sets the broker's `max_message_size` for the life of the guard (channels opened meanwhile take
/// it), through `rabbitmqctl`, and puts the previous value back on drop. Other tests here publish
/// far smaller messages, so the lowered limit does not touch them.
struct MaxMessageSize(u64);

impl MaxMessageSize {
    fn set(bytes: u64) -> MaxMessageSize {
        let get = rabbitmqctl("application:get_env(rabbit, max_message_size).");
        let old = get.trim().trim_start_matches("{ok,").trim_end_matches('}').parse().unwrap_or(134_217_728);
        rabbitmqctl(&format!("application:set_env(rabbit, max_message_size, {bytes})."));
        MaxMessageSize(old)
    }
}

impl Drop for MaxMessageSize {
    fn drop(&mut self) {
        rabbitmqctl(&format!("application:set_env(rabbit, max_message_size, {}).", self.0));
    }
}

fn rabbitmqctl(expr: &str) -> String {
    let out = std::process::Command::new("rabbitmqctl")
        .args(["eval", expr])
        .output()
        .expect("rabbitmqctl (the RabbitMQ service's CLI) must be runnable by the test user");
    assert!(out.status.success(), "rabbitmqctl eval {expr}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A message over the broker's max_message_size (lowered to 1 MiB here): RabbitMQ closes the
/// channel with 406; outboxd learns the limit from the refusal, dead-letters that event as
/// too_large in chunks that fit, publishes the others again, and the slot moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_message_is_dead_lettered_as_too_large_and_later_events_flow() {
    const LIMIT: u64 = 1024 * 1024;
    let _limit = MaxMessageSize::set(LIMIT);
    let (r, ok, dlq, pg, mut d) = default_exchange_with_dlq().await;
    let good1 = pg.insert_event("t", "a", Some("ok"), "{\"n\": 1}", None);
    let big = pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('t', 'b', 'ok', jsonb_build_object('blob', repeat('x', {}))) RETURNING event_id",
        2 * LIMIT
    ));
    let big = big.lines().next().unwrap().to_owned();
    let good2 = pg.insert_event("t", "c", Some("ok"), "{\"n\": 3}", None);
    let end = pg.current_lsn();
    assert!(slot_reaches(&pg, &end).await, "{}", d.log());
    let oks = r.drain(&ok).await;
    let mut seen = std::collections::HashSet::new();
    let firsts: Vec<String> = oks.iter().map(|m| m.header("id")).filter(|id| seen.insert(id.clone())).collect();
    assert_eq!(firsts, [good1, good2], "{}", d.log());
    let dead = r.drain(&dlq).await;
    assert!(!dead.is_empty(), "no dead-letter copy\n{}", d.log());
    assert!(dead.iter().all(|m| m.header("id") == big && m.header("outboxd.error") == "too_large"), "{dead:?}");
    assert!(dead.iter().all(|m| m.payload.len() as u64 <= LIMIT));
    assert!(d.log().contains("larger than configured max size"), "{}", d.log());
    d.stop_cleanly();
    r.delete().await;
}
