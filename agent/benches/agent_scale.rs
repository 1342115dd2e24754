//! Agent scale (issue 9): a synthetic segment of N threads × M instruments
//! (70 % waits, 20 % stages, 10 % statements) with every thread's summary
//! rows touched and its three history rings full, written with the real
//! writer API; then
//!
//! * `agent_scale/reader_summaries/NxM`: `pfs_shm_layout::reader::snapshot`
//!   with `ReadOptions::summaries()` (no events, rows summed by class,
//!   pages given back): the read behind `/metrics`,
//! * `agent_scale/reader_summaries_resident/NxM`: the same without giving
//!   the pages back (what releasing them costs in re-faults),
//! * `agent_scale/reader_full/NxM`: the same with every event and every
//!   thread's rows (`ReadOptions::default()`: the read behind the tables),
//! * `agent_scale/take/NxM`: `Snapshotter::take_summaries` (discovery
//!   pass, summaries snapshot, carry-forward) with nothing kept from a
//!   previous snapshot (every row read): what a first scrape pays,
//! * `agent_scale/take_incremental/NxM`: the same after 1 % of the summary
//!   rows changed (random threads and classes, written between
//!   iterations), the rows kept from the previous snapshot: what each
//!   later scrape pays,
//! * `agent_scale/take_full/NxM`: `Snapshotter::take` (tables, TRUNCATE),
//! * `agent_scale/render/NxM`: `/metrics` rendering of a cached snapshot
//!   (model aggregation + OpenMetrics encoding),
//! * `agent_scale/scrape/NxM`: a fresh summaries snapshot and its render,
//!   the whole `/metrics` request minus HTTP,
//! * `agent_tables/stream/NxM`: the by-thread waits table of a cached full
//!   snapshot written as JSON the way the API streams it, and
//!   `agent_tables/values/NxM` the previous way (`tables::build`, a
//!   `serde_json::Value` per cell, `to_json().to_string()`); both checked
//!   to give the same bytes,
//!
//! for N = 10, 100, 1 000 threads (and M = 50 at 1 000 threads, to show the
//! instrument axis). Bytes rendered are printed. Last, the real
//! `pfs-agent serve` is started against the 1 000 × 200 segment, scraped a
//! few times, and its peak RSS (`VmHWM`) read from `/proc/PID/status`; then
//! one by-thread summary table is requested and the peak read again (the
//! tables read every thread's rows: their cost is reported, not hidden).
//!
//! `PFS_BENCH_OUT=FILE` writes the non-criterion figures as JSON (used by
//! `scripts/bench`); `PFS_BENCH_QUICK=1` keeps only 10 and 1 000 threads;
//! `PFS_BENCH_NO_AGENT=1` skips the real agent (for profiling the rest);
//! `PFS_BENCH_AGENT_ONLY=1` runs only the real agent;
//! `PFS_BENCH_AGENT_BEFORE=EXE` measures another agent binary (a previous
//! commit's) on the same segment first, and says whether both answered the
//! table request with the same bytes.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, BenchmarkId, Criterion};
use pfs_agent::export::prometheus::{registry, render};
use pfs_agent::filter::Filter;
use pfs_agent::segments::SegmentSet;
use pfs_agent::snapshot::Snapshotter;
use pfs_agent::tables;
use pfs_agent::truncate::Baselines;
use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED, NONE_U32};
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_shm_layout::writer::{EventData, StatementFigures};
use pfs_shm_layout::{
    ClassKind, EventKind, Segment, SegmentConfig, SegmentWriter, TimerCalibration,
};

const TIMER: TimerCalibration = TimerCalibration::NANOSECONDS;

/// A live synthetic segment: the directory, the writer, and the file whose
/// exclusive `flock` tells the agent its process is alive.
struct Synthetic {
    dir: tempfile::TempDir,
    _lock: File,
    writer: SegmentWriter,
    /// Summary classes registered, with their kind.
    classes: Vec<(u32, EventKind)>,
    threads: Vec<u32>,
}

fn class_name(i: u32) -> (String, EventKind) {
    match i % 10 {
        0..=3 => (format!("wait/synch/mutex/bench/m{i}"), EventKind::Wait),
        4 | 5 => (format!("wait/io/file/bench/f{i}"), EventKind::Wait),
        6 => (format!("wait/synch/rwlock/bench/r{i}"), EventKind::Wait),
        7 | 8 => (format!("stage/bench/s{i}"), EventKind::Stage),
        _ => (format!("statement/bench/q{i}"), EventKind::Statement),
    }
}

fn build(threads: u32, instruments: u32) -> Synthetic {
    let dir = tempfile::Builder::new()
        .prefix("pfs-agent-scale")
        .tempdir_in(if Path::new("/dev/shm").is_dir() {
            Path::new("/dev/shm")
        } else {
            Path::new("/tmp")
        })
        .expect("temp dir");
    let path = dir.path().join(format!("bench.{}.pfs", std::process::id()));
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("create segment file");
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("flock");
    let cfg = SegmentConfig {
        service_name: "bench".into(),
        max_classes: 256,
        records_per_page: 16,
        max_pages: 64,
        ..SegmentConfig::default()
    };
    assert!(threads <= cfg.records_per_page * cfg.max_pages && instruments <= cfg.max_classes);
    let seg = Segment::create(
        file.try_clone().expect("dup"),
        &cfg,
        TIMER,
        std::process::id(),
        0,
    )
    .expect("create segment");
    let w = SegmentWriter::new(seg);
    let classes: Vec<(u32, EventKind)> = (0..instruments)
        .map(|i| {
            let (name, kind) = class_name(i);
            let k = ClassKind::from_name(&name).expect("PFS name");
            let idx = w
                .register_class(&name, k, FLAG_ENABLED | FLAG_TIMED)
                .expect("class slot");
            (idx, kind)
        })
        .collect();
    let mut records = Vec::new();
    for t in 0..threads {
        let tid = u64::from(t) + 1;
        let slot = w
            .alloc_thread(tid, 10_000 + tid, &format!("worker-{t}"))
            .expect("thread record");
        records.push(slot.index);
        let rec = w.segment().record(slot.index);
        let mut id = 0u64;
        // Two events per instrument: every summary row touched, two
        // histogram buckets each, and every history ring wrapped.
        for round in 0..2u64 {
            for &(class, kind) in &classes {
                id += 1;
                let wait_ps = (u64::from(class) + 1) * 7_919 * (round * 37 + tid % 11 + 1);
                let stmt = (kind == EventKind::Statement).then_some(StatementFigures {
                    rows_sent: id % 5,
                    rows_examined: id % 17,
                    digest: u64::from(class),
                    ..StatementFigures::default()
                });
                let e = EventData {
                    event_id: id,
                    end_event_id: id,
                    class,
                    timer_start: id * 1_000,
                    timer_end: id * 1_000 + wait_ps / 1_000,
                    timer_wait: wait_ps,
                    source: NONE_U32,
                    object_name: NONE_U32,
                    flags: EV_TIMED | EV_ENDED,
                    event_type: kind as u32,
                    thread_id: tid,
                    ..EventData::default()
                };
                rec.end_event(kind, &e, stmt.as_ref(), true, true);
                rec.summarize(class as usize, kind, true, wait_ps, 0, stmt.as_ref());
            }
        }
    }
    Synthetic {
        dir,
        _lock: file,
        writer: w,
        classes,
        threads: records,
    }
}

/// Changes 1 % of the summary rows (threads × classes): one timed event
/// each, on rows chosen at random (xorshift from `seed`).
fn change_one_percent(syn: &Synthetic, seed: &mut u64) {
    let rows = syn.threads.len() * syn.classes.len();
    for _ in 0..rows.div_ceil(100) {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let r = (*seed % rows as u64) as usize;
        let rec = syn
            .writer
            .segment()
            .record(syn.threads[r / syn.classes.len()]);
        let (class, kind) = syn.classes[r % syn.classes.len()];
        let stmt = (kind == EventKind::Statement).then_some(StatementFigures {
            rows_sent: 1,
            ..StatementFigures::default()
        });
        rec.summarize(
            class as usize,
            kind,
            true,
            1_000 + *seed % 1_000_000,
            0,
            stmt.as_ref(),
        );
    }
}

fn open_ro(dir: &Path) -> Segment {
    let path = std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "pfs"))
        .expect("segment file");
    Segment::open(File::open(path).expect("open"), false).expect("valid segment")
}

/// Rendered `/metrics` of `dir`, with its registry ready to render again
/// from the cached snapshot.
fn renderer(dir: &Path) -> prometheus_client::registry::Registry {
    let snap = Arc::new(Snapshotter::new(
        SegmentSet::new(dir, Duration::MAX),
        Duration::MAX,
    ));
    let reg = registry(snap.clone(), Default::default());
    snap.summaries(); // cache one snapshot: rendering then measures render only
    reg
}

struct Scale {
    threads: u32,
    instruments: u32,
    bytes: usize,
    segment_mib: f64,
}

fn bench_scale(c: &mut Criterion, shapes: &[(u32, u32)]) -> Vec<Scale> {
    let mut g = c.benchmark_group("agent_scale");
    g.sample_size(10);
    let built: Vec<(String, Synthetic, Duration)> = shapes
        .iter()
        .map(|&(threads, instruments)| {
            let t0 = Instant::now();
            let syn = build(threads, instruments);
            (format!("{threads}x{instruments}"), syn, t0.elapsed())
        })
        .collect();
    // The full reads first, for every shape: one allocates ~100 MiB at
    // 1 000 x 200, and once thousands of small snapshots have moved glibc's
    // heap thresholds, its trimming makes that memory re-fault on every
    // iteration (~5x slower). Measured apart from that effect.
    for (id, syn, _) in &built {
        let seg = open_ro(syn.dir.path());
        g.bench_function(BenchmarkId::new("reader_full", id), |b| {
            b.iter(|| snapshot(&seg, &ReadOptions::default()).expect("snapshot"))
        });
        let snapper = Snapshotter::new(
            SegmentSet::new(syn.dir.path(), Duration::MAX),
            Duration::ZERO,
        );
        g.bench_function(BenchmarkId::new("take_full", id), |b| {
            b.iter(|| snapper.take())
        });
    }
    let mut out = Vec::new();
    for (&(threads, instruments), (id, syn, built)) in shapes.iter().zip(&built) {
        let seg = open_ro(syn.dir.path());
        let s = snapshot(&seg, &ReadOptions::summaries()).expect("snapshot");
        assert_eq!(s.threads.len(), threads as usize);
        assert_eq!(s.live_rows.len(), instruments as usize);
        g.bench_function(BenchmarkId::new("reader_summaries", id), |b| {
            b.iter(|| snapshot(&seg, &ReadOptions::summaries()).expect("snapshot"))
        });
        let resident = ReadOptions {
            release_pages: false,
            ..ReadOptions::summaries()
        };
        g.bench_function(BenchmarkId::new("reader_summaries_resident", id), |b| {
            b.iter(|| snapshot(&seg, &resident).expect("snapshot"))
        });
        let snapper = Snapshotter::new(
            SegmentSet::new(syn.dir.path(), Duration::MAX),
            Duration::ZERO,
        );
        assert_eq!(snapper.take_summaries().segments.len(), 1);
        g.bench_function(BenchmarkId::new("take", id), |b| {
            b.iter_batched(
                || snapper.forget_kept(),
                |()| snapper.take_summaries(),
                BatchSize::PerIteration,
            )
        });
        let live_total = |s: &pfs_agent::snapshot::Snapshot| -> u64 {
            s.segments[0]
                .data
                .live_rows
                .iter()
                .map(|(_, r)| r.count)
                .sum()
        };
        let before = live_total(&snapper.take_summaries());
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        change_one_percent(syn, &mut seed);
        let after = snapper.take_summaries();
        let changed = (threads as usize * instruments as usize).div_ceil(100) as u64;
        assert_eq!(
            live_total(&after),
            before + changed,
            "incremental totals are exact"
        );
        // (A row drawn twice is read once.)
        assert!(
            after.stats.rows_read <= changed && after.stats.rows_read >= changed * 9 / 10,
            "only the changed rows are read: {} of {changed}",
            after.stats.rows_read
        );
        g.bench_function(BenchmarkId::new("take_incremental", id), |b| {
            b.iter_batched(
                || change_one_percent(syn, &mut seed),
                |()| snapper.take_summaries(),
                BatchSize::PerIteration,
            )
        });
        println!(
            "agent-scale-kept: threads={threads} instruments={instruments} kept_bytes={}",
            snapper.kept_bytes()
        );
        let reg = renderer(syn.dir.path());
        let text = render(&reg).expect("render");
        assert!(
            text.contains("pfs_events_waits_total"),
            "renders the PFS families"
        );
        g.bench_function(BenchmarkId::new("render", id), |b| {
            b.iter(|| render(&reg).expect("render"))
        });
        let fresh = Arc::new(Snapshotter::new(
            SegmentSet::new(syn.dir.path(), Duration::MAX),
            Duration::ZERO,
        ));
        let fresh_reg = registry(fresh, Default::default());
        g.bench_function(BenchmarkId::new("scrape", id), |b| {
            b.iter(|| render(&fresh_reg).expect("render"))
        });
        let segment_mib = seg.geometry().total_size as f64 / (1024.0 * 1024.0);
        println!(
            "agent-scale-shape: threads={threads} instruments={instruments} bytes_rendered={} segment_mib={segment_mib:.1} build_ms={:.0}",
            text.len(),
            built.as_secs_f64() * 1e3
        );
        out.push(Scale {
            threads,
            instruments,
            bytes: text.len(),
            segment_mib,
        });
    }
    g.finish();
    // One by-thread table from a cached full snapshot: written as the API
    // streams it (rows serialised one at a time into a reused buffer), and
    // the previous way (a `Value` per cell, an object per row, the text).
    let mut g = c.benchmark_group("agent_tables");
    g.sample_size(10);
    let name = tables::lookup("events_waits_summary_by_thread_by_event_name").expect("table");
    for (id, syn, _) in &built {
        let snapper = Snapshotter::new(
            SegmentSet::new(syn.dir.path(), Duration::MAX),
            Duration::MAX,
        );
        let snap = snapper.get();
        let (f, b) = (Filter::default(), Baselines::default());
        let mut buf = Vec::new();
        tables::write_json(name, &snap, &f, &b, &mut buf).expect("write");
        let old = tables::build(name, &snap, &f, &b);
        assert!(buf == old.to_json().to_string().into_bytes(), "same JSON");
        drop(old);
        g.bench_function(BenchmarkId::new("stream", id), |bch| {
            bch.iter(|| {
                buf.clear();
                tables::write_json(name, &snap, &f, &b, &mut buf).expect("write")
            })
        });
        g.bench_function(BenchmarkId::new("values", id), |bch| {
            bch.iter(|| {
                tables::build(name, &snap, &f, &b)
                    .to_json()
                    .to_string()
                    .len()
            })
        });
    }
    g.finish();
    out
}

/// A response: status, body length (de-chunked), a hash of the body.
struct Got {
    code: u16,
    len: usize,
    hash: u64,
}

fn http_get(addr: &str, path: &str) -> std::io::Result<Got> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(buf.len(), |p| p + 4);
    let head = String::from_utf8_lossy(&buf[..split]).to_ascii_lowercase();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(&buf[split..])
    } else {
        buf[split..].to_vec()
    };
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    Ok(Got {
        code,
        len: body.len(),
        hash: h.finish(),
    })
}

/// The body of a `Transfer-Encoding: chunked` message.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&b[..eol])
            .ok()
            .and_then(|l| usize::from_str_radix(l.split(';').next()?.trim(), 16).ok())
            .unwrap_or(0);
        b = &b[eol + 2..];
        if size == 0 || b.len() < size {
            break;
        }
        out.extend_from_slice(&b[..size]);
        b = b.get(size + 2..).unwrap_or_default();
    }
    out
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

struct Rss {
    hwm_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    shmem_kib: u64,
    scrape_ms: f64,
    /// `VmHWM` after one `events_waits_summary_by_thread_by_event_name`
    /// request (a full snapshot: every thread's rows), and that request's
    /// time, body size and body hash (to compare two agents' answers).
    table_hwm_kib: u64,
    table_ms: f64,
    table_bytes: usize,
    table_hash: u64,
    /// `VmRSS`, `RssAnon` and `RssShmem` right after the table request.
    table_rss_kib: u64,
    table_anon_kib: u64,
    table_shmem_kib: u64,
    /// `VmRSS` 12 s later, scrapes going on (the agent drops a full
    /// snapshot unused for 10 s).
    later_rss_kib: u64,
    later_anon_kib: u64,
    later_shmem_kib: u64,
}

/// Peak RSS of the agent `exe` serving the segments in `dir`.
fn agent_rss(exe: &Path, dir: &Path) -> Option<Rss> {
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(exe)
        .args(["serve", "--shm-dir"])
        .arg(dir)
        .args(["--listen", &addr])
        .env("PFS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut up = false;
    while Instant::now() < deadline {
        if http_get(&addr, "/healthz").is_ok_and(|g| g.code == 200) {
            up = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut result = None;
    if up {
        let mut times = Vec::new();
        for _ in 0..5 {
            // Past the agent's 250 ms cache: every scrape takes a snapshot.
            std::thread::sleep(Duration::from_millis(300));
            let t = Instant::now();
            match http_get(&addr, "/metrics") {
                Ok(g) if g.code == 200 => times.push(t.elapsed().as_secs_f64() * 1e3),
                _ => break,
            }
        }
        times.sort_by(f64::total_cmp);
        if times.len() == 5 {
            let mut r = Rss {
                hwm_kib: status_kib(pid, "VmHWM:").unwrap_or(0),
                anon_kib: status_kib(pid, "RssAnon:").unwrap_or(0),
                file_kib: status_kib(pid, "RssFile:").unwrap_or(0),
                shmem_kib: status_kib(pid, "RssShmem:").unwrap_or(0),
                scrape_ms: times[2],
                table_hwm_kib: 0,
                table_ms: 0.0,
                table_bytes: 0,
                table_hash: 0,
                table_rss_kib: 0,
                table_anon_kib: 0,
                table_shmem_kib: 0,
                later_rss_kib: 0,
                later_anon_kib: 0,
                later_shmem_kib: 0,
            };
            let t = Instant::now();
            if let Ok(g) = http_get(
                &addr,
                "/api/v1/tables/events_waits_summary_by_thread_by_event_name",
            ) && g.code == 200
            {
                r.table_ms = t.elapsed().as_secs_f64() * 1e3;
                r.table_bytes = g.len;
                r.table_hash = g.hash;
                r.table_hwm_kib = status_kib(pid, "VmHWM:").unwrap_or(0);
                r.table_rss_kib = status_kib(pid, "VmRSS:").unwrap_or(0);
                r.table_anon_kib = status_kib(pid, "RssAnon:").unwrap_or(0);
                r.table_shmem_kib = status_kib(pid, "RssShmem:").unwrap_or(0);
                for _ in 0..12 {
                    std::thread::sleep(Duration::from_secs(1));
                    let _ = http_get(&addr, "/metrics");
                }
                r.later_rss_kib = status_kib(pid, "VmRSS:").unwrap_or(0);
                r.later_anon_kib = status_kib(pid, "RssAnon:").unwrap_or(0);
                r.later_shmem_kib = status_kib(pid, "RssShmem:").unwrap_or(0);
            }
            result = Some(r);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    result
}

fn rss_line(label: &str, r: &Rss) -> String {
    format!(
        "{label}: threads=1000 instruments=200 vmhwm_kib={} rss_anon_kib={} rss_file_kib={} rss_shmem_kib={} scrape_ms={:.1} table_vmhwm_kib={} table_ms={:.0} table_bytes={} table_rss_kib={} table_anon_kib={} table_shmem_kib={} later_rss_kib={} later_anon_kib={} later_shmem_kib={}",
        r.hwm_kib,
        r.anon_kib,
        r.file_kib,
        r.shmem_kib,
        r.scrape_ms,
        r.table_hwm_kib,
        r.table_ms,
        r.table_bytes,
        r.table_rss_kib,
        r.table_anon_kib,
        r.table_shmem_kib,
        r.later_rss_kib,
        r.later_anon_kib,
        r.later_shmem_kib
    )
}

fn rss_json(r: &Rss) -> String {
    format!(
        "{{\"vmhwm_kib\":{},\"rss_anon_kib\":{},\"rss_file_kib\":{},\"rss_shmem_kib\":{},\"scrape_ms\":{:.2},\"table_vmhwm_kib\":{},\"table_ms\":{:.1},\"table_bytes\":{},\"table_rss_kib\":{},\"table_anon_kib\":{},\"table_shmem_kib\":{},\"later_rss_kib\":{},\"later_anon_kib\":{},\"later_shmem_kib\":{}}}",
        r.hwm_kib,
        r.anon_kib,
        r.file_kib,
        r.shmem_kib,
        r.scrape_ms,
        r.table_hwm_kib,
        r.table_ms,
        r.table_bytes,
        r.table_rss_kib,
        r.table_anon_kib,
        r.table_shmem_kib,
        r.later_rss_kib,
        r.later_anon_kib,
        r.later_shmem_kib
    )
}

fn main() {
    let quick = std::env::var_os("PFS_BENCH_QUICK").is_some_and(|v| v != "0");
    let shapes: &[(u32, u32)] = if quick {
        &[(10, 200), (1000, 200)]
    } else {
        &[(10, 200), (100, 200), (1000, 200), (1000, 50)]
    };
    let agent_only = std::env::var_os("PFS_BENCH_AGENT_ONLY").is_some_and(|v| v != "0");
    let mut c = Criterion::default().configure_from_args();
    let scales = if agent_only {
        Vec::new()
    } else {
        bench_scale(&mut c, shapes)
    };
    c.final_summary();
    // `cargo test --benches` runs this binary in test mode: skip the agent.
    let testing = std::env::args().any(|a| a == "--test" || a == "--list")
        || std::env::var_os("PFS_BENCH_NO_AGENT").is_some_and(|v| v != "0");
    let (rss, before) = if testing {
        (None, None)
    } else {
        let syn = build(1000, 200);
        // `PFS_BENCH_AGENT_BEFORE=EXE`: another agent binary (e.g. the
        // previous commit's) measured on the same segment just before.
        let before = std::env::var_os("PFS_BENCH_AGENT_BEFORE")
            .and_then(|exe| agent_rss(Path::new(&exe), syn.dir.path()));
        let exe = Path::new(env!("CARGO_BIN_EXE_pfs-agent"));
        (agent_rss(exe, syn.dir.path()), before)
    };
    if let Some(b) = &before {
        println!("{}", rss_line("agent-rss-before", b));
    }
    match &rss {
        Some(r) => println!("{}", rss_line("agent-rss", r)),
        None if !testing => println!("agent-rss: unavailable (agent did not serve)"),
        None => {}
    }
    if let (Some(b), Some(r)) = (&before, &rss) {
        println!(
            "agent-rss-table-identical: {}",
            if b.table_hash == r.table_hash && b.table_bytes == r.table_bytes {
                "yes"
            } else {
                "NO"
            }
        );
    }
    if let Some(out) = std::env::var_os("PFS_BENCH_OUT") {
        let shapes: Vec<String> = scales
            .iter()
            .map(|s| {
                format!(
                    "{{\"threads\":{},\"instruments\":{},\"bytes_rendered\":{},\"segment_mib\":{:.1}}}",
                    s.threads, s.instruments, s.bytes, s.segment_mib
                )
            })
            .collect();
        let rss = rss.as_ref().map_or("null".to_string(), rss_json);
        let before = before.as_ref().map_or("null".to_string(), rss_json);
        let json = format!(
            "{{\"shapes\":[{}],\"agent_rss\":{rss},\"agent_rss_before\":{before}}}\n",
            shapes.join(",")
        );
        std::fs::write(out, json).expect("write PFS_BENCH_OUT");
    }
}
