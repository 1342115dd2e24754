//! # pfs-client-c: the C ABI of pfs-client
//!
//! Lets programs in C, C++, or any language with a C FFI (Go through cgo,
//! Python through ctypes or cffi, Ruby, ...) record waits, stages,
//! statements and memory into a pfs-exporter segment, exactly as a Rust
//! program does through `pfs-client`, which this crate wraps. It builds
//! `libpfs.so` (cdylib) and `libpfs.a` (staticlib); the header
//! `include/pfs.h` is generated from this crate by cbindgen (see
//! `docs/C-API.md`, and `tests/header.rs`, which keeps it fresh).
//!
//! The rules are the Rust client's:
//!
//! * a failed (or missing) `pfs_init` leaves every call a cheap no-op;
//! * the event path (`pfs_wait_begin`/`pfs_wait_end`, stages, statements,
//!   memory accounting) takes no lock and allocates nothing: the state of
//!   a wait or a statement lives in a caller-owned struct (`pfs_wait_t`,
//!   `pfs_statement_t`), typically on the C stack;
//! * nothing from C can crash it: null pointers and invalid UTF-8 are
//!   no-ops or error codes, and no panic crosses the boundary (each entry
//!   point catches one and returns its no-op value).
//!
//! ```c
//! pfs_init();                                   /* PFS_SHM_DIR, PFS_SERVICE_NAME */
//! const pfs_wait_class_t *io = pfs_wait_class_register("wait/io/file/app/log");
//! pfs_wait_t w;
//! PFS_WAIT_BEGIN(&w, io, PFS_OP_WRITE, (uint64_t)fd); /* SOURCE: this line */
//! ssize_t n = write(fd, buf, len);
//! pfs_wait_end_bytes(&w, n > 0 ? (uint64_t)n : 0);
//! ```
//!
//! # Modules, in layers
//!
//! | layer | module | job |
//! | --- | --- | --- |
//! | 0 | `codes` | the error codes the API returns and their messages |
//! | 0 | `text` | C strings in (null and invalid UTF-8 refused), strings out into caller buffers |
//! | 0 | `shield` | catches a panic at the boundary and turns it into the call's no-op value |
//! | 1 | `slot` | caller-owned storage: a Rust guard kept in place inside a C struct, usable only by the thread that put it there |
//! | 1 | `classes` | class handles for C: one leaked, lazily registered class per name |
//! | 1 | `site` | call sites for C: `pfs_site_t`, the `SOURCE` of the events begun at one |
//! | 1 | `warning` | where the library's warnings go: standard error, the program's handler (`pfs_set_warning_handler`), or nowhere |
//! | 2 | `init` | `pfs_init`, `pfs_init_with` and `pfs_config_t` (checked field by field), the last error's message, the segment path |
//! | 2 | `wait` | timed waits: `pfs_wait_t`, begin and end, operation codes |
//! | 2 | `stage` | stages: enter, progress, end |
//! | 2 | `statement` | statements: `pfs_statement_t`, text, digest, rows, errors |
//! | 2 | `memory` | memory accounting: `pfs_memory_t` tokens |
//! | 2 | `task` | async tasks: `pfs_task_t`, a logical thread entered around each resume, and its statement |
//! | 2 | `thread` | the calling thread: actor, name, `THREAD_ID`, its open statement's `EVENT_ID` |
//! | 3 | `abi` | the ABI's version (the SONAME's number) and the check that a program's `pfs.h` matches the library |
//!
//! # Unsafe code
//!
//! An FFI crate takes raw pointers from C: every `unsafe` block says, in
//! its `// SAFETY:` comment, which documented caller rule (a non-null
//! pointer is valid, a wait struct is used by one thread, ...) makes it
//! sound. Null pointers are checked before any dereference.

#![deny(missing_docs)]
// The C names of the API (`pfs_wait_t`, ...) are its contract.
#![allow(non_camel_case_types)]

mod abi;
mod classes;
mod codes;
mod init;
mod memory;
mod shield;
mod site;
mod slot;
mod stage;
mod statement;
mod task;
mod text;
mod thread;
mod wait;
mod warning;

pub use abi::*;
pub use classes::{pfs_memory_class_t, pfs_stage_class_t, pfs_statement_class_t, pfs_wait_class_t};
pub use codes::*;
pub use init::*;
pub use memory::*;
pub use site::pfs_site_t;
pub use stage::*;
pub use statement::*;
pub use task::*;
pub use thread::*;
pub use wait::*;
pub use warning::*;
