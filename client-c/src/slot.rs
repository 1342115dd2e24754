//! Layer 1. Caller-owned storage: a Rust guard (a wait, a statement, a
//! memory token) kept in place inside an opaque C struct the caller owns,
//! typically on its stack, so that the event path allocates nothing.
//!
//! A [`Slot`] is an "armed" word and the value. `put` writes both without
//! reading what was there (C stack memory is uninitialised); `take` runs
//! the value's last use and drops it in place only if the slot is armed
//! for the caller, then disarms it, so a second end of the same struct is
//! a no-op.
//!
//! The armed word also says which thread may use the value ([`Owner`]): a
//! wait or a statement holds a reference to its thread's context, which
//! is freed when that thread exits, so only the thread that armed it may
//! end it. A struct that another thread armed (begun on another thread,
//! or stack memory left by a thread that exited and whose stack a new
//! thread reuses) is then, to the caller, as empty as uninitialised
//! memory: `with` and `take` refuse it, at the cost of one thread-local
//! read.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Set when the program turns out to be compiled with a `pfs.h` whose
/// structs are not this library's size (an ABI check that failed after
/// initialisation): from then on no slot is touched, so the library never
/// reads or writes past a program's struct. Written once, read on every
/// use: a line no thread writes in the normal run.
static UNUSABLE: AtomicBool = AtomicBool::new(false);

/// Stops every use of slots (see [`UNUSABLE`]).
pub(crate) fn refuse_all() {
    UNUSABLE.store(true, Relaxed);
}

/// Whether slots may be used: false once [`refuse_all`] ran.
#[inline(always)]
pub(crate) fn usable() -> bool {
    !UNUSABLE.load(Relaxed)
}

/// The armed word's value ("pfs_slot" in ASCII) for a slot any thread may
/// take, XOR the owner's token for a slot of one thread: any other value,
/// zero included, means empty.
const ARMED: u64 = 0x7066_735f_736c_6f74;

/// Who may use and take a slot's value: any thread, or the one thread
/// that armed it. A thread is known by a token no other thread of the
/// process has, had or will have (a counter, so never reused, unlike a
/// thread id or a context's address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner(u64);

/// The next thread token (0 is [`Owner::ANY`]).
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The calling thread's token, 0 until its first use. Const and
    /// without a destructor: readable at any time, thread exit included.
    static TOKEN: Cell<u64> = const { Cell::new(0) };
}

impl Owner {
    /// Any thread (memory tokens, which may be freed on any thread).
    pub(crate) const ANY: Owner = Owner(0);

    /// The calling thread: one thread-local read (and the first time, a
    /// shared counter's increment).
    #[inline(always)]
    pub(crate) fn me() -> Owner {
        match TOKEN.with(Cell::get) {
            0 => Self::first(),
            t => Owner(t),
        }
    }

    /// The calling thread's token, taken on its first use.
    #[cold]
    #[inline(never)]
    fn first() -> Owner {
        let t = NEXT_TOKEN.fetch_add(1, Relaxed);
        TOKEN.with(|c| c.set(t));
        Owner(t)
    }

    /// The armed word of a slot of this owner.
    #[inline(always)]
    const fn armed(self) -> u64 {
        ARMED ^ self.0
    }
}

/// Whether `owner`'s values can no longer be used: it is a thread whose
/// record was folded at its exit (a `pthread_key_create` destructor runs
/// after the client's own thread-exit hook), so a wait or statement it
/// began refers to a freed context. Such a value is never touched again
/// (the struct is disarmed, the guard forgotten, its event left unended
/// as if the thread had been killed). One thread-local read.
#[inline(always)]
fn gone(owner: Owner) -> bool {
    owner != Owner::ANY && pfs_client::thread_gone()
}

/// Whether `armed` is the armed word of a slot another thread of this
/// process armed (a token it was given), when `owner`, a thread, tries to
/// take it: an end on the wrong thread, worth counting. A disarmed slot
/// (already ended: 0), and memory that was never armed (no token yet
/// given reads back from it, but for odds of about one in 2^64 / tokens),
/// are not. Cold: only on a refused end.
#[cold]
#[inline(never)]
fn begun_by_another(armed: u64, owner: Owner) -> bool {
    let token = armed ^ ARMED;
    owner != Owner::ANY && token != 0 && token != owner.0 && token < NEXT_TOKEN.load(Relaxed)
}

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

/// Stores `value` in the slot at `p`, armed for `owner`; whatever `p` held
/// before is overwritten without being read or dropped.
///
/// # Safety
///
/// `p` is non-null, aligned for `Slot<T>` and valid for writes of
/// `size_of::<Slot<T>>()` bytes, and no other reference to it is live;
/// `owner` is [`Owner::ANY`] or [`Owner::me`].
#[inline(always)]
pub(crate) unsafe fn put<T>(p: *mut Slot<T>, owner: Owner, value: T) {
    if !usable() {
        return;
    }
    // SAFETY: by this function's contract `p` is valid, aligned and
    // exclusively ours; `write` does not read or drop the old contents.
    unsafe {
        p.write(Slot {
            armed: owner.armed(),
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

/// Marks the slot at `p` armed for `owner`: its value was initialised
/// through [`place`].
///
/// # Safety
///
/// As for [`put`], and the value is initialised.
#[inline(always)]
pub(crate) unsafe fn arm<T>(p: *mut Slot<T>, owner: Owner) {
    // SAFETY: by this function's contract `p` is valid and ours.
    unsafe { (&raw mut (*p).armed).write(owner.armed()) };
}

/// Marks the slot at `p` empty (without reading it), so that its end is a
/// no-op.
///
/// # Safety
///
/// As [`put`].
#[inline(always)]
pub(crate) unsafe fn clear<T>(p: *mut Slot<T>) {
    if !usable() {
        return;
    }
    // SAFETY: `p` is valid for writes and ours (contract); writing the
    // armed word through a raw place projection reads nothing.
    unsafe { (&raw mut (*p).armed).write(0) };
}

/// Runs `f` on the value of a slot armed for `owner` (`None` if it is
/// empty or armed for another owner).
///
/// # Safety
///
/// `p` is non-null, aligned and valid for reads and writes of a
/// `Slot<T>`, exclusively ours, and either armed for `owner` by [`put`] or
/// [`arm`] (and not taken since) or holding any armed word other than
/// `owner`'s. For `owner` [`Owner::me`], the second case covers whatever
/// another thread left there: only the calling thread arms a slot with
/// its token, and no other thread has or will have it.
#[inline(always)]
pub(crate) unsafe fn with<T, R>(
    p: *mut Slot<T>,
    owner: Owner,
    f: impl FnOnce(&mut T) -> R,
) -> Option<R> {
    if !usable() {
        return None;
    }
    // SAFETY: `p` is valid and exclusive (contract).
    let slot = unsafe { &mut *p };
    if slot.armed != owner.armed() || gone(owner) {
        return None;
    }
    // SAFETY: an armed slot holds an initialised value written by `put`
    // (contract).
    Some(f(unsafe { slot.value.assume_init_mut() }))
}

/// If the slot is armed for `owner`: disarms it, runs `last` on the
/// value, then drops the value in place (for a guard, the drop ends the
/// event). A slot armed for another owner is left as it is.
///
/// # Safety
///
/// As [`with`].
#[inline(always)]
pub(crate) unsafe fn take<T>(p: *mut Slot<T>, owner: Owner, last: impl FnOnce(&mut T)) {
    if !usable() {
        return;
    }
    // SAFETY: `p` is valid and exclusive (contract).
    let slot = unsafe { &mut *p };
    if slot.armed != owner.armed() {
        if begun_by_another(slot.armed, owner) {
            pfs_client::count_foreign_end();
        }
        return;
    }
    slot.armed = 0;
    if gone(owner) {
        // The value is left as it is, never dropped: see `gone`.
        return;
    }
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
            put(p, Owner::ANY, CountsDrops(&drops));
            assert_eq!(with(p, Owner::ANY, |_| 5), Some(5));
            let mut seen = false;
            take(p, Owner::ANY, |_| seen = true);
            assert!(seen);
            assert_eq!(drops.get(), 1);
            take(p, Owner::ANY, |_| panic!("an empty slot runs nothing"));
            assert_eq!(with(p, Owner::ANY, |_| 5), None);
            put(p, Owner::ANY, CountsDrops(&drops));
            clear(p);
            take(p, Owner::ANY, |_| panic!("a cleared slot runs nothing"));
        }
        assert_eq!(drops.get(), 1);
    }

    #[test]
    fn only_the_owner_takes_its_slot() {
        let me = Owner::me();
        assert_eq!(me, Owner::me(), "one token per thread");
        assert_ne!(me, Owner::ANY);
        let other = std::thread::spawn(Owner::me).join().unwrap();
        assert_ne!(me, other, "each thread its own token");
        let mut mem = MaybeUninit::<Slot<u32>>::uninit();
        let p = mem.as_mut_ptr();
        // SAFETY: `p` points to a local, aligned, exclusive slot; `other`
        // stands for a thread that armed the memory before us.
        unsafe {
            put(p, other, 7);
            assert_eq!(with(p, me, |v| *v), None, "another thread's slot");
            take(p, me, |_| panic!("another thread's slot is not taken"));
            take(p, Owner::ANY, |_| panic!("nor by an any-thread take"));
            assert_eq!(with(p, other, |v| *v), Some(7), "still armed for it");
            put(p, me, 8);
            assert_eq!(with(p, Owner::ANY, |v| *v), None);
            let mut got = 0;
            take(p, me, |v| got = *v);
            assert_eq!(got, 8);
        }
    }
}
