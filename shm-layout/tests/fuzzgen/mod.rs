//! Shared fuzz input generator: real populated segments built with the
//! layout's writer API, and proptest strategies for mutating them. Used by
//! `shm-layout/tests/fuzz.rs` and `agent/tests/fuzz_agent.rs`.

#![allow(dead_code)]

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use pfs_shm_layout::layout::*;
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_shm_layout::writer::{EventData, StatementFigures};
use pfs_shm_layout::{
    ClassKind, EventKind, Geometry, Segment, SegmentConfig, SegmentWriter, TimerCalibration, setup,
};
use proptest::prelude::*;

const TIMER: TimerCalibration = TimerCalibration {
    kind: TimerSource::Tsc,
    base_ticks: 100,
    ps_per_tick_q32: 300 << 32,
    frequency_hz: 3_000_000_000,
    base_ns: 5,
};

/// A valid segment's bytes and geometry.
pub struct Base {
    /// The file contents.
    pub bytes: Vec<u8>,
    /// Its geometry.
    pub geom: Geometry,
}

pub fn memfd(name: &str) -> File {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC).expect("memfd_create");
    File::from(fd)
}

fn ev(class: u32, id: u64, kind: EventKind) -> EventData {
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
    setup::set_actor(
        w.segment(),
        "%",
        "alice",
        "%",
        Some((Some(true), Some(true))),
    )
    .expect("room for an actor");
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
            let e = ev(mutex, id, EventKind::Wait);
            rec.end_event(EventKind::Wait, &e, None, true, true);
            rec.summarize(mutex as usize, EventKind::Wait, true, e.timer_wait, 8, None);
            w.append_long(EventKind::Wait, &e, None);
            let s = ev(stage, id + 1, EventKind::Stage);
            rec.begin_event(EventKind::Stage, &s);
            rec.end_event(EventKind::Stage, &s, None, true, true);
            rec.summarize(
                stage as usize,
                EventKind::Stage,
                true,
                s.timer_wait,
                0,
                None,
            );
            w.append_long(EventKind::Stage, &s, None);
            let q = ev(stmt, id + 2, EventKind::Statement);
            rec.begin_event(EventKind::Statement, &q);
            rec.set_statement_text("SELECT * FROM fuzz WHERE id = 1");
            rec.end_event(EventKind::Statement, &q, Some(&figures), true, true);
            rec.summarize(
                stmt as usize,
                EventKind::Statement,
                true,
                q.timer_wait,
                0,
                Some(&figures),
            );
            w.append_long(
                EventKind::Statement,
                &q,
                Some((&figures, &rec.header.statements_current)),
            );
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

pub fn bases() -> &'static [Base] {
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
                task_slots: 4,
            }),
            build(SegmentConfig {
                service_name: "fuzz-wide".into(),
                history_len: 3,
                max_classes: 70, // the touched bitmap spans two words
                max_strings: 64,
                records_per_page: 1,
                max_pages: 5,
                history_long_len: 5,
                task_slots: 4,
            }),
        ]
    })
}

/// Where a mutation lands; resolved against the base's geometry.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    Header,
    SectionDirectory,
    ContainerHeader,
    PageDirectory,
    RecordLock,
    RecordHeader,
    RecordEvents,
    RecordRows,
    GlobalRows,
    StringLength,
    ClassEntry,
    GlobalHeader,
    LongHeader,
    Anywhere,
}

#[derive(Debug, Clone)]
pub enum Mutation {
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
pub struct Case {
    pub base: usize,
    pub mutations: Vec<Mutation>,
    /// Resize before opening: `None`, or a length as a fraction (of
    /// 2^32) of twice the file.
    pub resize: Option<u32>,
    /// Truncate to this fraction of the file while it is mapped.
    pub shrink_mapped: Option<u32>,
    pub writable: bool,
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        3 => Just(Target::Header),
        4 => Just(Target::SectionDirectory),
        3 => Just(Target::ContainerHeader),
        2 => Just(Target::PageDirectory),
        3 => Just(Target::RecordLock),
        2 => Just(Target::RecordHeader),
        2 => Just(Target::RecordEvents),
        2 => Just(Target::RecordRows),
        2 => Just(Target::GlobalRows),
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

pub fn case() -> impl Strategy<Value = Case> {
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
        Target::RecordEvents => {
            let i = n(usize::MAX) % g.max_records() as usize;
            g.record_body_off(i as u32) + n(rows_offset(g.history_len))
        }
        Target::RecordRows => {
            let i = (n(usize::MAX) % g.max_records() as usize) as u32;
            // The rows and their sequence array.
            if n(2) == 0 {
                g.record_off(i) + ROW_SEQS_OFFSET + n(g.max_classes as usize * 8)
            } else {
                g.record_body_off(i)
                    + rows_offset(g.history_len)
                    + n(g.max_classes as usize * size_of::<SummaryRow>())
            }
        }
        Target::GlobalRows => {
            g.global_off + GLOBAL_ROWS_OFFSET + n(g.max_classes as usize * size_of::<SummaryRow>())
        }
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

pub fn apply(bytes: &mut [u8], g: &Geometry, m: &Mutation) {
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
pub fn frac(f: u32, of: usize) -> u64 {
    ((of as u128 * u128::from(f)) >> 32) as u64
}

/// The mutated bytes of `c` in a new memfd (resized as the case says).
pub fn case_file(c: &Case) -> File {
    let base = &bases()[c.base];
    let mut bytes = base.bytes.clone();
    for m in &c.mutations {
        apply(&mut bytes, &base.geom, m);
    }
    let f = memfd("pfs-fuzz-case");
    f.write_all_at(&bytes, 0).unwrap();
    if let Some(r) = c.resize {
        f.set_len(frac(r, 2 * bytes.len())).unwrap();
    }
    f
}
