//! Surviving a segment file that shrinks while it is mapped.
//!
//! Touching a page of a shared file mapping that lies beyond the file's
//! current end raises `SIGBUS`, whose default action kills the process. A
//! segment directory is shared with other processes, so a reader must
//! assume any mapped file may be truncated under it at any time (by a
//! hostile or buggy process, an operator, or a full `tmpfs` that cannot
//! back a page). The same signal comes from an I/O error behind the page.
//!
//! # Design
//!
//! * Every mapping made by `Segment::open` (in the `segment` module), and
//!   the creator's once it calls `Segment::protect` (`pfs-client` does at
//!   `init`), is registered in a fixed-size, lock-free table of
//!   `(start, end)` ranges ([`Registration`]); it is removed when the
//!   segment is dropped, before the mapping is unmapped.
//! * A process-wide `SIGBUS` handler is installed once (`sigaction`,
//!   `SA_SIGINFO | SA_ONSTACK`), remembering the previous disposition.
//! * When the faulting address (`si_addr`, kernel-generated faults only)
//!   lies in a registered range, the handler replaces the **whole** range
//!   with private anonymous zero pages (`mmap(MAP_FIXED)`, a plain system
//!   call), marks the registration faulted and returns: the interrupted
//!   load or store is restarted and now sees, or writes to, zeros. The
//!   whole range is replaced at once so that one fault costs one mapping
//!   (no page-by-page patching that could exhaust `vm.max_map_count`), and
//!   so that every later access to the damaged segment is harmless.
//! * Any other `SIGBUS` is passed to the previous handler (Rust's own
//!   stack-overflow handler, usually) or, if there was none, the default
//!   disposition is restored and the fault re-raises as it would have
//!   without this module.
//!
//! The owner of a segment checks [`Registration::faulted`] after reading
//! and drops the segment: its contents after the fault are zeros, not data.
//! A writer runs on against the zeros and stops growing the file.
//!
//! The handler is async-signal-safe: it only loads and stores atomics of a
//! static table and calls `mmap`/`sigaction` (system calls); it never
//! allocates, locks or logs, and it preserves `errno`.
//!
//! One of the four modules allowed to use `unsafe` (see the crate docs):
//! installing a signal handler and patching a mapping are system calls.
//!
//! Layer 1 (see the crate docs): depends only on [`crate::error`].

use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

use crate::error::SegmentError;

/// Capacity of the registration table: mappings that can be protected at
/// once (the agent holds one or two per segment file).
pub const MAX_REGISTRATIONS: usize = 4096;

/// One registered range. `state` is 0 when free, 1 while being filled, and
/// otherwise an even generation unique to the registration (a sequence
/// lock: the handler re-reads it to detect a slot reused under it).
struct Slot {
    state: AtomicU64,
    start: AtomicUsize,
    end: AtomicUsize,
    faulted: AtomicBool,
}

impl Slot {
    const fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            faulted: AtomicBool::new(false),
        }
    }
}

static SLOTS: [Slot; MAX_REGISTRATIONS] = [const { Slot::new() }; MAX_REGISTRATIONS];
/// One past the highest slot ever used (bounds the handler's scan).
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Source of registration generations.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Faults recovered since the process started.
static RECOVERED: AtomicU64 = AtomicU64::new(0);
/// The disposition found when the handler was installed.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
/// Whether installation succeeded.
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// A mapping protected against `SIGBUS`; unregistered on drop.
#[derive(Debug)]
pub struct Registration {
    slot: usize,
    generation: u64,
}

impl Registration {
    /// Registers `[start, start + len)` (a mapping made by the caller),
    /// installing the handler on first use. Fails if the handler cannot be
    /// installed or the table is full.
    pub fn new(start: *const u8, len: usize) -> Result<Self, SegmentError> {
        if !install() {
            return Err(SegmentError::Protect(
                "cannot install the SIGBUS handler".into(),
            ));
        }
        let start = start as usize;
        let end = start
            .checked_add(len)
            .ok_or_else(|| SegmentError::Protect("mapping wraps the address space".into()))?;
        let generation = 2 * (GENERATION.fetch_add(1, Ordering::Relaxed) + 1);
        for (i, slot) in SLOTS.iter().enumerate() {
            if slot
                .state
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            slot.start.store(start, Ordering::Relaxed);
            slot.end.store(end, Ordering::Relaxed);
            slot.faulted.store(false, Ordering::Relaxed);
            slot.state.store(generation, Ordering::Release);
            HIGH.fetch_max(i + 1, Ordering::Release);
            return Ok(Self {
                slot: i,
                generation,
            });
        }
        Err(SegmentError::Protect(format!(
            "more than {MAX_REGISTRATIONS} segment mappings are open at once"
        )))
    }

    /// True once an access to the range raised `SIGBUS`: the range now
    /// holds zeros, not the file's contents.
    pub fn faulted(&self) -> bool {
        self.slot().faulted.load(Ordering::Acquire)
    }

    fn slot(&self) -> &'static Slot {
        &SLOTS[self.slot]
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let slot = self.slot();
        debug_assert_eq!(slot.state.load(Ordering::Relaxed), self.generation);
        slot.state.store(0, Ordering::Release);
    }
}

/// Faults recovered (ranges replaced by zeros) since the process started.
pub fn recovered_faults() -> u64 {
    RECOVERED.load(Ordering::Relaxed)
}

/// Installs the handler once; true if it is in place.
fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        // SAFETY: `libc::sigaction` is a C struct of integers only (on
        // Linux `sa_sigaction` is a `sighandler_t`, i.e. a `usize`, not a
        // Rust function pointer, and `sa_mask` is an array of integers), so
        // the all-zero bit pattern is a valid value of every field. It is
        // used only as an out-parameter.
        let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: sigaction(2) with a null new action only reads the
        // current disposition into `*oldact`; `&mut prev` is a live,
        // aligned, writable `libc::sigaction`, the type libc's wrapper
        // expects, and nothing else is written.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut prev) } != 0 {
            return false;
        }
        // Stored before the handler can run, so the handler always finds it.
        let _ = PREVIOUS.set(prev);
        // SAFETY: as for `prev`: all-zero is a valid `libc::sigaction`.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = handler as *const () as libc::sighandler_t;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `&mut act.sa_mask` is a live, aligned, writable
        // `sigset_t`; sigemptyset(3) writes that set and nothing else.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: `act` is fully initialised: its handler is `handler`, an
        // `extern "C" fn(c_int, *mut siginfo_t, *mut c_void)`, exactly the
        // signature the kernel calls with SA_SIGINFO; the mask is empty and
        // the flags are valid. `handler` is async-signal-safe (module
        // docs), which is what installing it for a synchronous fault
        // requires. A null `oldact` is allowed (the old action was read
        // above).
        unsafe { libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) == 0 }
    })
}

/// The registered slot containing `addr`, and its range as read
/// consistently, if any (async-signal-safe).
fn find(addr: usize) -> Option<(&'static Slot, usize, usize)> {
    let high = HIGH.load(Ordering::Acquire).min(MAX_REGISTRATIONS);
    for slot in &SLOTS[..high] {
        let s1 = slot.state.load(Ordering::Acquire);
        if s1 < 2 {
            continue;
        }
        let (start, end) = (
            slot.start.load(Ordering::Relaxed),
            slot.end.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        if slot.state.load(Ordering::Relaxed) != s1 {
            continue; // reused while we read it: not the faulting mapping
        }
        if (start..end).contains(&addr) {
            return Some((slot, start, end));
        }
    }
    None
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: `__errno_location` (async-signal-safe, no lock) returns a
    // non-null, aligned pointer to this thread's `errno`, valid for the
    // thread's lifetime; this is a plain read of an initialised `int`. It
    // is saved so that our system calls do not change the value the
    // interrupted code sees.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the handler is installed with SA_SIGINFO only, so the kernel
    // passes `info` pointing to a `siginfo_t` that it wrote in full and that
    // stays valid until the handler returns (a chaining handler passes the
    // kernel's pointer on). `si_addr()` is unsafe because it reads a union
    // field: the read is of initialised bytes and yields an address that is
    // only compared, never dereferenced; it is meaningful for
    // kernel-generated faults (`si_code > 0`), the only ones used.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    let found = if code > 0 { find(addr) } else { None };
    if let Some((slot, start, end)) = found {
        // SAFETY: `[start, end)` is a registered range, read consistently
        // by `find`. A registration is always dropped before its mapping
        // is unmapped (field order in `Segment`, declaration order in
        // `Segment::open`), so a registered range is a live mapping, and
        // live mappings do not overlap: the faulting address lies in this
        // thread's access to that very mapping, made through a borrow of
        // its owner, which therefore cannot be dropped (nor the range
        // unmapped, nor the slot reused) before the access completes. MAP_FIXED replaces exactly that
        // range, page aligned (a mapping's start and length), with private
        // anonymous zero pages, readable and writable: every address and
        // every reference into the range stays valid and aligned, and reads
        // zeros, a valid value of every type in a segment (atomics only;
        // another process could have stored zeros there too). memmap2's
        // later `munmap` of the same range removes the replacement. No Rust
        // memory outside the range is touched; mmap(2) is a system call,
        // async-signal-safe.
        let replaced = unsafe {
            libc::mmap(
                start as *mut c_void,
                end - start,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if replaced != libc::MAP_FAILED {
            slot.faulted.store(true, Ordering::Release);
            RECOVERED.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the same valid, aligned pointer to this thread's
            // `errno` as read above; a plain write of an `int` restores the
            // interrupted code's value.
            unsafe { *libc::__errno_location() = errno };
            return;
        }
        // Could not patch: fall through and die as without the handler.
    }
    chain(sig, info, ctx);
    // SAFETY: as above, a plain write through the valid pointer to this
    // thread's `errno`.
    unsafe { *libc::__errno_location() = errno };
}

/// Passes a fault that is not ours to the previous disposition.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let prev = PREVIOUS.get();
    match prev {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: `p` is the disposition the kernel reported before
                // ours was installed. Neither SIG_DFL (0) nor SIG_IGN (1),
                // its `sa_sigaction` is the non-null address of a handler
                // function, pointer-sized like the target type, and its
                // SA_SIGINFO flag says the kernel calls it as
                // `extern "C" fn(c_int, *mut siginfo_t, *mut c_void)`. We
                // call it with the kernel's own arguments, as the kernel
                // would have.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: as above, a non-null handler address; without
                // SA_SIGINFO the kernel calls it as `extern "C" fn(c_int)`,
                // and so do we, with the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // Default (or ignored, which the kernel does not honour for a
            // synchronous fault): restore SIG_DFL; returning re-executes
            // the faulting access, which now terminates the process.
            // SAFETY: all-zero is a valid `libc::sigaction` (see `install`).
            let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            dfl.sa_sigaction = libc::SIG_DFL;
            // SAFETY: `dfl` is fully initialised (SIG_DFL, empty mask, no
            // flags); restoring the default disposition touches no memory
            // of ours, a null `oldact` is allowed, and sigaction(2) is
            // async-signal-safe.
            unsafe { libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut()) };
        }
    }
}
