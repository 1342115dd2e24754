//! Layer 1. Class handles for C: registering a name gives a pointer to a
//! lazily registered class (`pfs-client`'s `Lazy*Class`) that lives as
//! long as the process, so C code can register at any time, before
//! `pfs_init` included, and keep the handle in a global. One handle per
//! name and family: registering a name again returns the same pointer.

use std::collections::BTreeMap;
use std::sync::Mutex;

use pfs_client::{LazyMemoryClass, LazyStageClass, LazyStatementClass, LazyWaitClass};
use pfs_shm_layout::ClassKind;

/// A wait instrument (`wait/...`), from `pfs_wait_class_register`.
/// Opaque; valid for the life of the process; usable from any thread.
pub struct pfs_wait_class_t(pub(crate) LazyWaitClass);

/// A stage instrument (`stage/...`), from `pfs_stage_class_register`.
/// Opaque; valid for the life of the process; usable from any thread.
pub struct pfs_stage_class_t(pub(crate) LazyStageClass);

/// A statement instrument (`statement/...`), from
/// `pfs_statement_class_register`. Opaque; valid for the life of the
/// process; usable from any thread.
pub struct pfs_statement_class_t(pub(crate) LazyStatementClass);

/// A memory instrument (`memory/...`), from `pfs_memory_class_register`.
/// Opaque; valid for the life of the process; usable from any thread.
pub struct pfs_memory_class_t(pub(crate) LazyMemoryClass);

/// Handles by name, one map per family. Registration is a slow path (a
/// lock and, the first time, two small allocations); events never come
/// here.
type Registry<T> = Mutex<BTreeMap<&'static str, &'static T>>;

static WAITS: Registry<pfs_wait_class_t> = Mutex::new(BTreeMap::new());
static STAGES: Registry<pfs_stage_class_t> = Mutex::new(BTreeMap::new());
static STATEMENTS: Registry<pfs_statement_class_t> = Mutex::new(BTreeMap::new());
static MEMORY: Registry<pfs_memory_class_t> = Mutex::new(BTreeMap::new());

/// The handle for `name` in `registry`, made by `make` on first request.
fn intern<T>(registry: &Registry<T>, name: &str, make: fn(&'static str) -> T) -> &'static T {
    // A panic while the lock was held left the map consistent (an insert
    // either happened or not): keep using it.
    let mut map = registry.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = map.get(name) {
        return h;
    }
    let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
    let handle: &'static T = Box::leak(Box::new(make(name)));
    map.insert(name, handle);
    handle
}

/// The handle of wait instrument `name`, or `None` if it is not a
/// `wait/...` name.
pub(crate) fn wait(name: &str) -> Option<&'static pfs_wait_class_t> {
    let kind = ClassKind::from_name(name)?;
    kind.is_wait()
        .then(|| intern(&WAITS, name, |n| pfs_wait_class_t(LazyWaitClass::new(n))))
}

/// The handle of stage instrument `name`, or `None` if it is not a
/// `stage/...` name.
pub(crate) fn stage(name: &str) -> Option<&'static pfs_stage_class_t> {
    (ClassKind::from_name(name)? == ClassKind::Stage)
        .then(|| intern(&STAGES, name, |n| pfs_stage_class_t(LazyStageClass::new(n))))
}

/// The handle of statement instrument `name`, or `None` if it is not a
/// `statement/...` name.
pub(crate) fn statement(name: &str) -> Option<&'static pfs_statement_class_t> {
    (ClassKind::from_name(name)? == ClassKind::Statement).then(|| {
        intern(&STATEMENTS, name, |n| {
            pfs_statement_class_t(LazyStatementClass::new(n))
        })
    })
}

/// The handle of memory instrument `name`, or `None` if it is not a
/// `memory/...` name.
pub(crate) fn memory(name: &str) -> Option<&'static pfs_memory_class_t> {
    (ClassKind::from_name(name)? == ClassKind::Memory).then(|| {
        intern(&MEMORY, name, |n| {
            pfs_memory_class_t(LazyMemoryClass::new(n))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_handle_per_name_and_family_checked() {
        let a = wait("wait/synch/mutex/c/a").unwrap();
        assert!(std::ptr::eq(a, wait("wait/synch/mutex/c/a").unwrap()));
        assert!(!std::ptr::eq(a, wait("wait/synch/mutex/c/b").unwrap()));
        assert_eq!(a.0.name(), "wait/synch/mutex/c/a");
        assert!(wait("idle").is_some());
        assert!(wait("stage/c/a").is_none());
        assert!(stage("stage/c/a").is_some() && stage("wait/io/file/c/a").is_none());
        assert!(statement("statement/c/q").is_some() && statement("stage/c/q").is_none());
        assert!(memory("memory/c/buf").is_some() && memory("mem/c/buf").is_none());
    }
}
