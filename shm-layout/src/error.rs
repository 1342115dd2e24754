//! Typed errors. Every message says what is wrong and, where it helps,
//! what to do about it.
//!
//! Layer 0 (see the crate docs): depends on no other module of the crate.

/// Why a segment could not be created, opened or read.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// The file is shorter than its header says.
    #[error(
        "segment is truncated: {len} bytes, needs {need}; the file was cut short or is still being written"
    )]
    Truncated {
        /// Actual length.
        len: u64,
        /// Length required.
        need: u64,
    },
    /// Not a pfs segment.
    #[error(
        "not a pfs segment: magic {0:#018x} (expected \"PFSSHM\"); remove stray files from the segment directory"
    )]
    BadMagic(u64),
    /// Written on a machine of the other byte order.
    #[error(
        "segment byte-order mark {0:#010x} does not match this machine's; it was written by a foreign-endian process"
    )]
    ByteOrder(u32),
    /// A layout this reader does not know.
    #[error(
        "segment layout version {found} is not supported (this agent reads {}); {}",
        versions(*oldest, *supported),
        upgrade_advice(*found, *supported)
    )]
    UnsupportedVersion {
        /// Major version in the file.
        found: u32,
        /// The newest major version this code reads.
        supported: u32,
        /// The oldest major version this code reads.
        oldest: u32,
    },
    /// The creator has not finished initialising the segment.
    #[error("segment is still being initialised by its process; it will be read on a later pass")]
    NotReady,
    /// The header's geometry is inconsistent.
    #[error("segment is corrupt: {0}")]
    Corrupt(String),
    /// Parameters for a new segment are out of range.
    #[error("invalid segment configuration: {0}")]
    BadConfig(String),
    /// Space could not be reserved (the volume is full or size-limited).
    #[error(
        "cannot reserve space in the segment file: {0}; enlarge the volume (e.g. the emptyDir sizeLimit)"
    )]
    NoSpace(String),
    /// The process's file size limit (`RLIMIT_FSIZE`, `ulimit -f`) is
    /// below the segment's size: growing the file to it would raise
    /// `SIGXFSZ`, which kills the process.
    #[error(
        "the process's file size limit (ulimit -f, RLIMIT_FSIZE) is {limit} bytes, below the segment's {size}; raise the limit, or make the segment smaller (PFS_MAX_THREADS, PFS_MAX_CLASSES, the history sizes)"
    )]
    FileSizeLimit {
        /// The soft limit, in bytes.
        limit: u64,
        /// The segment's size, in bytes.
        size: u64,
    },
    /// An I/O call failed.
    #[error("cannot {0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
    /// The file became shorter than the segment while it was mapped.
    #[error(
        "segment file shrank to {len} bytes while mapped (the segment needs {need}); another process truncated it, so it is no longer read"
    )]
    Shrunk {
        /// Length of the file now.
        len: u64,
        /// Length the segment needs.
        need: u64,
    },
    /// Reading the mapping raised `SIGBUS` although the file is long enough.
    #[error(
        "reading the mapped segment raised SIGBUS (an I/O error, or a full tmpfs that cannot back a page); it is no longer read; check the volume"
    )]
    Unreadable,
    /// An access to the creator's own protected mapping raised `SIGBUS`
    /// (`Segment::protect`): the mapping now holds
    /// private zeros, and the file is not written again.
    #[error(
        "the segment's mapping raised SIGBUS (another process truncated its file, or its volume failed); this process records nothing more into it; restart the process to record again, and find what truncated the file"
    )]
    Faulted,
    /// The mapping could not be protected against truncation.
    #[error("cannot protect the segment mapping against truncation: {0}")]
    Protect(String),
    /// The fold log wrapped, or folds kept the global section busy,
    /// during every attempted snapshot.
    #[error(
        "threads exit faster than a snapshot can be reconciled ({0} folds during the read); will retry on the next pass"
    )]
    FoldStorm(u64),
    /// The global section's sequence lock stayed odd, at one value, during
    /// every attempted snapshot: a thread-exit fold that does not finish.
    #[error(
        "the global section (the totals of exited threads) stayed locked by one unfinished write (sequence {seq}) during the whole read: the process is stopped (SIGSTOP, a debugger, a frozen cgroup) in the middle of a thread-exit fold, or the writing thread died in it; if it persists while the process runs, the process must be restarted for its totals to be read again"
    )]
    GlobalLockStuck {
        /// The odd sequence value the lock stayed at.
        seq: u64,
    },
}

/// The layout versions `oldest..=newest`, in words.
fn versions(oldest: u32, newest: u32) -> String {
    if oldest >= newest {
        format!("version {newest}")
    } else {
        format!("versions {oldest} to {newest}")
    }
}

/// Which side of a layout version mismatch to upgrade: the agent when the
/// segment's version is newer, else the application.
fn upgrade_advice(found: u32, supported: u32) -> &'static str {
    if found > supported {
        "the application's pfs-client is newer: upgrade pfs-agent to a release that reads it"
    } else {
        "the application's pfs-client is older: upgrade the application to a pfs-client of this agent's layout version (or run an older pfs-agent beside it)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_refusal_names_the_side_to_upgrade() {
        let newer = SegmentError::UnsupportedVersion {
            found: 6,
            supported: 5,
            oldest: 5,
        };
        assert!(newer.to_string().contains("upgrade pfs-agent"), "{newer}");
        let older = SegmentError::UnsupportedVersion {
            found: 4,
            supported: 5,
            oldest: 4,
        };
        assert!(
            older.to_string().contains("upgrade the application"),
            "{older}"
        );
        assert!(!older.to_string().contains("upgrade pfs-agent"), "{older}");
    }
}
