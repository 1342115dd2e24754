//! Layer 8. An instrumented file: `open`, `read`, `write`, `sync`, `seek`
//! and `close` become `wait/io/file/...` waits carrying byte counts and
//! the file name.

use std::fs::OpenOptions;
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::panic::Location;
use std::path::Path;

use pfs_shm_layout::Operation;

use crate::io_wait::{IoObject, none, read_write_waits};
use crate::wait::LazyWaitClass;

/// A `std::fs::File` whose I/O is recorded.
///
/// ```
/// use std::io::Write;
/// use pfs_client::{LazyWaitClass, fs::File};
/// static WAL: LazyWaitClass = LazyWaitClass::new("wait/io/file/kv/wal");
/// let dir = tempfile::tempdir().unwrap();
/// let mut f = File::create(&WAL, dir.path().join("wal.log")).unwrap();
/// f.write_all(b"put k v\n").unwrap();
/// f.sync_data().unwrap();
/// ```
#[derive(Debug)]
pub struct File {
    obj: IoObject,
    inner: Option<std::fs::File>,
}

impl File {
    /// Opens `path` for reading.
    #[track_caller]
    pub fn open(class: &'static LazyWaitClass, path: impl AsRef<Path>) -> io::Result<Self> {
        Self::with_options(class, path, OpenOptions::new().read(true), Operation::Open)
    }

    /// Creates (truncates) `path` for writing.
    #[track_caller]
    pub fn create(class: &'static LazyWaitClass, path: impl AsRef<Path>) -> io::Result<Self> {
        Self::with_options(
            class,
            path,
            OpenOptions::new().write(true).create(true).truncate(true),
            Operation::Create,
        )
    }

    /// Opens `path` with `opts`, recording an `open` wait.
    #[track_caller]
    pub fn open_with(
        class: &'static LazyWaitClass,
        path: impl AsRef<Path>,
        opts: &OpenOptions,
    ) -> io::Result<Self> {
        Self::with_options(class, path, opts, Operation::Open)
    }

    #[track_caller]
    fn with_options(
        class: &'static LazyWaitClass,
        path: impl AsRef<Path>,
        opts: &OpenOptions,
        op: Operation,
    ) -> io::Result<Self> {
        let path = path.as_ref();
        let name = IoObject::intern(class, &path.to_string_lossy());
        let w = IoObject::begin(class, op, 0, name, Location::caller());
        let inner = opts.open(path);
        drop(w);
        let inner = inner?;
        let id = inner.as_raw_fd() as u64;
        Ok(Self {
            obj: IoObject { class, name, id },
            inner: Some(inner),
        })
    }

    fn file(&mut self) -> &mut std::fs::File {
        self.inner.as_mut().expect("file is open until dropped")
    }

    /// Runs `f` on the open file as one `op` wait attributed to `loc`.
    #[inline]
    fn io<R>(
        &mut self,
        op: Operation,
        loc: &'static Location<'static>,
        f: impl FnOnce(&mut std::fs::File) -> io::Result<R>,
    ) -> io::Result<R> {
        let obj = self.obj;
        obj.io(op, loc, self.file(), f, none)
    }

    /// Flushes data and metadata (`sync` wait).
    #[track_caller]
    pub fn sync_all(&mut self) -> io::Result<()> {
        self.io(Operation::Sync, Location::caller(), |f| f.sync_all())
    }

    /// Flushes data (`sync` wait).
    #[track_caller]
    pub fn sync_data(&mut self) -> io::Result<()> {
        self.io(Operation::Sync, Location::caller(), |f| f.sync_data())
    }

    /// File metadata (`stat` wait).
    #[track_caller]
    pub fn metadata(&mut self) -> io::Result<std::fs::Metadata> {
        self.io(Operation::Stat, Location::caller(), |f| f.metadata())
    }

    /// Truncates or extends (`chsize` wait).
    #[track_caller]
    pub fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.io(Operation::Chsize, Location::caller(), |f| f.set_len(len))
    }
}

read_write_waits!(File, file, Operation::Read, Operation::Write);

impl Seek for File {
    #[track_caller]
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.io(Operation::Seek, Location::caller(), |f| f.seek(pos))
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _w = self.obj.wait(Operation::Close, Location::caller());
        drop(self.inner.take());
    }
}
