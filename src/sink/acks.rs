//! The acks' way back from the sinks to the relay: a queue that many [`AckSender`]s (one per
//! delivery handle in flight) push into and one [`AckReceiver`] (the relay's) takes from in
//! batches. Generic over what it carries (the sinks' `delivery::Ack`), so this file names nothing
//! of the delivery module that holds its senders.
//!
//! A channel per ack (tokio's unbounded mpsc: a slot claimed in a block list, a semaphore, a wake-up
//! per push, the same on the way out) costs several hundred instructions a record; acks come in
//! runs (a Kafka delivery report resolves a whole broker response, the null sink acks as it is
//! handed a burst), so here a push is a short lock and a `VecDeque` push, and the receiver swaps
//! the whole queue out under one lock and hands its acks out one by one without touching the
//! shared state again.
//!
//! # Invariants
//! * Order: acks leave in the order they were pushed (a swap keeps the queue's order, and the
//!   receiver empties what it swapped out before it swaps again).
//! * No lost wake-up: a push onto an empty queue wakes the receiver's registered waker; the
//!   receiver registers before it looks a second time, so a push between its first look and its
//!   registration is seen by the second look.
//! * Once the receiver is gone (the relay's session ended) pushes are dropped, as a send on a
//!   closed channel was: nobody needs those outcomes, and the next session reads the records again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use futures_util::task::AtomicWaker;

struct Shared<Ack> {
    queue: Mutex<VecDeque<Ack>>,
    waker: AtomicWaker,
    closed: AtomicBool,
}

impl<Ack> Shared<Ack> {
    /// The queue, even if a thread panicked while holding it (a push or a swap cannot leave it
    /// half-changed).
    fn queue(&self) -> MutexGuard<'_, VecDeque<Ack>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A new queue: the sender half goes into every delivery handle, the receiver to the relay.
pub fn ack_queue<Ack>() -> (AckSender<Ack>, AckReceiver<Ack>) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(VecDeque::new()),
        waker: AtomicWaker::new(),
        closed: AtomicBool::new(false),
    });
    (AckSender(shared.clone()), AckReceiver { shared, ready: VecDeque::new() })
}

/// Pushes acks; cheap to clone (a reference count).
pub struct AckSender<Ack>(Arc<Shared<Ack>>);

// By hand: a derived Clone would ask `Ack: Clone`, and only the reference count is cloned.
impl<Ack> Clone for AckSender<Ack> {
    fn clone(&self) -> Self {
        AckSender(self.0.clone())
    }
}

impl<Ack> std::fmt::Debug for AckSender<Ack> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AckSender")
    }
}

impl<Ack> AckSender<Ack> {
    /// Queue `ack` for the relay; dropped if the relay is gone.
    pub fn send(&self, ack: Ack) {
        if self.0.closed.load(Ordering::Relaxed) {
            return;
        }
        let was_empty = {
            let mut q = self.0.queue();
            let was_empty = q.is_empty();
            q.push_back(ack);
            was_empty
        };
        // Only the first ack of a run wakes the receiver: it takes the whole queue at once.
        if was_empty {
            self.0.waker.wake();
        }
    }
}

/// The relay's end: takes acks in push order.
pub struct AckReceiver<Ack> {
    shared: Arc<Shared<Ack>>,
    /// Acks swapped out of the shared queue, not yet handed out.
    ready: VecDeque<Ack>,
}

impl<Ack> AckReceiver<Ack> {
    /// The next ack if one is queued, without waiting.
    pub fn try_recv(&mut self) -> Option<Ack> {
        if let Some(ack) = self.ready.pop_front() {
            return Some(ack);
        }
        {
            let mut q = self.shared.queue();
            if q.is_empty() {
                return None;
            }
            // `ready` is empty: the swap gives the queue its capacity back for the next run.
            std::mem::swap(&mut *q, &mut self.ready);
        }
        self.ready.pop_front()
    }

    /// Wait for the next ack. Cancel-safe: an ack is taken only in the poll that returns it.
    pub async fn recv(&mut self) -> Ack {
        std::future::poll_fn(|cx| {
            if let Some(ack) = self.try_recv() {
                return Poll::Ready(ack);
            }
            self.shared.waker.register(cx.waker());
            match self.try_recv() {
                Some(ack) => Poll::Ready(ack),
                None => Poll::Pending,
            }
        })
        .await
    }
}

impl<Ack> Drop for AckReceiver<Ack> {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        // Release what was queued (handles' texts) now, not when the last handle goes.
        self.shared.queue().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::delivery::{Ack, Outcome, Ticket};

    fn ack(n: u64) -> Ack {
        Ack { ticket: Ticket(n), bytes: 1, topic: "t".into(), dead_letter: false, outcome: Outcome::Acked, about: None }
    }

    #[test]
    fn acks_leave_in_push_order_across_swaps() {
        let (tx, mut rx) = ack_queue();
        tx.send(ack(1));
        tx.send(ack(2));
        assert_eq!(rx.try_recv().map(|a| a.ticket), Some(Ticket(1)));
        // Pushed while the receiver holds a swapped-out run: after that run, not before.
        tx.send(ack(3));
        assert_eq!(rx.try_recv().map(|a| a.ticket), Some(Ticket(2)));
        assert_eq!(rx.try_recv().map(|a| a.ticket), Some(Ticket(3)));
        assert!(rx.try_recv().is_none());
    }

    #[tokio::test]
    async fn a_push_from_another_task_wakes_the_waiting_receiver() {
        let (tx, mut rx) = ack_queue();
        let pusher = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            tx.send(ack(7));
        });
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await.expect("woken");
        assert_eq!(got.ticket, Ticket(7));
        pusher.await.unwrap();
    }

    #[test]
    fn pushes_after_the_receiver_is_gone_are_dropped() {
        let (tx, rx) = ack_queue();
        tx.send(ack(1));
        drop(rx);
        tx.send(ack(2));
        assert!(tx.0.queue().is_empty());
    }

    /// Several pushers on a multi-thread runtime, the receiver waiting on another: every ack
    /// arrives exactly once, and each pusher's acks in the order it pushed them. A lost wake-up
    /// hangs the receiver with acks queued (the timeout turns that into a failure); it needs a push
    /// to land in a window of a few instructions, so the test runs several rounds.
    #[test]
    fn many_pushers_on_many_threads_lose_nothing_and_keep_each_ones_order() {
        const PUSHERS: u64 = 6;
        const EACH: u64 = 20_000;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
        for round in 0..8 {
            rt.block_on(async {
                let (tx, mut rx) = ack_queue::<Ack>();
                let receiver = tokio::spawn(async move {
                    let mut next = vec![0u64; PUSHERS as usize];
                    for _ in 0..PUSHERS * EACH {
                        let a = rx.recv().await;
                        let (p, i) = (a.ticket.0 / EACH, a.ticket.0 % EACH);
                        assert_eq!(i, next[p as usize], "pusher {p}'s acks out of order (or one twice)");
                        next[p as usize] += 1;
                    }
                    assert!(rx.try_recv().is_none(), "more acks than were pushed");
                    next
                });
                let pushers: Vec<_> = (0..PUSHERS)
                    .map(|p| {
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            for i in 0..EACH {
                                tx.send(ack(p * EACH + i));
                                // Short runs: the receiver empties the queue and waits again and
                                // again, so pushes meet it busy, registering and asleep.
                                if i % 4 == 0 {
                                    tokio::task::yield_now().await;
                                }
                            }
                        })
                    })
                    .collect();
                for p in pushers {
                    p.await.unwrap();
                }
                let next = tokio::time::timeout(std::time::Duration::from_secs(10), receiver)
                    .await
                    .unwrap_or_else(|_| {
                        panic!("round {round}: the receiver is stuck with acks queued (a lost wake-up)")
                    })
                    .unwrap();
                assert_eq!(next, vec![EACH; PUSHERS as usize]);
            });
        }
    }
}
