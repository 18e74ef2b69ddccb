//! Each type's header and JSON bytes as Debezium 3.6.1 wrote them in tests/debezium_types.rs.

use super::*;
use crate::router::oid::{JSONB, TEXT};

const D: Mapping = Mapping {
    time_precision: TimePrecision::Adaptive,
    decimal: DecimalMode::Precise,
    binary: BinaryMode::Bytes,
    interval: IntervalMode::Numeric,
};

fn h(oid: u32, typmod: i32, text: &str) -> String {
    String::from_utf8(header(&typed(oid, typmod, text, D).unwrap()).unwrap_or_default().to_vec()).unwrap()
}

fn j(oid: u32, typmod: i32, text: &str) -> String {
    String::from_utf8(json(&typed(oid, typmod, text, D).unwrap()).to_vec()).unwrap()
}

/// numeric(p, s)'s type modifier.
fn scale(p: i32, s: i32) -> i32 {
    (p << 16 | s) + 4
}

#[test]
fn headers_as_simple_header_converter_writes_them() {
    assert_eq!(h(BOOL, -1, "t"), "true");
    assert_eq!(h(INT8, -1, "-9223372036854775808"), "-9223372036854775808");
    assert_eq!(h(FLOAT8, -1, "1e+20"), "1.0E20");
    assert_eq!(h(FLOAT8, -1, "-0"), "-0.0");
    assert_eq!(h(FLOAT8, -1, "123456789.125"), "1.23456789125E8");
    assert_eq!(h(FLOAT4, -1, "3.14"), "3.14");
    assert_eq!(h(FLOAT4, -1, "Infinity"), "Infinity");
    assert_eq!(h(NUMERIC, -1, "10.50"), r#"{"scale":1,"value":"aQ=="}"#);
    assert_eq!(h(NUMERIC, -1, "-1.000"), r#"{"scale":0,"value":"/w=="}"#);
    assert_eq!(h(NUMERIC, -1, "100"), r#"{"scale":0,"value":"ZA=="}"#);
    assert_eq!(h(NUMERIC, -1, "123456789012345678901234567890.5"), r#"{"scale":1,"value":"D5Uan6OihslPDnZsOQ=="}"#);
    assert_eq!(h(NUMERIC, scale(20, 8), "0.00000000"), "0E-8");
    assert_eq!(h(NUMERIC, scale(20, 8), "0.00000001"), "1E-8");
    assert_eq!(h(NUMERIC, scale(20, 8), "12.50000000"), "12.50000000");
    assert_eq!(h(NUMERIC, scale(10, 0), "-7"), "-7");
    assert_eq!(h(MONEY, -1, "-$1,000.00"), "-1000.00");
    assert_eq!(h(BYTEA, -1, r"\x5b"), "Ww==");
    assert_eq!(h(BYTEA, -1, r"\x"), "");
    assert_eq!(h(DATE, -1, "2026-01-01"), "20454");
    assert_eq!(h(DATE, -1, "0001-01-01"), "-719162");
    assert_eq!(h(TIME, -1, "08:00:00"), "28800000000");
    assert_eq!(h(TIME, 3, "12:34:56.789"), "45296789");
    assert_eq!(h(TIMETZ, -1, "23:59:59.123456-05:30"), "05:29:59.123456Z");
    assert_eq!(h(TIMETZ, -1, "08:00:00+02"), "06:00:00Z");
    assert_eq!(h(TIMESTAMP, -1, "2026-12-05 09:34:36"), "1796463276000000");
    assert_eq!(h(TIMESTAMP, -1, "1969-12-31 23:59:59.5"), "-500000");
    assert_eq!(h(TIMESTAMP, 3, "2026-12-05 09:34:36.123"), "1796463276123");
    assert_eq!(h(TIMESTAMPTZ, -1, "2026-12-05 06:00:00.5+00"), "2026-12-05T06:00:00.500000Z");
    assert_eq!(h(TIMESTAMPTZ, -1, "1969-07-20 20:17:40.123456+00"), "1969-07-20T20:17:40.123456Z");
    assert_eq!(h(TIMESTAMPTZ, 3, "2026-12-05 08:00:00+00"), "2026-12-05T08:00:00.000Z");
    assert_eq!(h(INTERVAL, -1, "1 year 2 mons 3 days 04:05:06.789"), "37091106789000");
    assert_eq!(h(INTERVAL, -1, "1 mon"), "2629800000000");
    assert_eq!(h(INTERVAL, -1, "-1 days"), "-86400000000");
    assert_eq!(h(1007, -1, "{NULL,1}"), "[null,1]");
    assert_eq!(h(1009, -1, r#"{a,"b c","d\"e",NULL}"#), r#"["a","b c","d\"e",null]"#);
    assert_eq!(h(TEXT, -1, r#"ü "q" \ x"#), r#"ü "q" \ x"#);
    assert_eq!(h(JSONB, -1, r#"{"a": 1}"#), r#"{"a": 1}"#);
    assert_eq!(h(70_000, -1, "happy"), "happy");
}

#[test]
fn json_as_json_converter_writes_it() {
    assert_eq!(j(NUMERIC, scale(20, 8), "12.50000000"), r#""SoF8gA==""#);
    assert_eq!(j(FLOAT8, -1, "NaN"), r#""NaN""#);
    assert_eq!(j(FLOAT8, -1, "1e+20"), "1.0E20");
    assert_eq!(j(BYTEA, -1, r"\x00ff10"), r#""AP8Q""#);
    assert_eq!(j(1009, -1, r#"{a,NULL}"#), r#"["a",null]"#);
    assert_eq!(j(TEXT, -1, "ü\n"), "\"ü\\n\"");
}

#[test]
fn options_and_refusals() {
    let m = |decimal, binary| Mapping { decimal, binary, ..D };
    let t = |oid, typmod, text, mapping| header(&typed(oid, typmod, text, mapping).unwrap()).unwrap_or_default();
    assert_eq!(t(NUMERIC, scale(20, 8), "0.00000001", m(DecimalMode::String, BinaryMode::Bytes)), "0.00000001");
    assert_eq!(t(NUMERIC, -1, "10.50", m(DecimalMode::Double, BinaryMode::Bytes)), "10.5");
    assert_eq!(t(BYTEA, -1, r"\x5bff", m(DecimalMode::Precise, BinaryMode::Hex)), "5bff");
    assert_eq!(t(BYTEA, -1, r"\xfbff", m(DecimalMode::Precise, BinaryMode::Base64UrlSafe)), "-_8=");
    let micros = Mapping { time_precision: TimePrecision::AdaptiveTimeMicroseconds, ..D };
    assert_eq!(t(TIME, 3, "12:34:56.789", micros), "45296789000");
    // numeric's special values: null when precise (no header), Debezium's names as strings.
    assert_eq!(typed(NUMERIC, -1, "NaN", D).unwrap(), Typed::Null);
    assert_eq!(header(&Typed::Null), None);
    assert_eq!(j(NUMERIC, -1, "NaN"), "null");
    assert_eq!(t(NUMERIC, -1, "NaN", m(DecimalMode::String, BinaryMode::Bytes)), "NAN");
    assert_eq!(t(NUMERIC, -1, "NaN", m(DecimalMode::Double, BinaryMode::Bytes)), "NaN");
    assert!(refusal(600, D).is_some() && refusal(TEXT, D).is_none());
    assert!(refusal(DATE, Mapping { time_precision: TimePrecision::Connect, ..D }).is_some());
    assert!(refusal(INTERVAL, Mapping { interval: IntervalMode::String, ..D }).is_some());
    // Text that is not the type's is an error, never a panic.
    for oid in [INT4, FLOAT8, NUMERIC, MONEY, DATE, TIME, TIMETZ, TIMESTAMP, TIMESTAMPTZ, INTERVAL, 1007, BYTEA] {
        assert!(typed(oid, -1, "garbage", D).is_err(), "{oid}");
    }
}

#[test]
fn a_negative_declared_scale_keeps_the_value() {
    // numeric(5,-2) (PostgreSQL 15+): the scale is the low 11 bits, signed; 12300 stays 12300.
    let typmod = ((5 << 16) | (-2i32 & 0x7ff)) + 4;
    assert_eq!(declared_scale(typmod), -2);
    assert_eq!(declared_scale(scale(20, 8)), 8);
    assert_eq!(h(NUMERIC, typmod, "12300"), "12300");
}
