//! Layer 2: retired totals that survive an agent restart.
//!
//! When a dead process's segment is retired, its final totals are folded
//! into per-service [`Retired`] totals and its file is removed. Those
//! totals would otherwise live only in the agent's memory, and a restarted
//! agent would show every such service's counters going backwards. So the
//! agent keeps them in a small JSON state file in the segment directory:
//!
//! * **Names**: [`STATE_FILE`] (`.pfs-agent-state.json`) and [`LOCK_FILE`]
//!   (`.pfs-agent.lock`). Neither ends in `.pfs`, so discovery never takes
//!   them for segments.
//! * **Space kept**: the owner keeps [`RESERVE_FILE`] allocated (at least
//!   [`RESERVE_MIN_BYTES`], twice the state): a save that finds the volume
//!   full gives it back and saves, since dead segments are removed only
//!   once a saved state counts them.
//! * **Atomic writes**: a temporary file (`O_EXCL | O_NOFOLLOW`, mode
//!   0600), `fsync`, `rename` over the state file, `fsync` of the
//!   directory. A reader sees the old state or the new one, never half.
//! * **Dead, not yet retired**: a dead segment's final totals are saved
//!   too (`pending`) when its death is found. A restarted agent that does
//!   not find its file (a process of the same pid replaced it) retires it
//!   from those totals; one that does tracks it, dead, as before.
//! * **Order**: the state (with the retired segment's identity in
//!   `absorbed`) is written *before* the segment file is removed. An agent
//!   killed between the two finds the file on restart, recognises it by
//!   name, inode, pid and start time, and removes it without counting it
//!   twice.
//! * **A newer agent's file** (a higher version: an agent downgrade) is
//!   left as it is, neither read nor overwritten (logged): this agent's
//!   retired totals start from zero and it retires nothing until a
//!   `pfs-agent` that reads the file runs again, which finds it intact.
//! * **Corruption**: a state file that cannot be parsed (or is larger than
//!   [`MAX_STATE_BYTES`], or of an older version this agent does not read, or is not a regular
//!   file: a FIFO there is opened without blocking and refused) is renamed
//!   to `.pfs-agent-state.json.corrupt` (`.corrupt.1` ... if that is taken:
//!   an earlier one is never replaced) and logged; the agent starts from
//!   zero retired totals and never crashes on it. If it cannot be set
//!   aside, it is never overwritten either: saving fails (logged, retried)
//!   until someone moves it away, and retired segment files are kept.
//! * **Two agents on one directory**: the agent that holds an exclusive
//!   `flock` on the lock file owns the directory: it alone retires
//!   segments, removes files and writes the state. Any other agent is a
//!   follower: it exports the same segments, never removes anything,
//!   re-reads the state file when it changes, and takes over when the
//!   owner exits (the kernel drops the lock of a killed owner).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use pfs_shm_layout::ClassKind;
use pfs_shm_layout::layout::{BucketScale, LOST_COUNTERS};
use pfs_shm_layout::reader::Summary;
use rustix::fs::{FlockOperation, OFlags};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Retired, ServiceTotals};
use crate::persist::{JsonError, MemoryJson, SummaryJson};
use crate::util::fs::{DIR_ACCESS_HINT, ReadError, nofollow, read_capped, set_aside, write_atomic};

/// Name of the state file in the segment directory.
pub const STATE_FILE: &str = ".pfs-agent-state.json";
/// Name of the lock file that elects the directory's owning agent.
pub const LOCK_FILE: &str = pfs_shm_layout::files::AGENT_LOCK_FILE;
/// Where a state file that cannot be read is set aside.
pub const CORRUPT_FILE: &str = ".pfs-agent-state.json.corrupt";
/// Space the owning agent keeps allocated for its next save: given back
/// when a save finds the volume full, so that the state that lets dead
/// segments be removed can still be written.
pub const RESERVE_FILE: &str = ".pfs-agent-state.reserve";
/// The reserve holds at least this, and twice the last state written.
pub const RESERVE_MIN_BYTES: u64 = 256 << 10;
/// A larger state file is refused as corrupt.
pub const MAX_STATE_BYTES: u64 = 16 << 20;

const FORMAT: &str = "pfs-agent-retired";
/// Version 2 (layout 8.0) says each summary's histogram scale
/// (`bucket_scale`): an agent that reads only version 1 would take its
/// stages' and statements' buckets for the wait scale's, and save them
/// back without it, so it leaves a version 2 file alone. Version 1 files
/// are read as version 2 ones without the field (the wait scale).
const VERSION: u32 = 2;
/// The oldest version read.
const OLDEST_VERSION: u32 = 1;

/// A state file that cannot be used (it is then set aside, see
/// [`Store::load`]).
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Opening or reading it failed, or it is too large.
    #[error(transparent)]
    File(#[from] ReadError),
    /// Not JSON of the expected shape.
    #[error("not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Another file's format.
    #[error("format {0:?}, expected {FORMAT:?}")]
    Format(String),
    /// A version this agent does not read.
    #[error("version {0} (this agent reads version {VERSION})")]
    Version(u32),
    /// A class of a kind this agent does not know.
    #[error("class {name}: unknown kind {kind}")]
    Kind {
        /// The class (instrument) name.
        name: String,
        /// The kind number found.
        kind: u32,
    },
    /// A summary that cannot be read back.
    #[error(transparent)]
    Summary(#[from] JsonError),
    /// Owned by another user than this agent's, under `--require-owner`.
    #[error(
        "owned by uid {0}, not by this agent's user: another user wrote it, and under --require-owner only the agent's own state is read"
    )]
    ForeignOwner(u32),
}

/// A retired segment whose file may still exist (it is removed after the
/// state is written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Absorbed {
    /// File name in the directory.
    pub file: String,
    /// Inode number of the file.
    pub ino: u64,
    /// Creator pid (from the segment header).
    pub pid: u32,
    /// Creation time, ns since the epoch (from the segment header).
    pub start_time_unix_ns: u64,
}

/// Everything the state file holds.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Retired totals by service.
    pub retired: Retired,
    /// Segments retired so far (the `pfs_agent_retired_segments` counter).
    pub retired_segments: u64,
    /// Retired segments whose files were not yet known to be removed.
    pub absorbed: Vec<Absorbed>,
    /// Dead segments not retired yet (exported for the retention period),
    /// with their final totals: a restarted agent retires them at once,
    /// so that their counts survive their files (which a restarted
    /// process of the same pid may replace meanwhile).
    pub pending: Vec<Pending>,
}

/// A dead segment kept aside in the state: who it was, its final totals,
/// and when its death was found (so that an agent restarted meanwhile
/// retires it after the rest of its retention, not a whole new one).
#[derive(Debug, Clone)]
pub struct Pending {
    /// The segment.
    pub id: Absorbed,
    /// Its final totals.
    pub totals: Retired,
    /// When its process's death was found, ns since the epoch (0: not
    /// known, in the files of agents that did not keep it).
    pub died_unix_ns: u64,
}

#[derive(Serialize, Deserialize)]
struct FileV1 {
    format: String,
    version: u32,
    retired_segments: u64,
    services: BTreeMap<String, ServiceV1>,
    absorbed: Vec<Absorbed>,
    /// Absent in the files of agents that did not keep it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pending: Vec<PendingV1>,
}

/// A dead segment not retired yet, and its final totals.
#[derive(Serialize, Deserialize)]
struct PendingV1 {
    #[serde(flatten)]
    id: Absorbed,
    services: BTreeMap<String, ServiceV1>,
    /// Absent in the files of agents that did not keep it.
    #[serde(default, skip_serializing_if = "is_zero")]
    died_unix_ns: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize)]
struct ServiceV1 {
    classes: BTreeMap<String, ClassV1>,
    memory: BTreeMap<String, MemoryJson>,
    lost: Vec<u64>,
    /// The earliest start of the processes counted (absent in files of
    /// agents that did not keep it: the origin is then unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    earliest_start_unix_ns: Option<u64>,
    /// When a segment of the service was last retired (absent in files of
    /// agents that did not keep it: taken as the time the file is first
    /// read, and saved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_retired_unix_ns: Option<u64>,
    /// Statements in progress when their processes ended, by instrument
    /// (absent in files of agents that did not count them, and when
    /// none: an older agent reading this file ignores it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    abandoned: BTreeMap<String, u64>,
}

#[derive(Serialize, Deserialize)]
struct ClassV1 {
    kind: u32,
    #[serde(flatten)]
    summary: SummaryJson,
}

impl ClassV1 {
    fn from(kind: ClassKind, s: &Summary) -> Self {
        Self {
            kind: kind as u32,
            summary: SummaryJson::of(s),
        }
    }

    fn to(&self, name: &str) -> Result<(ClassKind, Summary), StateError> {
        let kind = ClassKind::from_u32(self.kind).ok_or_else(|| StateError::Kind {
            name: name.to_string(),
            kind: self.kind,
        })?;
        // In the kind's scale: a file an agent wrote before layout 8.0
        // has its stages' and statements' in the wait scale.
        let s = self.summary.get(name)?;
        Ok((kind, s.rescaled(BucketScale::of_class(kind))))
    }
}

/// Retired totals as the file's services.
fn encode_services(retired: &Retired) -> BTreeMap<String, ServiceV1> {
    retired
        .by_service
        .iter()
        .map(|(svc, t)| {
            let classes = t
                .classes
                .iter()
                .map(|(n, (k, s))| (n.clone(), ClassV1::from(*k, s)))
                .collect();
            let memory = t
                .memory
                .iter()
                .map(|(n, m)| (n.clone(), MemoryJson::from(m)))
                .collect();
            (
                svc.clone(),
                ServiceV1 {
                    classes,
                    memory,
                    lost: t.lost.to_vec(),
                    earliest_start_unix_ns: retired.earliest_start_ns.get(svc).copied(),
                    last_retired_unix_ns: retired.last_retired_ns.get(svc).copied(),
                    abandoned: t.abandoned.clone(),
                },
            )
        })
        .collect()
}

/// The file's services as retired totals.
fn decode_services(services: BTreeMap<String, ServiceV1>) -> Result<Retired, StateError> {
    let mut retired = Retired::default();
    for (svc, s) in services {
        let mut t = ServiceTotals::default();
        for (name, row) in &s.classes {
            t.classes.insert(name.clone(), row.to(name)?);
        }
        for (name, m) in &s.memory {
            t.memory.insert(name.clone(), m.into());
        }
        t.abandoned = s.abandoned;
        // A newer agent may count more kinds of loss: keep the ones we know.
        for (a, b) in t.lost.iter_mut().zip(s.lost.iter().take(LOST_COUNTERS)) {
            *a = *b;
        }
        if let Some(t) = s.earliest_start_unix_ns {
            retired.earliest_start_ns.insert(svc.clone(), t);
        }
        // Absent in the files of agents that did not keep it: stamped (and
        // saved) when installed (`Retirement::install`).
        if let Some(t) = s.last_retired_unix_ns {
            retired.last_retired_ns.insert(svc.clone(), t);
        }
        retired.by_service.insert(svc, t);
    }
    Ok(retired)
}

/// The state as the file's JSON text.
pub fn encode(state: &State) -> Vec<u8> {
    let f = FileV1 {
        format: FORMAT.to_string(),
        version: VERSION,
        retired_segments: state.retired_segments,
        services: encode_services(&state.retired),
        absorbed: state.absorbed.clone(),
        pending: state
            .pending
            .iter()
            .map(|p| PendingV1 {
                id: p.id.clone(),
                services: encode_services(&p.totals),
                died_unix_ns: p.died_unix_ns,
            })
            .collect(),
    };
    let mut out = serde_json::to_vec_pretty(&f).expect("the state always serializes");
    out.push(b'\n');
    out
}

/// Parses the file's JSON text; the error says what is wrong.
pub fn decode(bytes: &[u8]) -> Result<State, StateError> {
    // The format and version first: another version's file may have
    // another shape.
    let head: crate::util::json::FileHead = serde_json::from_slice(bytes)?;
    if head.format != FORMAT {
        return Err(StateError::Format(head.format));
    }
    if !(OLDEST_VERSION..=VERSION).contains(&head.version) {
        return Err(StateError::Version(head.version));
    }
    let f: FileV1 = serde_json::from_slice(bytes)?;
    let pending = f
        .pending
        .into_iter()
        .map(|p| {
            Ok(Pending {
                id: p.id,
                totals: decode_services(p.services)?,
                died_unix_ns: p.died_unix_ns,
            })
        })
        .collect::<Result<_, StateError>>()?;
    Ok(State {
        retired: decode_services(f.services)?,
        retired_segments: f.retired_segments,
        absorbed: f.absorbed,
        pending,
    })
}

/// What [`Store::elect`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elected {
    /// Nothing: the same role, on the same lock file.
    Unchanged,
    /// A follower became the owner: the other agent exited. The state it
    /// left is to be loaded.
    Promoted,
    /// An owner took a lock file it did not hold: the directory appeared
    /// (it did not exist when the agent started) or was made again. The
    /// space kept for saving is to be made there, and the totals this
    /// agent holds saved there.
    Locked,
}

/// Who may retire segments in the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// This agent holds the lock: it retires, removes and writes the state.
    Owner,
    /// Another agent holds the lock: this one only reads.
    Follower,
}

/// The state file and the lock of one directory.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    lock: Option<File>,
    role: Role,
    /// `(inode, mtime ns, len)` of the state file last read or written.
    seen: Option<(u64, i64, u64)>,
    /// A write failed; retry on the next pass.
    pub dirty: bool,
    warned_lock: bool,
    /// The heartbeat's failure was logged.
    warned_beat: bool,
    /// `(inode, mtime ns, len)` of an unusable state file that could not be
    /// set aside: never overwritten while it is there, unchanged.
    unusable: Option<(u64, i64, u64)>,
    /// Read only a state file this agent's user owns ([`Store::own_files_only`]).
    own_files_only: bool,
}

fn stamp(m: &std::fs::Metadata) -> (u64, i64, u64) {
    (m.ino(), m.mtime() * 1_000_000_000 + m.mtime_nsec(), m.len())
}

impl Store {
    /// A store over `dir`; [`Store::elect`] decides the role.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            lock: None,
            role: Role::Owner,
            seen: None,
            dirty: false,
            warned_lock: false,
            warned_beat: false,
            unusable: None,
            own_files_only: false,
        }
    }

    /// Reads only a state file owned by this agent's effective user (the
    /// one that writes it): under `--require-owner`, where other users may
    /// write the directory but not be trusted, a state file another user
    /// planted (forged totals) is unusable, set aside as a corrupt one is.
    pub fn own_files_only(&mut self) {
        self.own_files_only = true;
    }

    /// This agent's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Path of the state file.
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Tries to take the directory's lock, and says what changed. An agent
    /// that cannot create the lock file (no directory yet, read-only
    /// directory) acts as the owner: there is nobody to share with, and its
    /// writes fail with a logged warning. An owner whose lock file is no
    /// longer the directory's (the directory was removed and made again)
    /// takes the new one, so that a second agent on the new directory
    /// cannot also own it.
    pub fn elect(&mut self) -> Elected {
        if self.lock.is_some() && !self.lock_is_current() {
            // An owner that kept its old lock would own a directory that
            // is gone; a follower waiting on it would be promoted when the
            // owner lets it go, while the owner takes the new one.
            tracing::info!(dir = %crate::util::shown::path(&self.dir), "the agent lock file was removed (with its directory?); taking the directory's lock again");
            self.lock = None;
        }
        if self.lock.is_some() && self.role == Role::Owner {
            return Elected::Unchanged;
        }
        let fresh = self.lock.is_none();
        if fresh {
            let opened = nofollow(OFlags::NONBLOCK | OFlags::NOCTTY)
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(self.dir.join(LOCK_FILE));
            match opened {
                Ok(f) => self.lock = Some(f),
                Err(e) => {
                    if !self.warned_lock && e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!(dir = %crate::util::shown::path(&self.dir), error = %e, "cannot create the agent lock file; acting as the only agent on this directory. Without it the agent cannot show its heartbeat either: an application that replaces a dead predecessor's segment (restarting in a loop) then counts it in pfs_lost_total{{kind=\"uncollected_segments\"}} although this agent read it; let the agent write in the directory");
                        self.warned_lock = true;
                    }
                    self.role = Role::Owner;
                    return Elected::Unchanged;
                }
            }
        }
        let Some(lock) = &self.lock else {
            return Elected::Unchanged;
        };
        let was = self.role;
        match rustix::fs::flock(lock, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                self.role = Role::Owner;
                if fresh {
                    // A lock file this agent did not hold: the directory
                    // appeared, or was made again (owner or follower
                    // before, this agent keeps what it holds).
                    Elected::Locked
                } else if was == Role::Follower {
                    tracing::info!(dir = %crate::util::shown::path(&self.dir), "the other agent on this directory exited; this agent now retires dead segments and keeps the state file");
                    Elected::Promoted
                } else {
                    Elected::Unchanged
                }
            }
            Err(_) => {
                if was == Role::Owner {
                    tracing::warn!(dir = %crate::util::shown::path(&self.dir), "another pfs-agent owns this directory (it holds {LOCK_FILE}); this agent exports the same segments but leaves retiring them and the state file to it");
                }
                self.role = Role::Follower;
                Elected::Unchanged
            }
        }
    }

    /// Sets the lock file's modification time to now: the heartbeat that
    /// tells a writer an agent watches the directory
    /// ([`pfs_shm_layout::files::agent_watched`]), so that a process that
    /// must replace a dead predecessor's segment knows whether its figures
    /// were collected. Owner and follower alike; nothing without a lock
    /// file.
    pub fn beat(&mut self) {
        let Some(lock) = &self.lock else { return };
        // Both times set to now, which write access allows: an explicit
        // time needs the file's owner, and the lock file may be another
        // user's (an earlier agent that ran as another uid).
        let now = rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        };
        let times = rustix::fs::Timestamps {
            last_access: now,
            last_modification: now,
        };
        if let Err(e) = rustix::fs::futimens(lock, &times)
            && !self.warned_beat
        {
            tracing::warn!(dir = %crate::util::shown::path(&self.dir), error = %e, "cannot update the modification time of {LOCK_FILE}, the agent's heartbeat: an application that replaces a dead predecessor's segment (restarting in a loop) then counts it in pfs_lost_total{{kind=\"uncollected_segments\"}} although this agent read it; let the agent write the file (remove it: the agent creates it again)");
            self.warned_beat = true;
        }
    }

    /// Whether the lock file held is still the directory's (same inode).
    fn lock_is_current(&self) -> bool {
        let Some(lock) = &self.lock else { return false };
        match (
            lock.metadata(),
            std::fs::symlink_metadata(self.dir.join(LOCK_FILE)),
        ) {
            (Ok(held), Ok(now)) => held.ino() == now.ino() && held.dev() == now.dev(),
            _ => false,
        }
    }

    /// Whether the state file changed since it was last read or written.
    pub fn changed(&self) -> bool {
        let now = std::fs::symlink_metadata(self.state_path())
            .ok()
            .map(|m| stamp(&m));
        now != self.seen
    }

    /// Reads the state file. A missing file is an empty state; a corrupt
    /// one is set aside as [`CORRUPT_FILE`], logged, and read as empty.
    pub fn load(&mut self) -> State {
        let path = self.state_path();
        match read_state(&path, self.own_files_only) {
            Ok(Some((state, st))) => {
                self.seen = Some(st);
                tracing::info!(path = %crate::util::shown::path(&path), services = state.retired.by_service.len(), retired_segments = state.retired_segments, "retired totals loaded");
                state
            }
            Ok(None) => {
                self.seen = None;
                State::default()
            }
            Err(StateError::Version(v)) if v > VERSION => {
                // A newer agent's: kept for it (an agent downgrade is
                // undone by upgrading again), neither read nor replaced.
                self.seen = std::fs::symlink_metadata(&path).ok().map(|m| stamp(&m));
                self.unusable = self.seen;
                tracing::error!(path = %crate::util::shown::path(&path), version = v, "state file written by a newer pfs-agent (state version {v}; this agent reads version {VERSION}): it is left as it is, neither read nor overwritten, so this agent's retired totals start from zero and dead segments are kept, not retired; run a pfs-agent that reads it (or move it away to start afresh)");
                State::default()
            }
            Err(StateError::File(ReadError::DirDenied(e))) => {
                // The directory's fault, not the file's (which may not
                // exist): nothing to set aside; read once it can be.
                self.seen = None;
                tracing::error!(dir = %crate::util::shown::path(&self.dir), error = %e, "cannot read the state file {STATE_FILE}: the segment directory cannot be searched, so retired totals start from zero and cannot be saved; {DIR_ACCESS_HINT}");
                State::default()
            }
            Err(msg) => {
                let moved = match self.role {
                    Role::Owner => Some(set_aside(&path, &self.dir.join(CORRUPT_FILE))),
                    Role::Follower => None,
                };
                self.seen = std::fs::symlink_metadata(&path).ok().map(|m| stamp(&m));
                match moved {
                    Some(Ok(aside)) => {
                        self.unusable = None;
                        tracing::error!(path = %crate::util::shown::path(&path), set_aside = %crate::util::shown::path(&aside), "state file is unusable ({msg}); it was set aside and retired totals start from zero, so services whose processes were retired may show one counter reset");
                    }
                    Some(Err(e)) => {
                        self.unusable = self.seen;
                        tracing::error!(path = %crate::util::shown::path(&path), error = %e, "state file is unusable ({msg}) and cannot be set aside; it is left as it is and the retired totals are not saved (retired segment files are kept) until you move it away");
                    }
                    None => {
                        tracing::error!(path = %crate::util::shown::path(&path), "state file is unusable ({msg}); retired totals start from zero");
                    }
                }
                State::default()
            }
        }
    }

    /// Writes the state atomically (temporary file, fsync, rename). Fails,
    /// instead of replacing it, while an unusable state file that could not
    /// be set aside is still there.
    pub fn save(&mut self, state: &State) -> std::io::Result<()> {
        self.save_with(state, true)
    }

    /// [`Store::save`]; a save that finds the volume full gives back the
    /// space kept for it ([`RESERVE_FILE`]) only if `spend_reserve` (a
    /// save that lets dead segments' files go, not one that only keeps
    /// totals aside).
    pub fn save_with(&mut self, state: &State, spend_reserve: bool) -> std::io::Result<()> {
        let path = self.state_path();
        if let Some(bad) = self.unusable {
            if std::fs::symlink_metadata(&path).is_ok_and(|m| stamp(&m) == bad) {
                return Err(std::io::Error::other(format!(
                    "{} is left as it is (unusable and not set aside, or written by a newer pfs-agent: see the error logged when it was loaded); move it away (the agent does not overwrite it)",
                    path.display()
                )));
            }
            self.unusable = None;
        }
        let bytes = encode(state);
        // Past the file size limit (`ulimit -f`), a write raises SIGXFSZ,
        // which would kill the agent: an error instead (logged, retried).
        if let Err(pfs_shm_layout::SegmentError::FileSizeLimit { limit, size }) =
            pfs_shm_layout::segment::within_file_size_limit(bytes.len() as u64)
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!(
                    "the agent's file size limit (ulimit -f, RLIMIT_FSIZE) is {limit} bytes, below the {size} bytes of its state file"
                ),
            ));
        }
        match write_atomic(&path, &bytes) {
            Err(e) if spend_reserve && no_space(&e) && self.give_back_reserve() => {
                tracing::warn!(dir = %crate::util::shown::path(&self.dir), "the volume is full: the space kept for the state file ({RESERVE_FILE}) was given back to save it");
                write_atomic(&path, &bytes)?;
            }
            r => r?,
        }
        self.seen = std::fs::symlink_metadata(&path).ok().map(|m| stamp(&m));
        self.keep_reserve(bytes.len() as u64);
        self.publish_collected(state);
        Ok(())
    }

    /// Lists in the lock file the dead segments whose final figures
    /// `state`, just saved, holds
    /// ([`pfs_shm_layout::files::collected_text`]): a restarting
    /// application that replaces one of them then knows nothing is lost,
    /// even while no agent runs. Best effort: written over the old list
    /// and then cut to size, so that a reader meanwhile finds every segment
    /// still listed; a failure only leaves such a replacement counted as
    /// uncollected.
    fn publish_collected(&self, state: &State) {
        use std::os::unix::fs::FileExt;
        let Some(lock) = &self.lock else { return };
        let text = pfs_shm_layout::files::collected_text(
            (state.pending.iter().map(|p| &p.id))
                .chain(&state.absorbed)
                .map(|a| (a.ino, a.start_time_unix_ns)),
        );
        if let Err(e) = lock
            .write_all_at(text.as_bytes(), 0)
            .and_then(|()| lock.set_len(text.len() as u64))
        {
            tracing::debug!(error = %e, "cannot list the collected segments in {LOCK_FILE}");
        }
    }

    /// Removes the reserve; whether there was one.
    fn give_back_reserve(&self) -> bool {
        std::fs::remove_file(self.dir.join(RESERVE_FILE)).is_ok()
    }

    /// Keeps space for the next save ([`RESERVE_FILE`]), sized for the
    /// state file as it is: for an agent that just became the owner.
    pub fn prepare(&self) {
        if self.role == Role::Owner {
            let len = std::fs::symlink_metadata(self.state_path()).map_or(0, |m| m.len());
            self.keep_reserve(len);
        }
    }

    /// Makes the reserve hold at least [`RESERVE_MIN_BYTES`] and twice
    /// `state_len` (the temporary file and the state it replaces both
    /// exist for a moment). Best effort: without room (or rights) there is
    /// no reserve, and saving goes on without one.
    fn keep_reserve(&self, state_len: u64) {
        let want = RESERVE_MIN_BYTES.max(2 * state_len);
        let path = self.dir.join(RESERVE_FILE);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() >= want) {
            return;
        }
        if let Err(e) = pfs_shm_layout::segment::within_file_size_limit(want) {
            // `fallocate` past the limit raises SIGXFSZ: no reserve.
            tracing::debug!(error = %e, "cannot keep space for the state file");
            return;
        }
        let made = nofollow(OFlags::NONBLOCK | OFlags::NOCTTY)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .and_then(|f| {
                rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, want)
                    .map_err(std::io::Error::from)
            });
        if let Err(e) = made {
            tracing::debug!(path = %crate::util::shown::path(&path), error = %e, "cannot keep space for the state file");
            // An empty reserve would be given back for nothing.
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() == 0) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Whether `e` says the volume (or a quota) is full.
fn no_space(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

type Loaded = Option<(State, (u64, i64, u64))>;

fn read_state(path: &Path, own_only: bool) -> Result<Loaded, StateError> {
    match read_capped(path, MAX_STATE_BYTES)? {
        None => Ok(None),
        Some((_, meta)) if own_only && meta.uid() != rustix::process::geteuid().as_raw() => {
            Err(StateError::ForeignOwner(meta.uid()))
        }
        Some((buf, meta)) => decode(&buf).map(|s| Some((s, stamp(&meta)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_shm_layout::reader::MemoryStats;
    use std::os::unix::fs::FileTypeExt;

    fn sample() -> State {
        let mut t = ServiceTotals::default();
        let mut s = Summary {
            count: 7,
            timed_count: 6,
            sum_ps: u128::from(u64::MAX) * 3,
            min_ps: 10,
            max_ps: 1 << 40,
            bytes: 99,
            scale: BucketScale::Long,
            ..Summary::default()
        };
        s.buckets[3] = 6;
        s.statement.rows_sent = 5;
        s.statement.cpu_time_ps = 4_000_000;
        s.statement.cancelled = 3;
        t.classes
            .insert("statement/test/q".into(), (ClassKind::Statement, s));
        t.classes.insert(
            "wait/synch/mutex/test/a".into(),
            (ClassKind::Mutex, Summary::default()),
        );
        t.memory.insert(
            "memory/test/buf".into(),
            MemoryStats {
                count_alloc: 3,
                low_bytes: -5,
                high_bytes: 700,
                ..MemoryStats::default()
            },
        );
        t.lost[2] = 4;
        t.abandoned.insert("statement/test/q".into(), 2);
        let mut retired = Retired::default();
        retired.by_service.insert("svc".into(), t);
        retired
            .earliest_start_ns
            .insert("svc".into(), 1_600_000_000_000_000_000);
        State {
            retired,
            retired_segments: 12,
            absorbed: vec![Absorbed {
                file: "svc.42.pfs".into(),
                ino: 17,
                pid: 42,
                start_time_unix_ns: 1_700_000_000_000_000_000,
            }],
            pending: Vec::new(),
        }
    }

    fn same_retired(a: &Retired, b: &Retired) {
        assert_eq!(a.earliest_start_ns, b.earliest_start_ns);
        assert_eq!(
            a.by_service.keys().collect::<Vec<_>>(),
            b.by_service.keys().collect::<Vec<_>>()
        );
        for (k, x) in &a.by_service {
            let y = &b.by_service[k];
            assert_eq!(x.classes, y.classes);
            assert_eq!(x.memory, y.memory);
            assert_eq!(x.lost, y.lost);
            assert_eq!(x.abandoned, y.abandoned);
        }
    }

    fn same(a: &State, b: &State) {
        assert_eq!(a.retired_segments, b.retired_segments);
        assert_eq!(a.absorbed, b.absorbed);
        same_retired(&a.retired, &b.retired);
        assert_eq!(a.pending.len(), b.pending.len());
        for (pa, pb) in a.pending.iter().zip(&b.pending) {
            assert_eq!(pa.id, pb.id);
            assert_eq!(pa.died_unix_ns, pb.died_unix_ns);
            same_retired(&pa.totals, &pb.totals);
        }
    }

    #[test]
    fn round_trip_is_exact() {
        let mut s = sample();
        s.pending.push(Pending {
            id: Absorbed {
                file: "svc.1.pfs".into(),
                ino: 23,
                pid: 1,
                start_time_unix_ns: 1_700_000_000_000_000_001,
            },
            totals: s.retired.clone(),
            died_unix_ns: 1_700_000_000_500_000_000,
        });
        let back = decode(&encode(&s)).unwrap();
        same(&s, &back);
        // A file without pending segments (an older agent's) loads.
        let back = decode(&encode(&sample())).unwrap();
        assert!(back.pending.is_empty());
        // So does one without abandoned statements (an older agent's, or
        // none): none.
        let text = String::from_utf8(encode(&sample())).unwrap();
        assert!(text.contains("\"abandoned\""), "{text}");
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["services"]["svc"]
            .as_object_mut()
            .unwrap()
            .remove("abandoned")
            .unwrap();
        let back = decode(v.to_string().as_bytes()).unwrap();
        assert!(back.retired.by_service["svc"].abandoned.is_empty());
    }

    /// Each save lists in the lock file the dead segments the state holds
    /// (pending and absorbed), for applications that replace them; a save
    /// of fewer cuts the list.
    #[test]
    fn a_save_lists_the_collected_segments_in_the_lock_file() {
        use pfs_shm_layout::files::agent_collected;
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::new(dir.path());
        store.elect();
        let mut s = sample();
        s.pending.push(Pending {
            id: Absorbed {
                file: "svc.1.pfs".into(),
                ino: 23,
                pid: 1,
                start_time_unix_ns: 5,
            },
            totals: Retired::default(),
            died_unix_ns: 0,
        });
        store.save(&s).unwrap();
        let absorbed = &s.absorbed[0];
        assert!(agent_collected(dir.path(), 23, 5), "pending");
        assert!(agent_collected(
            dir.path(),
            absorbed.ino,
            absorbed.start_time_unix_ns
        ));
        assert!(!agent_collected(dir.path(), 23, 6));
        s.pending.clear();
        store.save(&s).unwrap();
        assert!(!agent_collected(dir.path(), 23, 5), "retired and removed");
        assert!(agent_collected(
            dir.path(),
            absorbed.ino,
            absorbed.start_time_unix_ns
        ));
    }

    /// Under `--require-owner`, a state file that another user planted
    /// (forged totals) is not read but set aside; the agent's own is read.
    /// (The planted file needs root to make: without root, only the
    /// agent's own file is checked.)
    #[test]
    fn only_the_agents_own_state_file_is_read_when_owners_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::new(dir.path());
        store.own_files_only();
        store.save(&sample()).unwrap();
        assert_eq!(store.load().retired_segments, 12, "the agent's own file");
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let path = store.state_path();
        std::os::unix::fs::chown(&path, Some(12345), None).unwrap();
        let mut store = Store::new(dir.path());
        store.own_files_only();
        assert_eq!(
            store.load().retired_segments,
            0,
            "a planted file is not read"
        );
        assert!(dir.path().join(CORRUPT_FILE).exists(), "it is set aside");
        // Without the check (no --require-owner), any owner is read.
        std::fs::rename(dir.path().join(CORRUPT_FILE), &path).unwrap();
        assert_eq!(Store::new(dir.path()).load().retired_segments, 12);
    }

    /// Merging retired totals adds them: twice the sample is the sample
    /// with every count doubled.
    #[test]
    fn merged_totals_add_up() {
        let one = sample().retired;
        let mut two = one.clone();
        two.merge(&one);
        let (x, y) = (&one.by_service["svc"], &two.by_service["svc"]);
        for (name, (_, s)) in &x.classes {
            assert_eq!(y.classes[name].1.count, 2 * s.count, "{name}");
        }
        for (name, m) in &x.memory {
            assert_eq!(y.memory[name].count_alloc, 2 * m.count_alloc, "{name}");
        }
        assert_eq!(y.lost[2], 2 * x.lost[2]);
        assert_eq!(two.earliest_start_ns, one.earliest_start_ns);
    }

    /// A state file written before retired totals kept their processes'
    /// earliest start loads, the start unknown.
    #[test]
    fn a_state_file_without_starts_loads_with_unknown_starts() {
        let mut v: serde_json::Value = serde_json::from_slice(&encode(&sample())).unwrap();
        let svc = v["services"]["svc"].as_object_mut().unwrap();
        assert!(svc.remove("earliest_start_unix_ns").is_some());
        let back = decode(v.to_string().as_bytes()).unwrap();
        assert!(back.retired.by_service.contains_key("svc"));
        assert!(back.retired.earliest_start_ns.is_empty());
    }

    /// A state file written before `SUM_CPU_TIME` and `COUNT_CANCELLED`
    /// loads: both zero, everything else as written.
    #[test]
    fn a_state_file_without_cpu_time_and_cancellations_loads() {
        let mut v: serde_json::Value = serde_json::from_slice(&encode(&sample())).unwrap();
        let class = &mut v["services"]["svc"]["classes"]["statement/test/q"];
        assert_eq!(class["cpu_time_ps"], 4_000_000);
        let m = class.as_object_mut().unwrap();
        m.remove("cpu_time_ps").unwrap();
        m.remove("cancelled").unwrap();
        let back = decode(v.to_string().as_bytes()).unwrap();
        let mut want = sample();
        let (_, s) = want
            .retired
            .by_service
            .get_mut("svc")
            .unwrap()
            .classes
            .get_mut("statement/test/q")
            .unwrap();
        s.statement.cpu_time_ps = 0;
        s.statement.cancelled = 0;
        same(&want, &back);
    }

    /// A state file an agent wrote before layout 8.0 (version 1, no `bucket_scale`:
    /// every kind's histogram in the wait scale) loads with its stages'
    /// and statements' buckets moved to the long scale, its waits' as
    /// they were: a retired service's statement above 8 s is then in
    /// (8 s, 16 s], as a live process's of that service would be.
    #[test]
    fn a_state_file_of_the_wait_scale_loads_in_each_kind_s_scale() {
        let mut v: serde_json::Value = serde_json::from_slice(&encode(&sample())).unwrap();
        assert_eq!(v["version"], 2);
        v["version"] = 1.into();
        let classes = &mut v["services"]["svc"]["classes"];
        let mut old_buckets = vec![0u64; pfs_shm_layout::layout::HISTOGRAM_BUCKETS];
        old_buckets[pfs_shm_layout::layout::bucket_index(1_000_000)] = 2; // 1 µs
        old_buckets[pfs_shm_layout::layout::HISTOGRAM_BUCKETS - 1] = 1; // above 8 s
        for class in ["statement/test/q", "wait/synch/mutex/test/a"] {
            let c = classes[class].as_object_mut().unwrap();
            c.remove("bucket_scale");
            c.insert("buckets".into(), serde_json::json!(old_buckets));
        }
        let back = decode(v.to_string().as_bytes()).unwrap();
        let classes = &back.retired.by_service["svc"].classes;
        let long = BucketScale::Long;
        let (_, q) = &classes["statement/test/q"];
        assert_eq!(q.scale, long);
        assert_eq!(q.buckets[long.index(1_000_000)], 2);
        assert_eq!(q.buckets[long.index(16_000_000_000_000)], 1);
        assert_eq!(q.buckets.iter().sum::<u64>(), 3);
        let (_, a) = &classes["wait/synch/mutex/test/a"];
        assert_eq!(a.scale, BucketScale::Short);
        assert_eq!(a.buckets.to_vec(), old_buckets);
    }

    /// A state file of a newer version (an agent downgrade) is left as it
    /// is for the newer agent: not set aside, not overwritten.
    #[test]
    fn a_newer_agents_state_file_is_kept_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&encode(&sample())).unwrap();
        v["version"] = (VERSION + 1).into();
        v["a_newer_field"] = 1.into();
        // Another shape: a field this agent requires is gone.
        v.as_object_mut().unwrap().remove("services");
        let text = v.to_string();
        let path = dir.path().join(STATE_FILE);
        std::fs::write(&path, &text).unwrap();
        let mut store = Store::new(dir.path());
        store.elect();
        let state = store.load();
        assert!(state.retired.by_service.is_empty());
        assert!(store.save(&sample()).is_err(), "not overwritten");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        assert!(!dir.path().join(CORRUPT_FILE).exists(), "not set aside");
    }

    #[test]
    fn corrupt_files_are_refused_with_a_reason() {
        assert!(matches!(decode(b"{"), Err(StateError::Json(_))));
        let mut v: serde_json::Value = serde_json::from_slice(&encode(&sample())).unwrap();
        v["version"] = 99.into();
        assert!(matches!(
            decode(v.to_string().as_bytes()),
            Err(StateError::Version(99))
        ));
        let mut v: serde_json::Value = serde_json::from_slice(&encode(&sample())).unwrap();
        v["services"]["svc"]["classes"]["statement/test/q"]["buckets"] = serde_json::json!([1, 2]);
        assert!(matches!(
            decode(v.to_string().as_bytes()),
            Err(StateError::Summary(JsonError::Buckets { found: 2, .. }))
        ));
    }

    #[test]
    fn store_saves_loads_and_sets_corrupt_files_aside() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Store::new(dir.path());
        a.elect();
        assert_eq!(a.role(), Role::Owner);
        assert!(a.load().retired.by_service.is_empty());
        let s = sample();
        a.save(&s).unwrap();
        assert!(!a.changed());
        // A second agent on the same directory follows and reads the same.
        let mut b = Store::new(dir.path());
        b.elect();
        assert_eq!(b.role(), Role::Follower);
        same(&s, &b.load());
        // Corrupt the file: the owner sets it aside and starts empty.
        std::fs::write(a.state_path(), b"{\"format\": 3").unwrap();
        assert!(a.changed());
        assert!(a.load().retired.by_service.is_empty());
        assert!(dir.path().join(CORRUPT_FILE).exists());
        assert!(!a.state_path().exists());
        // The follower takes over once the owner's lock is gone.
        assert_eq!(b.elect(), Elected::Unchanged, "still a follower");
        drop(a);
        assert_eq!(b.elect(), Elected::Promoted);
        assert_eq!(b.elect(), Elected::Unchanged, "an owner stays the owner");
        assert_eq!(b.role(), Role::Owner);
    }

    /// Owner and follower keep the heartbeat a writer reads before it
    /// replaces a dead segment; it goes stale once no agent beats.
    #[test]
    fn agents_beat_on_the_lock_file() {
        use pfs_shm_layout::files::{AGENT_HEARTBEAT_FRESH, agent_watched};
        let dir = tempfile::tempdir().unwrap();
        let since = std::time::SystemTime::now() - AGENT_HEARTBEAT_FRESH / 2;
        let agent_watches = |d: &Path| agent_watched(d, since);
        let stale = std::time::SystemTime::now() - AGENT_HEARTBEAT_FRESH * 2;
        let set_stale = || {
            let f = std::fs::File::options()
                .write(true)
                .open(dir.path().join(LOCK_FILE));
            f.unwrap().set_modified(stale).unwrap();
        };
        let mut owner = Store::new(dir.path());
        owner.elect();
        let mut follower = Store::new(dir.path());
        follower.elect();
        assert_eq!(follower.role(), Role::Follower);
        for beating in [&mut owner, &mut follower] {
            set_stale();
            assert!(!agent_watches(dir.path()));
            beating.beat();
            assert!(agent_watches(dir.path()));
        }
    }

    /// The directory removed and made again under its owner: the owner
    /// takes the new directory's lock, so a second agent there follows
    /// instead of owning it too; and while the directory is gone, the owner
    /// stays the owner.
    #[test]
    fn an_owner_takes_the_lock_of_a_directory_made_again() {
        let parent = tempfile::tempdir().unwrap();
        let d = parent.path().join("segments");
        std::fs::create_dir(&d).unwrap();
        let mut a = Store::new(&d);
        assert_eq!(a.elect(), Elected::Locked);
        assert_eq!(a.elect(), Elected::Unchanged);
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(a.elect(), Elected::Unchanged);
        assert_eq!(a.role(), Role::Owner);
        std::fs::create_dir(&d).unwrap();
        assert_eq!(a.elect(), Elected::Locked);
        let mut b = Store::new(&d);
        assert_eq!(b.elect(), Elected::Unchanged);
        assert_eq!(b.role(), Role::Follower);
        assert_eq!(a.elect(), Elected::Unchanged);
        assert_eq!(a.role(), Role::Owner);
        // A follower waiting on the old lock file is not promoted when the
        // owner leaves it for the new directory's.
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::create_dir(&d).unwrap();
        assert_eq!(a.elect(), Elected::Locked);
        assert_eq!(b.elect(), Elected::Unchanged);
        assert_eq!(b.role(), Role::Follower, "two owners");
        // Made again with the follower first: it takes the new lock, the
        // old owner follows.
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::create_dir(&d).unwrap();
        assert_eq!(b.elect(), Elected::Locked);
        assert_eq!(a.elect(), Elected::Unchanged);
        assert_eq!((a.role(), b.role()), (Role::Follower, Role::Owner));
    }

    #[test]
    fn state_file_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere.json");
        std::fs::write(&target, encode(&sample())).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(STATE_FILE)).unwrap();
        let mut a = Store::new(dir.path());
        a.elect();
        assert!(a.load().retired.by_service.is_empty());
        // Saving replaces the link itself, never writes through it.
        a.save(&State::default()).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), encode(&sample()));
    }

    /// A FIFO planted as the state file neither blocks the load nor costs
    /// an earlier `.corrupt` file: it is set aside beside it.
    #[test]
    fn a_fifo_state_file_is_set_aside_without_blocking_or_replacing() {
        let dir = tempfile::tempdir().unwrap();
        let earlier = dir.path().join(CORRUPT_FILE);
        std::fs::write(&earlier, b"an earlier corrupt state").unwrap();
        let path = dir.path().join(STATE_FILE);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let d = dir.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut a = Store::new(&d);
            a.elect();
            tx.send(a.load().retired_segments).unwrap();
        });
        let loaded = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("loading a FIFO state file blocked");
        assert_eq!(loaded, 0);
        assert_eq!(
            std::fs::read(&earlier).unwrap(),
            b"an earlier corrupt state"
        );
        let aside = dir.path().join(format!("{CORRUPT_FILE}.1"));
        assert!(
            std::fs::symlink_metadata(&aside)
                .unwrap()
                .file_type()
                .is_fifo()
        );
        assert!(std::fs::symlink_metadata(&path).is_err());
    }

    /// An unusable state file that cannot be set aside is never replaced.
    #[test]
    fn an_unusable_state_file_that_stays_is_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        std::fs::write(&path, b"{ not json").unwrap();
        // Every set-aside name is taken.
        std::fs::create_dir(dir.path().join(CORRUPT_FILE)).unwrap();
        for n in 1..10 {
            std::fs::create_dir(dir.path().join(format!("{CORRUPT_FILE}.{n}"))).unwrap();
        }
        std::fs::write(dir.path().join(CORRUPT_FILE).join("keep"), b"x").unwrap();
        let mut a = Store::new(dir.path());
        a.elect();
        assert_eq!(a.load().retired_segments, 0);
        let e = a.save(&sample()).unwrap_err().to_string();
        assert!(e.contains("move it away"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"{ not json");
        // Once it is moved away, saving works again.
        std::fs::rename(&path, dir.path().join("elsewhere")).unwrap();
        a.save(&sample()).unwrap();
        same(&sample(), &a.load());
    }
}
