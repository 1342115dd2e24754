//! Layer 3. `SOURCE` capture without formatting on the hot path: each call
//! site (a `#[track_caller]` `&'static Location`, or a [`CallSite`] an
//! adapter names) is interned once into the segment's string table; later
//! events find its index in a small process-local lock-free table keyed by
//! the site's address.

use std::panic::Location;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};

use pfs_shm_layout::layout::NONE_U32;

use crate::reentry::reentrant;
use crate::runtime::Runtime;

/// A call site named by an adapter for the events it starts on behalf of
/// code elsewhere: `SOURCE` shows its `file:line` instead of the line of
/// the call into `pfs-client`. A tracing layer, for instance, gives the
/// span's callsite (`tracing::Metadata::file` and `line`). A site is
/// known by its address: keep one `'static` value per call site.
///
/// ```
/// use pfs_client::{CallSite, LazyStatementClass};
/// static JOB: LazyStatementClass = LazyStatementClass::new("statement/app/job");
/// static HANDLER: CallSite = CallSite::new("src/handlers.rs", 42);
///
/// let stmt = JOB.get().start_task_at(&HANDLER); // SOURCE handlers.rs:42
/// drop(stmt);
/// ```
#[derive(Debug)]
pub struct CallSite {
    file: &'static str,
    line: u32,
}

impl CallSite {
    /// The site at `line` of `file` (shown as its last path component).
    pub const fn new(file: &'static str, line: u32) -> Self {
        Self { file, line }
    }
}

/// What `SOURCE` can name: a file and a line, at a `'static` address that
/// identifies the site.
pub(crate) trait Site: Sync {
    fn file(&self) -> &'static str;
    fn line(&self) -> u32;
}

impl Site for Location<'static> {
    fn file(&self) -> &'static str {
        Location::file(self)
    }
    fn line(&self) -> u32 {
        Location::line(self)
    }
}

impl Site for CallSite {
    fn file(&self) -> &'static str {
        self.file
    }
    fn line(&self) -> u32 {
        self.line
    }
}

const SLOTS: usize = 4096;

struct Slot {
    key: AtomicUsize,
    id: AtomicU32,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        key: AtomicUsize::new(0),
        id: AtomicU32::new(NONE_U32),
    }
}; SLOTS];

/// The string index of `loc`, interning it on first sight. Inlined: the
/// location's home slot is looked at in line (a multiply, a shift and two
/// loads), so that the caller keeps its registers; a collision, a first
/// sight or a full table take the out-of-line probe.
#[inline(always)]
pub(crate) fn source_id(rt: &Runtime, loc: &'static dyn Site) -> u32 {
    let key = loc as *const dyn Site as *const () as usize;
    let i = (key >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - 12);
    let slot = &TABLE[i];
    if slot.key.load(Acquire) == key {
        // `NONE_U32` while another thread is interning it.
        return slot.id.load(Acquire);
    }
    probe(rt, loc, key, i)
}

/// [`source_id`] past the home slot `i` of `key`: linear probing over at
/// most 16 slots (`NONE_U32` if all are taken by other locations).
#[inline(never)]
fn probe(rt: &Runtime, loc: &'static dyn Site, key: usize, mut i: usize) -> u32 {
    for _ in 0..16 {
        let slot = &TABLE[i];
        let k = slot.key.load(Acquire);
        if k == key {
            // `NONE_U32` while another thread is interning it.
            return slot.id.load(Acquire);
        }
        if k == 0 {
            return intern_slow(rt, loc, slot, key);
        }
        i = (i + 1) & (SLOTS - 1);
    }
    NONE_U32
}

#[cold]
#[inline(never)]
fn intern_slow(rt: &Runtime, loc: &'static dyn Site, slot: &Slot, key: usize) -> u32 {
    if slot.key.compare_exchange(0, key, AcqRel, Acquire).is_err() {
        return NONE_U32; // lost the race for this slot; next event finds it
    }
    let file = loc.file().rsplit(['/', '\\']).next().unwrap_or(loc.file());
    let id = reentrant(|| rt.writer.intern(&format!("{file}:{}", loc.line()))).unwrap_or(NONE_U32);
    slot.id.store(id, Release);
    id
}
