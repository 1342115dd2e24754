//! Layer 7. Instrumented drop-in wrappers for
//! `std::sync::{Mutex, RwLock, Condvar}`. Every blocking acquisition
//! (`lock`, `read`, `write`) is a `wait/synch/...` wait whose `SPINS` is 1
//! when the lock was contended (a non-blocking attempt failed first) and 0
//! otherwise. A non-blocking one (`try_lock`, `try_read`, `try_write`) is
//! one `try_lock`, `try_read_lock` or `try_write_lock` wait, without
//! `SPINS`, whether it acquired or not. A condition variable records one
//! `wait` (or `timed_wait`) wait per time it blocks, as PFS records each
//! `mysql_cond_wait` call: `wait_while` and `wait_timeout_while` are loops
//! of such waits, and record none when the condition is already false.
//! What neither acquires nor blocks (`is_poisoned`, `clear_poison`,
//! `into_inner`, `get_mut`, `notify_one`, `notify_all`) records nothing.
//!
//! Each wrapper has the stable API of its `std::sync` type (Rust 1.95),
//! with std's signatures, results and poisoning, except that `new` takes
//! the class, so there is no `Default` or `From<T>`. The rwlock guards are
//! std's own (so `RwLockWriteGuard::downgrade` is there; it records
//! nothing). Not offered: std's unstable methods (`get_cloned`, `set`,
//! `replace`, `data_ptr`, the guards' `map` and `filter_map`) and the
//! deprecated `Condvar::wait_timeout_ms`.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{self, LockResult, OnceLock, PoisonError, TryLockError, TryLockResult};
use std::time::{Duration, Instant};

use pfs_shm_layout::Operation;

use crate::wait::{LazyWaitClass, WaitGuard};

fn object<T: ?Sized>(t: &T) -> usize {
    t as *const T as *const () as usize
}

#[inline(always)]
#[track_caller]
fn start(class: &'static LazyWaitClass, op: Operation, obj: usize) -> WaitGuard {
    class.get().start(op, obj)
}

/// Acquires a lock for the wait `w`: without blocking if it is free
/// (`SPINS` 0), else, once that attempt failed, blocking (`SPINS` 1). The
/// wait ends when the lock is held.
#[inline(always)]
fn acquire<G>(
    mut w: WaitGuard,
    try_acquire: impl FnOnce() -> TryLockResult<G>,
    block: impl FnOnce() -> LockResult<G>,
) -> LockResult<G> {
    match try_acquire() {
        Ok(g) => {
            w.set_spins(0);
            Ok(g)
        }
        Err(TryLockError::Poisoned(p)) => Err(p),
        Err(TryLockError::WouldBlock) => {
            w.set_spins(1);
            block()
        }
    }
}

/// A `WaitTimeoutResult` whose `timed_out()` is `timed_out`. std has no
/// constructor for it, so std's own `wait_timeout_while` makes both values
/// once, on a mutex and condvar of their own that nobody else sees: with a
/// condition already false it says "not timed out" without waiting, with
/// one always true and no time left, "timed out".
fn wait_timeout_result(timed_out: bool) -> sync::WaitTimeoutResult {
    static RESULTS: OnceLock<[sync::WaitTimeoutResult; 2]> = OnceLock::new();
    RESULTS.get_or_init(|| {
        let (m, cv) = (sync::Mutex::new(()), sync::Condvar::new());
        [false, true].map(|t| {
            let g = m.lock().unwrap_or_else(PoisonError::into_inner);
            let (g, r) = cv
                .wait_timeout_while(g, Duration::ZERO, |_| t)
                .unwrap_or_else(PoisonError::into_inner);
            drop(g);
            debug_assert_eq!(r.timed_out(), t);
            r
        })
    })[usize::from(timed_out)]
}

fn map_poison<G, H>(r: LockResult<G>, f: impl FnOnce(G) -> H) -> LockResult<H> {
    match r {
        Ok(g) => Ok(f(g)),
        Err(p) => Err(PoisonError::new(f(p.into_inner()))),
    }
}

/// A `std::sync::Mutex` whose acquisitions are recorded as
/// `wait/synch/mutex/...` waits.
///
/// ```
/// use pfs_client::{LazyWaitClass, sync::Mutex};
/// static STORE_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kv/store");
/// let m = Mutex::new(&STORE_LOCK, 0u64);
/// *m.lock().unwrap() += 1;
/// assert_eq!(*m.lock().unwrap(), 1);
/// ```
#[derive(Debug)]
pub struct Mutex<T: ?Sized> {
    class: &'static LazyWaitClass,
    inner: sync::Mutex<T>,
}

/// Guard of an instrumented [`Mutex`]. Like std's, it formats (`Debug`,
/// `Display`) as the value it guards.
///
/// ```
/// use pfs_client::{LazyWaitClass, sync::Mutex};
/// static NAME_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kv/name");
/// let m = Mutex::new(&NAME_LOCK, String::from("kv"));
/// let g = m.lock().unwrap();
/// assert_eq!((format!("{g}"), format!("{g:?}")), ("kv".into(), "\"kv\"".into()));
/// ```
pub struct MutexGuard<'a, T: ?Sized>(sync::MutexGuard<'a, T>);

impl<T> Mutex<T> {
    /// A mutex instrumented by `class`.
    pub const fn new(class: &'static LazyWaitClass, value: T) -> Self {
        Self {
            class,
            inner: sync::Mutex::new(value),
        }
    }

    /// Consumes the mutex.
    pub fn into_inner(self) -> LockResult<T> {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Locks, recording a `lock` wait.
    #[track_caller]
    pub fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
        let w = start(self.class, Operation::Lock, object(self));
        let r = acquire(w, || self.inner.try_lock(), || self.inner.lock());
        map_poison(r, MutexGuard)
    }

    /// Tries to lock without blocking, recording a `try_lock` wait.
    #[track_caller]
    pub fn try_lock(&self) -> Result<MutexGuard<'_, T>, TryLockError<MutexGuard<'_, T>>> {
        let _w = start(self.class, Operation::TryLock, object(self));
        match self.inner.try_lock() {
            Ok(g) => Ok(MutexGuard(g)),
            Err(TryLockError::WouldBlock) => Err(TryLockError::WouldBlock),
            Err(TryLockError::Poisoned(p)) => Err(TryLockError::Poisoned(PoisonError::new(
                MutexGuard(p.into_inner()),
            ))),
        }
    }

    /// Mutable access without locking.
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        self.inner.get_mut()
    }

    /// Whether a thread panicked while holding the lock. Records nothing.
    ///
    /// ```
    /// use pfs_client::{LazyWaitClass, sync::Mutex};
    /// static JOBS_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kv/jobs");
    /// let m = Mutex::new(&JOBS_LOCK, 0u32);
    /// let _ = std::panic::catch_unwind(|| {
    ///     let _g = m.lock().unwrap();
    ///     panic!("while held");
    /// });
    /// assert!(m.is_poisoned() && m.lock().is_err());
    /// m.clear_poison();
    /// assert!(!m.is_poisoned() && m.lock().is_ok());
    /// ```
    pub fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }

    /// Clears the poisoned state (see [`Mutex::is_poisoned`]). Records
    /// nothing.
    pub fn clear_poison(&self) {
        self.inner.clear_poison();
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// A `std::sync::RwLock` whose acquisitions are `wait/synch/rwlock/...`
/// waits (`read_lock`, `write_lock`).
///
/// ```
/// use pfs_client::{LazyWaitClass, sync::RwLock};
/// static CONFIG_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/kv/config");
/// let config = RwLock::new(&CONFIG_LOCK, String::from("v1"));
/// config.write().unwrap().push_str("+patch");
/// assert_eq!(*config.read().unwrap(), "v1+patch");
/// ```
#[derive(Debug)]
pub struct RwLock<T: ?Sized> {
    class: &'static LazyWaitClass,
    inner: sync::RwLock<T>,
}

/// Shared guard of an instrumented [`RwLock`].
pub type RwLockReadGuard<'a, T> = sync::RwLockReadGuard<'a, T>;
/// Exclusive guard of an instrumented [`RwLock`].
pub type RwLockWriteGuard<'a, T> = sync::RwLockWriteGuard<'a, T>;

impl<T> RwLock<T> {
    /// A rwlock instrumented by `class`.
    pub const fn new(class: &'static LazyWaitClass, value: T) -> Self {
        Self {
            class,
            inner: sync::RwLock::new(value),
        }
    }

    /// Consumes the rwlock.
    pub fn into_inner(self) -> LockResult<T> {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared lock, recording a `read_lock` wait.
    #[track_caller]
    pub fn read(&self) -> LockResult<RwLockReadGuard<'_, T>> {
        let w = start(self.class, Operation::ReadLock, object(self));
        acquire(w, || self.inner.try_read(), || self.inner.read())
    }

    /// Exclusive lock, recording a `write_lock` wait.
    #[track_caller]
    pub fn write(&self) -> LockResult<RwLockWriteGuard<'_, T>> {
        let w = start(self.class, Operation::WriteLock, object(self));
        acquire(w, || self.inner.try_write(), || self.inner.write())
    }

    /// Tries a shared lock without blocking, recording a `try_read_lock`
    /// wait whether it acquires or not.
    ///
    /// ```
    /// use std::sync::TryLockError;
    /// use pfs_client::{LazyWaitClass, sync::RwLock};
    /// static TABLE_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/kv/table");
    /// let table = RwLock::new(&TABLE_LOCK, 1);
    /// let r = table.try_read().unwrap();
    /// assert_eq!(*table.try_read().unwrap(), 1, "readers share");
    /// assert!(matches!(table.try_write(), Err(TryLockError::WouldBlock)));
    /// drop(r);
    /// *table.try_write().unwrap() = 2;
    /// assert_eq!(table.into_inner().unwrap(), 2);
    /// ```
    #[track_caller]
    pub fn try_read(&self) -> TryLockResult<RwLockReadGuard<'_, T>> {
        let _w = start(self.class, Operation::TryReadLock, object(self));
        self.inner.try_read()
    }

    /// Tries an exclusive lock without blocking, recording a
    /// `try_write_lock` wait whether it acquires or not.
    #[track_caller]
    pub fn try_write(&self) -> TryLockResult<RwLockWriteGuard<'_, T>> {
        let _w = start(self.class, Operation::TryWriteLock, object(self));
        self.inner.try_write()
    }

    /// Whether a thread panicked while holding the lock exclusively.
    /// Records nothing.
    ///
    /// ```
    /// use pfs_client::{LazyWaitClass, sync::RwLock};
    /// static STATS_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/kv/stats");
    /// let stats = RwLock::new(&STATS_LOCK, 0u32);
    /// let _ = std::panic::catch_unwind(|| {
    ///     let _w = stats.write().unwrap();
    ///     panic!("while written");
    /// });
    /// assert!(stats.is_poisoned() && stats.read().is_err());
    /// stats.clear_poison();
    /// assert!(!stats.is_poisoned() && stats.read().is_ok());
    /// ```
    pub fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }

    /// Clears the poisoned state (see [`RwLock::is_poisoned`]). Records
    /// nothing.
    pub fn clear_poison(&self) {
        self.inner.clear_poison();
    }

    /// Mutable access without locking.
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        self.inner.get_mut()
    }
}

/// A `std::sync::Condvar` whose waits are `wait/synch/cond/...` waits
/// (`wait`, `timed_wait`), used with an instrumented [`Mutex`].
///
/// ```
/// use std::time::Duration;
/// use pfs_client::{LazyWaitClass, sync::{Condvar, Mutex}};
/// static QUEUE_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kv/queue");
/// static NOT_EMPTY: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/kv/not_empty");
///
/// let queue = Mutex::new(&QUEUE_LOCK, Vec::<u32>::new());
/// let not_empty = Condvar::new(&NOT_EMPTY);
/// let guard = queue.lock().unwrap();
/// // Nobody notifies: the wait times out.
/// let (guard, timeout) = not_empty.wait_timeout(guard, Duration::from_millis(1)).unwrap();
/// assert!(timeout.timed_out() && guard.is_empty());
/// ```
#[derive(Debug)]
pub struct Condvar {
    class: &'static LazyWaitClass,
    inner: sync::Condvar,
}

impl Condvar {
    /// A condition variable instrumented by `class`.
    pub const fn new(class: &'static LazyWaitClass) -> Self {
        Self {
            class,
            inner: sync::Condvar::new(),
        }
    }

    /// Blocks until notified, recording a `wait` wait.
    #[track_caller]
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> LockResult<MutexGuard<'a, T>> {
        let _w = start(self.class, Operation::Wait, object(self));
        map_poison(self.inner.wait(guard.0), MutexGuard)
    }

    /// Blocks until notified or `timeout`, recording a `timed_wait` wait.
    #[track_caller]
    pub fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> LockResult<(MutexGuard<'a, T>, sync::WaitTimeoutResult)> {
        let _w = start(self.class, Operation::TimedWait, object(self));
        map_poison(self.inner.wait_timeout(guard.0, timeout), |(g, t)| {
            (MutexGuard(g), t)
        })
    }

    /// Blocks while `condition` holds, recording one `wait` wait each time
    /// it blocks (none if `condition` is false at once): PFS records each
    /// `mysql_cond_wait` of a `while (cond) mysql_cond_wait(...)` loop, and
    /// this is that loop, std's: `condition` is checked with the lock held,
    /// before the first wait and after each wakeup.
    ///
    /// ```
    /// use pfs_client::{LazyWaitClass, sync::{Condvar, Mutex}};
    /// static JOB_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kv/job");
    /// static JOB_DONE: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/kv/job_done");
    ///
    /// let (done, cv) = (Mutex::new(&JOB_LOCK, false), Condvar::new(&JOB_DONE));
    /// std::thread::scope(|s| {
    ///     s.spawn(|| {
    ///         *done.lock().unwrap() = true;
    ///         cv.notify_all();
    ///     });
    ///     let guard = cv.wait_while(done.lock().unwrap(), |done| !*done).unwrap();
    ///     assert!(*guard);
    /// });
    /// ```
    #[track_caller]
    pub fn wait_while<'a, T, F>(
        &self,
        mut guard: MutexGuard<'a, T>,
        mut condition: F,
    ) -> LockResult<MutexGuard<'a, T>>
    where
        F: FnMut(&mut T) -> bool,
    {
        while condition(&mut *guard) {
            guard = self.wait(guard)?;
        }
        Ok(guard)
    }

    /// Blocks while `condition` holds, at most `dur` in all, recording one
    /// `timed_wait` wait each time it blocks (none if `condition` is false
    /// at once), as [`Condvar::wait_while`] does. As std's, it checks
    /// `condition` before each wait and reports a timeout only if
    /// `condition` still holds once `dur` has passed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use pfs_client::{LazyWaitClass, sync::{Condvar, Mutex}};
    /// static SLOTS_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kv/slots");
    /// static SLOT_FREE: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/kv/slot_free");
    ///
    /// let (free, cv) = (Mutex::new(&SLOTS_LOCK, 0u32), Condvar::new(&SLOT_FREE));
    /// // Nobody frees a slot: it times out with the condition still true.
    /// let (guard, timeout) = cv
    ///     .wait_timeout_while(free.lock().unwrap(), Duration::from_millis(1), |n| *n == 0)
    ///     .unwrap();
    /// assert!(timeout.timed_out() && *guard == 0);
    /// ```
    #[track_caller]
    pub fn wait_timeout_while<'a, T, F>(
        &self,
        mut guard: MutexGuard<'a, T>,
        dur: Duration,
        mut condition: F,
    ) -> LockResult<(MutexGuard<'a, T>, sync::WaitTimeoutResult)>
    where
        F: FnMut(&mut T) -> bool,
    {
        let start = Instant::now();
        loop {
            if !condition(&mut *guard) {
                return Ok((guard, wait_timeout_result(false)));
            }
            let Some(timeout) = dur.checked_sub(start.elapsed()) else {
                return Ok((guard, wait_timeout_result(true)));
            };
            guard = self.wait_timeout(guard, timeout)?.0;
        }
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        self.inner.notify_one();
    }

    /// Wakes all waiters.
    pub fn notify_all(&self) {
        self.inner.notify_all();
    }
}
