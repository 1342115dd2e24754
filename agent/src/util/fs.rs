//! Files in a directory other processes can write to: opened without
//! following links or blocking (a FIFO planted there cannot hang the
//! agent), written atomically, read with a size cap, set aside without
//! replacing anything.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;

/// Options that never follow a symbolic link (`O_NOFOLLOW`: a link is
/// refused with `ELOOP`) plus the `extra` flags, and that create files
/// private to the agent (mode 0600). Every file the agent opens in a
/// directory others can write to is opened through these.
pub fn nofollow(extra: OFlags) -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600)
        .custom_flags((OFlags::NOFOLLOW | extra).bits() as i32);
    o
}

/// Opens `path` for reading with `O_NOFOLLOW` and the `extra` flags.
pub fn open_nofollow(path: &Path, extra: OFlags) -> std::io::Result<File> {
    nofollow(extra).read(true).open(path)
}

/// Opens `path` for reading and writing with `O_NOFOLLOW`.
pub fn open_rw_nofollow(path: &Path) -> std::io::Result<File> {
    nofollow(OFlags::empty()).read(true).write(true).open(path)
}

/// Opens `path` for reading without following a link and without
/// blocking (`O_NOFOLLOW | O_NONBLOCK | O_NOCTTY`: a FIFO opens at once
/// instead of waiting for a writer), and checks on the open descriptor that
/// it is a regular file. `Ok(None)` if it does not exist.
pub fn open_regular(path: &Path) -> Result<Option<(File, std::fs::Metadata)>, ReadError> {
    let f = match open_nofollow(path, OFlags::NONBLOCK | OFlags::NOCTTY) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ReadError::NotRegular("a symbolic link"));
        }
        // A socket cannot be opened (`ENXIO`): say what it is. A file
        // that cannot even be looked up for lack of permission is not the
        // problem: its directory is (not searchable by the agent).
        Err(e) => {
            return match std::fs::symlink_metadata(path) {
                Ok(m) if !m.is_file() => Err(ReadError::NotRegular(file_kind(&m))),
                Err(l) if l.kind() == std::io::ErrorKind::PermissionDenied => {
                    Err(ReadError::DirDenied(l))
                }
                _ => Err(ReadError::Open(e)),
            };
        }
    };
    let meta = f.metadata().map_err(ReadError::Stat)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular(file_kind(&meta)));
    }
    Ok(Some((f, meta)))
}

/// What kind of file `m` describes, for messages.
pub fn file_kind(m: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// `e` with what was being done to which path and, when there is one, what
/// the user can do about it.
fn explain(e: std::io::Error, what: &str, path: &Path) -> std::io::Error {
    use std::io::ErrorKind as K;
    let hint = match e.kind() {
        K::StorageFull | K::QuotaExceeded => "; free space on its filesystem",
        K::PermissionDenied | K::ReadOnlyFilesystem => "; check the directory's permissions",
        _ => "",
    };
    std::io::Error::new(
        e.kind(),
        format!("cannot {what} {}: {e}{hint}", path.display()),
    )
}

/// Replaces `path` with `bytes` atomically: a temporary file beside it
/// (`PATH.tmp`, `O_EXCL | O_NOFOLLOW`, mode 0600), `fsync`, `rename`,
/// `fsync` of the directory. A link planted at `path` is replaced, never
/// written through. A stale temporary file is removed first; a directory
/// in its place is not (it is not the agent's to delete): the error names
/// it and says to remove it. Errors name the path they concern.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    if let Err(e) = std::fs::remove_file(&tmp)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(match std::fs::symlink_metadata(&tmp) {
            Ok(m) if m.is_dir() => std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} is a directory in the way of the agent's temporary file: remove it",
                    tmp.display()
                ),
            ),
            _ => std::io::Error::new(
                e.kind(),
                format!(
                    "cannot remove the stale temporary file {}: {e}; remove it",
                    tmp.display()
                ),
            ),
        });
    }
    let mut f = nofollow(OFlags::empty())
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| explain(e, "create", &tmp))?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(explain(e, "write", &tmp));
    }
    drop(f);
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        let what = format!("rename {} to", tmp.display());
        return Err(explain(e, &what, path));
    }
    if let Some(dir) = path.parent()
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// What to do when the agent cannot list or search a directory the
/// instrumented applications made (theirs, mode 0700): said wherever that
/// shows (`/healthz`, logs, `query`), in the same words.
pub const DIR_ACCESS_HINT: &str = "run the agent as the instrumented applications' user, or set PFS_GROUP_ACCESS=1 on the applications (segment directory 0770, segments 0660) and run the agent in their group";

/// Why a capped read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Its directory cannot be searched (no permission): whether the file
    /// exists cannot be told, and the file itself is not the problem.
    #[error("its directory cannot be searched: {0}")]
    DirDenied(#[source] std::io::Error),
    /// `open` failed (other than "no such file").
    #[error("cannot open it: {0}")]
    Open(#[source] std::io::Error),
    /// `fstat` failed.
    #[error("cannot stat it: {0}")]
    Stat(#[source] std::io::Error),
    /// A directory, FIFO, socket, device or symbolic link (which kind).
    #[error("it is {0}, not a regular file; remove it")]
    NotRegular(&'static str),
    /// Larger than the cap.
    #[error("{len} bytes, larger than {max}")]
    TooLarge {
        /// The file's size.
        len: u64,
        /// The cap.
        max: u64,
    },
    /// `read` failed.
    #[error("cannot read it: {0}")]
    Read(#[source] std::io::Error),
}

/// Reads a regular file of at most `max` bytes without following links or
/// blocking (see [`open_regular`]): `Ok(None)` if it does not exist.
pub fn read_capped(
    path: &Path,
    max: u64,
) -> Result<Option<(Vec<u8>, std::fs::Metadata)>, ReadError> {
    let Some((mut f, meta)) = open_regular(path)? else {
        return Ok(None);
    };
    if meta.len() > max {
        return Err(ReadError::TooLarge {
            len: meta.len(),
            max,
        });
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    (&mut f)
        .take(max + 1)
        .read_to_end(&mut buf)
        .map_err(ReadError::Read)?;
    Ok(Some((buf, meta)))
}

/// Moves `path` out of the way to `aside`, never replacing anything there:
/// if `aside` is taken, to `aside.1` ... `aside.9`. Returns where it went.
pub fn set_aside(path: &Path, aside: &Path) -> std::io::Result<PathBuf> {
    let mut last = None;
    for n in 0..10 {
        let to = if n == 0 {
            aside.to_path_buf()
        } else {
            let mut p = aside.as_os_str().to_owned();
            p.push(format!(".{n}"));
            PathBuf::from(p)
        };
        match rename_noreplace(path, &to) {
            Ok(()) => return Ok(to),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("ten attempts"))
}

/// `rename` that fails with `AlreadyExists` instead of replacing `to`.
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    match renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        // A filesystem without RENAME_NOREPLACE: check, then rename.
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {
            if std::fs::symlink_metadata(to).is_ok() {
                return Err(std::io::ErrorKind::AlreadyExists.into());
            }
            std::fs::rename(from, to)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_reads_refuse_links_and_large_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        assert!(read_capped(&f, 10).unwrap().is_none(), "missing: None");
        std::fs::write(&f, b"0123456789x").unwrap();
        assert!(matches!(
            read_capped(&f, 10),
            Err(ReadError::TooLarge { len: 11, max: 10 })
        ));
        assert_eq!(read_capped(&f, 11).unwrap().unwrap().0, b"0123456789x");
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(matches!(
            read_capped(&link, 100),
            Err(ReadError::NotRegular("a symbolic link"))
        ));
        assert!(matches!(
            read_capped(dir.path(), 100),
            Err(ReadError::NotRegular("a directory"))
        ));
        // An atomic write replaces a planted link instead of following it.
        write_atomic(&link, b"new").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"0123456789x");
        assert_eq!(read_capped(&link, 100).unwrap().unwrap().0, b"new");
    }

    fn mkfifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    }

    /// A FIFO is refused at once (no writer needed), saying what it is.
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("state.json");
        mkfifo(&fifo);
        let (tx, rx) = std::sync::mpsc::channel();
        let p = fifo.clone();
        std::thread::spawn(move || tx.send(read_capped(&p, 100).map(|_| ())).unwrap());
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("read_capped blocked on a FIFO");
        let e = got.unwrap_err();
        assert!(matches!(e, ReadError::NotRegular("a FIFO")), "{e}");
        assert!(e.to_string().contains("remove it"), "{e}");
        assert!(matches!(
            open_regular(&fifo),
            Err(ReadError::NotRegular("a FIFO"))
        ));
    }

    /// A directory where the temporary file goes is named, not removed,
    /// and the write fails without touching the destination.
    #[test]
    fn a_directory_in_place_of_the_temporary_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.json");
        std::fs::write(&f, b"old").unwrap();
        let tmp = dir.path().join("state.json.tmp");
        std::fs::create_dir_all(tmp.join("x")).unwrap();
        let e = write_atomic(&f, b"new").unwrap_err().to_string();
        assert!(e.contains(&tmp.display().to_string()), "{e}");
        assert!(e.contains("directory") && e.contains("remove it"), "{e}");
        assert!(tmp.join("x").is_dir(), "never removed");
        assert_eq!(std::fs::read(&f).unwrap(), b"old");
        // A stale FIFO there is the agent's own name: replaced.
        std::fs::remove_dir_all(&tmp).unwrap();
        mkfifo(&tmp);
        write_atomic(&f, b"new").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
    }

    #[test]
    fn setting_aside_never_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let (a, aside) = (dir.path().join("a"), dir.path().join("a.corrupt"));
        std::fs::write(&aside, b"first").unwrap();
        std::fs::write(&a, b"second").unwrap();
        let to = set_aside(&a, &aside).unwrap();
        assert_eq!(to, dir.path().join("a.corrupt.1"));
        assert_eq!(std::fs::read(&aside).unwrap(), b"first");
        assert_eq!(std::fs::read(&to).unwrap(), b"second");
        assert!(!a.exists());
    }
}
