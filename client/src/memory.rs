//! Layer 6. Memory instruments (`memory/<area>/<name>`): explicit
//! accounting with tokens, the accounting itself (shared with the
//! `GlobalAlloc` wrapper of the `alloc` module), and the scope that the
//! wrapper attributes heap allocations to.
//!
//! Rules (the MySQL manual's): a block is instrumented only if both the
//! thread (`INSTRUMENTED`) and the instrument (`ENABLED`) are enabled when
//! it is allocated; its free is instrumented exactly when its allocation
//! was, whatever the flags say by then, and is attributed to the
//! allocation's instrument. A [`MemoryToken`] carries that decision.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pfs_shm_layout::layout::{MAX_CLASSES_LIMIT, NONE_U32};
use pfs_shm_layout::writer::{MemoryRowRef, memory_row_alloc, memory_row_free};

use crate::class::{ClassRef, Family, LazyRef};
use crate::context::ThreadCtx;
use crate::reentry::{in_pfs, reentrant};
use crate::runtime::{self, Runtime};
use crate::thread;

/// A memory instrument registered on first use after [`crate::init`].
///
/// ```no_run
/// use pfs_client::LazyMemoryClass;
/// static BUF: LazyMemoryClass = LazyMemoryClass::new("memory/kvstore/row_buffer");
///
/// let token = BUF.alloc(4096); // COUNT_ALLOC + 1, CURRENT + 4096 bytes
/// // ... use the buffer ...
/// token.free(); // or drop it
/// ```
#[derive(Debug)]
pub struct LazyMemoryClass(LazyRef);

impl LazyMemoryClass {
    /// Declares a memory instrument named `memory/<area>/<name>`.
    pub const fn new(name: &'static str) -> Self {
        Self(LazyRef::new(name))
    }

    /// The instrument's name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// The registered instrument (disabled before `init`).
    #[inline(always)]
    pub fn get(&self) -> MemoryClass {
        MemoryClass(self.0.get(Family::Memory))
    }

    /// Accounts an allocation of `size` bytes; see [`MemoryClass::alloc`].
    #[inline]
    pub fn alloc(&self, size: u64) -> MemoryToken {
        self.get().alloc(size)
    }
}

/// A registered memory instrument.
#[derive(Debug, Clone, Copy)]
pub struct MemoryClass(pub(crate) ClassRef);

impl MemoryClass {
    /// Registers (or finds) `memory/<area>/<name>` (disabled before
    /// `init`; a name that is not a memory instrument's is disabled,
    /// logged and counted in `pfs_lost_total{kind="instrument_classes"}`).
    ///
    /// ```
    /// let buf = pfs_client::MemoryClass::register("memory/app/buf");
    /// assert!(!buf.is_enabled()); // not initialised here
    /// ```
    pub fn register(name: &str) -> Self {
        Self(ClassRef::register(name, Family::Memory))
    }

    /// PFS `ENABLED` right now.
    pub fn is_enabled(&self) -> bool {
        self.0.enabled()
    }

    /// Accounts an allocation of `size` bytes by the calling thread, if
    /// both the thread and the instrument are enabled. The token remembers
    /// whether it was counted; freeing it (explicitly or by dropping it)
    /// accounts the free exactly when the allocation was counted.
    #[inline]
    pub fn alloc(&self, size: u64) -> MemoryToken {
        let counted = account_alloc(self.0, size);
        MemoryToken {
            class: if counted { self.0.index } else { NONE_U32 },
            size,
        }
    }
}

/// One accounted (or deliberately not accounted) allocation. Freeing it,
/// on any thread, accounts the free against the allocating instrument iff
/// the allocation was counted.
#[derive(Debug)]
#[must_use = "dropping the token frees the accounted memory at once"]
pub struct MemoryToken {
    class: u32,
    size: u64,
}

impl MemoryToken {
    /// Whether the allocation was counted (so the free will be).
    pub fn counted(&self) -> bool {
        self.class != NONE_U32
    }

    /// Bytes accounted by this token.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Accounts the free (same as dropping the token).
    pub fn free(self) {}
}

impl Drop for MemoryToken {
    fn drop(&mut self) {
        if self.class != NONE_U32 {
            account_free(self.class, self.size);
        }
    }
}

/// Accounts an allocation; `true` if it was counted. Hot path: the
/// class's flags word, the thread's context pointer (one thread-local
/// read) and its `INSTRUMENTED` flag, the truncation generation, then the
/// row update; a thread not registered yet takes the cold path.
#[inline(always)]
pub(crate) fn account_alloc(class: ClassRef, size: u64) -> bool {
    if !class.enabled() {
        return false;
    }
    let Some(ctx) = thread::live() else {
        return account_alloc_unregistered(class, size);
    };
    alloc_on(ctx, class, size)
}

/// The row update of a counted allocation, if the thread is instrumented.
#[inline(always)]
fn alloc_on(ctx: &'static ThreadCtx, class: ClassRef, size: u64) -> bool {
    if !ctx.instrumented.get() {
        return false;
    }
    let tgen = ctx.memory_truncate_gen.load(Relaxed);
    if let Some(row) = row_of(ctx, class.index, tgen) {
        memory_row_alloc(row, size, tgen);
    }
    true
}

/// The thread's row of memory class `class`: the memo when it holds that
/// class (one compare), else the record's lookup.
#[inline(always)]
fn row_of(ctx: &'static ThreadCtx, class: u32, tgen: u64) -> Option<MemoryRowRef<'static>> {
    let (memo, row) = ctx.memory_memo.get();
    if memo == class {
        Some(row)
    } else {
        memo_miss(ctx, class, tgen)
    }
}

/// [`row_of`] for another class than the memo's: looks the row up (first
/// touching it if need be) and remembers it.
#[cold]
#[inline(never)]
fn memo_miss(ctx: &'static ThreadCtx, class: u32, tgen: u64) -> Option<MemoryRowRef<'static>> {
    let row = ctx.rec.memory_row(class as usize, tgen)?;
    ctx.memory_memo.set((class, row));
    Some(row)
}

/// [`account_alloc`] by a thread without a live context: registers it
/// (unless inside a client slow path) and accounts there; not counted if
/// it has no record.
#[cold]
#[inline(never)]
fn account_alloc_unregistered(class: ClassRef, size: u64) -> bool {
    let Some(rt) = runtime::get() else {
        return false;
    };
    thread::with_ctx_memory(rt, |ctx| alloc_on(ctx, class, size)).unwrap_or(false)
}

/// Frees by threads without a record, made while that thread ran a
/// client slow path (so the writer's lock could not be taken): published
/// with the next such free made outside one. Per class: count, bytes.
static PENDING: [[AtomicU64; 2]; MAX_CLASSES_LIMIT as usize] =
    [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_CLASSES_LIMIT as usize];
static PENDING_ANY: AtomicU64 = AtomicU64::new(0);

/// Accounts the free of a counted allocation of class `class`: on the
/// calling thread's row, or, for a thread without a record (it exited or
/// is exiting: TLS destructors run after the record was folded), on the
/// global row, so that the global CURRENT stays exactly alloc − free.
/// Hot path: the thread's context pointer, the truncation generation, the
/// row update.
#[inline(always)]
pub(crate) fn account_free(class: u32, size: u64) {
    match thread::live() {
        Some(ctx) => free_on(ctx, class, size),
        None => account_free_unregistered(class, size),
    }
}

/// The row update of a counted free.
#[inline(always)]
fn free_on(ctx: &'static ThreadCtx, class: u32, size: u64) {
    let tgen = ctx.memory_truncate_gen.load(Relaxed);
    if let Some(row) = row_of(ctx, class, tgen) {
        memory_row_free(row, size, tgen);
    }
}

/// [`account_free`] by a thread without a live context: registers it
/// (unless inside a client slow path) and accounts there, or accounts on
/// the global row if it has no record.
#[cold]
#[inline(never)]
fn account_free_unregistered(class: u32, size: u64) {
    let Some(rt) = runtime::get() else {
        return;
    };
    if thread::with_ctx_memory(rt, |ctx| free_on(ctx, class, size)).is_none() {
        free_without_record(rt, class, size);
    }
}

#[cold]
#[inline(never)]
fn free_without_record(rt: &'static Runtime, class: u32, size: u64) {
    if in_pfs() {
        if let Some(p) = PENDING.get(class as usize) {
            p[0].fetch_add(1, Relaxed);
            p[1].fetch_add(size, Relaxed);
            PENDING_ANY.store(1, Relaxed);
        }
        return;
    }
    reentrant(|| {
        rt.writer.memory_free_global(class as usize, 1, size);
        if PENDING_ANY.swap(0, Relaxed) != 0 {
            for (i, p) in PENDING.iter().enumerate() {
                let n = p[0].swap(0, Relaxed);
                if n != 0 {
                    let b = p[1].swap(0, Relaxed);
                    rt.writer.memory_free_global(i, n, b);
                }
            }
        }
    });
}

thread_local! {
    /// The instrument of the innermost [`memory_scope`] (const, no
    /// destructor: readable during thread teardown).
    static SCOPE: Cell<Option<ClassRef>> = const { Cell::new(None) };
}

/// The instrument in scope on this thread, if any.
#[inline(always)]
pub(crate) fn scope() -> Option<ClassRef> {
    SCOPE.with(|s| s.get())
}

/// Attributes this thread's heap allocations (through the global
/// allocator wrapper `pfs_client::alloc::PfsAllocator`) to `class` until
/// the guard drops. Cheap: the class lookup and two thread-local writes
/// (one now, one at the drop). Scopes nest.
///
/// ```
/// use pfs_client::{LazyMemoryClass, memory_scope};
/// static CACHE: LazyMemoryClass = LazyMemoryClass::new("memory/kv/cache");
///
/// let entries = {
///     let _scope = memory_scope(&CACHE);
///     vec![0u8; 1 << 16] // counted as memory/kv/cache, with PfsAllocator
/// }; // the scope ends, `entries` stays counted until it is freed
/// # drop(entries);
/// ```
#[must_use = "the scope ends when the guard drops"]
pub fn memory_scope(class: &'static LazyMemoryClass) -> MemoryScope {
    let c = class.get().0;
    let prev = SCOPE.with(|s| s.replace(Some(c)));
    MemoryScope { prev }
}

/// Exchanges the calling thread's memory scope with `other`: how a task
/// context carries its own scope from poll to poll (the `task` module).
#[inline(always)]
pub(crate) fn swap_scope(other: &mut Option<ClassRef>) {
    *other = SCOPE.with(|s| s.replace(*other));
}

/// Guard of [`memory_scope`]; restores the enclosing scope when dropped.
/// Inside a task (a `pfs_client::task` context) the scope is the task's: it stays
/// with the task across `.await`, whichever worker polls it, and
/// allocations by other tasks on the same worker are not in it.
#[derive(Debug)]
pub struct MemoryScope {
    prev: Option<ClassRef>,
}

impl Drop for MemoryScope {
    fn drop(&mut self) {
        SCOPE.with(|s| s.set(self.prev));
    }
}
