//! Java's spellings of numbers, which Connect writes through `toString()`: `Double.toString`,
//! `Float.toString` and `BigDecimal.toString`. Pure; nothing here panics.
//!
//! The digits are Rust's shortest round-trip digits, which are Java's for every value the
//! tests compare (JDK 17's `Double.toString` gives a longer spelling for a few rare values; the
//! corpus in tests/debezium_types.rs checks ours against Debezium's).

use num_bigint::BigInt;

/// `Double.toString(v)`: `1.0`, `0.001`, `1.0E7`, `1.0E-5`, `-0.0`, `NaN`, `-Infinity`.
pub fn double(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    spell(v == 0.0, v.is_sign_negative(), &format!("{:e}", v.abs()), (1e-3..1e7).contains(&v.abs()))
}

/// `Float.toString(v)`, the same rules over a float's shortest digits.
pub fn float(v: f32) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    spell(v == 0.0, v.is_sign_negative(), &format!("{:e}", v.abs()), (1e-3..1e7).contains(&v.abs()))
}

/// Java's layout of shortest digits `sci` (`1.2345e8`): plain for magnitudes in [1e-3, 1e7)
/// with at least one digit after the point, else `d.dddEn`.
fn spell(zero: bool, negative: bool, sci: &str, plain: bool) -> String {
    let sign = if negative { "-" } else { "" };
    if zero {
        return format!("{sign}0.0");
    }
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if plain {
        let point = exp + 1;
        let (int, frac) = if point <= 0 {
            ("0".to_owned(), format!("{}{digits}", "0".repeat(point.unsigned_abs() as usize)))
        } else if point as usize >= digits.len() {
            (format!("{digits}{}", "0".repeat(point as usize - digits.len())), String::new())
        } else {
            (digits[..point as usize].to_owned(), digits[point as usize..].to_owned())
        };
        format!("{sign}{int}.{}", if frac.is_empty() { "0" } else { &frac })
    } else {
        let rest = if digits.len() > 1 { &digits[1..] } else { "0" };
        format!("{sign}{}.{rest}E{exp}", &digits[..1])
    }
}

/// `new BigDecimal(unscaled, scale).toString()`: plain when the scale is 0, or positive with an
/// adjusted exponent of at least -6 (`12.50000000`, `0.000001`); otherwise scientific with an
/// explicit exponent sign (`0E-8`, `1E-8`, `1.5E+3`).
pub fn big_decimal(unscaled: &BigInt, scale: i32) -> String {
    let text = unscaled.to_string();
    let (sign, digits) = match text.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", text.as_str()),
    };
    if scale == 0 {
        return text;
    }
    let adjusted = digits.len() as i64 - 1 - i64::from(scale);
    if scale > 0 && adjusted >= -6 {
        let scale = scale as usize;
        return if digits.len() > scale {
            format!("{sign}{}.{}", &digits[..digits.len() - scale], &digits[digits.len() - scale..])
        } else {
            format!("{sign}0.{}{digits}", "0".repeat(scale - digits.len()))
        };
    }
    let rest = if digits.len() > 1 { format!(".{}", &digits[1..]) } else { String::new() };
    let exp_sign = if adjusted >= 0 { "+" } else { "" };
    format!("{sign}{}{rest}E{exp_sign}{adjusted}", &digits[..1])
}

/// `new BigDecimal(unscaled, scale).toPlainString()`: never an exponent (`0.00000000`, `1500`).
pub fn plain_decimal(unscaled: &BigInt, scale: i32) -> String {
    let text = unscaled.to_string();
    let (sign, digits) = match text.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", text.as_str()),
    };
    if scale <= 0 {
        return format!("{text}{}", "0".repeat(scale.unsigned_abs() as usize));
    }
    let scale = scale as usize;
    if digits.len() > scale {
        format!("{sign}{}.{}", &digits[..digits.len() - scale], &digits[digits.len() - scale..])
    } else {
        format!("{sign}0.{}{digits}", "0".repeat(scale - digits.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each spelling as Debezium 3.6.1 on JDK 17 wrote it in tests/debezium_types.rs.
    #[test]
    fn as_java_spells_them() {
        for (v, s) in [
            (1.0, "1.0"),
            (1e20, "1.0E20"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (123456789.125, "1.23456789125E8"),
            (1e-7, "1.0E-7"),
            (1e7, "1.0E7"),
            (0.001, "0.001"),
            (9999999.0, "9999999.0"),
            (f64::NEG_INFINITY, "-Infinity"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(double(v), s, "{v}");
        }
        assert_eq!(float(3.14), "3.14");
        assert_eq!(float(1e-5), "1.0E-5");
        assert_eq!(float(123456.7), "123456.7");
        assert_eq!(float(1e20), "1.0E20");
        let d = |u: i64, s: i32| big_decimal(&BigInt::from(u), s);
        assert_eq!(d(0, 8), "0E-8");
        assert_eq!(d(1, 8), "1E-8");
        assert_eq!(d(1250000000, 8), "12.50000000");
        assert_eq!(d(-300000000, 8), "-3.00000000");
        assert_eq!(d(123, 8), "0.00000123");
        assert_eq!(d(-7, 0), "-7");
        assert_eq!(d(15, -2), "1.5E+3");
        assert_eq!(d(-1234, 2), "-12.34");
        let p = |u: i64, s: i32| plain_decimal(&BigInt::from(u), s);
        assert_eq!(
            (p(0, 8), p(1, 20), p(-1000, 3), p(15, -2)),
            ("0.00000000".into(), format!("0.{}1", "0".repeat(19)), "-1.000".into(), "1500".into())
        );
    }
}
