//! A JSON payload validated against a registered JSON Schema and framed the Confluent way (as
//! Confluent's `JsonSchemaConverter` / `KafkaJsonSchemaSerializer` frame it): the magic byte, the
//! schema id, then the payload's own JSON text, as the column holds it (serializers write it
//! compact; any JSON text decodes the same, and copying it costs nothing). A payload that does not
//! validate is refused with the first error and where it is, never sent.

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
            let at = e.instance_path().as_str();
            let at = if at.is_empty() { "/" } else { at };
            return Err(format!("the payload does not fit the schema (id {}) at {at}: {e}", self.id));
        }
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(MAGIC);
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(payload);
        Ok(out)
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
        assert!(e.contains("(id 3) at /amount_cents"), "{e}");
        assert!(w.encode(br#"{"id": "o-1"}"#).unwrap_err().contains("at /:"));
        assert!(Writer::new(1, "not json").is_err());
    }
}
