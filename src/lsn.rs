//! `Lsn`: a position in PostgreSQL's write-ahead log.
//!
//! An LSN is a 64-bit byte offset into the WAL, written by PostgreSQL as two hex halves `X/Y`
//! (`pg_lsn`). Ordering is plain integer ordering. `Lsn::ZERO` (`0/0`) means "no position"; the
//! server reads it in `START_REPLICATION` as "start at the slot's confirmed position".

use std::fmt;
use std::str::FromStr;

/// A WAL position. Ordered, copyable, printed as PostgreSQL prints `pg_lsn`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);

    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// The text `X/Y` is not a valid `pg_lsn`.
#[derive(Debug, thiserror::Error)]
#[error("invalid LSN {0:?}: expected two hex numbers like 16/B374D848")]
pub struct ParseLsnError(String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_owned());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn(((hi as u64) << 32) | lo as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        for s in ["0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF", "0/1"] {
            assert_eq!(s.parse::<Lsn>().unwrap().to_string(), s);
        }
        assert_eq!("1/0".parse::<Lsn>().unwrap(), Lsn(1 << 32));
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "0", "x/1", "1/", "/1", "1/2/3", "100000000/0"] {
            assert!(s.parse::<Lsn>().is_err(), "{s} should not parse");
        }
    }
}
