//! UTF-8 text in shared memory: storing a string into an array of atomic
//! words with its length, loading it back (checked), and truncating on a
//! character boundary. Every string field of the segment (service name,
//! class and thread names, interned strings, statement text, actor
//! columns) goes through these functions, and names are hashed here
//! ([`fnv1a32`]).
//!
//! Layer 0 (see the crate docs): depends on no other module of the crate.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Stores `bytes` (truncated to the array) into an array of atomics, zero
/// padded, and its length into `len`.
pub(crate) fn store_bytes(dst: &[AtomicU64], len: &AtomicU32, bytes: &[u8]) {
    let n = store_prefix(dst, len, bytes);
    for word in &dst[n.div_ceil(8)..] {
        word.store(0, Ordering::Relaxed);
    }
}

/// Stores `bytes` (truncated to the array) into the first words of an
/// array of atomics and its length into `len`, leaving the words past the
/// text as they were (a field whose bytes past its length are
/// unspecified, such as `SQL_TEXT`): the cost follows the text, not the
/// field. Returns the stored length.
pub(crate) fn store_prefix(dst: &[AtomicU64], len: &AtomicU32, bytes: &[u8]) -> usize {
    let n = bytes.len().min(dst.len() * 8);
    let bytes = &bytes[..n];
    let mut chunks = bytes.chunks_exact(8);
    for (word, chunk) in dst.iter().zip(&mut chunks) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        word.store(u64::from_le_bytes(w), Ordering::Relaxed);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        dst[n / 8].store(u64::from_le_bytes(w), Ordering::Relaxed);
    }
    len.store(n as u32, Ordering::Relaxed);
    n
}

/// Loads a string stored by [`store_bytes`]; `None` if the length is out of
/// range or the bytes are not UTF-8.
pub(crate) fn load_string(src: &[AtomicU64], len: u32) -> Option<String> {
    let len = len as usize;
    if len > src.len() * 8 {
        return None;
    }
    let mut bytes = Vec::with_capacity(src.len() * 8);
    for w in src {
        bytes.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    bytes.truncate(len);
    String::from_utf8(bytes).ok()
}

/// Truncates `s` to at most `max` bytes on a character boundary.
///
/// ```
/// use pfs_shm_layout::text::truncate_utf8;
/// assert_eq!(truncate_utf8("héllo", 2), "h");
/// assert_eq!(truncate_utf8("héllo", 3), "hé");
/// ```
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// 32-bit FNV-1a of `bytes`: a stable hash (the same in every build and
/// version) for names that must stay the same across processes.
///
/// ```
/// assert_eq!(pfs_shm_layout::text::fnv1a32(b""), 0x811c_9dc5);
/// assert_eq!(pfs_shm_layout::text::fnv1a32(b"a"), 0xe40c_292c);
/// ```
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// 64-bit FNV-1a of `bytes`: a statement's `DIGEST` (the hash of the
/// digest text the application supplied, as the segment stores it).
///
/// ```
/// assert_eq!(pfs_shm_layout::text::fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
/// assert_eq!(pfs_shm_layout::text::fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
/// ```
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
