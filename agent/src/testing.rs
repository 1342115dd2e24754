//! Layer 0 (tests only): fixtures for the agent's unit tests and, with
//! feature `testing`, for integration tests: real segments written the way
//! pfs-client writes them.

use std::fs::File;
use std::path::Path;

use pfs_shm_layout::layout::{
    EV_CANCELLED, EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED, NONE_U32,
};
use pfs_shm_layout::values::StatementFigures;
use pfs_shm_layout::writer::EventData;
use pfs_shm_layout::{
    ClassKind, EventKind, Segment, SegmentConfig, SegmentWriter, TimerCalibration,
};

/// A segment file at `path` created with `cfg` by pid `pid`, ticking in
/// nanoseconds. With `live`, the returned file holds the owner's lock, as
/// a running process does (the segment is dead once it is dropped).
pub fn segment_at(path: &Path, cfg: &SegmentConfig, pid: u32, live: bool) -> (File, SegmentWriter) {
    segment_started_at(path, cfg, pid, live, 0)
}

/// [`segment_at`], its creator started at `start_time_unix_ns`.
pub fn segment_started_at(
    path: &Path,
    cfg: &SegmentConfig,
    pid: u32,
    live: bool,
    start_time_unix_ns: u64,
) -> (File, SegmentWriter) {
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .unwrap();
    if live {
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    }
    let seg = Segment::create(
        file.try_clone().unwrap(),
        cfg,
        TimerCalibration::NANOSECONDS,
        pid,
        start_time_unix_ns,
    )
    .unwrap();
    (file, SegmentWriter::new(seg))
}

/// The smallest useful segment of `service`: one record of one page,
/// four classes and strings, rings of two (and one for `history_long`).
pub fn tiny_config(service: &str) -> SegmentConfig {
    SegmentConfig {
        service_name: service.into(),
        history_len: 2,
        max_classes: 4,
        max_strings: 4,
        records_per_page: 1,
        max_pages: 1,
        history_long_len: 1,
        task_slots: 4,
    }
}

/// A dead segment (nobody holds it) of `service`, pid `pid`, at
/// `dir/<service>.<pid>.pfs`, whose one thread recorded `n` timed waits of
/// `wait/synch/mutex/t/a` (see [`record_waits`]); returns its path.
pub fn dead_segment(dir: &Path, service: &str, pid: u32, n: u64) -> std::path::PathBuf {
    let path = dir.join(pfs_shm_layout::files::segment_file_name(service, pid));
    let (_file, w) = segment_at(&path, &tiny_config(service), pid, false);
    let class = mutex_class(&w, "a");
    let slot = w.alloc_thread(1, 1, "t").expect("a record");
    record_waits(&w, slot.index, class, n);
    path
}

/// A timed mutex instrument `wait/synch/mutex/t/{name}`.
pub fn mutex_class(w: &SegmentWriter, name: &str) -> u32 {
    w.register_class(
        &format!("wait/synch/mutex/t/{name}"),
        ClassKind::Mutex,
        FLAG_ENABLED | FLAG_TIMED,
    )
    .unwrap()
}

/// `n` ended, timed waits of `class` by thread record `slot`, lasting
/// 1, 2, ... `n` µs, each summarised.
pub fn record_waits(w: &SegmentWriter, slot: u32, class: u32, n: u64) {
    let rec = w.segment().record(slot);
    for i in 0..n {
        let e = EventData {
            event_id: i + 1,
            class,
            source: NONE_U32,
            object_name: NONE_U32,
            flags: EV_TIMED | EV_ENDED,
            ..Default::default()
        };
        rec.end_event(EventKind::Wait, &e, None, true, true);
        rec.summarize(
            class as usize,
            EventKind::Wait,
            true,
            1_000_000 * (i + 1),
            0,
            None,
        );
    }
}

/// A timed statement instrument `statement/t/{name}`.
pub fn statement_class(w: &SegmentWriter, name: &str) -> u32 {
    w.register_class(
        &format!("statement/t/{name}"),
        ClassKind::Statement,
        FLAG_ENABLED | FLAG_TIMED,
    )
    .unwrap()
}

/// Begins event `event_id` of `kind` and class `class` of logical thread
/// `thread_id` in thread record `slot` (running, in `events_*_current`,
/// timed, started at `event_id` µs); returns it, to be ended.
pub fn begin(
    w: &SegmentWriter,
    slot: u32,
    kind: EventKind,
    class: u32,
    (thread_id, event_id): (u64, u64),
) -> EventData {
    let e = EventData {
        event_id,
        class,
        timer_start: event_id * 1_000,
        source: NONE_U32,
        object_name: NONE_U32,
        flags: EV_TIMED,
        event_type: kind as u32,
        thread_id,
        ..Default::default()
    };
    w.segment().record(slot).begin_event(kind, &e);
    e
}

/// Statement `event_id` of logical thread `thread_id` (a task's when it is
/// not the record's own), as thread record `slot` writes it, lasting
/// `wait_ps`. Begun only (running, in `events_statements_current`) if
/// `figures` is `None`; else ended (current row and history ring) with
/// those figures (`CPU_TIME`, and flag CANCELLED if `cancelled` is set)
/// and summarised, as the client does.
pub fn statement(
    w: &SegmentWriter,
    slot: u32,
    class: u32,
    (thread_id, event_id): (u64, u64),
    wait_ps: u64,
    figures: Option<StatementFigures>,
) {
    let rec = w.segment().record(slot);
    let cancelled = figures.is_some_and(|f| f.cancelled != 0);
    let mut e = begin(w, slot, EventKind::Statement, class, (thread_id, event_id));
    let Some(f) = figures else { return };
    e.end_event_id = event_id + 1;
    e.timer_end = e.timer_start + wait_ps / 1_000;
    e.timer_wait = wait_ps;
    e.flags |= EV_ENDED | if cancelled { EV_CANCELLED } else { 0 };
    rec.end_event(EventKind::Statement, &e, Some(&f), true, true);
    rec.summarize(
        class as usize,
        EventKind::Statement,
        true,
        wait_ps,
        0,
        Some(&f),
    );
}
