//! Layer 1: the three kinds of timed event the tables and metrics are
//! split by (waits, stages, statements), with everything that differs
//! between them in one place.

use pfs_shm_layout::ClassKind;
use pfs_shm_layout::writer::{KIND_STAGE, KIND_STATEMENT, KIND_WAIT};

/// A kind of timed event.
///
/// ```
/// use pfs_agent::event_kind::EventKind;
/// use pfs_shm_layout::ClassKind;
/// assert_eq!(EventKind::Wait.table_word(), "waits");
/// assert!(EventKind::Wait.matches(ClassKind::Mutex));
/// assert_eq!(EventKind::of_class(ClassKind::Stage), Some(EventKind::Stage));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// `wait/...` instruments (synch, I/O, ...).
    Wait,
    /// `stage/...` instruments.
    Stage,
    /// `statement/...` instruments.
    Statement,
}

impl EventKind {
    /// Every kind, in table order.
    pub const ALL: [EventKind; 3] = [EventKind::Wait, EventKind::Stage, EventKind::Statement];

    /// The word in table names (`events_waits_current`).
    pub fn table_word(self) -> &'static str {
        match self {
            EventKind::Wait => "waits",
            EventKind::Stage => "stages",
            EventKind::Statement => "statements",
        }
    }

    /// Whether instruments of class kind `c` record events of this kind.
    pub fn matches(self, c: ClassKind) -> bool {
        match self {
            EventKind::Wait => c.is_wait(),
            EventKind::Stage => c == ClassKind::Stage,
            EventKind::Statement => c == ClassKind::Statement,
        }
    }

    /// The event kind an instrument of class kind `c` records, if any
    /// (memory instruments record none).
    pub fn of_class(c: ClassKind) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.matches(c))
    }

    /// The index of this kind in the segment's per-kind arrays (the
    /// writer's `KIND_*`), also its number in the agent's state files.
    pub fn index(self) -> usize {
        match self {
            EventKind::Wait => KIND_WAIT,
            EventKind::Stage => KIND_STAGE,
            EventKind::Statement => KIND_STATEMENT,
        }
    }

    /// The kind whose [`EventKind::index`] is `i`.
    pub fn from_index(i: usize) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.index() == i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_round_trip_and_classes_have_one_kind() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_index(k.index()), Some(k));
        }
        assert_eq!(EventKind::from_index(3), None);
        for c in [ClassKind::Mutex, ClassKind::File, ClassKind::OtherWait] {
            assert_eq!(EventKind::of_class(c), Some(EventKind::Wait));
        }
        assert_eq!(
            EventKind::of_class(ClassKind::Statement),
            Some(EventKind::Statement)
        );
        assert_eq!(EventKind::of_class(ClassKind::Memory), None);
    }
}
