//! Why the segment directory cannot be listed: every reason, with its
//! metric label (`pfs_agent_discovery_errors_total{reason}`) and what the
//! operator should do. A directory that does not exist is no such reason:
//! a sidecar that starts before its application waits for it.

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
}

impl ListFailure {
    /// Every reason, in label order: each is exported from the start, at 0.
    pub const ALL: [ListFailure; 3] = [
        ListFailure::Io,
        ListFailure::NotADirectory,
        ListFailure::PermissionDenied,
    ];

    /// The reason of a failed listing; `None` if the directory does not
    /// exist (not a failure: it is waited for).
    pub fn of(e: &std::io::Error) -> Option<Self> {
        use std::io::ErrorKind as K;
        match e.kind() {
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
        write!(
            f,
            "cannot list the segment directory {} ({}): no instrumented process can be found; {}",
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
        assert_eq!(ListFailure::of(&Error::from(ErrorKind::NotFound)), None);
        assert_eq!(
            ListFailure::of(&Error::from_raw_os_error(libc::EACCES)),
            Some(ListFailure::PermissionDenied)
        );
        assert_eq!(
            ListFailure::of(&Error::from_raw_os_error(libc::ENOTDIR)),
            Some(ListFailure::NotADirectory)
        );
        assert_eq!(
            ListFailure::of(&Error::from_raw_os_error(libc::EIO)),
            Some(ListFailure::Io)
        );
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
