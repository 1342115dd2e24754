//! Sizes and durations as the command line writes them (`4G`, `512K`;
//! `10s`, `250ms`, `5m`), read and written back the same way so that a
//! default is written once, as a value, and shown in `--help` as text.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use pfs_shm_layout::rules::{SyntaxError, parse_duration};

/// A size that is not `N` or `N` with a K, M, G or T suffix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// A suffix other than K, M, G, T.
    #[error("unknown size suffix in {0:?}; use K, M, G or T")]
    Suffix(String),
    /// Not a number.
    #[error("{0:?} is not a size; use e.g. 4G, 512M, 1048576")]
    NotANumber(String),
    /// Does not fit 64 bits.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

const SUFFIXES: [(char, u32); 4] = [('T', 40), ('G', 30), ('M', 20), ('K', 10)];

/// Parses `4096`, `512K`, `100M`, `4G`, `1T` (powers of 1024).
///
/// ```
/// use pfs_agent::util::text::parse_size;
/// assert_eq!(parse_size("512K"), Ok(512 << 10));
/// assert!(parse_size("4X").is_err());
/// ```
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let up = c.to_ascii_uppercase();
            let Some((_, shift)) = SUFFIXES.iter().find(|(x, _)| *x == up) else {
                return Err(SizeError::Suffix(s.to_string()));
            };
            (&t[..i], *shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| SizeError::NotANumber(s.to_string()))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| SizeError::TooLarge(s.to_string()))
}

/// A byte size that reads as [`parse_size`] does and prints with the
/// largest suffix that divides it exactly (`4G`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, SizeError> {
        parse_size(s).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match SUFFIXES
            .iter()
            .find(|(_, shift)| self.0 != 0 && self.0.is_multiple_of(1 << shift))
        {
            Some((c, shift)) => write!(f, "{}{c}", self.0 >> shift),
            None => write!(f, "{}", self.0),
        }
    }
}

/// A duration that reads as [`parse_duration`] does and prints as whole
/// seconds (`10s`) or else milliseconds (`250ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = SyntaxError;
    fn from_str(s: &str) -> Result<Self, SyntaxError> {
        parse_duration(s).map(HumanDuration)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.subsec_nanos() == 0 {
            write!(f, "{}s", self.0.as_secs())
        } else {
            write!(f, "{}ms", self.0.as_millis())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512K").unwrap(), 512 << 10);
        assert_eq!(parse_size("4g").unwrap(), 4 << 30);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        assert_eq!(parse_size("4X"), Err(SizeError::Suffix("4X".into())));
        assert!(matches!(parse_size("G"), Err(SizeError::NotANumber(_))));
        assert!(matches!(
            parse_size("99999999999T"),
            Err(SizeError::TooLarge(_))
        ));
    }

    #[test]
    fn values_print_as_they_are_read() {
        for s in ["4G", "512K", "1T", "4097", "3M"] {
            assert_eq!(s.parse::<ByteSize>().unwrap().to_string(), s);
        }
        assert_eq!(ByteSize(0).to_string(), "0");
        for s in ["10s", "60s", "250ms", "0s"] {
            assert_eq!(s.parse::<HumanDuration>().unwrap().to_string(), s);
        }
        assert_eq!("5m".parse::<HumanDuration>().unwrap().to_string(), "300s");
    }
}
