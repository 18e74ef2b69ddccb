//! Background tasks that may not die silently. A task that ends while the work it serves goes on
//! (a panic, or a return its owner did not ask for) becomes a [`Definite::TaskEnded`] error in the
//! loop that owns it, and so ends the process with the task named, instead of leaving the process
//! half alive (an idle slot pinning WAL without heartbeats, deliveries that never resolve while
//! `/healthz` stays green).
//!
//! [`fault`] is the harness's way to make a named task die: in debug builds only, the environment
//! variable `OUTBOXD_FAULT_END_TASK` names one task (`monitor`, `kafka-reports`) that panics when
//! it starts. Release builds compile it to `false`.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::error::Definite;

/// A sink's report that a task it depends on ended. The sink keeps one end; the loop that drives
/// the sink waits on a clone ([`Failure::wait`]) beside its other work, so a dead task stops it.
/// The default one never fires.
#[derive(Clone, Default)]
pub struct Failure {
    fired: CancellationToken,
    error: Arc<Mutex<Option<Definite>>>,
}

impl Failure {
    /// Record `e` (the first report wins) and wake every waiter.
    pub fn report(&self, e: Definite) {
        let mut slot = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(e);
        }
        self.fired.cancel();
    }

    /// Resolves once a failure was reported. Cancel-safe.
    pub async fn wait(&self) -> Definite {
        self.fired.cancelled().await;
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| Definite::Bug("a sink task's failure was reported twice".into()))
    }

    /// Report through `self` when `task` (called `what`) ends; the watcher ends with it. Abort
    /// `task` through the returned handle to stop it without a report mattering.
    pub fn watch(&self, what: &'static str, task: JoinHandle<()>) -> tokio::task::AbortHandle {
        let abort = task.abort_handle();
        let me = self.clone();
        tokio::spawn(async move {
            match task.await {
                // Stopped through the handle: its owner no longer needs it.
                Err(e) if e.is_cancelled() => {}
                r => me.report(ended(what, r)),
            }
        });
        abort
    }
}

/// The error for `what` having ended with `joined` while it was still needed.
pub fn ended(what: &str, joined: Result<(), JoinError>) -> Definite {
    let how = match joined {
        Ok(()) => "returned".to_owned(),
        Err(e) if e.is_panic() => {
            let p = e.into_panic();
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text payload".into());
            format!("panicked: {msg}")
        }
        Err(_) => "was cancelled".to_owned(),
    };
    Definite::TaskEnded { task: what.to_owned(), how }
}

/// Whether the harness asked `task` to die (debug builds only; see the module doc).
pub fn fault(task: &str) -> bool {
    cfg!(debug_assertions) && std::env::var("OUTBOXD_FAULT_END_TASK").is_ok_and(|v| v == task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watched_task_that_ends_fires_the_failure() {
        let f = Failure::default();
        let _abort = f.watch("the pump", tokio::spawn(async { panic!("gone") }));
        let e = tokio::time::timeout(std::time::Duration::from_secs(5), f.wait()).await.expect("fired").to_string();
        assert!(e.contains("the pump") && e.contains("panicked: gone"), "{e}");
        // One that keeps running never fires.
        let g = Failure::default();
        let abort = g.watch("the loop", tokio::spawn(std::future::pending()));
        assert!(tokio::time::timeout(std::time::Duration::from_millis(50), g.wait()).await.is_err());
        abort.abort();
    }

    #[tokio::test]
    async fn a_panic_and_a_return_are_both_named() {
        let e = ended("the monitor", tokio::spawn(async { panic!("boom {}", 7) }).await).to_string();
        assert!(e.contains("the monitor") && e.contains("panicked: boom 7"), "{e}");
        let e = ended("the pump", tokio::spawn(async {}).await).to_string();
        assert!(e.contains("the pump") && e.contains("returned"), "{e}");
    }
}
