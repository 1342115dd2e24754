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
//!   no counter goes backwards) and the file is removed. When the death is
//!   noticed, the segment is read one last time; a row its writer was
//!   killed in the middle of updating cannot be read any more and keeps
//!   its last good value (carried forward), and such a segment is retired
//!   at once, so that value is saved before anything else can lose it.
//! * A file replaced under the same name (a restarted process that got the
//!   same pid, as in a container) is noticed by its inode: the old segment
//!   is retired at once and the new one tracked.
//! * With [`SegmentSet::persist`] the retired totals survive an agent
//!   restart and only the directory's owning agent retires (see
//!   [`crate::retired`]).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirEntryExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, snapshot};
use pfs_shm_layout::{Segment, SegmentError};
use rustix::fs::FlockOperation;

use crate::aggregate::Retired;
use crate::retired::{Absorbed, Role, State, Store};

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
    pub last: Option<SegmentSnapshot>,
    /// Writable mapping for applying setup defaults (when there are any).
    rw: Option<Segment>,
    /// Classes the defaults have been applied to.
    classes_applied: usize,
    /// Inode of the file (a file replaced under the same name differs).
    ino: u64,
}

impl Tracked {
    fn identity(&self) -> Absorbed {
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
    /// The state file, when retired totals persist.
    store: Option<Store>,
    /// Retired segments whose files may still exist.
    absorbed: Vec<Absorbed>,
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
            store: None,
            absorbed: Vec::new(),
        }
    }

    /// Keeps the retired totals in the directory's state file (loaded now,
    /// written at every retirement), so an agent restart loses none.
    pub fn persist(mut self) -> Self {
        let mut store = Store::new(&self.dir);
        store.elect();
        self.install(store.load());
        self.store = Some(store);
        self
    }

    /// This agent's role on the directory (`Owner` without persistence).
    pub fn role(&self) -> Role {
        self.store.as_ref().map_or(Role::Owner, Store::role)
    }

    fn install(&mut self, state: State) {
        self.retired = state.retired;
        self.retired_segments = state.retired_segments;
        self.absorbed = state.absorbed;
        // Segments the state already counts are not exported again.
        let absorbed = &self.absorbed;
        self.tracked
            .retain(|_, t| !absorbed.contains(&t.identity()));
    }

    /// Whether the file `name` with inode `ino` was retired already.
    fn was_absorbed(&self, name: &std::ffi::OsStr, ino: u64) -> bool {
        self.absorbed
            .iter()
            .any(|a| a.ino == ino && std::ffi::OsStr::new(&a.file) == name)
    }

    /// Before a pass: elect, and (re)load the state when this agent just
    /// became the owner or, as a follower, when the owner rewrote it.
    fn sync_store(&mut self, force: bool) {
        let Some(store) = &mut self.store else { return };
        let reload =
            store.elect() || (store.role() == Role::Follower && (force || store.changed()));
        if reload {
            let state = store.load();
            self.install(state);
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
        self.sync_store(false);
        let mut seen = Vec::new();
        let mut retire = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "pfs") {
                continue;
            }
            seen.push(path.clone());
            if let Some(t) = self.tracked.get(&path) {
                if t.ino == entry.ino() {
                    continue;
                }
                // Replaced under the same name: retire the old one now.
                tracing::info!(path = %path.display(), "segment file replaced by a new process; retiring the old one");
                retire.push(self.tracked.remove(&path).expect("tracked"));
            }
            if self.was_absorbed(&entry.file_name(), entry.ino()) {
                // Retired already (by an agent that died before removing
                // it, or whose removal failed and was logged).
                if self.role() == Role::Owner {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            self.consider(&path);
            self.adopt(&path, entry.ino());
        }
        // Files removed behind our back (by an operator, or the owning agent).
        self.invalid.retain(|p, _| seen.contains(p));
        let vanished = self.tracked.keys().any(|p| !seen.contains(p));
        if vanished && self.role() == Role::Follower {
            // The owner wrote the state before removing the file.
            self.sync_store(true);
            self.tracked.retain(|p, _| seen.contains(p));
        }
        let now = Instant::now();
        let owner = self.role() == Role::Owner;
        // Retiring a torn segment at once only helps when it is saved.
        let persist = self.store.is_some();
        let mut expired = Vec::new();
        for (path, t) in &mut self.tracked {
            if !seen.contains(path) && t.dead_since.is_none() {
                t.dead_since = Some(now);
            }
            let mut torn = false;
            if t.dead_since.is_none() && owner_is_dead(t.segment.file()) {
                tracing::info!(path = %path.display(), service = t.segment.service(), "process exited; keeping its final counters for the retention period");
                t.dead_since = Some(now);
                torn = final_read(t);
            }
            if owner
                && ((torn && persist)
                    || t.dead_since
                        .is_some_and(|d| now.duration_since(d) >= self.dead_retention))
            {
                expired.push(path.clone());
            }
        }
        for path in expired {
            if let Some(t) = self.tracked.remove(&path) {
                retire.push(t);
            }
        }
        self.retire(retire);
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
                        ino: 0,
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

    /// Records the inode of a newly tracked segment; drops it (and removes
    /// its file) if the state says it was retired already (an agent killed
    /// between writing the state and removing the file).
    fn adopt(&mut self, path: &Path, listed_ino: u64) {
        let Some(t) = self.tracked.get_mut(path) else {
            return;
        };
        t.ino = t.segment.file().metadata().map_or(listed_ino, |m| m.ino());
        let id = t.identity();
        if self.absorbed.contains(&id) {
            self.tracked.remove(path);
            if self.role() == Role::Owner {
                remove_retired(path, id.ino);
            }
        }
    }

    /// Folds dead segments' final totals into the retired totals, saves
    /// the state, then removes their files (the order that makes a crash
    /// in between harmless).
    fn retire(&mut self, dead: Vec<Tracked>) {
        if dead.is_empty() {
            return self.save_if_dirty();
        }
        let mut remove = Vec::new();
        for mut t in dead {
            if t.dead_since.is_none() || t.last.is_none() {
                final_read(&mut t);
            }
            if let Some(s) = &t.last {
                self.retired.absorb(s);
            }
            self.retired_segments += 1;
            let id = t.identity();
            // A file replaced under the same name is not ours to remove.
            if std::fs::symlink_metadata(&t.path).is_ok_and(|m| m.ino() == t.ino) {
                if self.store.is_some() {
                    self.absorbed.push(id);
                }
                remove.push((t.path.clone(), t.ino));
            }
        }
        self.retired_changed();
        for (path, ino) in remove {
            remove_retired(&path, ino);
        }
    }

    /// Saves the state after `self.retired` changed (call after every
    /// `self.retired.absorb`); a failed save is retried every pass.
    fn retired_changed(&mut self) {
        if let Some(store) = &mut self.store {
            store.dirty = true;
        }
        self.save_if_dirty();
    }

    fn save_if_dirty(&mut self) {
        let Some(store) = &mut self.store else { return };
        if !store.dirty || store.role() != Role::Owner {
            return;
        }
        // Entries whose file is gone need no remembering.
        let dir = &self.dir;
        self.absorbed.retain(|a| {
            std::fs::symlink_metadata(dir.join(&a.file)).is_ok_and(|m| m.ino() == a.ino)
        });
        let state = State {
            retired: self.retired.clone(),
            retired_segments: self.retired_segments,
            absorbed: self.absorbed.clone(),
        };
        match store.save(&state) {
            Ok(()) => store.dirty = false,
            Err(e) => {
                tracing::warn!(path = %store.state_path().display(), error = %e, "cannot save the retired totals; retrying every pass (until then an agent restart would make retired services' counters go backwards)")
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
        let dead = dead.iter().filter_map(|p| self.tracked.remove(p)).collect();
        self.retire(dead);
    }
}

/// Reads a dead segment one last time into `t.last`. Rows that cannot be
/// read (their writer died in the middle of an update, leaving the row's
/// sequence odd forever) keep their previous value. Returns true if there
/// were such rows: the segment should then be retired at once, so its last
/// good values are saved.
fn final_read(t: &mut Tracked) -> bool {
    // Events too: the tables keep showing a dead process's last events
    // for the retention period.
    match snapshot(&t.segment, &ReadOptions::default()) {
        Ok(mut s) => {
            let torn = s.threads.iter().any(|th| !th.skipped_rows.is_empty());
            if torn {
                tracing::info!(path = %t.path.display(), "a writer of this dead process was killed in the middle of an update; its row keeps its last good value");
            }
            crate::snapshot::carry_forward(&mut s, t.last.as_ref());
            t.last = Some(s);
            torn
        }
        Err(e) => {
            tracing::warn!(path = %t.path.display(), error = %e, "cannot read the dead segment one last time; keeping its previous snapshot");
            false
        }
    }
}

/// Removes a retired segment's file if it is still the same file.
fn remove_retired(path: &Path, ino: u64) {
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == ino) {
        return;
    }
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(path = %path.display(), "dead segment retired and removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove retired segment; check the directory's permissions")
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
