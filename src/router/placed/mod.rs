//! Placed columns (`--table-fields-additional-placement`) as Debezium 3.6.1 writes them: the
//! value Debezium's PostgreSQL connector makes of the column ([`Typed`], its Connect value under
//! the connector's mapping options, [`Mapping`]), then that value as Connect's default
//! `SimpleHeaderConverter` writes a header (`Values.convertToString`, [`header`]) and as
//! JsonConverter (`schemas.enable=false`) writes an envelope field ([`json`]).
//!
//! # Invariants
//! * The type decides the Connect value (with the column's declared precision or scale from its
//!   type modifier, and the mapping options); the row decides nothing but the value.
//! * A type whose Debezium value outboxd does not write is refused when the route is compiled
//!   ([`refusal`]), naming the column and what makes both agree; every other value is typed here
//!   or is an `Err` (a `bad_value` event), never a panic.
//! * Types outside the table in [`typed`] (extension types, enums, the network and text search
//!   types) are Debezium strings: their PostgreSQL text.

pub(crate) mod java;
mod pgtext;
mod write;

use num_bigint::BigInt;

pub use write::{header, json};

/// The connector options that change how Debezium types a column (drop-in mode reads them from
/// the connector; the defaults are Debezium's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    pub time_precision: TimePrecision,
    pub decimal: DecimalMode,
    pub binary: BinaryMode,
    pub interval: IntervalMode,
}

/// `time.precision.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TimePrecision {
    /// `time`/`timestamp` up to 3 fraction digits as milliseconds, else microseconds.
    #[default]
    Adaptive,
    /// As adaptive, but every `time` as microseconds.
    #[value(name = "adaptive_time_microseconds")]
    AdaptiveTimeMicroseconds,
    /// Connect's own Date/Time/Timestamp logical types (outboxd refuses placed temporal columns).
    Connect,
    /// ISO 8601 strings (outboxd refuses placed temporal columns).
    Isostring,
}

/// `decimal.handling.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DecimalMode {
    /// Connect's Decimal (declared scale) or Debezium's variable-scale struct.
    #[default]
    Precise,
    /// A double.
    Double,
    /// A string.
    String,
}

/// `binary.handling.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BinaryMode {
    /// Bytes (Base64 in a header and in JSON).
    #[default]
    Bytes,
    /// A Base64 string.
    Base64,
    /// A URL-safe Base64 string.
    #[value(name = "base64-url-safe")]
    Base64UrlSafe,
    /// A hex string.
    Hex,
}

/// `interval.handling.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IntervalMode {
    /// Microseconds (a month is 30.4375 days).
    #[default]
    Numeric,
    /// ISO 8601 (outboxd refuses placed interval columns).
    String,
}

/// A column's value as Debezium's connector carries it in Connect.
#[derive(Clone, Debug, PartialEq)]
pub enum Typed {
    /// INT16/INT32/INT64, and the logical types carried as them (Date, MicroTimestamp, ...).
    Int(i64),
    Float64(f64),
    Float32(f32),
    /// Connect's Decimal logical type: the unscaled value and the declared scale.
    Decimal(BigInt, i32),
    /// Debezium's VariableScaleDecimal struct `{scale, value}` (a `numeric` without a scale).
    VariableDecimal(BigInt, i32),
    Str(String),
    Bool(bool),
    Bytes(Vec<u8>),
    Array(Vec<Option<Typed>>),
    /// No value: a `numeric` `NaN` or infinity under `decimal.handling.mode=precise`, which
    /// Debezium carries as null (outboxd then writes no header, as for a NULL column).
    Null,
}

pub mod oids {
    pub const MONEY: u32 = 790;
    pub const DATE: u32 = 1082;
    pub const TIME: u32 = 1083;
    pub const TIMETZ: u32 = 1266;
    pub const INTERVAL: u32 = 1186;
    /// The geometric types, which Debezium writes as structs outboxd does not reproduce.
    pub const GEOMETRIC: [(u32, &str); 7] =
        [(600, "point"), (601, "lseg"), (602, "path"), (603, "box"), (604, "polygon"), (628, "line"), (718, "circle")];
    /// Array types and their element types.
    pub const ARRAYS: [(u32, u32); 27] = [
        (1000, 16),
        (1001, 17),
        (1005, 21),
        (1007, 23),
        (1016, 20),
        (1009, 25),
        (1015, 1043),
        (1014, 1042),
        (1021, 700),
        (1022, 701),
        (1231, 1700),
        (791, MONEY),
        (2951, 2950),
        (199, 114),
        (3807, 3802),
        (1182, DATE),
        (1183, TIME),
        (1270, TIMETZ),
        (1115, 1114),
        (1185, 1184),
        (1187, INTERVAL),
        (1041, 869),
        (651, 650),
        (1040, 829),
        (1028, 26),
        (1002, 18),
        (1003, 19),
    ];
}

use super::oid::{BOOL, BYTEA, FLOAT4, FLOAT8, INT2, INT4, INT8, NUMERIC, OID, TIMESTAMP, TIMESTAMPTZ};
use oids::*;

/// The element type of an array type this module places, if `type_oid` is one.
pub fn element(type_oid: u32) -> Option<u32> {
    ARRAYS.iter().find(|(a, _)| *a == type_oid).map(|(_, e)| *e)
}

/// Declared fraction digits of a `time`, `timetz`, `timestamp` or `timestamptz` (6 when none).
fn precision(typmod: i32) -> i32 {
    if typmod < 0 {
        6
    } else {
        typmod
    }
}

/// Why a placed column of this type cannot be written as Debezium writes it under `mapping`,
/// naming what makes both agree; `None` when it can.
pub fn refusal(type_oid: u32, mapping: Mapping) -> Option<String> {
    let t = element(type_oid).unwrap_or(type_oid);
    if let Some((_, name)) = GEOMETRIC.iter().find(|(o, _)| *o == t) {
        return Some(format!(
            "is a {name}, which Debezium writes as a geometry struct outboxd does not reproduce; place another column"
        ));
    }
    let temporal = matches!(t, DATE | TIME | TIMETZ | TIMESTAMP | TIMESTAMPTZ);
    if temporal && matches!(mapping.time_precision, TimePrecision::Connect | TimePrecision::Isostring) {
        return Some("is a date/time type, and outboxd does not write Debezium's time.precision.mode=connect or isostring values; use time.precision.mode=adaptive (the default) or adaptive_time_microseconds".into());
    }
    if t == INTERVAL && mapping.interval == IntervalMode::String {
        return Some("is an interval, and outboxd does not write Debezium's interval.handling.mode=string values; use interval.handling.mode=numeric (the default)".into());
    }
    if element(type_oid).is_some() && matches!(t, NUMERIC | MONEY) && mapping.decimal == DecimalMode::Precise {
        return Some("is an array of numeric or money, whose Debezium value (a list of decimals) outboxd does not reproduce; use decimal.handling.mode=string or double".into());
    }
    None
}

/// The Connect value Debezium makes of a column of `type_oid` (`typmod` its type modifier)
/// whose PostgreSQL text is `text`.
pub fn typed(type_oid: u32, typmod: i32, text: &str, m: Mapping) -> Result<Typed, String> {
    let int = |v: &str| v.parse::<i64>().map(Typed::Int).map_err(|_| format!("cannot read integer value {v:?}"));
    let decimal = |u: BigInt, s: i32| match m.decimal {
        DecimalMode::Precise => Typed::Decimal(u, s),
        DecimalMode::Double => Typed::Float64(java::big_decimal(&u, s).parse().unwrap_or(f64::NAN)),
        // Debezium's string mode is `toPlainString()`: never an exponent.
        DecimalMode::String => Typed::Str(java::plain_decimal(&u, s)),
    };
    Ok(match type_oid {
        BOOL => Typed::Bool(text == "t"),
        INT2 | INT4 | INT8 | OID => int(text)?,
        FLOAT4 => Typed::Float32(float(text)? as f32),
        FLOAT8 => Typed::Float64(float(text)?),
        NUMERIC => match pgtext::numeric(text)? {
            // Debezium's special values: null when precise (its decimals have none), the Java
            // constants' names as strings (`NAN`, tested), the double itself.
            None => match m.decimal {
                DecimalMode::Precise => Typed::Null,
                DecimalMode::Double => Typed::Float64(float(text)?),
                DecimalMode::String => Typed::Str(match text {
                    "NaN" => "NAN".into(),
                    "Infinity" => "POSITIVE_INFINITY".into(),
                    _ => "NEGATIVE_INFINITY".into(),
                }),
            },
            Some((u, s)) if typmod < 0 => match m.decimal {
                DecimalMode::Precise => {
                    let (u, s) = pgtext::strip(u, s);
                    Typed::VariableDecimal(u, s)
                }
                _ => decimal(u, s),
            },
            Some((u, s)) => match declared_scale(typmod) {
                // PostgreSQL 15's numeric(p,-s) rounds to tens, hundreds...: its text has no
                // fraction, and is written at its own scale 0 (Debezium not compared here).
                scale if scale < 0 => decimal(u, s),
                scale => decimal(pgtext::rescale(u, s, scale), scale),
            },
        },
        MONEY => {
            let (u, s) = pgtext::money(text)?;
            decimal(u, s)
        }
        BYTEA => {
            let raw = super::render::bytea(text.as_bytes())?;
            use base64::Engine as _;
            match m.binary {
                BinaryMode::Bytes => Typed::Bytes(raw.to_vec()),
                BinaryMode::Base64 => Typed::Str(base64::engine::general_purpose::STANDARD.encode(&raw)),
                BinaryMode::Base64UrlSafe => Typed::Str(base64::engine::general_purpose::URL_SAFE.encode(&raw)),
                BinaryMode::Hex => Typed::Str(crate::hex::lower(&raw)),
            }
        }
        DATE => Typed::Int(pgtext::date(text)?),
        TIME => {
            let us = pgtext::time(text)?;
            let millis = precision(typmod) <= 3 && m.time_precision == TimePrecision::Adaptive;
            Typed::Int(if millis { us / 1000 } else { us })
        }
        TIMESTAMP => {
            let us = pgtext::timestamp(text, false)?;
            Typed::Int(if precision(typmod) <= 3 { us.div_euclid(1000) } else { us })
        }
        TIMETZ => Typed::Str(zoned_time(pgtext::timetz(text)?)),
        TIMESTAMPTZ => Typed::Str(zoned_timestamp(pgtext::timestamp(text, true)?, precision(typmod))?),
        INTERVAL => {
            let (months, days, us) = pgtext::interval(text)?;
            // Debezium's MicroDuration: a month is 365.25 / 12 = 30.4375 days.
            let total = i128::from(months) * 2_629_800_000_000 + i128::from(days) * 86_400_000_000 + i128::from(us);
            Typed::Int(i64::try_from(total).map_err(|_| format!("interval {text:?} is out of range"))?)
        }
        _ => match element(type_oid) {
            Some(e) => Typed::Array(
                pgtext::array(text)?
                    .into_iter()
                    .map(|v| v.map(|v| typed(e, typmod, &v, m)).transpose())
                    .collect::<Result<_, _>>()?,
            ),
            None => Typed::Str(text.to_owned()),
        },
    })
}

/// A `real` or `double precision` text (`1e+20`, `-Infinity`, `NaN`).
fn float(text: &str) -> Result<f64, String> {
    match text {
        "NaN" => Ok(f64::NAN),
        "Infinity" => Ok(f64::INFINITY),
        "-Infinity" => Ok(f64::NEG_INFINITY),
        _ => text.parse().map_err(|_| format!("cannot read floating-point value {text:?}")),
    }
}

/// Debezium's ZonedTime: `HH:mm:ss`, the fraction as needed, `Z`.
fn zoned_time(us: i64) -> String {
    let (secs, frac) = (us / 1_000_000, us % 1_000_000);
    let mut out = format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    if frac != 0 {
        out.push_str(format!(".{frac:06}").trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// A `numeric(p,s)` column's declared scale from its type modifier: the low 11 bits of
/// `typmod - 4`, signed (PostgreSQL 15 allows scales from -1000 to 1000).
fn declared_scale(typmod: i32) -> i32 {
    (((typmod - 4) & 0x7ff) ^ 0x400) - 0x400
}

/// Debezium's ZonedTimestamp: `yyyy-MM-ddTHH:mm:ss`, the fraction to the column's precision, `Z`.
fn zoned_timestamp(us: i64, precision: i32) -> Result<String, String> {
    let ts = jiff::Timestamp::from_microsecond(us).map_err(|e| format!("timestamptz out of range ({e})"))?;
    let dt = jiff::tz::Offset::UTC.to_datetime(ts);
    // java.time's ISO year: four digits, a sign below year 0 (1 BC is year 0, 44 BC is -0043).
    let sign = if dt.year() < 0 { "-" } else { "" };
    let mut out = format!("{sign}{:04}-{}", dt.year().unsigned_abs(), dt.strftime("%m-%dT%H:%M:%S"));
    if precision > 0 {
        let frac = format!("{:06}", us.rem_euclid(1_000_000));
        out.push('.');
        out.push_str(&frac[..precision.clamp(1, 6) as usize]);
    }
    out.push('Z');
    Ok(out)
}

#[cfg(test)]
mod tests;
