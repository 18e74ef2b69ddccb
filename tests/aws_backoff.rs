//! The AWS publisher's backoff is per what fails (review A3): a key whose entries keep being
//! throttled while the other keys' entries are stored slows down on its own, its retries spaced by
//! a growing backoff, instead of going again at the first backoff each time some other call went
//! through. Through `tools/aws/throttle_proxy.py` in its `hot:KEY:N` mode (the key's first N
//! sends answered as a per-entry throttle, each send of it logged with its time), in front of a
//! local Kinesis and SQS (moto), under a steady writer of 30 keys; and nothing is lost or reordered.

mod common;
#[path = "common/kinesis.rs"]
mod kinesis_common;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use common::aws::{Moto, ThrottleProxy};
use common::*;
use kinesis_common::*;

/// Refusals of the hot key: 5, so its four backoffs are 0.25 + 0.5 + 1 + 2 s at least (3.75 s).
/// Reset by the other keys' successes, each would stay near the first (about 1.2 s for four).
const REFUSALS: usize = 5;
const MIN_SPAN_SECS: f64 = 3.0;
/// Keys the writer spreads its rows over, so other calls go and succeed while the hot key's are
/// refused.
const KEYS: u64 = 30;
/// For SQS, fewer (moto's FIFO queue takes a few hundred messages a second at most, and slows as
/// it fills), still more than one batch holds.
const SQS_KEYS: u64 = 12;

/// The times of the hot key's refused sends, once it went through; asserting the spacing.
fn assert_spaced(proxy: &ThrottleProxy, log: &dyn Fn() -> String) {
    let ok = wait_until(Duration::from_secs(60), || proxy.hot_attempts().iter().any(|(_, refused)| !refused));
    let sends = proxy.hot_attempts();
    assert!(ok, "the hot key never went through: {sends:?}\n{}", log());
    let refused: Vec<f64> = sends.iter().filter(|(_, r)| *r).map(|(t, _)| *t).collect();
    assert_eq!(refused.len(), REFUSALS, "{sends:?}");
    let gaps: Vec<String> = refused.windows(2).map(|w| format!("{:.2}", w[1] - w[0])).collect();
    let span = refused[REFUSALS - 1] - refused[0];
    eprintln!("the hot key's refused sends {span:.2} s apart in all, gaps {gaps:?}");
    assert!(
        span >= MIN_SPAN_SECS,
        "the hot key was sent again too fast: {REFUSALS} refusals in {span:.2} s (gaps {gaps:?}); its backoff was reset by the other keys' successes"
    );
}

#[test]
fn kinesis_a_throttled_key_backs_off_on_its_own() {
    let moto = Moto::start();
    create_stream(&moto, "hot", 2);
    let proxy = ThrottleProxy::start_mode(&moto, 0.0, Some(&format!("hot:k1:{REFUSALS}")));
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut d = spawn(&kinesis_args(&pg, &proxy.url, "hot", &["--on-bad-event", "fail"]), &[]);
    let writer = Writer::start(pg.url(), KEYS, Duration::from_millis(300));
    assert_spaced(&proxy, &|| d.log());
    std::thread::sleep(Duration::from_millis(500));
    let written = writer.finish();
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(60)), "slot behind\n{}", d.log());
    let v = judge(&read_stream(&moto, "hot"));
    let want: BTreeSet<u64> = (1..=written).collect();
    let missing: Vec<&u64> = want.difference(&v.seen).collect();
    assert!(missing.is_empty(), "{} of {written} events lost: {missing:?}", missing.len());
    assert!(v.reordered.is_empty(), "key order broken: {:?}", &v.reordered[..v.reordered.len().min(10)]);
    d.stop_cleanly();
}

#[test]
fn sqs_fifo_a_throttled_group_backs_off_on_its_own() {
    let moto = Moto::start();
    let queue = moto.create_queue("hot.fifo", true);
    let proxy = ThrottleProxy::start_mode(&moto, 0.0, Some(&format!("hot:k1:{REFUSALS}")));
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let mut a = vec!["--sink", "sqs", "--sqs-queue-url", &queue, "--aws-endpoint-url", &proxy.url];
    a.extend(["--aws-region", "us-east-1", "--status-interval", "200ms", "--on-bad-event", "fail"]);
    let mut d = spawn(&daemon_args_pg_only(&pg, &a), &[]);
    let writer = Writer::start(pg.url(), SQS_KEYS, Duration::from_millis(500));
    assert_spaced(&proxy, &|| d.log());
    std::thread::sleep(Duration::from_millis(500));
    let written = writer.finish();
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(60)), "slot behind\n{}", d.log());
    let mut seen = BTreeSet::new();
    let mut last: HashMap<String, u64> = HashMap::new();
    for m in moto.drain_queue(&queue, 2) {
        assert_eq!(m.group.as_deref().map(|g| g.starts_with('k')), Some(true), "group {:?}", m.group);
        let n = serde_json::from_slice::<serde_json::Value>(&m.body).expect("JSON body")["n"].as_u64().expect("n");
        assert!(seen.insert(n), "event {n} twice");
        let key = m.group.clone().unwrap_or_default();
        let prev = last.insert(key.clone(), n);
        assert!(prev.is_none_or(|p| p < n), "key {key}: {n} after {prev:?}");
    }
    let want: BTreeSet<u64> = (1..=written).collect();
    let missing: Vec<&u64> = want.difference(&seen).collect();
    assert!(missing.is_empty(), "{} of {written} events lost: {missing:?}", missing.len());
    d.stop_cleanly();
}
