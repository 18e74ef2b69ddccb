//! Half-open links: a TCP proxy between outboxd and PostgreSQL stops forwarding without closing
//! (a NAT timeout, a partition). outboxd must notice within `--wal-receiver-timeout` plus a few
//! seconds, say it is not ready meanwhile, end its own stale walsender instead of waiting for
//! PostgreSQL's `wal_sender_timeout` (60 s here), and lose nothing.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::netfault::FreezeProxy;
use common::*;

fn insert(pg: &PgCluster, from: usize, to: usize) {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'a', 'k' || g, 'half.v1', json_build_object('n', g) FROM generate_series({from}, {to}) g"
    ));
}

/// Distinct `n` values of the events outboxd printed.
fn seen(log: &str) -> HashSet<i64> {
    log.lines()
        .filter(|l| l.contains("\"topic\":\"half.v1.events\""))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["payload"]["n"].as_i64())
        .collect()
}

#[test]
fn frozen_postgres_link_reconnects_within_the_receiver_timeout_and_loses_nothing() {
    let pg = PgCluster::start_with(&["wal_sender_timeout = 60s"]);
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let proxy = FreezeProxy::start(pg.port());
    let metrics_port = free_port();
    let url = format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{}/app?sslmode=disable&connect_timeout=3", proxy.port);
    let a = args(&[
        "run",
        "--sink",
        "stdout",
        "--postgres-url",
        &url,
        "--status-interval",
        "1s",
        "--wal-receiver-timeout",
        "4s",
        "--heartbeat-interval",
        "0",
        "--reconnect-max-backoff",
        "1s",
        "--metrics-addr",
        &format!("127.0.0.1:{metrics_port}"),
    ]);
    let mut d = Outboxd::spawn_streaming(&a);
    insert(&pg, 1, 100);
    assert!(wait_until(Duration::from_secs(20), || seen(&d.log()).len() == 100), "{}", d.log());
    let old_pid = pg.psql("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'outboxd'");
    assert!(!old_pid.is_empty(), "no active walsender");

    // Phase 1: the route is blackholed (new connections hang too) for 10 s.
    proxy.freeze();
    let frozen_at = Instant::now();
    insert(&pg, 101, 200);
    assert!(
        wait_until(Duration::from_secs(9), || d.log().contains("--wal-receiver-timeout")),
        "no receiver timeout within 4 s + 5 s of the freeze:\n{}",
        d.log()
    );
    let detected = frozen_at.elapsed();
    assert!(detected <= Duration::from_secs(9), "detected after {detected:?}");
    // Not streaming: /readyz says so, and so does the gauge.
    assert!(
        wait_until(Duration::from_secs(3), || http_get(metrics_port, "/readyz").is_some_and(|(c, _)| c == 503)),
        "/readyz stayed ready on a dead link"
    );
    let (_, body) = http_get(metrics_port, "/metrics").expect("metrics");
    assert_eq!(metric(&body, "outboxd_connected{component=\"postgres\"}"), Some(0.0), "{body}");
    // The stale walsender still holds the slot: PostgreSQL has not noticed (wal_sender_timeout 60 s).
    let holder = pg.psql("SELECT coalesce(active_pid::text, '') FROM pg_replication_slots WHERE slot_name = 'outboxd'");
    assert_eq!(holder, old_pid, "the server dropped the walsender by itself; the test proves nothing");
    std::thread::sleep(Duration::from_secs(10).saturating_sub(frozen_at.elapsed()));

    // Phase 2: new connections pass again; the old one stays dead, as after a NAT timeout.
    proxy.thaw();
    let thawed_at = Instant::now();
    assert!(
        wait_until(Duration::from_secs(20), || seen(&d.log()).len() == 200),
        "events lost or not resumed: {} of 200\n{}",
        seen(&d.log()).len(),
        d.log()
    );
    let resumed = thawed_at.elapsed();
    assert!(resumed < Duration::from_secs(20), "took {resumed:?}, wal_sender_timeout would have been 60 s");
    assert!(d.log().contains("our previous walsender still held the slot"), "{}", d.log());
    let new_pid =
        pg.psql("SELECT coalesce(active_pid::text, '') FROM pg_replication_slots WHERE slot_name = 'outboxd'");
    assert!(!new_pid.is_empty() && new_pid != old_pid, "slot holder {new_pid} (old {old_pid})");
    assert!(
        wait_until(Duration::from_secs(5), || http_get(metrics_port, "/readyz").is_some_and(|(c, _)| c == 200)),
        "not ready after recovery"
    );
    insert(&pg, 201, 250);
    assert!(wait_until(Duration::from_secs(15), || seen(&d.log()).len() == 250), "{}", d.log());
    d.stop_cleanly();
    eprintln!("detected after {detected:?}; resumed {resumed:?} after the thaw");
}

/// The same freeze in front of the broker: records in flight stay unacked, so the slot never
/// passes them; after the thaw librdkafka reconnects and every event arrives.
#[test]
fn frozen_broker_link_confirms_nothing_unacked_and_delivers_after_the_thaw() {
    use common::secure_kafka::{client_config, consume_with};
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let proxy = FreezeProxy::start(1);
    let broker = Broker::options().advertise(proxy.port).start();
    proxy.set_target(broker.port());
    let bootstrap = format!("127.0.0.1:{}", proxy.port);
    let mut a = daemon_args_pg_only(&pg, &["--status-interval", "500ms", "--heartbeat-interval", "0"]);
    a.extend(args(&["--kafka-brokers", &bootstrap]));
    for p in ["socket.timeout.ms=6000", "request.timeout.ms=5000", "socket.keepalive.enable=true"] {
        a.extend(args(&["--kafka-property", p]));
    }
    let mut d = Outboxd::spawn_streaming(&a);
    insert(&pg, 1, 50);
    let lsn_sql =
        "SELECT (confirmed_flush_lsn >= '{L}'::pg_lsn)::text FROM pg_replication_slots WHERE slot_name = 'outboxd'";
    let after_first = pg.psql("SELECT pg_current_wal_lsn()::text");
    assert!(
        wait_until(Duration::from_secs(30), || pg.psql(&lsn_sql.replace("{L}", &after_first)) == "true"),
        "first batch never confirmed:\n{}",
        d.log()
    );

    proxy.freeze();
    insert(&pg, 51, 100);
    // The commit record of the unacked batch ends at or before this position.
    let commit_end = pg.psql("SELECT pg_current_wal_insert_lsn()::text");
    // Sample the slot for 8 s: it must never reach the end of the unacked transaction.
    let end = Instant::now() + Duration::from_secs(8);
    while Instant::now() < end {
        let past = pg.psql(&format!(
            "SELECT (confirmed_flush_lsn >= '{commit_end}'::pg_lsn)::text FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        ));
        assert_eq!(past, "false", "slot confirmed past records the broker never acked:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(d.is_running(), "{}", d.log());

    proxy.thaw();
    let after_second = pg.psql("SELECT pg_current_wal_lsn()::text");
    assert!(
        wait_until(Duration::from_secs(90), || pg.psql(&lsn_sql.replace("{L}", &after_second)) == "true"),
        "not confirmed after the thaw:\n{}",
        d.log()
    );
    let got = consume_with(&client_config(&bootstrap, &[]), "half.v1.events", 100, Duration::from_secs(30));
    let ids: HashSet<String> = got.iter().filter_map(|r| r.key_str()).collect();
    assert_eq!(ids.len(), 100, "distinct events after the thaw: {} of 100", ids.len());
    d.stop_cleanly();
}

/// Our walsender is recognised by PID, start time and application name, never by PID alone
/// (issue 23 item 6): after a server restart another instance's walsender can get the PID ours
/// had. Here another outboxd holds the slot; asked to end "our" walsender with its PID but
/// another start time (or application name), outboxd's rule leaves it alone; with its full
/// identity it ends it.
#[test]
fn a_walsender_with_our_old_pid_but_another_start_time_is_left_alone() {
    use outboxd::pg::admin;
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let mut other = Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &["--sink", "stdout"]));
    let holder: i32 =
        pg.psql("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'outboxd'").parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let target = outboxd::config::PgTarget::parse(&pg.url()).unwrap();
        let client = admin::connect_target(&target).await.unwrap();
        let real = admin::walsender(&client, holder).await.unwrap().expect("the holder is in pg_stat_activity");
        assert_eq!(real.pid, holder);
        let reused = admin::Walsender { backend_start: "2000-01-01 00:00:00+00".into(), ..real.clone() };
        assert!(!admin::terminate_own_walsender(&client, "outboxd", &reused).await.unwrap(), "ended by PID alone");
        let renamed = admin::Walsender { application_name: "someone-else".into(), ..real.clone() };
        assert!(!admin::terminate_own_walsender(&client, "outboxd", &renamed).await.unwrap());
        let still =
            pg.psql("SELECT coalesce(active_pid::text, '') FROM pg_replication_slots WHERE slot_name = 'outboxd'");
        assert_eq!(still, holder.to_string(), "the other walsender was ended");
        assert!(
            admin::terminate_own_walsender(&client, "outboxd", &real).await.unwrap(),
            "the real one is ours to end"
        );
    });
    // The instance whose walsender was ended reconnects and streams again.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let now =
                pg.psql("SELECT coalesce(active_pid::text, '') FROM pg_replication_slots WHERE slot_name = 'outboxd'");
            !now.is_empty() && now != holder.to_string()
        }),
        "{}",
        other.log()
    );
    other.stop_cleanly();
}
