//! [`Handoff`]: how a sink with background tasks takes records without waiting, for the sinks
//! whose work happens in tasks fed by bounded channels (NATS, Redis, RabbitMQ, HTTP).
//!
//! A sink has one or more lanes (bounded channels, each read by a task). [`Handoff::push`] puts a
//! job on its lane at once when there is room; otherwise the job is *held* here, and so is every
//! job after it, whatever its lane, so jobs leave in the order they came. While anything is held
//! the sink is [`Sink::blocked`](super::Sink::blocked), and [`Handoff::unblock`] waits for room on
//! the lane of the oldest held job with `Sender::reserve`, which is cancel-safe: a job leaves
//! `held` only once its slot is taken, so dropping the wait loses nothing.
//!
//! The handoff also owns the sink's background tasks and aborts them when dropped: the handles of
//! the jobs they had not resolved then fail on drop, and the events are read again next session.

use std::collections::VecDeque;

use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::task::JoinHandle;

use super::SinkError;
use crate::error::Definite;

pub(super) struct Handoff<T> {
    lanes: Vec<mpsc::Sender<T>>,
    /// Jobs no lane had room for yet, oldest first, with their lane.
    held: VecDeque<(usize, T)>,
    tasks: Vec<JoinHandle<()>>,
    /// What the sink reports when a lane's reader is gone.
    closed: &'static str,
}

impl<T> Handoff<T> {
    /// `closed` says which task ended, e.g. "the Redis writer task ended".
    pub fn new(lanes: Vec<mpsc::Sender<T>>, tasks: Vec<JoinHandle<()>>, closed: &'static str) -> Self {
        debug_assert!(!lanes.is_empty());
        Handoff { lanes, held: VecDeque::new(), tasks, closed }
    }

    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    fn closed(&self) -> SinkError {
        SinkError::Fatal(Definite::Sink(self.closed.into()))
    }

    /// Hand `job` to `lane` now, or hold it (behind every job already held).
    #[allow(clippy::result_large_err)] // the error of `Sink::send`, returned as it is
    pub fn push(&mut self, lane: usize, job: T) -> Result<(), SinkError> {
        if !self.held.is_empty() {
            self.held.push_back((lane, job));
            return Ok(());
        }
        match self.lanes[lane].try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(job)) => {
                self.held.push_back((lane, job));
                Ok(())
            }
            Err(TrySendError::Closed(_)) => Err(self.closed()),
        }
    }

    pub fn blocked(&self) -> bool {
        !self.held.is_empty()
    }

    /// Wait for room for the oldest held job, then hand over as many held jobs as fit without
    /// waiting again. Pending forever while nothing is held. Cancel-safe.
    pub async fn unblock(&mut self) -> Result<(), SinkError> {
        let Some(&(lane, _)) = self.held.front() else { return std::future::pending().await };
        let Ok(permit) = self.lanes[lane].reserve().await else { return Err(self.closed()) };
        if let Some((_, job)) = self.held.pop_front() {
            permit.send(job);
        }
        while let Some((lane, job)) = self.held.pop_front() {
            match self.lanes[lane].try_send(job) {
                Ok(()) => {}
                Err(TrySendError::Full(job)) => {
                    self.held.push_front((lane, job));
                    break;
                }
                Err(TrySendError::Closed(_)) => return Err(self.closed()),
            }
        }
        Ok(())
    }

    /// Drop the held jobs (their handles fail on drop).
    pub fn discard_held(&mut self) {
        self.held.clear();
    }
}

/// Inside `impl Sink for …` of a sink whose held jobs live in a field `handoff`: the
/// [`Sink`](super::Sink) methods about held records, all answered by the handoff.
macro_rules! held_in_handoff {
    () => {
        fn blocked(&self) -> bool {
            self.handoff.blocked()
        }

        async fn unblock(&mut self) -> Result<(), SinkError> {
            self.handoff.unblock().await
        }

        fn discard_held(&mut self) {
            self.handoff.discard_held();
        }
    };
}
pub(super) use held_in_handoff;

impl<T> Drop for Handoff<T> {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn full_lanes_hold_jobs_in_order_and_unblock_moves_them() {
        let (tx0, mut rx0) = mpsc::channel(1);
        let (tx1, mut rx1) = mpsc::channel(1);
        let mut h = Handoff::new(vec![tx0, tx1], Vec::new(), "gone");
        h.push(0, 1).unwrap();
        h.push(0, 2).unwrap(); // lane 0 full: held
        h.push(1, 3).unwrap(); // lane 1 has room, but a job is held: held behind it
        assert!(h.blocked());
        assert_eq!(h.held.len(), 2);
        assert_eq!(rx0.recv().await, Some(1));
        h.unblock().await.unwrap();
        assert!(!h.blocked(), "both held jobs fit now");
        assert_eq!(rx0.recv().await, Some(2));
        assert_eq!(rx1.recv().await, Some(3));
    }

    #[tokio::test]
    async fn unblock_stops_at_a_full_lane_and_a_dropped_wait_loses_nothing() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut h = Handoff::new(vec![tx], Vec::new(), "gone");
        for j in 1..=3 {
            h.push(0, j).unwrap();
        }
        // No room: the wait is cancelled, and the held jobs stay.
        let waited = tokio::time::timeout(std::time::Duration::from_millis(20), h.unblock()).await;
        assert!(waited.is_err());
        assert_eq!(h.held.len(), 2);
        assert_eq!(rx.recv().await, Some(1));
        h.unblock().await.unwrap();
        assert_eq!(h.held.len(), 1, "one slot free: one job moved");
        assert_eq!(rx.recv().await, Some(2));
        h.unblock().await.unwrap();
        assert_eq!(rx.recv().await, Some(3));
        assert!(!h.blocked());
    }

    #[tokio::test]
    async fn a_closed_lane_is_fatal() {
        let (tx, rx) = mpsc::channel::<u8>(1);
        drop(rx);
        let mut h = Handoff::new(vec![tx], Vec::new(), "the writer task ended");
        match h.push(0, 1) {
            Err(SinkError::Fatal(Definite::Sink(m))) => assert_eq!(m, "the writer task ended"),
            other => panic!("{other:?}"),
        }
    }
}
