//! How column values become bytes, strings and JSON.
//!
//! pgoutput sends every value in PostgreSQL's text output format (we never ask for binary), with
//! the walsender pinned to `DateStyle=ISO, TimeZone=UTC`. This module turns those texts into what
//! Kafka consumers expect: raw bytes for `bytea` (decoded from `\x` hex), `true`/`false` for
//! booleans, ISO 8601 for timestamps (see [`super::timestamp`]), and JSON text as is. Everything
//! else is its text. Only timestamps can fail to render: a value out of jiff's range is an `Err`.

use bytes::Bytes;

use super::timestamp;

pub use super::oid::{
    BOOL, BYTEA, FLOAT4, FLOAT8, INT2, INT4, INT8, JSON, JSONB, NUMERIC, OID, TEXT, TIMESTAMP, TIMESTAMPTZ, VARCHAR,
};

/// Decode `bytea` hex output (`\x0a0b`) into raw bytes.
pub fn bytea(text: &[u8]) -> Result<Bytes, String> {
    let hex = text.strip_prefix(b"\\x").ok_or("bytea value is not in hex format (set bytea_output = 'hex')")?;
    if hex.len() % 2 != 0 {
        return Err("bytea hex has an odd number of digits".into());
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(format!("bytea hex has a non-hex character {:?}", c as char)),
    };
    let mut out = Vec::with_capacity(hex.len() / 2);
    for pair in hex.chunks_exact(2) {
        out.push(nib(pair[0])? << 4 | nib(pair[1])?);
    }
    Ok(Bytes::from(out))
}

/// A value as the bytes of a key, header or plain record value.
pub fn as_bytes(type_oid: u32, text: &Bytes) -> Result<Bytes, String> {
    match type_oid {
        BYTEA => bytea(text),
        BOOL | TIMESTAMP | TIMESTAMPTZ => Ok(Bytes::from(as_string(type_oid, text)?.into_bytes())),
        _ => Ok(text.clone()),
    }
}

/// A value as a string (headers, envelope fields): ISO 8601 timestamps, `true`/`false`.
pub fn as_string(type_oid: u32, text: &[u8]) -> Result<String, String> {
    Ok(match type_oid {
        BOOL => match text {
            b"t" => "true".into(),
            b"f" => "false".into(),
            other => String::from_utf8_lossy(other).into_owned(),
        },
        TIMESTAMPTZ => timestamp::iso(text, true)?,
        TIMESTAMP => timestamp::iso(text, false)?,
        _ => String::from_utf8_lossy(text).into_owned(),
    })
}

/// A value as a JSON value for an envelope: JSON columns embedded, numbers and booleans typed,
/// everything else a string.
pub fn as_json(type_oid: u32, text: &[u8]) -> Result<serde_json::Value, String> {
    Ok(match type_oid {
        JSON | JSONB => serde_json::from_slice(text)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(text).into_owned())),
        INT2 | INT4 | INT8 | OID | FLOAT4 | FLOAT8 | NUMERIC => {
            serde_json::from_slice::<serde_json::Number>(text).map(serde_json::Value::Number).unwrap_or_else(|_| {
                // NaN, Infinity: JSON has no spelling for them.
                serde_json::Value::String(String::from_utf8_lossy(text).into_owned())
            })
        }
        BOOL => serde_json::Value::Bool(text == b"t"),
        _ => serde_json::Value::String(as_string(type_oid, text)?),
    })
}

/// Whether the column holds JSON text.
pub fn is_json(type_oid: u32) -> bool {
    matches!(type_oid, JSON | JSONB)
}

/// Whether the column holds text that `--table-expand-json-payload` may parse.
pub fn is_text(type_oid: u32) -> bool {
    matches!(type_oid, TEXT | VARCHAR) || type_oid == 1042 /* bpchar */
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renderings() {
        assert_eq!(&bytea(b"\\x00ff10").unwrap()[..], &[0, 255, 16]);
        assert!(bytea(b"\\x0").is_err() && bytea(b"00").is_err() && bytea(b"\\xzz").is_err());
        let s = |oid: u32, t: &[u8]| as_string(oid, t).unwrap();
        assert_eq!(s(BOOL, b"t"), "true");
        assert_eq!(s(TIMESTAMPTZ, b"2026-12-02 10:49:10.5+00"), "2026-12-02T10:49:10.5Z");
        assert_eq!(s(TIMESTAMPTZ, b"2026-12-02 10:49:10+05:30"), "2026-12-02T10:49:10+05:30");
        assert_eq!(s(TIMESTAMPTZ, b"2026-12-02 10:49:10-03"), "2026-12-02T10:49:10-03:00");
        assert_eq!(s(TIMESTAMP, b"2026-12-02 10:49:10"), "2026-12-02T10:49:10");
        assert_eq!(s(2950, b"0b6b3c1e-0000-4000-8000-000000000001"), "0b6b3c1e-0000-4000-8000-000000000001");
        let j = |oid: u32, t: &[u8]| as_json(oid, t).unwrap();
        assert_eq!(j(INT8, b"42"), serde_json::json!(42));
        assert_eq!(j(NUMERIC, b"10.50").to_string(), "10.50".parse::<serde_json::Value>().unwrap().to_string());
        assert_eq!(j(NUMERIC, b"NaN"), serde_json::json!("NaN"));
        assert_eq!(j(JSONB, br#"{"a": 1}"#), serde_json::json!({"a": 1}));
        assert_eq!(j(BOOL, b"f"), serde_json::json!(false));
        assert_eq!(j(TEXT, b"x"), serde_json::json!("x"));
        assert_eq!(j(TIMESTAMPTZ, b"2026-12-02 10:49:10+00"), serde_json::json!("2026-12-02T10:49:10Z"));
        // Out-of-range timestamps are errors in every rendering, never a panic.
        let far = b"99999999999999999-01-01 00:00:00+00";
        assert!(as_string(TIMESTAMPTZ, far).is_err() && as_json(TIMESTAMPTZ, far).is_err());
        assert!(as_bytes(TIMESTAMPTZ, &Bytes::from_static(far)).is_err());
    }
}
