//! `outboxd dlq replay --sink sqs|sns`: sending the events of dead-letter copies back, to an SQS
//! queue (`SendMessageBatch`) or an SNS topic (`PublishBatch`), as `--sink sqs|sns` would have
//! sent them ([`super::message::event_message`]). Reading and deleting the copies is
//! [`super::dlq`]'s.
//!
//! Order on a FIFO destination: a call holds one message of a group, and a group with an event not
//! replayed in this run (refused, failed, or its copy held back by the reader's side: no
//! destination, no payload, unreadable) gets none of its later events in this run, in any later
//! batch: [`SqsTarget`] keeps those groups for the whole run. Its earlier events still go, and a
//! keyless held copy holds nothing back ([`Held`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_sqs::Client;

use super::dlq::replayed;
use super::message::{event_message, group_of};
use super::publisher::Failure;
use super::{queue_facts, QueueFacts, DEFAULT_MAX_BYTES};
use crate::sink::aws::{class_of, sdk_config, AwsConfig, Class};
use crate::sink::dead_letter::entry::Entry;
use crate::sink::dead_letter::held::Held;

/// Messages in one send call (SQS's and SNS's limit).
const PAGE: usize = 10;
/// Tries of a batch whose messages keep being throttled before replay reports them failed.
const TRIES: u32 = 8;
/// Tries of asking a destination what it is (FIFO, its size limit) before a batch to it fails.
const FACTS_TRIES: u32 = 4;
/// Where replay sends: the clients, and what each destination (an SQS queue URL, or an SNS topic
/// ARN for `--sink sns`) said of itself: FIFO or not, and the largest message it takes.
pub struct SqsTarget {
    client: Client,
    sns: aws_sdk_sns::Client,
    dests: HashMap<String, Result<(bool, usize), String>>,
    /// FIFO (destination, group) pairs with an event not replayed in this run: their later
    /// events are not sent either, in any later batch of the run (the key's order).
    blocked: HashSet<(String, String)>,
}

/// Entries stored (id, new message id), and entries failed (id, code, message).
type Answered = (Vec<(String, String)>, Vec<(String, String, String)>);

/// Whether `dest` is an SNS topic ARN rather than a queue URL.
fn is_topic(dest: &str) -> bool {
    dest.starts_with("arn:") && dest.split(':').nth(2) == Some("sns")
}

impl SqsTarget {
    pub async fn connect(aws: &AwsConfig) -> SqsTarget {
        let sdk = sdk_config(aws).await;
        SqsTarget {
            client: Client::new(&sdk),
            sns: aws_sdk_sns::Client::new(&sdk),
            dests: HashMap::new(),
            blocked: HashSet::new(),
        }
    }

    /// What `dest` said of itself. An answer, or a refusal, is kept for the run; no answer (a
    /// transient failure) is tried again with a backoff, up to [`FACTS_TRIES`] times, and is not
    /// kept, so the next batch for `dest` asks again.
    async fn facts(&mut self, dest: &str) -> Result<(bool, usize), String> {
        if let Some(f) = self.dests.get(dest) {
            return f.clone();
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let f = if is_topic(dest) {
                match super::topic::topic_fifo(&self.sns, dest).await {
                    Ok(Some(fifo)) => Some(Ok((fifo, DEFAULT_MAX_BYTES))),
                    Ok(None) => None,
                    Err(why) => Some(Err(why)),
                }
            } else {
                match queue_facts(&self.client, "destination queue", dest).await {
                    Ok(Some(QueueFacts { fifo, max_bytes })) => Some(Ok((fifo, max_bytes))),
                    Ok(None) => None,
                    Err(r) => Some(Err(r.to_string())),
                }
            };
            match f {
                Some(f) => {
                    self.dests.insert(dest.to_owned(), f.clone());
                    return f;
                }
                None if tries >= FACTS_TRIES => {
                    let service = if is_topic(dest) { "SNS" } else { "SQS" };
                    return Err(format!(
                        "{dest}: no answer from {service} after {tries} tries; left for a later run (check --aws-endpoint-url / --aws-region and the network)"
                    ));
                }
                None => {
                    tracing::warn!(destination = dest, "no answer asking what the destination is; retrying");
                    tokio::time::sleep(crate::retry::backoff(tries, Duration::from_secs(5))).await;
                }
            }
        }
    }

    /// One `SendMessageBatch` (a queue) or `PublishBatch` (a topic) call with `msgs`, entry ids
    /// their numbers.
    async fn call(&self, dest: &str, msgs: &[(usize, &super::message::Message)]) -> Result<Answered, Failure> {
        let failed = |id: &str, code: &str, m: Option<&str>| {
            (id.to_owned(), code.to_owned(), crate::sink::aws::service_text(m.unwrap_or("")))
        };
        if is_topic(dest) {
            let entries = msgs
                .iter()
                .map(|(n, m)| super::topic::entry(*n, &m.body, &m.attributes, m.group.as_deref(), m.dedup.as_deref()))
                .collect();
            let call = self.sns.publish_batch().topic_arn(dest).set_publish_batch_request_entries(Some(entries));
            let out = call.send().await.map_err(|e| Failure::of("SNS PublishBatch", &e))?;
            Ok((
                out.successful()
                    .iter()
                    .filter_map(|s| Some((s.id()?.to_owned(), s.message_id().unwrap_or_default().to_owned())))
                    .collect(),
                out.failed().iter().map(|f| failed(f.id(), f.code(), f.message())).collect(),
            ))
        } else {
            let entries = msgs
                .iter()
                .map(|(n, m)| {
                    super::publisher::entry(*n, &m.body, &m.attributes, m.group.as_deref(), m.dedup.as_deref())
                })
                .collect();
            let call = self.client.send_message_batch().queue_url(dest).set_entries(Some(entries));
            let out = call.send().await.map_err(|e| Failure::of("SQS SendMessageBatch", &e))?;
            Ok((
                out.successful().iter().map(|s| (s.id().to_owned(), s.message_id().to_owned())).collect(),
                out.failed().iter().map(|f| failed(f.id(), f.code(), f.message())).collect(),
            ))
        }
    }
}

/// One event of a replay batch on its way.
struct Out {
    dest: String,
    msg: super::message::Message,
}

/// Sends `batch` (each event to its queue URL) and waits for every answer: per event,
/// `Ok(the new message id)` or `Err(why)`. `held` are the keys of copies this run holds without
/// replaying them (no destination, no payload, unreadable): on a FIFO destination their later
/// events are not sent. See the module doc for order on a FIFO queue.
pub async fn send_batch(t: &mut SqsTarget, batch: &[(Entry, String)], held: &Held) -> Vec<Result<String, String>> {
    let mut results: Vec<Option<Result<String, String>>> = vec![None; batch.len()];
    let mut outs: Vec<Option<Out>> = Vec::with_capacity(batch.len());
    // Each event's FIFO (destination, group); `None` on a standard destination (no order).
    let mut groups: Vec<Option<(String, String)>> = Vec::with_capacity(batch.len());
    for (i, (e, dest)) in batch.iter().enumerate() {
        let facts = t.facts(dest).await;
        let group = matches!(facts, Ok((true, _))).then(|| (dest.clone(), group_of(e.head.key.as_deref(), false)));
        let held_back = group.is_some() && held.blocks(e.head.key.as_deref(), batch.len(), i);
        groups.push(group);
        if held_back {
            results[i] = Some(Err(NOT_SENT.into()));
            outs.push(None);
            continue;
        }
        let built = match facts {
            Ok((fifo, max)) => event_message(&replayed(&e.head, dest), fifo, max)
                .map_err(|(code, why)| format!("SQS cannot take it ({code}): {why}")),
            Err(why) => Err(why),
        };
        // Not sent: on a FIFO destination its key's later events wait for a later run ([`pick`]).
        outs.push(built.map(|msg| Out { dest: dest.clone(), msg }).map_err(|why| results[i] = Some(Err(why))).ok());
    }
    // Per FIFO group, the first event of this batch not replayed.
    let mut failed_at: HashMap<(String, String), usize> = HashMap::new();
    let mut tries = 0u32;
    loop {
        let pending: Vec<usize> = (0..batch.len()).filter(|&i| results[i].is_none()).collect();
        if pending.is_empty() {
            break;
        }
        let call = pick(&pending, &outs, &groups, &t.blocked, &mut failed_at, &mut results);
        if call.is_empty() {
            continue;
        }
        let dest = outs[call[0]].as_ref().map(|o| o.dest.clone()).unwrap_or_default();
        let picked: Vec<(usize, &super::message::Message)> =
            call.iter().enumerate().filter_map(|(n, &i)| outs[i].as_ref().map(|o| (n, &o.msg))).collect();
        let mut retry = false;
        match t.call(&dest, &picked).await {
            Ok((successful, failed)) => {
                if !successful.is_empty() {
                    tries = 0;
                }
                for (id, message_id) in successful {
                    if let Some(&i) = id.parse::<usize>().ok().and_then(|n| call.get(n)) {
                        results[i] = Some(Ok(message_id));
                    }
                }
                for (id, code, message) in failed {
                    let Some(&i) = id.parse::<usize>().ok().and_then(|n| call.get(n)) else { continue };
                    match class_of(Some(&code), None, true) {
                        Class::Transient => retry = true,
                        _ => results[i] = Some(Err(format!("refused ({code}): {message}"))),
                    }
                }
                // Named neither way: sent again.
                retry |= call.iter().any(|&i| results[i].is_none());
            }
            Err(f) => {
                let why = match f.setup {
                    Some(why) => Some(why),
                    None if class_of(f.code.as_deref(), f.status, false) == Class::Setup => {
                        Some(format!("refused the call ({}): {}", f.code.unwrap_or_default(), f.text))
                    }
                    None => None,
                };
                match why {
                    Some(why) => call.iter().for_each(|&i| results[i] = Some(Err(why.clone()))),
                    None => {
                        tracing::warn!(error = %f.text, "a replay batch call failed; sending again after a backoff");
                        retry = true;
                    }
                }
            }
        }
        if retry {
            tries += 1;
            if tries >= TRIES {
                for r in results.iter_mut().filter(|r| r.is_none()) {
                    *r = Some(Err(format!("SQS still throttled or failing after {TRIES} tries")));
                }
                break;
            }
            tokio::time::sleep(crate::retry::backoff(tries, Duration::from_secs(5))).await;
        }
    }
    pick(&[], &outs, &groups, &t.blocked, &mut failed_at, &mut results);
    t.blocked.extend(failed_at.into_keys());
    results.into_iter().map(|r| r.unwrap_or_else(|| Err("not sent".into()))).collect()
}

/// Why an event of a FIFO group with an earlier event not replayed is not sent.
const NOT_SENT: &str = "an earlier event of its key was not replayed; left for a later run";

/// The events of the next call, in order: all to the first pending event's queue, at most
/// [`PAGE`], within the queue's size, one per FIFO group (`fifo`: each event's); an event of a
/// group `blocked` in an earlier batch, or after an event of its group not replayed in this one
/// (`failed_at`, filled here from `results`), is failed too, and a group skipped for room stays
/// skipped for this call (its order).
fn pick(
    pending: &[usize],
    outs: &[Option<Out>],
    fifo: &[Option<(String, String)>],
    blocked: &HashSet<(String, String)>,
    failed_at: &mut HashMap<(String, String), usize>,
    results: &mut [Option<Result<String, String>>],
) -> Vec<usize> {
    // An event not replayed fails its group's later events (only), for the rest of the run.
    for (i, r) in results.iter().enumerate() {
        if let (Some(Err(_)), Some(Some(g))) = (r, fifo.get(i)) {
            let at = failed_at.entry(g.clone()).or_insert(i);
            *at = (*at).min(i);
        }
    }
    let mut call = Vec::new();
    let mut groups: HashSet<String> = HashSet::new();
    let mut skipped: HashSet<String> = HashSet::new();
    let mut bytes = 0usize;
    let mut dest: Option<&str> = None;
    for &i in pending {
        let Some(o) = &outs[i] else { continue };
        if let Some(g) = &fifo[i] {
            if blocked.contains(g) || failed_at.get(g).is_some_and(|&f| f < i) {
                results[i] = Some(Err(NOT_SENT.into()));
                continue;
            }
        }
        if dest.is_some_and(|d| d != o.dest) {
            continue;
        }
        let room = call.len() < PAGE && (call.is_empty() || bytes + o.msg.size <= DEFAULT_MAX_BYTES);
        match &o.msg.group {
            Some(g) if skipped.contains(g) || groups.contains(g) || !room => {
                skipped.insert(g.clone());
            }
            _ if !room => {}
            g => {
                if let Some(g) = g {
                    groups.insert(g.clone());
                }
                dest = Some(&o.dest);
                bytes += o.msg.size;
                call.push(i);
            }
        }
    }
    call
}

#[cfg(test)]
mod tests {
    use super::super::message::Value;
    use super::*;

    fn out(dest: &str, group: Option<&str>, size: usize) -> Option<Out> {
        let msg = super::super::message::Message {
            group: group.map(Into::into),
            dedup: None,
            body: String::new(),
            attributes: vec![("a".into(), Value::Text("b".into()))],
            size,
        };
        Some(Out { dest: dest.into(), msg })
    }

    /// A target whose every destination is known without asking (nothing listens at its
    /// endpoint, so an event that were sent would fail as "no answer", not as held back).
    fn target(dests: &[(&str, bool, usize)]) -> SqsTarget {
        let sqs = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        let sns = aws_sdk_sns::Config::builder()
            .behavior_version(aws_sdk_sns::config::BehaviorVersion::latest())
            .region(aws_sdk_sns::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        SqsTarget {
            client: Client::from_conf(sqs),
            sns: aws_sdk_sns::Client::from_conf(sns),
            dests: dests.iter().map(|(d, fifo, max)| (d.to_string(), Ok((*fifo, *max)))).collect(),
            blocked: HashSet::new(),
        }
    }

    fn entry(key: &str, id: &str, payload: usize) -> (Entry, String) {
        (Entry::for_test(key, id, payload), "q".into())
    }

    /// Replay calls [`send_batch`] per 10 copies: a key whose event was not replayed in one call
    /// is held back in every later call of the run, and so is a key with a copy held unreplayed.
    #[tokio::test]
    async fn a_key_not_replayed_in_one_batch_is_held_back_in_the_later_batches() {
        let mut t = target(&[("q", true, 300)]);
        let none = Held::default();
        let first = send_batch(&mut t, &[entry("k", "e1", 400)], &none).await;
        assert!(matches!(&first[0], Err(w) if w.contains("cannot take it")), "{first:?}");
        let later = send_batch(&mut t, &[entry("k", "e2", 10)], &none).await;
        assert!(matches!(&later[0], Err(w) if w.contains("earlier event")), "{later:?}");
        let mut held = Held::default();
        held.hold(Some(b"h"));
        held.pushed();
        let behind = send_batch(&mut t, &[entry("h", "e3", 10)], &held).await;
        assert!(matches!(&behind[0], Err(w) if w.contains("earlier event")), "{behind:?}");
    }

    /// A copy of a key held back after an event of the key went into the unsent batch keeps only
    /// the key's later events back; a keyless held copy keeps nothing back.
    #[tokio::test]
    async fn a_held_copy_blocks_only_its_keys_later_events() {
        let mut t = target(&[("q", true, 300)]);
        let mut held = Held::default();
        held.pushed();
        held.hold(Some(b"h"));
        held.hold(None);
        held.pushed();
        held.pushed();
        let mut keyless = entry("", "e3", 400);
        keyless.0.head.key = None;
        let r = send_batch(&mut t, &[entry("h", "e1", 400), entry("h", "e2", 10), keyless], &held).await;
        // Events that go fail at once (too large), so the test needs no server.
        assert!(matches!(&r[0], Err(w) if w.contains("cannot take it")), "the earlier event was held back: {r:?}");
        assert!(matches!(&r[1], Err(w) if w.contains("earlier event")), "{r:?}");
        assert!(matches!(&r[2], Err(w) if w.contains("cannot take it")), "the keyless event was held back: {r:?}");
    }

    /// No answer from the destination is not kept: the next batch asks again.
    #[tokio::test]
    async fn no_answer_about_a_destination_is_asked_again_not_kept() {
        let mut t = target(&[]);
        for dest in ["http://127.0.0.1:9/1/q", "arn:aws:sns:us-east-1:1:t"] {
            let first = t.facts(dest).await;
            assert!(matches!(&first, Err(w) if w.contains("no answer")), "{first:?}");
            assert!(!t.dests.contains_key(dest), "a transient failure was kept for the run");
        }
    }

    #[test]
    fn a_call_holds_one_message_of_a_group_and_a_failed_group_stays_behind() {
        let outs = vec![out("q", Some("a"), 10), out("q", Some("a"), 10), out("q", Some("b"), 10), out("r", None, 10)];
        let mut results = vec![None; 4];
        let fifo: Vec<_> =
            outs.iter().map(|o| o.as_ref().and_then(|o| o.msg.group.clone().map(|g| (o.dest.clone(), g)))).collect();
        let (blocked, mut failed) = (HashSet::new(), HashMap::new());
        assert_eq!(pick(&[0, 1, 2, 3], &outs, &fifo, &blocked, &mut failed, &mut results), vec![0, 2]);
        results[0] = Some(Err("refused".into()));
        assert_eq!(pick(&[1, 2, 3], &outs, &fifo, &blocked, &mut failed, &mut results), vec![2]);
        assert!(matches!(&results[1], Some(Err(w)) if w.contains("earlier event")), "{results:?}");
        assert_eq!(pick(&[3], &outs, &fifo, &blocked, &mut failed, &mut results), vec![3]);
    }
}
