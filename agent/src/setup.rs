//! Layer 2: changing setup inside segments, shared by the HTTP control
//! API, `pfs-agent setup` and the defaults given on the agent's command
//! line. A change opens the matching segments read-write (`O_NOFOLLOW`)
//! and changes the setup words in place; writers see it at their next
//! event.

use std::path::{Path, PathBuf};

use pfs_shm_layout::layout::TimerId;
use pfs_shm_layout::rules::{
    ActorRule, SyntaxError, check_actor_rows, parse_actor_rules, parse_consumer_rules,
    parse_instrument_rules,
};
use pfs_shm_layout::setup::ActorsFull;
use pfs_shm_layout::{EventKind, Segment, SegmentError, setup};
use serde::Deserialize;

use crate::filter::Filter;
use crate::util::fs::open_rw_nofollow;

/// One change, as the API's JSON bodies spell it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstrumentChange {
    /// SQL `LIKE` pattern over instrument names (`wait/synch/%`).
    pub name: String,
    /// New `ENABLED`, if given.
    pub enabled: Option<bool>,
    /// New `TIMED`, if given.
    pub timed: Option<bool>,
}

/// A `setup_consumers` change.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerChange {
    /// `LIKE` pattern over consumer names (`events_waits_%`).
    pub name: String,
    /// New `ENABLED`.
    pub enabled: bool,
}

/// A `setup_timers` change.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimerChange {
    /// `wait`, `stage`, `statement`, or a `LIKE` pattern over them.
    pub name: String,
    /// `CYCLE`, `NANOSECOND`, `MICROSECOND`, `MILLISECOND` or `TICK`.
    pub timer_name: String,
}

/// A `setup_actors` change (insert, update or delete one row).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActorChange {
    /// `HOST` (`%` = any).
    pub host: String,
    /// `USER` (`%` = any).
    pub user: String,
    /// `ROLE` (`%` = any).
    #[serde(default = "percent")]
    pub role: String,
    /// `ENABLED` (default yes).
    pub enabled: Option<bool>,
    /// `HISTORY` (default yes).
    pub history: Option<bool>,
    /// Delete the row instead.
    #[serde(default)]
    pub delete: bool,
}

fn percent() -> String {
    "%".into()
}

/// Any setup change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `setup_instruments`.
    Instruments(InstrumentChange),
    /// `setup_consumers`.
    Consumers(ConsumerChange),
    /// `setup_timers`.
    Timers(TimerChange),
    /// `setup_actors`.
    Actors(ActorChange),
}

/// What a change did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Rows matched, summed over segments.
    pub matched: usize,
    /// Segments changed.
    pub segments: usize,
    /// Segments that could not be opened for writing, with the reason.
    pub errors: Vec<OpenError>,
    /// Segments left out by the `service`/`pid` filter, by service (pid).
    pub filtered_out: Vec<(String, u32)>,
    /// Segments whose `setup_actors` table had no room for a new row.
    pub full: usize,
}

impl Outcome {
    /// A warning for a change that matched no instrument in segments it
    /// could reach: easy to take for a change that worked. `None` when
    /// something matched (or no segment was reached: the errors say why).
    ///
    /// ```
    /// use pfs_agent::setup::{Change, InstrumentChange, Outcome};
    ///
    /// let change = Change::Instruments(InstrumentChange {
    ///     name: "wait/io/file/%".into(),
    ///     enabled: Some(false),
    ///     timed: None,
    /// });
    /// let none = Outcome { matched: 0, segments: 1, ..Outcome::default() };
    /// assert!(none.nothing_matched(&change).unwrap().contains("PFS_INSTRUMENT"));
    /// let some = Outcome { matched: 3, segments: 1, ..Outcome::default() };
    /// assert!(some.nothing_matched(&change).is_none());
    /// ```
    pub fn nothing_matched(&self, change: &Change) -> Option<String> {
        if self.matched > 0 {
            return None;
        }
        if self.segments == 0 {
            // Segments were there, the filter left them all out.
            return (!self.filtered_out.is_empty()).then(|| {
                let mut live: Vec<String> = self
                    .filtered_out
                    .iter()
                    .map(|(svc, pid)| format!("{svc} (pid {pid})"))
                    .collect();
                live.sort();
                live.truncate(10);
                format!(
                    "no live segment matches the service/pid filter: nothing changed; live: {}",
                    live.join(", ")
                )
            });
        }
        if self.full > 0 {
            return Some(format!(
                "{} in {} segment(s): nothing changed",
                pfs_shm_layout::setup::ActorsFull,
                self.full
            ));
        }
        Some(match change {
            Change::Instruments(c) => format!(
                "no instrument matched {:?}: nothing changed. Instruments registered later \
                 take the defaults: set those with `pfs-agent serve --instrument '{}=...'` \
                 or PFS_INSTRUMENT in the application's environment",
                c.name, c.name
            ),
            Change::Consumers(c) => format!(
                "no consumer matched {:?}: nothing changed (`pfs-agent query setup_consumers` or GET /api/v1/tables/setup_consumers lists them)",
                c.name
            ),
            Change::Timers(_) | Change::Actors(_) => {
                "the change matched no row: nothing changed".to_string()
            }
        })
    }
}

/// A change that cannot be applied, found before touching any segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidChange {
    /// A timer name PFS does not have.
    #[error("unknown timer_name {0:?}; use CYCLE, NANOSECOND, MICROSECOND, MILLISECOND or TICK")]
    Timer(String),
    /// An instrument change that changes nothing.
    #[error(
        "nothing to change: give \"enabled\" and/or \"timed\" (--enabled and/or --timed on the command line)"
    )]
    Nothing,
    /// An empty instrument or consumer name, which matches nothing.
    #[error("the name is empty; give a name or a LIKE pattern (\"%\" for all)")]
    EmptyName,
    /// An actor column outside 1..=32 bytes.
    #[error(
        "host, user and role must be 1 to {} bytes (\"%\" matches any)",
        pfs_shm_layout::layout::ACTOR_FIELD_BYTES
    )]
    ActorLength,
    /// An actor row deleted and given values in one change.
    #[error(
        "delete removes the row: give either delete or enabled/history, not both (--delete, or --enabled/--history, on the command line)"
    )]
    DeleteWithValues,
    /// A `setup_timers` name that matches no event kind: it would change
    /// nothing.
    #[error(
        "setup_timers has no event kind {name:?}{hint}; the name is one of wait, stage, statement, or a LIKE pattern over them (\"%\" for all)"
    )]
    EventKind {
        /// The name given.
        name: String,
        /// A suggestion, if the name is near one (`waits`).
        hint: String,
    },
}

/// Why a `setup_timers` change's `name` is refused: it matches no event
/// kind in any case (`idle`, `waits`), so it would change nothing.
fn unknown_event_kind(name: &str) -> Option<InvalidChange> {
    let kinds = EventKind::ALL.map(EventKind::name);
    if kinds
        .iter()
        .any(|k| setup::like(&name.to_ascii_lowercase(), k))
    {
        return None;
    }
    let lower = name.to_ascii_lowercase();
    let hint = kinds
        .iter()
        .find(|k| !lower.is_empty() && (lower.starts_with(*k) || k.starts_with(&lower)))
        .map(|k| format!(" (did you mean {k:?}?)"))
        .unwrap_or_default();
    Some(InvalidChange::EventKind {
        name: name.to_string(),
        hint,
    })
}

/// Checks a change before touching any segment.
pub fn validate(change: &Change) -> Result<(), InvalidChange> {
    match change {
        Change::Timers(t) if TimerId::from_name(&t.timer_name).is_none() => {
            Err(InvalidChange::Timer(t.timer_name.clone()))
        }
        Change::Timers(t) => unknown_event_kind(&t.name).map_or(Ok(()), Err),
        Change::Instruments(i) if i.name.is_empty() => Err(InvalidChange::EmptyName),
        Change::Consumers(c) if c.name.is_empty() => Err(InvalidChange::EmptyName),
        Change::Instruments(i) if i.enabled.is_none() && i.timed.is_none() => {
            Err(InvalidChange::Nothing)
        }
        Change::Actors(a)
            if [&a.host, &a.user, &a.role]
                .iter()
                .any(|s| s.is_empty() || s.len() > pfs_shm_layout::layout::ACTOR_FIELD_BYTES) =>
        {
            Err(InvalidChange::ActorLength)
        }
        Change::Actors(a) if a.delete && (a.enabled.is_some() || a.history.is_some()) => {
            Err(InvalidChange::DeleteWithValues)
        }
        _ => Ok(()),
    }
}

/// A segment that cannot be opened for writing.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// `open` failed (permissions, a link, gone).
    #[error(
        "{}: cannot open for writing: {source} (the agent needs the segment's uid or group)",
        path.display()
    )]
    Open {
        /// The segment file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not a usable segment.
    #[error("{}: {source}", path.display())]
    Segment {
        /// The segment file.
        path: PathBuf,
        /// Why.
        source: SegmentError,
    },
}

/// Opens `path` for writing, refusing symlinks.
pub fn open_rw(path: &Path) -> Result<Segment, OpenError> {
    let f = open_rw_nofollow(path).map_err(|source| OpenError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    Segment::open(f, true).map_err(|source| OpenError::Segment {
        path: path.to_path_buf(),
        source,
    })
}

/// Applies `change` to every segment among `paths` that passes `filter`.
pub fn apply(paths: &[PathBuf], filter: &Filter, change: &Change) -> Outcome {
    let mut out = Outcome::default();
    for p in paths {
        let seg = match open_rw(p) {
            Ok(s) => s,
            Err(e) => {
                out.errors.push(e);
                continue;
            }
        };
        if !filter.matches(seg.service(), seg.pid()) {
            out.filtered_out
                .push((seg.service().to_string(), seg.pid()));
            continue;
        }
        match apply_one(&seg, change) {
            Ok(n) => out.matched += n,
            Err(ActorsFull) => out.full += 1,
        }
        out.segments += 1;
    }
    out
}

/// Applies `change` to one writable segment; returns rows matched, or
/// [`ActorsFull`] for a new `setup_actors` row without room.
pub fn apply_one(seg: &Segment, change: &Change) -> Result<usize, ActorsFull> {
    Ok(match change {
        Change::Instruments(c) => setup::set_instruments(seg, &c.name, c.enabled, c.timed),
        Change::Consumers(c) => setup::set_consumers(seg, &c.name, c.enabled),
        Change::Timers(c) => match TimerId::from_name(&c.timer_name) {
            // In any case, as MySQL compares `NAME = 'WAIT'`.
            Some(t) => setup::set_timers(seg, &c.name.to_ascii_lowercase(), t),
            None => 0,
        },
        Change::Actors(c) => {
            // Columns not given keep their value (a new row: YES).
            let flags = (!c.delete).then_some((c.enabled, c.history));
            return setup::set_actor(seg, &c.host, &c.user, &c.role, flags);
        }
    })
}

/// Setup defaults from the agent's command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defaults {
    /// `(pattern, FLAG_* bits)`; the longest matching pattern wins.
    pub instruments: Vec<(String, u32)>,
    /// `(pattern, enabled)`, applied in order.
    pub consumers: Vec<(String, bool)>,
    /// `setup_actors` rows, inserted or updated in order.
    pub actors: Vec<ActorRule>,
}

impl Defaults {
    /// Parses `--instrument`, `--consumer` and `--actor` values
    /// (`PATTERN=VALUE` each, as `PFS_INSTRUMENT`, `PFS_CONSUMERS` and
    /// `PFS_ACTORS` spell them). A consumer pattern that names no consumer
    /// is an error, as are more actor rows than `setup_actors` holds.
    pub fn parse(
        instruments: &[String],
        consumers: &[String],
        actors: &[String],
    ) -> Result<Self, SyntaxError> {
        let consumers = parse_consumer_rules(&consumers.join(";"))?;
        setup::check_consumer_rules(&consumers)?;
        let actors = parse_actor_rules(&actors.join(";"))?;
        check_actor_rows(&actors)?;
        Ok(Self {
            instruments: parse_instrument_rules(&instruments.join(";"))?,
            consumers,
            actors,
        })
    }

    /// True if there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.instruments.is_empty() && self.consumers.is_empty() && self.actors.is_empty()
    }

    /// A stable fingerprint of these defaults (never 0), recorded in each
    /// segment they were applied to.
    pub fn fingerprint(&self) -> u32 {
        let mut text = String::new();
        for (p, f) in &self.instruments {
            text.push_str(&format!("i\0{p}\0{f}\0"));
        }
        for (p, on) in &self.consumers {
            text.push_str(&format!("c\0{p}\0{on}\0"));
        }
        for a in &self.actors {
            let (u, h, r, e, y) = (&a.user, &a.host, &a.role, a.enabled, a.history);
            text.push_str(&format!("a\0{u}\0{h}\0{r}\0{e}\0{y}\0"));
        }
        pfs_shm_layout::text::fnv1a32(text.as_bytes()).max(1)
    }

    /// Starts applying the defaults to the segment at `path`: consumers
    /// now, instruments as they register ([`Applied::catch_up`]). A
    /// segment that records these same defaults as applied already (by
    /// this agent before a restart, or by another agent on the directory)
    /// is not set again: its consumers and the classes they covered keep
    /// the live changes made since; only classes registered after are
    /// set. `None` (with a warning) if it cannot be opened for writing, or
    /// if there is nothing to apply.
    pub fn attach(&self, path: &Path) -> Option<Applied> {
        if self.is_empty() {
            return None;
        }
        match open_rw(path) {
            Ok(rw) => {
                let fingerprint = self.fingerprint();
                let (recorded, covered) = setup::agent_defaults(&rw);
                let classes = if recorded == fingerprint {
                    covered as usize
                } else {
                    self.apply_consumers(&rw);
                    self.apply_actors(&rw, path);
                    setup::set_agent_defaults(&rw, fingerprint, 0);
                    0
                };
                Some(Applied {
                    rw,
                    classes,
                    fingerprint,
                })
            }
            Err(e) => {
                tracing::warn!("cannot apply setup defaults: {e}");
                None
            }
        }
    }

    /// Applies consumer rules (once, when a segment is found).
    pub fn apply_consumers(&self, seg: &Segment) {
        for (p, on) in &self.consumers {
            setup::set_consumers(seg, p, *on);
        }
    }

    /// Inserts or updates the actor rows (once, when a segment is found);
    /// a row that finds the table full is logged and skipped.
    pub fn apply_actors(&self, seg: &Segment, path: &Path) {
        for a in &self.actors {
            let flags = Some((Some(a.enabled), Some(a.history)));
            if let Err(e) = setup::set_actor(seg, &a.host, &a.user, &a.role, flags) {
                tracing::warn!(
                    segment = %crate::util::shown::path(path),
                    "cannot apply --actor {}@{}/{}: {e}",
                    a.user,
                    a.host,
                    a.role
                );
            }
        }
    }

    /// Applies instrument rules to classes `from..`; returns the number of
    /// classes now covered.
    pub fn apply_instruments(&self, seg: &Segment, from: usize) -> usize {
        use pfs_shm_layout::layout::{CLASS_READY, FLAG_ENABLED, FLAG_TIMED};
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let classes = seg.classes();
        let mut n = from;
        for e in &classes[from.min(classes.len())..] {
            if e.state.load(Acquire) != CLASS_READY {
                break; // classes are published in index order
            }
            n += 1;
            let Some(name) = pfs_shm_layout::reader::class_name(e) else {
                continue;
            };
            if let Some((_, flags)) = self
                .instruments
                .iter()
                .filter(|(p, _)| setup::like(p, &name))
                .max_by_key(|(p, _)| p.len())
            {
                let _ = e.flags.fetch_update(Relaxed, Relaxed, |f| {
                    Some((f & !(FLAG_ENABLED | FLAG_TIMED)) | flags)
                });
            }
        }
        n
    }
}

/// The defaults being applied to one segment: a writable mapping of it,
/// and how many of its classes were covered so far.
#[derive(Debug)]
pub struct Applied {
    rw: Segment,
    classes: usize,
    /// [`Defaults::fingerprint`], recorded in the segment with `classes`.
    fingerprint: u32,
}

impl Applied {
    /// Applies the instrument defaults to classes registered since the
    /// last call, and records them as covered in the segment.
    pub fn catch_up(&mut self, defaults: &Defaults) {
        let n = defaults.apply_instruments(&self.rw, self.classes);
        if n != self.classes {
            self.classes = n;
            setup::set_agent_defaults(&self.rw, self.fingerprint, n as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timers(name: &str) -> Change {
        Change::Timers(TimerChange {
            name: name.into(),
            timer_name: "NANOSECOND".into(),
        })
    }

    #[test]
    fn empty_names_and_changes_of_nothing_are_refused() {
        let empty = Change::Instruments(InstrumentChange {
            name: String::new(),
            enabled: Some(false),
            timed: None,
        });
        assert_eq!(validate(&empty), Err(InvalidChange::EmptyName));
        let empty = Change::Consumers(ConsumerChange {
            name: String::new(),
            enabled: true,
        });
        assert_eq!(validate(&empty), Err(InvalidChange::EmptyName));
        let nothing = Change::Instruments(InstrumentChange {
            name: "wait/%".into(),
            enabled: None,
            timed: None,
        });
        let e = validate(&nothing).unwrap_err().to_string();
        assert!(e.contains("--enabled"), "{e}");
    }

    #[test]
    fn an_actor_row_is_deleted_or_given_values_not_both() {
        let actor = |delete, enabled| {
            Change::Actors(ActorChange {
                host: "%".into(),
                user: "app".into(),
                role: "%".into(),
                enabled,
                history: None,
                delete,
            })
        };
        assert!(validate(&actor(true, None)).is_ok());
        assert!(validate(&actor(false, Some(false))).is_ok());
        assert_eq!(
            validate(&actor(true, Some(true))),
            Err(InvalidChange::DeleteWithValues)
        );
    }

    #[test]
    fn event_kinds_are_checked() {
        for ok in [
            "wait",
            "stage",
            "statement",
            "%",
            "sta%",
            "_tage",
            "STAGE",
            "Wait",
        ] {
            assert!(validate(&timers(ok)).is_ok(), "{ok}");
        }
        let e = validate(&timers("WAITS")).unwrap_err().to_string();
        assert!(
            e.contains("\"WAITS\"") && e.contains("did you mean \"wait\""),
            "{e}"
        );
        let e = validate(&timers("idle")).unwrap_err().to_string();
        assert!(
            e.contains("wait, stage, statement") && !e.contains("did you mean"),
            "{e}"
        );
    }
}
