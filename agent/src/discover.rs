//! Finding segments in the directory, deciding whether their processes
//! live, and retiring the dead.
//!
//! * A file is a candidate if its name ends in `.pfs`. It is opened with
//!   `O_NOFOLLOW` (a symlink is refused, never followed) and must be a
//!   regular file.
//! * A file that fails validation is remembered with its reason and size,
//!   logged once, and retried only when it changes.
//! * **Liveness through `flock`**: the owning process holds an exclusive
//!   lock for its lifetime. If the agent can take a shared lock, the owner
//!   is gone. Pids are never used: containers of a pod do not share a pid
//!   namespace.
//! * A dead process's segment keeps being exported for `dead_retention`;
//!   then its final totals are folded into per-service retired totals (so
//!   no counter goes backwards) and the file is removed.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, snapshot};
use pfs_shm_layout::{Segment, SegmentError};
use rustix::fs::FlockOperation;

use crate::aggregate::Retired;

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
    pub last: Option<std::sync::Arc<SegmentSnapshot>>,
    /// Writable mapping for applying setup defaults (when there are any).
    rw: Option<Segment>,
    /// Classes the defaults have been applied to.
    classes_applied: usize,
}

/// A file that is not a usable segment.
#[derive(Debug, Clone)]
pub struct Invalid {
    /// Short machine-readable reason (metric label).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

/// Every segment file of one directory.
#[derive(Debug)]
pub struct SegmentSet {
    dir: PathBuf,
    dead_retention: Duration,
    /// Live and recently dead segments, by path.
    pub tracked: HashMap<PathBuf, Tracked>,
    /// Files refused, by path.
    pub invalid: HashMap<PathBuf, Invalid>,
    /// Totals of retired (dead and removed) segments, by service.
    pub retired: Retired,
    /// Count of segment errors by reason (monotonic).
    pub errors: HashMap<&'static str, u64>,
    /// Segments retired so far.
    pub retired_segments: u64,
    /// Setup defaults applied to every segment.
    pub defaults: crate::setup::Defaults,
}

/// The metric label for a validation error.
pub fn reason(e: &SegmentError) -> &'static str {
    match e {
        SegmentError::Truncated { .. } => "truncated",
        SegmentError::BadMagic(_) => "bad_magic",
        SegmentError::ByteOrder(_) => "byte_order",
        SegmentError::UnsupportedVersion { .. } => "unsupported_version",
        SegmentError::NotReady => "not_ready",
        SegmentError::Corrupt(_) => "corrupt",
        SegmentError::BadConfig(_) => "bad_config",
        SegmentError::NoSpace(_) => "no_space",
        SegmentError::Io(..) => "io",
        SegmentError::FoldStorm(_) => "fold_storm",
    }
}

impl SegmentSet {
    /// An empty set over `dir`.
    pub fn new(dir: impl Into<PathBuf>, dead_retention: Duration) -> Self {
        Self {
            dir: dir.into(),
            dead_retention,
            tracked: HashMap::new(),
            invalid: HashMap::new(),
            retired: Retired::default(),
            errors: HashMap::new(),
            retired_segments: 0,
            defaults: crate::setup::Defaults::default(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// One discovery pass: opens new files, re-checks liveness, retires
    /// segments dead for longer than the retention.
    pub fn refresh(&mut self) {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list the segment directory; check --shm-dir and its permissions");
                return;
            }
        };
        let mut seen = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "pfs") {
                continue;
            }
            seen.push(path.clone());
            if self.tracked.contains_key(&path) {
                continue;
            }
            self.consider(&path);
        }
        // Files removed behind our back (by an operator, or a restarted agent's peer).
        self.invalid.retain(|p, _| seen.contains(p));
        let now = Instant::now();
        let mut retire = Vec::new();
        for (path, t) in &mut self.tracked {
            if !seen.contains(path) && t.dead_since.is_none() {
                t.dead_since = Some(now);
            }
            if t.dead_since.is_none() && owner_is_dead(t.segment.file()) {
                tracing::info!(path = %path.display(), service = t.segment.service(), "process exited; keeping its final counters for the retention period");
                t.dead_since = Some(now);
            }
            if t.dead_since
                .is_some_and(|d| now.duration_since(d) >= self.dead_retention)
            {
                retire.push(path.clone());
            }
        }
        for path in retire {
            self.retire(&path);
        }
        if !self.defaults.is_empty() {
            for t in self.tracked.values_mut().filter(|t| t.dead_since.is_none()) {
                if let Some(rw) = &t.rw {
                    t.classes_applied = self.defaults.apply_instruments(rw, t.classes_applied);
                }
            }
        }
    }

    fn consider(&mut self, path: &Path) {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(_) => return, // vanished
        };
        let (len, modified) = (meta.len(), meta.modified().ok());
        if let Some(inv) = self.invalid.get(path)
            && inv.len == len
            && inv.modified == modified
        {
            return; // unchanged since refused
        }
        let result = if meta.file_type().is_symlink() {
            Err((
                "symlink",
                "is a symbolic link; segments are never followed through links".to_string(),
            ))
        } else if !meta.file_type().is_file() || meta.file_type().is_fifo() {
            Err(("not_regular", "is not a regular file".to_string()))
        } else {
            open_segment(path).map_err(|e| (reason(&e), e.to_string()))
        };
        match result {
            Ok(segment) => {
                tracing::info!(path = %path.display(), service = segment.service(), pid = segment.pid(), "segment found");
                self.invalid.remove(path);
                let rw = if self.defaults.is_empty() {
                    None
                } else {
                    match crate::setup::open_rw(path) {
                        Ok(rw) => {
                            self.defaults.apply_consumers(&rw);
                            Some(rw)
                        }
                        Err(e) => {
                            tracing::warn!("cannot apply setup defaults: {e}");
                            None
                        }
                    }
                };
                self.tracked.insert(
                    path.to_path_buf(),
                    Tracked {
                        segment,
                        path: path.to_path_buf(),
                        dead_since: None,
                        last: None,
                        rw,
                        classes_applied: 0,
                    },
                );
            }
            Err(("not_ready", _)) => {} // being created: next pass
            Err((reason, message)) => {
                tracing::warn!(path = %path.display(), reason, "refusing segment file: {message}");
                *self.errors.entry(reason).or_default() += 1;
                self.invalid.insert(
                    path.to_path_buf(),
                    Invalid {
                        reason,
                        message,
                        len,
                        modified,
                    },
                );
            }
        }
    }

    /// Folds a dead segment's final totals into the retired totals and
    /// removes its file.
    fn retire(&mut self, path: &Path) {
        let Some(t) = self.tracked.remove(path) else {
            return;
        };
        let final_snap = snapshot(
            &t.segment,
            &ReadOptions {
                events: false,
                per_thread_rows: false,
                ..Default::default()
            },
        )
        .ok()
        .map(std::sync::Arc::new)
        .or(t.last);
        if let Some(s) = &final_snap {
            self.retired.absorb(s);
        }
        self.retired_segments += 1;
        match std::fs::remove_file(path) {
            Ok(()) => tracing::info!(path = %path.display(), "dead segment retired and removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove retired segment")
            }
        }
    }

    /// Retires every dead segment now (used at shutdown of the demo).
    pub fn retire_all_dead(&mut self) {
        let dead: Vec<_> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.dead_since.is_some())
            .map(|(p, _)| p.clone())
            .collect();
        for p in dead {
            self.retire(&p);
        }
    }
}

fn open_segment(path: &Path) -> Result<Segment, SegmentError> {
    let file = open_nofollow(path).map_err(|e| SegmentError::Io("open the segment", e))?;
    Segment::open(file, false)
}

fn open_nofollow(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
}

/// True if nobody holds the segment's lock (its process has exited).
pub fn owner_is_dead(file: &File) -> bool {
    match rustix::fs::flock(file, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = rustix::fs::flock(file, FlockOperation::Unlock);
            true
        }
        Err(_) => false,
    }
}
