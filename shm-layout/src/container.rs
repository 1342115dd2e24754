//! The thread container's page protocol: allocation without skipping,
//! reclamation of quiet pages, revival.
//!
//! Each container page has one state word in the page directory:
//!
//! ```text
//!  63                                    2 1 0
//! +---------------------------------------+---+
//! |  users (allocators scanning the page) |st |   st: 0 UNUSED, 1 ACTIVE,
//! +---------------------------------------+---+       2 RECLAIMING, 3 RECLAIMED
//! ```
//!
//! | transition               | who                          | how |
//! |--------------------------|------------------------------|-----|
//! | UNUSED → ACTIVE          | allocator, process lock held | reserve (`fallocate`) the page, `store(Release)` |
//! | ACTIVE(u) → ACTIVE(u+1)  | allocator entering to scan   | `compare_exchange`, only from ACTIVE |
//! | ACTIVE(u) → ACTIVE(u−1)  | allocator leaving            | `fetch_sub(Release)` |
//! | ACTIVE(0) → RECLAIMING   | reclaimer, process lock held | `compare_exchange(Acquire)`, only with no user |
//! | RECLAIMING → ACTIVE      | reclaimer (a record in use)  | `store(Release)` |
//! | RECLAIMING → RECLAIMED   | reclaimer, after the hole punch | `store(Release)` |
//! | RECLAIMED → ACTIVE       | allocator, process lock held | reserve the page, write every lock word FREE(base), `store(Release)` |
//!
//! **Why no record is handed to two owners, and no page in use is
//! reclaimed.** An allocator only touches a page's lock words between a
//! successful *enter* (a compare-exchange that requires ACTIVE) and its
//! *leave*. The reclaimer's compare-exchange requires ACTIVE with zero
//! users, so while a page is RECLAIMING or RECLAIMED no allocator is inside
//! it and none can enter. The reclaimer's `Acquire` reads the `Release` of
//! the last *leave*, so it sees every lock word that allocator changed: a
//! record taken (DIRTY or ALLOCATED) makes it give the page back ACTIVE. A
//! record is released only by its owner, which is not a page user; a page
//! whose every lock word is FREE therefore has no owner, and punching it
//! destroys nothing.
//!
//! **Versions survive reclamation.** A punched page reads as zeros, so its
//! lock words read FREE(0). Before punching, the reclaimer notes the highest
//! version in the page; revival writes FREE(that version) into every lock
//! word before the page becomes ACTIVE again, so a record's
//! `(index, version)` pairs never repeat, and a reader's fold-log check
//! (crate docs) can never confuse two lifetimes.
//!
//! **Readers** (the agent) never write these words. They copy records only
//! from ACTIVE pages and accept a copy only when its lock word is unchanged
//! afterwards; a page reclaimed during a copy reads zeros, which changes the
//! word. A reader that faults a punched page back in costs 4 KiB until the
//! owner's next maintenance pass punches it again.
//!
//! The functions are generic over [`Word`] so that `loom` explores this very
//! code (see the tests at the bottom of this file).
//!
//! Layer 3 (see the crate docs): depends on [`crate::layout`] (the page and
//! record states) and [`crate::lockword`] (taking a record).

use std::sync::atomic::Ordering::*;

pub use crate::layout::{PAGE_ACTIVE, PAGE_RECLAIMED, PAGE_RECLAIMING, PAGE_UNUSED, PAGE_USER};
use crate::layout::{REC_ALLOCATED, REC_FREE};
use crate::lockword::{self, Word};

/// Decoded page state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageState {
    /// Never used.
    Unused,
    /// In use.
    Active,
    /// Being reclaimed.
    Reclaiming,
    /// Returned to the operating system.
    Reclaimed,
}

impl PageState {
    /// Decodes a page word.
    #[inline]
    pub fn of(word: u64) -> Self {
        match word & 3 {
            PAGE_UNUSED => Self::Unused,
            PAGE_ACTIVE => Self::Active,
            PAGE_RECLAIMING => Self::Reclaiming,
            _ => Self::Reclaimed,
        }
    }

    /// Upper-case name, as shown in tables and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unused => "unused",
            Self::Active => "active",
            Self::Reclaiming => "reclaiming",
            Self::Reclaimed => "reclaimed",
        }
    }
}

/// Enters an ACTIVE page to scan its records. `false` if the page is not
/// ACTIVE (then it must not be touched).
#[inline]
pub fn enter<W: Word + ?Sized>(page: &W) -> bool {
    let mut w = page.load(Relaxed);
    loop {
        if w & 3 != PAGE_ACTIVE {
            return false;
        }
        match page.compare_exchange(w, w + PAGE_USER, Acquire, Relaxed) {
            Ok(_) => return true,
            Err(now) => w = now,
        }
    }
}

/// Leaves a page entered with [`enter`].
#[inline]
pub fn leave<W: Word + ?Sized>(page: &W) {
    page.fetch_sub(PAGE_USER, Release);
}

/// Scans the page's `n` record lock words (`lock(slot)`) from slot
/// `start`, wrapping around, for a FREE record, and takes it (FREE →
/// DIRTY). Returns the slot and the version it had. The caller must have
/// entered the page.
#[inline]
pub fn take_free<'a, W: Word + ?Sized + 'a>(
    n: usize,
    lock: impl Fn(usize) -> &'a W,
    start: usize,
) -> Option<(usize, u64)> {
    (0..n).find_map(|k| {
        let slot = (start + k) % n;
        lockword::try_acquire(lock(slot)).map(|v| (slot, v))
    })
}

/// Why a page was not reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReclaimed {
    /// Not ACTIVE, or an allocator is scanning it.
    Busy,
    /// A record is in use (DIRTY or ALLOCATED).
    InUse,
    /// The hole punch failed; the page stays ACTIVE.
    PunchFailed,
}

/// Reclaims an ACTIVE page whose records are all FREE: takes it out of the
/// allocators' reach (RECLAIMING), checks every lock word, calls `punch`
/// (which returns the page's bytes to the OS and reports success), and
/// marks it RECLAIMED. Returns the highest record version in the page, to
/// hand to [`revive`] later. Call with the owner's process lock held (one
/// reclaimer and one reviver at a time).
pub fn try_reclaim<'a, W: Word + ?Sized + 'a>(
    page: &W,
    n: usize,
    lock: impl Fn(usize) -> &'a W,
    punch: impl FnOnce() -> bool,
) -> Result<u64, NotReclaimed> {
    if page
        .compare_exchange(PAGE_ACTIVE, PAGE_RECLAIMING, Acquire, Relaxed)
        .is_err()
    {
        return Err(NotReclaimed::Busy);
    }
    let mut max_version = 0;
    for slot in 0..n {
        let (state, version) = lockword::decode(lock(slot).load(Acquire));
        if state != lockword::RecordState::Free {
            page.store(PAGE_ACTIVE, Release);
            return Err(NotReclaimed::InUse);
        }
        max_version = max_version.max(version);
    }
    if !punch() {
        page.store(PAGE_ACTIVE, Release);
        return Err(NotReclaimed::PunchFailed);
    }
    page.store(PAGE_RECLAIMED, Release);
    Ok(max_version)
}

/// Brings a RECLAIMED page back: every lock word becomes FREE(`base`) (the
/// version [`try_reclaim`] returned), then the page becomes ACTIVE. The
/// caller has reserved the page's bytes again and holds the process lock.
pub fn revive<'a, W: Word + ?Sized + 'a>(
    page: &W,
    n: usize,
    lock: impl Fn(usize) -> &'a W,
    base: u64,
) {
    debug_assert_eq!(page.load(Relaxed) & 3, PAGE_RECLAIMED);
    for slot in 0..n {
        lock(slot).store(lockword::encode(REC_FREE, base), Relaxed);
    }
    page.store(PAGE_ACTIVE, Release);
}

/// Makes a newly reserved UNUSED page ACTIVE. The caller holds the process
/// lock.
pub fn activate<W: Word + ?Sized>(page: &W) {
    page.store(PAGE_ACTIVE, Release);
}

/// Whether every lock word is FREE right now (a cheap pre-check before
/// [`try_reclaim`]; not a guarantee).
pub fn all_free<'a, W: Word + ?Sized + 'a>(n: usize, lock: impl Fn(usize) -> &'a W) -> bool {
    (0..n).all(|slot| lock(slot).load(Relaxed) & 3 == REC_FREE)
}

/// Whether a lock word shows an owned record.
#[inline]
pub fn is_allocated(word: u64) -> bool {
    word & 3 == REC_ALLOCATED
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn words(n: usize) -> Vec<AtomicU64> {
        (0..n).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn reclaim_needs_no_user_and_all_free() {
        let page = AtomicU64::new(PAGE_ACTIVE);
        let locks = words(2);
        let refs = |i: usize| &locks[i];
        assert!(enter(&page));
        assert_eq!(
            try_reclaim(&page, 2, refs, || true),
            Err(NotReclaimed::Busy)
        );
        let (slot, v) = take_free(2, refs, 1).unwrap();
        assert_eq!(slot, 1, "the scan starts at the given slot");
        leave(&page);
        assert_eq!(
            try_reclaim(&page, 2, refs, || true),
            Err(NotReclaimed::InUse)
        );
        assert_eq!(PageState::of(page.load(Relaxed)), PageState::Active);
        let v = lockword::publish(refs(1), v);
        lockword::release(refs(1), v);
        assert_eq!(
            try_reclaim(&page, 2, refs, || false),
            Err(NotReclaimed::PunchFailed)
        );
        let base = try_reclaim(&page, 2, refs, || {
            locks.iter().for_each(|l| l.store(0, Relaxed));
            true
        })
        .unwrap();
        assert_eq!(base, 1);
        assert!(!enter(&page), "a reclaimed page cannot be entered");
        revive(&page, 2, refs, base);
        assert!(enter(&page));
        let (_, v) = take_free(2, refs, 1).unwrap();
        assert_eq!(lockword::publish(refs(1), v), 2, "versions continue");
        leave(&page);
    }
}

/// Model checks of the protocol with `loom`: every interleaving of
/// allocators and a reclaimer over a tiny container.
#[cfg(test)]
mod loom_model {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU64, AtomicUsize};
    use std::sync::atomic::Ordering;

    impl Word for AtomicU64 {
        fn load(&self, order: Ordering) -> u64 {
            AtomicU64::load(self, order)
        }
        fn store(&self, value: u64, order: Ordering) {
            AtomicU64::store(self, value, order)
        }
        fn compare_exchange(
            &self,
            current: u64,
            new: u64,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u64, u64> {
            AtomicU64::compare_exchange(self, current, new, success, failure)
        }
        fn fetch_sub(&self, value: u64, order: Ordering) -> u64 {
            AtomicU64::fetch_sub(self, value, order)
        }
    }

    const SLOTS: usize = 2;

    struct Model {
        page: AtomicU64,
        locks: [AtomicU64; SLOTS],
        /// Test-only ownership marks: set by the owner after taking a
        /// record, cleared before releasing it.
        owners: [AtomicUsize; SLOTS],
        /// Test-only: the last version each slot's owner published.
        last: [AtomicU64; SLOTS],
    }

    impl Model {
        fn new() -> Self {
            Self {
                page: AtomicU64::new(PAGE_ACTIVE),
                locks: [AtomicU64::new(0), AtomicU64::new(0)],
                owners: [AtomicUsize::new(0), AtomicUsize::new(0)],
                last: [AtomicU64::new(0), AtomicU64::new(0)],
            }
        }
        /// One allocation lifetime: scan, own, check, release.
        fn lifetime(&self, me: usize, start: usize) {
            if !enter(&self.page) {
                return;
            }
            let got = take_free(SLOTS, |i| &self.locks[i], start);
            leave(&self.page);
            let Some((slot, v)) = got else { return };
            let v = lockword::publish(&self.locks[slot], v);
            assert_eq!(
                self.owners[slot].swap(me, Ordering::Relaxed),
                0,
                "record {slot} handed to two owners"
            );
            assert_eq!(
                self.locks[slot].load(Ordering::Relaxed),
                lockword::encode(REC_ALLOCATED, v),
                "an owned record's page was reclaimed"
            );
            let prev = self.last[slot].swap(v, Ordering::Relaxed);
            assert!(v > prev, "slot {slot}: version {v} after {prev} was reused");
            self.owners[slot].store(0, Ordering::Relaxed);
            lockword::release(&self.locks[slot], v);
        }
        /// The reclaimer: its punch asserts that nobody owns a record, then
        /// zeroes the page as a hole punch does. Revives afterwards.
        fn reclaim_and_revive(&self) {
            let r = try_reclaim(
                &self.page,
                SLOTS,
                |i| &self.locks[i],
                || {
                    for o in &self.owners {
                        assert_eq!(o.load(Ordering::Relaxed), 0, "reclaimed a page in use");
                    }
                    for l in &self.locks {
                        l.store(0, Ordering::Relaxed);
                    }
                    true
                },
            );
            if let Ok(base) = r {
                revive(&self.page, SLOTS, |i| &self.locks[i], base);
            }
        }
    }

    #[test]
    fn two_allocators_and_a_reclaimer() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let m = Arc::new(Model::new());
            let a = {
                let m = m.clone();
                loom::thread::spawn(move || m.lifetime(1, 0))
            };
            let c = {
                let m = m.clone();
                loom::thread::spawn(move || m.lifetime(2, 0))
            };
            m.reclaim_and_revive();
            a.join().unwrap();
            c.join().unwrap();
        });
    }

    #[test]
    fn versions_continue_across_reclamation() {
        loom::model(|| {
            let m = Arc::new(Model::new());
            let a = {
                let m = m.clone();
                loom::thread::spawn(move || {
                    m.lifetime(1, 1);
                    m.lifetime(1, 1);
                })
            };
            m.reclaim_and_revive();
            a.join().unwrap();
        });
    }
}
