//! Keys `outboxd dlq replay` holds back: a copy read but not replayed in this run (no
//! destination, no payload, unreadable) holds its key from that copy on, so the key's later
//! events are not sent before it (a key's order). Events of the key read before that copy are
//! earlier in the key's order and are sent as usual, even when they wait in the same unsent
//! batch. A keyless copy holds nothing: keyless events have no order among them.
//!
//! Order is counted in events handed to a batch ([`Held::pushed`]): a copy held at count `n`
//! blocks an event of its key whose count is `n` or more.

use std::collections::HashMap;

/// See the module doc.
#[derive(Debug, Default)]
pub struct Held {
    /// Key → the count of events handed to a batch when its first copy was held.
    keys: HashMap<Vec<u8>, u64>,
    /// Events handed to a batch so far in this run.
    pushed: u64,
}

impl Held {
    /// An event was handed to the batch.
    pub fn pushed(&mut self) {
        self.pushed += 1;
    }

    /// A copy of `key` is held back here: the key's events handed to a batch from now on are not
    /// sent in this run. A keyless copy (or an empty key) holds nothing.
    pub fn hold(&mut self, key: Option<&[u8]>) {
        if let Some(k) = key.filter(|k| !k.is_empty()) {
            self.keys.entry(k.to_vec()).or_insert(self.pushed);
        }
    }

    /// Whether event `i` of the batch of `len` events handed last (the batch being sent), with
    /// `key`, comes after a held copy of its key.
    pub fn blocks(&self, key: Option<&[u8]>, len: usize, i: usize) -> bool {
        let Some(k) = key.filter(|k| !k.is_empty()) else { return false };
        let at = self.pushed.saturating_sub(len as u64) + i as u64;
        self.keys.get(k).is_some_and(|&held| held <= at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_events_after_a_held_copy_of_their_key_are_blocked() {
        let mut h = Held::default();
        // Batch: k(0), k(1); then a copy of k is held; then k(2), j(3); a keyless copy held.
        h.pushed();
        h.pushed();
        h.hold(Some(b"k"));
        h.hold(None);
        h.hold(Some(b""));
        h.pushed();
        h.pushed();
        let k = Some(&b"k"[..]);
        assert!(!h.blocks(k, 4, 0), "an earlier event of the key in the unsent batch");
        assert!(!h.blocks(k, 4, 1));
        assert!(h.blocks(k, 4, 2), "a later event of the held key");
        assert!(!h.blocks(Some(b"j"), 4, 3), "another key");
        assert!(!h.blocks(None, 4, 3), "a keyless held copy blocks no keyless event");
        assert!(!h.blocks(Some(b""), 4, 3));
        // A later batch: every event of k is after the held copy.
        h.pushed();
        assert!(h.blocks(k, 1, 0));
        // Held again later: the first hold counts.
        h.hold(Some(b"k"));
        assert!(h.blocks(k, 1, 0));
    }
}
