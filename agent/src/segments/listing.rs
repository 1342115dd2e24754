//! Why the segment directory cannot be listed: every reason, with its
//! metric label (`pfs_agent_discovery_errors_total{reason}`) and what the
//! operator should do. A directory that does not exist yet is no such
//! reason (a sidecar that starts before its application waits for it);
//! one removed while segments found in it are still read is.

use std::fmt;
use std::path::PathBuf;

use crate::util::fs::DIR_ACCESS_HINT;

/// A reason a discovery pass could not list the segment directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ListFailure {
    /// The agent may not read (or search) the directory: it runs as
    /// another user than the applications that made it.
    PermissionDenied,
    /// The path is not a directory (any more).
    NotADirectory,
    /// Any other error (I/O, too many open files...).
    Io,
    /// The directory is gone although segments were found in it: deleted,
    /// or its volume unmounted under the agent.
    Removed,
}

impl ListFailure {
    /// Every reason, in label order: each is exported from the start, at 0.
    pub const ALL: [ListFailure; 4] = [
        ListFailure::Io,
        ListFailure::NotADirectory,
        ListFailure::PermissionDenied,
        ListFailure::Removed,
    ];

    /// The reason of a failed listing, the agent still reading segments it
    /// found in the directory (`found_before`) or not; `None` if the
    /// directory does not exist and nothing was found in it (not a failure:
    /// it is waited for).
    pub fn of(e: &std::io::Error, found_before: bool) -> Option<Self> {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::NotFound if found_before => Some(Self::Removed),
            K::NotFound => None,
            K::PermissionDenied => Some(Self::PermissionDenied),
            K::NotADirectory => Some(Self::NotADirectory),
            _ => Some(Self::Io),
        }
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::PermissionDenied => "permission_denied",
            Self::NotADirectory => "not_a_directory",
            Self::Io => "io",
            Self::Removed => "removed",
        }
    }

    /// What to do about it.
    pub fn advice(self) -> &'static str {
        match self {
            Self::PermissionDenied => DIR_ACCESS_HINT,
            Self::NotADirectory => {
                "pass the directory the instrumented processes write their segments to with --shm-dir (or PFS_SHM_DIR)"
            }
            Self::Io => "check the filesystem under --shm-dir and the agent's limits (open files)",
            Self::Removed => {
                "it existed and held segments: it was deleted, or its volume unmounted. The processes already found are still read through their open files; one that starts now makes the directory again (pfs-client creates it) and is found then. If its volume was unmounted, remount it; if it was deleted by a clean-up job, keep the job off it"
            }
        }
    }
}

/// The segment directory cannot be listed now: no new process can be
/// found (the segments already found are still read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListError {
    /// The directory.
    pub dir: PathBuf,
    /// Why.
    pub reason: ListFailure,
    /// The system's error, as text.
    pub error: String,
}

impl fmt::Display for ListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let found = if self.reason == ListFailure::Removed {
            "no new instrumented process can be found until it is back"
        } else {
            "no instrumented process can be found"
        };
        write!(
            f,
            "cannot list the segment directory {} ({}): {found}; {}",
            self.dir.display(),
            self.error,
            self.reason.advice()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn a_missing_directory_is_no_failure_the_others_are_labelled() {
        assert_eq!(
            ListFailure::of(&Error::from(ErrorKind::NotFound), false),
            None
        );
        assert_eq!(
            ListFailure::of(&Error::from(ErrorKind::NotFound), true),
            Some(ListFailure::Removed)
        );
        for found_before in [false, true] {
            assert_eq!(
                ListFailure::of(&Error::from_raw_os_error(libc::EACCES), found_before),
                Some(ListFailure::PermissionDenied)
            );
            assert_eq!(
                ListFailure::of(&Error::from_raw_os_error(libc::ENOTDIR), found_before),
                Some(ListFailure::NotADirectory)
            );
            assert_eq!(
                ListFailure::of(&Error::from_raw_os_error(libc::EIO), found_before),
                Some(ListFailure::Io)
            );
        }
        let labels: Vec<_> = ListFailure::ALL.iter().map(|r| r.label()).collect();
        let mut sorted = labels.clone();
        sorted.sort();
        assert_eq!(labels, sorted, "in label order");
    }

    #[test]
    fn the_message_names_the_directory_the_error_and_what_to_do() {
        let e = ListError {
            dir: "/dev/shm/pfs".into(),
            reason: ListFailure::PermissionDenied,
            error: "Permission denied (os error 13)".into(),
        };
        let m = e.to_string();
        assert!(
            m.contains("/dev/shm/pfs") && m.contains("os error 13"),
            "{m}"
        );
        assert!(m.contains("PFS_GROUP_ACCESS=1"), "{m}");
    }
}
