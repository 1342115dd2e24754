//! Retiring dead segments: their final totals fold into per-service
//! retired totals (so no counter goes backwards), the state file is
//! saved, then their files are removed, in the order that makes a crash in
//! between harmless. With persistence, only the directory's owning agent
//! retires (see [`crate::retired`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use pfs_shm_layout::reader::SegmentSnapshot;

use super::tracked::Tracked;
use crate::aggregate::Retired;
use crate::retired::{Absorbed, Role, State, Store};

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
}

impl Retirement {
    pub(super) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            retired: Retired::default(),
            retired_segments: 0,
            store: None,
            absorbed: Vec::new(),
        }
    }

    /// Keeps the totals in the directory's state file from now on (loaded
    /// now, written at every retirement).
    pub(super) fn persist(&mut self) {
        let mut store = Store::new(&self.dir);
        store.elect();
        self.install(store.load());
        self.store = Some(store);
    }

    /// Whether the totals persist.
    pub(super) fn persists(&self) -> bool {
        self.store.is_some()
    }

    /// This agent's role on the directory (`Owner` without persistence).
    pub(super) fn role(&self) -> Role {
        self.store.as_ref().map_or(Role::Owner, Store::role)
    }

    fn install(&mut self, state: State) {
        self.retired = state.retired;
        self.retired_segments = state.retired_segments;
        self.absorbed = state.absorbed;
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
        let reload =
            store.elect() || (store.role() == Role::Follower && (force || store.changed()));
        if reload {
            let state = store.load();
            self.install(state);
        }
        reload
    }

    /// Folds the last good figures of a segment that cannot be read any
    /// more (its file shrank, its mapping faulted).
    pub(super) fn absorb(&mut self, last: &SegmentSnapshot) {
        self.retired.absorb(last);
        self.changed();
    }

    /// Folds dead segments' final totals into the retired totals, saves
    /// the state, then removes their files.
    pub(super) fn retire(&mut self, dead: Vec<Tracked>) {
        if dead.is_empty() {
            return self.save_if_dirty();
        }
        let mut remove = Vec::new();
        for mut t in dead {
            if t.dead_since.is_none() || t.last_summaries.is_none() {
                t.final_read();
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
        self.changed();
        for (path, ino) in remove {
            remove_retired(&path, ino);
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
        };
        match store.save(&state) {
            Ok(()) => store.dirty = false,
            Err(e) => {
                tracing::warn!(path = %store.state_path().display(), error = %e, "cannot save the retired totals; retrying every pass (until then an agent restart would make retired services' counters go backwards)")
            }
        }
    }
}

/// Removes a retired segment's file if it is still the same file.
pub(super) fn remove_retired(path: &Path, ino: u64) {
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
