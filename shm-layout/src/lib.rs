//! # pfs-shm-layout: the segment format and its lock-free protocol
//!
//! One instrumented process owns one **segment**: a file (normally on
//! tmpfs) mapped shared by the process and read by `pfs-agent`. This crate
//! is the only contract between the two; this page is its specification,
//! precise enough to write a reader in another language. The structures in
//! [`layout`] are the same tables in Rust, with every size and offset
//! checked at compile time, and `tests/spec.rs` checks every number of the
//! tables below against them.
//!
//! Layout version **8.1** ([`layout::LAYOUT_MAJOR`].[`layout::LAYOUT_MINOR`]).
//! All integers are little-endian (the header's byte-order mark says so).
//! Every field is an aligned 32- or 64-bit word, read and written with
//! atomic instructions only.
//!
//! Versions: 8.1 uses the last eight words of a file or socket class's
//! summary row, which no wait used before, for its waits by I/O mode
//! (read, write, misc: *I/O words*): an 8.0 reader ignores them, and an
//! 8.1 reader finds them zero in older segments. 8.0 changes what a stage's and a statement's histogram
//! buckets span: 954 ns to 1024 s instead of the waits' 7.45 ns to 8 s,
//! so that a request slower than 8 s is counted where it lies (see
//! *Summary row*); nothing moved. A 7.x reader would misread them, hence
//! the major version; an 8.0 reader reads 7.x segments and moves their
//! stage and statement buckets to the new scale (a 7.x event above 8 s
//! is counted in (8 s, 16 s]: only "above 8 s" is known of it). 7.2 uses lost counter 10, `uncollected_segments`: a new
//! process that had to remove a dead predecessor's segment no agent had
//! collected counts it (a 7.1 reader ignores it). 7.1 adds the optional Tasks section (kind 10) and lost
//! counter 9, `task_slots`: an async task that awaits shows its open
//! statement, stage and queued wait there (see *Task slots*). A 7.0 reader
//! ignores both; a 7.1 reader reads a 7.0 segment as having no task
//! slots. 7.0 defers a summary row's histogram increment by one event:
//! the row's first word, `pending`, names the bucket of its latest timed
//! event, which a writer adds to `buckets` at the row's next timed event
//! and a reader adds when it loads the row (see *Summary row*). A 6.x
//! reader would miss one event per row in the buckets, hence the major
//! version; a 7.x reader reads 6.x segments (their word is zero) and 5.x
//! segments as a 6.x reader does. 6.2 uses consumer bit 14, `events_statements_cpu`: a writer
//! times a task's polls (statements' `CPU_TIME`) only while it is set, and
//! a creator sets it in the initial consumers word (5.x, 6.0 and 6.1
//! writers time them always; a reader shows the bit set for them, and an
//! agent does not change it there). 6.1 uses lost counter 8, `events_ended_by_another_thread`
//! (6.0 readers ignore it; it is 0 in 6.0 segments). 6.0 no longer stores a memory row's `CURRENT_COUNT_USED` and
//! `CURRENT_NUMBER_OF_BYTES_USED`, which are allocated − freed by
//! definition: a reader derives them from the counts and sums, and an
//! allocation or a free writes two words fewer (the fields after them
//! moved up); a 6.x reader reads 5.x segments too, whose only difference
//! is that row. 5.1 uses a reserved word of the setup section,
//! `agent_defaults`, where the agent records the setup defaults it applied
//! (5.0 readers and writers ignore it). 5.0 moved the sequence lock of each per-thread summary and
//! memory row out of the row (whose first word is now reserved) into a
//! dense array, and split each record in a head (header and row
//! sequences; the heads of a page side by side) and a body (history rings
//! and rows), so that a reader finds the rows that changed since its last
//! snapshot from a few dense pages instead of touching every row
//! (incremental snapshots). 4.0 re-based the latency histogram's buckets
//! on powers of two of a second (3.x: of a picosecond), for exact native
//! and exponential histograms; nothing else moved, but a 3.x reader would
//! mislabel every bucket, hence the major bump. 3.1 added tasks (per-row
//! `THREAD_ID`, `CPU_TIME`, `CANCELLED`).
//!
//! A segment is a plain file mapped with `memmap2`, not a POSIX shared
//! memory object: the `shared_memory` crate was considered and rejected,
//! because it can only place memory in `/dev/shm` by `shm_open` name, is
//! unmaintained since 2022, and a sidecar needs a file on a volume both
//! containers mount.
//!
//! ## The file
//!
//! ```text
//!  offset 0    ┌──────────────────────────────────────────────────┐
//!              │ Header (4096 B): magic, versions, sizes, pid,    │
//!              │ start time, service, timer calibration, section  │
//!              │ directory                                        │
//!  0x1000      ├──────────────────────────────────────────────────┤
//!              │ Counters: LostCounters (128 B)                   │
//!  0x2000      ├──────────────────────────────────────────────────┤
//!              │ Classes: max_classes × ClassEntry (128 B)        │  setup_instruments
//!              ├──────────────────────────────────────────────────┤
//!              │ Strings: max_strings × StringEntry (64 B)        │  SOURCE, OBJECT_NAME
//!              ├──────────────────────────────────────────────────┤
//!              │ Global: GlobalHeader (6208 B): seq, fold_count,  │  exited threads'
//!              │ fold log; max_classes × SummaryRow (384 B)       │  totals
//!              ├──────────────────────────────────────────────────┤
//!              │ Setup: SetupSection (8192 B): consumers, timers, │  written by the agent
//!              │ actors                                           │
//!              ├──────────────────────────────────────────────────┤
//!              │ Tasks: TasksHeader (64 B); task_slots ×          │  awaiting tasks' open
//!              │ TaskSlot (640 B) (since 7.1; absent if none)     │  events
//!              ├──────────────────────────────────────────────────┤
//!              │ Threads: ContainerHeader (64 B), page directory  │
//!              │ (max_pages × u64), page 0 │ page 1 │ ...         │
//!              │ (holes until added; each page_size bytes)        │
//!              ├──────────────────────────────────────────────────┤
//!              │ WaitsLong: LongHeader (128 B) + history_long_len │  history_long rings,
//!              │   × EventRecord (128 B)                          │  holes until first
//!              │ StagesLong: the same                             │  used
//!              │ StatementsLong: LongHeader (128 B) +             │
//!              │   history_long_len × StatementRecord (384 B)     │
//!              └──────────────────────────────────────────────────┘
//!
//!  page = records_per_page × record head, then records_per_page × record
//!         body (since 5.0; record_size = head + body bytes)
//!
//!  record head (head_size bytes)
//!  ┌──────────────────────────────────────────────┐
//!  │ ThreadHeader (896 B): lock, identity, actor, │
//!  │ touched, the three current events            │
//!  ├──────────────────────────────────────────────┤
//!  │ max_classes row sequence locks, 8 bytes each,│  which rows changed, without
//!  │ padded to 64: entry c guards summary row c   │  touching them (since 5.0)
//!  └──────────────────────────────────────────────┘
//!  record body (record_size − head_size bytes)
//!  ┌──────────────────────────────────────────────┐
//!  │ history_len × EventRecord (128 B)            │  events_waits_history ring
//!  ├──────────────────────────────────────────────┤
//!  │ history_len × EventRecord (128 B)            │  events_stages_history ring
//!  ├──────────────────────────────────────────────┤
//!  │ history_len × StatementRecord (384 B)        │  events_statements_history ring
//!  ├──────────────────────────────────────────────┤
//!  │ max_classes × SummaryRow (384 B), one per    │  events_*_summary_by_thread_
//!  │ class                                        │  by_event_name
//!  └──────────────────────────────────────────────┘
//! ```
//!
//! A record is in two parts, so that what a reader looks at on every
//! snapshot (the headers and the row sequences) is a few dense pages per
//! container page, kept resident, while the bodies are touched only where
//! a row changed. With *h* = `history_len`, *m* = `max_classes` (the
//! Classes section's `count`) and *s* = 8·*m* rounded up to a multiple of
//! 64, a head is 896 + *s* bytes (`head_size`): the sequence lock of row
//! *c* is at byte 896 + 8·*c* of the head. In a body, the waits ring starts
//! at byte 0, the stages ring at 128·*h*, the statements ring at 256·*h*,
//! and summary row *c* at 640·*h* + 384·*c*; a body is 640·*h* + 384·*m*
//! bytes, and `record_size` is head plus body. Record *i* of page *p* has
//! its head at `pages_offset` + *p*·`page_size` + *i*·`head_size` from the
//! start of the Threads section, and its body at `pages_offset` +
//! *p*·`page_size` + `records_per_page`·`head_size` + *i*·(`record_size` −
//! `head_size`). Its **record index** (used by the fold log) is
//! *p*·`records_per_page` + *i*. The page directory's entry *p* is the
//! 64-bit word at byte 64 + 8·*p* of the section.
//!
//! Section offsets are not fixed: read them from the directory (a 7.0
//! segment has no Tasks section, and its Threads section follows Setup).
//! Every
//! section starts on a 4096-byte boundary. Regions up to the first
//! container page are reserved (`fallocate`) at creation, except the
//! `history_long` rings, reserved on first use (flagged in the header's
//! `long_reserved`), and the Tasks section past its first page (its
//! header and first slots): a slot's page is reserved before `used`
//! counts the slot; a page is reserved when it is added or revived,
//! before it is touched, so a full volume surfaces as an error and a lost
//! count, never as a SIGBUS. Neither side touches an unreserved region.
//! (A writer whose ring could not be reserved counts that ring's events
//! lost, without a lock, and tries the reservation again once every
//! [`writer::LONG_RETRY_EVERY`] of them.)
//!
//! Every table below lists a structure's fields in order, from offset 0 to
//! its end (reserved words included). `name[N]` is an array of N elements;
//! a reserved field reads as zero.
//!
//! ## Header: [`layout::Header`], 4096 bytes
//!
//! At offset 0.
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0x000 | 8 | `magic` | `"PFSSHM\0\0"` |
//! | 0x008 | 4 | `major` | 8; a reader of this version also reads 7.x segments (their stage and statement histograms have the wait scale, below), 6.x segments (no pending bucket: the summary row's first word is zero) and 5.x segments (their memory rows differ, below); refuse any other |
//! | 0x00C | 4 | `minor` | 1; compatible additions (new section kinds, use of reserved fields): accept any |
//! | 0x010 | 4 | `byte_order` | `0x01020304` as written by the creator |
//! | 0x014 | 4 | `header_size` | 4096 |
//! | 0x018 | 8 | `segment_size` | file size set by the creator; must be ≤ the file's length |
//! | 0x020 | 8 | `state` | 0 initialising, 1 ready (stored last, release) |
//! | 0x028 | 4 | `creator_pid` | informative only |
//! | 0x02C | 4 | `section_count` | used directory entries (≤ 16) |
//! | 0x030 | 8 | `start_time_unix_ns` | creation wall-clock time |
//! | 0x038 | 8 | `timer_base_ticks` | tick value of `TIMER_START` = 0 |
//! | 0x040 | 8 | `timer_ps_per_tick_q32` | ps per tick, 32.32 fixed point |
//! | 0x048 | 8 | `timer_frequency_hz` | ticks per second |
//! | 0x050 | 4 | `timer_kind` | [`layout::TimerSource`]: 1 TSC (CYCLE is the TSC), 2 monotonic (no invariant TSC) |
//! | 0x054 | 4 | `history_len` | events per history ring (≤ 1024, at least 1) |
//! | 0x058 | 4 | `service_name_len` | bytes of UTF-8 in `service_name` (≤ 64) |
//! | 0x05C | 4 | `reserved0` | reserved |
//! | 0x060 | 64 | `service_name` | UTF-8, zero padded |
//! | 0x0A0 | 8 | `timer_base_ns` | `CLOCK_MONOTONIC` ns at creation (base of the non-CYCLE timers) |
//! | 0x0A8 | 8 | `history_long_len` | rows per `history_long` ring (≤ 16777216) |
//! | 0x0B0 | 8 | `long_reserved` | bit *k*: `history_long` ring *k* ([`EventKind::index`]) is reserved and readable (readers never touch an unreserved ring) |
//! | 0x0B8 | 72 | `reserved1` | reserved |
//! | 0x100 | 512 | `sections[16]` | section directory, below |
//! | 0x300 | 3328 | `padding` | reserved, up to the end of the header |
//!
//! ## Section directory entry: [`layout::SectionEntry`], 32 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 4 | `kind` | [`layout::SectionKind`]; 0 = unused entry |
//! | 4 | 4 | `reserved` | reserved |
//! | 8 | 8 | `offset` | from the start of the file, a multiple of 4096 |
//! | 16 | 8 | `size` | bytes |
//! | 24 | 4 | `count` | entries, as below |
//! | 28 | 4 | `stride` | bytes per entry, as below |
//!
//! A reader checks that `offset` is 4096-aligned, `offset + size ≤
//! segment_size` and `count × stride ≤ size`, and ignores kinds it does not
//! know.
//!
//! | kind | section | count | stride | content |
//! |-----:|---------|-------|--------|---------|
//! | 1 | Counters | 16 | 8 | [`layout::LostCounters`] |
//! | 2 | Classes | `max_classes` | 128 | [`layout::ClassEntry`] |
//! | 3 | Strings | `max_strings` | 64 | [`layout::StringEntry`] |
//! | 4 | Global | `max_classes` | 384 | [`layout::GlobalHeader`], then the rows |
//! | 5 | Threads | `max_pages` | `page_size` | [`layout::ContainerHeader`], page directory, pages |
//! | 6 | Setup | 48 | 128 | [`layout::SetupSection`]: consumers, timers, actor rows |
//! | 7 | WaitsLong | `history_long_len` | 128 | [`layout::LongHeader`], then event rows |
//! | 8 | StagesLong | `history_long_len` | 128 | as WaitsLong |
//! | 9 | StatementsLong | `history_long_len` | 384 | [`layout::LongHeader`], then statement rows |
//! | 10 | Tasks | `task_slots` | 640 | [`layout::TasksHeader`], then the task slots (since 7.1; optional: left out when a segment has none) |
//!
//! ## Lost counters: [`layout::LostCounters`], 128 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 128 | `counters[16]` | by index, below; multi-writer (`fetch_add`, slow paths only) |
//!
//! | index | counter |
//! |------:|---------|
//! | 0 | `thread_instances` |
//! | 1 | `instrument_classes` |
//! | 2 | `strings` |
//! | 3 | `container_pages` |
//! | 4 | `events_no_thread_record` |
//! | 5 | `events_waits_history_long` |
//! | 6 | `events_stages_history_long` |
//! | 7 | `events_statements_history_long` |
//! | 8 | `events_ended_by_another_thread` |
//! | 9 | `task_slots` |
//! | 10 | `uncollected_segments` |
//!
//! Index 8 is used since 6.1, index 9 since 7.1 and index 10 since 7.2 (0
//! in older segments). Indexes 11 and up are reserved ([`layout::LostKind`]).
//!
//! ## Class entry: [`layout::ClassEntry`], 128 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 4 | `state` | 0 empty, 2 ready (stored last, release) |
//! | 4 | 4 | `flags` | bit 0 ENABLED, bit 1 TIMED; the agent may rewrite it at any time |
//! | 8 | 4 | `kind` | [`ClassKind`] |
//! | 12 | 4 | `name_len` | ≤ 112 |
//! | 16 | 112 | `name` | UTF-8 PFS name, e.g. `wait/synch/mutex/kv/store` |
//!
//! `kind`, from the name's prefix ([`ClassKind`]); kinds 1 to 7 are waits
//! (`events_waits_*` tables):
//!
//! | value | kind | names |
//! |------:|------|-------|
//! | 1 | mutex | `wait/synch/mutex/...` |
//! | 2 | rwlock | `wait/synch/rwlock/...`, `wait/synch/sxlock/...` |
//! | 3 | cond | `wait/synch/cond/...` |
//! | 4 | file | `wait/io/file/...` |
//! | 5 | socket | `wait/io/socket/...` |
//! | 6 | idle | `idle`, `idle/...` |
//! | 7 | wait | any other `wait/...` |
//! | 8 | stage | `stage/...` |
//! | 9 | statement | `statement/...` |
//! | 10 | memory | `memory/...` |
//!
//! A class's index in this section is its index everywhere else: the
//! `class` of an event row, and the summary (or memory) row of that index
//! in each thread record and in the global section.
//!
//! ## String entry: [`layout::StringEntry`], 64 bytes
//!
//! Published in index order. Used for `SOURCE` (`file.rs:123`) and
//! `OBJECT_NAME`.
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 4 | `state` | 0 unused, 2 ready (stored last, release) |
//! | 4 | 4 | `len` | ≤ 56 |
//! | 8 | 56 | `bytes` | UTF-8, zero padded |
//!
//! ## Global section header: [`layout::GlobalHeader`], 6208 bytes
//!
//! Followed, at offset 6208 of the section, by `max_classes` summary rows,
//! the totals of the threads that exited. `seq` guards the whole section.
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | `seq` | sequence lock over the rows, `fold_count` and the fold log |
//! | 8 | 8 | `fold_count` | thread folds completed (the last fold ticket) |
//! | 16 | 48 | `reserved` | reserved |
//! | 64 | 6144 | `fold_log[256]` | the last folds, fold *t* at index *t* mod 256 |
//!
//! ### Fold log entry: [`layout::FoldLogEntry`], 24 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | `ticket` | fold ticket (from 1); 0 = empty |
//! | 8 | 8 | `record` | record index in the thread container |
//! | 16 | 8 | `version` | lock-word version of the folded record lifetime |
//!
//! ## Summary row: [`layout::SummaryRow`], 384 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | `pending` | the latest timed event's bucket + 1, not yet in `buckets`; 0: none (since 7.0; reserved, zero, in 5.x and 6.x; the row's `seq` until 4.x) |
//! | 8 | 8 | `count` | `COUNT_STAR` |
//! | 16 | 8 | `timed_count` | events with timers |
//! | 24 | 8 | `sum_lo` | `SUM_TIMER_WAIT`, ps, low 64 bits |
//! | 32 | 8 | `sum_hi` | `SUM_TIMER_WAIT`, ps, high 64 bits |
//! | 40 | 8 | `min` | `MIN_TIMER_WAIT`, ps (`u64::MAX`: none) |
//! | 48 | 8 | `max` | `MAX_TIMER_WAIT`, ps |
//! | 56 | 8 | `bytes` | sum of `NUMBER_OF_BYTES` |
//! | 64 | 256 | `buckets[32]` | latency histogram, per bucket (not cumulative) |
//! | 320 | 8 | `errors` | statement classes: `SUM_ERRORS` |
//! | 328 | 8 | `warnings` | `SUM_WARNINGS` |
//! | 336 | 8 | `rows_affected` | `SUM_ROWS_AFFECTED` |
//! | 344 | 8 | `rows_sent` | `SUM_ROWS_SENT` |
//! | 352 | 8 | `rows_examined` | `SUM_ROWS_EXAMINED` |
//! | 360 | 8 | `cpu_time` | `SUM_CPU_TIME`, ps (since 3.1) |
//! | 368 | 8 | `cancelled` | statements cancelled (since 3.1) |
//! | 376 | 8 | `reserved` | reserved |
//!
//! In the row of a file or socket class (`wait/io/file/...`,
//! `wait/io/socket/...`), which has no statement figures, the last eight
//! words (from offset 320) are its **I/O words** instead (since 8.1).
//!
//! ### I/O words: [`layout::IoTail`], 64 bytes
//!
//! Each array is indexed by mode: 0 `read` (operations `read`, `recv`),
//! 1 `write` (`write`, `send`), 2 `misc` (every other operation of a file
//! or socket: `create`, `open`, `close`, `seek`, `sync`, `stat`, `delete`,
//! `rename`, `chsize`, `connect`, `accept`, `other`). A writer adds each
//! wait of such a class to its mode's words under the row's sequence lock,
//! in the same write as `count`, `sum` and `bytes`.
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 24 | `count[3]` | `COUNT_READ`, `COUNT_WRITE`, `COUNT_MISC`: waits, timed or not |
//! | 24 | 24 | `sum_ns[3]` | `SUM_TIMER_READ`, `_WRITE`, `_MISC` of the timed waits, in **nanoseconds** |
//! | 48 | 16 | `bytes[2]` | `SUM_NUMBER_OF_BYTES_READ`, `SUM_NUMBER_OF_BYTES_WRITE` |
//!
//! **The buckets** double in width from one to the next; where they
//! start depends on the row's event kind ([`layout::BucketScale`], since
//! 8.0):
//!
//! | scale | kinds | bucket 0 | bucket *i* (1..=30) | bucket 31 |
//! |---|---|---|---|---|
//! | short | waits | ≤ 2^-27 s (7450 ps) | (2^(i-28), 2^(i-27)] s | > 2^3 s (8 s) |
//! | long | stages, statements | ≤ 2^-20 s (953 674 ps) | (2^(i-21), 2^(i-20)] s | > 2^10 s (1024 s) |
//!
//! Until 7.x every kind had the short scale. In integer picoseconds,
//! bucket *i* ≤ 30 ends at ⌊10^12 · 2^(i+z)⌋ ps, *z* = −27 (short) or −20
//! (long): 7450, 14901, 29802, ..., 10^12 at *i* = 27, ..., 8·10^12 for
//! the short scale; 953 674, 1 907 348, ..., 10^12 at *i* = 20, ...,
//! 1.024·10^15 for the long one. A duration of *d* ps goes to the first
//! bucket whose bound is ≥ *d*. The bounds are powers of two of a second
//! (since 4.0; 3.x used 2^(13+i) ps), so they are exactly the buckets of
//! a Prometheus native histogram of schema 0 (index *i* + *z*) and of an
//! OTLP exponential histogram of scale 0 (index *i* + *z* − 1), bucket 0
//! being the zero bucket: see [`layout::bucket_index`] and
//! [`layout::BucketScale::index`].
//!
//! **The pending bucket (since 7.0).** A writer does not add a timed
//! event to its bucket at once: it stores the bucket's index + 1 in
//! `pending`, and adds the bucket `pending` named before, if any (one
//! counter, whose address does not depend on the new event's duration).
//! So `buckets` hold all the row's timed events but its latest, and a
//! reader, in the same read of the row (under its sequence lock), adds
//! one to bucket `pending − 1` when `pending` is 1..=32; then the buckets
//! sum to `timed_count` as they always did. `pending` lies between the
//! buckets of `min` and `max` in a row a live writer published, since
//! those include the latest event. A thread's rows folded into the global
//! section at its exit carry no pending bucket (the fold adds it), so a
//! global row's `pending` is 0.
//!
//! ## Memory row: [`layout::MemoryRow`], 384 bytes
//!
//! For a class of kind `memory` (10), the summary row slot at its index,
//! per thread and in the global section, is a memory row instead. Signed
//! values are two's-complement `i64`. Written by the owning thread only,
//! relaxed stores under the row's sequence lock; zeroed on first touch
//! (thread) or at class registration (global).
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | `reserved0` | reserved (the row's `seq` until 4.x) |
//! | 8 | 8 | `count_alloc` | `COUNT_ALLOC` |
//! | 16 | 8 | `count_free` | `COUNT_FREE` |
//! | 24 | 8 | `sum_bytes_alloc` | `SUM_NUMBER_OF_BYTES_ALLOC` |
//! | 32 | 8 | `sum_bytes_free` | `SUM_NUMBER_OF_BYTES_FREE` |
//! | 40 | 8 | `low_count_used` | `LOW_COUNT_USED` (i64) |
//! | 48 | 8 | `high_count_used` | `HIGH_COUNT_USED` (i64) |
//! | 56 | 8 | `low_bytes_used` | `LOW_NUMBER_OF_BYTES_USED` (i64) |
//! | 64 | 8 | `high_bytes_used` | `HIGH_NUMBER_OF_BYTES_USED` (i64) |
//! | 72 | 8 | `truncate_gen` | setup `memory_truncate_gen` at the last update |
//! | 80 | 304 | `reserved` | reserved |
//!
//! `CURRENT_COUNT_USED` is `count_alloc − count_free` and
//! `CURRENT_NUMBER_OF_BYTES_USED` is `sum_bytes_alloc − sum_bytes_free`,
//! both wrapping and read as `i64` (not stored since 6.0).
//!
//! ## Memory row of layout 5.x: [`layout::MemoryRowV5`], 384 bytes
//!
//! A reader of this version also reads 5.x segments (a process built with
//! the previous client, during a rolling upgrade: see
//! [`layout::LAYOUT_MAJORS_READ`]); they differ from 6.x in their memory
//! rows only, which stored CURRENT (and from 7.x as 6.x does: no pending
//! bucket, the summary row's first word is zero):
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | `reserved0` | reserved |
//! | 8 | 8 | `count_alloc` | `COUNT_ALLOC` |
//! | 16 | 8 | `count_free` | `COUNT_FREE` |
//! | 24 | 8 | `sum_bytes_alloc` | `SUM_NUMBER_OF_BYTES_ALLOC` |
//! | 32 | 8 | `sum_bytes_free` | `SUM_NUMBER_OF_BYTES_FREE` |
//! | 40 | 8 | `low_count_used` | `LOW_COUNT_USED` (i64) |
//! | 48 | 8 | `current_count_used` | `CURRENT_COUNT_USED` (i64) |
//! | 56 | 8 | `high_count_used` | `HIGH_COUNT_USED` (i64) |
//! | 64 | 8 | `low_bytes_used` | `LOW_NUMBER_OF_BYTES_USED` (i64) |
//! | 72 | 8 | `current_bytes_used` | `CURRENT_NUMBER_OF_BYTES_USED` (i64) |
//! | 80 | 8 | `high_bytes_used` | `HIGH_NUMBER_OF_BYTES_USED` (i64) |
//! | 88 | 8 | `truncate_gen` | setup `memory_truncate_gen` at the last update |
//! | 96 | 288 | `reserved` | reserved |
//!
//! The setup section's `memory_truncate_gen` is bumped by the agent when a
//! memory table is truncated. A writer whose row holds an older generation
//! sets LOW = HIGH = CURRENT before its next update; a reader shows such a
//! row with LOW = HIGH = CURRENT. A thread's fold adds counts, sums, LOW
//! and HIGH into the global row (aggregate watermarks are the sum of the
//! children's, as in PFS), so the global CURRENT is exactly allocated −
//! freed.
//!
//! ## Event row: [`layout::EventRecord`], 128 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | `seq` | sequence lock over the row |
//! | 8 | 8 | `event_id` | per-thread, from 1; 0 = empty row |
//! | 16 | 8 | `end_event_id` | valid if flag ENDED |
//! | 24 | 4 | `class` | class index |
//! | 28 | 4 | `operation` | [`Operation`] |
//! | 32 | 8 | `timer_start` | raw ticks, valid if flag TIMED |
//! | 40 | 8 | `timer_end` | raw ticks, valid if TIMED and ENDED |
//! | 48 | 8 | `timer_wait` | ps, valid if TIMED and ENDED: TIMER_END − TIMER_START, each converted to ps as a reader does |
//! | 56 | 8 | `object_instance` | `OBJECT_INSTANCE_BEGIN` |
//! | 64 | 8 | `bytes` | valid if flag HAS_BYTES |
//! | 72 | 8 | `spins` | valid if flag HAS_SPINS |
//! | 80 | 4 | `source` | string index, `0xFFFFFFFF` none |
//! | 84 | 4 | `object_name` | string index, `0xFFFFFFFF` none |
//! | 88 | 8 | `nesting_event_id` | 0 = NULL |
//! | 96 | 4 | `nesting_event_type` | [`EventKind`]: 0 none, 1 WAIT, 2 STAGE, 3 STATEMENT |
//! | 100 | 4 | `flags` | 1 TIMED, 2 ENDED, 4 HAS_BYTES, 8 HAS_SPINS, 16 HAS_PROGRESS, 32 CANCELLED; timer in bits 8..=10 |
//! | 104 | 4 | `event_type` | as `nesting_event_type` |
//! | 108 | 4 | `reserved32` | reserved |
//! | 112 | 8 | `thread_id` | `THREAD_ID`; in a thread record's rows 0 = the record's thread |
//! | 120 | 8 | `cpu_time` | statements: `CPU_TIME`, ps, valid if ENDED (since 3.1) |
//!
//! With flag HAS_PROGRESS (stages), `bytes` is `WORK_COMPLETED` and
//! `spins` is `WORK_ESTIMATED`. Bits 8..=10 of the flags name the timer
//! that took the timestamps (0 CYCLE, 1 NANOSECOND, 2 MICROSECOND,
//! 3 MILLISECOND, 4 TICK). CYCLE timestamps are raw ticks:
//! `ps = (ticks − timer_base_ticks) × timer_ps_per_tick_q32 >> 32` in
//! 128-bit arithmetic (a 64-bit TSC at 3 GHz wraps after 194 years, unlike
//! MySQL's picosecond `TIMER_START`, 213 days); the other timers store
//! nanoseconds: `ps = (ns − timer_base_ns) × 1000`. `END_EVENT_ID` of a
//! stage or statement is the thread's next event id when the event ended,
//! so a parent's `[EVENT_ID, END_EVENT_ID)` contains its children; a wait
//! has no children (waits nest in stages and statements), and its
//! `END_EVENT_ID` is its `EVENT_ID` + 1 (for a synchronous wait, which
//! ends before its thread's next event begins, that is the thread's next
//! event id too; an async wait pending while its task or worker recorded
//! other events does not cover them).
//!
//! **Tasks (since 3.1).** An async task that carries its own event
//! context (a statement held across `.await`) is a *logical thread*: it
//! has its own `THREAD_ID` (from the same sequence as the records', so
//! never equal to one), its own `EVENT_ID` sequence from 1, and its events
//! nest only in its own events. Whichever thread polls the task writes the
//! task's events into its own record (current rows, history rings,
//! summaries) with `thread_id` set to the task's. So a reader takes an
//! event's `THREAD_ID` from the row (0 = the record's thread), keys events
//! by (`THREAD_ID`, `EVENT_ID`), and finds an event's parent under the
//! same `THREAD_ID`: one statement's events may sit in several records,
//! never under several ids. A history ring can hold several logical
//! threads' events; its order is write order. Flag CANCELLED marks a
//! statement whose future was dropped before it completed; `cpu_time` is
//! the time its task was being polled while it was open (wall time is
//! `timer_wait`), 0 for a statement of a thread.
//!
//! ## Statement row: [`layout::StatementRecord`], 384 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 128 | `ev` | an event row, whose `seq` guards the whole statement row |
//! | 128 | 8 | `errors` | `ERRORS` |
//! | 136 | 8 | `warnings` | `WARNINGS` |
//! | 144 | 8 | `rows_affected` | `ROWS_AFFECTED` |
//! | 152 | 8 | `rows_sent` | `ROWS_SENT` |
//! | 160 | 8 | `rows_examined` | `ROWS_EXAMINED` |
//! | 168 | 8 | `digest` | 64-bit FNV-1a of the application's digest text, 0 = none |
//! | 176 | 4 | `text_len` | ≤ 200 |
//! | 180 | 4 | `reserved` | reserved |
//! | 184 | 200 | `text` | `SQL_TEXT`, UTF-8, truncated; bytes past `text_len` unspecified |
//!
//! ## Thread header: [`layout::ThreadHeader`], 896 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | `lock` | `version << 2 \| state` ([`lockword`]) |
//! | 8 | 8 | `seq` | sequence lock over identity and actor |
//! | 16 | 8 | `thread_id` | `THREAD_ID` |
//! | 24 | 8 | `os_tid` | `THREAD_OS_ID` |
//! | 32 | 4 | `name_len` | ≤ 32 |
//! | 36 | 4 | `flags` | 1 INSTRUMENTED, 2 HISTORY |
//! | 40 | 32 | `name` | UTF-8 thread name |
//! | 72 | 4 | `user` | string index of the declared actor's user (`0xFFFFFFFF` none) |
//! | 76 | 4 | `host` | string index of its host |
//! | 80 | 4 | `role` | string index of its role |
//! | 84 | 4 | `reserved0` | reserved |
//! | 88 | 12 | `history_next[3]` | writer's next slot per ring (waits, stages, statements) |
//! | 100 | 4 | `reserved1` | reserved |
//! | 104 | 24 | `history_count[3]` | events ever appended per ring; event *k* is in slot *k* mod `history_len` |
//! | 128 | 128 | `touched[16]` | bit *c* (bit *c* mod 64 of word *c* / 64): summary row *c* written in this lifetime; readers ignore rows whose bit is clear (they may hold an earlier lifetime's figures) |
//! | 256 | 128 | `waits_current` | event row |
//! | 384 | 128 | `stages_current` | event row |
//! | 512 | 384 | `statements_current` | statement row |
//!
//! ## Tasks section header: [`layout::TasksHeader`], 64 bytes
//!
//! The Tasks section (since 7.1) starts with this header; slot *i* is at
//! byte 64 + 640·*i* of the section.
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 4 | `used` | slots handed out at least once, their pages reserved: read slots `0..used` only (stored with release, only grows) |
//! | 4 | 4 | `reserved0` | reserved |
//! | 8 | 56 | `reserved[7]` | reserved |
//!
//! A slot is held by one async task at a time, a *logical thread* with a
//! `THREAD_ID` of its own, while it runs with a statement, stage or queued
//! wait open. The task's current events are in the current rows of the
//! thread that polls it, while it is polled; each time a poll returns, the
//! task writes into its slot what it still has open, so that a task that
//! awaits (a request waiting for a downstream call, a lock, a timer) is
//! still in `events_*_current`. Each row is written under its own sequence
//! lock, by the one thread running the task (its polls are ordered).
//!
//! ### Task slot: [`layout::TaskSlot`], 640 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 128 | `waits_current` | event row: the wait the task is queued in |
//! | 128 | 128 | `stages_current` | event row: its open stage |
//! | 256 | 384 | `statements_current` | statement row: its open statement, with its text |
//!
//! A row whose `event_id` is 0 is empty. Any other row shows an event
//! still running (never ENDED) whose `thread_id` is the task's. The same
//! event may be in the current row of the thread that polls the task at
//! that instant, running or ended: a reader shows it once, from the
//! thread's row.
//!
//! ## Setup section: [`layout::SetupSection`], 8192 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 4 | `consumers` | bit 0 global_instrumentation, 1 thread_instrumentation; kind *k* ([`EventKind::index`]: 0 waits, 1 stages, 2 statements) uses bits 2+4*k*.. : current, history, history_long, summaries; bit 14 (since 6.2) events_statements_cpu |
//! | 4 | 60 | `reserved0[15]` | reserved |
//! | 64 | 4 | `timers` | 3 bits per kind (waits at bit 0, stages 3, statements 6): timer id |
//! | 68 | 60 | `reserved1[15]` | reserved |
//! | 128 | 8 | `actors_version` | bumped on every actor change |
//! | 136 | 8 | `memory_truncate_gen` | bumped on every TRUNCATE of a memory table |
//! | 144 | 8 | `agent_defaults` | (since 5.1) written by the agent: the fingerprint of the setup defaults it applied (high 32 bits) and the classes they cover (low 32 bits); 0 = none |
//! | 152 | 40 | `reserved2[5]` | reserved |
//! | 192 | 6144 | `actors[48]` | `setup_actors` rows, below |
//! | 6336 | 1856 | `padding` | reserved |
//!
//! ### Actor row: [`layout::ActorEntry`], 128 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | `seq` | sequence lock over the row |
//! | 8 | 4 | `flags` | 1 ENABLED, 2 HISTORY, 4 USED |
//! | 12 | 4 | `host_len` | ≤ 32 |
//! | 16 | 4 | `user_len` | ≤ 32 |
//! | 20 | 4 | `role_len` | ≤ 32 |
//! | 24 | 32 | `host` | UTF-8 `HOST` (`%` = any) |
//! | 56 | 32 | `user` | UTF-8 `USER` (`%` = any) |
//! | 88 | 32 | `role` | UTF-8 `ROLE` (`%` = any) |
//! | 120 | 8 | `reserved` | reserved |
//!
//! ## history_long ring header: [`layout::LongHeader`], 128 bytes
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | `next` | tickets taken (alone on its cache line) |
//! | 8 | 56 | `reserved0` | reserved |
//! | 64 | 8 | `len` | reserved: the ring's length is `history_long_len` |
//! | 72 | 8 | `slot_size` | reserved: the slot size is the directory entry's `stride` |
//! | 80 | 48 | `reserved1` | reserved |
//!
//! Slot *t* mod `history_long_len` holds ticket *t*; its `seq` is
//! `(t + 1) << 1` once written (odd while a writer holds it, 0 never
//! written). A reader orders rows by that value.
//!
//! ## Container header: [`layout::ContainerHeader`], 64 bytes
//!
//! At the start of the Threads section; the page directory follows it.
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 4 | `records_per_page` | records per page |
//! | 4 | 4 | `max_pages` | page directory length |
//! | 8 | 8 | `record_size` | bytes per record, head plus body (multiple of 64) |
//! | 16 | 8 | `page_size` | bytes per page (multiple of 4096) |
//! | 24 | 8 | `pages_offset` | page 0, from the section start |
//! | 32 | 8 | `pages_added` | pages `0..pages_added` were added (ACTIVE, RECLAIMING or RECLAIMED) |
//! | 40 | 8 | `pages_reclaimed` | reclaims so far (owner's count) |
//! | 48 | 8 | `pages_revived` | revivals so far |
//! | 56 | 8 | `reserved` | reserved |
//!
//! ## Container and page states
//!
//! | word | values |
//! |------|--------|
//! | page directory | state in bits 0..1: 0 UNUSED (hole), 1 ACTIVE, 2 RECLAIMING, 3 RECLAIMED (hole again); bits 2..63: allocators scanning the page |
//! | record `lock` | state 0 FREE, 1 DIRTY, 2 ALLOCATED; version in bits 2..63 |
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
//! A zero lock word is FREE, so a hole or a zero-filled page never shows a
//! thread. Readers copy records only from ACTIVE pages (touching a
//! reclaimed hole would make the filesystem allocate it again). The full
//! protocol, and why it never hands a record to two owners nor reclaims a
//! page in use, is in [`container`]; a `loom` model checks it.
//!
//! ## Protocols
//!
//! * **Sequence locks** ([`seqlock`]): one writer per row. The writer
//!   stores `seq` odd, then the fields, then `seq` even (release). A
//!   reader loads `seq` (acquire), then the fields, then `seq` again
//!   (after an acquire fence), and accepts the copy iff the two loads are
//!   equal and even; otherwise it retries a bounded number of times, then
//!   skips the row and counts it. A thread's summary and memory rows
//!   have their `seq` in the record's row sequence array (entry *c* for
//!   row *c*), not in the row; a reader that kept a row's copy with the
//!   even `seq` it was read at knows the row is unchanged while `seq`
//!   still has that value (it grows by 2 per write, and a new lifetime of
//!   the record is a new version). The global section has one `seq`, in
//!   its header, over the whole section: every write to its rows, its
//!   `fold_count` and its fold log happens inside it. The copy between
//!   the two loads may also be taken with `pread(2)` of the segment file
//!   at the row's offset instead of loads through a mapping: the kernel's
//!   copy is as racy as loads and the same check validates it. The
//!   incremental reader does so for the few changed rows of a record it
//!   kept ([`segment::Segment::copy_row`]), which spares it the
//!   page faults (and fault-around) of mapping their pages, and for the
//!   rows of a record it did not keep, in one `pread` of a run of rows
//!   ([`segment::Segment::copy_rows_via`]): every row's `seq` is loaded
//!   before the copy, and a row is taken from it only if that `seq` was
//!   even and is unchanged after it (any other row is read again as
//!   above).
//! * **Walks in parts** ([`reader`]): a reader may split its walk of the
//!   thread container into contiguous ranges of pages read at once by
//!   several threads ([`reader::ReadOptions::threads`]). Each row is read
//!   under its sequence lock as above, whichever thread reads it; the
//!   global section and the fold log are read once, after every part is
//!   done, and a thread found folded in that log is dropped from whichever
//!   part read it, so the snapshot is the one a single walk takes. A
//!   reader may also ask the CPU to fetch rows ahead of reading them (a
//!   prefetch: no value is read, no page is faulted in), and give each
//!   thread past the first that copies rows with `pread` a file
//!   description of its own ([`segment::Segment::copy_row_via`]). Neither
//!   changes what is read or how it is validated. (An incremental reader's
//!   parts also update its kept copies as they go, each only those of the
//!   records in its own range: reader-private memory, outside the protocol;
//!   see [`rowcache::RowCache`].)
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
//! * **Thread exit** ([`writer::SegmentWriter::fold_and_free`], reconciled
//!   by [`reader`]): the exiting thread, under the creator's process-local
//!   lock, adds its rows into the global rows, appends `(ticket, record,
//!   version)` to the fold log and sets `fold_count = ticket`, all inside
//!   the global sequence lock, then frees its record. Readers drop copies
//!   that the fold log shows as already folded, so each event is counted
//!   exactly once and totals never go down. A reader's totals (say
//!   `events_waits_summary_global_by_event_name`):
//!   1. read `fold_count` (*F0*);
//!   2. copy every ALLOCATED record of every ACTIVE page: its lock word,
//!      its touched summary rows (each under its entry of the row
//!      sequence array), then the lock
//!      word again; keep the copy only if the word is unchanged, with
//!      version = lock word >> 2;
//!   3. read the global section under its `seq`: rows, `fold_count`
//!      (*F2*) and fold log;
//!   4. if *F2* − *F0* ≥ 256, the log may have lost entries: start again;
//!   5. drop each copy whose (record index, version) is in a fold log
//!      entry with 0 < `ticket` ≤ *F2*;
//!   6. a class's total is its global row plus its row in every kept copy
//!      (counts and sums add; MIN and MAX over rows with `timed_count` >
//!      0, a `min` of `u64::MAX` meaning none).
//!
//!   **A global lock that stays odd.** A reader that finds the global
//!   `seq` odd for its whole retry budget tells two cases apart by
//!   sampling `seq` and `fold_count` after each failed attempt: if they
//!   moved, folds keep the section busy (exits faster than a snapshot:
//!   [`SegmentError::FoldStorm`], retry later); if `seq` stayed odd at
//!   one value, one fold does not finish ([`SegmentError::GlobalLockStuck`]):
//!   its process is stopped in the middle of it (it may resume), or the
//!   folding thread or the whole process was killed in it. While the
//!   process lives (it holds its `flock`), a reader keeps retrying and
//!   never reads the section. Once it is dead, nobody can finish the
//!   write: a reader may read the section as it is, only while `seq`
//!   still holds that odd value ([`reader::ReadOptions::global_stuck_at`]).
//!   The fold was stopped somewhere in: merging the thread's rows, writing
//!   its fold-log entry, publishing `fold_count`; its record is still
//!   ALLOCATED. If the entry for ticket `fold_count` + 1 is written, every
//!   row was merged: the reader takes *F2* = `fold_count` + 1 and drops
//!   the record's copy, and the totals are exact. Otherwise the rows
//!   merged so far are in the global rows *and* in the kept copy, so the
//!   totals are **possibly torn**: that thread's events of some classes
//!   may count twice (a row being merged may be half added). A reader
//!   reports such a read as torn, and must never discard the segment for
//!   want of a consistent read.
//!
//!   **A row that stays odd.** A thread's summary or memory row whose
//!   writer was killed in the middle of an update (a process that exits
//!   while its threads record) keeps its sequence odd forever. While the
//!   process lives a reader skips it (its previous copy stands); once the
//!   process is dead, a reader may read it as it is
//!   ([`reader::ReadOptions::dead_writers`]): every field is written with
//!   one store, so each holds its value from before or after that update,
//!   and the row is off by at most that one event (save the 128-bit sum
//!   when the kill fell between its two words on the one event in 2^64 ps
//!   of waits that carries into the high word). A writer adds the pending
//!   bucket before it stores the new `pending` (in that order, also for
//!   the compiler): a kill between the two leaves the previous event
//!   counted twice and the latest in no bucket, so the buckets still sum
//!   to `timed_count` and none went below a value a reader saw before.
//!
//! - **The directory ([`files`]).** A segment is `<service>.<pid>.pfs`,
//!   or `<service>.<pid>.<n>.pfs` (n = 1..=8) while a dead predecessor's
//!   file holds the name. The agent's `.pfs-agent.lock`
//!   ([`files::AGENT_LOCK_FILE`]): the agent that holds its `flock` owns
//!   the directory; every agent sets its times to now at each pass (the
//!   heartbeat, [`files::agent_watched`], since 7.2); the owner writes in
//!   it, after each save of its state, `pfs-agent collected 1` then one
//!   line `<inode> <start_time_unix_ns>` per dead segment whose final
//!   figures that state holds ([`files::collected_text`],
//!   [`files::agent_collected`]). A writer that must replace a dead
//!   predecessor's segment counts it in `uncollected_segments` unless one
//!   of the two says it was collected.
//!
//! ## Modules and layers
//!
//! Each module has one job and builds only on modules of lower layers: it
//! names no module of its own or a higher layer, in code or in doc links
//! (tests at the end of a file excepted). There are no module cycles.
//!
//! | layer | module | job |
//! |------:|--------|-----|
//! | 0 | [`clock`] | the monotonic clocks every timer reads, in ns |
//! | 0 | [`error`] | typed errors |
//! | 0 | [`files`] | where segments live: the default directory, a segment's file name |
//! | 0 | [`fork`] | a hook run in the child of `fork(2)`, so that a writer stops there (unsafe) |
//! | 0 | [`kinds`] | instrument class kinds, event kinds and wait operations |
//! | 0 | [`seqlock`] | the sequence lock (one writer, readers retry) |
//! | 0 | [`text`] | UTF-8 strings in arrays of atomic words |
//! | 0 | [`tsc`] | reading the CPU time-stamp counter (unsafe) |
//! | 1 | [`layout`] | offsets and sizes of every section: the `repr(C)` types and constants |
//! | 1 | [`sigbus`] | surviving a mapped file that shrinks (unsafe) |
//! | 2 | [`actors`] | `setup_actors` rows: writing, clearing, matching |
//! | 2 | [`calibration`] | how a segment's timer ticks become picoseconds |
//! | 2 | [`geometry`] | a segment's parameters, their limits, and every section's offset and size |
//! | 2 | [`lockword`] | the record lock word (version and state) |
//! | 2 | [`rules`] | text syntax of setup rules and durations |
//! | 2 | [`values`] | summary, memory and statement figures, and their arithmetic |
//! | 3 | [`container`] | the thread container's page protocol |
//! | 3 | [`rowcache`] | kept copies of threads' summary rows and their sums, for incremental snapshots |
//! | 3 | [`segment`] | creating, validating and mapping a segment file; typed views of its sections (unsafe) |
//! | 4 | [`setup`] | live setup: instruments, consumers, timers, actors |
//! | 4 | [`writer`] | the writer side: registration, allocation, the hot path, folding |
//! | 5 | [`reader`] | the reader side: lock-free, version-checked snapshots |
//! | 5 | [`tasks`] | task slots: an awaiting task's open events, and the pool that hands slots out |
//!
//! Items that moved between modules stay reachable at their old paths:
//! `segment::truncate_utf8` (now [`text`]), `setup::{Actor, write_actor,
//! clear_actor, match_actor}` (now [`actors`]), `reader::{Summary,
//! MemoryStats}` and `writer::StatementFigures` (now [`values`]),
//! `writer::read_tsc` (now [`tsc`]), `segment::{SegmentConfig, Geometry,
//! MAX_*}` (now [`geometry`]), `segment::TimerCalibration` (now
//! [`calibration`]).
//!
//! ## Unsafe code
//!
//! The crate root denies `unsafe_code`; four modules are allowed it, and
//! every `unsafe` block in them argues its soundness in a `// SAFETY:`
//! comment:
//!
//! * [`segment`]: typed references into the mapping, at offsets checked
//!   against the validated geometry, and `madvise` on it; the byte view
//!   of a private row copy that `pread` fills; the mapping made private
//!   in a forked child; the prefetch hint (`_mm_prefetch`);
//! * [`fork`]: registering a `pthread_atfork` child handler;
//! * [`sigbus`]: the `SIGBUS` handler (`sigaction`, `mmap`, `errno`);
//! * [`tsc`]: the `RDTSC` intrinsic.
//!
//! ## Example: create, write, read back
//!
//! ```
//! use pfs_shm_layout::{ClassKind, EventKind, Segment, SegmentConfig, SegmentWriter, TimerCalibration};
//! use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED, NONE_U32};
//! use pfs_shm_layout::writer::EventData;
//! use pfs_shm_layout::reader::{snapshot, ReadOptions};
//!
//! let file = tempfile::tempfile().unwrap();
//! let timer = TimerCalibration::NANOSECONDS;
//! let cfg = SegmentConfig { service_name: "doc".into(), ..Default::default() };
//! let seg = Segment::create(file.try_clone().unwrap(), &cfg, timer, std::process::id(), 0).unwrap();
//! let w = SegmentWriter::new(seg);
//! let class = w.register_class("wait/synch/mutex/doc/m", ClassKind::Mutex, FLAG_ENABLED | FLAG_TIMED).unwrap();
//! let slot = w.alloc_thread(1, 42, "main").unwrap();
//! let rec = w.segment().record(slot.index);
//! let ev = EventData { event_id: 1, end_event_id: 2, class, timer_start: 10, timer_end: 15,
//!     timer_wait: 5_000, source: NONE_U32, object_name: NONE_U32, flags: EV_TIMED | EV_ENDED, ..Default::default() };
//! rec.end_event(EventKind::Wait, &ev, None, true, true); // events_waits_current + history
//! rec.summarize(class as usize, EventKind::Wait, true, 5_000, 0, None); // summary row
//!
//! let reader = Segment::open(file, false).unwrap(); // as the agent would
//! let snap = snapshot(&reader, &ReadOptions::default()).unwrap();
//! assert_eq!(snap.threads[0].rows[0].1.count, 1);
//! assert_eq!(snap.threads[0].rows[0].1.sum_ps, 5_000);
//! ```

#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod actors;
pub mod calibration;
pub mod clock;
pub mod container;
pub mod error;
pub mod files;
#[allow(unsafe_code)]
pub mod fork;
pub mod geometry;
pub mod kinds;
pub mod layout;
pub mod lockword;
pub mod reader;
pub mod rowcache;
pub mod rules;
#[allow(unsafe_code)]
pub mod segment;
pub mod seqlock;
pub mod setup;
#[allow(unsafe_code)]
pub mod sigbus;
pub mod tasks;
pub mod text;
#[allow(unsafe_code)]
pub mod tsc;
pub mod values;
pub mod writer;

pub use calibration::TimerCalibration;
pub use error::SegmentError;
pub use geometry::{Geometry, SegmentConfig};
pub use kinds::{ClassKind, EventKind, IoMode, Operation};
pub use segment::{RecordRef, Segment};
pub use writer::{NoRecord, SegmentWriter, ThreadSlot};
