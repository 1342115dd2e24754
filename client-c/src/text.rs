//! Layer 0. Strings across the boundary: NUL-terminated C strings in
//! (a null pointer or invalid UTF-8 is refused, or cut to its valid
//! prefix where a truncated text is still useful), and strings out into
//! caller buffers. No allocation.

use std::ffi::{CStr, c_char};

/// The UTF-8 string at `p`, or `None` for a null pointer or invalid UTF-8.
///
/// # Safety
///
/// `p` is null or points to a NUL-terminated string that stays valid and
/// unchanged for `'a`.
pub(crate) unsafe fn str_in<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is non-null and, by this function's contract, a valid
    // NUL-terminated string for 'a.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().ok()
}

/// The longest valid UTF-8 prefix of the string at `p` (`None` for a null
/// pointer, which a setter takes as a no-op): a text with a stray byte is
/// kept up to that byte.
///
/// # Safety
///
/// As [`str_in`].
pub(crate) unsafe fn prefix_in<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is non-null and, by this function's contract, a valid
    // NUL-terminated string for 'a.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    Some(match std::str::from_utf8(bytes) {
        Ok(s) => s,
        // `valid_up_to` is a character boundary, so the prefix is UTF-8.
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
    })
}

/// Copies `s` into the caller's buffer `buf` of `len` bytes as a
/// NUL-terminated string, truncated on a character boundary if it does not
/// fit (nothing is written if `buf` is null or `len` is 0). Returns the
/// length of `s` in bytes (without the NUL), so that a caller can tell
/// that it was truncated (`>= len`), like `snprintf`.
///
/// # Safety
///
/// `buf` is null or valid for writes of `len` bytes.
pub(crate) unsafe fn str_out(s: &str, buf: *mut c_char, len: usize) -> usize {
    if buf.is_null() || len == 0 {
        return s.len();
    }
    let n = pfs_shm_layout::text::truncate_utf8(s, len - 1).len();
    // SAFETY: `buf` is non-null and valid for `len` bytes (contract);
    // `n + 1 <= len`, and `s` is a Rust string, which cannot overlap a
    // buffer the caller lent us for writing.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    s.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_in_and_out() {
        // SAFETY: literals are NUL-terminated and static.
        unsafe {
            assert_eq!(str_in(c"wait/x".as_ptr()), Some("wait/x"));
            assert_eq!(str_in(std::ptr::null()), None);
            assert_eq!(str_in(c"a\xffb".as_ptr()), None);
            assert_eq!(prefix_in(c"ab\xffc".as_ptr()), Some("ab"));
            assert_eq!(prefix_in(std::ptr::null()), None);
        }
        let mut buf = [0x55 as c_char; 4];
        // SAFETY: `buf` is a local array of 4 bytes.
        let n = unsafe { str_out("héllo", buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, 6);
        // "hé" is 3 bytes: it fits with its NUL; "hél" would not.
        // SAFETY: str_out wrote a NUL within the buffer.
        let got = unsafe { CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(got.to_str().unwrap(), "hé");
        // SAFETY: a null buffer is allowed and left alone.
        assert_eq!(unsafe { str_out("abc", std::ptr::null_mut(), 9) }, 3);
    }
}
