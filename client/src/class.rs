//! Layer 3. Instrument classes: registration in the segment's class
//! registry (checking that a name is of the family the caller expects),
//! the live setup flags word of each class, and lazily registered
//! statics.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use pfs_shm_layout::layout::{FLAG_ENABLED, LostKind, NONE_U32};
use pfs_shm_layout::{ClassKind, EventKind};

use crate::reentry::reentrant;
use crate::runtime;
use crate::warning;

/// Flags of an instrument that does not exist (client not initialised,
/// registry full, wrong name): permanently disabled.
static DISABLED: AtomicU32 = AtomicU32::new(0);

/// The instrument family an API accepts: a `wait/...`, `stage/...`,
/// `statement/...` or `memory/...` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    Wait,
    Stage,
    Statement,
    Memory,
}

impl Family {
    /// The kind of event the family's classes record (`None`: memory).
    fn event_kind(self) -> Option<EventKind> {
        match self {
            Family::Wait => Some(EventKind::Wait),
            Family::Stage => Some(EventKind::Stage),
            Family::Statement => Some(EventKind::Statement),
            Family::Memory => None,
        }
    }

    /// Whether a class of `kind` belongs to this family.
    fn accepts(self, kind: ClassKind) -> bool {
        match self.event_kind() {
            Some(k) => k.matches(kind),
            None => kind == ClassKind::Memory,
        }
    }

    /// The family's word, for the warning about a wrong name.
    fn what(self) -> &'static str {
        self.event_kind().map_or("memory", EventKind::name)
    }
}

/// A registered class: its index and its live setup flags word.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassRef {
    pub(crate) index: u32,
    pub(crate) flags: &'static AtomicU32,
}

impl ClassRef {
    pub(crate) const DISABLED: ClassRef = ClassRef {
        index: NONE_U32,
        flags: &DISABLED,
    };

    /// Registers `name` if it names an instrument of `family`; a disabled
    /// class otherwise (and before `init`, or with the registry full).
    pub(crate) fn register(name: &str, family: Family) -> Self {
        let rt = runtime::get();
        match ClassKind::from_name(name) {
            Some(kind) if family.accepts(kind) => {
                let Some(rt) = rt else {
                    return Self::DISABLED;
                };
                rt.writer
                    .register_class(name, kind, rt.flags_for(name))
                    .map(|index| Self {
                        index,
                        flags: rt.writer.class_flags(index),
                    })
                    .unwrap_or(Self::DISABLED)
            }
            _ => {
                misnamed(name, family, rt);
                Self::DISABLED
            }
        }
    }

    #[inline(always)]
    pub(crate) fn flags(&self) -> u32 {
        self.flags.load(Relaxed)
    }

    #[inline(always)]
    pub(crate) fn enabled(&self) -> bool {
        self.flags() & FLAG_ENABLED != 0
    }
}

/// A class registered on first use after `init`.
#[derive(Debug)]
pub(crate) struct LazyRef {
    name: &'static str,
    cell: OnceLock<ClassRef>,
}

impl LazyRef {
    pub(crate) const fn new(name: &'static str) -> Self {
        Self {
            name,
            cell: OnceLock::new(),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// The class, registered on the first call after `init` (disabled,
    /// and not cached, before).
    #[inline(always)]
    pub(crate) fn get(&self, family: Family) -> ClassRef {
        match self.cell.get() {
            Some(c) => *c,
            None => self.resolve(family),
        }
    }

    #[cold]
    fn resolve(&self, family: Family) -> ClassRef {
        if runtime::get().is_none() {
            if matches!(family, Family::Stage | Family::Statement) {
                warning::not_initialised(family.what(), self.name);
            }
            return ClassRef::DISABLED;
        }
        // Registration allocates under the writer's lock: never account
        // those allocations (see the `reentry` module).
        *self
            .cell
            .get_or_init(|| reentrant(|| ClassRef::register(self.name, family)))
    }
}

/// Misnamed instruments already said, by name and family: a program that
/// registers one again (a C loop) says and counts it once. At most
/// [`MISNAMED_KEPT`] are kept; past them each is counted again, and said
/// no more.
static MISNAMED: std::sync::Mutex<Vec<(String, &'static str)>> = std::sync::Mutex::new(Vec::new());

/// How many misnamed instruments [`MISNAMED`] keeps.
const MISNAMED_KEPT: usize = 256;

/// A name that is not an instrument of `family` (a typo, the wrong
/// family): counted where an operator looks
/// (`pfs_lost_total{kind="instrument_classes"}`) once `init` has run, and
/// said (a program may have no subscriber), once per name. Before `init`
/// it is said, not counted (there is no segment yet).
#[cold]
fn misnamed(name: &str, family: Family, rt: Option<&'static runtime::Runtime>) {
    let what = family.what();
    let first = reentrant(|| {
        let mut seen = MISNAMED.lock().unwrap_or_else(|e| e.into_inner());
        if seen.iter().any(|(n, w)| n == name && *w == what) {
            return Some(false);
        }
        if seen.len() >= MISNAMED_KEPT {
            return None;
        }
        seen.push((name.to_string(), what));
        Some(true)
    });
    if first == Some(false) {
        return;
    }
    let counted = match rt {
        Some(rt) => {
            rt.writer.segment().count_lost(LostKind::Classes);
            "counted in pfs_lost_total{kind=\"instrument_classes\"}"
        }
        None => "not counted: the client is not initialised yet",
    };
    if first.is_some() {
        warning::warn(
            &format!("not a PFS {what} instrument name: {name:?}; instrument disabled ({counted})"),
            |m| tracing::warn!("{m}"),
        );
    }
}
