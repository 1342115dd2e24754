//! Layer 7. A `GlobalAlloc` wrapper that accounts every heap allocation
//! of an instrumented thread to the memory instrument in scope
//! ([`crate::memory_scope`]) or to a default instrument
//! (`memory/pfs_client/default`).
//!
//! ```no_run
//! use pfs_client::alloc::PfsAllocator;
//! #[global_allocator]
//! static ALLOC: PfsAllocator = PfsAllocator::new();
//! ```
//!
//! # Block header
//!
//! Every block gets an 8-byte header just before the pointer returned to
//! the program: the class index (or `u32::MAX` when the allocation was not
//! counted) and a magic word. The size is not stored: `GlobalAlloc` hands
//! `dealloc` and `realloc` the layout the block was allocated (or last
//! reallocated) with, whose size is the one accounted. The header area is
//! padded to the block's alignment (`max(8, align)` bytes in front), so
//! the user pointer keeps its alignment; `realloc` moves the header with
//! the block. The free reads the header: it is accounted exactly when the
//! allocation was, against the allocation's instrument, whatever the
//! flags and the scope say by then. `realloc` counts as the free of the
//! old block and the allocation of the new one.
//!
//! # Cost
//!
//! The accounting is inlined into `alloc` and `dealloc`; per allocation
//! it reads the reentrancy flag, the scope, the class's flags word, the
//! thread's context (one thread-local pointer) and the truncation
//! generation, updates the thread's row under its sequence lock (the
//! context remembers the row it used last, so a repeat of the same class
//! skips the row lookup) and writes the header word; per free it reads the
//! header word and the context and updates the row. Registration, a
//! change of class, first touch of a row, truncation and threads without a
//! record are cold calls.
//!
//! # Reentrancy and thread exit
//!
//! The client's own slow paths (thread registration, class and string
//! registration, the fold at thread exit) allocate. They run with a
//! const thread-local flag set; allocations made then are not accounted
//! (they are the instrumentation's own memory, shown by the agent as
//! `memory/performance_schema/*`), so the allocator never recurses and
//! never waits for a lock its thread holds. A thread is registered lazily
//! by its first accounted allocation. Allocations before [`crate::init`]
//! are not accounted. After a thread's record is folded (TLS destructors
//! that run later), its allocations are not accounted and its frees of
//! accounted blocks go to the global row directly, so that the global
//! `CURRENT_NUMBER_OF_BYTES_USED` stays exactly allocated − freed.
//!
//! # Unsafe code
//!
//! A global allocator is unsafe by nature: the `GlobalAlloc` impl (five
//! blocks: the calls to the inner allocator and the header reads and
//! writes of `dealloc` and `realloc`), the allocation path shared by
//! `alloc` and `alloc_zeroed` (two blocks), and the two header accessors
//! (one block each, `unsafe fn`s whose contract their callers meet).

use std::alloc::{GlobalAlloc, Layout, System};

use pfs_shm_layout::layout::NONE_U32;

use crate::memory::{LazyMemoryClass, account_alloc, account_free, scope};
use crate::reentry::in_pfs;

/// Bytes of the block header (one `u64`: class, magic).
const HEADER: usize = 8;
/// Marks a block allocated by [`PfsAllocator`].
const MAGIC: u32 = 0x5046_534d; // "PFSM"

/// The default instrument of [`PfsAllocator::new`].
pub static DEFAULT_CLASS: LazyMemoryClass = LazyMemoryClass::new("memory/pfs_client/default");

/// The accounting allocator; see the module documentation.
///
/// It can also wrap another allocator, with another default instrument:
///
/// ```no_run
/// use std::alloc::System;
/// use pfs_client::{LazyMemoryClass, alloc::PfsAllocator};
///
/// static UNSCOPED: LazyMemoryClass = LazyMemoryClass::new("memory/app/unscoped");
/// #[global_allocator]
/// static ALLOC: PfsAllocator = PfsAllocator::with(System, &UNSCOPED);
/// ```
#[derive(Debug)]
pub struct PfsAllocator<A = System> {
    inner: A,
    default: &'static LazyMemoryClass,
}

impl PfsAllocator<System> {
    /// Wraps the system allocator; unscoped allocations go to
    /// `memory/pfs_client/default` ([`DEFAULT_CLASS`]).
    pub const fn new() -> Self {
        Self {
            inner: System,
            default: &DEFAULT_CLASS,
        }
    }
}

impl Default for PfsAllocator<System> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A> PfsAllocator<A> {
    /// Wraps `inner`, attributing unscoped allocations to `default`.
    pub const fn with(inner: A, default: &'static LazyMemoryClass) -> Self {
        Self { inner, default }
    }
}

/// The header's layout: one `u64` (two `u32` words, class and magic).
const HEADER_LAYOUT: Layout = Layout::new::<u64>();

/// The layout of the whole block (header area + user bytes) and the
/// offset of the user bytes in it, `front = max(8, l.align())`: the header
/// followed by `l` (`Layout::extend`), so `front + l.size()` bytes aligned
/// to `max(8, l.align())`. Never zero-sized; `None` if too large.
#[inline(always)]
fn outer(l: &Layout) -> Option<(Layout, usize)> {
    // Nearly every block: the header is the 8 bytes in front, and the
    // block is 8-aligned. `Layout::extend`'s general padding arithmetic
    // gives the same, in more instructions; with the size bounded here,
    // the compiler drops `from_size_align`'s own check.
    const FAST_MAX: usize = isize::MAX as usize - 2 * HEADER;
    if l.align() <= HEADER
        && l.size() <= FAST_MAX
        && let Ok(o) = Layout::from_size_align(l.size() + HEADER, HEADER)
    {
        return Some((o, HEADER));
    }
    HEADER_LAYOUT.extend(*l).ok()
}

/// Writes the header of a block accounted to `class` in front of user
/// pointer `p`: the class, then the magic; returns `p`.
///
/// # Safety
/// `p` must be 8-aligned, and the 8 bytes before it must be memory of one
/// live block that the caller may write (the header area of a block of
/// this allocator).
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn write_header(p: *mut u8, class: u32) -> *mut u8 {
    // The two `u32` words in memory order, stored at once.
    let (c, m) = (class.to_ne_bytes(), MAGIC.to_ne_bytes());
    let word = u64::from_ne_bytes([c[0], c[1], c[2], c[3], m[0], m[1], m[2], m[3]]);
    // SAFETY: by the contract, `p - 8` is in the same block as `p` (so
    // `sub` stays in bounds) and the 8 bytes there are writable; `p` and so
    // `p - 8` are 8-aligned, so the `u64` write is aligned. No reference
    // to those bytes exists: the program only ever sees the memory from
    // `p` on.
    unsafe { p.sub(HEADER).cast::<u64>().write(word) };
    p
}

/// Reads the class (or `NONE_U32`) from the header in front of user
/// pointer `p`.
///
/// # Safety
/// `p` must have been returned by a [`PfsAllocator`] and not freed yet.
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn read_header(p: *mut u8) -> u32 {
    // SAFETY: such a `p` is 8-aligned with the block's header in the 8
    // bytes before it, written by `write_header` when the block was handed
    // out (allocation or `realloc`) and not touched since: the program
    // only ever sees the memory from `p` on. So both reads are in bounds,
    // aligned and of initialised `u32`s.
    let (class, magic) = unsafe {
        let h = p.sub(HEADER).cast::<u32>();
        (
            h.read(),
            if cfg!(debug_assertions) {
                h.add(1).read()
            } else {
                MAGIC
            },
        )
    };
    debug_assert_eq!(magic, MAGIC, "block not from PfsAllocator");
    class
}

impl<A: GlobalAlloc> PfsAllocator<A> {
    /// Accounts a new block of `size` bytes; the class to store (or
    /// `NONE_U32`).
    #[inline(always)]
    fn account(&self, size: usize) -> u32 {
        if in_pfs() {
            return NONE_U32;
        }
        // Resolving the default class registers it once (a slow path,
        // itself marked reentrant). Before `init` every class is disabled,
        // so nothing is counted.
        let class = match scope() {
            Some(c) => c,
            None => self.default.get().0,
        };
        if account_alloc(class, size as u64) {
            class.index
        } else {
            NONE_U32
        }
    }

    /// Accounts the free of a block of `size` bytes whose header says
    /// `class`.
    #[inline(always)]
    fn release(size: usize, class: u32) {
        if class != NONE_U32 {
            account_free(class, size as u64);
        }
    }

    /// `alloc` and `alloc_zeroed`: takes a block of `outer(layout)` from
    /// the inner allocator (zeroed if asked), accounts it and writes its
    /// header; returns the user pointer, or null. Safe to call with any
    /// layout: the outer layout is never zero-sized.
    #[allow(unsafe_code)]
    #[inline(always)]
    fn alloc_block(&self, layout: &Layout, zeroed: bool) -> *mut u8 {
        let Some((o, front)) = outer(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `o` has a non-zero size (at least `HEADER` bytes), the
        // one precondition of `GlobalAlloc::alloc` and `alloc_zeroed`.
        let base = unsafe {
            if zeroed {
                self.inner.alloc_zeroed(o)
            } else {
                self.inner.alloc(o)
            }
        };
        if base.is_null() {
            return base;
        }
        let class = self.account(layout.size());
        // SAFETY: `base` is a live block of layout `o`, aligned to
        // `o.align()` and `front + layout.size()` bytes long, that nobody
        // else uses yet. So `base + front` is in bounds, and 8-aligned as
        // `front` and `o.align()` are multiples of 8; the 8 bytes before it
        // are in the block (`front >= 8`).
        unsafe { write_header(base.add(front), class) }
    }
}

// SAFETY: every block is obtained from `inner` with `outer(layout)`, whose
// alignment is at least the requested one and at least 8; the user
// pointer is `front` bytes in (see `outer`), a multiple of the alignment, so it
// is suitably aligned and has `layout.size()` bytes after it, which are
// the program's alone (the header lies before them). `dealloc` and
// `realloc` recompute the same outer layout from the layout they are given
// (GlobalAlloc's contract: the one used to allocate), and `realloc` keeps
// the alignment, so the header stays `front` bytes in front.
#[allow(unsafe_code)]
unsafe impl<A: GlobalAlloc> GlobalAlloc for PfsAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.alloc_block(&layout, false)
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.alloc_block(&layout, true)
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was returned by this allocator and not freed yet
        // (the caller's contract), as `read_header` requires.
        let class = unsafe { read_header(ptr) };
        Self::release(layout.size(), class);
        let (o, front) = outer(&layout).expect("layout was valid at allocation");
        // SAFETY: `ptr` was allocated with `layout` (the caller's
        // contract), so its block starts `front` bytes before it and was
        // allocated from `inner` with `o`, and is freed once.
        unsafe { self.inner.dealloc(ptr.sub(front), o) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (o, f) = outer(&layout).expect("layout was valid at allocation");
        // The new outer size must be a valid size at the same alignment
        // (`inner.realloc`'s contract): too large is an allocation failure.
        let Some(new_o) = new_size
            .checked_add(f)
            .and_then(|n| Layout::from_size_align(n, o.align()).ok())
        else {
            return std::ptr::null_mut();
        };
        // SAFETY: `ptr` was returned by this allocator and not freed yet
        // (the caller's contract).
        let old_class = unsafe { read_header(ptr) };
        // SAFETY: the block starts `f` bytes before `ptr` and was allocated
        // from `inner` with `o` (as in `dealloc`); `new_o.size()` is
        // non-zero and does not overflow `isize` once rounded up to
        // `o.align()` (`Layout::from_size_align` checked it).
        let base = unsafe { self.inner.realloc(ptr.sub(f), o, new_o.size()) };
        if base.is_null() {
            return base; // the old block is untouched, still accounted
        }
        Self::release(layout.size(), old_class);
        let class = self.account(new_size);
        // SAFETY: `base` is a live block of `new_o` (alignment kept), `f +
        // new_size` bytes long, the header area copied from the old block
        // or not: either way its 8 bytes before `base + f` are ours to
        // overwrite (`f >= 8`, a multiple of 8, as is the alignment).
        unsafe { write_header(base.add(f), class) }
    }
}
