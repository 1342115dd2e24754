//! The segment's binary layout: every structure as a `#[repr(C)]` type made
//! only of atomics, with its size and field offsets asserted at compile time.
//!
//! See the crate documentation for the diagram and the tables; this module
//! is their machine-checked form. All integers are little-endian on every
//! platform this crate builds for (x86-64, aarch64); the header records the
//! writer's byte order anyway so that a reader never guesses.
//!
//! Layer 1 (see the crate docs): depends only on [`crate::seqlock`] (the
//! sequence word inside rows) and [`crate::kinds`] (the event kind that
//! indexes per-kind consumer and timer bits). The protocols over these
//! words live above:
//! the record lock word in the `lockword` module, the page words in the
//! `container` module.

use std::mem::{align_of, offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::kinds::{ClassKind, EventKind};
use crate::seqlock::SeqLock;

/// `b"PFSSHM\0\0"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PFSSHM\0\0");
/// Major layout version. Bumped on every incompatible change; a reader
/// refuses any major version it does not know.
pub const LAYOUT_MAJOR: u32 = 8;
/// Minor layout version: compatible additions (new section kinds, use of
/// reserved fields). Readers accept any minor version of a known major.
pub const LAYOUT_MINOR: u32 = 1;
/// The major versions a reader of this crate reads: its own; 7, whose
/// stage and statement histograms have the wait scale
/// ([`BucketScale::written`]: a reader moves them to the new one); 6,
/// whose summary rows have no pending bucket (the word is zero: read the
/// same way); and 5, which differs from 6 in its memory row only
/// ([`MemoryRowV5`]); so that a newer agent reads the processes built
/// with the previous clients during a rolling upgrade. Writers write
/// [`LAYOUT_MAJOR`] only.
pub const LAYOUT_MAJORS_READ: std::ops::RangeInclusive<u32> = 5..=LAYOUT_MAJOR;
/// The major versions whose header and counters section are this
/// version's, word for word (8.0 changed only what the stage and
/// statement histogram buckets mean): a writer replacing a dead
/// predecessor's file reads its creation time and its lost counters from
/// these.
pub const LAYOUT_MAJORS_SAME_HEADER: std::ops::RangeInclusive<u32> = 7..=LAYOUT_MAJOR;
/// Written natively by the creator; a reader on the other byte order would
/// read `0x0403_0201` and refuses the segment.
pub const BYTE_ORDER_MARK: u32 = 0x0102_0304;
/// Size of the header, and alignment of every section and container page.
pub const PAGE: usize = 4096;
/// The header's `timer_kind`: what the CYCLE timer reads.
///
/// ```
/// use pfs_shm_layout::layout::TimerSource;
/// assert_eq!(TimerSource::from_u32(TimerSource::Tsc as u32), Some(TimerSource::Tsc));
/// assert_eq!(TimerSource::from_u32(0), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum TimerSource {
    /// The CYCLE timer is the CPU's invariant TSC, and the other timers
    /// are derived from it.
    Tsc = 1,
    /// No invariant TSC: every timer reads the monotonic clock (CYCLE in
    /// nanosecond ticks).
    Monotonic = 2,
}

impl TimerSource {
    /// From the stored value; unknown values are `None`.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Tsc),
            2 => Some(Self::Monotonic),
            _ => None,
        }
    }
}
/// Header `state`: the creator is still initialising the segment.
pub const SEGMENT_INITIALIZING: u64 = 0;
/// Header `state`: every section is initialised; readers may proceed.
pub const SEGMENT_READY: u64 = 1;
/// Maximum number of entries in the section directory.
pub const MAX_SECTIONS: usize = 16;
/// Bytes of UTF-8 service name in the header.
pub const SERVICE_NAME_BYTES: usize = 64;
/// Bytes of UTF-8 instrument name in a class entry.
pub const CLASS_NAME_BYTES: usize = 112;
/// Bytes of UTF-8 in an interned string entry.
pub const STRING_BYTES: usize = 56;
/// Bytes of UTF-8 thread name in a thread record.
pub const THREAD_NAME_BYTES: usize = 32;
/// Upper bound on `max_classes`: the touched-class bitmap of a thread
/// record has this many bits.
pub const MAX_CLASSES_LIMIT: u32 = 1024;
/// Buckets of the latency histogram (see [`bucket_index`]).
pub const HISTOGRAM_BUCKETS: usize = 32;
/// Entries in the fold log of the global section.
pub const FOLD_LOG_LEN: usize = 256;
/// Number of lost counters in the counters section.
pub const LOST_COUNTERS: usize = 16;
/// "No value" for 32-bit indexes (class, string).
pub const NONE_U32: u32 = u32::MAX;

/// Section kinds in the section directory. Unknown kinds are ignored by
/// readers, which is how minor versions add sections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SectionKind {
    /// Lost counters, [`LostCounters`].
    Counters = 1,
    /// Instrument class registry: `count` entries of [`ClassEntry`].
    Classes = 2,
    /// Interned strings (source locations, object names): [`StringEntry`].
    Strings = 3,
    /// Totals folded in by exited threads: [`GlobalHeader`] then `count`
    /// summary rows.
    Global = 4,
    /// The paged thread container: [`ContainerHeader`], page directory,
    /// then the pages.
    Threads = 5,
    /// Live setup: consumers, timers, actors ([`SetupSection`]).
    Setup = 6,
    /// `events_waits_history_long`: [`LongHeader`] then `count` [`EventRecord`]s.
    WaitsLong = 7,
    /// `events_stages_history_long`: [`LongHeader`] then `count` [`EventRecord`]s.
    StagesLong = 8,
    /// `events_statements_history_long`: [`LongHeader`] then `count` [`StatementRecord`]s.
    StatementsLong = 9,
    /// Task slots (since 7.1, optional): [`TasksHeader`] then `count`
    /// [`TaskSlot`]s.
    Tasks = 10,
}

impl SectionKind {
    /// The kind for a raw directory value, if known.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Counters,
            2 => Self::Classes,
            3 => Self::Strings,
            4 => Self::Global,
            5 => Self::Threads,
            6 => Self::Setup,
            7 => Self::WaitsLong,
            8 => Self::StagesLong,
            9 => Self::StatementsLong,
            10 => Self::Tasks,
            _ => return None,
        })
    }
}

/// One entry of the section directory (32 bytes).
#[repr(C)]
#[derive(Debug, Default)]
pub struct SectionEntry {
    /// [`SectionKind`] as `u32`; 0 = unused entry.
    pub kind: AtomicU32,
    /// Reserved, zero.
    pub reserved: AtomicU32,
    /// Byte offset of the section from the start of the file; multiple of [`PAGE`].
    pub offset: AtomicU64,
    /// Byte size of the section.
    pub size: AtomicU64,
    /// Number of entries (meaning depends on the kind).
    pub count: AtomicU32,
    /// Bytes per entry (meaning depends on the kind).
    pub stride: AtomicU32,
}

/// The segment header, at offset 0, [`PAGE`] bytes long.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// [`LAYOUT_MAJOR`].
    pub major: AtomicU32,
    /// [`LAYOUT_MINOR`].
    pub minor: AtomicU32,
    /// [`BYTE_ORDER_MARK`].
    pub byte_order: AtomicU32,
    /// [`PAGE`]: size of this header.
    pub header_size: AtomicU32,
    /// Total file size the creator set (sparse beyond reserved regions).
    pub segment_size: AtomicU64,
    /// [`SEGMENT_INITIALIZING`] or [`SEGMENT_READY`]; stored last, `Release`.
    pub state: AtomicU64,
    /// Pid of the creating process, in its own pid namespace (informative
    /// only: liveness is decided through `flock`, never through pids).
    pub creator_pid: AtomicU32,
    /// Number of used entries in `sections`.
    pub section_count: AtomicU32,
    /// Wall-clock creation time, nanoseconds since the Unix epoch.
    pub start_time_unix_ns: AtomicU64,
    /// Timer tick value at creation: `TIMER_START` 0 in tables.
    pub timer_base_ticks: AtomicU64,
    /// Picoseconds per timer tick as a 32.32 fixed-point number:
    /// `ps = ticks * ps_per_tick_q32 >> 32` (computed in 128 bits).
    pub timer_ps_per_tick_q32: AtomicU64,
    /// Measured timer frequency, ticks per second.
    pub timer_frequency_hz: AtomicU64,
    /// Timer source: a [`TimerSource`] as `u32`.
    pub timer_kind: AtomicU32,
    /// Events kept per thread in each `events_*_history` ring.
    pub history_len: AtomicU32,
    /// Length in bytes of `service_name`.
    pub service_name_len: AtomicU32,
    /// Reserved, zero.
    pub reserved0: AtomicU32,
    /// UTF-8 service name, zero padded.
    pub service_name: [AtomicU64; SERVICE_NAME_BYTES / 8],
    /// `CLOCK_MONOTONIC` nanoseconds at creation: `TIMER_START` 0 for
    /// events timed with the NANOSECOND, MICROSECOND, MILLISECOND and TICK
    /// timers, whose ticks are nanoseconds.
    pub timer_base_ns: AtomicU64,
    /// Events per `events_*_history_long` ring (0 = none).
    pub history_long_len: AtomicU64,
    /// Bit *k* set: the `history_long` ring of [`EventKind::index`] *k*
    /// (0 waits, 1 stages, 2 statements) has been reserved and may be
    /// read. A reader must not
    /// touch an unreserved ring: on a full volume, even reading a hole of a
    /// shared mapping faults (SIGBUS).
    pub long_reserved: AtomicU64,
    /// Reserved, zero.
    pub reserved1: [AtomicU64; 9],
    /// The section directory, at offset 0x100.
    pub sections: [SectionEntry; MAX_SECTIONS],
    /// Pads the header to [`PAGE`] bytes.
    pub padding: [AtomicU64; (PAGE - 0x300) / 8],
}

/// Lost counters: every bounded structure counts what did not fit.
#[repr(C)]
#[derive(Debug, Default)]
pub struct LostCounters {
    /// Indexed by [`LostKind`]. Multi-writer (`fetch_add`, slow paths only).
    pub counters: [AtomicU64; LOST_COUNTERS],
}

/// What a lost counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum LostKind {
    /// A thread could not get a record (container full).
    Threads = 0,
    /// An instrument could not be registered (class registry full).
    Classes = 1,
    /// A string could not be interned (string table full), or a writer
    /// could not remember a call site (its own table full): counted once
    /// per string or site.
    Strings = 2,
    /// A container page could not be reserved (volume full).
    Pages = 3,
    /// A thread's events lost because it had no record.
    Events = 4,
    /// `events_waits_history_long` slots not written (lapped or busy).
    WaitsLong = 5,
    /// `events_stages_history_long` slots not written.
    StagesLong = 6,
    /// `events_statements_history_long` slots not written.
    StatementsLong = 7,
    /// Events whose end came from another thread than the one that began
    /// them (a C caller's struct ended elsewhere, an unpinned goroutine):
    /// the end is refused, the event not recorded (since 6.1).
    ForeignEnds = 8,
    /// Times an async task's open statement, stage or pending wait could
    /// not be shown while the task awaited, because every task slot was
    /// taken (counted once per task; since 7.1).
    TaskSlots = 9,
    /// Dead processes' segments that no agent had collected, removed by a
    /// new process of the same service and pid because all of its file
    /// names were taken (a process restarting in a loop while no agent
    /// ran): their last figures are lost. Counted by the new process,
    /// which starts it at the replaced segment's own count plus one
    /// (since 7.2).
    UncollectedSegments = 10,
}

impl LostKind {
    /// Every kind, in counter order.
    pub const ALL: [LostKind; 11] = [
        Self::Threads,
        Self::Classes,
        Self::Strings,
        Self::Pages,
        Self::Events,
        Self::WaitsLong,
        Self::StagesLong,
        Self::StatementsLong,
        Self::ForeignEnds,
        Self::TaskSlots,
        Self::UncollectedSegments,
    ];

    /// The label used in tables and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Threads => "thread_instances",
            Self::Classes => "instrument_classes",
            Self::Strings => "strings",
            Self::Pages => "container_pages",
            Self::Events => "events_no_thread_record",
            Self::WaitsLong => "events_waits_history_long",
            Self::StagesLong => "events_stages_history_long",
            Self::StatementsLong => "events_statements_history_long",
            Self::ForeignEnds => "events_ended_by_another_thread",
            Self::TaskSlots => "task_slots",
            Self::UncollectedSegments => "uncollected_segments",
        }
    }
}

/// Class entry state: unused.
pub const CLASS_EMPTY: u32 = 0;
/// Class entry state: published; `kind` and `name` are final.
pub const CLASS_READY: u32 = 2;
/// Class flag: the instrument records events (PFS `ENABLED`).
pub const FLAG_ENABLED: u32 = 1;
/// Class flag: the instrument's events are timed (PFS `TIMED`).
pub const FLAG_TIMED: u32 = 2;

/// One instrument class (128 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct ClassEntry {
    /// [`CLASS_EMPTY`] or [`CLASS_READY`] (stored last, `Release`).
    pub state: AtomicU32,
    /// [`FLAG_ENABLED`] | [`FLAG_TIMED`]. Written by the agent at any time,
    /// read by writers on every event with one `Relaxed` load.
    pub flags: AtomicU32,
    /// [`crate::kinds::ClassKind`] as `u32`.
    pub kind: AtomicU32,
    /// Length in bytes of `name`.
    pub name_len: AtomicU32,
    /// UTF-8 instrument name (`wait/synch/mutex/<area>/<name>`), zero padded.
    pub name: [AtomicU64; CLASS_NAME_BYTES / 8],
}

/// String entry state: published.
pub const STRING_READY: u32 = 2;

/// One interned string (64 bytes): source locations (`file.rs:123`) and
/// object names (file paths), truncated to [`STRING_BYTES`].
#[repr(C)]
#[derive(Debug)]
pub struct StringEntry {
    /// 0 = unused, [`STRING_READY`] = published (stored last, `Release`).
    pub state: AtomicU32,
    /// Length in bytes of `bytes`.
    pub len: AtomicU32,
    /// UTF-8, zero padded.
    pub bytes: [AtomicU64; STRING_BYTES / 8],
}

/// [`SummaryRow::pending`]'s word for bucket `bucket`: its index + 1
/// (0 says no bucket is pending).
#[inline(always)]
pub const fn pending_word(bucket: usize) -> u64 {
    bucket as u64 + 1
}

/// The bucket a [`SummaryRow::pending`] word names: `None` for 0 (none
/// pending), and for a word no writer stores (above
/// [`HISTOGRAM_BUCKETS`]).
///
/// ```
/// use pfs_shm_layout::layout::{pending_bucket, pending_word};
/// assert_eq!(pending_bucket(0), None);
/// assert_eq!(pending_bucket(pending_word(5)), Some(5));
/// assert_eq!(pending_bucket(33), None);
/// ```
#[inline(always)]
pub const fn pending_bucket(word: u64) -> Option<usize> {
    let i = word.wrapping_sub(1);
    if i < HISTOGRAM_BUCKETS as u64 {
        Some(i as usize)
    } else {
        None
    }
}

/// Latency histogram buckets of the wait scale ([`BucketScale::Short`]):
/// bucket 0 holds durations `<= 2^-27 s` (7.45 ns); bucket `i` in
/// `1..=30` holds `(2^(i-28), 2^(i-27)]` seconds; bucket 31 holds
/// everything above `2^3 s` (8 s). The bounds are powers of two of a
/// *second* (since layout 4.0; 3.x used powers of two of a picosecond),
/// so the buckets are exactly those of a Prometheus native histogram of
/// schema 0 (index `i - 27`) and of an OTLP exponential histogram of scale
/// 0 (index `i - 28`), bucket 0 being their zero bucket (threshold
/// `2^-27`). In integer picoseconds, bucket `i` ends at
/// [`bucket_upper_ps`]`(i)` = ⌊10^12 · 2^(i-27)⌋, so the classification of
/// an integer duration is exact. Stages and statements use
/// [`BucketScale::Long`] (since 8.0): [`BucketScale::index`].
#[inline(always)]
pub const fn bucket_index(ps: u64) -> usize {
    if ps <= BUCKET_UPPER_PS[0] {
        return 0;
    }
    // 2^(b-1) < ps ≤ 2^b, and BUCKET_UPPER_PS[i] ≈ 2^(i + 12.863): the
    // bucket is b - 13 or b - 12 (b ≥ 13 here: ps > 7450).
    let b = 64 - (ps - 1).leading_zeros() as usize;
    let i = b - 13;
    if i >= HISTOGRAM_BUCKETS - 1 {
        return HISTOGRAM_BUCKETS - 1;
    }
    // ps > BUCKET_UPPER_PS[i] = ⌊5^12 · 2^(i−15)⌋ ⟺ ps · 2^15 > 5^12 · 2^i
    // (ps is an integer); both sides are below 2^59 (ps ≤ 2^b, b ≤ 43).
    // Two shifts instead of a table load: on a timed event's end, the
    // bucket is the longest chain after the timer read.
    i + ((ps << 15) > (BUCKET_FIVE_12 << i)) as usize
}

/// 5^12: 10^12 · 2^(i−27) = 5^12 · 2^(i−15), so every bucket bound is this
/// number shifted.
const BUCKET_FIVE_12: u64 = 244_140_625;

/// `log2` of bucket 0's upper bound in seconds, in the wait scale: bucket
/// `i < 31` ends at `2^(BUCKET_LOG2_SECONDS_0 + i)` seconds
/// ([`BucketScale::log2_seconds_0`] for every scale).
pub const BUCKET_LOG2_SECONDS_0: i32 = -27;

/// The inclusive upper bounds in integer picoseconds of buckets `0..=30`
/// of a scale whose bucket 0 ends at `2^(shift - 27)` s:
/// ⌊10^12 · 2^(i + shift - 27)⌋ = ⌊5^12 · 2^(i + shift - 15)⌋.
const fn bucket_bounds(shift: usize) -> [u64; HISTOGRAM_BUCKETS - 1] {
    const FIVE_12: u64 = BUCKET_FIVE_12;
    let mut t = [0u64; HISTOGRAM_BUCKETS - 1];
    let mut i = 0;
    while i < HISTOGRAM_BUCKETS - 1 {
        let e = i + shift;
        t[i] = if e >= 15 {
            FIVE_12 << (e - 15)
        } else {
            FIVE_12 >> (15 - e)
        };
        i += 1;
    }
    t
}

/// Inclusive upper bounds in integer picoseconds of buckets `0..=30` of
/// the wait scale ([`BucketScale::Short`]): ⌊10^12 · 2^(i-27)⌋ =
/// ⌊5^12 · 2^(i-15)⌋.
pub const BUCKET_UPPER_PS: [u64; HISTOGRAM_BUCKETS - 1] = bucket_bounds(0);

/// Inclusive upper bounds in integer picoseconds of buckets `0..=30` of
/// the stage and statement scale ([`BucketScale::Long`]): ⌊10^12 ·
/// 2^(i-20)⌋.
pub const LONG_BUCKET_UPPER_PS: [u64; HISTOGRAM_BUCKETS - 1] =
    bucket_bounds(BucketScale::Long.shift() as usize);

/// Inclusive upper bound in picoseconds of bucket `i` of the wait scale
/// (rounded down to an integer), `None` for the last (+Inf) bucket.
pub const fn bucket_upper_ps(i: usize) -> Option<u64> {
    BucketScale::Short.upper_ps(i)
}

/// Exact upper bound in seconds of bucket `i` of the wait scale (a power
/// of two), `None` for the last (+Inf) bucket.
pub fn bucket_upper_seconds(i: usize) -> Option<f64> {
    BucketScale::Short.upper_seconds(i)
}

/// What a summary row's latency histogram buckets span: the same 32
/// buckets, each twice as wide as the one before, the last open-ended,
/// starting at a power of two of a second that depends on the event kind
/// (since layout 8.0; until 7.x every kind had the wait scale, and a
/// request slower than 8 s could only be counted as "above 8 s").
///
/// | scale | kinds | bucket 0 | bucket `i` in 1..=30 | bucket 31 |
/// |---|---|---|---|---|
/// | `Short` | waits | ≤ 2^-27 s (7.45 ns) | (2^(i-28), 2^(i-27)] s | > 8 s |
/// | `Long` | stages, statements | ≤ 2^-20 s (954 ns) | (2^(i-21), 2^(i-20)] s | > 1024 s |
///
/// ```
/// use pfs_shm_layout::EventKind;
/// use pfs_shm_layout::layout::BucketScale;
///
/// let s = BucketScale::of(EventKind::Statement);
/// assert_eq!(s, BucketScale::Long);
/// assert_eq!(s.upper_seconds(30), Some(1024.0));
/// assert_eq!(s.index(12_000_000_000_000), 24); // 12 s: (8 s, 16 s]
/// assert_eq!(BucketScale::of(EventKind::Wait).index(12_000_000_000_000), 31);
/// ```
///
/// Ordered from the finest to the coarsest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum BucketScale {
    /// Waits: 7.45 ns to 8 s.
    #[default]
    Short,
    /// Stages and statements: 954 ns to 1024 s (17 min).
    Long,
}

impl BucketScale {
    /// The scale a writer of this layout uses for `kind`'s rows.
    #[inline(always)]
    pub const fn of(kind: EventKind) -> Self {
        match kind {
            EventKind::Wait => Self::Short,
            EventKind::Stage | EventKind::Statement => Self::Long,
        }
    }

    /// The scale of a class of kind `kind`'s rows (the wait scale for a
    /// memory class, which has no histogram).
    #[inline]
    pub fn of_class(kind: ClassKind) -> Self {
        EventKind::of_class(kind).map_or(Self::Short, Self::of)
    }

    /// The scale of `kind`'s rows in a segment of major version `major`
    /// (every kind had the wait scale until 7.x).
    #[inline]
    pub const fn written(kind: EventKind, major: u32) -> Self {
        if major >= 8 {
            Self::of(kind)
        } else {
            Self::Short
        }
    }

    /// How many buckets of the wait scale one bucket of this one is
    /// offset by: bucket `i` here ends where bucket `i + shift` of the
    /// wait scale does.
    #[inline(always)]
    pub const fn shift(self) -> u32 {
        match self {
            Self::Short => 0,
            Self::Long => 7,
        }
    }

    /// `log2` of bucket 0's upper bound in seconds: bucket `i < 31` ends
    /// at `2^(log2_seconds_0 + i)` seconds. So bucket `i` is bucket
    /// `i + log2_seconds_0` of a Prometheus native histogram of schema 0,
    /// and `i + log2_seconds_0 - 1` of an OTLP exponential histogram of
    /// scale 0; bucket 0 is their zero bucket.
    #[inline(always)]
    pub const fn log2_seconds_0(self) -> i32 {
        BUCKET_LOG2_SECONDS_0 + self.shift() as i32
    }

    /// The bucket of a duration of `ps` picoseconds: the first whose
    /// inclusive bound ([`BucketScale::upper_ps`]) is ≥ `ps`.
    #[inline(always)]
    pub const fn index(self, ps: u64) -> usize {
        match self {
            Self::Short => bucket_index(ps),
            Self::Long => {
                let t = &LONG_BUCKET_UPPER_PS;
                if ps <= t[0] {
                    return 0;
                }
                // 2^(b-1) < ps ≤ 2^b, and t[i] ≈ 2^(i + 19.863): the
                // bucket is b - 20 or b - 19 (b ≥ 20 here: ps > 953 674).
                let b = 64 - (ps - 1).leading_zeros() as usize;
                let i = b - 20;
                if i >= HISTOGRAM_BUCKETS - 1 {
                    return HISTOGRAM_BUCKETS - 1;
                }
                i + (ps > t[i]) as usize
            }
        }
    }

    /// Inclusive upper bound in picoseconds of bucket `i` (rounded down
    /// to an integer), `None` for the last (+Inf) bucket.
    #[inline]
    pub const fn upper_ps(self, i: usize) -> Option<u64> {
        if i >= HISTOGRAM_BUCKETS - 1 {
            return None;
        }
        Some(match self {
            Self::Short => BUCKET_UPPER_PS[i],
            Self::Long => LONG_BUCKET_UPPER_PS[i],
        })
    }

    /// Exact upper bound in seconds of bucket `i` (a power of two), `None`
    /// for the last (+Inf) bucket.
    pub fn upper_seconds(self, i: usize) -> Option<f64> {
        (i < HISTOGRAM_BUCKETS - 1).then(|| 2f64.powi(self.log2_seconds_0() + i as i32))
    }

    /// `buckets`, counted in the scale `from`, in this one: each bucket
    /// goes to the bucket here that ends where it ends, or to bucket 0 if
    /// none does (a finer bucket inside the coarser bucket 0), or to the
    /// open-ended top if it ends above the last bound. The finer scale's
    /// open-ended top (above 8 s) is taken to end at twice its last bound,
    /// so it goes to `(8 s, 16 s]`: its events were longer than 8 s, and
    /// no longer is known (the figure a 7.x process's statements above 8 s
    /// get). From the coarser to the finer scale (no writer's row: a
    /// hostile segment's class of another kind under the same name), the
    /// coarser bucket 0 goes to the finer bucket with its bound.
    pub fn rescale(
        self,
        from: BucketScale,
        buckets: &[u64; HISTOGRAM_BUCKETS],
    ) -> [u64; HISTOGRAM_BUCKETS] {
        let (to, from) = (self.shift() as usize, from.shift() as usize);
        let last = HISTOGRAM_BUCKETS - 1;
        let mut out = [0u64; HISTOGRAM_BUCKETS];
        for (i, &n) in buckets.iter().enumerate() {
            // Bucket i ends at 2^(i + from - 27) s: bucket i + from - to
            // here.
            let j = (i + from).saturating_sub(to).min(last);
            out[j] = out[j].saturating_add(n);
        }
        out
    }
}

/// Summary statistics of one instrument class (384 bytes), guarded by `seq`.
/// Used per thread (written only by the owning thread) and in the global
/// section (written by exiting threads, serialised by the creator process).
#[repr(C)]
#[derive(Debug)]
pub struct SummaryRow {
    /// The bucket of the row's latest timed event, not yet added to
    /// `buckets`: [`pending_word`] of its index, 0 for none. Since 7.0: a
    /// writer adds an event's bucket at the row's next timed event (the
    /// counter to increment is then known before the event's timer is
    /// read, instead of at the end of a chain that starts there); a
    /// reader adds one to the bucket [`pending_bucket`] names, under the
    /// row's sequence lock like every other field.
    /// (Reserved, zero, in 5.x and 6.x; until 4.x the row's sequence
    /// lock. Since 5.0 a thread's row is guarded by its entry in the
    /// record's row sequence array, [`ROW_SEQS_OFFSET`], and a global row
    /// by the global section's `seq`.)
    pub pending: AtomicU64,
    /// `COUNT_STAR`: events, timed or not.
    pub count: AtomicU64,
    /// Timed events: the ones included in sum, min, max and buckets.
    pub timed_count: AtomicU64,
    /// `SUM_TIMER_WAIT` in picoseconds, low 64 bits.
    pub sum_lo: AtomicU64,
    /// `SUM_TIMER_WAIT` in picoseconds, high 64 bits (never wraps).
    pub sum_hi: AtomicU64,
    /// `MIN_TIMER_WAIT` in ps; `u64::MAX` when no timed event.
    pub min: AtomicU64,
    /// `MAX_TIMER_WAIT` in ps.
    pub max: AtomicU64,
    /// Sum of `NUMBER_OF_BYTES` over events that carried a byte count.
    pub bytes: AtomicU64,
    /// Per-bucket (not cumulative) counts of timed events, see
    /// [`bucket_index`]: all but the latest, which `pending` names (since
    /// 7.0; a reader adds it).
    pub buckets: [AtomicU64; HISTOGRAM_BUCKETS],
    /// Statements: `SUM_ERRORS`. (In the row of a file or socket class,
    /// this word and the seven after it are an [`IoTail`], since 8.1.)
    pub errors: AtomicU64,
    /// Statements: `SUM_WARNINGS`.
    pub warnings: AtomicU64,
    /// Statements: `SUM_ROWS_AFFECTED`.
    pub rows_affected: AtomicU64,
    /// Statements: `SUM_ROWS_SENT`.
    pub rows_sent: AtomicU64,
    /// Statements: `SUM_ROWS_EXAMINED`.
    pub rows_examined: AtomicU64,
    /// Statements: `SUM_CPU_TIME` in picoseconds (the sum of the
    /// statements' `CPU_TIME`; wraps at 2^64 ps, 213 days). Since 3.1.
    pub cpu_time: AtomicU64,
    /// Statements: how many were cancelled ([`EV_CANCELLED`]). Since 3.1.
    pub cancelled: AtomicU64,
    /// Reserved, zero (but in an [`IoTail`]).
    pub reserved: AtomicU64,
}

/// The last eight words of the summary row of a file or socket class
/// (`wait/io/file/...`, `wait/io/socket/...`), which have no statement
/// figures (64 bytes, at the offset of [`SummaryRow::errors`]; since 8.1,
/// zero before): its waits split by [`IoMode`], as PFS's
/// `file_summary_by_event_name` and `socket_summary_by_event_name` split
/// them. Each array is indexed by [`IoMode::index`]. A wait is counted in
/// the mode of its operation ([`IoMode::of_operation`]), as well as in
/// the row's own `count`, `sum` and `bytes`. (`segment::io_tail` views a
/// row's words so.)
///
/// [`IoMode`]: crate::kinds::IoMode
/// [`IoMode::index`]: crate::kinds::IoMode::index
/// [`IoMode::of_operation`]: crate::kinds::IoMode::of_operation
#[repr(C)]
#[derive(Debug)]
pub struct IoTail {
    /// `COUNT_READ`, `COUNT_WRITE`, `COUNT_MISC`: waits, timed or not.
    pub count: [AtomicU64; 3],
    /// `SUM_TIMER_READ`, `SUM_TIMER_WRITE`, `SUM_TIMER_MISC`, of the timed
    /// waits, in nanoseconds (not picoseconds: 64 bits of them hold 584
    /// years of waiting, where a thread's waits of a process's lifetime
    /// fold into one global row).
    pub sum_ns: [AtomicU64; 3],
    /// `SUM_NUMBER_OF_BYTES_READ`, `SUM_NUMBER_OF_BYTES_WRITE` (misc
    /// operations move none).
    pub bytes: [AtomicU64; 2],
}

impl IoTail {
    /// The eight words in memory order: the whole tail of the row, which
    /// is a statement class's figures in a statement row.
    pub fn words(&self) -> [&AtomicU64; 8] {
        let [c0, c1, c2] = &self.count;
        let [t0, t1, t2] = &self.sum_ns;
        let [b0, b1] = &self.bytes;
        [c0, c1, c2, t0, t1, t2, b0, b1]
    }
}

/// Memory statistics of one memory instrument (384 bytes, the size of a
/// [`SummaryRow`]): the summary row slot of a class of kind
/// [`crate::kinds::ClassKind::Memory`] holds this instead. Signed
/// values are two's-complement `i64` in the `u64` words: a thread's
/// `CURRENT` goes negative when it frees memory another thread allocated.
///
/// `CURRENT_COUNT_USED` and `CURRENT_NUMBER_OF_BYTES_USED` are not stored:
/// they are `count_alloc − count_free` and `sum_bytes_alloc −
/// sum_bytes_free` (wrapping), which is what they are by definition, so an
/// allocation or a free writes two counters fewer (see [`MemoryRow::current`]).
#[repr(C)]
#[derive(Debug)]
pub struct MemoryRow {
    /// Reserved, zero (a summary row's `pending` word, [`SummaryRow::pending`],
    /// is not used by memory rows).
    pub reserved0: AtomicU64,
    /// `COUNT_ALLOC`.
    pub count_alloc: AtomicU64,
    /// `COUNT_FREE`.
    pub count_free: AtomicU64,
    /// `SUM_NUMBER_OF_BYTES_ALLOC`.
    pub sum_bytes_alloc: AtomicU64,
    /// `SUM_NUMBER_OF_BYTES_FREE`.
    pub sum_bytes_free: AtomicU64,
    /// `LOW_COUNT_USED` (i64).
    pub low_count_used: AtomicU64,
    /// `HIGH_COUNT_USED` (i64).
    pub high_count_used: AtomicU64,
    /// `LOW_NUMBER_OF_BYTES_USED` (i64).
    pub low_bytes_used: AtomicU64,
    /// `HIGH_NUMBER_OF_BYTES_USED` (i64).
    pub high_bytes_used: AtomicU64,
    /// The segment's `memory_truncate_gen` as of the row's last update: an
    /// older value means LOW and HIGH are to be read as CURRENT.
    pub truncate_gen: AtomicU64,
    /// Reserved, zero.
    pub reserved: [AtomicU64; 38],
}

/// The memory row of layout 5.x, which stored `CURRENT_COUNT_USED` and
/// `CURRENT_NUMBER_OF_BYTES_USED` (384 bytes, like [`MemoryRow`]): what a
/// reader finds in a 5.x segment (see
/// [`LAYOUT_MAJORS_READ`]; `segment::v5_memory_row` views a row so). The
/// same words as 6.0 up to `low_count_used`.
#[repr(C)]
#[derive(Debug)]
pub struct MemoryRowV5 {
    /// Reserved, zero.
    pub reserved0: AtomicU64,
    /// `COUNT_ALLOC`.
    pub count_alloc: AtomicU64,
    /// `COUNT_FREE`.
    pub count_free: AtomicU64,
    /// `SUM_NUMBER_OF_BYTES_ALLOC`.
    pub sum_bytes_alloc: AtomicU64,
    /// `SUM_NUMBER_OF_BYTES_FREE`.
    pub sum_bytes_free: AtomicU64,
    /// `LOW_COUNT_USED` (i64).
    pub low_count_used: AtomicU64,
    /// `CURRENT_COUNT_USED` (i64).
    pub current_count_used: AtomicU64,
    /// `HIGH_COUNT_USED` (i64).
    pub high_count_used: AtomicU64,
    /// `LOW_NUMBER_OF_BYTES_USED` (i64).
    pub low_bytes_used: AtomicU64,
    /// `CURRENT_NUMBER_OF_BYTES_USED` (i64).
    pub current_bytes_used: AtomicU64,
    /// `HIGH_NUMBER_OF_BYTES_USED` (i64).
    pub high_bytes_used: AtomicU64,
    /// As [`MemoryRow::truncate_gen`].
    pub truncate_gen: AtomicU64,
    /// Reserved, zero.
    pub reserved: [AtomicU64; 36],
}

impl MemoryRow {
    /// `(CURRENT_COUNT_USED, CURRENT_NUMBER_OF_BYTES_USED)` as two's-
    /// complement words: allocated − freed, of the row as loaded now
    /// (relaxed; under the row's sequence lock for a consistent pair).
    #[inline(always)]
    pub fn current(&self) -> (u64, u64) {
        let ld = |a: &AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        (
            ld(&self.count_alloc).wrapping_sub(ld(&self.count_free)),
            ld(&self.sum_bytes_alloc).wrapping_sub(ld(&self.sum_bytes_free)),
        )
    }
}

/// Event flag: `timer_start`, `timer_end` and `timer_wait` are valid
/// (PFS: non-NULL timers).
pub const EV_TIMED: u32 = 1;
/// Event flag: the event has ended (`end_event_id` valid).
pub const EV_ENDED: u32 = 2;
/// Event flag: `bytes` (`NUMBER_OF_BYTES`) is valid.
pub const EV_HAS_BYTES: u32 = 4;
/// Event flag: `spins` is valid.
pub const EV_HAS_SPINS: u32 = 8;
/// Event flag (stages): `bytes` is `WORK_COMPLETED` and `spins` is
/// `WORK_ESTIMATED`.
pub const EV_HAS_PROGRESS: u32 = 16;
/// Event flag (statements, since 3.1): the statement was cancelled: the
/// future that owned it was dropped before it completed.
pub const EV_CANCELLED: u32 = 32;
/// Event flags bits 8..11: the [`TimerId`] that produced the ticks.
pub const EV_TIMER_SHIFT: u32 = 8;
/// Mask of the timer bits in event flags.
pub const EV_TIMER_MASK: u32 = 0x7 << EV_TIMER_SHIFT;

/// Bytes of statement text kept in a [`StatementRecord`].
pub const STATEMENT_TEXT_BYTES: usize = 200;

/// A statement event (384 bytes): the common [`EventRecord`] part (whose
/// `seq` guards the whole record) and the statement's own figures.
#[repr(C)]
#[derive(Debug)]
pub struct StatementRecord {
    /// Common event fields; `ev.seq` guards every field of the record.
    pub ev: EventRecord,
    /// `ERRORS`.
    pub errors: AtomicU64,
    /// `WARNINGS`.
    pub warnings: AtomicU64,
    /// `ROWS_AFFECTED`.
    pub rows_affected: AtomicU64,
    /// `ROWS_SENT`.
    pub rows_sent: AtomicU64,
    /// `ROWS_EXAMINED`.
    pub rows_examined: AtomicU64,
    /// `DIGEST`: 64-bit FNV-1a of the digest text the application supplied
    /// (0 = none).
    pub digest: AtomicU64,
    /// Bytes of `text` in use.
    pub text_len: AtomicU32,
    /// Reserved, zero.
    pub reserved: AtomicU32,
    /// `SQL_TEXT` as supplied by the application, truncated, UTF-8.
    pub text: [AtomicU64; STATEMENT_TEXT_BYTES / 8],
}

/// Timers of `setup_timers` / `performance_timers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum TimerId {
    /// The CPU cycle counter (TSC); ticks convert with the header's calibration.
    Cycle = 0,
    /// Nanoseconds on the `CLOCK_MONOTONIC` scale (`timer_base_ns` at
    /// creation). A writer may derive them from an invariant TSC and the
    /// header's calibration instead of reading the clock (the Rust client
    /// does); readers cannot tell the difference.
    Nanosecond = 1,
    /// [`TimerId::Nanosecond`] truncated to microseconds (ticks still in ns).
    Microsecond = 2,
    /// [`TimerId::Nanosecond`] truncated to milliseconds (ticks still in ns).
    Millisecond = 3,
    /// `CLOCK_MONOTONIC_COARSE`: the kernel tick (ticks in ns).
    Tick = 4,
}

impl TimerId {
    /// Every timer, in `performance_timers` order.
    pub const ALL: [TimerId; 5] = [
        Self::Cycle,
        Self::Nanosecond,
        Self::Microsecond,
        Self::Millisecond,
        Self::Tick,
    ];

    /// From the stored value.
    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    /// The PFS `TIMER_NAME`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cycle => "CYCLE",
            Self::Nanosecond => "NANOSECOND",
            Self::Microsecond => "MICROSECOND",
            Self::Millisecond => "MILLISECOND",
            Self::Tick => "TICK",
        }
    }

    /// From a PFS `TIMER_NAME` (case-insensitive).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }
}

/// Consumer bit: nothing is recorded without it (`global_instrumentation`).
pub const CONSUMER_GLOBAL: u32 = 1 << 0;
/// Consumer bit: per-thread tables (`thread_instrumentation`).
pub const CONSUMER_THREAD: u32 = 1 << 1;
/// Consumer bit: task statements' `CPU_TIME` (`events_statements_cpu`, as
/// MySQL 8.0.28's): a task's polls are timed (one timer pair each) only
/// while it is on. Since 6.2; writers of 6.0 and 6.1 time them always,
/// and readers show it on for them. The bit after the per-kind ones.
pub const CONSUMER_STATEMENTS_CPU: u32 = 1 << (2 + 4 * EventKind::ALL.len() as u32);
/// Per-kind consumer bits: the kind of [`EventKind::index`] `k` (0 waits,
/// 1 stages, 2 statements) uses bits `2 + 4k ..`: current, history,
/// history_long, summaries.
pub const fn consumer_bit(kind: EventKind, which: ConsumerKind) -> u32 {
    1 << (2 + 4 * kind.index() as u32 + which as u32)
}

/// Which per-kind consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ConsumerKind {
    /// `events_*_current`.
    Current = 0,
    /// `events_*_history`.
    History = 1,
    /// `events_*_history_long`.
    HistoryLong = 2,
    /// `events_*_summary_*`.
    Summaries = 3,
}

/// Default consumers: everything but the `history_long` rings (as PFS),
/// and `events_statements_cpu` on (off in MySQL, where it costs a system
/// call per statement; here a timer pair per poll of a task with a
/// statement open: see docs/ASYNC.md).
pub const CONSUMERS_DEFAULT: u32 = {
    let mut v = CONSUMER_GLOBAL | CONSUMER_THREAD | CONSUMER_STATEMENTS_CPU;
    let mut i = 0;
    while i < EventKind::ALL.len() {
        let k = EventKind::ALL[i];
        v |= consumer_bit(k, ConsumerKind::Current)
            | consumer_bit(k, ConsumerKind::History)
            | consumer_bit(k, ConsumerKind::Summaries);
        i += 1;
    }
    v
};

/// Default timers word: waits CYCLE, stages and statements NANOSECOND.
pub const TIMERS_DEFAULT: u32 =
    timers_word([TimerId::Cycle, TimerId::Nanosecond, TimerId::Nanosecond]);

/// Packs one timer per event kind (3 bits each), `t` indexed by
/// [`EventKind::index`].
pub const fn timers_word(t: [TimerId; 3]) -> u32 {
    (t[0] as u32) | ((t[1] as u32) << 3) | ((t[2] as u32) << 6)
}

/// The timer of event kind `kind` (bits `3k ..` for [`EventKind::index`]
/// `k`).
pub const fn timer_of(word: u32, kind: EventKind) -> u32 {
    (word >> (3 * kind.index() as u32)) & 7
}

/// Actor flag: threads matching this row are instrumented (`ENABLED`).
pub const ACTOR_ENABLED: u32 = 1;
/// Actor flag: their events go to the history tables (`HISTORY`).
pub const ACTOR_HISTORY: u32 = 2;
/// Actor flag: the row exists.
pub const ACTOR_USED: u32 = 4;
/// Rows in `setup_actors`.
pub const MAX_ACTORS: usize = 48;
/// Bytes per actor column.
pub const ACTOR_FIELD_BYTES: usize = 32;

/// One `setup_actors` row (128 bytes), written by the agent under `seq`.
#[repr(C)]
#[derive(Debug)]
pub struct ActorEntry {
    /// Sequence lock over the row.
    pub seq: SeqLock,
    /// `ACTOR_*` flags; 0 = unused row.
    pub flags: AtomicU32,
    /// Length of `host`.
    pub host_len: AtomicU32,
    /// Length of `user`.
    pub user_len: AtomicU32,
    /// Length of `role`.
    pub role_len: AtomicU32,
    /// `HOST` (`%` = any).
    pub host: [AtomicU64; ACTOR_FIELD_BYTES / 8],
    /// `USER` (`%` = any).
    pub user: [AtomicU64; ACTOR_FIELD_BYTES / 8],
    /// `ROLE` (`%` = any).
    pub role: [AtomicU64; ACTOR_FIELD_BYTES / 8],
    /// Reserved, zero.
    pub reserved: AtomicU64,
}

/// The setup section (8192 bytes): words that writers read on every event,
/// each alone on its cache line, and the actor rows.
#[repr(C)]
#[derive(Debug)]
pub struct SetupSection {
    /// `setup_consumers` as a bitmask (`CONSUMER_*`, [`consumer_bit`]).
    pub consumers: AtomicU32,
    /// Reserved, zero.
    pub reserved0: [AtomicU32; 15],
    /// `setup_timers`: 3 bits per event kind ([`timers_word`]).
    pub timers: AtomicU32,
    /// Reserved, zero.
    pub reserved1: [AtomicU32; 15],
    /// Bumped by the agent on every `setup_actors` change.
    pub actors_version: AtomicU64,
    /// Bumped by the agent on every TRUNCATE of a memory table: a memory
    /// row whose `truncate_gen` differs sets LOW = HIGH = CURRENT.
    pub memory_truncate_gen: AtomicU64,
    /// Layout 5.1: the agent's setup defaults applied to this segment,
    /// `fingerprint << 32 | classes covered` (0 = none): written by the
    /// agent, so that an agent started again with the same defaults does
    /// not apply them again over live changes.
    pub agent_defaults: AtomicU64,
    /// Reserved, zero.
    pub reserved2: [AtomicU64; 5],
    /// `setup_actors` rows.
    pub actors: [ActorEntry; MAX_ACTORS],
    /// Pads the section to 8192 bytes.
    pub padding: [AtomicU64; (8192 - 192 - 128 * MAX_ACTORS) / 8],
}

/// Header of a `history_long` section (128 bytes): the shared ticket
/// counter alone on its cache line, then two words reserved for the ring
/// geometry (zero in layout 3.0: the directory entry has it).
#[repr(C)]
#[derive(Debug)]
pub struct LongHeader {
    /// Next ticket: every append takes one with `fetch_add` (the only
    /// hot-path shared cache line, and only while the consumer is on).
    pub next: AtomicU64,
    /// Reserved, zero.
    pub reserved0: [AtomicU64; 7],
    /// Reserved for the number of slots: zero in layout 3.0, whose
    /// writers never store it. A reader takes the ring's length from the
    /// header's `history_long_len` (equal to its directory entry's `count`).
    pub len: AtomicU64,
    /// Reserved for the bytes per slot: zero in layout 3.0. A reader takes
    /// the slot size from the ring's directory entry (`stride`).
    pub slot_size: AtomicU64,
    /// Reserved, zero.
    pub reserved1: [AtomicU64; 6],
}

/// A `history_long` slot's sequence value for a completed write of ticket
/// `t` (even, never 0); odd while a writer holds the slot.
pub const fn long_seq(ticket: u64) -> u64 {
    (ticket + 1) << 1
}

/// Thread flag: `INSTRUMENTED` (setup_actors `ENABLED` for this thread).
pub const THREAD_INSTRUMENTED: u32 = 1;
/// Thread flag: `HISTORY`.
pub const THREAD_HISTORY: u32 = 2;

/// One event (128 bytes): `events_waits_current` and the history slots.
#[repr(C)]
#[derive(Debug)]
pub struct EventRecord {
    /// Sequence lock over every other field.
    pub seq: SeqLock,
    /// `EVENT_ID`: per-thread, shared by all event kinds, starts at 1.
    pub event_id: AtomicU64,
    /// `END_EVENT_ID` (valid with [`EV_ENDED`]).
    pub end_event_id: AtomicU64,
    /// Class index into the class registry.
    pub class: AtomicU32,
    /// [`crate::kinds::Operation`] as `u32`.
    pub operation: AtomicU32,
    /// `TIMER_START` as raw timer ticks (valid with [`EV_TIMED`]).
    pub timer_start: AtomicU64,
    /// `TIMER_END` as raw timer ticks (valid with [`EV_TIMED`] and [`EV_ENDED`]).
    pub timer_end: AtomicU64,
    /// `TIMER_WAIT` in picoseconds (valid with [`EV_TIMED`] and [`EV_ENDED`]).
    pub timer_wait: AtomicU64,
    /// `OBJECT_INSTANCE_BEGIN`: address or id of the waited-on object.
    pub object_instance: AtomicU64,
    /// `NUMBER_OF_BYTES` (valid with [`EV_HAS_BYTES`]).
    pub bytes: AtomicU64,
    /// `SPINS` (valid with [`EV_HAS_SPINS`]).
    pub spins: AtomicU64,
    /// `SOURCE`: string index, [`NONE_U32`] if unknown.
    pub source: AtomicU32,
    /// `OBJECT_NAME`: string index, [`NONE_U32`] if none.
    pub object_name: AtomicU32,
    /// `NESTING_EVENT_ID` (0 = NULL).
    pub nesting_event_id: AtomicU64,
    /// `NESTING_EVENT_TYPE`: [`EventKind::wire`] of the parent's kind.
    pub nesting_event_type: AtomicU32,
    /// `EV_*` flags.
    pub flags: AtomicU32,
    /// This event's own kind: [`EventKind::wire`].
    pub event_type: AtomicU32,
    /// Reserved, zero.
    pub reserved32: AtomicU32,
    /// `THREAD_ID` of the event. Always set in `history_long` rings. In a
    /// thread record's own rows, 0 means the record's thread (every row of
    /// a 3.0 writer); since 3.1 writers set it, and it differs from the
    /// record's when the event belongs to a task polled by that thread.
    pub thread_id: AtomicU64,
    /// Statements: `CPU_TIME` in picoseconds, valid with [`EV_ENDED`]: the
    /// time the statement's task was being polled (0 for a statement of a
    /// thread). Other kinds: zero. Since 3.1.
    pub cpu_time: AtomicU64,
}

/// Record lock word state: free (also the value of a never-touched,
/// zero-filled record, so a hole reads as FREE).
pub const REC_FREE: u64 = 0;
/// Record lock word state: being initialised by its new owner.
pub const REC_DIRTY: u64 = 1;
/// Record lock word state: owned and published.
pub const REC_ALLOCATED: u64 = 2;

/// The fixed part of a thread record (896 bytes). It is followed, in the
/// record, by the waits, stages and statements history rings
/// (`history_len` entries each) and `max_classes` [`SummaryRow`]s.
#[repr(C)]
#[derive(Debug)]
pub struct ThreadHeader {
    /// PFS-style lock word: `version << 2 | state` (protocol in the
    /// `lockword` module).
    pub lock: AtomicU64,
    /// Sequence lock over the identity fields below.
    pub seq: SeqLock,
    /// `THREAD_ID`: unique within the segment, starts at 1.
    pub thread_id: AtomicU64,
    /// `THREAD_OS_ID`: the kernel thread id (in the writer's namespace).
    pub os_tid: AtomicU64,
    /// Length in bytes of `name`.
    pub name_len: AtomicU32,
    /// `THREAD_INSTRUMENTED` | `THREAD_HISTORY`.
    pub flags: AtomicU32,
    /// UTF-8 thread name, zero padded.
    pub name: [AtomicU64; THREAD_NAME_BYTES / 8],
    /// Actor `USER` string index ([`NONE_U32`] = none declared).
    pub user: AtomicU32,
    /// Actor `HOST` string index.
    pub host: AtomicU32,
    /// Actor `ROLE` string index.
    pub role: AtomicU32,
    /// Reserved, zero.
    pub reserved0: AtomicU32,
    /// Next history slot per kind (by [`EventKind::index`]); owner only.
    pub history_next: [AtomicU32; 3],
    /// Reserved, zero.
    pub reserved1: AtomicU32,
    /// Events ever appended to each history ring (by [`EventKind::index`]);
    /// event *k* of a kind is in slot *k* mod `history_len`. Stored after
    /// the slot is complete.
    pub history_count: [AtomicU64; 3],
    /// Bit `c` set = summary row `c` has been written since allocation.
    /// Readers visit only touched rows.
    pub touched: [AtomicU64; MAX_CLASSES_LIMIT as usize / 64],
    /// `events_waits_current`.
    pub waits_current: EventRecord,
    /// `events_stages_current`.
    pub stages_current: EventRecord,
    /// `events_statements_current`.
    pub statements_current: StatementRecord,
}

/// Global section header (exited threads' totals), followed by the fold log
/// and `max_classes` [`SummaryRow`]s. `seq` guards the whole section.
#[repr(C)]
#[derive(Debug)]
pub struct GlobalHeader {
    /// Sequence lock over the rows, `fold_count` and the fold log.
    pub seq: SeqLock,
    /// Number of thread folds completed (the last fold ticket).
    pub fold_count: AtomicU64,
    /// Reserved, zero.
    pub reserved: [AtomicU64; 6],
    /// Ring of the last [`FOLD_LOG_LEN`] folds, indexed `ticket % FOLD_LOG_LEN`.
    pub fold_log: [FoldLogEntry; FOLD_LOG_LEN],
}

/// One fold: which record lifetime was folded under which ticket (24 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct FoldLogEntry {
    /// Fold ticket (1-based); 0 = empty.
    pub ticket: AtomicU64,
    /// Record index in the thread container.
    pub record: AtomicU64,
    /// Lock-word version of the folded record lifetime.
    pub version: AtomicU64,
}

/// Container page state (low 2 bits of a page word): never used; its
/// bytes are a hole.
pub const PAGE_UNUSED: u64 = 0;
/// Container page state: reserved (`fallocate`d) and part of every scan.
pub const PAGE_ACTIVE: u64 = 1;
/// Container page state: being checked and punched by its owner.
pub const PAGE_RECLAIMING: u64 = 2;
/// Container page state: its records were all FREE for the quiet time and
/// its bytes went back to the OS (a hole) until it is revived.
pub const PAGE_RECLAIMED: u64 = 3;
/// The unit of the `users` count in bits 2..63 of a page word (allocators
/// scanning the page; protocol in the `container` module).
pub const PAGE_USER: u64 = 4;

/// Header of the thread container section (64 bytes), followed by the page
/// directory (`max_pages` × `AtomicU64` page states, padded to [`PAGE`])
/// and the pages.
#[repr(C)]
#[derive(Debug)]
pub struct ContainerHeader {
    /// Records per page.
    pub records_per_page: AtomicU32,
    /// Maximum number of pages.
    pub max_pages: AtomicU32,
    /// Bytes per record (multiple of 64).
    pub record_size: AtomicU64,
    /// Bytes per page (multiple of [`PAGE`]).
    pub page_size: AtomicU64,
    /// Offset of page 0 from the start of the section.
    pub pages_offset: AtomicU64,
    /// Number of pages ever added (pages `0..pages_added` are ACTIVE,
    /// RECLAIMING or RECLAIMED; the rest are UNUSED).
    pub pages_added: AtomicU64,
    /// Pages reclaimed so far (each returned `page_size` bytes to the OS).
    pub pages_reclaimed: AtomicU64,
    /// Reclaimed pages revived so far.
    pub pages_revived: AtomicU64,
    /// Reserved, zero.
    pub reserved: AtomicU64,
}

/// Header of the Tasks section (64 bytes, since 7.1), followed by the
/// section's `count` [`TaskSlot`]s.
#[repr(C)]
#[derive(Debug)]
pub struct TasksHeader {
    /// Slots handed out at least once since creation: readers look at
    /// slots `0..used` only (every other slot is empty, and may be an
    /// unreserved hole). Only grows; stored with `Release` by the creating
    /// process under its slow-path lock, after the slot's page is reserved
    /// and before the slot is first written.
    pub used: AtomicU32,
    /// Reserved, zero.
    pub reserved0: AtomicU32,
    /// Reserved, zero.
    pub reserved: [AtomicU64; 7],
}

/// One task slot (640 bytes, since 7.1): what an async task (a logical
/// thread of its own `THREAD_ID`) has open while it awaits, so that
/// `events_*_current` shows a request that waits between polls. The same
/// three rows as a thread record's current events, each written under its
/// own sequence lock by the task (whichever thread runs it: a task runs on
/// one thread at a time, and the runtime orders its successive polls, so a
/// slot has one writer at a time, as a row must).
///
/// A row is empty while its `event_id` is 0. Otherwise it shows an event
/// of the task still running (never [`EV_ENDED`]), with `thread_id` set to
/// the task's `THREAD_ID`. The same event may show at once in the row of
/// the thread polling the task: a reader shows it once, from the thread's
/// row (which may also show it ended).
#[repr(C)]
#[derive(Debug)]
pub struct TaskSlot {
    /// The wait the task is queued in (an acquisition of an instrumented
    /// async lock, semaphore or channel), if any.
    pub waits_current: EventRecord,
    /// The task's open stage, if any.
    pub stages_current: EventRecord,
    /// The task's open statement, if any, with its `SQL_TEXT`.
    pub statements_current: StatementRecord,
}

// ---------------------------------------------------------------------------
// Compile-time checks: sizes and offsets are part of the format.
// ---------------------------------------------------------------------------

const _: () = {
    assert!(size_of::<SectionEntry>() == 32);
    assert!(size_of::<Header>() == PAGE);
    assert!(offset_of!(Header, magic) == 0x00);
    assert!(offset_of!(Header, major) == 0x08);
    assert!(offset_of!(Header, minor) == 0x0C);
    assert!(offset_of!(Header, byte_order) == 0x10);
    assert!(offset_of!(Header, header_size) == 0x14);
    assert!(offset_of!(Header, segment_size) == 0x18);
    assert!(offset_of!(Header, state) == 0x20);
    assert!(offset_of!(Header, creator_pid) == 0x28);
    assert!(offset_of!(Header, section_count) == 0x2C);
    assert!(offset_of!(Header, start_time_unix_ns) == 0x30);
    assert!(offset_of!(Header, timer_base_ticks) == 0x38);
    assert!(offset_of!(Header, timer_ps_per_tick_q32) == 0x40);
    assert!(offset_of!(Header, timer_frequency_hz) == 0x48);
    assert!(offset_of!(Header, timer_kind) == 0x50);
    assert!(offset_of!(Header, history_len) == 0x54);
    assert!(offset_of!(Header, service_name_len) == 0x58);
    assert!(offset_of!(Header, service_name) == 0x60);
    assert!(offset_of!(Header, timer_base_ns) == 0xA0);
    assert!(offset_of!(Header, history_long_len) == 0xA8);
    assert!(offset_of!(Header, long_reserved) == 0xB0);
    assert!(offset_of!(Header, sections) == 0x100);
    assert!(size_of::<LostCounters>() == 128);
    assert!(size_of::<ClassEntry>() == 128);
    assert!(offset_of!(ClassEntry, flags) == 4);
    assert!(offset_of!(ClassEntry, name) == 16);
    assert!(size_of::<StringEntry>() == 64);
    assert!(size_of::<SummaryRow>() == 384);
    assert!(offset_of!(SummaryRow, errors) == 320);
    assert!(offset_of!(SummaryRow, rows_examined) == 352);
    assert!(offset_of!(SummaryRow, cpu_time) == 360);
    assert!(offset_of!(SummaryRow, cancelled) == 368);
    assert!(offset_of!(SummaryRow, count) == 8);
    assert!(offset_of!(SummaryRow, timed_count) == 16);
    assert!(offset_of!(SummaryRow, sum_lo) == 24);
    assert!(offset_of!(SummaryRow, sum_hi) == 32);
    assert!(offset_of!(SummaryRow, min) == 40);
    assert!(offset_of!(SummaryRow, max) == 48);
    assert!(offset_of!(SummaryRow, bytes) == 56);
    assert!(offset_of!(SummaryRow, buckets) == 64);
    assert!(size_of::<IoTail>() == 64);
    assert!(size_of::<IoTail>() == size_of::<SummaryRow>() - offset_of!(SummaryRow, errors));
    assert!(align_of::<IoTail>() == align_of::<SummaryRow>());
    assert!(offset_of!(IoTail, sum_ns) == 24);
    assert!(offset_of!(IoTail, bytes) == 48);
    assert!(size_of::<MemoryRow>() == size_of::<SummaryRow>());
    assert!(size_of::<MemoryRow>() == 384);
    assert!(align_of::<MemoryRow>() == align_of::<SummaryRow>());
    assert!(offset_of!(MemoryRow, count_alloc) == 8);
    assert!(offset_of!(MemoryRow, low_count_used) == 40);
    assert!(offset_of!(MemoryRow, high_bytes_used) == 64);
    assert!(offset_of!(MemoryRow, truncate_gen) == 72);
    assert!(size_of::<MemoryRowV5>() == size_of::<MemoryRow>());
    assert!(align_of::<MemoryRowV5>() == align_of::<MemoryRow>());
    assert!(offset_of!(MemoryRowV5, low_count_used) == offset_of!(MemoryRow, low_count_used));
    assert!(offset_of!(MemoryRowV5, current_bytes_used) == 72);
    assert!(offset_of!(MemoryRowV5, truncate_gen) == 88);
    assert!(offset_of!(SetupSection, memory_truncate_gen) == 136);
    assert!(size_of::<EventRecord>() == 128);
    assert!(offset_of!(EventRecord, event_id) == 8);
    assert!(offset_of!(EventRecord, end_event_id) == 16);
    assert!(offset_of!(EventRecord, class) == 24);
    assert!(offset_of!(EventRecord, operation) == 28);
    assert!(offset_of!(EventRecord, timer_start) == 32);
    assert!(offset_of!(EventRecord, timer_end) == 40);
    assert!(offset_of!(EventRecord, timer_wait) == 48);
    assert!(offset_of!(EventRecord, object_instance) == 56);
    assert!(offset_of!(EventRecord, bytes) == 64);
    assert!(offset_of!(EventRecord, spins) == 72);
    assert!(offset_of!(EventRecord, source) == 80);
    assert!(offset_of!(EventRecord, object_name) == 84);
    assert!(offset_of!(EventRecord, nesting_event_id) == 88);
    assert!(offset_of!(EventRecord, nesting_event_type) == 96);
    assert!(offset_of!(EventRecord, flags) == 100);
    assert!(offset_of!(EventRecord, event_type) == 104);
    assert!(size_of::<StatementRecord>() == 384);
    assert!(offset_of!(StatementRecord, errors) == 128);
    assert!(offset_of!(StatementRecord, digest) == 168);
    assert!(offset_of!(StatementRecord, text_len) == 176);
    assert!(offset_of!(StatementRecord, text) == 184);
    assert!(size_of::<ThreadHeader>() == 896);
    assert!(offset_of!(ThreadHeader, lock) == 0);
    assert!(offset_of!(ThreadHeader, seq) == 8);
    assert!(offset_of!(ThreadHeader, thread_id) == 16);
    assert!(offset_of!(ThreadHeader, os_tid) == 24);
    assert!(offset_of!(ThreadHeader, name_len) == 32);
    assert!(offset_of!(ThreadHeader, flags) == 36);
    assert!(offset_of!(ThreadHeader, name) == 40);
    assert!(offset_of!(ThreadHeader, user) == 72);
    assert!(offset_of!(ThreadHeader, history_next) == 88);
    assert!(offset_of!(ThreadHeader, history_count) == 104);
    assert!(offset_of!(ThreadHeader, touched) == 128);
    assert!(offset_of!(ThreadHeader, waits_current) == 256);
    assert!(offset_of!(ThreadHeader, stages_current) == 384);
    assert!(offset_of!(ThreadHeader, statements_current) == 512);
    assert!(size_of::<ActorEntry>() == 128);
    assert!(size_of::<SetupSection>() == 8192);
    assert!(offset_of!(SetupSection, timers) == 64);
    assert!(offset_of!(SetupSection, actors_version) == 128);
    assert!(offset_of!(SetupSection, actors) == 192);
    assert!(size_of::<LongHeader>() == 128);
    assert!(offset_of!(EventRecord, thread_id) == 112);
    assert!(offset_of!(EventRecord, cpu_time) == 120);
    assert!(size_of::<FoldLogEntry>() == 24);
    assert!(size_of::<GlobalHeader>() == 64 + 24 * FOLD_LOG_LEN);
    assert!(offset_of!(SetupSection, consumers) == 0);
    assert!(size_of::<ContainerHeader>() == 64);
    assert!(offset_of!(ContainerHeader, records_per_page) == 0);
    assert!(offset_of!(ContainerHeader, max_pages) == 4);
    assert!(offset_of!(ContainerHeader, record_size) == 8);
    assert!(offset_of!(ContainerHeader, page_size) == 16);
    assert!(offset_of!(ContainerHeader, pages_offset) == 24);
    assert!(offset_of!(ContainerHeader, pages_added) == 32);
    assert!(offset_of!(ContainerHeader, pages_reclaimed) == 40);
    assert!(offset_of!(ContainerHeader, pages_revived) == 48);
    assert!(size_of::<TasksHeader>() == 64);
    assert!(offset_of!(TasksHeader, used) == 0);
    assert!(size_of::<TaskSlot>() == 640);
    assert!(offset_of!(TaskSlot, waits_current) == 0);
    assert!(offset_of!(TaskSlot, stages_current) == 128);
    assert!(offset_of!(TaskSlot, statements_current) == 256);
    // Histogram bucket bounds are what the docs say: powers of two of a
    // second, 7.45 ns to 8 s for waits, 954 ns to 1024 s for stages and
    // statements.
    assert!(LONG_BUCKET_UPPER_PS[0] == 953_674); // 2^-20 s = 953674.3 ps
    assert!(LONG_BUCKET_UPPER_PS[20] == 1_000_000_000_000); // 1 s
    assert!(LONG_BUCKET_UPPER_PS[30] == 1_024_000_000_000_000); // 1024 s
    assert!(BucketScale::Long.index(953_674) == 0);
    assert!(BucketScale::Long.index(953_675) == 1);
    assert!(BucketScale::Long.index(1_024_000_000_000_000) == 30);
    assert!(BucketScale::Long.index(1_024_000_000_000_001) == 31);
    assert!(BucketScale::Long.index(u64::MAX) == 31);
    let mut i = 0;
    while i < HISTOGRAM_BUCKETS - 1 {
        let u = LONG_BUCKET_UPPER_PS[i];
        assert!(BucketScale::Long.index(u) == i);
        assert!(BucketScale::Long.index(u + 1) == i + 1);
        assert!(i == 0 || BucketScale::Long.index(LONG_BUCKET_UPPER_PS[i - 1] + 1) == i);
        // The same bound as the wait scale's bucket `i + 7`.
        assert!(i + 7 >= HISTOGRAM_BUCKETS - 1 || u == BUCKET_UPPER_PS[i + 7]);
        i += 1;
    }
    assert!(BUCKET_UPPER_PS[0] == 7450); // 2^-27 s = 7450.58 ps
    assert!(BUCKET_UPPER_PS[27] == 1_000_000_000_000); // 1 s
    assert!(BUCKET_UPPER_PS[30] == 8_000_000_000_000); // 8 s
    assert!(bucket_index(0) == 0);
    assert!(bucket_index(7450) == 0);
    assert!(bucket_index(7451) == 1);
    assert!(bucket_index(14901) == 1); // 2^-26 s = 14901.16 ps
    assert!(bucket_index(14902) == 2);
    assert!(bucket_index(1_000_000_000_000) == 27);
    assert!(bucket_index(1_000_000_000_001) == 28);
    assert!(bucket_index(8_000_000_000_000) == 30);
    assert!(bucket_index(8_000_000_000_001) == 31);
    assert!(bucket_index(u64::MAX) == 31);
    // Every bound, and the picosecond on either side of it, is classified
    // as the table says (`bucket_index` computes the bounds with shifts).
    let mut i = 0;
    while i < HISTOGRAM_BUCKETS - 1 {
        let u = BUCKET_UPPER_PS[i];
        assert!(bucket_index(u) == i);
        assert!(bucket_index(u + 1) == i + 1);
        assert!(i == 0 || bucket_index(u - 1) == i);
        assert!(i == 0 || bucket_index(BUCKET_UPPER_PS[i - 1] + 1) == i);
        i += 1;
    }
};

/// Byte size of one thread record for the given parameters: its head
/// ([`thread_head_size`]) and its body ([`thread_body_size`]).
pub const fn thread_record_size(history_len: u32, max_classes: u32) -> usize {
    thread_head_size(max_classes) + thread_body_size(history_len, max_classes)
}

/// Offset of the row sequence array within a record's head (since 5.0):
/// one [`SeqLock`] per class, entry *c* guarding summary (or memory) row
/// *c*, right after the [`ThreadHeader`]. Dense, so that a reader learns
/// which rows changed since it last read them without touching the rows.
pub const ROW_SEQS_OFFSET: usize = size_of::<ThreadHeader>();

/// Byte size of a record's head (since 5.0): the [`ThreadHeader`] and the
/// row sequence array, padded to 64 bytes. A container page holds its
/// records' heads side by side, then their bodies, so that the part of
/// every record a reader looks at on each snapshot is a few dense pages.
pub const fn thread_head_size(max_classes: u32) -> usize {
    ROW_SEQS_OFFSET + (max_classes as usize * size_of::<SeqLock>()).next_multiple_of(64)
}

/// Byte size of a record's body: `history_len` waits and stages
/// [`EventRecord`]s, `history_len` [`StatementRecord`]s, `max_classes`
/// summary rows (a multiple of 64).
pub const fn thread_body_size(history_len: u32, max_classes: u32) -> usize {
    rows_offset(history_len) + max_classes as usize * size_of::<SummaryRow>()
}

/// Offset of the stages history ring within a record's body (the waits
/// ring is at 0).
pub const fn stages_history_offset(history_len: u32) -> usize {
    history_len as usize * size_of::<EventRecord>()
}

/// Offset of the statements history ring within a record's body.
pub const fn statements_history_offset(history_len: u32) -> usize {
    stages_history_offset(history_len) + history_len as usize * size_of::<EventRecord>()
}

/// Offset of summary row 0 within a record's body.
pub const fn rows_offset(history_len: u32) -> usize {
    statements_history_offset(history_len) + history_len as usize * size_of::<StatementRecord>()
}

/// Offset of summary row 0 within the global section.
pub const GLOBAL_ROWS_OFFSET: usize = size_of::<GlobalHeader>();

/// Rounds `n` up to a multiple of [`PAGE`].
pub const fn page_align(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The bucket by the table: the first bound at or above `ps`.
    fn bucket_by_table(ps: u64) -> usize {
        BUCKET_UPPER_PS
            .iter()
            .position(|&u| ps <= u)
            .unwrap_or(HISTOGRAM_BUCKETS - 1)
    }

    proptest! {
        #[test]
        fn bucket_index_is_the_tables(ps in any::<u64>(), shift in 0u32..64) {
            // Every magnitude, not only the huge values `any` favours.
            let ps = ps >> shift;
            prop_assert_eq!(bucket_index(ps), bucket_by_table(ps));
            let long = LONG_BUCKET_UPPER_PS
                .iter()
                .position(|&u| ps <= u)
                .unwrap_or(HISTOGRAM_BUCKETS - 1);
            prop_assert_eq!(BucketScale::Long.index(ps), long);
        }

        #[test]
        fn rescaling_puts_every_duration_where_the_new_scale_would(
            ps in any::<u64>(), shift in 0u32..64,
        ) {
            let ps = ps >> shift;
            let mut short = [0u64; HISTOGRAM_BUCKETS];
            short[bucket_index(ps)] = 1;
            let long = BucketScale::Long.rescale(BucketScale::Short, &short);
            let expect = if ps > BUCKET_UPPER_PS[HISTOGRAM_BUCKETS - 2] {
                // Above 8 s: only that is known, counted in (8 s, 16 s].
                BucketScale::Long.index(16_000_000_000_000)
            } else {
                BucketScale::Long.index(ps)
            };
            prop_assert_eq!(long.iter().position(|&n| n == 1), Some(expect));
            prop_assert_eq!(long.iter().sum::<u64>(), 1);
        }
    }

    #[test]
    fn the_same_scale_is_kept_and_the_coarse_one_refines_by_bound() {
        let b: [u64; HISTOGRAM_BUCKETS] = std::array::from_fn(|i| i as u64 + 1);
        for s in [BucketScale::Short, BucketScale::Long] {
            assert_eq!(s.rescale(s, &b), b);
        }
        let fine = BucketScale::Short.rescale(BucketScale::Long, &b);
        assert_eq!(fine.iter().sum::<u64>(), b.iter().sum::<u64>());
        assert_eq!(fine[7], 1); // Long bucket 0 ends at 2^-20 s, as Short 7
        assert_eq!(fine[30], 24); // Long 23: (4 s, 8 s]
        assert_eq!(fine[31], (25..=32).sum::<u64>());
        assert_eq!(
            BucketScale::written(EventKind::Statement, 7),
            BucketScale::Short
        );
        assert_eq!(
            BucketScale::written(EventKind::Statement, 8),
            BucketScale::Long
        );
        assert_eq!(BucketScale::written(EventKind::Wait, 8), BucketScale::Short);
        assert_eq!(BucketScale::Long.upper_ps(0), Some(953_674));
        assert_eq!(BucketScale::Long.upper_seconds(0), Some(2f64.powi(-20)));
        assert_eq!(BucketScale::Long.upper_ps(31), None);
    }
}
