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
//! * Every mapping made by [`Segment::open`](crate::Segment::open) is
//!   registered in a fixed-size, lock-free table of `(start, end)` ranges
//!   ([`Registration`]); it is removed when the segment is dropped, before
//!   the mapping is unmapped.
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
//!
//! The handler is async-signal-safe: it only loads and stores atomics of a
//! static table and calls `mmap`/`sigaction` (system calls); it never
//! allocates, locks or logs, and it preserves `errno`.

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
        // SAFETY: all-zero bytes are a valid `sigaction` (SIG_DFL, empty
        // flags); it is only an out-parameter here.
        let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a null new action only reads the current disposition
        // into `prev`, which is valid for writes.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut prev) } != 0 {
            return false;
        }
        // Stored before the handler can run, so the handler always finds it.
        let _ = PREVIOUS.set(prev);
        // SAFETY: as above, a zeroed `sigaction` is valid.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = handler as *const () as libc::sighandler_t;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `act.sa_mask` is a valid, writable sigset_t.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: installs a fully initialised action whose handler has
        // the SA_SIGINFO signature; the old action is not wanted.
        unsafe { libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) == 0 }
    })
}

/// The registered slot containing `addr`, if any (async-signal-safe).
fn find(addr: usize) -> Option<&'static Slot> {
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
            return Some(slot);
        }
    }
    None
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: errno is thread-local; saving and restoring it keeps the
    // interrupted code's value intact across our system calls.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler;
    // `si_addr` is meaningful for kernel-generated SIGBUS (si_code > 0).
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    let slot = if code > 0 { find(addr) } else { None };
    if let Some(slot) = slot {
        let (start, end) = (
            slot.start.load(Ordering::Relaxed),
            slot.end.load(Ordering::Relaxed),
        );
        // SAFETY: `[start, end)` is a live mapping owned by a `Segment`
        // (the faulting thread is accessing it, so it cannot be unmapped
        // concurrently: the segment is borrowed). Replacing it with
        // private anonymous memory of the same extent keeps every address
        // valid; memmap2's later `munmap` of the range removes it.
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
            // SAFETY: see above.
            unsafe { *libc::__errno_location() = errno };
            return;
        }
        // Could not patch: fall through and die as without the handler.
    }
    chain(sig, info, ctx);
    // SAFETY: see above.
    unsafe { *libc::__errno_location() = errno };
}

/// Passes a fault that is not ours to the previous disposition.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let prev = PREVIOUS.get();
    match prev {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous action declared SA_SIGINFO, so its
                // handler has this signature; we pass our own arguments.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain (non-SA_SIGINFO) handler takes the signal.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // Default (or ignored, which the kernel does not honour for a
            // synchronous fault): restore SIG_DFL; returning re-executes
            // the faulting access, which now terminates the process.
            // SAFETY: a zeroed sigaction with SIG_DFL (0) is valid.
            let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            dfl.sa_sigaction = libc::SIG_DFL;
            unsafe { libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut()) };
        }
    }
}
