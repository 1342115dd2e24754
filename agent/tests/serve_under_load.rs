//! The real `pfs-agent serve` under clients that misbehave, on loopback:
//!
//! * table clients that never read their (large) response hold no thread
//!   that `/metrics`, OTLP or discovery need: `/metrics` keeps answering
//!   within seconds and a process's exit is still noticed within seconds;
//!   their streams are given up after the stall limit (the connection cut
//!   short, never ending like a whole table), which frees the table slots
//!   long before the connection timeout;
//! * `/healthz` is answered even when every `--max-connections` slot is
//!   taken (other requests still wait for a slot);
//! * a connection closed to make room sends the rest of its last answer
//!   first (a slow reader's large scrape is not cut short);
//! * the default `--listen` (`[::]`) answers on IPv4 and IPv6 loopback;
//! * with `--control-token-file` naming a file that does not exist (an
//!   optional Kubernetes Secret not created), the agent starts with
//!   control disabled; a missing `--read-token-file` still stops it (reads
//!   must not open up by accident);
//! * `/healthz` answers 503, saying why, once the background discovery has
//!   not completed a pass for too long (the library's server on a real
//!   socket, whose snapshotter nobody refreshes: a stuck discovery).
//!
//! Segments are written with `pfs-shm-layout` as the client writes them;
//! a segment is live while this test process holds its file's lock.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{BIN, Serve, free_port, get};
use pfs_agent::testing::{mutex_class, record_waits, segment_at, tiny_config};
use pfs_shm_layout::SegmentConfig;

/// A table of 256 threads × 200 instruments: about 10 MB of JSON, more
/// than a connection's socket buffers (up to 4 MB on Linux) and the
/// stream's queue hold.
const BIG_TABLE: &str = "events_waits_summary_by_thread_by_event_name";

/// The value of the `/metrics` sample `pfs_agent_segments{state}`.
fn segments(agent: &Serve, state: &str) -> Result<f64, String> {
    agent.metric("pfs_agent_segments", &[&format!("state=\"{state}\"")])
}

/// A live segment of 256 threads that each recorded one wait of each of
/// 200 instruments (its lock held by the returned file).
fn big_segment(dir: &Path) -> (File, pfs_shm_layout::SegmentWriter) {
    let cfg = SegmentConfig {
        service_name: "big".into(),
        history_len: 2,
        max_classes: 256,
        max_strings: 512,
        records_per_page: 16,
        max_pages: 16,
        history_long_len: 1,
        task_slots: 4,
    };
    let (file, w) = segment_at(&dir.join("big.100.pfs"), &cfg, 100, true);
    let classes: Vec<u32> = (0..200)
        .map(|i| mutex_class(&w, &format!("c{i}")))
        .collect();
    for t in 0..256u64 {
        let slot = w.alloc_thread(t + 1, 1000 + t, "worker").unwrap();
        for &c in &classes {
            record_waits(&w, slot.index, c, 1);
        }
    }
    (file, w)
}

/// Two live segments (services `many0`, `many1`) whose one thread each
/// recorded a wait of each of 1 000 instruments with long names: a
/// `/metrics` answer of about 10 MB, more than loopback's socket buffers
/// take in (up to 4 MB sent ahead of a reader that does not read), so
/// hyper holds the rest.
fn many_instruments(dir: &Path) -> Vec<(File, pfs_shm_layout::SegmentWriter)> {
    (0..2u32)
        .map(|n| {
            let cfg = SegmentConfig {
                service_name: format!("many{n}"),
                history_len: 2,
                max_classes: 1024,
                max_strings: 16,
                records_per_page: 1,
                max_pages: 1,
                history_long_len: 1,
                task_slots: 4,
            };
            let path = dir.join(format!("many{n}.{}.pfs", 100 + n));
            let (file, w) = segment_at(&path, &cfg, 100 + n, true);
            let slot = w.alloc_thread(1, 1000, "worker").unwrap();
            for i in 0..1000 {
                let name =
                    format!("instrument_number_{i:04}_named_at_length_to_make_a_large_answer");
                let c = mutex_class(&w, &name);
                record_waits(&w, slot.index, c, 1);
            }
            (file, w)
        })
        .collect()
}

/// A connection with a tiny receive buffer that asks for `path` and never
/// reads the answer.
fn stalled_client(addr: SocketAddr, path: &str) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let s = rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.connect(addr).await.unwrap().into_std().unwrap()
    });
    s.set_nonblocking(false).unwrap();
    let mut w = &s;
    write!(w, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    s
}

#[test]
fn table_clients_that_never_read_starve_neither_metrics_nor_discovery() {
    let dir = tempfile::tempdir().unwrap();
    let _big = big_segment(dir.path());
    let victim = segment_at(
        &dir.path().join("victim.200.pfs"),
        &tiny_config("victim"),
        200,
        true,
    );
    let mut agent = Serve::start(dir.path(), &["--connection-timeout", "120s"]);
    agent.wait_healthy(Duration::from_secs(20));
    let (status, table) = agent.get(&format!("/api/v1/tables/{BIG_TABLE}")).unwrap();
    assert_eq!(status, 200);
    assert!(
        table.len() > 8 << 20,
        "the table is too small ({} bytes) to stall its stream\n{}",
        table.len(),
        agent.stderr()
    );
    assert_eq!(segments(&agent, "live"), Ok(2.0));

    // More stalled table clients than the runtime has blocking threads.
    let stalled: Vec<TcpStream> = (0..6)
        .map(|_| stalled_client(agent.addr, &format!("/api/v1/tables/{BIG_TABLE}")))
        .collect();
    std::thread::sleep(Duration::from_secs(2));

    // /metrics answers, again and again (each past the 250 ms cache).
    for _ in 0..4 {
        let start = Instant::now();
        let r = agent.request("GET", "/metrics", Duration::from_secs(5));
        let took = start.elapsed();
        assert!(
            matches!(&r, Ok((200, _))),
            "/metrics with 6 stalled table clients: {:?} after {took:?}\n{}",
            r.map(|(s, b)| (s, b.len())),
            agent.stderr()
        );
        std::thread::sleep(Duration::from_millis(400));
    }

    // The streams whose clients took nothing for the stall limit are given
    // up, long before the 120 s connection timeout: the first two, then
    // those that got their slots while waiting (how many of the other
    // four did, rather than being refused after waiting 10 s, depends on
    // the machine's pace). Then the slots are free again: a table is
    // served whole. (The stalled connections are read only afterwards:
    // reading one would let its stream go on.)
    let start = Instant::now();
    let given_up = |agent: &Serve| agent.stderr().matches("took no data for").count();
    while given_up(&agent) < 2 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(given_up(&agent) >= 2, "{}", agent.stderr());
    eprintln!(
        "serve_under_load: the first stalled streams given up after {:?}",
        start.elapsed()
    );
    // Any stream that started by then stalls and is given up in turn.
    std::thread::sleep(Duration::from_secs(16));
    let (status, again) = agent
        .get(&format!("/api/v1/tables/{BIG_TABLE}"))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    assert_eq!(status, 200, "{}", agent.stderr());
    assert_eq!(again.len(), table.len(), "the table is served whole again");

    // Each stalled connection ended: cut short (a 200 without the last
    // chunk, never a table that looks whole), one per stream given up, or
    // refused.
    let mut cut = 0;
    for (i, mut s) in stalled.into_iter().enumerate() {
        let got = read_to_close(&mut s, Duration::from_secs(60));
        let status = status_of(&got);
        if status.contains(" 200 ") {
            assert!(
                !got.ends_with(b"\r\n0\r\n\r\n"),
                "stalled client {i}: a table cut short ended like a whole one"
            );
            cut += 1;
        } else {
            assert!(status.contains(" 503 "), "stalled client {i}: {status}");
        }
    }
    assert_eq!(cut, given_up(&agent), "streams cut short");
    assert!(cut >= 2, "{cut} streams cut short");

    // A process's exit is noticed by discovery within seconds.
    drop(victim);
    let start = Instant::now();
    let mut dead = Err(String::new());
    while start.elapsed() < Duration::from_secs(6) {
        dead = segments(&agent, "dead");
        if dead == Ok(1.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        dead,
        Ok(1.0),
        "the victim's exit was not noticed within 6 s ({:?})\n{}",
        start.elapsed(),
        agent.stderr()
    );
    eprintln!(
        "serve_under_load: 6 stalled table clients of a {} byte table; exit noticed after {:?}",
        table.len(),
        start.elapsed()
    );
    assert_eq!(agent.get("/healthz").map(|r| r.0), Ok(200));
}

/// A stop while table streams are blocked on clients that do not read,
/// with the runtime then shut down as `pfs-agent demo` does: the server
/// returns within its stop wait, no stream thread panics in the runtime's
/// shutdown, and the cut streams end without the final chunk.
#[test]
fn stopping_with_stalled_table_streams_exits_cleanly() {
    use pfs_agent::segments::SegmentSet;
    use pfs_agent::server::AppState;
    use pfs_agent::snapshot::Snapshotter;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static PANICS: AtomicUsize = AtomicUsize::new(0);
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some("pfs-table") {
            PANICS.fetch_add(1, Ordering::SeqCst);
        }
        default_hook(info);
    }));

    let dir = tempfile::tempdir().unwrap();
    let _big = big_segment(dir.path());
    let snap = Arc::new(Snapshotter::new(
        SegmentSet::new(dir.path(), Duration::MAX),
        Duration::ZERO,
    ));
    snap.refresh();
    let state = AppState::new(snap, None);
    let (rt, addr, stop, server) = library_server(state);
    let mut stalled: Vec<TcpStream> = (0..2)
        .map(|_| stalled_client(addr, &format!("/api/v1/tables/{BIG_TABLE}")))
        .collect();
    // Both streams fill their queues and block on their clients.
    std::thread::sleep(Duration::from_secs(3));
    let _ = stop.send(());
    let start = Instant::now();
    rt.block_on(server).unwrap();
    let took = start.elapsed();
    rt.shutdown_timeout(Duration::from_secs(2));
    std::thread::sleep(Duration::from_millis(500));
    // The default hook again: this test's counts only its own threads.
    drop(std::panic::take_hook());
    assert!(
        took < Duration::from_secs(5),
        "the server took {took:?} to stop"
    );
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "a table stream's thread panicked at shutdown"
    );
    for s in &mut stalled {
        let body = read_to_close(s, Duration::from_secs(20));
        assert!(
            !body.ends_with(b"0\r\n\r\n"),
            "a stream cut by the stop ended like a whole table"
        );
    }
}

/// Reads `s` until the server closes it (or `limit` passes: a panic).
fn read_to_close(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return got,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("read: {e}"),
        }
        assert!(
            start.elapsed() < limit,
            "the connection is still open after {limit:?} ({} bytes read)",
            got.len()
        );
    }
}

/// Reads from `s` for up to `limit`: whatever came, or nothing.
fn read_for(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    match s.read(&mut buf) {
        Ok(n) => buf[..n].to_vec(),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Vec::new(),
        Err(e) => panic!("read: {e}"),
    }
}

fn status_of(resp: &[u8]) -> String {
    String::from_utf8_lossy(resp)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

#[test]
fn healthz_is_answered_beyond_the_connection_limit() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let mut agent = Serve::start(
        dir.path(),
        &[
            "--max-connections",
            "2",
            "--control-token-file",
            token.to_str().unwrap(),
        ],
    );
    agent.wait_healthy(Duration::from_secs(20));
    // Two control requests whose bodies are still arriving take both
    // slots, once the probe's connection above has given its slot back
    // (else one of them may be accepted as a spare, leaving a slot for the
    // scrape). (Idle ones, silent or kept alive after a request, would be
    // closed to make room: `tests/scrape_storm.rs`.)
    std::thread::sleep(Duration::from_millis(500));
    let busy = || {
        let mut c = TcpStream::connect(agent.addr).unwrap();
        c.write_all(
            b"POST /api/v1/setup/consumers HTTP/1.1\r\nHost: localhost\r\n\
              Authorization: Bearer s3cret\r\nContent-Length: 100\r\n\r\n[",
        )
        .unwrap();
        c
    };
    let x = busy();
    let y = busy();
    std::thread::sleep(Duration::from_millis(400));
    // A scrape waits for a slot ...
    let mut scrape = TcpStream::connect(agent.addr).unwrap();
    scrape
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    // ... while probes are answered at once, again and again.
    for _ in 0..3 {
        let start = Instant::now();
        let r = agent.request("GET", "/healthz", Duration::from_secs(2));
        assert_eq!(
            r,
            Ok((200, "ok\n".to_string())),
            "a probe with every slot taken, after {:?}\n{}",
            start.elapsed(),
            agent.stderr()
        );
    }
    let early = read_for(&mut scrape, Duration::from_secs(1));
    assert!(
        early.is_empty(),
        "the scrape was served while both slots were taken: {}",
        status_of(&early)
    );
    // Once a slot frees, the scrape is served.
    drop((x, y));
    let late = read_for(&mut scrape, Duration::from_secs(10));
    assert!(
        status_of(&late).contains(" 200 "),
        "the waiting scrape after the slots freed: {:?}",
        status_of(&late)
    );
}

/// A scrape whose client reads slowly: its whole answer is handed to
/// hyper long before the client has it, so by the slot rules its
/// connection turns idle and may be closed to make room for another
/// scrape, but only once the rest of the answer is sent.
#[test]
fn a_connection_closed_to_make_room_sends_the_rest_of_its_answer_first() {
    let dir = tempfile::tempdir().unwrap();
    let _held = many_instruments(dir.path());
    let mut agent = Serve::start(dir.path(), &["--max-connections", "1"]);
    agent.wait_healthy(Duration::from_secs(20));
    // The probe's connection gives its slot back.
    std::thread::sleep(Duration::from_millis(500));
    let mut slow = stalled_client(agent.addr, "/metrics");
    let mut got = read_for(&mut slow, Duration::from_secs(10));
    assert!(status_of(&got).contains(" 200 "), "{}", status_of(&got));
    // It stops reading; its answer is long handed to hyper.
    std::thread::sleep(Duration::from_millis(800));
    // A scrape on a new connection needs the only regular slot.
    let mut next = TcpStream::connect(agent.addr).unwrap();
    next.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // The slow client reads on: its answer is whole.
    got.extend(read_to_close(&mut slow, Duration::from_secs(20)));
    let end = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .expect("a Content-Length")
        .trim()
        .parse()
        .unwrap();
    assert!(length > 6 << 20, "a large answer ({length} bytes)");
    assert_eq!(got.len() - end - 4, length, "the answer was cut short");
    let resp = read_to_close(&mut next, Duration::from_secs(20));
    assert!(status_of(&resp).contains(" 200 "), "{}", status_of(&resp));
}

#[test]
fn listening_on_the_ipv6_any_address_answers_ipv4_and_ipv6() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let v4: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // `[::]:PORT` is the default's address on a free port (the default
    // itself, `[::]:9464`, is checked in the command line's tests).
    let mut agent = Serve::start_on(dir.path(), Some(format!("[::]:{port}")), v4, &[]);
    agent.wait_healthy(Duration::from_secs(20));
    assert_eq!(agent.get("/healthz"), Ok((200, "ok\n".to_string())));
    let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    if TcpListener::bind("[::1]:0").is_ok() {
        agent.addr = v6;
        assert_eq!(
            agent.get("/healthz"),
            Ok((200, "ok\n".to_string())),
            "over IPv6 loopback"
        );
    } else {
        eprintln!("serve_under_load: no IPv6 loopback here; checked IPv4 only");
    }
    let log = agent.stderr();
    assert!(log.contains(&format!("listen=[::]:{port}")), "{log}");
}

#[test]
fn a_missing_control_token_file_disables_control_a_missing_read_token_file_is_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let missing = secrets.path().join("token");
    let missing = missing.to_str().unwrap();
    let mut agent = Serve::start(dir.path(), &["--control-token-file", missing]);
    agent.wait_healthy(Duration::from_secs(20));
    let (status, body) = agent
        .request(
            "POST",
            "/api/v1/tables/threads/truncate",
            Duration::from_secs(5),
        )
        .unwrap();
    assert_eq!(status, 403, "control with no token file: {body}");
    let log = agent.stderr();
    assert!(
        log.contains("the control token file does not exist") && log.contains("is disabled"),
        "{log}"
    );
    assert!(!log.contains("WARN"), "{log}");
    drop(agent);

    // An empty file is a mistake, not an absent Secret: the agent stops.
    std::fs::write(missing, "\n").unwrap();
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--control-token-file",
            missing,
        ])
        .arg("--shm-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is empty"), "{err}");

    // A read token file that does not exist would open the reads: fatal.
    let read = secrets.path().join("read-token");
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--read-token-file"])
        .arg(&read)
        .arg("--shm-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "started without its read token");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read the token file"), "{err}");
}

#[test]
fn healthz_fails_once_discovery_is_stale() {
    use pfs_agent::segments::SegmentSet;
    use pfs_agent::server::{AppOptions, AppState};
    use pfs_agent::snapshot::Snapshotter;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let snap = Arc::new(Snapshotter::new(
        SegmentSet::new(dir.path(), Duration::MAX),
        Duration::ZERO,
    ));
    let state = AppState::with_options(
        snap.clone(),
        AppOptions {
            discovery_stale_after: Some(Duration::from_millis(500)),
            ..AppOptions::default()
        },
    );
    let (_rt, addr, stop, _server) = library_server(state);
    snap.refresh();
    assert_eq!(get(addr, "/healthz"), Ok((200, "ok\n".to_string())));
    // No pass for longer than the limit: a stuck discovery.
    std::thread::sleep(Duration::from_millis(800));
    let (status, body) = get(addr, "/healthz").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("discovery has not completed a pass") && body.contains("restart"),
        "{body}"
    );
    // /metrics still answers (a stale discovery is for the probe to act on).
    assert_eq!(get(addr, "/metrics").map(|r| r.0), Ok(200));
    // A pass again: healthy again.
    snap.refresh();
    assert_eq!(get(addr, "/healthz"), Ok((200, "ok\n".to_string())));
    let _ = stop.send(());
}

/// The library's server for `state` on a runtime of its own, on 127.0.0.1
/// and a free port: the runtime, the address, the sender that stops the
/// server, and the server's task.
fn library_server(
    state: std::sync::Arc<pfs_agent::server::AppState>,
) -> (
    tokio::runtime::Runtime,
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(pfs_agent::server::serve(listener, state, async {
        let _ = stopped.await;
    }));
    (rt, addr, stop, server)
}
