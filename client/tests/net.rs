//! The instrumented TCP socket against a real segment: a server and a
//! client on 127.0.0.1, each in its own thread, exchange known byte counts;
//! every wait they record is read back from `events_waits_history_long`
//! and the summaries, exactly. One test function: `init` is once per
//! process.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::mpsc;

use common::read;
use pfs_client::LazyWaitClass;
use pfs_client::net::{TcpListener, TcpStream};
use pfs_shm_layout::reader::{Event, SegmentSnapshot, Summary};
use pfs_shm_layout::{EventKind, Operation};

static NET: LazyWaitClass = LazyWaitClass::new("wait/io/socket/nettest/conn");
static OFF: LazyWaitClass = LazyWaitClass::new("wait/io/socket/nettest/off");

/// The client's first message, read by the server with `read_exact`.
const HELLO: usize = 100;
/// The server's answer, read by the client with `read_exact`.
const ANSWER: usize = 250;
/// What the client then streams with plain `write`s, read by the server
/// with plain `read`s until end of stream.
const STREAM: usize = 64 * 1024;

/// One recorded wait, as the test compares it: operation, `OBJECT_NAME`
/// text, `OBJECT_INSTANCE`, `NUMBER_OF_BYTES`.
type Wait = (Operation, Option<String>, u64, Option<u64>);

/// What a side of the connection saw, to build its expected waits from.
struct Side {
    thread_id: u64,
    /// This side's stream fd (`OBJECT_INSTANCE`), its own address and its
    /// peer's.
    fd: u64,
    local: SocketAddr,
    peer: SocketAddr,
    /// The byte count of each plain `read` or `write`, in call order.
    plain: Vec<usize>,
    /// Server side: the listener's fd and address.
    listener: Option<(u64, SocketAddr)>,
    /// The line of its `connect` (client) or `accept` (server) call.
    line: u32,
}

fn class_index(s: &SegmentSnapshot, name: &str) -> Option<u32> {
    s.classes.iter().find(|c| c.name == name).map(|c| c.index)
}

/// The class's summary: exited threads' totals and live threads' rows.
fn global(s: &SegmentSnapshot, class: u32) -> Summary {
    let mut sum = Summary::default();
    for (c, r) in s
        .exited
        .iter()
        .chain(s.live_rows.iter())
        .chain(s.threads.iter().flat_map(|t| t.rows.iter()))
    {
        if *c == class {
            sum.merge(r);
        }
    }
    sum
}

fn wait(s: &SegmentSnapshot, e: &Event) -> Wait {
    (
        e.operation.unwrap(),
        e.object_name.map(|n| s.strings[&n].clone()),
        e.object_instance,
        e.bytes,
    )
}

/// The server: accepts one connection, reads HELLO, answers ANSWER, then
/// reads with plain `read`s until the client shuts its half down.
fn serve(listener: TcpListener) -> Side {
    let thread_id = pfs_client::thread_id().unwrap();
    let listener_addr = listener.local_addr().unwrap();
    let listener_fd = listener.get_ref().as_raw_fd() as u64;
    let line = line!() + 1;
    let (mut conn, peer) = listener.accept().unwrap();
    assert_eq!(conn.peer_addr().unwrap(), peer);
    let local = conn.local_addr().unwrap();
    let fd = conn.get_ref().as_raw_fd() as u64;
    let mut hello = [0u8; HELLO];
    conn.read_exact(&mut hello).unwrap();
    assert!(hello.iter().all(|&b| b == 1));
    conn.write_all(&[2u8; ANSWER]).unwrap();
    let mut plain = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = conn.read(&mut buf).unwrap();
        plain.push(n);
        if n == 0 {
            break;
        }
        assert!(buf[..n].iter().all(|&b| b == 3));
    }
    assert_eq!(plain.iter().sum::<usize>(), STREAM);
    drop(conn);
    drop(listener);
    Side {
        thread_id,
        fd,
        local,
        peer,
        plain,
        listener: Some((listener_fd, listener_addr)),
        line,
    }
}

/// The client: connects, sends HELLO, reads ANSWER, streams STREAM bytes
/// with plain `write`s, shuts its write half down.
fn client(addr: SocketAddr) -> Side {
    let thread_id = pfs_client::thread_id().unwrap();
    let line = line!() + 1;
    let mut conn = TcpStream::connect(&NET, addr).unwrap();
    conn.set_nodelay(true).unwrap();
    // (Asked now: once both sides have closed, the socket has no peer.)
    let local = conn.local_addr().unwrap();
    let peer = conn.peer_addr().unwrap();
    let fd = conn.get_ref().as_raw_fd() as u64;
    conn.write_all(&[1u8; HELLO]).unwrap();
    let mut answer = [0u8; ANSWER];
    conn.read_exact(&mut answer).unwrap();
    assert!(answer.iter().all(|&b| b == 2));
    let data = vec![3u8; STREAM];
    let mut plain = Vec::new();
    let mut sent = 0;
    while sent < STREAM {
        // Chunks of at most 10 000 bytes: several sends, whatever the
        // socket buffers.
        let n = conn.write(&data[sent..STREAM.min(sent + 10_000)]).unwrap();
        plain.push(n);
        sent += n;
    }
    conn.shutdown(Shutdown::Write).unwrap();
    drop(conn);
    Side {
        thread_id,
        fd,
        local,
        peer,
        plain,
        listener: None,
        line,
    }
}

#[test]
fn socket_waits_are_recorded_exactly() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(
        pfs_client::Config::new("net-test")
            .shm_dir(dir.path())
            .instrument(OFF.name(), 0)
            .consumer("events_waits_history_long", true),
    )
    .unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();

    // The instrumented connection.
    let listener = TcpListener::bind(&NET, "127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || serve(listener));
    let client = std::thread::spawn(move || client(addr));
    let client = client.join().unwrap();
    let server = server.join().unwrap();

    // A connection of a disabled class (an echo): nothing recorded.
    let off_listener = TcpListener::bind(&OFF, "127.0.0.1:0").unwrap();
    let off_addr = off_listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let off_server = std::thread::spawn(move || {
        let mut conn = off_listener.incoming().next().unwrap().unwrap();
        tx.send(conn.peer_addr().unwrap()).unwrap();
        let mut buf = Vec::new();
        conn.read_to_end(&mut buf).unwrap();
        conn.write_all(&buf).unwrap();
        buf.len()
    });
    let mut off = TcpStream::connect(&OFF, off_addr).unwrap();
    off.write_all(&[4u8; HELLO]).unwrap();
    off.shutdown(Shutdown::Write).unwrap();
    let mut echo = Vec::new();
    off.read_to_end(&mut echo).unwrap();
    assert_eq!(echo.len(), HELLO);
    drop(off);
    assert_eq!(off_server.join().unwrap(), HELLO);
    let off_peer = rx.recv().unwrap();

    let s = read(&path);
    assert_eq!(s.lost[5], 0, "events_waits_history_long lost events");
    let net = class_index(&s, NET.name()).expect("NET registered");

    // Each side's waits, in order, exactly.
    // OBJECT_NAME: the peer's address, as text; a listener's is its own.
    let server_name = Some(addr.to_string());
    // An accepted stream is named after the client's IP only.
    let client_name = Some(client.local.ip().to_string());
    assert_eq!(client.peer, addr);
    assert_eq!(
        server.peer, client.local,
        "accept's address is the client's"
    );
    assert_eq!(server.local, addr);
    assert_eq!(client_name.as_deref(), Some("127.0.0.1"));
    let (listener_fd, listener_addr) = server.listener.unwrap();
    assert_eq!(listener_addr, addr);
    let mut expect_client: Vec<Wait> = vec![
        (Operation::Connect, server_name.clone(), 0, None),
        (
            Operation::Send,
            server_name.clone(),
            client.fd,
            Some(HELLO as u64),
        ),
        (
            Operation::Recv,
            server_name.clone(),
            client.fd,
            Some(ANSWER as u64),
        ),
    ];
    for &n in &client.plain {
        expect_client.push((
            Operation::Send,
            server_name.clone(),
            client.fd,
            Some(n as u64),
        ));
    }
    expect_client.push((Operation::Close, server_name.clone(), client.fd, None));
    let mut expect_server: Vec<Wait> = vec![
        (Operation::Accept, server_name.clone(), listener_fd, None),
        (
            Operation::Recv,
            client_name.clone(),
            server.fd,
            Some(HELLO as u64),
        ),
        (
            Operation::Send,
            client_name.clone(),
            server.fd,
            Some(ANSWER as u64),
        ),
    ];
    for &n in &server.plain {
        expect_server.push((
            Operation::Recv,
            client_name.clone(),
            server.fd,
            Some(n as u64),
        ));
    }
    expect_server.push((Operation::Close, client_name.clone(), server.fd, None));
    expect_server.push((Operation::Close, server_name.clone(), listener_fd, None));

    let of = |thread_id: u64| -> Vec<Wait> {
        s.long[EventKind::Wait.index()]
            .iter()
            .filter(|e| e.thread_id == thread_id && e.class == net)
            .map(|e| wait(&s, e))
            .collect()
    };
    assert!(client.plain.len() > 1, "several plain sends");
    assert_eq!(of(client.thread_id), expect_client, "the client's waits");
    assert_eq!(of(server.thread_id), expect_server, "the server's waits");
    // No other thread recorded a NET wait (the main thread bound the
    // listener, which records none).
    let all: Vec<&Event> = s.long[EventKind::Wait.index()]
        .iter()
        .filter(|e| e.class == net)
        .collect();
    assert_eq!(all.len(), expect_client.len() + expect_server.len());

    // Per operation, over both threads.
    let ops = |op: Operation| all.iter().filter(|e| e.operation == Some(op)).count();
    assert_eq!(ops(Operation::Connect), 1);
    assert_eq!(ops(Operation::Accept), 1);
    assert_eq!(ops(Operation::Send), 2 + client.plain.len());
    assert_eq!(ops(Operation::Recv), 2 + server.plain.len());
    assert_eq!(ops(Operation::Close), 3, "two streams and the listener");

    // The summary: every wait counted, every byte sent and received.
    let g = global(&s, net);
    assert_eq!(g.count, all.len() as u64);
    assert_eq!(g.bytes, 2 * (HELLO + ANSWER + STREAM) as u64);
    // Both threads exited: their totals come from the fold. (The OFF
    // server thread recorded nothing, so it never registered.)
    assert_eq!(s.threads_exited, 2, "client and server folded");

    // SOURCE is the caller's line.
    let source = |op: Operation| {
        let e = all.iter().find(|e| e.operation == Some(op)).unwrap();
        s.strings[&e.source.unwrap()].clone()
    };
    assert_eq!(
        source(Operation::Connect),
        format!("net.rs:{}", client.line)
    );
    assert_eq!(source(Operation::Accept), format!("net.rs:{}", server.line));

    // The disabled class recorded nothing and interned no name.
    let off = class_index(&s, OFF.name()).expect("OFF registered");
    assert!(!s.classes.iter().find(|c| c.index == off).unwrap().enabled());
    assert!(
        s.long[EventKind::Wait.index()]
            .iter()
            .all(|e| e.class != off)
    );
    assert_eq!(global(&s, off).count, 0);
    assert_eq!(global(&s, off).bytes, 0);
    // (Its client's IP alone is the enabled class's name too.)
    for name in [off_addr.to_string(), off_peer.to_string()] {
        assert!(
            !s.strings.values().any(|v| *v == name),
            "{name} interned for a disabled class"
        );
    }
}
