//! A `GlobalAlloc` wrapper that accounts every heap allocation of an
//! instrumented thread to the memory instrument in scope
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
//! Every block gets a 16-byte header just before the pointer returned to
//! the program: the requested size, the class index (or `u32::MAX` when
//! the allocation was not counted) and a magic word. The header area is
//! padded to the block's alignment (`max(16, align)` bytes in front), so
//! the user pointer keeps its alignment; `realloc` moves the header with
//! the block. The free reads the header: it is accounted exactly when the
//! allocation was, against the allocation's instrument, whatever the
//! flags and the scope say by then. `realloc` counts as the free of the
//! old block and the allocation of the new one.
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

use std::alloc::{GlobalAlloc, Layout, System};

use pfs_shm_layout::layout::NONE_U32;

use crate::LazyMemoryClass;
use crate::memory::{account_alloc, account_free, scope};

/// Bytes of the block header.
const HEADER: usize = 16;
/// Marks a block allocated by [`PfsAllocator`].
const MAGIC: u32 = 0x5046_534d; // "PFSM"

/// The default instrument of [`PfsAllocator::new`].
pub static DEFAULT_CLASS: LazyMemoryClass = LazyMemoryClass::new("memory/pfs_client/default");

/// The accounting allocator; see the module documentation.
#[derive(Debug)]
pub struct PfsAllocator<A = System> {
    inner: A,
    default: &'static LazyMemoryClass,
}

impl PfsAllocator<System> {
    /// Wraps the system allocator; unscoped allocations go to
    /// `memory/pfs_client/default`.
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

/// Front padding of a block of layout `l`: the header, rounded up to the
/// alignment.
#[inline(always)]
fn front(l: &Layout) -> usize {
    l.align().max(HEADER)
}

/// The layout of the whole block (header area + user bytes).
#[inline(always)]
fn outer(l: &Layout) -> Option<Layout> {
    let size = l.size().checked_add(front(l))?;
    Layout::from_size_align(size, l.align().max(HEADER)).ok()
}

impl<A: GlobalAlloc> PfsAllocator<A> {
    /// Accounts a new block of `size` bytes; the class to store (or
    /// `NONE_U32`).
    #[inline(always)]
    fn account(&self, size: usize) -> u32 {
        if crate::thread::in_pfs() || crate::runtime::get().is_none() {
            return NONE_U32;
        }
        // Resolving the default class registers it once (a slow path,
        // itself marked reentrant).
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

    /// Writes the header in front of user pointer `p`.
    ///
    /// # Safety
    /// `p` must be at least [`HEADER`] bytes into a block we allocated.
    #[inline(always)]
    unsafe fn write_header(p: *mut u8, size: usize, class: u32) {
        // SAFETY: the caller guarantees the 16 bytes before `p` are ours;
        // `p` is at least 16-aligned, so both words are aligned.
        unsafe {
            let h = p.sub(HEADER) as *mut u64;
            h.write(size as u64);
            h.add(1).write(u64::from(class) | (u64::from(MAGIC) << 32));
        }
    }

    /// Reads `(size, class)` from the header of user pointer `p`.
    ///
    /// # Safety
    /// `p` must have been returned by this allocator and not yet freed.
    #[inline(always)]
    unsafe fn read_header(p: *mut u8) -> (u64, u32) {
        // SAFETY: as in `write_header`; the header was written at alloc.
        unsafe {
            let h = p.sub(HEADER) as *const u64;
            let w = h.add(1).read();
            debug_assert_eq!((w >> 32) as u32, MAGIC, "block not from PfsAllocator");
            (h.read(), w as u32)
        }
    }

    #[inline(always)]
    fn release(size: u64, class: u32) {
        if class != NONE_U32 {
            account_free(class, size);
        }
    }
}

// SAFETY: every block is obtained from `inner` with `outer(layout)`, whose
// alignment is at least the requested one and at least 16; the user
// pointer is `front(layout)` bytes in, a multiple of the alignment, so it
// is suitably aligned and has `layout.size()` bytes after it. `dealloc`
// and `realloc` recompute the same outer layout from the layout they are
// given (GlobalAlloc's contract: the one used to allocate).
impl<A: GlobalAlloc> PfsAllocator<A> {
    /// Accounts a fresh block and writes its header; returns the user pointer.
    ///
    /// # Safety
    /// `base` must be a non-null block allocated with `outer(layout)`.
    #[inline]
    unsafe fn finish_alloc(&self, base: *mut u8, layout: &Layout) -> *mut u8 {
        let class = self.account(layout.size());
        // SAFETY: `front` bytes lie before the user pointer within the block
        // (caller contract: `base` has the outer layout).
        unsafe {
            let p = base.add(front(layout));
            Self::write_header(p, layout.size(), class);
            p
        }
    }
}

unsafe impl<A: GlobalAlloc> GlobalAlloc for PfsAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(o) = outer(&layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `o` has a non-zero size.
        let base = unsafe { self.inner.alloc(o) };
        if base.is_null() {
            return base;
        }
        // SAFETY: `base` is a fresh block of the outer layout of `layout`.
        unsafe { self.finish_alloc(base, &layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let Some(o) = outer(&layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `o` has a non-zero size.
        let base = unsafe { self.inner.alloc_zeroed(o) };
        if base.is_null() {
            return base;
        }
        // SAFETY: as in `alloc`.
        unsafe { self.finish_alloc(base, &layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with `layout` (caller contract).
        let (size, class) = unsafe { Self::read_header(ptr) };
        Self::release(size, class);
        let o = outer(&layout).expect("layout was valid at allocation");
        // SAFETY: the block starts `front` bytes before `ptr`, allocated
        // from `inner` with layout `o`.
        unsafe { self.inner.dealloc(ptr.sub(front(&layout)), o) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let f = front(&layout);
        let o = outer(&layout).expect("layout was valid at allocation");
        let Some(new_outer) = new_size.checked_add(f) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `ptr` came from `alloc` with `layout`.
        let (old_size, old_class) = unsafe { Self::read_header(ptr) };
        // SAFETY: the block was allocated from `inner` with `o`; the
        // alignment is unchanged, so the header stays `f` bytes in front.
        let base = unsafe { self.inner.realloc(ptr.sub(f), o, new_outer) };
        if base.is_null() {
            return base; // the old block is untouched, still accounted
        }
        Self::release(old_size, old_class);
        let class = self.account(new_size);
        // SAFETY: as in `alloc`.
        unsafe {
            let p = base.add(f);
            Self::write_header(p, new_size, class);
            p
        }
    }
}
