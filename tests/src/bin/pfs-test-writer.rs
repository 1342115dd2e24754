//! `pfs-test-writer`: an instrumented process with known, checkable
//! output, driven by the integration tests.
//!
//! ```text
//! pfs-test-writer exact --shm-dir D --service S --threads N --per-class K --exit-midway M
//! pfs-test-writer torn  --shm-dir D --service S --threads N --seconds T
//! pfs-test-writer churn --shm-dir D --service S --seconds T
//! pfs-test-writer nested --shm-dir D --service S --threads N --statements K --history H
//! pfs-test-writer loop --shm-dir D --service S --threads N
//! pfs-test-writer memory --shm-dir D --service S
//! pfs-test-writer memscript --shm-dir D --service S
//! pfs-test-writer spread --shm-dir D --service S
//! pfs-test-writer reclaim --shm-dir D --service S --waves W --threads N --reclaim-ms Q
//! pfs-test-writer awaiting --shm-dir D --service S --tasks N
//! pfs-test-writer io --shm-dir D --service S --rounds R
//! ```
//!
//! Every mode prints JSON lines on stdout; see each function.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use pfs_client::{LazyWaitClass, Operation};
use pfs_tests::torn::{OPS, Tally, checkable_wait};
use serde_json::json;

static CLASS_A: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/test/a");
static CLASS_B: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/test/b");
static CLASS_C: LazyWaitClass = LazyWaitClass::new("wait/io/file/test/c");
static CLASSES: [&LazyWaitClass; 3] = [&CLASS_A, &CLASS_B, &CLASS_C];

struct Args {
    mode: String,
    opts: HashMap<String, String>,
}

impl Args {
    fn parse() -> Result<Self> {
        let mut it = std::env::args().skip(1);
        let mode = it
            .next()
            .ok_or_else(|| anyhow!("usage: pfs-test-writer exact|torn|churn --opt value ..."))?;
        let mut opts = HashMap::new();
        while let Some(k) = it.next() {
            let Some(k) = k.strip_prefix("--") else {
                bail!("unexpected argument {k:?}")
            };
            let v = it.next().ok_or_else(|| anyhow!("--{k} needs a value"))?;
            opts.insert(k.to_string(), v);
        }
        Ok(Self { mode, opts })
    }

    fn str(&self, k: &str) -> Result<&str> {
        self.opts
            .get(k)
            .map(String::as_str)
            .ok_or_else(|| anyhow!("--{k} is required"))
    }

    fn num(&self, k: &str) -> Result<u64> {
        self.str(k)?
            .parse()
            .with_context(|| format!("--{k} must be a number"))
    }

    fn num_or(&self, k: &str, d: u64) -> Result<u64> {
        if self.opts.contains_key(k) {
            self.num(k)
        } else {
            Ok(d)
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse()?;
    let mut cfg = pfs_client::Config::new(args.str("service")?)
        .shm_dir(args.str("shm-dir")?)
        .history_len(args.num_or("history", 10)? as u32)
        .reclaim_after(match args.opts.get("reclaim-ms") {
            Some(ms) => Some(Duration::from_millis(ms.parse().context("--reclaim-ms")?)),
            None => Some(pfs_client::DEFAULT_RECLAIM_AFTER),
        });
    // As `Config::from_env` would: the access tests run the writer both ways.
    cfg.group_access = std::env::var("PFS_GROUP_ACCESS").is_ok_and(|v| v == "1");
    pfs_client::init_with(cfg).context("pfs_client::init_with")?;
    // Register the classes up front, in a fixed order (indexes 0, 1, 2).
    for c in CLASSES {
        if !c.get().is_enabled() {
            bail!("class {} is not enabled after init", c.name());
        }
    }
    match args.mode.as_str() {
        "exact" => exact(&args),
        "torn" => torn(&args),
        "churn" => churn(&args),
        "nested" => nested(&args),
        "loop" => loop_mode(&args),
        "memory" => memory_mode(),
        "memscript" => memscript_mode(),
        "spread" => spread_mode(),
        "reclaim" => reclaim_mode(&args),
        "awaiting" => awaiting_mode(&args),
        "io" => io_mode(&args),
        m => bail!("unknown mode {m:?}"),
    }
}

static WAL: LazyWaitClass = LazyWaitClass::new("wait/io/file/test/wal");
static CONN: LazyWaitClass = LazyWaitClass::new("wait/io/socket/test/conn");

/// What `io` did to one instrument, by mode (read, write, misc): waits and
/// bytes.
#[derive(Default)]
struct ByMode {
    count: [u64; 3],
    bytes: [u64; 2],
}

impl ByMode {
    fn read(&mut self, n: usize) {
        self.count[0] += 1;
        self.bytes[0] += n as u64;
    }
    fn write(&mut self, n: usize) {
        self.count[1] += 1;
        self.bytes[1] += n as u64;
    }
    fn misc(&mut self) {
        self.count[2] += 1;
    }
    fn json(&self) -> serde_json::Value {
        json!({"count": self.count, "bytes": self.bytes})
    }
}

/// `io`: real file and socket I/O through `pfs_client::fs::File` and
/// `pfs_client::net::TcpStream`, `--rounds` times: a WAL file created,
/// appended to (records of growing size), `fsync`ed, sought, read back,
/// `stat`ed and closed; a loopback TCP connection (its peer an
/// uninstrumented echo thread) connected, written to, read from and
/// closed. Prints `{"ready":true,"pid":..,"classes":{name:{"count":[r,w,m],
/// "bytes":[r,w]}}}` (what it did, by mode), then waits for a line on
/// stdin.
fn io_mode(args: &Args) -> Result<()> {
    use pfs_client::fs::File;
    use pfs_client::net::TcpStream;
    use std::io::{Seek, SeekFrom};
    let rounds = args.num("rounds")? as usize;
    let dir = std::path::PathBuf::from(args.str("shm-dir")?).join("io-data");
    std::fs::create_dir_all(&dir).context("io data directory")?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("listen")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let (mut wal, mut conn) = (ByMode::default(), ByMode::default());
    for r in 0..rounds {
        let path = dir.join(format!("wal-{r}.log"));
        let mut f = File::create(&WAL, &path).context("create")?;
        wal.misc();
        let mut written = 0;
        for i in 0..5 {
            let rec = vec![b'a' + i as u8; 100 + 37 * i + r];
            f.write_all(&rec).context("append")?;
            wal.write(rec.len());
            written += rec.len();
        }
        f.sync_data().context("fsync")?;
        wal.misc();
        drop(f);
        wal.misc(); // close
        let mut f = File::open(&WAL, &path).context("open")?;
        wal.misc();
        f.seek(SeekFrom::Start(0)).context("seek")?;
        wal.misc();
        let mut back = vec![0u8; written];
        f.read_exact(&mut back).context("read back")?;
        wal.read(written);
        let len = f.metadata().context("stat")?.len();
        wal.misc();
        anyhow::ensure!(
            len == written as u64,
            "file of {len} bytes, {written} written"
        );
        drop(f);
        wal.misc(); // close

        let mut s = TcpStream::connect(&CONN, addr).context("connect")?;
        conn.misc();
        let msg = vec![b'x'; 64 + r];
        s.write_all(&msg).context("send")?;
        conn.write(msg.len());
        let mut echo = vec![0u8; msg.len()];
        s.read_exact(&mut echo).context("recv")?;
        conn.read(echo.len());
        drop(s);
        conn.misc(); // close
    }
    print(json!({
        "ready": true,
        "pid": std::process::id(),
        "classes": {
            "wait/io/file/test/wal": wal.json(),
            "wait/io/socket/test/conn": conn.json(),
        },
    }));
    wait_stdin_line();
    Ok(())
}

static REQUEST: pfs_client::LazyStatementClass =
    pfs_client::LazyStatementClass::new("statement/test/request");
static BACKEND: pfs_client::LazyStageClass = pfs_client::LazyStageClass::new("stage/test/backend");
static POOL: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/test/pool");

/// `awaiting`: an async service whose `--tasks` requests all wait. Each
/// is a task on a multi-threaded tokio runtime (`pfs_task`) that opens a
/// statement (text `GET /orders/<i>`) and a stage, then waits for a
/// connection from a pool: a `wait/synch/mutex/test/pool` wait measured
/// across polls (`start_async`, what the tokio drop-ins do), over a
/// `tokio::sync::watch` the main thread holds closed. Prints
/// `{"ready":true,"tasks":[{"thread_id","text"}...]}` once every task has
/// started; on a line on stdin, opens the pool, waits for every task to
/// end and prints `{"released":true}`; exits at stdin EOF.
fn awaiting_mode(args: &Args) -> Result<()> {
    use pfs_client::task::TaskExt;
    let n = args.num("tasks")? as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .context("tokio runtime")?;
    let (open_tx, open_rx) = tokio::sync::watch::channel(false);
    let (tx, rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (mut open, tx) = (open_rx.clone(), tx.clone());
            rt.spawn(
                async move {
                    let mut stmt = REQUEST.start_task();
                    let text = format!("GET /orders/{i}");
                    stmt.set_text(&text);
                    BACKEND.enter();
                    let _ = tx.send((stmt.id().0, text));
                    let wait = POOL.get().start_async(Operation::Lock, 0x5000);
                    let _ = open.wait_for(|open| *open).await;
                    wait.end();
                    stmt.set_rows_sent(1);
                }
                .pfs_task(),
            )
        })
        .collect();
    let tasks: Vec<_> = (0..n)
        .map(|_| rx.recv_timeout(Duration::from_secs(30)))
        .collect::<Result<_, _>>()
        .context("tasks did not start")?;
    let tasks: Vec<_> = tasks
        .into_iter()
        .map(|(tid, text)| json!({"thread_id": tid, "text": text}))
        .collect();
    print(json!({"ready": true, "segment": segment(), "tasks": tasks}));
    wait_stdin_line();
    let _ = open_tx.send(true);
    for h in handles {
        rt.block_on(h).context("a task panicked")?;
    }
    print(json!({"released": true}));
    wait_stdin_eof();
    Ok(())
}

fn print(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn wait_stdin_eof() {
    let mut buf = [0u8; 256];
    let mut stdin = std::io::stdin().lock();
    while let Ok(n) = stdin.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
}

/// Blocks until the test writes a line on stdin (or closes it).
fn wait_stdin_line() {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

fn segment() -> String {
    pfs_client::segment_path()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// A tally keyed by class name: `{name: {count, sum_ps, bytes}}`.
fn classes_json(t: &Tally) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (i, c) in CLASSES.iter().enumerate() {
        m.insert(
            c.name().to_string(),
            json!({"count": t.count[i], "sum_ps": t.sum_ps[i], "bytes": t.bytes[i]}),
        );
    }
    m.into()
}

/// Records one wait of class `i`; returns whether it was recorded and its
/// TIMER_WAIT.
fn one_wait(i: usize, object: usize, bytes: Option<u64>, tally: &mut Tally) {
    let mut g = CLASSES[i].get().start(OPS[i], object);
    if !g.is_recording() {
        return;
    }
    if let Some(b) = bytes {
        g.set_bytes(b);
    }
    std::hint::black_box(object.wrapping_mul(31));
    let wait = g.end().expect("instruments are timed");
    tally.count[i] += 1;
    tally.sum_ps[i] += wait;
    tally.bytes[i] += bytes.unwrap_or(0);
}

/// `exact`: N threads each record exactly K waits of every class (file
/// waits carry bytes); M of them exit right away, the others park until
/// stdin reaches EOF. Prints one line:
///
/// `{"ready":true,"pid":..,"segment":..,"threads":N,"live":N-M,"classes":{name:{count,sum_ps,bytes}},
///   "total_bytes":..,"per_thread":[{"name":..,"live":bool,"classes":{..}}]}`
fn exact(args: &Args) -> Result<()> {
    let n = args.num("threads")? as usize;
    let k = args.num("per-class")?;
    let m = args.num_or("exit-midway", 0)? as usize;
    if m > n {
        bail!("--exit-midway {m} > --threads {n}");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Barrier::new(n - m + 1));
    let results = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for t in 0..n {
        let live = t >= m;
        let (stop, done, results) = (stop.clone(), done.clone(), results.clone());
        let h = std::thread::Builder::new()
            .name(format!("exact-{t}"))
            .spawn(move || {
                let mut tally = Tally::default();
                for j in 0..k {
                    for i in 0..3 {
                        let bytes = (i == 2).then_some(100 + (j % 7) * 512 + t as u64);
                        one_wait(i, 0x1000 * (i + 1) + t, bytes, &mut tally);
                    }
                }
                results.lock().unwrap().push((t, live, tally));
                if live {
                    done.wait();
                    while !stop.load(Relaxed) {
                        std::thread::park_timeout(Duration::from_millis(50));
                    }
                }
            })?;
        handles.push((live, h));
    }
    // Join the exiting threads: their folds are complete when join returns.
    let mut live_handles = Vec::new();
    for (live, h) in handles {
        if live {
            live_handles.push(h);
        } else {
            h.join().map_err(|_| anyhow!("writer thread panicked"))?;
        }
    }
    done.wait();
    let mut per = results.lock().unwrap().clone();
    per.sort_by_key(|(t, _, _)| *t);
    let mut total = Tally::default();
    for (_, _, tally) in &per {
        total.add(tally);
    }
    let per_thread: Vec<_> = per
        .iter()
        .map(|(t, live, tally)| json!({"name": format!("exact-{t}"), "live": live, "classes": classes_json(tally)}))
        .collect();
    print(json!({
        "ready": true,
        "pid": std::process::id(),
        "segment": segment(),
        "threads": n,
        "live": n - m,
        "classes": classes_json(&total),
        "total_bytes": total.bytes.iter().sum::<u64>(),
        "per_thread": per_thread,
    }));
    wait_stdin_eof();
    stop.store(true, Relaxed);
    for h in live_handles {
        h.thread().unpark();
        h.join().map_err(|_| anyhow!("writer thread panicked"))?;
    }
    Ok(())
}

/// `torn`: N threads hammer self-checking waits for T seconds. The n-th
/// event of a thread (EVENT_ID n) has object n*7919, bytes n^0x5555 and
/// spins n+3, so a reader can tell a torn copy from a consistent one.
/// Prints `{"ready":true,...}` first and `{"done":true,"events":E,"per_class":[..]}`
/// after every thread has exited.
fn torn(args: &Args) -> Result<()> {
    let n = args.num("threads")? as usize;
    let secs = args.num("seconds")?;
    let start = Arc::new(Barrier::new(n + 1));
    let deadline = Arc::new(Mutex::new(None::<Instant>));
    let mut handles = Vec::new();
    for t in 0..n {
        let (start, deadline) = (start.clone(), deadline.clone());
        handles.push(
            std::thread::Builder::new()
                .name(format!("torn-{t}"))
                .spawn(move || -> [u64; 3] {
                    start.wait();
                    let end = deadline.lock().unwrap().expect("deadline set before start");
                    let mut id: u64 = 0;
                    let mut tally = Tally::default();
                    loop {
                        for _ in 0..64 {
                            id += 1;
                            assert!(
                                checkable_wait(&CLASSES, id, &mut tally),
                                "torn writer thread lost its record"
                            );
                        }
                        if Instant::now() >= end {
                            break;
                        }
                    }
                    tally.count
                })?,
        );
    }
    *deadline.lock().unwrap() = Some(Instant::now() + Duration::from_secs(secs));
    print(json!({"ready": true, "pid": std::process::id(), "segment": segment(), "threads": n}));
    start.wait();
    let mut per_class = [0u64; 3];
    for h in handles {
        let c = h.join().map_err(|_| anyhow!("torn thread panicked"))?;
        for i in 0..3 {
            per_class[i] += c[i];
        }
    }
    print(json!({"done": true, "events": per_class.iter().sum::<u64>(), "per_class": per_class}));
    Ok(())
}

/// `churn`: for T seconds, keeps spawning short-lived threads (up to 4
/// alive at once), each recording a known number of waits and exiting.
/// Prints `{"ready":true,..}`, then after T seconds and after every thread
/// has exited `{"done":true,"threads":..,"events":E,"classes":{name:{count,..}}}`,
/// then waits for stdin EOF.
fn churn(args: &Args) -> Result<()> {
    let secs = args.num("seconds")?;
    let spawned = Arc::new(AtomicU64::new(0));
    let total = Arc::new(Mutex::new(Tally::default()));
    print(json!({"ready": true, "pid": std::process::id(), "segment": segment()}));
    let end = Instant::now() + Duration::from_secs(secs);
    let mut alive: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let mut seq: u64 = 0;
    while Instant::now() < end {
        while alive.len() < 4 {
            seq += 1;
            let (spawned, total) = (spawned.clone(), total.clone());
            let s = seq;
            alive.push(
                std::thread::Builder::new()
                    .name(format!("churn-{s}"))
                    .spawn(move || {
                        spawned.fetch_add(1, Relaxed);
                        let mut tally = Tally::default();
                        // 1..=40 waits, spread over the classes depending on s.
                        let waits = 1 + s % 40;
                        for j in 0..waits {
                            let i = ((s + j) % 3) as usize;
                            let bytes = (i == 2).then_some(64 + j);
                            one_wait(i, s as usize, bytes, &mut tally);
                        }
                        total.lock().unwrap().add(&tally);
                    })?,
            );
        }
        // Reap the first finished thread (its fold is done once joined).
        let mut i = 0;
        while i < alive.len() {
            if alive[i].is_finished() {
                alive
                    .swap_remove(i)
                    .join()
                    .map_err(|_| anyhow!("churn thread panicked"))?;
            } else {
                i += 1;
            }
        }
        std::thread::yield_now();
    }
    for h in alive {
        h.join().map_err(|_| anyhow!("churn thread panicked"))?;
    }
    let total = *total.lock().unwrap();
    print(json!({
        "done": true,
        "threads": spawned.load(Relaxed),
        "events": total.count.iter().sum::<u64>(),
        "classes": classes_json(&total),
    }));
    wait_stdin_eof();
    Ok(())
}

static STMT_Q: pfs_client::LazyStatementClass =
    pfs_client::LazyStatementClass::new("statement/test/query");
static STAGE_PARSE: pfs_client::LazyStageClass =
    pfs_client::LazyStageClass::new("stage/test/parse");
static STAGE_EXEC: pfs_client::LazyStageClass = pfs_client::LazyStageClass::new("stage/test/exec");

/// `nested`: each of N threads runs K statements; each statement enters two
/// stages and records waits inside each, plus one wait before any stage.
/// Threads then stay alive (so their history is readable) until stdin
/// closes. Prints `{"ready": true, "statements": N*K, "stages": 2*N*K,
/// "waits": ...}`.
fn nested(args: &Args) -> Result<()> {
    let threads = args.num("threads")? as usize;
    let statements = args.num("statements")?;
    let done = Arc::new(Barrier::new(threads + 1));
    let release = Arc::new(Barrier::new(threads + 1));
    let mut handles = Vec::new();
    for t in 0..threads {
        let (done, release) = (done.clone(), release.clone());
        handles.push(
            std::thread::Builder::new()
                .name(format!("nested-{t}"))
                .spawn(move || {
                    for i in 0..statements {
                        let mut stmt = STMT_Q.start();
                        stmt.set_text(&format!("SELECT {i}"));
                        drop(CLASS_A.get().start(Operation::Lock, 1)); // directly in the statement
                        STAGE_PARSE.enter();
                        drop(CLASS_A.get().start(Operation::Lock, 2));
                        STAGE_EXEC.enter();
                        drop(CLASS_B.get().start(Operation::ReadLock, 3));
                        drop(CLASS_C.get().start(Operation::Write, 4));
                        stmt.set_rows_sent(i);
                        drop(stmt);
                    }
                    done.wait();
                    release.wait();
                })?,
        );
    }
    done.wait();
    let n = threads as u64 * statements;
    print(
        json!({"ready": true, "segment": segment(), "statements": n, "stages": 2 * n, "waits": 4 * n}),
    );
    wait_stdin_eof();
    release.wait();
    for h in handles {
        h.join().map_err(|_| anyhow!("nested thread panicked"))?;
    }
    Ok(())
}

/// `loop`: N threads record one wait of class A every ~200 µs until stdin
/// closes, then print how many each recorded.
fn loop_mode(args: &Args) -> Result<()> {
    let threads = args.num("threads")? as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (stop, total) = (stop.clone(), total.clone());
            std::thread::Builder::new()
                .name(format!("loop-{t}"))
                .spawn(move || {
                    while !stop.load(Relaxed) {
                        drop(CLASS_A.get().start(Operation::Lock, t));
                        total.fetch_add(1, Relaxed);
                        std::thread::sleep(Duration::from_micros(200));
                    }
                })
                .map_err(anyhow::Error::from)
        })
        .collect::<Result<_>>()?;
    print(json!({"ready": true, "segment": segment()}));
    wait_stdin_eof();
    stop.store(true, Relaxed);
    for h in handles {
        h.join().map_err(|_| anyhow!("loop thread panicked"))?;
    }
    print(json!({"done": true, "events": total.load(Relaxed)}));
    Ok(())
}

static MEM_BUF: pfs_client::LazyMemoryClass = pfs_client::LazyMemoryClass::new("memory/test/buf");
static MEM_CACHE: pfs_client::LazyMemoryClass =
    pfs_client::LazyMemoryClass::new("memory/test/cache");

/// Sets ENABLED of the instruments matching `pattern`, as the agent would.
fn set_enabled(pattern: &str, on: bool) -> Result<()> {
    let path = pfs_client::segment_path().ok_or_else(|| anyhow!("no segment"))?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let seg = pfs_shm_layout::Segment::open(f, true)?;
    pfs_shm_layout::setup::set_instruments(&seg, pattern, Some(on), None);
    Ok(())
}

/// A scripted memory workload, every step ordered (the expected tables are
/// computed by hand in `tests/tests/memory_exact.rs`):
///
/// * `mem-1` (alice@h1): buf 100, buf 200, free 100; cache 1000 kept;
///   hands the 200-byte block to `mem-2`; stays alive.
/// * `mem-2` (alice@h1): frees that 200-byte block, then buf 50 and its
///   free; stays alive.
/// * `mem-3` (bob@h2): buf 400 (handed to main), cache 10 and its free;
///   exits.
/// * main (no actor): frees mem-3's 400-byte block after mem-3 exited;
///   cache 7, disables cache, frees the 7 (counted), cache 9 while
///   disabled (not counted), enables cache, frees the 9 (not counted).
///
/// Prints `{"ready": true}` and waits for stdin EOF.
fn memory_mode() -> Result<()> {
    use std::sync::mpsc::channel;
    MEM_BUF.get();
    MEM_CACHE.get();
    let (to_2, from_1) = channel::<pfs_client::MemoryToken>();
    let (done_tx, done_rx) = channel::<&'static str>();
    let stop = Arc::new(Barrier::new(3));
    let s1 = stop.clone();
    let d1 = done_tx.clone();
    let t1 = std::thread::Builder::new()
        .name("mem-1".into())
        .spawn(move || {
            pfs_client::set_thread_actor("alice", "h1", "");
            let a = MEM_BUF.alloc(100);
            let b = MEM_BUF.alloc(200);
            a.free();
            let c = MEM_CACHE.alloc(1000);
            to_2.send(b).expect("send");
            let _ = d1.send("mem-1");
            s1.wait();
            drop(c);
        })?;
    assert_eq!(done_rx.recv()?, "mem-1");
    let s2 = stop.clone();
    let d2 = done_tx.clone();
    let t2 = std::thread::Builder::new()
        .name("mem-2".into())
        .spawn(move || {
            pfs_client::set_thread_actor("alice", "h1", "");
            let b = from_1.recv().expect("recv");
            b.free();
            MEM_BUF.alloc(50).free();
            let _ = d2.send("mem-2");
            s2.wait();
        })?;
    assert_eq!(done_rx.recv()?, "mem-2");
    let e = std::thread::Builder::new()
        .name("mem-3".into())
        .spawn(move || {
            pfs_client::set_thread_actor("bob", "h2", "");
            let e = MEM_BUF.alloc(400);
            MEM_CACHE.alloc(10).free();
            e
        })?
        .join()
        .map_err(|_| anyhow!("mem-3 panicked"))?;
    e.free();
    let g = MEM_CACHE.alloc(7);
    set_enabled("memory/test/cache", false)?;
    if MEM_CACHE.get().is_enabled() {
        bail!("cache still enabled");
    }
    g.free();
    let h = MEM_CACHE.alloc(9);
    if h.counted() {
        bail!("an allocation while disabled was counted");
    }
    set_enabled("memory/test/cache", true)?;
    h.free();
    print(json!({"ready": true, "segment": segment()}));
    wait_stdin_eof();
    stop.wait();
    for t in [t1, t2] {
        t.join().map_err(|_| anyhow!("memory thread panicked"))?;
    }
    print(json!({"done": true}));
    Ok(())
}

static MEM_SCRIPT: pfs_client::LazyMemoryClass =
    pfs_client::LazyMemoryClass::new("memory/test/script");

/// `memscript`: memory operations of `memory/test/script` driven line by
/// line from stdin, each run on a named thread, so that a test can check
/// the tables between any two steps (truncations included):
///
/// * `spawn T`: starts thread `T` (named `T`);
/// * `alloc T ID BYTES`: thread `T` allocates a block, kept as `ID`;
/// * `free T ID`: thread `T` frees block `ID` (whoever allocated it);
/// * `exit T`: thread `T` exits (its memory folds into the global rows).
///
/// Prints `{"ready": true, ...}` first, then `{"ok": LINE}` once each line
/// is done (or `{"error": ...}`), and ends at stdin EOF.
fn memscript_mode() -> Result<()> {
    use std::sync::mpsc::{Sender, channel};
    type Blocks = Arc<Mutex<HashMap<String, pfs_client::MemoryToken>>>;
    type Job = Box<dyn FnOnce() -> Result<()> + Send>;
    MEM_SCRIPT.get();
    let blocks: Blocks = Arc::default();
    let mut threads: HashMap<String, (Sender<Job>, std::thread::JoinHandle<()>)> = HashMap::new();
    print(json!({"ready": true, "pid": std::process::id(), "segment": segment()}));
    // Runs `job` on thread `t` and waits for it.
    let run = |threads: &HashMap<String, (Sender<Job>, std::thread::JoinHandle<()>)>,
               t: &str,
               job: Job|
     -> Result<()> {
        let (tx, _) = threads.get(t).ok_or_else(|| anyhow!("no thread {t:?}"))?;
        let (done_tx, done_rx) = channel();
        tx.send(Box::new(move || {
            let r = job();
            let _ = done_tx.send(r);
            Ok(())
        }))
        .map_err(|_| anyhow!("thread {t:?} is gone"))?;
        done_rx.recv().map_err(|_| anyhow!("thread {t:?} died"))?
    };
    for line in std::io::stdin().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let r = match words.as_slice() {
            ["spawn", t] => {
                let (tx, rx) = channel::<Job>();
                let h = std::thread::Builder::new()
                    .name((*t).to_string())
                    .spawn(move || {
                        for job in rx {
                            let _ = job();
                        }
                    })?;
                threads.insert((*t).to_string(), (tx, h));
                Ok(())
            }
            ["alloc", t, id, bytes] => {
                let (b, id, bytes) = (blocks.clone(), id.to_string(), bytes.parse::<u64>()?);
                run(
                    &threads,
                    t,
                    Box::new(move || {
                        let tok = MEM_SCRIPT.alloc(bytes);
                        if !tok.counted() {
                            bail!("block {id} was not counted");
                        }
                        b.lock().expect("blocks").insert(id, tok);
                        Ok(())
                    }),
                )
            }
            ["free", t, id] => {
                let (b, id) = (blocks.clone(), id.to_string());
                run(
                    &threads,
                    t,
                    Box::new(move || {
                        let tok = b.lock().expect("blocks").remove(&id);
                        tok.ok_or_else(|| anyhow!("no block {id}"))?.free();
                        Ok(())
                    }),
                )
            }
            ["exit", t] => match threads.remove(*t) {
                Some((tx, h)) => {
                    drop(tx);
                    h.join().map_err(|_| anyhow!("thread {t:?} panicked"))
                }
                None => Err(anyhow!("no thread {t:?}")),
            },
            _ => Err(anyhow!("unknown command {line:?}")),
        };
        match r {
            Ok(()) => print(json!({"ok": line})),
            Err(e) => print(json!({"error": format!("{line}: {e:#}")})),
        }
    }
    for (_, (tx, h)) in threads {
        drop(tx);
        let _ = h.join();
    }
    Ok(())
}

static SPREAD: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/test/spread");
static SPREAD_STATEMENT: pfs_client::LazyStatementClass =
    pfs_client::LazyStatementClass::new("statement/test/spread");

/// `spread`: timed waits of `wait/synch/mutex/test/spread` spread over
/// the latency histogram, from nanoseconds (nothing between start and
/// end) to a wait above 8 s (the waits' overflow bucket): for each
/// duration of 0, 2 µs, 30 µs, 400 µs, 5 ms, 60 ms and 300 ms, 3 to 9
/// waits (a different number each); and one 8.3 s wait on its own thread,
/// meanwhile. Each wait is the only event of a `statement/test/spread`
/// statement (whose histogram reaches 1024 s: the 8.3 s one is in
/// (8 s, 16 s]). Prints `{"ready": true, ...}` at the start and
/// `{"done": true, "waits": N}` once every wait ended (as many
/// statements), then waits for stdin EOF.
fn spread_mode() -> Result<()> {
    print(json!({"ready": true, "pid": std::process::id(), "segment": segment()}));
    let wait = |d: Duration| {
        let statement = SPREAD_STATEMENT.start();
        let g = SPREAD.get().start(Operation::Lock, 0);
        if !d.is_zero() {
            std::thread::sleep(d);
        }
        g.end().expect("spread is timed");
        drop(statement);
    };
    let long = std::thread::Builder::new()
        .name("spread-long".into())
        .spawn(move || wait(Duration::from_millis(8300)))?;
    let mut waits = 1;
    for (n, us) in [0u64, 2, 30, 400, 5_000, 60_000, 300_000]
        .iter()
        .enumerate()
    {
        for _ in 0..3 + n {
            wait(Duration::from_micros(*us));
            waits += 1;
        }
    }
    long.join().map_err(|_| anyhow!("spread-long panicked"))?;
    print(json!({"done": true, "waits": waits}));
    wait_stdin_eof();
    Ok(())
}

/// `reclaim`: W waves; in each, N threads named `w{wave}-{i}` record
/// `5 * (i % 7 + 1)` waits each and stay alive together (the peak). The
/// mode prints `{"phase": "peak", ...}` and waits for a stdin line; then
/// every thread exits, it prints `{"phase": "idle", ...}` (the container's
/// pages are now free and, after `--reclaim-ms`, reclaimed by the
/// maintenance thread) and waits for another line. Ends with
/// `{"done": true, "events": total}` and waits for stdin EOF.
fn reclaim_mode(args: &Args) -> Result<()> {
    let waves = args.num_or("waves", 3)?;
    let threads = args.num_or("threads", 48)? as usize;
    print(json!({"ready": true, "pid": std::process::id(), "segment": segment()}));
    let mut events = 0u64;
    for wave in 0..waves {
        let up = Arc::new(Barrier::new(threads + 1));
        let down = Arc::new(Barrier::new(threads + 1));
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let (up, down) = (up.clone(), down.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("w{wave}-{i}"))
                    .spawn(move || {
                        let mut tally = Tally::default();
                        for j in 0..5 * (i % 7 + 1) {
                            one_wait(0, i * 1000 + j, None, &mut tally);
                        }
                        up.wait();
                        down.wait();
                        tally.count[0]
                    })?,
            );
        }
        up.wait();
        print(json!({"phase": "peak", "wave": wave, "threads": threads}));
        wait_stdin_line();
        down.wait();
        for h in handles {
            events += h.join().map_err(|_| anyhow!("reclaim thread panicked"))?;
        }
        print(json!({"phase": "idle", "wave": wave, "events": events}));
        wait_stdin_line();
    }
    print(json!({"done": true, "events": events}));
    wait_stdin_eof();
    Ok(())
}
