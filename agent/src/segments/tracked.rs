//! A segment being exported: its mapping, whether its process lives, and
//! the last snapshots taken of it (carry-forward source, and once the
//! process is dead, its final figures).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use pfs_shm_layout::reader::{IncrementalReader, ReadOptions, SegmentSnapshot, snapshot};
use pfs_shm_layout::{Segment, SegmentError};

use crate::carry::carry_forward_summed;
use crate::retired::Absorbed;
use crate::setup::Applied;

/// A segment being exported.
#[derive(Debug)]
pub struct Tracked {
    /// The mapping.
    pub segment: Segment,
    /// File path.
    pub path: PathBuf,
    /// `None` while the owner lives; when it was found dead otherwise.
    pub dead_since: Option<Instant>,
    /// Last snapshot taken of it (kept for carry-forward and for dead
    /// segments, whose content no longer changes).
    pub last: Option<Arc<SegmentSnapshot>>,
    /// Last summaries snapshot (what `/metrics` and OTLP export, and what
    /// retirement folds): carry-forward source, and, once the process is
    /// dead, its final figures.
    pub last_summaries: Option<Arc<SegmentSnapshot>>,
    /// Reads its summaries incrementally: keeps the live threads' rows
    /// between snapshots, and reads only the rows that changed.
    reader: IncrementalReader,
    /// The setup defaults being applied to it (when there are any).
    pub(super) defaults: Option<Applied>,
    /// Inode of the file (a file replaced under the same name differs).
    pub(super) ino: u64,
}

impl Tracked {
    /// A newly found segment.
    pub(super) fn new(segment: Segment, path: PathBuf, defaults: Option<Applied>) -> Self {
        Self {
            segment,
            path,
            dead_since: None,
            last: None,
            last_summaries: None,
            reader: IncrementalReader::default(),
            defaults,
            ino: 0,
        }
    }

    /// The figures to fold when the segment retires: the last summaries
    /// snapshot, else the last full one.
    pub(super) fn final_figures(&self) -> Option<&SegmentSnapshot> {
        self.last_summaries.as_deref().or(self.last.as_deref())
    }

    /// What identifies this segment's file in the state file.
    pub(super) fn identity(&self) -> Absorbed {
        Absorbed {
            file: self
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            ino: self.ino,
            pid: self.segment.pid(),
            start_time_unix_ns: self.segment.start_time_unix_ns(),
        }
    }

    /// A snapshot of the segment, refused if the file shrank or the
    /// mapping faulted during the read (the data would be zeros, not the
    /// segment's); the next refresh then drops the segment.
    pub fn snapshot(&self, opts: &ReadOptions) -> Result<SegmentSnapshot, SegmentError> {
        let s = snapshot(&self.segment, opts)?;
        self.segment.check()?;
        Ok(s)
    }

    /// A summaries snapshot ([`ReadOptions::summaries`]), reading only the
    /// rows that changed since the previous one; refused as
    /// [`Tracked::snapshot`] is.
    pub fn snapshot_summaries(&mut self) -> Result<SegmentSnapshot, SegmentError> {
        let s = self
            .reader
            .snapshot(&self.segment, &ReadOptions::summaries())?;
        self.segment.check()?;
        Ok(s)
    }

    /// Forgets the rows kept for incremental snapshots: the next summaries
    /// snapshot reads every row.
    pub fn forget_kept(&mut self) {
        self.reader = IncrementalReader::default();
    }

    /// Heap bytes of the rows kept for incremental snapshots.
    pub fn kept_bytes(&self) -> usize {
        self.reader.heap_bytes()
    }

    /// Reads a dead segment one last time into `last_summaries` (the
    /// figures retirement folds). Rows that cannot be read (their writer
    /// died in the middle of an update, leaving the row's sequence odd
    /// forever) keep their previous value. Returns true if there were such
    /// rows: the segment should then be retired at once, so its last good
    /// values are saved.
    pub(super) fn final_read(&mut self) -> bool {
        match self.snapshot_summaries() {
            Ok(mut s) => {
                let torn = s.threads.iter().any(|th| !th.skipped_rows.is_empty());
                if torn {
                    tracing::info!(path = %self.path.display(), "a writer of this dead process was killed in the middle of an update; its row keeps its last good value");
                }
                if let Some(prev) = &self.last_summaries {
                    carry_forward_summed(&mut s, prev);
                }
                self.last_summaries = Some(Arc::new(s));
                torn
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the dead segment one last time; keeping its previous snapshot");
                false
            }
        }
    }
}
