//! The text syntax both sides accept for setup rules and durations, so
//! that `PFS_INSTRUMENT` (client) and `--instrument` (agent), or
//! `PFS_RECLAIM_AFTER` and `--dead-retention`, read the same way.
//!
//! Layer 2 (see the crate docs): depends only on [`crate::layout`]'s flag
//! bits.

use std::time::Duration;

use crate::layout::{FLAG_ENABLED, FLAG_TIMED};

/// Text that is not a rule list or a duration; the message says what is
/// expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyntaxError {
    /// A rule without `=`.
    #[error("{0:?} is not pattern=VALUE")]
    NotPatternValue(String),
    /// A rule whose value is not one of the accepted words.
    #[error("{rule:?}: unknown value {value:?}; use {expected}")]
    UnknownValue {
        /// The whole rule.
        rule: String,
        /// Its value.
        value: String,
        /// The accepted values, in words.
        expected: &'static str,
    },
    /// A consumer rule whose pattern names no consumer.
    #[error("{rule:?}: {pattern:?} matches no consumer; they are {names}")]
    NoSuchConsumer {
        /// The whole rule.
        rule: String,
        /// Its pattern.
        pattern: String,
        /// Every consumer name, comma-separated.
        names: String,
    },
    /// A duration whose number cannot be read (or is too large).
    #[error("{0:?} is not a duration; use e.g. 300s, 5m, 1.5h")]
    NotADuration(String),
    /// A duration with a unit other than `ms`, `s`, `m` (or `min`), `h`, `d`.
    #[error("unknown unit {unit:?} in {input:?}; use ms, s, m (or min), h or d")]
    UnknownUnit {
        /// The unit written.
        unit: String,
        /// The whole duration.
        input: String,
    },
}

/// Parses `pattern=VALUE` rules separated by `;` or `,`. Instrument values:
/// `ON`/`YES`/`TRUE`/`1` (enabled and timed), `COUNTED` (enabled, not
/// timed), `OFF`/`NO`/`FALSE`/`0` (disabled). Returns the pattern and the
/// `FLAG_*` bits.
pub fn parse_instrument_rules(s: &str) -> Result<Vec<(String, u32)>, SyntaxError> {
    parse_rules(s, "ON, OFF or COUNTED", |v| {
        match v.to_ascii_uppercase().as_str() {
            "ON" | "YES" | "TRUE" | "1" => Some(FLAG_ENABLED | FLAG_TIMED),
            "COUNTED" => Some(FLAG_ENABLED),
            "OFF" | "NO" | "FALSE" | "0" => Some(0),
            _ => None,
        }
    })
}

/// Parses consumer rules (`pattern=ON|OFF`).
pub fn parse_consumer_rules(s: &str) -> Result<Vec<(String, bool)>, SyntaxError> {
    parse_rules(s, "ON or OFF", |v| match v.to_ascii_uppercase().as_str() {
        "ON" | "YES" | "TRUE" | "1" => Some(true),
        "OFF" | "NO" | "FALSE" | "0" => Some(false),
        _ => None,
    })
}

fn parse_rules<T>(
    s: &str,
    expected: &'static str,
    value: impl Fn(&str) -> Option<T>,
) -> Result<Vec<(String, T)>, SyntaxError> {
    s.split([';', ','])
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|r| {
            let (p, v) = r
                .split_once('=')
                .filter(|(p, _)| !p.trim().is_empty())
                .ok_or_else(|| SyntaxError::NotPatternValue(r.to_string()))?;
            let v = value(v.trim()).ok_or_else(|| SyntaxError::UnknownValue {
                rule: r.to_string(),
                value: v.trim().to_string(),
                expected,
            })?;
            Ok((p.trim().to_string(), v))
        })
        .collect()
}

/// Parses a duration written as a number and a unit (`ms`, `s`, `m` or
/// `min` as `pfs-agent query` prints minutes, `h`; no unit means seconds;
/// spaces between them are allowed), e.g. `500ms`, `30s`, `5m`, `5 min`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(pfs_shm_layout::rules::parse_duration("5m"), Ok(Duration::from_secs(300)));
/// assert!(pfs_shm_layout::rules::parse_duration("5 parsecs").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, SyntaxError> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(SyntaxError::NotADuration(s.to_string()));
    }
    let (num, unit) = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let not_one = || SyntaxError::NotADuration(s.to_string());
    let unit = unit.trim_start();
    // Milliseconds per unit.
    let per: u64 = match unit {
        "ms" => 1,
        "s" | "" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(SyntaxError::UnknownUnit {
                unit: unit.to_string(),
                input: s.to_string(),
            });
        }
    };
    if num.contains('.') {
        // A decimal, as `pfs-agent query` prints durations (`5.00 min`).
        let n: f64 = num.parse().map_err(|_| not_one())?;
        Duration::try_from_secs_f64(n * per as f64 / 1_000.0).map_err(|_| not_one())
    } else {
        let n: u64 = num.parse().map_err(|_| not_one())?;
        n.checked_mul(per)
            .map(Duration::from_millis)
            .ok_or_else(not_one)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_and_their_errors() {
        assert_eq!(
            parse_instrument_rules("wait/%=OFF; stage/%=counted,statement/%=on").unwrap(),
            vec![
                ("wait/%".to_string(), 0),
                ("stage/%".to_string(), FLAG_ENABLED),
                ("statement/%".to_string(), FLAG_ENABLED | FLAG_TIMED),
            ]
        );
        assert_eq!(
            parse_consumer_rules("a=ON;b=no").unwrap(),
            vec![("a".to_string(), true), ("b".to_string(), false)]
        );
        assert_eq!(
            parse_instrument_rules("x").unwrap_err().to_string(),
            "\"x\" is not pattern=VALUE"
        );
        assert_eq!(
            parse_instrument_rules(" =OFF").unwrap_err().to_string(),
            "\"=OFF\" is not pattern=VALUE",
            "a rule without a pattern"
        );
        assert_eq!(
            parse_consumer_rules("a=COUNTED").unwrap_err().to_string(),
            "\"a=COUNTED\": unknown value \"COUNTED\"; use ON or OFF"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(
            parse_duration("-5s"),
            Err(SyntaxError::NotADuration("-5s".into()))
        );
        assert!(matches!(
            parse_duration("m"),
            Err(SyntaxError::NotADuration(_))
        ));
        assert_eq!(
            parse_duration("5 parsecs").unwrap_err().to_string(),
            "unknown unit \"parsecs\" in \"5 parsecs\"; use ms, s, m (or min), h or d"
        );
        // Decimals and days, as `pfs-agent query` prints them; too large
        // is an error, not a wrap.
        assert_eq!(
            parse_duration("5.00 min").unwrap(),
            Duration::from_secs(300)
        );
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        for bad in ["99999999999999999h", "1e9999h", "1.2.3s", "."] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        // Minutes as `pfs-agent query` prints them.
        assert_eq!(parse_duration("5min").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("5 min").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("2 s").unwrap(), Duration::from_secs(2));
    }
}
