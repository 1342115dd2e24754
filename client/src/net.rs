//! Layer 8. An instrumented TCP socket: `connect`, `accept`, `send`,
//! `recv` and `close` become `wait/io/socket/...` waits carrying byte
//! counts and the peer's address.

use std::io;
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::panic::Location;
use std::time::Duration;

use pfs_shm_layout::Operation;
use pfs_shm_layout::layout::NONE_U32;

use crate::io_wait::{IoObject, read_write_waits};
use crate::wait::LazyWaitClass;

/// A `std::net::TcpStream` whose I/O is recorded: `OBJECT_NAME` is the
/// peer's address (`127.0.0.1:5432` for a stream this process connected;
/// the client's IP alone, `127.0.0.1`, for one a [`TcpListener`]
/// accepted), `OBJECT_INSTANCE` the socket's fd. Dropping it records
/// `close`.
///
/// Each distinct name takes one entry of the segment's string table
/// ([`Config::max_strings`](crate::Config::max_strings), never freed):
/// hence the client's IP without its port, one entry per client host. Once
/// the table is full, further names (and `SOURCE`s first seen after) are
/// not recorded and are counted as lost.
///
/// ```
/// use std::io::{Read, Write};
/// use pfs_client::{LazyWaitClass, net::{TcpListener, TcpStream}};
/// static BACKEND: LazyWaitClass = LazyWaitClass::new("wait/io/socket/kv/backend");
/// let server = TcpListener::bind(&BACKEND, "127.0.0.1:0").unwrap();
/// let mut conn = TcpStream::connect(&BACKEND, server.local_addr().unwrap()).unwrap();
/// let (mut peer, _) = server.accept().unwrap();
/// conn.write_all(b"GET k\n").unwrap();
/// let mut buf = [0u8; 6];
/// peer.read_exact(&mut buf).unwrap();
/// assert_eq!(&buf, b"GET k\n");
/// ```
#[derive(Debug)]
pub struct TcpStream {
    obj: IoObject,
    inner: Option<std::net::TcpStream>,
}

impl TcpStream {
    /// Connects to `addr`, recording a `connect` wait per address tried
    /// (named after it). Name resolution happens before, outside any wait.
    #[track_caller]
    pub fn connect(class: &'static LazyWaitClass, addr: impl ToSocketAddrs) -> io::Result<Self> {
        let loc = Location::caller();
        let mut last = None;
        for addr in addr.to_socket_addrs()? {
            match Self::connect_one(class, &addr, loc, |a| std::net::TcpStream::connect(a)) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "could not resolve to any addresses",
            )
        }))
    }

    /// Connects to `addr` within `timeout` (`connect` wait).
    #[track_caller]
    pub fn connect_timeout(
        class: &'static LazyWaitClass,
        addr: &SocketAddr,
        timeout: Duration,
    ) -> io::Result<Self> {
        Self::connect_one(class, addr, Location::caller(), |a| {
            std::net::TcpStream::connect_timeout(a, timeout)
        })
    }

    /// One `connect` wait: `f` connecting to `addr`.
    fn connect_one(
        class: &'static LazyWaitClass,
        addr: &SocketAddr,
        loc: &'static Location<'static>,
        f: impl FnOnce(&SocketAddr) -> io::Result<std::net::TcpStream>,
    ) -> io::Result<Self> {
        let name = IoObject::intern(class, addr);
        let w = IoObject::begin(class, Operation::Connect, 0, name, loc);
        let inner = f(addr);
        drop(w);
        Ok(Self::with_name(class, inner?, name))
    }

    /// Wraps a connected stream (one from another library, say), recording
    /// no wait: its I/O and close are recorded from now on.
    pub fn from_std(class: &'static LazyWaitClass, stream: std::net::TcpStream) -> Self {
        let name = match stream.peer_addr() {
            Ok(addr) => IoObject::intern(class, &addr),
            Err(_) => NONE_U32,
        };
        Self::with_name(class, stream, name)
    }

    fn with_name(class: &'static LazyWaitClass, inner: std::net::TcpStream, name: u32) -> Self {
        let id = inner.as_raw_fd() as u64;
        Self {
            obj: IoObject { class, name, id },
            inner: Some(inner),
        }
    }

    /// The inner stream. I/O through it is not recorded.
    pub fn get_ref(&self) -> &std::net::TcpStream {
        self.inner.as_ref().expect("stream is open until dropped")
    }

    /// The inner stream, mutably. I/O through it is not recorded.
    pub fn get_mut(&mut self) -> &mut std::net::TcpStream {
        self.inner.as_mut().expect("stream is open until dropped")
    }

    /// Unwraps the stream, still open: no `close` wait is recorded.
    pub fn into_inner(mut self) -> std::net::TcpStream {
        self.inner.take().expect("stream is open until dropped")
    }

    /// The remote address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.get_ref().peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.get_ref().local_addr()
    }

    /// Sets `TCP_NODELAY` (no wait).
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.get_ref().set_nodelay(nodelay)
    }

    /// Sets the read timeout (no wait). A `recv` that times out is still
    /// recorded, without bytes.
    pub fn set_read_timeout(&self, dur: Option<Duration>) -> io::Result<()> {
        self.get_ref().set_read_timeout(dur)
    }

    /// Sets the write timeout (no wait). A `send` that times out is still
    /// recorded, without bytes.
    pub fn set_write_timeout(&self, dur: Option<Duration>) -> io::Result<()> {
        self.get_ref().set_write_timeout(dur)
    }

    /// Shuts down the read, write or both halves (no wait: the socket stays
    /// open until dropped, which records `close`).
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.get_ref().shutdown(how)
    }

    /// A second handle on the same socket (a new fd, same class and name),
    /// say for a reader thread and a writer thread. No wait; each handle
    /// records its own `close`.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self::with_name(
            self.obj.class,
            self.get_ref().try_clone()?,
            self.obj.name,
        ))
    }
}

read_write_waits!(TcpStream, get_mut, Operation::Recv, Operation::Send);

impl Drop for TcpStream {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            let _w = self.obj.wait(Operation::Close, Location::caller());
            drop(inner);
        }
    }
}

/// A `std::net::TcpListener` whose `accept`s are recorded (`OBJECT_NAME`
/// its local address), handing out instrumented [`TcpStream`]s of the same
/// class, each named after its client's IP. Dropping it records `close`.
///
/// ```
/// use std::io::{Read, Write};
/// use pfs_client::{LazyWaitClass, net::{TcpListener, TcpStream}};
/// static CLIENT: LazyWaitClass = LazyWaitClass::new("wait/io/socket/kv/client_connection");
/// let server = TcpListener::bind(&CLIENT, "127.0.0.1:0").unwrap();
/// let addr = server.local_addr().unwrap();
/// let client = std::thread::spawn(move || {
///     let mut c = TcpStream::connect(&CLIENT, addr).unwrap();
///     c.write_all(b"ping").unwrap();
/// });
/// let (mut conn, peer) = server.accept().unwrap(); // an `accept` wait
/// assert_eq!(conn.peer_addr().unwrap(), peer); // OBJECT_NAME: peer.ip()
/// let mut msg = String::new();
/// conn.read_to_string(&mut msg).unwrap(); // one `recv` wait
/// assert_eq!(msg, "ping");
/// client.join().unwrap();
/// ```
#[derive(Debug)]
pub struct TcpListener {
    obj: IoObject,
    inner: Option<std::net::TcpListener>,
}

impl TcpListener {
    /// Binds to `addr` (no wait: binding does not block).
    pub fn bind(class: &'static LazyWaitClass, addr: impl ToSocketAddrs) -> io::Result<Self> {
        Ok(Self::from_std(class, std::net::TcpListener::bind(addr)?))
    }

    /// Wraps a bound listener (no wait).
    pub fn from_std(class: &'static LazyWaitClass, listener: std::net::TcpListener) -> Self {
        let name = match listener.local_addr() {
            Ok(addr) => IoObject::intern(class, &addr),
            Err(_) => NONE_U32,
        };
        let id = listener.as_raw_fd() as u64;
        Self {
            obj: IoObject { class, name, id },
            inner: Some(listener),
        }
    }

    /// Accepts a connection (`accept` wait): the stream, instrumented with
    /// this listener's class and named after the client's IP, and the
    /// client's address.
    #[track_caller]
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let w = self.obj.wait(Operation::Accept, Location::caller());
        let r = self.get_ref().accept();
        drop(w);
        let (stream, peer) = r?;
        // The client's IP without its port: one name per client host, not
        // one per connection (names stay in the segment's string table).
        let name = IoObject::intern(self.obj.class, &peer.ip());
        Ok((TcpStream::with_name(self.obj.class, stream, name), peer))
    }

    /// An endless iterator of [`TcpListener::accept`]ed streams.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.get_ref().local_addr()
    }

    /// The inner listener. Accepts through it are not recorded.
    pub fn get_ref(&self) -> &std::net::TcpListener {
        self.inner.as_ref().expect("listener is open until dropped")
    }

    /// Unwraps the listener, still open: no `close` wait is recorded.
    pub fn into_inner(mut self) -> std::net::TcpListener {
        self.inner.take().expect("listener is open until dropped")
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            let _w = self.obj.wait(Operation::Close, Location::caller());
            drop(inner);
        }
    }
}

/// The iterator of [`TcpListener::incoming`]: each item is one `accept`,
/// attributed to the `for` loop (or `next` call) that asks for it; through
/// an adapter such as `take`, `SOURCE` is the adapter's line in `core`.
///
/// ```no_run
/// use pfs_client::{LazyWaitClass, net::TcpListener};
/// static CLIENT: LazyWaitClass = LazyWaitClass::new("wait/io/socket/app/client");
/// let server = TcpListener::bind(&CLIENT, "0.0.0.0:8080").unwrap();
/// for conn in server.incoming() {
///     let conn = conn.unwrap();
///     std::thread::spawn(move || drop(conn));
/// }
/// ```
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a TcpListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<TcpStream>;

    #[track_caller]
    fn next(&mut self) -> Option<io::Result<TcpStream>> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}
