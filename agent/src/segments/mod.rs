//! Layer 3: the segment directory. Finds the segment files, decides
//! whether their processes live, and retires the dead. One concern per
//! submodule: [`refusal`] (why a file is not exported), [`listing`] (why
//! the directory cannot be listed), [`policy`] (which files are accepted), [`liveness`] (`flock`), [`tracked`] (a segment
//! being exported), [`retirement`] (folding the dead into retired totals), [`volume`] (the space left);
//! this module runs the discovery pass over them.
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
//! * A directory that cannot be listed (other than not existing yet; one
//!   removed while segments found in it are still tracked is reason
//!   `removed`) is logged, counted at every pass in
//!   `pfs_agent_discovery_errors_total{reason}`, and reported by
//!   [`SegmentSet::list_failure`] while it lasts (`/healthz` adds a
//!   `degraded:` line, still 200, as for the other
//!   [`SegmentSet::problems`]).
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
//! * A read that finds the global section locked by one unfinished fold
//!   (`global_lock_stuck`) is retried while the process lives; once it is
//!   dead, the section is read as it is and flagged as possibly torn (see
//!   [`tracked`]). A dead segment that could never be read is never
//!   retired: its file is kept, tracked, and listed as invalid.
//! * A file being created (header still zeros, or not marked ready) is
//!   retried silently for the not-ready grace, then reported, counted and
//!   listed as invalid, and still retried.
//! * A file replaced under the same name (a restarted process that got the
//!   same pid, as in a container) is noticed by its inode: the old segment
//!   is retired at once and the new one tracked.
//! * With [`SegmentSet::persist`] the retired totals survive an agent
//!   restart and only the directory's owning agent retires (see
//!   [`crate::retired`]).
//! * With setup defaults ([`crate::setup::Defaults`]), each new segment
//!   gets them through a writable mapping, and instruments registered later
//!   get them at the next pass.

pub mod listing;
pub mod liveness;
pub mod policy;
pub mod refusal;
mod retirement;
pub mod tracked;
pub mod volume;

use std::collections::{HashMap, HashSet};
use std::fs::Metadata;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pfs_shm_layout::SegmentError;

use crate::aggregate::{EndSeen, Retired};
use crate::retired::Role;
use crate::setup::Defaults;
pub use listing::{ListError, ListFailure};
pub use liveness::owner_is_dead;
pub use policy::{DEFAULT_MAX_SEGMENT_SIZE, OwnerPolicy, Policy};
pub use refusal::{Refusal, Refused};
use retirement::{Retirement, remove_retired};
pub use tracked::Tracked;

/// A file that is not a usable segment.
#[derive(Debug, Clone)]
pub struct Invalid {
    /// Why.
    pub reason: Refusal,
    /// Human-readable message.
    pub message: String,
    stamp: Stamp,
}

/// What identifies a version of a file: a change to any field (content
/// written, `chown`/`chgrp`/`chmod`, replaced by another file) means a
/// retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Stamp {
    len: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
}

impl Stamp {
    fn of(m: &Metadata) -> Self {
        Self {
            len: m.len(),
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            nlink: m.nlink(),
        }
    }

    /// What a refusal for `reason` is kept for: the whole stamp, or, for
    /// a refusal that does not depend on the content, the file's identity,
    /// type, owner, mode and links only (a live process's writes move its
    /// length and times; refused again at each, it was logged and counted
    /// every ~30 s).
    fn for_reason(self, reason: Refusal) -> Self {
        if reason.depends_on_content() {
            self
        } else {
            Self {
                len: 0,
                mtime: (0, 0),
                ctime: (0, 0),
                ..self
            }
        }
    }
}

/// How long a follower reads on a dead process's segment whose file
/// someone else removed (the owner saves its totals, as pending, when it
/// finds the death: within a discovery pass or two).
const FOLLOWER_GRACE: Duration = Duration::from_secs(10);

/// Files in `not_ready` state this long are reported (once) as stuck
/// (see [`SegmentSet::with_not_ready_grace`]).
const NOT_READY_GRACE: Duration = Duration::from_secs(10);

/// How long a dead process's segment stays exported before it is retired
/// when nothing else is said (`serve --dead-retention`, whose default
/// text `5m` a test keeps equal to this).
pub const DEFAULT_DEAD_RETENTION: Duration = Duration::from_secs(300);

/// How long a service's retired totals stay exported once none of its
/// processes is seen (`serve --forget-retired-after`, whose default text
/// `24h` a test keeps equal to this).
pub const DEFAULT_FORGET_RETIRED_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Every segment file of one directory.
#[derive(Debug)]
pub struct SegmentSet {
    dir: PathBuf,
    dead_retention: Duration,
    /// See [`SegmentSet::with_forget_retired_after`].
    forget_retired_after: Option<Duration>,
    /// Live and recently dead segments, by path.
    pub tracked: HashMap<PathBuf, Tracked>,
    /// The tracked paths gone from the last listing (sorted): a follower
    /// reloads the state when they change.
    vanished_last: Vec<PathBuf>,
    /// [`FOLLOWER_GRACE`] (shorter in tests).
    follower_grace: Duration,
    /// Files refused, by path.
    pub invalid: HashMap<PathBuf, Invalid>,
    /// Count of segment errors by reason (monotonic).
    pub errors: HashMap<Refusal, u64>,
    /// Count of discovery passes that could not list the directory, by
    /// reason (monotonic; a directory not there yet is not counted).
    pub list_errors: HashMap<ListFailure, u64>,
    /// Setup defaults applied to every segment.
    pub defaults: Defaults,
    retirement: Retirement,
    /// Which files are accepted.
    policy: Policy,
    identity: policy::Identity,
    /// Files still being initialised by their creator: first seen, and
    /// whether the wait was already reported.
    pending: HashMap<PathBuf, (Instant, bool)>,
    not_ready_grace: Duration,
    /// The last failure to list the directory, and when it was logged
    /// (logged again only when it changes, or every [`RELOG_AFTER`]).
    list_error: Option<(String, Instant)>,
    /// The current failure to list the directory, unless it is only not
    /// there (see [`SegmentSet::list_failure`]).
    list_failure: Option<ListError>,
    /// Whether that failure is the directory not existing while no
    /// segment was ever found in it: a sidecar started before its
    /// application, which `serve` says once at start, not a problem to
    /// warn about at every pass.
    dir_absent: bool,
    /// The directory's volume at the last pass (`None` before the
    /// directory exists).
    pub volume: Option<volume::Volume>,
    /// Whether a pass has listed the directory: a segment found after
    /// that belongs to a process that started since.
    listed_once: bool,
    /// Whether what a dead process was doing when it ended is logged
    /// (the server's set; not `query`'s, which would say it again at
    /// every run).
    report_deaths: bool,
}

/// How often a failure that persists is logged again.
const RELOG_AFTER: Duration = Duration::from_secs(300);

impl SegmentSet {
    /// An empty set over `dir`; dead segments are exported for
    /// `dead_retention`, then retired.
    pub fn new(dir: impl Into<PathBuf>, dead_retention: Duration) -> Self {
        let dir = dir.into();
        Self {
            retirement: Retirement::new(&dir),
            dir,
            dead_retention,
            forget_retired_after: Some(DEFAULT_FORGET_RETIRED_AFTER),
            tracked: HashMap::new(),
            vanished_last: Vec::new(),
            follower_grace: FOLLOWER_GRACE,
            invalid: HashMap::new(),
            errors: HashMap::new(),
            list_errors: HashMap::new(),
            defaults: Defaults::default(),
            policy: Policy::default(),
            identity: policy::Identity::current(),
            pending: HashMap::new(),
            not_ready_grace: NOT_READY_GRACE,
            list_error: None,
            list_failure: None,
            dir_absent: false,
            volume: None,
            report_deaths: true,
            listed_once: false,
        }
    }

    /// Does not log what dead processes were doing when they ended (for a
    /// one-shot reader such as `query`, which has no memory of having
    /// said it before; the serving agent says it once per death).
    pub fn without_death_reports(mut self) -> Self {
        self.report_deaths = false;
        self
    }

    /// Keeps the retired totals in the directory's state file (loaded now,
    /// written at every retirement), so an agent restart loses none.
    ///
    /// Under `--require-owner` (a policy other than [`OwnerPolicy::Any`]),
    /// only a state file owned by this agent's user is read.
    pub fn persist(mut self) -> Self {
        let own = self.own_files_only();
        self.retirement.persist(own);
        self.forget_absorbed();
        self
    }

    /// Whether the agent trusts only files of its own user among its
    /// state in the directory (retired totals, `TRUNCATE` baselines): under
    /// `--require-owner`, a policy other than [`OwnerPolicy::Any`].
    pub fn own_files_only(&self) -> bool {
        self.policy.owner != OwnerPolicy::Any
    }

    /// Replaces how long a service's retired totals stay exported after
    /// its last segment was retired, while no segment of it is in the
    /// directory (`None`: for ever). Past it they are forgotten, so that
    /// an agent over a directory that sees many short-lived services
    /// (every instrumented command run on a host) does not export them
    /// for ever.
    pub fn with_forget_retired_after(mut self, after: Option<Duration>) -> Self {
        self.forget_retired_after = after;
        self
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

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Why the last pass could not list the directory, if it could not
    /// for another reason than the directory not existing (a sidecar
    /// started before its application waits for it): no new process can
    /// be found while this lasts.
    pub fn list_failure(&self) -> Option<&ListError> {
        self.list_failure.as_ref()
    }

    /// What is wrong that a restart of the agent would not fix, one line
    /// each, for `/healthz`: the directory cannot be listed; segment files
    /// the agent may not read (processes it cannot export); the retired
    /// totals cannot be saved (dead segments' files are kept); the volume
    /// is full. Each is also a metric and logged.
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self.list_failure.iter().map(ToString::to_string).collect();
        let mut denied: Vec<(&PathBuf, &Invalid)> = (self.invalid.iter())
            .filter(|(_, i)| i.reason == Refusal::PermissionDenied)
            .collect();
        denied.sort_by_key(|(p, _)| *p);
        if let Some((path, first)) = denied.first() {
            out.push(format!(
                "{} segment file(s) the agent may not read, so their processes are not exported: {}: {}",
                denied.len(),
                crate::util::shown::path(path),
                first.message
            ));
        }
        if let Some(error) = self.retirement.save_failure() {
            out.push(format!(
                "cannot save the retired totals in {} ({error}): dead processes' segment files are kept until it can; see the agent's log for what to do",
                self.dir.display()
            ));
        }
        if let Some(v) = self.volume.filter(volume::Volume::is_full) {
            out.push(v.full_message(&self.dir));
        }
        out
    }

    /// Warns when `segment` (just found at `path`) has the service and
    /// pid of another live process's: two containers of one pod running
    /// the same program, each pid 1 of its own namespace. `/metrics` adds
    /// them up rightly, but their rows in the tables look alike (same
    /// `SERVICE`, `PID` and `THREAD_ID`s) and a `pid` filter takes both.
    fn warn_if_alike(&self, path: &Path, segment: &pfs_shm_layout::Segment) {
        if let Some(other) = self.alike(path, segment) {
            let (service, pid) = (segment.service(), segment.pid());
            tracing::warn!(
                path = %crate::util::shown::path(path),
                other = %crate::util::shown::path(&other.path),
                "two live processes of service {service:?} have pid {pid} (containers of one pod, each pid 1 of its own namespace?): /metrics adds them up rightly, but their rows in the tables look alike (same SERVICE, PID and THREAD_IDs) and a pid filter takes both; give each container its own PFS_SERVICE_NAME"
            );
        }
    }

    /// The live process already tracked whose service and pid are
    /// `segment`'s (see [`SegmentSet::warn_if_alike`]).
    fn alike(&self, path: &Path, segment: &pfs_shm_layout::Segment) -> Option<&Tracked> {
        if owner_is_dead(segment.file()) {
            return None; // a dead predecessor, found after its successor
        }
        let (service, pid) = (segment.service(), segment.pid());
        self.tracked.values().find(|t| {
            t.path != path
                && t.dead_since.is_none()
                && t.segment.pid() == pid
                && t.segment.service() == service
                && !owner_is_dead(t.segment.file())
        })
    }

    /// Whether the last save of the retired totals failed (with
    /// persistence): dead segments' files are kept meanwhile.
    pub fn state_unsaved(&self) -> bool {
        self.retirement.save_failure().is_some()
    }

    /// This agent's role on the directory (`Owner` without persistence).
    pub fn role(&self) -> Role {
        self.retirement.role()
    }

    /// Totals of retired (dead and removed) segments, by service.
    pub fn retired(&self) -> &Retired {
        &self.retirement.retired
    }

    /// Segments retired so far.
    pub fn retired_segments(&self) -> u64 {
        self.retirement.retired_segments
    }

    /// Segments the state counts already are not exported again.
    fn forget_absorbed(&mut self) {
        let r = &self.retirement;
        self.tracked.retain(|_, t| !r.is_absorbed(&t.identity()));
    }

    fn sync_state(&mut self, force: bool) {
        if self.retirement.sync(force) {
            self.forget_absorbed();
        }
    }

    /// Counts and logs a refused file, remembering it until it changes. The
    /// same file refused again for the same reason after it changed (a
    /// newer application's segment, refused for its version as it is
    /// created and again once marked ready) is neither logged nor counted
    /// again: `pfs_agent_segment_errors_total` counts files.
    fn refuse(&mut self, path: &Path, refused: Refused, stamp: Stamp) {
        let Refused { reason, message } = refused;
        self.pending.remove(path);
        let again = self
            .invalid
            .get(path)
            .is_some_and(|inv| inv.reason == reason && inv.stamp.ino == stamp.ino);
        if !again {
            tracing::warn!(path = %crate::util::shown::path(path), reason = reason.label(), "refusing segment file: {message}");
            *self.errors.entry(reason).or_default() += 1;
        }
        self.invalid.insert(
            path.to_path_buf(),
            Invalid {
                reason,
                message,
                stamp: stamp.for_reason(reason),
            },
        );
    }

    /// Logs and counts (once each) the tracked segments whose global
    /// section was found stuck by a read: at once for a dead process, after
    /// the not-ready grace for a live one (see [`Tracked::snapshot`]).
    pub fn report_stuck(&mut self) {
        let grace = self.not_ready_grace;
        let n = self
            .tracked
            .values_mut()
            .filter_map(|t| t.report_stuck(grace).then_some(()))
            .count() as u64;
        if n > 0 {
            *self.errors.entry(Refusal::GlobalLockStuck).or_default() += n;
        }
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
            self.retirement.absorb(&t);
            let stamp = std::fs::symlink_metadata(&path)
                .map(|m| Stamp::of(&m))
                .unwrap_or_default();
            let message = format!(
                "{e}; service {:?} pid {} keeps its last exported totals",
                t.segment.service(),
                t.segment.pid()
            );
            self.refuse(&path, Refused::new(Refusal::of(&e), message), stamp);
        }
    }

    /// One discovery pass: opens new files, re-checks liveness, retires
    /// segments dead for longer than the retention.
    pub fn refresh(&mut self) {
        self.drop_damaged();
        self.volume = volume::Volume::of(&self.dir);
        let mut seen = HashSet::new();
        let mut retire = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => {
                self.list_failure = None;
                let absent = std::mem::take(&mut self.dir_absent);
                if self.list_error.take().is_some() {
                    if absent {
                        tracing::info!(dir = %crate::util::shown::path(&self.dir), "the segment directory exists now");
                    } else {
                        tracing::info!(dir = %crate::util::shown::path(&self.dir), "the segment directory can be listed again");
                    }
                }
                Some(e)
            }
            Err(e) => {
                let msg = e.to_string();
                let relog = self
                    .list_error
                    .as_ref()
                    .is_none_or(|(m, at)| *m != msg || at.elapsed() >= RELOG_AFTER);
                // Not there yet, and nothing found in it before: waiting
                // is normal (`serve` said so at start).
                let found_before = !self.tracked.is_empty();
                self.dir_absent = e.kind() == std::io::ErrorKind::NotFound && !found_before;
                self.list_failure = ListFailure::of(&e, found_before).map(|reason| ListError {
                    dir: self.dir.clone(),
                    reason,
                    error: msg.clone(),
                });
                if let Some(f) = &self.list_failure {
                    *self.list_errors.entry(f.reason).or_default() += 1;
                }
                if relog {
                    if self.dir_absent {
                        tracing::debug!(dir = %crate::util::shown::path(&self.dir), "the segment directory does not exist yet; waiting for an instrumented process to create it");
                    } else {
                        let advice = ListFailure::of(&e, found_before)
                            .map_or("check --shm-dir (or PFS_SHM_DIR)", ListFailure::advice);
                        tracing::warn!(dir = %crate::util::shown::path(&self.dir), error = %e, tracked = self.tracked.len(), "cannot list the segment directory, so no new process is found (the segments already found are still read, and their processes' exits still noticed); {advice}");
                    }
                    self.list_error = Some((msg, Instant::now()));
                }
                // No discovery this pass; the tracked segments are not
                // "vanished" (the listing failed, not the files), and their
                // liveness is checked through the files they hold below.
                seen.extend(self.tracked.keys().cloned());
                None
            }
        };
        let listed = entries.is_some();
        if listed {
            self.sync_state(false);
        }
        for entry in entries.into_iter().flatten().flatten() {
            let path = entry.path();
            if !pfs_shm_layout::files::is_segment_file(&path) {
                continue;
            }
            seen.insert(path.clone());
            if let Some(t) = self.tracked.get(&path) {
                if t.ino == entry.ino() {
                    continue;
                }
                // Replaced under the same name: retire the old one now.
                tracing::info!(path = %crate::util::shown::path(&path), "segment file replaced by a new process; retiring the old one");
                retire.push(self.tracked.remove(&path).expect("tracked"));
            }
            if self
                .retirement
                .was_absorbed(&entry.file_name(), entry.ino())
            {
                // Retired already (by an agent that died before removing
                // it, or whose removal failed and was logged, or dropped
                // damaged with its totals kept).
                if self.role() == Role::Owner {
                    match std::fs::remove_file(&path) {
                        Ok(()) => {
                            tracing::info!(path = %crate::util::shown::path(&path), "removed a segment file whose totals are kept already (retired, or dropped as damaged)")
                        }
                        Err(e) => {
                            tracing::debug!(path = %crate::util::shown::path(&path), error = %e, "cannot remove a retired segment file")
                        }
                    }
                }
                continue;
            }
            self.consider(&path);
            self.adopt(&path, entry.ino());
        }
        // Files removed behind our back (by an operator, or the owning
        // agent): known only from a listing.
        if self.list_error.is_none() {
            self.invalid.retain(|p, _| seen.contains(p));
            self.pending.retain(|p, _| seen.contains(p));
        }
        let mut vanished: Vec<PathBuf> = self
            .tracked
            .keys()
            .filter(|p| !seen.contains(*p))
            .cloned()
            .collect();
        vanished.sort();
        if !vanished.is_empty() && self.role() == Role::Follower {
            // The owner writes the state before removing a dead process's
            // file: reloaded (once per change of what vanished), the state
            // drops what it counts. A file someone else removed is read on
            // while its process runs (its flock), and for a grace after it
            // died (the owner keeps its totals by then, as pending), then
            // dropped: never kept for good, whatever the owner saw.
            if vanished != self.vanished_last {
                self.sync_state(true);
            }
            let (now, grace) = (Instant::now(), self.follower_grace);
            self.tracked.retain(|p, t| {
                seen.contains(p) || t.dead_since.is_none_or(|d| now.duration_since(d) < grace)
            });
        }
        self.vanished_last = vanished;
        let now = Instant::now();
        let owner = self.role() == Role::Owner;
        // Retiring a torn segment at once only helps when it is saved.
        let persist = self.retirement.persists();
        let mut expired = Vec::new();
        for (path, t) in &mut self.tracked {
            if !seen.contains(path) && t.dead_since.is_none() && !t.unlinked_reported {
                // Gone from the listing: removed (a temporary-file
                // cleaner, an operator), or its directory replaced. Its
                // process's death is still told by its flock, below; while
                // it runs, it writes the open file, which is read.
                t.unlinked_reported = true;
                if !owner_is_dead(t.segment.file()) {
                    tracing::warn!(path = %crate::util::shown::path(path), service = t.segment.service(), pid = t.segment.pid(), "segment file removed from the directory while its process runs (or the directory was replaced): still read through the file the agent holds, and retired once the process exits; a restarted agent will not find it. Do not clean the segment directory of live processes' files");
                }
            }
            let mut torn = false;
            let dead = t.dead_since.is_some() || owner_is_dead(t.segment.file());
            if !dead {
                t.seen_alive = true;
            } else if t.dead_since.is_none() {
                // Found dead by an agent before this one (a restart): its
                // retention runs from then, not from now.
                let found = self.retirement.died_unix_ns(&t.identity());
                t.dead_since = Some(found.map_or(now, |ns| instant_of(now, ns)));
                if found.is_some() {
                    tracing::info!(path = %crate::util::shown::path(path), service = t.segment.service(), "a process found dead before this agent started; keeping its final counters for the rest of the retention period");
                } else {
                    tracing::info!(path = %crate::util::shown::path(path), service = t.segment.service(), "process exited; keeping its final counters for the retention period");
                }
                torn = t.final_read();
                // Its end seen as it happened, or found after the fact
                // (it ended while no agent ran): then when is not known.
                let seen = |s: &pfs_shm_layout::reader::SegmentSnapshot| {
                    if t.seen_alive {
                        EndSeen::At(s.timer.now_ps())
                    } else {
                        EndSeen::Unknown
                    }
                };
                if found.is_none()
                    && self.report_deaths
                    && let Some(s) = t.final_figures()
                    && let Some(what) = crate::aggregate::ended_in_progress(s, seen(s))
                {
                    // What it was doing when it ended: a crash's or a
                    // kill's last requests, which the tables (live
                    // processes only) no longer show. Waits alone (workers
                    // blocked in I/O at an `exit`) may be a normal end.
                    let (path, service, pid) = (
                        crate::util::shown::path(path),
                        t.segment.service(),
                        t.segment.pid(),
                    );
                    let text = &what.text;
                    if what.work {
                        tracing::warn!(path = %path, service, pid, "the process ended with work in progress (killed or crashed, or exited without ending its statements); the last event of each thread: {text}");
                    } else {
                        tracing::info!(path = %path, service, pid, "the process ended with threads in waits (killed or crashed, or exited while they waited); the last event of each thread: {text}");
                    }
                }
                self.retirement.pend(t);
            }
            if owner
                && ((torn && persist)
                    || t.dead_since
                        .is_some_and(|d| now.duration_since(d) >= self.dead_retention))
            {
                expired.push(path.clone());
            }
        }
        // Past the dead segments whose totals the state keeps aside, the
        // longest dead are retired early.
        let excess = self
            .retirement
            .pending()
            .saturating_sub(retirement::MAX_PENDING + expired.len());
        if owner && excess > 0 {
            let mut dead: Vec<(Instant, &PathBuf)> = self
                .tracked
                .iter()
                .filter(|(p, _)| !expired.contains(p))
                .filter_map(|(p, t)| Some((t.dead_since?, p)))
                .collect();
            dead.sort();
            let early: Vec<PathBuf> = dead
                .iter()
                .take(excess)
                .map(|(_, p)| (*p).clone())
                .collect();
            expired.extend(early);
        }
        for path in expired {
            if let Some(t) = self.tracked.remove(&path) {
                retire.push(t);
            }
        }
        // Retired now: reported (if their final read found a stuck lock)
        // before they leave the set.
        let grace = self.not_ready_grace;
        let stuck = retire
            .iter_mut()
            .map(|t| u64::from(t.report_stuck(grace)))
            .sum::<u64>();
        if stuck > 0 {
            *self.errors.entry(Refusal::GlobalLockStuck).or_default() += stuck;
        }
        for t in self.retirement.retire(retire) {
            self.tracked.insert(t.path.clone(), t);
        }
        if self.list_error.is_none() {
            let tracked = &self.tracked;
            self.retirement
                .claim(|id| tracked.values().any(|t| t.identity() == *id));
            // Not while a file is being created: its process's service is
            // not known yet, and may be one of them.
            if let (true, true, Some(after)) =
                (owner, self.pending.is_empty(), self.forget_retired_after)
            {
                self.retirement.forget_idle(
                    |svc| tracked.values().any(|t| t.segment.service() == svc),
                    after,
                );
            }
        }
        self.report_stuck();
        for t in self.tracked.values_mut().filter(|t| t.dead_since.is_none()) {
            if let Some(applied) = &mut t.defaults {
                applied.catch_up(&self.defaults);
            }
        }
        self.listed_once |= listed;
    }

    fn consider(&mut self, path: &Path) {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(_) => return, // vanished
        };
        let stamp = Stamp::of(&meta);
        if self
            .invalid
            .get(path)
            .is_some_and(|inv| inv.stamp == stamp.for_reason(inv.reason))
            && !self.pending.contains_key(path)
        {
            return; // unchanged since refused (files still being created are retried)
        }
        let first_name = self
            .tracked
            .values()
            .find(|t| t.ino == meta.ino() && t.path != path)
            .map(|t| t.path.clone());
        let result = if meta.file_type().is_symlink() {
            Err(policy::symlink())
        } else if !meta.file_type().is_file() {
            Err(policy::not_regular(&meta))
        } else if let Some(first) = first_name {
            Err(policy::duplicate(&first))
        } else {
            self.policy.open(path, &self.identity)
        };
        match result {
            Ok(segment) => {
                tracing::info!(path = %crate::util::shown::path(path), service = segment.service(), pid = segment.pid(), "segment found");
                self.warn_if_alike(path, &segment);
                self.invalid.remove(path);
                self.pending.remove(path);
                let defaults = self.defaults.attach(path);
                let mut t = Tracked::new(segment, path.to_path_buf(), defaults);
                // Found after a listing that did not have it: its process
                // started since, so an end found now is seen within a
                // pass of it, even if no pass saw it alive.
                t.seen_alive = self.listed_once;
                self.tracked.insert(path.to_path_buf(), t);
            }
            Err(Refused {
                reason: reason @ (Refusal::NotReady | Refusal::Empty),
                message,
            }) => {
                // Being created (empty: created, not sized yet; sized,
                // header not written yet, or not marked ready): retried
                // every pass, silently. If it is a creator's (not empty)
                // and stays so past the grace with no process holding it,
                // its creator died while creating it: the agent that owns
                // the directory removes it. Otherwise reported once,
                // counted and listed as invalid past the grace, still
                // retried.
                let now = Instant::now();
                let since = self
                    .pending
                    .entry(path.to_path_buf())
                    .or_insert((now, false))
                    .0;
                let overdue = now.duration_since(since) >= self.not_ready_grace;
                // (An empty file is not known to be a creator's: it may be
                // an operator's; it is reported, never removed.)
                if overdue
                    && reason == Refusal::NotReady
                    && self.role() == Role::Owner
                    && abandoned(path)
                {
                    match std::fs::remove_file(path) {
                        Ok(()) => {
                            tracing::info!(path = %crate::util::shown::path(path), "removed a segment file whose creator died while creating it (no process holds it)")
                        }
                        Err(e) => {
                            tracing::warn!(path = %crate::util::shown::path(path), error = %e, "cannot remove a segment file whose creator died while creating it; remove it")
                        }
                    }
                    self.pending.remove(path);
                    self.invalid.remove(path);
                    return;
                }
                let (_, reported) = self.pending.get_mut(path).expect("inserted above");
                if !*reported && overdue {
                    *reported = true;
                    let message = format!(
                        "still not initialised after {:?}: {message}; its creator may have died (the file is retried every pass; remove it if no process is starting)",
                        self.not_ready_grace
                    );
                    tracing::warn!(path = %crate::util::shown::path(path), reason = reason.label(), "segment file {message}");
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
            }
            Err(refused) => self.refuse(path, refused, stamp),
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
        if self.retirement.is_absorbed(&id) {
            self.tracked.remove(path);
            if self.role() == Role::Owner {
                remove_retired(path, id.ino);
            }
        }
    }
}

/// Whether nobody holds the lock of the file at `path` (a segment's
/// creator locks it right after creating it, for its whole life).
fn abandoned(path: &Path) -> bool {
    matches!(crate::util::fs::open_regular(path), Ok(Some((f, _))) if owner_is_dead(&f))
}

/// The instant, on the clock of `now`, of `unix_ns` (ns since the epoch,
/// in the past): `now` if it is not in the past, the earliest instant this
/// clock has if it is before it.
fn instant_of(now: Instant, unix_ns: u64) -> Instant {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let ago = Duration::from_nanos(wall.saturating_sub(unix_ns));
    now.checked_sub(ago).unwrap_or_else(|| {
        // Before this clock's origin (the machine's boot): as far back as
        // it goes.
        let mut back = ago;
        loop {
            back /= 2;
            if let Some(t) = now.checked_sub(back) {
                return t;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// A small segment at `path`, its lock held (by the returned writer's
    /// file) if `held`.
    fn segment(path: &Path, held: bool) -> (std::fs::File, pfs_shm_layout::SegmentWriter) {
        crate::testing::segment_at(path, &crate::testing::tiny_config("unit"), 1, held)
    }

    /// A small segment at `path` that nobody holds.
    fn segment_file(path: &Path) -> std::fs::File {
        segment(path, false).0
    }

    /// Two live processes of one service and pid (two containers of a
    /// pod) are told alike; a dead predecessor of the same pid is not.
    #[test]
    fn live_processes_alike_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second, third) = (
            dir.path().join("unit.1.pfs"),
            dir.path().join("unit.1.1.pfs"),
            dir.path().join("unit.1.2.pfs"),
        );
        let _a = segment(&first, true);
        let mut set = SegmentSet::new(dir.path(), Duration::from_secs(3600));
        set.refresh();
        let _b = segment(&second, true);
        let open = |set: &SegmentSet, p: &Path| set.policy.open(p, &set.identity).unwrap();
        let b = open(&set, &second);
        assert_eq!(set.alike(&second, &b).map(|t| &t.path), Some(&first));
        drop(_a); // the first one's process exits
        assert!(set.alike(&second, &b).is_none(), "a dead predecessor");
        // Found after the live one (an agent restarted meanwhile): a dead
        // predecessor is not alike either.
        let _c = segment(&third, false);
        let c = open(&set, &third);
        set.refresh();
        assert!(set.alike(&third, &c).is_none(), "a dead one found late");
        let fourth = dir.path().join("unit.1.3.pfs");
        let _d = segment(&fourth, true);
        let d = open(&set, &fourth);
        set.refresh();
        assert_eq!(set.alike(&fourth, &d).map(|t| &t.path), Some(&second));
    }

    /// Dead segments' totals kept aside in the state file are bounded:
    /// past [`retirement::MAX_PENDING`], the longest dead are retired
    /// before their retention ends, their counts folded exactly once.
    #[test]
    fn dead_segments_kept_aside_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let n = retirement::MAX_PENDING + 8;
        for pid in 0..n {
            crate::testing::dead_segment(dir.path(), "svc", 100 + pid as u32, 2);
        }
        let mut set = SegmentSet::new(dir.path(), Duration::from_secs(3600)).persist();
        set.refresh();
        assert_eq!(set.retired_segments(), 8);
        assert_eq!(set.tracked.len(), retirement::MAX_PENDING);
        let retired = &set.retired().by_service["svc"].classes["wait/synch/mutex/t/a"].1;
        assert_eq!(retired.count, 16);
        let state: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(crate::retired::STATE_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(
            state["pending"].as_array().map(Vec::len),
            Some(retirement::MAX_PENDING)
        );
        set.refresh();
        assert_eq!(set.retired_segments(), 8, "stable");
    }

    /// A service none of whose segments is left is forgotten once its
    /// last one was retired longer ago than `--forget-retired-after`; one
    /// with a segment in the directory never is; the state file says the
    /// same, and `never` keeps everything.
    #[test]
    fn a_service_with_no_process_left_is_forgotten_after_a_while() {
        let dir = tempfile::tempdir().unwrap();
        crate::testing::dead_segment(dir.path(), "gone", 100, 2);
        crate::testing::dead_segment(dir.path(), "stays", 101, 2);
        let after = Duration::from_millis(300);
        let mut set = SegmentSet::new(dir.path(), Duration::ZERO)
            .with_forget_retired_after(Some(after))
            .persist();
        set.refresh();
        assert_eq!(set.retired_segments(), 2);
        let services = |set: &SegmentSet| -> Vec<String> {
            set.retired().by_service.keys().cloned().collect()
        };
        assert_eq!(services(&set), ["gone", "stays"]);
        // A live process of `stays` appears.
        let (_held, _w) = crate::testing::segment_at(
            &dir.path().join("stays.102.pfs"),
            &crate::testing::tiny_config("stays"),
            102,
            true,
        );
        std::thread::sleep(after + Duration::from_millis(100));
        set.refresh();
        assert_eq!(services(&set), ["stays"], "the one with a process kept");
        let state = std::fs::read_to_string(dir.path().join(crate::retired::STATE_FILE)).unwrap();
        assert!(
            !state.contains("\"gone\"") && state.contains("\"stays\""),
            "{state}"
        );
        // A restarted agent agrees; with `never`, nothing goes.
        drop(set);
        crate::testing::dead_segment(dir.path(), "gone", 103, 2);
        let mut set = SegmentSet::new(dir.path(), Duration::ZERO)
            .with_forget_retired_after(None)
            .persist();
        set.refresh();
        std::thread::sleep(after + Duration::from_millis(100));
        set.refresh();
        assert_eq!(services(&set), ["gone", "stays"]);
        let gone = &set.retired().by_service["gone"].classes["wait/synch/mutex/t/a"].1;
        assert_eq!(gone.count, 2, "counted from zero when it came back");
    }

    /// Totals from a state file that did not say when they were last
    /// retired (an older agent's) are stamped when loaded, and saved at
    /// once: restarts do not keep postponing their forgetting.
    #[test]
    fn retired_totals_without_a_time_are_stamped_and_saved() {
        let dir = tempfile::tempdir().unwrap();
        crate::testing::dead_segment(dir.path(), "old", 100, 2);
        let mut set = SegmentSet::new(dir.path(), Duration::ZERO).persist();
        set.refresh();
        drop(set);
        let path = dir.path().join(crate::retired::STATE_FILE);
        let mut state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let old = state["services"]["old"].as_object_mut().unwrap();
        assert!(old.remove("last_retired_unix_ns").is_some());
        std::fs::write(&path, serde_json::to_vec(&state).unwrap()).unwrap();
        let mut set = SegmentSet::new(dir.path(), Duration::ZERO).persist();
        set.refresh();
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let t = state["services"]["old"]["last_retired_unix_ns"].as_u64();
        assert!(t.is_some_and(|t| t > 0), "{state}");
        assert_eq!(set.retired().by_service["old"].classes.len(), 1);
    }

    #[test]
    fn a_file_stuck_initialising_is_reported_once_and_retried() {
        let dir = tempfile::tempdir().unwrap();
        // Its creator still holds it (a slow or stopped one).
        let (f, _w) = segment(&dir.path().join("stuck.pfs"), true);
        // state = SEGMENT_INITIALIZING, as a creator that died mid-way.
        f.write_all_at(&0u64.to_le_bytes(), 0x20).unwrap();
        let mut set = SegmentSet::new(dir.path(), Duration::from_secs(60))
            .with_not_ready_grace(Duration::ZERO);
        set.refresh();
        set.refresh();
        set.refresh();
        assert_eq!(
            set.errors.get(&Refusal::NotReady),
            Some(&1),
            "{:?}",
            set.errors
        );
        assert!(set.tracked.is_empty());
        assert_eq!(
            set.invalid[&dir.path().join("stuck.pfs")].reason,
            Refusal::NotReady,
            "listed (counted as invalid) once reported"
        );
        // Finished after all: it is picked up on the next pass.
        f.write_all_at(&1u64.to_le_bytes(), 0x20).unwrap();
        set.refresh();
        assert_eq!(set.tracked.len(), 1);
        assert!(set.pending.is_empty() && set.invalid.is_empty());
    }

    #[test]
    fn a_process_exit_is_noticed_after_the_directory_is_gone() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("shm");
        std::fs::create_dir(&dir).unwrap();
        let cfg = pfs_shm_layout::SegmentConfig {
            service_name: "unit".into(),
            ..Default::default()
        };
        let (lock, w) = crate::testing::segment_at(&dir.join("unit.1.pfs"), &cfg, 1, true);
        let mut set = SegmentSet::new(&dir, Duration::from_secs(60));
        set.refresh();
        assert_eq!(set.tracked.len(), 1);
        assert!(set.tracked.values().all(|t| t.dead_since.is_none()));
        // The directory goes (a demo removing its own), then the process.
        std::fs::remove_dir_all(&dir).unwrap();
        set.refresh();
        assert!(
            set.tracked.values().all(|t| t.dead_since.is_none()),
            "a failed listing is not a vanished file"
        );
        drop((lock, w));
        set.refresh();
        assert_eq!(set.tracked.len(), 1);
        assert!(
            set.tracked.values().all(|t| t.dead_since.is_some()),
            "the exit is seen through the file the agent holds"
        );
        assert!(set.list_error.is_some());
    }

    #[test]
    fn a_live_process_whose_file_is_removed_or_whose_directory_is_replaced_stays_live() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("shm");
        std::fs::create_dir(&dir).unwrap();
        let cfg = crate::testing::tiny_config("unit");
        let (lock_a, w_a) = crate::testing::segment_at(&dir.join("unit.1.pfs"), &cfg, 1, true);
        let (lock_b, w_b) = crate::testing::segment_at(&dir.join("unit.2.pfs"), &cfg, 2, true);
        let mut set = SegmentSet::new(&dir, Duration::from_secs(60));
        set.refresh();
        assert_eq!(set.tracked.len(), 2);
        // A cleaner removes one file; then the directory is replaced by a
        // new one (another process creating it after a `rm -rf`).
        std::fs::remove_file(dir.join("unit.1.pfs")).unwrap();
        set.refresh();
        std::fs::rename(&dir, root.path().join("old")).unwrap();
        std::fs::create_dir(&dir).unwrap();
        set.refresh();
        set.refresh();
        assert_eq!(set.tracked.len(), 2);
        assert!(
            set.tracked.values().all(|t| t.dead_since.is_none()),
            "both processes still hold their files: alive"
        );
        // Still read: an event recorded now is in the next snapshot.
        let class = crate::testing::mutex_class(&w_a, "late");
        let slot = w_a.alloc_thread(7, 7, "t").unwrap();
        crate::testing::record_waits(&w_a, slot.index, class, 3);
        let t = set.tracked.values().find(|t| t.segment.pid() == 1).unwrap();
        let opts = pfs_shm_layout::reader::ReadOptions::default();
        let snap = pfs_shm_layout::reader::snapshot(&t.segment, &opts).unwrap();
        let late: u64 = snap
            .threads
            .iter()
            .flat_map(|t| t.rows.iter())
            .filter(|(c, _)| *c == class)
            .map(|(_, r)| r.count)
            .sum();
        assert_eq!(late, 3, "the removed file's later events are read");
        // Their exits are still seen, through the files the agent holds.
        drop((lock_a, w_a, lock_b, w_b));
        set.refresh();
        assert!(set.tracked.values().all(|t| t.dead_since.is_some()));
    }

    #[test]
    fn a_follower_reads_a_removed_file_while_its_process_runs_then_lets_it_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir
            .path()
            .join(pfs_shm_layout::files::segment_file_name("svc", 4242));
        let (lock, w) =
            crate::testing::segment_at(&path, &crate::testing::tiny_config("svc"), 4242, true);
        let class = crate::testing::mutex_class(&w, "a");
        let slot = w.alloc_thread(1, 1, "t").expect("a record");
        crate::testing::record_waits(&w, slot.index, class, 3);
        let mut owner = SegmentSet::new(dir.path(), Duration::ZERO).persist();
        let mut follower = SegmentSet::new(dir.path(), Duration::ZERO).persist();
        follower.follower_grace = Duration::ZERO;
        assert_eq!(
            (owner.role(), follower.role()),
            (Role::Owner, Role::Follower)
        );
        owner.refresh();
        follower.refresh();
        std::fs::remove_file(&path).unwrap(); // a temporary-file cleaner
        for _ in 0..3 {
            owner.refresh();
            follower.refresh();
        }
        assert_eq!(
            (owner.tracked.len(), follower.tracked.len()),
            (1, 1),
            "its process runs: read on by both"
        );
        drop((lock, w)); // the process exits
        for _ in 0..3 {
            owner.refresh();
            follower.refresh();
        }
        assert_eq!(owner.retired_segments(), 1);
        assert!(owner.tracked.is_empty());
        assert!(
            follower.tracked.is_empty(),
            "the follower lets it go (the owner's state counts it): not counted twice"
        );
        assert_eq!(follower.retired_segments(), 1);
    }

    #[test]
    fn a_directory_that_cannot_be_listed_is_reported_and_counted_a_missing_one_is_not() {
        let root = tempfile::tempdir().unwrap();
        let mut set = SegmentSet::new(root.path().join("later"), Duration::from_secs(60));
        set.refresh();
        assert!(set.list_failure().is_none(), "not there yet: waited for");
        assert!(set.list_errors.is_empty());
        let path = root.path().join("afile");
        std::fs::write(&path, b"").unwrap();
        let mut set = SegmentSet::new(&path, Duration::from_secs(60));
        set.refresh();
        set.refresh();
        let f = set.list_failure().expect("a file cannot be listed");
        assert_eq!(f.reason, ListFailure::NotADirectory);
        assert!(f.to_string().contains(&path.display().to_string()), "{f}");
        assert_eq!(set.list_errors.get(&ListFailure::NotADirectory), Some(&2));
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        set.refresh();
        assert!(set.list_failure().is_none(), "listed again");
        assert_eq!(set.list_errors.get(&ListFailure::NotADirectory), Some(&2));
    }

    #[test]
    fn a_file_abandoned_while_created_is_removed_by_the_owner_an_empty_one_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut set = SegmentSet::new(dir.path(), Duration::from_secs(60))
            .with_not_ready_grace(Duration::ZERO);
        // Sized but never initialised, and empty (never sized: maybe an
        // operator's `touch`); nobody holds either.
        let empty = dir.path().join("empty.1.pfs");
        std::fs::write(&empty, b"").unwrap();
        let stuck = dir.path().join("stuck.2.pfs");
        let f = segment_file(&stuck);
        f.write_all_at(&0u64.to_le_bytes(), 0x20).unwrap();
        drop(f);
        set.refresh();
        set.refresh();
        assert!(set.role() == Role::Owner, "this set owns its directory");
        assert!(!stuck.exists(), "the creator's file is removed");
        assert!(!set.invalid.contains_key(&stuck) && !set.pending.contains_key(&stuck));
        assert!(empty.exists(), "an empty file is never removed");
        assert_eq!(
            set.invalid[&empty].reason,
            Refusal::Empty,
            "reported past the grace"
        );
        assert_eq!(set.errors.get(&Refusal::Empty), Some(&1));
        assert_eq!(set.errors.get(&Refusal::NotReady), None);
    }

    #[test]
    fn an_empty_file_is_not_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut set = SegmentSet::new(dir.path(), Duration::from_secs(60));
        std::fs::write(dir.path().join("new.3.pfs"), b"").unwrap();
        set.refresh();
        assert!(
            set.errors.is_empty(),
            "a file being created: {:?}",
            set.errors
        );
        assert!(set.invalid.is_empty());
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
        assert_eq!(set.errors.get(&Refusal::WorldWritable), Some(&1));
        assert_eq!(set.invalid[&p].reason, Refusal::WorldWritable);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        set.refresh();
        assert_eq!(set.tracked.len(), 1, "ctime changed: retried and accepted");
        assert!(set.invalid.is_empty());
    }

    #[test]
    fn a_live_file_refused_for_what_it_is_is_not_refused_again_at_each_write() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("live.1.pfs");
        let (_lock, w) = segment(&p, true);
        std::fs::hard_link(&p, dir.path().join("link.pfs")).unwrap();
        let ww = dir.path().join("ww.2.pfs");
        let (_lock2, w2) = segment(&ww, true);
        std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut set = SegmentSet::new(dir.path(), Duration::from_secs(60));
        set.refresh();
        let counts = |set: &SegmentSet| {
            (
                set.errors.get(&Refusal::Duplicate).copied(),
                set.errors.get(&Refusal::WorldWritable).copied(),
            )
        };
        assert_eq!(counts(&set), (Some(1), Some(1)));
        for i in 0..3 {
            // The processes write (their files' times move), as live ones do.
            std::thread::sleep(Duration::from_millis(20));
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.write_all_at(&[0], 4096 * 3 + i).unwrap();
            let f = std::fs::OpenOptions::new().write(true).open(&ww).unwrap();
            f.write_all_at(&[0], 4096 * 3 + i).unwrap();
            set.refresh();
        }
        assert_eq!(counts(&set), (Some(1), Some(1)), "refused once each");
        // Refused for its content: its header says a version this agent
        // does not read; refused again after it changed (its creator
        // marks it ready), counted once; another file of that name (a
        // new inode) is counted again.
        // A segment at `path` whose header says the next major version.
        let newer_segment = |path: &Path| {
            let f = segment_file(path);
            let major = std::mem::offset_of!(pfs_shm_layout::layout::Header, major) as u64;
            let next = pfs_shm_layout::layout::LAYOUT_MAJOR + 1;
            f.write_all_at(&next.to_le_bytes(), major).unwrap();
            f
        };
        let newer = dir.path().join("newer.3.pfs");
        let f = newer_segment(&newer);
        set.refresh();
        let unsupported = |set: &SegmentSet| set.errors.get(&Refusal::UnsupportedVersion).copied();
        assert_eq!(unsupported(&set), Some(1));
        std::thread::sleep(Duration::from_millis(20));
        f.write_all_at(&[0], 4096 * 3).unwrap();
        set.refresh();
        assert_eq!(unsupported(&set), Some(1), "the same file: counted once");
        drop(f);
        // (Made beside it and renamed over it: a new inode for sure.)
        let other = dir.path().join("other.tmp");
        drop(newer_segment(&other));
        std::fs::rename(&other, &newer).unwrap();
        set.refresh();
        assert_eq!(unsupported(&set), Some(2), "another file");
        drop((w, w2));
        // Fixed: the mode changes, and it is considered again.
        std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o600)).unwrap();
        set.refresh();
        assert!(set.tracked.contains_key(&ww));
    }
}
