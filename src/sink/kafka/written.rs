//! The delivery reports of the open Kafka transaction (`--delivery exactly-once`), held until
//! the transaction ends: the delivery-report callback ([`super::events`]) puts them here, and the
//! transactions ([`super::txn`]) take them to ack on commit or disarm on abort.
//!
//! # Invariants
//! * No handle is acked here: a report only waits, so a record is acked only after the commit
//!   that holds it.
//! * Every report wakes a waiter ([`Written::wait_for`]), so a commit waiting for all of its
//!   records never misses the last one.

use std::sync::Mutex;
use std::time::Duration;

use super::sent::Sent;

/// Delivery reports of the open transaction: held until it commits.
#[derive(Default)]
pub struct Written {
    acked: Mutex<Vec<Sent>>,
    failed: Mutex<Vec<Failed>>,
    /// Woken by every report, for the commit that waits for all of them.
    arrived: tokio::sync::Notify,
}

/// A failed delivery report: the handle, the reason, and the rejection code when the broker
/// refused this one record ([`super::events::rejection_code`]).
pub(super) type Failed = (Sent, String, Option<&'static str>);

/// What [`Written::take`] returns: the acked handles, and the failed ones.
pub(super) type Reports = (Vec<Sent>, Vec<Failed>);

impl Written {
    pub(super) fn acked(&self, d: Sent) {
        self.acked.lock().unwrap_or_else(|p| p.into_inner()).push(d);
        self.arrived.notify_one();
    }

    pub(super) fn failed(&self, d: Sent, reason: String, code: Option<&'static str>) {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).push((d, reason, code));
        self.arrived.notify_one();
    }

    /// Wait, without blocking the runtime (whose thread serves the reports), until `n` reports
    /// arrived or `limit` passed.
    pub(super) async fn wait_for(&self, n: usize, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while self.count() < n {
            if tokio::time::timeout_at(deadline, self.arrived.notified()).await.is_err() {
                return;
            }
        }
    }

    fn count(&self) -> usize {
        self.acked.lock().unwrap_or_else(|p| p.into_inner()).len()
            + self.failed.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Take everything reported so far: (acked, failed).
    pub(super) fn take(&self) -> Reports {
        (
            std::mem::take(&mut *self.acked.lock().unwrap_or_else(|p| p.into_inner())),
            std::mem::take(&mut *self.failed.lock().unwrap_or_else(|p| p.into_inner())),
        )
    }

    /// Forget every handle of an aborted transaction (the next session resends them). Records
    /// the broker refused for good are returned, to be condemned ([`super::txn::Txns::condemned`]).
    pub(super) fn disarm_all(&self) -> Vec<(Sent, String, &'static str)> {
        let (acked, failed) = self.take();
        acked.into_iter().for_each(|d| d.disarm());
        let mut refused = Vec::new();
        for (d, reason, code) in failed {
            match code {
                Some(code) => refused.push((d, reason, code)),
                None => d.disarm(),
            }
        }
        refused
    }
}
