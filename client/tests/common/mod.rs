//! Shared by the integration tests: the client's own segment read back
//! as the agent reads it. Each test file uses some of it.

#![allow(dead_code)]

use std::path::Path;

use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, snapshot};

/// A full snapshot (events, every thread's rows) of the segment at `path`.
pub fn read(path: &Path) -> SegmentSnapshot {
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    snapshot(&seg, &ReadOptions::default()).unwrap()
}
