//! Layer 1. Call sites from C: `pfs_site_t`, the `SOURCE` (`file:line`)
//! of the events begun through `pfs_wait_begin_at`,
//! `pfs_statement_begin_at` and `pfs_stage_enter_at`. The header's
//! `PFS_WAIT_BEGIN`, `PFS_STATEMENT_BEGIN` and `PFS_STAGE_ENTER` declare
//! one `static const pfs_site_t` per call site, with `__FILE__` and
//! `__LINE__`: its address identifies the site (as a Rust
//! `#[track_caller]` location's does), and its file and line are read once,
//! at the site's first event.

use std::ffi::{CStr, c_char};

use pfs_client::Site;

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

// SAFETY: the struct is plain data (a pointer value and a number); a
// shared reference to it lets a thread read those values only. Reading
// the string `file` points to is what needs the `*_at` functions'
// contract, and only [`CSite`] (made by the unsafe [`site_in`]) does it.
unsafe impl Sync for pfs_site_t {}

/// A `pfs_site_t` given to a `*_at` function, under that function's
/// contract (static storage, `file` NULL or a static string, never
/// changed): the one type that reads the string, so safe code holding a
/// `pfs_site_t` cannot make it read a bad pointer.
#[repr(transparent)]
struct CSite(pfs_site_t);

impl Site for CSite {
    /// The file's last path component (all `SOURCE` shows), up to its
    /// first byte that is not UTF-8: a stray byte elsewhere in the path
    /// costs nothing.
    fn file(&self) -> &str {
        if self.0.file.is_null() {
            return "";
        }
        // SAFETY: a `CSite` is made only by `site_in`, whose contract
        // makes `file` a NUL-terminated string with static storage
        // duration, never changed.
        let path = unsafe { CStr::from_ptr(self.0.file) }.to_bytes();
        let name = match path.iter().rposition(|&b| b == b'/' || b == b'\\') {
            Some(i) => &path[i + 1..],
            None => path,
        };
        match std::str::from_utf8(name) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(&name[..e.valid_up_to()]).unwrap_or_default(),
        }
    }

    fn line(&self) -> u32 {
        self.0.line
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
    // lives (unchanged) for the rest of the process; `CSite` is a
    // transparent wrapper of `pfs_site_t`, so the cast keeps layout and
    // alignment.
    unsafe { p.cast::<CSite>().as_ref() }.map(|s| s as &'static dyn Site)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_names_its_file_s_last_component() {
        let site = |file: &'static CStr| {
            CSite(pfs_site_t {
                file: file.as_ptr(),
                line: 7,
            })
        };
        assert_eq!(site(c"src/db/pool.c").file(), "pool.c");
        assert_eq!(site(c"C:\\app\\win.c").file(), "win.c");
        assert_eq!(site(c"plain.c").file(), "plain.c");
        // A stray byte in a directory name costs nothing; in the name,
        // the name is kept up to it.
        assert_eq!(site(c"d\xff/ok.c").file(), "ok.c");
        assert_eq!(site(c"dir/n\xffame.c").file(), "n");
        let none = CSite(pfs_site_t {
            file: std::ptr::null(),
            line: 3,
        });
        assert_eq!((none.file(), none.line()), ("", 3));
    }
}
