//! Instrument classes: registration and lazily registered statics.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use pfs_shm_layout::ClassKind;
use pfs_shm_layout::layout::{FLAG_ENABLED, NONE_U32};

use crate::runtime;

/// Flags of an instrument that does not exist (client not initialised,
/// registry full, wrong name): permanently disabled.
static DISABLED: AtomicU32 = AtomicU32::new(0);

/// A registered class: its index and its live setup flags word.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassRef {
    pub(crate) index: u32,
    pub(crate) flags: &'static AtomicU32,
}

impl ClassRef {
    pub(crate) const DISABLED: ClassRef = ClassRef {
        index: NONE_U32,
        flags: &DISABLED,
    };

    /// Registers `name` if its kind is accepted by `want`.
    pub(crate) fn register(name: &str, want: fn(ClassKind) -> bool, what: &str) -> Self {
        let Some(rt) = runtime::get() else {
            return Self::DISABLED;
        };
        match ClassKind::from_name(name) {
            Some(kind) if want(kind) => rt
                .writer
                .register_class(name, kind, rt.flags_for(name))
                .map(|index| Self {
                    index,
                    flags: rt.writer.class_flags(index),
                })
                .unwrap_or(Self::DISABLED),
            _ => {
                tracing::warn!(
                    name,
                    "not a PFS {what} instrument name; instrument disabled"
                );
                Self::DISABLED
            }
        }
    }

    #[inline(always)]
    pub(crate) fn flags(&self) -> u32 {
        self.flags.load(Relaxed)
    }

    #[inline(always)]
    pub(crate) fn enabled(&self) -> bool {
        self.flags() & FLAG_ENABLED != 0
    }
}

/// A class registered on first use after `init`.
#[derive(Debug)]
pub(crate) struct LazyRef {
    name: &'static str,
    cell: OnceLock<ClassRef>,
}

impl LazyRef {
    pub(crate) const fn new(name: &'static str) -> Self {
        Self {
            name,
            cell: OnceLock::new(),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    #[inline(always)]
    pub(crate) fn get(&self, want: fn(ClassKind) -> bool, what: &str) -> ClassRef {
        match self.cell.get() {
            Some(c) => *c,
            None => self.resolve(want, what),
        }
    }

    #[cold]
    fn resolve(&self, want: fn(ClassKind) -> bool, what: &str) -> ClassRef {
        if runtime::get().is_none() {
            return ClassRef::DISABLED;
        }
        // Registration allocates under the writer's lock: never account
        // those allocations (see `crate::alloc`).
        *self
            .cell
            .get_or_init(|| crate::thread::reentrant(|| ClassRef::register(self.name, want, what)))
    }
}
