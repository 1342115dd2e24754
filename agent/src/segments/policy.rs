//! Which files of the directory are accepted: opened without following
//! links or blocking, then judged on the open descriptor (regular file,
//! not world-writable, owner, size) before the segment is validated.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use pfs_shm_layout::Segment;
use rustix::fs::OFlags;

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

impl Policy {
    /// Opens `path` without following links or blocking, applies the
    /// policy to the open descriptor (so a file swapped in after the
    /// `lstat` is judged itself), then validates it.
    pub(super) fn open(&self, path: &Path, me: &Identity) -> Result<Segment, Refused> {
        let file = open_nofollow(path, OFlags::NONBLOCK | OFlags::NOCTTY).map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                symlink()
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
        Ok(Segment::open(file, false)?)
    }
}
