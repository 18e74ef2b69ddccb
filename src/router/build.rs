//! The per-row half of the router: one [`Row`](super::Row) of a compiled [`Route`] into one
//! [`Record`], then its contract ([`super::contract`]).
//!
//! # Invariants
//! * The steps run in one order (id, route-by and topic, key and payload, timestamp, headers,
//!   trace context, placements, then tombstone or envelope), so a row with several bad values
//!   always fails on the same one.
//! * Every [`BadEvent`] carries what could be salvaged (id, key, payload, the topic once known);
//!   the salvage is built only when a row is bad, never on the way of a good one.
//! * JSON is parsed only when an option asks for it (`--table-expand-json-payload`, the headers
//!   column, envelope placements); otherwise values pass through as the bytes that came in.

use bytes::Bytes;

use super::contract::{self, Contracts, Verdict};
use super::converter::{self, Converter};
use super::render::{self, as_bytes, as_json, as_string, is_json, is_text};
use super::row::{Field, OutboxRow, Row};
use super::{
    check_topic, expand, pg_us_to_unix_ms, placed, timestamp, trace, BadEvent, Col, HeaderName, PlacementTarget,
    Record, Route, Text,
};

/// What the placements add to a record besides headers.
#[derive(Default)]
struct Placed<'r> {
    /// Envelope columns as outboxd's own JSON object.
    envelope: Option<serde_json::Map<String, serde_json::Value>>,
    /// Envelope columns under `--value-converter json`, as JsonConverter writes them.
    json_fields: Vec<(&'r String, Bytes)>,
    partition: Option<i32>,
}

/// One column of a row as text: `None` for NULL; a value the router cannot read is an error.
#[inline(always)]
fn column(cols: &Row, c: Col) -> Result<Option<&[u8]>, String> {
    match cols.get(c.idx) {
        Some(Field::Text(b)) => Ok(Some(b)),
        Some(Field::Null) => Ok(None),
        Some(Field::UnchangedToast) => Err(format!("column {} arrived as an unchanged TOAST value", c.idx)),
        Some(Field::Binary(_)) => Err(format!("column {} arrived in binary format", c.idx)),
        None => Err(format!("row has {} columns, expected at least {}", cols.len(), c.idx + 1)),
    }
}

/// [`column`] as shared bytes (a slice of the message), for the values a record keeps.
#[inline(always)]
fn shared(cols: &Row, c: Col) -> Result<Option<Bytes>, String> {
    match cols.share_text(c.idx) {
        Some(b) => Ok(Some(b)),
        // NULL, or a value the router cannot read: `column` says which.
        None => column(cols, c).map(|_| None),
    }
}

impl Route {
    /// Turn one inserted row into a record, contracts aside.
    // Inlined into `Route::route`, its one caller: as a call it moved the large result once more.
    #[allow(clippy::result_large_err)]
    #[inline(always)]
    pub(super) fn build(&self, row: OutboxRow<'_>) -> Result<Record, BadEvent> {
        let cols = row.tuple;
        // Salvage first, so every error can carry the event's id, key and payload.
        let event_id = || column(cols, self.id).ok().flatten().map(|b| String::from_utf8_lossy(b).into_owned());
        let key_raw = shared(cols, self.key).ok().flatten();
        let payload_raw = shared(cols, self.payload).ok().flatten();
        let key = key_raw.as_ref().map(|k| as_bytes(self.key.type_oid, k)).transpose();
        let payload = payload_raw.as_ref().map(|p| as_bytes(self.payload.type_oid, p)).transpose();
        // Salvage for a dead-letter copy is built only when a row is bad: the converted value when
        // it converts, else the raw text.
        let salvage = |raw: &Option<Bytes>, type_oid: u32| {
            raw.as_ref().map(|v| as_bytes(type_oid, v).unwrap_or_else(|_| v.clone()))
        };
        let bad = |code: &'static str, message: String, topic: Option<String>| BadEvent {
            event_id: event_id(),
            code,
            message,
            topic,
            key: salvage(&key_raw, self.key.type_oid),
            payload: salvage(&payload_raw, self.payload.type_oid),
            headers: Vec::new(),
            payload_dropped: None,
        };
        // The id header is the column's own bytes (a slice of the message, not a copy) when they
        // are UTF-8, as a text column's always are; else the lossy text the event id is.
        // The event id is that same slice, shared.
        let (id, id_header) = match shared(cols, self.id) {
            Ok(Some(raw)) => match Text::try_from(raw.clone()) {
                Ok(s) => (s, raw),
                Err(_) => {
                    let s = Text::from(String::from_utf8_lossy(&raw).into_owned());
                    let b = s.as_bytes().clone();
                    (s, b)
                }
            },
            Ok(None) => return Err(bad("null_id", "the event id column is NULL".into(), None)),
            Err(e) => return Err(bad("bad_value", e, None)),
        };
        let routed = match column(cols, self.route_by) {
            Ok(Some(v)) => v,
            Ok(None) => return Err(bad("null_route", "the route-by column is NULL".into(), None)),
            Err(e) => return Err(bad("bad_value", e, None)),
        };
        let topic = match self.topics.get(routed) {
            Some(topic) => topic,
            None => {
                let value = as_string(self.route_by.type_oid, routed).map_err(|e| bad("bad_value", e, None))?;
                let topic = self.topic.topic(&value);
                if let Err(e) = check_topic(&topic) {
                    return Err(bad("invalid_topic", e, Some(topic)));
                }
                let topic = Text::from(topic);
                self.topics.put(routed, &topic);
                topic
            }
        };
        let fail = |code: &'static str, message: String| bad(code, message, Some(topic.to_string()));
        let key = key.map_err(|e| fail("bad_value", e))?;
        let mut payload = payload.map_err(|e| fail("bad_value", e))?;
        if self.expand_json && is_text(self.payload.type_oid) {
            if let Some(p) = &payload {
                match serde_json::from_slice::<serde_json::Value>(p) {
                    Ok(v) => payload = Some(Bytes::from(v.to_string())),
                    Err(e) => tracing::warn!(event_id = %id, error = %e, "payload is not JSON; sending it as text"),
                }
            }
        }
        // Debezium's test is `payload.toString().trim().isEmpty()`: text that is empty or only
        // whitespace (Java's trim drops every char <= U+0020). A `bytea` value's toString is never
        // empty, so only a NULL one counts.
        let empty = match &payload {
            None => true,
            Some(_) if self.payload.type_oid == render::BYTEA => false,
            Some(p) => p.iter().all(|b| *b <= b' '),
        };
        let timestamp_ms = match self.timestamp {
            Some(c) => match column(cols, c).map_err(|e| fail("bad_value", e))? {
                Some(b) => timestamp::epoch_ms(c.type_oid, b).map_err(|e| fail("bad_value", e))?,
                None => Some(pg_us_to_unix_ms(row.commit_time_us)),
            },
            None => Some(pg_us_to_unix_ms(row.commit_time_us)),
        };
        // Before 1970 no Kafka client takes the instant (Java's producer refuses it, its consumers
        // misread it), AMQP's timestamp is unsigned and Debezium's task fails on it: one bad event
        // for every sink rather than a record each sink would carry differently.
        if let Some(ms) = timestamp_ms.filter(|ms| *ms < 0) {
            return Err(fail("invalid_timestamp", timestamp::before_epoch(ms)));
        }
        let mut headers = vec![(HeaderName::Borrowed("id"), id_header)];
        if let Some(c) = self.headers {
            if let Some(h) = column(cols, c).map_err(|e| fail("bad_value", e))? {
                expand_headers(h, &mut headers).map_err(|e| fail("invalid_json", e))?;
            }
        }
        if let Some(c) = self.trace {
            if let Some(v) = column(cols, c).map_err(|e| fail("bad_value", e))? {
                self.trace_context(v, &id, &mut headers);
            }
        }
        let placed = self.place(cols, &mut headers, &fail)?;
        let event_type = self.raw_event_type(cols);
        let partition = placed.partition;
        if self.tombstone && empty {
            // Headers and partition stay: consumers of a compacted topic still see which event
            // deleted the key.
            return Ok(Record {
                topic,
                key,
                payload: None,
                headers,
                partition,
                timestamp_ms,
                event_id: id,
                event_type,
            });
        }
        let payload = self.envelope(payload, placed);
        Ok(Record { topic, key, payload, headers, partition, timestamp_ms, event_id: id, event_type })
    }

    /// The placements of one row: header placements go on `headers`, the rest into [`Placed`].
    // Inlined: a step of `build`, called once per row; as a call it moved the large result around.
    #[allow(clippy::result_large_err)]
    #[inline(always)]
    fn place<'r>(
        &'r self,
        cols: &Row,
        headers: &mut Vec<super::Header>,
        fail: &impl Fn(&'static str, String) -> BadEvent,
    ) -> Result<Placed<'r>, BadEvent> {
        let mut placed = Placed::default();
        for (c, target) in &self.placements {
            let v = column(cols, *c).map_err(|e| fail("bad_value", e))?;
            match target {
                PlacementTarget::Header(alias) => {
                    if let Some(v) = v {
                        let b = if is_json(c.type_oid) {
                            cols.share(c.idx)
                        } else {
                            placed::header(&self.typed(*c, v).map_err(|e| fail("bad_value", e))?)
                        };
                        headers.extend(b.map(|b| (alias.clone().into(), b)));
                    }
                }
                PlacementTarget::Envelope(alias) if self.json_envelope => {
                    let j = match v {
                        Some(v) => placed::json(&self.typed(*c, v).map_err(|e| fail("bad_value", e))?),
                        None => Bytes::from_static(b"null"),
                    };
                    placed.json_fields.push((alias, j));
                }
                PlacementTarget::Envelope(alias) => {
                    let j = match v {
                        Some(v) => as_json(c.type_oid, v).map_err(|e| fail("bad_value", e))?,
                        None => serde_json::Value::Null,
                    };
                    placed.envelope.get_or_insert_with(serde_json::Map::new).insert(alias.clone(), j);
                }
                PlacementTarget::Partition => {
                    let Some(v) = v else { continue };
                    let p = std::str::from_utf8(v).ok().and_then(|s| s.parse::<i32>().ok()).filter(|p| *p >= 0);
                    placed.partition = Some(p.ok_or_else(|| {
                        fail(
                            "bad_value",
                            format!(
                                "partition column value {:?} is not a non-negative integer",
                                String::from_utf8_lossy(v)
                            ),
                        )
                    })?);
                }
            }
        }
        Ok(placed)
    }

    /// A placed column's value as Debezium's connector types it.
    fn typed(&self, c: Col, v: &[u8]) -> Result<placed::Typed, String> {
        let text = std::str::from_utf8(v).map_err(|_| format!("column {} is not UTF-8 text", c.idx))?;
        placed::typed(c.type_oid, c.typmod, text, self.mapping)
    }

    /// The record's value: the payload as it is, or wrapped in the envelope the placements
    /// configure (JsonConverter's struct under `--value-converter json`, else a JSON object).
    #[inline(always)]
    fn envelope(&self, payload: Option<Bytes>, placed: Placed<'_>) -> Option<Bytes> {
        if self.json_envelope {
            let p = match &payload {
                None => Bytes::from_static(b"null"),
                // A logical message's payload, which Debezium's decoder has typed already.
                Some(p) if self.conversion.decoded_payload => expand::value(p)
                    .map(Bytes::from)
                    .unwrap_or_else(|_| converter::jackson_string(&String::from_utf8_lossy(p))),
                Some(p) => converter::convert(Converter::Json, self.payload.type_oid, p.clone()),
            };
            let fields = &placed.json_fields;
            let mut out =
                Vec::with_capacity(p.len() + 16 + fields.iter().map(|(a, v)| a.len() + v.len() + 4).sum::<usize>());
            out.extend_from_slice(b"{\"payload\":");
            out.extend_from_slice(&p);
            for (alias, v) in fields {
                out.push(b',');
                out.extend_from_slice(&converter::jackson_string(alias));
                out.push(b':');
                out.extend_from_slice(v);
            }
            out.push(b'}');
            Some(Bytes::from(out))
        } else if let Some(mut env) = placed.envelope.or_else(|| self.envelope.then(serde_json::Map::new)) {
            let p = match &payload {
                None => serde_json::Value::Null,
                Some(p)
                    if is_json(self.payload.type_oid)
                        || (self.expand_json && serde_json::from_slice::<serde_json::Value>(p).is_ok()) =>
                {
                    serde_json::from_slice(p).unwrap_or(serde_json::Value::Null)
                }
                Some(p) => serde_json::Value::String(String::from_utf8_lossy(p).into_owned()),
            };
            env.insert("payload".into(), p);
            Some(Bytes::from(serde_json::Value::Object(env).to_string()))
        } else {
            payload
        }
    }

    /// The event type column's text as sent (a cheap `Bytes` clone, no conversion).
    #[inline(always)]
    fn raw_event_type(&self, cols: &Row) -> Option<Bytes> {
        cols.share_text(self.event_type?.idx)
    }

    /// The trace context column's value as `traceparent` and `tracestate` headers (they replace
    /// any of those names from the headers column). A value that is not trace context is left
    /// out: the event goes without it, and the first such value per table is logged.
    fn trace_context(&self, v: &[u8], event_id: &str, headers: &mut Vec<super::Header>) {
        match trace::parse(v) {
            Ok(ctx) => {
                headers.retain(|(k, _)| k != "traceparent" && k != "tracestate");
                headers.push(("traceparent".into(), Bytes::from(ctx.traceparent)));
                if let Some(s) = ctx.tracestate {
                    headers.push(("tracestate".into(), Bytes::from(s)));
                }
            }
            Err(e) => {
                if !self.trace_warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(table = %self.table, %event_id, "the trace context column of this event is not W3C trace context ({e}); events without valid trace context go without traceparent (logged once per table)");
                }
            }
        }
    }
}

/// Check a routed record's payload column (as the producer wrote it, before any envelope) against
/// the contract of its event type. A violation keeps the whole record for the dead-letter copy.
#[allow(clippy::result_large_err)]
pub(super) fn enforce(
    row: OutboxRow<'_>,
    type_col: Col,
    payload_col: Col,
    contracts: &Contracts,
    record: Record,
) -> Result<Record, BadEvent> {
    let text = |c: Col| match row.tuple.get(c.idx) {
        Some(Field::Text(_)) => row.tuple.share(c.idx),
        _ => None,
    };
    let event_type = text(type_col).and_then(|b| as_string(type_col.type_oid, &b).ok());
    // A tombstone (no value) has nothing to check; otherwise the column converted when the record
    // was built, so it converts again.
    let payload = match record.payload {
        None => None,
        Some(_) => text(payload_col).and_then(|b| as_bytes(payload_col.type_oid, &b).ok()),
    };
    let violation = match contracts.check(event_type.as_deref(), payload.as_deref()) {
        Verdict::Valid | Verdict::Unchecked => return Ok(record),
        Verdict::Violation(v) => v,
    };
    let mut headers = record.headers;
    headers.extend(violation.header());
    Err(BadEvent {
        event_id: Some(record.event_id.into()),
        code: contract::CODE,
        message: violation.message,
        topic: Some(record.topic.into()),
        key: record.key,
        payload: record.payload,
        headers,
        payload_dropped: None,
    })
}

/// Each top-level key of a JSON object becomes a header: strings as their text, others as JSON.
fn expand_headers(json: &[u8], out: &mut Vec<super::Header>) -> Result<(), String> {
    if json == b"{}" {
        return Ok(());
    }
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(json).map_err(|e| format!("the headers column is not a JSON object: {e}"))?;
    for (k, v) in map {
        let b = match v {
            serde_json::Value::String(s) => Bytes::from(s),
            other => Bytes::from(other.to_string()),
        };
        out.push((k.into(), b));
    }
    Ok(())
}
