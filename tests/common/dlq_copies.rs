//! Dead-letter copies for the `outboxd dlq` tests of the sinks other than Kafka
//! (`tests/dlq_sinks.rs`, `tests/dlq_sinks_rabbitmq_http.rs`): copies made by the pipeline's own
//! [`DeadLetter::into_records`] (a plain one, a chunked one, a chunked one missing a chunk), the
//! tool's runs and output, the Redis helpers both files use, and a JetStream stream of a test's
//! own ([`NatsStream`], `tests/dlq_copy_writable*.rs`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use outboxd::lsn::Lsn;
use outboxd::relay::{Position, Source};
use outboxd::router::Record;
use outboxd::tools::dlq::DeadLetter;

use async_nats::jetstream;

use super::{args, daemon_args_pg_only, run_to_exit, unique_name, wait_until_async, PgCluster};

pub const RUN_TIMEOUT: Duration = Duration::from_secs(90);
pub const NATS_URL: &str = "nats://127.0.0.1:4222";
pub const REDIS_URL: &str = "redis://127.0.0.1:6379/0";

/// A dead letter as the pipeline makes it.
pub fn dead_letter(id: &str, topic: &str, key: &str, payload: Vec<u8>) -> DeadLetter {
    DeadLetter {
        event_id: Some(id.to_owned()),
        code: "schema",
        message: format!("payload of {id} breaks the contract"),
        original_topic: Some(topic.to_owned()),
        key: Some(Bytes::from(key.to_owned())),
        payload: Some(Bytes::from(payload)),
        headers: vec![("trace".into(), Bytes::from(format!("t-{id}")))],
        source: Source { position: Position::Lsn(Lsn(0x16B_3748)), table: Arc::from("public.outbox") },
    }
}

/// Bytes that show a misplaced or missing chunk.
pub fn big_payload(n: usize) -> Vec<u8> {
    let mut p = b"{\"blob\":\"".to_vec();
    p.extend((0..n).map(|i| b'a' + (i % 26) as u8));
    p.extend(b"\"}");
    p
}

/// The synthesised copies: A plain, B chunked, C chunked with chunk 1 left out.
pub fn synthesised(prefix: &str, dlq: &str) -> (Vec<Record>, Vec<u8>) {
    let b_payload = big_payload(30_000);
    let mut records =
        dead_letter("ev-a", &format!("{prefix}.orders.a"), "ka", b"{\"a\":1}".to_vec()).into_records(dlq, 1 << 20);
    let b = dead_letter("ev-b", &format!("{prefix}.orders.b"), "kb", b_payload.clone()).into_records(dlq, 4000);
    assert!(b.len() > 5, "B must be chunked");
    records.extend(b);
    let mut c = dead_letter("ev-c", &format!("{prefix}.orders.c"), "kc", big_payload(20_000)).into_records(dlq, 4000);
    c.remove(1);
    records.extend(c);
    (records, b_payload)
}

pub fn summary(out: &str) -> String {
    out.lines()
        .rfind(|l| l.starts_with("replayed ") && l.contains("already done"))
        .unwrap_or_else(|| panic!("no summary line in:\n{out}"))
        .to_owned()
}

pub fn json_line(out: &str) -> serde_json::Value {
    out.lines()
        .filter(|l| l.starts_with('{'))
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line in:\n{out}"))
}

pub fn dlq_cmd(sink: &[&str], dlq: &str, sub: &str, extra: &[&str]) -> (Option<i32>, String) {
    let mut a = vec!["dlq", sub];
    a.extend_from_slice(sink);
    a.extend(["--dlq-topic", dlq, "--read-timeout", "20s"]);
    a.extend_from_slice(extra);
    run_to_exit(&args(&a), RUN_TIMEOUT)
}

/// `list --json` found A, B and the run's copy, and C as incomplete.
pub fn check_list(out: &str, run_id: &str, run_reason: &str) {
    let j = json_line(out);
    assert_eq!(j["total"], 3, "{out}");
    let mut ids: Vec<String> =
        j["records"].as_array().unwrap().iter().map(|r| r["event_id"].as_str().unwrap().to_owned()).collect();
    ids.sort();
    let mut want = vec!["ev-a".to_owned(), "ev-b".to_owned(), run_id.to_owned()];
    want.sort();
    assert_eq!(ids, want, "{out}");
    assert_eq!(j["by_reason"]["schema"], 2, "{out}");
    assert_eq!(j["by_reason"][run_reason], 1, "{out}");
    let b = j["records"].as_array().unwrap().iter().find(|r| r["event_id"] == "ev-b").unwrap();
    assert_eq!(b["payload_bytes"], 30_011, "{out}");
    assert!(b["chunks"].as_u64().unwrap() > 5, "{out}");
    let inc = j["incomplete"].as_array().unwrap();
    assert_eq!(inc.len(), 1, "{out}");
    assert_eq!(inc[0]["event_id"], "ev-c", "{out}");
}

pub fn redis() -> redis::Connection {
    redis::Client::open(REDIS_URL).and_then(|c| c.get_connection()).expect("Redis on 127.0.0.1:6379")
}

pub type Entry = (String, Vec<Vec<u8>>);

pub fn xrange(con: &mut redis::Connection, key: &str) -> Vec<Entry> {
    redis::cmd("XRANGE").arg(key).arg("-").arg("+").query(con).expect("XRANGE")
}

/// Deletes every key under the prefix when the test ends, pass or fail.
pub struct Cleanup(pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(mut con) = redis::Client::open(REDIS_URL).and_then(|c| c.get_connection()) {
            let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{}*", self.0)).query(&mut con).unwrap_or_default();
            for k in keys {
                let _: Result<i64, _> = redis::cmd("DEL").arg(k).query(&mut con);
            }
        }
    }
}

/// Replay in three runs on one state dir: the run's copy (`stray`) alone to `to`, then the rest
/// (A and B; C, incomplete, reported and never sent), then again (nothing left). Returns the
/// second run's output.
pub fn replay_in_three_runs(sink: &[&str], dlq: &str, st: &str, stray: &str, to: &str) -> String {
    let (code, out) = dlq_cmd(sink, dlq, "replay", &["--state-dir", st, "--event-id", stray, "--to-topic", to]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 1,"), "{out}");
    let (code, rest) = dlq_cmd(sink, dlq, "replay", &["--state-dir", st]);
    assert_eq!(code, Some(0), "{rest}");
    assert!(summary(&rest).starts_with("replayed 2, skipped 0 (no destination), already done 1"), "{rest}");
    assert!(rest.contains("ev-c") && rest.contains("missing 1"), "the incomplete set is reported:\n{rest}");
    let (code, out) = dlq_cmd(sink, dlq, "replay", &["--state-dir", st]);
    assert_eq!(code, Some(0), "{out}");
    assert!(summary(&out).starts_with("replayed 0, skipped 0 (no destination), already done 3"), "{out}");
    rest
}

/// A message read back from a JetStream stream.
pub struct NatsMsg {
    pub subject: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub payload: Vec<u8>,
}

impl NatsMsg {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }
}

/// A JetStream stream of a test's own, binding `<prefix>.>`, and `outboxd run` into it.
pub struct NatsStream {
    pub js: jetstream::Context,
    pub name: String,
    pub prefix: String,
    pub max_payload: usize,
}

impl NatsStream {
    /// A stream of its own binding `<prefix>.>`.
    pub async fn create() -> NatsStream {
        let client = async_nats::connect(NATS_URL).await.expect("NATS on 127.0.0.1:4222");
        let max_payload = client.server_info().max_payload;
        let js = jetstream::new(client);
        let name = unique_name("obxcopy").replace('-', "_");
        let prefix = name.replace('_', "-");
        let subjects = vec![format!("{prefix}.>")];
        js.create_stream(jetstream::stream::Config { name: name.clone(), subjects, ..Default::default() })
            .await
            .expect("create stream");
        NatsStream { js, name, prefix, max_payload }
    }

    pub async fn messages(&self) -> Vec<NatsMsg> {
        let mut s = self.js.get_stream(&self.name).await.expect("stream");
        let last = s.info().await.unwrap().state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            let Ok(m) = s.get_raw_message(seq).await else { continue };
            let headers = m
                .headers
                .iter()
                .flat_map(|(k, vs)| vs.iter().map(move |v| (k.to_string(), v.to_string().into_bytes())))
                .collect();
            out.push(NatsMsg { subject: m.subject.to_string(), headers, payload: m.payload.to_vec() });
        }
        out
    }

    pub async fn on(&self, subject: &str) -> Vec<NatsMsg> {
        self.messages().await.into_iter().filter(|m| m.subject == subject).collect()
    }

    pub async fn wait_on(&self, subject: &str, n: usize) -> bool {
        wait_until_async(Duration::from_secs(30), || async { self.on(subject).await.len() >= n }).await
    }

    pub fn run_args(&self, pg: &PgCluster) -> Vec<String> {
        let replacement = format!("{}.${{routedByValue}}", self.prefix);
        let dlq = format!("{}.dlq", self.prefix);
        daemon_args_pg_only(
            pg,
            &[
                "--sink",
                "nats",
                "--nats-url",
                NATS_URL,
                "--route-by-field",
                "aggregate_type",
                "--route-topic-replacement",
                &replacement,
                "--dlq-topic",
                &dlq,
            ],
        )
    }

    pub async fn delete(self) {
        let _ = self.js.delete_stream(&self.name).await;
    }
}
