//! Layer 2. Process-wide state: the segment this process owns, created once
//! by [`crate::init`] and kept for the life of the process, and gone in
//! the child of a `fork` (the segment is the parent's: a forked child
//! records nothing, see `thread`'s fork hook).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pfs_shm_layout::layout::{ConsumerKind, SetupSection};
use pfs_shm_layout::{EventKind, Segment, SegmentConfig, SegmentWriter};
use rustix::fs::FlockOperation;

use crate::config::Config;
use crate::error::InitError;

pub(crate) struct Runtime {
    pub(crate) writer: &'static SegmentWriter,
    pub(crate) path: PathBuf,
    /// The live setup words, read on every event.
    pub(crate) setup: &'static SetupSection,
    /// The timers' clock (the header's calibration, and what derives
    /// from it).
    pub(crate) clock: crate::timer::Clock,
    default_flags: u32,
    instrument_rules: Vec<(String, u32)>,
}

impl Runtime {
    /// Initial flags of a new class: the longest matching `PFS_INSTRUMENT`
    /// pattern wins (MySQL's rule for `performance-schema-instrument`),
    /// else the defaults.
    pub(crate) fn flags_for(&self, name: &str) -> u32 {
        self.instrument_rules
            .iter()
            .filter(|(p, _)| pfs_shm_layout::setup::like(p, name))
            .max_by_key(|(p, _)| p.len())
            .map_or(self.default_flags, |(_, f)| *f)
    }
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// Set in the child of a `fork` of an initialised process ([`mark_forked`]).
static FORKED: AtomicBool = AtomicBool::new(false);

/// The runtime, if [`crate::init`] succeeded in this process (not in the
/// process it was forked from).
#[inline(always)]
pub(crate) fn get() -> Option<&'static Runtime> {
    if FORKED.load(Relaxed) {
        return None;
    }
    RUNTIME.get()
}

/// Marks this process a forked child of an initialised one: from now on
/// there is no runtime. Async-signal-safe (one atomic store).
pub(crate) fn mark_forked() {
    FORKED.store(true, Relaxed);
}

pub(crate) fn init(cfg: Config) -> Result<&'static Runtime, InitError> {
    if let Some(rt) = RUNTIME.get() {
        if FORKED.load(Relaxed) {
            return Err(InitError::Forked(rt.path.clone()));
        }
        return Err(InitError::AlreadyInitialized(rt.path.clone()));
    }
    let rt = create(&cfg)?;
    let path = rt.path.clone();
    RUNTIME
        .set(rt)
        .map_err(|_| InitError::AlreadyInitialized(path))?;
    Ok(RUNTIME.get().expect("just set"))
}

fn create(cfg: &Config) -> Result<Runtime, InitError> {
    let dir = &cfg.shm_dir;
    let dir_mode = if cfg.group_access { 0o770 } else { 0o700 };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(dir_mode)
            .create(dir)
            .map_err(|e| InitError::Io(format!("create segment directory {}", dir.display()), e))?;
        // The umask (typically 022) would take the group's write bit.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode))
            .map_err(|e| InitError::Io(format!("chmod segment directory {}", dir.display()), e))?;
    }
    let meta = std::fs::metadata(dir)
        .map_err(|e| InitError::Io(format!("inspect segment directory {}", dir.display()), e))?;
    if meta.permissions().mode() & 0o002 != 0 {
        return Err(InitError::WorldWritable(dir.clone()));
    }
    let pid = std::process::id();
    let path = dir.join(pfs_shm_layout::files::segment_file_name(
        &cfg.service_name,
        pid,
    ));
    let file_mode = if cfg.group_access { 0o660 } else { 0o600 };
    let file = open_new(&path, file_mode)?;
    file.set_permissions(std::fs::Permissions::from_mode(file_mode))
        .map_err(|e| InitError::Io(format!("chmod {}", path.display()), e))?;
    rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive)
        .map_err(|e| InitError::Io(format!("lock {}", path.display()), e.into()))?;
    let records_per_page = cfg.records_per_page.max(1);
    let seg_cfg = SegmentConfig {
        service_name: pfs_shm_layout::text::truncate_utf8(
            &cfg.service_name,
            pfs_shm_layout::layout::SERVICE_NAME_BYTES,
        )
        .to_string(),
        history_len: cfg.history_len,
        max_classes: cfg.max_classes,
        max_strings: cfg.max_strings,
        records_per_page,
        max_pages: cfg.max_threads.div_ceil(records_per_page).max(1),
        history_long_len: cfg.history_long_len,
    };
    let created = Segment::create(
        file,
        &seg_cfg,
        crate::timer::calibration(),
        pid,
        now_unix_ns(),
    );
    let seg = match created {
        Ok(seg) => seg,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return Err(InitError::Segment(path, e));
        }
    };
    // The runtime lives as long as the process: leaking the writer lets
    // the hot path hold `'static` references into the mapping.
    let writer: &'static SegmentWriter = Box::leak(Box::new(SegmentWriter::new(seg)));
    let setup = writer.segment().setup();
    for (pattern, on) in &cfg.consumer_rules {
        pfs_shm_layout::setup::set_consumers(writer.segment(), pattern, *on);
    }
    // The history_long rings on from the start are reserved now, not by
    // the first event appended (whose statement would count the time).
    let consumers = setup.consumers.load(std::sync::atomic::Ordering::Relaxed);
    for kind in EventKind::ALL {
        if pfs_shm_layout::setup::effective(consumers, kind, ConsumerKind::HistoryLong) {
            writer.prepare_long(kind);
        }
    }
    if let Some(quiet) = cfg.reclaim_after {
        writer.set_reclaim_after(Some(quiet));
        spawn_maintenance(writer, quiet);
    }
    tracing::info!(path = %path.display(), "pfs segment created");
    Ok(Runtime {
        writer,
        path,
        setup,
        clock: crate::timer::Clock::new(*writer.segment().timer()),
        default_flags: cfg.default_flags(),
        instrument_rules: cfg.instrument_rules.clone(),
    })
}

/// Starts the `pfs-maintenance` thread: every quarter of the quiet time
/// (between 10 ms and 5 s) it runs the container reclaimer, a slow path
/// that never touches the event hot path. If the thread cannot be started
/// the process runs on without reclamation.
fn spawn_maintenance(writer: &'static SegmentWriter, quiet: Duration) {
    let tick = (quiet / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
    let started = std::thread::Builder::new()
        .name("pfs-maintenance".into())
        .spawn(move || {
            loop {
                std::thread::sleep(tick);
                writer.maintain();
            }
        });
    if let Err(e) = started {
        tracing::warn!(
            "pfs: cannot start the maintenance thread ({e}); container pages will not be reclaimed"
        );
    }
}

fn open_new(path: &Path, mode: u32) -> Result<File, InitError> {
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc_o_nofollow())
            .open(path)
    };
    match open() {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // A previous process with our pid (pid reuse, or a container
            // restart) left it behind. Replace it only if nobody holds it.
            let old = File::open(path)
                .map_err(|e| InitError::Io(format!("open {}", path.display()), e))?;
            if rustix::fs::flock(&old, FlockOperation::NonBlockingLockExclusive).is_err() {
                return Err(InitError::InUse(path.to_path_buf()));
            }
            std::fs::remove_file(path)
                .map_err(|e| InitError::Io(format!("remove stale {}", path.display()), e))?;
            open().map_err(|e| InitError::Io(format!("create {}", path.display()), e))
        }
        Err(e) => Err(InitError::Io(format!("create {}", path.display()), e)),
    }
}

fn libc_o_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

pub(crate) fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
