//! Layer 8. Instrumented drop-ins for `tokio::sync` (feature `tokio`):
//! [`Mutex`], [`RwLock`], [`Semaphore`], [`Notify`] and the receiving end
//! of an [`mpsc`] channel, whose waits to acquire are recorded as
//! `wait/synch/...` waits of the task that waited.
//!
//! Porting is a change of `use` plus a class per constructor: the methods
//! these types have keep tokio's names and signatures and return tokio's
//! own guards and permits (except [`OwnedMutexGuard`], see there). They
//! cover the acquisitions async code makes, the receivers' `poll_recv` and
//! `poll_recv_many` (for hand-written futures and streams), plus
//! `Mutex::blocking_lock`/`blocking_lock_owned`,
//! `RwLock::blocking_read`/`blocking_write`, `Semaphore::blocking_acquire*`
//! (owned forms too) and the receivers' `blocking_recv*` (recorded as waits
//! of the calling thread). Not offered, and reached uninstrumented through `as_inner`
//! (`as_inner_mut` for receivers): `RwLock`'s owned guards (`read_owned`,
//! `write_owned` and their `try_` forms), `Notify::notified_owned`, the
//! receivers' capacities and sender counts, and
//! `OwnedMutexGuard::map`. `RwLock::new` and `Notify::new` are `const`
//! (`const_new` is there too, under tokio's name); [`Mutex`] and
//! [`Semaphore`] have no `const` constructor (see below).
//!
//! ```
//! use std::sync::Arc;
//! use pfs_client::LazyWaitClass;
//! use pfs_client::task::TaskExt;
//! use pfs_client::tokio::Mutex; // was: use tokio::sync::Mutex;
//!
//! static CACHE_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/app/cache");
//!
//! let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! rt.block_on(async {
//!     let cache = Arc::new(Mutex::new(&CACHE_LOCK, Vec::<u32>::new()));
//!     let c = cache.clone();
//!     // `.pfs_task()`: the task's waits nest in its own statement and stage.
//!     tokio::spawn(async move { c.lock().await.push(1) }.pfs_task())
//!         .await
//!         .unwrap();
//!     assert_eq!(*cache.lock().await, [1]);
//! });
//! ```
//!
//! # What is recorded: only acquisitions that waited
//!
//! Every acquisition first tries tokio's non-blocking form (`try_lock`,
//! `try_read`, `try_write`, `try_acquire`, `try_recv`; for [`Notify`], the
//! first poll of the [`Notified`] future). **If that succeeds, nothing is
//! recorded and no timer is read**: the acquisition costs what tokio's
//! `try_*` costs. Only when it fails does the wait start
//! ([`WaitClass::start_async`](crate::wait::WaitClass::start_async) reads
//! the wait timer and takes the wait's `EVENT_ID` and nesting, as any event
//! does at its start); the future then awaits tokio's own acquisition, and
//! the whole wait is recorded when it completes, by the thread that polled
//! it last, with the task's `THREAD_ID`, nested in the task's open stage,
//! else its open statement, as they were when it started waiting (give the
//! future its context with
//! [`TaskExt::pfs_task`](crate::task::TaskExt::pfs_task) or a `pfs-tracing`
//! span; without one the wait belongs to the worker thread that started
//! it).
//!
//! So a class's `COUNT_STAR` counts the *contended* acquisitions and
//! `SUM_TIMER_WAIT` their time queued; the uncontended ones are not
//! counted. Why: a recorded wait costs a timer pair plus some forty stores
//! to the thread's record, more than an uncontended tokio lock and unlock
//! together, and what the instrument is for is the waiting, which an
//! uncontended acquisition does not do. The target is that an uncontended
//! acquisition costs at most tokio's own plus one timer pair; it costs
//! tokio's `try_*`, which is less than tokio's `lock().await` (see the
//! `async` group of `client/benches/async_tasks.rs`). (The synchronous
//! `pfs_client::sync` locks, by contrast, record every acquisition.) A
//! `try_*` method of a drop-in never waits and records nothing.
//!
//! | drop-in | name the class | `OPERATION` |
//! | --- | --- | --- |
//! | [`Mutex::lock`], [`Mutex::lock_owned`] | `wait/synch/mutex/<area>/<name>` | `lock` |
//! | [`RwLock::read`] | `wait/synch/rwlock/<area>/<name>` | `read_lock` |
//! | [`RwLock::write`] | `wait/synch/rwlock/<area>/<name>` | `write_lock` |
//! | [`Semaphore::acquire`] and its variants | `wait/synch/mutex/<area>/<name>` | `lock` |
//! | [`Notify::notified`] | `wait/synch/cond/<area>/<name>` | `wait` |
//! | [`mpsc::Receiver::recv`], [`mpsc::Receiver::recv_many`], [`mpsc::Receiver::poll_recv`], [`mpsc::Receiver::poll_recv_many`] | `wait/synch/cond/<area>/<name>` | `wait` |
//!
//! A semaphore is named as a mutex: its permits are held and released like
//! a lock with several owners, and what a task waits for is a holder's
//! release. [`Notify`] and a channel are conditions: nothing is held, the
//! task waits for a signal. (The class registration accepts any `wait/...`
//! name; these are the conventions.)
//!
//! `OBJECT_INSTANCE_BEGIN` is the address of the tokio primitive behind a
//! [`Mutex`] or [`Semaphore`] (stable: it is on the heap), the address of
//! the [`RwLock`] or [`Notify`] itself (stable while it does not move,
//! e.g. in a `static` or an `Arc`), and a number given to each channel by
//! [`mpsc::channel`].
//!
//! # A waiter dropped while queued
//!
//! An acquisition future dropped before it acquired (a `tokio::select!`
//! branch that lost, a `tokio::time::timeout` that elapsed, an aborted
//! task) records its wait at the drop: one wait, of the same class and
//! operation, whose `TIMER_WAIT` is the time it spent queued up to the
//! drop. tokio takes it out of the queue; nothing was acquired. It is an
//! event of the task it started in, nested where it started, wherever it
//! is dropped: inside its [`Task`](crate::task::Task) (a timeout in the
//! task's own code, or the task itself aborted: a `Task` drops its future
//! inside its context, and ends its open statement as cancelled), or
//! outside any task context (tower-http drops a request's handler future
//! outside the request's span when the client hangs up; the `pfs-tracing`
//! layer then ends the request's statement as cancelled). Dropped outside
//! its task, its `END_EVENT_ID` is its `EVENT_ID` + 1, as for a statement
//! ended outside its task.
//!
//! # Differences from tokio
//!
//! * The uncontended path is tokio's `try_*`, which takes no part in
//!   tokio's cooperative-scheduling budget: a loop whose every acquisition
//!   (or receive) succeeds at once does not yield at it, whereas tokio's
//!   `lock().await` or `recv().await` consumes budget and is forced to
//!   yield when the budget is spent. A task that receives from a channel
//!   that is never empty should yield on its own
//!   (`tokio::task::yield_now`).
//! * The blocking forms (`Mutex::blocking_lock`, ...) try tokio's `try_*`
//!   first, like the async ones. Called from async code, where tokio's
//!   `blocking_*` always panics, they panic when they would have to wait
//!   (and, being tokio's own forms there, `blocking_recv_many` with
//!   messages waiting and the acquisitions of a closed semaphore), not
//!   when the `try_*` succeeds: tokio gives no way to tell a runtime's
//!   worker thread from a `spawn_blocking` thread (both have a runtime
//!   handle), and the latter is where these are meant to be used,
//!   recorded. A panicking one records no wait.
//! * [`RwLock::new`], [`RwLock::with_max_readers`] and [`Notify::new`]
//!   are `const` (tokio's `const_*` forms): under `tokio_unstable` with
//!   tracing, tokio-console does not see these primitives.
//! * `SOURCE` of a wait is the line that called the drop-in's method
//!   (`lock()`, `recv()`, `notified()`, ...), as for the synchronous
//!   drop-ins: each method is a `#[track_caller]` function that returns
//!   its future, and the future keeps the location for the wait it may
//!   start.
//! * [`Mutex`] and [`Semaphore`] keep tokio's primitive in an `Arc` (one
//!   allocation when made, so their `new` is not `const`), which is what
//!   lets [`Mutex::lock_owned`] and [`Semaphore::acquire_owned`] work from
//!   an `Arc` of the drop-in. [`RwLock::new`] and [`Notify::new`] are
//!   `const`.

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::panic::Location;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::tokio::sync as ts;
use pfs_shm_layout::Operation;

use crate::wait::{AsyncWait, LazyWaitClass};

pub use ::tokio::sync::{
    AcquireError, MappedMutexGuard, MutexGuard, OwnedSemaphorePermit, RwLockMappedWriteGuard,
    RwLockReadGuard, RwLockWriteGuard, SemaphorePermit, TryAcquireError, TryLockError,
};

/// The blocking form of an acquisition of `target`, from synchronous code:
/// `attempt` (tokio's `try_*`) first, recording nothing if it succeeds; else a wait
/// of the calling thread of `class` lasts while `block` (tokio's
/// `blocking_*`) waits. Inside async code, tokio's `blocking_*` panics:
/// so does this, but only when the acquisition would have to wait (tokio
/// gives no way to tell a runtime's worker thread from a `spawn_blocking`
/// thread, where blocking is what these are for; both have a runtime
/// handle).
#[track_caller]
fn block_for<S, G>(
    class: &'static LazyWaitClass,
    operation: Operation,
    object: usize,
    mut target: S,
    attempt: impl FnOnce(&mut S) -> Option<G>,
    block: impl FnOnce(&mut S) -> G,
) -> G {
    if let Some(g) = attempt(&mut target) {
        return g;
    }
    // Kept out of the unwinding: if `block` panics (tokio's, in async
    // code), nothing was acquired and no wait is recorded (the guard is
    // forgotten: its current row keeps showing it until the thread's next
    // wait).
    let wait = std::mem::ManuallyDrop::new(class.get().start(operation, object));
    let g = block(&mut target);
    drop(std::mem::ManuallyDrop::into_inner(wait));
    g
}

/// The address of `t`, as a wait's `OBJECT_INSTANCE_BEGIN`.
fn address<T: ?Sized>(t: &T) -> usize {
    t as *const T as *const () as usize
}

/// Awaits `fut`, the blocking form of an acquisition whose non-blocking
/// form failed, as a wait of `class`: recorded when `fut` completes, or
/// when it is dropped before.
#[inline]
async fn wait_for<F: Future>(
    class: &'static LazyWaitClass,
    operation: Operation,
    object: usize,
    source: &'static Location<'static>,
    fut: F,
) -> F::Output {
    let w = class.get().start_async_at(operation, object, source);
    let out = fut.await;
    w.end();
    out
}

/// A `tokio::sync::Mutex` whose contended acquisitions are recorded as
/// `wait/synch/mutex/...` waits (`OPERATION` `lock`); an uncontended one
/// records nothing (see the [module docs](self)).
///
/// ```
/// use std::sync::Arc;
/// use pfs_client::{LazyWaitClass, tokio::Mutex};
/// static COUNTER_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/app/counter");
///
/// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// rt.block_on(async {
///     let counter = Arc::new(Mutex::new(&COUNTER_LOCK, 0u64));
///     *counter.lock().await += 1;
///     let mut owned = counter.clone().lock_owned().await; // 'static: may move into a task
///     *owned += 1;
///     assert!(counter.try_lock().is_err());
///     drop(owned);
///     assert_eq!(*counter.try_lock().unwrap(), 2);
/// });
/// ```
pub struct Mutex<T: ?Sized> {
    class: &'static LazyWaitClass,
    inner: Arc<ts::Mutex<T>>,
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("class", &self.class.name())
            .field("inner", &self.inner)
            .finish()
    }
}

impl<T> Mutex<T> {
    /// A mutex instrumented by `class` (a `wait/synch/mutex/...` name).
    pub fn new(class: &'static LazyWaitClass, value: T) -> Self {
        Self {
            class,
            inner: Arc::new(ts::Mutex::new(value)),
        }
    }

    /// Consumes the mutex, returning the value.
    pub fn into_inner(self) -> T {
        match Arc::try_unwrap(self.inner) {
            Ok(m) => m.into_inner(),
            // Only an `OwnedMutexGuard` shares `inner`, and it holds an
            // `Arc` of this mutex, which then cannot be owned here.
            Err(_) => unreachable!("an OwnedMutexGuard outlived its Mutex"),
        }
    }
}

impl<T: ?Sized> Mutex<T> {
    fn object(&self) -> usize {
        address(&*self.inner)
    }

    /// Locks, waiting if it is held. A lock that had to wait is recorded
    /// as a `lock` wait when it is acquired (or when this future is
    /// dropped before); one that did not records nothing.
    #[track_caller]
    pub fn lock(&self) -> impl Future<Output = MutexGuard<'_, T>> {
        let source = Location::caller();
        async move {
            if let Ok(g) = self.inner.try_lock() {
                return g;
            }
            let lock = self.inner.lock();
            wait_for(self.class, Operation::Lock, self.object(), source, lock).await
        }
    }

    /// Locks without waiting, or fails; records nothing.
    pub fn try_lock(&self) -> Result<MutexGuard<'_, T>, TryLockError> {
        self.inner.try_lock()
    }

    /// Locks from synchronous code (not from a runtime's worker, as
    /// tokio's), blocking the thread while it is held. A lock that had to
    /// wait is recorded as a `lock` wait of the calling thread.
    #[track_caller]
    pub fn blocking_lock(&self) -> MutexGuard<'_, T> {
        block_for(
            self.class,
            Operation::Lock,
            self.object(),
            &*self.inner,
            |m| m.try_lock().ok(),
            |m| m.blocking_lock(),
        )
    }

    /// tokio's mutex inside, for what this type does not offer (its own
    /// acquisitions are not recorded).
    pub fn as_inner(&self) -> &ts::Mutex<T> {
        &self.inner
    }

    /// Locks an `Arc`ed mutex, returning a guard that keeps it alive
    /// (`'static`, so it can move into a spawned task). Recorded as
    /// [`Mutex::lock`].
    #[track_caller]
    pub fn lock_owned(self: Arc<Self>) -> impl Future<Output = OwnedMutexGuard<T>> {
        let source = Location::caller();
        async move {
            let guard = match self.inner.clone().try_lock_owned() {
                Ok(g) => g,
                Err(_) => {
                    let lock = self.inner.clone().lock_owned();
                    wait_for(self.class, Operation::Lock, self.object(), source, lock).await
                }
            };
            OwnedMutexGuard { guard, mutex: self }
        }
    }

    /// [`Mutex::lock_owned`] from synchronous code, blocking the thread
    /// while the mutex is held (as [`Mutex::blocking_lock`]). A lock that
    /// had to wait is recorded as a `lock` wait of the calling thread.
    #[track_caller]
    pub fn blocking_lock_owned(self: Arc<Self>) -> OwnedMutexGuard<T> {
        let guard = block_for(
            self.class,
            Operation::Lock,
            self.object(),
            self.inner.clone(),
            |m| m.clone().try_lock_owned().ok(),
            |m| m.clone().blocking_lock_owned(),
        );
        OwnedMutexGuard { guard, mutex: self }
    }

    /// [`Mutex::lock_owned`] without waiting, or fails; records nothing.
    pub fn try_lock_owned(self: Arc<Self>) -> Result<OwnedMutexGuard<T>, TryLockError> {
        let guard = self.inner.clone().try_lock_owned()?;
        Ok(OwnedMutexGuard { guard, mutex: self })
    }

    /// Mutable access without locking: the `&mut` proves no one else can
    /// lock.
    pub fn get_mut(&mut self) -> &mut T {
        match Arc::get_mut(&mut self.inner) {
            Some(m) => m.get_mut(),
            // As in `into_inner`: an owned guard would hold `self`.
            None => unreachable!("an OwnedMutexGuard outlived its Mutex"),
        }
    }
}

/// The guard of [`Mutex::lock_owned`]: like tokio's `OwnedMutexGuard`, it
/// keeps the (`Arc`ed) mutex alive and derefs to the value; unlocks on
/// drop.
///
/// It is a type of its own (wrapping tokio's) because it must hold the
/// `Arc` of the drop-in, not only of tokio's mutex inside it: so, as with
/// tokio, no one can own the [`Mutex`] (for [`Mutex::into_inner`] or
/// [`Mutex::get_mut`]) while a guard is alive.
pub struct OwnedMutexGuard<T: ?Sized> {
    // Dropped first: unlocks, then releases the mutex.
    guard: ts::OwnedMutexGuard<T>,
    mutex: Arc<Mutex<T>>,
}

impl<T: ?Sized> OwnedMutexGuard<T> {
    /// The mutex this guard locks (an associated function, as tokio's, so
    /// that it does not shadow a method of `T`).
    pub fn mutex(this: &Self) -> &Arc<Mutex<T>> {
        &this.mutex
    }
}

impl<T: ?Sized> Deref for OwnedMutexGuard<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> DerefMut for OwnedMutexGuard<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for OwnedMutexGuard<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for OwnedMutexGuard<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

/// A `tokio::sync::RwLock` whose contended acquisitions are recorded as
/// `wait/synch/rwlock/...` waits (`read_lock`, `write_lock`); uncontended
/// ones record nothing (see the [module docs](self)).
///
/// ```
/// use pfs_client::{LazyWaitClass, tokio::RwLock};
/// static ROUTES_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/app/routes");
/// static ROUTES: RwLock<Vec<&str>> = RwLock::new(&ROUTES_LOCK, Vec::new());
///
/// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// rt.block_on(async {
///     ROUTES.write().await.push("/health");
///     let (a, b) = (ROUTES.read().await, ROUTES.read().await); // shared
///     assert_eq!(a.len() + b.len(), 2);
///     assert!(ROUTES.try_write().is_err());
/// });
/// ```
pub struct RwLock<T: ?Sized> {
    class: &'static LazyWaitClass,
    inner: ts::RwLock<T>,
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("class", &self.class.name())
            .field("inner", &&self.inner)
            .finish()
    }
}

impl<T> RwLock<T> {
    /// A rwlock instrumented by `class` (a `wait/synch/rwlock/...` name).
    /// `const`, unlike tokio's `new`: it is also tokio's `const_new`.
    pub const fn new(class: &'static LazyWaitClass, value: T) -> Self {
        Self {
            class,
            inner: ts::RwLock::const_new(value),
        }
    }

    /// [`RwLock::new`], under tokio's name for a `static` lock.
    pub const fn const_new(class: &'static LazyWaitClass, value: T) -> Self {
        Self::new(class, value)
    }

    /// A rwlock admitting at most `max_reads` readers at once (tokio's
    /// `with_max_readers`; panics as it does if `max_reads` is 0 or above
    /// tokio's limit).
    pub const fn with_max_readers(class: &'static LazyWaitClass, value: T, max_reads: u32) -> Self {
        Self {
            class,
            inner: ts::RwLock::const_with_max_readers(value, max_reads),
        }
    }

    /// [`RwLock::with_max_readers`], under tokio's name for a `static`
    /// lock.
    pub const fn const_with_max_readers(
        class: &'static LazyWaitClass,
        value: T,
        max_reads: u32,
    ) -> Self {
        Self::with_max_readers(class, value, max_reads)
    }

    /// Consumes the lock, returning the value.
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared lock, waiting while a writer holds it or is queued (tokio's
    /// lock is fair). A lock that had to wait is recorded as a `read_lock`
    /// wait; one that did not records nothing.
    #[track_caller]
    pub fn read(&self) -> impl Future<Output = RwLockReadGuard<'_, T>> {
        let source = Location::caller();
        async move {
            if let Ok(g) = self.inner.try_read() {
                return g;
            }
            let lock = self.inner.read();
            wait_for(self.class, Operation::ReadLock, address(self), source, lock).await
        }
    }

    /// Exclusive lock, waiting while it is held. A lock that had to wait is
    /// recorded as a `write_lock` wait; one that did not records nothing.
    #[track_caller]
    pub fn write(&self) -> impl Future<Output = RwLockWriteGuard<'_, T>> {
        let source = Location::caller();
        async move {
            if let Ok(g) = self.inner.try_write() {
                return g;
            }
            let lock = self.inner.write();
            wait_for(
                self.class,
                Operation::WriteLock,
                address(self),
                source,
                lock,
            )
            .await
        }
    }

    /// Shared lock without waiting, or fails; records nothing.
    pub fn try_read(&self) -> Result<RwLockReadGuard<'_, T>, TryLockError> {
        self.inner.try_read()
    }

    /// Shared lock from synchronous code (not from a runtime's worker, as
    /// tokio's), blocking the thread. A lock that had to wait is recorded
    /// as a `read_lock` wait of the calling thread.
    #[track_caller]
    pub fn blocking_read(&self) -> RwLockReadGuard<'_, T> {
        block_for(
            self.class,
            Operation::ReadLock,
            address(self),
            &self.inner,
            |l| l.try_read().ok(),
            |l| l.blocking_read(),
        )
    }

    /// Exclusive lock from synchronous code, blocking the thread; recorded
    /// as [`RwLock::blocking_read`], as a `write_lock` wait.
    #[track_caller]
    pub fn blocking_write(&self) -> RwLockWriteGuard<'_, T> {
        block_for(
            self.class,
            Operation::WriteLock,
            address(self),
            &self.inner,
            |l| l.try_write().ok(),
            |l| l.blocking_write(),
        )
    }

    /// tokio's rwlock inside, for what this type does not offer (its own
    /// acquisitions are not recorded).
    pub fn as_inner(&self) -> &ts::RwLock<T> {
        &self.inner
    }

    /// Exclusive lock without waiting, or fails; records nothing.
    pub fn try_write(&self) -> Result<RwLockWriteGuard<'_, T>, TryLockError> {
        self.inner.try_write()
    }

    /// Mutable access without locking.
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }
}

/// A `tokio::sync::Semaphore` whose contended acquisitions are recorded as
/// waits (`OPERATION` `lock`; name the class `wait/synch/mutex/...`, see
/// the [module docs](self)); uncontended ones record nothing.
///
/// ```
/// use std::sync::Arc;
/// use pfs_client::{LazyWaitClass, tokio::Semaphore};
/// static DB_SLOTS: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/app/db_slots");
///
/// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// rt.block_on(async {
///     let slots = Arc::new(Semaphore::new(&DB_SLOTS, 2));
///     let a = slots.acquire().await.unwrap();
///     let b = slots.clone().acquire_owned().await.unwrap(); // 'static
///     assert_eq!(slots.available_permits(), 0);
///     assert!(slots.try_acquire().is_err());
///     drop((a, b));
///     assert_eq!(slots.acquire_many(2).await.unwrap().num_permits(), 2);
/// });
/// ```
pub struct Semaphore {
    class: &'static LazyWaitClass,
    inner: Arc<ts::Semaphore>,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("class", &self.class.name())
            .field("inner", &self.inner)
            .finish()
    }
}

impl Semaphore {
    /// The most permits a semaphore can hold (tokio's).
    pub const MAX_PERMITS: usize = ts::Semaphore::MAX_PERMITS;

    /// A semaphore with `permits` permits, instrumented by `class`.
    pub fn new(class: &'static LazyWaitClass, permits: usize) -> Self {
        Self {
            class,
            inner: Arc::new(ts::Semaphore::new(permits)),
        }
    }

    fn object(&self) -> usize {
        address(&*self.inner)
    }

    /// Permits available now.
    pub fn available_permits(&self) -> usize {
        self.inner.available_permits()
    }

    /// Adds `n` permits (waking waiters they satisfy).
    pub fn add_permits(&self, n: usize) {
        self.inner.add_permits(n);
    }

    /// Removes up to `n` available permits; returns how many.
    pub fn forget_permits(&self, n: usize) -> usize {
        self.inner.forget_permits(n)
    }

    /// Closes the semaphore: pending and future acquisitions fail.
    pub fn close(&self) {
        self.inner.close();
    }

    /// Whether it is closed.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Acquires one permit, waiting if none is available (tokio's
    /// semaphore is fair: also while an earlier waiter is queued). An
    /// acquisition that had to wait is recorded as a `lock` wait when it
    /// ends, acquired or failed because the semaphore was closed meanwhile;
    /// one that did not (or found it closed) records nothing.
    #[track_caller]
    pub fn acquire(&self) -> impl Future<Output = Result<SemaphorePermit<'_>, AcquireError>> {
        self.acquire_many(1)
    }

    /// Acquires `n` permits at once; recorded as [`Semaphore::acquire`].
    #[track_caller]
    pub fn acquire_many(
        &self,
        n: u32,
    ) -> impl Future<Output = Result<SemaphorePermit<'_>, AcquireError>> {
        let source = Location::caller();
        async move {
            match self.inner.try_acquire_many(n) {
                Ok(p) => Ok(p),
                // Closed: tokio's acquire fails at once.
                Err(TryAcquireError::Closed) => self.inner.acquire_many(n).await,
                Err(TryAcquireError::NoPermits) => {
                    let acquire = self.inner.acquire_many(n);
                    wait_for(self.class, Operation::Lock, self.object(), source, acquire).await
                }
            }
        }
    }

    /// Acquires `n` permits from synchronous code (not from a runtime's
    /// worker, as tokio's), blocking the thread until they are available.
    /// One that had to wait is recorded as a `lock` wait of the calling
    /// thread; one that did not (or found it closed) records nothing.
    #[track_caller]
    pub fn blocking_acquire_many(&self, n: u32) -> Result<SemaphorePermit<'_>, AcquireError> {
        block_for(
            self.class,
            Operation::Lock,
            self.object(),
            &*self.inner,
            |s| match s.try_acquire_many(n) {
                Ok(p) => Some(Ok(p)),
                // Closed: tokio's fails at once.
                Err(TryAcquireError::Closed) => Some(s.blocking_acquire_many(n)),
                Err(TryAcquireError::NoPermits) => None,
            },
            |s| s.blocking_acquire_many(n),
        )
    }

    /// [`Semaphore::blocking_acquire_many`] of one permit.
    #[track_caller]
    pub fn blocking_acquire(&self) -> Result<SemaphorePermit<'_>, AcquireError> {
        self.blocking_acquire_many(1)
    }

    /// One permit without waiting, or fails; records nothing.
    pub fn try_acquire(&self) -> Result<SemaphorePermit<'_>, TryAcquireError> {
        self.inner.try_acquire()
    }

    /// `n` permits without waiting, or fails; records nothing.
    pub fn try_acquire_many(&self, n: u32) -> Result<SemaphorePermit<'_>, TryAcquireError> {
        self.inner.try_acquire_many(n)
    }

    /// Acquires one permit of an `Arc`ed semaphore as a `'static` permit
    /// (tokio's `OwnedSemaphorePermit`); recorded as
    /// [`Semaphore::acquire`].
    #[track_caller]
    pub fn acquire_owned(
        self: Arc<Self>,
    ) -> impl Future<Output = Result<OwnedSemaphorePermit, AcquireError>> {
        self.acquire_many_owned(1)
    }

    /// Acquires `n` permits as a `'static` permit; recorded as
    /// [`Semaphore::acquire`].
    #[track_caller]
    pub fn acquire_many_owned(
        self: Arc<Self>,
        n: u32,
    ) -> impl Future<Output = Result<OwnedSemaphorePermit, AcquireError>> {
        let source = Location::caller();
        async move {
            match self.inner.clone().try_acquire_many_owned(n) {
                Ok(p) => Ok(p),
                Err(TryAcquireError::Closed) => self.inner.clone().acquire_many_owned(n).await,
                Err(TryAcquireError::NoPermits) => {
                    let acquire = self.inner.clone().acquire_many_owned(n);
                    wait_for(self.class, Operation::Lock, self.object(), source, acquire).await
                }
            }
        }
    }

    /// [`Semaphore::acquire_many_owned`] from synchronous code, blocking
    /// the thread until the permits are available (as
    /// [`Semaphore::blocking_acquire_many`]).
    #[track_caller]
    pub fn blocking_acquire_many_owned(
        self: Arc<Self>,
        n: u32,
    ) -> Result<OwnedSemaphorePermit, AcquireError> {
        let object = self.object();
        block_for(
            self.class,
            Operation::Lock,
            object,
            self.inner.clone(),
            |s| match s.clone().try_acquire_many_owned(n) {
                Ok(p) => Some(Ok(p)),
                // Closed: tokio's fails at once.
                Err(TryAcquireError::Closed) => Some(s.clone().blocking_acquire_many_owned(n)),
                Err(TryAcquireError::NoPermits) => None,
            },
            |s| s.clone().blocking_acquire_many_owned(n),
        )
    }

    /// [`Semaphore::blocking_acquire_many_owned`] of one permit.
    #[track_caller]
    pub fn blocking_acquire_owned(self: Arc<Self>) -> Result<OwnedSemaphorePermit, AcquireError> {
        self.blocking_acquire_many_owned(1)
    }

    /// [`Semaphore::acquire_owned`] without waiting, or fails; records
    /// nothing.
    pub fn try_acquire_owned(self: Arc<Self>) -> Result<OwnedSemaphorePermit, TryAcquireError> {
        self.inner.clone().try_acquire_owned()
    }

    /// [`Semaphore::acquire_many_owned`] without waiting, or fails;
    /// records nothing.
    pub fn try_acquire_many_owned(
        self: Arc<Self>,
        n: u32,
    ) -> Result<OwnedSemaphorePermit, TryAcquireError> {
        self.inner.clone().try_acquire_many_owned(n)
    }

    /// tokio's semaphore inside, for what this type does not offer (its
    /// own acquisitions are not recorded).
    pub fn as_inner(&self) -> &Arc<ts::Semaphore> {
        &self.inner
    }
}

/// A `tokio::sync::Notify` whose waits for a notification are recorded as
/// `wait/synch/cond/...` waits (`OPERATION` `wait`), when the
/// [`Notified`] future had to wait: one that finds a stored permit (or a
/// `notify_waiters` since it was made) on its first poll records nothing.
///
/// ```
/// use std::sync::Arc;
/// use pfs_client::{LazyWaitClass, tokio::Notify};
/// static READY: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/app/ready");
///
/// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// rt.block_on(async {
///     let ready = Arc::new(Notify::new(&READY));
///     let r = ready.clone();
///     let waiter = tokio::spawn(async move { r.notified().await }); // waits: recorded
///     tokio::task::yield_now().await;
///     ready.notify_one();
///     waiter.await.unwrap();
///     ready.notify_one(); // stores a permit
///     ready.notified().await; // takes it at once: nothing recorded
/// });
/// ```
pub struct Notify {
    class: &'static LazyWaitClass,
    inner: ts::Notify,
}

impl fmt::Debug for Notify {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notify")
            .field("class", &self.class.name())
            .field("inner", &self.inner)
            .finish()
    }
}

impl Notify {
    /// A `Notify` instrumented by `class` (a `wait/synch/cond/...` name).
    /// `const`, unlike tokio's `new`: it is also tokio's `const_new`.
    pub const fn new(class: &'static LazyWaitClass) -> Self {
        Self {
            class,
            inner: ts::Notify::const_new(),
        }
    }

    /// [`Notify::new`], under tokio's name for a `static` `Notify`.
    pub const fn const_new(class: &'static LazyWaitClass) -> Self {
        Self::new(class)
    }

    /// A future that completes when notified (see tokio's
    /// `Notify::notified` for which notifications it receives).
    #[track_caller]
    pub fn notified(&self) -> Notified<'_> {
        Notified {
            inner: self.inner.notified(),
            class: self.class,
            object: address(self),
            source: Location::caller(),
            wait: None,
        }
    }

    /// Wakes the first waiter, or stores a permit for the next
    /// `notified().await`.
    pub fn notify_one(&self) {
        self.inner.notify_one();
    }

    /// Wakes the last waiter, or stores a permit.
    pub fn notify_last(&self) {
        self.inner.notify_last();
    }

    /// tokio's `Notify` inside, for what this type does not offer (waits
    /// through it are not recorded).
    pub fn as_inner(&self) -> &ts::Notify {
        &self.inner
    }

    /// Wakes every [`Notified`] made before this call; stores no permit.
    pub fn notify_waiters(&self) {
        self.inner.notify_waiters();
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Notify::notified`]. Its first poll that returns
    /// `Pending` starts a `wait` (reads the timer); the wait is recorded
    /// when it completes, or when it is dropped before (see the
    /// [module docs](self)). `Send`.
    #[must_use = "futures do nothing unless polled"]
    pub struct Notified<'a> {
        #[pin]
        inner: ts::futures::Notified<'a>,
        class: &'static LazyWaitClass,
        object: usize,
        // Where `notified()` was called: the wait's `SOURCE`.
        source: &'static Location<'static>,
        // Started on the first `Pending`; dropped after `inner`.
        wait: Option<AsyncWait>,
    }
}

impl fmt::Debug for Notified<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notified")
            .field("class", &self.class.name())
            .field("waiting", &self.wait.is_some())
            .finish()
    }
}

impl Notified<'_> {
    /// Registers as a waiter without polling (tokio's
    /// `Notified::enable`): a `notify_one` from now on can wake it. Returns
    /// true if it was already notified. Records nothing; the wait, if any,
    /// starts at the first poll.
    pub fn enable(self: Pin<&mut Self>) -> bool {
        self.project().inner.enable()
    }
}

impl Future for Notified<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        match this.inner.poll(cx) {
            Poll::Ready(()) => {
                if let Some(w) = this.wait.take() {
                    w.end();
                }
                Poll::Ready(())
            }
            Poll::Pending => {
                if this.wait.is_none() {
                    *this.wait = Some(this.class.get().start_async_at(
                        Operation::Wait,
                        *this.object,
                        this.source,
                    ));
                }
                Poll::Pending
            }
        }
    }
}

/// tokio's `mpsc` channels with an instrumented receiving end: a receive
/// that finds the channel empty is recorded as a `wait/synch/cond/...`
/// wait (`OPERATION` `wait`) of the time until a message came (or the
/// channel closed); one that finds a message records nothing. The senders
/// are tokio's.
///
/// ```
/// use pfs_client::{LazyWaitClass, tokio::mpsc};
/// static JOBS: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/app/jobs");
///
/// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// rt.block_on(async {
///     let (tx, mut rx) = mpsc::channel::<u32>(&JOBS, 16);
///     tokio::spawn(async move {
///         for job in 0..3 {
///             tx.send(job).await.unwrap();
///         }
///     });
///     let mut got = Vec::new();
///     while let Some(job) = rx.recv().await {
///         got.push(job);
///     }
///     assert_eq!(got, [0, 1, 2]);
/// });
/// ```
pub mod mpsc {
    use std::fmt;
    use std::future::Future;
    use std::panic::Location;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::task::{Context, Poll};

    use ::tokio::sync::mpsc as tm;
    use pfs_shm_layout::Operation;

    use super::block_for;
    use crate::wait::{AsyncWait, LazyWaitClass};

    pub use ::tokio::sync::mpsc::{
        OwnedPermit, Permit, Sender, UnboundedSender, WeakSender, WeakUnboundedSender, error,
    };

    /// The channels' `OBJECT_INSTANCE_BEGIN`: a number per channel,
    /// stable when the receiver moves.
    fn next_channel_id() -> usize {
        static NEXT: AtomicUsize = AtomicUsize::new(1);
        NEXT.fetch_add(1, Relaxed)
    }

    /// A bounded channel of `buffer` messages (tokio's
    /// `mpsc::channel`), whose receiver is instrumented by `class`.
    pub fn channel<T>(class: &'static LazyWaitClass, buffer: usize) -> (Sender<T>, Receiver<T>) {
        let (tx, rx) = tm::channel(buffer);
        (tx, Receiver::new(class, rx))
    }

    /// An unbounded channel (tokio's `mpsc::unbounded_channel`), whose
    /// receiver is instrumented by `class`.
    pub fn unbounded_channel<T>(
        class: &'static LazyWaitClass,
    ) -> (UnboundedSender<T>, UnboundedReceiver<T>) {
        let (tx, rx) = tm::unbounded_channel();
        (tx, UnboundedReceiver::new(class, rx))
    }

    macro_rules! receiver {
        ($(#[$doc:meta])* $name:ident, $inner:ty) => {
            $(#[$doc])*
            pub struct $name<T> {
                class: &'static LazyWaitClass,
                id: usize,
                inner: $inner,
                /// The wait a `poll_recv*` that found the channel empty
                /// started, ended by the poll that gets a message (or the
                /// receiver's drop).
                polled: Option<AsyncWait>,
            }

            impl<T> fmt::Debug for $name<T> {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.debug_struct(stringify!($name))
                        .field("class", &self.class.name())
                        .field("inner", &self.inner)
                        .finish()
                }
            }

            impl<T> $name<T> {
                /// Instruments tokio's receiver `inner` with `class`.
                pub fn new(class: &'static LazyWaitClass, inner: $inner) -> Self {
                    Self {
                        class,
                        id: next_channel_id(),
                        inner,
                        polled: None,
                    }
                }

                /// tokio's receiver, no longer instrumented (a wait
                /// `poll_recv` started is recorded now).
                pub fn into_inner(mut self) -> $inner {
                    self.polled.take();
                    self.inner
                }

                /// tokio's receiver inside, for what this type does not
                /// offer (capacities, sender counts); receives through it
                /// are not recorded.
                pub fn as_inner_mut(&mut self) -> &mut $inner {
                    &mut self.inner
                }

                /// The next message, waiting while the channel is empty;
                /// `None` once it is closed and drained. A receive that
                /// found it empty is recorded as a `wait` when it ends (or
                /// when this future is dropped before); one that found a
                /// message, or the channel closed, records nothing.
                #[track_caller]
                pub fn recv(&mut self) -> impl Future<Output = Option<T>> {
                    let source = Location::caller();
                    async move {
                        match self.inner.try_recv() {
                            Ok(v) => Some(v),
                            Err(error::TryRecvError::Disconnected) => None,
                            Err(error::TryRecvError::Empty) => {
                                let w = self.class.get().start_async_at(Operation::Wait, self.id, source);
                                let v = self.inner.recv().await;
                                w.end();
                                v
                            }
                        }
                    }
                }

                /// Appends up to `limit` messages to `buffer`, waiting while
                /// the channel is empty; returns how many (0: closed and
                /// drained, or `limit` 0). Recorded as `recv`.
                #[track_caller]
                pub fn recv_many(
                    &mut self,
                    buffer: &mut Vec<T>,
                    limit: usize,
                ) -> impl Future<Output = usize> {
                    let source = Location::caller();
                    async move {
                        if limit == 0 || !self.inner.is_empty() || self.inner.is_closed() {
                            return self.inner.recv_many(buffer, limit).await;
                        }
                        let w = self.class.get().start_async_at(Operation::Wait, self.id, source);
                        let n = self.inner.recv_many(buffer, limit).await;
                        w.end();
                        n
                    }
                }

                /// The next message without waiting, or why not; records
                /// nothing.
                pub fn try_recv(&mut self) -> Result<T, error::TryRecvError> {
                    self.inner.try_recv()
                }

                /// Polls for the next message, for hand-written futures
                /// and streams (tokio's `poll_recv`). A poll that finds the
                /// channel empty (and open) starts a `wait`; the poll that
                /// returns `Ready` ends it, so a receive that waited across
                /// several polls is one wait, recorded by the thread of
                /// that last poll (a receiver dropped while waiting
                /// records it at the drop). One that finds a message
                /// records nothing. A caller that stops polling after a
                /// `Pending` and receives another way leaves that wait
                /// open until the next `poll_recv*` that returns `Ready`
                /// (or the receiver's drop): its `TIMER_WAIT` then covers
                /// that time too, and it stays nested in what was open
                /// when it started (a wait's ids are taken at its start),
                /// even if that statement ended since.
                #[track_caller]
                pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
                    if self.polled.is_none() {
                        match self.inner.try_recv() {
                            Ok(v) => return Poll::Ready(Some(v)),
                            Err(error::TryRecvError::Disconnected) => return Poll::Ready(None),
                            Err(error::TryRecvError::Empty) => {
                                self.polled =
                                    Some(self.class.get().start_async(Operation::Wait, self.id));
                            }
                        }
                    }
                    let r = self.inner.poll_recv(cx);
                    if r.is_ready()
                        && let Some(w) = self.polled.take()
                    {
                        w.end();
                    }
                    r
                }

                /// tokio's `poll_recv_many`, recorded as
                /// [`poll_recv`](Self::poll_recv).
                #[track_caller]
                pub fn poll_recv_many(
                    &mut self,
                    cx: &mut Context<'_>,
                    buffer: &mut Vec<T>,
                    limit: usize,
                ) -> Poll<usize> {
                    if self.polled.is_none()
                        && limit != 0
                        && self.inner.is_empty()
                        && !self.inner.is_closed()
                    {
                        self.polled = Some(self.class.get().start_async(Operation::Wait, self.id));
                    }
                    let r = self.inner.poll_recv_many(cx, buffer, limit);
                    if r.is_ready()
                        && let Some(w) = self.polled.take()
                    {
                        w.end();
                    }
                    r
                }

                /// The next message from synchronous code (not from a
                /// runtime's worker, as tokio's), blocking the thread while
                /// the channel is empty; recorded as a `wait` of the
                /// calling thread if it had to wait.
                #[track_caller]
                pub fn blocking_recv(&mut self) -> Option<T> {
                    block_for(
                        self.class,
                        Operation::Wait,
                        self.id,
                        &mut self.inner,
                        |rx| match rx.try_recv() {
                            Ok(v) => Some(Some(v)),
                            Err(error::TryRecvError::Disconnected) => Some(None),
                            Err(error::TryRecvError::Empty) => None,
                        },
                        |rx| rx.blocking_recv(),
                    )
                }

                /// Appends up to `limit` messages to `buffer` from
                /// synchronous code, blocking while the channel is empty;
                /// returns how many. Recorded as
                /// [`blocking_recv`](Self::blocking_recv).
                #[track_caller]
                pub fn blocking_recv_many(&mut self, buffer: &mut Vec<T>, limit: usize) -> usize {
                    block_for(
                        self.class,
                        Operation::Wait,
                        self.id,
                        (&mut self.inner, buffer),
                        |(rx, buffer)| {
                            (limit == 0 || !rx.is_empty() || rx.is_closed())
                                .then(|| rx.blocking_recv_many(buffer, limit))
                        },
                        |(rx, buffer)| rx.blocking_recv_many(buffer, limit),
                    )
                }

                /// Closes the channel to senders; buffered messages can
                /// still be received.
                pub fn close(&mut self) {
                    self.inner.close();
                }

                /// Whether the channel is closed (every sender dropped, or
                /// `close`).
                pub fn is_closed(&self) -> bool {
                    self.inner.is_closed()
                }

                /// Whether no message is buffered.
                pub fn is_empty(&self) -> bool {
                    self.inner.is_empty()
                }

                /// Messages buffered.
                pub fn len(&self) -> usize {
                    self.inner.len()
                }
            }
        };
    }

    receiver!(
        /// The receiving end of [`channel`]: tokio's `mpsc::Receiver`, with
        /// [`Receiver::recv`] and [`Receiver::recv_many`] instrumented.
        /// Made by [`channel`], or by [`Receiver::new`] from a tokio
        /// receiver.
        Receiver,
        tm::Receiver<T>
    );

    receiver!(
        /// The receiving end of [`unbounded_channel`]: tokio's
        /// `mpsc::UnboundedReceiver`, with [`UnboundedReceiver::recv`] and
        /// [`UnboundedReceiver::recv_many`] instrumented.
        UnboundedReceiver,
        tm::UnboundedReceiver<T>
    );
}
