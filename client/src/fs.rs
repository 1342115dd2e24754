//! Layer 7. An instrumented file: `open`, `read`, `write`, `sync`, `seek`
//! and `close` become `wait/io/file/...` waits carrying byte counts and
//! the file name.

use std::fs::OpenOptions;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::panic::Location;
use std::path::Path;

use pfs_shm_layout::Operation;
use pfs_shm_layout::layout::NONE_U32;

use crate::reentry::reentrant;
use crate::runtime;
use crate::wait::{LazyWaitClass, WaitGuard};

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
    class: &'static LazyWaitClass,
    inner: Option<std::fs::File>,
    name: u32,
    id: u64,
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
        let name = match runtime::get() {
            Some(rt) if class.get().is_enabled() => {
                reentrant(|| rt.writer.intern(&path.to_string_lossy())).unwrap_or(NONE_U32)
            }
            _ => NONE_U32,
        };
        let loc = Location::caller();
        let w = Self::begin(class, op, 0, name, loc);
        let inner = opts.open(path);
        drop(w);
        let inner = inner?;
        let id = inner.as_raw_fd() as u64;
        Ok(Self {
            class,
            inner: Some(inner),
            name,
            id,
        })
    }

    #[inline]
    fn begin(
        class: &'static LazyWaitClass,
        op: Operation,
        id: u64,
        name: u32,
        loc: &'static Location<'static>,
    ) -> WaitGuard {
        let c = class.get();
        if !c.is_enabled() {
            return c.start(op, 0); // disabled: records nothing
        }
        c.start_at(op, id, name, loc)
    }

    fn file(&mut self) -> &mut std::fs::File {
        self.inner.as_mut().expect("file is open until dropped")
    }

    /// Starts an `op` wait on this file, attributed to `loc`.
    #[inline]
    fn wait(&self, op: Operation, loc: &'static Location<'static>) -> WaitGuard {
        Self::begin(self.class, op, self.id, self.name, loc)
    }

    /// Runs `f` on the open file as one `op` wait attributed to `loc`;
    /// `bytes` gives the wait's `NUMBER_OF_BYTES` when `f` succeeds (`None`
    /// for operations that move no data).
    #[inline]
    fn io<R>(
        &mut self,
        op: Operation,
        loc: &'static Location<'static>,
        f: impl FnOnce(&mut std::fs::File) -> io::Result<R>,
        bytes: impl FnOnce(&R) -> Option<u64>,
    ) -> io::Result<R> {
        let mut w = self.wait(op, loc);
        let r = f(self.file());
        if let Some(n) = r.as_ref().ok().and_then(bytes) {
            w.set_bytes(n);
        }
        r
    }

    /// Flushes data and metadata (`sync` wait).
    #[track_caller]
    pub fn sync_all(&mut self) -> io::Result<()> {
        self.io(Operation::Sync, Location::caller(), |f| f.sync_all(), none)
    }

    /// Flushes data (`sync` wait).
    #[track_caller]
    pub fn sync_data(&mut self) -> io::Result<()> {
        self.io(Operation::Sync, Location::caller(), |f| f.sync_data(), none)
    }

    /// File metadata (`stat` wait).
    #[track_caller]
    pub fn metadata(&mut self) -> io::Result<std::fs::Metadata> {
        self.io(Operation::Stat, Location::caller(), |f| f.metadata(), none)
    }

    /// Truncates or extends (`chsize` wait).
    #[track_caller]
    pub fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.io(
            Operation::Chsize,
            Location::caller(),
            |f| f.set_len(len),
            none,
        )
    }
}

/// `NUMBER_OF_BYTES` of an operation that moves no data: not set.
fn none<R>(_: &R) -> Option<u64> {
    None
}

/// `NUMBER_OF_BYTES` of a read or write that reports its count.
fn count(n: &usize) -> Option<u64> {
    Some(*n as u64)
}

impl Read for File {
    #[track_caller]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.io(Operation::Read, Location::caller(), |f| f.read(buf), count)
    }

    /// One `read` wait for the whole buffer, attributed to the caller.
    #[track_caller]
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let n = buf.len() as u64;
        self.io(
            Operation::Read,
            Location::caller(),
            |f| f.read_exact(buf),
            |_| Some(n),
        )
    }

    /// One `read` wait for the whole file, attributed to the caller.
    #[track_caller]
    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        self.io(
            Operation::Read,
            Location::caller(),
            |f| f.read_to_end(buf),
            count,
        )
    }
}

impl Write for File {
    #[track_caller]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.io(
            Operation::Write,
            Location::caller(),
            |f| f.write(buf),
            count,
        )
    }

    /// One `write` wait for the whole buffer, attributed to the caller.
    #[track_caller]
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let n = buf.len() as u64;
        self.io(
            Operation::Write,
            Location::caller(),
            |f| f.write_all(buf),
            |_| Some(n),
        )
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file().flush()
    }
}

impl Seek for File {
    #[track_caller]
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.io(Operation::Seek, Location::caller(), |f| f.seek(pos), none)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _w = self.wait(Operation::Close, Location::caller());
        drop(self.inner.take());
    }
}
