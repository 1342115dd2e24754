//! Layer 0 of `segments` (imports none of its siblings). The segment
//! volume's space: its size and what is free, read at every discovery
//! pass (`statvfs`). A full volume is what makes applications lose
//! container pages, and what keeps a process that starts then from
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

/// Free space under this counts as full: a process of the default
/// geometry needs about 2.1 MiB to start (0.5 MiB of tables and its first
/// page of 16 thread records), so this leaves room for one more.
pub const FULL_BELOW_BYTES: u64 = 4 << 20;

/// On a volume smaller than ten times [`FULL_BELOW_BYTES`], full is under
/// this share (in percent) free instead: a test's or a tiny program's
/// volume.
pub const FULL_BELOW_PERCENT_OF_SMALL: u64 = 10;

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

    /// Whether less than [`FULL_BELOW_BYTES`] is free, or, on a small
    /// volume, less than [`FULL_BELOW_PERCENT_OF_SMALL`] of it: an absolute
    /// floor, so that a large filesystem shared with others (a host's
    /// `/dev/shm`) is not called full with gigabytes left.
    pub fn is_full(&self) -> bool {
        let share = self.size_bytes / 100 * FULL_BELOW_PERCENT_OF_SMALL;
        self.free_bytes < FULL_BELOW_BYTES.min(share)
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
    fn full_is_under_4_mib_free_or_a_tenth_of_a_small_volume() {
        const MIB: u64 = 1 << 20;
        let v = |size, free| Volume {
            size_bytes: size,
            free_bytes: free,
        };
        // A 64 MiB emptyDir: full under 4 MiB.
        assert!(v(64 * MIB, 3 * MIB).is_full());
        assert!(!v(64 * MIB, 5 * MIB).is_full());
        // A host's 128 GiB /dev/shm with 1 GiB free is not full.
        assert!(!v(128 << 30, 1 << 30).is_full());
        assert!(v(128 << 30, MIB).is_full());
        // A 4 MiB test volume: full under 10 %.
        assert!(v(4 * MIB, 0).is_full() && v(4 * MIB, 400_000).is_full());
        assert!(!v(4 * MIB, 2 * MIB).is_full());
        let line = v(1000, 0).full_message(Path::new("/v"));
        assert!(line.contains("0 of 1000 bytes free"), "{line}");
    }
}
