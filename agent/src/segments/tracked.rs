//! A segment being exported: its mapping, whether its process lives, and
//! the last snapshots taken of it (carry-forward source, and once the
//! process is dead, its final figures). Layer 3, under [`super`].
//!
//! A global section whose sequence lock stays odd at one value
//! ([`SegmentError::GlobalLockStuck`]) is a fold that does not finish. While
//! the process lives it may still finish (a stopped process), so reads
//! keep being retried and fail; once the process is dead nobody can finish
//! it, so the section is read as it is ([`ReadOptions::global_stuck_at`])
//! and the result is flagged as possibly torn ([`Stuck::torn`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pfs_shm_layout::reader::{IncrementalReader, ReadOptions, SegmentSnapshot, snapshot};
use pfs_shm_layout::{Segment, SegmentError};

use super::liveness::owner_is_dead;
use crate::carry::carry_forward_summed;
use crate::retired::Absorbed;
use crate::setup::Applied;

/// A global section whose sequence lock was found stuck (odd at one
/// value for a whole read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stuck {
    /// The odd sequence value it stays at.
    pub seq: u64,
    /// When it was first found at that value.
    pub since: Instant,
    /// Whether the owner was dead, so that the section was read as it is:
    /// the figures exported since may be torn.
    pub torn: bool,
    /// Whether it was reported (logged at `WARN` and counted).
    reported: bool,
}

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
    /// The global section's lock, while it is found stuck.
    pub stuck: Option<Stuck>,
    /// The last read failed with this message (`None` after a success):
    /// each failure is logged at `WARN` when it first happens only.
    pub failure: Option<String>,
    /// Whether its retirement was refused and logged (never read).
    pub(super) unretirable_reported: bool,
    /// Whether its file was found gone from the directory while its
    /// process still ran (logged once; it is read through the open file).
    pub(super) unlinked_reported: bool,
    /// Whether a pass found its process alive, or it was found after
    /// the agent's first listing of the directory (its process started
    /// since): its end, if any, is then seen within a pass of it, not
    /// found after the fact.
    pub(super) seen_alive: bool,
}

impl Tracked {
    /// A newly found segment.
    pub(super) fn new(segment: Segment, path: PathBuf, defaults: Option<Applied>) -> Self {
        Self {
            segment,
            path,
            dead_since: None,
            unlinked_reported: false,
            seen_alive: false,
            last: None,
            last_summaries: None,
            reader: IncrementalReader::default(),
            defaults,
            ino: 0,
            stuck: None,
            failure: None,
            unretirable_reported: false,
        }
    }

    /// The figures to fold when the segment retires: the last summaries
    /// snapshot, else the last full one.
    pub(super) fn final_figures(&self) -> Option<&SegmentSnapshot> {
        self.last_summaries.as_deref().or(self.last.as_deref())
    }

    /// Whether its process has ended: its death was seen, or its lock is
    /// free now (a file replaced under its name before a pass saw the
    /// death: retired at once).
    pub(super) fn has_ended(&self) -> bool {
        self.dead_since.is_some() || owner_is_dead(self.segment.file())
    }

    /// When its process's death was found, ns since the epoch (0: alive).
    pub(super) fn died_unix_ns(&self) -> u64 {
        self.dead_since.map_or(0, |d| {
            std::time::SystemTime::now()
                .checked_sub(d.elapsed())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |t| t.as_nanos() as u64)
        })
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
    /// A global section left locked by a dead process is read as it is
    /// (see the module docs).
    pub fn snapshot(&mut self, opts: &ReadOptions) -> Result<SegmentSnapshot, SegmentError> {
        self.read(Some(opts))
    }

    /// A summaries snapshot ([`ReadOptions::summaries`]), reading only the
    /// rows that changed since the previous one; refused as
    /// [`Tracked::snapshot`] is.
    pub fn snapshot_summaries(&mut self) -> Result<SegmentSnapshot, SegmentError> {
        self.read(None)
    }

    /// One read: `opts`, or an incremental summaries read for `None`.
    fn read(&mut self, opts: Option<&ReadOptions>) -> Result<SegmentSnapshot, SegmentError> {
        let first = self.read_once(opts, None);
        let Err(SegmentError::GlobalLockStuck { seq }) = first else {
            if first.is_ok() {
                self.unstuck();
            }
            return first;
        };
        let now = Instant::now();
        let dead = self.dead_since.is_some() || owner_is_dead(self.segment.file());
        let stuck = match self.stuck {
            Some(s) if s.seq == seq => s,
            _ => Stuck {
                seq,
                since: now,
                torn: false,
                reported: false,
            },
        };
        self.stuck = Some(stuck);
        if !dead {
            return first;
        }
        // Nobody can finish the write: read the section as it is.
        let read = self.read_once(opts, Some(seq));
        if read.is_ok()
            && let Some(s) = &mut self.stuck
        {
            s.torn = true;
        }
        read
    }

    fn read_once(
        &mut self,
        opts: Option<&ReadOptions>,
        global_stuck_at: Option<u64>,
    ) -> Result<SegmentSnapshot, SegmentError> {
        // A dead process's rows left odd by a writer killed mid-update are
        // read as they are: nobody will finish them.
        // (Its flock, not only its file gone: a live process's removed file
        // is still written.)
        let dead_writers = self.dead_since.is_some() && owner_is_dead(self.segment.file());
        let s = match opts {
            Some(o) => snapshot(
                &self.segment,
                &ReadOptions {
                    global_stuck_at,
                    dead_writers,
                    ..*o
                },
            )?,
            None => self.reader.snapshot(
                &self.segment,
                &ReadOptions {
                    global_stuck_at,
                    dead_writers,
                    ..ReadOptions::summaries()
                },
            )?,
        };
        self.segment.check()?;
        Ok(s)
    }

    /// A read succeeded without reading a stuck lock as it is.
    fn unstuck(&mut self) {
        if let Some(s) = self.stuck.take()
            && s.reported
        {
            tracing::info!(path = %crate::util::shown::path(&self.path), service = self.segment.service(), "the global section's unfinished write completed after {:?}; the segment is read normally again", s.since.elapsed());
        }
    }

    /// Logs (at `WARN`) a stuck global lock once it is worth an operator's
    /// attention: at once if the process is dead (the figures are then
    /// read as they are), after `grace` while it lives (a process stopped
    /// for a moment in the middle of a fold is not). Returns true the one
    /// time it is reported, to be counted.
    pub(super) fn report_stuck(&mut self, grace: Duration) -> bool {
        let Some(s) = &mut self.stuck else {
            return false;
        };
        if s.reported || (!s.torn && s.since.elapsed() < grace) {
            return false;
        }
        s.reported = true;
        let (path, service, pid) = (
            self.path.display(),
            self.segment.service(),
            self.segment.pid(),
        );
        if s.torn {
            tracing::warn!(path = %path, service, pid, seq = s.seq, reason = "global_lock_stuck", "the process died in the middle of a thread-exit fold: the global section (totals of exited threads) stays locked by its unfinished write and nobody can finish it; its figures are read as they are and may be torn (the thread being folded may count some of its last events twice)");
        } else {
            let exported = if self.last_summaries.is_some() || self.last.is_some() {
                "its last good snapshot stays exported"
            } else {
                "it is not exported (counted as invalid) until a read succeeds"
            };
            tracing::warn!(path = %path, service, pid, seq = s.seq, reason = "global_lock_stuck", "the global section (totals of exited threads) has stayed locked by one unfinished write for {:?} while the process lives: it is stopped in the middle of a thread-exit fold (SIGSTOP, a debugger, a frozen cgroup) or the writing thread died in it; {exported}; retried every pass (restart the process if it persists)", s.since.elapsed());
        }
        true
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
    /// figures retirement folds). A row its writer was killed in the middle
    /// of updating (its sequence odd forever) is read as it is
    /// ([`ReadOptions::dead_writers`]): off by at most that one event.
    /// Rows that still cannot be read (the file cannot be read there) keep
    /// their previous value. Returns true if there were such rows: the
    /// segment should then be retired at once, so its last good values
    /// are saved.
    pub(super) fn final_read(&mut self) -> bool {
        match self.snapshot_summaries() {
            Ok(mut s) => {
                if s.stats.torn_rows > 0 {
                    tracing::info!(path = %crate::util::shown::path(&self.path), rows = s.stats.torn_rows, "a writer of this dead process was killed in the middle of an update: its row is read as it is (each figure from before or after that last event)");
                }
                let torn = s.threads.iter().any(|th| !th.skipped_rows.is_empty());
                if torn {
                    tracing::info!(path = %crate::util::shown::path(&self.path), "rows of this dead process cannot be read; they keep their last good value");
                }
                if let Some(prev) = &self.last_summaries {
                    carry_forward_summed(&mut s, prev);
                }
                self.last_summaries = Some(Arc::new(s));
                torn
            }
            Err(e) => {
                let keep = if self.final_figures().is_some() {
                    "keeping its previous snapshot"
                } else {
                    "it was never read: its file is kept, not retired"
                };
                let message = e.to_string();
                if self.failure.as_deref() != Some(message.as_str()) {
                    tracing::warn!(path = %crate::util::shown::path(&self.path), error = %e, "cannot read the dead segment one last time; {keep}");
                }
                self.failure = Some(message);
                false
            }
        }
    }
}
