//! `events_statements_cpu` as readers show it: the bit itself for a 6.2
//! or later writer, on for older writers (6.0 and 6.1 time task polls
//! always).

mod common;

use std::sync::atomic::Ordering::Relaxed;

use pfs_shm_layout::layout::{CONSUMER_STATEMENTS_CPU, CONSUMERS_DEFAULT};
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_shm_layout::setup::{consumers_in_effect, set_consumers};
use pfs_shm_layout::{Segment, SegmentConfig};

#[test]
fn the_cpu_consumer_is_shown_as_it_acts() {
    let (file, w) = common::create(&SegmentConfig::default());
    let seg = w.segment();
    assert_eq!(consumers_in_effect(seg), CONSUMERS_DEFAULT);
    assert_eq!(set_consumers(seg, "events_statements_cpu", false), 1);
    let shown = |seg: &Segment| {
        snapshot(seg, &ReadOptions::default()).unwrap().consumers & CONSUMER_STATEMENTS_CPU != 0
    };
    let reader = Segment::open(file.try_clone().unwrap(), false).unwrap();
    assert!(!shown(&reader), "a current writer: the bit as set");
    // A 6.2 writer's: the same.
    seg.header().major.store(6, Relaxed);
    seg.header().minor.store(2, Relaxed);
    let reader = Segment::open(file.try_clone().unwrap(), false).unwrap();
    assert!(!shown(&reader), "a 6.2 writer: the bit as set");
    // The same segment as a 6.1 writer made it: it measures whatever the
    // bit says.
    seg.header().minor.store(1, Relaxed);
    let reader = Segment::open(file.try_clone().unwrap(), false).unwrap();
    assert_eq!((reader.major_version(), reader.minor_version()), (6, 1));
    assert!(shown(&reader), "a 6.1 writer: shown on");
    // ...and not switchable there (as the agent opens it): nothing
    // matched, nothing changed.
    let agent = Segment::open(file, true).unwrap();
    assert_eq!(set_consumers(&agent, "events_statements_cpu", false), 0);
    assert_eq!(set_consumers(&agent, "events_statements_%", false), 4);
    assert!(shown(&reader));
}
