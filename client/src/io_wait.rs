//! Layer 7. I/O waits on one object (a file, a socket): what an
//! instrumented object carries (its wait class, `OBJECT_NAME` and
//! `OBJECT_INSTANCE`), the wait around one operation with its byte count,
//! and the `Read` and `Write` implementations that files and sockets share
//! ([`read_write_waits!`]).

use std::fmt::Display;
use std::io;
use std::panic::Location;

use pfs_shm_layout::Operation;
use pfs_shm_layout::layout::NONE_U32;

use crate::runtime;
use crate::wait::{LazyWaitClass, ObjectName, WaitGuard};

/// The wait side of an instrumented I/O object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IoObject {
    pub(crate) class: &'static LazyWaitClass,
    /// `OBJECT_NAME`: an interned string, or `NONE_U32`.
    pub(crate) name: u32,
    /// `OBJECT_INSTANCE`: the fd.
    pub(crate) id: u64,
}

impl IoObject {
    /// `text` interned as an `OBJECT_NAME` of `class`: only when the client
    /// is initialised and the class enabled (else `NONE_U32`).
    pub(crate) fn intern(class: &'static LazyWaitClass, text: &impl Display) -> u32 {
        if runtime::get().is_some() && class.get().is_enabled() {
            ObjectName::new(&text.to_string()).to_raw()
        } else {
            NONE_U32
        }
    }

    /// Starts an `op` wait of `class` on object `id` named `name`,
    /// attributed to `loc` (for an operation before the object exists:
    /// an open, a connect).
    #[inline]
    pub(crate) fn begin(
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

    /// Starts an `op` wait on this object, attributed to `loc`.
    #[inline]
    pub(crate) fn wait(&self, op: Operation, loc: &'static Location<'static>) -> WaitGuard {
        Self::begin(self.class, op, self.id, self.name, loc)
    }

    /// Runs `f` on `target` (the object's inner file or socket) as one
    /// `op` wait attributed to `loc`; `bytes` gives the wait's
    /// `NUMBER_OF_BYTES` when `f` succeeds (`None` for operations that
    /// move no data).
    #[inline]
    pub(crate) fn io<T, R>(
        &self,
        op: Operation,
        loc: &'static Location<'static>,
        target: &mut T,
        f: impl FnOnce(&mut T) -> io::Result<R>,
        bytes: impl FnOnce(&R) -> Option<u64>,
    ) -> io::Result<R> {
        let mut w = self.wait(op, loc);
        let r = f(target);
        if let Some(n) = r.as_ref().ok().and_then(bytes) {
            w.set_bytes(n);
        }
        r
    }
}

/// `NUMBER_OF_BYTES` of an operation that moves no data: not set.
pub(crate) fn none<R>(_: &R) -> Option<u64> {
    None
}

/// `NUMBER_OF_BYTES` of a read or write that reports its count.
pub(crate) fn count(n: &usize) -> Option<u64> {
    Some(*n as u64)
}

/// `write!` to `inner`, with the number of bytes written.
pub(crate) fn write_fmt_counted<W: io::Write>(
    inner: &mut W,
    args: std::fmt::Arguments<'_>,
) -> io::Result<u64> {
    struct Counting<'a, W> {
        inner: &'a mut W,
        n: u64,
    }
    impl<W: io::Write> io::Write for Counting<'_, W> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = self.inner.write(buf)?;
            self.n += n as u64;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            self.inner.flush()
        }
    }
    let mut c = Counting { inner, n: 0 };
    io::Write::write_fmt(&mut c, args)?;
    Ok(c.n)
}

/// `Read` and `Write` for an instrumented type `$ty` with an `obj:
/// IoObject` field and a method `$inner(&mut self) -> &mut T` giving the
/// open file or socket: each call is one `$read` or `$write` wait with its
/// byte count, attributed to the caller (`read_exact`, `read_to_end`,
/// `read_to_string`, `write_all` and `write!` are one wait each, not one
/// per inner call).
macro_rules! read_write_waits {
    ($ty:ty, $inner:ident, $read:expr, $write:expr) => {
        impl std::io::Read for $ty {
            #[track_caller]
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let obj = self.obj;
                obj.io(
                    $read,
                    std::panic::Location::caller(),
                    self.$inner(),
                    |f| f.read(buf),
                    $crate::io_wait::count,
                )
            }

            /// One wait for the whole buffer, attributed to the caller.
            #[track_caller]
            fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
                let n = buf.len() as u64;
                let obj = self.obj;
                obj.io(
                    $read,
                    std::panic::Location::caller(),
                    self.$inner(),
                    |f| f.read_exact(buf),
                    |_| Some(n),
                )
            }

            /// One wait until the end, attributed to the caller.
            #[track_caller]
            fn read_to_end(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
                let obj = self.obj;
                obj.io(
                    $read,
                    std::panic::Location::caller(),
                    self.$inner(),
                    |f| f.read_to_end(buf),
                    $crate::io_wait::count,
                )
            }

            /// One wait until the end, attributed to the caller.
            #[track_caller]
            fn read_to_string(&mut self, buf: &mut String) -> std::io::Result<usize> {
                let obj = self.obj;
                obj.io(
                    $read,
                    std::panic::Location::caller(),
                    self.$inner(),
                    |f| f.read_to_string(buf),
                    $crate::io_wait::count,
                )
            }

            #[track_caller]
            fn read_vectored(
                &mut self,
                bufs: &mut [std::io::IoSliceMut<'_>],
            ) -> std::io::Result<usize> {
                let obj = self.obj;
                obj.io(
                    $read,
                    std::panic::Location::caller(),
                    self.$inner(),
                    |f| f.read_vectored(bufs),
                    $crate::io_wait::count,
                )
            }
        }

        impl std::io::Write for $ty {
            #[track_caller]
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                let obj = self.obj;
                obj.io(
                    $write,
                    std::panic::Location::caller(),
                    self.$inner(),
                    |f| f.write(buf),
                    $crate::io_wait::count,
                )
            }

            /// One wait for the whole buffer, attributed to the caller.
            #[track_caller]
            fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
                let n = buf.len() as u64;
                let obj = self.obj;
                obj.io(
                    $write,
                    std::panic::Location::caller(),
                    self.$inner(),
                    |f| f.write_all(buf),
                    |_| Some(n),
                )
            }

            #[track_caller]
            fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
                let obj = self.obj;
                obj.io(
                    $write,
                    std::panic::Location::caller(),
                    self.$inner(),
                    |f| f.write_vectored(bufs),
                    $crate::io_wait::count,
                )
            }

            /// One wait for the whole formatted text (`write!`), attributed
            /// to the caller.
            #[track_caller]
            fn write_fmt(&mut self, args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
                let obj = self.obj;
                obj.io(
                    $write,
                    std::panic::Location::caller(),
                    self.$inner(),
                    |f| $crate::io_wait::write_fmt_counted(f, args),
                    |n| Some(*n),
                )
                .map(|_| ())
            }

            fn flush(&mut self) -> std::io::Result<()> {
                self.$inner().flush()
            }
        }
    };
}
pub(crate) use read_write_waits;
