//! Layer 1. Client configuration, from code or from the environment, and
//! its checks against what a segment can hold (`Config::validate`).

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use pfs_shm_layout::geometry::{DEFAULT_MAX_SEGMENT_BYTES, MAX_STRINGS, MAX_TASK_SLOTS};
use pfs_shm_layout::layout::{FLAG_ENABLED, FLAG_TIMED, MAX_CLASSES_LIMIT};
pub use pfs_shm_layout::rules::{
    ActorRule, parse_actor_rules, parse_consumer_rules, parse_duration, parse_instrument_rules,
};
use pfs_shm_layout::rules::{SyntaxError, check_actor_rows};
use pfs_shm_layout::segment::{MAX_HISTORY_LEN, MAX_HISTORY_LONG_LEN, MAX_PAGES};
use pfs_shm_layout::setup::check_consumer_rules;

use crate::error::{ConfigError, InitError};

/// Default segment directory (a tmpfs on Linux).
pub use pfs_shm_layout::files::DEFAULT_SHM_DIR;

/// How [`crate::init_with`] creates this process's segment.
///
/// ```
/// let cfg = pfs_client::Config::new("checkout").shm_dir("/tmp/pfs-doc").history_len(20);
/// assert_eq!(cfg.service_name, "checkout");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Directory of segment files (`PFS_SHM_DIR`, default `/dev/shm/pfs`).
    pub shm_dir: PathBuf,
    /// Service name (`PFS_SERVICE_NAME`, default: the executable's name).
    pub service_name: String,
    /// Events per history ring (`PFS_HISTORY_SIZE`, default 10).
    pub history_len: u32,
    /// Instrument class capacity (`PFS_MAX_CLASSES`, default 256).
    pub max_classes: u32,
    /// Interned string capacity: `SOURCE` call sites (`file:line`) and
    /// object names (file paths, socket addresses), one entry per distinct
    /// string (`PFS_MAX_STRINGS`, default 2048). Beyond it, those strings
    /// are not recorded (counted as lost, kind `strings`).
    pub max_strings: u32,
    /// Maximum concurrently instrumented threads (`PFS_MAX_THREADS`, default 1024).
    pub max_threads: u32,
    /// Thread records per container page.
    pub records_per_page: u32,
    /// Create the directory `0770` and the segment `0660` so an agent in
    /// the same group can read and control it (`PFS_GROUP_ACCESS=1`).
    pub group_access: bool,
    /// New instruments start ENABLED (`PFS_INSTRUMENTS_ENABLED`, default yes).
    pub enabled: bool,
    /// New instruments start TIMED (`PFS_INSTRUMENTS_TIMED`, default yes).
    pub timed: bool,
    /// Events per `history_long` ring (`PFS_HISTORY_LONG_SIZE`, default 10 000).
    pub history_long_len: u32,
    /// Async tasks that `events_*_current` can show while they await, at
    /// once (`PFS_TASK_SLOTS`, default 1024; 640 bytes each, reserved when
    /// the segment is created; 0 shows a task only while it is polled).
    /// Beyond it, a task that awaits is shown only while it runs, counted
    /// lost (kind `task_slots`) once.
    pub task_slots: u32,
    /// Initial flags by `LIKE` pattern (`PFS_INSTRUMENT`, e.g.
    /// `wait/io/file/%=OFF;wait/synch/%=COUNTED`); the longest matching
    /// pattern wins.
    pub instrument_rules: Vec<(String, u32)>,
    /// Initial consumers by pattern (`PFS_CONSUMERS`, e.g.
    /// `events_waits_history_long=ON`), applied in order.
    pub consumer_rules: Vec<(String, bool)>,
    /// `setup_actors` rows the segment starts with, besides its default
    /// `%`/`%`/`%` row (`PFS_ACTORS`, e.g. `batch@%=OFF`): threads that
    /// declare their actor before any agent could change the table find
    /// them.
    pub actor_rules: Vec<ActorRule>,
    /// Protect the segment's mapping against `SIGBUS` (`PFS_SIGBUS_HANDLER`,
    /// default yes): a process-wide handler, installed by `init`, turns
    /// a fault in the mapping (its file truncated by another process) into
    /// private zero pages, so the process runs on, recording nothing more,
    /// instead of dying. Every other `SIGBUS` goes to the handler installed
    /// before (Rust's own, usually) or kills as it would have. Off for a
    /// program that must own `SIGBUS` alone.
    pub sigbus_handler: bool,
    /// Reclaim thread-container pages whose records have all been free for
    /// this long, returning their memory to the OS (`None`: never). A
    /// background thread `pfs-maintenance` runs the reclaimer.
    pub reclaim_after: Option<Duration>,
}

/// Default quiet time before an empty container page is reclaimed.
pub const DEFAULT_RECLAIM_AFTER: Duration = Duration::from_secs(30);

impl Config {
    /// Defaults for `service_name`.
    pub fn new(service_name: impl Into<String>) -> Self {
        // The segment's sizes are the layout's defaults, written once there.
        let seg = pfs_shm_layout::SegmentConfig::default();
        Self {
            shm_dir: PathBuf::from(DEFAULT_SHM_DIR),
            service_name: service_name.into(),
            history_len: seg.history_len,
            max_classes: seg.max_classes,
            max_strings: seg.max_strings,
            max_threads: seg.records_per_page * seg.max_pages,
            records_per_page: seg.records_per_page,
            group_access: false,
            enabled: true,
            timed: true,
            history_long_len: seg.history_long_len,
            task_slots: seg.task_slots,
            instrument_rules: Vec::new(),
            consumer_rules: Vec::new(),
            actor_rules: Vec::new(),
            reclaim_after: Some(DEFAULT_RECLAIM_AFTER),
            sigbus_handler: true,
        }
    }

    /// Reads `PFS_*` variables over the defaults; the service name defaults
    /// to the executable's file name.
    pub fn from_env() -> Result<Self, InitError> {
        let exe = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "unknown".into());
        // An empty name is no name: the executable's.
        let service = env_text("PFS_SERVICE_NAME")?.filter(|s| !s.trim().is_empty());
        let mut c = Self::new(service.unwrap_or(exe));
        // An empty directory is no directory: the default. (A path, so any
        // bytes: a directory whose name is not UTF-8 is still that one.)
        if let Some(d) = std::env::var_os("PFS_SHM_DIR")
            && !d.to_string_lossy().trim().is_empty()
        {
            c.shm_dir = d.into();
        }
        let bad = |k: &str, why: String| InitError::BadEnv(k.to_string(), why);
        let num =
            |k: &str, d: u32, range: std::ops::RangeInclusive<u32>| -> Result<u32, InitError> {
                let Some(v) = env_text(k)? else {
                    return Ok(d);
                };
                let expect = format!("a whole number from {} to {}", range.start(), range.end());
                match v.trim().parse::<u32>() {
                    Ok(n) if range.contains(&n) => Ok(n),
                    _ => Err(bad(k, format!("{v:?}; expected {expect}"))),
                }
            };
        let flag = |k: &str, d: bool| -> Result<bool, InitError> {
            let Some(v) = env_text(k)? else {
                return Ok(d);
            };
            match v.trim().to_ascii_lowercase().as_str() {
                "1" | "yes" | "on" | "true" => Ok(true),
                "0" | "no" | "off" | "false" => Ok(false),
                _ => Err(bad(
                    k,
                    format!("{v:?}; expected yes or no (1/0, on/off, true/false)"),
                )),
            }
        };
        c.history_len = num("PFS_HISTORY_SIZE", c.history_len, Self::HISTORY_LEN_RANGE)?;
        c.max_classes = num("PFS_MAX_CLASSES", c.max_classes, Self::MAX_CLASSES_RANGE)?;
        c.max_strings = num("PFS_MAX_STRINGS", c.max_strings, Self::MAX_STRINGS_RANGE)?;
        c.max_threads = num("PFS_MAX_THREADS", c.max_threads, c.max_threads_range())?;
        c.group_access = flag("PFS_GROUP_ACCESS", c.group_access)?;
        c.enabled = flag("PFS_INSTRUMENTS_ENABLED", c.enabled)?;
        c.timed = flag("PFS_INSTRUMENTS_TIMED", c.timed)?;
        c.sigbus_handler = flag("PFS_SIGBUS_HANDLER", c.sigbus_handler)?;
        c.history_long_len = num(
            "PFS_HISTORY_LONG_SIZE",
            c.history_long_len,
            Self::HISTORY_LONG_LEN_RANGE,
        )?;
        c.task_slots = num("PFS_TASK_SLOTS", c.task_slots, Self::TASK_SLOTS_RANGE)?;
        if let Some(v) = env_text("PFS_INSTRUMENT")? {
            c.instrument_rules = parse_instrument_rules(&v)
                .map_err(|e| InitError::BadEnv("PFS_INSTRUMENT".into(), e.to_string()))?;
        }
        if let Some(v) = env_text("PFS_RECLAIM_AFTER")? {
            c.reclaim_after = match v.trim() {
                d if d.eq_ignore_ascii_case("off") || d == "0" => None,
                d => Some(parse_duration(d).map_err(|e| {
                    InitError::BadEnv(
                        "PFS_RECLAIM_AFTER".into(),
                        format!("{e}, or off to never return pages"),
                    )
                })?),
            };
        }
        if let Some(v) = env_text("PFS_ACTORS")? {
            c.actor_rules = parse_actor_rules(&v)
                .map_err(|e| InitError::BadEnv("PFS_ACTORS".into(), e.to_string()))?;
            // Too many rows: said of the variable, not of the field.
            if let Err(e @ ConfigError::TooManyActors { .. }) = c.check_actor_rules() {
                return Err(InitError::BadEnv("PFS_ACTORS".into(), e.to_string()));
            }
        }
        if let Some(v) = env_text("PFS_CONSUMERS")? {
            c.consumer_rules = parse_consumer_rules(&v)
                .and_then(|r| check_consumer_rules(&r).map(|()| r))
                .map_err(|e| InitError::BadEnv("PFS_CONSUMERS".into(), e.to_string()))?;
        }
        Ok(c)
    }

    /// Sets the segment directory.
    pub fn shm_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.shm_dir = dir.into();
        self
    }

    /// Sets the history ring length.
    pub fn history_len(mut self, n: u32) -> Self {
        self.history_len = n;
        self
    }

    /// Adds an initial instrument rule (see [`parse_instrument_rules`]).
    pub fn instrument(mut self, pattern: &str, flags: u32) -> Self {
        self.instrument_rules.push((pattern.to_string(), flags));
        self
    }

    /// Adds an initial consumer rule.
    pub fn consumer(mut self, pattern: &str, enabled: bool) -> Self {
        self.consumer_rules.push((pattern.to_string(), enabled));
        self
    }

    /// Adds a `setup_actors` row the segment starts with (see
    /// [`parse_actor_rules`]; a row of the same user, host and role as an
    /// earlier one replaces it).
    pub fn actor(mut self, rule: ActorRule) -> Self {
        self.actor_rules.push(rule);
        self
    }

    /// Sets the quiet time after which empty container pages are reclaimed
    /// (`None` turns reclamation and its background thread off).
    pub fn reclaim_after(mut self, quiet: Option<Duration>) -> Self {
        self.reclaim_after = quiet;
        self
    }

    /// Sets how many awaiting async tasks `events_*_current` can show at
    /// once (see [`Config::task_slots`](struct.Config.html#structfield.task_slots)).
    pub fn task_slots(mut self, n: u32) -> Self {
        self.task_slots = n;
        self
    }

    /// Whether `init` protects the segment's mapping with a `SIGBUS`
    /// handler (see [`Config::sigbus_handler`](struct.Config.html#structfield.sigbus_handler)).
    pub fn sigbus_handler(mut self, on: bool) -> Self {
        self.sigbus_handler = on;
        self
    }

    /// Sets the maximum number of instrumented threads.
    pub fn max_threads(mut self, n: u32) -> Self {
        self.max_threads = n;
        self
    }

    pub(crate) fn default_flags(&self) -> u32 {
        (if self.enabled { FLAG_ENABLED } else { 0 }) | (if self.timed { FLAG_TIMED } else { 0 })
    }
}

impl Config {
    /// Accepted `history_len` (`PFS_HISTORY_SIZE`).
    pub const HISTORY_LEN_RANGE: RangeInclusive<u32> = 1..=MAX_HISTORY_LEN;
    /// Accepted `max_classes` (`PFS_MAX_CLASSES`).
    pub const MAX_CLASSES_RANGE: RangeInclusive<u32> = 1..=MAX_CLASSES_LIMIT;
    /// Accepted `max_strings` (`PFS_MAX_STRINGS`).
    pub const MAX_STRINGS_RANGE: RangeInclusive<u32> = 1..=MAX_STRINGS;
    /// Accepted `history_long_len` (`PFS_HISTORY_LONG_SIZE`; 0 keeps no
    /// `history_long` rings).
    pub const HISTORY_LONG_LEN_RANGE: RangeInclusive<u32> = 0..=MAX_HISTORY_LONG_LEN;
    /// Accepted `task_slots` (`PFS_TASK_SLOTS`; 0 keeps none).
    pub const TASK_SLOTS_RANGE: RangeInclusive<u32> = 0..=MAX_TASK_SLOTS;

    /// Accepted `max_threads` (`PFS_MAX_THREADS`) with this
    /// `records_per_page`: the container holds at most `MAX_PAGES` pages.
    /// The segment rounds `max_threads` up to a multiple of
    /// `records_per_page`.
    pub fn max_threads_range(&self) -> RangeInclusive<u32> {
        1..=MAX_PAGES.saturating_mul(self.records_per_page.max(1))
    }

    /// Checks every setting that `PFS_*` variables would have checked:
    /// the numbers against what the segment layout accepts, and the
    /// consumer rules against the consumers' names. [`Config::from_env`]
    /// gives a valid config or an error; a config built in code (or from
    /// C's `pfs_config_t`) can be checked with this before
    /// [`crate::init_with`].
    ///
    /// ```
    /// let cfg = pfs_client::Config::new("svc").max_threads(u32::MAX);
    /// let e = cfg.validate().unwrap_err();
    /// assert_eq!(e.to_string(), "max_threads is 4294967295; expected 1 to 1048576");
    /// let cfg = pfs_client::Config::new("svc").consumer("events_waits_histroy", true);
    /// assert!(cfg.validate().is_err());
    /// assert!(pfs_client::Config::new(" ").validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check = |field, value, range: RangeInclusive<u32>| {
            if range.contains(&value) {
                Ok(())
            } else {
                Err(ConfigError::OutOfRange {
                    field,
                    value,
                    min: *range.start(),
                    max: *range.end(),
                })
            }
        };
        if self.service_name.trim().is_empty() {
            return Err(ConfigError::EmptyServiceName);
        }
        if self.shm_dir.as_os_str().is_empty() {
            return Err(ConfigError::EmptyShmDir);
        }
        check("history_len", self.history_len, Self::HISTORY_LEN_RANGE)?;
        check("max_classes", self.max_classes, Self::MAX_CLASSES_RANGE)?;
        check("max_strings", self.max_strings, Self::MAX_STRINGS_RANGE)?;
        check("max_threads", self.max_threads, self.max_threads_range())?;
        check(
            "history_long_len",
            self.history_long_len,
            Self::HISTORY_LONG_LEN_RANGE,
        )?;
        check("task_slots", self.task_slots, Self::TASK_SLOTS_RANGE)?;
        check_consumer_rules(&self.consumer_rules)?;
        self.check_actor_rules()?;
        if let Ok(g) = pfs_shm_layout::Geometry::new(&self.segment_config())
            && g.total_size as u64 > DEFAULT_MAX_SEGMENT_BYTES
        {
            return Err(ConfigError::SegmentTooLarge {
                bytes: g.total_size as u64,
                max: DEFAULT_MAX_SEGMENT_BYTES,
            });
        }
        Ok(())
    }

    /// The `setup_actors` rows fit the table, each field 1 to 32 bytes.
    fn check_actor_rules(&self) -> Result<(), ConfigError> {
        let field = |f: &str| !f.is_empty() && f.len() <= pfs_shm_layout::layout::ACTOR_FIELD_BYTES;
        if let Some(a) = (self.actor_rules.iter())
            .find(|a| ![&a.user, &a.host, &a.role].iter().all(|f| field(f)))
        {
            let key = format!("{}@{}/{}", a.user, a.host, a.role);
            return Err(ConfigError::Actor(key));
        }
        match check_actor_rows(&self.actor_rules) {
            Err(SyntaxError::TooManyActors { given, max }) => {
                Err(ConfigError::TooManyActors { given, max })
            }
            _ => Ok(()),
        }
    }

    /// The segment these settings lay out.
    pub(crate) fn segment_config(&self) -> pfs_shm_layout::SegmentConfig {
        let records_per_page = self.records_per_page.max(1);
        pfs_shm_layout::SegmentConfig {
            service_name: pfs_shm_layout::text::truncate_utf8(
                &self.service_name,
                pfs_shm_layout::layout::SERVICE_NAME_BYTES,
            )
            .to_string(),
            history_len: self.history_len,
            max_classes: self.max_classes,
            max_strings: self.max_strings,
            records_per_page,
            max_pages: self.max_threads.div_ceil(records_per_page).max(1),
            history_long_len: self.history_long_len,
            task_slots: self.task_slots,
        }
    }
}

/// The text of environment variable `k`: `None` if it is not set or set
/// to nothing but spaces; an error (not "unset") if it is not UTF-8, so
/// that a mistyped value is said, rather than silently replaced by the
/// default.
fn env_text(k: &str) -> Result<Option<String>, InitError> {
    match std::env::var(k) {
        // Set but empty (as a manifest renders an unset value): unset.
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(InitError::BadEnv(
            k.to_string(),
            format!("{v:?} is not UTF-8 text; set it to UTF-8 text, or unset it"),
        )),
    }
}
