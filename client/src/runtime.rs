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

use pfs_shm_layout::layout::{ConsumerKind, LostKind, SetupSection};
use pfs_shm_layout::{EventKind, Segment, SegmentError, SegmentWriter};
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
    /// The segment's free task slots (where an awaiting task's open
    /// events stay visible; see `task`).
    pub(crate) task_slots: pfs_shm_layout::tasks::TaskSlotPool,
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

/// Whether this process is a forked child of an initialised one.
#[inline]
pub(crate) fn forked() -> bool {
    FORKED.load(Relaxed)
}

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
/// there is no runtime, and the child's view of the segment is a private
/// copy (`Segment::detach_after_fork`), so that guards open at the fork
/// and ended in the child write nothing the parent or an agent reads.
/// Async-signal-safe (an atomic store and one `mmap`).
pub(crate) fn mark_forked() {
    FORKED.store(true, Relaxed);
    if let Some(rt) = RUNTIME.get() {
        rt.writer.segment().detach_after_fork();
    }
}

/// Serialises [`init`]: two threads initialising at once (a plugin and its
/// host) must not both create a segment, the loser removing the winner's.
static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Creates the runtime once. `renounce`, run first on the library's own
/// `pfs-maintenance` thread, gives back the thread record that thread may
/// have been given already (the thread registry is above this module).
pub(crate) fn init(cfg: Config, renounce: fn()) -> Result<&'static Runtime, InitError> {
    // In a forked child, before any lock: another thread of the parent may
    // have held one at the fork, and it is never released here.
    if FORKED.load(Relaxed)
        && let Some(rt) = RUNTIME.get()
    {
        return Err(InitError::Forked(rt.path.clone()));
    }
    let _no_cancel = NoCancel::new();
    let _one_at_a_time = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(rt) = RUNTIME.get() {
        if FORKED.load(Relaxed) {
            return Err(InitError::Forked(rt.path.clone()));
        }
        return Err(InitError::AlreadyInitialized(rt.path.clone()));
    }
    cfg.validate()?;
    let rt = create(&cfg, renounce)?;
    let path = rt.path.clone();
    RUNTIME
        .set(rt)
        .map_err(|_| InitError::AlreadyInitialized(path))?;
    Ok(RUNTIME.get().expect("just set"))
}

fn create(cfg: &Config, renounce: fn()) -> Result<Runtime, InitError> {
    // Absolute, so that the segment's path (`segment_path`, and the
    // file an agent is pointed at) stays right after the process changes
    // its working directory, as daemons do.
    let dir = &std::path::absolute(&cfg.shm_dir).map_err(|e| {
        InitError::Io(
            format!("resolve segment directory {}", cfg.shm_dir.display()),
            e,
        )
    })?;
    let dir_mode = if cfg.group_access { 0o770 } else { 0o700 };
    create_dir(dir, dir_mode)?;
    let meta = std::fs::metadata(dir)
        .map_err(|e| InitError::Io(format!("inspect segment directory {}", dir.display()), e))?;
    if meta.permissions().mode() & 0o002 != 0 {
        return Err(InitError::WorldWritable(dir.clone()));
    }
    let pid = std::process::id();
    let file_mode = if cfg.group_access { 0o660 } else { 0o600 };
    // The name as the segment keeps it (cut to SERVICE_NAME_BYTES), in
    // the file name too: a longer one can exceed what a file name may be.
    let seg_cfg = cfg.segment_config();
    let (path, file, uncollected) = open_new(dir, &seg_cfg.service_name, pid, file_mode)?;
    file.set_permissions(std::fs::Permissions::from_mode(file_mode))
        .map_err(|e| InitError::Io(format!("chmod {}", path.display()), e))?;
    rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive)
        .map_err(|e| InitError::Io(format!("lock {}", path.display()), e.into()))?;
    // The initial setup is written before the segment is published: an
    // agent that opens it at once finds it, and is then its only writer.
    let created = Segment::create_with(
        file,
        &seg_cfg,
        crate::timer::calibration(),
        pid,
        now_unix_ns(),
        cfg.sigbus_handler,
        |seg| {
            for (pattern, on) in &cfg.consumer_rules {
                pfs_shm_layout::setup::set_consumers(seg, pattern, *on);
            }
            for a in &cfg.actor_rules {
                // They fit: `Config::validate` counted them.
                let flags = Some((Some(a.enabled), Some(a.history)));
                let _ = pfs_shm_layout::setup::set_actor(seg, &a.host, &a.user, &a.role, flags);
            }
        },
    );
    let created = match created {
        // Truncated while it was being created: nothing to record into.
        Ok(seg) if seg.faulted() => Err(SegmentError::Faulted),
        Ok(seg) if cfg.sigbus_handler && !seg.protected() => {
            tracing::warn!(
                "pfs: cannot install the SIGBUS handler: a process that truncates {} would kill this one (PFS_SIGBUS_HANDLER=no silences this)",
                path.display()
            );
            Ok(seg)
        }
        other => other,
    };
    let seg = match created {
        Ok(seg) => seg,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return Err(InitError::Segment(path, e));
        }
    };
    // The runtime lives as long as the process: leaking the writer lets
    // the hot path hold `'static` references into the mapping.
    mark_ready(&seg);
    let writer: &'static SegmentWriter = Box::leak(Box::new(SegmentWriter::new(seg)));
    if uncollected > 0 {
        (writer.segment()).add_lost(LostKind::UncollectedSegments, uncollected);
    }
    let setup = writer.segment().setup();
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
        spawn_maintenance(writer, quiet, renounce);
    }
    tracing::info!(path = %path.display(), "pfs segment created");
    Ok(Runtime {
        writer,
        path,
        setup,
        clock: crate::timer::Clock::new(*writer.segment().timer()),
        task_slots: pfs_shm_layout::tasks::TaskSlotPool::new(writer.segment()),
        default_flags: cfg.default_flags(),
        instrument_rules: cfg.instrument_rules.clone(),
    })
}

/// Sets the ready segment's modification time to now: the moment from
/// which an agent's pass finds it ready. A successor that must replace
/// it once it is dead compares the agent's heartbeat with this (see
/// `open_new`): a file found while it was still being created is not
/// tracked yet, and was not read if it is replaced before the agent's
/// next pass. (Writes through the mapping may move the time later, never
/// earlier.)
fn mark_ready(seg: &Segment) {
    let _ = seg.file().set_modified(SystemTime::now());
}

/// Creates the segment directory `dir` (and its parents) with `mode`,
/// unless it exists.
fn create_dir(dir: &Path, mode: u32) -> Result<(), InitError> {
    if dir.exists() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| InitError::Io(format!("create segment directory {}", dir.display()), e))?;
    // The umask (typically 022) would take the group's write bit. A
    // set-group-ID bit inherited from the parent (a Kubernetes volume
    // with `fsGroup`) stays: it gives the segments the volume's group,
    // the one the agent shares.
    let inherited = std::fs::metadata(dir).map_or(0, |m| m.permissions().mode() & 0o2000);
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | inherited))
        .map_err(|e| InitError::Io(format!("chmod segment directory {}", dir.display()), e))?;
    Ok(())
}

/// Starts the `pfs-maintenance` thread: every quarter of the quiet time
/// (between 10 ms and 5 s) it runs the container reclaimer, a slow path
/// that never touches the event hot path; and at least every second it
/// looks whether the segment's mapping faulted (its file truncated), to
/// say so. If the thread cannot be started the process runs on without
/// reclamation.
fn spawn_maintenance(writer: &'static SegmentWriter, quiet: Duration, renounce: fn()) {
    let tick = (quiet / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
    let look = tick.min(FAULT_CHECK_EVERY);
    let started = spawn_without_signals(
        std::thread::Builder::new().name("pfs-maintenance".into()),
        // All of it is the instrumentation's own work: it keeps no thread
        // record (with `PfsAllocator` installed, the allocations the
        // thread's start makes would give it one, counted in `pfs_threads`
        // and against `max_threads`) and its allocations are not
        // accounted.
        move || {
            renounce();
            crate::reentry::reentrant(|| {
                let mut since = Duration::ZERO;
                loop {
                    std::thread::sleep(look);
                    if writer.segment().faulted() {
                        warn_faulted();
                        return;
                    }
                    since += look;
                    if since >= tick {
                        since = Duration::ZERO;
                        writer.maintain();
                    }
                }
            })
        },
    );
    if let Err(e) = started {
        tracing::warn!(
            "pfs: cannot start the maintenance thread ({e}); container pages will not be reclaimed"
        );
    }
}

/// How often the `pfs-maintenance` thread looks whether the segment's
/// mapping faulted, at most.
const FAULT_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Says, once, that the segment's mapping faulted (its file truncated
/// under it): the process runs on and records nothing more. The
/// maintenance thread notices it within [`FAULT_CHECK_EVERY`]; a thread
/// that starts says it too (`thread`).
pub(crate) fn warn_faulted() {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Relaxed) {
        let path = get().map_or_else(String::new, |rt| rt.path.display().to_string());
        crate::warning::warn(
            &format!("pfs: {path}: {}", pfs_shm_layout::SegmentError::Faulted),
            |m| tracing::warn!("{m}"),
        );
    }
}

/// Spawns `f` on a thread that blocks every asynchronous signal, so that
/// the library's thread never takes a signal meant for the application:
/// a service that blocks `SIGTERM` in its threads after `init` and waits
/// for it with `sigwait` in one of them would otherwise be killed by the
/// `SIGTERM` the kernel delivers to ours (the one thread not blocking
/// it). A thread starts with its creator's mask: the creating thread
/// blocks them all for the spawn and restores its own mask after.
/// Synchronous signals (a fault of the thread itself) stay unblocked.
#[allow(unsafe_code)]
fn spawn_without_signals(
    builder: std::thread::Builder,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let mut block = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: `sigfillset` initialises the set `block` points to (valid,
    // writable, of the type); `sigdelset` takes signals out of that
    // initialised set; `pthread_sigmask` reads `block` and writes the
    // calling thread's previous mask into `old` (valid and writable), and
    // changes nothing else. None keeps a pointer past the call.
    let masked = unsafe {
        libc::sigfillset(block.as_mut_ptr());
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(block.as_mut_ptr(), sig);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, block.as_ptr(), old.as_mut_ptr()) == 0
    };
    let spawned = builder.spawn(f);
    if masked {
        // SAFETY: `old` was initialised by the successful call above; the
        // call only reads it.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut()) };
    }
    spawned
}

/// Holds off `pthread_cancel` of the calling thread while alive, for the
/// library's slow paths (a thread's registration, `init`): their system
/// calls (`fallocate`, `open`, a log line's `write`) are cancellation
/// points, and a cancellation acted upon there would unwind through the
/// library, where the C ABI's panic guard stops it and glibc then aborts
/// the process ("exception not rethrown"). A cancellation requested
/// meanwhile is acted upon at the thread's next cancellation point
/// outside the library.
pub(crate) struct NoCancel(std::ffi::c_int);

// glibc's and musl's; the `libc` crate does not declare them for Linux.
const PTHREAD_CANCEL_DISABLE: std::ffi::c_int = 1;
#[allow(unsafe_code)]
unsafe extern "C" {
    fn pthread_setcancelstate(state: std::ffi::c_int, old: *mut std::ffi::c_int)
    -> std::ffi::c_int;
}

impl NoCancel {
    /// Disables cancellation until the value drops.
    #[allow(unsafe_code)]
    pub(crate) fn new() -> Self {
        let mut old = 0;
        // SAFETY: the function (POSIX, in every libc this builds against)
        // writes the previous state to `old`, a valid `c_int`, and takes
        // PTHREAD_CANCEL_DISABLE, a valid state.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        Self(old)
    }
}

impl Drop for NoCancel {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: restores the state read in `new` (a valid state); a null
        // `old` is allowed (the previous state is not wanted).
        unsafe { pthread_setcancelstate(self.0, std::ptr::null_mut()) };
    }
}

/// How many numbered names ([`pfs_shm_layout::files::numbered_segment_file_name`])
/// a process tries after its plain one before it replaces a dead
/// predecessor's segment: the dead segments of as many restarts in a row
/// wait for an agent (one that was down meanwhile) to collect them.
const NUMBERED_NAMES: u32 = 8;

/// Creates the segment file: under the first of the process's names that
/// no file has, else in place of the first dead predecessor's (a file no
/// running process holds); [`InitError::InUse`] if running processes hold
/// them all. Never removes a file some process holds, nor, while a free
/// name remains, one an agent has not collected yet; of several dead
/// ones, the oldest. The count is what the new segment starts its lost
/// counter `uncollected_segments` with: 0, or, when the segment replaced
/// had not been found by a watching agent
/// ([`pfs_shm_layout::files::agent_watched`]) nor saved by the agent that
/// owns the directory ([`pfs_shm_layout::files::agent_collected`]: its
/// final figures are in the agent's state, whether or not an agent runs
/// now), whose figures are so lost,
/// that segment's own count plus one (so that the sum over the files
/// present counts every such loss). Replaced under an agent that found
/// it, nothing is lost: the agent folds the old segment in, by its inode.
fn open_new(
    dir: &Path,
    service: &str,
    pid: u32,
    mode: u32,
) -> Result<(PathBuf, File, u64), InitError> {
    let open = |path: &Path| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc_o_nofollow())
            .open(path)
    };
    let names = (0..=NUMBERED_NAMES).map(|n| {
        dir.join(pfs_shm_layout::files::numbered_segment_file_name(
            service, pid, n,
        ))
    });
    for path in names.clone() {
        match open(&path) {
            Ok(f) => return Ok((path, f, 0)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(InitError::Io(format!("create {}", path.display()), e)),
        }
    }
    let mut first = None;
    let mut unusable = None;
    // The dead predecessors' files (their locks taken), with when each
    // was made and became ready: the oldest is replaced, the one an agent
    // most likely read.
    let mut dead: Vec<(SystemTime, SystemTime, PathBuf, File)> = Vec::new();
    for path in names {
        // Not blocking on a FIFO planted at the name, not following a
        // symbolic link; anything but a regular file is left alone (never
        // replaced), and the next name tried.
        let old = OpenOptions::new()
            .read(true)
            .custom_flags(libc_o_nofollow() | rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(&path)
            .and_then(|f| match f.metadata() {
                Ok(m) if m.file_type().is_file() => Ok((f, m)),
                Ok(_) => Err(std::io::Error::other("not a regular file")),
                Err(e) => Err(e),
            });
        let (old, meta) = match old {
            Ok(f) => f,
            Err(e) => {
                unusable.get_or_insert((path, e));
                continue;
            }
        };
        if rustix::fs::flock(&old, FlockOperation::NonBlockingLockExclusive).is_err() {
            first.get_or_insert(path);
            continue; // a running process's
        }
        // Its birth time orders them (where the filesystem keeps none, its
        // last modification). Its modification time is when it became
        // readable at the earliest: a creator sets it once its segment is
        // ready (`mark_ready`), so an agent's pass that began later found
        // it ready, and tracks it.
        let ready = meta.modified().unwrap_or(UNIX_EPOCH);
        let made = meta.created().unwrap_or(ready);
        dead.push((made, ready, path, old));
    }
    if let Some((_, ready, path, old)) = dead.into_iter().min_by_key(|(made, ..)| *made) {
        let collected = || {
            use std::os::unix::fs::MetadataExt;
            let (Ok(m), Some(start)) =
                (old.metadata(), pfs_shm_layout::Segment::start_time_in(&old))
            else {
                return false;
            };
            pfs_shm_layout::files::agent_collected(dir, m.ino(), start)
        };
        let uncollected = if pfs_shm_layout::files::agent_watched(dir, ready) || collected() {
            0
        } else {
            // Its own count of such losses goes on in the new segment.
            let before =
                pfs_shm_layout::Segment::lost_counter_in(&old, LostKind::UncollectedSegments);
            tracing::warn!(
                path = %path.display(),
                "pfs: replacing a dead process's segment that no agent read ({} restarts in a row while no pfs-agent watched {}): its figures are lost, counted in pfs_lost_total{{kind=\"uncollected_segments\"}}",
                NUMBERED_NAMES + 1,
                dir.display()
            );
            before.unwrap_or(0).saturating_add(1)
        };
        std::fs::remove_file(&path)
            .map_err(|e| InitError::Io(format!("remove stale {}", path.display()), e))?;
        let f = open(&path).map_err(|e| InitError::Io(format!("create {}", path.display()), e))?;
        return Ok((path, f, uncollected));
    }
    match (first, unusable) {
        (Some(held), _) => Err(InitError::InUse(held)),
        (None, Some((path, e))) => Err(InitError::Io(
            format!(
                "use {} or any of its numbered alternatives (none is a file a process may take: remove or rename what is at those names)",
                path.display()
            ),
            e,
        )),
        (None, None) => unreachable!("every name was either held or unusable"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn held(path: &Path) -> File {
        let f = File::create(path).unwrap();
        rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive).unwrap();
        f
    }

    fn name(n: u32) -> String {
        pfs_shm_layout::files::numbered_segment_file_name("svc", 1, n)
    }

    #[test]
    fn names_taken_by_fifos_and_links_are_skipped_never_opened_blocking() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        // Every name taken; the plain one by a FIFO (an open without
        // O_NONBLOCK would wait for a writer forever), one by a dangling
        // link, the rest by files of running processes, but for one
        // dead process's file: that one is replaced.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join(name(0)),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        std::os::unix::fs::symlink("/nonexistent", dir.path().join(name(1))).unwrap();
        let _held: Vec<File> = (2..NUMBERED_NAMES)
            .map(|n| held(&dir.path().join(name(n))))
            .collect();
        File::create(dir.path().join(name(NUMBERED_NAMES))).unwrap(); // dead
        let (path, _f, _) = open_new(dir.path(), "svc", 1, 0o600).unwrap();
        assert_eq!(path, dir.path().join(name(NUMBERED_NAMES)));
        assert!(
            std::fs::symlink_metadata(dir.path().join(name(0)))
                .unwrap()
                .file_type()
                .is_fifo()
        );
        // With the dead one held too: in use, not an error about the FIFO.
        let _also = held(&path);
        match open_new(dir.path(), "svc", 1, 0o600) {
            Err(InitError::InUse(p)) => assert_eq!(p, dir.path().join(name(2))),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn names_all_unusable_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..=NUMBERED_NAMES {
            std::fs::create_dir(dir.path().join(name(n))).unwrap();
        }
        match open_new(dir.path(), "svc", 1, 0o600) {
            Err(InitError::Io(what, _)) => assert!(what.contains("svc.1.pfs"), "{what}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_name_held_by_a_running_process_gives_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let _other_container = held(&dir.path().join(name(0)));
        let (path, _f, _) = open_new(dir.path(), "svc", 1, 0o600).unwrap();
        assert_eq!(path, dir.path().join("svc.1.1.pfs"));
    }

    #[test]
    fn a_dead_predecessor_is_kept_for_the_agent_while_a_name_is_free() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(name(0)), b"dead predecessor").unwrap();
        let (path, _f, _) = open_new(dir.path(), "svc", 1, 0o600).unwrap();
        assert_eq!(path, dir.path().join("svc.1.1.pfs"));
        assert_eq!(
            std::fs::read(dir.path().join(name(0))).unwrap(),
            b"dead predecessor",
            "not removed before an agent collected it"
        );
    }

    #[test]
    fn with_every_name_taken_the_oldest_dead_predecessor_is_replaced() {
        use pfs_shm_layout::files::{AGENT_HEARTBEAT_FRESH, AGENT_LOCK_FILE};
        let dir = tempfile::tempdir().unwrap();
        let _held: Vec<File> = (0..2).map(|n| held(&dir.path().join(name(n)))).collect();
        // Made newest first: the last name is the oldest.
        for n in (2..=NUMBERED_NAMES).rev() {
            std::fs::write(dir.path().join(name(n)), b"dead").unwrap();
            std::thread::sleep(Duration::from_millis(25)); // file times are coarse
        }
        let lock_it =
            |f: &File| rustix::fs::flock(f, FlockOperation::NonBlockingLockExclusive).unwrap();
        let next = std::cell::Cell::new(NUMBERED_NAMES);
        let replace = |expected: u64, why: &str| {
            let (path, f, uncollected) = open_new(dir.path(), "svc", 1, 0o600).unwrap();
            assert_eq!(path, dir.path().join(name(next.get())), "{why}: the oldest");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "a new file");
            assert_eq!(uncollected, expected, "{why}");
            lock_it(&f); // its process runs
            next.set(next.get() - 1);
            f
        };
        let _a = replace(1, "no agent watches: its figures are lost");
        // An agent's fresh heartbeat, later than the file: found, folded in
        // by that agent, not lost.
        let beat = File::create(dir.path().join(AGENT_LOCK_FILE)).unwrap();
        let _b = replace(0, "an agent watches");
        // A heartbeat too old: the agent is gone.
        beat.set_modified(SystemTime::now() - AGENT_HEARTBEAT_FRESH * 2)
            .unwrap();
        let _c = replace(1, "the agent stopped beating");
        // Fresh, but from before the file was ready: no pass found it so.
        let ready = std::fs::metadata(dir.path().join(name(next.get())))
            .unwrap()
            .modified()
            .unwrap();
        beat.set_modified(ready - Duration::from_millis(1)).unwrap();
        let _d = replace(1, "the agent has not passed since");
        // A segment that counted such losses itself: its count goes on.
        let mut bytes = vec![0u8; 2 * pfs_shm_layout::layout::PAGE];
        bytes[..8].copy_from_slice(&pfs_shm_layout::layout::MAGIC.to_le_bytes());
        bytes[8..12].copy_from_slice(&pfs_shm_layout::layout::LAYOUT_MAJOR.to_le_bytes());
        let at =
            pfs_shm_layout::geometry::COUNTERS_OFF + 8 * LostKind::UncollectedSegments as usize;
        bytes[at..at + 8].copy_from_slice(&3u64.to_le_bytes());
        std::fs::write(dir.path().join(name(next.get())), &bytes).unwrap();
        beat.set_modified(SystemTime::now() - AGENT_HEARTBEAT_FRESH * 2)
            .unwrap();
        let _e = replace(4, "carried: 3 before, and this one");
        // The agent stopped long ago, but its list says it saved this
        // segment's final figures (its inode and creation time): nothing
        // lost. A list naming another creation time (a later file given
        // the same inode) does not count.
        let path = dir.path().join(name(next.get()));
        bytes[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
        bytes[0x30..0x38].copy_from_slice(&77u64.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(&path).unwrap().ino();
        let list = |start: u64| {
            std::fs::write(
                dir.path().join(AGENT_LOCK_FILE),
                pfs_shm_layout::files::collected_text([(1, 2), (ino, start)]),
            )
            .unwrap();
            beat.set_modified(SystemTime::now() - AGENT_HEARTBEAT_FRESH * 2)
                .unwrap();
        };
        list(78);
        assert!(!pfs_shm_layout::files::agent_collected(dir.path(), ino, 77));
        list(77);
        let _f = replace(0, "saved by the agent that owns the directory");
    }

    #[test]
    fn with_every_name_held_init_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let _held: Vec<File> = (0..=NUMBERED_NAMES)
            .map(|n| held(&dir.path().join(name(n))))
            .collect();
        let e = open_new(dir.path(), "svc", 1, 0o600).unwrap_err();
        assert!(matches!(e, InitError::InUse(_)), "{e}");
        assert!(e.to_string().contains("PFS_SERVICE_NAME"), "{e}");
    }

    #[test]
    fn a_new_directory_keeps_the_volumes_set_group_id_bit() {
        let vol = tempfile::tempdir().unwrap();
        std::fs::set_permissions(vol.path(), std::fs::Permissions::from_mode(0o2770)).unwrap();
        let dir = vol.path().join("segments");
        create_dir(&dir, 0o770).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o2770, "{mode:o}");
        // Without one to inherit, none is added.
        let plain = tempfile::tempdir().unwrap();
        let dir = plain.path().join("segments");
        create_dir(&dir, 0o700).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{mode:o}");
    }
}
