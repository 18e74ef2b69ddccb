//! Kafka cluster failures under a steady writer: a 3-broker Apache Kafka cluster (plus a dedicated
//! controller; `default.replication.factor=3`, `min.insync.replicas=2`) and outboxd producing with
//! its defaults (idempotent, `acks=all`, `message.timeout.ms=0`) while a writer commits numbered
//! events ([`Numbered`]'s rows: event `i` is aggregate `agg-{i % 23}`, payload `{"n": i}`) in
//! 5-event transactions. The faults:
//!
//! 1. kill -9 of the broker leading the most partitions of the topic; it is started again, and
//!    once every partition has its full ISR back, kill -9 of a follower (a broker leading no
//!    partition of the topic then, normally the one just restarted). `acks=all` then waits until
//!    the controller fences the dead follower out of the ISR.
//! 2. SIGSTOP of the leader for 12 s, longer than the producer's `request.timeout.ms` (5 s) and
//!    than `broker.session.timeout.ms` (9 s, so the controller moves its leaderships), then SIGCONT.
//! 3. A rolling restart: controlled shutdown, start, wait ready and for the full ISR, one broker at
//!    a time.
//! 4. Two brokers killed (one left: NOT_ENOUGH_REPLICAS): nothing written after the kill may be
//!    confirmed to the slot, outboxd stays up and `/readyz` says not ready; one broker started
//!    again is enough for outboxd to resume by itself.
//! 5. Reassignment of every partition to a rotated replica list, then a preferred leader election
//!    (every leader moves), twice, while streaming.
//!
//! Invariants every test checks after draining:
//! * lost = 0: every committed event id is in Kafka, and nothing else is;
//! * per key (aggregate) the first occurrences of its events are in commit order;
//! * duplicates only of records in flight at a fault: a repeated event belongs to a transaction
//!   that the slot had not confirmed when the fault began and that committed before outboxd had
//!   recovered from it; their number is printed;
//! * the slot never passed an unacked record: the topic uses `LogAppendTime`, so each record's
//!   timestamp is when its leader appended it (before any ack). A sampler reads
//!   `confirmed_flush_lsn` every ~100 ms; when a sample at time t shows the slot past a
//!   transaction, every event of that transaction must have been appended by t. Test 4 also
//!   checks the stronger, direct form (the slot stays below the first transaction written after
//!   the kill until a broker returns), and test 2 the same for the frozen leader's partitions.
//!
//! Figures (events, duplicates, seconds to resume) are printed with `eprintln!` (`--nocapture`).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};

use common::*;

const AGGREGATES: usize = 23;
const BATCH: usize = 5;
/// Clock granularity allowed between a record's LogAppendTime (ms) and a slot sample's time.
const CLOCK_SLACK_MS: i64 = 50;
fn lsn(s: &str) -> u64 {
    let (hi, lo) = s.trim().split_once('/').unwrap_or_else(|| panic!("not an LSN: {s:?}"));
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

fn show(l: u64) -> String {
    format!("{:X}/{:X}", l >> 32, l & 0xffff_ffff)
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn confirmed(pg: &PgCluster) -> u64 {
    lsn(&pg.confirmed_lsn())
}

// ---------------------------------------------------------------------------
// the writer and the slot sampler
// ---------------------------------------------------------------------------

/// One committed writer transaction of events `first..first + BATCH`.
#[derive(Clone, Copy, Debug)]
struct Batch {
    first: usize,
    /// WAL insert position inside the transaction, after its rows and before its commit record:
    /// a slot confirmed past it has confirmed the transaction.
    in_txn: u64,
    /// WAL insert position read after the commit: an upper bound of the commit's end.
    after: u64,
    /// When the transaction was sent (it cannot have committed earlier).
    started: Instant,
}

/// Commits [`Numbered`]'s rows, BATCH per transaction, until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    batches: Arc<Mutex<Vec<Batch>>>,
    handle: JoinHandle<()>,
}

impl Writer {
    fn start(pg: &PgCluster, kind: &'static str) -> Writer {
        let ev = Numbered::new(pg, kind, AGGREGATES);
        let stop = Arc::new(AtomicBool::new(false));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let handle = {
            let (stop, batches) = (stop.clone(), batches.clone());
            std::thread::spawn(move || {
                let mut next = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Numbered's rows, plus the WAL position inside and after the transaction
                    // (one -c is one implicit transaction; the next -c runs after the commit).
                    let sql = format!("{}; SELECT pg_current_wal_insert_lsn()", ev.insert_sql(next, BATCH));
                    let started = Instant::now();
                    let out = psql_socket(&ev.sock, ev.port, &[&sql, "SELECT pg_current_wal_insert_lsn()"])
                        .expect("psql runs");
                    assert!(out.status.success(), "writer: {}", String::from_utf8_lossy(&out.stderr));
                    let text = String::from_utf8_lossy(&out.stdout);
                    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
                    let in_txn = lsn(lines.next().expect("in-transaction LSN"));
                    let after = lsn(lines.next().expect("after-commit LSN"));
                    batches.lock().unwrap().push(Batch { first: next, in_txn, after, started });
                    next += BATCH;
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        Writer { stop, batches, handle }
    }

    /// Events committed so far.
    fn written(&self) -> usize {
        self.batches.lock().unwrap().len() * BATCH
    }

    /// Waits for the first transaction sent at or after `since`.
    fn first_batch_since(&self, since: Instant, timeout: Duration) -> Option<Batch> {
        let mut found = None;
        wait_until(timeout, || {
            found = self.batches.lock().unwrap().iter().find(|b| b.started >= since).copied();
            found.is_some()
        });
        found
    }

    fn finish(self) -> Vec<Batch> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("writer thread");
        let b = self.batches.lock().unwrap().clone();
        b
    }
}

/// Reads the slot's confirmed_flush_lsn about every 100 ms: (wall-clock ms after the read, LSN).
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<(i64, u64)>>,
}

impl Sampler {
    fn start(pg: &PgCluster) -> Sampler {
        let (sock, port) = (pg.socket_dir(), pg.port());
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let q = "SELECT coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = 'outboxd'";
                    if let Ok(o) = psql_socket(&sock, port, &[q]) {
                        let t = now_ms();
                        let s = String::from_utf8_lossy(&o.stdout).trim().to_owned();
                        if o.status.success() && s.contains('/') {
                            out.push((t, lsn(&s)));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                out
            })
        };
        Sampler { stop, handle }
    }

    fn finish(self) -> Vec<(i64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("sampler thread")
    }
}

/// Time from `since` until the slot confirmed the first transaction sent after `since`.
fn resumed_after(pg: &PgCluster, w: &Writer, since: Instant, timeout: Duration) -> Option<Duration> {
    let b = w.first_batch_since(since, timeout)?;
    let left = (since + timeout).saturating_duration_since(Instant::now());
    wait_until(left, || confirmed(pg) > b.in_txn).then(|| since.elapsed())
}

// ---------------------------------------------------------------------------
// cluster helpers
// ---------------------------------------------------------------------------

/// (partition, leader, replicas, isr) of one partition.
type PartitionState = (i32, i32, Vec<i32>, Vec<i32>);

/// (partition, leader, isr): what the outage diagnosis records.
type LeaderIsr = (i32, i32, Vec<i32>);

/// Every partition of `topic`; None when no broker answered.
fn partitions(broker: &Broker, topic: &str) -> Option<Vec<PartitionState>> {
    let consumer: BaseConsumer = broker.client_config().create().ok()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)).ok()?;
    let mut out: Vec<_> = md
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| (p.id(), p.leader(), p.replicas().to_vec(), p.isr().to_vec())))
        .collect();
    out.sort();
    Some(out)
}

/// Waits until every partition of `topic` has a leader and all 3 replicas in its ISR.
fn wait_full_isr(broker: &Broker, topic: &str, timeout: Duration) {
    let mut last = None;
    let ok = wait_until(timeout, || {
        last = partitions(broker, topic);
        last.as_ref().is_some_and(|ps| ps.len() == 3 && ps.iter().all(|(_, l, _, isr)| *l > 0 && isr.len() == 3))
    });
    assert!(ok, "{topic} never got its full ISR back: {last:?}\n{}", broker.log());
}

/// The broker leading the most partitions of `topic`, and the partitions it leads.
fn busiest_leader(broker: &Broker, topic: &str) -> (u32, Vec<i32>) {
    let ps = broker.replicas(topic);
    let mut by: HashMap<i32, Vec<i32>> = HashMap::new();
    for (p, leader, _) in &ps {
        by.entry(*leader).or_default().push(*p);
    }
    let (leader, parts) = by.into_iter().max_by_key(|(l, ps)| (ps.len(), -*l)).expect("partitions");
    assert!(leader > 0, "no leader: {ps:?}");
    (leader as u32, parts)
}

/// Creates `topic` with 3 partitions, LogAppendTime, and replication factor 3 and
/// `min.insync.replicas=2` stated explicitly, so these tests do not depend on the cluster's
/// defaults (with a dedicated controller, CreateTopics' -1 is resolved by the controller's own
/// `default.replication.factor`, and in Kafka 4.x the controller publishes its
/// `min.insync.replicas` cluster-wide; scripts/kafka sets both on the controller, and
/// `topics_outboxd_creates_are_as_durable_as_the_cluster` checks what it gets).
fn create_rf3_topic(broker: &Broker, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let cfg = broker.client_config();
    let name = topic.to_owned();
    let res = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let admin: AdminClient<DefaultClientContext> = cfg.create().map_err(|e| e.to_string())?;
            let new = NewTopic::new(&name, 3, TopicReplication::Fixed(3))
                .set("message.timestamp.type", "LogAppendTime")
                .set("min.insync.replicas", "2");
            let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
            let out = admin.create_topics([&new], &opts).await.map_err(|e| e.to_string())?;
            out.into_iter().try_for_each(|r| r.map(|_| ()).map_err(|(t, c)| format!("{t}: {c}")))
        })
    })
    .join()
    .expect("create topic thread");
    if let Err(e) = res {
        panic!("create {topic}: {e}\n{}", broker.log());
    }
}

/// A PostgreSQL cluster with the outbox table, 3 brokers, and `{kind}.v1.events` with 3
/// partitions, RF 3 and LogAppendTime, every replica in sync.
fn cluster(kind: &str) -> (PgCluster, Broker, String) {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::options().brokers(3).start();
    let topic = format!("{kind}.v1.events");
    create_rf3_topic(&broker, &topic);
    wait_full_isr(&broker, &topic, Duration::from_secs(60));
    (pg, broker, topic)
}

/// outboxd streaming to `broker` with `extra` flags; returns it and its metrics port.
fn daemon(pg: &PgCluster, broker: &Broker, extra: &[&str]) -> (Outboxd, u16) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut flags = vec!["--status-interval", "200ms", "--reconnect-max-backoff", "1s", "--metrics-addr", &addr];
    flags.extend_from_slice(extra);
    (Outboxd::spawn_streaming(&daemon_args(pg, broker, &flags)), port)
}

// ---------------------------------------------------------------------------
// the checks
// ---------------------------------------------------------------------------

/// A fault's replay window: events of transactions the slot had not confirmed when the fault
/// began (`after > from_lsn`), committed before outboxd had recovered (`index < until`).
struct Window {
    label: &'static str,
    from_lsn: u64,
    until: usize,
}

struct Figures {
    events: usize,
    duplicates: usize,
}

fn index_of(id: &str) -> usize {
    usize::from_str_radix(id.rsplit('-').next().unwrap(), 16).unwrap_or_else(|e| panic!("event id {id}: {e}"))
}

/// Drains `topic` and checks the invariants of the module doc; panics with details otherwise.
fn verify(
    pg: &PgCluster,
    broker: &Broker,
    topic: &str,
    batches: &[Batch],
    samples: &[(i64, u64)],
    windows: &[Window],
) -> Figures {
    let total = batches.len() * BATCH;
    let in_table: usize = pg.psql("SELECT count(*) FROM outbox").parse().unwrap();
    assert_eq!(in_table, total, "the writer's bookkeeping disagrees with the table");
    assert!(pg.wait_slot_reaches_wal_end(Duration::from_secs(120)), "slot never caught up: {}", pg.confirmed_lsn());
    let records = broker.consume_all(topic, 3, total, Duration::from_secs(180));

    // Per event: copies, earliest append time.
    let mut copies = vec![0usize; total];
    let mut appended = vec![i64::MAX; total];
    let mut unknown = Vec::new();
    // Per key, in (partition, offset) order: first occurrences must be increasing.
    let mut last_first: HashMap<String, usize> = HashMap::new();
    let mut order_breaks = Vec::new();
    let mut key_partitions: HashMap<String, HashSet<i32>> = HashMap::new();
    for r in &records {
        let id = r.header_str("id").expect("id header");
        let i = index_of(&id);
        if i >= total {
            unknown.push(id);
            continue;
        }
        let key = r.key_str().expect("key");
        assert_eq!(key, format!("agg-{}", i % AGGREGATES), "event {i} has the wrong key");
        assert_eq!(r.payload_json()["n"].as_u64(), Some(i as u64), "event {i} payload");
        key_partitions.entry(key.clone()).or_default().insert(r.partition);
        copies[i] += 1;
        let ts = r.timestamp_ms.expect("record timestamp");
        appended[i] = appended[i].min(ts);
        if copies[i] == 1 {
            if let Some(prev) = last_first.insert(key.clone(), i) {
                if prev > i {
                    order_breaks.push(format!(
                        "{key}: event {i} first seen after event {prev} (partition {}, offset {})",
                        r.partition, r.offset
                    ));
                }
            }
        }
    }
    let lost: Vec<usize> = (0..total).filter(|&i| copies[i] == 0).collect();
    let duplicates: usize = copies.iter().map(|c| c.saturating_sub(1)).sum();
    eprintln!("  read back {} records for {total} events: {} lost, {duplicates} duplicates", records.len(), lost.len());
    assert!(unknown.is_empty(), "records that are not in the outbox: {:?}", &unknown[..unknown.len().min(5)]);
    assert!(lost.is_empty(), "{} events lost, e.g. {:?}", lost.len(), &lost[..lost.len().min(10)]);
    let split: Vec<_> = key_partitions.iter().filter(|(_, ps)| ps.len() > 1).collect();
    assert!(split.is_empty(), "keys spread over several partitions: {split:?}");
    assert!(order_breaks.is_empty(), "order per key broken: {:?}", &order_breaks[..order_breaks.len().min(10)]);

    // Duplicates only inside a fault's window, and no more than those windows hold.
    let in_window = |i: usize| {
        let b = &batches[i / BATCH];
        windows.iter().any(|w| b.after > w.from_lsn && i < w.until)
    };
    let outside: Vec<String> = (0..total)
        .filter(|&i| copies[i] > 1 && !in_window(i))
        .map(|i| format!("event {i} x{} (txn after-LSN {})", copies[i], show(batches[i / BATCH].after)))
        .collect();
    assert!(outside.is_empty(), "duplicates outside every fault window: {:?}", &outside[..outside.len().min(10)]);
    let window_events = (0..total).filter(|&i| in_window(i)).count();
    for w in windows {
        let n = (0..total).filter(|&i| batches[i / BATCH].after > w.from_lsn && i < w.until).count();
        eprintln!(
            "  window {:?}: from slot {} to event {}: {n} events could be replayed",
            w.label,
            show(w.from_lsn),
            w.until
        );
    }
    assert!(duplicates <= window_events, "{duplicates} duplicates, but only {window_events} events were in flight");

    // The slot never passed an unacked record: every transaction below a sample was appended by
    // the sample's time. Batches are in commit order, so those below a sample are a prefix.
    let mut prefix_max = Vec::with_capacity(batches.len());
    let mut worst = (i64::MIN, 0usize);
    for (k, b) in batches.iter().enumerate() {
        for (i, &at) in appended.iter().enumerate().skip(b.first).take(BATCH) {
            if at > worst.0 {
                worst = (at, i);
            }
        }
        prefix_max.push((worst, k));
    }
    let mut checked = 0;
    for &(t, c) in samples {
        let below = batches.partition_point(|b| b.in_txn < c);
        if below == 0 {
            continue;
        }
        checked += 1;
        let ((ts, i), _) = prefix_max[below - 1];
        assert!(
            ts <= t + CLOCK_SLACK_MS,
            "at {t} ms the slot was confirmed at {}, past event {i} (transaction in-LSN {}), which was appended only at {ts} ms ({} ms later)",
            show(c),
            show(batches[i / BATCH].in_txn),
            ts - t
        );
    }
    assert!(checked > 10, "only {checked} slot samples covered any transaction");
    eprintln!("  slot check: {checked} samples, none past an unappended record");
    Figures { events: total, duplicates }
}

// ---------------------------------------------------------------------------
// the tests
// ---------------------------------------------------------------------------

#[test]
fn leader_kill9_then_follower_kill9() {
    let (pg, broker, topic) = cluster("leaderkill");
    let (mut d, _) = daemon(&pg, &broker, &[]);
    let sampler = Sampler::start(&pg);
    let w = Writer::start(&pg, "leaderkill");
    std::thread::sleep(Duration::from_secs(5));

    // Leader kill.
    let (leader, led) = busiest_leader(&broker, &topic);
    eprintln!("killing broker {leader}, leader of partitions {led:?}: {:?}", broker.replicas(&topic));
    let c0 = confirmed(&pg);
    let t0 = Instant::now();
    broker.kill_node(leader);
    let r1 = resumed_after(&pg, &w, t0, Duration::from_secs(120));
    assert!(r1.is_some(), "not resumed within 120 s of the leader's kill -9:\n{}", d.log());
    let until1 = w.written();
    // The broker the harness asks may answer from metadata a moment older than the delivery.
    let moved = |r: &[(i32, i32, Vec<i32>)]| r.iter().all(|(_, l, _)| *l > 0 && *l as u32 != leader);
    wait_until(Duration::from_secs(15), || moved(&broker.replicas(&topic)));
    let after_kill = broker.replicas(&topic);
    assert!(moved(&after_kill), "leadership did not move: {after_kill:?}");
    assert!(d.is_running(), "{}", d.log());
    std::thread::sleep(Duration::from_secs(3));

    // The killed broker comes back and catches up.
    broker.start_node(leader);
    broker.wait_ready();
    wait_full_isr(&broker, &topic, Duration::from_secs(120));
    std::thread::sleep(Duration::from_secs(2));

    // Follower kill: a broker that leads no partition of the topic now.
    let ps = broker.replicas(&topic);
    let leaders: HashSet<i32> = ps.iter().map(|(_, l, _)| *l).collect();
    let follower = broker.broker_ids().into_iter().find(|id| !leaders.contains(&(*id as i32))).unwrap_or_else(|| {
        panic!("every broker leads a partition of {topic}: {ps:?}");
    });
    eprintln!("killing broker {follower}, a follower only: {ps:?}");
    let c1 = confirmed(&pg);
    let t1 = Instant::now();
    broker.kill_node(follower);
    let r2 = resumed_after(&pg, &w, t1, Duration::from_secs(120));
    assert!(r2.is_some(), "not resumed within 120 s of the follower's kill -9:\n{}", d.log());
    let until2 = w.written();
    assert!(d.is_running(), "{}", d.log());
    std::thread::sleep(Duration::from_secs(3));

    let batches = w.finish();
    assert!(pg.wait_slot_reaches_wal_end(Duration::from_secs(60)), "slot stuck at {}\n{}", pg.confirmed_lsn(), d.log());
    let samples = sampler.finish();
    let f = verify(
        &pg,
        &broker,
        &topic,
        &batches,
        &samples,
        &[
            Window { label: "leader kill", from_lsn: c0, until: until1 },
            Window { label: "follower kill", from_lsn: c1, until: until2 },
        ],
    );
    eprintln!(
        "leader+follower kill -9: {} events, {} duplicates, resumed {:.1} s after the leader's kill, {:.1} s after the follower's",
        f.events,
        f.duplicates,
        r1.unwrap().as_secs_f64(),
        r2.unwrap().as_secs_f64()
    );
    d.stop_cleanly();
}

#[test]
fn leader_frozen_past_the_request_timeout() {
    let (pg, broker, topic) = cluster("frozen");
    let (mut d, _) = daemon(&pg, &broker, &["--kafka-property", "request.timeout.ms=5000"]);
    let sampler = Sampler::start(&pg);
    let w = Writer::start(&pg, "frozen");
    std::thread::sleep(Duration::from_secs(5));

    let (leader, led) = busiest_leader(&broker, &topic);
    eprintln!("freezing broker {leader}, leader of partitions {led:?}: {:?}", broker.replicas(&topic));
    let c0 = confirmed(&pg);
    let t0 = Instant::now();
    let t0_ms = now_ms();
    broker.pause_node(leader);
    // Frozen 12 s: past request.timeout.ms (5 s) and broker.session.timeout.ms (9 s).
    let r = resumed_after(&pg, &w, t0, Duration::from_secs(12));
    std::thread::sleep(Duration::from_secs(12).saturating_sub(t0.elapsed()));
    let frozen_for = t0.elapsed();
    let t1 = Instant::now();
    broker.resume_node(leader);
    let r = r.or_else(|| resumed_after(&pg, &w, t0, Duration::from_secs(120)));
    assert!(r.is_some(), "not resumed within 120 s of the freeze:\n{}", d.log());
    let until = w.written();
    assert!(d.is_running(), "{}", d.log());
    wait_full_isr(&broker, &topic, Duration::from_secs(120));
    let isr_back = t1.elapsed();
    std::thread::sleep(Duration::from_secs(3));

    let batches = w.finish();
    assert!(pg.wait_slot_reaches_wal_end(Duration::from_secs(60)), "slot stuck at {}\n{}", pg.confirmed_lsn(), d.log());
    let samples = sampler.finish();

    // Direct check: while the frozen broker still led them (the first 6 s, before the controller
    // can fence it), nothing could be acked on its partitions, so the slot stays below the first
    // transaction after the freeze that wrote to one of them.
    let records = broker.consume_all(&topic, 3, batches.len() * BATCH, Duration::from_secs(180));
    let part_of: HashMap<usize, i32> =
        records.iter().map(|r| (index_of(&r.header_str("id").unwrap()), r.partition)).collect();
    let first_stuck = batches
        .iter()
        .filter(|b| b.started >= t0)
        .find(|b| (b.first..b.first + BATCH).any(|i| part_of.get(&i).is_some_and(|p| led.contains(p))))
        .copied()
        .expect("a transaction to the frozen leader's partitions");
    let mut direct = 0;
    for &(t, c) in samples.iter().filter(|(t, _)| *t >= t0_ms && *t <= t0_ms + 6000) {
        direct += 1;
        assert!(
            c <= first_stuck.in_txn,
            "{} ms into the freeze the slot was at {}, past transaction {} (in-LSN {}) to a frozen partition",
            t - t0_ms,
            show(c),
            first_stuck.first / BATCH,
            show(first_stuck.in_txn)
        );
    }
    // A sample is a psql process: a loaded box takes fewer than on a quiet one.
    assert!(direct > 2, "only {direct} slot samples during the freeze");

    let f = verify(&pg, &broker, &topic, &batches, &samples, &[Window { label: "freeze", from_lsn: c0, until }]);
    eprintln!(
        "leader SIGSTOP {:.1} s: {} events, {} duplicates, resumed {:.1} s after the SIGSTOP; full ISR {:.1} s after SIGCONT",
        frozen_for.as_secs_f64(),
        f.events,
        f.duplicates,
        r.unwrap().as_secs_f64(),
        isr_back.as_secs_f64()
    );
    d.stop_cleanly();
}

#[test]
fn rolling_restart_of_every_broker() {
    let (pg, broker, topic) = cluster("rolling");
    let (mut d, _) = daemon(&pg, &broker, &[]);
    let sampler = Sampler::start(&pg);
    let w = Writer::start(&pg, "rolling");
    std::thread::sleep(Duration::from_secs(5));

    let roll_ms = now_ms();
    let mut windows = Vec::new();
    let mut steps = Vec::new();
    for id in broker.broker_ids() {
        let c = confirmed(&pg);
        let t = Instant::now();
        broker.stop_node(id);
        assert!(broker.node_pid(id).is_none(), "broker {id} still runs after its controlled shutdown");
        broker.start_node(id);
        broker.wait_ready();
        wait_full_isr(&broker, &topic, Duration::from_secs(120));
        let r = resumed_after(&pg, &w, t, Duration::from_secs(60));
        assert!(r.is_some(), "slot not moving after broker {id}'s restart:\n{}", d.log());
        assert!(d.is_running(), "{}", d.log());
        windows.push(Window { label: "restart", from_lsn: c, until: w.written() });
        steps.push(t.elapsed());
        eprintln!("broker {id} restarted in {:.1} s: {:?}", t.elapsed().as_secs_f64(), broker.replicas(&topic));
    }
    let roll_end_ms = now_ms();
    std::thread::sleep(Duration::from_secs(3));

    let batches = w.finish();
    assert!(pg.wait_slot_reaches_wal_end(Duration::from_secs(60)), "slot stuck at {}\n{}", pg.confirmed_lsn(), d.log());
    let samples = sampler.finish();
    // The longest time the slot stood still during the roll (the writer commits every ~50 ms).
    let mut stall = 0i64;
    let mut since = (roll_ms, 0u64);
    for &(t, c) in samples.iter().filter(|(t, _)| *t >= roll_ms && *t <= roll_end_ms) {
        if c != since.1 {
            since = (t, c);
        }
        stall = stall.max(t - since.0);
    }
    let f = verify(&pg, &broker, &topic, &batches, &samples, &windows);
    eprintln!(
        "rolling restart: {} events, {} duplicates, steps {:?} s, longest slot stall {:.1} s",
        f.events,
        f.duplicates,
        steps.iter().map(|s| (s.as_secs_f64() * 10.0).round() / 10.0).collect::<Vec<_>>(),
        stall as f64 / 1000.0
    );
    d.stop_cleanly();
}

#[test]
fn two_brokers_down_confirms_nothing_and_resumes_when_one_returns() {
    let (pg, broker, topic) = cluster("minisr");
    let (mut d, port) = daemon(&pg, &broker, &["--kafka-property", "request.timeout.ms=5000"]);
    let sampler = Sampler::start(&pg);
    let w = Writer::start(&pg, "minisr");
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        wait_until(Duration::from_secs(10), || http_get(port, "/readyz").is_some_and(|(c, _)| c == 200)),
        "not ready before the fault"
    );

    let (a, _) = busiest_leader(&broker, &topic);
    let b = broker.broker_ids().into_iter().find(|id| *id != a).unwrap();
    let c0 = confirmed(&pg);
    broker.kill_node(a);
    broker.kill_node(b);
    let t0 = Instant::now();
    let t0_ms = now_ms();
    // Nothing can be acked from here on (one live broker, min.insync.replicas=2).
    let l0 = lsn(&pg.current_lsn());
    eprintln!("killed brokers {a} and {b}; WAL at {}", show(l0));

    // 25 s outage: outboxd stays up; /readyz must turn not ready and stay so.
    let mut readyz: Vec<(f64, Option<u16>)> = Vec::new();
    // (s since the kill, [(partition, leader, isr)]) for the diagnosis of a failure.
    let mut isr_seen: Vec<(f64, Vec<LeaderIsr>)> = Vec::new();
    while t0.elapsed() < Duration::from_secs(25) {
        assert!(d.is_running(), "outboxd exited during the outage:\n{}", d.log());
        readyz.push((t0.elapsed().as_secs_f64(), http_get(port, "/readyz").map(|(c, _)| c)));
        if readyz.len() % 4 == 1 {
            let ps = partitions(&broker, &topic).unwrap_or_default();
            isr_seen.push((t0.elapsed().as_secs_f64(), ps.into_iter().map(|(p, l, _, isr)| (p, l, isr)).collect()));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let heal_ms = now_ms();
    let during = confirmed(&pg);
    let batch_count = w.written() / BATCH;

    // One broker back: outboxd resumes by itself.
    let t1 = Instant::now();
    broker.start_node(a);
    let r = resumed_after(&pg, &w, t1, Duration::from_secs(120));
    let resume_ready = wait_until(Duration::from_secs(30), || http_get(port, "/readyz").is_some_and(|(c, _)| c == 200));
    let until = w.written();
    assert!(d.is_running(), "{}", d.log());
    broker.start_node(b);
    broker.wait_ready();
    wait_full_isr(&broker, &topic, Duration::from_secs(120));
    std::thread::sleep(Duration::from_secs(3));

    let batches = w.finish();
    let samples = sampler.finish();
    // The first transaction after the kill bounds the slot during the whole outage.
    let first_unacked = batches.iter().find(|b| b.in_txn > l0).copied().expect("a transaction after the kill");
    let outage: Vec<(i64, u64)> = samples.iter().copied().filter(|(t, _)| *t >= t0_ms && *t <= heal_ms).collect();
    eprintln!(
        "outage: {} slot samples, slot {} -> {}, first unacked transaction in-LSN {}, {} transactions written during it, /readyz {:?}",
        outage.len(),
        show(c0),
        show(during),
        show(first_unacked.in_txn),
        batch_count - first_unacked.first / BATCH,
        readyz.iter().map(|(t, c)| format!("{t:.0}s:{}", c.map_or("-".into(), |c| c.to_string()))).collect::<Vec<_>>()
    );
    assert!(outage.len() > 20, "too few slot samples during the outage: {}", outage.len());
    if let Some(&(t, c)) = outage.iter().find(|(_, c)| *c > first_unacked.in_txn) {
        // Diagnose before failing: where and when were the records of the transactions the slot
        // passed appended (LogAppendTime), and what did the metadata say meanwhile?
        let passed: Vec<&Batch> = batches.iter().filter(|b| b.in_txn > l0 && b.in_txn < c).collect();
        let records = broker.consume_all(&topic, 3, batches.len() * BATCH, Duration::from_secs(120));
        let lo = passed.first().map_or(0, |b| b.first);
        let hi = passed.last().map_or(0, |b| b.first + BATCH);
        let mut seen: Vec<(usize, i32, i64, i64)> = records
            .iter()
            .map(|r| {
                (index_of(&r.header_str("id").unwrap()), r.partition, r.offset, r.timestamp_ms.unwrap_or(0) - t0_ms)
            })
            .filter(|(i, ..)| *i >= lo && *i < hi)
            .collect();
        seen.sort();
        panic!(
            "{} ms into the outage the slot was confirmed at {}, past the first unacked transaction (in-LSN {}): \
             {} transactions (events {lo}..{hi}) passed; their records (event, partition, offset, appended ms after the kill): {:?}\n\
             metadata during the outage (s, [(partition, leader, isr)]): {isr_seen:?}\n{}",
            t - t0_ms,
            show(c),
            show(first_unacked.in_txn),
            passed.len(),
            &seen[..seen.len().min(40)],
            d.log()
        );
    }
    assert!(r.is_some(), "not resumed within 120 s of broker {a}'s return:\n{}", d.log());
    assert!(resume_ready, "/readyz not ready again 30 s after the resume");

    let f = verify(&pg, &broker, &topic, &batches, &samples, &[Window { label: "outage", from_lsn: c0, until }]);
    eprintln!(
        "two brokers down: {} events, {} duplicates, resumed {:.1} s after one broker was started again",
        f.events,
        f.duplicates,
        r.unwrap().as_secs_f64()
    );
    // Last, so the figures above are printed either way: not ready from 15 s after the kill on,
    // until a broker returned (nothing could be delivered meanwhile).
    // (outboxd counts Kafka down after 10 s with records outstanding and no ack; before that a
    // metadata answer from the surviving broker may still read as up.)
    let late: Vec<&(f64, Option<u16>)> = readyz.iter().filter(|(t, _)| *t > 15.0).collect();
    assert!(
        late.len() >= 5 && late.iter().all(|(_, c)| *c != Some(200)),
        "/readyz during the outage (s since the kill: status): {readyz:?}"
    );
    d.stop_cleanly();
}

#[test]
fn reassignment_and_leader_election_while_streaming() {
    let (pg, broker, topic) = cluster("elect");
    let (mut d, _) = daemon(&pg, &broker, &[]);
    let sampler = Sampler::start(&pg);
    let w = Writer::start(&pg, "elect");
    std::thread::sleep(Duration::from_secs(5));

    let dir = tempfile::tempdir().expect("tempdir");
    let admin = broker.admin_bootstrap();
    let mut windows = Vec::new();
    let mut resumes = Vec::new();
    for round in 0..2 {
        let before = broker.replicas(&topic);
        // Every partition's replica list rotated by one: a new preferred leader, the same brokers.
        let wanted: Vec<(i32, Vec<i32>)> = before
            .iter()
            .map(|(p, _, rs)| {
                let mut rs = rs.clone();
                rs.rotate_left(1);
                (*p, rs)
            })
            .collect();
        let json = serde_json::json!({
            "version": 1,
            "partitions": wanted.iter().map(|(p, rs)| serde_json::json!({"topic": topic, "partition": p, "replicas": rs})).collect::<Vec<_>>()
        });
        let file = dir.path().join(format!("reassign-{round}.json"));
        std::fs::write(&file, json.to_string()).unwrap();
        let file = file.to_str().unwrap();
        const REASSIGN: &str = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand";
        let c = confirmed(&pg);
        let t = Instant::now();
        let (ok, out) =
            broker.tool(REASSIGN, &["--bootstrap-server", &admin, "--reassignment-json-file", file, "--execute"]);
        assert!(ok, "reassignment failed: {out}");
        let mut last = String::new();
        let done = wait_until(Duration::from_secs(60), || {
            let (ok, out) =
                broker.tool(REASSIGN, &["--bootstrap-server", &admin, "--reassignment-json-file", file, "--verify"]);
            last = out;
            ok && last.matches("is completed").count() == 3
        });
        assert!(done, "reassignment not completed: {last}");
        let (ok, out) = broker.tool(
            "LeaderElectionCommand",
            &["--bootstrap-server", &admin, "--election-type", "PREFERRED", "--all-topic-partitions"],
        );
        assert!(ok, "preferred election failed: {out}");
        let mut now = Vec::new();
        let moved = wait_until(Duration::from_secs(30), || {
            now = broker.replicas(&topic);
            now.iter().all(|(p, l, rs)| wanted.iter().any(|(q, w)| q == p && w == rs && w[0] == *l))
        });
        assert!(moved, "round {round}: leaders did not move to the new preferred replicas: {before:?} -> {now:?}");
        let r = resumed_after(&pg, &w, t, Duration::from_secs(60));
        assert!(r.is_some(), "round {round}: slot not moving after the election:\n{}", d.log());
        assert!(d.is_running(), "{}", d.log());
        windows.push(Window { label: "reassign+elect", from_lsn: c, until: w.written() });
        resumes.push(r.unwrap().as_secs_f64());
        eprintln!("round {round}: {before:?} -> {now:?} in {:.1} s", t.elapsed().as_secs_f64());
        std::thread::sleep(Duration::from_secs(3));
    }

    let batches = w.finish();
    assert!(pg.wait_slot_reaches_wal_end(Duration::from_secs(60)), "slot stuck at {}\n{}", pg.confirmed_lsn(), d.log());
    let samples = sampler.finish();
    let f = verify(&pg, &broker, &topic, &batches, &samples, &windows);
    eprintln!(
        "reassignment + preferred election x2: {} events, {} duplicates, slot past the first later transaction {resumes:?} s after each round began",
        f.events, f.duplicates
    );
    d.stop_cleanly();
}

/// outboxd creates its topic itself, with its defaults (`--topic-replication-factor -1`: the
/// cluster's `default.replication.factor`, 3 here): the topic gets three replicas and
/// `min.insync.replicas=2`, and a kill -9 of its leader under the writer loses nothing.
#[test]
fn topics_outboxd_creates_are_as_durable_as_the_cluster() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::options().brokers(3).start();
    let topic = "durable.v1.events".to_string();
    let (mut d, _) = daemon(&pg, &broker, &[]);
    let sampler = Sampler::start(&pg);
    let w = Writer::start(&pg, "durable");
    assert!(wait_until(Duration::from_secs(60), || broker.partition_count(&topic).is_some()), "{}", d.log());
    wait_full_isr_any(&broker, &topic, Duration::from_secs(60));
    let ps = broker.replicas(&topic);
    assert!(ps.iter().all(|(_, _, r)| r.len() == 3), "outboxd created {topic} with fewer than 3 replicas: {ps:?}");
    let (ok, desc) = broker
        .tool("TopicCommand", &["--bootstrap-server", &broker.admin_bootstrap(), "--describe", "--topic", &topic]);
    assert!(ok && desc.contains("ReplicationFactor: 3"), "{desc}");
    std::thread::sleep(Duration::from_secs(3));

    let (leader, _) = busiest_leader(&broker, &topic);
    let c0 = confirmed(&pg);
    let t0 = Instant::now();
    broker.kill_node(leader);
    let r = resumed_after(&pg, &w, t0, Duration::from_secs(120));
    assert!(r.is_some(), "not resumed within 120 s of the leader's kill -9:\n{}", d.log());
    let until = w.written();
    std::thread::sleep(Duration::from_secs(3));
    let batches = w.finish();
    assert!(pg.wait_slot_reaches_wal_end(Duration::from_secs(60)), "slot stuck at {}\n{}", pg.confirmed_lsn(), d.log());
    let samples = sampler.finish();
    let f = verify(&pg, &broker, &topic, &batches, &samples, &[Window { label: "leader kill", from_lsn: c0, until }]);
    eprintln!(
        "outboxd-created topic ({} partition(s), replicas {ps:?}), leader kill -9: {} events, {} duplicates, resumed {:.1} s after",
        ps.len(),
        f.events,
        f.duplicates,
        r.unwrap().as_secs_f64()
    );
    d.stop_cleanly();
}

/// Waits until every partition of `topic` (however many) has a leader and 3 replicas in sync.
fn wait_full_isr_any(broker: &Broker, topic: &str, timeout: Duration) {
    let mut last = None;
    let ok = wait_until(timeout, || {
        last = partitions(broker, topic);
        last.as_ref().is_some_and(|ps| !ps.is_empty() && ps.iter().all(|(_, l, _, isr)| *l > 0 && isr.len() == 3))
    });
    assert!(ok, "{topic} never got 3 in-sync replicas: {last:?}\n{}", broker.log());
}
