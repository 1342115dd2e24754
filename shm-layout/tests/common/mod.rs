//! Fixtures shared by this crate's integration tests: a small segment
//! configuration, a segment on a temporary file, and the wait events the
//! tests write. Each test file uses some of them.

#![allow(dead_code)]

use std::fs::File;

use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, NONE_U32};
use pfs_shm_layout::layout::{FLAG_ENABLED, FLAG_TIMED};
use pfs_shm_layout::reader::{SegmentSnapshot, Summary};
use pfs_shm_layout::writer::{EventData, RowExtra};
use pfs_shm_layout::{
    ClassKind, EventKind, IoMode, RecordRef, Segment, SegmentConfig, SegmentWriter,
    TimerCalibration,
};

/// A small segment: history rings of 4, 8 classes, 16 strings,
/// `history_long` rings of 8, and the container's shape as given.
pub fn config(service: &str, records_per_page: u32, max_pages: u32) -> SegmentConfig {
    SegmentConfig {
        service_name: service.into(),
        history_len: 4,
        max_classes: 8,
        max_strings: 16,
        records_per_page,
        max_pages,
        history_long_len: 8,
        task_slots: 4,
    }
}

/// A segment created in a temporary file (nanosecond timer), the file (to
/// open it again as a reader would) and its writer.
pub fn create(cfg: &SegmentConfig) -> (File, SegmentWriter) {
    let f = tempfile::tempfile().unwrap();
    let seg = Segment::create(
        f.try_clone().unwrap(),
        cfg,
        TimerCalibration::NANOSECONDS,
        7,
        0,
    )
    .unwrap();
    (f, SegmentWriter::new(seg))
}

/// An ended, timed wait of class `class` with event id `id`.
pub fn wait_event(class: u32, id: u64, wait_ps: u64) -> EventData {
    EventData {
        event_id: id,
        end_event_id: id,
        class,
        timer_start: id * 10,
        timer_end: id * 10 + wait_ps / 1000,
        timer_wait: wait_ps,
        source: NONE_U32,
        object_name: NONE_U32,
        flags: EV_TIMED | EV_ENDED,
        event_type: EventKind::Wait as u32,
        ..Default::default()
    }
}

/// Ends a wait the way the client does: current, history, summary.
pub fn record_wait(rec: RecordRef<'_>, e: &EventData) {
    record(rec, e, 0, RowExtra::None);
}

/// Ends a file or socket wait the way the client does: current,
/// history, and the summary with its mode's figures.
pub fn record_io(rec: RecordRef<'_>, e: &EventData, mode: IoMode, bytes: u64) {
    record(rec, e, bytes, RowExtra::Io(mode));
}

/// Ends a timed wait: its current row, history, and summary (with
/// `bytes` and `extra`).
fn record(rec: RecordRef<'_>, e: &EventData, bytes: u64, extra: RowExtra<'_>) {
    rec.end_event(EventKind::Wait, e, None, true, true);
    let class = e.class as usize;
    rec.summarize(class, EventKind::Wait, true, e.timer_wait, bytes, extra);
}

/// Registers `n` enabled, timed classes of kind `kind` named
/// `{prefix}0`, `{prefix}1`, ...; their indexes.
pub fn timed_classes(w: &SegmentWriter, prefix: &str, kind: ClassKind, n: u32) -> Vec<u32> {
    (0..n)
        .map(|i| {
            w.register_class(&format!("{prefix}{i}"), kind, FLAG_ENABLED | FLAG_TIMED)
                .unwrap()
        })
        .collect()
}

/// Class `class`'s total in snapshot `s`: its live threads' rows and the
/// exited threads' folded ones, merged.
pub fn total(s: &SegmentSnapshot, class: u32) -> Summary {
    let mut t = Summary::default();
    for (_, r) in s
        .live_rows
        .iter()
        .chain(&s.exited)
        .filter(|(c, _)| *c == class)
    {
        t.merge(r);
    }
    t
}
