//! A JSON payload validated against a registered JSON Schema and framed the Confluent way (as
//! Confluent's `JsonSchemaConverter` / `KafkaJsonSchemaSerializer` frame it): the magic byte, the
//! schema id, then the payload's own JSON text, as the column holds it (serializers write it
//! compact; any JSON text decodes the same, and copying it costs nothing). A payload that does not
//! validate is refused with its first error, never sent: the field and what the schema expects
//! there, in words ([`words`] for the common keywords; the library's own sentence for the rest).

use jsonschema::error::{TypeKind, ValidationErrorKind};
use serde_json::Value;

use super::mismatch::{self, Mismatch, Path, Step};

/// The wire format's first byte.
const MAGIC: u8 = 0;

pub struct Writer {
    id: u32,
    validator: jsonschema::Validator,
    /// The schema's `title`: its record name, as Confluent's JsonSchema names it.
    title: Option<String>,
}

impl Writer {
    pub fn new(id: u32, schema: &str) -> Result<Writer, String> {
        let schema: serde_json::Value =
            serde_json::from_str(schema).map_err(|e| format!("the registered schema is not JSON: {e}"))?;
        // The draft is the schema's `$schema` (draft 2020-12 when it has none).
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&schema)
            .map_err(|e| format!("the registered schema is not a JSON Schema outboxd can use: {e}"))?;
        let title = schema.get("title").and_then(|t| t.as_str()).map(str::to_owned);
        Ok(Writer { id, validator, title })
    }

    /// The schema's `title`, if it has one.
    pub fn name(&self) -> Option<String> {
        self.title.clone()
    }

    /// `payload` (JSON text) as magic byte, schema id and the same text.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let json: serde_json::Value =
            serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
        if let Some(e) = self.validator.iter_errors(&json).next() {
            return Err(format!("the payload does not fit the schema (id {}): {}", self.id, words(&e, &json)));
        }
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(MAGIC);
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(payload);
        Ok(out)
    }
}

/// A validation error as a [`Mismatch`]: the instance's path in the payload's own terms (an
/// index where the payload has an array), and the keyword's demand in words.
fn words(e: &jsonschema::ValidationError<'_>, payload: &Value) -> Mismatch {
    let mut path = Path::default();
    let mut node = Some(payload);
    for seg in e.instance_path().as_str().split('/').skip(1) {
        let name = seg.replace("~1", "/").replace("~0", "~");
        let step = match (node, name.parse::<usize>()) {
            (Some(Value::Array(_)), Ok(i)) => Step::Index(i),
            _ => Step::Field(name.clone()),
        };
        node = match (&step, node) {
            (Step::Index(i), Some(Value::Array(a))) => a.get(*i),
            (_, Some(Value::Object(o))) => o.get(&name),
            _ => None,
        };
        path.0.push(step);
    }
    let got = e.instance();
    let why = match e.kind() {
        ValidationErrorKind::Type { kind: TypeKind::Single(t) } => {
            return Mismatch::expected(&path, &type_words(&t.to_string()), got)
        }
        ValidationErrorKind::Type { kind: TypeKind::Multiple(ts) } => {
            let each: Vec<String> = ts.iter().map(|t| type_words(&t.to_string())).collect();
            return Mismatch::expected(&path, &each.join(" or "), got);
        }
        ValidationErrorKind::Required { property } => {
            let name = property.as_str().map_or_else(|| property.to_string(), str::to_owned);
            return Mismatch::new(&path.with(Step::Field(name)), "missing, and the schema requires it");
        }
        ValidationErrorKind::Enum { options } => {
            let each: Vec<String> =
                options.as_array().map_or_else(Vec::new, |a| a.iter().map(Value::to_string).collect());
            format!("{} is not one of the schema's values {}", short(got), mismatch::list(&each))
        }
        ValidationErrorKind::Constant { expected_value } => {
            format!("expected {}, got {}", expected_value, mismatch::words(got))
        }
        ValidationErrorKind::Minimum { limit } => format!("expected at least {limit}, got {got}"),
        ValidationErrorKind::Maximum { limit } => format!("expected at most {limit}, got {got}"),
        ValidationErrorKind::ExclusiveMinimum { limit } => format!("expected more than {limit}, got {got}"),
        ValidationErrorKind::ExclusiveMaximum { limit } => format!("expected less than {limit}, got {got}"),
        ValidationErrorKind::MinLength { limit } => format!("expected at least {limit} characters, got {}", short(got)),
        ValidationErrorKind::MaxLength { limit } => format!("expected at most {limit} characters, got {}", short(got)),
        ValidationErrorKind::Pattern { pattern } => {
            format!("expected a string matching {}, got {}", mismatch::quoted(pattern), mismatch::words(got))
        }
        ValidationErrorKind::Format { format } => format!("expected a {format} string, got {}", mismatch::words(got)),
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            format!("has fields the schema does not allow: {}", mismatch::list(unexpected))
        }
        // The rest (combinators, array and object sizes, ...): the library's sentence.
        _ => e.to_string(),
    };
    Mismatch::new(&path, why)
}

/// A JSON Schema type name in words.
fn type_words(t: &str) -> String {
    match t {
        "integer" => "an integer".into(),
        "number" => "a number".into(),
        "string" => "a string".into(),
        "boolean" => "a boolean".into(),
        "object" => "an object".into(),
        "array" => "an array".into(),
        other => other.to_owned(),
    }
}

/// A value as it is quoted in a reason: a string in quotes, anything else in words.
fn short(v: &Value) -> String {
    match v {
        Value::String(s) => mismatch::quoted(s),
        other => mismatch::words(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{"type":"object","properties":{"id":{"type":"string"},"amount_cents":{"type":"integer"}},
        "required":["id","amount_cents"]}"#;

    /// The header confluent-kafka's JSONSerializer wrote against Apicurio Registry (schema id 3),
    /// then the payload's text.
    #[test]
    fn header_then_the_payload() {
        let w = Writer::new(3, ORDER).unwrap();
        let mut want = vec![0u8, 0, 0, 0, 3];
        want.extend_from_slice(br#"{"id": "o-1", "amount_cents": 1234}"#);
        assert_eq!(w.encode(br#"{"id": "o-1", "amount_cents": 1234}"#).unwrap(), want);
    }

    #[test]
    fn a_payload_that_does_not_validate_is_refused_with_where() {
        let w = Writer::new(3, ORDER).unwrap();
        let e = w.encode(br#"{"id": "o-1", "amount_cents": "ten"}"#).unwrap_err();
        assert_eq!(
            e,
            r#"the payload does not fit the schema (id 3): field "amount_cents": expected an integer, got a string "ten""#
        );
        assert!(Writer::new(1, "not json").is_err());
    }

    /// Each case: a payload, and the reason given for it.
    #[test]
    fn each_mismatch_names_its_field_and_the_expectation_in_words() {
        const SCHEMA: &str = r#"{"type":"object","required":["id"],"additionalProperties":false,"properties":{
            "id":{"type":"string","minLength":2,"pattern":"^o"},
            "amount":{"type":"integer","minimum":0,"maximum":100},
            "currency":{"enum":["EUR","USD"]},
            "at":{"type":"string","format":"date-time"},
            "note":{"type":["string","null"]},
            "lines":{"type":"array","items":{"type":"object","properties":{"price":{"type":"number"}}}},
            "attrs":{"type":"object","properties":{"a/b":{"type":"boolean"}}}}}"#;
        let w = Writer::new(3, SCHEMA).unwrap();
        for (payload, want) in [
            (r#"{"amount":1}"#, r#"field "id": missing, and the schema requires it"#),
            (r#"{"id":"o-1","amount":1099511627776}"#, r#"field "amount": expected at most 100, got 1099511627776"#),
            (r#"{"id":"o-1","amount":-1}"#, r#"field "amount": expected at least 0, got -1"#),
            (r#"{"id":"o-1","amount":1.5}"#, r#"field "amount": expected an integer, got 1.5"#),
            (
                r#"{"id":"o-1","currency":"JPY"}"#,
                r#"field "currency": "JPY" is not one of the schema's values ["EUR", "USD"]"#,
            ),
            (r#"{"id":"o"}"#, r#"field "id": expected at least 2 characters, got "o""#),
            (r#"{"id":"xx"}"#, r#"field "id": expected a string matching "^o", got a string "xx""#),
            (
                r#"{"id":"o-1","at":"yesterday"}"#,
                r#"field "at": expected a date-time string, got a string "yesterday""#,
            ),
            (r#"{"id":"o-1","note":5}"#, r#"field "note": expected null or a string, got 5"#),
            (
                r#"{"id":"o-1","lines":[{"price":1},{"price":"twelve"}]}"#,
                r#"field "lines[1].price": expected a number, got a string "twelve""#,
            ),
            (r#"{"id":"o-1","attrs":{"a/b":"yes"}}"#, r#"field "attrs.a/b": expected a boolean, got a string "yes""#),
            (r#"{"id":"o-1","extra":1}"#, r#"the payload: has fields the schema does not allow: [extra]"#),
            (r#"[1]"#, r#"the payload: expected an object, got an array of 1 item"#),
        ] {
            let e = w.encode(payload.as_bytes()).unwrap_err();
            assert_eq!(e.strip_prefix("the payload does not fit the schema (id 3): "), Some(want), "{payload}");
        }
    }
}
