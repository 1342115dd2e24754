//! # pfs-shm-layout: the segment format and its lock-free protocol
//!
//! One instrumented process owns one **segment**: a file (normally on
//! tmpfs) mapped shared by the process and read by `pfs-agent`. This crate
//! is the only contract between the two; this page is its specification,
//! precise enough to write a reader in another language. The structures in
//! [`layout`] are the same tables in Rust, with every size and offset
//! checked at compile time.
//!
//! Layout version **3.0** ([`layout::LAYOUT_MAJOR`].[`layout::LAYOUT_MINOR`]).
//! All integers are little-endian (the header's byte-order mark says so).
//! Every field is an aligned 32- or 64-bit word, read and written with
//! atomic instructions only.
//!
//! ## The file
//!
//! ```text
//!  offset 0       ┌──────────────────────────────────────────────┐
//!                 │ Header (4096 B): magic, versions, sizes,     │
//!                 │ pid, start time, service, timer calibration, │
//!                 │ section directory at 0x100                   │
//!  0x1000         ├──────────────────────────────────────────────┤
//!                 │ Counters: 16 × u64 lost counters             │
//!  0x2000         ├──────────────────────────────────────────────┤
//!                 │ Classes: max_classes × 128 B                 │  setup_instruments
//!                 ├──────────────────────────────────────────────┤
//!                 │ Strings: max_strings × 64 B                  │  SOURCE, OBJECT_NAME
//!                 ├──────────────────────────────────────────────┤
//!                 │ Global: seq, fold_count, fold log (256),     │  exited threads'
//!                 │         max_classes × SummaryRow (384 B)     │  totals
//!                 ├──────────────────────────────────────────────┤
//!                 │ Setup (8192 B): consumers, timers, actors    │  written by the agent
//!                 ├──────────────────────────────────────────────┤
//!                 │ Threads: ContainerHeader (64 B)              │
//!                 │          page directory: max_pages × u64     │
//!                 │          page 0 │ page 1 │ ... (holes until  │
//!                 │          added; each page_size bytes)        │
//!                 ├──────────────────────────────────────────────┤
//!                 │ WaitsLong: LongHeader + len × Event (128 B)  │  history_long rings,
//!                 │ StagesLong: LongHeader + len × Event         │  holes until first
//!                 │ StatementsLong: LongHeader + len × Stmt(384) │  used
//!                 └──────────────────────────────────────────────┘
//!
//!  page = records_per_page × thread record (record_size B, 64-aligned)
//!
//!  thread record
//!  ┌──────────────────────┬──────────────┬──────────────┬───────────────┬───────────────────────────┐
//!  │ ThreadHeader (896 B) │ N × Event    │ N × Event    │ N × Statement │ max_classes × Summary     │
//!  │ lock, identity,      │ waits        │ stages       │ statements    │ (384 B), one per class:   │
//!  │ actor, touched,      │ history ring │ history ring │ history ring  │ events_*_summary_by_      │
//!  │ 3 × current          │ (128 B each) │              │ (384 B each)  │ thread_by_event_name      │
//!  └──────────────────────┴──────────────┴──────────────┴───────────────┴───────────────────────────┘
//! ```
//!
//! Section offsets are not fixed: read them from the directory. Every
//! section starts on a 4096-byte boundary. Regions up to the first
//! container page are reserved (`fallocate`) at creation, except the
//! `history_long` rings, reserved on first use (flagged in the header's
//! `long_reserved`); a page is reserved when it is added or revived,
//! before it is touched, so a full volume surfaces as an error and a lost
//! count, never as a SIGBUS. Neither side touches an unreserved region.
//!
//! ## Header (offset 0, 4096 bytes)
//!
//! | offset | size | field                   | meaning |
//! |-------:|-----:|-------------------------|---------|
//! | 0x000  | 8    | `magic`                 | `"PFSSHM\0\0"` |
//! | 0x008  | 4    | `major`                 | 1; refuse any other |
//! | 0x00C  | 4    | `minor`                 | compatible additions |
//! | 0x010  | 4    | `byte_order`            | `0x01020304` as written by the creator |
//! | 0x014  | 4    | `header_size`           | 4096 |
//! | 0x018  | 8    | `segment_size`          | file size set by the creator; must be ≤ the file's length |
//! | 0x020  | 8    | `state`                 | 0 initialising, 1 ready (stored last, release) |
//! | 0x028  | 4    | `creator_pid`           | informative only |
//! | 0x02C  | 4    | `section_count`         | used directory entries (≤ 16) |
//! | 0x030  | 8    | `start_time_unix_ns`    | creation wall-clock time |
//! | 0x038  | 8    | `timer_base_ticks`      | tick value of `TIMER_START` = 0 |
//! | 0x040  | 8    | `timer_ps_per_tick_q32` | ps per tick, 32.32 fixed point |
//! | 0x048  | 8    | `timer_frequency_hz`    | ticks per second |
//! | 0x050  | 4    | `timer_kind`            | 1 CYCLE (TSC), 2 NANOSECOND |
//! | 0x054  | 4    | `history_len`           | events per history ring (1..=1024) |
//! | 0x058  | 4    | `service_name_len`      | bytes of UTF-8 in `service_name` (≤ 64) |
//! | 0x060  | 64   | `service_name`          | UTF-8, zero padded |
//! | 0x0A0  | 8    | `timer_base_ns`         | `CLOCK_MONOTONIC` ns at creation (base of the non-CYCLE timers) |
//! | 0x0A8  | 8    | `history_long_len`      | rows per `history_long` ring |
//! | 0x0B0  | 8    | `long_reserved`         | bit *k*: `history_long` ring *k* is reserved and readable (readers never touch an unreserved ring) |
//! | 0x100  | 512  | `sections[16]`          | section directory, below |
//!
//! Section directory entry (32 bytes): `kind` u32, reserved u32, `offset`
//! u64, `size` u64, `count` u32, `stride` u32. A reader checks that
//! `offset` is 4096-aligned, `offset + size ≤ segment_size` and
//! `count × stride ≤ size`, and ignores kinds it does not know.
//!
//! | kind | section  | count          | stride | content |
//! |-----:|----------|----------------|-------:|---------|
//! | 1    | Counters | 16             | 8      | lost counters ([`layout::LostKind`]) |
//! | 2    | Classes  | `max_classes`  | 128    | [`layout::ClassEntry`] |
//! | 3    | Strings  | `max_strings`  | 64     | [`layout::StringEntry`] |
//! | 4    | Global   | `max_classes`  | 384    | [`layout::GlobalHeader`] (6208 B) then rows |
//! | 5    | Threads  | `max_pages`    | page size | [`layout::ContainerHeader`], page directory, pages |
//! | 6    | Setup    | 48             | 128    | [`layout::SetupSection`]: consumers, timers, actor rows |
//! | 7    | WaitsLong | `history_long_len` | 128 | [`layout::LongHeader`] (128 B) then event rows |
//! | 8    | StagesLong | `history_long_len` | 128 | as WaitsLong |
//! | 9    | StatementsLong | `history_long_len` | 384 | [`layout::LongHeader`] then statement rows |
//!
//! ## Class entry (128 bytes)
//!
//! | offset | size | field      | meaning |
//! |-------:|-----:|------------|---------|
//! | 0      | 4    | `state`    | 0 empty, 2 ready (stored last, release) |
//! | 4      | 4    | `flags`    | bit 0 ENABLED, bit 1 TIMED; the agent may rewrite it at any time |
//! | 8      | 4    | `kind`     | [`ClassKind`] |
//! | 12     | 4    | `name_len` | ≤ 112 |
//! | 16     | 112  | `name`     | UTF-8 PFS name, e.g. `wait/synch/mutex/kv/store` |
//!
//! ## String entry (64 bytes)
//!
//! `state` u32 (2 = ready), `len` u32 (≤ 56), 56 bytes of UTF-8. Published
//! in index order. Used for `SOURCE` (`file.rs:123`) and `OBJECT_NAME`.
//!
//! ## Summary row (320 bytes)
//!
//! | offset | size | field          | meaning |
//! |-------:|-----:|----------------|---------|
//! | 0      | 8    | `seq`          | sequence lock over the row |
//! | 8      | 8    | `count`        | `COUNT_STAR` |
//! | 16     | 8    | `timed_count`  | events with timers |
//! | 24     | 16   | `sum_lo/hi`    | `SUM_TIMER_WAIT`, ps, 128-bit |
//! | 40     | 8    | `min`          | `MIN_TIMER_WAIT`, ps (`u64::MAX`: none) |
//! | 48     | 8    | `max`          | `MAX_TIMER_WAIT`, ps |
//! | 56     | 8    | `bytes`        | sum of `NUMBER_OF_BYTES` |
//! | 64     | 256  | `buckets[32]`  | latency histogram, per bucket (not cumulative) |
//! | 320    | 40   | `errors`, `warnings`, `rows_affected`, `rows_sent`, `rows_examined` | statement classes: `SUM_*` |
//! | 360    | 24   | reserved       | zero |
//!
//! Bucket 0 counts durations ≤ 2^13 ps (8.192 ns), bucket *i* (1..=30)
//! counts (2^(12+i), 2^(13+i)] ps, bucket 31 counts everything above 2^43
//! ps (8.8 s): see [`layout::bucket_index`].
//!
//! ## Memory row (384 bytes, layout minor 1)
//!
//! For a class of kind `memory` (10), the summary row slot at its index,
//! per thread and in the global section, is a [`layout::MemoryRow`]
//! instead. Signed values are two's-complement `i64`. Written by the owning
//! thread only, relaxed stores under `seq`; zeroed on first touch (thread)
//! or at class registration (global).
//!
//! | offset | size | field                | meaning |
//! |-------:|-----:|----------------------|---------|
//! | 0      | 8    | `seq`                | sequence lock over the row |
//! | 8      | 8    | `count_alloc`        | `COUNT_ALLOC` |
//! | 16     | 8    | `count_free`         | `COUNT_FREE` |
//! | 24     | 8    | `sum_bytes_alloc`    | `SUM_NUMBER_OF_BYTES_ALLOC` |
//! | 32     | 8    | `sum_bytes_free`     | `SUM_NUMBER_OF_BYTES_FREE` |
//! | 40     | 8    | `low_count_used`     | `LOW_COUNT_USED` (i64) |
//! | 48     | 8    | `current_count_used` | `CURRENT_COUNT_USED` (i64) |
//! | 56     | 8    | `high_count_used`    | `HIGH_COUNT_USED` (i64) |
//! | 64     | 8    | `low_bytes_used`     | `LOW_NUMBER_OF_BYTES_USED` (i64) |
//! | 72     | 8    | `current_bytes_used` | `CURRENT_NUMBER_OF_BYTES_USED` (i64) |
//! | 80     | 8    | `high_bytes_used`    | `HIGH_NUMBER_OF_BYTES_USED` (i64) |
//! | 88     | 8    | `truncate_gen`       | setup `memory_truncate_gen` at the last update |
//! | 96     | 288  | reserved             | zero |
//!
//! The setup section's word at offset 136, `memory_truncate_gen`, is bumped
//! by the agent when a memory table is truncated. A writer whose row holds
//! an older generation sets LOW = HIGH = CURRENT before its next update; a
//! reader shows such a row with LOW = HIGH = CURRENT. A thread's fold adds
//! counts, sums, CURRENT, LOW and HIGH into the global row (aggregate
//! watermarks are the sum of the children's, as in PFS), so the global
//! CURRENT is exactly allocated − freed.
//!
//! ## Event row (128 bytes)
//!
//! | offset | size | field                | meaning |
//! |-------:|-----:|----------------------|---------|
//! | 0      | 8    | `seq`                | sequence lock over the row |
//! | 8      | 8    | `event_id`           | per-thread, from 1; 0 = empty row |
//! | 16     | 8    | `end_event_id`       | valid if flag ENDED |
//! | 24     | 4    | `class`              | class index |
//! | 28     | 4    | `operation`          | [`Operation`] |
//! | 32     | 8    | `timer_start`        | raw ticks, valid if flag TIMED |
//! | 40     | 8    | `timer_end`          | raw ticks, valid if TIMED and ENDED |
//! | 48     | 8    | `timer_wait`         | ps, valid if TIMED and ENDED |
//! | 56     | 8    | `object_instance`    | `OBJECT_INSTANCE_BEGIN` |
//! | 64     | 8    | `bytes`              | valid if flag HAS_BYTES |
//! | 72     | 8    | `spins`              | valid if flag HAS_SPINS |
//! | 80     | 4    | `source`             | string index, `0xFFFFFFFF` none |
//! | 84     | 4    | `object_name`        | string index, `0xFFFFFFFF` none |
//! | 88     | 8    | `nesting_event_id`   | 0 = NULL |
//! | 96     | 4    | `nesting_event_type` | 0 none, 1 WAIT, 2 STAGE, 3 STATEMENT |
//! | 100    | 4    | `flags`              | 1 TIMED, 2 ENDED, 4 HAS_BYTES, 8 HAS_SPINS |
//! | 104    | 4    | `event_type`         | as `nesting_event_type` |
//! | 112    | 8    | `thread_id`          | `THREAD_ID` (set in `history_long` rows) |
//!
//! Flags also carry bit 16 HAS_PROGRESS (stages: `bytes` is
//! `WORK_COMPLETED`, `spins` is `WORK_ESTIMATED`) and, in bits 8..10, the
//! timer that took the timestamps (0 CYCLE, 1 NANOSECOND, 2 MICROSECOND,
//! 3 MILLISECOND, 4 TICK). CYCLE timestamps are raw ticks:
//! `ps = (ticks − timer_base_ticks) × timer_ps_per_tick_q32 >> 32` in
//! 128-bit arithmetic (a 64-bit TSC at 3 GHz wraps after 194 years, unlike
//! MySQL's picosecond `TIMER_START`, 213 days); the other timers store
//! nanoseconds: `ps = (ns − timer_base_ns) × 1000`. `END_EVENT_ID` is the
//! thread's next event id when the event ended, so a parent's
//! `[EVENT_ID, END_EVENT_ID)` contains its children.
//!
//! ## Statement row (384 bytes)
//!
//! An event row (offsets 0..128, whose `seq` guards the whole row), then
//! `errors`, `warnings`, `rows_affected`, `rows_sent`, `rows_examined`,
//! `digest` (6 × u64 at 128..176; `digest` is a 64-bit FNV-1a of the
//! application's digest text, 0 = none), `text_len` u32 at 176, reserved
//! u32, and 200 bytes of UTF-8 `SQL_TEXT` at 184.
//!
//! ## Thread header (896 bytes)
//!
//! | offset | size | field                 | meaning |
//! |-------:|-----:|-----------------------|---------|
//! | 0      | 8    | `lock`                | `version << 2 \| state` ([`lockword`]) |
//! | 8      | 8    | `seq`                 | sequence lock over identity and actor |
//! | 16     | 8    | `thread_id`           | `THREAD_ID` |
//! | 24     | 8    | `os_tid`              | `THREAD_OS_ID` |
//! | 32     | 4    | `name_len`            | ≤ 32 |
//! | 36     | 4    | `flags`               | 1 INSTRUMENTED, 2 HISTORY |
//! | 40     | 32   | `name`                | UTF-8 thread name |
//! | 72     | 12   | `user`, `host`, `role` | string indexes of the declared actor (`0xFFFFFFFF` none) |
//! | 88     | 12   | `history_next[3]`     | writer's next slot per ring (waits, stages, statements) |
//! | 104    | 24   | `history_count[3]`    | events ever appended per ring; event *k* is in slot *k* mod `history_len` |
//! | 128    | 128  | `touched[16]`         | bit *c*: row *c* written in this lifetime |
//! | 256    | 128  | `waits_current`       | event row |
//! | 384    | 128  | `stages_current`      | event row |
//! | 512    | 384  | `statements_current`  | statement row |
//!
//! ## Setup section (8192 bytes)
//!
//! | offset | size | field            | meaning |
//! |-------:|-----:|------------------|---------|
//! | 0      | 4    | `consumers`      | bit 0 global_instrumentation, 1 thread_instrumentation; kind *k* (0 waits, 1 stages, 2 statements) uses bits 2+4*k*.. : current, history, history_long, summaries |
//! | 64     | 4    | `timers`         | 3 bits per kind (waits at bit 0, stages 3, statements 6): timer id |
//! | 128    | 8    | `actors_version` | bumped on every actor change |
//! | 192    | 6144 | `actors[48]`     | 128-byte rows: `seq` u64, `flags` u32 (1 ENABLED, 2 HISTORY, 4 USED), `host_len`, `user_len`, `role_len` u32, then 32 bytes each of UTF-8 host, user, role |
//!
//! ## history_long rings
//!
//! `LongHeader` (128 bytes): `next` u64 (tickets taken, alone on its cache
//! line), then at 64 `len` u64 and `slot_size` u64. Slot *t* mod `len`
//! holds ticket *t*; its `seq` is `(t + 1) << 1` once written (odd while a
//! writer holds it, 0 never written). A reader orders rows by that value.
//!
//! ## Container and page states
//!
//! | word            | values |
//! |-----------------|--------|
//! | page directory  | state in bits 0..1: 0 UNUSED (hole), 1 ACTIVE, 2 RECLAIMING, 3 RECLAIMED (hole again); bits 2..63: allocators scanning the page |
//! | record `lock`   | state 0 FREE, 1 DIRTY, 2 ALLOCATED; version in bits 2..63 |
//!
//! ```text
//!            add (reserve)          all FREE for the quiet time, no user
//!  UNUSED ─────────────────▶ ACTIVE ─────────────────────────────────────▶ RECLAIMING
//!                              ▲  ▲            a record in use / punch failed │
//!                              │  └───────────────────────────────────────────┤
//!                              │                                  hole punched │
//!                              │      revive (reserve, lock words FREE(base))  ▼
//!                              └──────────────────────────────────────── RECLAIMED
//! ```
//!
//! | offset | size | `ContainerHeader` field | meaning |
//! |-------:|-----:|-------------------------|---------|
//! | 0      | 4    | `records_per_page`      | records per page |
//! | 4      | 4    | `max_pages`             | page directory length |
//! | 8      | 8    | `record_size`           | bytes per record (multiple of 64) |
//! | 16     | 8    | `page_size`             | bytes per page (multiple of 4096) |
//! | 24     | 8    | `pages_offset`          | page 0, from the section start |
//! | 32     | 8    | `pages_added`           | pages `0..pages_added` were added (ACTIVE, RECLAIMING or RECLAIMED) |
//! | 40     | 8    | `pages_reclaimed`       | reclaims so far (owner's count) |
//! | 48     | 8    | `pages_revived`         | revivals so far |
//! | 56     | 8    | reserved                | zero |
//!
//! A zero lock word is FREE, so a hole or a zero-filled page never shows a
//! thread. Readers copy records only from ACTIVE pages (touching a
//! reclaimed hole would make the filesystem allocate it again). The full
//! protocol, and why it never hands a record to two owners nor reclaims a
//! page in use, is in [`container`]; a `loom` model checks it.
//!
//! ## Protocols
//!
//! * **Sequence locks** ([`seqlock`]): one writer per row; readers retry a
//!   bounded number of times, then skip and count.
//! * **history_long slots**: many writers; a writer claims a slot by
//!   compare-exchange only if it holds an older ticket, else counts the
//!   event lost (see [`writer::SegmentWriter::append_long`]).
//! * **Setup** ([`setup`]): the agent changes class flags, the consumers and
//!   timers words with atomic read-modify-writes; writers read each with one
//!   relaxed load per event.
//! * **Records** ([`lockword`]): FREE → DIRTY by compare-exchange, DIRTY →
//!   ALLOCATED(v+1) once initialised, ALLOCATED(v) → FREE(v) at thread exit.
//!   Readers copy ALLOCATED records and keep a copy only if the lock word
//!   is unchanged afterwards.
//! * **Thread exit** ([`reader`]): the exiting thread, under the creator's
//!   process-local lock, adds its rows into the global rows, appends
//!   `(ticket, record, version)` to the fold log and sets `fold_count =
//!   ticket`, all inside the global sequence lock, then frees its record.
//!   Readers drop copies that the fold log shows as already folded, so each
//!   event is counted exactly once and totals never go down.
//!
//! ## Example: create, write, read back
//!
//! ```
//! use pfs_shm_layout::{ClassKind, Segment, SegmentConfig, SegmentWriter, TimerCalibration};
//! use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED, NONE_U32};
//! use pfs_shm_layout::writer::EventData;
//! use pfs_shm_layout::reader::{snapshot, ReadOptions};
//!
//! let file = tempfile::tempfile().unwrap();
//! let timer = TimerCalibration { kind: 2, base_ticks: 0, ps_per_tick_q32: 1000 << 32, frequency_hz: 1_000_000_000, base_ns: 0 };
//! let cfg = SegmentConfig { service_name: "doc".into(), ..Default::default() };
//! let seg = Segment::create(file.try_clone().unwrap(), &cfg, timer, std::process::id(), 0).unwrap();
//! let w = SegmentWriter::new(seg);
//! let class = w.register_class("wait/synch/mutex/doc/m", ClassKind::Mutex, FLAG_ENABLED | FLAG_TIMED).unwrap();
//! let slot = w.alloc_thread(1, 42, "main").unwrap();
//! let rec = w.segment().record(slot.index);
//! let ev = EventData { event_id: 1, end_event_id: 2, class, timer_start: 10, timer_end: 15,
//!     timer_wait: 5_000, source: NONE_U32, object_name: NONE_U32, flags: EV_TIMED | EV_ENDED, ..Default::default() };
//! rec.end_event(0, &ev, None, true, true);        // events_waits_current + history
//! rec.summarize(class as usize, true, 5_000, 0, None); // summary row
//!
//! let reader = Segment::open(file, false).unwrap(); // as the agent would
//! let snap = snapshot(&reader, &ReadOptions::default()).unwrap();
//! assert_eq!(snap.threads[0].rows[0].1.count, 1);
//! assert_eq!(snap.threads[0].rows[0].1.sum_ps, 5_000);
//! ```

#![deny(missing_docs)]

pub mod container;
pub mod error;
pub mod heap;
pub mod kinds;
pub mod layout;
pub mod lockword;
pub mod reader;
pub mod rules;
pub mod segment;
pub mod seqlock;
pub mod setup;
pub mod sigbus;
pub mod writer;

pub use error::SegmentError;
pub use kinds::{ClassKind, Operation};
pub use segment::{Geometry, RecordRef, Segment, SegmentConfig, TimerCalibration};
pub use writer::{SegmentWriter, ThreadSlot};
