//! A JSON payload as a Protobuf message of a registered `.proto`, framed the Confluent way (what
//! Confluent's `ProtobufConverter` writes): the magic byte, the schema id, the message indexes
//! (which message of the file: here always the first top-level one, written as the single byte
//! `0`), then the message's binary encoding.
//!
//! The registry holds `.proto` text; it is compiled here at run time (protox, no `protoc`), with
//! Google's well-known types available to `import`. The payload is read with Protobuf's JSON
//! mapping (field names as written or in lowerCamelCase, 64-bit integers as numbers or strings,
//! enums by name); a field the message does not have is a mismatch. A mismatch is reported with
//! the field and what the message expects there, in words ([`super::proto_fit`]).

use prost::Message as _;
use prost_reflect::{DynamicMessage, FileDescriptor, MessageDescriptor};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

/// The wire format's first byte.
const MAGIC: u8 = 0;
/// The name the registered source is compiled under.
const SOURCE_NAME: &str = "registered.proto";

pub struct Writer {
    id: u32,
    message: MessageDescriptor,
}

/// The registered source, and nothing else by that name.
struct Registered(String);

impl FileResolver for Registered {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        if name == SOURCE_NAME {
            File::from_source(name, &self.0)
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

/// The registered `.proto` source compiled (Google's well-known types importable, nothing else):
/// what a writer and a reader of the wire format pick their message from.
pub fn compile(source: &str) -> Result<FileDescriptor, String> {
    let mut chain = ChainFileResolver::new();
    chain.add(Registered(source.to_owned()));
    chain.add(GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(chain);
    compiler
        .open_file(SOURCE_NAME)
        .map_err(|e| format!("the registered schema does not compile as a .proto file: {e}"))?;
    compiler
        .descriptor_pool()
        .get_file_by_name(SOURCE_NAME)
        .ok_or_else(|| "the registered schema compiled to nothing".to_owned())
}

impl Writer {
    pub fn new(id: u32, source: &str) -> Result<Writer, String> {
        let file = compile(source)?;
        let message =
            file.messages().next().ok_or_else(|| "the registered .proto file declares no message".to_owned())?;
        Ok(Writer { id, message })
    }

    /// The message's full name (`package.Message`), as Confluent's ProtobufSchema names it.
    pub fn name(&self) -> Option<String> {
        Some(self.message.full_name().to_owned())
    }

    /// `payload` (JSON text) as magic byte, schema id, message index `[0]` and the message.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let mut de = serde_json::Deserializer::from_slice(payload);
        let msg = DynamicMessage::deserialize(self.message.clone(), &mut de)
            .and_then(|m| de.end().map(|()| m))
            .map_err(|e| {
                // The library decides what fits; the explainer says why not, where it can.
                let why = serde_json::from_slice(payload)
                    .ok()
                    .and_then(|json| super::proto_fit::explain(&self.message, &json))
                    .map_or_else(|| e.to_string(), |m| m.to_string());
                format!("the payload does not fit message {} (schema id {}): {why}", self.message.full_name(), self.id)
            })?;
        let mut out = Vec::with_capacity(6 + payload.len());
        out.push(MAGIC);
        out.extend_from_slice(&self.id.to_be_bytes());
        // The message indexes: [0], which the format shortens to one zero byte.
        out.push(0);
        msg.encode(&mut out).map_err(|e| format!("cannot encode the message: {e}"))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOP: &str = r#"syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
message OrderCreated {
  string id = 1;
  int64 amount_cents = 2;
  repeated string items = 3;
  Address ship_to = 4;
  google.protobuf.Timestamp at = 5;
  message Address { string city = 1; string zip = 2; }
}
message OrderCancelled { string id = 1; string reason = 2; }
"#;

    /// The bytes confluent-kafka's ProtobufSerializer wrote for the same message against Apicurio
    /// Registry (schema id 2, message index [0]), captured byte for byte.
    #[test]
    fn the_same_bytes_as_the_stock_serializer() {
        let w = Writer::new(2, SHOP).unwrap();
        let got = w
            .encode(br#"{"id": "o-1", "amount_cents": 1234, "items": ["a", "b"], "ship_to": {"city": "Bern", "zip": "3000"}}"#)
            .unwrap();
        let want: &[u8] = &[
            0x00, 0, 0, 0, 2, 0x00, 0x0a, 0x03, b'o', b'-', b'1', 0x10, 0xd2, 0x09, 0x1a, 0x01, b'a', 0x1a, 0x01, b'b',
            0x22, 0x0c, 0x0a, 0x04, b'B', b'e', b'r', b'n', 0x12, 0x04, b'3', b'0', b'0', b'0',
        ];
        assert_eq!(got, want);
        // lowerCamelCase names and 64-bit integers as strings (Protobuf's JSON mapping) too.
        let camel = w.encode(
            br#"{"id": "o-1", "amountCents": "1234", "items": ["a", "b"], "shipTo": {"city": "Bern", "zip": "3000"}}"#,
        );
        assert_eq!(camel.unwrap(), want);
    }

    #[test]
    fn a_payload_that_does_not_fit_is_refused_with_the_reason() {
        let w = Writer::new(9, SHOP).unwrap();
        for bad in [&br#"{"id": 5}"#[..], br#"{"nope": 1}"#, b"not json", br#"{"id": "x"} trailing"#] {
            let e = w.encode(bad).unwrap_err();
            assert!(e.contains("does not fit message shop.v1.OrderCreated (schema id 9)"), "{e}");
        }
        assert!(Writer::new(1, "syntax = \"proto3\"; message {").is_err());
        assert!(Writer::new(1, "syntax = \"proto3\";").err().unwrap_or_default().contains("no message"));
    }
}
