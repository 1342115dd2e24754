//! Layer 0. Where segments live: the default directory, the file name of
//! a process's segment (`<service>.<pid>.pfs`, so that a listing tells
//! service and pid; `<service>.<pid>.<n>.pfs` when that name is taken) and how a file is recognised as a segment by its name.
//! The writer names its file with these; readers list a directory with
//! them.

use std::path::Path;
use std::time::{Duration, SystemTime};

/// The segment directory when `PFS_SHM_DIR` is not set.
pub const DEFAULT_SHM_DIR: &str = "/dev/shm/pfs";

/// The extension of every segment file.
pub const SEGMENT_EXTENSION: &str = "pfs";

/// The file name of the segment of process `pid` of `service`:
/// `<service>.<pid>.pfs`, the service's characters other than ASCII
/// letters, digits, `-` and `_` replaced by `_`.
///
/// ```
/// use pfs_shm_layout::files::segment_file_name;
/// assert_eq!(segment_file_name("orders api/v2", 42), "orders_api_v2.42.pfs");
/// ```
pub fn segment_file_name(service: &str, pid: u32) -> String {
    numbered_segment_file_name(service, pid, 0)
}

/// The `n`-th file name a process of `service` with `pid` may take:
/// [`segment_file_name`] for 0, `<service>.<pid>.<n>.pfs` after it. A
/// process takes the first name no other file has: two containers of one
/// pod are both pid 1, and a restarted process must not remove the segment
/// of its dead predecessor before an agent has read it.
///
/// ```
/// use pfs_shm_layout::files::numbered_segment_file_name;
/// assert_eq!(numbered_segment_file_name("api", 1, 0), "api.1.pfs");
/// assert_eq!(numbered_segment_file_name("api", 1, 2), "api.1.2.pfs");
/// ```
pub fn numbered_segment_file_name(service: &str, pid: u32, n: u32) -> String {
    let safe: String = service
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if n == 0 {
        format!("{safe}.{pid}.{SEGMENT_EXTENSION}")
    } else {
        format!("{safe}.{pid}.{n}.{SEGMENT_EXTENSION}")
    }
}

/// Whether `path` names a segment file (by its extension; what it holds
/// is for the reader to check).
///
/// ```
/// use pfs_shm_layout::files::is_segment_file;
/// assert!(is_segment_file(std::path::Path::new("/dev/shm/pfs/api.7.pfs")));
/// assert!(!is_segment_file(std::path::Path::new("/dev/shm/pfs/.pfs-agent.lock")));
/// ```
pub fn is_segment_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == SEGMENT_EXTENSION)
}

/// The agent's lock file in a segment directory: the agent that holds an
/// exclusive `flock` on it owns the directory (retires dead segments).
/// Every agent on the directory also sets its modification time at each
/// pass over it (about once a second): the agent's *heartbeat*, which a
/// writer can read with `stat` alone, whatever the file's owner and mode.
pub const AGENT_LOCK_FILE: &str = ".pfs-agent.lock";

/// How recent an agent's heartbeat ([`AGENT_LOCK_FILE`]'s modification
/// time) must be for a writer to take an agent as watching the directory.
pub const AGENT_HEARTBEAT_FRESH: Duration = Duration::from_secs(10);

/// The first line of [`AGENT_LOCK_FILE`]'s content: the list of dead
/// segments whose final figures the agent that owns the directory has
/// saved ([`collected_text`], [`agent_collected`]).
const COLLECTED_HEADER: &str = "pfs-agent collected 1";

/// The most of [`AGENT_LOCK_FILE`] a writer reads.
const COLLECTED_MAX_BYTES: u64 = 1 << 20;

/// What the agent that owns a directory writes in [`AGENT_LOCK_FILE`]
/// each time it has saved its state: the dead segments whose final
/// figures that state holds (awaiting retirement, or retired and their
/// files not yet removed), one per line as the file's inode and the
/// segment's creation time (`start_time_unix_ns`, which tells a file from
/// a later one given the same inode). Such a segment's figures survive its
/// file, and the agent itself: a writer that replaces it loses nothing,
/// whether or not an agent runs then.
///
/// ```
/// use pfs_shm_layout::files::{AGENT_LOCK_FILE, agent_collected, collected_text};
/// let dir = std::env::temp_dir().join(format!("pfs-doc-collected-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join(AGENT_LOCK_FILE), collected_text([(42, 7)])).unwrap();
/// assert!(agent_collected(&dir, 42, 7));
/// assert!(!agent_collected(&dir, 42, 8)); // a later file of the same inode
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn collected_text(segments: impl IntoIterator<Item = (u64, u64)>) -> String {
    let mut out = format!("{COLLECTED_HEADER}\n");
    for (ino, start) in segments {
        out.push_str(&format!("{ino} {start}\n"));
    }
    out
}

/// Whether the agent that owns `dir` says ([`collected_text`]) it saved
/// the final figures of the dead segment whose file has inode `ino` and
/// which was created at `start_time_unix_ns`. `false` when it cannot be
/// told: no lock file, one this process may not read, an older agent's
/// (empty), a list being rewritten.
pub fn agent_collected(dir: &Path, ino: u64, start_time_unix_ns: u64) -> bool {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(dir.join(AGENT_LOCK_FILE))
    else {
        return false;
    };
    let mut text = String::new();
    if f.take(COLLECTED_MAX_BYTES)
        .read_to_string(&mut text)
        .is_err()
    {
        return false;
    }
    let mut lines = text.lines();
    if lines.next() != Some(COLLECTED_HEADER) {
        return false;
    }
    let want = format!("{ino} {start_time_unix_ns}");
    lines.any(|l| l == want)
}

/// Whether an agent watches `dir` now, and has since `since`: its
/// heartbeat is at most [`AGENT_HEARTBEAT_FRESH`] old (or as far in the
/// future: clocks differ a little), and later than `since`. A dead
/// process's segment that was ready at `since` (its modification time,
/// which its creator sets once the segment is ready) in such a directory
/// has been found by that agent, which keeps its figures if the file is
/// replaced (unless it refused the file, e.g. could not open it: that
/// shows as an invalid segment); if no agent watches, or it has not passed
/// over the directory since, replacing the file loses them.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// let dir = std::env::temp_dir().join(format!("pfs-doc-heartbeat-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let before = SystemTime::now() - Duration::from_secs(1);
/// assert!(!pfs_shm_layout::files::agent_watched(&dir, before));
/// std::fs::File::create(dir.join(pfs_shm_layout::files::AGENT_LOCK_FILE)).unwrap();
/// assert!(pfs_shm_layout::files::agent_watched(&dir, before)); // just written
/// assert!(!pfs_shm_layout::files::agent_watched(&dir, SystemTime::now() + Duration::from_secs(1)));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn agent_watched(dir: &Path, since: SystemTime) -> bool {
    let Ok(beat) = std::fs::symlink_metadata(dir.join(AGENT_LOCK_FILE)).and_then(|m| m.modified())
    else {
        return false;
    };
    let now = SystemTime::now();
    let fresh = match now.duration_since(beat) {
        Ok(age) => age <= AGENT_HEARTBEAT_FRESH,
        Err(ahead) => ahead.duration() <= AGENT_HEARTBEAT_FRESH,
    };
    fresh && beat > since
}
