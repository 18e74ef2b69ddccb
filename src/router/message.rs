//! Logical messages as events: the JSON object a producer passes to
//! `pg_logical_emit_message(true, PREFIX, content)` (`--messages-prefix`) becomes the record an
//! outbox row with the same values would become.
//!
//! There is no second router. The fields the routing flags name (`--table-field-event-id`, `-key`,
//! `-type`, `-payload`, `-timestamp`, `-headers`, `--route-by-field`, the placements) are laid out
//! once as a synthetic table, one column per field; each message becomes a row of that
//! table, and the [`Route`] compiled for it does the rest. Topics, keys, headers, placements,
//! tombstones, contracts and masking are therefore exactly a row's.
//!
//! Column types of the synthetic table: the payload and headers fields are `jsonb` (their exact
//! JSON text, as the producer wrote it), the timestamp field is text read as RFC 3339 (an integer
//! there is epoch milliseconds and is turned into RFC 3339 first), every other field is text (a
//! JSON string as its characters, other JSON values as their JSON text). A field that is absent or
//! JSON `null` is a NULL column.
//!
//! What a row cannot lack, a message can; so two checks come before routing, each a [`BadEvent`]:
//! content that is not a JSON object (`invalid_json`), and an object without the key field
//! (`missing_key`; an explicit `null` key is allowed and means no key, as a NULL column does).
//! A missing id or route field is the router's own `null_id` / `null_route`.

use bytes::Bytes;
use serde_json::value::RawValue;

use super::render::{JSONB, TEXT};
use super::row::{Column, Row, Table, Value};
use super::{BadEvent, HeadersField, Route, RouteConfig};
use crate::error::Definite;

/// Reason code of a message object without the key field.
pub const MISSING_KEY: &str = "missing_key";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Json,
    Timestamp,
    Text,
}

/// The route of logical-message events, compiled once per configuration.
#[derive(Clone, Debug)]
pub struct MessageRoute {
    route: Route,
    fields: Vec<(String, Kind)>,
    key_field: String,
    id_field: String,
}

impl MessageRoute {
    pub fn compile(cfg: &RouteConfig) -> Result<MessageRoute, Definite> {
        let mut fields: Vec<(String, Kind)> = Vec::new();
        let mut add = |name: &str, kind: Kind| {
            if !fields.iter().any(|(n, _)| n == name) {
                fields.push((name.to_owned(), kind));
            }
        };
        // JSON fields first, so a name that is also a text field keeps its JSON form.
        add(&cfg.payload_field, Kind::Json);
        match &cfg.headers_field {
            HeadersField::IfPresent(h) | HeadersField::Required(h) => add(h, Kind::Json),
            HeadersField::Disabled => {}
        }
        if let Some(ts) = &cfg.timestamp_field {
            add(ts, Kind::Timestamp);
        }
        for name in [&cfg.id_field, &cfg.key_field, &cfg.route_by_field, &cfg.type_field] {
            add(name, Kind::Text);
        }
        for p in &cfg.placements {
            add(&p.column, Kind::Text);
        }
        let columns = fields
            .iter()
            .map(|(name, kind)| Column {
                name: name.clone(),
                type_oid: if *kind == Kind::Json { JSONB } else { TEXT },
                type_modifier: -1,
            })
            .collect();
        let rel = Table { schema: "pg_logical_emit_message".into(), name: "message".into(), columns };
        let mut route = Route::compile(cfg, &rel)?;
        route.payload_is_decoded_json();
        Ok(MessageRoute { route, fields, key_field: cfg.key_field.clone(), id_field: cfg.id_field.clone() })
    }

    /// The compiled route the rows of [`MessageRoute::row`] go through.
    pub fn route(&self) -> &Route {
        &self.route
    }

    /// One message's content as a row of the synthetic table.
    // Bad events are rare; carrying their salvage inline beats a box on every good message.
    #[allow(clippy::result_large_err)]
    pub fn row(&self, content: &Bytes) -> Result<Row, BadEvent> {
        let bad = |code: &'static str, message: String| BadEvent {
            event_id: None,
            code,
            message,
            topic: None,
            key: None,
            payload: Some(content.clone()),
            headers: Vec::new(),
            payload_dropped: None,
        };
        let object: std::collections::HashMap<String, &RawValue> = serde_json::from_slice(content).map_err(|e| {
            bad("invalid_json", format!("the logical message's content is not a JSON object of event fields: {e}"))
        })?;
        if !object.contains_key(&self.key_field) {
            let mut b = bad(
                MISSING_KEY,
                format!(
                    "the logical message has no {:?} field (the key, set by --table-field-event-key)",
                    self.key_field
                ),
            );
            b.event_id = object.get(&self.id_field).filter(|v| v.get() != "null").and_then(|v| text(v));
            return Err(b);
        }
        let values: Vec<Value> = self
            .fields
            .iter()
            .map(|(name, kind)| match object.get(name) {
                None => Value::Null,
                Some(v) if v.get() == "null" => Value::Null,
                Some(v) => Value::Text(match kind {
                    Kind::Json => Bytes::copy_from_slice(v.get().as_bytes()),
                    Kind::Text => Bytes::from(text(v).unwrap_or_default()),
                    Kind::Timestamp => Bytes::from(timestamp(v)),
                }),
            })
            .collect();
        Ok(Row::from(values))
    }
}

impl MessageRoute {
    /// The id field of a content that is a JSON object, for messages refused before routing.
    pub fn event_id(&self, content: &[u8]) -> Option<String> {
        let object: std::collections::HashMap<String, &RawValue> = serde_json::from_slice(content).ok()?;
        object.get(&self.id_field).filter(|v| v.get() != "null").and_then(|v| text(v))
    }
}

/// A text field: a JSON string as its characters, anything else as its JSON text.
fn text(v: &RawValue) -> Option<String> {
    match serde_json::from_str::<String>(v.get()) {
        Ok(s) => Some(s),
        Err(_) => Some(v.get().to_owned()),
    }
}

/// The timestamp field: a string as it is (read as RFC 3339 by the router), an integer as epoch
/// milliseconds turned into RFC 3339. Anything else is passed on as text, which the router then
/// refuses as `bad_value`.
fn timestamp(v: &RawValue) -> String {
    if let Ok(ms) = v.get().parse::<i64>() {
        if let Ok(ts) = jiff::Timestamp::from_millisecond(ms) {
            return ts.to_string();
        }
    }
    text(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::OutboxRow;

    fn cfg() -> RouteConfig {
        crate::router::tests::default_route_config()
    }

    #[allow(clippy::result_large_err)]
    fn routed(content: &str) -> Result<crate::router::Record, BadEvent> {
        let m = MessageRoute::compile(&cfg()).unwrap();
        let tuple = m.row(&Bytes::from(content.to_owned()))?;
        m.route().route(OutboxRow { tuple: &tuple, commit_time_us: 0 })
    }

    #[test]
    fn a_message_routes_like_a_row() {
        let r = routed(
            r#"{"event_id":"e-1","aggregate_type":"order","aggregate_id":"o-1","event_type":"order.paid.v1",
                "payload":{"b":1, "a":[1,2]},"headers":{"traceparent":"00-x","n":3},"created_at":"2026-12-01T10:00:00.5Z"}"#,
        )
        .unwrap();
        assert_eq!(r.topic, "order.paid.v1.events");
        assert_eq!(r.key.as_deref(), Some(&b"o-1"[..]));
        // The payload's exact JSON text, key order and spacing kept.
        assert_eq!(r.payload.as_deref(), Some(&br#"{"b":1, "a":[1,2]}"#[..]));
        assert_eq!(r.event_id, "e-1");
        let h: Vec<(&str, &[u8])> = r.headers.iter().map(|(k, v)| (&**k, &v[..])).collect();
        // Expanded as a row's headers column is: keys in serde_json's (sorted) order.
        assert_eq!(h, vec![("id", &b"e-1"[..]), ("n", b"3"), ("traceparent", b"00-x")]);
        assert_eq!(r.timestamp_ms, Some(1_796_119_200_500));
    }

    #[test]
    fn created_at_as_epoch_ms_or_absent() {
        let base = r#""event_id":"e","aggregate_id":"k","event_type":"t","payload":1"#;
        let r = routed(&format!("{{{base},\"created_at\":1796119200500}}")).unwrap();
        assert_eq!(r.timestamp_ms, Some(1_796_119_200_500));
        // Absent: the commit time (0 µs after 2000-01-01 here).
        let r = routed(&format!("{{{base}}}")).unwrap();
        assert_eq!(r.timestamp_ms, Some(946_684_800_000));
        let bad = routed(&format!("{{{base},\"created_at\":true}}")).unwrap_err();
        assert_eq!(bad.code, "bad_value");
    }

    #[test]
    fn numbers_as_text_and_null_key_means_no_key() {
        let r = routed(r#"{"event_id":7,"aggregate_id":null,"event_type":"t","payload":"x"}"#).unwrap();
        assert_eq!(r.event_id, "7");
        assert_eq!(r.key, None);
        assert_eq!(r.payload.as_deref(), Some(&br#""x""#[..]));
    }

    #[test]
    fn bad_contents() {
        for (content, code) in [
            ("not json", "invalid_json"),
            ("[1,2]", "invalid_json"),
            (r#""a string""#, "invalid_json"),
            (r#"{"event_id":"e","event_type":"t","payload":1}"#, MISSING_KEY),
            (r#"{"aggregate_id":"k","event_type":"t","payload":1}"#, "null_id"),
            (r#"{"event_id":"e","aggregate_id":"k","payload":1}"#, "null_route"),
            (r#"{"event_id":"e","aggregate_id":"k","event_type":"t","headers":[1]}"#, "invalid_json"),
        ] {
            let bad = routed(content).unwrap_err();
            assert_eq!(bad.code, code, "{content}");
        }
        let bad = routed(r#"{"event_id":"e-9","event_type":"t"}"#).unwrap_err();
        assert_eq!(bad.event_id.as_deref(), Some("e-9"));
        assert_eq!(bad.payload.as_deref(), Some(&br#"{"event_id":"e-9","event_type":"t"}"#[..]));
    }
}
