//! Giving freed heap memory back to the kernel. The agent's only
//! `unsafe` (one FFI call), allowed here and denied everywhere else.
//!
//! glibc's `free` keeps memory in its arenas for reuse: after a process
//! drops a large, short-lived structure made of many small allocations (the
//! agent's full snapshot: every thread's rows), most of it stays resident
//! for good. [`release_free_memory`] asks the allocator to return every free
//! page now.

/// Returns the allocator's free pages to the kernel (glibc
/// `malloc_trim(0)`: every arena, free pages inside the heap too, not only
/// its top). Costs a walk of the free lists (milliseconds after a large
/// drop): call it after freeing something large, not on a hot path. A
/// no-op on other C libraries. Returns whether memory was released.
#[allow(unsafe_code)]
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` has no preconditions: it takes each arena's
        // lock and only returns free chunks' pages to the kernel, never
        // memory that is in use. Rust's global allocator in this process
        // is glibc's malloc unless a program installs another one, and
        // then this call only touches glibc's (possibly empty) arenas.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn freed_memory_can_be_released() {
        // Many small blocks (below the mmap threshold), then all freed.
        let blocks: Vec<Vec<u8>> = (0..4096).map(|i| vec![i as u8; 16 * 1024]).collect();
        // Allocated after them, alive: the freed blocks are not at the
        // heap's top, where `free` itself could trim them.
        let pin = std::hint::black_box(Box::new([1u8; 64]));
        assert_eq!(blocks.iter().map(Vec::len).sum::<usize>(), 64 << 20);
        drop(blocks);
        // glibc: released something; elsewhere a no-op that says so.
        assert_eq!(
            super::release_free_memory(),
            cfg!(all(target_os = "linux", target_env = "gnu"))
        );
        assert_eq!(pin[63], 1);
    }
}
