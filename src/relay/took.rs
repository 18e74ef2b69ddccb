//! What happens to every ack the relay takes from the queue, wherever it is taken: while the
//! source runs ([`Relay::apply_acks`]) and after its loop ended ([`Relay::drain_acked`]).
//!
//! # Invariants
//! * One place: an ack's record leaves the in-flight count, its span ends, and an acked record
//!   to its own topic is counted in `outboxd_events_total`, here and nowhere else, so an ack
//!   taken at either point is accounted the same way.
//! * No per-record lookup: acks are tallied per topic over a run and counted per topic
//!   ([`Relay::count_acked`]) once the run is applied.

use super::{Ack, Outcome, Relay, Ticket};
use crate::router::Text;
use crate::sink::Sink;

/// Distinct topics [`Relay::tally_acked`] keeps before it counts what it has.
const ACKED_TOPICS: usize = 16;

impl<S: Sink> Relay<'_, S> {
    /// What every ack taken from the queue goes through first, in both places it is taken
    /// ([`Relay::apply_acks`] while the source runs, [`Relay::drain_acked`] after its loop ended),
    /// so neither can miss a step: its record leaves the in-flight count, its span ends with its
    /// outcome, and an ack of a record to its own topic is tallied for `outboxd_events_total` (a
    /// dead-letter copy or chunk is counted by `outboxd_dlq_events_total` instead). Returns the
    /// ticket of an acked record, for the ledger, or the ack of a failed or rejected one, for the
    /// caller to act on.
    pub(super) fn took(&mut self, ack: Ack) -> Result<Ticket, Ack> {
        self.resolved(ack.bytes);
        if let Some(otlp) = crate::otlp::exporter() {
            let outcome = match (&ack.outcome, ack.dead_letter) {
                (Outcome::Acked, false) => "acked",
                (Outcome::Acked, true) => "dead_lettered",
                (Outcome::Failed { .. }, _) => "failed",
                // The policy ends it (skipped, dead-lettered) or the source stops.
                (Outcome::Rejected(_), _) => "",
            };
            // An ack made before the exporter started carries no `about` (so no id); its span was
            // never begun. An empty event id is an id like any other.
            if !outcome.is_empty() && ack.about.is_some() {
                otlp.end(ack.event_id(), outcome);
            }
        }
        if !matches!(ack.outcome, Outcome::Acked) {
            return Err(ack);
        }
        if !ack.dead_letter {
            self.tally_acked(ack.topic);
        }
        Ok(ack.ticket)
    }

    /// One more record acked to `topic`. Acks to several topics interleave (events of several
    /// types), so they are tallied per topic over a whole run of acks: one series lookup per topic
    /// and run ([`Relay::count_acked`]), not per record. A handful of topics is the usual case; past
    /// [`ACKED_TOPICS`] the tally is counted and starts over, so the scan stays short.
    fn tally_acked(&mut self, topic: Text) {
        // The records of a route share its topic text: the same bytes at the same address, found
        // without comparing them.
        let same = |t: &Text| (t.as_ptr() == topic.as_ptr() && t.len() == topic.len()) || *t == topic;
        if let Some((_, n)) = self.acked.iter_mut().find(|(t, _)| same(t)) {
            *n += 1;
            return;
        }
        if self.acked.len() >= ACKED_TOPICS {
            self.count_acked();
        }
        self.acked.push((topic, 1));
    }

    /// Add the tallied acks to `outboxd_events_total`.
    pub(super) fn count_acked(&mut self) {
        for (topic, n) in self.acked.drain(..) {
            self.metrics.acked_n(&topic, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::lsn::Lsn;
    use crate::metrics::Metrics;
    use crate::relay::tests::{cfg, record_on as record};
    use crate::relay::{Position, Source};
    use crate::sink::NullSink;

    /// Acks the session's loop did not take before it ended (a shutdown during a burst of delivery
    /// reports) confirm their LSN through `drain_acked`: they count in `outboxd_events_total` as
    /// the loop's own acks do, and leave the in-flight count.
    #[test]
    fn acks_drained_after_the_loop_count_as_delivered_events() {
        let recorder = crate::metrics::builder().unwrap().build_recorder();
        let handle = recorder.handle();
        let mut done = Vec::new();
        metrics::with_local_recorder(&recorder, || {
            let mut sink = NullSink;
            let mut relay = Relay::new(&mut sink, cfg(), Metrics::new());
            let source = Source { position: Position::Lsn(Lsn(1)), table: Arc::from("public.outbox") };
            for (n, topic) in ["orders", "orders", "users"].into_iter().enumerate() {
                let r = record(topic, n as u64);
                relay.delivery(Ticket(n as u64), &r, 10, source.clone()).ack();
            }
            // A dead-letter copy's ack completes its ticket but is not an event to its topic.
            let r = record("dlq", 9);
            relay.delivery(Ticket(9), &r, 10, source.clone()).for_dead_letter("part 1 of 1".into()).ack();
            assert_eq!(relay.in_flight(), 4);
            relay.drain_acked(|t| {
                done.push(t);
                true
            });
            assert_eq!(relay.in_flight(), 0);
            assert_eq!(relay.in_flight_bytes(), 0);
        });
        assert_eq!(done, [Ticket(0), Ticket(1), Ticket(2), Ticket(9)]);
        let body = handle.render();
        let mut got: Vec<&str> = body.lines().filter(|l| l.starts_with("outboxd_events_total{")).collect();
        got.sort();
        assert_eq!(
            got,
            ["outboxd_events_total{topic=\"orders\"} 2", "outboxd_events_total{topic=\"users\"} 1"],
            "{body}"
        );
    }
}
