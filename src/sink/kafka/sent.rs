//! What rides with a record through librdkafka to its delivery report: an event's handle, or the
//! exactly-once position record, which resolves nothing; and where it waits meanwhile
//! ([`InFlight`]).
//!
//! The producer's opaque is not a pointer to a boxed [`Sent`] (an allocation and a free per record,
//! ~340 instructions with glibc's allocator at our batch sizes) but a [`Slot`]: the key under which
//! the [`Sent`] waits in the client's [`InFlight`] slab, whose room is reused record after record.
//!
//! # Invariants
//! * Only [`Sent::Record`] carries a [`Delivery`]; the position record's report only counts towards
//!   its transaction ([`super::written::Written`]), so it can never be acked, failed or condemned as
//!   if it were an event.
//! * A [`Sent`] put in [`InFlight`] is taken out exactly once: by its delivery report, or by the
//!   producer call that refused its record. A slot librdkafka reports twice, or never handed out,
//!   finds nothing ([`InFlight::take`] gives `None`), never another record's handle: a slab key is
//!   reused as soon as its entry was taken, so a [`Slot`] carries the entry's generation beside
//!   its key (a stale slot's generation differs, for 2^32 reuses of one key).
//! * No [`Slot`] is a null opaque (keys are stored plus one).
//! * A [`Sent`] still in [`InFlight`] when the client goes away is dropped with it: an event's
//!   handle dropped without a result counts as not delivered; in a transaction it is disarmed
//!   instead (`DeliveryContext`'s drop).

use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

use rdkafka::util::IntoOpaque;
use slab::Slab;

use super::SinkError;
use crate::error::Definite;
use crate::sink::delivery::Delivery;

/// The opaque of one produced record.
pub enum Sent {
    /// An event's record, or a chunk of a dead-letter copy: its handle resolves it.
    Record(Delivery),
    /// The exactly-once position record ([`super::txn::Txns::commit`]).
    Position,
}

impl Sent {
    /// Resolve the record as acked (the position record has nothing to resolve).
    pub fn ack(self) {
        if let Sent::Record(d) = self {
            d.ack();
        }
    }

    /// Give the handle up without reporting.
    pub fn disarm(self) {
        if let Sent::Record(d) = self {
            d.disarm();
        }
    }

    /// The handle of a record the producer gave back unsent. Only the sink's own records come
    /// back there; the position record is sent, and given back, by the transaction alone.
    #[allow(clippy::result_large_err)]
    pub fn given_back(back: Option<Sent>) -> Result<Delivery, SinkError> {
        match back {
            Some(Sent::Record(d)) => Ok(d),
            Some(Sent::Position) => {
                Err(SinkError::Fatal(Definite::Bug("the position record came back as an event".into())))
            }
            None => Err(SinkError::Fatal(Definite::Bug("a refused record's handle was not in flight".into()))),
        }
    }
}

/// The [`Sent`] of every record librdkafka holds, each under its [`Slot`].
#[derive(Default)]
pub struct InFlight(Mutex<Held>);

/// The slab, and the generation the next entry gets.
#[derive(Default)]
struct Held {
    slab: Slab<(u32, Sent)>,
    generation: u32,
}

/// A record's key into [`InFlight`], as librdkafka carries it (its opaque): the slab key plus one
/// in the low 32 bits, the entry's generation in the high 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(usize);

// The slot packs two 32-bit halves into the opaque.
const _: () = assert!(usize::BITS == 64, "sink/kafka/sent.rs packs a slot into a 64-bit opaque");

impl InFlight {
    /// Keep `sent` until its record's report (or refusal) takes it back. Keys stay below 2^32 - 1:
    /// the in-flight budget holds far fewer records at once.
    pub fn put(&self, sent: Sent) -> Slot {
        let mut held = self.lock();
        let generation = held.generation;
        held.generation = generation.wrapping_add(1);
        let key = held.slab.insert((generation, sent));
        Slot(((generation as usize) << 32) | ((key + 1) & 0xffff_ffff))
    }

    /// Take back what `slot` holds; nothing for a slot not (or no longer) in flight.
    pub fn take(&self, slot: Slot) -> Option<Sent> {
        let key = (slot.0 & 0xffff_ffff).checked_sub(1)?;
        let generation = (slot.0 >> 32) as u32;
        let mut held = self.lock();
        match held.slab.get(key) {
            Some((g, _)) if *g == generation => held.slab.try_remove(key).map(|(_, sent)| sent),
            _ => None,
        }
    }

    /// Everything still held, taken out.
    pub fn drain(&self) -> Vec<Sent> {
        self.lock().slab.drain().map(|(_, sent)| sent).collect()
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        // A panic while the lock is held cannot leave the slab half-changed (insert and remove
        // either happen or not), so a poisoned lock is still a sound one.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl IntoOpaque for Slot {
    fn into_ptr(self) -> *mut c_void {
        std::ptr::without_provenance_mut(self.0)
    }

    unsafe fn from_ptr(ptr: *mut c_void) -> Self {
        Slot(ptr.addr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_gives_its_record_back_once_and_is_never_null() {
        let slab = InFlight::default();
        let a = slab.put(Sent::Position);
        let b = slab.put(Sent::Position);
        assert!(!a.into_ptr().is_null() && !b.into_ptr().is_null());
        assert_ne!(a, b);
        // SAFETY: the pointer was made by `into_ptr`.
        let back = unsafe { Slot::from_ptr(a.into_ptr()) };
        assert!(matches!(slab.take(back), Some(Sent::Position)));
        assert!(slab.take(a).is_none(), "a slot is taken once");
        assert!(slab.take(Slot(0)).is_none(), "a null opaque finds nothing");
        assert!(slab.take(Slot(99)).is_none(), "a slot never handed out finds nothing");
        assert!(matches!(slab.take(b), Some(Sent::Position)));
    }

    /// A key is reused at once; a report of its earlier record (a slot reported twice) must not
    /// take the record now waiting under it.
    #[test]
    fn a_stale_slot_never_takes_the_record_reusing_its_key() {
        let slab = InFlight::default();
        let first = slab.put(Sent::Position);
        assert!(slab.take(first).is_some());
        let second = slab.put(Sent::Position);
        assert_eq!(first.0 & 0xffff_ffff, second.0 & 0xffff_ffff, "the key is reused");
        assert!(slab.take(first).is_none(), "the stale slot finds nothing");
        assert!(slab.take(second).is_some(), "the new record is still there");
    }

    #[test]
    fn only_a_record_is_given_back_as_a_handle() {
        assert!(matches!(Sent::given_back(Some(Sent::Position)), Err(SinkError::Fatal(_))));
        assert!(matches!(Sent::given_back(None), Err(SinkError::Fatal(_))));
    }
}
