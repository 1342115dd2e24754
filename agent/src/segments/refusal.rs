//! Why a file of the segment directory is not exported: every reason,
//! with its metric label and its meaning (the table in
//! `docs/SECURITY-segments.md` is checked against [`Refusal::ALL`]).

use pfs_shm_layout::SegmentError;

/// A reason to refuse (or drop) a segment file. Counted in
/// `pfs_agent_segment_errors_total{reason}` under [`Refusal::label`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// Zero-length file.
    Empty,
    /// Shorter than its header.
    Truncated,
    /// Not a pfs segment.
    BadMagic,
    /// Written by a process of the other byte order.
    ByteOrder,
    /// A layout major version this agent does not read.
    UnsupportedVersion,
    /// Inconsistent header.
    Corrupt,
    /// Still being initialised by its creator after the grace time.
    NotReady,
    /// A symbolic link.
    Symlink,
    /// A second name (hard link) of a segment file read under another name.
    Duplicate,
    /// Not a regular file.
    NotRegular,
    /// Writable by any user.
    WorldWritable,
    /// Owner not allowed by the owner policy.
    ForeignOwner,
    /// The agent may not open it (its mode and owner).
    PermissionDenied,
    /// Larger than the size limit.
    TooLarge,
    /// Truncated while mapped.
    Shrunk,
    /// Reading it raised `SIGBUS`.
    Unreadable,
    /// Its mapping could not be registered for `SIGBUS` recovery.
    Unprotected,
    /// A segment configuration a reader never sees (creation only).
    BadConfig,
    /// No space to reserve (creation only).
    NoSpace,
    /// A system call failed.
    Io,
    /// Threads exited faster than a snapshot could be taken.
    FoldStorm,
    /// The global section stayed locked by one unfinished write (a fold
    /// its writer never finished).
    GlobalLockStuck,
}

impl Refusal {
    /// Every reason a segment directory can count, in documentation order:
    /// each is exported from the start, at 0, in
    /// `pfs_agent_segment_errors_total{reason}`.
    pub const ALL: [Refusal; 19] = [
        Refusal::Empty,
        Refusal::Truncated,
        Refusal::BadMagic,
        Refusal::ByteOrder,
        Refusal::UnsupportedVersion,
        Refusal::Corrupt,
        Refusal::NotReady,
        Refusal::Symlink,
        Refusal::Duplicate,
        Refusal::NotRegular,
        Refusal::WorldWritable,
        Refusal::ForeignOwner,
        Refusal::PermissionDenied,
        Refusal::TooLarge,
        Refusal::Shrunk,
        Refusal::Unreadable,
        Refusal::Unprotected,
        Refusal::Io,
        Refusal::GlobalLockStuck,
    ];

    /// Whether the refusal depends on what the file holds (and so may
    /// change whenever it is written), not only on what the file is: its
    /// type, owner, mode and names. A file refused for the latter is
    /// considered again when those change, not at every write of a live
    /// process (whose mapped writes move its times).
    pub fn depends_on_content(self) -> bool {
        !matches!(
            self,
            Refusal::Symlink
                | Refusal::Duplicate
                | Refusal::NotRegular
                | Refusal::WorldWritable
                | Refusal::ForeignOwner
                | Refusal::PermissionDenied
        )
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Empty => "empty",
            Refusal::Truncated => "truncated",
            Refusal::BadMagic => "bad_magic",
            Refusal::ByteOrder => "byte_order",
            Refusal::UnsupportedVersion => "unsupported_version",
            Refusal::Corrupt => "corrupt",
            Refusal::NotReady => "not_ready",
            Refusal::Symlink => "symlink",
            Refusal::Duplicate => "duplicate",
            Refusal::NotRegular => "not_regular",
            Refusal::WorldWritable => "world_writable",
            Refusal::ForeignOwner => "foreign_owner",
            Refusal::PermissionDenied => "permission_denied",
            Refusal::TooLarge => "too_large",
            Refusal::Shrunk => "shrunk",
            Refusal::Unreadable => "unreadable",
            Refusal::Unprotected => "unprotected",
            Refusal::BadConfig => "bad_config",
            Refusal::NoSpace => "no_space",
            Refusal::Io => "io",
            Refusal::FoldStorm => "fold_storm",
            Refusal::GlobalLockStuck => "global_lock_stuck",
        }
    }

    /// What it means, for the documentation.
    pub fn meaning(self) -> &'static str {
        match self {
            Refusal::Empty => "zero-length file, still empty after 10 s",
            Refusal::Truncated => "shorter than its header (or than one header page)",
            Refusal::BadMagic => "not a pfs segment (random bytes, other files)",
            Refusal::ByteOrder => "written by a process of the other byte order",
            Refusal::UnsupportedVersion => "layout major version this agent does not read",
            Refusal::Corrupt => "inconsistent header: offsets, sizes or counts out of range",
            Refusal::NotReady => {
                "still not initialised by its creator after 10 s (kept being retried)"
            }
            Refusal::Symlink => "a symbolic link (never followed)",
            Refusal::Duplicate => {
                "a second name (hard link) of a segment read under another name: read once"
            }
            Refusal::NotRegular => "a directory, FIFO, socket or device",
            Refusal::WorldWritable => "file mode allows writes by any user",
            Refusal::ForeignOwner => "owner not allowed by --require-owner uid|group",
            Refusal::PermissionDenied => {
                "the agent may not read it (mode and owner): an application of another user without PFS_GROUP_ACCESS=1"
            }
            Refusal::TooLarge => "larger than --max-segment-size",
            Refusal::Shrunk => "file truncated while the agent had it mapped",
            Refusal::Unreadable => "reading the mapping raised SIGBUS (I/O error, full tmpfs)",
            Refusal::Unprotected => "the mapping could not be registered for SIGBUS recovery",
            Refusal::BadConfig => "a segment configuration only its creator can get wrong",
            Refusal::NoSpace => "no space to reserve a region (creation only)",
            Refusal::Io => "open, stat or mmap failed",
            Refusal::FoldStorm => "threads exited faster than a snapshot could be taken",
            Refusal::GlobalLockStuck => {
                "the global section stayed locked by one unfinished thread-exit fold (process stopped, or died in it)"
            }
        }
    }

    /// The reason for a validation or read error.
    pub fn of(e: &SegmentError) -> Refusal {
        match e {
            SegmentError::Truncated { len: 0, .. } => Refusal::Empty,
            SegmentError::Truncated { .. } => Refusal::Truncated,
            SegmentError::BadMagic(_) => Refusal::BadMagic,
            SegmentError::ByteOrder(_) => Refusal::ByteOrder,
            SegmentError::UnsupportedVersion { .. } => Refusal::UnsupportedVersion,
            SegmentError::NotReady => Refusal::NotReady,
            SegmentError::Corrupt(_) => Refusal::Corrupt,
            SegmentError::BadConfig(_) => Refusal::BadConfig,
            SegmentError::NoSpace(_) | SegmentError::FileSizeLimit { .. } => Refusal::NoSpace,
            SegmentError::Io(..) => Refusal::Io,
            SegmentError::FoldStorm(_) => Refusal::FoldStorm,
            SegmentError::GlobalLockStuck { .. } => Refusal::GlobalLockStuck,
            SegmentError::Shrunk { .. } => Refusal::Shrunk,
            // (`Faulted` is the creator's own: a reader meets `Unreadable`.)
            SegmentError::Unreadable | SegmentError::Faulted => Refusal::Unreadable,
            SegmentError::Protect(_) => Refusal::Unprotected,
        }
    }
}

/// A refused file: the reason and a message for the log that says what to
/// do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    /// The reason.
    pub reason: Refusal,
    /// What is wrong and what to do.
    pub message: String,
}

impl Refused {
    /// A refusal for `reason` with `message`.
    pub fn new(reason: Refusal, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

impl From<SegmentError> for Refused {
    fn from(e: SegmentError) -> Self {
        Self::new(Refusal::of(&e), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn every_reason_a_reader_meets_is_listed_and_documented() {
        let samples = [
            SegmentError::Truncated { len: 0, need: 1 },
            SegmentError::Truncated { len: 1, need: 2 },
            SegmentError::BadMagic(0),
            SegmentError::ByteOrder(0),
            SegmentError::UnsupportedVersion {
                found: 9,
                supported: 2,
                oldest: 1,
            },
            SegmentError::NotReady,
            SegmentError::Corrupt(String::new()),
            SegmentError::Shrunk { len: 0, need: 1 },
            SegmentError::Unreadable,
            SegmentError::Protect(String::new()),
            SegmentError::Io("x", std::io::Error::other("x")),
            SegmentError::GlobalLockStuck { seq: 1 },
        ];
        for e in &samples {
            let r = Refusal::of(e);
            assert!(
                Refusal::ALL.contains(&r),
                "{} not in Refusal::ALL",
                r.label()
            );
        }
        let doc = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/SECURITY-segments.md"),
        )
        .unwrap();
        for r in Refusal::ALL {
            let row = format!("| `{}` | {} |", r.label(), r.meaning().replace('|', "\\|"));
            assert!(doc.contains(&row), "docs/SECURITY-segments.md lacks {row}");
        }
    }
}
