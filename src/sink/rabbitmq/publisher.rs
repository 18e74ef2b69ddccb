//! The RabbitMQ sink's publisher task: one connection, one channel in confirm mode, and every
//! unconfirmed message in a window kept in send order.
//!
//! Jobs are published in the order they arrive on the one channel, `mandatory` set, with up to
//! [`WINDOW`] publisher confirms outstanding (RabbitMQ may confirm many at once with `multiple`;
//! lapin resolves each publish's own confirm). Every confirm is collected as soon as it resolves
//! (see [`Window`] for why a returned message is matched by its content, not by the confirm it
//! came with), and jobs are resolved front to back:
//! * `basic.ack` with no `basic.return` before it → `ack()`: the broker routed the message to
//!   every bound queue and, the message being persistent, wrote it to disk in the durable ones;
//! * `basic.ack` after a `basic.return` → `reject()` as `unroutable`: no queue is bound for this
//!   routing key at this exchange, so the broker dropped the message. That is a fact about this
//!   one event's topic, like NATS's "no stream binds the subject": `--on-bad-event` decides (the
//!   dead-letter copy goes to `--dlq-topic`, which needs a queue of its own);
//! * a body over the broker's `max_message_size` → `reject()` as `too_large`. RabbitMQ does not
//!   announce the limit; it closes the channel with 406 "message size N is larger than
//!   configured max size M". The publisher takes M from that text, reconnects, and rejects every
//!   unconfirmed message over M instead of publishing it again. Until it learns otherwise the
//!   limit is [`MAX_MESSAGE_SIZE`], RabbitMQ's default since 3.8;
//! * anything else (a `basic.nack`, a channel or connection error, no confirm within
//!   [`CONFIRM_TIMEOUT`], a missing exchange) → back off, reconnect, and publish the whole window
//!   again in order on a fresh channel. Nothing is acked on this path, so the slot stays put.
//!
//! At-least-once window: a message the broker stored whose confirm was lost with the connection
//! is published again, so a queue can hold it twice; the copies keep each key's order, since the
//! retry resends the whole unconfirmed suffix in order. A `basic.nack` of one message while later
//! ones were acked also resends those later ones after it: the first copies then arrive ahead of
//! the nacked event (consumers that dedupe by `message_id` keep the first copy).
//!
//! Health: `/readyz` and `outboxd_connected{component="rabbitmq"}` follow the link: up once a
//! channel is open in confirm mode, down from the first failure until a reconnect succeeds, and
//! checked every second, so a connection lost while idle (lapin's heartbeat, [`HEARTBEAT`] s
//! unless the URL sets `heartbeat`) shows too.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::FieldTable;
use lapin::uri::AMQPUri;
use lapin::BasicProperties;
use lapin::{Channel, Connection, ConnectionProperties, ErrorKind, ExchangeKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::config::RabbitConfig;
use crate::error::Definite;
use crate::health::Health;
use crate::sink::delivery::Delivery;
use crate::sink::link::Link as SinkLink;

/// Publishes awaiting their confirm at once, and the job channel's capacity.
pub const WINDOW: usize = 4096;
/// RabbitMQ's default `max_message_size` (128 MiB), the limit until the broker says otherwise.
pub const MAX_MESSAGE_SIZE: usize = 128 * 1024 * 1024;
/// A publish with no confirm this long counts as a lost connection.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Heartbeat seconds asked for when the URL sets none (RabbitMQ's default is 60).
const HEARTBEAT: u16 = 10;
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// AMQP reply codes that mean the settings are wrong, not that the broker is away.
const ACCESS_REFUSED: u16 = 403;
const NOT_FOUND: u16 = 404;
const PRECONDITION_FAILED: u16 = 406;
const NOT_ALLOWED: u16 = 530;

/// One record on its way to RabbitMQ: the message, and the record's parts for a rejection.
pub(super) struct Job {
    pub routing_key: String,
    pub properties: BasicProperties,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    pub headers: Vec<crate::router::Header>,
    pub delivery: Delivery,
}

impl Job {
    pub fn body(&self) -> &[u8] {
        self.payload.as_deref().unwrap_or_default()
    }

    /// Resolve as a bad event.
    pub fn reject(self, code: &'static str, reason: String) {
        self.delivery.reject(code, reason, self.key, self.payload, self.headers);
    }
}

/// An open connection and its confirm-mode channel. Dropping it closes both.
struct Link {
    conn: Connection,
    chan: Channel,
}

/// A published job: `seq` names its latest publish, `outcome` is its confirm once harvested.
struct Entry {
    seq: u64,
    job: Job,
    since: Instant,
    outcome: Option<Outcome>,
}

/// A confirm with any returned message taken out (those go to [`Window::returned`]).
enum Outcome {
    Ack,
    Nack,
    Failed(lapin::Error),
}

type ConfirmFuture = Pin<Box<dyn Future<Output = (u64, lapin::Result<Confirmation>)> + Send>>;

/// What a returned message is matched on: its message id, routing key and body.
type Returned = (String, String, Vec<u8>);

/// The unconfirmed jobs in send order and their confirms.
///
/// lapin hands a `basic.return` to whichever publish's confirm it completes next, which under
/// a `multiple` ack can be another message's. So every confirm is harvested as soon as it
/// resolves, returned messages go to `returned`, and a job counts as returned only if one of
/// them is its own. That is complete when the front job is decided: RabbitMQ sends returns in
/// publish order, each before the ack covering its message, and lapin takes them first in
/// first out, so once every publish up to a job has its confirm, that job's return (if any)
/// rode on one of the confirms harvested so far.
#[derive(Default)]
struct Window {
    entries: VecDeque<Entry>,
    confirms: FuturesUnordered<ConfirmFuture>,
    returned: Vec<Returned>,
    next_seq: u64,
}

impl Window {
    /// Publish `job` at the back.
    fn publish(&mut self, link: &Link, exchange: &str, job: Job) {
        self.next_seq += 1;
        let seq = self.next_seq;
        self.confirms.push(publish(&link.chan, exchange, &job, seq));
        self.entries.push_back(Entry { seq, job, since: Instant::now(), outcome: None });
    }

    /// Forget the old link's confirms and publish every job again, in order.
    fn republish(&mut self, link: &Link, exchange: &str) {
        self.confirms = FuturesUnordered::new();
        self.returned.clear();
        for e in self.entries.iter_mut() {
            self.next_seq += 1;
            e.seq = self.next_seq;
            e.since = Instant::now();
            e.outcome = None;
            self.confirms.push(publish(&link.chan, exchange, &e.job, e.seq));
        }
    }

    /// Store one confirm on its entry, and every other one that is ready too.
    fn harvest(&mut self, first: (u64, lapin::Result<Confirmation>)) {
        self.record(first);
        while let Some(Some(next)) = self.confirms.next().now_or_never() {
            self.record(next);
        }
    }

    fn record(&mut self, (seq, result): (u64, lapin::Result<Confirmation>)) {
        let outcome = match result {
            Ok(Confirmation::Ack(ret)) => {
                self.keep_returned(ret);
                Outcome::Ack
            }
            Ok(Confirmation::Nack(ret)) => {
                self.keep_returned(ret);
                Outcome::Nack
            }
            Ok(Confirmation::NotRequested) => Outcome::Nack,
            Err(e) => Outcome::Failed(e),
        };
        if let Ok(i) = self.entries.binary_search_by_key(&seq, |e| e.seq) {
            self.entries[i].outcome = Some(outcome);
        }
    }

    fn keep_returned(&mut self, ret: Option<Box<lapin::message::BasicReturnMessage>>) {
        if let Some(r) = ret {
            let d = r.delivery;
            let id = d.properties.message_id().as_ref().map(|s| s.to_string()).unwrap_or_default();
            self.returned.push((id, d.routing_key.to_string(), d.data));
        }
    }

    /// Whether `job` came back as unroutable (and forget that return).
    fn take_returned(&mut self, job: &Job) -> bool {
        let id = job.properties.message_id().as_ref().map(|s| s.as_str()).unwrap_or_default();
        let pos = self.returned.iter().position(|(i, k, b)| i == id && *k == job.routing_key && b == job.body());
        pos.map(|p| self.returned.swap_remove(p)).is_some()
    }
}

/// What the front of the window came to.
enum Front {
    Confirmed((u64, lapin::Result<Confirmation>)),
    TimedOut,
}

pub(super) struct Publisher {
    uri: AMQPUri,
    url: String,
    exchange: String,
    link: Option<Link>,
    /// The body size limit, lowered when the broker names a smaller one; shared with the sink.
    limit: Arc<AtomicUsize>,
    /// The broker's reachability as `/readyz`, the metrics and the log show it.
    reach: SinkLink,
}

impl Publisher {
    /// Connect once: a refused login, an unknown virtual host or a missing exchange ends start-up
    /// with a set-up error; an unreachable broker is waited for by [`Publisher::run`].
    pub async fn start(cfg: &RabbitConfig, health: Arc<Health>, limit: Arc<AtomicUsize>) -> Result<Self, Definite> {
        let mut uri = cfg.uri()?;
        if uri.query.heartbeat.is_none() {
            uri.query.heartbeat = Some(HEARTBEAT);
        }
        let mut p = Publisher {
            uri,
            url: cfg.url_masked(),
            exchange: cfg.exchange.clone(),
            link: None,
            limit,
            reach: SinkLink::new("rabbitmq", "RabbitMQ", health),
        };
        match p.open().await {
            Ok(link) => {
                p.link = Some(link);
                p.set_up(true, "");
            }
            Err(e) if matches!(reply_code(&e), Some(ACCESS_REFUSED | NOT_FOUND | NOT_ALLOWED)) => {
                let fix = match reply_code(&e) {
                    Some(NOT_FOUND) => format!(
                        "declare exchange {:?} (durable) or give an existing one with --rabbitmq-exchange",
                        p.exchange
                    ),
                    Some(NOT_ALLOWED) => "check the virtual host in --rabbitmq-url (%2f is \"/\")".into(),
                    _ => "check the user and password in --rabbitmq-url (or OUTBOXD_RABBITMQ_URL)".into(),
                };
                return Err(Definite::Setup(format!("RabbitMQ at {} refused outboxd: {e}; {fix}", p.url)));
            }
            Err(e) => p.set_up(false, &describe(&e)),
        }
        Ok(p)
    }

    async fn open(&self) -> lapin::Result<Link> {
        let props = ConnectionProperties::default().with_connection_name("outboxd".into());
        let open = async {
            let conn = Connection::connect_uri(self.uri.clone(), props).await?;
            let chan = conn.create_channel().await?;
            if !self.exchange.is_empty() {
                let passive = ExchangeDeclareOptions { passive: true, ..Default::default() };
                chan.exchange_declare(&self.exchange, ExchangeKind::Direct, passive, FieldTable::default()).await?;
            }
            chan.confirm_select(ConfirmSelectOptions::default()).await?;
            Ok(Link { conn, chan })
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, open).await {
            Ok(r) => r,
            Err(_) => Err(ErrorKind::IOError(Arc::new(std::io::ErrorKind::TimedOut.into())).into()),
        }
    }

    /// Publish jobs in order and resolve them front to back (see the module doc).
    pub async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        let mut window = Window::default();
        let mut failures: u32 = 0;
        let mut open = true;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            if !open && window.entries.is_empty() {
                return;
            }
            let step = if self.link.is_none() {
                self.reconnect(&mut window).await
            } else {
                // The oldest unconfirmed publish bounds the wait for confirms.
                let deadline = window.entries.iter().find(|e| e.outcome.is_none()).map(|e| e.since + CONFIRM_TIMEOUT);
                tokio::select! {
                    biased;
                    front = next_confirm(&mut window.confirms, deadline), if deadline.is_some() => match front {
                        Front::Confirmed(c) => {
                            window.harvest(c);
                            self.settle(&mut window)
                        }
                        Front::TimedOut => Err(format!("no confirm within {CONFIRM_TIMEOUT:?}")),
                    },
                    job = rx.recv(), if open && window.entries.len() < WINDOW => match job {
                        Some(job) => self.publish_new(job, &mut window).await,
                        None => {
                            open = false;
                            Ok(false)
                        }
                    },
                    _ = tick.tick() => self.check_link(),
                }
            };
            match step {
                Ok(true) => failures = 0,
                Ok(false) => {}
                Err(reason) => {
                    if self.link.take().is_some() || !self.reach.is_down() {
                        tracing::warn!(url = %self.url, reason, unconfirmed = window.entries.len(),
                            "RabbitMQ did not confirm; reconnecting to publish the unconfirmed events again in order");
                    }
                    self.set_up(false, &reason);
                    tokio::time::sleep(crate::retry::backoff(failures, MAX_BACKOFF)).await;
                    failures = failures.saturating_add(1);
                }
            }
        }
    }

    /// Open a new link and publish the whole window on it again, in order; events over a
    /// size limit the broker named meanwhile are rejected instead.
    async fn reconnect(&mut self, window: &mut Window) -> Result<bool, String> {
        let link = self.open().await.map_err(|e| format!("connecting: {}", describe(&e)))?;
        let limit = self.limit.load(Ordering::Relaxed);
        for e in std::mem::take(&mut window.entries) {
            let size = e.job.body().len();
            if size > limit {
                e.job.reject("too_large", too_large(size, limit));
            } else {
                window.entries.push_back(e);
            }
        }
        window.republish(&link, &self.exchange);
        self.link = Some(link);
        self.set_up(true, "");
        Ok(false)
    }

    async fn publish_new(&mut self, job: Job, window: &mut Window) -> Result<bool, String> {
        let limit = self.limit.load(Ordering::Relaxed);
        let size = job.body().len();
        if size > limit {
            job.reject("too_large", too_large(size, limit));
            return Ok(true);
        }
        let Some(link) = &self.link else { return Err("no connection".into()) };
        window.publish(link, &self.exchange, job);
        Ok(false)
    }

    /// Resolve the decided jobs at the front; a failure leaves them for the retry.
    fn settle(&mut self, window: &mut Window) -> Result<bool, String> {
        let mut progress = false;
        while let Some(outcome) = window.entries.front_mut().and_then(|e| e.outcome.take()) {
            match outcome {
                Outcome::Ack => {}
                Outcome::Nack => {
                    let key = window.entries.front().map(|e| e.job.routing_key.clone()).unwrap_or_default();
                    return Err(format!("RabbitMQ nacked a publish to routing key {key:?} (a queue refused it)"));
                }
                Outcome::Failed(e) => {
                    if let Some(max) = size_limit(&e) {
                        self.limit.store(max, Ordering::Relaxed);
                    }
                    return Err(describe(&e));
                }
            }
            let Some(Entry { job, .. }) = window.entries.pop_front() else { break };
            if window.take_returned(&job) {
                let reason = format!(
                    "RabbitMQ returned the message as unroutable: nothing is bound to routing key {:?} at exchange {:?}",
                    job.routing_key, self.exchange
                );
                job.reject("unroutable", reason);
            } else {
                job.delivery.ack();
            }
            progress = true;
        }
        Ok(progress)
    }

    fn check_link(&mut self) -> Result<bool, String> {
        match &self.link {
            Some(l) if l.conn.status().connected() && l.chan.status().connected() => {
                self.set_up(true, "");
                Ok(false)
            }
            Some(l) => Err(format!("connection {:?}, channel {:?}", l.conn.status().state(), l.chan.status().state())),
            None => Ok(false),
        }
    }

    fn set_up(&mut self, up: bool, reason: &str) {
        self.reach.set(up, reason);
    }
}

/// The next confirm to resolve, or a timeout at `deadline`.
async fn next_confirm(confirms: &mut FuturesUnordered<ConfirmFuture>, deadline: Option<Instant>) -> Front {
    let Some(deadline) = deadline else { return std::future::pending().await };
    match tokio::time::timeout_at(deadline, confirms.next()).await {
        Ok(Some(c)) => Front::Confirmed(c),
        // No confirm future for an unconfirmed entry: the publish never happened; treat as lost.
        Ok(None) | Err(_) => Front::TimedOut,
    }
}

fn too_large(size: usize, limit: usize) -> String {
    format!("message body of {size} bytes exceeds RabbitMQ's max_message_size {limit}")
}

/// Start publishing `job`; the future ends with its confirm.
///
/// The first poll, made here, hands the frames to lapin's writer and takes the publish's
/// delivery tag, so calls in send order put messages on the wire in send order without waiting
/// for each write: the rest of the future is the write completing and then the confirm. A write
/// that never completes is caught by the confirm deadline.
fn publish(chan: &Channel, exchange: &str, job: &Job, seq: u64) -> ConfirmFuture {
    let opts = BasicPublishOptions { mandatory: true, immediate: false };
    let (chan, exchange, key) = (chan.clone(), exchange.to_owned(), job.routing_key.clone());
    let (body, properties) = (job.payload.clone().unwrap_or_default(), job.properties.clone());
    let mut write = Box::pin(async move { chan.basic_publish(&exchange, &key, opts, &body, properties).await });
    let written = (&mut write).now_or_never();
    Box::pin(async move {
        let confirm = match written {
            Some(w) => w,
            None => write.await,
        };
        match confirm {
            Ok(c) => (seq, c.await),
            Err(e) => (seq, Err(e)),
        }
    })
}

fn reply_code(e: &lapin::Error) -> Option<u16> {
    match e.kind() {
        ErrorKind::ProtocolError(a) => Some(a.get_id()),
        _ => None,
    }
}

/// The error's text: lapin's errors carry no URL, so no password.
fn describe(e: &lapin::Error) -> String {
    e.to_string()
}

/// The limit in RabbitMQ's refusal of an oversize message, if `e` is one.
fn size_limit(e: &lapin::Error) -> Option<usize> {
    let ErrorKind::ProtocolError(a) = e.kind() else { return None };
    (a.get_id() == PRECONDITION_FAILED).then_some(())?;
    parse_size_limit(a.get_message().as_str())
}

/// `"... message size 200 is larger than configured max size 100"` → 100.
fn parse_size_limit(text: &str) -> Option<usize> {
    let rest = &text[text.find("larger than configured max size")? + "larger than configured max size".len()..];
    rest.split(|c: char| !c.is_ascii_digit()).find(|s| !s.is_empty())?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_size_limit;

    #[test]
    fn the_brokers_size_limit_is_read_from_its_refusal() {
        let text = "PRECONDITION_FAILED - message size 2097152 is larger than configured max size 1048576";
        assert_eq!(parse_size_limit(text), Some(1_048_576));
        assert_eq!(parse_size_limit("PRECONDITION_FAILED - inequivalent arg 'durable'"), None);
        assert_eq!(parse_size_limit("larger than configured max size"), None);
    }
}
