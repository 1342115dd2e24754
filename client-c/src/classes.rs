//! Layer 1. Class handles for C: registering a name gives a pointer to a
//! lazily registered class (`pfs-client`'s `Lazy*Class`) that lives as
//! long as the process, so C code can register at any time, before
//! `pfs_init` included, and keep the handle in a global. One handle per
//! name and family: registering a name again returns the same pointer.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, Ordering};

use pfs_client::{
    LazyMemoryClass, LazyStageClass, LazyStatementClass, LazyWaitClass, MemoryClass, StageClass,
    StatementClass, WaitClass,
};
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

/// One registered handle in a family's list. Nodes are leaked: they
/// live as long as the process, and are never changed once published.
struct Node<T: 'static> {
    name: &'static str,
    handle: &'static T,
    next: *const Node<T>,
}

/// Handles by name, one list per family, insert-only and lock-free (one
/// compare-and-swap publishes a node at the head). No lock, so that a
/// `fork` while another thread registers leaves the child a usable
/// registry: a lock that thread held at the fork would never be released
/// in the child, whose next registration would wait forever. Registration
/// is a slow path and lists are short (a service's instrument names).
/// (The `PhantomData` makes the registry `Sync` only for handles that are:
/// it hands out `&'static T` to any thread.)
struct Registry<T: 'static>(AtomicPtr<Node<T>>, PhantomData<&'static T>);

impl<T> Registry<T> {
    const fn new() -> Self {
        Self(AtomicPtr::new(std::ptr::null_mut()), PhantomData)
    }

    /// The handle of `name` in the list from `node` on.
    ///
    /// # Safety
    ///
    /// `node` is null or a node of a registry's list, loaded (or reached)
    /// with Acquire ordering.
    #[allow(unsafe_code)]
    unsafe fn find(mut node: *const Node<T>, name: &str) -> Option<&'static T> {
        // SAFETY: every node of a list was leaked by `intern` (valid for
        // the life of the process) and fully written, its `next`
        // included, before the Release compare-and-swap that published
        // it; the caller's Acquire load of the head synchronises with that
        // swap and, through the release sequence of the head's later
        // swaps, with every earlier one, so every node reachable from it
        // is visible, complete. A published node is never written again,
        // so shared references to it are sound.
        while let Some(n) = unsafe { node.as_ref() } {
            if n.name == name {
                return Some(n.handle);
            }
            node = n.next;
        }
        None
    }
}

static WAITS: Registry<pfs_wait_class_t> = Registry::new();
static STAGES: Registry<pfs_stage_class_t> = Registry::new();
static STATEMENTS: Registry<pfs_statement_class_t> = Registry::new();
static MEMORY: Registry<pfs_memory_class_t> = Registry::new();

/// The handle for `name` in `registry`, made by `make` on first request.
/// Two threads registering one name at once get the same handle: the
/// loser of the swap finds the winner's node and leaks its own (a few
/// bytes, once).
fn intern<T>(registry: &Registry<T>, name: &str, make: fn(&'static str) -> T) -> &'static T {
    let mut mine: Option<&'static mut Node<T>> = None;
    loop {
        let head = registry.0.load(Ordering::Acquire);
        // SAFETY: `head` is the list's head, loaded with Acquire.
        #[allow(unsafe_code)]
        if let Some(h) = unsafe { Registry::find(head, name) } {
            return h;
        }
        let node = mine.get_or_insert_with(|| {
            let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
            Box::leak(Box::new(Node {
                name,
                handle: Box::leak(Box::new(make(name))),
                next: std::ptr::null(),
            }))
        });
        node.next = head;
        let handle = node.handle;
        let p: *mut Node<T> = &mut **node;
        if registry
            .0
            .compare_exchange(head, p, Ordering::Release, Ordering::Relaxed)
            .is_ok()
        {
            return handle;
        }
    }
}

/// Refuses `name` for a family (`register`: that family's registration
/// in `pfs-client`), which disables it, logs why and, once `pfs_init` has
/// run, counts it in `pfs_lost_total{kind="instrument_classes"}` as a Rust
/// instrument of that name would be: a C program's typo shows where an
/// operator looks, not only as a NULL handle.
fn refuse<T, C>(name: &str, register: fn(&str) -> C) -> Option<&'static T> {
    register(name);
    None
}

/// The handle of wait instrument `name`, or `None` (counted, see
/// [`refuse`]) if it is not a `wait/...` name.
pub(crate) fn wait(name: &str) -> Option<&'static pfs_wait_class_t> {
    match ClassKind::from_name(name) {
        Some(kind) if kind.is_wait() => Some(intern(&WAITS, name, |n| {
            pfs_wait_class_t(LazyWaitClass::new(n))
        })),
        _ => refuse(name, WaitClass::register),
    }
}

/// The handle of stage instrument `name`, or `None` (counted) if it is
/// not a `stage/...` name.
pub(crate) fn stage(name: &str) -> Option<&'static pfs_stage_class_t> {
    match ClassKind::from_name(name) {
        Some(ClassKind::Stage) => Some(intern(&STAGES, name, |n| {
            pfs_stage_class_t(LazyStageClass::new(n))
        })),
        _ => refuse(name, StageClass::register),
    }
}

/// The handle of statement instrument `name`, or `None` (counted) if it
/// is not a `statement/...` name.
pub(crate) fn statement(name: &str) -> Option<&'static pfs_statement_class_t> {
    match ClassKind::from_name(name) {
        Some(ClassKind::Statement) => Some(intern(&STATEMENTS, name, |n| {
            pfs_statement_class_t(LazyStatementClass::new(n))
        })),
        _ => refuse(name, StatementClass::register),
    }
}

/// The handle of memory instrument `name`, or `None` (counted) if it is
/// not a `memory/...` name.
pub(crate) fn memory(name: &str) -> Option<&'static pfs_memory_class_t> {
    match ClassKind::from_name(name) {
        Some(ClassKind::Memory) => Some(intern(&MEMORY, name, |n| {
            pfs_memory_class_t(LazyMemoryClass::new(n))
        })),
        _ => refuse(name, MemoryClass::register),
    }
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

    /// Threads registering the same names at once get one handle per
    /// name (the lock-free list loses no node and makes no duplicate).
    #[test]
    fn concurrent_registrations_agree() {
        let names: Vec<String> = (0..64)
            .map(|i| format!("wait/synch/mutex/race/{i}"))
            .collect();
        let seen: Vec<Vec<usize>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|t| {
                    let names = &names;
                    s.spawn(move || {
                        let mut order: Vec<usize> = (0..names.len()).collect();
                        order.rotate_left(t * 8);
                        let mut out = vec![0; names.len()];
                        for i in order {
                            out[i] = std::ptr::from_ref(wait(&names[i]).unwrap()) as usize;
                        }
                        out
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for other in &seen[1..] {
            assert_eq!(other, &seen[0]);
        }
        let distinct: std::collections::BTreeSet<_> = seen[0].iter().collect();
        assert_eq!(distinct.len(), names.len());
    }
}
