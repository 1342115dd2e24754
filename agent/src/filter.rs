//! Layer 1: which processes a table or a setup change applies to (by
//! service name and pid).

use pfs_shm_layout::reader::SegmentSnapshot;

/// Restricts a table or a setup change to some processes.
///
/// ```
/// let f = pfs_agent::filter::Filter { service: Some("checkout".into()), pid: None };
/// assert!(f.matches("checkout", 42));
/// assert!(!f.matches("billing", 42));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this service.
    pub service: Option<String>,
    /// Only this pid.
    pub pid: Option<u32>,
}

impl Filter {
    /// True if the process `service`, `pid` passes the filter.
    pub fn matches(&self, service: &str, pid: u32) -> bool {
        self.service.as_deref().is_none_or(|x| x == service) && self.pid.is_none_or(|p| p == pid)
    }

    /// True if the segment `s` passes the filter.
    pub fn accepts(&self, s: &SegmentSnapshot) -> bool {
        self.matches(&s.service, s.pid)
    }
}
