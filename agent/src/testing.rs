//! Layer 0 (tests only): fixtures for the agent's unit tests, real
//! segments written the way pfs-client writes them.

use std::fs::File;
use std::path::Path;

use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED, NONE_U32};
use pfs_shm_layout::writer::EventData;
use pfs_shm_layout::{ClassKind, Segment, SegmentConfig, SegmentWriter, TimerCalibration};

/// A segment file at `path` created with `cfg` by pid `pid`, ticking in
/// nanoseconds. With `live`, the returned file holds the owner's lock, as
/// a running process does (the segment is dead once it is dropped).
pub fn segment_at(path: &Path, cfg: &SegmentConfig, pid: u32, live: bool) -> (File, SegmentWriter) {
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
        0,
    )
    .unwrap();
    (file, SegmentWriter::new(seg))
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
        rec.end_event(0, &e, None, true, true);
        rec.summarize(class as usize, true, 1_000_000 * (i + 1), 0, None);
    }
}
