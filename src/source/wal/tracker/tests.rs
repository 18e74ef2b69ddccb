//! The ack tracker's tests: the frontier, out-of-order acks, empty transactions, keepalives,
//! dead-letter copies, and every order of acks over a few transactions.

use super::*;

fn lsn(n: u64) -> Lsn {
    Lsn(n)
}

#[test]
fn frontier_waits_for_every_record_of_a_transaction() {
    let mut t = AckTracker::new(lsn(100));
    let a = t.begin(0).unwrap();
    t.record().unwrap();
    t.record().unwrap();
    assert_eq!(t.commit(lsn(200)).unwrap(), lsn(100));
    assert_eq!(t.ack(a).unwrap(), lsn(100));
    assert_eq!(t.in_flight(), 1);
    assert_eq!(t.ack(a).unwrap(), lsn(200));
    assert!(!t.busy());
}

#[test]
fn a_standalone_record_waits_for_its_ack_and_never_goes_backwards() {
    let mut t = AckTracker::new(lsn(100));
    let a = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(200)).unwrap();
    // A non-transactional message starting right where that commit ended.
    let b = t.begin(0).unwrap();
    t.record().unwrap();
    assert_eq!(t.commit_standalone(lsn(200)).unwrap(), lsn(100));
    assert_eq!(t.ack(b).unwrap(), lsn(100), "the earlier transaction is not acked yet");
    assert_eq!(t.ack(a).unwrap(), lsn(200));
    // One at a later LSN moves the frontier to it once acked; an earlier LSN is clamped up.
    let c = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit_standalone(lsn(260)).unwrap();
    assert_eq!(t.confirmed(), lsn(200));
    assert_eq!(t.ack(c).unwrap(), lsn(260));
    t.begin(0).unwrap();
    assert_eq!(t.commit_standalone(lsn(10)).unwrap(), lsn(260));
    // A real commit must still be strictly later.
    t.begin(0).unwrap();
    assert!(t.commit(lsn(260)).is_err());
}

#[test]
fn out_of_order_acks_across_transactions() {
    let mut t = AckTracker::new(lsn(0));
    let a = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(10)).unwrap();
    let b = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(20)).unwrap();
    let c = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(30)).unwrap();
    // Later transactions acked first: nothing may be confirmed yet.
    assert_eq!(t.ack(c).unwrap(), lsn(0));
    assert_eq!(t.ack(b).unwrap(), lsn(0));
    // The first ack releases all three at once.
    assert_eq!(t.ack(a).unwrap(), lsn(30));
}

#[test]
fn ack_before_commit_does_not_confirm() {
    let mut t = AckTracker::new(lsn(5));
    let a = t.begin(0).unwrap();
    t.record().unwrap();
    assert_eq!(t.ack(a).unwrap(), lsn(5));
    assert_eq!(t.commit(lsn(9)).unwrap(), lsn(9));
}

#[test]
fn empty_transactions_complete_in_order() {
    let mut t = AckTracker::new(lsn(0));
    let a = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(10)).unwrap();
    t.begin(0).unwrap();
    // Empty, but behind an unacked one: must wait.
    assert_eq!(t.commit(lsn(20)).unwrap(), lsn(0));
    assert_eq!(t.ack(a).unwrap(), lsn(20));
    // Empty with nothing ahead: completes at commit.
    t.begin(0).unwrap();
    assert_eq!(t.commit(lsn(25)).unwrap(), lsn(25));
}

#[test]
fn empty_transactions_behind_a_stalled_record_take_no_memory() {
    let mut t = AckTracker::new(lsn(0));
    let a = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(10)).unwrap();
    for i in 0..100_000u64 {
        t.begin(0).unwrap();
        assert_eq!(t.commit(lsn(20 + i)).unwrap(), lsn(0), "the stalled record holds the frontier");
    }
    assert_eq!(t.queued(), 1, "empty transactions folded into the stalled one");
    // A transaction with a record after the flood, then more empties behind it.
    let b = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(200_000)).unwrap();
    t.begin(0).unwrap();
    t.commit(lsn(200_010)).unwrap();
    assert_eq!(t.queued(), 2);
    // Acking `a` releases the flood, but not `b` or what folded into it.
    assert_eq!(t.ack(a).unwrap(), lsn(20 + 99_999));
    assert_eq!(t.ack(b).unwrap(), lsn(200_010));
    assert_eq!(t.queued(), 0);
    let mut n = 0;
    t.drain_completed(|_| n += 1);
    assert_eq!(n, 100_003, "every transaction is still counted once");
}

#[test]
fn acks_find_their_transaction_after_folding() {
    let mut t = AckTracker::new(lsn(0));
    let a = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(10)).unwrap();
    t.begin(0).unwrap();
    t.commit(lsn(20)).unwrap();
    let c = t.begin(0).unwrap();
    t.record().unwrap();
    t.record().unwrap();
    t.commit(lsn(30)).unwrap();
    assert_eq!(t.ack(c).unwrap(), lsn(0));
    assert_eq!(t.ack(a).unwrap(), lsn(20));
    assert_eq!(t.ack(c).unwrap(), lsn(30));
    assert!(t.ack(TxnId(1)).is_err(), "the folded transaction has no records to ack");
}

#[test]
fn keepalive_advances_only_when_idle() {
    let mut t = AckTracker::new(lsn(10));
    assert_eq!(t.keepalive(lsn(50)), lsn(50));
    // A smaller wal_end never moves us back.
    assert_eq!(t.keepalive(lsn(40)), lsn(50));
    let a = t.begin(0).unwrap();
    assert_eq!(t.keepalive(lsn(60)), lsn(50), "open transaction blocks keepalive");
    t.record().unwrap();
    t.commit(lsn(70)).unwrap();
    assert_eq!(t.keepalive(lsn(80)), lsn(50), "unacked record blocks keepalive");
    assert_eq!(t.ack(a).unwrap(), lsn(80), "the WAL end kept while busy applies at the last ack");
    assert_eq!(t.keepalive(lsn(90)), lsn(90));
}

#[test]
fn a_keepalive_seen_while_busy_applies_once_the_queue_empties() {
    let mut t = AckTracker::new(lsn(10));
    let a = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(20)).unwrap();
    // WAL past our commit that holds nothing for us (another table, a running-xacts record).
    assert_eq!(t.keepalive(lsn(40)), lsn(10), "an unacked record holds the frontier");
    let b = t.begin(0).unwrap();
    t.record().unwrap();
    assert_eq!(t.ack(a).unwrap(), lsn(20), "a transaction is open: the kept WAL end waits");
    t.commit(lsn(50)).unwrap();
    assert_eq!(t.confirmed(), lsn(20));
    // Nothing is ours once b is acked: its end is past the kept one, so the frontier is its end.
    assert_eq!(t.ack(b).unwrap(), lsn(50));
    // A keepalive before the ack with no later transaction: the ack alone reaches the WAL end.
    let c = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(60)).unwrap();
    t.keepalive(lsn(90));
    assert_eq!(t.ack(c).unwrap(), lsn(90), "the kept WAL end applies when the last ack empties the queue");
    // And the monotonicity check moved with it.
    t.begin(0).unwrap();
    assert!(matches!(t.commit(lsn(90)), Err(AckError::Backwards { .. })));
}

#[test]
fn backwards_commit_and_nesting_are_errors() {
    let mut t = AckTracker::new(lsn(100));
    t.begin(0).unwrap();
    assert!(matches!(t.begin(0), Err(AckError::NestedBegin(_))));
    assert_eq!(t.commit(lsn(100)), Err(AckError::Backwards { end: lsn(100), prev: lsn(100) }));
    let mut t = AckTracker::new(lsn(0));
    assert!(matches!(t.record(), Err(AckError::NoOpenTxn(_))));
    assert!(matches!(t.commit(lsn(1)), Err(AckError::NoOpenTxn(_))));
    t.begin(0).unwrap();
    t.commit(lsn(50)).unwrap();
    t.begin(0).unwrap();
    assert!(matches!(t.commit(lsn(40)), Err(AckError::Backwards { .. })));
}

#[test]
fn stray_acks_are_errors() {
    let mut t = AckTracker::new(lsn(0));
    let a = t.begin(0).unwrap();
    t.record().unwrap();
    t.commit(lsn(5)).unwrap();
    t.ack(a).unwrap();
    assert_eq!(t.ack(a), Err(AckError::UnknownTxn(a)));
    assert_eq!(t.ack(TxnId(99)), Err(AckError::UnknownTxn(TxnId(99))));
}

/// Every interleaving of acks over a few transactions: the frontier is always the end LSN of
/// the longest fully-acked committed prefix, and never decreases.
#[test]
fn exhaustive_small_interleavings() {
    // Transactions with 0..=2 records each; acks in every permutation order.
    let sizes = [2usize, 0, 1, 2];
    let mut records = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        for _ in 0..n {
            records.push(i);
        }
    }
    let mut perm: Vec<usize> = (0..records.len()).collect();
    let mut count = 0;
    loop {
        let mut t = AckTracker::new(lsn(0));
        let ids: Vec<TxnId> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let id = t.begin(0).unwrap();
                for _ in 0..n {
                    t.record().unwrap();
                }
                t.commit(lsn(10 * (i as u64 + 1))).unwrap();
                id
            })
            .collect();
        let mut acked = vec![0usize; sizes.len()];
        let mut prev = t.confirmed();
        for &p in &perm {
            let txn = records[p];
            acked[txn] += 1;
            let now = t.ack(ids[txn]).unwrap();
            assert!(now >= prev);
            prev = now;
            let prefix = (0..sizes.len()).take_while(|&i| acked[i] == sizes[i]).count();
            let expect = if prefix == 0 { 0 } else { 10 * prefix as u64 };
            assert_eq!(now, lsn(expect), "perm {perm:?}");
        }
        assert_eq!(t.confirmed(), lsn(40));
        count += 1;
        if !next_permutation(&mut perm) {
            break;
        }
    }
    assert_eq!(count, 120);
}

fn next_permutation(v: &mut [usize]) -> bool {
    let Some(i) = (1..v.len()).rev().find(|&i| v[i - 1] < v[i]) else {
        return false;
    };
    let j = (i..v.len()).rev().find(|&j| v[j] > v[i - 1]).unwrap();
    v.swap(i - 1, j);
    v[i..].reverse();
    true
}

#[test]
fn dead_letter_copy_keeps_the_transaction_open_until_it_is_acked() {
    let mut t = AckTracker::new(Lsn(0));
    let a = t.begin(77).unwrap();
    t.record().unwrap();
    t.commit(Lsn(10)).unwrap();
    assert_eq!(t.oldest_commit_time(), Some(77));
    // The original is rejected: add the DLQ copy, then resolve the original.
    t.record_for(a).unwrap();
    assert_eq!(t.ack(a).unwrap(), Lsn(0), "the copy is still pending");
    assert_eq!(t.ack(a).unwrap(), Lsn(10));
    let mut done = Vec::new();
    t.drain_completed(|c| done.push(c));
    assert_eq!(done, vec![77]);
    t.drain_completed(|c| done.push(c));
    assert_eq!(done, vec![77], "drained once");
    assert_eq!(t.oldest_commit_time(), None);
    assert!(t.record_for(a).is_err(), "a finished transaction takes no more records");
}

#[test]
fn a_transaction_completes_on_its_own_last_ack_not_on_the_frontier() {
    let mut t = AckTracker::new(Lsn(0));
    let a = t.begin(1).unwrap();
    t.record().unwrap();
    t.commit(Lsn(10)).unwrap();
    let b = t.begin(2).unwrap();
    t.record().unwrap();
    t.commit(Lsn(20)).unwrap();
    t.ack(b).unwrap();
    let mut done = Vec::new();
    t.drain_completed(|c| done.push(c));
    assert_eq!(done, vec![2], "b is fully acked although a holds the frontier");
    assert_eq!(t.confirmed(), Lsn(0));
    t.ack(a).unwrap();
    t.drain_completed(|c| done.push(c));
    assert_eq!(done, vec![2, 1]);
    assert_eq!(t.confirmed(), Lsn(20));
    // An empty transaction completes at its commit.
    t.begin(3).unwrap();
    t.commit(Lsn(30)).unwrap();
    t.drain_completed(|c| done.push(c));
    assert_eq!(done, vec![2, 1, 3]);
}

/// A run of acks (`ack_n`, the relay's grouping of consecutive acks of one transaction) moves the
/// frontier exactly as that many single acks would: never past a transaction with a record still
/// in flight, and an over-long run is refused without changing anything.
#[test]
fn a_run_of_acks_never_confirms_past_a_record_in_flight() {
    let mut t = AckTracker::new(lsn(0));
    let a = t.begin(0).unwrap();
    for _ in 0..3 {
        t.record().unwrap();
    }
    t.commit(lsn(10)).unwrap();
    let b = t.begin(0).unwrap();
    t.record().unwrap();
    t.record().unwrap();
    t.commit(lsn(20)).unwrap();
    // All of b, two of a's three: nothing may be confirmed.
    assert_eq!(t.ack_n(b, 2).unwrap(), lsn(0));
    assert_eq!(t.ack_n(a, 2).unwrap(), lsn(0));
    assert_eq!(t.in_flight(), 1);
    // A run longer than what is pending is a bug: refused, and the frontier does not move.
    assert_eq!(t.ack_n(a, 2), Err(AckError::TooManyAcks { id: a, n: 2, pending: 1 }));
    // An empty run changes nothing either.
    assert_eq!(t.ack_n(a, 0), Ok(lsn(0)));
    assert_eq!(t.confirmed(), lsn(0));
    assert_eq!(t.in_flight(), 1);
    // The last record of a: both transactions are confirmed, and both counted as completed.
    assert_eq!(t.ack_n(a, 1).unwrap(), lsn(20));
    let mut completed = 0;
    t.drain_completed(|_| completed += 1);
    assert_eq!(completed, 2);
    assert!(!t.busy());
}
