//! The record lock word: PFS's `pfs_lock`, a version and a state in one
//! `AtomicU64`.
//!
//! ```text
//!  63                                   2 1 0
//! +--------------------------------------+---+
//! |               version                |st |   st: 0 FREE, 1 DIRTY, 2 ALLOCATED
//! +--------------------------------------+---+
//! ```
//!
//! | transition            | who               | how                                   |
//! |-----------------------|-------------------|---------------------------------------|
//! | FREE → DIRTY          | allocating thread | `compare_exchange` (the only RMW)     |
//! | DIRTY → ALLOCATED(v+1)| new owner         | `store(Release)` after initialising   |
//! | ALLOCATED(v) → FREE(v)| owner, at exit    | `store(Release)` after folding        |
//!
//! A word of zero is FREE with version 0, which is what a never-touched
//! (hole) page reads as. A reader copies a record only if it sees
//! ALLOCATED, and accepts the copy only if the word is unchanged after the
//! copy: a changed word means the lifetime it copied has ended.
//!
//! Layer 2 (see the crate docs): depends only on [`crate::layout`] (the
//! `REC_*` state values).

use std::sync::atomic::{AtomicU64, Ordering};

/// The operations the record and page protocols need from a 64-bit atomic
/// word. Implemented for [`AtomicU64`] (the shared-memory words) and, in
/// this crate's tests, for `loom`'s model-checked atomic, so the very code
/// that runs in production is the code the model checker explores.
pub trait Word {
    /// [`AtomicU64::load`].
    fn load(&self, order: Ordering) -> u64;
    /// [`AtomicU64::store`].
    fn store(&self, value: u64, order: Ordering);
    /// [`AtomicU64::compare_exchange`].
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64>;
    /// [`AtomicU64::fetch_sub`].
    fn fetch_sub(&self, value: u64, order: Ordering) -> u64;
}

impl Word for AtomicU64 {
    #[inline]
    fn load(&self, order: Ordering) -> u64 {
        AtomicU64::load(self, order)
    }
    #[inline]
    fn store(&self, value: u64, order: Ordering) {
        AtomicU64::store(self, value, order)
    }
    #[inline]
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        AtomicU64::compare_exchange(self, current, new, success, failure)
    }
    #[inline]
    fn fetch_sub(&self, value: u64, order: Ordering) -> u64 {
        AtomicU64::fetch_sub(self, value, order)
    }
}

use crate::layout::{REC_ALLOCATED, REC_DIRTY, REC_FREE};

/// Decoded state of a lock word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Free for allocation.
    Free,
    /// Being initialised by a new owner; not readable.
    Dirty,
    /// Owned and readable.
    Allocated,
    /// State bits 3: never written by a correct writer.
    Invalid,
}

/// Splits a lock word into its state and version.
#[inline]
pub fn decode(word: u64) -> (RecordState, u64) {
    let state = match word & 3 {
        REC_FREE => RecordState::Free,
        REC_DIRTY => RecordState::Dirty,
        REC_ALLOCATED => RecordState::Allocated,
        _ => RecordState::Invalid,
    };
    (state, word >> 2)
}

/// Builds a lock word from a state value (`REC_*`) and a version.
#[inline]
pub const fn encode(state: u64, version: u64) -> u64 {
    (version << 2) | state
}

/// Tries FREE → DIRTY. Returns the version observed if this caller won.
#[inline]
pub fn try_acquire<W: Word + ?Sized>(lock: &W) -> Option<u64> {
    let w = lock.load(Ordering::Relaxed);
    if w & 3 != REC_FREE {
        return None;
    }
    let version = w >> 2;
    lock.compare_exchange(
        w,
        encode(REC_DIRTY, version),
        Ordering::Acquire,
        Ordering::Relaxed,
    )
    .ok()
    .map(|_| version)
}

/// DIRTY → ALLOCATED with the next version; returns that version.
#[inline]
pub fn publish<W: Word + ?Sized>(lock: &W, old_version: u64) -> u64 {
    let v = old_version.wrapping_add(1) & (u64::MAX >> 2);
    lock.store(encode(REC_ALLOCATED, v), Ordering::Release);
    v
}

/// ALLOCATED(v) → FREE(v).
#[inline]
pub fn release<W: Word + ?Sized>(lock: &W, version: u64) {
    lock.store(encode(REC_FREE, version), Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle() {
        let l = AtomicU64::new(0);
        assert_eq!(decode(0), (RecordState::Free, 0));
        let v = try_acquire(&l).expect("free word is acquirable");
        assert_eq!(decode(l.load(Ordering::Relaxed)).0, RecordState::Dirty);
        assert_eq!(
            try_acquire(&l),
            None,
            "a DIRTY record cannot be taken twice"
        );
        let v1 = publish(&l, v);
        assert_eq!(
            decode(l.load(Ordering::Relaxed)),
            (RecordState::Allocated, 1)
        );
        assert_eq!(try_acquire(&l), None);
        release(&l, v1);
        assert_eq!(decode(l.load(Ordering::Relaxed)), (RecordState::Free, 1));
        let v = try_acquire(&l).unwrap();
        assert_eq!(publish(&l, v), 2, "each lifetime gets a new version");
    }
}
