//! `outboxd dlq` against `--sink redis`: reading the dead-letter copies the Redis sink XADDed to
//! the `--dlq-topic` stream key, and XADDing them back to their streams.
//!
//! Reading is `XRANGE` in pages of [`PAGE`] entries, from the first entry up to the last entry id
//! the stream had when reading began (`XREVRANGE + - COUNT 1`, asked once at open); nothing is
//! consumed, trimmed or acknowledged. A failed request is retried until `--read-timeout` passes
//! without an answer; reading then fails rather than returning a shortened DLQ.
//!
//! Entry fields are those the sink writes ([`crate::sink::redis::xadd`]): `key` first when the
//! record had a key, then `payload` when it had one, then the headers in order. (So a record with
//! neither key nor payload whose first header is named `key` or `payload` reads back wrongly; the
//! router's first header is `id`, so outboxd never writes one.)
//!
//! Replay progress ([`crate::tools::dlq`]) keeps a record's position as partition 0 and an offset made
//! from the entry id `MS-SEQ`: `MS << 20 | SEQ`, which keeps the stream's order. Ids out of that
//! range (`SEQ` of 2^20 or more, or `MS` past the year 2248; only explicit ids can be such) are
//! reported and never replayed. `list` and `replay` show the entry id itself.
//!
//! Replay XADDs each event with the sink's own command (same field layout, entry id `*`) and counts
//! it replayed only on the XADD's reply.

use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};

use super::config::RedisConfig;
use super::{describe, xadd};
use crate::error::{Definite, Error};
use crate::router::Record;
use crate::sink::dead_letter::entry::Entry;
use crate::sink::dead_letter::{DlqRecord, PREFIX};

/// An entry as read: its id and its fields, name and value alternating.
type RawEntry = (String, Vec<Vec<u8>>);

/// Entries per XRANGE.
const PAGE: usize = 256;
const SEQ_BITS: u32 = 20;
const MAX_MS: u64 = 1 << (63 - SEQ_BITS);

/// Connects for the tool, with timeouts so a silent server is an error, not a hang.
pub async fn connect(cfg: &RedisConfig) -> Result<MultiplexedConnection, Definite> {
    cfg.check()?;
    let client = Client::open(cfg.url.as_str())
        .map_err(|e| Definite::Config(format!("--redis-url {}: {:?}", cfg.url_masked(), e.kind())))?;
    let c = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(30)));
    client.get_multiplexed_async_connection_with_config(&c).await.map_err(|e| {
        Definite::Setup(format!("cannot connect to --redis-url {}: {}; check the URL", cfg.url_masked(), describe(&e)))
    })
}

/// `MS-SEQ` as numbers.
fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The state offset of an entry id; see the module doc.
fn offset_of(id: &str) -> Option<i64> {
    let (ms, seq) = parse_id(id)?;
    (ms < MAX_MS && seq < (1 << SEQ_BITS)).then_some(((ms << SEQ_BITS) | seq) as i64)
}

/// Reads the DLQ stream; see the module doc.
pub struct RedisReader {
    conn: MultiplexedConnection,
    key: String,
    /// Last entry id when reading began.
    last: String,
    /// Where the next page starts (`-`, then `(ID` after the last read).
    from: String,
    page: std::vec::IntoIter<DlqRecord>,
    done: bool,
    timeout: Duration,
}

impl RedisReader {
    /// `None` when the key does not exist or the stream is empty.
    pub async fn open(
        mut conn: MultiplexedConnection,
        key: &str,
        timeout: Duration,
    ) -> Result<Option<RedisReader>, Definite> {
        let reply: Value = redis::cmd("XREVRANGE")
            .arg(key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut conn)
            .await
            .map_err(|e| {
                Definite::Setup(format!("cannot read the last entry of Redis stream {key:?}: {}", describe(&e)))
            })?;
        let entries = entries(reply).map_err(|why| Definite::Setup(format!("Redis stream {key:?}: {why}")))?;
        let Some((last, _)) = entries.into_iter().next() else { return Ok(None) };
        Ok(Some(RedisReader {
            conn,
            key: key.to_owned(),
            last,
            from: "-".into(),
            page: Vec::new().into_iter(),
            done: false,
            timeout,
        }))
    }

    /// The next entry, `None` past the last id seen at open.
    pub async fn next(&mut self) -> Result<Option<DlqRecord>, Error> {
        loop {
            if let Some(r) = self.page.next() {
                return Ok(Some(r));
            }
            if self.done {
                return Ok(None);
            }
            let page = self.fetch().await?;
            if page.len() < PAGE || page.last().is_some_and(|(id, _)| *id == self.last) {
                self.done = true;
            }
            if let Some((id, _)) = page.last() {
                self.from = format!("({id}");
            }
            let mut records = Vec::with_capacity(page.len());
            for (id, fields) in page {
                records.push(
                    record(&id, fields)
                        .map_err(|why| Definite::Setup(format!("Redis stream {:?} entry {id}: {why}", self.key)))?,
                );
            }
            self.page = records.into_iter();
        }
    }

    async fn fetch(&mut self) -> Result<Vec<RawEntry>, Definite> {
        let started = Instant::now();
        loop {
            let mut cmd = redis::cmd("XRANGE");
            cmd.arg(&self.key).arg(&self.from).arg(&self.last).arg("COUNT").arg(PAGE);
            let why = match cmd.query_async::<Value>(&mut self.conn).await {
                Ok(v) => match entries(v) {
                    Ok(e) => return Ok(e),
                    // An answer we cannot read will not read better next time.
                    Err(why) => return Err(Definite::Setup(format!("Redis stream {:?}: {why}", self.key))),
                },
                Err(e) => describe(&e),
            };
            if started.elapsed() >= self.timeout {
                return Err(Definite::Setup(format!(
                    "reading Redis stream {:?} stalled after {} for --read-timeout {:?}: {why}; check the server, or raise --read-timeout",
                    self.key, self.from, self.timeout
                )));
            }
            tracing::warn!(error = %why, "reading Redis stream {}; retrying", self.key);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn bytes_of(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        _ => None,
    }
}

/// An XRANGE/XREVRANGE reply as `(id, [field, value, ...])`, checked, never panicking.
fn entries(v: Value) -> Result<Vec<RawEntry>, String> {
    let list = match v {
        Value::Array(a) => a,
        Value::Nil => return Ok(Vec::new()),
        Value::ServerError(e) => return Err(format!("{} {}", e.code(), e.details().unwrap_or_default())),
        other => return Err(format!("unexpected reply {other:?}")),
    };
    let mut out = Vec::with_capacity(list.len());
    for entry in list {
        let Value::Array(parts) = entry else { return Err("an entry is not an array".into()) };
        let mut parts = parts.into_iter();
        let id = parts.next().and_then(bytes_of).and_then(|b| String::from_utf8(b).ok());
        let Some(id) = id else { return Err("an entry has no id".into()) };
        let fields = match parts.next() {
            Some(Value::Array(f)) => f.into_iter().map(bytes_of).collect::<Option<Vec<_>>>(),
            Some(Value::Map(m)) => {
                m.into_iter().flat_map(|(k, v)| [bytes_of(k), bytes_of(v)]).collect::<Option<Vec<_>>>()
            }
            Some(Value::Nil) | None => Some(Vec::new()),
            _ => None,
        };
        let Some(fields) = fields.filter(|f| f.len() % 2 == 0) else {
            return Err(format!("entry {id} has unreadable fields"));
        };
        out.push((id, fields));
    }
    Ok(out)
}

/// The entry as a DLQ record (fields as the sink writes them; see the module doc).
fn record(id: &str, fields: Vec<Vec<u8>>) -> Result<DlqRecord, String> {
    let offset = offset_of(id).ok_or_else(|| "the entry id is out of the range replay can track".to_owned())?;
    let mut pairs = fields.chunks_exact(2).map(|p| (p[0].clone(), p[1].clone())).peekable();
    let key = pairs.next_if(|(f, _)| f == b"key").map(|(_, v)| v);
    let payload = pairs.next_if(|(f, _)| f == b"payload").map(|(_, v)| v);
    let headers = pairs.map(|(f, v)| (String::from_utf8_lossy(&f).into_owned(), Some(v))).collect();
    Ok(DlqRecord {
        partition: 0,
        offset,
        key,
        payload_len: payload.as_ref().map(Vec::len),
        payload,
        headers,
        timestamp_ms: None,
        time_ms: None,
        label: Some(id.to_owned()),
        undecoded: Vec::new(),
        moved_later: false,
    })
}

/// The record replay XADDs for `r` to `dest`.
fn replayed(r: &DlqRecord, dest: &str) -> Record {
    Record {
        topic: dest.into(),
        key: r.key.clone().map(Bytes::from),
        payload: r.payload.clone().map(Bytes::from),
        headers: r
            .headers
            .iter()
            .filter(|(k, _)| !k.starts_with(PREFIX))
            .map(|(k, v)| (k.clone().into(), Bytes::from(v.clone().unwrap_or_default())))
            .collect(),
        partition: None,
        timestamp_ms: None,
        event_id: r.event_id().unwrap_or_default().into(),
        event_type: None,
    }
}

/// XADDs `batch` in one pipeline: per event, `Ok(new entry id)` or `Err(why)`.
pub async fn send_batch(conn: &mut MultiplexedConnection, batch: &[(Entry, String)]) -> Vec<Result<String, String>> {
    let mut pipe = redis::pipe();
    for (e, dest) in batch {
        pipe.add_command(xadd(&replayed(&e.head, dest), None));
    }
    let replies = match conn.send_packed_commands(&pipe, 0, batch.len()).await {
        Ok(r) if r.len() == batch.len() => r,
        Ok(r) => return vec![Err(format!("{} replies for {} XADDs", r.len(), batch.len())); batch.len()],
        Err(e) => return vec![Err(describe(&e)); batch.len()],
    };
    replies
        .into_iter()
        .map(|v| match v {
            Value::ServerError(e) => Err(format!("XADD refused: {} {}", e.code(), e.details().unwrap_or_default())),
            v => bytes_of(v)
                .map(|id| String::from_utf8_lossy(&id).into_owned())
                .ok_or_else(|| "unexpected XADD reply".into()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_keep_the_stream_order_and_refuse_what_they_cannot_hold() {
        let a = offset_of("1733300000000-0").unwrap();
        let b = offset_of("1733300000000-511").unwrap();
        let c = offset_of("1733300000001-0").unwrap();
        assert!(a < b && b < c);
        assert_eq!(offset_of("0-1"), Some(1));
        assert_eq!(offset_of("1-1048576"), None);
        assert_eq!(offset_of(&format!("{MAX_MS}-0")), None);
        assert_eq!(offset_of("x-1"), None);
    }

    #[test]
    fn fields_read_back_as_the_sink_wrote_them() {
        let f = |v: &[&[u8]]| v.iter().map(|x| x.to_vec()).collect::<Vec<_>>();
        let r =
            record("5-0", f(&[b"key", b"k", b"payload", b"{}", b"id", b"e-1", b"outboxd.error", b"schema"])).unwrap();
        assert_eq!((r.key.as_deref(), r.payload.as_deref()), (Some(&b"k"[..]), Some(&b"{}"[..])));
        assert_eq!(r.event_id().as_deref(), Some("e-1"));
        assert_eq!(r.position(), "5-0");
        let back = replayed(&r, "orders");
        assert_eq!(back.headers.len(), 1, "outboxd.* stripped");
        // A tombstone without a key.
        let r = record("5-1", f(&[b"id", b"e-2"])).unwrap();
        assert_eq!((r.key.as_deref(), r.payload.as_deref()), (None, None));
        assert_eq!(r.headers.len(), 1);
        assert!(entries(Value::Array(vec![Value::Int(1)])).is_err());
        assert!(entries(Value::Array(vec![Value::Array(vec![Value::BulkString(b"1-0".to_vec())])])).unwrap()[0]
            .1
            .is_empty());
    }
}
