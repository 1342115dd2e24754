//! Layer 2. A segment's geometry: the parameters fixed when it is
//! created ([`SegmentConfig`]), their limits, and the offset and size of
//! every section derived from them ([`Geometry`]), by the creator and again
//! by every reader, which checks them against the file. Pure arithmetic on
//! the [`crate::layout`] types; mapping the file is the next layer's job.
//!
//! Builds on [`crate::layout`], [`crate::kinds`] and [`crate::error`].

use std::mem::size_of;

use crate::error::SegmentError;
use crate::kinds::EventKind;
use crate::layout::*;

/// Largest string table a segment may declare.
pub const MAX_STRINGS: u32 = 1 << 20;
/// Largest number of thread records per container page.
pub const MAX_RECORDS_PER_PAGE: u32 = 4096;
/// Largest number of container pages.
pub const MAX_PAGES: u32 = 1 << 16;
/// Largest `history_long` ring.
pub const MAX_HISTORY_LONG_LEN: u32 = 1 << 24;
/// Largest `history_len` (events per thread and kind in the history rings).
pub const MAX_HISTORY_LEN: u32 = 1024;
/// Largest number of task slots.
pub const MAX_TASK_SLOTS: u32 = 1 << 16;
/// Offset of the lost counters section: the page after the header, in
/// every segment a creator of this major version lays out.
pub const COUNTERS_OFF: usize = PAGE;

/// Parameters fixed when a segment is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentConfig {
    /// Service name shown in metrics (`service` label); at most 64 bytes.
    pub service_name: String,
    /// Events per `events_*_history` ring (PFS default 10).
    pub history_len: u32,
    /// Capacity of the instrument class registry (≤ 1024).
    pub max_classes: u32,
    /// Capacity of the interned-string table.
    pub max_strings: u32,
    /// Thread records per container page.
    pub records_per_page: u32,
    /// Maximum container pages; `records_per_page * max_pages` threads.
    pub max_pages: u32,
    /// Events per `events_*_history_long` ring (PFS default 10 000); the
    /// rings are reserved only when their consumer is first enabled.
    pub history_long_len: u32,
    /// Task slots: async tasks (with an open statement, stage or queued
    /// wait) that `events_*_current` can show while they await at once.
    /// 0 leaves the Tasks section out (since 7.1).
    pub task_slots: u32,
}

/// The largest segment a reader accepts by default: `pfs-agent`'s
/// `--max-segment-size` default (a file claiming more, e.g. a huge sparse
/// one, is refused as `too_large`), and so the largest `pfs-client`
/// creates: a bigger one would record what nothing exports. A default
/// segment is about 112 MiB, mostly sparse.
pub const DEFAULT_MAX_SEGMENT_BYTES: u64 = 4 << 30;

impl Default for SegmentConfig {
    fn default() -> Self {
        Self {
            service_name: "unknown".into(),
            history_len: 10,
            max_classes: 256,
            max_strings: 2048,
            records_per_page: 16,
            max_pages: 64,
            history_long_len: 10_000,
            task_slots: 1024,
        }
    }
}

/// Offsets and sizes of every section, derived from a [`SegmentConfig`]
/// by the creator and re-derived and checked by readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Events per history ring.
    pub history_len: u32,
    /// Class registry capacity.
    pub max_classes: u32,
    /// String table capacity.
    pub max_strings: u32,
    /// Records per container page.
    pub records_per_page: u32,
    /// Maximum container pages.
    pub max_pages: u32,
    /// Offset of the counters section.
    pub counters_off: usize,
    /// Offset of the class registry.
    pub classes_off: usize,
    /// Offset of the string table.
    pub strings_off: usize,
    /// Offset of the global section.
    pub global_off: usize,
    /// Offset of the setup section.
    pub setup_off: usize,
    /// Offset of the Tasks section (equal to `threads_off` when it has
    /// no slots).
    pub tasks_off: usize,
    /// Task slots (0: no Tasks section).
    pub task_slots: u32,
    /// Offset of the thread container section.
    pub threads_off: usize,
    /// Offsets of the waits, stages and statements `history_long` sections
    /// (by [`EventKind::index`]).
    pub long_off: [usize; 3],
    /// Slots per `history_long` ring.
    pub long_len: u32,
    /// Offset of container page 0 (absolute).
    pub pages_off: usize,
    /// Bytes per thread record.
    pub record_size: usize,
    /// Bytes per container page.
    pub page_size: usize,
    /// Total file size.
    pub total_size: usize,
}

/// Bytes of a Tasks section of `slots` slots: its header and the slots,
/// page aligned; 0 for none.
const fn tasks_size(slots: u32) -> usize {
    if slots == 0 {
        0
    } else {
        page_align(size_of::<TasksHeader>() + slots as usize * size_of::<TaskSlot>())
    }
}

impl Geometry {
    /// Lays out a segment for `cfg`, or explains which parameter is out of
    /// range.
    pub fn new(cfg: &SegmentConfig) -> Result<Self, SegmentError> {
        let bad = |what: String| Err(SegmentError::BadConfig(what));
        let in_range = |v: u32, max: u32| (1..=max).contains(&v);
        if !in_range(cfg.history_len, MAX_HISTORY_LEN) {
            return bad(format!("history_len must be in 1..={MAX_HISTORY_LEN}"));
        }
        if !in_range(cfg.max_classes, MAX_CLASSES_LIMIT) {
            return bad(format!("max_classes must be in 1..={MAX_CLASSES_LIMIT}"));
        }
        if !in_range(cfg.max_strings, MAX_STRINGS) {
            return bad(format!("max_strings must be in 1..={MAX_STRINGS}"));
        }
        if !in_range(cfg.records_per_page, MAX_RECORDS_PER_PAGE) {
            return bad(format!(
                "records_per_page must be in 1..={MAX_RECORDS_PER_PAGE}"
            ));
        }
        if !in_range(cfg.max_pages, MAX_PAGES) {
            return bad(format!("max_pages must be in 1..={MAX_PAGES}"));
        }
        if cfg.service_name.len() > SERVICE_NAME_BYTES {
            return bad(format!(
                "service_name must be at most {SERVICE_NAME_BYTES} bytes"
            ));
        }
        if cfg.task_slots > MAX_TASK_SLOTS {
            return bad(format!("task_slots must be at most {MAX_TASK_SLOTS}"));
        }
        if cfg.history_long_len > MAX_HISTORY_LONG_LEN {
            return bad(format!(
                "history_long_len must be at most {MAX_HISTORY_LONG_LEN}"
            ));
        }
        let record_size = thread_record_size(cfg.history_len, cfg.max_classes);
        let page_size = page_align(record_size * cfg.records_per_page as usize);
        let counters_off = COUNTERS_OFF;
        let classes_off = counters_off + PAGE;
        let strings_off =
            classes_off + page_align(cfg.max_classes as usize * size_of::<ClassEntry>());
        let global_off =
            strings_off + page_align(cfg.max_strings as usize * size_of::<StringEntry>());
        let setup_off = global_off
            + page_align(GLOBAL_ROWS_OFFSET + cfg.max_classes as usize * size_of::<SummaryRow>());
        let tasks_off = setup_off + size_of::<SetupSection>();
        let threads_off = tasks_off + tasks_size(cfg.task_slots);
        let pages_off =
            threads_off + page_align(size_of::<ContainerHeader>() + cfg.max_pages as usize * 8);
        let too_large = || SegmentError::BadConfig("segment too large".into());
        let threads_end = pages_off
            .checked_add(
                page_size
                    .checked_mul(cfg.max_pages as usize)
                    .ok_or_else(too_large)?,
            )
            .ok_or_else(too_large)?;
        let long_len = cfg.history_long_len as usize;
        let event_long = page_align(size_of::<LongHeader>() + long_len * size_of::<EventRecord>());
        let stmt_long =
            page_align(size_of::<LongHeader>() + long_len * size_of::<StatementRecord>());
        // Waits, stages, statements (in `EventKind::index` order).
        let long_off = [
            threads_end,
            threads_end + event_long,
            threads_end + 2 * event_long,
        ];
        let total_size = long_off[EventKind::Statement.index()] + stmt_long;
        Ok(Self {
            history_len: cfg.history_len,
            max_classes: cfg.max_classes,
            max_strings: cfg.max_strings,
            records_per_page: cfg.records_per_page,
            max_pages: cfg.max_pages,
            counters_off,
            classes_off,
            strings_off,
            global_off,
            setup_off,
            tasks_off,
            task_slots: cfg.task_slots,
            threads_off,
            long_off,
            long_len: cfg.history_long_len,
            pages_off,
            record_size,
            page_size,
            total_size,
        })
    }

    /// Bytes of the `history_long` section of `kind`.
    pub fn long_size(&self, kind: EventKind) -> usize {
        let slot = if kind == EventKind::Statement {
            size_of::<StatementRecord>()
        } else {
            size_of::<EventRecord>()
        };
        page_align(size_of::<LongHeader>() + self.long_len as usize * slot)
    }

    /// Bytes of the Tasks section (0 when it has no slots).
    pub fn tasks_size(&self) -> usize {
        tasks_size(self.task_slots)
    }

    /// Absolute offset of task slot `i`.
    pub fn task_slot_off(&self, i: u32) -> usize {
        self.tasks_off + size_of::<TasksHeader>() + i as usize * size_of::<TaskSlot>()
    }

    /// Maximum number of thread records.
    pub fn max_records(&self) -> u32 {
        self.records_per_page * self.max_pages
    }

    /// Absolute offset of thread record `idx`'s head (its header, then
    /// its row sequences): slot *i* of a page has the page's *i*-th head.
    pub fn record_off(&self, idx: u32) -> usize {
        let page = idx / self.records_per_page;
        let slot = (idx % self.records_per_page) as usize;
        self.page_off(page) + slot * thread_head_size(self.max_classes)
    }

    /// Absolute offset of thread record `idx`'s body (its history rings,
    /// then its summary rows), after the page's heads.
    pub fn record_body_off(&self, idx: u32) -> usize {
        let page = idx / self.records_per_page;
        let slot = (idx % self.records_per_page) as usize;
        let head = thread_head_size(self.max_classes);
        self.page_off(page)
            + self.records_per_page as usize * head
            + slot * (self.record_size - head)
    }

    /// Absolute offset of container page `page`.
    pub fn page_off(&self, page: u32) -> usize {
        self.pages_off + page as usize * self.page_size
    }
}
