//! The in-flight budgets, `--max-in-flight` records and `--max-in-flight-bytes` bytes: what one
//! source may have handed to the sink and not yet resolved. The relay counts; [`Budget::admits`]
//! is the one rule every source's waiting goes by ([`super::wait`]).
//!
//! # Invariants
//! * The rule is checked before a record, against what is already in flight: the record count
//!   never passes `records`, and the bytes pass `bytes` by one record at most.
//! * A record always fits when nothing is in flight, however large: a budget delays a record, it
//!   never refuses one (the size check against the sink's own limit is the relay's `send`).

use crate::config::Config;

/// `--max-in-flight` and `--max-in-flight-bytes`: what may be handed to the sink and not yet
/// resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub records: usize,
    pub bytes: usize,
}

impl Budget {
    pub fn of(cfg: &Config) -> Budget {
        Budget { records: cfg.max_in_flight, bytes: cfg.max_in_flight_bytes }
    }

    /// Is there room for one more record beside `records` records of `bytes` bytes?
    pub fn admits(&self, records: usize, bytes: usize) -> bool {
        records < self.records && bytes < self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::Budget;

    #[test]
    fn a_budget_admits_below_both_limits_only() {
        let b = Budget { records: 3, bytes: 100 };
        assert!(b.admits(0, 0));
        assert!(b.admits(2, 99));
        assert!(!b.admits(3, 0), "the record budget is spent");
        assert!(!b.admits(0, 100), "the byte budget is spent");
    }

    #[test]
    fn one_record_of_any_size_fits_when_nothing_is_in_flight() {
        // The budget is checked before a record, against what is already in flight: a record
        // larger than the byte budget still goes when it would be alone.
        let b = Budget { records: 1, bytes: 1024 };
        assert!(b.admits(0, 0));
        assert!(!b.admits(1, 0));
    }
}
