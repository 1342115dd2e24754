//! The segment volume's space: its size and what is free, read at every
//! discovery pass (`statvfs`). A full volume is what makes applications
//! lose container pages, and what keeps a process that starts then from
//! creating its segment at all (it runs uninstrumented, and the agent
//! never sees it): the agent exports the figures
//! (`pfs_agent_volume_{size,free}_bytes`) and reports a full volume on
//! `/healthz`.

use std::path::Path;

/// Size and free space of the filesystem that holds the segment directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Volume {
    /// Bytes in all.
    pub size_bytes: u64,
    /// Bytes an unprivileged process may still allocate (`f_bavail`).
    pub free_bytes: u64,
}

/// Free space under this share of the volume counts as full: what a
/// process needs for its first pages of thread records.
pub const FULL_BELOW_PERCENT: u64 = 1;

impl Volume {
    /// The volume holding `dir`; `None` if it cannot be examined (the
    /// directory does not exist yet).
    pub fn of(dir: &Path) -> Option<Self> {
        let s = rustix::fs::statvfs(dir).ok()?;
        let unit = s.f_frsize.max(1);
        Some(Self {
            size_bytes: s.f_blocks.saturating_mul(unit),
            free_bytes: s.f_bavail.saturating_mul(unit),
        })
    }

    /// Whether less than [`FULL_BELOW_PERCENT`] of it is free.
    pub fn is_full(&self) -> bool {
        self.free_bytes.saturating_mul(100) < self.size_bytes.saturating_mul(FULL_BELOW_PERCENT)
    }

    /// The `/healthz` line for a full volume under `dir`.
    pub fn full_message(&self, dir: &Path) -> String {
        format!(
            "the segment volume of {} is full ({} of {} bytes free): processes that start now run uninstrumented (they cannot create their segment, so the agent never sees them) and live ones lose container pages; give the volume more room (emptyDir sizeLimit) or fewer processes",
            dir.display(),
            self.free_bytes,
            self.size_bytes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_has_a_volume_a_missing_one_none() {
        let dir = tempfile::tempdir().unwrap();
        let v = Volume::of(dir.path()).expect("a volume");
        assert!(v.size_bytes > 0 && v.free_bytes <= v.size_bytes, "{v:?}");
        assert_eq!(Volume::of(&dir.path().join("nope")), None);
    }

    #[test]
    fn full_is_under_one_percent_free() {
        let v = |free| Volume {
            size_bytes: 1000,
            free_bytes: free,
        };
        assert!(v(0).is_full() && v(9).is_full());
        assert!(!v(10).is_full() && !v(500).is_full());
        assert!(
            v(0).full_message(Path::new("/v"))
                .contains("0 of 1000 bytes free")
        );
    }
}
