//! `outboxd shadow compare`: the validator of a migration to the outbox. The old publishing path
//! keeps writing the legacy topic while the outbox writes the same events, as `.shadow` event
//! types, to a shadow topic; this reads both, pairs the two copies of each event and reports
//! what is only on one side, what differs (as JSON Pointer paths) and how far apart the copies are.
//!
//! * this file: how a record is identified (`--match-by`);
//! * [`diff`]: the JSON-semantic comparison and `--ignore`;
//! * [`pair`]: the pairing state and the tally, pure and bounded as its doc says;
//! * [`tool`]: reading the topics (`crate::sink::kafka::dlq`'s reader, clients from
//!   [`crate::sink::kafka::client`]), the report, `--follow` and its metrics.

pub mod diff;
pub mod pair;
pub mod tool;

use self::diff::{parse_pointer, Payload};

/// How the two copies of an event are recognised as one (`--match-by`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchBy {
    /// `header:NAME`: the value of that Kafka header (outboxd sends the event id as `id`).
    Header(String),
    /// `key`: the record key.
    Key,
    /// `field:/json/pointer`: the payload's value there.
    Field(String),
}

impl MatchBy {
    pub fn parse(s: &str) -> Result<MatchBy, String> {
        let bad = |why: &str| {
            format!("--match-by {s:?}: {why}; give header:NAME (e.g. header:id), key, or field:/json/pointer")
        };
        if s == "key" {
            return Ok(MatchBy::Key);
        }
        if let Some(name) = s.strip_prefix("header:") {
            if name.is_empty() {
                return Err(bad("the header name is empty"));
            }
            return Ok(MatchBy::Header(name.to_owned()));
        }
        if let Some(ptr) = s.strip_prefix("field:") {
            match parse_pointer(ptr) {
                Ok(t) if t.is_empty() => return Err(bad("the pointer names the whole payload")),
                Ok(_) => return Ok(MatchBy::Field(ptr.to_owned())),
                Err(why) => return Err(bad(&why)),
            }
        }
        Err(bad("unknown form"))
    }

    /// The record's id, `None` when it has none: no such header, no key, a payload that is not
    /// JSON or lacks the field, or an empty or `null` value. A field that is not a string is
    /// identified by its JSON text, so `42` and `"42"` are different ids.
    pub fn identify(
        &self,
        key: Option<&[u8]>,
        headers: &[(String, Option<Vec<u8>>)],
        payload: &Payload,
    ) -> Option<String> {
        let id = match self {
            MatchBy::Header(name) => headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.as_deref())
                .map(|v| String::from_utf8_lossy(v).into_owned()),
            MatchBy::Key => key.map(|k| String::from_utf8_lossy(k).into_owned()),
            MatchBy::Field(ptr) => match payload {
                Payload::Json(v) => match v.pointer(ptr)? {
                    serde_json::Value::Null => None,
                    serde_json::Value::String(s) => Some(s.clone()),
                    other => Some(other.to_string()),
                },
                _ => None,
            },
        };
        id.filter(|s| !s.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn match_by_forms() {
        assert_eq!(MatchBy::parse("key"), Ok(MatchBy::Key));
        assert_eq!(MatchBy::parse("header:id"), Ok(MatchBy::Header("id".into())));
        assert_eq!(MatchBy::parse("field:/order/id"), Ok(MatchBy::Field("/order/id".into())));
        for bad in ["header:", "field:orderId", "field:", "field:/a~9", "id", "Key"] {
            let e = MatchBy::parse(bad).unwrap_err();
            assert!(e.contains("--match-by") && e.contains("header:NAME") && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn ids_come_from_the_header_the_key_or_the_field() {
        let headers =
            vec![("id".to_string(), Some(b"e-1".to_vec())), ("empty".into(), Some(vec![])), ("nul".into(), None)];
        let p = Payload::Json(json!({"orderId": "o-7", "n": 42, "z": null, "o": {"b": 1}}));
        let id = |m: &str, key: Option<&[u8]>, p: &Payload| MatchBy::parse(m).unwrap().identify(key, &headers, p);
        assert_eq!(id("header:id", None, &p).as_deref(), Some("e-1"));
        assert_eq!(id("header:missing", None, &p), None);
        assert_eq!(id("header:empty", None, &p), None);
        assert_eq!(id("header:nul", None, &p), None);
        assert_eq!(id("key", Some(b"k-1"), &p).as_deref(), Some("k-1"));
        assert_eq!(id("key", None, &p), None);
        assert_eq!(id("field:/orderId", None, &p).as_deref(), Some("o-7"));
        assert_eq!(id("field:/n", None, &p).as_deref(), Some("42"));
        assert_eq!(id("field:/o", None, &p).as_deref(), Some(r#"{"b":1}"#));
        assert_eq!(id("field:/z", None, &p), None);
        assert_eq!(id("field:/missing", None, &p), None);
        assert_eq!(id("field:/orderId", None, &Payload::Raw(b"nope".to_vec())), None);
        assert_eq!(id("field:/orderId", None, &Payload::Absent), None);
    }
}
