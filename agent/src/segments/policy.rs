//! Which files of the directory are accepted: opened without following
//! links or blocking, then judged on the open descriptor (regular file,
//! not world-writable, owner, size) before the segment is validated; a
//! validation error is then explained from the file's header (a file still
//! being created is not refused, an undefined state is corrupt). Layer 3,
//! under [`super`].

use std::fs::{File, Metadata};
use std::mem::{offset_of, size_of};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use pfs_shm_layout::layout::{
    Header, MAX_SECTIONS, PAGE, SEGMENT_INITIALIZING, SEGMENT_READY, SectionEntry,
};
use pfs_shm_layout::{Segment, SegmentError};
use rustix::fs::OFlags;

use super::liveness::owner_is_dead;
use super::refusal::{Refusal, Refused};
use crate::util::fs::open_nofollow;

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
/// about 112 MiB, mostly sparse), the layout's
/// [`pfs_shm_layout::geometry::DEFAULT_MAX_SEGMENT_BYTES`], which
/// pfs-client does not exceed.
pub const DEFAULT_MAX_SEGMENT_SIZE: u64 = pfs_shm_layout::geometry::DEFAULT_MAX_SEGMENT_BYTES;

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
pub(super) struct Identity {
    uid: u32,
    gids: Vec<u32>,
}

impl Identity {
    pub(super) fn current() -> Self {
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

/// The refusal of a symbolic link.
pub(super) fn symlink() -> Refused {
    Refused::new(
        Refusal::Symlink,
        "is a symbolic link; segments are never followed through links",
    )
}

/// The refusal of a second name of segment file `first`.
pub(super) fn duplicate(first: &Path) -> Refused {
    Refused::new(
        Refusal::Duplicate,
        format!(
            "is a hard link to {}, read under that name: its counts would be read twice; remove the link",
            crate::util::shown::path(first)
        ),
    )
}

/// The refusal of a directory, FIFO, socket or device.
pub(super) fn not_regular(meta: &Metadata) -> Refused {
    let what = if meta.is_dir() {
        "a directory"
    } else {
        "a FIFO, socket or device"
    };
    Refused::new(
        Refusal::NotRegular,
        format!("is {what}, not a regular file"),
    )
}

/// The refusal of a file the agent may not open: whose it is, and the
/// two ways to let the agent read it; or, if its mode would let the agent
/// read it, that something else denies it. An empty file is one being
/// created (a creator under `umask 077` makes it `0600` before its
/// `chmod 0660`): retried silently as one, not called a permission
/// problem.
pub(super) fn permission_denied(path: &Path, me: &Identity) -> Refused {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return Refused::new(
            Refusal::PermissionDenied,
            "the agent may not open it, nor examine it: check the permissions of the segment directory and of its parents",
        );
    };
    if m.len() == 0 {
        return Refused::new(Refusal::Empty, "an empty file the agent may not open (yet)");
    }
    let mode = m.mode() & 0o7777;
    let readable = (m.uid() == me.uid && mode & 0o400 != 0)
        || (me.gids.contains(&m.gid()) && mode & 0o040 != 0)
        || mode & 0o004 != 0;
    let file = format!("mode {mode:04o}, owner uid {} gid {}", m.uid(), m.gid());
    let mut groups = me.gids.clone();
    groups.sort_unstable();
    groups.dedup();
    let message = if readable {
        format!(
            "the agent (uid {}, groups {groups:?}) may not open it although its mode allows it ({file}): something else denies it (SELinux, AppArmor, a seccomp or mount policy); the agent's log has the error",
            me.uid
        )
    } else {
        format!(
            "the agent (uid {}, groups {groups:?}) may not read it ({file}): start the application with PFS_GROUP_ACCESS=1 (segments 0660) in a group of the agent's (in Kubernetes: the pod's fsGroup), or run the agent as the application's user",
            me.uid
        )
    };
    Refused::new(Refusal::PermissionDenied, message)
}

impl Policy {
    /// Whether `serve` would accept the file at `path` under this policy
    /// (links, file type, permissions, owner, size, validation), for a
    /// tool that writes into segments (`pfs-agent setup`): it must never
    /// write into a file the agent refuses to read.
    pub fn check(&self, path: &Path) -> Result<(), Refused> {
        self.open(path, &Identity::current()).map(drop)
    }

    /// Opens `path` without following links or blocking, applies the
    /// policy to the open descriptor (so a file swapped in after the
    /// `lstat` is judged itself), then validates it.
    pub(super) fn open(&self, path: &Path, me: &Identity) -> Result<Segment, Refused> {
        let file = open_nofollow(path, OFlags::NONBLOCK | OFlags::NOCTTY).map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                symlink()
            } else if e.kind() == std::io::ErrorKind::PermissionDenied {
                permission_denied(path, me)
            } else {
                Refused::new(Refusal::Io, format!("cannot open the segment: {e}"))
            }
        })?;
        let meta = file
            .metadata()
            .map_err(|e| Refused::new(Refusal::Io, format!("cannot stat the segment: {e}")))?;
        if !meta.file_type().is_file() {
            return Err(not_regular(&meta));
        }
        let mode = meta.mode();
        if mode & 0o002 != 0 {
            return Err(Refused::new(
                Refusal::WorldWritable,
                format!(
                    "has mode {:04o}: any user could write it; segments are created 0600 or 0660 (chmod o-w, or remove it)",
                    mode & 0o7777
                ),
            ));
        }
        match self.owner {
            OwnerPolicy::Any => {}
            OwnerPolicy::Uid if meta.uid() != me.uid => {
                return Err(Refused::new(
                    Refusal::ForeignOwner,
                    format!(
                        "is owned by uid {}, not the agent's uid {} (--require-owner uid); run the application as the same user or relax --require-owner",
                        meta.uid(),
                        me.uid
                    ),
                ));
            }
            OwnerPolicy::Group if !me.gids.contains(&meta.gid()) => {
                return Err(Refused::new(
                    Refusal::ForeignOwner,
                    format!(
                        "has group {}, not one of the agent's groups {:?} (--require-owner group); share a group (e.g. fsGroup) or relax --require-owner",
                        meta.gid(),
                        me.gids
                    ),
                ));
            }
            OwnerPolicy::Uid | OwnerPolicy::Group => {}
        }
        if meta.len() > self.max_size {
            return Err(Refused::new(
                Refusal::TooLarge,
                format!(
                    "is {} bytes, more than --max-segment-size {}; raise it if this is a real, very large segment",
                    meta.len(),
                    self.max_size
                ),
            ));
        }
        let probe = file.try_clone().map_err(|e| {
            Refused::new(Refusal::Io, format!("cannot duplicate the descriptor: {e}"))
        })?;
        Segment::open(file, false).map_err(|e| explain(&probe, e))
    }
}

/// The refusal for a validation error `e` of `file`, after a second look
/// at its header (copied with `pread`: these bytes only explain a refusal,
/// they are never used as a segment):
///
/// * a file its creator is still writing is `not_ready` (retried silently
///   for the grace time): the first page still all zeros (sized, header
///   not written yet), or no magic yet or shorter than its header says
///   while a process holds its lock (creators lock the file before sizing
///   it; an empty file is never probed, its creator may not hold the lock
///   yet, and a probe could make its lock attempt fail);
/// * a header marked neither initialising nor ready is `corrupt`, at once;
/// * a section that is misaligned or overlaps the header says so.
fn explain(file: &File, e: SegmentError) -> Refused {
    let mut page = vec![0u8; PAGE];
    let got = read_prefix(file, &mut page);
    let page = &page[..got];
    let word = |off: usize, n: usize| -> Option<u64> {
        let b = page.get(off..off + n)?;
        let mut w = [0u8; 8];
        w[..n].copy_from_slice(b);
        Some(u64::from_le_bytes(w))
    };
    let creating = |what: &str| {
        Refused::new(
            Refusal::NotReady,
            format!("{what}: its creator is still writing it"),
        )
    };
    match &e {
        SegmentError::BadMagic(0) if got > 0 && page.iter().all(|&b| b == 0) => {
            creating("its header is still all zeros")
        }
        SegmentError::BadMagic(0) if got > 0 && !owner_is_dead(file) => {
            creating("it has no magic yet and a process holds its lock")
        }
        SegmentError::Truncated { len, need } if *len > 0 && !owner_is_dead(file) => creating(
            &format!("it is {len} bytes, its header needs {need}, and a process holds its lock"),
        ),
        SegmentError::NotReady => match word(offset_of!(Header, state), 8) {
            Some(state) if state != SEGMENT_INITIALIZING && state != SEGMENT_READY => Refused::new(
                Refusal::Corrupt,
                format!(
                    "segment is corrupt: its header's state word is {state:#x}, neither {SEGMENT_INITIALIZING} (initialising) nor {SEGMENT_READY} (ready); the file was damaged or is not a pfs segment: remove it"
                ),
            ),
            _ => e.into(),
        },
        SegmentError::Corrupt(msg) => match misplaced_section(&word, msg) {
            Some(why) => Refused::new(Refusal::Corrupt, format!("segment is corrupt: {why}")),
            None => e.into(),
        },
        _ => e.into(),
    }
}

/// Reads up to `buf.len()` bytes from the start of `file`; returns how
/// many (0 on an error: nothing to explain with).
fn read_prefix(file: &File, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], got as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    got
}

/// The real fault of the section the validator reported as "lies
/// outside" (its message `msg`), if it is misaligned or overlaps the
/// header; `word(offset, bytes)` reads the header.
fn misplaced_section(word: &impl Fn(usize, usize) -> Option<u64>, msg: &str) -> Option<String> {
    let count = (word(offset_of!(Header, section_count), 4)? as usize).min(MAX_SECTIONS);
    (0..count).find_map(|i| {
        let at = offset_of!(Header, sections) + i * size_of::<SectionEntry>();
        let kind = word(at + offset_of!(SectionEntry, kind), 4)?;
        let off = word(at + offset_of!(SectionEntry, offset), 8)?;
        if !msg.starts_with(&format!("section kind {kind} at offset {off} ")) {
            return None;
        }
        let page = PAGE as u64;
        if off < page {
            Some(format!(
                "section kind {kind} at offset {off:#x} overlaps the {page}-byte header (sections start at offset {page:#x} or later); the header is damaged: remove the file"
            ))
        } else if off % page != 0 {
            Some(format!(
                "section kind {kind} at offset {off:#x} is not aligned to {page} bytes (every section starts on a page boundary); the header is damaged: remove the file"
            ))
        } else {
            None
        }
    })
}
