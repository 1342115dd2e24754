//! Layer 1. Caller-owned storage: a Rust guard (a wait, a statement, a
//! memory token) kept in place inside an opaque C struct the caller owns,
//! typically on its stack, so that the event path allocates nothing.
//!
//! A [`Slot`] is an "armed" word and the value. `put` writes both without
//! reading what was there (C stack memory is uninitialised); `take` runs
//! the value's last use and drops it in place only if the slot is armed,
//! then disarms it, so a second end of the same struct is a no-op.

use std::mem::MaybeUninit;

/// The armed word's value ("pfs_slot" in ASCII): any other value, zero
/// included, means empty.
const ARMED: u64 = 0x7066_735f_736c_6f74;

/// A value of type `T` in caller-owned memory, with its armed word.
#[repr(C)]
pub(crate) struct Slot<T> {
    armed: u64,
    value: MaybeUninit<T>,
}

impl<T> Slot<T> {
    /// Whether a C struct of `size` bytes aligned to `align` can hold a
    /// slot of `T` (checked at compile time by each user).
    pub(crate) const fn fits(size: usize, align: usize) -> bool {
        size_of::<Self>() <= size && align_of::<Self>() <= align
    }
}

/// Stores `value` in the slot at `p`, armed; whatever `p` held before is
/// overwritten without being read or dropped.
///
/// # Safety
///
/// `p` is non-null, aligned for `Slot<T>` and valid for writes of
/// `size_of::<Slot<T>>()` bytes, and no other reference to it is live.
#[inline(always)]
pub(crate) unsafe fn put<T>(p: *mut Slot<T>, value: T) {
    // SAFETY: by this function's contract `p` is valid, aligned and
    // exclusively ours; `write` does not read or drop the old contents.
    unsafe {
        p.write(Slot {
            armed: ARMED,
            value: MaybeUninit::new(value),
        })
    };
}

/// The value's place in the slot at `p`, to be initialised in place and
/// then [`arm`]ed (a large value, such as a guard, written where it stays
/// instead of copied there).
///
/// # Safety
///
/// As for [`put`]; the reference must not outlive the slot's memory.
#[inline(always)]
pub(crate) unsafe fn place<'a, T>(p: *mut Slot<T>) -> &'a mut MaybeUninit<T> {
    // SAFETY: by this function's contract `p` is valid, aligned and
    // exclusively ours; a `MaybeUninit` may hold anything.
    unsafe { &mut (*p).value }
}

/// Marks the slot at `p` armed: its value was initialised through
/// [`place`].
///
/// # Safety
///
/// As for [`put`], and the value is initialised.
#[inline(always)]
pub(crate) unsafe fn arm<T>(p: *mut Slot<T>) {
    // SAFETY: by this function's contract `p` is valid and ours.
    unsafe { (&raw mut (*p).armed).write(ARMED) };
}

/// Marks the slot at `p` empty (without reading it), so that its end is a
/// no-op.
///
/// # Safety
///
/// As [`put`].
#[inline(always)]
pub(crate) unsafe fn clear<T>(p: *mut Slot<T>) {
    // SAFETY: `p` is valid for writes and ours (contract); writing the
    // armed word through a raw place projection reads nothing.
    unsafe { (&raw mut (*p).armed).write(0) };
}

/// Runs `f` on the value of an armed slot (`None` if empty).
///
/// # Safety
///
/// `p` is non-null, aligned and valid for reads and writes of a
/// `Slot<T>`, exclusively ours, and either armed by [`put`] (and not taken
/// since) or holding any armed word other than [`ARMED`].
#[inline(always)]
pub(crate) unsafe fn with<T, R>(p: *mut Slot<T>, f: impl FnOnce(&mut T) -> R) -> Option<R> {
    // SAFETY: `p` is valid and exclusive (contract).
    let slot = unsafe { &mut *p };
    if slot.armed != ARMED {
        return None;
    }
    // SAFETY: an armed slot holds an initialised value written by `put`
    // (contract).
    Some(f(unsafe { slot.value.assume_init_mut() }))
}

/// If the slot is armed: disarms it, runs `last` on the value, then drops
/// the value in place (for a guard, the drop ends the event).
///
/// # Safety
///
/// As [`with`].
#[inline(always)]
pub(crate) unsafe fn take<T>(p: *mut Slot<T>, last: impl FnOnce(&mut T)) {
    // SAFETY: `p` is valid and exclusive (contract).
    let slot = unsafe { &mut *p };
    if slot.armed != ARMED {
        return;
    }
    slot.armed = 0;
    // SAFETY: the slot was armed, so `value` was initialised by `put` and
    // not dropped since; disarming first means it is dropped only once
    // even if `last` or the drop panics.
    unsafe {
        last(slot.value.assume_init_mut());
        slot.value.assume_init_drop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    struct CountsDrops<'a>(&'a Cell<u32>);

    impl Drop for CountsDrops<'_> {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[test]
    fn a_slot_drops_its_value_once() {
        let drops = Cell::new(0);
        let mut mem = MaybeUninit::<Slot<CountsDrops<'_>>>::uninit();
        let p = mem.as_mut_ptr();
        // SAFETY: `p` points to a local, aligned, exclusive slot.
        unsafe {
            put(p, CountsDrops(&drops));
            assert_eq!(with(p, |_| 5), Some(5));
            let mut seen = false;
            take(p, |_| seen = true);
            assert!(seen);
            assert_eq!(drops.get(), 1);
            take(p, |_| panic!("an empty slot runs nothing"));
            assert_eq!(with(p, |_| 5), None);
            put(p, CountsDrops(&drops));
            clear(p);
            take(p, |_| panic!("a cleared slot runs nothing"));
        }
        assert_eq!(drops.get(), 1);
    }
}
