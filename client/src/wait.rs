//! Layer 6. Timed waits (`wait/...`): instrument classes and the guard
//! that records one wait.

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::panic::Location;

use pfs_shm_layout::{EventKind, IoMode, Operation};
use std::sync::atomic::Ordering::Relaxed;

use pfs_shm_layout::layout::{
    ConsumerKind, EV_HAS_BYTES, EV_HAS_SPINS, FLAG_ENABLED, FLAG_TIMED, NONE_U32, timer_of,
};
use pfs_shm_layout::setup::effective;

use crate::class::{ClassRef, Family, LazyRef};
use crate::event::{self, Active};
use crate::reentry::reentrant;
use crate::source::{Site, SourceArg};
use crate::{runtime, thread, timer};

/// A registered wait instrument. Cheap to copy; checking whether it is
/// enabled is one relaxed load.
///
/// For instruments named at run time; a `static` one is a
/// [`LazyWaitClass`].
///
/// ```
/// use pfs_client::{Operation, WaitClass};
///
/// let replica = "eu-1";
/// let send = WaitClass::register(&format!("wait/io/socket/kv/send_{replica}"));
/// let mut w = send.start(Operation::Send, 7);
/// w.set_bytes(1500);
/// // Not recorded: the client is not initialised here.
/// assert_eq!(w.end(), None);
/// assert!(!WaitClass::disabled().is_enabled());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct WaitClass(ClassRef);

impl WaitClass {
    /// Registers (or finds) the instrument `name`, which must be a PFS wait
    /// name: `wait/synch/mutex/<area>/<name>`, `wait/synch/rwlock/...`,
    /// `wait/synch/cond/...`, `wait/io/file/...`, `wait/io/socket/...`.
    /// Returns a disabled class if the client is not initialised, the name
    /// is not a wait name, or the registry is full (counted as lost).
    pub fn register(name: &str) -> Self {
        Self(ClassRef::register(name, Family::Wait))
    }

    /// A class that never records.
    pub const fn disabled() -> Self {
        Self(ClassRef::DISABLED)
    }

    /// PFS `ENABLED`, as the agent set it.
    #[inline(always)]
    pub fn is_enabled(&self) -> bool {
        self.0.enabled()
    }

    /// Starts a wait on `object` (its address or any stable id). The caller's
    /// source location becomes the event's `SOURCE`. Disabled: one relaxed
    /// load and a branch.
    #[inline(always)]
    #[track_caller]
    pub fn start(&self, operation: Operation, object: usize) -> WaitGuard {
        let flags = self.0.flags();
        if flags & FLAG_ENABLED == 0 {
            return WaitGuard::NONE;
        }
        self.begin(
            flags,
            operation,
            object as u64,
            NONE_U32,
            Location::caller(),
        )
    }

    /// [`WaitClass::start`], with the guard written straight into `place`
    /// instead of returned: for adapters whose guard lives in memory they
    /// are given, such as the C ABI's caller-owned `pfs_wait_t` (returning
    /// a guard and copying it there costs a store-to-load stall). Whatever
    /// `place` held is overwritten without being dropped.
    ///
    /// ```
    /// use std::mem::MaybeUninit;
    /// use pfs_client::{LazyWaitClass, Operation, WaitGuard};
    ///
    /// static M: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/app/m");
    /// let mut place = MaybeUninit::<WaitGuard>::uninit();
    /// let guard = M.get().start_in(&mut place, Operation::Lock, 0);
    /// assert!(!guard.is_recording()); // not initialised here
    /// // SAFETY: `start_in` initialised `place`.
    /// drop(unsafe { place.assume_init() }); // ends the wait
    /// ```
    #[inline(always)]
    #[track_caller]
    pub fn start_in<'a>(
        &self,
        place: &'a mut MaybeUninit<WaitGuard>,
        operation: Operation,
        object: usize,
    ) -> &'a mut WaitGuard {
        let flags = self.0.flags();
        if flags & FLAG_ENABLED == 0 {
            return place.write(WaitGuard::NONE);
        }
        self.begin_in(place, flags, operation, object as u64, Location::caller())
    }

    /// [`WaitClass::start_in`], with `SOURCE` `site` instead of the
    /// caller's line (none if `None`): for an adapter that starts waits on
    /// behalf of code elsewhere, such as the C ABI (the C caller's
    /// `__FILE__` and `__LINE__`).
    #[inline(always)]
    pub fn start_in_at<'a>(
        &self,
        place: &'a mut MaybeUninit<WaitGuard>,
        operation: Operation,
        object: usize,
        site: Option<&'static dyn Site>,
    ) -> &'a mut WaitGuard {
        let flags = self.0.flags();
        if flags & FLAG_ENABLED == 0 {
            return place.write(WaitGuard::NONE);
        }
        self.begin_in(place, flags, operation, object as u64, site)
    }

    /// [`WaitClass::start_in_at`], with `OBJECT_NAME` `name`: for an
    /// adapter that starts named waits on behalf of code elsewhere (the C
    /// ABI's `pfs_wait_begin_named`).
    #[inline(always)]
    pub fn start_in_named_at<'a>(
        &self,
        place: &'a mut MaybeUninit<WaitGuard>,
        operation: Operation,
        object: usize,
        name: ObjectName,
        site: Option<&'static dyn Site>,
    ) -> &'a mut WaitGuard {
        let flags = self.0.flags();
        if flags & FLAG_ENABLED == 0 {
            return place.write(WaitGuard::NONE);
        }
        self.begin_in_named(place, flags, operation, object as u64, name.0, site)
    }

    /// [`WaitClass::start`] with `OBJECT_NAME` `name` (a file's path, a
    /// peer's address, a table: what the wait is on, as the instrumented
    /// `File` and `TcpStream` record). Intern the name once, when the
    /// object is opened ([`ObjectName::new`]); each wait then passes the
    /// handle.
    ///
    /// ```
    /// use pfs_client::{LazyWaitClass, ObjectName, Operation};
    ///
    /// static SEGMENT_READ: LazyWaitClass = LazyWaitClass::new("wait/io/file/store/segment");
    ///
    /// let name = ObjectName::new("/var/lib/store/seg-000042"); // at open
    /// let mut w = SEGMENT_READ.get().start_named(Operation::Read, 42, name);
    /// w.set_bytes(4096);
    /// drop(w); // ends the wait (a no-op here: the client is not initialised)
    /// ```
    #[inline(always)]
    #[track_caller]
    pub fn start_named(&self, operation: Operation, object: usize, name: ObjectName) -> WaitGuard {
        let flags = self.0.flags();
        if flags & FLAG_ENABLED == 0 {
            return WaitGuard::NONE;
        }
        self.begin(flags, operation, object as u64, name.0, Location::caller())
    }

    /// The enabled path of [`WaitClass::start_in_named_at`], out of line
    /// (apart from [`WaitClass::begin_in`], which the C ABI's unnamed wait
    /// takes: no argument more there).
    #[inline(never)]
    fn begin_in_named(
        self,
        place: &mut MaybeUninit<WaitGuard>,
        flags: u32,
        operation: Operation,
        object: u64,
        name: u32,
        loc: impl SourceArg,
    ) -> &mut WaitGuard {
        place.write(self.guard(flags, operation, object, name, loc))
    }

    /// The enabled path of [`WaitClass::start_in`], out of line.
    #[inline(never)]
    fn begin_in(
        self,
        place: &mut MaybeUninit<WaitGuard>,
        flags: u32,
        operation: Operation,
        object: u64,
        loc: impl SourceArg,
    ) -> &mut WaitGuard {
        place.write(self.guard(flags, operation, object, NONE_U32, loc))
    }

    #[inline]
    pub(crate) fn start_at(
        &self,
        operation: Operation,
        object: u64,
        object_name: u32,
        loc: &'static Location<'static>,
    ) -> WaitGuard {
        self.begin(self.0.flags(), operation, object, object_name, loc)
    }

    /// The enabled path, out of line: a disabled wait inlined at its call
    /// site stays a load and a branch, without this function's frame.
    #[inline(never)]
    fn begin(
        self,
        flags: u32,
        operation: Operation,
        object: u64,
        object_name: u32,
        loc: &'static Location<'static>,
    ) -> WaitGuard {
        self.guard(flags, operation, object, object_name, loc)
    }

    /// The guard of a wait starting now (the enabled path, inlined into
    /// each out-of-line entry).
    #[inline(always)]
    fn guard(
        self,
        flags: u32,
        operation: Operation,
        object: u64,
        object_name: u32,
        loc: impl SourceArg,
    ) -> WaitGuard {
        WaitGuard {
            active: event::begin::<{ EventKind::Wait.index() }>(
                thread::current,
                self.0,
                flags,
                operation as u32,
                object,
                object_name,
                loc.site(),
            ),
            _not_send: PhantomData,
        }
    }
}

impl WaitClass {
    /// Starts a wait that a future measures across polls (an async lock
    /// acquisition, a channel receive): it takes its `EVENT_ID` and
    /// nesting now, as every event does at its start (the task's, inside a
    /// task's context: nested in its open stage, else its open statement),
    /// reads the wait timer, and writes nothing until it ends. The whole
    /// wait is then recorded at once, by the thread that ends it, as an
    /// event of the logical thread it started in, even if it ends (is
    /// dropped) outside that task's context. `Send`. Disabled: one relaxed
    /// load.
    #[inline]
    #[track_caller]
    pub fn start_async(&self, operation: Operation, object: usize) -> AsyncWait {
        self.start_async_at(operation, object, Location::caller())
    }

    /// [`WaitClass::start_async`] with `SOURCE` `source`: for a wait
    /// started inside a future, where `#[track_caller]` no longer reaches
    /// the caller of the function that made it.
    #[inline]
    pub(crate) fn start_async_at(
        &self,
        operation: Operation,
        object: usize,
        source: &'static Location<'static>,
    ) -> AsyncWait {
        let flags = self.0.flags();
        if flags & FLAG_ENABLED == 0 {
            return AsyncWait::NONE;
        }
        // Admitted here, as every event is at its start: a thread that is
        // not instrumented, or the consumers off, record nothing.
        let Some(claimed) = event::claim::<{ EventKind::Wait.index() }>(thread::current, flags)
        else {
            return AsyncWait::NONE;
        };
        let start = runtime::get().and_then(|rt| {
            (flags & FLAG_TIMED != 0).then(|| {
                let t = timer_of(rt.setup.timers.load(Relaxed), EventKind::Wait);
                (timer::now(&rt.clock, t), t)
            })
        });
        // A task's wait: its slot shows it while the task awaits.
        if let Some(rt) = runtime::get()
            && rt.task_slots.is_enabled()
            && let Some(ctx) = thread::with_registered(|c| c).filter(|c| c.in_task())
            && effective(
                rt.setup.consumers.load(Relaxed),
                EventKind::Wait,
                ConsumerKind::Current,
            )
        {
            let row = event::started_row::<{ EventKind::Wait.index() }>(
                rt,
                ctx,
                self.0,
                start,
                operation as u32,
                object as u64,
                NONE_U32,
                Some(source),
                claimed,
            );
            if let Ok(mut q) = ctx.queued.try_borrow_mut() {
                q.note_start(row);
                ctx.queued_any.set(true);
            }
        }
        AsyncWait {
            class: Some(self.0),
            start,
            operation: operation as u32,
            object: object as u64,
            source,
            claimed,
        }
    }
}

/// A wait measured across polls; recorded when it ends or drops. Started
/// by [`WaitClass::start_async`].
///
/// ```
/// use pfs_client::{LazyWaitClass, Operation};
/// static QUEUE: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/app/queue");
///
/// async fn next(rx: &mut std::collections::VecDeque<u32>) -> Option<u32> {
///     let w = QUEUE.get().start_async(Operation::Wait, 0);
///     let item = rx.pop_front(); // an `.await` in real code
///     drop(w); // records the wait
///     item
/// }
/// # let _ = next;
/// ```
#[must_use = "the wait is recorded when it ends"]
#[derive(Debug)]
pub struct AsyncWait {
    /// The class, while it is to be recorded.
    class: Option<ClassRef>,
    /// Raw ticks and timer at the start, if timed.
    start: Option<(u64, u32)>,
    operation: u32,
    object: u64,
    source: &'static Location<'static>,
    /// Its ids, taken where it started (meaningless while `class` is
    /// `None`).
    claimed: event::Claim,
}

impl AsyncWait {
    const NONE: AsyncWait = AsyncWait {
        class: None,
        start: None,
        operation: 0,
        object: 0,
        source: Location::caller(),
        claimed: event::Claim::NONE,
    };

    /// True if this wait will be recorded.
    pub fn is_recording(&self) -> bool {
        self.class.is_some()
    }

    /// Records the wait as ended now; returns its `TIMER_WAIT` in ps
    /// (`None` if not recorded or not timed).
    #[inline]
    pub fn end(mut self) -> Option<u64> {
        self.finish()
    }

    /// Forgets the wait: nothing is recorded.
    #[inline]
    pub fn discard(mut self) {
        if self.class.take().is_some() {
            self.note_end();
        }
    }

    /// Notes that the wait ended, for its task's slot (taken out of it
    /// when the poll returns).
    fn note_end(&self) {
        if let Some(ctx) = thread::with_registered(|c| c).filter(|c| c.in_task())
            && let Ok(mut q) = ctx.queued.try_borrow_mut()
        {
            q.note_end(self.claimed.ids());
            ctx.queued_any.set(true);
        }
    }

    #[inline(never)]
    fn finish(&mut self) -> Option<u64> {
        let class = self.class.take()?;
        self.note_end();
        event::record_since::<{ EventKind::Wait.index() }>(
            thread::current,
            class,
            self.start,
            self.operation,
            self.object,
            NONE_U32,
            Some(self.source),
            self.claimed,
        )
    }
}

impl Drop for AsyncWait {
    #[inline]
    fn drop(&mut self) {
        if self.class.is_some() {
            self.finish();
        }
    }
}

/// A wait's `OBJECT_NAME`: a text interned once in the process's segment
/// (its string table), then given to each wait by this handle
/// ([`WaitClass::start_named`]). Cheap to copy.
///
/// ```
/// use pfs_client::ObjectName;
///
/// let name = ObjectName::new("10.0.0.7:5432");
/// assert!(!name.is_some()); // the client is not initialised here
/// assert_eq!(ObjectName::from_raw(name.to_raw()), name);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectName(u32);

impl ObjectName {
    /// No name: `OBJECT_NAME` NULL.
    pub const NONE: ObjectName = ObjectName(NONE_U32);

    /// Interns `name` (a name over 56 bytes, the layout's `STRING_BYTES`,
    /// keeps its end, after a hash of the whole: `~1a2b3c4d…/shard-07/000001.log`,
    /// see `pfs_shm_layout::writer::object_name_that_fits`). Takes the
    /// process's writer lock and a hash lookup: call it once per object
    /// (when it is opened), not per wait. [`ObjectName::NONE`] if the
    /// client is not initialised, or if a new name would leave less than
    /// a quarter of the string table (`PFS_MAX_STRINGS`) free: that
    /// quarter stays for `SOURCE` call sites, so a service that opens
    /// files without end still shows where new code paths run (the
    /// refused names are counted in `pfs_lost_total{kind="strings"}`,
    /// once per text).
    pub fn new(name: &str) -> Self {
        match runtime::get() {
            Some(rt) => Self(reentrant(|| rt.writer.intern_object_name(name)).unwrap_or(NONE_U32)),
            None => Self::NONE,
        }
    }

    /// Whether a name was interned.
    pub fn is_some(self) -> bool {
        self.0 != NONE_U32
    }

    /// The handle as a number, for adapters that hand it to other code
    /// (the C ABI's `pfs_object_name`).
    pub fn to_raw(self) -> u32 {
        self.0
    }

    /// The handle [`ObjectName::to_raw`] gave. Any other number names no
    /// string, or another one: the reader shows what the segment holds
    /// there (NULL for an index it does not hold), never more.
    pub fn from_raw(raw: u32) -> Self {
        Self(raw)
    }
}

/// A lazily registered wait class, for `static` instruments:
///
/// ```
/// use pfs_client::{LazyWaitClass, Operation};
/// static WAL_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kv/wal");
///
/// let guard = WAL_LOCK.get().start(Operation::Lock, 0);
/// drop(guard); // ends the wait (a no-op here: the client is not initialised)
/// ```
#[derive(Debug)]
pub struct LazyWaitClass(LazyRef);

impl LazyWaitClass {
    /// Declares the instrument; it registers on first use after `init`.
    pub const fn new(name: &'static str) -> Self {
        Self(LazyRef::new(name))
    }

    /// The registered class (disabled, and not cached, before `init`).
    #[inline(always)]
    pub fn get(&self) -> WaitClass {
        WaitClass(self.0.get(Family::Wait))
    }

    /// The instrument name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }
}

/// One wait in progress; dropping it (or [`WaitGuard::end`]) records it.
/// Not `Send`: a wait belongs to the thread that started it.
///
/// Keep it on the stack (or in what the stack owns). A guard kept in a
/// `thread_local!` whose destructor runs after the thread's record was
/// folded at thread exit records nothing: its wait is counted as lost
/// (`pfs_lost_total{kind="events_no_thread_record"}`).
#[must_use = "the wait ends when the guard is dropped"]
pub struct WaitGuard {
    active: Option<Active>,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for WaitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitGuard")
            .field("active", &self.active.is_some())
            .finish()
    }
}

impl WaitGuard {
    const NONE: WaitGuard = WaitGuard {
        active: None,
        _not_send: PhantomData,
    };

    /// True if this wait is being recorded.
    pub fn is_recording(&self) -> bool {
        self.active.is_some()
    }

    /// Sets `NUMBER_OF_BYTES` (file and socket I/O).
    #[inline(always)]
    pub fn set_bytes(&mut self, bytes: u64) {
        if let Some(a) = &mut self.active {
            a.data.bytes = bytes;
            a.data.flags |= EV_HAS_BYTES;
        }
    }

    /// Sets `SPINS` (lock attempts before the wait blocked).
    #[inline(always)]
    pub fn set_spins(&mut self, spins: u64) {
        if let Some(a) = &mut self.active {
            a.data.spins = spins;
            a.data.flags |= EV_HAS_SPINS;
        }
    }

    /// Ends the wait now; returns the recorded `TIMER_WAIT` in picoseconds
    /// (`None` if not recorded or not timed).
    #[inline]
    pub fn end(mut self) -> Option<u64> {
        let r = self.active.as_mut().and_then(finish);
        self.active = None;
        r
    }
}

/// Ends a recorded wait. Out of line, so that dropping a guard of a
/// disabled instrument is a test of `active` and nothing more; it works on
/// the guard in place (no copy of the event).
#[inline(never)]
fn finish(a: &mut Active) -> Option<u64> {
    if !thread::can_end(a.rt) {
        return None;
    }
    // A file or socket wait also counts in its mode's figures; a lock's or
    // a condition's operation has none (one compare).
    match IoMode::of_operation(a.data.operation) {
        Some(mode) => event::end_io(a, mode),
        None => event::end::<{ EventKind::Wait.index() }>(a, None),
    }
}

impl Drop for WaitGuard {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(a) = &mut self.active {
            finish(a);
        }
    }
}
