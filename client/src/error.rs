//! Layer 0. Initialisation and configuration errors. Instrumentation never fails after
//! `init`: what does not fit is counted as lost.

use std::path::PathBuf;

/// Why [`crate::init`] could not create the segment. The application can
/// log it and carry on: every instrument then stays a no-op.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// `init` was called twice.
    #[error("pfs-client is already initialised (segment {0})")]
    AlreadyInitialized(PathBuf),
    /// This process was forked (without `exec`) from one that initialised
    /// instrumentation: the segment is the parent's, and a child records
    /// nothing.
    #[error(
        "this process was forked from one that initialised pfs-client (segment {0}): a forked child records nothing; initialise in each worker after forking, not in the parent, or exec"
    )]
    Forked(PathBuf),
    /// A [`crate::Config`] field is out of range, or a rule matches
    /// nothing.
    #[error("invalid pfs-client configuration: {0}")]
    BadConfig(#[from] ConfigError),
    /// An environment variable has a value we cannot use.
    #[error("environment variable {0} is invalid: {1}")]
    BadEnv(String, String),
    /// The directory is world-writable: anyone could plant segments.
    #[error(
        "segment directory {0} is world-writable; use a private directory (mode 0700, or 0770 with group access: PFS_GROUP_ACCESS=1, Config::group_access, C's PFS_CONFIG_GROUP_ACCESS)"
    )]
    WorldWritable(PathBuf),
    /// Live processes hold this segment path and its numbered alternatives
    /// (`<service>.<pid>.<n>.pfs`).
    #[error(
        "segment {0} and its numbered alternatives are held by running processes; give each process its own PFS_SERVICE_NAME"
    )]
    InUse(PathBuf),
    /// A filesystem call failed.
    #[error(
        "cannot {0}: {1}; check the segment directory (PFS_SHM_DIR, or the configuration's shm_dir) and its permissions"
    )]
    Io(String, #[source] std::io::Error),
    /// The segment could not be laid out or reserved.
    #[error("cannot create segment {0}: {1}")]
    Segment(PathBuf, #[source] pfs_shm_layout::SegmentError),
}

/// A [`crate::Config`] setting that a segment cannot hold, found by
/// [`crate::Config::validate`]. Each names the field as `Config` (and C's
/// `pfs_config_t`) spells it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A number outside the range the segment layout accepts.
    #[error("{field} is {value}; expected {min} to {max}")]
    OutOfRange {
        /// The field's name (`max_threads`, ...).
        field: &'static str,
        /// Its value.
        value: u32,
        /// The smallest accepted value.
        min: u32,
        /// The largest accepted value.
        max: u32,
    },
    /// No service name: the segment file and every series need one.
    #[error(
        "service_name is empty; name the service (PFS_SERVICE_NAME, Config::new(\"name\"), or C's pfs_config_t.service_name)"
    )]
    EmptyServiceName,
    /// The sizes lay out a segment larger than a reader accepts by default
    /// (`pfs-agent --max-segment-size`): nothing would export it.
    #[error(
        "max_threads, history_len, history_long_len, max_classes and max_strings lay out a segment of {} MiB, more than the {} MiB pfs-agent reads by default (its --max-segment-size); lower them (PFS_MAX_THREADS, PFS_HISTORY_SIZE, PFS_HISTORY_LONG_SIZE, PFS_MAX_CLASSES, PFS_MAX_STRINGS; C's pfs_config_t has no max_strings: only PFS_MAX_STRINGS with pfs_init() sets it), or start pfs-agent with a larger --max-segment-size",
        bytes >> 20,
        max >> 20
    )]
    SegmentTooLarge {
        /// The segment's size.
        bytes: u64,
        /// The largest accepted.
        max: u64,
    },
    /// No segment directory.
    #[error(
        "shm_dir is empty; give a directory (PFS_SHM_DIR, or Config::shm_dir), or leave it at its default /dev/shm/pfs"
    )]
    EmptyShmDir,
    /// A `setup_actors` row whose user, host or role is empty or longer
    /// than 32 bytes.
    #[error(
        "actor_rules: {0:?}: an actor is USER@HOST or USER@HOST/ROLE (each a name or %, 1 to 32 bytes)"
    )]
    Actor(String),
    /// More `setup_actors` rows than the table holds beside its default
    /// row.
    #[error("actor_rules: {given} rows, the table holds {max} beside its default %/%/% row")]
    TooManyActors {
        /// Distinct rows given.
        given: usize,
        /// The most that fit.
        max: usize,
    },
    /// A consumer rule whose pattern matches no consumer (a typo), which
    /// `PFS_CONSUMERS` also rejects.
    #[error("consumer_rules: {0}")]
    Consumers(#[from] pfs_shm_layout::rules::SyntaxError),
}
