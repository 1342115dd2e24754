//! Layer 0. The error codes the API returns (`PFS_OK`, `PFS_ERR_*`).

/// Success.
pub const PFS_OK: i32 = 0;
/// A required pointer was null, a string was not UTF-8, or a rule string
/// did not parse.
pub const PFS_ERR_INVALID_ARGUMENT: i32 = -1;
/// This process already initialised instrumentation.
pub const PFS_ERR_ALREADY_INITIALIZED: i32 = -2;
/// A `PFS_*` environment variable has a value that cannot be used.
pub const PFS_ERR_BAD_ENV: i32 = -3;
/// The segment directory is world-writable.
pub const PFS_ERR_WORLD_WRITABLE: i32 = -4;
/// A running process holds the segment file.
pub const PFS_ERR_IN_USE: i32 = -5;
/// A filesystem call failed (directory, file, lock).
pub const PFS_ERR_IO: i32 = -6;
/// The segment could not be laid out or reserved.
pub const PFS_ERR_SEGMENT: i32 = -7;
/// An internal error (a bug): instrumentation stays off.
pub const PFS_ERR_INTERNAL: i32 = -8;
/// This process was forked (without `exec`) from one that initialised
/// instrumentation: a forked child records nothing; initialise in each
/// worker after forking instead of in the parent.
pub const PFS_ERR_FORKED: i32 = -9;
