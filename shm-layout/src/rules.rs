//! The text syntax both sides accept for setup rules and durations, so
//! that `PFS_INSTRUMENT` (client) and `--instrument` (agent), or
//! `PFS_RECLAIM_AFTER` and `--dead-retention`, read the same way.
//!
//! Layer 2 (see the crate docs): depends only on [`crate::layout`]'s flag
//! bits.

use std::time::Duration;

use crate::kinds::ClassKind;
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
    /// An instrument rule whose pattern matches no instrument name (see
    /// [`may_name_an_instrument`]).
    #[error(
        "{rule:?}: {pattern:?} matches no instrument name; names are case-sensitive and start with wait/, stage/, statement/ or memory/, or are idle or idle/... (e.g. wait/synch/mutex/%=OFF)"
    )]
    NoSuchInstrument {
        /// The whole rule.
        rule: String,
        /// Its pattern.
        pattern: String,
    },
    /// An actor rule whose key is not `USER@HOST` or `USER@HOST/ROLE`
    /// with each part 1 to [`crate::layout::ACTOR_FIELD_BYTES`] bytes.
    #[error(
        "{0:?}: an actor is USER@HOST or USER@HOST/ROLE (each a name or %, 1 to 32 bytes), e.g. batch@%=OFF"
    )]
    BadActor(String),
    /// More distinct actor rows than `setup_actors` holds beside its
    /// default `%`/`%`/`%` row ([`actor_rows_added`]).
    #[error("{given} setup_actors rows given, besides the default %@% row; at most {max} fit")]
    TooManyActors {
        /// Distinct rows given.
        given: usize,
        /// The most that fit ([`ACTOR_ROWS_MAX_ADDED`]).
        max: usize,
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
    let rules = parse_rules(s, "ON, OFF or COUNTED", |v| {
        match v.to_ascii_uppercase().as_str() {
            "ON" | "YES" | "TRUE" | "1" => Some(FLAG_ENABLED | FLAG_TIMED),
            "COUNTED" => Some(FLAG_ENABLED),
            "OFF" | "NO" | "FALSE" | "0" => Some(0),
            _ => None,
        }
    })?;
    // A typo in the family (`statements/%`, `Wait/%`) would otherwise
    // change nothing, silently.
    if let Some((pattern, _)) = rules.iter().find(|(p, _)| !may_name_an_instrument(p)) {
        let rule = s
            .split([';', ','])
            .map(str::trim)
            .find(|r| r.split_once('=').is_some_and(|(p, _)| p.trim() == pattern))
            .unwrap_or(pattern)
            .to_string();
        return Err(SyntaxError::NoSuchInstrument {
            rule,
            pattern: pattern.clone(),
        });
    }
    Ok(rules)
}

/// Whether the `LIKE` pattern `pattern` can match an instrument name, as
/// far as its family tells: the text before its first wildcard (`%`, `_`)
/// must begin a name of some family (`wait/`, `stage/`, `statement/`,
/// `memory/`, `idle`), or begin with one; a pattern without wildcards must
/// be an instrument name itself. (Past the family, any name is an
/// instrument's: `wait/synch/mutx/%` is a wait of another kind, not an
/// error.)
///
/// ```
/// use pfs_shm_layout::rules::may_name_an_instrument;
/// assert!(may_name_an_instrument("wait/io/file/%"));
/// assert!(may_name_an_instrument("%"));
/// assert!(may_name_an_instrument("st%"));
/// assert!(may_name_an_instrument("idle"));
/// assert!(may_name_an_instrument("statement/http/GET /health"));
/// assert!(!may_name_an_instrument("statements/%"));
/// assert!(!may_name_an_instrument("Wait/%"));
/// assert!(!may_name_an_instrument("wait/"));
/// ```
pub fn may_name_an_instrument(pattern: &str) -> bool {
    const FAMILIES: [&str; 5] = ["wait/", "stage/", "statement/", "memory/", "idle"];
    let mut literal = String::new();
    let mut chars = pattern.chars();
    let mut wildcard = false;
    while let Some(c) = chars.next() {
        match c {
            '%' | '_' => {
                wildcard = true;
                break;
            }
            '\\' => literal.extend(chars.next()),
            c => literal.push(c),
        }
    }
    if !wildcard {
        return ClassKind::from_name(&literal).is_some();
    }
    FAMILIES
        .iter()
        .any(|f| literal.starts_with(f) || f.starts_with(literal.as_str()))
}

/// Parses consumer rules (`pattern=ON|OFF`).
pub fn parse_consumer_rules(s: &str) -> Result<Vec<(String, bool)>, SyntaxError> {
    parse_rules(s, "ON or OFF", |v| match v.to_ascii_uppercase().as_str() {
        "ON" | "YES" | "TRUE" | "1" => Some(true),
        "OFF" | "NO" | "FALSE" | "0" => Some(false),
        _ => None,
    })
}

/// One `setup_actors` row a process starts with (`PFS_ACTORS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorRule {
    /// `HOST`: a name, or `%` for any (as MySQL's column: not a pattern).
    pub host: String,
    /// `USER`.
    pub user: String,
    /// `ROLE` (`%` when not given).
    pub role: String,
    /// `ENABLED`.
    pub enabled: bool,
    /// `HISTORY`.
    pub history: bool,
}

/// Parses `setup_actors` rows, `USER@HOST[/ROLE]=VALUE` separated by `;`
/// or `,`. Values: `ON`/`YES` (ENABLED and HISTORY), `NO_HISTORY`
/// (ENABLED, no HISTORY), `OFF`/`NO` (neither). Each of user, host and
/// role is a name or `%` (any), as in MySQL's table; the host is after
/// the last `@` and ends at the first `/` (no `/` in a role), the role is
/// `%` when not given.
///
/// ```
/// use pfs_shm_layout::rules::parse_actor_rules;
/// let rules = parse_actor_rules("batch@%=OFF; %@db-1/admin=NO_HISTORY").unwrap();
/// assert_eq!((rules[0].user.as_str(), rules[0].host.as_str(), rules[0].role.as_str()), ("batch", "%", "%"));
/// assert_eq!((rules[0].enabled, rules[0].history), (false, false));
/// assert_eq!((rules[1].host.as_str(), rules[1].role.as_str(), rules[1].enabled, rules[1].history), ("db-1", "admin", true, false));
/// assert!(parse_actor_rules("batch=OFF").is_err());
/// assert!(parse_actor_rules("u@10.0.0.0/8/x=OFF").is_err());
/// ```
pub fn parse_actor_rules(s: &str) -> Result<Vec<ActorRule>, SyntaxError> {
    let rules = parse_rules(s, "ON, OFF or NO_HISTORY", |v| {
        match v.to_ascii_uppercase().as_str() {
            "ON" | "YES" | "TRUE" | "1" => Some((true, true)),
            "NO_HISTORY" => Some((true, false)),
            "OFF" | "NO" | "FALSE" | "0" => Some((false, false)),
            _ => None,
        }
    })?;
    let field = |f: &str| !f.is_empty() && f.len() <= crate::layout::ACTOR_FIELD_BYTES;
    rules
        .into_iter()
        .map(|(key, (enabled, history))| {
            let (user, rest) = key
                .rsplit_once('@')
                .ok_or_else(|| SyntaxError::BadActor(key.clone()))?;
            let (host, role) = rest.split_once('/').unwrap_or((rest, "%"));
            let (user, host, role) = (user.trim(), host.trim(), role.trim());
            if ![user, host, role].into_iter().all(field) || role.contains('/') {
                return Err(SyntaxError::BadActor(key.clone()));
            }
            Ok(ActorRule {
                host: host.to_string(),
                user: user.to_string(),
                role: role.to_string(),
                enabled,
                history,
            })
        })
        .collect()
}

/// The `setup_actors` rows a segment can hold beside its default
/// `%`/`%`/`%` row, which is always there.
pub const ACTOR_ROWS_MAX_ADDED: usize = crate::layout::MAX_ACTORS - 1;

/// The rows `rules` add to `setup_actors`: distinct (host, user, role)
/// keys other than the default row's (a later rule for the same key
/// changes that row, it takes no other).
///
/// ```
/// use pfs_shm_layout::rules::{actor_rows_added, parse_actor_rules};
/// let rules = parse_actor_rules("a@%=OFF; a@%=ON; %@%=NO_HISTORY; b@h/r=ON").unwrap();
/// assert_eq!(actor_rows_added(&rules), 2);
/// ```
pub fn actor_rows_added(rules: &[ActorRule]) -> usize {
    let mut keys: Vec<(&str, &str, &str)> = rules
        .iter()
        .map(|a| (a.host.as_str(), a.user.as_str(), a.role.as_str()))
        .filter(|k| *k != ("%", "%", "%"))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys.len()
}

/// [`SyntaxError::TooManyActors`] if `rules` add more rows than
/// `setup_actors` holds.
pub fn check_actor_rows(rules: &[ActorRule]) -> Result<(), SyntaxError> {
    match actor_rows_added(rules) {
        given if given > ACTOR_ROWS_MAX_ADDED => Err(SyntaxError::TooManyActors {
            given,
            max: ACTOR_ROWS_MAX_ADDED,
        }),
        _ => Ok(()),
    }
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
            parse_instrument_rules("wait/%=OFF; statements/%=OFF").unwrap_err(),
            SyntaxError::NoSuchInstrument {
                rule: "statements/%=OFF".into(),
                pattern: "statements/%".into()
            },
            "a typo in the family changes nothing: refused"
        );
        assert!(
            parse_instrument_rules("idle=OFF,wait/synch/%=counted,%=ON").is_ok(),
            "every family, and every name"
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
