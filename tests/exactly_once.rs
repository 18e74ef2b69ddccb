//! `--delivery exactly-once` against a three-broker Apache Kafka cluster (plus a controller;
//! replication factor 3, `min.insync.replicas=2`, the transaction log replicated likewise).
//!
//! A writer commits [`Numbered`] events (event `i` is aggregate `agg-{i % 17}`, payload `{"n": i}`)
//! in transactions of 5, with a transaction of [`BIG`] events now and then: bigger than half of
//! `--max-in-flight`, so it is committed to Kafka in several transactions, with the stored
//! position pointing inside it. The checker reads the topic with `isolation.level=read_committed`
//! and counts lost events, duplicates and per-key order violations; it also reports what a
//! `read_uncommitted` consumer sees, for reference (records of aborted transactions).
//!
//! Faults:
//! * kill -9 of outboxd at random points (`OUTBOXD_EOS_KILLS`, default 6; the full run is 20),
//!   each restart resuming from the position committed in Kafka, even with the slot behind it
//!   (the slot is confirmed every `--status-interval` 2 s, so most kills fall between a Kafka
//!   commit and the slot's confirmation);
//! * two instances on one slot: the active one frozen with SIGSTOP, the standby takes over
//!   (PostgreSQL ends the frozen walsender after `wal_sender_timeout`), and the old one resumed
//!   with SIGCONT: it is fenced, and nothing it held appears;
//! * kill -9 of the coordinator's leader and of the data partition's leader;
//! * PostgreSQL fast restart and kill -9 of the postmaster;
//! * rows the router refuses, between kills: each dead-letter copy once in `outboxd.dlq`;
//! * the same kill -9 faults with logical messages (`--messages-prefix`) instead of rows.
//!
//! Every run: 0 lost, 0 duplicates, per-key order held. Figures go to stderr (`--nocapture`).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use common::*;

const AGGREGATES: usize = 17;
const TOPIC: &str = "eos.v1.events";
/// Events in the occasional big transaction (`--max-in-flight 200` commits it in pieces).
const BIG: usize = 450;
const T: Duration = Duration::from_secs(180);

/// Commits numbered events until stopped: 5 per transaction, and a [`BIG`] one every 40th.
struct Writer {
    stop: Arc<AtomicBool>,
    next: Arc<AtomicUsize>,
    handle: JoinHandle<()>,
}

impl Writer {
    fn start(pg: &PgCluster) -> Writer {
        Writer::start_as(pg, false)
    }

    /// With `messages`, the events are logical messages (`outbox_emit`) instead of rows.
    fn start_as(pg: &PgCluster, messages: bool) -> Writer {
        let ev = Numbered::new(pg, "eos", AGGREGATES);
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicUsize::new(0));
        let handle = {
            let (stop, next) = (stop.clone(), next.clone());
            std::thread::spawn(move || {
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let n = if round % 40 == 20 { BIG } else { 5 };
                    let first = next.load(Ordering::Relaxed);
                    // A refused insert (never here: the server stays up) would simply not count.
                    if if messages { ev.emit(first, n) } else { ev.insert(first, n) } {
                        next.store(first + n, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(15));
                }
            })
        };
        Writer { stop, next, handle }
    }

    fn written(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }

    fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("writer thread");
        self.next.load(Ordering::Relaxed)
    }
}

/// What the checker found.
#[derive(Debug, Default)]
struct Verdict {
    written: usize,
    committed_read: usize,
    uncommitted_read: usize,
    lost: Vec<i64>,
    duplicates: Vec<i64>,
    order: Vec<String>,
}

impl Verdict {
    fn assert_exactly_once(&self, what: &str) {
        eprintln!(
            "[{what}] written {}, read_committed {}, read_uncommitted {} (aborted records visible to it: {}), lost {}, duplicates {}, order violations {}",
            self.written,
            self.committed_read,
            self.uncommitted_read,
            self.uncommitted_read.saturating_sub(self.committed_read),
            self.lost.len(),
            self.duplicates.len(),
            self.order.len()
        );
        assert!(self.lost.is_empty(), "[{what}] lost events: {:?}", &self.lost[..self.lost.len().min(20)]);
        assert!(
            self.duplicates.is_empty(),
            "[{what}] duplicates to read_committed: {:?}",
            &self.duplicates[..self.duplicates.len().min(20)]
        );
        assert!(self.order.is_empty(), "[{what}] order: {:?}", &self.order[..self.order.len().min(10)]);
        assert_eq!(self.committed_read, self.written, "[{what}] every event once");
    }
}

/// Read `topic` read_committed (until every event in the outbox table arrived and a quiet
/// second passed) and read_uncommitted, and judge against the table: the truth about what
/// committed (the harness's PostgreSQL runs with `synchronous_commit = off`, so a commit the
/// writer saw acknowledged can vanish in a postmaster kill -9).
fn check(broker: &Broker, pg: &PgCluster, written_by_writer: usize) -> Verdict {
    let want: std::collections::BTreeSet<i64> =
        pg.psql("SELECT payload->>'n' FROM outbox").lines().filter_map(|l| l.trim().parse().ok()).collect();
    if want.len() != written_by_writer {
        eprintln!(
            "[check] the table holds {} events; the writer saw {written_by_writer} commits acknowledged",
            want.len()
        );
    }
    check_against(broker, want)
}

/// As [`check`], against the events `want` (logical messages leave no table to ask).
fn check_against(broker: &Broker, want: std::collections::BTreeSet<i64>) -> Verdict {
    let written = want.len();
    let got = broker.consume_all(TOPIC, 1, written, T);
    let mut seen: HashMap<i64, usize> = HashMap::new();
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut v = Verdict { written, committed_read: got.len(), ..Verdict::default() };
    for c in &got {
        let n = c.payload_json()["n"].as_i64().expect("payload n");
        *seen.entry(n).or_default() += 1;
        let key = c.key_str().unwrap_or_default();
        assert_eq!(key, format!("agg-{}", n as usize % AGGREGATES), "key of event {n}");
        if let Some(prev) = last.insert(key.clone(), n) {
            if prev >= n {
                v.order.push(format!("{key}: {prev} then {n}"));
            }
        }
    }
    v.lost = want.iter().copied().filter(|n| !seen.contains_key(n)).collect();
    let phantoms: Vec<i64> = seen.keys().copied().filter(|n| !want.contains(n)).collect();
    assert!(phantoms.is_empty(), "events in Kafka that the table does not hold: {phantoms:?}");
    v.duplicates = seen.iter().filter(|(_, c)| **c > 1).map(|(n, _)| *n).collect();
    v.duplicates.sort_unstable();
    v.uncommitted_read = read_uncommitted(broker);
    v
}

/// How many records a read_uncommitted consumer sees in the topic.
fn read_uncommitted(broker: &Broker) -> usize {
    let n = broker.partition_count(TOPIC).unwrap_or(0) as i32;
    let consumer: BaseConsumer = broker
        .client_config()
        .set("group.id", "eos-uncommitted")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_uncommitted")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning).expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    let (mut count, mut quiet) = (0, Instant::now());
    while quiet.elapsed() < Duration::from_secs(2) {
        if let Some(Ok(_)) = consumer.poll(Duration::from_millis(100)) {
            count += 1;
            quiet = Instant::now();
        }
    }
    count
}

/// A small deterministic generator (the seed is printed, to replay a run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

fn eos_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["--delivery", "exactly-once", "--max-in-flight", "200", "--status-interval", "2s"];
    a.extend_from_slice(extra);
    a
}

/// `pg` with the outbox, a three-broker cluster, outboxd streaming to it in exactly-once mode
/// (its arguments, to start it again) and the writer going. Bind in this order so the daemon is
/// dropped first.
fn scene(pg: PgCluster) -> (PgCluster, Broker, Vec<String>, Writer, Outboxd) {
    pg.apply_all_sql();
    let broker = Broker::options().brokers(3).start();
    let args = daemon_args(&pg, &broker, &eos_args(&[]));
    let d = Outboxd::spawn_streaming(&args);
    let writer = Writer::start(&pg);
    (pg, broker, args, writer, d)
}

/// Wait until the slot confirmed the end of the WAL the writer left, with `d` running.
fn drained(pg: &PgCluster, d: &Outboxd) {
    let end = pg.current_lsn();
    if let Err(e) = pg.slot_reaches_idle_wal_end(&end, Duration::from_secs(30), T) {
        panic!("{e}\n{}", d.log());
    }
}

#[test]
fn kill9_at_random_points_loses_nothing_and_duplicates_nothing() {
    let kills: usize = std::env::var("OUTBOXD_EOS_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(6);
    let seed = std::env::var("OUTBOXD_EOS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("[kill9] seed {seed} (OUTBOXD_EOS_SEED replays it), {kills} kills");
    let mut rng = Lcg(seed);
    let (pg, broker, args, writer, mut d) = scene(PgCluster::start());
    let mut restarts_log = String::new();
    for k in 0..kills {
        std::thread::sleep(Duration::from_millis(300 + rng.next(2500)));
        let at = writer.written();
        restarts_log.push_str(&d.log());
        d.kill9();
        eprintln!("[kill9] kill {} at about event {at}", k + 1);
        d = Outboxd::spawn(&args);
    }
    assert!(d.wait_for_streaming(Duration::from_secs(90)), "{}", d.log());
    std::thread::sleep(Duration::from_secs(2));
    let written = writer.finish();
    drained(&pg, &d);
    let v = check(&broker, &pg, written);
    if !v.lost.is_empty() || !v.duplicates.is_empty() {
        eprintln!("{restarts_log}\n--- last ---\n{}", d.log());
    }
    v.assert_exactly_once("kill9");
    let log = d.log();
    assert!(log.contains("exactly-once: committed position read"), "{log}");
    d.stop_cleanly();
}

/// Logical messages (`--messages-prefix`) take the same exactly-once path as rows: kill -9 at
/// random points, and every message once, in order per key, to read_committed consumers. (The
/// server stays up, so every message the writer saw committed is the truth.)
#[test]
fn logical_messages_under_kill9_are_delivered_exactly_once() {
    let kills = std::env::var("OUTBOXD_EOS_KILLS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(6).div_ceil(2);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::options().brokers(3).start();
    let args = daemon_args(&pg, &broker, &eos_args(&["--messages-prefix", "outbox"]));
    let mut d = Outboxd::spawn_streaming(&args);
    let writer = Writer::start_as(&pg, true);
    let mut rng = Lcg(std::process::id() as u64);
    for k in 0..kills {
        std::thread::sleep(Duration::from_millis(500 + rng.next(2000)));
        d.kill9();
        eprintln!("[messages] kill {} at about event {}", k + 1, writer.written());
        d = Outboxd::spawn(&args);
    }
    assert!(d.wait_for_streaming(Duration::from_secs(90)), "{}", d.log());
    std::thread::sleep(Duration::from_secs(2));
    let written = writer.finish();
    drained(&pg, &d);
    assert_eq!(pg.psql("SELECT count(*) FROM outbox").trim(), "0", "the events were messages, not rows");
    let v = check_against(&broker, (0..written as i64).collect());
    v.assert_exactly_once("messages");
    d.stop_cleanly();
}

/// A shutdown (SIGTERM) while the session is inside a PostgreSQL transaction bigger than the
/// in-flight budget: what was read of it commits at its last whole change at once (the unit test
/// `a_shutdown_inside_a_transaction_commits_at_its_last_change_at_once` covers an open transaction
/// below half the budget, which used to wait out `--shutdown-timeout` and abort), the process
/// exits promptly, and the next session resumes inside the transaction from the stored position:
/// every event once, in order per key.
#[test]
fn a_shutdown_inside_a_postgres_transaction_commits_at_once_and_resumes_inside_it() {
    // Bigger than the in-flight budget: the session is inside it, committing every half budget
    // at a change, when the shutdown comes.
    const N: usize = 150_000;
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let args = daemon_args(
        &pg,
        &broker,
        &[
            "--delivery",
            "exactly-once",
            "--max-in-flight",
            "20000",
            "--shutdown-timeout",
            "120s",
            "--metrics-addr",
            &addr,
            // The in-flight gauge is set on each status update.
            "--status-interval",
            "100ms",
        ],
    );
    // The slot first (a first run), then one transaction of N events behind it.
    Outboxd::spawn_streaming(&args).stop_cleanly();
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'eos', 'agg-' || (i % {AGGREGATES}), 'eos.v1', jsonb_build_object('n', i) FROM generate_series(0, {}) AS i",
        N - 1
    ));
    let mut d = Outboxd::spawn(&args);
    // Inside the transaction: events handed to the sink, its end not read yet.
    let port: u16 = port.parse().unwrap();
    let inside = wait_until(Duration::from_secs(90), || {
        http_get(port, "/metrics")
            .and_then(|(_, body)| metric(&body, "outboxd_events_in_flight"))
            .is_some_and(|n| n >= 1000.0)
    });
    assert!(inside, "no events in flight:\n{}", d.log());
    let asked = Instant::now();
    d.sigterm();
    let status = d.wait_exit(Duration::from_secs(60));
    let took = asked.elapsed();
    let log = d.log();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{log}");
    assert!(
        log.contains("shutdown inside a PostgreSQL transaction: what was read of it commits at its last whole change"),
        "the shutdown did not land inside the {N}-event transaction (it was read too fast?):\n{log}"
    );
    assert!(!log.contains("shutdown timeout"), "{log}");
    eprintln!("[shutdown] exited {took:?} after SIGTERM, inside the transaction");
    assert!(took < Duration::from_secs(30), "the shutdown took {took:?}\n{log}");

    let d = Outboxd::spawn_streaming(&args);
    drained(&pg, &d);
    check(&broker, &pg, N).assert_exactly_once("shutdown");
}

#[test]
fn a_frozen_instance_is_fenced_by_its_standby_and_nothing_it_held_appears() {
    let pg = PgCluster::start_with(&["wal_sender_timeout = '4s'"]);
    pg.apply_all_sql();
    let broker = Broker::options().brokers(3).start();
    let args = daemon_args(&pg, &broker, &eos_args(&["--standby-retry-interval", "1s"]));
    let mut a = Outboxd::spawn_streaming(&args);
    let mut b = Outboxd::spawn(&args);
    assert!(b.wait_for_log("standing by to take it over", Duration::from_secs(60)), "{}", b.log());
    let writer = Writer::start(&pg);
    std::thread::sleep(Duration::from_secs(3));
    let pid = a.pid().expect("a runs");
    assert!(send_signal(pid, "STOP"));
    let frozen_at = writer.written();
    let took_over = b.wait_for_streaming(Duration::from_secs(90));
    assert!(took_over, "the standby never took over:\n{}", b.log());
    std::thread::sleep(Duration::from_secs(3));
    assert!(send_signal(pid, "CONT"));
    // The old instance wakes with a dead replication link and a fenced producer: it stands by.
    // Which it meets first is a race: a produce or commit refused as fenced, or the broken link
    // to PostgreSQL (then it stands by without touching Kafka again, and its open transaction
    // was already aborted by the standby's init_transactions). Either way nothing it held may
    // appear, which the check below counts.
    let stood_by = a.wait_for_log("standing by", Duration::from_secs(90));
    assert!(stood_by, "the resumed instance did not stand by:\n{}", a.log());
    std::thread::sleep(Duration::from_secs(1));
    let path = if a.log().contains("fenced") { "fenced by the coordinator" } else { "its PostgreSQL link broke first" };
    eprintln!("[fenced] the resumed instance stood by: {path}");
    assert!(a.is_running(), "{}", a.log());
    std::thread::sleep(Duration::from_secs(2));
    let written = writer.finish();
    drained(&pg, &b);
    eprintln!("[fenced] frozen at about event {frozen_at}");
    check(&broker, &pg, written).assert_exactly_once("fenced");
    b.stop_cleanly();
    a.stop_cleanly();
}

#[test]
fn exactly_once_is_refused_with_another_sink_and_with_a_dead_letter_sink() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let (code, log) = run_to_exit(&daemon_args_pg_only(&pg, &["--delivery", "exactly-once", "--sink", "stdout"]), T);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("--delivery exactly-once needs --sink kafka"), "{log}");
}

/// Java's `String.hashCode` of ASCII text (Kafka picks a transactional id's coordinator
/// partition with it).
fn java_hash(s: &str) -> i32 {
    s.bytes().fold(0i32, |h, b| h.wrapping_mul(31).wrapping_add(b as i32))
}

/// The broker leading `topic`'s `partition`, once it has one.
fn leader_of(broker: &Broker, topic: &str, partition: i32) -> u32 {
    let mut leader = -1;
    let found = wait_until(Duration::from_secs(60), || {
        leader = broker.replicas(topic).iter().find(|(p, _, _)| *p == partition).map_or(-1, |(_, l, _)| *l);
        leader > 0
    });
    assert!(found, "{topic}[{partition}] has no leader");
    leader as u32
}

/// kill -9 of a broker, and a start again once the writer went on for a while without it.
fn kill_and_restart(broker: &Broker, id: u32, what: &str) {
    eprintln!("[brokers] kill -9 of broker {id} ({what})");
    broker.kill_node(id);
    std::thread::sleep(Duration::from_secs(6));
    broker.start_node(id);
    broker.wait_ready();
    std::thread::sleep(Duration::from_secs(4));
}

#[test]
fn killing_the_coordinators_leader_and_the_data_leader_duplicates_nothing() {
    let (pg, broker, _, writer, mut d) = scene(PgCluster::start());
    assert!(wait_until(Duration::from_secs(60), || broker.partition_count(TOPIC).is_some()), "{}", d.log());
    // The transaction coordinator: the leader of __transaction_state's partition for our id
    // (Kafka: abs(hashCode) % transaction.state.log.num.partitions, 5 in the harness).
    let sysid = pg.psql("SELECT system_identifier FROM pg_control_system()");
    let id = format!("outboxd-{sysid}-outboxd");
    let partition = match java_hash(&id) {
        i32::MIN => 0,
        h => h.abs() % 5,
    };
    let coordinator = leader_of(&broker, "__transaction_state", partition);
    kill_and_restart(&broker, coordinator, "the transaction coordinator's leader");
    let data = leader_of(&broker, TOPIC, 0);
    kill_and_restart(&broker, data, "the data partition's leader");
    assert!(d.is_running(), "{}", d.log());
    let written = writer.finish();
    drained(&pg, &d);
    check(&broker, &pg, written).assert_exactly_once("brokers");
    d.stop_cleanly();
}

#[test]
fn postgres_fast_restart_and_postmaster_kill9_duplicate_nothing() {
    let (mut pg, broker, _, writer, mut d) = scene(PgCluster::start());
    std::thread::sleep(Duration::from_secs(3));
    eprintln!("[postgres] fast restart at about event {}", writer.written());
    pg.restart();
    std::thread::sleep(Duration::from_secs(4));
    eprintln!("[postgres] kill -9 of the postmaster at about event {}", writer.written());
    pg.kill9();
    std::thread::sleep(Duration::from_secs(1));
    pg.start_again();
    std::thread::sleep(Duration::from_secs(5));
    assert!(d.is_running(), "{}", d.log());
    let written = writer.finish();
    drained(&pg, &d);
    check(&broker, &pg, written).assert_exactly_once("postgres");
    d.stop_cleanly();
}

/// Rows the router refuses, between the writer's: under the default `--on-bad-event dlq` their
/// dead-letter copies go in the same Kafka transactions as the events around them, so through
/// kills each copy is in `outboxd.dlq` once, like each event in its topic.
#[test]
fn dead_letter_copies_are_written_once_through_kills() {
    let (pg, broker, args, writer, mut d) = scene(PgCluster::start());
    let mut bad = Vec::new();
    for i in 0..4 {
        std::thread::sleep(Duration::from_millis(700));
        let id = format!("00000000-0000-4000-9000-{i:012x}");
        pg.psql(&format!(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('{id}', 'bad', 'bad-{i}', 'not a topic!', '{{}}')"
        ));
        bad.push(id);
        std::thread::sleep(Duration::from_millis(400));
        d.kill9();
        d = Outboxd::spawn(&args);
    }
    assert!(d.wait_for_streaming(Duration::from_secs(90)), "{}", d.log());
    let written = writer.finish();
    drained(&pg, &d);
    check(&broker, &pg, written).assert_exactly_once("dead letters");
    let copies = broker.consume_all("outboxd.dlq", 1, bad.len(), T);
    let mut ids: Vec<String> = copies.iter().filter_map(|c| c.header_str("id")).collect();
    ids.sort();
    eprintln!("[dead letters] {} copies read_committed for {} refused rows", copies.len(), bad.len());
    assert_eq!(ids, bad, "each refused row's copy once");
    d.stop_cleanly();
}

/// The network to the (single, proxied) broker frozen, no RST, for longer than the transaction
/// timeout: the coordinator aborts the open transaction on its own, the records outboxd had
/// produced in it time out, and the producer's epoch is bumped. After the thaw, outboxd aborts
/// (or, fenced by the bump, stands by and takes its slot back) and resumes from the committed
/// position: nothing of the aborted transaction is visible, nothing is lost or duplicated.
#[test]
fn a_network_freeze_longer_than_the_transaction_timeout_loses_and_duplicates_nothing() {
    use common::netfault::FreezeProxy;
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let proxy = FreezeProxy::start(1);
    // The coordinator looks for timed-out transactions every second (Kafka's default: 10 s).
    let broker = Broker::options()
        .advertise(proxy.port)
        .prop("transaction.abort.timed.out.transaction.cleanup.interval.ms=1000")
        .start();
    proxy.set_target(broker.port());
    let mut a = daemon_args_pg_only(&pg, &eos_args(&["--standby-retry-interval", "1s"]));
    a.extend(args(&["--kafka-brokers", &format!("127.0.0.1:{}", proxy.port)]));
    for p in [
        "transaction.timeout.ms=6000",
        "message.timeout.ms=6000",
        "socket.timeout.ms=6000",
        "request.timeout.ms=5000",
        "socket.keepalive.enable=true",
    ] {
        a.extend(args(&["--kafka-property", p]));
    }
    let mut d = Outboxd::spawn_streaming(&a);
    let writer = Writer::start(&pg);
    assert!(wait_until(Duration::from_secs(60), || broker.end_offsets(TOPIC) > 0), "{}", d.log());
    eprintln!("[freeze] network frozen at about event {}", writer.written());
    proxy.freeze();
    // Twice the transaction timeout, plus the coordinator's check.
    std::thread::sleep(Duration::from_secs(14));
    proxy.thaw();
    eprintln!("[freeze] thawed at about event {}", writer.written());
    std::thread::sleep(Duration::from_secs(5));
    let written = writer.finish();
    drained(&pg, &d);
    assert!(d.is_running(), "{}", d.log());
    let log = d.log();
    // The fault was met: the transaction open during the freeze ended without a commit.
    assert!(
        log.contains("Kafka transaction aborted") || log.contains("fenced"),
        "no abort or fencing after a freeze longer than transaction.timeout.ms:\n{log}"
    );
    check(&broker, &pg, written).assert_exactly_once("network freeze");
    d.stop_cleanly();
}

/// A record the broker refuses for good (larger than its topic's `max.message.bytes`, below the
/// producer's limit) inside a Kafka transaction fails the transaction, which is aborted. outboxd
/// condemns the record: when the next session meets it again, `--on-bad-event` (dlq) applies to
/// it first, so the transaction that holds its dead-letter copy commits, and the events around it
/// arrive once each. Without that, every session would abort on the same record forever.
#[test]
fn a_record_the_broker_refuses_inside_a_transaction_is_dead_lettered_not_looped() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    broker.create_topic_with("small.v1.events", 1, &[("max.message.bytes", "2000")], false);
    let mut d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &eos_args(&[])));
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(6000));
    // One transaction each, drained in between, so no good record shares the oversize one's batch.
    for (key, payload) in [("s-1", "{}"), ("s-big", big.as_str()), ("s-2", "{}")] {
        pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('rules', '{key}', 'small.v1', '{payload}')"
        ));
        drained(&pg, &d);
    }
    assert!(d.is_running(), "{}", d.log());
    let got = broker.consume_all("small.v1.events", 1, 2, T);
    let keys: Vec<String> = got.iter().filter_map(|c| c.key_str()).collect();
    assert_eq!(keys, ["s-1", "s-2"], "read_committed events around the refused one:\n{}", d.log());
    let dead = broker.consume_all("outboxd.dlq", 1, 1, T);
    let copies: Vec<&Consumed> = dead.iter().filter(|c| c.key_str().as_deref() == Some("s-big")).collect();
    assert_eq!(copies.len(), 1, "one dead-letter copy of s-big, read_committed: {dead:?}\n{}", d.log());
    assert_eq!(copies[0].header_str("outboxd.error").as_deref(), Some("too_large"), "{:?}", copies[0]);
    let log = d.log();
    assert!(log.contains("the broker refused a record inside a Kafka transaction"), "{log}");
    // The refused transaction, and at most one after it: librdkafka may fail the next one on the
    // sequence gap the refused batch left (OUT_OF_ORDER_SEQUENCE_NUMBER, "requires epoch bump").
    let aborted = log.matches("Kafka transaction aborted; the next session resumes").count();
    eprintln!("[condemned] aborted transactions: {aborted}, dead-letter copies: {}", copies.len());
    assert!(aborted <= 2, "the refusal looped ({aborted} aborts):\n{log}");
    d.stop_cleanly();
}
