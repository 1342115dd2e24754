//! Layer 1. Call sites from C: `pfs_site_t`, the `SOURCE` (`file:line`)
//! of the events begun through `pfs_wait_begin_at`,
//! `pfs_statement_begin_at` and `pfs_stage_enter_at`. The header's
//! `PFS_WAIT_BEGIN`, `PFS_STATEMENT_BEGIN` and `PFS_STAGE_ENTER` declare
//! one `static const pfs_site_t` per call site, with `__FILE__` and
//! `__LINE__`: its address identifies the site (as a Rust
//! `#[track_caller]` location's does), and its file and line are read once,
//! at the site's first event.

use std::ffi::c_char;

use pfs_client::Site;

use crate::text::prefix_in;

/// One call site of the program: where an event begins, shown as the
/// event's `SOURCE` (`file:line`, the file's last path component). Declare
/// one per call site with static storage duration and never change it;
/// the header's `PFS_WAIT_BEGIN`, `PFS_STATEMENT_BEGIN` and
/// `PFS_STAGE_ENTER` do so.
#[repr(C)]
#[derive(Debug)]
pub struct pfs_site_t {
    /// The file (`__FILE__`): a NUL-terminated string with static storage
    /// duration, or NULL (then `SOURCE` is `:<line>`).
    pub file: *const c_char,
    /// The line (`__LINE__`).
    pub line: u32,
}

// SAFETY: a site is only ever read (by the contract of the `*_at`
// functions it is a constant with static storage duration whose `file`
// points to a string with static storage duration), so a shared reference
// to it may be used from any thread.
unsafe impl Sync for pfs_site_t {}

impl Site for pfs_site_t {
    fn file(&self) -> &str {
        // SAFETY: `file` is NULL or a NUL-terminated string with static
        // storage duration (the `*_at` functions' contract), never changed.
        unsafe { prefix_in(self.file) }
    }

    fn line(&self) -> u32 {
        self.line
    }
}

/// The site at `p` (none if `p` is NULL).
///
/// # Safety
///
/// `p` is NULL or points to a `pfs_site_t` with static storage duration,
/// never changed, whose `file` is NULL or a NUL-terminated string with
/// static storage duration.
#[inline(always)]
pub(crate) unsafe fn site_in(p: *const pfs_site_t) -> Option<&'static dyn Site> {
    // SAFETY: by this function's contract `p` is NULL or a valid site that
    // lives (unchanged) for the rest of the process.
    unsafe { p.as_ref() }.map(|s| s as &'static dyn Site)
}
