//! `outboxd poll` behind a real PgBouncer. Its aggregate locks are session advisory locks taken,
//! used and released in separate statements; a transaction-mode pooler hands statements to any
//! server session, so two pollers could own one aggregate. outboxd must refuse such a connection
//! with an error that names the cause and the fix, before it sends anything, and must work
//! through a session-mode pool.

mod common;

use std::time::Duration;

use common::*;

fn poll_outbox_with_events(n: usize) -> PgCluster {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.apply_sql_file(sql_dir().join("05_poll.sql"));
    for i in 0..n {
        pg.insert_event("t", &format!("a{}", i % 3), Some("pool"), &format!("{{\"n\": {i}}}"), None);
    }
    pg
}

fn poll_via(url: &str) -> Vec<String> {
    args(&[
        "poll",
        "--postgres-url",
        url,
        "--sink",
        "stdout",
        "--metrics-addr",
        "127.0.0.1:0",
        "--poll-interval",
        "200ms",
    ])
}

fn unpublished(pg: &PgCluster) -> usize {
    pg.psql("SELECT count(*) FROM outbox WHERE published_at IS NULL").parse().unwrap()
}

#[test]
fn a_transaction_mode_pooler_is_refused_before_anything_is_sent() {
    let pg = poll_outbox_with_events(6);
    let bouncer = PgBouncer::start(&pg, "transaction");
    let (code, out) = run_to_exit(&poll_via(&bouncer.url()), Duration::from_secs(90));
    eprintln!("outboxd poll through pool_mode=transaction:\n{out}");
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}\n{out}\n{}", bouncer.log());
    assert!(
        out.contains("transaction-mode pooler")
            && out.contains("pool_mode=transaction")
            && out.contains("session-mode pool"),
        "{out}"
    );
    assert!(!out.contains("secret-pw"), "{out}");
    assert!(!out.contains("\"topic\""), "nothing may be sent through it:\n{out}");
    assert_eq!(unpublished(&pg), 6, "no row may be claimed through it");
}

#[test]
fn a_session_mode_pooler_relays_everything() {
    let pg = poll_outbox_with_events(6);
    let bouncer = PgBouncer::start(&pg, "session");
    let mut d = Outboxd::spawn(&poll_via(&bouncer.url()));
    let done = wait_until(Duration::from_secs(60), || unpublished(&pg) == 0);
    let log = d.log();
    d.stop_cleanly();
    assert!(done, "rows still unpublished\n{log}\n{}", bouncer.log());
    let records: Vec<serde_json::Value> =
        log.lines().filter(|l| l.starts_with('{')).filter_map(|l| serde_json::from_str(l).ok()).collect();
    let mut ns: Vec<u64> =
        records.iter().filter(|r| r["topic"] == "pool.events").map(|r| r["payload"]["n"].as_u64().unwrap()).collect();
    ns.sort();
    assert_eq!(ns, (0..6).collect::<Vec<u64>>(), "{log}");
    assert!(!log.contains("pooler"), "{log}");
}
