//! A [`Typed`] value written out: as Connect's `SimpleHeaderConverter` writes a header
//! (`Values.convertToString`) and as JsonConverter (`schemas.enable=false`) writes a field.
//!
//! `Values.convertToString` writes a number or boolean as Java's `toString()`, a string as it
//! is, bytes as Base64, a list as `[a,b]` with its strings quoted (only `\` and `"` escaped) and
//! `null` for a null, a struct as `{"name":value,...}`. JsonConverter writes Jackson's JSON:
//! numbers as Java spells them (a NaN or infinite double as a string), a Decimal as the Base64
//! of its unscaled two's-complement bytes (its default `decimal.format=BASE64`).

use base64::Engine as _;
use bytes::Bytes;
use num_bigint::BigInt;

use super::{java, Typed};
use crate::router::converter::jackson_string;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Debezium's VariableScaleDecimal struct, as both writers spell it.
fn variable(u: &BigInt, s: i32) -> String {
    format!("{{\"scale\":{s},\"value\":\"{}\"}}", b64(&u.to_signed_bytes_be()))
}

/// A non-array value as `Values.convertToString` writes it (`embedded`: inside a list).
fn scalar(v: &Typed, embedded: bool, out: &mut String) {
    match v {
        Typed::Int(i) => out.push_str(&i.to_string()),
        Typed::Float64(f) => out.push_str(&java::double(*f)),
        Typed::Float32(f) => out.push_str(&java::float(*f)),
        Typed::Decimal(u, s) => out.push_str(&java::big_decimal(u, *s)),
        Typed::VariableDecimal(u, s) => out.push_str(&variable(u, *s)),
        Typed::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Typed::Str(s) if embedded => {
            out.push('"');
            out.push_str(&s.replace('\\', "\\\\").replace('"', "\\\""));
            out.push('"');
        }
        Typed::Str(s) => out.push_str(s),
        Typed::Bytes(b) if embedded => {
            out.push('"');
            out.push_str(&b64(b));
            out.push('"');
        }
        Typed::Bytes(b) => out.push_str(&b64(b)),
        Typed::Null => out.push_str("null"),
        Typed::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                match item {
                    Some(v) => scalar(v, true, out),
                    None => out.push_str("null"),
                }
            }
            out.push(']');
        }
    }
}

/// The header bytes Connect's default `SimpleHeaderConverter` writes for `v`; `None` for
/// [`Typed::Null`], which is no header in outboxd (a null-valued one in Debezium).
pub fn header(v: &Typed) -> Option<Bytes> {
    if *v == Typed::Null {
        return None;
    }
    let mut out = String::new();
    scalar(v, false, &mut out);
    Some(Bytes::from(out))
}

/// `v` as JsonConverter (`schemas.enable=false`) writes it.
pub fn json(v: &Typed) -> Bytes {
    let mut out = Vec::new();
    write_json(v, &mut out);
    Bytes::from(out)
}

fn write_json(v: &Typed, out: &mut Vec<u8>) {
    let non_finite =
        |s: String| if s.ends_with("Infinity") || s == "NaN" { jackson_string(&s).to_vec() } else { s.into_bytes() };
    match v {
        Typed::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
        Typed::Float64(f) => out.extend(non_finite(java::double(*f))),
        Typed::Float32(f) => out.extend(non_finite(java::float(*f))),
        Typed::Decimal(u, _) => out.extend_from_slice(&jackson_string(&b64(&u.to_signed_bytes_be()))),
        Typed::VariableDecimal(u, s) => out.extend_from_slice(variable(u, *s).as_bytes()),
        Typed::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Typed::Str(s) => out.extend_from_slice(&jackson_string(s)),
        Typed::Bytes(b) => out.extend_from_slice(&jackson_string(&b64(b))),
        Typed::Null => out.extend_from_slice(b"null"),
        Typed::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                match item {
                    Some(v) => write_json(v, out),
                    None => out.extend_from_slice(b"null"),
                }
            }
            out.push(b']');
        }
    }
}
