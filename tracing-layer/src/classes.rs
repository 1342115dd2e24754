//! Layer 0. The statement classes the layer names from field values, and
//! their bound: at most `max` are created; beyond, a new name folds into
//! its rule's `other` class and counts one lost class
//! (`pfs_lost_total{kind="instrument_classes"}`). A name is looked up, once per
//! statement, in a small per-thread cache of recent names, else under the
//! map's read lock (threads serving the same routes then share no lock
//! word); a name seen for the first time takes the write lock and
//! registers its class.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{PoisonError, RwLock};

use pfs_client::StatementClass;

/// How many folded names are remembered (each then counted as lost once);
/// past this, a folded name counts one lost class every time it is seen.
pub(crate) const FOLDED_NAMES: usize = 4096;

#[derive(Debug, Default)]
struct Map {
    /// Created classes, and folded names (mapped to their `other` class).
    by_name: HashMap<String, StatementClass>,
    created: usize,
    folded: usize,
}

/// The bounded set of classes named from field values.
#[derive(Debug)]
pub(crate) struct Classes {
    /// Tells this set's entries in the per-thread caches from another's.
    id: u64,
    max: usize,
    map: RwLock<Map>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Names per thread in the cache of recent names.
const RECENT: usize = 16;

/// A recent name: (set id, name, class).
type Recent = (u64, Box<str>, StatementClass);

thread_local! {
    /// Recent names, replaced round-robin.
    static RECENT_NAMES: RefCell<(Vec<Recent>, usize)> = const { RefCell::new((Vec::new(), 0)) };
}

impl Classes {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Relaxed),
            max,
            map: RwLock::new(Map::default()),
        }
    }

    /// The class of statement name `name` (a full `statement/...` name):
    /// registered if new and within the bound, else `other()` (the rule's
    /// overflow class), counting a lost class; and whether the name now
    /// always gives this class (false for a name folded past
    /// [`FOLDED_NAMES`]: each sight counts).
    #[inline]
    pub(crate) fn get(
        &self,
        name: &str,
        other: impl FnOnce() -> StatementClass,
    ) -> (StatementClass, bool) {
        let recent = RECENT_NAMES.try_with(|r| {
            let r = r.try_borrow().ok()?;
            r.0.iter()
                .find(|(id, n, _)| *id == self.id && **n == *name)
                .map(|(_, _, c)| *c)
        });
        if let Ok(Some(c)) = recent {
            return (c, true);
        }
        let found = self
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .by_name
            .get(name)
            .copied();
        let (class, remembered) = match found {
            Some(c) => (c, true),
            None => self.add(name, other),
        };
        if remembered {
            let _ = RECENT_NAMES.try_with(|r| {
                if let Ok(mut r) = r.try_borrow_mut() {
                    let (names, next) = &mut *r;
                    let e = (self.id, Box::from(name), class);
                    if names.len() < RECENT {
                        names.push(e);
                    } else {
                        names[*next] = e;
                        *next = (*next + 1) % RECENT;
                    }
                }
            });
        }
        (class, remembered)
    }

    /// Adds `name`; returns its class and whether the name is now in the
    /// map (not when folded past [`FOLDED_NAMES`]: each sight counts).
    #[cold]
    fn add(&self, name: &str, other: impl FnOnce() -> StatementClass) -> (StatementClass, bool) {
        let mut m = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = m.by_name.get(name) {
            return (*c, true);
        }
        if m.created < self.max {
            let c = StatementClass::register(name);
            m.by_name.insert(name.to_string(), c);
            m.created += 1;
            return (c, true);
        }
        pfs_client::count_lost_class();
        let o = other();
        if m.folded < FOLDED_NAMES {
            m.by_name.insert(name.to_string(), o);
            m.folded += 1;
            return (o, true);
        }
        (o, false)
    }

    /// (classes created, names folded and remembered).
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        let m = self.map.read().unwrap_or_else(PoisonError::into_inner);
        (m.created, m.folded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_folded_once() {
        // Not initialised: classes are disabled, the bookkeeping is the same.
        let c = Classes::new(2);
        let mut others = 0;
        let mut other = || {
            others += 1;
            StatementClass::register("statement/t/other")
        };
        for name in [
            "statement/t/a",
            "statement/t/b",
            "statement/t/a",
            "statement/t/c",
        ] {
            c.get(name, &mut other);
        }
        assert_eq!(c.counts(), (2, 1));
        c.get("statement/t/c", &mut other);
        assert_eq!(c.counts(), (2, 1), "a folded name is remembered");
        assert_eq!(others, 1);
    }
}
