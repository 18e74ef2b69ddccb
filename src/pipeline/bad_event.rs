//! What happens to an event that cannot be delivered as it is: the `--on-bad-event` policy.
//!
//! Two ways in: a row the router refused ([`Session::on_bad_row`], nothing counted for it yet), and
//! a record the sink refused for good, synchronously or in its delivery report
//! ([`Session::on_sink_result`], [`Session::on_bad_pending`], already counted in its transaction).
//! `fail` stops the session; `skip` logs, counts and resolves the record; `dlq` sends a copy to
//! `--dlq-topic` whose acks stand in for the event's.
//!
//! Invariant: the copy is counted in the transaction *before* the original is resolved, and a copy
//! split into chunks counts every chunk before any is sent, so the transaction can never complete
//! (and the frontier never pass it) on a partial copy. A dead-letter copy is never dead-lettered
//! again: its refusal stops the pipeline.

use super::*;

impl<S: Sink, W: WalSource> Session<'_, S, W> {
    /// What `send` or `unblock` said: a refusal of one record goes to the bad-event policy.
    pub(super) async fn on_sink_result(&mut self, r: Result<(), SinkError>) -> Result<(), Error> {
        match r {
            Ok(()) => Ok(()),
            Err(SinkError::Fatal(d)) => Err(d.into()),
            Err(SinkError::Rejected { code, reason, record, delivery }) => {
                if delivery.is_dead_letter() {
                    return Err(dead_letter_refused(*record, delivery, reason));
                }
                let txn = delivery.txn();
                let source = delivery.source().clone();
                self.in_flight_bytes = self.in_flight_bytes.saturating_sub(delivery.bytes());
                let dl = DeadLetter::from_record(*record, code, reason, source);
                // The policy resolves the original in the tracker itself.
                delivery.disarm();
                self.on_bad_pending(txn, dl).await
            }
        }
    }

    /// A row the router refused: nothing is counted for it yet.
    pub(super) async fn on_bad_row(&mut self, bad: BadEvent, source: Source) -> Result<(), Error> {
        self.metrics.failed(bad.code);
        match self.cfg.on_bad_event {
            BadEventPolicy::Fail => Err(bad.into_definite().into()),
            BadEventPolicy::Skip => {
                tracing::error!(event_id = ?bad.event_id, reason = bad.code, message = %bad.message, lsn = %source.position, "skipping bad event (--on-bad-event skip)");
                Ok(())
            }
            BadEventPolicy::Dlq => {
                let txn = self.tracker.record().map_err(|e| Definite::Bug(e.to_string()))?;
                self.dead_letter(txn, DeadLetter::from_bad_event(bad, source)).await
            }
        }
    }

    /// A bad event whose record is already counted in `txn` and not yet resolved.
    pub(super) async fn on_bad_pending(&mut self, txn: TxnId, dl: DeadLetter) -> Result<(), Error> {
        self.metrics.failed(dl.code);
        match self.cfg.on_bad_event {
            BadEventPolicy::Fail => {
                let reason = format!("{} ({})", dl.message, dl.code);
                Err(dl.into_failure(reason).into())
            }
            BadEventPolicy::Skip => {
                tracing::error!(event_id = ?dl.event_id, reason = dl.code, message = %dl.message, lsn = %dl.source.position, "skipping bad event (--on-bad-event skip)");
                self.tracker.ack(txn).map_err(|e| Definite::Bug(e.to_string()))?;
                Ok(())
            }
            BadEventPolicy::Dlq => {
                // Count the copy before resolving the original, so the transaction stays open.
                self.tracker.record_for(txn).map_err(|e| Definite::Bug(e.to_string()))?;
                self.tracker.ack(txn).map_err(|e| Definite::Bug(e.to_string()))?;
                self.dead_letter(txn, dl).await
            }
        }
    }

    /// Send the dead-letter copy for a record already counted in `txn`. A copy over the sink's
    /// limit goes as several chunk records: each is counted in the tracker before any is sent, so
    /// the transaction cannot complete until every chunk is acked.
    pub(super) async fn dead_letter(&mut self, txn: TxnId, dl: DeadLetter) -> Result<(), Error> {
        tracing::warn!(event_id = ?dl.event_id, reason = dl.code, message = %dl.message, lsn = %dl.source.position, dlq = %self.cfg.dlq_topic, "sending bad event to the dead-letter topic");
        self.metrics.dead_lettered(dl.code);
        let max = self.sink.dead_letter_max_bytes().unwrap_or(usize::MAX);
        let source = dl.source.clone();
        let records = dl.into_records(&self.cfg.dlq_topic, max);
        // `txn` already counts one record for the copy; add the other chunks before any is sent,
        // so the transaction cannot complete on a partial set.
        for _ in 1..records.len() {
            self.tracker.record_for(txn).map_err(|e| Definite::Bug(e.to_string()))?;
        }
        for record in records {
            let delivery = self.delivery(txn, &record, source.clone()).for_dead_letter();
            // Not through `on_sink_result`: a dead-letter copy never goes back to the policy.
            // Chunks not sent stay counted, so a refusal never lets the transaction complete.
            match self.sink.send(record, delivery).await {
                Ok(()) => {}
                Err(SinkError::Fatal(d)) => return Err(d.into()),
                Err(SinkError::Rejected { reason, record, delivery, .. }) => {
                    return Err(dead_letter_refused(*record, delivery, reason))
                }
            }
        }
        Ok(())
    }
}

/// A dead-letter copy is never dead-lettered again: its refusal stops the pipeline.
fn dead_letter_refused(record: Record, delivery: Delivery, reason: String) -> Error {
    let e = copy_refused(record.event_id, record.topic, &reason);
    delivery.fail(reason);
    e.into()
}
