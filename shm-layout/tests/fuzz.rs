//! Fuzz harness (proptest) over the segment validator and every read path
//! the agent uses: `Segment::open`, `reader::snapshot` (with and without
//! events), `setup::read_actors`, the setup writers on a writable mapping,
//! and `Segment::check`.
//!
//! Each case starts from a real, populated segment made with this crate's
//! writer API (classes of every kind, strings, threads with current and
//! history events, statements with text, memory rows, actors, exited
//! threads folded into the global rows, `history_long` rings), applies
//! 1 to 8 mutations biased toward the fields that steer the reader (header,
//! section directory, container header, page directory, lock words, string
//! and name lengths, ring counters), optionally truncates or extends the
//! file before the open, optionally truncates it while mapped, and reads.
//! The property: no panic, termination (a watchdog aborts a case stuck for
//! minutes), and results bounded by the file.
//!
//! `PFS_FUZZ_CASES` sets the number of cases (default 1500, a few seconds
//! in a debug build). The counts of executions, accepted and rejected
//! files are printed (`cargo test -p pfs-shm-layout --test fuzz --
//! --nocapture`).

use std::collections::BTreeMap;
use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use pfs_shm_layout::layout::*;
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_shm_layout::writer::{EventData, StatementFigures};
use pfs_shm_layout::{
    ClassKind, Geometry, Segment, SegmentConfig, SegmentError, SegmentWriter, TimerCalibration,
    setup,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const TIMER: TimerCalibration = TimerCalibration {
    kind: 1,
    base_ticks: 100,
    ps_per_tick_q32: 300 << 32,
    frequency_hz: 3_000_000_000,
    base_ns: 5,
};

/// A valid segment's bytes and geometry.
struct Base {
    bytes: Vec<u8>,
    geom: Geometry,
}

fn memfd(name: &str) -> File {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC).expect("memfd_create");
    File::from(fd)
}

fn ev(class: u32, id: u64, kind: EventType) -> EventData {
    EventData {
        event_id: id,
        end_event_id: id + 1,
        class,
        timer_start: 1000 + id,
        timer_end: 2000 + id,
        timer_wait: 1000 * id,
        source: 0,
        object_name: 1,
        flags: EV_TIMED | EV_ENDED | EV_HAS_BYTES,
        event_type: kind as u32,
        nesting_event_id: id.saturating_sub(1),
        ..Default::default()
    }
}

/// Builds a segment with content in every section.
fn build(cfg: SegmentConfig) -> Base {
    let f = memfd("pfs-fuzz-base");
    let seg = Segment::create(f.try_clone().unwrap(), &cfg, TIMER, 42, 7).unwrap();
    let w = SegmentWriter::new(seg);
    let flags = FLAG_ENABLED | FLAG_TIMED;
    let mutex = w
        .register_class("wait/synch/mutex/fuzz/m", ClassKind::Mutex, flags)
        .unwrap();
    let stage = w
        .register_class("stage/fuzz/s", ClassKind::Stage, flags)
        .unwrap();
    let stmt = w
        .register_class("statement/fuzz/select", ClassKind::Statement, flags)
        .unwrap();
    let mem = w
        .register_class("memory/fuzz/buf", ClassKind::Memory, flags)
        .unwrap();
    w.intern("src/fuzz.rs:1").unwrap();
    w.intern("object").unwrap();
    w.intern("alice").unwrap();
    setup::set_actor(w.segment(), "%", "alice", "%", Some((true, true)));
    setup::set_consumers(w.segment(), "%", true);
    let figures = StatementFigures {
        errors: 1,
        rows_sent: 5,
        digest: 99,
        ..Default::default()
    };
    let mut slots = Vec::new();
    for t in 0..3u64 {
        let slot = w.alloc_thread(t + 1, 100 + t, "fuzz-thread").unwrap();
        let rec = w.segment().record(slot.index);
        rec.set_actor(2, 1, NONE_U32, THREAD_INSTRUMENTED | THREAD_HISTORY);
        for i in 0..6 {
            let id = t * 100 + i * 3 + 1;
            let e = ev(mutex, id, EventType::Wait);
            rec.end_event(0, &e, None, true, true);
            rec.summarize(mutex as usize, true, e.timer_wait, 8, None);
            w.append_long(0, &e, None);
            let s = ev(stage, id + 1, EventType::Stage);
            rec.begin_event(1, &s);
            rec.end_event(1, &s, None, true, true);
            rec.summarize(stage as usize, true, s.timer_wait, 0, None);
            w.append_long(1, &s, None);
            let q = ev(stmt, id + 2, EventType::Statement);
            rec.begin_event(2, &q);
            rec.set_statement_text("SELECT * FROM fuzz WHERE id = 1");
            rec.end_event(2, &q, Some(&figures), true, true);
            rec.summarize(stmt as usize, true, q.timer_wait, 0, Some(&figures));
            w.append_long(2, &q, Some((&figures, &rec.header.statements_current)));
            rec.memory_alloc(mem as usize, 64 * (i + 1), 0);
            if i % 2 == 0 {
                rec.memory_free(mem as usize, 64, 0);
            }
        }
        slots.push(slot);
    }
    // One exited thread: its rows are in the global section and the fold log.
    w.fold_and_free(slots.remove(0));
    let geom = *w.segment().geometry();
    let mut bytes = vec![0u8; geom.total_size];
    f.read_exact_at(&mut bytes, 0).unwrap();
    // The base itself must read back.
    let check = memfd("pfs-fuzz-check");
    check.write_all_at(&bytes, 0).unwrap();
    let seg = Segment::open(check, false).unwrap();
    let s = snapshot(&seg, &ReadOptions::default()).unwrap();
    assert_eq!(s.threads.len(), 2, "base segment has two live threads");
    assert!(!s.exited.is_empty(), "base segment has folded rows");
    assert!(s.long.iter().all(|l| !l.is_empty()));
    Base { bytes, geom }
}

fn bases() -> &'static [Base] {
    static B: OnceLock<Vec<Base>> = OnceLock::new();
    B.get_or_init(|| {
        vec![
            build(SegmentConfig {
                service_name: "fuzz-small".into(),
                history_len: 4,
                max_classes: 8,
                max_strings: 16,
                records_per_page: 2,
                max_pages: 3,
                history_long_len: 8,
            }),
            build(SegmentConfig {
                service_name: "fuzz-wide".into(),
                history_len: 3,
                max_classes: 70, // the touched bitmap spans two words
                max_strings: 64,
                records_per_page: 1,
                max_pages: 5,
                history_long_len: 5,
            }),
        ]
    })
}

/// Where a mutation lands; resolved against the base's geometry.
#[derive(Debug, Clone, Copy)]
enum Target {
    Header,
    SectionDirectory,
    ContainerHeader,
    PageDirectory,
    RecordLock,
    RecordHeader,
    StringLength,
    ClassEntry,
    GlobalHeader,
    LongHeader,
    Anywhere,
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Store `value` (4 or 8 bytes, little-endian) at an aligned offset.
    Word {
        target: Target,
        pick: u64,
        value: u64,
        wide: bool,
    },
    /// Overwrite a run of bytes.
    Bytes { pick: u64, bytes: Vec<u8> },
}

#[derive(Debug, Clone)]
struct Case {
    base: usize,
    mutations: Vec<Mutation>,
    /// Resize before opening: `None`, or a length as a fraction (of
    /// 2^32) of twice the file.
    resize: Option<u32>,
    /// Truncate to this fraction of the file while it is mapped.
    shrink_mapped: Option<u32>,
    writable: bool,
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        3 => Just(Target::Header),
        4 => Just(Target::SectionDirectory),
        3 => Just(Target::ContainerHeader),
        2 => Just(Target::PageDirectory),
        3 => Just(Target::RecordLock),
        2 => Just(Target::RecordHeader),
        2 => Just(Target::StringLength),
        2 => Just(Target::ClassEntry),
        2 => Just(Target::GlobalHeader),
        2 => Just(Target::LongHeader),
        2 => Just(Target::Anywhere),
    ]
}

fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(3),
        Just(u64::MAX),
        Just(u64::from(u32::MAX)),
        Just(1 << 31),
        Just(1 << 32),
        Just(1 << 63),
        Just(PAGE as u64),
        Just(PAGE as u64 - 1),
        0u64..70_000,
        any::<u64>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => (target(), any::<u64>(), value(), any::<bool>()).prop_map(|(target, pick, value, wide)| {
            Mutation::Word { target, pick, value, wide }
        }),
        1 => (any::<u64>(), proptest::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(pick, bytes)| Mutation::Bytes { pick, bytes }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..bases().len(),
        proptest::collection::vec(mutation(), 0..8),
        proptest::option::weighted(0.1, any::<u32>()),
        proptest::option::weighted(0.1, any::<u32>()),
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(base, mutations, resize, shrink_mapped, writable)| Case {
            base,
            mutations,
            resize,
            shrink_mapped,
            writable,
        })
}

/// The absolute offset of a mutation.
fn resolve(g: &Geometry, target: Target, pick: u64, len: usize) -> usize {
    let n = |m: usize| (pick % m.max(1) as u64) as usize;
    let rec = |i: usize| g.record_off((i % g.max_records() as usize) as u32);
    match target {
        Target::Header => n(0x300),
        Target::SectionDirectory => 0x100 + n(MAX_SECTIONS) * 32 + [0, 8, 16, 24, 28][n(5)],
        Target::ContainerHeader => g.threads_off + n(size_of::<ContainerHeader>()),
        Target::PageDirectory => {
            g.threads_off + size_of::<ContainerHeader>() + n(g.max_pages as usize) * 8
        }
        Target::RecordLock => rec(n(usize::MAX)) + offset_of!(ThreadHeader, lock),
        Target::RecordHeader => rec(n(usize::MAX)) + n(size_of::<ThreadHeader>()),
        Target::StringLength => {
            g.strings_off
                + n(g.max_strings as usize) * size_of::<StringEntry>()
                + [offset_of!(StringEntry, state), offset_of!(StringEntry, len)][n(2)]
        }
        Target::ClassEntry => {
            g.classes_off
                + n(g.max_classes as usize) * size_of::<ClassEntry>()
                + n(offset_of!(ClassEntry, name) + 8)
        }
        Target::GlobalHeader => g.global_off + n(size_of::<GlobalHeader>()),
        Target::LongHeader => g.long_off[n(3)] + n(size_of::<LongHeader>()),
        Target::Anywhere => n(len),
    }
}

fn apply(bytes: &mut [u8], g: &Geometry, m: &Mutation) {
    let len = bytes.len();
    match m {
        Mutation::Word {
            target,
            pick,
            value,
            wide,
        } => {
            let w = if *wide { 8 } else { 4 };
            let off = resolve(g, *target, *pick, len) / w * w;
            if off + w <= len {
                bytes[off..off + w].copy_from_slice(&value.to_le_bytes()[..w]);
            }
        }
        Mutation::Bytes { pick, bytes: b } => {
            let off = (*pick % len as u64) as usize;
            let end = (off + b.len()).min(len);
            bytes[off..end].copy_from_slice(&b[..end - off]);
        }
    }
}

/// `f / 2^32` of `of`.
fn frac(f: u32, of: usize) -> u64 {
    ((of as u128 * u128::from(f)) >> 32) as u64
}

#[derive(Default)]
struct Tally {
    executions: AtomicU64,
    accepted: AtomicU64,
    snapshots_ok: AtomicU64,
    snapshots_err: AtomicU64,
    shrunk_mapped: AtomicU64,
    rejected: Mutex<BTreeMap<&'static str, u64>>,
}

fn kind(e: &SegmentError) -> &'static str {
    match e {
        SegmentError::Truncated { .. } => "truncated",
        SegmentError::BadMagic(_) => "bad_magic",
        SegmentError::ByteOrder(_) => "byte_order",
        SegmentError::UnsupportedVersion { .. } => "unsupported_version",
        SegmentError::NotReady => "not_ready",
        SegmentError::Corrupt(_) => "corrupt",
        SegmentError::Shrunk { .. } => "shrunk",
        SegmentError::Unreadable => "unreadable",
        _ => "other",
    }
}

/// Runs one case; panics (the property fails) on any violation.
fn run(c: &Case, tally: &Tally) {
    let base = &bases()[c.base];
    let g = &base.geom;
    let mut bytes = base.bytes.clone();
    for m in &c.mutations {
        apply(&mut bytes, g, m);
    }
    let f = memfd("pfs-fuzz-case");
    f.write_all_at(&bytes, 0).unwrap();
    if let Some(r) = c.resize {
        f.set_len(frac(r, 2 * bytes.len())).unwrap();
    }
    let file_len = f.metadata().unwrap().len();
    tally.executions.fetch_add(1, Ordering::Relaxed);
    let seg = match Segment::open(f.try_clone().unwrap(), c.writable) {
        Ok(s) => s,
        Err(e) => {
            *tally.rejected.lock().unwrap().entry(kind(&e)).or_default() += 1;
            let _ = e.to_string();
            return;
        }
    };
    tally.accepted.fetch_add(1, Ordering::Relaxed);
    let sg = *seg.geometry();
    assert!(
        sg.total_size as u64 <= file_len,
        "accepted geometry {} exceeds the file {file_len}",
        sg.total_size
    );
    assert!(sg.max_classes <= MAX_CLASSES_LIMIT && sg.history_len <= 1024);
    if let Some(s) = c.shrink_mapped {
        f.set_len(frac(s, file_len as usize)).unwrap();
        tally.shrunk_mapped.fetch_add(1, Ordering::Relaxed);
    }
    for events in [true, false] {
        match snapshot(
            &seg,
            &ReadOptions {
                events,
                ..Default::default()
            },
        ) {
            Ok(s) => {
                tally.snapshots_ok.fetch_add(1, Ordering::Relaxed);
                // Results are bounded by what the file can hold.
                assert!(s.threads.len() as u64 <= u64::from(sg.max_records()));
                assert!(s.classes.len() <= sg.max_classes as usize);
                assert!(s.strings.len() <= sg.max_strings as usize);
                assert!(s.exited.len() + s.exited_memory.len() <= sg.max_classes as usize);
                assert!(s.long.iter().all(|l| l.len() <= sg.long_len as usize));
                for t in &s.threads {
                    assert!(t.waits_history.len() <= sg.history_len as usize);
                    assert!(t.rows.len() + t.memory.len() <= sg.max_classes as usize);
                }
            }
            Err(e) => {
                tally.snapshots_err.fetch_add(1, Ordering::Relaxed);
                let _ = e.to_string();
            }
        }
    }
    let _ = setup::read_actors(&seg);
    if c.writable {
        setup::set_instruments(&seg, "%", Some(true), Some(false));
        setup::set_consumers(&seg, "events_%", true);
        setup::set_timers(&seg, "%", TimerId::Nanosecond);
        setup::set_actor(&seg, "h", "u", "r", Some((true, false)));
        setup::set_actor(&seg, "%", "alice", "%", None);
    }
    let shrunk = c
        .shrink_mapped
        .is_some_and(|s| frac(s, file_len as usize) < sg.total_size as u64);
    match seg.check() {
        Ok(()) => assert!(!shrunk, "a segment truncated while mapped passed check()"),
        Err(e) => assert!(
            shrunk,
            "check() failed on a file that was not shrunk: {e} ({c:?})"
        ),
    }
}

#[test]
fn fuzz_validator_and_reader() {
    let cases: u32 = std::env::var("PFS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let _ = bases();
    let tally = Arc::new(Tally::default());
    // Termination: a case that runs for minutes is a hang, not slowness.
    let started = Arc::new(AtomicU64::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t0 = Instant::now();
    {
        let (started, done) = (started.clone(), done.clone());
        std::thread::spawn(move || {
            let mut last = (0, Instant::now());
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let n = started.load(Ordering::Relaxed);
                if n != last.0 {
                    last = (n, Instant::now());
                } else if last.1.elapsed() > Duration::from_secs(120) {
                    eprintln!("fuzz: case {n} has not terminated after 120 s");
                    std::process::abort();
                }
            }
        });
    }
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let t = tally.clone();
    let result = runner.run(&case(), move |c| {
        started.fetch_add(1, Ordering::Relaxed);
        run(&c, &t);
        Ok(())
    });
    done.store(true, Ordering::Relaxed);
    let rejected = tally.rejected.lock().unwrap().clone();
    let rejected_total: u64 = rejected.values().sum();
    println!(
        "fuzz: {} executions in {:.1?}: {} accepted ({} snapshots ok, {} failed cleanly, {} truncated while mapped), {} rejected {:?}",
        tally.executions.load(Ordering::Relaxed),
        t0.elapsed(),
        tally.accepted.load(Ordering::Relaxed),
        tally.snapshots_ok.load(Ordering::Relaxed),
        tally.snapshots_err.load(Ordering::Relaxed),
        tally.shrunk_mapped.load(Ordering::Relaxed),
        rejected_total,
        rejected,
    );
    if let Err(e) = result {
        panic!("fuzz case failed: {e}");
    }
    // The harness exercised both outcomes (a harness that only ever
    // rejects, or only accepts, tests nothing).
    assert!(tally.accepted.load(Ordering::Relaxed) > 0);
    assert!(rejected_total > 0);
}
