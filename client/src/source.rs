//! Layer 3. `SOURCE` capture without formatting on the hot path: each call
//! site (a `#[track_caller]` `&'static Location`, a [`CallSite`] an
//! adapter names, or any other [`Site`], such as the C ABI's
//! `pfs_site_t`) is interned once into the segment's string table; later
//! events find its index in a small process-local lock-free table keyed by
//! the site's address.

use std::panic::Location;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

use pfs_shm_layout::layout::{LostKind, NONE_U32};

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
/// let stmt = JOB.get().start_task_at(Some(&HANDLER)); // SOURCE handlers.rs:42
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
/// identifies the site. The address is the key: the file and line are read
/// once, at the site's first event in the process (`SOURCE` shows
/// `file:line`, the file's last path component). Implemented by
/// [`CallSite`] and `std::panic::Location`; an adapter whose sites come
/// from elsewhere (the C ABI's `pfs_site_t`, one `static` per call site)
/// implements it for its own type. Each site needs an address of its own:
/// a value of a zero-sized type has none (all such values share one, and
/// show the first one's `SOURCE`).
///
/// ```
/// use pfs_client::{LazyStageClass, Site};
///
/// /// A site whose line is known at build time.
/// struct Generated(u32);
///
/// impl Site for Generated {
///     fn file(&self) -> &str {
///         "generated.rs"
///     }
///     fn line(&self) -> u32 {
///         self.0
///     }
/// }
///
/// static AT_7: Generated = Generated(7);
/// static PARSE: LazyStageClass = LazyStageClass::new("stage/app/parse");
/// PARSE.get().enter_at(Some(&AT_7)); // SOURCE generated.rs:7
/// ```
pub trait Site: Sync {
    /// The file, as a path (only its last component is shown).
    fn file(&self) -> &str;
    /// The line in it.
    fn line(&self) -> u32;
}

impl std::fmt::Debug for dyn Site + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file(), self.line())
    }
}

impl Site for Location<'static> {
    fn file(&self) -> &str {
        Location::file(self)
    }
    fn line(&self) -> u32 {
        Location::line(self)
    }
}

impl Site for CallSite {
    fn file(&self) -> &str {
        self.file
    }
    fn line(&self) -> u32 {
        self.line
    }
}

/// A `SOURCE` as an out-of-line entry point takes it: the caller's
/// location (always there), or an adapter's site (perhaps none). Generic,
/// so that an entry point given a location knows it is there (no test of
/// an `Option` on the hot path).
pub(crate) trait SourceArg: Copy {
    fn site(self) -> Option<&'static dyn Site>;
}

impl SourceArg for &'static Location<'static> {
    #[inline(always)]
    fn site(self) -> Option<&'static dyn Site> {
        Some(self)
    }
}

impl SourceArg for Option<&'static dyn Site> {
    #[inline(always)]
    fn site(self) -> Option<&'static dyn Site> {
        self
    }
}

/// Call sites the table holds (by address): 16 Ki slots of 16 bytes, in
/// zero pages that cost memory only once a slot in them is taken.
const SLOTS: usize = 1 << 14;

/// Slots a site is looked for in past its home slot.
const PROBES: usize = 32;

/// One call site: its address (0: a free slot) and its string index.
struct Slot {
    key: AtomicUsize,
    /// The string index XOR [`PENDING`], so that a slot is all zeros
    /// until taken and the table lies in zero pages (`.bss`).
    id_x: AtomicU32,
}

impl Slot {
    /// The site's string index, `PENDING` until interned.
    #[inline(always)]
    fn id(&self) -> u32 {
        self.id_x.load(Acquire) ^ PENDING
    }

    fn set_id(&self, id: u32) {
        self.id_x.store(id ^ PENDING, Release);
    }
}

/// A slot's id while the thread that took the slot interns its site
/// (then the string's index, or `NONE_U32` if the string table is full).
const PENDING: u32 = NONE_U32 - 1;

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        key: AtomicUsize::new(0),
        id_x: AtomicU32::new(0),
    }
}; SLOTS];

/// The string index of `loc`, interning it on first sight. Inlined: the
/// location's home slot is looked at in line (a multiply, a shift and two
/// loads), so that the caller keeps its registers; a collision, a first
/// sight or a full table take the out-of-line probe.
#[inline(always)]
pub(crate) fn source_id(rt: &Runtime, loc: &'static dyn Site) -> u32 {
    let key = loc as *const dyn Site as *const () as usize;
    let i =
        (key >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - SLOTS.trailing_zeros());
    let slot = &TABLE[i];
    if slot.key.load(Acquire) == key {
        let id = slot.id();
        if id != PENDING {
            return id;
        }
        // Another thread is interning it: so does this one.
        return intern(rt, loc);
    }
    probe(rt, loc, key, i)
}

/// [`source_id`] past the home slot `i` of `key`: linear probing over at
/// most [`PROBES`] slots. If all are taken by other sites (a process with
/// well over ten thousand call sites), the event has no `SOURCE`, and the
/// site is counted as a lost string once (see [`count_unnamed`]).
#[inline(never)]
fn probe(rt: &Runtime, loc: &'static dyn Site, key: usize, mut i: usize) -> u32 {
    for _ in 0..PROBES {
        let slot = &TABLE[i];
        let k = slot.key.load(Acquire);
        if k == key {
            let id = slot.id();
            return if id == PENDING { intern(rt, loc) } else { id };
        }
        if k == 0 {
            return intern_slow(rt, loc, slot, key);
        }
        i = (i + 1) & (SLOTS - 1);
    }
    count_unnamed(rt, key);
    NONE_U32
}

/// Sites the table had no room for, by a hash of their address: one bit
/// each (128 Ki bits, in zero pages until used).
static UNNAMED: [AtomicU64; 1 << 11] = [const { AtomicU64::new(0) }; 1 << 11];

/// Counts a site the table has no room for as a lost string, once: its
/// later events read its bit (a shared line read, not written), so they
/// write nothing shared. Two such sites whose addresses hash alike count
/// once.
#[cold]
fn count_unnamed(rt: &Runtime, key: usize) {
    let h = (key >> 3).wrapping_mul(0xD6E8_FEB8_6659_FD93) >> (usize::BITS - 17);
    let (word, bit) = (&UNNAMED[h / 64], 1u64 << (h % 64));
    if word.load(Relaxed) & bit == 0 && word.fetch_or(bit, Relaxed) & bit == 0 {
        rt.writer.segment().count_lost(LostKind::Strings);
    }
}

/// Takes the free `slot` for `key` and interns `loc` into it. A thread
/// that loses the slot to another interns `loc` all the same (the string
/// table gives one index per string): every event has its `SOURCE`, also
/// at a first sight that races with another thread's.
#[cold]
#[inline(never)]
fn intern_slow(rt: &Runtime, loc: &'static dyn Site, slot: &Slot, key: usize) -> u32 {
    let won = slot.key.compare_exchange(0, key, AcqRel, Acquire).is_ok();
    let id = intern(rt, loc);
    if won {
        slot.set_id(id);
    }
    id
}

/// The string index of `loc`'s `file:line` (its file's last component),
/// interned now (under the writer's lock: first sights only).
#[cold]
#[inline(never)]
fn intern(rt: &Runtime, loc: &'static dyn Site) -> u32 {
    debug_assert!(
        size_of_val(loc) != 0,
        "a zero-sized Site has no address of its own"
    );
    let file = loc.file().rsplit(['/', '\\']).next().unwrap_or(loc.file());
    reentrant(|| rt.writer.intern(&format!("{file}:{}", loc.line()))).unwrap_or(NONE_U32)
}
