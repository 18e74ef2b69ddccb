//! When the inbox writer's periodic chores are due: the backlog gauges and `--retain`'s pruning.
//! By the clock, not by counted turns, so a turn delayed by a long write does not push them back.

use std::time::{Duration, Instant};

/// When the writer's periodic chores are next due: the backlog gauges every [`Chores::BACKLOG`],
/// pruning every [`Chores::PRUNE`] (the first 30 s after the start).
pub(super) struct Chores {
    backlog: Instant,
    prune: Instant,
}

impl Chores {
    const BACKLOG: Duration = Duration::from_secs(5);
    const PRUNE: Duration = Duration::from_secs(60);

    pub fn new(now: Instant) -> Chores {
        Chores { backlog: now, prune: now + Duration::from_secs(30) }
    }

    /// Whether the backlog and the pruning are due at `now`; a due one is set to its next time.
    pub fn due(&mut self, now: Instant) -> (bool, bool) {
        let next = |at: &mut Instant, every: Duration| {
            let due = now >= *at;
            if due {
                *at = now + every;
            }
            due
        };
        (next(&mut self.backlog, Self::BACKLOG), next(&mut self.prune, Self::PRUNE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chores_come_by_the_clock_however_late_the_turns() {
        let t0 = Instant::now();
        let mut c = Chores::new(t0);
        assert_eq!(c.due(t0), (true, false), "the backlog at once, pruning after 30 s");
        assert_eq!(c.due(t0 + Duration::from_secs(4)), (false, false));
        // One turn 40 s late (a long write): both are due once, not once per missed turn.
        assert_eq!(c.due(t0 + Duration::from_secs(40)), (true, true));
        assert_eq!(c.due(t0 + Duration::from_secs(41)), (false, false));
        assert_eq!(c.due(t0 + Duration::from_secs(45)), (true, false));
        assert_eq!(c.due(t0 + Duration::from_secs(100)), (true, true));
    }
}
