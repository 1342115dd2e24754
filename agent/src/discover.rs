//! Finding segments in the directory, deciding whether their processes
//! live, and retiring the dead.
//!
//! * A file is a candidate if its name ends in `.pfs`. It is opened with
//!   `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY` (a symlink is refused, never
//!   followed; a FIFO swapped in cannot block the agent) and, checked on
//!   the open descriptor, must be a regular file, not world-writable, owned
//!   as [`Policy::owner`] requires, and at most [`Policy::max_size`] bytes.
//! * A file that fails validation is remembered with its reason, logged
//!   once, counted in `pfs_agent_segment_errors_total{reason}`, and retried
//!   only when it changes (size, times, inode). Removed files are
//!   forgotten, so the memory held is bounded by the directory's entries.
//! * A tracked segment whose file shrinks under the mapping, or whose read
//!   raised `SIGBUS` (see `pfs_shm_layout::sigbus`), is dropped with reason
//!   `shrunk` or `unreadable`; its last good snapshot folds into the
//!   service's retired totals so no counter goes backwards.
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

use std::collections::{HashMap, HashSet};
use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{DirEntryExt, MetadataExt, OpenOptionsExt};
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
    pub last: Option<std::sync::Arc<SegmentSnapshot>>,
    /// Last summaries snapshot (what `/metrics` and OTLP export, and what
    /// retirement folds): carry-forward source, and, once the process is
    /// dead, its final figures.
    pub last_summaries: Option<std::sync::Arc<SegmentSnapshot>>,
    /// Writable mapping for applying setup defaults (when there are any).
    rw: Option<Segment>,
    /// Classes the defaults have been applied to.
    classes_applied: usize,
    /// Inode of the file (a file replaced under the same name differs).
    ino: u64,
}

impl Tracked {
    /// The figures to fold when the segment retires: the last summaries
    /// snapshot, else the last full one.
    fn final_figures(&self) -> Option<&SegmentSnapshot> {
        self.last_summaries.as_deref().or(self.last.as_deref())
    }

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

    /// A snapshot of the segment, refused if the file shrank or the
    /// mapping faulted during the read (the data would be zeros, not the
    /// segment's); the next refresh then drops the segment.
    pub fn snapshot(&self, opts: &ReadOptions) -> Result<SegmentSnapshot, SegmentError> {
        let s = snapshot(&self.segment, opts)?;
        self.segment.check()?;
        Ok(s)
    }
}

/// A file that is not a usable segment.
#[derive(Debug, Clone)]
pub struct Invalid {
    /// Short machine-readable reason (metric label).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    stamp: Stamp,
}

/// What identifies a version of a file: a change to any field (content
/// written, `chown`/`chmod`, replaced by another file) means a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &Metadata) -> Self {
        Self {
            len: m.len(),
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// Who may own an accepted segment file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OwnerPolicy {
    /// Any owner (the directory's permissions decide who can write there).
    #[default]
    Any,
    /// Only the agent's effective uid.
    Uid,
    /// Only a group of the agent (effective or supplementary gid).
    Group,
}

/// Which files are accepted as segments, beyond validation.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Required owner.
    pub owner: OwnerPolicy,
    /// Largest file accepted, bytes. A segment's size bounds the memory
    /// and time one snapshot of it can take; a file claiming more (e.g. a
    /// huge sparse file) is refused with reason `too_large`.
    pub max_size: u64,
}

/// Default [`Policy::max_size`]: 4 GiB (a default pfs-client segment is
/// about 110 MiB, mostly sparse).
pub const DEFAULT_MAX_SEGMENT_SIZE: u64 = 4 << 30;

impl Default for Policy {
    fn default() -> Self {
        Self {
            owner: OwnerPolicy::Any,
            max_size: DEFAULT_MAX_SEGMENT_SIZE,
        }
    }
}

/// The agent's identity, for the owner policy.
#[derive(Debug, Clone)]
struct Identity {
    uid: u32,
    gids: Vec<u32>,
}

impl Identity {
    fn current() -> Self {
        let mut gids = vec![rustix::process::getegid().as_raw()];
        if let Ok(groups) = rustix::process::getgroups() {
            gids.extend(groups.into_iter().map(|g| g.as_raw()));
        }
        Self {
            uid: rustix::process::geteuid().as_raw(),
            gids,
        }
    }
}

/// Files in `not_ready` state this long are reported (once) as stuck
/// (see [`SegmentSet::with_not_ready_grace`]).
const NOT_READY_GRACE: Duration = Duration::from_secs(10);

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
    /// Which files are accepted.
    policy: Policy,
    identity: Identity,
    /// Files still being initialised by their creator: first seen, and
    /// whether the wait was already reported.
    pending: HashMap<PathBuf, (Instant, bool)>,
    not_ready_grace: Duration,
    /// The state file, when retired totals persist.
    store: Option<Store>,
    /// Retired segments whose files may still exist.
    absorbed: Vec<Absorbed>,
}

/// The metric label for a validation error.
pub fn reason(e: &SegmentError) -> &'static str {
    match e {
        SegmentError::Truncated { len: 0, .. } => "empty",
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
        SegmentError::Shrunk { .. } => "shrunk",
        SegmentError::Unreadable => "unreadable",
        SegmentError::Protect(_) => "unprotected",
    }
}

/// Every `reason` label [`SegmentSet`] can count, with its meaning (the
/// documentation's table is checked against this list).
pub const REASONS: &[(&str, &str)] = &[
    ("empty", "zero-length file"),
    (
        "truncated",
        "shorter than its header (or than one header page)",
    ),
    ("bad_magic", "not a pfs segment (random bytes, other files)"),
    ("byte_order", "written by a process of the other byte order"),
    (
        "unsupported_version",
        "layout major version this agent does not read",
    ),
    (
        "corrupt",
        "inconsistent header: offsets, sizes or counts out of range",
    ),
    (
        "not_ready",
        "still not initialised by its creator after 10 s (kept being retried)",
    ),
    ("symlink", "a symbolic link (never followed)"),
    ("not_regular", "a directory, FIFO, socket or device"),
    ("world_writable", "file mode allows writes by any user"),
    (
        "foreign_owner",
        "owner not allowed by --require-owner uid|group",
    ),
    ("too_large", "larger than --max-segment-size"),
    ("shrunk", "file truncated while the agent had it mapped"),
    (
        "unreadable",
        "reading the mapping raised SIGBUS (I/O error, full tmpfs)",
    ),
    (
        "unprotected",
        "the mapping could not be registered for SIGBUS recovery",
    ),
    ("io", "open, stat or mmap failed"),
];

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
            policy: Policy::default(),
            identity: Identity::current(),
            pending: HashMap::new(),
            not_ready_grace: NOT_READY_GRACE,
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

    /// Replaces the acceptance policy (before the first refresh).
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Replaces how long a file may stay `not_ready` before it is
    /// reported (default 10 s).
    pub fn with_not_ready_grace(mut self, grace: Duration) -> Self {
        self.not_ready_grace = grace;
        self
    }

    /// Counts and logs a refused file, remembering it until it changes.
    fn refuse(&mut self, path: &Path, reason: &'static str, message: String, stamp: Stamp) {
        tracing::warn!(path = %path.display(), reason, "refusing segment file: {message}");
        *self.errors.entry(reason).or_default() += 1;
        self.invalid.insert(
            path.to_path_buf(),
            Invalid {
                reason,
                message,
                stamp,
            },
        );
    }

    /// Drops tracked segments whose file shrank or whose mapping faulted.
    fn drop_damaged(&mut self) {
        let damaged: Vec<(PathBuf, SegmentError)> = self
            .tracked
            .iter()
            .filter_map(|(p, t)| t.segment.check().err().map(|e| (p.clone(), e)))
            .collect();
        for (path, e) in damaged {
            let Some(t) = self.tracked.remove(&path) else {
                continue;
            };
            if let Some(last) = t.final_figures() {
                self.retired.absorb(last);
                self.retired_changed();
            }
            let stamp = std::fs::symlink_metadata(&path)
                .map(|m| Stamp::of(&m))
                .unwrap_or(Stamp {
                    len: 0,
                    ino: 0,
                    mtime: (0, 0),
                    ctime: (0, 0),
                });
            let message = format!(
                "{e}; service {:?} pid {} keeps its last exported totals",
                t.segment.service(),
                t.segment.pid()
            );
            self.refuse(&path, reason(&e), message, stamp);
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// One discovery pass: opens new files, re-checks liveness, retires
    /// segments dead for longer than the retention.
    pub fn refresh(&mut self) {
        self.drop_damaged();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list the segment directory; check --shm-dir and its permissions");
                return;
            }
        };
        self.sync_store(false);
        let mut seen = HashSet::new();
        let mut retire = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "pfs") {
                continue;
            }
            seen.insert(path.clone());
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
        self.pending.retain(|p, _| seen.contains(p));
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
        let stamp = Stamp::of(&meta);
        if self.invalid.get(path).is_some_and(|inv| inv.stamp == stamp) {
            return; // unchanged since refused
        }
        let result = if meta.file_type().is_symlink() {
            Err((
                "symlink",
                "is a symbolic link; segments are never followed through links".to_string(),
            ))
        } else if !meta.file_type().is_file() {
            Err(("not_regular", not_regular(&meta)))
        } else {
            self.open_checked(path)
        };
        match result {
            Ok(segment) => {
                tracing::info!(path = %path.display(), service = segment.service(), pid = segment.pid(), "segment found");
                self.invalid.remove(path);
                self.pending.remove(path);
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
                        last_summaries: None,
                        rw,
                        classes_applied: 0,
                        ino: 0,
                    },
                );
            }
            Err(("not_ready", message)) => {
                // Being created: retried every pass; reported once if it
                // stays so (a creator that died mid-initialisation).
                let now = Instant::now();
                let (since, reported) = self
                    .pending
                    .entry(path.to_path_buf())
                    .or_insert((now, false));
                if !*reported && now.duration_since(*since) >= self.not_ready_grace {
                    *reported = true;
                    tracing::warn!(path = %path.display(), reason = "not_ready", "segment file still not initialised after {:?}: {message}; its creator may have died", self.not_ready_grace);
                    *self.errors.entry("not_ready").or_default() += 1;
                }
            }
            Err((reason, message)) => self.refuse(path, reason, message, stamp),
        }
    }

    /// Opens `path` without following links or blocking, applies the
    /// policy to the open descriptor (so a file swapped in after the
    /// `lstat` is judged itself), then validates it.
    fn open_checked(&self, path: &Path) -> Result<Segment, (&'static str, String)> {
        let file = open_nofollow(path).map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                (
                    "symlink",
                    "is a symbolic link; segments are never followed through links".to_string(),
                )
            } else {
                ("io", format!("cannot open the segment: {e}"))
            }
        })?;
        let meta = file
            .metadata()
            .map_err(|e| ("io", format!("cannot stat the segment: {e}")))?;
        if !meta.file_type().is_file() {
            return Err(("not_regular", not_regular(&meta)));
        }
        let mode = meta.mode();
        if mode & 0o002 != 0 {
            return Err((
                "world_writable",
                format!(
                    "has mode {:04o}: any user could write it; segments are created 0600 or 0660 (chmod o-w, or remove it)",
                    mode & 0o7777
                ),
            ));
        }
        match self.policy.owner {
            OwnerPolicy::Any => {}
            OwnerPolicy::Uid if meta.uid() != self.identity.uid => {
                return Err((
                    "foreign_owner",
                    format!(
                        "is owned by uid {}, not the agent's uid {} (--require-owner uid); run the application as the same user or relax --require-owner",
                        meta.uid(),
                        self.identity.uid
                    ),
                ));
            }
            OwnerPolicy::Group if !self.identity.gids.contains(&meta.gid()) => {
                return Err((
                    "foreign_owner",
                    format!(
                        "has group {}, not one of the agent's groups {:?} (--require-owner group); share a group (e.g. fsGroup) or relax --require-owner",
                        meta.gid(),
                        self.identity.gids
                    ),
                ));
            }
            OwnerPolicy::Uid | OwnerPolicy::Group => {}
        }
        if meta.len() > self.policy.max_size {
            return Err((
                "too_large",
                format!(
                    "is {} bytes, more than --max-segment-size {}; raise it if this is a real, very large segment",
                    meta.len(),
                    self.policy.max_size
                ),
            ));
        }
        Segment::open(file, false).map_err(|e| (reason(&e), e.to_string()))
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
            if t.dead_since.is_none() || t.last_summaries.is_none() {
                final_read(&mut t);
            }
            if let Some(s) = t.final_figures() {
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

/// Reads a dead segment one last time into `t.last_summaries` (the
/// figures retirement folds). Rows that cannot be read (their writer died
/// in the middle of an update, leaving the row's sequence odd forever)
/// keep their previous value. Returns true if there were such rows: the
/// segment should then be retired at once, so its last good values are
/// saved.
fn final_read(t: &mut Tracked) -> bool {
    match t.snapshot(&ReadOptions::summaries()) {
        Ok(mut s) => {
            let torn = s.threads.iter().any(|th| !th.skipped_rows.is_empty());
            if torn {
                tracing::info!(path = %t.path.display(), "a writer of this dead process was killed in the middle of an update; its row keeps its last good value");
            }
            if let Some(prev) = &t.last_summaries {
                crate::snapshot::carry_forward_summed(&mut s, prev);
            }
            t.last_summaries = Some(std::sync::Arc::new(s));
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

fn not_regular(meta: &Metadata) -> String {
    let what = if meta.is_dir() {
        "a directory"
    } else {
        "a FIFO, socket or device"
    };
    format!("is {what}, not a regular file")
}

fn open_nofollow(path: &Path) -> std::io::Result<File> {
    use rustix::fs::OFlags;
    OpenOptions::new()
        .read(true)
        .custom_flags((OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY).bits() as i32)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn segment_file(path: &Path) -> File {
        let f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .unwrap();
        let cfg = pfs_shm_layout::SegmentConfig {
            service_name: "unit".into(),
            history_len: 2,
            max_classes: 4,
            max_strings: 4,
            records_per_page: 1,
            max_pages: 1,
            history_long_len: 1,
        };
        let timer = pfs_shm_layout::TimerCalibration {
            kind: 2,
            base_ticks: 0,
            ps_per_tick_q32: 1000 << 32,
            frequency_hz: 1_000_000_000,
            base_ns: 0,
        };
        drop(Segment::create(f.try_clone().unwrap(), &cfg, timer, 1, 0).unwrap());
        f
    }

    #[test]
    fn a_file_stuck_initialising_is_reported_once_and_retried() {
        let dir = tempfile::tempdir().unwrap();
        let f = segment_file(&dir.path().join("stuck.pfs"));
        // state = SEGMENT_INITIALIZING, as a creator that died mid-way.
        f.write_all_at(&0u64.to_le_bytes(), 0x20).unwrap();
        let mut set = SegmentSet::new(dir.path(), Duration::from_secs(60))
            .with_not_ready_grace(Duration::ZERO);
        set.refresh();
        set.refresh();
        set.refresh();
        assert_eq!(set.errors.get("not_ready"), Some(&1), "{:?}", set.errors);
        assert!(set.tracked.is_empty() && set.invalid.is_empty());
        // Finished after all: it is picked up on the next pass.
        f.write_all_at(&1u64.to_le_bytes(), 0x20).unwrap();
        set.refresh();
        assert_eq!(set.tracked.len(), 1);
        assert!(set.pending.is_empty());
    }

    #[test]
    fn a_refused_file_is_retried_when_chmod_fixes_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ww.pfs");
        drop(segment_file(&p));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut set = SegmentSet::new(dir.path(), Duration::from_secs(60));
        set.refresh();
        set.refresh();
        assert_eq!(set.errors.get("world_writable"), Some(&1));
        assert_eq!(set.invalid[&p].reason, "world_writable");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        set.refresh();
        assert_eq!(set.tracked.len(), 1, "ctime changed: retried and accepted");
        assert!(set.invalid.is_empty());
    }

    #[test]
    fn every_reason_is_listed_and_documented() {
        let samples = [
            SegmentError::Truncated { len: 0, need: 1 },
            SegmentError::Truncated { len: 1, need: 2 },
            SegmentError::BadMagic(0),
            SegmentError::ByteOrder(0),
            SegmentError::UnsupportedVersion {
                found: 9,
                supported: 2,
            },
            SegmentError::NotReady,
            SegmentError::Corrupt(String::new()),
            SegmentError::Shrunk { len: 0, need: 1 },
            SegmentError::Unreadable,
            SegmentError::Protect(String::new()),
            SegmentError::Io("x", std::io::Error::other("x")),
        ];
        let listed: Vec<&str> = REASONS.iter().map(|(r, _)| *r).collect();
        for e in &samples {
            assert!(listed.contains(&reason(e)), "{} not in REASONS", reason(e));
        }
        let doc = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/SECURITY-segments.md"),
        )
        .unwrap();
        for (r, meaning) in REASONS {
            let row = format!("| `{r}` | {} |", meaning.replace('|', "\\|"));
            assert!(doc.contains(&row), "docs/SECURITY-segments.md lacks {row}");
        }
    }
}
