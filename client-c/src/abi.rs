//! Layer 3. The ABI's version and the check that a program's `pfs.h`
//! agrees with the library it runs with: `PFS_ABI_VERSION` (also the
//! number of the SONAME, `libpfs.so.0`), `pfs_abi_version`,
//! `pfs_check_abi` (and the header's `PFS_CHECK_ABI()`, which passes the
//! header's version and struct sizes to it).
//!
//! The policy: any incompatible change (a struct's size or fields, a
//! function's signature or meaning, a removed function or constant)
//! raises `PFS_ABI_VERSION` and the SONAME; additions (a function, a
//! constant, an error code) do not.

use crate::codes::{PFS_ERR_ABI_MISMATCH, PFS_ERR_INTERNAL, PFS_OK};
use crate::init::{pfs_config_t, refuse};
use crate::memory::pfs_memory_t;
use crate::shield::shield;
use crate::slot;
use crate::statement::pfs_statement_t;
use crate::wait::pfs_wait_t;

/// The ABI version this header describes (`libpfs.so.0`): compare it with
/// `pfs_abi_version()`, or let `PFS_CHECK_ABI()` do it.
pub const PFS_ABI_VERSION: u32 = 0;

/// The ABI version of the library the program runs with (its SONAME's
/// number). Any thread, any time.
#[unsafe(no_mangle)]
pub extern "C" fn pfs_abi_version() -> u32 {
    PFS_ABI_VERSION
}

/// Checks that the program was compiled with a `pfs.h` that matches this
/// library: the header's `PFS_ABI_VERSION` and the sizes of the structs
/// the program allocates. Call it as `PFS_CHECK_ABI()`, which passes them,
/// before `pfs_init*`:
///
/// ```c
/// if (PFS_CHECK_ABI() != PFS_OK) { /* pfs_init_error says what differs */ }
/// ```
///
/// Returns `PFS_OK`, or `PFS_ERR_ABI_MISMATCH` (message: `pfs_init_error`)
/// after which every `pfs_init*` and every later check (even a matching
/// one: the library stays off for the process) returns
/// `PFS_ERR_ABI_MISMATCH` too, and
/// (even if the library was initialised already) every call that takes a
/// `pfs_wait_t`, `pfs_statement_t` or `pfs_memory_t` leaves it untouched,
/// so the program runs uninstrumented instead of handing the library
/// structs of the wrong size (waits, statements and memory begun before
/// such a late check are never ended nor freed in the accounting); or
/// `PFS_ERR_INTERNAL`.
///
/// Threading: any thread, before `pfs_init*`; takes a lock.
#[unsafe(no_mangle)]
pub extern "C" fn pfs_check_abi(
    abi_version: u32,
    config_size: usize,
    wait_size: usize,
    statement_size: usize,
    memory_size: usize,
) -> i32 {
    shield(PFS_ERR_INTERNAL, || {
        let mut wrong = Vec::new();
        if abi_version != PFS_ABI_VERSION {
            wrong.push(format!(
                "PFS_ABI_VERSION {abi_version} (this libpfs: {PFS_ABI_VERSION})"
            ));
        }
        for (name, got, want) in [
            ("pfs_config_t", config_size, size_of::<pfs_config_t>()),
            ("pfs_wait_t", wait_size, size_of::<pfs_wait_t>()),
            (
                "pfs_statement_t",
                statement_size,
                size_of::<pfs_statement_t>(),
            ),
            ("pfs_memory_t", memory_size, size_of::<pfs_memory_t>()),
        ] {
            if got != want {
                wrong.push(format!("sizeof({name}) {got} (this libpfs: {want})"));
            }
        }
        if wrong.is_empty() {
            if !slot::usable() {
                // A check failed before: the library stays off for the
                // process, and every later check says so.
                return PFS_ERR_ABI_MISMATCH;
            }
            return PFS_OK;
        }
        // Called after a successful `pfs_init*` too: the structs the
        // program hands over are the wrong size, so none is touched again.
        slot::refuse_all();
        refuse(format!(
            "the program's pfs.h does not match libpfs.so.{PFS_ABI_VERSION}: {}; rebuild it against this library's pfs.h (instrumentation stays off: the library no longer touches the program's pfs_wait_t, pfs_statement_t and pfs_memory_t)",
            wrong.join(", ")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soname_is_the_abi_version() {
        assert_eq!(env!("PFS_SONAME"), format!("libpfs.so.{PFS_ABI_VERSION}"));
        assert_eq!(pfs_abi_version(), PFS_ABI_VERSION);
    }
}
