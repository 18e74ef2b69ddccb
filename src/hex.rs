//! Lower-case hex text of bytes, for digests (chunk ids, webhook signatures) and trace and span
//! ids. One writer, so every place spells them the same way.

use std::fmt::Write as _;

/// `bytes` as lower-case hex, two digits per byte.
pub fn lower(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_lower_case_digits_per_byte() {
        assert_eq!(super::lower(&[0x00, 0x0f, 0xab, 0xff]), "000fabff");
        assert_eq!(super::lower(&[]), "");
    }
}
