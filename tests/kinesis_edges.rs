//! `--sink kinesis` under throttling, against a local Kinesis (moto's server mode) behind
//! `tools/aws/throttle_proxy.py`, which answers a share of PutRecords calls
//! ProvisionedThroughputExceededException and takes a random part of the records out of as many
//! again, answering them with that code at their places while Kinesis stores the others (the
//! partial failure). Nothing may be lost and no key reordered: a throttled record must be stored
//! before any later record of its key. The second test lifts the one-record-of-a-key-in-flight
//! rule (`OUTBOXD_KINESIS_UNORDERED=1`, for benchmarks only) and shows that the same check then
//! finds keys reordered, so it can fail.

mod common;
#[path = "common/kinesis.rs"]
mod kinesis_common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::aws::{Moto, ThrottleProxy};
use common::*;
use kinesis_common::*;

/// 6 transactions of 50 events over 6 keys through the throttling proxy.
fn throttled_run(unordered: bool) -> (Verdict, u64, (u64, u64), String) {
    let moto = Moto::start();
    create_stream(&moto, "throttled", 2);
    let proxy = ThrottleProxy::start(&moto, 0.3);
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let env: &[(&str, &str)] = if unordered { &[("OUTBOXD_KINESIS_UNORDERED", "1")] } else { &[] };
    let mut d = spawn(&kinesis_args(&pg, &proxy.url, "throttled", &["--on-bad-event", "fail"]), env);
    pg.insert_load("t", 6, 6, 50);
    let end = pg.current_lsn();
    assert!(pg.wait_slot_confirms(&end, Duration::from_secs(120)), "slot behind\n{}", d.log());
    let injected = proxy.injected();
    let v = judge(&read_stream(&moto, "throttled"));
    let log = d.log();
    d.stop_cleanly();
    (v, 300, injected, log)
}

#[test]
fn throttled_calls_and_records_lose_nothing_and_reorder_no_key() {
    let (v, events, (whole, records), log) = throttled_run(false);
    assert!(whole > 0 && records > 0, "nothing injected: {whole} calls, {records} records");
    let want: BTreeSet<u64> = (1..=events).collect();
    let missing: Vec<&u64> = want.difference(&v.seen).collect();
    assert!(missing.is_empty(), "{} of {events} events lost: {missing:?}\n{log}", missing.len());
    assert!(v.reordered.is_empty(), "key order broken: {:?}", &v.reordered[..v.reordered.len().min(10)]);
    assert_eq!(v.resent, 0, "a throttled record is sent again, an accepted one never");
    assert!(log.contains("sending them again after a backoff"), "{log}");
    eprintln!("{events} events through {whole} throttled calls and {records} throttled records, in key order");
}

#[test]
fn without_the_hold_the_same_check_finds_keys_reordered() {
    let (v, events, (whole, records), _) = throttled_run(true);
    assert!(records > 0, "no record throttled ({whole} calls)");
    assert_eq!(v.seen.len() as u64, events, "nothing lost even so");
    assert!(!v.reordered.is_empty(), "{records} records throttled, and no key reordered without the hold");
    eprintln!("without the hold: {} reorderings, e.g. {:?}", v.reordered.len(), v.reordered.first());
}
