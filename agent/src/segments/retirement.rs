//! Retiring dead segments: their final totals fold into per-service
//! retired totals (so no counter goes backwards), the state file is
//! saved, then their files are removed, in the order that makes a crash in
//! between harmless. A file is removed only once the state that counts it
//! is saved: while saving fails (a full disk, something in the way of the
//! temporary file) the segments stay tracked and their files stay, the
//! failure is logged (again when it changes, or every few minutes) and the
//! save is retried every pass. With persistence, only the directory's
//! owning agent retires (see [`crate::retired`]).
//!
//! A dead segment is exported for the retention period before it is
//! retired; meanwhile its final totals are kept aside in the state file
//! (`pending`), at most [`MAX_PENDING`] of them. An agent that starts (or
//! takes the directory over) retires at once those whose files it does
//! not find: a process restarted under the same pid may have replaced
//! them while no agent watched, and their counts must not go with them.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::tracked::Tracked;
use crate::aggregate::Retired;
use crate::retired::{Absorbed, Elected, Pending, Role, State, Store};

/// The retired totals of one directory and, with persistence, its state
/// file.
#[derive(Debug)]
pub(super) struct Retirement {
    dir: PathBuf,
    /// Totals of retired (dead and removed) segments, by service.
    pub(super) retired: Retired,
    /// Segments retired so far.
    pub(super) retired_segments: u64,
    /// The state file, when retired totals persist.
    store: Option<Store>,
    /// Retired segments whose files may still exist.
    absorbed: Vec<Absorbed>,
    /// Dead segments not retired yet, and their final totals (with
    /// persistence).
    pending: Vec<Pending>,
    /// `pending` was just loaded: the next pass says which of its
    /// segments still have their files.
    unclaimed: bool,
    /// The unsaved change lets dead segments' files go: its save may
    /// spend the space kept for it (one that only keeps totals aside may
    /// not).
    spend_reserve: bool,
    /// The last save failure logged, and when.
    save_warning: Option<(String, Instant)>,
}

/// Dead segments whose totals are kept aside at most; past this, the
/// longest dead are retired before their retention ends (the service
/// totals are the same either way), which bounds the state file.
pub(super) const MAX_PENDING: usize = 32;

/// A save failure that does not change is logged again after this long.
const SAVE_WARNING_EVERY: Duration = Duration::from_secs(300);

impl Retirement {
    pub(super) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            retired: Retired::default(),
            retired_segments: 0,
            store: None,
            absorbed: Vec::new(),
            pending: Vec::new(),
            unclaimed: false,
            spend_reserve: false,
            save_warning: None,
        }
    }

    /// The error of the last save of the retired totals, while saving
    /// fails.
    pub(super) fn save_failure(&self) -> Option<&str> {
        self.save_warning.as_ref().map(|(e, _)| e.as_str())
    }

    /// Keeps the totals in the directory's state file from now on (loaded
    /// now, written at every retirement).
    pub(super) fn persist(&mut self, own_files_only: bool) {
        let mut store = Store::new(&self.dir);
        if own_files_only {
            store.own_files_only();
        }
        store.elect();
        let state = store.load();
        store.prepare();
        self.store = Some(store);
        self.install(state);
    }

    /// Whether the totals persist.
    pub(super) fn persists(&self) -> bool {
        self.store.is_some()
    }

    /// This agent's role on the directory (`Owner` without persistence).
    pub(super) fn role(&self) -> Role {
        self.store.as_ref().map_or(Role::Owner, Store::role)
    }

    /// Takes `state` as this agent's. Its pending segments are checked by
    /// the next pass ([`Retirement::claim`]).
    fn install(&mut self, state: State) {
        self.retired = state.retired;
        // Totals from a file that did not say when they were last retired
        // (an older agent's): from now, saved so that a restart does not
        // postpone their forgetting again.
        let now = crate::aggregate::unix_now_ns();
        let unstamped: Vec<String> = (self.retired.by_service.keys())
            .filter(|svc| !self.retired.last_retired_ns.contains_key(*svc))
            .cloned()
            .collect();
        for svc in &unstamped {
            self.retired.last_retired_ns.insert(svc.clone(), now);
        }
        if let (false, Some(store)) = (unstamped.is_empty(), &mut self.store) {
            store.dirty = true;
        }
        self.retired_segments = state.retired_segments;
        self.absorbed = state.absorbed;
        self.pending = state.pending;
        self.unclaimed = !self.pending.is_empty();
    }

    /// After the first pass over the directory since the state was
    /// loaded: the pending segments that pass did not find (`tracked`
    /// says which it did) lost their files while no agent watched (a
    /// process of the same pid replaced them, or someone removed them):
    /// they are retired now, from their totals kept aside. The others are
    /// tracked again, as dead, and retired after their retention.
    pub(super) fn claim(&mut self, tracked: impl Fn(&Absorbed) -> bool) {
        if !std::mem::take(&mut self.unclaimed) {
            return;
        }
        let before = self.pending.len();
        let mut kept = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            if tracked(&p.id) {
                kept.push(p);
                continue;
            }
            let Pending { id, totals, .. } = p;
            tracing::info!(
                file = id.file,
                pid = id.pid,
                "a dead segment's file went away while no agent watched (or was not accepted this pass); its final counters, kept in the state file, are retired now"
            );
            self.retired.merge(&totals);
            // Retired now (its totals carry when its death was found).
            for svc in totals.by_service.keys() {
                self.retired
                    .last_retired_ns
                    .insert(svc.clone(), crate::aggregate::unix_now_ns());
            }
            self.retired_segments += 1;
            // Counted now: should its file be there after all (refused
            // this pass, or listed late), it is not exported again (and
            // the entry goes at the first save that finds no such file).
            if !self.absorbed.contains(&id) {
                self.absorbed.push(id);
            }
        }
        self.pending = kept;
        if self.pending.len() != before {
            self.changed();
        }
    }

    /// Keeps aside the final totals of `t`, just found dead (owner, with
    /// persistence): saved with the next pass.
    pub(super) fn pend(&mut self, t: &Tracked) {
        if self.store.is_none() || self.role() != Role::Owner {
            return;
        }
        let Some(s) = t.final_figures() else { return };
        let id = t.identity();
        let mut totals = Retired::default();
        totals.absorb(s, true);
        let died_unix_ns = t.died_unix_ns();
        match self.pending.iter_mut().find(|p| p.id == id) {
            Some(p) => {
                p.totals = totals;
                if p.died_unix_ns == 0 {
                    // Kept by an agent that did not note when.
                    p.died_unix_ns = died_unix_ns;
                }
            }
            None => self.pending.push(Pending {
                id,
                totals,
                died_unix_ns,
            }),
        }
        if let Some(store) = &mut self.store {
            store.dirty = true;
        }
    }

    /// When the death of `id`, a dead segment kept aside, was found (by
    /// this agent or one before it), ns since the epoch, if known.
    pub(super) fn died_unix_ns(&self, id: &Absorbed) -> Option<u64> {
        self.pending
            .iter()
            .find(|p| p.id == *id)
            .map(|p| p.died_unix_ns)
            .filter(|&ns| ns != 0)
    }

    /// Dead segments kept aside.
    pub(super) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether the state counts the segment `id` already.
    pub(super) fn is_absorbed(&self, id: &Absorbed) -> bool {
        self.absorbed.contains(id)
    }

    /// Whether the file `name` with inode `ino` was retired already.
    pub(super) fn was_absorbed(&self, name: &std::ffi::OsStr, ino: u64) -> bool {
        self.absorbed
            .iter()
            .any(|a| a.ino == ino && std::ffi::OsStr::new(&a.file) == name)
    }

    /// Before a pass: elect, and (re)load the state when this agent just
    /// became the owner or, as a follower, when the owner rewrote it (or
    /// `force`). Returns whether the state was reloaded: segments it
    /// counts must then stop being exported.
    pub(super) fn sync(&mut self, force: bool) -> bool {
        let Some(store) = &mut self.store else {
            return false;
        };
        let elected = store.elect();
        store.beat();
        if store.role() == Role::Follower {
            // Saving is the owner's: a failure of this agent's own last
            // save no longer stands (nor would it ever be retried).
            self.save_warning = None;
        }
        if elected != Elected::Unchanged {
            store.prepare();
        }
        // A directory that appeared, or was made again: an agent that
        // holds retired totals saves them there (at the next pass); one
        // that holds none reads what the directory has (a state file an
        // earlier agent left on a volume mounted late).
        let holds_totals = self.retired_segments > 0
            || !self.pending.is_empty()
            || !self.retired.by_service.is_empty();
        if elected == Elected::Locked && holds_totals {
            store.dirty = true;
        }
        let reload = elected == Elected::Promoted
            || (elected == Elected::Locked && !holds_totals)
            || (store.role() == Role::Follower && (force || store.changed()));
        if reload {
            let state = store.load();
            self.install(state);
        }
        reload
    }

    /// Folds the last good figures of `t`, a segment that cannot be read
    /// any more (its file shrank, its mapping faulted); its totals kept
    /// aside, if it was dead, go (they are counted now).
    pub(super) fn absorb(&mut self, t: &Tracked) {
        let Some(last) = t.final_figures() else {
            return;
        };
        self.retired.absorb(last, t.has_ended());
        let id = t.identity();
        self.pending.retain(|p| p.id != id);
        // A dead one's file stays: should it become readable, it is not
        // counted again.
        if self.store.is_some() && t.dead_since.is_some() && !self.absorbed.contains(&id) {
            self.absorbed.push(id);
        }
        self.changed();
    }

    /// Folds dead segments' final totals into the retired totals, saves
    /// the state, then removes their files. If the state cannot be saved,
    /// the segments whose files would be removed are not retired: they are
    /// given back, to stay tracked (and exported), and retried at the next
    /// pass. A segment that was never read
    /// (no figures to fold) is not retired: its file is kept and it is
    /// given back, to stay tracked (and counted) until a read succeeds or
    /// the file goes away; removing it would lose all its counters.
    #[must_use = "segments that could not be retired must stay tracked"]
    pub(super) fn retire(&mut self, dead: Vec<Tracked>) -> Vec<Tracked> {
        let mut kept = Vec::new();
        if dead.is_empty() {
            self.save_if_dirty();
            return kept;
        }
        let mut remove = Vec::new();
        for mut t in dead {
            if t.dead_since.is_none() || t.last_summaries.is_none() {
                t.final_read();
            }
            let Some(s) = t.final_figures() else {
                let same_file = std::fs::symlink_metadata(&t.path).is_ok_and(|m| m.ino() == t.ino);
                if same_file {
                    if !t.unretirable_reported {
                        t.unretirable_reported = true;
                        tracing::warn!(path = %crate::util::shown::path(&t.path), service = t.segment.service(), pid = t.segment.pid(), error = t.failure.as_deref().unwrap_or("never read"), "not retiring a dead segment that could not be read: its file is kept (and counted as invalid) so that its counters are not lost; remove it by hand once its figures are not needed");
                    }
                    kept.push(t);
                } else {
                    tracing::warn!(path = %crate::util::shown::path(&t.path), service = t.segment.service(), pid = t.segment.pid(), "a segment that could not be read was replaced or removed; its figures are lost");
                }
                continue;
            };
            // A file replaced under the same name is not ours to remove.
            if std::fs::symlink_metadata(&t.path).is_ok_and(|m| m.ino() == t.ino) {
                remove.push(t);
            } else {
                self.retired.absorb(s, t.has_ended());
                self.retired_segments += 1;
                let id = t.identity();
                self.pending.retain(|p| p.id != id);
            }
        }
        // What to go back to if the state that counts the files to remove
        // cannot be saved.
        let undo = (self.store.is_some() && !remove.is_empty()).then(|| {
            (
                self.retired.clone(),
                self.retired_segments,
                self.absorbed.clone(),
                self.pending.clone(),
            )
        });
        for t in &remove {
            if let Some(s) = t.final_figures() {
                self.retired.absorb(s, t.has_ended());
            }
            self.retired_segments += 1;
            if self.store.is_some() {
                let id = t.identity();
                self.pending.retain(|p| p.id != id);
                self.absorbed.push(id);
            }
        }
        self.spend_reserve |= !remove.is_empty();
        self.changed();
        if let Some((retired, retired_segments, absorbed, pending)) = undo
            && self.store.as_ref().is_some_and(|s| s.dirty)
        {
            // Not saved: a file removed now would be counted nowhere after
            // a restart. Keep them tracked; the next pass tries again.
            self.retired = retired;
            self.retired_segments = retired_segments;
            self.absorbed = absorbed;
            self.pending = pending;
            kept.extend(remove);
            return kept;
        }
        let removed = !remove.is_empty();
        for t in remove {
            remove_retired(&t.path, t.ino);
        }
        // The files removed freed space: the reserve a full volume took
        // (or never let the agent make) is made again now, not at the
        // next save.
        if let (true, Some(store)) = (removed, &self.store)
            && store.role() == Role::Owner
        {
            store.prepare();
        }
        kept
    }

    /// Forgets the retired totals of the services that no segment in the
    /// directory belongs to (`present` says which do) and whose last
    /// segment was retired more than `after` ago, and saves. Owner only.
    pub(super) fn forget_idle(&mut self, present: impl Fn(&str) -> bool, after: Duration) {
        let idle = self
            .retired
            .idle_since(crate::aggregate::unix_now_ns(), after);
        let mut forgot = 0;
        for svc in idle.iter().filter(|s| !present(s)) {
            // Dead segments kept aside are present (tracked): none here.
            self.retired.forget(svc);
            forgot += 1;
            tracing::info!(service = %svc, after = %crate::util::text::HumanDuration(after), "forgot a service's retired totals: none of its processes was seen for --forget-retired-after; its series leave /metrics and OTLP (a process of it that comes back starts its counters from zero)");
        }
        if forgot > 0 {
            self.changed();
        }
    }

    /// Saves the state after the totals changed; a failed save is retried
    /// every pass.
    fn changed(&mut self) {
        if let Some(store) = &mut self.store {
            store.dirty = true;
        }
        self.save_if_dirty();
    }

    /// Saves the state if a change is not saved yet (and this agent owns
    /// the directory).
    pub(super) fn save_if_dirty(&mut self) {
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
            pending: self.pending.clone(),
        };
        match store.save_with(&state, self.spend_reserve) {
            Ok(()) => {
                store.dirty = false;
                self.spend_reserve = false;
                if self.save_warning.take().is_some() {
                    tracing::info!(path = %store.state_path().display(), "retired totals saved again; dead segments kept meanwhile are retired and removed now");
                }
            }
            Err(e) => {
                let error = e.to_string();
                let now = Instant::now();
                let repeated = self.save_warning.as_ref().is_some_and(|(last, at)| {
                    *last == error && now.duration_since(*at) < SAVE_WARNING_EVERY
                });
                let path = store.state_path();
                let mut tmp = path.clone().into_os_string();
                tmp.push(".tmp");
                let tmp = PathBuf::from(tmp);
                if repeated {
                    tracing::debug!(path = %crate::util::shown::path(&path), error, "cannot save the retired totals (still)");
                } else {
                    let fix = match e.kind() {
                        std::io::ErrorKind::NotFound => format!(
                            "the segment directory {} is gone: make it again (or remount its volume)",
                            self.dir.display()
                        ),
                        std::io::ErrorKind::PermissionDenied
                        | std::io::ErrorKind::ReadOnlyFilesystem => format!(
                            "let the agent write in {} (or mount it read-write)",
                            self.dir.display()
                        ),
                        std::io::ErrorKind::FileTooLarge => {
                            "raise the file size limit of pfs-agent's process (ulimit -f, RLIMIT_FSIZE: unlimited is usual)".to_string()
                        }
                        _ => format!(
                            "free space on the filesystem, or remove what is in the way (the error names it; {} is the agent's temporary file)",
                            tmp.display()
                        ),
                    };
                    tracing::warn!(path = %crate::util::shown::path(&path), tmp = %crate::util::shown::path(&tmp), error, "cannot save the retired totals: {fix}. Dead segments are not removed until the save succeeds; it is retried every pass, and this is logged again if the error changes or in {} minutes", SAVE_WARNING_EVERY.as_secs() / 60);
                    self.save_warning = Some((error, now));
                }
            }
        }
    }
}

/// Removes a retired segment's file if it is still the same file, and its
/// other names in the directory if it has some (hard links, refused as
/// duplicates while it was read): left behind, the file would be read
/// again under one of them and its counts folded twice.
pub(super) fn remove_retired(path: &Path, ino: u64) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.ino() != ino {
        return;
    }
    if meta.nlink() > 1
        && let Some(dir) = path.parent()
        && let Ok(entries) = std::fs::read_dir(dir)
    {
        for e in entries.flatten() {
            let other = e.path();
            if other != path
                && std::fs::symlink_metadata(&other)
                    .is_ok_and(|m| m.ino() == ino && m.dev() == meta.dev())
                && std::fs::remove_file(&other).is_ok()
            {
                tracing::info!(path = %crate::util::shown::path(&other), "removed a second name (hard link) of a retired segment");
            }
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::info!(path = %crate::util::shown::path(path), "dead segment retired and removed")
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %crate::util::shown::path(path), error = %e, "cannot remove retired segment; check the directory's permissions")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::ServiceTotals;
    use pfs_shm_layout::ClassKind;
    use pfs_shm_layout::reader::Summary;

    fn id(file: &str) -> Absorbed {
        Absorbed {
            file: file.into(),
            ino: 7,
            pid: 1,
            start_time_unix_ns: 1_700_000_000_000_000_000,
        }
    }

    fn waits(n: u64) -> Retired {
        let mut t = ServiceTotals::default();
        let s = Summary {
            count: n,
            ..Summary::default()
        };
        t.classes
            .insert("wait/synch/mutex/t/a".into(), (ClassKind::Mutex, s));
        let mut r = Retired::default();
        r.by_service.insert("svc".into(), t);
        r.earliest_start_ns.insert("svc".into(), 5);
        r
    }

    fn count(r: &Retired) -> u64 {
        r.by_service
            .get("svc")
            .map_or(0, |t| t.classes["wait/synch/mutex/t/a"].1.count)
    }

    /// After a load, the pending segments the first pass did not find are
    /// retired from their kept totals, once; those it found stay pending.
    #[test]
    fn pending_segments_not_found_after_a_load_are_retired_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Retirement::new(dir.path());
        r.install(State {
            retired: waits(100),
            retired_segments: 4,
            absorbed: Vec::new(),
            pending: vec![
                Pending {
                    id: id("svc.1.pfs"),
                    totals: waits(10),
                    died_unix_ns: 0,
                },
                Pending {
                    id: id("svc.1.1.pfs"),
                    totals: waits(1),
                    died_unix_ns: 0,
                },
            ],
        });
        r.claim(|i| *i == id("svc.1.1.pfs"));
        assert_eq!(count(&r.retired), 110, "the file that went away");
        assert_eq!(r.retired_segments, 5);
        assert_eq!(r.pending(), 1, "the one still tracked");
        r.claim(|_| false);
        assert_eq!(count(&r.retired), 110, "claimed once per load");
    }
}
