//! Task slots (since 7.1): where an async task's open statement, stage and
//! queued wait stay visible while the task awaits, and the pool that hands
//! the slots out.
//!
//! A task (a logical thread, see [`TaskSlot`]) is polled by one worker
//! thread at a time. While it runs, its events are in that thread's
//! current rows; when a poll returns, the worker goes on with other work
//! and its rows stop showing the task. So that `events_*_current` still
//! shows a request that waits (on a downstream call, a lock, a timer), the
//! task keeps what it has open in a slot of its own:
//!
//! * it takes a slot from a [`TaskSlotPool`] the first time a poll returns
//!   with something open, and gives it back (empty) when it ends;
//! * at each poll's return it writes into the slot what changed since the
//!   last one ([`TaskSlotRef::show`] per row, [`TaskSlotRef::clear`] for a
//!   row whose event ended). A task that awaits again with the same
//!   statement and stage writes nothing.
//!
//! A slot has one writer at a time: the thread polling the task, and the
//! runtime orders one poll's return before the next poll. Every row is
//! written under its sequence lock, like a thread's current rows, and read
//! the same way by readers.
//!
//! The pool is the process's ([`TaskSlotPool::take`],
//! [`TaskSlotPool::give`]): a lock-free stack of the slots given back, so a
//! task's first await takes no lock (one compare-and-swap to take a slot,
//! one to give it back), and any thread takes any free slot. Only a slot
//! never used before is handed out under a lock, once its page is reserved
//! (`fallocate`): a segment reserves its task slots as the number of tasks
//! that await at once grows, not at creation, and `used` counts only
//! reserved slots.
//!
//! Layer 5 (see the crate docs): builds on [`crate::segment`] (the
//! section's view) and [`crate::writer`] (the row stores).

use std::sync::Mutex;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::kinds::EventKind;
use crate::layout::{EV_ENDED, EventRecord, STATEMENT_TEXT_BYTES, TaskSlot};
use crate::segment::Segment;
use crate::text::{store_prefix, truncate_utf8};
use crate::writer::{EventData, StatementFigures, store_begin_fields, store_statement_fields};

/// One task slot, written by the task that holds it.
///
/// ```
/// use pfs_shm_layout::tasks::TaskSlotPool;
/// use pfs_shm_layout::writer::EventData;
/// use pfs_shm_layout::{EventKind, Segment, SegmentConfig, TimerCalibration};
///
/// let seg = Segment::create(
///     tempfile::tempfile().unwrap(),
///     &SegmentConfig { service_name: "doc".into(), ..Default::default() },
///     TimerCalibration::NANOSECONDS,
///     1,
///     0,
/// )
/// .unwrap();
/// let pool = TaskSlotPool::new(&seg);
/// let mine = pool.take(&seg).unwrap();
/// let slot = pool.slot(&seg, mine).unwrap();
/// let stmt = EventData { event_id: 1, thread_id: 900, ..Default::default() };
/// slot.show(EventKind::Statement, &stmt, Some("GET /users/7"));
/// assert!(slot.shows(EventKind::Statement, 900, 1));
/// slot.clear(EventKind::Statement);
/// pool.give(mine);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TaskSlotRef<'a> {
    slot: &'a TaskSlot,
}

impl TaskSlotRef<'_> {
    fn row(&self, kind: EventKind) -> &EventRecord {
        match kind {
            EventKind::Wait => &self.slot.waits_current,
            EventKind::Stage => &self.slot.stages_current,
            EventKind::Statement => &self.slot.statements_current.ev,
        }
    }

    /// Shows `e`, an event of the task still running (its `thread_id` the
    /// task's), in the row of `kind`, with `text` as a statement's
    /// `SQL_TEXT` (truncated to 200 bytes; ignored for other kinds). One
    /// sequence-locked write of the whole row.
    pub fn show(&self, kind: EventKind, e: &EventData, text: Option<&str>) {
        let row = self.row(kind);
        let _w = row.seq.write();
        store_begin_fields(
            row,
            &EventData {
                flags: e.flags & !EV_ENDED,
                ..*e
            },
        );
        if kind == EventKind::Statement {
            let s = &self.slot.statements_current;
            store_statement_fields(s, &StatementFigures::default(), s);
            let text = truncate_utf8(text.unwrap_or(""), STATEMENT_TEXT_BYTES);
            store_prefix(&s.text, &s.text_len, text.as_bytes());
        }
    }

    /// Whether the row of `kind` shows event `event_id` of logical thread
    /// `thread_id`. Only the slot's holder calls it (it reads its own
    /// stores).
    pub fn shows(&self, kind: EventKind, thread_id: u64, event_id: u64) -> bool {
        let row = self.row(kind);
        row.event_id.load(Relaxed) == event_id && row.thread_id.load(Relaxed) == thread_id
    }

    /// Empties the row of `kind` (one sequence-locked store; nothing if it
    /// is empty already).
    pub fn clear(&self, kind: EventKind) {
        let row = self.row(kind);
        if row.event_id.load(Relaxed) != 0 {
            let _w = row.seq.write();
            row.event_id.store(0, Relaxed);
        }
    }

    /// Empties every row: for a slot given back.
    pub fn clear_all(&self) {
        for kind in EventKind::ALL {
            self.clear(kind);
        }
    }
}

/// The process's free task slots: a lock-free stack of the slots given
/// back, and the slots never handed out yet, taken in index order (see the
/// module docs). A slot is held by one task at a time and given back empty.
#[derive(Debug)]
pub struct TaskSlotPool {
    /// Top of the stack of free slots: the slot index + 1 in the low 32
    /// bits (0: empty), a count of changes in the high 32 (so that a stale
    /// top cannot be taken for the current one).
    head: AtomicU64,
    /// Per slot, the slot below it on the stack (index + 1; 0: none).
    next: Box<[AtomicU32]>,
    /// Slots whose bytes are reserved (counted from 0), under the lock
    /// that hands out new slots: a new slot is reserved before it is
    /// counted in `used`, so that a reader never touches an unreserved
    /// page.
    grow: Mutex<u32>,
}

impl TaskSlotPool {
    /// The pool of `seg`'s task slots (none if it has no Tasks section).
    pub fn new(seg: &Segment) -> Self {
        let slots = seg.tasks().map_or(0, |(_, s)| s.len());
        Self {
            head: AtomicU64::new(0),
            next: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            grow: Mutex::new(seg.task_slots_reserved_at_creation()),
        }
    }

    /// A free slot of `seg` (the pool's segment): one given back if any
    /// (lock-free), else one never used (under a lock, reserving its page
    /// first: one `fallocate` for about six slots). `None` when every slot
    /// is taken, or the volume could not back a new one.
    pub fn take(&self, seg: &Segment) -> Option<u32> {
        let mut head = self.head.load(Acquire);
        loop {
            let top = head as u32;
            if top == 0 {
                return self.fresh(seg);
            }
            let below = self.next[top as usize - 1].load(Relaxed);
            let new = (head >> 32).wrapping_add(1) << 32 | u64::from(below);
            match self.head.compare_exchange_weak(head, new, Acquire, Acquire) {
                Ok(_) => return Some(top - 1),
                Err(h) => head = h,
            }
        }
    }

    /// Whether the segment has task slots at all (none: `PFS_TASK_SLOTS`
    /// 0, tasks are shown only while they run).
    #[inline]
    pub fn is_enabled(&self) -> bool {
        !self.next.is_empty()
    }

    /// Gives slot `i` back; it must be empty ([`TaskSlotRef::clear_all`]).
    pub fn give(&self, i: u32) {
        let Some(next) = self.next.get(i as usize) else {
            return;
        };
        let mut head = self.head.load(Relaxed);
        loop {
            next.store(head as u32, Relaxed);
            let new = (head >> 32).wrapping_add(1) << 32 | u64::from(i + 1);
            match self.head.compare_exchange_weak(head, new, Release, Relaxed) {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// A slot never handed out, if any is left: `used` grows by one, after
    /// the slot's page is reserved.
    fn fresh(&self, seg: &Segment) -> Option<u32> {
        let (header, slots) = seg.tasks()?;
        if header.used.load(Relaxed) as usize >= slots.len() {
            return None; // all handed out: no lock for a task refused again
        }
        let mut reserved = self.grow.lock().unwrap_or_else(|e| e.into_inner());
        let used = header.used.load(Relaxed);
        if used as usize >= slots.len() {
            return None;
        }
        if used >= *reserved {
            *reserved = seg.reserve_task_slot(used).ok()?;
        }
        header.used.store(used + 1, Release);
        Some(used)
    }

    /// Slot `i` of `seg` (`None` if it has no such slot).
    pub fn slot<'a>(&self, seg: &'a Segment, i: u32) -> Option<TaskSlotRef<'a>> {
        let (_, slots) = seg.tasks()?;
        slots.get(i as usize).map(|slot| TaskSlotRef { slot })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SegmentConfig, TimerCalibration};

    fn segment(task_slots: u32) -> Segment {
        let cfg = SegmentConfig {
            service_name: "tasks".into(),
            task_slots,
            ..Default::default()
        };
        Segment::create(
            tempfile::tempfile().unwrap(),
            &cfg,
            TimerCalibration::NANOSECONDS,
            1,
            0,
        )
        .unwrap()
    }

    #[test]
    fn slots_are_reused_before_new_ones_are_used() {
        let seg = segment(4);
        let pool = TaskSlotPool::new(&seg);
        let a: Vec<_> = (0..3).map(|_| pool.take(&seg).unwrap()).collect();
        assert_eq!(a, [0, 1, 2]);
        pool.give(1);
        pool.give(2);
        let b: Vec<_> = (0..3).map(|_| pool.take(&seg).unwrap()).collect();
        assert_eq!(b, [2, 1, 3]);
        assert_eq!(pool.take(&seg), None, "all four taken");
        assert_eq!(seg.tasks().unwrap().0.used.load(Relaxed), 4);
    }

    #[test]
    fn threads_take_and_give_back_every_slot_exactly_once() {
        let seg = segment(64);
        let pool = TaskSlotPool::new(&seg);
        let held = std::sync::Mutex::new(std::collections::HashSet::new());
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        let Some(i) = pool.take(&seg) else { continue };
                        assert!(held.lock().unwrap().insert(i), "slot {i} held twice");
                        held.lock().unwrap().remove(&i);
                        pool.give(i);
                    }
                });
            }
        });
        let all: std::collections::HashSet<_> = (0..64).filter_map(|_| pool.take(&seg)).collect();
        assert_eq!(all.len(), 64);
        assert_eq!(pool.take(&seg), None);
    }

    #[test]
    fn no_section_no_slots() {
        let seg = segment(0);
        let pool = TaskSlotPool::new(&seg);
        assert_eq!(pool.take(&seg), None);
        assert!(pool.slot(&seg, 0).is_none());
    }

    #[test]
    fn slots_are_reserved_as_they_are_first_handed_out() {
        let seg = segment(40);
        let first = seg.task_slots_reserved_at_creation();
        assert_eq!(first, 6, "the first page holds the header and six slots");
        let pool = TaskSlotPool::new(&seg);
        for i in 0..40 {
            assert_eq!(pool.take(&seg), Some(i));
        }
        assert_eq!(seg.reserve_task_slot(39).unwrap(), 40);
    }

    #[test]
    fn a_row_shows_the_event_running_and_its_text() {
        let seg = segment(2);
        let pool = TaskSlotPool::new(&seg);
        let slot = pool.slot(&seg, 1).unwrap();
        let e = EventData {
            event_id: 3,
            thread_id: 77,
            flags: EV_ENDED,
            ..Default::default()
        };
        slot.show(EventKind::Statement, &e, Some("SELECT 1"));
        let row = &seg.tasks().unwrap().1[1].statements_current;
        assert_eq!(row.ev.flags.load(Relaxed) & EV_ENDED, 0);
        assert_eq!(row.text_len.load(Relaxed), 8);
        assert!(slot.shows(EventKind::Statement, 77, 3));
        assert!(!slot.shows(EventKind::Statement, 78, 3));
        slot.clear_all();
        assert!(!slot.shows(EventKind::Statement, 77, 3));
        assert_eq!(row.ev.seq.sequence() & 1, 0);
    }
}
