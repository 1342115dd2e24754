//! Layer 0. The statement classes the layer names from field values, and
//! their bound: at most `max` are created; beyond, a new name folds into
//! its rule's `other` class and counts one lost class
//! (`pfs_lost_total{kind="instrument_classes"}`). A name is looked up, once per
//! statement, in the thread's own copy of the names it has seen (the most
//! recent scanned first, then a hash map): no allocation and no lock word
//! shared with other threads, however many routes a service has. Only a
//! name new to the thread takes the shared map's read lock and is copied
//! once into the thread's map; a name new to the process takes the write
//! lock and registers its class.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
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
    /// Tells this set's copies in the threads from another set's.
    id: u64,
    max: usize,
    map: RwLock<Map>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Names per thread scanned before the thread's hash map.
const RECENT: usize = 16;

/// Names a thread copies at most, per set: past this (a field of high
/// cardinality), a name new to the thread is looked up in the shared map
/// each time, so that many threads do not each hold thousands of names.
const LOCAL_NAMES: usize = 1024;

/// One thread's copy of the names of one [`Classes`] it has looked up:
/// the remembered names (at most [`LOCAL_NAMES`]), each allocated once,
/// and the most recent ones, which share those allocations.
struct Local {
    set: u64,
    all: HashMap<Rc<str>, StatementClass>,
    recent: Vec<(Rc<str>, StatementClass)>,
    /// The next entry of `recent` to replace once it is full.
    next: usize,
}

impl Local {
    /// The class of `name`, if this thread has seen it.
    fn find(&mut self, name: &str) -> Option<StatementClass> {
        if let Some((_, c)) = self.recent.iter().find(|(n, _)| **n == *name) {
            return Some(*c);
        }
        let (n, &c) = self.all.get_key_value(name)?;
        let n = n.clone();
        self.remember_recent((n, c));
        Some(c)
    }

    /// Copies `name` into this thread's map.
    fn add(&mut self, name: &str, class: StatementClass) {
        let n: Rc<str> = Rc::from(name);
        self.all.insert(n.clone(), class);
        self.remember_recent((n, class));
    }

    fn remember_recent(&mut self, e: (Rc<str>, StatementClass)) {
        if self.recent.len() < RECENT {
            self.recent.push(e);
        } else {
            self.recent[self.next] = e;
            self.next = (self.next + 1) % RECENT;
        }
    }
}

thread_local! {
    /// This thread's copies, one per [`Classes`] (one per layer).
    static LOCAL: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
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
        let seen = LOCAL.try_with(|l| {
            let mut l = l.try_borrow_mut().ok()?;
            l.iter_mut().find(|l| l.set == self.id)?.find(name)
        });
        if let Ok(Some(c)) = seen {
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
            let _ = LOCAL.try_with(|l| {
                if let Ok(mut l) = l.try_borrow_mut() {
                    let i = match l.iter().position(|l| l.set == self.id) {
                        Some(i) => i,
                        None => {
                            l.push(Local {
                                set: self.id,
                                all: HashMap::new(),
                                recent: Vec::with_capacity(RECENT),
                                next: 0,
                            });
                            l.len() - 1
                        }
                    };
                    if l[i].all.len() < LOCAL_NAMES {
                        l[i].add(name, class);
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
