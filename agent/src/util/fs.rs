//! Files in a directory other processes can write to: opened without
//! following links, written atomically, read with a size cap.

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

/// Replaces `path` with `bytes` atomically: a temporary file beside it
/// (`O_EXCL | O_NOFOLLOW`, mode 0600), `fsync`, `rename`, `fsync` of the
/// directory. A link planted at `path` is replaced, never written through.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut f = nofollow(OFlags::empty())
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    drop(f);
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Some(dir) = path.parent()
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Why a capped read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// `open` failed (other than "no such file").
    #[error("cannot open it: {0}")]
    Open(#[source] std::io::Error),
    /// `fstat` failed.
    #[error("cannot stat it: {0}")]
    Stat(#[source] std::io::Error),
    /// A directory, FIFO, socket or device.
    #[error("not a regular file")]
    NotRegular,
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

/// Reads a regular file of at most `max` bytes without following links:
/// `Ok(None)` if it does not exist.
pub fn read_capped(
    path: &Path,
    max: u64,
) -> Result<Option<(Vec<u8>, std::fs::Metadata)>, ReadError> {
    let mut f = match open_nofollow(path, OFlags::empty()) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ReadError::Open(e)),
    };
    let meta = f.metadata().map_err(ReadError::Stat)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
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
        assert!(matches!(read_capped(&link, 100), Err(ReadError::Open(_))));
        assert!(matches!(
            read_capped(dir.path(), 100),
            Err(ReadError::NotRegular)
        ));
        // An atomic write replaces a planted link instead of following it.
        write_atomic(&link, b"new").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"0123456789x");
        assert_eq!(read_capped(&link, 100).unwrap().unwrap().0, b"new");
    }
}
