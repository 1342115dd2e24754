//! The instrumented demo application that `pfs-agent demo` runs as a child
//! process: an in-memory key-value store with a write-ahead log on disk,
//! and the async HTTP service of [`crate::http`] beside it. Layer 2.
//!
//! * Short-lived connection threads (`conn-N`) submit bursts of GET / PUT /
//!   DELETE requests to a queue (mutex + condvar) and wait for the replies
//!   on a per-burst reply mutex + condvar.
//! * Worker threads (`worker-N`) serve the queue: GETs take the store's
//!   rwlock shared, PUT / DELETE append a record to the WAL (under the WAL
//!   mutex, with group-commit `fdatasync`) and take it exclusive; every
//!   request also bumps a shared statistics mutex (a deliberate hot spot).
//! * `wal-flusher` commits the WAL's unsynced tail every few milliseconds;
//!   `checkpoint` periodically reads the WAL tail back and writes a snapshot
//!   file.
//!
//! Every lock, condvar and file operation goes through `pfs-client`, so all
//! timings come from the instrumentation; the PRNG only chooses requests.
//!
//! SIGTERM and SIGINT stop it cleanly (the same drain as its stop flag), so
//! it also behaves as a container's PID 1, where a signal without a handler
//! is dropped by the kernel; a second signal exits at once.

use std::collections::{HashMap, VecDeque};
use std::fs::OpenOptions;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LockResult, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use pfs_client::fs::File;
use pfs_client::sync::{Condvar, Mutex, RwLock};
use pfs_client::{LazyMemoryClass, LazyStageClass, LazyStatementClass, LazyWaitClass, MemoryToken};

use crate::error::DemoError;

/// Protects the request queue (producers: connections; consumers: workers).
static QUEUE_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kvstore/queue_lock");
/// Idle workers wait here for requests: an idle instrument (`idle/...`,
/// MySQL's `idle`), which the dashboard's wait panels leave out.
static QUEUE_NOT_EMPTY: LazyWaitClass = LazyWaitClass::new("idle/kvstore/queue_not_empty");
/// The key-value map: GET shared, PUT / DELETE exclusive.
static STORE_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/kvstore/store");
/// Serialises WAL appends, group commits and rotation.
static WAL_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kvstore/wal_lock");
/// Request counters shared by all workers: a deliberate hot spot.
static STATS_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kvstore/stats");
/// Per-burst reply state shared by a connection and the workers.
static REPLY_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/kvstore/reply_lock");
/// A connection waits here until its whole burst has been answered.
static REPLY_READY: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/kvstore/reply_ready");
/// The write-ahead log file (appends, syncs, truncation, tail reads).
static WAL_FILE: LazyWaitClass = LazyWaitClass::new("wait/io/file/kvstore/wal");
/// The checkpoint snapshot file.
static SNAPSHOT_FILE: LazyWaitClass = LazyWaitClass::new("wait/io/file/kvstore/snapshot");

/// One statement per request served, by operation.
static STMT_GET: LazyStatementClass = LazyStatementClass::new("statement/kvstore/get");
static STMT_PUT: LazyStatementClass = LazyStatementClass::new("statement/kvstore/put");
static STMT_DELETE: LazyStatementClass = LazyStatementClass::new("statement/kvstore/delete");
static STMT_CHECKPOINT: LazyStatementClass =
    LazyStatementClass::new("statement/kvstore/checkpoint");

/// The phases of a request, as MySQL names its stages.
static STAGE_PARSING: LazyStageClass = LazyStageClass::new("stage/kvstore/parsing");
static STAGE_OPENING: LazyStageClass = LazyStageClass::new("stage/kvstore/opening_tables");
static STAGE_EXECUTING: LazyStageClass = LazyStageClass::new("stage/kvstore/executing");
static STAGE_SENDING: LazyStageClass = LazyStageClass::new("stage/kvstore/sending_data");
static STAGE_CLEANUP: LazyStageClass = LazyStageClass::new("stage/kvstore/cleaning_up");
static STAGE_CHECKPOINT: LazyStageClass = LazyStageClass::new("stage/kvstore/writing_snapshot");

/// Memory: the values the store holds (grows with the key space, shrinks
/// on DELETE and when a PUT replaces a value).
static MEM_VALUES: LazyMemoryClass = LazyMemoryClass::new("memory/kvstore/store_values");
/// Memory: a request's buffer, allocated by the connection thread and freed
/// by the worker that served it (so per-thread CURRENT goes negative).
static MEM_REQUEST: LazyMemoryClass = LazyMemoryClass::new("memory/kvstore/request_buffers");
/// Memory: the row buffer a statement builds its answer in.
static MEM_ROWS: LazyMemoryClass = LazyMemoryClass::new("memory/kvstore/row_buffers");

/// Values larger than this are refused (an application rule of the demo
/// store), which gives statements real errors.
const MAX_VALUE_LEN: usize = 240;

/// Keys are `key-0000` .. `key-4095`.
const KEY_SPACE: u64 = 4096;
/// Keys written once at start-up, so early GETs can hit.
const PRELOAD_KEYS: u64 = 1024;
/// The WAL is truncated when it grows past this.
const WAL_MAX_BYTES: u64 = 4 << 20;
/// Group commit: `fdatasync` after this many unsynced appends ...
const GROUP_COMMIT_WRITES: u32 = 32;
/// ... or when the oldest unsynced append is this old.
const GROUP_COMMIT_INTERVAL: Duration = Duration::from_millis(20);
/// How often `wal-flusher` looks for an unsynced tail.
const FLUSH_TICK: Duration = Duration::from_millis(10);
/// How often `checkpoint` runs.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(2);
/// How much of the WAL a checkpoint reads back.
const WAL_TAIL_BYTES: u64 = 64 << 10;
/// The stats hot spot re-ranks the hot keys every this many requests ...
const HOT_KEYS_EVERY: u64 = 256;
/// ... keeping this many.
const HOT_KEYS: usize = 8;
/// Connections kept alive by the spawner.
const MIN_CONNS: usize = 2;
const MAX_CONNS: usize = 8;
/// Longest uninterrupted sleep of a stop-aware thread.
const STOP_POLL: Duration = Duration::from_millis(50);

const WAL_NAME: &str = "kvstore.wal";
const SNAPSHOT_NAME: &str = "kvstore.snapshot";
const SNAPSHOT_TMP_NAME: &str = "kvstore.snapshot.tmp";

/// Options of the demo workload process. Everything else `pfs-client`
/// reads from the environment (`PFS_GROUP_ACCESS`, `PFS_MAX_THREADS`, ...,
/// see `pfs_client::Config::from_env`) applies too; these two override
/// `PFS_SHM_DIR` and `PFS_SERVICE_NAME`.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    /// Directory where the pfs-client segment is created.
    pub shm_dir: PathBuf,
    /// PFS service name, e.g. `kvstore-demo`.
    pub service: String,
    /// Directory of the write-ahead log and snapshot (real files on disk).
    pub data_dir: PathBuf,
    /// Number of worker threads (default 4).
    pub workers: usize,
}

/// Runs the demo key-value store workload until the process receives
/// SIGTERM or SIGINT, then stops cleanly (connections finish their burst,
/// workers drain the queue, the WAL is synced) and returns `Ok`. A second
/// signal during that drain exits the process at once (status 128 + the
/// signal's number).
///
/// First installs the signal handlers and creates `opts.data_dir`, then
/// initialises `pfs-client` from the environment
/// (`pfs_client::Config::from_env`: `PFS_GROUP_ACCESS`, `PFS_MAX_THREADS`,
/// ...) with `opts.shm_dir` and `opts.service` on top; if that fails, it
/// logs why and runs on uninstrumented, as an application should. Then
/// creates the WAL in `opts.data_dir`, starts the async HTTP service ([`crate::http`]) and
/// its load generator, then `opts.workers` workers, the WAL flusher, the
/// checkpointer and the connection spawner, and blocks joining them.
pub fn run(opts: WorkloadOptions) -> Result<(), DemoError> {
    let WorkloadOptions {
        shm_dir,
        service,
        data_dir,
        workers,
    } = opts;
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signal(stop.clone())?;
    // The data directory first (made, and written to): a workload that
    // cannot run leaves no segment behind.
    let probe = data_dir.join(".pfs-demo-probe");
    std::fs::create_dir_all(&data_dir)
        .and_then(|()| std::fs::File::create(&probe))
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|source| DemoError::Wal {
            dir: data_dir.clone(),
            source,
        })?;
    let group_access = match instrument(&shm_dir, &service) {
        Ok(group_access) => group_access,
        Err(e) => {
            // As an instrumented application should: say why, run on.
            let mut why = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                why = format!("{why}: {c}");
                cause = c.source();
            }
            tracing::error!(
                "{why}; the workload runs uninstrumented (an application must not stop because its instrumentation cannot start)"
            );
            false
        }
    };
    tracing::info!(
        service,
        segment = ?pfs_client::segment_path(),
        group_access,
        data_dir = %data_dir.display(),
        workers,
        "kvstore demo workload starting"
    );
    let (_http, addr) = crate::http::spawn(stop.clone())?;
    tracing::info!(%addr, "orders HTTP service and its load generator started");
    let counters = run_workload(&data_dir, workers, stop)?;
    tracing::info!(?counters, "kvstore demo workload stopped");
    Ok(())
}

/// Initialises `pfs-client` from the environment with `shm_dir` and
/// `service` on top; whether the segment is group-accessible.
fn instrument(shm_dir: &std::path::Path, service: &str) -> Result<bool, DemoError> {
    let mut config = pfs_client::Config::from_env()
        .map_err(DemoError::Environment)?
        .shm_dir(shm_dir);
    config.service_name = service.to_string();
    let group_access = config.group_access;
    pfs_client::init_with(config).map_err(|source| DemoError::Init {
        service: service.to_string(),
        shm_dir: shm_dir.to_path_buf(),
        source,
    })?;
    // Every wait instrument registered at once, so that setup_instruments
    // and /metrics list each from the start, not from its first wait (the
    // snapshot file's, say, comes with the first checkpoint).
    for class in [
        &QUEUE_LOCK,
        &QUEUE_NOT_EMPTY,
        &STORE_LOCK,
        &WAL_LOCK,
        &STATS_LOCK,
        &REPLY_LOCK,
        &REPLY_READY,
        &WAL_FILE,
        &SNAPSHOT_FILE,
    ] {
        class.get();
    }
    Ok(group_access)
}

/// Sets `stop` on the first SIGTERM or SIGINT; a second one exits the
/// process at once with status 128 + its number. The handlers are in place
/// when this returns (a signal that arrives earlier kills the process, or
/// is dropped if it is a PID namespace's init); a thread named `signals`
/// waits for them.
fn stop_on_signal(stop: Arc<AtomicBool>) -> Result<(), DemoError> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(DemoError::resource("start the signal-handling runtime"))?;
    let (mut term, mut int) = {
        let _in_rt = rt.enter();
        let handler = |kind, name: &str| {
            signal(kind).map_err(DemoError::resource(format!("install a {name} handler")))
        };
        (
            handler(SignalKind::terminate(), "SIGTERM")?,
            handler(SignalKind::interrupt(), "SIGINT")?,
        )
    };
    // A workload of `pfs-agent demo` gets SIGTERM when its parent dies.
    let parent = std::os::unix::process::parent_id();
    spawn_named("signals".into(), move || {
        rt.block_on(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            let why = if std::os::unix::process::parent_id() != parent {
                " (its parent process exited: a workload stops with the demo or program that started it)"
            } else {
                ""
            };
            tracing::info!(
                signal = name,
                "stopping{why}: finishing the requests in flight; send the signal again to exit at once"
            );
            stop.store(true, Ordering::Release);
            let (name, code) = tokio::select! {
                _ = term.recv() => ("SIGTERM", 128 + 15),
                _ = int.recv() => ("SIGINT", 128 + 2),
            };
            tracing::warn!(signal = name, "second signal: exiting without finishing");
            std::process::exit(code);
        })
    })?;
    Ok(())
}

/// Recovers the guard of a poisoned lock: a panicked worker must not take
/// the whole demo down.
fn relock<G>(r: LockResult<G>) -> G {
    r.unwrap_or_else(PoisonError::into_inner)
}

fn key_name(n: u64) -> String {
    format!("key-{n:04}")
}

/// A printable value of `len` bytes (no spaces or newlines, so a WAL
/// record is one line).
fn make_value(rng: &mut fastrand::Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.u8(b'a'..=b'z')).collect()
}

/// The write-ahead log: an append-only file, group-committed, truncated
/// when it grows too large.
struct Wal {
    file: File,
    len: u64,
    unsynced: u32,
    last_sync: Instant,
    syncs: u64,
    rotations: u64,
}

impl Wal {
    fn open(path: &Path) -> io::Result<Self> {
        let mut file = File::open_with(
            &WAL_FILE,
            path,
            OpenOptions::new().create(true).append(true),
        )?;
        file.set_len(0)?;
        Ok(Self {
            file,
            len: 0,
            unsynced: 0,
            last_sync: Instant::now(),
            syncs: 0,
            rotations: 0,
        })
    }

    fn append(&mut self, record: &[u8]) {
        if let Err(e) = self.file.write_all(record) {
            tracing::warn!(error = %e, "WAL append failed");
            return;
        }
        self.len += record.len() as u64;
        self.unsynced += 1;
        if self.unsynced >= GROUP_COMMIT_WRITES || self.last_sync.elapsed() >= GROUP_COMMIT_INTERVAL
        {
            self.sync();
        }
        if self.len >= WAL_MAX_BYTES {
            self.rotate();
        }
    }

    fn sync(&mut self) {
        match self.file.sync_data() {
            Ok(()) => {
                self.unsynced = 0;
                self.syncs += 1;
            }
            Err(e) => tracing::warn!(error = %e, "WAL sync failed"),
        }
        self.last_sync = Instant::now();
    }

    fn sync_if_due(&mut self) {
        if self.unsynced > 0 && self.last_sync.elapsed() >= GROUP_COMMIT_INTERVAL {
            self.sync();
        }
    }

    /// Everything in the log is in the snapshot-to-be: start it afresh.
    fn rotate(&mut self) {
        self.sync();
        match self.file.set_len(0) {
            Ok(()) => {
                self.len = 0;
                self.rotations += 1;
            }
            Err(e) => tracing::warn!(error = %e, "WAL truncation failed"),
        }
    }
}

/// What one checkpoint did.
#[derive(Debug, Clone, Copy, Default)]
struct CheckpointInfo {
    wal_tail_bytes: u64,
    wal_tail_records: u64,
    snapshot_bytes: u64,
    keys: usize,
}

/// The key-value store and its write-ahead log.
struct Store {
    map: RwLock<HashMap<String, (Vec<u8>, MemoryToken)>>,
    wal: Mutex<Wal>,
    wal_path: PathBuf,
    snapshot_path: PathBuf,
    snapshot_tmp: PathBuf,
}

impl Store {
    fn open(data_dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(data_dir)?;
        let wal_path = data_dir.join(WAL_NAME);
        Ok(Self {
            map: RwLock::new(&STORE_LOCK, HashMap::new()),
            wal: Mutex::new(&WAL_LOCK, Wal::open(&wal_path)?),
            wal_path,
            snapshot_path: data_dir.join(SNAPSHOT_NAME),
            snapshot_tmp: data_dir.join(SNAPSHOT_TMP_NAME),
        })
    }

    fn get(&self, key: &str) -> Option<Vec<u8>> {
        relock(self.map.read()).get(key).map(|(v, _)| v.clone())
    }

    /// Logs then applies; true if the key existed.
    fn put(&self, key: &str, value: Vec<u8>) -> bool {
        let mut record = Vec::with_capacity(key.len() + value.len() + 4);
        record.extend_from_slice(b"P ");
        record.extend_from_slice(key.as_bytes());
        record.push(b' ');
        record.extend_from_slice(&value);
        record.push(b'\n');
        relock(self.wal.lock()).append(&record);
        let accounted = MEM_VALUES.alloc((key.len() + value.len()) as u64);
        // A replaced value's token drops here: its memory is freed.
        relock(self.map.write())
            .insert(key.to_owned(), (value, accounted))
            .is_some()
    }

    /// Logs then applies; true if the key existed.
    fn delete(&self, key: &str) -> bool {
        let record = format!("D {key}\n");
        relock(self.wal.lock()).append(record.as_bytes());
        relock(self.map.write()).remove(key).is_some()
    }

    fn sync_wal_if_due(&self) {
        relock(self.wal.lock()).sync_if_due();
    }

    /// Reads the WAL tail back through a second handle, then writes the
    /// whole map to a fresh snapshot file and renames it into place.
    fn checkpoint(&self) -> io::Result<CheckpointInfo> {
        let mut info = CheckpointInfo::default();
        {
            let mut f = File::open(&WAL_FILE, &self.wal_path)?;
            let len = f.metadata()?.len();
            f.seek(SeekFrom::Start(len.saturating_sub(WAL_TAIL_BYTES)))?;
            let mut buf = vec![0u8; 16 << 10];
            loop {
                let n = match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                info.wal_tail_bytes += n as u64;
                info.wal_tail_records += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
            }
        }
        let mut image = Vec::new();
        {
            let map = relock(self.map.read());
            info.keys = map.len();
            for (k, (v, _)) in &*map {
                image.extend_from_slice(k.as_bytes());
                image.push(b' ');
                image.extend_from_slice(v);
                image.push(b'\n');
            }
        }
        let mut f = File::create(&SNAPSHOT_FILE, &self.snapshot_tmp)?;
        for chunk in image.chunks(64 << 10) {
            f.write_all(chunk)?;
        }
        f.sync_data()?;
        drop(f);
        std::fs::rename(&self.snapshot_tmp, &self.snapshot_path)?;
        info.snapshot_bytes = image.len() as u64;
        Ok(info)
    }
}

/// Request counters.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    requests: u64,
    gets: u64,
    hits: u64,
    puts: u64,
    deletes: u64,
    connections: u64,
}

/// What the hot `stats` mutex protects: counters plus a hot-key tracker
/// that is re-ranked *while the lock is held* every
/// [`HOT_KEYS_EVERY`] requests, the classic mistake that makes a stats
/// lock show up in `events_waits_summary_global_by_event_name`.
struct Stats {
    counters: Counters,
    key_hits: Vec<u64>,
    hot_keys: Vec<(u64, u64)>,
}

impl Stats {
    fn new() -> Self {
        Self {
            counters: Counters::default(),
            key_hits: vec![0; KEY_SPACE as usize],
            hot_keys: Vec::new(),
        }
    }

    fn record(&mut self, slot: u64, op: OpKind, found: bool) {
        let c = &mut self.counters;
        c.requests += 1;
        match op {
            OpKind::Get => {
                c.gets += 1;
                c.hits += u64::from(found);
            }
            OpKind::Put => c.puts += 1,
            OpKind::Delete => c.deletes += 1,
        }
        if let Some(h) = self.key_hits.get_mut(slot as usize) {
            *h += 1;
        }
        if c.requests.is_multiple_of(HOT_KEYS_EVERY) {
            self.rank_hot_keys();
        }
    }

    /// Sorts the whole key space by access count (real work, on purpose
    /// under the lock).
    fn rank_hot_keys(&mut self) {
        let mut order: Vec<u64> = (0..self.key_hits.len() as u64).collect();
        order.sort_unstable_by_key(|&k| std::cmp::Reverse(self.key_hits[k as usize]));
        self.hot_keys = order
            .iter()
            .take(HOT_KEYS)
            .map(|&k| (k, self.key_hits[k as usize]))
            .collect();
    }
}

enum Op {
    Get,
    Put(Vec<u8>),
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Get,
    Put,
    Delete,
}

struct Request {
    /// The request's buffer, accounted to the connection thread that
    /// built it and freed by the worker that serves it.
    buf: MemoryToken,
    /// Key number in `0..KEY_SPACE`.
    slot: u64,
    key: String,
    op: Op,
    reply: Arc<Reply>,
}

/// Replies of one burst: the connection waits until `pending` is 0.
struct Reply {
    state: Mutex<ReplyState>,
    ready: Condvar,
}

struct ReplyState {
    pending: usize,
    found: usize,
}

impl Reply {
    fn new(pending: usize) -> Self {
        Self {
            state: Mutex::new(&REPLY_LOCK, ReplyState { pending, found: 0 }),
            ready: Condvar::new(&REPLY_READY),
        }
    }
}

/// Everything the threads share.
struct Shared {
    store: Store,
    queue: Mutex<VecDeque<Request>>,
    not_empty: Condvar,
    stats: Mutex<Stats>,
    stop: Arc<AtomicBool>,
    conns_alive: AtomicUsize,
    next_conn: AtomicU64,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Sleeps `d` in short steps; false once stop is requested.
    fn sleep(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        loop {
            if self.stopped() {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            thread::sleep((deadline - now).min(STOP_POLL));
        }
    }

    /// Asks every thread to finish and wakes idle workers.
    fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        let _q = relock(self.queue.lock());
        self.not_empty.notify_all();
    }

    /// Serves one request as a statement with its stages; true if the key
    /// was found (GET) or existed (PUT / DELETE).
    fn serve(&self, slot: u64, key: &str, op: Op) -> bool {
        let (class, verb) = match op {
            Op::Get => (&STMT_GET, "GET"),
            Op::Put(_) => (&STMT_PUT, "PUT"),
            Op::Delete => (&STMT_DELETE, "DELETE"),
        };
        let mut stmt = class.start();
        let _rows = MEM_ROWS.alloc(256);
        STAGE_PARSING.enter();
        stmt.set_text(&format!("{verb} {key}"));
        stmt.set_digest_text(&format!("{verb} ?"));
        let valid = key.starts_with("key-");
        STAGE_OPENING.enter();
        let store = &self.store;
        STAGE_EXECUTING.enter();
        let (found, kind) = match op {
            Op::Get => {
                let v = store.get(key);
                STAGE_SENDING.enter();
                let found = v.is_some();
                stmt.set_rows_examined(1);
                stmt.set_rows_sent(u64::from(found));
                if !found {
                    stmt.add_warnings(1); // "no rows"
                }
                (found, OpKind::Get)
            }
            Op::Put(value) if value.len() > MAX_VALUE_LEN || !valid => {
                stmt.add_errors(1); // refused: value too large
                (false, OpKind::Put)
            }
            Op::Put(value) => {
                let existed = store.put(key, value);
                stmt.set_rows_affected(1);
                (existed, OpKind::Put)
            }
            Op::Delete => {
                let existed = store.delete(key);
                stmt.set_rows_affected(u64::from(existed));
                (existed, OpKind::Delete)
            }
        };
        STAGE_CLEANUP.enter();
        relock(self.stats.lock()).record(slot, kind, found);
        drop(stmt);
        found
    }
}

fn worker_loop(shared: &Shared) {
    loop {
        let next = {
            let mut q = relock(shared.queue.lock());
            loop {
                if let Some(r) = q.pop_front() {
                    break Some(r);
                }
                if shared.stopped() {
                    break None;
                }
                q = relock(shared.not_empty.wait(q));
            }
        };
        let Some(Request {
            buf,
            slot,
            key,
            op,
            reply,
        }) = next
        else {
            return;
        };
        let found = shared.serve(slot, &key, op);
        drop(buf);
        let mut st = relock(reply.state.lock());
        st.pending -= 1;
        st.found += usize::from(found);
        if st.pending == 0 {
            reply.ready.notify_one();
        }
    }
}

fn make_request(rng: &mut fastrand::Rng, reply: &Arc<Reply>) -> Request {
    let slot = rng.u64(0..=KEY_SPACE - 1);
    let op = match rng.u64(0..=99) {
        0..70 => Op::Get,
        70..95 => {
            let len = rng.u64(16..=256) as usize;
            Op::Put(make_value(rng, len))
        }
        _ => Op::Delete,
    };
    let payload = match &op {
        Op::Put(v) => v.len(),
        _ => 0,
    };
    Request {
        buf: MEM_REQUEST.alloc((64 + payload) as u64),
        slot,
        key: key_name(slot),
        op,
        reply: Arc::clone(reply),
    }
}

/// Decrements the live-connection count when a connection thread ends.
struct AliveGuard<'a>(&'a AtomicUsize);

impl Drop for AliveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One client connection: a few bursts of requests, then it goes away.
fn connection(shared: &Shared, id: u64) {
    let _alive = AliveGuard(&shared.conns_alive);
    // Who this connection serves: setup_actors decides whether it is
    // instrumented, and the threads table shows it.
    pfs_client::set_thread_actor("app", &format!("client-{}", id % 3), "");
    let mut rng = fastrand::Rng::with_seed(id);
    let bursts = rng.u64(4..=20);
    let mut answered = 0usize;
    for _ in 0..bursts {
        let n = rng.u64(8..=48) as usize;
        let reply = Arc::new(Reply::new(n));
        let batch: Vec<Request> = (0..n).map(|_| make_request(&mut rng, &reply)).collect();
        {
            let mut q = relock(shared.queue.lock());
            // Checked under the queue lock: workers only exit once stop is
            // set and the queue is empty, so a submitted burst is served.
            if shared.stopped() {
                break;
            }
            q.extend(batch);
            shared.not_empty.notify_all();
        }
        let mut st = relock(reply.state.lock());
        while st.pending > 0 {
            st = relock(reply.ready.wait(st));
        }
        answered += st.found;
        drop(st);
        thread::sleep(Duration::from_millis(rng.u64(20..=60)));
    }
    relock(shared.stats.lock()).counters.connections += 1;
    tracing::trace!(id, bursts, answered, "connection closed");
}

fn spawn_named(
    name: String,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, DemoError> {
    thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .map_err(DemoError::resource(format!("spawn thread {name}")))
}

fn spawn_connection(shared: &Arc<Shared>) {
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    shared.conns_alive.fetch_add(1, Ordering::AcqRel);
    let s = Arc::clone(shared);
    if let Err(e) = spawn_named(format!("conn-{id}"), move || connection(&s, id)) {
        shared.conns_alive.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(error = %e, "cannot start a connection");
    }
}

/// Keeps `MIN_CONNS..=MAX_CONNS` connections alive, starting one every
/// 50-200 ms.
fn spawner_loop(shared: &Arc<Shared>) {
    let mut rng = fastrand::Rng::with_seed(0x5EED);
    loop {
        while shared.conns_alive.load(Ordering::Acquire) < MIN_CONNS && !shared.stopped() {
            spawn_connection(shared);
        }
        if shared.conns_alive.load(Ordering::Acquire) < MAX_CONNS && !shared.stopped() {
            spawn_connection(shared);
        }
        if !shared.sleep(Duration::from_millis(rng.u64(50..=200))) {
            return;
        }
    }
}

fn flusher_loop(shared: &Shared) {
    while shared.sleep(FLUSH_TICK) {
        shared.store.sync_wal_if_due();
    }
    relock(shared.store.wal.lock()).sync();
}

fn checkpoint_loop(shared: &Shared) {
    while shared.sleep(CHECKPOINT_INTERVAL) {
        let stmt = STMT_CHECKPOINT.start();
        STAGE_CHECKPOINT.enter();
        let result = shared.store.checkpoint();
        drop(stmt);
        match result {
            Ok(info) => {
                let (stats, hot_keys) = {
                    let s = relock(shared.stats.lock());
                    (s.counters, s.hot_keys.clone())
                };
                let (syncs, rotations) = {
                    let wal = relock(shared.store.wal.lock());
                    (wal.syncs, wal.rotations)
                };
                tracing::debug!(
                    ?info,
                    ?stats,
                    ?hot_keys,
                    wal_syncs = syncs,
                    wal_rotations = rotations,
                    live_connections = shared.conns_alive.load(Ordering::Relaxed),
                    "checkpoint"
                );
            }
            Err(e) => tracing::warn!(error = %e, "checkpoint failed"),
        }
    }
}

fn start_threads(
    shared: &Arc<Shared>,
    workers: usize,
) -> Result<(Vec<JoinHandle<()>>, JoinHandle<()>), DemoError> {
    let mut handles = Vec::new();
    for i in 0..workers.max(1) {
        let s = Arc::clone(shared);
        handles.push(spawn_named(format!("worker-{i}"), move || worker_loop(&s))?);
    }
    let s = Arc::clone(shared);
    handles.push(spawn_named("wal-flusher".into(), move || flusher_loop(&s))?);
    let s = Arc::clone(shared);
    handles.push(spawn_named("checkpoint".into(), move || {
        checkpoint_loop(&s)
    })?);
    let s = Arc::clone(shared);
    let spawner = spawn_named("conn-spawner".into(), move || spawner_loop(&s))?;
    Ok((handles, spawner))
}

fn join(h: JoinHandle<()>) -> Result<(), DemoError> {
    let name = h.thread().name().unwrap_or("?").to_owned();
    h.join().map_err(|_| DemoError::ThreadPanicked { name })
}

/// Runs the workload until `stop` is set (by SIGTERM / SIGINT, in the real
/// process),
/// then drains connections and workers and returns the final counters.
fn run_workload(
    data_dir: &Path,
    workers: usize,
    stop: Arc<AtomicBool>,
) -> Result<Counters, DemoError> {
    let store = Store::open(data_dir).map_err(|source| DemoError::Wal {
        dir: data_dir.to_owned(),
        source,
    })?;
    let mut rng = fastrand::Rng::with_seed(0xDA7A);
    for n in 0..PRELOAD_KEYS {
        let len = rng.u64(16..=256) as usize;
        store.put(&key_name(n), make_value(&mut rng, len));
    }
    let shared = Arc::new(Shared {
        store,
        queue: Mutex::new(&QUEUE_LOCK, VecDeque::new()),
        not_empty: Condvar::new(&QUEUE_NOT_EMPTY),
        stats: Mutex::new(&STATS_LOCK, Stats::new()),
        stop,
        conns_alive: AtomicUsize::new(0),
        next_conn: AtomicU64::new(1),
    });
    let (handles, spawner) = match start_threads(&shared, workers) {
        Ok(h) => h,
        Err(e) => {
            shared.shutdown();
            return Err(e);
        }
    };
    let spawned = join(spawner);
    // Stop requested (or the spawner died): let live connections finish
    // their burst, then release the workers.
    shared.stop.store(true, Ordering::Release);
    while shared.conns_alive.load(Ordering::Acquire) > 0 {
        thread::sleep(Duration::from_millis(5));
    }
    shared.shutdown();
    let mut result = spawned;
    for h in handles {
        let r = join(h);
        if result.is_ok() {
            result = r;
        }
    }
    result?;
    let counters = relock(shared.stats.lock()).counters;
    Ok(counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_len(p: &Path) -> u64 {
        std::fs::metadata(p).unwrap().len()
    }

    #[test]
    fn put_then_get_returns_value_and_wal_grows() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let wal = dir.path().join(WAL_NAME);
        let before = file_len(&wal);
        assert!(!store.put("key-0001", b"hello".to_vec()));
        assert_eq!(store.get("key-0001").as_deref(), Some(&b"hello"[..]));
        let after_put = file_len(&wal);
        assert!(
            after_put > before,
            "WAL did not grow: {before} -> {after_put}"
        );
        assert!(store.put("key-0001", b"world".to_vec()));
        assert_eq!(store.get("key-0001").as_deref(), Some(&b"world"[..]));
        assert!(store.delete("key-0001"));
        assert_eq!(store.get("key-0001"), None);
        assert!(!store.delete("key-0001"));
        assert!(file_len(&wal) > after_put);

        store.put("key-0002", b"kept".to_vec());
        let info = store.checkpoint().unwrap();
        assert_eq!(info.wal_tail_records, 5);
        assert_eq!(info.wal_tail_bytes, file_len(&wal));
        assert_eq!(info.keys, 1);
        let snap = std::fs::read(dir.path().join(SNAPSHOT_NAME)).unwrap();
        assert_eq!(snap, b"key-0002 kept\n");
    }

    #[test]
    fn wal_rotation_truncates_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let value = vec![b'x'; 64 << 10];
        for i in 0..(WAL_MAX_BYTES / (64 << 10) + 1) {
            store.put(&key_name(i), value.clone());
        }
        let wal = relock(store.wal.lock());
        assert_eq!(wal.rotations, 1);
        assert!(wal.len < WAL_MAX_BYTES);
        assert_eq!(file_len(&dir.path().join(WAL_NAME)), wal.len);
    }

    #[test]
    fn stats_count_requests_and_rank_hot_keys() {
        let mut s = Stats::new();
        for i in 0..HOT_KEYS_EVERY {
            let slot = if i % 2 == 0 { 7 } else { 100 + i };
            s.record(slot, OpKind::Get, i % 4 == 0);
        }
        s.record(9, OpKind::Put, false);
        s.record(9, OpKind::Delete, true);
        let c = s.counters;
        assert_eq!(
            (c.requests, c.gets, c.hits, c.puts, c.deletes),
            (HOT_KEYS_EVERY + 2, HOT_KEYS_EVERY, 64, 1, 1)
        );
        assert_eq!(s.hot_keys.len(), HOT_KEYS);
        assert_eq!(s.hot_keys[0], (7, HOT_KEYS_EVERY / 2));
    }

    #[test]
    fn load_choices_are_deterministic_and_in_range() {
        let (mut a, mut b) = (fastrand::Rng::with_seed(3), fastrand::Rng::with_seed(3));
        for _ in 0..1000 {
            let x = a.u64(8..=48);
            assert_eq!(x, b.u64(8..=48));
            assert!((8..=48).contains(&x));
        }
        let value = make_value(&mut a, 64);
        assert!(value.iter().all(u8::is_ascii_lowercase));
    }

    #[test]
    fn workload_serves_requests_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopper = {
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(400));
                stop.store(true, Ordering::Release);
            })
        };
        let stats = run_workload(dir.path(), 2, stop).unwrap();
        stopper.join().unwrap();
        assert!(stats.requests > 0, "{stats:?}");
        assert_eq!(stats.gets + stats.puts + stats.deletes, stats.requests);
        assert!(stats.hits <= stats.gets);
        assert!(file_len(&dir.path().join(WAL_NAME)) > 0);
    }
}
