//! Timed waits: instrument classes and the guard that records one wait.

use std::marker::PhantomData;
use std::panic::Location;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use pfs_shm_layout::layout::{
    EV_ENDED, EV_HAS_BYTES, EV_HAS_SPINS, EV_TIMED, EventType, FLAG_ENABLED, FLAG_TIMED, NONE_U32,
};
use pfs_shm_layout::writer::EventData;
use pfs_shm_layout::{ClassKind, Operation};

use crate::runtime::{self, Runtime};
use crate::thread::{ThreadCtx, with_ctx};
use crate::timer;

/// Flags of an instrument that does not exist (client not initialised,
/// registry full): permanently disabled.
static DISABLED: AtomicU32 = AtomicU32::new(0);

/// A registered wait instrument. Cheap to copy; checking whether it is
/// enabled is one relaxed load.
#[derive(Clone, Copy, Debug)]
pub struct WaitClass {
    index: u32,
    flags: &'static AtomicU32,
}

impl WaitClass {
    /// Registers (or finds) the instrument `name`, which must be a PFS wait
    /// name: `wait/synch/mutex/<area>/<name>`, `wait/synch/rwlock/...`,
    /// `wait/synch/cond/...`, `wait/io/file/...`, `wait/io/socket/...`.
    /// Returns a disabled class if the client is not initialised, the name
    /// is not a wait name, or the registry is full (counted as lost).
    pub fn register(name: &str) -> Self {
        let Some(rt) = runtime::get() else {
            return Self::disabled();
        };
        match ClassKind::from_name(name) {
            Some(kind) if kind.is_wait() => rt
                .writer
                .register_class(name, kind, rt.default_flags)
                .map(|index| Self {
                    index,
                    flags: rt.writer.class_flags(index),
                })
                .unwrap_or_else(Self::disabled),
            _ => {
                tracing::warn!(name, "not a PFS wait instrument name; instrument disabled");
                Self::disabled()
            }
        }
    }

    /// A class that never records.
    pub const fn disabled() -> Self {
        Self {
            index: NONE_U32,
            flags: &DISABLED,
        }
    }

    #[inline(always)]
    pub(crate) fn flags_word(&self) -> u32 {
        self.flags.load(Relaxed)
    }

    /// PFS `ENABLED`, as the agent set it.
    #[inline(always)]
    pub fn is_enabled(&self) -> bool {
        self.flags.load(Relaxed) & FLAG_ENABLED != 0
    }

    /// Starts a wait on `object` (its address or any stable id). The caller's
    /// source location becomes the event's `SOURCE`. Disabled: one relaxed
    /// load and a branch.
    #[inline(always)]
    #[track_caller]
    pub fn start(&self, operation: Operation, object: usize) -> WaitGuard {
        let flags = self.flags.load(Relaxed);
        if flags & FLAG_ENABLED == 0 {
            return WaitGuard::NONE;
        }
        self.start_enabled(
            flags,
            operation,
            object as u64,
            NONE_U32,
            Location::caller(),
        )
    }

    #[inline]
    pub(crate) fn start_enabled(
        &self,
        flags: u32,
        operation: Operation,
        object: u64,
        object_name: u32,
        loc: &'static Location<'static>,
    ) -> WaitGuard {
        let Some(rt) = runtime::get() else {
            return WaitGuard::NONE;
        };
        let class = self.index;
        with_ctx(rt, |ctx| {
            let event_id = ctx.event_id.get() + 1;
            ctx.event_id.set(event_id);
            let timed = flags & FLAG_TIMED != 0;
            let data = EventData {
                event_id,
                class,
                operation: operation as u32,
                timer_start: if timed { timer::now_ticks() } else { 0 },
                object_instance: object,
                source: crate::source::source_id(rt, loc),
                object_name,
                flags: if timed { EV_TIMED } else { 0 },
                event_type: EventType::Wait as u32,
                ..EventData::default()
            };
            ctx.rec.begin_event(&data);
            WaitGuard {
                active: Some(Active { rt, ctx, data }),
                _not_send: PhantomData,
            }
        })
        .unwrap_or(WaitGuard::NONE)
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
pub struct LazyWaitClass {
    name: &'static str,
    class: OnceLock<WaitClass>,
}

impl LazyWaitClass {
    /// Declares the instrument; it registers on first use after `init`.
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            class: OnceLock::new(),
        }
    }

    /// The registered class (disabled, and not cached, before `init`).
    #[inline(always)]
    pub fn get(&self) -> WaitClass {
        match self.class.get() {
            Some(c) => *c,
            None => self.resolve(),
        }
    }

    #[cold]
    fn resolve(&self) -> WaitClass {
        if runtime::get().is_none() {
            return WaitClass::disabled();
        }
        *self.class.get_or_init(|| WaitClass::register(self.name))
    }

    /// The instrument name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

struct Active {
    rt: &'static Runtime,
    ctx: &'static ThreadCtx,
    data: EventData,
}

/// One wait in progress; dropping it (or [`WaitGuard::end`]) records it.
/// Not `Send`: a wait belongs to the thread that started it.
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

    pub(crate) const fn none() -> Self {
        Self::NONE
    }

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
        self.finish()
    }

    #[inline(always)]
    fn finish(&mut self) -> Option<u64> {
        let mut a = self.active.take()?;
        let d = &mut a.data;
        d.end_event_id = d.event_id;
        d.flags |= EV_ENDED;
        if d.flags & EV_TIMED != 0 {
            d.timer_end = timer::now_ticks();
            d.timer_wait =
                a.rt.writer
                    .segment()
                    .timer()
                    .ticks_to_ps(d.timer_end.saturating_sub(d.timer_start));
        }
        a.ctx.rec.end_event(d);
        (d.flags & EV_TIMED != 0).then_some(d.timer_wait)
    }
}

impl Drop for WaitGuard {
    #[inline(always)]
    fn drop(&mut self) {
        self.finish();
    }
}
