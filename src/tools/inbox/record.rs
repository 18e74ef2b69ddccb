//! One Kafka record as the inbox stores it: [`Received`] (what the consumer thread copies out of
//! librdkafka) into [`Row`] (the inbox table's columns). Pure: no I/O, so every case is a unit test.
//!
//! The event id is a chain ([`Naming::event_id_headers`]): the `id` header (the EventRouter's and
//! outboxd's), else the header `--event-id-header` names (when it is another), else
//! `TOPIC/PARTITION/OFFSET`, which names the record itself: a redelivery of the same record is
//! then deduplicated, a second copy the producer wrote is not (it is another record). The first
//! header of the chain that the record carries decides: one that is there but unusable (empty,
//! not UTF-8) is a bad record, never replaced by a later link, since the same event sent again
//! would then get another id.

use serde_json::{Map, Value};

/// A record as the consumer thread hands it over: owned copies, no librdkafka borrow.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// Headers in the record's order (a repeated name: the last one wins in `headers`).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Milliseconds since the epoch (create or log-append time).
    pub timestamp_ms: Option<i64>,
}

/// One row of the inbox table (sql/08_inbox.sql), as the writer binds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub event_id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub aggregate_key: Option<String>,
    pub key: Option<Vec<u8>>,
    pub event_type: Option<String>,
    pub payload: Option<Vec<u8>>,
    /// The payload as JSON text when jsonb takes it (see [`jsonb_text`]).
    pub payload_json: Option<String>,
    /// Every header as a JSON object, text.
    pub headers: String,
    /// The headers as they came, for a dead-letter copy if the table refuses the row.
    pub raw_headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp_ms: Option<i64>,
}

impl Row {
    /// The record again, for its dead-letter copy.
    pub fn received(&self) -> Received {
        Received {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            key: self.key.clone(),
            payload: self.payload.clone(),
            headers: self.raw_headers.clone(),
            timestamp_ms: self.timestamp_ms,
        }
    }
}

/// Which headers name the event and its type.
#[derive(Debug, Clone)]
pub struct Naming {
    /// The event id's headers, in the order they are tried: `id`, then `--event-id-header`'s
    /// when it names another ([`Naming::event_id_headers`]).
    pub event_id_headers: Vec<String>,
    pub event_type_header: String,
}

/// The header every outbox event router sends the event id in; always the chain's first link.
pub const ID_HEADER: &str = "id";

impl Naming {
    /// The chain for `--event-id-header NAME`: `id`, then NAME unless it is `id` too.
    pub fn event_id_headers(named: &str) -> Vec<String> {
        let mut chain = vec![ID_HEADER.to_owned()];
        if named != ID_HEADER {
            chain.push(named.to_owned());
        }
        chain
    }
}

/// Why a record cannot be a row; the reason is a dead letter's `outboxd.error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad {
    pub reason: &'static str,
    pub message: String,
}

impl Received {
    /// `topic/partition/offset`: the record's own name.
    pub fn position(&self) -> String {
        format!("{}/{}/{}", self.topic, self.partition, self.offset)
    }

    fn header(&self, name: &str) -> Option<&Option<Vec<u8>>> {
        self.headers.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// The row for `r`, or why there is none (with the record, for its dead-letter copy; boxed, as
/// it is rare and the row is what the hot path returns).
pub fn to_row(r: Received, naming: &Naming) -> Result<Row, Box<(Bad, Received)>> {
    let found = naming.event_id_headers.iter().find_map(|name| r.header(name).map(|v| (name, v)));
    let event_id = match found {
        None => r.position(),
        Some((_, Some(v))) if !v.is_empty() => match std::str::from_utf8(v) {
            Ok(s) if !s.contains('\0') => s.to_owned(),
            _ => return Err(Box::new((bad_id(&r, found.map(|f| f.0), "is not UTF-8 text"), r))),
        },
        Some((name, _)) => return Err(Box::new((bad_id(&r, Some(name), "is empty"), r))),
    };
    let event_type = r.header(&naming.event_type_header).and_then(|v| v.as_deref()).map(text).filter(|s| !s.is_empty());
    let mut headers = Map::new();
    for (name, value) in &r.headers {
        headers
            .insert(name.replace('\0', "\u{fffd}"), value.as_deref().map_or(Value::Null, |v| Value::String(text(v))));
    }
    Ok(Row {
        event_id,
        aggregate_key: r.key.as_deref().map(text),
        event_type,
        payload_json: r.payload.as_deref().and_then(jsonb_text),
        headers: Value::Object(headers).to_string(),
        raw_headers: r.headers,
        topic: r.topic,
        partition: r.partition,
        offset: r.offset,
        key: r.key,
        payload: r.payload,
        timestamp_ms: r.timestamp_ms,
    })
}

fn bad_id(r: &Received, header: Option<&String>, what: &str) -> Bad {
    Bad {
        reason: "inbox_bad_event_id",
        message: format!(
            "record {} has a {:?} header that {what}; the producer must send the event id as text",
            r.position(),
            header.map_or("", String::as_str)
        ),
    }
}

/// Text for a text column: PostgreSQL refuses NUL and invalid UTF-8, so both are replaced (the
/// bytes are kept in the bytea columns where it matters: key, payload).
fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).replace('\0', "\u{fffd}")
}

/// The payload as JSON text for the `jsonb` column, when it is one JSON document that jsonb
/// accepts: jsonb refuses `\u0000` in strings, which JSON allows, so such a payload keeps only
/// its bytes rather than failing the batch.
pub fn jsonb_text(payload: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(payload).ok()?;
    let v: Value = serde_json::from_str(s).ok()?;
    let compact = v.to_string();
    (!compact.contains("\\u0000")).then_some(compact)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naming() -> Naming {
        Naming { event_id_headers: Naming::event_id_headers("id"), event_type_header: "eventType".into() }
    }

    fn named(header: &str) -> Naming {
        Naming { event_id_headers: Naming::event_id_headers(header), ..naming() }
    }

    #[test]
    fn the_chain_is_id_then_the_named_header_then_the_position() {
        assert_eq!(Naming::event_id_headers("id"), vec!["id".to_owned()]);
        assert_eq!(Naming::event_id_headers("eventId"), vec!["id".to_owned(), "eventId".to_owned()]);
        let n = named("eventId");
        let both = rec(vec![("eventId", Some(b"named")), ("id", Some(b"router"))], None);
        assert_eq!(to_row(both, &n).unwrap().event_id, "router", "`id` comes first, wherever it is");
        let named_only = rec(vec![("eventId", Some(b"named")), ("other", Some(b"x"))], None);
        assert_eq!(to_row(named_only.clone(), &n).unwrap().event_id, "named");
        assert_eq!(to_row(named_only, &naming()).unwrap().event_id, "orders.events/2/41", "no flag: id, then position");
        assert_eq!(to_row(rec(vec![("other", Some(b"x"))], None), &n).unwrap().event_id, "orders.events/2/41");
    }

    #[test]
    fn the_first_header_present_decides_even_when_unusable() {
        let n = named("eventId");
        let (e, _) = *to_row(rec(vec![("id", Some(b"")), ("eventId", Some(b"named"))], None), &n).unwrap_err();
        assert_eq!(e.reason, "inbox_bad_event_id");
        assert!(e.message.contains("\"id\" header that is empty"), "{}", e.message);
        let (e, _) = *to_row(rec(vec![("eventId", Some(b"\xff"))], None), &n).unwrap_err();
        assert!(e.message.contains("\"eventId\" header that is not UTF-8"), "{}", e.message);
    }

    fn rec(headers: Vec<(&str, Option<&[u8]>)>, payload: Option<&[u8]>) -> Received {
        Received {
            topic: "orders.events".into(),
            partition: 2,
            offset: 41,
            key: Some(b"o-1".to_vec()),
            payload: payload.map(<[u8]>::to_vec),
            headers: headers.into_iter().map(|(n, v)| (n.to_owned(), v.map(<[u8]>::to_vec))).collect(),
            timestamp_ms: Some(1),
        }
    }

    #[test]
    fn the_id_header_names_the_event_else_the_position() {
        let r = to_row(rec(vec![("id", Some(b"e-1")), ("eventType", Some(b"paid"))], Some(b"{}")), &naming()).unwrap();
        assert_eq!((r.event_id.as_str(), r.event_type.as_deref()), ("e-1", Some("paid")));
        let r = to_row(rec(vec![], Some(b"{}")), &naming()).unwrap();
        assert_eq!(r.event_id, "orders.events/2/41");
        assert_eq!(r.event_type, None);
    }

    #[test]
    fn an_unusable_id_header_is_a_bad_record_not_a_fallback() {
        for v in [None, Some(&b""[..]), Some(&b"\xff\xfe"[..]), Some(&b"a\0b"[..])] {
            let (e, back) = *to_row(rec(vec![("id", v)], None), &naming()).unwrap_err();
            assert_eq!(back.offset, 41);
            assert_eq!(e.reason, "inbox_bad_event_id", "{v:?}");
            assert!(e.message.contains("orders.events/2/41"), "{}", e.message);
        }
    }

    #[test]
    fn payload_json_only_when_jsonb_takes_it() {
        assert_eq!(jsonb_text(br#"{ "a" : [1, 2] }"#).as_deref(), Some(r#"{"a":[1,2]}"#));
        assert_eq!(jsonb_text(b"not json"), None);
        assert_eq!(jsonb_text(br#"{"a":"x\u0000y"}"#), None);
        assert_eq!(jsonb_text(b"\xff"), None);
        assert_eq!(jsonb_text(b"{} {}"), None);
    }

    #[test]
    fn headers_become_an_object_of_text() {
        let r = to_row(rec(vec![("id", Some(b"e")), ("bin", Some(b"\xff")), ("none", None)], None), &naming()).unwrap();
        let h: Value = serde_json::from_str(&r.headers).unwrap();
        assert_eq!(h["id"], "e");
        assert_eq!(h["bin"], "\u{fffd}");
        assert_eq!(h["none"], Value::Null);
        assert_eq!(r.payload_json, None);
        assert_eq!(r.aggregate_key.as_deref(), Some("o-1"));
    }
}
