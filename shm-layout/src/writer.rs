//! The writer side of the protocol, used by the instrumented process.
//!
//! * Slow paths (registering a class, interning a string, allocating and
//!   freeing a thread record, adding a page) are serialised by a mutex
//!   local to the creating process; they may take locks, allocate and make
//!   system calls.
//! * The hot path ([`RecordRef::begin_event`], [`RecordRef::end_event`])
//!   writes only the calling thread's own record, with relaxed loads and
//!   stores bracketed by sequence locks: no lock, no syscall, no allocation,
//!   no read-modify-write instruction, no cache line another thread writes.
//!
//! Layer 4 (see the crate docs): builds on [`crate::segment`] (the
//! mapping), [`crate::container`] and [`crate::lockword`] (the record and
//! page protocols) and the layers below; it never reads a snapshot.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::*};

use std::time::{Duration, Instant};

use crate::container::{self, PageState};
use crate::error::SegmentError;
use crate::kinds::{ClassKind, EventKind, IoMode};
use crate::layout::*;
use crate::lockword;
use crate::segment::{RecordRef, Segment, io_tail, touched_classes};
use crate::seqlock::SeqLock;
use crate::text::{fnv1a32, store_bytes, store_prefix, truncate_utf8};

// Moved to `tsc` (the unsafe fence) and `values` (below the reader);
// re-exported at their old paths.
#[cfg(target_arch = "x86_64")]
pub use crate::tsc::read_tsc;
pub use crate::values::StatementFigures;

/// A segment owned by this process, with the slow-path state that
/// serialises registration, allocation and folding.
#[derive(Debug)]
pub struct SegmentWriter {
    seg: Segment,
    slow: Mutex<SlowState>,
    /// Per `history_long` ring (by [`EventKind::index`]): a [`LongState`]
    /// as its discriminant.
    long_state: [AtomicU8; 3],
    /// Bumped (under the process lock) whenever a record may have become
    /// free for an allocator that already scanned past it: a record
    /// released, a page added, revived or given back ACTIVE by the
    /// reclaimer. An allocator adds a page only if this did not move during
    /// its whole scan, i.e. it really found every record taken.
    epoch: AtomicU64,
    /// Where the next scan starts: the page of the last record released or
    /// taken (the most likely place for a free record). Only a hint: every
    /// scan still wraps around all pages.
    hint: AtomicU32,
}

#[derive(Debug, Default)]
struct SlowState {
    classes: HashMap<String, u32>,
    strings: HashMap<String, u32>,
    /// Strings the full table refused, one bit per hash of theirs
    /// ([`REFUSED_BITS`] bits, 128 KiB, made on the first refusal): each
    /// is counted lost once, however many threads or events ask for it.
    /// Two that hash alike count once: the count falls short by the
    /// collisions, about n² / 2²¹ of n refused strings (0.1 % at 2 500,
    /// 1 % at 20 000), where an exact set would grow with every refused
    /// name in the application's memory.
    refused: Option<Box<[u64]>>,
    /// Per added page: the owner's bookkeeping for reclamation.
    pages: Vec<PageBook>,
    /// Reclaim pages quiet for this long; `None` never reclaims.
    reclaim_after: Option<Duration>,
    /// Totals since creation.
    reclaim: ReclaimStats,
}

/// Process-local bookkeeping of one container page.
#[derive(Debug, Clone, Copy)]
struct PageBook {
    /// When a record of the page was last released (or the page added or
    /// revived): the page is quiet once this is `reclaim_after` old and
    /// every record is FREE.
    last_release: Instant,
    /// Highest record version seen when the page was reclaimed.
    base_version: u64,
}

/// What page reclamation did so far (see [`SegmentWriter::maintain`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimStats {
    /// Pages reclaimed (their bytes returned to the OS).
    pub pages_reclaimed: u64,
    /// Reclaimed pages brought back into use.
    pub pages_revived: u64,
    /// Bytes returned by the reclaims (page size × pages reclaimed).
    pub bytes_reclaimed: u64,
    /// Hole punches that failed (the page stayed ACTIVE).
    pub punch_failures: u64,
}

/// After a `history_long` ring could not be reserved (volume full), its
/// events are counted lost without a lock, and every this many losses one
/// of them tries the reservation again.
pub const LONG_RETRY_EVERY: u64 = 1 << 16;

/// Bits (log2) of the set that counts each string a full string table
/// refuses once: 2^20 bits, 128 KiB of the application's memory, made on
/// the first refusal.
pub const REFUSED_BITS: u32 = 20;

/// The share of the string table (numerator, denominator) that object
/// names leave free for call sites ([`SegmentWriter::intern_object_name`]):
/// a quarter, 512 entries of the default 2048.
pub const OBJECT_NAMES_LEAVE_FREE: (u64, u64) = (1, 4);

/// Where the reservation of a `history_long` ring stands, as stored in
/// [`SegmentWriter`]'s `long_state` (its discriminant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum LongState {
    /// Not reserved yet: the next append (or a prepare) tries.
    NotReserved = 0,
    /// Reserved and usable.
    Reserved = 1,
    /// The reservation failed (volume full): events are counted lost, and
    /// the reservation is tried again every [`LONG_RETRY_EVERY`] of them.
    Failed = 2,
}

impl LongState {
    /// From the stored discriminant (anything unknown is not reserved).
    #[inline(always)]
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Reserved,
            2 => Self::Failed,
            _ => Self::NotReserved,
        }
    }
}

/// Why [`SegmentWriter::alloc_thread`] found no record for a thread (each
/// counted in the segment's lost counters: `thread_instances`, plus
/// `container_pages` for the volume).
#[derive(Debug, thiserror::Error)]
pub enum NoRecord {
    /// Every record of the container's largest size is taken.
    #[error("all {records} thread records of the segment are in use")]
    Full {
        /// The records the segment can hold.
        records: u32,
    },
    /// The volume could not back a new page of records (it is full).
    #[error("cannot add a page of thread records to the segment: {0}")]
    Volume(#[source] SegmentError),
}

/// A thread record owned by the calling thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSlot {
    /// Record index in the container.
    pub index: u32,
    /// Lock-word version of this lifetime.
    pub version: u64,
}

/// Everything one event row holds, in the writer's registers.
///
/// The two kind fields hold wire words ([`EventKind::wire`]), not
/// `Option<EventKind>`s: an enum field would be the niche of an `Option`
/// of a struct holding an `EventData` (the client's event in flight), and
/// that `None` would then be a copy of a whole row instead of a zero word.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventData {
    /// `EVENT_ID`.
    pub event_id: u64,
    /// `END_EVENT_ID` (with [`EV_ENDED`]).
    pub end_event_id: u64,
    /// Class index.
    pub class: u32,
    /// [`crate::kinds::Operation`] value.
    pub operation: u32,
    /// Start, raw ticks.
    pub timer_start: u64,
    /// End, raw ticks.
    pub timer_end: u64,
    /// Duration in ps.
    pub timer_wait: u64,
    /// `OBJECT_INSTANCE_BEGIN`.
    pub object_instance: u64,
    /// `NUMBER_OF_BYTES`.
    pub bytes: u64,
    /// `SPINS`.
    pub spins: u64,
    /// Source string index or [`NONE_U32`].
    pub source: u32,
    /// Object name string index or [`NONE_U32`].
    pub object_name: u32,
    /// `NESTING_EVENT_ID`.
    pub nesting_event_id: u64,
    /// `NESTING_EVENT_TYPE` as stored: [`EventKind::wire`] of the parent
    /// event's kind (0: none).
    pub nesting_event_type: u32,
    /// `EV_*` flags.
    pub flags: u32,
    /// This event's own kind as stored: [`EventKind::wire`] (0: not
    /// said).
    pub event_type: u32,
    /// `THREAD_ID` (written to `history_long` slots).
    pub thread_id: u64,
}

/// An `events_*_current` row being started (see
/// [`RecordRef::begin_event_open`]): published when `TIMER_START` is stored.
#[must_use = "the row is published by `publish`"]
#[derive(Debug)]
pub struct StartedRow<'a> {
    row: &'a EventRecord,
    _write: crate::seqlock::SeqWriteGuard<'a>,
}

impl StartedRow<'_> {
    /// Stores `TIMER_START` and publishes the row.
    #[inline(always)]
    pub fn publish(self, timer_start: u64) {
        self.row.timer_start.store(timer_start, Relaxed);
    }
}

/// The name a class is registered under: `name`, its control characters
/// (a NUL, a newline: nothing an exporter's label should carry) replaced by
/// `?`, if it fits the class table's [`CLASS_NAME_BYTES`]; else its first
/// bytes (cut at a character boundary) followed by `~` and eight hex
/// digits of a hash (FNV-1a) of the whole name, so that two long names
/// sharing a prefix stay two classes, and one long name is always the
/// same class.
///
/// ```
/// use pfs_shm_layout::layout::CLASS_NAME_BYTES;
/// use pfs_shm_layout::writer::class_name_that_fits;
///
/// assert_eq!(class_name_that_fits("wait/synch/mutex/app/m"), "wait/synch/mutex/app/m");
/// let long = |tail: &str| format!("statement/http/GET /{}{tail}", "x".repeat(120));
/// let (long_a, long_b) = (long("a"), long("b"));
/// let (a, b) = (class_name_that_fits(&long_a), class_name_that_fits(&long_b));
/// assert!(a.len() <= CLASS_NAME_BYTES && b.len() <= CLASS_NAME_BYTES);
/// assert_ne!(a, b);
/// assert_eq!(a, class_name_that_fits(&long_a));
/// assert_eq!(class_name_that_fits("wait/io/file/app/a\0b\n"), "wait/io/file/app/a?b?");
/// ```
pub fn class_name_that_fits(name: &str) -> std::borrow::Cow<'_, str> {
    if name.chars().any(char::is_control) {
        let clean: String = name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        return class_name_that_fits(&clean).into_owned().into();
    }
    if name.len() <= CLASS_NAME_BYTES {
        return name.into();
    }
    let hash = fnv1a32(name.as_bytes());
    let head = truncate_utf8(name, CLASS_NAME_BYTES - 9);
    format!("{head}~{hash:08x}").into()
}

/// An object name (a file's path, a peer's address) as the string table
/// keeps it: as it is if it fits [`STRING_BYTES`], else its end (a path's
/// file name and the directories nearest it: what tells two files apart)
/// after `~` and a hash of the whole name, so that two names cut to the
/// same end stay two, and `…` (the start was cut).
///
/// ```
/// use pfs_shm_layout::layout::STRING_BYTES;
/// use pfs_shm_layout::writer::object_name_that_fits;
///
/// assert_eq!(object_name_that_fits("/var/log/app.log"), "/var/log/app.log");
/// let dir = "/var/lib/myservice/data/tenants/000123/segments/shard-07";
/// let (a, b) = (format!("{dir}/000001.log"), format!("{dir}/000002.log"));
/// let (fa, fb) = (object_name_that_fits(&a), object_name_that_fits(&b));
/// assert!(fa.len() <= STRING_BYTES && fb.len() <= STRING_BYTES);
/// assert_ne!(fa, fb);
/// assert!(fa.ends_with("/segments/shard-07/000001.log"), "{fa}");
/// assert!(fa.starts_with('~') && fa.contains('…'), "{fa}");
/// ```
pub fn object_name_that_fits(name: &str) -> std::borrow::Cow<'_, str> {
    if name.len() <= STRING_BYTES {
        return name.into();
    }
    const MARK: &str = "…";
    let hash = fnv1a32(name.as_bytes());
    // `~` and 8 hex digits, the mark, then the end that fits.
    let room = STRING_BYTES - 9 - MARK.len();
    let mut from = name.len() - room;
    while !name.is_char_boundary(from) {
        from += 1;
    }
    format!("~{hash:08x}{MARK}{}", &name[from..]).into()
}

impl SegmentWriter {
    /// Wraps a segment this process created.
    pub fn new(seg: Segment) -> Self {
        let now = Instant::now();
        let book = PageBook {
            last_release: now,
            base_version: 0,
        };
        let slow = SlowState {
            pages: vec![book; seg.pages_added() as usize],
            ..SlowState::default()
        };
        Self {
            seg,
            slow: Mutex::new(slow),
            long_state: [const { AtomicU8::new(LongState::NotReserved as u8) }; 3],
            epoch: AtomicU64::new(0),
            hint: AtomicU32::new(0),
        }
    }

    /// The segment.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    fn slow(&self) -> std::sync::MutexGuard<'_, SlowState> {
        self.slow.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers an instrument class (or returns the existing index for the
    /// same name). `flags` are the initial `FLAG_*` bits. Returns `None`
    /// and counts a lost class when the registry is full. A name longer
    /// than [`CLASS_NAME_BYTES`] is stored as [`class_name_that_fits`]
    /// makes it: two long names stay two classes.
    pub fn register_class(&self, name: &str, kind: ClassKind, flags: u32) -> Option<u32> {
        let fitted = class_name_that_fits(name);
        let name = fitted.as_ref();
        let mut slow = self.slow();
        if let Some(&i) = slow.classes.get(name) {
            return Some(i);
        }
        let i = slow.classes.len() as u32;
        let Some(e) = self.seg.classes().get(i as usize) else {
            self.seg.count_lost(LostKind::Classes);
            return None;
        };
        if kind == ClassKind::Memory {
            // The global row of a memory class is a `MemoryRow`: zero it
            // (creation left SummaryRow's MIN sentinel in it) before the
            // class is published and before any fold can touch it.
            let gh = self.seg.global_header();
            let _w = gh.seq.write();
            clear_memory_row(&self.seg.global_memory_rows()[i as usize], 0);
        }
        e.kind.store(kind as u32, Relaxed);
        e.flags.store(flags, Relaxed);
        store_bytes(&e.name, &e.name_len, name.as_bytes());
        e.state.store(CLASS_READY, Release);
        slow.classes.insert(name.to_string(), i);
        Some(i)
    }

    /// The setup flags word of class `i`, read by writers on every event.
    pub fn class_flags(&self, i: u32) -> &AtomicU32 {
        &self.seg.classes()[i as usize].flags
    }

    /// Interns a string (a source location, an actor's name); `None` when
    /// the table is full, and a lost count the first time a string is
    /// refused.
    pub fn intern(&self, s: &str) -> Option<u32> {
        self.intern_leaving(s, 0)
    }

    /// [`SegmentWriter::intern`] for an object name (a file's path, a
    /// peer's address): names come from data, without bound (every file a
    /// service opens), so a new one takes an entry only while more than
    /// [`OBJECT_NAMES_LEAVE_FREE`] of the table is free. The rest stays for
    /// call sites, which the code bounds: a code path first reached after
    /// a day of rotated log files still gets its `SOURCE`.
    /// A name longer than [`STRING_BYTES`] keeps its end
    /// ([`object_name_that_fits`]).
    pub fn intern_object_name(&self, s: &str) -> Option<u32> {
        let s = object_name_that_fits(s);
        let s = s.as_ref();
        let free =
            self.seg.strings().len() as u64 * OBJECT_NAMES_LEAVE_FREE.0 / OBJECT_NAMES_LEAVE_FREE.1;
        self.intern_leaving(s, free as usize)
    }

    /// Interns `s` if known, or if more than `keep_free` entries are free.
    fn intern_leaving(&self, s: &str, keep_free: usize) -> Option<u32> {
        let s = truncate_utf8(s, STRING_BYTES);
        let mut slow = self.slow();
        if let Some(&i) = slow.strings.get(s) {
            return Some(i);
        }
        let i = slow.strings.len() as u32;
        let room = self.seg.strings().len().saturating_sub(keep_free);
        let Some(e) = self.seg.strings()[..room].get(i as usize) else {
            const BITS: u32 = REFUSED_BITS;
            let refused = slow
                .refused
                .get_or_insert_with(|| vec![0; 1 << (BITS - 6)].into_boxed_slice());
            // (FNV-1a's top bits hardly depend on the last bytes: mixed.)
            let h = crate::text::fnv1a64(s.as_bytes()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let h = (h >> (64 - BITS)) as usize;
            let (word, bit) = (&mut refused[h / 64], 1u64 << (h % 64));
            if *word & bit == 0 {
                *word |= bit;
                self.seg.count_lost(LostKind::Strings);
            }
            return None;
        };
        store_bytes(&e.bytes, &e.len, s.as_bytes());
        e.state.store(STRING_READY, Release);
        slow.strings.insert(s.to_string(), i);
        Some(i)
    }

    /// Allocates a thread record and publishes its identity. Lock-free
    /// except when a page must be added or revived. Fails (with a lost
    /// count) when the container is full or the volume cannot back a page:
    /// [`NoRecord`] says which.
    ///
    /// The scan never skips: it walks every record of every ACTIVE page
    /// with a local cursor, starting at the page of the last record
    /// released or taken (where a free record most likely is) and wrapping
    /// around, each page from a slot derived from `thread_id` (so
    /// concurrent allocators probe different records). A page is added, or a reclaimed one revived, only
    /// under the process lock and only if no record was released and no
    /// page changed since the scan began: every record really was taken.
    pub fn alloc_thread(
        &self,
        thread_id: u64,
        os_tid: u64,
        name: &str,
    ) -> Result<ThreadSlot, NoRecord> {
        let g = self.seg.geometry();
        let rpp = g.records_per_page as usize;
        // Fibonacci hashing of the thread id spreads starting slots.
        let start = (thread_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % rpp;
        loop {
            let epoch = self.epoch.load(Acquire);
            let pages = self.seg.pages_added();
            if let Some((index, v)) = self.scan(pages, start) {
                let rec = self.seg.record(index);
                init_record(rec, thread_id, os_tid, name);
                let version = lockword::publish(&rec.header.lock, v);
                return Ok(ThreadSlot { index, version });
            }
            let mut slow = self.slow();
            if self.epoch.load(Relaxed) != epoch || self.seg.pages_added() != pages {
                continue;
            }
            let states = self.seg.page_states();
            let reclaimed = (0..pages)
                .find(|&p| PageState::of(states[p as usize].load(Acquire)) == PageState::Reclaimed);
            if let Some(p) = reclaimed {
                if let Err(e) = self.seg.reserve_page(p) {
                    self.seg.count_lost(LostKind::Pages);
                    self.seg.count_lost(LostKind::Threads);
                    return Err(NoRecord::Volume(e));
                }
                let book = &mut slow.pages[p as usize];
                container::revive(
                    &states[p as usize],
                    rpp,
                    |s| self.page_lock(p, s),
                    book.base_version,
                );
                book.last_release = Instant::now();
                slow.reclaim.pages_revived += 1;
                self.seg
                    .container_header()
                    .pages_revived
                    .store(slow.reclaim.pages_revived, Release);
            } else {
                if pages >= g.max_pages {
                    self.seg.count_lost(LostKind::Threads);
                    return Err(NoRecord::Full {
                        records: g.max_pages * g.records_per_page,
                    });
                }
                if let Err(e) = self.seg.reserve_page(pages) {
                    self.seg.count_lost(LostKind::Pages);
                    self.seg.count_lost(LostKind::Threads);
                    return Err(NoRecord::Volume(e));
                }
                container::activate(&states[pages as usize]);
                self.seg
                    .container_header()
                    .pages_added
                    .store(u64::from(pages) + 1, Release);
                slow.pages.push(PageBook {
                    last_release: Instant::now(),
                    base_version: 0,
                });
            }
            self.epoch.fetch_add(1, Release);
        }
    }

    /// The lock word of record `slot` of page `page`.
    fn page_lock(&self, page: u32, slot: usize) -> &AtomicU64 {
        &self
            .seg
            .record(page * self.seg.geometry().records_per_page + slot as u32)
            .header
            .lock
    }

    /// One full scan of pages `0..pages` for a FREE record, from the hint.
    fn scan(&self, pages: u32, start: usize) -> Option<(u32, u64)> {
        if pages == 0 {
            return None;
        }
        let rpp = self.seg.geometry().records_per_page;
        let states = self.seg.page_states();
        let first = self.hint.load(Relaxed) % pages;
        (0..pages).map(|k| (first + k) % pages).find_map(|p| {
            let state = &states[p as usize];
            // Lock words are touched only by a page user: a page being
            // reclaimed may be a hole, and touching a hole on a full volume
            // would fault.
            if !container::enter(state) {
                return None;
            }
            let got = container::take_free(rpp as usize, |s| self.page_lock(p, s), start);
            container::leave(state);
            if got.is_some() {
                self.hint.store(p, Relaxed);
            }
            got.map(|(slot, v)| (p * rpp + slot as u32, v))
        })
    }

    /// Sets how long a page's records must all have been FREE before
    /// [`maintain`](Self::maintain) reclaims it; `None` turns reclamation
    /// off (the default).
    pub fn set_reclaim_after(&self, quiet: Option<Duration>) {
        self.slow().reclaim_after = quiet;
    }

    /// The maintenance pass (a slow path: the owner calls it from a thread
    /// exit or a periodic tick, never from the event hot path). Reclaims
    /// every ACTIVE page whose records have all been FREE for the quiet
    /// time: its bytes go back to the OS by a hole punch. Punches RECLAIMED
    /// pages again, which drops any 4 KiB a reader faulted back in. Returns
    /// the running totals.
    pub fn maintain(&self) -> ReclaimStats {
        let mut slow = self.slow();
        self.maintain_locked(&mut slow, Instant::now());
        slow.reclaim
    }

    /// Reclamation totals so far.
    pub fn reclaim_stats(&self) -> ReclaimStats {
        self.slow().reclaim
    }

    fn maintain_locked(&self, slow: &mut SlowState, now: Instant) {
        let Some(quiet) = slow.reclaim_after else {
            return;
        };
        let rpp = self.seg.geometry().records_per_page as usize;
        let states = self.seg.page_states();
        let page_size = self.seg.geometry().page_size as u64;
        for (p, state) in states.iter().enumerate().take(slow.pages.len()) {
            let page = p as u32;
            match PageState::of(state.load(Acquire)) {
                PageState::Active => {}
                PageState::Reclaimed => {
                    // Idempotent; failures change nothing.
                    let _ = self.seg.punch_page(page);
                    continue;
                }
                _ => continue,
            }
            if now.saturating_duration_since(slow.pages[p].last_release) < quiet
                || !container::all_free(rpp, |s| self.page_lock(page, s))
            {
                continue;
            }
            let mut punched = false;
            let r = container::try_reclaim(
                state,
                rpp,
                |s| self.page_lock(page, s),
                || {
                    punched = self.seg.punch_page(page).is_ok();
                    punched
                },
            );
            match r {
                Ok(base) => {
                    slow.pages[p].base_version = base;
                    slow.reclaim.pages_reclaimed += 1;
                    slow.reclaim.bytes_reclaimed += page_size;
                    self.seg
                        .container_header()
                        .pages_reclaimed
                        .store(slow.reclaim.pages_reclaimed, Release);
                }
                Err(container::NotReclaimed::PunchFailed) => {
                    slow.reclaim.punch_failures += 1;
                    self.epoch.fetch_add(1, Release);
                }
                Err(container::NotReclaimed::InUse) => {
                    self.epoch.fetch_add(1, Release);
                }
                Err(container::NotReclaimed::Busy) => {}
            }
        }
    }

    /// Appends an ended event to the `history_long` ring of `kind`.
    ///
    /// Protocol: take a ticket with `fetch_add`; the slot is `ticket mod
    /// len`; claim it with a compare-exchange from an even sequence whose
    /// ticket is older than ours to odd; write; publish `long_seq(ticket)`.
    /// A slot held by another writer, or already holding a newer ticket (we
    /// were lapped), is not written and the event is counted lost. So no
    /// slot is ever torn or written twice for one ticket, and
    /// `tickets = written + lost` exactly. `stmt` carries the statement part.
    /// Returns whether the event was written.
    #[inline]
    pub fn append_long(
        &self,
        kind: EventKind,
        e: &EventData,
        stmt: Option<(&StatementFigures, &StatementRecord)>,
    ) -> bool {
        let state = self.long_state[kind.index()].load(Relaxed);
        if state != LongState::Reserved as u8 && !self.long_usable(kind, state) {
            return false;
        }
        let h = self.seg.long_header(kind);
        let len = self.seg.geometry().long_len as u64;
        if len == 0 {
            return false;
        }
        let ticket = h.next.fetch_add(1, Relaxed);
        // history_long is off by default: this division and the shared
        // ticket line are its documented cost.
        let slot = (ticket % len) as usize;
        let seq = if kind == EventKind::Statement {
            &self.seg.long_statements()[slot].ev.seq
        } else {
            &self.seg.long_events(kind)[slot].seq
        };
        let Some(guard) = seq.try_claim(long_seq(ticket)) else {
            self.seg.count_lost(long_lost(kind));
            return false;
        };
        if kind == EventKind::Statement {
            let r = &self.seg.long_statements()[slot];
            store_event_fields(&r.ev, e);
            if let Some((f, cur)) = stmt {
                store_statement_fields(r, f, cur);
            }
        } else {
            store_event_fields(&self.seg.long_events(kind)[slot], e);
        }
        drop(guard);
        true
    }

    /// Whether the `history_long` ring of `kind` is reserved: an append
    /// then makes no system call (the first append to a ring not reserved
    /// reserves it, with `fallocate`).
    #[inline]
    pub fn long_ready(&self, kind: EventKind) -> bool {
        self.long_state[kind.index()].load(Relaxed) == LongState::Reserved as u8
    }

    /// Reserves the `history_long` ring of `kind` now (it is otherwise
    /// reserved by its first append, which then pays for it); false if
    /// the volume is full (its events are then counted lost).
    pub fn prepare_long(&self, kind: EventKind) -> bool {
        self.reserve_long(kind)
    }

    /// [`Self::append_long`]'s way past a ring not reserved (its state
    /// `state`): reserves it on first use; after a failed reservation
    /// (volume full), counts the event lost without taking the writer's
    /// lock, and tries again once every [`LONG_RETRY_EVERY`] losses (the
    /// volume may have room by then). False if the event is lost.
    #[cold]
    #[inline(never)]
    fn long_usable(&self, kind: EventKind, state: u8) -> bool {
        let lost = long_lost(kind);
        let retry = LongState::from_u8(state) == LongState::Failed;
        if retry {
            let before = self.seg.lost().counters[lost as usize].load(Relaxed);
            if !(before + 1).is_multiple_of(LONG_RETRY_EVERY) {
                self.seg.count_lost(lost);
                return false;
            }
        }
        if self.reserve_long_inner(kind, retry) {
            return true;
        }
        self.seg.count_lost(lost);
        false
    }

    #[cold]
    fn reserve_long(&self, kind: EventKind) -> bool {
        self.reserve_long_inner(kind, false)
    }

    /// Reserves the ring of `kind` unless it is reserved already, or its
    /// reservation failed and this is not a `retry`.
    #[cold]
    fn reserve_long_inner(&self, kind: EventKind, retry: bool) -> bool {
        let _slow = self.slow();
        let state = &self.long_state[kind.index()];
        match LongState::from_u8(state.load(Relaxed)) {
            LongState::Reserved => true,
            LongState::Failed if !retry => false,
            LongState::NotReserved | LongState::Failed => {
                let ok = self.seg.reserve_long(kind).is_ok();
                if ok {
                    self.seg
                        .header()
                        .long_reserved
                        .fetch_or(1 << kind.index(), Release);
                }
                let new = if ok {
                    LongState::Reserved
                } else {
                    LongState::Failed
                };
                state.store(new as u8, Release);
                ok
            }
        }
    }

    /// Accounts `count` frees of `bytes` in total, of memory class `class`,
    /// made by a thread that has no record (it exited, is exiting, or never
    /// got one) directly into the global row, like the fold of a thread
    /// that did only these frees. Slow path: takes the writer's lock.
    pub fn memory_free_global(&self, class: usize, count: u64, bytes: u64) {
        let _slow = self.slow();
        let Some(e) = self.seg.classes().get(class) else {
            return;
        };
        if e.state.load(Acquire) != CLASS_READY || e.kind.load(Relaxed) != ClassKind::Memory as u32
        {
            return;
        }
        let tgen = self.seg.setup().memory_truncate_gen.load(Relaxed);
        let gh = self.seg.global_header();
        let row = &self.seg.global_memory_rows()[class];
        let _w = gh.seq.write();
        apply_truncation(row, tgen);
        let add = |d: &AtomicU64, v: u64| d.store(d.load(Relaxed).wrapping_add(v), Relaxed);
        add(&row.count_free, count);
        add(&row.sum_bytes_free, bytes);
        add(&row.low_count_used, count.wrapping_neg());
        add(&row.low_bytes_used, bytes.wrapping_neg());
    }

    /// Folds the record's summaries into the global rows and frees it.
    /// Readers see either the thread's own rows or the folded totals, never
    /// both and never neither (see the fold log in the crate docs).
    pub fn fold_and_free(&self, slot: ThreadSlot) {
        let rec = self.seg.record(slot.index);
        let mut slow = self.slow();
        let gh = self.seg.global_header();
        let rows = self.seg.global_rows();
        let ticket = gh.fold_count.load(Relaxed) + 1;
        let classes = self.seg.classes();
        let mem_rows = self.seg.global_memory_rows();
        let tgen = self.seg.setup().memory_truncate_gen.load(Relaxed);
        {
            let _w = gh.seq.write();
            for class in touched_classes(rec.header, rows.len()) {
                // Classes are immutable once ready: the kind says which
                // view both rows have.
                if classes[class].kind.load(Relaxed) == ClassKind::Memory as u32 {
                    merge_memory_row(&mem_rows[class], &rec.memory_rows()[class], tgen);
                } else {
                    merge_row(&rows[class], &rec.rows[class]);
                }
            }
            let log = &gh.fold_log[(ticket % FOLD_LOG_LEN as u64) as usize];
            log.ticket.store(ticket, Relaxed);
            log.record.store(u64::from(slot.index), Relaxed);
            log.version.store(slot.version, Relaxed);
            gh.fold_count.store(ticket, Relaxed);
        }
        lockword::release(&rec.header.lock, slot.version);
        let page = slot.index / self.seg.geometry().records_per_page;
        if let Some(book) = slow.pages.get_mut(page as usize) {
            book.last_release = Instant::now();
        }
        self.hint.store(page, Relaxed);
        self.epoch.fetch_add(1, Release);
    }
}

/// Stores a thread's `NAME` in its header (under the caller's write of
/// the header's sequence lock).
fn store_name(h: &ThreadHeader, name: &str) {
    store_bytes(
        &h.name,
        &h.name_len,
        truncate_utf8(name, THREAD_NAME_BYTES).as_bytes(),
    );
}

fn init_record(rec: RecordRef<'_>, thread_id: u64, os_tid: u64, name: &str) {
    let h = rec.header;
    {
        let _w = h.seq.write();
        h.thread_id.store(thread_id, Relaxed);
        h.os_tid.store(os_tid, Relaxed);
        store_name(h, name);
        h.flags.store(THREAD_INSTRUMENTED | THREAD_HISTORY, Relaxed);
        for a in [&h.user, &h.host, &h.role] {
            a.store(NONE_U32, Relaxed);
        }
    }
    for w in &h.touched {
        w.store(0, Relaxed);
    }
    for k in EventKind::ALL {
        h.history_count[k.index()].store(0, Relaxed);
        h.history_next[k.index()].store(0, Relaxed);
    }
    for cur in [
        &h.waits_current,
        &h.stages_current,
        &h.statements_current.ev,
    ] {
        let _w = cur.seq.write();
        cur.flags.store(0, Relaxed);
        cur.event_id.store(0, Relaxed);
    }
}

fn merge_row(dst: &SummaryRow, src: &SummaryRow) {
    let add = |d: &AtomicU64, s: &AtomicU64| {
        d.store(d.load(Relaxed).saturating_add(s.load(Relaxed)), Relaxed)
    };
    add(&dst.count, &src.count);
    add(&dst.timed_count, &src.timed_count);
    let (lo, carry) = dst
        .sum_lo
        .load(Relaxed)
        .overflowing_add(src.sum_lo.load(Relaxed));
    dst.sum_lo.store(lo, Relaxed);
    dst.sum_hi.store(
        dst.sum_hi
            .load(Relaxed)
            .wrapping_add(src.sum_hi.load(Relaxed))
            .wrapping_add(u64::from(carry)),
        Relaxed,
    );
    dst.min
        .store(dst.min.load(Relaxed).min(src.min.load(Relaxed)), Relaxed);
    dst.max
        .store(dst.max.load(Relaxed).max(src.max.load(Relaxed)), Relaxed);
    add(&dst.bytes, &src.bytes);
    for (d, s) in dst.buckets.iter().zip(&src.buckets) {
        add(d, s);
    }
    // A global row has no pending bucket: the thread's is added now.
    if let Some(p) = pending_bucket(src.pending.load(Relaxed)) {
        let d = &dst.buckets[p];
        d.store(d.load(Relaxed).saturating_add(1), Relaxed);
    }
    // The last eight words: a statement class's figures, or a file or
    // socket class's by I/O mode; added word by word either way.
    for (d, s) in io_tail(dst).words().into_iter().zip(io_tail(src).words()) {
        add(d, s);
    }
}

/// Zeroes a memory row and stamps it with truncation generation `tgen`.
fn clear_memory_row(row: &MemoryRow, tgen: u64) {
    for a in [
        &row.count_alloc,
        &row.count_free,
        &row.sum_bytes_alloc,
        &row.sum_bytes_free,
        &row.low_count_used,
        &row.high_count_used,
        &row.low_bytes_used,
        &row.high_bytes_used,
    ] {
        a.store(0, Relaxed);
    }
    row.truncate_gen.store(tgen, Relaxed);
}

/// If `row` predates truncation generation `tgen`, LOW = HIGH = CURRENT.
/// The check is one load and a compare; the reset, taken once per row
/// after each truncation, is a cold path.
#[inline(always)]
fn apply_truncation(row: &MemoryRow, tgen: u64) {
    if row.truncate_gen.load(Relaxed) != tgen {
        std::hint::cold_path();
        let (c, b) = row.current();
        row.low_count_used.store(c, Relaxed);
        row.high_count_used.store(c, Relaxed);
        row.low_bytes_used.store(b, Relaxed);
        row.high_bytes_used.store(b, Relaxed);
        row.truncate_gen.store(tgen, Relaxed);
    }
}

/// Folds a thread's memory row into a global one (caller holds the global
/// sequence lock): counts and sums add (so the global CURRENT, derived
/// from them, stays exactly allocated − freed); LOW and HIGH add too (the
/// PFS aggregation rule: the worst case of the children). Both rows are
/// first brought to truncation generation `tgen`.
fn merge_memory_row(dst: &MemoryRow, src: &MemoryRow, tgen: u64) {
    apply_truncation(dst, tgen);
    let stale = src.truncate_gen.load(Relaxed) != tgen;
    let add = |d: &AtomicU64, v: u64| d.store(d.load(Relaxed).wrapping_add(v), Relaxed);
    let (cc, cb) = src.current();
    let pick = |w: &AtomicU64, cur: u64| if stale { cur } else { w.load(Relaxed) };
    add(&dst.count_alloc, src.count_alloc.load(Relaxed));
    add(&dst.count_free, src.count_free.load(Relaxed));
    add(&dst.sum_bytes_alloc, src.sum_bytes_alloc.load(Relaxed));
    add(&dst.sum_bytes_free, src.sum_bytes_free.load(Relaxed));
    add(&dst.low_count_used, pick(&src.low_count_used, cc));
    add(&dst.high_count_used, pick(&src.high_count_used, cc));
    add(&dst.low_bytes_used, pick(&src.low_bytes_used, cb));
    add(&dst.high_bytes_used, pick(&src.high_bytes_used, cb));
}

/// The `history_long` lost counter of `kind`.
#[inline(always)]
fn long_lost(kind: EventKind) -> LostKind {
    match kind {
        EventKind::Wait => LostKind::WaitsLong,
        EventKind::Stage => LostKind::StagesLong,
        EventKind::Statement => LostKind::StatementsLong,
    }
}

#[inline(always)]
fn store_event_fields(rec: &EventRecord, e: &EventData) {
    rec.event_id.store(e.event_id, Relaxed);
    rec.end_event_id.store(e.end_event_id, Relaxed);
    rec.class.store(e.class, Relaxed);
    rec.operation.store(e.operation, Relaxed);
    rec.timer_start.store(e.timer_start, Relaxed);
    rec.timer_end.store(e.timer_end, Relaxed);
    rec.timer_wait.store(e.timer_wait, Relaxed);
    rec.object_instance.store(e.object_instance, Relaxed);
    rec.bytes.store(e.bytes, Relaxed);
    rec.spins.store(e.spins, Relaxed);
    rec.source.store(e.source, Relaxed);
    rec.object_name.store(e.object_name, Relaxed);
    rec.nesting_event_id.store(e.nesting_event_id, Relaxed);
    rec.nesting_event_type.store(e.nesting_event_type, Relaxed);
    rec.flags.store(e.flags, Relaxed);
    rec.event_type.store(e.event_type, Relaxed);
    rec.thread_id.store(e.thread_id, Relaxed);
}

/// The fields of a started event (see [`RecordRef::begin_event`]).
#[inline(always)]
pub(crate) fn store_begin_fields(rec: &EventRecord, e: &EventData) {
    store_ids(rec, e);
    rec.timer_start.store(e.timer_start, Relaxed);
    store_flags_counts(rec, e);
}

/// The fields an event's end changes.
#[inline(always)]
fn store_end_fields(rec: &EventRecord, e: &EventData) {
    store_times(rec, e);
    store_flags_counts(rec, e);
}

/// Every field a reader of a per-thread row shows.
#[inline(always)]
fn store_row(rec: &EventRecord, e: &EventData) {
    store_ids(rec, e);
    rec.timer_start.store(e.timer_start, Relaxed);
    store_times(rec, e);
    store_flags_counts(rec, e);
}

/// Every field of a started event but `TIMER_START` and the flags.
#[inline(always)]
fn store_ids(rec: &EventRecord, e: &EventData) {
    rec.event_id.store(e.event_id, Relaxed);
    rec.class.store(e.class, Relaxed);
    rec.operation.store(e.operation, Relaxed);
    rec.object_instance.store(e.object_instance, Relaxed);
    rec.source.store(e.source, Relaxed);
    rec.object_name.store(e.object_name, Relaxed);
    rec.nesting_event_id.store(e.nesting_event_id, Relaxed);
    rec.nesting_event_type.store(e.nesting_event_type, Relaxed);
    rec.event_type.store(e.event_type, Relaxed);
    rec.thread_id.store(e.thread_id, Relaxed);
}

#[inline(always)]
fn store_times(rec: &EventRecord, e: &EventData) {
    rec.end_event_id.store(e.end_event_id, Relaxed);
    rec.timer_end.store(e.timer_end, Relaxed);
    rec.timer_wait.store(e.timer_wait, Relaxed);
}

/// Flags, and `NUMBER_OF_BYTES` and `SPINS` (or a stage's progress) when
/// flagged.
#[inline(always)]
fn store_flags_counts(rec: &EventRecord, e: &EventData) {
    rec.flags.store(e.flags, Relaxed);
    if e.flags & (EV_HAS_BYTES | EV_HAS_SPINS) != 0 {
        rec.bytes.store(e.bytes, Relaxed);
        rec.spins.store(e.spins, Relaxed);
    }
}

/// A per-thread history slot.
#[inline(always)]
fn write_history(rec: &EventRecord, e: &EventData) {
    let _w = rec.seq.write();
    store_row(rec, e);
}

/// Copies figures and, from `cur` (the writer's own current row), the text.
#[inline]
pub(crate) fn store_statement_fields(
    dst: &StatementRecord,
    f: &StatementFigures,
    cur: &StatementRecord,
) {
    dst.errors.store(f.errors, Relaxed);
    dst.warnings.store(f.warnings, Relaxed);
    dst.rows_affected.store(f.rows_affected, Relaxed);
    dst.rows_sent.store(f.rows_sent, Relaxed);
    dst.rows_examined.store(f.rows_examined, Relaxed);
    dst.digest.store(f.digest, Relaxed);
    dst.ev.cpu_time.store(f.cpu_time_ps, Relaxed);
    if std::ptr::eq(dst, cur) {
        return;
    }
    let len = cur.text_len.load(Relaxed);
    dst.text_len.store(len, Relaxed);
    let words = (len as usize).div_ceil(8).min(dst.text.len());
    for (d, s) in dst.text[..words].iter().zip(&cur.text) {
        d.store(s.load(Relaxed), Relaxed);
    }
}

/// Adds a file or socket wait of `mode` to the I/O words of `row` (whose
/// sequence lock the caller holds): out of line, so that the other waits
/// pay one compare for it.
#[inline(never)]
fn summarize_io(row: &SummaryRow, mode: IoMode, wait_ps: Option<u64>, bytes: u64) {
    let add = |a: &AtomicU64, v: u64| a.store(a.load(Relaxed).saturating_add(v), Relaxed);
    let (t, m) = (io_tail(row), mode.index());
    add(&t.count[m], 1);
    if let Some(ps) = wait_ps {
        add(&t.sum_ns[m], ps / 1000);
    }
    if let Some(b) = t.bytes.get(m) {
        add(b, bytes);
    }
}

/// What a summary row's last eight words get from an event, besides the
/// figures every event adds ([`RecordRef::summarize`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowExtra<'f> {
    /// Nothing: a stage, a wait other than file or socket I/O.
    None,
    /// A statement's own figures (`SUM_ERRORS`, ...).
    Statement(&'f StatementFigures),
    /// A file or socket wait, in its [`IoMode`] ([`IoTail`]).
    Io(IoMode),
}

impl<'f> From<Option<&'f StatementFigures>> for RowExtra<'f> {
    #[inline(always)]
    fn from(f: Option<&'f StatementFigures>) -> Self {
        f.map_or(RowExtra::None, RowExtra::Statement)
    }
}

impl<'f> From<&'f StatementFigures> for RowExtra<'f> {
    #[inline(always)]
    fn from(f: &'f StatementFigures) -> Self {
        RowExtra::Statement(f)
    }
}

impl RecordRef<'_> {
    /// `events_*_current` of `kind`.
    #[inline(always)]
    pub fn current(&self, kind: EventKind) -> &EventRecord {
        match kind {
            EventKind::Wait => &self.header.waits_current,
            EventKind::Stage => &self.header.stages_current,
            EventKind::Statement => &self.header.statements_current.ev,
        }
    }

    /// Publishes an event that has started as `events_*_current` of its
    /// kind. Hot path: one sequence-locked write of this thread's own lines.
    /// Only the fields a running event shows are written: `END_EVENT_ID`,
    /// `TIMER_END` and `TIMER_WAIT` are read only with [`EV_ENDED`],
    /// `NUMBER_OF_BYTES` and `SPINS` only with their flags (written here
    /// when set, as by a stage's progress), and per-thread rows leave
    /// `thread_id` alone (the record header has it).
    #[inline(always)]
    pub fn begin_event(&self, kind: EventKind, e: &EventData) {
        if kind == EventKind::Statement {
            // A new statement starts with no text.
            let cur = &self.header.statements_current;
            let _w = cur.ev.seq.write();
            store_begin_fields(&cur.ev, e);
            store_statement_fields(cur, &StatementFigures::default(), cur);
            cur.text_len.store(0, Relaxed);
        } else {
            let cur = self.current(kind);
            let _w = cur.seq.write();
            store_begin_fields(cur, e);
        }
    }

    /// [`RecordRef::begin_event`] with the start time written last: every
    /// other field is stored and the row stays unpublished (its sequence
    /// odd) until [`StartedRow::publish`] stores `TIMER_START`. The caller
    /// reads its timer in between, so that the row's writes are not part of
    /// the measured interval.
    #[inline(always)]
    pub fn begin_event_open(&self, kind: EventKind, e: &EventData) -> StartedRow<'_> {
        let row = if kind == EventKind::Statement {
            let cur = &self.header.statements_current;
            let w = cur.ev.seq.write();
            store_statement_fields(cur, &StatementFigures::default(), cur);
            cur.text_len.store(0, Relaxed);
            (&cur.ev, w)
        } else {
            let cur = self.current(kind);
            (cur, cur.seq.write())
        };
        store_ids(row.0, e);
        store_flags_counts(row.0, e);
        StartedRow {
            row: row.0,
            _write: row.1,
        }
    }

    /// Copies the `SQL_TEXT` of this record's current statement into `out`
    /// if the row shows event `event_id` of logical thread `thread_id`;
    /// returns its length (0 if it has none) and whether any byte copied
    /// differed from what `out` held, or `None` if the row shows another
    /// event. For a statement an inner one is about to replace in the row:
    /// its text is kept aside and written back with
    /// [`RecordRef::resume_statement`] when it ends; and for a task's
    /// statement taken out of the row as the task stops being polled.
    /// Only the record's owner calls it (it reads its own stores).
    pub fn copy_statement_text(
        &self,
        thread_id: u64,
        event_id: u64,
        out: &mut [u8; STATEMENT_TEXT_BYTES],
    ) -> Option<(usize, bool)> {
        let cur = &self.header.statements_current;
        if cur.ev.event_id.load(Relaxed) != event_id || cur.ev.thread_id.load(Relaxed) != thread_id
        {
            return None;
        }
        let len = (cur.text_len.load(Relaxed) as usize).min(STATEMENT_TEXT_BYTES);
        let mut changed = false;
        for (chunk, word) in out.chunks_mut(8).zip(&cur.text).take(len.div_ceil(8)) {
            let bytes = word.load(Relaxed).to_le_bytes();
            let bytes = &bytes[..chunk.len()];
            if chunk != bytes {
                chunk.copy_from_slice(bytes);
                changed = true;
            }
        }
        Some((len, changed))
    }

    /// Makes `e`, a statement that started earlier (possibly in another
    /// record: a task's statement, resumed on this thread), this record's
    /// current statement, with its `SQL_TEXT`, in one sequence-locked
    /// write; [`RecordRef::end_event`] then ends it in place. The text is
    /// truncated to 200 bytes.
    pub fn resume_statement(&self, e: &EventData, text: &str) {
        let cur = &self.header.statements_current;
        let _w = cur.ev.seq.write();
        store_begin_fields(&cur.ev, e);
        store_statement_fields(cur, &StatementFigures::default(), cur);
        store_prefix(
            &cur.text,
            &cur.text_len,
            truncate_utf8(text, STATEMENT_TEXT_BYTES).as_bytes(),
        );
    }

    /// Empties `events_*_current` of `kind` if it shows the event
    /// `event_id` of logical thread `thread_id` still running: for a task
    /// that stops being polled with that event open, so that no current
    /// row shows it while the task waits (the row shows what its thread
    /// runs; [`RecordRef::unhide`], [`RecordRef::resume_statement`],
    /// [`RecordRef::begin_event`] and a full [`RecordRef::end_event`] write
    /// the event again where it goes on). Only the thread that owns the
    /// record may call it. Returns whether the row showed it.
    #[inline]
    pub fn hide_unended(&self, kind: EventKind, thread_id: u64, event_id: u64) -> bool {
        let cur = self.current(kind);
        // This thread is the row's only writer: it reads its own stores.
        if cur.event_id.load(Relaxed) == event_id
            && cur.thread_id.load(Relaxed) == thread_id
            && cur.flags.load(Relaxed) & EV_ENDED == 0
        {
            let _w = cur.seq.write();
            cur.event_id.store(0, Relaxed);
            true
        } else {
            false
        }
    }

    /// This record's `events_*_current` row of `kind` as an event, if it
    /// shows event `event_id` of logical thread `thread_id` still running:
    /// for a task about to stop being polled, which writes it again
    /// ([`RecordRef::begin_event`], [`RecordRef::resume_statement`]) on the
    /// thread that polls it next. Only the thread that owns the record may
    /// call it (it reads its own stores).
    pub fn unended_event(
        &self,
        kind: EventKind,
        thread_id: u64,
        event_id: u64,
    ) -> Option<EventData> {
        let r = self.current(kind);
        let flags = r.flags.load(Relaxed);
        if r.event_id.load(Relaxed) != event_id
            || r.thread_id.load(Relaxed) != thread_id
            || flags & EV_ENDED != 0
        {
            return None;
        }
        Some(EventData {
            event_id,
            end_event_id: 0,
            class: r.class.load(Relaxed),
            operation: r.operation.load(Relaxed),
            timer_start: r.timer_start.load(Relaxed),
            timer_end: 0,
            timer_wait: 0,
            object_instance: r.object_instance.load(Relaxed),
            bytes: r.bytes.load(Relaxed),
            spins: r.spins.load(Relaxed),
            source: r.source.load(Relaxed),
            object_name: r.object_name.load(Relaxed),
            nesting_event_id: r.nesting_event_id.load(Relaxed),
            nesting_event_type: r.nesting_event_type.load(Relaxed),
            flags,
            event_type: r.event_type.load(Relaxed),
            thread_id,
        })
    }

    /// Whether this record's `events_*_current` row of `kind` shows the
    /// event `event_id` of logical thread `thread_id`, running or ended.
    /// Only the thread that owns the record may call it.
    #[inline]
    pub fn shows(&self, kind: EventKind, thread_id: u64, event_id: u64) -> bool {
        let cur = self.current(kind);
        cur.event_id.load(Relaxed) == event_id && cur.thread_id.load(Relaxed) == thread_id
    }

    /// Whether this record's `events_*_current` row of `kind` shows the
    /// event `event_id` of logical thread `thread_id` ended. Only the
    /// thread that owns the record may call it.
    #[inline]
    pub fn shows_ended(&self, kind: EventKind, thread_id: u64, event_id: u64) -> bool {
        let cur = self.current(kind);
        cur.event_id.load(Relaxed) == event_id
            && cur.thread_id.load(Relaxed) == thread_id
            && cur.flags.load(Relaxed) & EV_ENDED != 0
    }

    /// Shows again the event `event_id` of `thread_id`, started at
    /// `timer_start`, that [`RecordRef::hide_unended`] took out of this
    /// record's `events_*_current` row of `kind`, if nothing was written
    /// there since (one sequence-locked store: a task polled again on the
    /// thread that polled it last). Returns false, writing nothing, if the
    /// row holds anything else. Only the thread that owns the record may
    /// call it.
    #[inline]
    pub fn unhide(&self, kind: EventKind, thread_id: u64, event_id: u64, timer_start: u64) -> bool {
        let cur = self.current(kind);
        // This thread is the row's only writer: it reads its own stores.
        if cur.event_id.load(Relaxed) != 0
            || cur.thread_id.load(Relaxed) != thread_id
            || cur.timer_start.load(Relaxed) != timer_start
            || cur.flags.load(Relaxed) & EV_ENDED != 0
        {
            return false;
        }
        let _w = cur.seq.write();
        cur.event_id.store(event_id, Relaxed);
        true
    }

    /// Sets the current statement's `SQL_TEXT` (truncated to 200 bytes).
    pub fn set_statement_text(&self, text: &str) {
        let cur = &self.header.statements_current;
        let _w = cur.ev.seq.write();
        store_prefix(
            &cur.text,
            &cur.text_len,
            truncate_utf8(text, STATEMENT_TEXT_BYTES).as_bytes(),
        );
    }

    /// Ends an event: updates `events_*_current` (if `current`), appends it
    /// to the kind's history ring (if `history`). Summaries are separate
    /// ([`RecordRef::summarize`]) because their consumer is separate.
    ///
    /// If the current row still holds this event (its `EVENT_ID` is
    /// `e.event_id`: [`RecordRef::begin_event`] published it and no other
    /// event of the kind has since), only the fields that change at the end
    /// are stored; otherwise (the current consumer was off at the start, or
    /// an inner event of the same kind replaced it) the whole row is.
    #[inline(always)]
    pub fn end_event(
        &self,
        kind: EventKind,
        e: &EventData,
        stmt: Option<&StatementFigures>,
        current: bool,
        history: bool,
    ) {
        let h = self.header;
        if current {
            let cur = self.current(kind);
            // This thread is the row's only writer: the loads see its own
            // last stores. A task's events share the row with the thread's
            // and other tasks' (each with its own event ids): the row is
            // this event's only if the thread id matches too.
            let ours = cur.event_id.load(Relaxed) == e.event_id
                && cur.thread_id.load(Relaxed) == e.thread_id;
            let _w = cur.seq.write();
            if ours {
                store_end_fields(cur, e);
            } else {
                store_row(cur, e);
                if kind == EventKind::Statement {
                    // The text in the row is another statement's (an inner
                    // one's): this one's is not known here.
                    h.statements_current.text_len.store(0, Relaxed);
                }
            }
            if let (EventKind::Statement, Some(f)) = (kind, stmt) {
                let sc = &h.statements_current;
                store_statement_fields(sc, f, sc);
            }
        }
        if !history {
            return;
        }
        let len = match kind {
            EventKind::Wait => self.history.len(),
            EventKind::Stage => self.stages_history.len(),
            EventKind::Statement => self.statements_history.len(),
        };
        let k = kind.index();
        let slot = h.history_next[k].load(Relaxed) as usize;
        let slot = if slot < len { slot } else { 0 };
        match kind {
            EventKind::Wait => write_history(&self.history[slot], e),
            EventKind::Stage => write_history(&self.stages_history[slot], e),
            EventKind::Statement => {
                let dst = &self.statements_history[slot];
                let _w = dst.ev.seq.write();
                store_row(&dst.ev, e);
                store_statement_fields(
                    dst,
                    &stmt.copied().unwrap_or_default(),
                    &h.statements_current,
                );
            }
        }
        let next = if slot + 1 == len { 0 } else { slot + 1 };
        h.history_next[k].store(next as u32, Relaxed);
        h.history_count[k].store(h.history_count[k].load(Relaxed) + 1, Release);
    }

    /// Adds one event of `kind` to summary row `class` (its histogram in
    /// the kind's [`BucketScale`]), and `extra`'s figures to the row's
    /// last eight words: a statement's ([`RowExtra::Statement`], or
    /// `Some(&figures)`), or, for a wait of a file or socket class, its
    /// mode's ([`RowExtra::Io`]); `None` for anything else.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn summarize<'f>(
        &self,
        class: usize,
        kind: EventKind,
        timed: bool,
        wait_ps: u64,
        bytes: u64,
        extra: impl Into<RowExtra<'f>>,
    ) {
        let extra = extra.into();
        let (Some(row), Some(seq)) = (self.rows.get(class), self.row_seqs.get(class)) else {
            return;
        };
        let word = &self.header.touched[class / 64];
        let bit = 1u64 << (class % 64);
        let touched = word.load(Relaxed);
        if touched & bit == 0 {
            first_touch(row, seq);
            word.store(touched | bit, Release);
        }
        let _w = seq.write();
        row.count.store(row.count.load(Relaxed) + 1, Relaxed);
        if timed {
            row.timed_count
                .store(row.timed_count.load(Relaxed) + 1, Relaxed);
            let (lo, carry) = row.sum_lo.load(Relaxed).overflowing_add(wait_ps);
            row.sum_lo.store(lo, Relaxed);
            if carry {
                row.sum_hi.store(row.sum_hi.load(Relaxed) + 1, Relaxed);
            }
            if wait_ps < row.min.load(Relaxed) {
                row.min.store(wait_ps, Relaxed);
            }
            if wait_ps > row.max.load(Relaxed) {
                row.max.store(wait_ps, Relaxed);
            }
            // The previous timed event's bucket, whose counter's address
            // does not wait for this event's timer; this one's is pending
            // (layout 7.0: `SummaryRow::pending`).
            if let Some(p) = pending_bucket(row.pending.load(Relaxed)) {
                let b = &row.buckets[p];
                b.store(b.load(Relaxed) + 1, Relaxed);
            }
            // The bucket first, then the word that names it: a writer
            // killed between the two (its row left odd, read as it is
            // once it is dead) counts one event twice, never fewer than
            // a reader saw before. x86-64 keeps stores in order; this
            // keeps the compiler from reordering them (no instruction).
            std::sync::atomic::compiler_fence(Release);
            row.pending
                .store(pending_word(BucketScale::of(kind).index(wait_ps)), Relaxed);
        }
        if bytes != 0 {
            row.bytes
                .store(row.bytes.load(Relaxed).saturating_add(bytes), Relaxed);
        }
        // Saturating: an application's figure near 2^64 (a C `-1`) must
        // not wrap the counter back to small values.
        let add = |a: &AtomicU64, v: u64| a.store(a.load(Relaxed).saturating_add(v), Relaxed);
        if let RowExtra::Io(mode) = extra {
            summarize_io(row, mode, timed.then_some(wait_ps), bytes);
        }
        if let RowExtra::Statement(f) = extra {
            add(&row.errors, f.errors);
            add(&row.warnings, f.warnings);
            add(&row.rows_affected, f.rows_affected);
            add(&row.rows_sent, f.rows_sent);
            add(&row.rows_examined, f.rows_examined);
            if f.cpu_time_ps != 0 {
                add(&row.cpu_time, f.cpu_time_ps);
            }
            if f.cancelled != 0 {
                add(&row.cancelled, f.cancelled);
            }
        }
    }

    /// Accounts one allocation of `size` bytes to memory class `class`
    /// (PFS `memory_summary_by_thread_by_event_name`). `tgen` is the
    /// segment's current `memory_truncate_gen` (one relaxed load by the
    /// caller). Hot path: relaxed loads and stores of this thread's own
    /// row under its sequence lock, no read-modify-write instruction.
    #[inline(always)]
    pub fn memory_alloc(&self, class: usize, size: u64, tgen: u64) {
        if let Some(row) = self.memory_row(class, tgen) {
            memory_op(row, size, tgen, true);
        }
    }

    /// Accounts one free of `size` bytes to memory class `class`; see
    /// [`Self::memory_alloc`]. The row's CURRENT may go negative (memory
    /// allocated by another thread).
    #[inline(always)]
    pub fn memory_free(&self, class: usize, size: u64, tgen: u64) {
        if let Some(row) = self.memory_row(class, tgen) {
            memory_op(row, size, tgen, false);
        }
    }

    /// This record's memory row of class `class`, ready for
    /// [`memory_row_alloc`] and [`memory_row_free`]: zeroed and marked
    /// touched first if the record has not used the class yet (a cold
    /// branch); `None` if `class` is out of range. The row stays ready for
    /// as long as the caller holds the record (touched bits are cleared
    /// only when a record is initialised for a new thread), so the caller
    /// may keep it and skip this lookup on later operations.
    #[inline(always)]
    pub fn memory_row(&self, class: usize, tgen: u64) -> Option<MemoryRowRef<'_>> {
        let row = self.memory_rows().get(class)?;
        let seq = self.row_seqs.get(class)?;
        // `class` < rows ≤ MAX_CLASSES_LIMIT (checked when the segment was
        // created or opened): the modulo never wraps, it only spares a
        // second bounds check.
        let touched = &self.header.touched;
        let word = &touched[(class / 64) % touched.len()];
        if (word.load(Relaxed) >> (class % 64)) & 1 == 0 {
            first_touch_memory(row, seq, word, class, tgen);
        }
        Some(MemoryRowRef { row, seq })
    }

    /// Renames the thread (`threads.NAME`): `name` cut to
    /// [`THREAD_NAME_BYTES`] on a character boundary. Only the record's
    /// owner calls it.
    pub fn set_name(&self, name: &str) {
        let h = self.header;
        let _w = h.seq.write();
        store_name(h, name);
    }

    /// Records the thread's actor and its setup_actors verdict.
    pub fn set_actor(&self, user: u32, host: u32, role: u32, flags: u32) {
        let h = self.header;
        let _w = h.seq.write();
        h.user.store(user, Relaxed);
        h.host.store(host, Relaxed);
        h.role.store(role, Relaxed);
        h.flags.store(flags, Relaxed);
    }
}

/// A thread's memory row and the sequence lock that guards it (the row's
/// entry in the record's row sequence array): what
/// [`RecordRef::memory_row`] gives, to keep for later operations.
#[derive(Debug, Clone, Copy)]
pub struct MemoryRowRef<'a> {
    /// The row.
    pub row: &'a MemoryRow,
    /// Its sequence lock.
    pub seq: &'a SeqLock,
}

/// Accounts one allocation of `size` bytes on `row`, a memory row that
/// [`RecordRef::memory_row`] returned for the caller's own record (which
/// it still holds); `tgen` as for [`RecordRef::memory_alloc`]. The same
/// update as `memory_alloc`, without the row lookup.
#[inline(always)]
pub fn memory_row_alloc(row: MemoryRowRef<'_>, size: u64, tgen: u64) {
    memory_op(row, size, tgen, true);
}

/// Accounts one free of `size` bytes on `row`; see [`memory_row_alloc`].
#[inline(always)]
pub fn memory_row_free(row: MemoryRowRef<'_>, size: u64, tgen: u64) {
    memory_op(row, size, tgen, false);
}

/// The one memory row update: truncation is a cold branch; the rest is
/// straight-line relaxed loads and plain stores of the thread's own row
/// under its sequence lock: the operation's count and sum, then one
/// watermark compare per value. CURRENT is not stored (it is allocated −
/// freed, [`MemoryRow::current`]): computed here from the counter just
/// written and its mirror (`count_free` for an allocation).
#[inline(always)]
fn memory_op(r: MemoryRowRef<'_>, size: u64, tgen: u64, alloc: bool) {
    let _w = r.seq.write();
    let row = r.row;
    apply_truncation(row, tgen);
    let ld = |a: &AtomicU64| a.load(Relaxed);
    // A free is the allocation's mirror image: the same arithmetic on the
    // other counters.
    let (count, sum, other_count, other_sum) = if alloc {
        (
            &row.count_alloc,
            &row.sum_bytes_alloc,
            &row.count_free,
            &row.sum_bytes_free,
        )
    } else {
        (
            &row.count_free,
            &row.sum_bytes_free,
            &row.count_alloc,
            &row.sum_bytes_alloc,
        )
    };
    let n = ld(count).wrapping_add(1);
    let z = ld(sum).wrapping_add(size);
    count.store(n, Relaxed);
    sum.store(z, Relaxed);
    // Watermarks compare as signed values: an allocation can only raise
    // HIGH, a free only lower LOW.
    if alloc {
        let (c, b) = (
            n.wrapping_sub(ld(other_count)),
            z.wrapping_sub(ld(other_sum)),
        );
        if (c as i64) > (ld(&row.high_count_used) as i64) {
            row.high_count_used.store(c, Relaxed);
        }
        if (b as i64) > (ld(&row.high_bytes_used) as i64) {
            row.high_bytes_used.store(b, Relaxed);
        }
    } else {
        let (c, b) = (
            ld(other_count).wrapping_sub(n),
            ld(other_sum).wrapping_sub(z),
        );
        if (c as i64) < (ld(&row.low_count_used) as i64) {
            row.low_count_used.store(c, Relaxed);
        }
        if (b as i64) < (ld(&row.low_bytes_used) as i64) {
            row.low_bytes_used.store(b, Relaxed);
        }
    }
}

#[cold]
#[inline(never)]
fn first_touch(row: &SummaryRow, seq: &SeqLock) {
    let _w = seq.write();
    for a in [
        &row.pending,
        &row.count,
        &row.timed_count,
        &row.sum_lo,
        &row.sum_hi,
        &row.max,
        &row.bytes,
    ]
    .into_iter()
    // The last eight words too (statement or I/O figures): a reused
    // record's row still holds the previous thread's, already folded.
    .chain(io_tail(row).words())
    {
        a.store(0, Relaxed);
    }
    row.min.store(u64::MAX, Relaxed);
    for b in &row.buckets {
        b.store(0, Relaxed);
    }
}

/// The thread's first operation on memory class `class` since its record
/// was (re)used: zeroes the row (it may hold a previous thread's figures,
/// already folded), then marks the class touched in `word`.
#[cold]
#[inline(never)]
fn first_touch_memory(row: &MemoryRow, seq: &SeqLock, word: &AtomicU64, class: usize, tgen: u64) {
    {
        let _w = seq.write();
        clear_memory_row(row, tgen);
    }
    word.store(word.load(Relaxed) | (1u64 << (class % 64)), Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::{Event, ReadOptions, snapshot};
    use crate::{SegmentConfig, TimerCalibration};

    fn writer() -> SegmentWriter {
        let cal = TimerCalibration::NANOSECONDS;
        let f = tempfile::tempfile().unwrap();
        let seg = Segment::create(f, &SegmentConfig::default(), cal, 1, 0).unwrap();
        SegmentWriter::new(seg)
    }

    /// A full string table counts each refused string once, however
    /// often it is asked for (threads racing at a new call site, an
    /// object name at every event).
    #[test]
    fn a_refused_string_is_counted_lost_once() {
        let cal = TimerCalibration::NANOSECONDS;
        let f = tempfile::tempfile().unwrap();
        let cfg = SegmentConfig {
            max_strings: 2,
            ..SegmentConfig::default()
        };
        let w = SegmentWriter::new(Segment::create(f, &cfg, cal, 1, 0).unwrap());
        assert_eq!(w.intern("a.c:1"), Some(0));
        assert_eq!(w.intern("a.c:2"), Some(1));
        let lost = || w.segment().lost().counters[LostKind::Strings as usize].load(Relaxed);
        for _ in 0..5 {
            assert_eq!(w.intern("a.c:3"), None);
        }
        assert_eq!(lost(), 1);
        assert_eq!(w.intern("a.c:4"), None);
        assert_eq!(w.intern("a.c:3"), None);
        assert_eq!(lost(), 2);
        assert_eq!(w.intern("a.c:1"), Some(0), "the interned ones still are");
    }

    /// Object names fill the string table only to three quarters: the
    /// last quarter stays for call sites, and a name once interned is
    /// found again after that.
    #[test]
    fn object_names_leave_a_quarter_of_the_strings_to_call_sites() {
        let cfg = SegmentConfig {
            max_strings: 8,
            ..SegmentConfig::default()
        };
        let f = tempfile::tempfile().unwrap();
        let w = SegmentWriter::new(
            Segment::create(f, &cfg, TimerCalibration::NANOSECONDS, 1, 0).unwrap(),
        );
        let lost = || w.segment().lost().counters[LostKind::Strings as usize].load(Relaxed);
        let names: Vec<_> = (0..10)
            .map(|i| w.intern_object_name(&format!("/log/{i}")))
            .collect();
        assert_eq!(names[..6], (0..6).map(Some).collect::<Vec<_>>()[..]);
        assert!(names[6..].iter().all(Option::is_none), "{names:?}");
        assert_eq!(lost(), 4);
        assert_eq!(
            w.intern_object_name("/log/2"),
            Some(2),
            "known names still are"
        );
        assert_eq!(w.intern("a.c:1"), Some(6), "call sites take the rest");
        assert_eq!(w.intern("a.c:2"), Some(7));
        assert_eq!(w.intern("a.c:3"), None);
    }

    fn started(id: u64, object: u64) -> EventData {
        EventData {
            event_id: id,
            class: 0,
            timer_start: id * 100,
            object_instance: object,
            source: NONE_U32,
            object_name: NONE_U32,
            flags: EV_TIMED,
            event_type: EventKind::Wait as u32,
            ..Default::default()
        }
    }

    fn ended(mut e: EventData, bytes: Option<u64>) -> EventData {
        e.end_event_id = e.event_id + 1;
        e.timer_end = e.timer_start + 7;
        e.timer_wait = 7_000;
        e.flags |= EV_ENDED;
        if let Some(b) = bytes {
            e.bytes = b;
            e.flags |= EV_HAS_BYTES;
        }
        e
    }

    fn current(w: &SegmentWriter) -> Event {
        let s = snapshot(w.segment(), &ReadOptions::default()).unwrap();
        s.threads[0].waits_current.unwrap()
    }

    #[test]
    fn end_completes_the_row_begin_published() {
        let w = writer();
        let slot = w.alloc_thread(1, 1, "t").unwrap();
        let rec = w.segment().record(slot.index);
        let e = started(1, 42);
        rec.begin_event(EventKind::Wait, &e);
        let running = current(&w);
        assert_eq!((running.event_id, running.end_event_id), (1, None));
        assert_eq!(running.bytes, None);
        let e = ended(e, Some(512));
        rec.end_event(EventKind::Wait, &e, None, true, true);
        let c = current(&w);
        assert_eq!(c.end_event_id, Some(2));
        assert_eq!(c.object_instance, 42);
        assert_eq!(c.timer_wait, Some(7_000));
        assert_eq!(c.bytes, Some(512));
        let s = snapshot(w.segment(), &ReadOptions::default()).unwrap();
        assert_eq!(s.threads[0].waits_history, vec![c]);
    }

    #[test]
    fn an_outer_event_rewrites_the_row_an_inner_one_replaced() {
        let w = writer();
        let slot = w.alloc_thread(1, 1, "t").unwrap();
        let rec = w.segment().record(slot.index);
        let outer = started(1, 10);
        rec.begin_event(EventKind::Wait, &outer);
        let inner = started(2, 20);
        rec.begin_event(EventKind::Wait, &inner);
        rec.end_event(EventKind::Wait, &ended(inner, Some(1)), None, true, true);
        // The outer one ends without bytes, over the inner one's row.
        let outer = ended(outer, None);
        rec.end_event(EventKind::Wait, &outer, None, true, true);
        let c = current(&w);
        assert_eq!((c.event_id, c.object_instance, c.bytes), (1, 10, None));
        assert_eq!(c.end_event_id, Some(2));
        // Begun while the current consumer was off: ending with it on
        // writes the whole row.
        let late = started(3, 30);
        rec.end_event(EventKind::Wait, &ended(late, None), None, true, false);
        let c = current(&w);
        assert_eq!((c.event_id, c.object_instance), (3, 30));
        assert_eq!(c.timer_start, Some(u128::from(late.timer_start) * 1000));
    }

    /// After a failed reservation of a `history_long` ring (volume full),
    /// its events are counted lost without waiting for the writer's lock
    /// (held here by this thread all along), and one in
    /// [`LONG_RETRY_EVERY`] tries the reservation again, which succeeds
    /// once the volume has room.
    #[test]
    fn a_failed_history_long_ring_costs_no_lock_and_is_retried() {
        let w = writer();
        let lost = |w: &SegmentWriter| {
            w.segment().lost().counters[LostKind::WaitsLong as usize].load(Relaxed)
        };
        w.long_state[EventKind::Wait.index()].store(LongState::Failed as u8, Relaxed);
        let e = ended(started(1, 10), None);
        std::thread::scope(|sc| {
            let held = w.slow();
            let (tx, rx) = std::sync::mpsc::channel();
            let (w, e) = (&w, &e);
            sc.spawn(move || {
                let written = (0..1000)
                    .filter(|_| w.append_long(EventKind::Wait, e, None))
                    .count();
                tx.send(written).unwrap();
            });
            let r = rx.recv_timeout(std::time::Duration::from_secs(30));
            drop(held);
            assert_eq!(
                r,
                Ok(0),
                "appends to a ring that could not be reserved waited for the writer's lock"
            );
        });
        assert_eq!(lost(&w), 1000);
        // The retry: by the event that would make the losses a multiple of
        // LONG_RETRY_EVERY (written, so not counted lost).
        w.segment().lost().counters[LostKind::WaitsLong as usize]
            .store(LONG_RETRY_EVERY - 2, Relaxed);
        assert!(!w.append_long(EventKind::Wait, &e, None));
        assert_eq!(lost(&w), LONG_RETRY_EVERY - 1);
        assert!(w.append_long(EventKind::Wait, &e, None), "retried");
        assert_eq!(lost(&w), LONG_RETRY_EVERY - 1);
        assert_eq!(
            w.long_state[EventKind::Wait.index()].load(Relaxed),
            LongState::Reserved as u8
        );
        assert!(w.append_long(EventKind::Wait, &e, None));
        assert_eq!(
            w.segment().long_header(EventKind::Wait).next.load(Relaxed),
            2
        );
    }
}
