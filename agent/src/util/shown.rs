//! Text from segments and file names as it is shown to a person: control
//! characters escaped (`\n`, `\u{1b}`), so that a name or a statement text
//! that a process (or whoever can create files in the segment directory)
//! chose cannot forge log lines or drive the terminal of an operator
//! (clear the screen, set the title, write the clipboard). JSON and the
//! Prometheus exposition escape on their own.

use std::borrow::Cow;
use std::path::Path;

/// `s` with every control character escaped (`\n`, `\t`, `\u{1b}`, ...);
/// borrowed when there is none.
///
/// ```
/// use pfs_agent::util::shown::printable;
/// assert_eq!(printable("GET /users"), "GET /users");
/// assert_eq!(printable("a\nb\u{1b}[2J"), "a\\nb\\u{1b}[2J");
/// ```
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A path as [`printable`] text, for logs and messages.
///
/// ```
/// use std::path::Path;
/// use pfs_agent::util::shown::path;
/// assert_eq!(path(Path::new("/dev/shm/pfs/a\nb.pfs")), "/dev/shm/pfs/a\\nb.pfs");
/// ```
pub fn path(p: &Path) -> String {
    printable(&p.to_string_lossy()).into_owned()
}
