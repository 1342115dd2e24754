//! Mapping a segment file: creation (by the instrumented process), a
//! validating open (by the agent), and typed views of every section.
//!
//! One of the four modules allowed to use `unsafe` (with
//! [`crate::sigbus`], [`crate::tsc`] and [`crate::fork`]; the crate root
//! denies `unsafe_code` everywhere else): this one turns offsets, checked
//! against the validated geometry, into typed references to atomics.
//!
//! Layer 3 (see the crate docs): builds on [`crate::geometry`] (where
//! each section lies), [`crate::calibration`] (the header's timer),
//! [`crate::layout`], [`crate::kinds`] (the event kind of a
//! `history_long` ring), [`crate::seqlock`], [`crate::sigbus`],
//! [`crate::actors`] (the default actor row written at creation),
//! [`crate::text`] and [`crate::error`].

use std::fs::File;
use std::mem::{align_of, size_of};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::SegmentError;
use crate::kinds::EventKind;
use crate::layout::*;
use crate::seqlock::SeqLock;
use crate::sigbus::Registration;
use crate::text::{load_string, store_bytes};

// Moved to `text` (below every user of strings); re-exported at its old
// path.
pub use crate::text::truncate_utf8;

// Moved to `geometry` and `calibration` (pure arithmetic, below the
// mapping); re-exported at their old paths.
pub use crate::calibration::TimerCalibration;
pub use crate::geometry::{
    Geometry, MAX_HISTORY_LEN, MAX_HISTORY_LONG_LEN, MAX_PAGES, MAX_RECORDS_PER_PAGE, MAX_STRINGS,
    MAX_TASK_SLOTS, SegmentConfig,
};

/// A private copy of one row slot, filled by [`Segment::copy_row`] and
/// read like the row itself ([`RowCopy::summary`], [`RowCopy::memory`]).
/// Allocated once and reused.
pub struct RowCopy(Box<SummaryRow>);

impl RowCopy {
    /// A zeroed row.
    pub fn new() -> Self {
        // SAFETY: `SummaryRow` is `repr(C)` and made only of `AtomicU64`s
        // (asserted where it is defined: no padding), for which all-zero
        // bytes are a valid value.
        Self(unsafe { Box::new(std::mem::zeroed()) })
    }

    /// The copied row, as a summary row.
    pub fn summary(&self) -> &SummaryRow {
        &self.0
    }

    /// The copied row, as a memory row.
    pub fn memory(&self) -> &MemoryRow {
        let row: &SummaryRow = &self.0;
        // SAFETY: `MemoryRow` has the size and alignment of `SummaryRow`
        // (asserted in `layout`); both are `repr(C)` aggregates of atomics,
        // valid for any bit pattern; the borrow is that of `self`.
        unsafe { &*(row as *const SummaryRow).cast::<MemoryRow>() }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let row: &mut SummaryRow = &mut self.0;
        // SAFETY: the slice covers exactly the row, which this exclusive
        // borrow owns for the slice's lifetime; every byte pattern is a
        // valid `SummaryRow` (atomics of integers, no padding), so any
        // bytes written through the slice leave a valid value.
        unsafe {
            std::slice::from_raw_parts_mut(
                (row as *mut SummaryRow).cast::<u8>(),
                size_of::<SummaryRow>(),
            )
        }
    }
}

/// A private copy of the first row slots of one thread record, filled by
/// [`Segment::copy_rows_via`] with one `pread(2)`; row *c* is read like
/// the row itself ([`RowsCopy::summary`]). Allocated once per walk and
/// reused.
pub struct RowsCopy {
    rows: Box<[SummaryRow]>,
    /// Each row's sequence, loaded before the copy.
    seqs: Box<[u64]>,
    /// Rows filled by the last copy.
    len: usize,
}

impl RowsCopy {
    /// Room for `n` zeroed rows.
    pub fn new(n: usize) -> Self {
        let rows = (0..n)
            // SAFETY: as in `RowCopy::new`: all-zero bytes are a valid
            // `SummaryRow`.
            .map(|_| unsafe { std::mem::zeroed::<SummaryRow>() })
            .collect();
        Self {
            rows,
            seqs: vec![0; n].into_boxed_slice(),
            len: 0,
        }
    }

    /// Rows it has room for.
    pub fn room(&self) -> usize {
        self.rows.len()
    }

    /// Copied row `class`, as a summary row, with the sequence it was
    /// copied at, if `seq` (the row's sequence lock) shows that no write
    /// overlapped the copy (even before it, the same now); `None`
    /// otherwise, or beyond the rows the last copy filled.
    pub fn summary(&self, class: usize, seq: &SeqLock) -> Option<(u64, &SummaryRow)> {
        let row = self.rows[..self.len].get(class)?;
        let before = self.seqs[class];
        (before & 1 == 0 && seq.sequence() == before).then_some((before, row))
    }

    fn bytes_mut(&mut self, n: usize) -> &mut [u8] {
        let rows = &mut self.rows[..n];
        // SAFETY: the slice covers exactly these rows, which this
        // exclusive borrow owns for the slice's lifetime; every byte
        // pattern is a valid `SummaryRow` (atomics of integers, no
        // padding).
        unsafe { std::slice::from_raw_parts_mut(rows.as_mut_ptr().cast::<u8>(), size_of_val(rows)) }
    }
}

impl Default for RowsCopy {
    /// Room for no row.
    fn default() -> Self {
        Self::new(0)
    }
}

impl Default for RowCopy {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for RowCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowCopy").finish_non_exhaustive()
    }
}

/// Another open file description of a segment's file
/// ([`Segment::row_reader`]), for one of several threads that copy rows
/// at once ([`Segment::copy_row_via`]), with the identity of the file
/// (device and inode), so that it reads only for its own segment.
#[derive(Debug)]
pub struct RowReader(File, FileId);

/// A file's device and inode numbers.
type FileId = (u64, u64);

/// The device and inode numbers of `m`'s file.
fn file_id(m: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// Makes reads through `file` leave its access time alone (`O_NOATIME`),
/// where the kernel allows it (this process owns the file, or has
/// `CAP_FOWNER`); else reads go on as before. A reader's every `pread`
/// otherwise asks whether the file's access time is due an update: about
/// 3 % of an incremental scrape, which copies a few thousand rows one
/// `pread` each.
fn no_atime(file: &File) {
    use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
    if let Ok(flags) = fcntl_getfl(file) {
        // (`EPERM` for a file of another user: nothing to do.)
        let _ = fcntl_setfl(file, flags | OFlags::NOATIME);
    }
}

/// A mapped segment, validated. Both sides use it: the creator through
/// [`Segment::create`], readers through [`Segment::open`].
#[derive(Debug)]
pub struct Segment {
    /// SIGBUS protection of `map` (readers only). Declared before `map` so
    /// that it is dropped, and the range unregistered, before the unmap.
    guard: Option<Registration>,
    map: MmapRaw,
    file: File,
    /// `file`'s identity, for [`Segment::copy_row_via`].
    file_id: FileId,
    geom: Geometry,
    timer: TimerCalibration,
    service: String,
    pid: u32,
    start_time_unix_ns: u64,
    major: u32,
    minor: u32,
}

/// Refuses a file of `size` bytes that the process's file size limit
/// (`RLIMIT_FSIZE`) forbids: extending a file past it raises `SIGXFSZ`,
/// whose default action kills the process, before the call can fail.
pub fn within_file_size_limit(size: u64) -> Result<(), SegmentError> {
    match rustix::process::getrlimit(rustix::process::Resource::Fsize).current {
        Some(limit) if limit < size => Err(SegmentError::FileSizeLimit { limit, size }),
        _ => Ok(()),
    }
}

impl Segment {
    /// Creates a segment in `file` (empty, opened read-write, owned and
    /// `flock`ed by the caller). Every fixed region is reserved with
    /// `fallocate` before it is touched, so a full volume is an error here,
    /// never a SIGBUS later.
    pub fn create(
        file: File,
        cfg: &SegmentConfig,
        timer: TimerCalibration,
        pid: u32,
        start_time_unix_ns: u64,
    ) -> Result<Self, SegmentError> {
        Self::create_with(file, cfg, timer, pid, start_time_unix_ns, false, |_| {})
    }

    /// [`Segment::create`], running `prepare` on the segment just before
    /// it is published (`SEGMENT_READY`): setup the creator writes there
    /// (its initial consumers and `setup_actors` rows) is in place before
    /// any reader, or any agent that changes setup, can open it, so the
    /// creator is never a second writer of a row beside the agent. With
    /// `protect`, the mapping is protected ([`Segment::protect`]) as soon
    /// as it is made, before its first byte is written: a file truncated
    /// while it is being created cannot kill the creator either (the
    /// segment is then returned [`Segment::faulted`]). If it cannot be
    /// protected, it is created all the same: [`Segment::protected`] says
    /// which.
    #[allow(clippy::too_many_arguments)]
    pub fn create_with(
        file: File,
        cfg: &SegmentConfig,
        timer: TimerCalibration,
        pid: u32,
        start_time_unix_ns: u64,
        protect: bool,
        prepare: impl FnOnce(&Segment),
    ) -> Result<Self, SegmentError> {
        let geom = Geometry::new(cfg)?;
        within_file_size_limit(geom.total_size as u64)?;
        file.set_len(geom.total_size as u64)
            .map_err(|e| SegmentError::Io("set the segment size", e))?;
        // Task slots are reserved as they are first handed out
        // (`reserve_task_slot`): only the section's first page, with its
        // header, is reserved now.
        let first_task_page = if geom.task_slots > 0 { PAGE } else { 0 };
        reserve(&file, 0, geom.tasks_off + first_task_page)?;
        reserve(&file, geom.threads_off, geom.pages_off - geom.threads_off)?;
        let meta = file
            .metadata()
            .map_err(|e| SegmentError::Io("stat the segment", e))?;
        let map = MmapOptions::new()
            .len(geom.total_size)
            .map_raw(&file)
            .map_err(|e| SegmentError::Io("map the segment", e))?;
        let mut seg = Self {
            guard: None,
            map,
            file,
            file_id: file_id(&meta),
            geom,
            timer,
            service: cfg.service_name.clone(),
            pid,
            start_time_unix_ns,
            major: LAYOUT_MAJOR,
            minor: LAYOUT_MINOR,
        };
        if protect {
            let _ = seg.protect();
        }
        let h = seg.header();
        let r = Ordering::Relaxed;
        h.magic.store(MAGIC, r);
        h.major.store(LAYOUT_MAJOR, r);
        h.minor.store(LAYOUT_MINOR, r);
        h.byte_order.store(BYTE_ORDER_MARK, r);
        h.header_size.store(PAGE as u32, r);
        h.segment_size.store(geom.total_size as u64, r);
        h.creator_pid.store(pid, r);
        h.start_time_unix_ns.store(start_time_unix_ns, r);
        h.timer_base_ticks.store(timer.base_ticks, r);
        h.timer_ps_per_tick_q32.store(timer.ps_per_tick_q32, r);
        h.timer_frequency_hz.store(timer.frequency_hz, r);
        h.timer_kind.store(timer.kind as u32, r);
        h.timer_base_ns.store(timer.base_ns, r);
        h.history_long_len.store(u64::from(geom.long_len), r);
        h.history_len.store(geom.history_len, r);
        store_bytes(
            &h.service_name,
            &h.service_name_len,
            cfg.service_name.as_bytes(),
        );
        let sections = [
            (
                SectionKind::Counters,
                geom.counters_off,
                PAGE,
                LOST_COUNTERS as u32,
                8,
            ),
            (
                SectionKind::Classes,
                geom.classes_off,
                geom.strings_off - geom.classes_off,
                geom.max_classes,
                size_of::<ClassEntry>() as u32,
            ),
            (
                SectionKind::Strings,
                geom.strings_off,
                geom.global_off - geom.strings_off,
                geom.max_strings,
                size_of::<StringEntry>() as u32,
            ),
            (
                SectionKind::Global,
                geom.global_off,
                geom.setup_off - geom.global_off,
                geom.max_classes,
                size_of::<SummaryRow>() as u32,
            ),
            (
                SectionKind::Setup,
                geom.setup_off,
                size_of::<SetupSection>(),
                MAX_ACTORS as u32,
                size_of::<ActorEntry>() as u32,
            ),
            (
                SectionKind::Tasks,
                geom.tasks_off,
                geom.tasks_size(),
                geom.task_slots,
                size_of::<TaskSlot>() as u32,
            ),
            (
                SectionKind::Threads,
                geom.threads_off,
                geom.long_off[EventKind::Wait.index()] - geom.threads_off,
                geom.max_pages,
                geom.page_size as u32,
            ),
            (
                SectionKind::WaitsLong,
                geom.long_off[EventKind::Wait.index()],
                geom.long_size(EventKind::Wait),
                geom.long_len,
                size_of::<EventRecord>() as u32,
            ),
            (
                SectionKind::StagesLong,
                geom.long_off[EventKind::Stage.index()],
                geom.long_size(EventKind::Stage),
                geom.long_len,
                size_of::<EventRecord>() as u32,
            ),
            (
                SectionKind::StatementsLong,
                geom.long_off[EventKind::Statement.index()],
                geom.long_size(EventKind::Statement),
                geom.long_len,
                size_of::<StatementRecord>() as u32,
            ),
        ];
        // A section of no bytes (Tasks with no slots) is left out.
        let sections = sections.into_iter().filter(|s| s.2 > 0);
        let mut used = 0;
        for (entry, (kind, off, size, count, stride)) in h.sections.iter().zip(sections) {
            entry.kind.store(kind as u32, r);
            entry.offset.store(off as u64, r);
            entry.size.store(size as u64, r);
            entry.count.store(count, r);
            entry.stride.store(stride, r);
            used += 1;
        }
        h.section_count.store(used, r);
        for row in seg.global_rows() {
            row.min.store(u64::MAX, r);
        }
        let setup = seg.setup();
        setup.consumers.store(CONSUMERS_DEFAULT, r);
        setup.timers.store(TIMERS_DEFAULT, r);
        crate::actors::write_actor(
            &setup.actors[0],
            "%",
            "%",
            "%",
            ACTOR_ENABLED | ACTOR_HISTORY,
        );
        let c = seg.container_header();
        c.records_per_page.store(geom.records_per_page, r);
        c.max_pages.store(geom.max_pages, r);
        c.record_size.store(geom.record_size as u64, r);
        c.page_size.store(geom.page_size as u64, r);
        c.pages_offset
            .store((geom.pages_off - geom.threads_off) as u64, r);
        prepare(&seg);
        h.state.store(SEGMENT_READY, Ordering::Release);
        Ok(seg)
    }

    /// Opens and validates an existing segment. Every offset, size, count
    /// and string of the header is checked against the file before use; a
    /// segment still being initialised gives [`SegmentError::NotReady`].
    /// `writable` maps it read-write (needed only to change setup flags);
    /// a read-only open also sets `O_NOATIME` on `file`'s open file
    /// description where the kernel allows it (see `no_atime`).
    pub fn open(file: File, writable: bool) -> Result<Self, SegmentError> {
        if !writable {
            no_atime(&file);
        }
        let meta = file
            .metadata()
            .map_err(|e| SegmentError::Io("stat the segment", e))?;
        let len = meta.len();
        if len < PAGE as u64 {
            return Err(SegmentError::Truncated {
                len,
                need: PAGE as u64,
            });
        }
        let len = usize::try_from(len)
            .map_err(|_| SegmentError::Corrupt("file larger than address space".into()))?;
        let mut opts = MmapOptions::new();
        opts.len(len);
        let map = if writable {
            opts.map_raw(&file)
        } else {
            opts.map_raw_read_only(&file)
        }
        .map_err(|e| SegmentError::Io("map the segment", e))?;
        // Protected from here on: the file may shrink under the mapping at
        // any time, including while it is being validated.
        let guard = Registration::new(map.as_ptr(), len)?;
        let validated = Self::validate(&map, len);
        let faulted = guard.faulted();
        let seg = match validated {
            Ok(v) => Self {
                guard: Some(guard),
                map,
                file,
                file_id: file_id(&meta),
                geom: v.geom,
                timer: v.timer,
                service: v.service,
                pid: v.pid,
                start_time_unix_ns: v.start_time_unix_ns,
                major: v.major,
                minor: v.minor,
            },
            // Zeros read after a fault explain nothing: report the fault.
            Err(_) if faulted => {
                let now = file.metadata().map(|m| m.len()).unwrap_or(0);
                return Err(if now < len as u64 {
                    SegmentError::Shrunk {
                        len: now,
                        need: len as u64,
                    }
                } else {
                    SegmentError::Unreadable
                });
            }
            Err(e) => return Err(e),
        };
        seg.check()?;
        Ok(seg)
    }

    /// The checks of [`Self::open`] on a mapping of `len` bytes.
    fn validate(map: &MmapRaw, len: usize) -> Result<Validated, SegmentError> {
        // Header fields are validated through a temporary view of page 0.
        // SAFETY: `len >= PAGE` was checked and `Header` is `PAGE` bytes,
        // so it is in bounds; the mapping is page aligned; `Header` is made
        // of atomics only (valid for any bit pattern, changed by other
        // processes only atomically); the reference borrows `map` and is
        // used only in this function. The caller registered the mapping
        // with `sigbus` first, so a file shrinking now cannot kill us.
        let h: &Header = unsafe { &*(map.as_ptr() as *const Header) };
        let r = Ordering::Relaxed;
        let magic = h.magic.load(r);
        if magic != MAGIC {
            return Err(SegmentError::BadMagic(magic));
        }
        let bom = h.byte_order.load(r);
        if bom != BYTE_ORDER_MARK {
            return Err(SegmentError::ByteOrder(bom));
        }
        let major = h.major.load(r);
        if !LAYOUT_MAJORS_READ.contains(&major) {
            return Err(SegmentError::UnsupportedVersion {
                found: major,
                supported: *LAYOUT_MAJORS_READ.end(),
                oldest: *LAYOUT_MAJORS_READ.start(),
            });
        }
        if h.state.load(Ordering::Acquire) != SEGMENT_READY {
            return Err(SegmentError::NotReady);
        }
        let minor = h.minor.load(r);
        let corrupt = |m: String| Err(SegmentError::Corrupt(m));
        if h.header_size.load(r) as usize != PAGE {
            return corrupt(format!(
                "header_size {} is not {PAGE}",
                h.header_size.load(r)
            ));
        }
        let seg_size = h.segment_size.load(r);
        if seg_size > len as u64 {
            return Err(SegmentError::Truncated {
                len: len as u64,
                need: seg_size,
            });
        }
        let section_count = h.section_count.load(r) as usize;
        if section_count > MAX_SECTIONS {
            return corrupt(format!(
                "section_count {section_count} exceeds {MAX_SECTIONS}"
            ));
        }
        let service =
            load_string(&h.service_name, h.service_name_len.load(r)).ok_or_else(|| {
                SegmentError::Corrupt(format!(
                    "service name is not valid UTF-8 of at most {SERVICE_NAME_BYTES} bytes"
                ))
            })?;
        let history_len = h.history_len.load(r);
        let mut found: [Option<(u64, u64, u32, u32)>; 11] = [None; 11];
        for e in &h.sections[..section_count] {
            let (kind, off, size, count, stride) = (
                e.kind.load(r),
                e.offset.load(r),
                e.size.load(r),
                e.count.load(r),
                e.stride.load(r),
            );
            let end = off.checked_add(size);
            if off % PAGE as u64 != 0 || off < PAGE as u64 || end.is_none_or(|end| end > seg_size) {
                return corrupt(format!(
                    "section kind {kind} at offset {off} size {size} lies outside the {seg_size}-byte segment"
                ));
            }
            if u64::from(count) * u64::from(stride) > size {
                return corrupt(format!(
                    "section kind {kind}: {count} x {stride} bytes exceed its size {size}"
                ));
            }
            if let Some(k) = SectionKind::from_u32(kind) {
                found[k as usize] = Some((off, size, count, stride));
            }
        }
        let need = |k: SectionKind| {
            found[k as usize]
                .ok_or_else(|| SegmentError::Corrupt(format!("required section {k:?} missing")))
        };
        let (counters_off, counters_size, _, _) = need(SectionKind::Counters)?;
        if (counters_size as usize) < size_of::<LostCounters>() {
            return corrupt("counters section too small".into());
        }
        let (classes_off, _, max_classes, cstride) = need(SectionKind::Classes)?;
        let (strings_off, _, max_strings, sstride) = need(SectionKind::Strings)?;
        let (global_off, gsize, gcount, gstride) = need(SectionKind::Global)?;
        let (threads_off, tsize, _, _) = need(SectionKind::Threads)?;
        let (setup_off, setup_size, _, _) = need(SectionKind::Setup)?;
        if (setup_size as usize) < size_of::<SetupSection>() {
            return corrupt("setup section too small".into());
        }
        let long_len = h.history_long_len.load(r);
        if long_len > u64::from(MAX_HISTORY_LONG_LEN) {
            return corrupt(format!(
                "history_long_len {long_len} exceeds {MAX_HISTORY_LONG_LEN}"
            ));
        }
        if max_strings > MAX_STRINGS {
            return corrupt(format!(
                "string table of {max_strings} entries exceeds {MAX_STRINGS}"
            ));
        }
        let mut long_off = [0usize; 3];
        for (kind, k) in EventKind::ALL.into_iter().zip([
            SectionKind::WaitsLong,
            SectionKind::StagesLong,
            SectionKind::StatementsLong,
        ]) {
            let (off, size, count, stride) = need(k)?;
            let slot = if kind == EventKind::Statement {
                size_of::<StatementRecord>()
            } else {
                size_of::<EventRecord>()
            };
            let need_bytes =
                (size_of::<LongHeader>() as u64).checked_add(long_len.saturating_mul(slot as u64));
            if u64::from(count) != long_len
                || stride as usize != slot
                || need_bytes.is_none_or(|n| n > size)
            {
                return corrupt(format!(
                    "{k:?} ring of {long_len} slots does not fit its section"
                ));
            }
            long_off[kind.index()] = off as usize;
        }
        if cstride as usize != size_of::<ClassEntry>()
            || sstride as usize != size_of::<StringEntry>()
            || gstride as usize != size_of::<SummaryRow>()
        {
            return corrupt("section strides do not match this layout version".into());
        }
        if max_classes == 0 || max_classes > MAX_CLASSES_LIMIT || gcount != max_classes {
            return corrupt(format!(
                "class count {max_classes} / global rows {gcount} invalid"
            ));
        }
        if (GLOBAL_ROWS_OFFSET + gcount as usize * size_of::<SummaryRow>()) as u64 > gsize {
            return corrupt("global section too small for its rows".into());
        }
        if history_len == 0 || history_len > MAX_HISTORY_LEN {
            return corrupt(format!("history_len {history_len} out of range"));
        }
        // Tasks (since 7.1) is optional: without it, no slot is read.
        let (tasks_off, task_slots) = match found[SectionKind::Tasks as usize] {
            None => (threads_off as usize, 0),
            Some((off, size, count, stride)) => {
                if stride as usize != size_of::<TaskSlot>()
                    || count > MAX_TASK_SLOTS
                    || size_of::<TasksHeader>() as u64 + u64::from(count) * u64::from(stride) > size
                {
                    return corrupt(format!(
                        "Tasks section of {count} x {stride}-byte slots does not fit its {size} bytes"
                    ));
                }
                (off as usize, count)
            }
        };
        if (size_of::<ContainerHeader>() as u64) > tsize {
            return corrupt("thread section too small".into());
        }
        // SAFETY: the directory loop checked that `threads_off` is a
        // multiple of PAGE (so aligned) and `threads_off + tsize <=
        // seg_size <= len`, and `size_of::<ContainerHeader>() <= tsize` was
        // checked just above: the header is inside the mapping.
        // `ContainerHeader` is made of atomics only (valid for any bit
        // pattern); the reference borrows `map`, used only in this function.
        let c: &ContainerHeader =
            unsafe { &*(map.as_ptr().add(threads_off as usize) as *const ContainerHeader) };
        let records_per_page = c.records_per_page.load(r);
        let max_pages = c.max_pages.load(r);
        let record_size = c.record_size.load(r);
        let page_size = c.page_size.load(r);
        let pages_offset = c.pages_offset.load(r);
        let expect_record = thread_record_size(history_len, max_classes) as u64;
        // The creator's own limits (`Geometry::new`): a header claiming more
        // is not from a pfs-client, whatever the file's size.
        if records_per_page == 0
            || records_per_page > MAX_RECORDS_PER_PAGE
            || max_pages == 0
            || max_pages > MAX_PAGES
            || record_size != expect_record
        {
            return corrupt(format!(
                "thread container: {records_per_page} records/page, {max_pages} pages, record size {record_size} (expected {expect_record})"
            ));
        }
        let pages_bytes = page_size.checked_mul(u64::from(max_pages));
        if !page_size.is_multiple_of(PAGE as u64)
            || page_size < record_size * u64::from(records_per_page)
            || !pages_offset.is_multiple_of(PAGE as u64)
            || pages_offset < (size_of::<ContainerHeader>() as u64 + u64::from(max_pages) * 8)
            || pages_bytes
                .and_then(|b| b.checked_add(pages_offset))
                .is_none_or(|end| end > tsize)
        {
            return corrupt("thread container pages do not fit their section".into());
        }
        let geom = Geometry {
            history_len,
            max_classes,
            max_strings,
            records_per_page,
            max_pages,
            counters_off: counters_off as usize,
            classes_off: classes_off as usize,
            strings_off: strings_off as usize,
            global_off: global_off as usize,
            setup_off: setup_off as usize,
            tasks_off,
            task_slots,
            threads_off: threads_off as usize,
            long_off,
            long_len: long_len as u32,
            pages_off: (threads_off + pages_offset) as usize,
            record_size: record_size as usize,
            page_size: page_size as usize,
            total_size: seg_size as usize,
        };
        let timer = TimerCalibration {
            kind: TimerSource::from_u32(h.timer_kind.load(r)).unwrap_or(TimerSource::Monotonic),
            base_ticks: h.timer_base_ticks.load(r),
            ps_per_tick_q32: h.timer_ps_per_tick_q32.load(r),
            frequency_hz: h.timer_frequency_hz.load(r),
            base_ns: h.timer_base_ns.load(r),
        };
        let pid = h.creator_pid.load(r);
        let start_time_unix_ns = h.start_time_unix_ns.load(r);
        Ok(Validated {
            geom,
            timer,
            service,
            pid,
            start_time_unix_ns,
            major,
            minor,
        })
    }

    /// Whether the mapping is still backed by the file: `Err(Shrunk)` if
    /// the file is now shorter than the segment, `Err(Unreadable)` if an
    /// access raised SIGBUS (the mapping then reads as zeros). A reader
    /// calls it after each snapshot and drops the segment on error; data
    /// read since the last successful check must be discarded.
    pub fn check(&self) -> Result<(), SegmentError> {
        let need = self.geom.total_size as u64;
        let len = self
            .file
            .metadata()
            .map_err(|e| SegmentError::Io("stat the segment", e))?
            .len();
        if len < need {
            return Err(SegmentError::Shrunk { len, need });
        }
        if self.faulted() {
            return Err(SegmentError::Unreadable);
        }
        Ok(())
    }

    /// Protects this mapping against `SIGBUS` ([`crate::sigbus`]), as
    /// [`Segment::open`] does for a reader's: for the creator, whose file
    /// any process with write access (or root) could truncate. A later
    /// access beyond the file's end then finds private zero pages instead
    /// of killing the process: its events go nowhere from then on, and
    /// [`Segment::faulted`] says so. Installs the process-wide handler on
    /// first use (other `SIGBUS`es go to the previous handler, or kill as
    /// before). Fails if the handler cannot be installed or
    /// [`crate::sigbus::MAX_REGISTRATIONS`] mappings are protected already.
    pub fn protect(&mut self) -> Result<(), SegmentError> {
        if self.guard.is_none() {
            self.guard = Some(Registration::new(self.map.as_ptr(), self.map.len())?);
        }
        Ok(())
    }

    /// Whether this mapping is protected against `SIGBUS`
    /// ([`Segment::protect`]; every mapping [`Segment::open`] makes is).
    pub fn protected(&self) -> bool {
        self.guard.is_some()
    }

    /// Whether an access to this (protected) mapping raised `SIGBUS`: it
    /// has held private zeros since, not the file's bytes.
    pub fn faulted(&self) -> bool {
        self.guard.as_ref().is_some_and(Registration::faulted)
    }

    /// [`SegmentError::Faulted`] once the mapping faulted: the file is
    /// no longer what this process writes, and growing it again (a
    /// reservation past a truncated end) would only hand the agent zeros.
    fn writable_file(&self) -> Result<&File, SegmentError> {
        if self.faulted() {
            return Err(SegmentError::Faulted);
        }
        Ok(&self.file)
    }

    /// The validated geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geom
    }

    /// The timer calibration recorded by the creator.
    pub fn timer(&self) -> &TimerCalibration {
        &self.timer
    }

    /// Service name from the header.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Creator pid (informative).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Creation time, ns since the Unix epoch.
    pub fn start_time_unix_ns(&self) -> u64 {
        self.start_time_unix_ns
    }

    /// Major layout version of the file: [`LAYOUT_MAJOR`], or an older one
    /// of [`LAYOUT_MAJORS_READ`] (a segment of a process built with an
    /// older client, read by a newer agent).
    pub fn major_version(&self) -> u32 {
        self.major
    }

    /// Minor layout version of the file.
    pub fn minor_version(&self) -> u32 {
        self.minor
    }

    /// The underlying file (for `flock` liveness checks).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// A typed reference at a checked offset.
    fn at<T>(&self, off: usize) -> &T {
        assert!(
            off.is_multiple_of(align_of::<T>()) && off + size_of::<T>() <= self.geom.total_size,
            "internal error: offset {off} out of the validated geometry"
        );
        // SAFETY: in bounds: `off + size_of::<T>()` is at most the
        // validated total size (asserted), itself at most the mapping's
        // length (`create` maps exactly `total_size`; `open` checked
        // `segment_size <= len`). Aligned: the mapping starts on a page
        // boundary and `off` is a multiple of `align_of::<T>()` (asserted).
        // Valid: every caller (all in this module) names a `layout` type, a
        // `repr(C)` aggregate of atomics, for which every bit pattern is a
        // value, and whose every mutation, by this process or another, is
        // an atomic store (`UnsafeCell`), so a shared reference never
        // observes a non-atomic write. Lifetime: the reference borrows
        // `self`, which owns the mapping. A file shrunk under the mapping
        // raises SIGBUS, which `sigbus` turns into zero pages (readers);
        // creators reserve every byte before touching it.
        unsafe { &*(self.map.as_ptr().add(off) as *const T) }
    }

    /// A typed slice at a checked offset.
    fn slice_at<T>(&self, off: usize, count: usize) -> &[T] {
        assert!(
            off.is_multiple_of(align_of::<T>())
                && off + size_of::<T>() * count <= self.geom.total_size,
            "internal error: slice at {off} x {count} out of the validated geometry"
        );
        // SAFETY: as in `at`, for `count` consecutive elements: the whole
        // slice ends within the validated size (asserted; every caller's
        // count is bounded by the validated geometry, so the product does
        // not overflow), each element is aligned (`size_of` is a multiple of
        // `align_of`), and `T` is a `layout` type or `AtomicU64`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(off) as *const T, count) }
    }

    /// The header.
    pub fn header(&self) -> &Header {
        self.at(0)
    }

    /// The Tasks section's header and slots (`None`: the segment has no
    /// Tasks section, as before 7.1 or with no slots).
    pub fn tasks(&self) -> Option<(&TasksHeader, &[TaskSlot])> {
        let g = &self.geom;
        (g.task_slots > 0).then(|| {
            (
                self.at(g.tasks_off),
                self.slice_at(g.task_slot_off(0), g.task_slots as usize),
            )
        })
    }

    /// The lost counters.
    pub fn lost(&self) -> &LostCounters {
        self.at(self.geom.counters_off)
    }

    /// Counts one loss of `kind` (slow paths only: a shared-line RMW).
    pub fn count_lost(&self, kind: LostKind) {
        self.add_lost(kind, 1);
    }

    /// Counts `n` losses of `kind` (slow paths only).
    pub fn add_lost(&self, kind: LostKind, n: u64) {
        self.lost().counters[kind as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Lost counter `kind` of the segment in `file`, read with `pread`
    /// (no mapping: a file truncated meanwhile cannot raise `SIGBUS` in
    /// the caller, an application), for a writer about to replace a dead
    /// predecessor's segment. `None` unless the file starts with the
    /// magic of a segment of a major version whose counters section is
    /// this one's ([`LAYOUT_MAJORS_SAME_HEADER`], at
    /// [`crate::geometry::COUNTERS_OFF`]); the counter is as its writer
    /// left it.
    pub fn lost_counter_in(file: &File, kind: LostKind) -> Option<u64> {
        let at = crate::geometry::COUNTERS_OFF + size_of::<AtomicU64>() * kind as usize;
        Self::word_in(file, at)
    }

    /// The creation time (`start_time_unix_ns`) of the segment in `file`,
    /// read as [`Segment::lost_counter_in`] reads: with the file's inode,
    /// what names a dead segment in the agent's list of those it collected
    /// ([`crate::files::agent_collected`]).
    pub fn start_time_in(file: &File) -> Option<u64> {
        Self::word_in(file, std::mem::offset_of!(Header, start_time_unix_ns))
    }

    /// The little-endian `u64` at byte `at` of the segment in `file`, read
    /// with `pread`, if the file starts with the magic of a segment of a
    /// major version with this one's header ([`LAYOUT_MAJORS_SAME_HEADER`]).
    fn word_in(file: &File, at: usize) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut head = [0u8; 12];
        file.read_exact_at(&mut head, 0).ok()?;
        let magic = u64::from_le_bytes(head[..8].try_into().ok()?);
        let major = u32::from_le_bytes(head[8..].try_into().ok()?);
        if magic != MAGIC || !LAYOUT_MAJORS_SAME_HEADER.contains(&major) {
            return None;
        }
        let mut word = [0u8; 8];
        file.read_exact_at(&mut word, at as u64).ok()?;
        Some(u64::from_le_bytes(word))
    }

    /// The class registry.
    pub fn classes(&self) -> &[ClassEntry] {
        self.slice_at(self.geom.classes_off, self.geom.max_classes as usize)
    }

    /// The string table.
    pub fn strings(&self) -> &[StringEntry] {
        self.slice_at(self.geom.strings_off, self.geom.max_strings as usize)
    }

    /// The global section header.
    pub fn global_header(&self) -> &GlobalHeader {
        self.at(self.geom.global_off)
    }

    /// The global (exited threads) summary rows, one per class.
    pub fn global_rows(&self) -> &[SummaryRow] {
        self.slice_at(
            self.geom.global_off + GLOBAL_ROWS_OFFSET,
            self.geom.max_classes as usize,
        )
    }

    /// The global rows viewed as [`MemoryRow`]s (meaningful only at the
    /// indexes of memory classes): the same bytes as [`Self::global_rows`].
    pub fn global_memory_rows(&self) -> &[MemoryRow] {
        self.slice_at(
            self.geom.global_off + GLOBAL_ROWS_OFFSET,
            self.geom.max_classes as usize,
        )
    }

    /// The thread container header.
    pub fn container_header(&self) -> &ContainerHeader {
        self.at(self.geom.threads_off)
    }

    /// The container page directory (one state word per page).
    pub fn page_states(&self) -> &[AtomicU64] {
        self.slice_at(
            self.geom.threads_off + size_of::<ContainerHeader>(),
            self.geom.max_pages as usize,
        )
    }

    /// Number of pages added, clamped to the validated maximum.
    pub fn pages_added(&self) -> u32 {
        let n = self.container_header().pages_added.load(Ordering::Acquire);
        n.min(u64::from(self.geom.max_pages)) as u32
    }

    /// Gives back this process's mapping of container page `page`: its
    /// resident pages stop counting in this process's RSS, the file keeps
    /// every byte, and the next access maps the same bytes again. A reader
    /// calls it after copying the page (the reader's `release_pages`
    /// option).
    /// Advice only: failures are ignored.
    pub fn release_page(&self, page: u32) {
        if page >= self.geom.max_pages {
            return;
        }
        let off = self.geom.page_off(page);
        // SAFETY: the range is inside the mapping: `page < max_pages` was
        // checked, and the validated geometry places every page below
        // `total_size`. Every mapping of a segment is MAP_SHARED over a
        // file, and MADV_DONTNEED on a shared file mapping only removes
        // this process's page-table entries: the data stays in the file
        // (the page cache, or tmpfs), and a later access faults the very
        // same bytes back in, so references into the mapping stay valid and
        // see unchanged memory (unlike a private mapping, where the advice
        // would discard private copies). The one private range, the zero
        // pages `sigbus` puts in after a fault, reads as zeros again: also
        // unchanged.
        let _ = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                off,
                self.geom.page_size,
            )
        };
    }

    /// Maps in at once (`MADV_POPULATE_READ`, Linux 5.14+) the bodies of
    /// the `count` thread records from record `first` on (one container
    /// page's): a reader about to read their rows through the mapping
    /// makes one system call instead of a page fault every 16 system
    /// pages, and finds every line it fetches ahead mapped. Advice only:
    /// failures (an older kernel) are ignored, the reads then fault as
    /// before.
    pub fn populate_bodies(&self, first: u32, count: u32) {
        let g = &self.geom;
        let rpp = g.records_per_page;
        if count == 0 || first >= g.max_records() || first % rpp + count > rpp {
            return;
        }
        let body = g.record_size - thread_head_size(g.max_classes);
        // (The whole page, heads included, when every record is read.)
        let start = if count == rpp {
            g.page_off(first / rpp)
        } else {
            g.record_body_off(first) / PAGE * PAGE
        };
        let end = g.record_body_off(first) + count as usize * body;
        let _ = self
            .map
            .advise_range(memmap2::Advice::PopulateRead, start, end - start);
    }

    /// [`Segment::release_page`] for the bodies of container page `page`
    /// only (from the first whole system page after its records' heads):
    /// an incremental reader keeps the heads, which it reads on every
    /// snapshot, resident, and gives back the rows it read.
    pub fn release_page_bodies(&self, page: u32) {
        if page >= self.geom.max_pages {
            return;
        }
        let off = self.geom.page_off(page);
        let heads = (self.geom.records_per_page as usize * thread_head_size(self.geom.max_classes))
            .next_multiple_of(PAGE);
        if heads >= self.geom.page_size {
            return;
        }
        // SAFETY: as in `release_page`: the range lies inside the page
        // (`heads < page_size`, and `off + page_size` is inside the
        // mapping), `off + heads` is page-aligned (pages are), and
        // MADV_DONTNEED on this shared file mapping only drops page-table
        // entries, the bytes staying in the file.
        let _ = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                off + heads,
                self.geom.page_size - heads,
            )
        };
    }

    /// Copies row `class` of thread record `idx` (a [`SummaryRow`], or a
    /// [`MemoryRow`] for a memory class: they share the slot) into `out` with
    /// one `pread(2)` of the segment file, without touching the mapping:
    /// no page fault, no page mapped (fault-around would map 16 pages for
    /// one row, and giving them back costs as much again), nothing added
    /// to this process's RSS. For a reader that reads a few scattered rows
    /// of each record. The copy is as racy as a load through the mapping
    /// and is validated the same way: take it between the two loads of
    /// the row's sequence ([`crate::seqlock::SeqLock::read_versioned`]).
    /// Returns false if the file is shorter than the row's end (a
    /// truncated segment) or the read fails; `out` then holds no row.
    /// Panics if `idx >= max_records()` or `class >= max_classes`.
    pub fn copy_row(&self, idx: u32, class: usize, out: &mut RowCopy) -> bool {
        self.copy_row_via(None, idx, class, out)
    }

    /// [`Segment::copy_row`] through `via`, another description of this
    /// segment's file ([`Segment::row_reader`]; `None`: the segment's
    /// own). In a process of several threads every `pread` takes and drops
    /// a reference to the open file it reads, and threads reading through
    /// one description pass that counter's cache line back and forth:
    /// each thread copying rows alongside others should read through a
    /// description of its own (measured: an incremental snapshot of
    /// 1 000 threads × 200 classes, 1 % of the rows changed, two walk
    /// threads: 2.9 → 2.4 ms). A reader of another segment's file copies
    /// nothing (false).
    pub fn copy_row_via(
        &self,
        via: Option<&RowReader>,
        idx: u32,
        class: usize,
        out: &mut RowCopy,
    ) -> bool {
        use std::os::unix::fs::FileExt;
        assert!(idx < self.geom.max_records(), "record index out of range");
        assert!(class < self.geom.max_classes as usize, "class out of range");
        let off = self.geom.record_body_off(idx)
            + rows_offset(self.geom.history_len)
            + class * size_of::<SummaryRow>();
        let bytes = out.bytes_mut();
        let len = bytes.len();
        let file = match via {
            None => &self.file,
            Some(RowReader(f, id)) if *id == self.file_id => f,
            Some(_) => return false,
        };
        matches!(file.read_at(bytes, off as u64), Ok(n) if n == len)
    }

    /// Copies rows `0..n` of thread record `idx` into `out` with one
    /// `pread(2)` (through `via`, as [`Segment::copy_row_via`]), without
    /// touching the mapping: for a reader about to read most of a
    /// record's rows, a copy at the speed of memory instead of a page
    /// fault every 16 system pages and the pages given back afterwards.
    /// As racy as loads through the mapping: each row is valid only if its
    /// sequence, loaded before the copy, is even and unchanged after it.
    /// Returns false (`out` then holds no row) if `n` exceeds `out`'s room
    /// or the classes, or the read fails or comes short (a truncated
    /// segment). Panics if `idx >= max_records()`.
    pub fn copy_rows_via(
        &self,
        via: Option<&RowReader>,
        idx: u32,
        n: usize,
        out: &mut RowsCopy,
    ) -> bool {
        use std::os::unix::fs::FileExt;
        assert!(idx < self.geom.max_records(), "record index out of range");
        out.len = 0;
        if n > out.rows.len() || n > self.geom.max_classes as usize {
            return false;
        }
        let off = self.geom.record_body_off(idx) + rows_offset(self.geom.history_len);
        let file = match via {
            None => &self.file,
            Some(RowReader(f, id)) if *id == self.file_id => f,
            Some(_) => return false,
        };
        let seqs = &self.record(idx).row_seqs[..n];
        for (d, s) in out.seqs.iter_mut().zip(seqs) {
            *d = s.sequence();
        }
        let bytes = out.bytes_mut(n);
        let len = bytes.len();
        let ok = matches!(file.read_at(bytes, off as u64), Ok(k) if k == len);
        // The sequences a reader loads next, to validate the rows, come
        // after the copy.
        std::sync::atomic::fence(Ordering::Acquire);
        if ok {
            out.len = n;
        }
        ok
    }

    /// Opens another description of the segment's file, for
    /// [`Segment::copy_row_via`]: through `/proc/self/fd`, so the very
    /// file this segment maps, even if it was since unlinked or replaced.
    /// It holds a file descriptor until dropped.
    /// Once an open fails (no `/proc`, or a security policy denies it),
    /// later calls fail at once: a walk asks again at every scrape, and a
    /// denial may be logged by the policy each time.
    pub fn row_reader(&self) -> std::io::Result<RowReader> {
        use std::os::fd::AsRawFd;
        use std::sync::atomic::AtomicBool;
        static REFUSED: AtomicBool = AtomicBool::new(false);
        if REFUSED.load(Ordering::Relaxed) {
            return Err(std::io::Error::other(
                "an earlier open of /proc/self/fd failed",
            ));
        }
        File::open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
            .inspect(no_atime)
            .map(|f| RowReader(f, self.file_id))
            .inspect_err(|_| REFUSED.store(true, Ordering::Relaxed))
    }

    /// Thread record `idx`. Panics if `idx >= max_records()`.
    pub fn record(&self, idx: u32) -> RecordRef<'_> {
        assert!(idx < self.geom.max_records(), "record index out of range");
        let (off, body) = (self.geom.record_off(idx), self.geom.record_body_off(idx));
        let (n, m) = (self.geom.history_len, self.geom.max_classes);
        RecordRef {
            header: self.at(off),
            row_seqs: self.slice_at(off + ROW_SEQS_OFFSET, m as usize),
            history: self.slice_at(body, n as usize),
            stages_history: self.slice_at(body + stages_history_offset(n), n as usize),
            statements_history: self.slice_at(body + statements_history_offset(n), n as usize),
            rows: self.slice_at(body + rows_offset(n), m as usize),
        }
    }

    /// The setup section.
    pub fn setup(&self) -> &SetupSection {
        self.at(self.geom.setup_off)
    }

    /// Header of the `history_long` ring of `kind`.
    pub fn long_header(&self, kind: EventKind) -> &LongHeader {
        self.at(self.geom.long_off[kind.index()])
    }

    /// Slots of the waits or stages `history_long` ring.
    pub fn long_events(&self, kind: EventKind) -> &[EventRecord] {
        assert!(
            kind != EventKind::Statement,
            "statements use long_statements"
        );
        self.slice_at(
            self.geom.long_off[kind.index()] + size_of::<LongHeader>(),
            self.geom.long_len as usize,
        )
    }

    /// Slots of the statements `history_long` ring.
    pub fn long_statements(&self) -> &[StatementRecord] {
        self.slice_at(
            self.geom.long_off[EventKind::Statement.index()] + size_of::<LongHeader>(),
            self.geom.long_len as usize,
        )
    }

    /// Reserves the `history_long` ring of `kind` before its first use.
    pub fn reserve_long(&self, kind: EventKind) -> Result<(), SegmentError> {
        reserve(
            self.writable_file()?,
            self.geom.long_off[kind.index()],
            self.geom.long_size(kind),
        )
    }

    /// Reserves (`fallocate`s) the page that holds task slot `slot`, and
    /// returns the number of slots counted from 0 that reserved pages now
    /// hold whole. A slot must be reserved before it is first written (the
    /// section's first page, with the header, is reserved at creation).
    /// Errors mean the volume is full.
    pub fn reserve_task_slot(&self, slot: u32) -> Result<u32, SegmentError> {
        let g = &self.geom;
        let start = g.task_slot_off(slot) / PAGE * PAGE;
        let end = (g.task_slot_off(slot) + size_of::<TaskSlot>()).div_ceil(PAGE) * PAGE;
        reserve(self.writable_file()?, start, end - start)?;
        let whole = (end - g.task_slot_off(0)) / size_of::<TaskSlot>();
        Ok((whole as u32).min(g.task_slots))
    }

    /// Task slots whose bytes were reserved at creation (those the Tasks
    /// section's first page holds whole).
    pub fn task_slots_reserved_at_creation(&self) -> u32 {
        let g = &self.geom;
        if g.task_slots == 0 {
            return 0;
        }
        let whole = (g.tasks_off + PAGE - g.task_slot_off(0)) / size_of::<TaskSlot>();
        (whole as u32).min(g.task_slots)
    }

    /// Reserves (`fallocate`s) the bytes of container page `page` so that
    /// touching them can never SIGBUS. Errors mean the volume is full.
    pub fn reserve_page(&self, page: u32) -> Result<(), SegmentError> {
        reserve(
            self.writable_file()?,
            self.geom.page_off(page),
            self.geom.page_size,
        )
    }
}

impl Segment {
    /// Turns this process's mapping of the segment into a private
    /// copy-on-write one, at the same address: for the writer's segment in
    /// the child of a `fork`. The child's copies of the parent's guards and
    /// contexts still hold references into the mapping; whatever they write
    /// from now on (an event open at the fork and ended in the child, a
    /// free of the parent's block) changes the child's private pages only,
    /// never the file the parent and the agent share. Reads still see the
    /// segment as it was at the fork. Async-signal-safe (one `mmap`, no
    /// allocation, no lock), as a `fork` child handler must be; returns
    /// `false` if the system refused (the mapping is then unchanged).
    pub fn detach_after_fork(&self) -> bool {
        use std::os::fd::AsRawFd;
        let (addr, len) = (self.map.as_mut_ptr(), self.map.len());
        // SAFETY: the new mapping replaces exactly this segment's own
        // range (`MAP_FIXED` over `addr..addr + len`, which `self.map`
        // owns and unmaps at drop), with the same file from offset 0, so
        // every reference into the range stays valid memory holding the
        // same bytes; only where later writes go changes. `mmap` either
        // replaces the whole range or, failing, leaves it as it was, and
        // the kernel swaps the two mappings under its mapping lock, which
        // a page fault also takes: an access from another thread meanwhile
        // (none in a fork child, whose only thread is the caller) sees the
        // old mapping or the new one, both readable and writable with the
        // same bytes, never a hole. Every access to the range is atomic,
        // so none is torn by the swap; a write that lands after it stays
        // private, which is the point.
        let r = unsafe {
            libc::mmap(
                addr.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                self.file.as_raw_fd(),
                0,
            )
        };
        r != libc::MAP_FAILED
    }

    /// Returns the bytes of container page `page` to the operating system
    /// (`fallocate(PUNCH_HOLE)`; the file keeps its size and the range reads
    /// as zeros). Only the page's owner calls this, on a RECLAIMING page.
    pub fn punch_page(&self, page: u32) -> Result<(), SegmentError> {
        rustix::fs::fallocate(
            self.file.as_fd(),
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            self.geom.page_off(page) as u64,
            self.geom.page_size as u64,
        )
        .map_err(|e| SegmentError::Io("punch a hole in the segment file", std::io::Error::from(e)))
    }

    /// Bytes of storage the segment file holds (`st_blocks` × 512), which
    /// shrinks when pages are reclaimed.
    pub fn allocated_bytes(&self) -> Result<u64, SegmentError> {
        let st = rustix::fs::fstat(self.file.as_fd())
            .map_err(|e| SegmentError::Io("stat the segment file", std::io::Error::from(e)))?;
        Ok(st.st_blocks as u64 * 512)
    }
}

/// What [`Segment::validate`] derives from a header.
struct Validated {
    geom: Geometry,
    timer: TimerCalibration,
    service: String,
    pid: u32,
    start_time_unix_ns: u64,
    major: u32,
    minor: u32,
}

/// Views of one thread record.
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    /// Fixed part: lock word, identity, current events.
    pub header: &'a ThreadHeader,
    /// `events_waits_history` slots.
    pub history: &'a [EventRecord],
    /// `events_stages_history` slots.
    pub stages_history: &'a [EventRecord],
    /// `events_statements_history` slots.
    pub statements_history: &'a [StatementRecord],
    /// Summary rows by class index.
    pub rows: &'a [SummaryRow],
    /// Row sequence locks by class index: entry *c* guards `rows[c]`.
    pub row_seqs: &'a [SeqLock],
}

impl<'a> RecordRef<'a> {
    /// The summary rows viewed as [`MemoryRow`]s (meaningful only at the
    /// indexes of memory classes).
    pub fn memory_rows(&self) -> &'a [MemoryRow] {
        // SAFETY: `MemoryRow` has the size and alignment of `SummaryRow`
        // (asserted in `layout`), so the slice covers exactly the bytes of
        // `rows`, which were bounds- and alignment-checked by `slice_at`;
        // both are `repr(C)` aggregates of atomics, valid for any bit
        // pattern; the lifetime is that of `rows`.
        unsafe {
            std::slice::from_raw_parts(self.rows.as_ptr() as *const MemoryRow, self.rows.len())
        }
    }
}

/// Reserves `len` bytes at `off`: `fallocate`, or writing zeros where the
/// filesystem has no `fallocate`. Never changes the file's size (the
/// creator sets it first): a file another process truncated is not grown
/// back with zeros that an agent would then find in place of a segment.
fn reserve(file: &File, off: usize, len: usize) -> Result<(), SegmentError> {
    match rustix::fs::fallocate(
        file.as_fd(),
        rustix::fs::FallocateFlags::KEEP_SIZE,
        off as u64,
        len as u64,
    ) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP) | Err(rustix::io::Errno::NOSYS) => {
            use std::os::unix::fs::FileExt;
            let now = file
                .metadata()
                .map_err(|e| SegmentError::Io("stat the segment", e))?
                .len();
            if now < (off + len) as u64 {
                return Err(SegmentError::Shrunk {
                    len: now,
                    need: (off + len) as u64,
                });
            }
            let zeros = vec![0u8; 64 * 1024];
            let mut done = 0;
            while done < len {
                let n = zeros.len().min(len - done);
                file.write_all_at(&zeros[..n], (off + done) as u64)
                    .map_err(|e| SegmentError::NoSpace(e.to_string()))?;
                done += n;
            }
            Ok(())
        }
        Err(e) => Err(SegmentError::NoSpace(e.to_string())),
    }
}

/// Asks the CPU to fetch the cache lines `x` spans: a hint, which reads
/// no value, and never faults (a line of a page not mapped is not fetched).
#[inline(always)]
pub(crate) fn prefetch<T: ?Sized>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let start = (x as *const T).cast::<i8>();
        let first = start.wrapping_sub(start as usize % 64);
        let end = start as usize + std::mem::size_of_val(x);
        let mut line = first;
        while (line as usize) < end {
            // SAFETY: SSE is part of the x86_64 baseline, and a prefetch
            // reads no memory the program sees: any address is allowed.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line) };
            line = line.wrapping_add(64);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Class indexes whose touched bit is set in a thread record's header,
/// below `limit` (used by the writer's fold and by the reader).
pub(crate) fn touched_classes(h: &ThreadHeader, limit: usize) -> impl Iterator<Item = usize> + '_ {
    h.touched.iter().enumerate().flat_map(move |(w, word)| {
        let mut bits = word.load(Ordering::Acquire);
        std::iter::from_fn(move || {
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let c = w * 64 + b;
                if c < limit {
                    return Some(c);
                }
            }
            None
        })
    })
}

/// The last eight words of summary row `row` read as the I/O words of a
/// file or socket class ([`IoTail`], since 8.1).
///
/// ```
/// use pfs_shm_layout::layout::SummaryRow;
/// use pfs_shm_layout::segment::io_tail;
/// # fn f(row: &SummaryRow) -> u64 {
/// io_tail(row).count[pfs_shm_layout::IoMode::Read.index()].load(std::sync::atomic::Ordering::Relaxed)
/// # }
/// ```
pub fn io_tail(row: &SummaryRow) -> &IoTail {
    // SAFETY: `IoTail` is a `repr(C)` struct of 8 `AtomicU64`s, exactly
    // the row's bytes from `errors` to its end (asserted in `layout`:
    // size and alignment), and `SummaryRow` is `repr(C)` of `AtomicU64`s
    // only, so those bytes are in bounds, aligned, and valid for any bit
    // pattern; the reference keeps `row`'s lifetime and shared access, and
    // the words are only ever accessed atomically through either view.
    // (The pointer is the row's, offset: its provenance covers the tail.)
    unsafe {
        &*std::ptr::from_ref(row)
            .cast::<u8>()
            .add(std::mem::offset_of!(SummaryRow, errors))
            .cast::<IoTail>()
    }
}

/// Row `row`'s words read as a layout 5.x memory row ([`MemoryRowV5`]),
/// for a segment of major version 5 ([`Segment::major_version`]).
pub fn v5_memory_row(row: &MemoryRow) -> &MemoryRowV5 {
    // SAFETY: both types are `repr(C)` structs of `AtomicU64`s only, of the
    // same size and alignment (asserted in `layout`), so every bit pattern
    // of one is a valid value of the other; the reference keeps `row`'s
    // lifetime and shared access, and the words are only ever accessed
    // atomically through either view.
    unsafe { &*(row as *const MemoryRow).cast::<MemoryRowV5>() }
}
