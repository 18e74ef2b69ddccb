//! Logical messages whose prefix is a `--messages-prefix`: events of the transaction that emitted
//! them.
//!
//! A transactional message (`pg_logical_emit_message(true, ...)`) arrives between its
//! transaction's BEGIN and COMMIT, so it joins that transaction in the ack tracker exactly as a row
//! does: the commit is confirmed only after every record of it, rows and messages alike, is acked.
//! Its content is routed by [`MessageRoute`] through the rows' own router and masking.
//!
//! A non-transactional message is decoded as soon as it is written, even when the transaction that
//! wrote it aborts later, so it is never published. It is a bad event `non_transactional` handled
//! by `--on-bad-event` in a transaction of its own, confirmed at its LSN only once the policy is
//! done with it (for `dlq`: once the copy is acked). Under `--delivery exactly-once` the position
//! committed with the copy covers the message ([`Boundary::Standalone`]), and a new session that
//! meets it again behind that position passes over it, so its copy is written once.
//!
//! A message's content is the whole event object, not just its payload: `--mask`/`--encrypt` rules
//! cannot be applied to it, so when rules are configured a bad message's dead-letter copy leaves
//! the content out (header `outboxd.payload.dropped` says why).

use super::*;
use crate::pg::pgoutput::Message;
use crate::router::message::MessageRoute;

/// Reason code of a non-transactional message with an event prefix.
pub const NON_TRANSACTIONAL: &str = "non_transactional";

/// The message route and the `outboxd.source.table` name of each prefix.
pub(super) struct Messages {
    route: MessageRoute,
    sources: Vec<(String, Arc<str>)>,
}

impl Messages {
    fn compile(cfg: &Config) -> Result<Messages, Definite> {
        let sources = cfg.messages_prefixes.iter().map(|p| (p.clone(), Arc::from(format!("message:{p}")))).collect();
        Ok(Messages { route: MessageRoute::compile(&cfg.route)?, sources })
    }

    fn source(&self, prefix: &str) -> Arc<str> {
        match self.sources.iter().find(|(p, _)| p == prefix) {
            Some((_, s)) => s.clone(),
            None => Arc::from(format!("message:{prefix}")),
        }
    }
}

impl<S: Sink, W: WalSource> Session<'_, S, W> {
    /// One message with an event prefix (the caller matched it).
    pub(super) async fn on_event_message(&mut self, at: Lsn, m: Message) -> Result<(), Error> {
        if self.messages.is_none() {
            self.messages = Some(Messages::compile(self.cfg)?);
        }
        let Some(messages) = self.messages.as_ref() else { return Ok(()) };
        let source = Source { position: Position::Lsn(at), table: messages.source(&m.prefix) };
        if m.flags & 1 == 0 {
            let bad = BadEvent {
                event_id: messages.route.event_id(&m.content),
                code: NON_TRANSACTIONAL,
                message: format!(
                    "a logical message with prefix {:?} was emitted non-transactionally; it may come from a transaction that aborted, so it is not published: emit it with pg_logical_emit_message(true, ...)",
                    m.prefix
                ),
                topic: None,
                key: None,
                payload: Some(m.content),
                headers: Vec::new(),
                payload_dropped: None,
            };
            let bad = without_content_if_masked(self.cfg, bad);
            return self.on_standalone_bad(at, bad, source).await;
        }
        let commit_time_us = self.tracker.open_commit_time().ok_or_else(|| Definite::Protocol {
            lsn: at,
            detail: "a transactional logical message outside a transaction".into(),
        })?;
        let routed = match messages.route.row(&m.content) {
            Ok(tuple) => route_masked(self.cfg, messages.route.route(), OutboxRow { tuple: &tuple, commit_time_us }),
            Err(bad) => Err(without_content_if_masked(self.cfg, bad)),
        };
        self.emit(routed, source).await
    }

    /// A bad event decoded outside any transaction: the policy runs in a transaction of its own,
    /// so a dead-letter copy holds the frontier back until it is acked.
    async fn on_standalone_bad(&mut self, at: Lsn, bad: BadEvent, source: Source) -> Result<(), Error> {
        if self.tracker.open_commit_time().is_some() {
            // Not sent that way by pgoutput; if it were, the open transaction carries it.
            return self.emit(Err(bad), source).await;
        }
        let bug = |e: crate::source::wal::tracker::AckError| Definite::Bug(format!("{e} (at {at})"));
        self.tracker.begin(now_pg_us()).map_err(bug)?;
        // Handled before this session (an exactly-once position past it was committed with its
        // copy): an empty transaction, so the slot moves over it.
        if !self.resume.as_mut().is_some_and(|r| r.standalone(at)) {
            self.emit(Err(bad), source).await?;
            // Exactly-once: the next Kafka commit, which holds the copy, stores a position past it.
            self.relay.sink().boundary(Boundary::Standalone { at });
        }
        self.tracker.commit_standalone(at).map_err(bug)?;
        self.record_completed();
        Ok(())
    }
}

/// A bad message carries its whole content, which masking rules (written for the payload) cannot
/// be applied to: with rules configured, it is left out of the dead-letter copy.
fn without_content_if_masked(cfg: &Config, mut bad: BadEvent) -> BadEvent {
    if !cfg.mask.is_empty() && bad.payload.is_some() {
        bad.payload = None;
        bad.payload_dropped =
            Some("the logical message's content is not kept: --mask/--encrypt rules apply to the payload field".into());
    }
    bad
}
