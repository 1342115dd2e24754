//! Layer 7. Instrumented drop-in wrappers for
//! `std::sync::{Mutex, RwLock, Condvar}`. Every acquisition is a
//! `wait/synch/...` wait whose `SPINS` is 1 when the lock was contended (a
//! non-blocking attempt failed first) and 0 otherwise.

use std::ops::{Deref, DerefMut};
use std::sync::{self, LockResult, PoisonError, TryLockError, TryLockResult};
use std::time::Duration;

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

/// Guard of an instrumented [`Mutex`].
#[derive(Debug)]
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

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        self.inner.notify_one();
    }

    /// Wakes all waiters.
    pub fn notify_all(&self) {
        self.inner.notify_all();
    }
}
