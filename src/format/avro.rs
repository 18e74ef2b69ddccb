//! A JSON payload as an Avro binary datum of a registered schema, framed the Confluent way.
//!
//! JSON maps onto Avro by value (not Avro's own JSON encoding): an object is a record (missing
//! fields take their defaults) or a map, a number an int, long, float or double as the schema
//! says, a string a string, enum symbol, or bytes; a union takes the first branch the value fits,
//! so `null` or a bare value for `["null", "string"]`. Anything else is a mismatch, reported with
//! the field and what the schema expects there ([`super::avro_fit`]), never a panic.

use apache_avro::types::Value;
use apache_avro::Schema;

/// The wire format's first byte.
const MAGIC: u8 = 0;

pub struct Writer {
    id: u32,
    schema: Schema,
}

impl Writer {
    pub fn new(id: u32, schema: &str) -> Result<Writer, String> {
        let schema =
            Schema::parse_str(schema).map_err(|e| format!("the registered schema does not parse as Avro: {e}"))?;
        Ok(Writer { id, schema })
    }

    /// The schema's full name (`namespace.name`), when it is a named type.
    pub fn name(&self) -> Option<String> {
        self.schema.name().map(|n| n.fullname(None))
    }

    /// `payload` (JSON text) as magic byte, schema id and datum.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let json: serde_json::Value =
            serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
        // The library decides what fits; the explainer says why not, in words, where it can. It
        // reads the payload again: a refusal is rare, and the good path keeps its one parse.
        let refused = |e: apache_avro::Error| {
            let why = serde_json::from_slice(payload)
                .ok()
                .and_then(|json| super::avro_fit::explain(&self.schema, &json))
                .map_or_else(|| e.to_string(), |m| m.to_string());
            format!("the payload does not fit the schema (id {}): {why}", self.id)
        };
        let value = Value::try_from(json).and_then(|v| v.resolve(&self.schema)).map_err(refused)?;
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(MAGIC);
        out.extend_from_slice(&self.id.to_be_bytes());
        apache_avro::writer::datum::GenericDatumWriter::builder(&self.schema)
            .build()
            .and_then(|w| w.write_value_ref(&mut out, &value))
            .map_err(refused)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{"type":"record","name":"Order","namespace":"shop.v1","fields":[
        {"name":"id","type":"string"},{"name":"amount_cents","type":"long"},
        {"name":"note","type":["null","string"],"default":null}]}"#;

    /// The bytes confluent-kafka's AvroSerializer wrote for the same values against Apicurio
    /// Registry (schema id 1), captured byte for byte.
    #[test]
    fn the_same_bytes_as_the_stock_serializer() {
        let w = Writer::new(1, ORDER).unwrap();
        assert_eq!(
            w.encode(br#"{"id":"o-1","amount_cents":1234,"note":null}"#).unwrap(),
            [0x00, 0, 0, 0, 1, 0x06, b'o', b'-', b'1', 0xa4, 0x13, 0x00]
        );
        assert_eq!(
            w.encode(br#"{"id":"o-2","amount_cents":-5,"note":"gift"}"#).unwrap(),
            [0x00, 0, 0, 0, 1, 0x06, b'o', b'-', b'2', 0x09, 0x02, 0x08, b'g', b'i', b'f', b't']
        );
        // A missing field with a default takes it.
        assert_eq!(w.encode(br#"{"id":"o-1","amount_cents":1234}"#).unwrap().last(), Some(&0x00));
    }

    #[test]
    fn a_payload_that_does_not_fit_is_refused_with_the_reason() {
        let w = Writer::new(7, ORDER).unwrap();
        for bad in [&br#"{"id":"o-1"}"#[..], br#"{"id":5,"amount_cents":1}"#, b"not json", br#"[1,2]"#] {
            let e = w.encode(bad).unwrap_err();
            assert!(e.contains("not JSON") || e.contains("does not fit the schema (id 7)"), "{e}");
        }
        // In words, naming the field (the cases are in `avro_fit`).
        let e = w.encode(br#"{"id":"o-1","amount_cents":"twelve"}"#).unwrap_err();
        assert_eq!(
            e,
            r#"the payload does not fit the schema (id 7): field "amount_cents": expected a long (64-bit integer), got a string "twelve""#
        );
        assert!(Writer::new(1, "{\"type\":\"recordx\"}").is_err());
    }
}
