//! UTF-8 text in shared memory: storing a string into an array of atomic
//! words with its length, loading it back (checked), and truncating on a
//! character boundary. Every string field of the segment (service name,
//! class and thread names, interned strings, statement text, actor
//! columns) goes through these functions, and names are hashed here
//! ([`fnv1a32`]).
//!
//! Layer 0 (see the crate docs): depends on no other module of the crate.

use std::sync::Arc;
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
    string_of_words(src.iter().map(|w| w.load(Ordering::Relaxed)), len)
}

/// The string of `len` bytes held by `words` (as [`store_bytes`] stores
/// it, already loaded: a reader can copy the words under a sequence lock
/// and make the string only if it needs one); `None` if the length is out
/// of range or the bytes are not UTF-8.
pub(crate) fn string_of_words(
    words: impl ExactSizeIterator<Item = u64>,
    len: u32,
) -> Option<String> {
    let len = len as usize;
    if len > words.len() * 8 {
        return None;
    }
    let mut bytes = Vec::with_capacity(words.len() * 8);
    for w in words {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    bytes.truncate(len);
    String::from_utf8(bytes).ok()
}

/// [`string_of_words`] made straight into an `Arc<str>`: one allocation
/// for a string of up to 64 bytes (a thread name), where a `String` and
/// its copy would be two.
pub(crate) fn shared_str_of_words(words: &[u64], len: u32) -> Option<Arc<str>> {
    let mut bytes = [0u8; 64];
    if words.len() * 8 > bytes.len() {
        return string_of_words(words.iter().copied(), len).map(Arc::from);
    }
    for (b, w) in bytes.chunks_exact_mut(8).zip(words) {
        b.copy_from_slice(&w.to_le_bytes());
    }
    let text = bytes
        .get(..len as usize)
        .filter(|_| len as usize <= words.len() * 8)?;
    std::str::from_utf8(text).ok().map(Arc::from)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(text: &[u8], words: usize) -> (Vec<AtomicU64>, AtomicU32) {
        let dst: Vec<AtomicU64> = (0..words).map(|_| AtomicU64::new(u64::MAX)).collect();
        let len = AtomicU32::new(0);
        store_bytes(&dst, &len, text);
        (dst, len)
    }

    fn words(dst: &[AtomicU64]) -> Vec<u64> {
        dst.iter().map(|w| w.load(Ordering::Relaxed)).collect()
    }

    #[test]
    fn a_name_read_shared_is_the_name_loaded() {
        for (text, n) in [
            (&b""[..], 4),
            (b"worker-7", 4),
            ("h\u{e9}llo-\u{2603}".as_bytes(), 4),
            (b"a-thread-name-of-thirty-two-byte", 4),
            (
                b"longer than sixty-four bytes, held in more than eight words.....!",
                12,
            ),
        ] {
            let (dst, len) = stored(text, n);
            let len = len.load(Ordering::Relaxed);
            let loaded = load_string(&dst, len).expect("stored text loads");
            let shared = shared_str_of_words(&words(&dst), len).expect("and reads shared");
            assert_eq!(*shared, *loaded);
            assert_eq!(shared.as_bytes(), &text[..text.len().min(n * 8)]);
        }
    }

    #[test]
    fn a_bad_length_or_bytes_read_shared_is_none() {
        let (dst, _) = stored(b"worker", 4);
        assert_eq!(
            shared_str_of_words(&words(&dst), 33),
            None,
            "past the words"
        );
        assert_eq!(load_string(&dst, 33), None);
        let (dst, len) = stored(&[b'a', 0xff, b'b'], 4);
        let len = len.load(Ordering::Relaxed);
        assert_eq!(shared_str_of_words(&words(&dst), len), None, "not UTF-8");
        assert_eq!(load_string(&dst, len), None);
    }
}
