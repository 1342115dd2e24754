//! The `std::sync` drop-ins (`pfs_client::sync`) against std and the real
//! segment. Each method answers as std's does (results, poisoning after a
//! panic while held, timeouts): where a script runs alone it runs on std's
//! type and on the drop-in and both must see the same. Each records
//! exactly the waits the module says, read back from
//! `events_waits_history_long` and the summaries, per class and
//! operation: one per `lock`/`read`/`write`, one per `try_*` whether it
//! acquires or not, one `wait`/`timed_wait` per time a condition loop
//! sleeps, and nothing for what neither acquires nor blocks.
//!
//! `init` is once per process: the test functions share it through a
//! `OnceLock`, and each uses classes of its own.

use std::ops::Deref;
use std::panic::{self, AssertUnwindSafe, RefUnwindSafe, UnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{LockResult, OnceLock, TryLockError, TryLockResult};
use std::time::{Duration, Instant};

use pfs_client::sync::{Condvar, Mutex, MutexGuard, RwLock};
use pfs_client::{LazyWaitClass, Operation};
use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::reader::{Event, ReadOptions, SegmentSnapshot, snapshot};
use pfs_shm_layout::{EventKind, Segment};

static POISON_MUTEX: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/sync_test/poison");
static POISON_RWLOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/sync_test/poison");
static WW_MUTEX: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/sync_test/ww");
static WW_COND: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/sync_test/ww");
static WTW_MUTEX: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/sync_test/wtw");
static WTW_COND: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/sync_test/wtw");
static NA_MUTEX: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/sync_test/na");
static NA_RWLOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/sync_test/na");
static NA_COND: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/sync_test/na");

/// A timeout that nobody notifies before.
const DUR: Duration = Duration::from_millis(30);
/// A timeout that never passes in a test.
const LONG: Duration = Duration::from_secs(60);

/// The payload of the tests' own panics, which the panic hook keeps quiet.
struct Deliberate;

/// The segment, initialised once for the whole process with the
/// `history_long` consumers on, opened for reading. Also silences the
/// tests' deliberate panics (any other panic is reported as usual).
fn segment() -> &'static std::fs::File {
    static FILE: OnceLock<std::fs::File> = OnceLock::new();
    FILE.get_or_init(|| {
        let report = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<Deliberate>() {
                report(info);
            }
        }));
        let dir = tempfile::tempdir().unwrap();
        pfs_client::init_with(
            pfs_client::Config::new("sync-dropins")
                .shm_dir(dir.path())
                .consumer("events_%_history_long", true),
        )
        .unwrap();
        std::fs::File::open(pfs_client::segment_path().unwrap()).unwrap()
    })
}

/// Registers `classes` (a class registers on first use), so that a class
/// that recorded nothing is there with a count of 0.
fn register(classes: &[&LazyWaitClass]) {
    for c in classes {
        assert!(c.get().is_enabled(), "{}", c.name());
    }
}

fn read() -> SegmentSnapshot {
    let seg = Segment::open(segment().try_clone().unwrap(), false).unwrap();
    snapshot(&seg, &ReadOptions::default()).unwrap()
}

fn class_index(s: &SegmentSnapshot, name: &str) -> u32 {
    s.classes
        .iter()
        .find(|c| c.name == name)
        .map(|c| c.index)
        .unwrap_or_else(|| panic!("{name} registered"))
}

/// The waits `class` recorded in `history_long`, all ended; as many as
/// its summary's `COUNT_STAR`.
fn waits(s: &SegmentSnapshot, class: &LazyWaitClass) -> Vec<Event> {
    for kind in [
        LostKind::WaitsLong,
        LostKind::StagesLong,
        LostKind::StatementsLong,
    ] {
        assert_eq!(
            s.lost[kind as usize], 0,
            "history_long lost events: {kind:?}"
        );
    }
    let idx = class_index(s, class.name());
    let waits: Vec<Event> = s.long[EventKind::Wait.index()]
        .iter()
        .filter(|e| e.class == idx)
        .copied()
        .collect();
    assert!(waits.iter().all(|e| e.end_event_id.is_some()), "ended");
    assert_eq!(
        s.summary_of(idx).count,
        waits.len() as u64,
        "{}: COUNT_STAR",
        class.name()
    );
    waits
}

/// How many waits of `class` each operation recorded, in operation order.
fn by_operation(s: &SegmentSnapshot, class: &LazyWaitClass) -> Vec<(Operation, usize)> {
    let mut n: Vec<(Operation, usize)> = Vec::new();
    for e in waits(s, class) {
        let op = e.operation.expect("an operation");
        match n.iter_mut().find(|(o, _)| *o == op) {
            Some((_, c)) => *c += 1,
            None => n.push((op, 1)),
        }
    }
    n.sort_by_key(|(o, _)| *o as u32);
    n
}

fn locked<G: Deref<Target = u32>>(r: LockResult<G>) -> String {
    match r {
        Ok(g) => format!("ok {}", *g),
        Err(p) => format!("poisoned {}", *p.into_inner()),
    }
}

fn tried<G: Deref<Target = u32>>(r: TryLockResult<G>) -> String {
    match r {
        Ok(g) => format!("ok {}", *g),
        Err(TryLockError::WouldBlock) => "would block".into(),
        Err(TryLockError::Poisoned(p)) => format!("poisoned {}", *p.into_inner()),
    }
}

fn mut_ref(r: LockResult<&mut u32>) -> String {
    match r {
        Ok(v) => format!("ok {v}"),
        Err(p) => format!("poisoned {}", p.into_inner()),
    }
}

fn owned(r: LockResult<u32>) -> String {
    match r {
        Ok(v) => format!("ok {v}"),
        Err(p) => format!("poisoned {}", p.into_inner()),
    }
}

/// Poisons `m` (a std mutex or a drop-in), looks at it every way, clears
/// it: what each step returned. Takes 5 `lock`s and 3 `try_lock`s.
macro_rules! mutex_script {
    ($m:expr) => {{
        let mut m = $m;
        let mut seen = vec![format!("poisoned {}", m.is_poisoned())];
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            let mut g = m.lock().unwrap();
            *g += 1;
            panic::panic_any(Deliberate);
        }));
        seen.push(format!("panicked {}", r.is_err()));
        seen.push(format!("poisoned {}", m.is_poisoned()));
        seen.push(locked(m.lock()));
        seen.push(tried(m.try_lock()));
        seen.push(mut_ref(m.get_mut()));
        m.clear_poison();
        seen.push(format!("poisoned {}", m.is_poisoned()));
        seen.push(locked(m.lock()));
        {
            let _held = m.lock().unwrap();
            seen.push(tried(m.try_lock()));
        }
        seen.push(tried(m.try_lock()));
        seen.push(mut_ref(m.get_mut()));
        let _ = panic::catch_unwind(AssertUnwindSafe(|| {
            let _g = m.lock().unwrap();
            panic::panic_any(Deliberate);
        }));
        seen.push(owned(m.into_inner()));
        seen
    }};
}

/// Shares, excludes, poisons (a reader's panic does not, a writer's does),
/// clears and downgrades `rw` (a std rwlock or a drop-in): what each step
/// returned. Takes 2 `read`s, 3 `write`s, 6 `try_read`s and 5
/// `try_write`s.
macro_rules! rwlock_script {
    ($rw:expr) => {{
        let mut rw = $rw;
        let mut seen = vec![format!("poisoned {}", rw.is_poisoned())];
        {
            let _r = rw.try_read().unwrap();
            seen.push(tried(rw.try_read()));
            seen.push(tried(rw.try_write()));
        }
        {
            let _w = rw.try_write().unwrap();
            seen.push(tried(rw.try_read()));
            seen.push(tried(rw.try_write()));
        }
        let _ = panic::catch_unwind(AssertUnwindSafe(|| {
            let _r = rw.read().unwrap();
            panic::panic_any(Deliberate);
        }));
        seen.push(format!("poisoned {}", rw.is_poisoned()));
        let _ = panic::catch_unwind(AssertUnwindSafe(|| {
            let mut w = rw.write().unwrap();
            *w = 7;
            panic::panic_any(Deliberate);
        }));
        seen.push(format!("poisoned {}", rw.is_poisoned()));
        seen.push(locked(rw.read()));
        seen.push(locked(rw.write()));
        seen.push(tried(rw.try_read()));
        seen.push(tried(rw.try_write()));
        seen.push(mut_ref(rw.get_mut()));
        rw.clear_poison();
        seen.push(format!("poisoned {}", rw.is_poisoned()));
        seen.push(tried(rw.try_read()));
        {
            let r = std::sync::RwLockWriteGuard::downgrade(rw.write().unwrap());
            seen.push(format!("downgraded {}", *r));
            seen.push(tried(rw.try_write()));
            seen.push(tried(rw.try_read()));
        }
        seen.push(owned(rw.into_inner()));
        seen
    }};
}

#[test]
fn mutex_poisoning_is_std_s_and_only_acquisitions_record() {
    segment();
    let std_seen = mutex_script!(std::sync::Mutex::new(0u32));
    let seen = mutex_script!(Mutex::new(&POISON_MUTEX, 0u32));
    assert_eq!(seen, std_seen);
    assert_eq!(
        seen,
        [
            "poisoned false",
            "panicked true",
            "poisoned true",
            "poisoned 1",
            "poisoned 1",
            "poisoned 1",
            "poisoned false",
            "ok 1",
            "would block",
            "ok 1",
            "ok 1",
            "poisoned 1",
        ]
    );
    let s = read();
    assert_eq!(
        by_operation(&s, &POISON_MUTEX),
        [(Operation::Lock, 5), (Operation::TryLock, 3)]
    );
    let spins: Vec<_> = waits(&s, &POISON_MUTEX)
        .iter()
        .filter(|e| e.operation == Some(Operation::TryLock))
        .map(|e| e.spins)
        .collect();
    assert_eq!(spins, [None; 3], "a try_lock has no SPINS");
}

#[test]
fn rwlock_try_and_poisoning_are_std_s_and_record_their_operations() {
    segment();
    let std_seen = rwlock_script!(std::sync::RwLock::new(0u32));
    let seen = rwlock_script!(RwLock::new(&POISON_RWLOCK, 0u32));
    assert_eq!(seen, std_seen);
    assert_eq!(
        seen,
        [
            "poisoned false",
            "ok 0",
            "would block",
            "would block",
            "would block",
            "poisoned false",
            "poisoned true",
            "poisoned 7",
            "poisoned 7",
            "poisoned 7",
            "poisoned 7",
            "poisoned 7",
            "poisoned false",
            "ok 7",
            "downgraded 7",
            "would block",
            "ok 7",
            "ok 7",
        ]
    );
    let s = read();
    assert_eq!(
        by_operation(&s, &POISON_RWLOCK),
        [
            (Operation::ReadLock, 2),
            (Operation::WriteLock, 3),
            (Operation::TryReadLock, 6),
            (Operation::TryWriteLock, 5),
        ]
    );
    let try_spins: Vec<_> = waits(&s, &POISON_RWLOCK)
        .iter()
        .filter(|e| {
            matches!(
                e.operation,
                Some(Operation::TryReadLock | Operation::TryWriteLock)
            )
        })
        .map(|e| e.spins)
        .collect();
    assert_eq!(try_spins, [None; 11], "a try has no SPINS");
}

/// Runs `waiter` (which waits on `cv` for `m`'s value to reach 3, with a
/// condition that stores each value it sees in `seen`) while another
/// thread sets the value to 1, 2, 3, each time once the waiter has seen
/// the previous one and so sleeps (the setter takes the lock only then),
/// notifying each time. Takes 3 `lock`s on the setter's thread.
fn notified_three_times<R>(
    m: &Mutex<u32>,
    cv: &Condvar,
    seen: &AtomicU32,
    waiter: impl FnOnce() -> R,
) -> R {
    seen.store(u32::MAX, SeqCst);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for i in 1..=3 {
                while seen.load(SeqCst) != i - 1 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                *m.lock().unwrap() = i;
                cv.notify_one();
            }
        });
        waiter()
    })
}

/// Takes `m` (with the caller holding it as `held`), then panics holding it
/// on another thread and notifies: the waiter wakes to a poisoned mutex.
/// Takes 1 `lock` on that thread.
fn poisoned_while_waiting<'a, R>(
    m: &'a Mutex<u32>,
    cv: &Condvar,
    held: MutexGuard<'a, u32>,
    waiter: impl FnOnce(MutexGuard<'a, u32>) -> R,
) -> R {
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let _ = panic::catch_unwind(|| {
                let _g = m.lock();
                panic::panic_any(Deliberate);
            });
            cv.notify_one();
        });
        waiter(held)
    })
}

#[test]
fn condvar_wait_while_records_one_wait_per_sleep() {
    segment();
    register(&[&WW_MUTEX, &WW_COND]);
    let m = Mutex::new(&WW_MUTEX, 0u32);
    let cv = Condvar::new(&WW_COND);

    // False at once: no wait, as std does not wait.
    let (sm, scv) = (std::sync::Mutex::new(0u32), std::sync::Condvar::new());
    let std_g = scv.wait_while(sm.lock().unwrap(), |n| *n != 0).unwrap();
    let g = cv.wait_while(m.lock().unwrap(), |n| *n != 0).unwrap();
    assert_eq!(*g, *std_g);
    drop(g);
    let s = read();
    assert!(waits(&s, &WW_COND).is_empty());

    // Three notifications, each while it sleeps: three waits (one more per
    // spurious wakeup, which the condition also sees).
    let seen = AtomicU32::new(0);
    let mut asked = 0;
    let g = notified_three_times(&m, &cv, &seen, || {
        cv.wait_while(m.lock().unwrap(), |n| {
            asked += 1;
            seen.store(*n, SeqCst);
            *n < 3
        })
        .unwrap()
    });
    assert_eq!(*g, 3);
    drop(g);
    assert!(asked >= 4, "0, 1, 2 then 3: {asked}");
    let slept = asked - 1;
    let s = read();
    assert_eq!(by_operation(&s, &WW_COND), [(Operation::Wait, slept)]);

    // Poisoned while it sleeps: the wait that wakes to it returns the
    // error, with the guard, as std's does.
    let mut asked = 0;
    let r = poisoned_while_waiting(&m, &cv, m.lock().unwrap(), |g| {
        cv.wait_while(g, |_| {
            asked += 1;
            true
        })
        .map(|g| *g)
        .map_err(|p| *p.into_inner())
    });
    assert_eq!(r, Err(3));
    assert!(m.is_poisoned());
    assert!(asked >= 1);
    let s = read();
    assert_eq!(
        by_operation(&s, &WW_COND),
        [(Operation::Wait, slept + asked)]
    );
    assert_eq!(
        by_operation(&s, &WW_MUTEX),
        [(Operation::Lock, 1 + (1 + 3) + (1 + 1))],
        "waking from a condvar wait is not a lock wait"
    );
}

#[test]
fn condvar_wait_timeout_while_times_out_like_std() {
    segment();
    register(&[&WTW_MUTEX, &WTW_COND]);
    let m = Mutex::new(&WTW_MUTEX, 0u32);
    let cv = Condvar::new(&WTW_COND);
    let (sm, scv) = (std::sync::Mutex::new(0u32), std::sync::Condvar::new());

    // False at once: not timed out, no wait.
    let (std_g, std_t) = scv
        .wait_timeout_while(sm.lock().unwrap(), LONG, |n| *n != 0)
        .unwrap();
    let (g, t) = cv
        .wait_timeout_while(m.lock().unwrap(), LONG, |n| *n != 0)
        .unwrap();
    assert_eq!((*g, t), (*std_g, std_t));
    assert!(!t.timed_out());
    drop((g, std_g));
    let s = read();
    assert!(waits(&s, &WTW_COND).is_empty());

    // Never false, nobody notifies: times out once `DUR` has passed, with
    // a `timed_wait` per sleep (the last check, past the deadline, does
    // not sleep).
    let start = Instant::now();
    let (std_g, std_t) = scv
        .wait_timeout_while(sm.lock().unwrap(), DUR, |_| true)
        .unwrap();
    assert!(start.elapsed() >= DUR);
    let mut asked = 0;
    let start = Instant::now();
    let (g, t) = cv
        .wait_timeout_while(m.lock().unwrap(), DUR, |_| {
            asked += 1;
            true
        })
        .unwrap();
    assert!(start.elapsed() >= DUR);
    assert_eq!((*g, t), (*std_g, std_t));
    assert!(t.timed_out());
    drop((g, std_g));
    assert!(asked >= 2, "checked before sleeping and after the deadline");
    let mut slept = asked - 1;
    let s = read();
    let timed = waits(&s, &WTW_COND);
    assert_eq!(by_operation(&s, &WTW_COND), [(Operation::TimedWait, slept)]);
    let total: u64 = timed.iter().map(|e| e.timer_wait.expect("timed")).sum();
    // A loaded machine may preempt it between its start and its first
    // sleep: half of `DUR` still tells measured sleeps from none.
    assert!(
        total >= (DUR / 2).as_nanos() as u64 * 1000,
        "the sleeps add up to about {DUR:?}: {total} ps"
    );

    // No time at all: timed out, as std.
    let (std_g, std_t) = scv
        .wait_timeout_while(sm.lock().unwrap(), Duration::ZERO, |_| true)
        .unwrap();
    let mut asked = 0;
    let (g, t) = cv
        .wait_timeout_while(m.lock().unwrap(), Duration::ZERO, |_| {
            asked += 1;
            true
        })
        .unwrap();
    assert_eq!((*g, t), (*std_g, std_t));
    assert!(t.timed_out());
    drop((g, std_g));
    slept += asked - 1;

    // Notified in time: not timed out, a `timed_wait` per sleep.
    let seen = AtomicU32::new(0);
    let mut asked = 0;
    let (g, t) = notified_three_times(&m, &cv, &seen, || {
        cv.wait_timeout_while(m.lock().unwrap(), LONG, |n| {
            asked += 1;
            seen.store(*n, SeqCst);
            *n < 3
        })
        .unwrap()
    });
    assert_eq!((*g, t.timed_out()), (3, false));
    drop(g);
    assert!(asked >= 4, "0, 1, 2 then 3: {asked}");
    slept += asked - 1;

    // Poisoned while it sleeps: the error, with the guard and that wait's
    // result, as std's.
    let mut asked = 0;
    let r = poisoned_while_waiting(&m, &cv, m.lock().unwrap(), |g| {
        cv.wait_timeout_while(g, LONG, |_| {
            asked += 1;
            true
        })
        .map(|(g, t)| (*g, t.timed_out()))
        .map_err(|p| {
            let (g, t) = p.into_inner();
            (*g, t.timed_out())
        })
    });
    assert_eq!(r, Err((3, false)));
    assert!(m.is_poisoned());
    slept += asked;

    let s = read();
    assert_eq!(by_operation(&s, &WTW_COND), [(Operation::TimedWait, slept)]);
    assert_eq!(
        by_operation(&s, &WTW_MUTEX),
        [(Operation::Lock, 1 + 1 + 1 + (1 + 3) + (1 + 1))]
    );
}

#[test]
fn what_neither_acquires_nor_blocks_records_nothing() {
    segment();
    register(&[&NA_MUTEX, &NA_RWLOCK, &NA_COND]);
    let mut m = Mutex::new(&NA_MUTEX, 1u32);
    let mut rw = RwLock::new(&NA_RWLOCK, 2u32);
    let cv = Condvar::new(&NA_COND);
    assert!(!m.is_poisoned() && !rw.is_poisoned());
    m.clear_poison();
    rw.clear_poison();
    *m.get_mut().unwrap() += 10;
    *rw.get_mut().unwrap() += 20;
    cv.notify_one();
    cv.notify_all();
    assert_eq!(
        (m.into_inner().unwrap(), rw.into_inner().unwrap()),
        (11, 22)
    );
    let s = read();
    for c in [&NA_MUTEX, &NA_RWLOCK, &NA_COND] {
        assert!(waits(&s, c).is_empty(), "{}", c.name());
    }
}

#[test]
fn auto_traits_and_formatting_are_std_s() {
    segment();
    fn shared<T: Send + Sync + UnwindSafe + RefUnwindSafe>() {}
    fn sync_guard<T: Sync>() {}
    shared::<Mutex<u32>>();
    shared::<RwLock<u32>>();
    shared::<Condvar>();
    sync_guard::<MutexGuard<'static, u32>>();

    static FMT: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/sync_test/fmt");
    let m = Mutex::new(&FMT, String::from("v"));
    let sm = std::sync::Mutex::new(String::from("v"));
    let (g, sg) = (m.lock().unwrap(), sm.lock().unwrap());
    assert_eq!(format!("{g} {g:?}"), format!("{sg} {sg:?}"));
}
