//! What rides with a record through librdkafka to its delivery report (the producer's opaque):
//! an event's handle, or the exactly-once position record, which resolves nothing.
//!
//! Invariant: only [`Sent::Record`] carries a [`Delivery`]; the position record's report only
//! counts towards its transaction ([`super::written::Written`]), so it can never be acked, failed
//! or condemned as if it were an event.

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
    pub fn given_back(self: Box<Sent>) -> Result<Delivery, SinkError> {
        match *self {
            Sent::Record(d) => Ok(d),
            Sent::Position => Err(SinkError::Fatal(Definite::Bug("the position record came back as an event".into()))),
        }
    }
}
