//! `outboxd poll` in tests: the schema it needs, its arguments, and a series of events per aggregate
//! whose order the tests check (`tests/poll.rs`, `tests/budgets.rs`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::*;

/// The seed schema plus what poll mode needs.
pub fn poll_outbox(pg: &PgCluster) {
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.apply_sql_file(sql_dir().join("05_poll.sql"));
}

pub fn poll_args(pg: &PgCluster, broker: &Broker, extra: &[&str]) -> Vec<String> {
    let mut a = daemon_args(pg, broker, extra);
    assert_eq!(a[0], "run");
    a[0] = "poll".into();
    a
}

pub fn spawn_polling(args: &[String]) -> Outboxd {
    let d = Outboxd::spawn(args);
    assert!(d.wait_for_log("polling", Duration::from_secs(60)), "outboxd poll did not start:\n{}", d.log());
    d
}

/// `n` events per aggregate `a0..a{aggs}`, inserted one aggregate-interleaved row at a time in
/// `per_stmt`-row statements; payload {"agg": .., "n": ..} with `n` counting up per aggregate from
/// `from`.
pub fn insert_series(pg: &PgCluster, topic_type: &str, aggs: usize, from: usize, n: usize) {
    let mut values = Vec::new();
    for i in from..from + n {
        for a in 0..aggs {
            values.push(format!("('t', 'a{a}', '{topic_type}', '{{\"agg\": \"a{a}\", \"n\": {i}}}')"));
        }
    }
    for chunk in values.chunks(200) {
        pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES {}",
            chunk.join(", ")
        ));
    }
}

pub fn count(pg: &PgCluster, where_: &str) -> usize {
    pg.psql(&format!("SELECT count(*) FROM outbox WHERE {where_}")).parse().unwrap()
}

/// Per aggregate, the `n` values in the order of their first occurrence; and the duplicate count.
pub fn first_occurrences(records: &[Consumed]) -> (HashMap<String, Vec<u64>>, usize) {
    let mut seen = HashSet::new();
    let mut order: HashMap<String, Vec<u64>> = HashMap::new();
    let mut dups = 0;
    for r in records {
        let id = r.header_str("id").expect("id header");
        if !seen.insert(id) {
            dups += 1;
            continue;
        }
        let p = r.payload_json();
        order.entry(p["agg"].as_str().unwrap().to_owned()).or_default().push(p["n"].as_u64().unwrap());
    }
    (order, dups)
}

/// Every aggregate's events arrive complete (0..n) and in order.
pub fn assert_complete_in_order(order: &HashMap<String, Vec<u64>>, aggs: usize, n: u64, log: &str) {
    assert_eq!(order.len(), aggs, "aggregates seen: {:?}\n{log}", order.keys());
    for (agg, ns) in order {
        let want: Vec<u64> = (0..n).collect();
        assert_eq!(ns, &want, "aggregate {agg}: first occurrences out of order or incomplete\n{log}");
    }
}
